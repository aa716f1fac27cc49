"""Tiny multi-seed runs for the fault-injection tests, and the numerical comparison of two runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anndata as ad
import numpy as np

import countvae as cv
from countvae.diagnostics import fit_seeds

SEEDS = [0, 1, 2]
OPTIONS = {
    "model_kwargs": {"n_latent": 2, "n_hidden": 8, "decoder": "linear"},
    "train_kwargs": {"max_epochs": 3, "batch_size": 64},
    "torch_threads": 1,
    "progress_bar": False,
}


def tiny_data(seed: int = 5) -> ad.AnnData:
    """200 cells x 50 genes of simulated counts, registered."""
    adata = cv.data.simulate(n_cells=200, n_genes=50, n_latent=2, seed=seed)
    cv.CountVAE.setup_anndata(adata)
    return adata


def run(adata: ad.AnnData, out_dir: Path | None, seeds=SEEDS, **kwargs):
    """``fit_seeds`` with the tiny settings above."""
    return fit_seeds(adata, seeds=seeds, out_dir=out_dir, **{**OPTIONS, **kwargs})


def numbers(fits) -> dict[str, np.ndarray]:
    """Every fit's held-out latents and every parameter, by name."""
    out = {}
    for fit in fits:
        out[f"latent_{fit.seed}"] = fit.latent(fits.adata_heldout)
        for name, tensor in fit.model.module.state_dict().items():
            out[f"{name}_{fit.seed}"] = tensor.detach().cpu().numpy()
    return out


def assert_same_numbers(fits, reference: dict[str, np.ndarray]) -> None:
    """The fits' latents and parameters equal the reference's exactly."""
    got = numbers(fits)
    assert sorted(got) == sorted(reference)
    for key, value in reference.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def leftovers(root: Path) -> list[Path]:
    """Temporary files or folders of the atomic writers left anywhere under ``root``."""
    return [p for p in root.rglob("*") if p.name.endswith((".partial", ".old"))]


def files_of(folder: Path) -> dict[str, bytes]:
    """The bytes of every file under ``folder``, by relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class KillWorkerOnce:
    """A ``progress`` callable that SIGKILLs the worker process fitting ``seed`` at event ``kind``, once.

    The marker file makes it fire once across processes and runs (a retried or
    rerun seed is not killed again); it never kills the process that created it.
    """

    def __init__(self, marker: Path, seed: int, kind: str = "seed trained"):
        self.marker = Path(marker)
        self.seed = seed
        self.kind = kind
        self.creator_pid = os.getpid()

    def __call__(self, event) -> None:
        if event.seed != self.seed or event.kind != self.kind or os.getpid() == self.creator_pid:
            return
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
