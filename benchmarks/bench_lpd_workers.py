"""The report's held-out log p(x) of five fits: in workers on one thread each, against in process on 2 threads.

    python benchmarks/bench_lpd_workers.py                       # embedded default and Kang, 2 rounds each
    python benchmarks/bench_lpd_workers.py --datasets embedded --rounds 1 --quick

For each data set, `countvae diagnose`'s five default fits (fitted once, stored under ``--work``) are estimated
on the same 500 held-out cells by :func:`countvae.diagnostics.reporting.heldout_lpd.heldout_lpd` under three
settings, interleaved round by round in one process whose torch runs 2 threads (this machine's default):

* ``in process, caller's threads``: ``lpd_jobs=1, lpd_threads=2``, the report's default before;
* ``workers, caller's threads``: ``lpd_jobs=2, lpd_threads=2``, what ``lpd_jobs=2`` did before (each worker
  took the caller's thread count);
* ``auto, 1 thread``: the defaults now (``lpd_jobs="auto"``, ``lpd_threads=1``).

It also checks that one thread gives the same numbers here and in workers, and how far the estimates move
between 1 and 2 threads. Writes section report-lpd-workers of RESULTS.md. The scvi-tools peer of this
estimator (``get_marginal_ll``) is timed on the same cells in section lpd-package.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_RESULTS, command_line, load_average, machine_line, markdown_table, write_section  # noqa: E402

SETTINGS = {
    "in process, caller's threads (before)": {"lpd_jobs": 1, "lpd_threads": 2},
    "workers, caller's threads (lpd_jobs=2 before)": {"lpd_jobs": 2, "lpd_threads": 2},
    "auto, 1 thread (now)": {},
}


def stored_fits(dataset: str, work: Path, quick: bool):
    """`countvae diagnose`'s default fits of ``dataset`` (fitted once, resumed from ``work``) and 500 held-out cells."""
    import countvae as cv
    from countvae.cli import build_parser
    from countvae.cli.diagnose import diagnose_settings
    from countvae.diagnostics import plan_diagnose

    argv = ["diagnose", "--quiet"] + (["--seeds", "2", "--max-epochs", "2"] if quick else [])
    if dataset != "embedded":
        path = work / f"{dataset}.h5ad"
        if not path.exists():
            cv.data.load_dataset(dataset).write_h5ad(path)
        argv += [str(path), "--batch-key", "batch"]
    adata, settings = diagnose_settings(build_parser().parse_args(argv))
    plan = plan_diagnose(adata, settings=replace(settings, out_dir=None)).split()
    fits = plan.fit(work / f"fits_{dataset}{'_quick' if quick else ''}")
    return list(fits), fits.adata_heldout[:500].copy()


def measure(dataset: str, work: Path, rounds: int, quick: bool) -> tuple[list[dict], dict]:
    """Seconds per setting and round, and the agreement checks."""
    import torch

    from countvae.diagnostics import ReportSettings
    from countvae.diagnostics.reporting.heldout_lpd import heldout_lpd

    fits, cells = stored_fits(dataset, work, quick)
    torch.set_num_threads(2)
    rows, frames = [], {}
    # The smoke run leaves out the oversubscribed setting, whose workers alone take about half a minute.
    settings = {k: v for k, v in SETTINGS.items() if not (quick and v.get("lpd_jobs") == 2)}
    for r in range(rounds):
        for name, overrides in settings.items():
            started = time.perf_counter()
            out = heldout_lpd(fits, cells, ReportSettings(**overrides))
            rows.append({"data": dataset, "round": r + 1, "setting": name, "seconds": time.perf_counter() - started})
            frames.setdefault(name, [f["lpd"].to_numpy() for f in out])
            print(rows[-1], flush=True)
    one_here = heldout_lpd(fits, cells, ReportSettings(lpd_jobs=1))
    one_workers = heldout_lpd(fits, cells, ReportSettings(lpd_jobs=2))
    checks = {
        "data": dataset,
        "fits x cells": f"{len(fits)} x {cells.n_obs}",
        "1 thread: here == workers": all(
            np.array_equal(a["lpd"].to_numpy(), b["lpd"].to_numpy()) for a, b in zip(one_here, one_workers, strict=True)
        ),
        "largest difference, 1 against 2 threads (nats, one cell)": max(
            float(np.abs(a["lpd"].to_numpy() - b).max())
            for a, b in zip(one_here, frames[next(iter(SETTINGS))], strict=True)
        ),
    }
    return rows, checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="embedded,kang2018")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/countvae_bench_lpd_workers"))
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 seeds of 2 epochs")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    before = load_average()
    rows, checks = [], []
    for dataset in args.datasets.split(","):
        timed, checked = measure(dataset, args.work, args.rounds, args.quick)
        rows += timed
        checks.append(checked)
    table = pd.DataFrame(rows).pivot_table(index=["data", "setting"], columns="round", values="seconds", sort=False)
    table.columns = [f"round {c} s" for c in table.columns]
    body = "\n".join(
        [
            "## The report's held-out log p(x) in workers and on fixed threads (`bench_lpd_workers.py`)"
            + (" (QUICK smoke run: 2 fits of 2 epochs, not a measurement)" if args.quick else ""),
            "",
            f"Command: `{command_line()}`",
            "",
            f"{machine_line(2)}. Load average before / after: {before} / {load_average()}.",
            "",
            "Five default fits of `countvae diagnose`, 500 held-out cells, the caller's torch on 2 threads; the "
            "settings interleaved round by round (see the script's docstring).",
            "",
            markdown_table(table.reset_index(), floatfmt="{:.1f}"),
            "",
            markdown_table(pd.DataFrame(checks), floatfmt="{:.3g}"),
        ]
    )
    write_section(args.results, "report-lpd-workers", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
