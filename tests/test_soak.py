"""A small soak: 30 consecutive tiny fits in one process leak no memory, file handles or temporary files.

Each round builds a model, trains it two epochs, estimates held-out log p(x),
saves it, loads it back and estimates again; every tenth round also runs a
two-seed ``fit_seeds`` without an out_dir (its fits live in a temporary folder).
The first rounds warm up (torch and Pyro allocate their caches once); after
them the resident memory may grow by at most :data:`MAX_RSS_GROWTH_MIB`, the open
file descriptors and the temporary folder must be as they were, and no
``countvae-*`` temporary folder may be left.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

import countvae as cv
from countvae.diagnostics import fit_seeds

ROUNDS = 30
WARM_UP = 5
#: Allowed growth of resident memory after the warm-up, over the remaining rounds (a leak of one model per
#: round, about 0.3 MiB here, would still fit; the check is against unbounded growth, e.g. kept Pyro traces).
MAX_RSS_GROWTH_MIB = 40.0


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return float(line.split()[1]) / 1024.0
    raise AssertionError(f"{field} is not in /proc/self/status")


def _open_fds() -> list[str]:
    """What each open file descriptor of this process points to (a sorted multiset)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the descriptor os.listdir itself used
            continue
    return sorted(targets)


def test_thirty_fits_leak_no_memory_handles_or_temp_files(tmp_path, monkeypatch):
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    adata = cv.data.simulate(n_cells=200, n_genes=50, n_latent=2, seed=7)
    cv.CountVAE.setup_anndata(adata)
    fit_cells, held = adata[:170].copy(), adata[170:].copy()
    rss, fds, temp_entries = [], None, None
    for round_ in range(ROUNDS):
        model = cv.CountVAE(fit_cells, n_latent=2, n_hidden=8, decoder="linear")
        model.train(max_epochs=2, batch_size=64, progress_bar=False, seed=round_)
        lpd = model.get_log_predictive_density(held, n_samples=10)
        folder = tmp_path / "model"
        model.save(folder, overwrite=True)
        again = cv.CountVAE.load(folder, adata=fit_cells).get_log_predictive_density(held, n_samples=10)
        np.testing.assert_array_equal(lpd["lpd"].to_numpy(), again["lpd"].to_numpy())
        if round_ % 10 == 9:
            fits = fit_seeds(
                fit_cells,
                seeds=[round_, round_ + 1],
                model_kwargs={"n_latent": 2, "n_hidden": 8},
                train_kwargs={"max_epochs": 1},
                n_jobs=1,  # in this process: joblib's reusable worker pool keeps its pipes open on purpose
                progress_bar=False,
            )
            assert len(fits) == 2
            del fits
        del model, lpd, again
        if round_ == WARM_UP - 1:
            fds = _open_fds()
            temp_entries = sorted(temp_root.rglob("*"))
        rss.append(_status_mib("VmRSS"))
    growth = rss[-1] - rss[WARM_UP - 1]
    print(
        f"soak: {ROUNDS} rounds, RSS after warm-up {rss[WARM_UP - 1]:.1f} MiB, at the end {rss[-1]:.1f} MiB "
        f"(growth {growth:.1f} MiB), peak {_status_mib('VmHWM'):.1f} MiB, open fds {len(_open_fds())}"
    )
    assert growth < MAX_RSS_GROWTH_MIB, f"resident memory grew by {growth:.1f} MiB over {ROUNDS - WARM_UP} rounds"
    assert _open_fds() == fds, f"file descriptors left open: {sorted(set(_open_fds()) - set(fds))}"
    # torch keeps one cache folder of its own there (torchinductor_<user>), made once; countvae leaves nothing.
    assert not list(temp_root.glob("countvae-*")), f"temporary folders left behind: {sorted(temp_root.iterdir())}"
    assert sorted(temp_root.rglob("*")) == temp_entries, "temporary files appeared after the warm-up"
