"""Runs for the interruption tests, with markers and pauses at chosen progress events.

For tests/diagnostics/fitting/test_resume.py.

Usage::

    python tests/seedrun.py [--markers DIR] [--pause-at EVENT] fit DATA.h5ad OUT_DIR|- RESULTS.npz SEED [SEED ...]
    python tests/seedrun.py [--markers DIR] [--pause-at EVENT] diagnose DIAGNOSE-ARGUMENTS...

``fit`` fits a small countvae model for each seed (one torch thread, in this
process), then writes each fit's held-out posterior means and log predictive
densities to RESULTS.npz and the seeds reused from OUT_DIR to stdout as JSON.
``diagnose`` runs ``countvae diagnose`` with the given arguments.

Both pass :class:`Checkpoints` as the run's ``progress`` callable (the public
event hook of ``fit_seeds`` and ``DiagnosticReport.save``): for every event it
touches a marker file in DIR named ``<kind>-<seed or file>`` (e.g.
``seed_stored-0``, ``report_file_written-report.html``), and at the event named
by ``--pause-at`` (``<kind>:<seed or file>``, e.g. ``seed_written:2``) it waits
forever, so that a test can SIGKILL the process at exactly that point.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import torch

from countvae.cli import build_parser
from countvae.cli import diagnose as diagnose_command
from countvae.diagnostics import ProgressEvent, fit_seeds


class Checkpoints:
    """Marker files for every progress event, and a pause at one of them."""

    def __init__(self, marker_dir: Path | None, pause_at: str | None):
        self.marker_dir = marker_dir
        self.pause_at = pause_at

    def __call__(self, event: ProgressEvent) -> None:
        """Touch the event's marker; wait forever if it is the one to pause at."""
        what = event.name if event.seed is None else str(event.seed)
        kind = event.kind.name.lower()
        if self.marker_dir is not None:
            Path(self.marker_dir, f"{kind}-{what}").touch()
        if self.pause_at == f"{kind}:{what}":
            while True:
                time.sleep(0.5)


def fit(argv: list[str], progress: Checkpoints) -> None:
    """Fit the seeds and write the results (see the module docstring)."""
    data_path, out_dir, results_path, *seeds = argv
    adata = ad.read_h5ad(data_path)
    fits = fit_seeds(
        adata,
        seeds=[int(s) for s in seeds],
        model_kwargs={"n_latent": 2, "n_hidden": 16, "decoder": "mlp"},
        train_kwargs={"max_epochs": 25, "batch_size": 64},
        out_dir=None if out_dir == "-" else out_dir,
        torch_threads=1,
        n_jobs=1,  # one seed after another, so that each pause (and kill) lands between known seeds
        progress_bar=False,
        progress=progress,
    )
    results = {}
    for fitted in fits:
        results[f"latent_{fitted.seed}"] = fitted.latent(fits.adata_heldout)
        frame = fitted.log_predictive_density(fits.adata_heldout, n_samples=20, seed=0)
        results[f"lpd_{fitted.seed}"] = frame.to_numpy(dtype=np.float64)  # the reliable flag as 0/1
    np.savez(results_path, **results)
    print(json.dumps({"reused": fits.reused_seeds, "seconds": {str(k): v for k, v in fits.seconds.items()}}))


def diagnose(argv: list[str], progress: Checkpoints) -> int:
    """``countvae diagnose ARGV`` with ``progress`` observing its events."""
    args = build_parser().parse_args(["diagnose", *argv])
    return diagnose_command.run(args, progress=progress)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markers", type=Path, default=None)
    parser.add_argument("--pause-at", default=None)
    parser.add_argument("mode", choices=["fit", "diagnose"])
    known, rest = parser.parse_known_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    progress = Checkpoints(known.markers, known.pause_at)
    if known.mode == "fit":
        fit(rest, progress)
        return 0
    return diagnose(rest, progress)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
