"""Time of the multi-seed analysis (``diagnostics.report``) on Kang and at 100,000 held-out cells.

The analysis must stay under 10% of ``countvae diagnose`` on Kang with 5 seeds (whose fits take
2-3 minutes each) and scale to 100,000 held-out cells. The analysis time does not depend on how
long the models were trained, so the fits here are short; what is timed is ``report()`` with its
default settings, per step, plus writing the three report files.

    python benchmarks/bench_report.py kang            # 5 seeds on Kang (10% held out), default settings
    python benchmarks/bench_report.py scale           # 2 seeds, 100,000 simulated held-out cells
    python benchmarks/bench_report.py scale --cells 20000 --quick
    python benchmarks/bench_report.py diagnose        # `countvae diagnose` end to end on Kang, default settings
    python benchmarks/bench_report.py diagnose --keep kang_diag   # ... and keep its folder (report/report.html)
    python benchmarks/bench_report.py embedded --keep embedded_diag   # `countvae diagnose` on its embedded data

Writes the section ``report-<which>`` of RESULTS.md (``--results``) with the
command, the machine, the load, the time per step and the resident memory during ``report()``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_RESULTS, command_line, load_average, machine_line, peak_rss_mb, write_section  # noqa: E402


def _current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024.0
    return float("nan")


class _RssSampler(threading.Thread):
    """Largest resident memory seen while a block runs (sampled every 20 ms)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.start_mb = _current_rss_mb()
        self.peak_mb = self.start_mb
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.02):
            self.peak_mb = max(self.peak_mb, _current_rss_mb())

    def stop(self) -> None:
        self._done.set()
        self.join()


REPORT_MEMORY: dict[str, float] = {}


def _time_report(fits, heldout, markers=None) -> tuple[dict[str, float], float]:
    from countvae.diagnostics import report

    sampler = _RssSampler()
    sampler.start()
    try:
        rep = report(fits, heldout, markers=markers)
    finally:
        sampler.stop()
    REPORT_MEMORY.update(before=sampler.start_mb, peak=sampler.peak_mb)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rep.save(Path(tmp) / "report")
        save_seconds = time.perf_counter() - t0
    return rep.timings, save_seconds


def kang(args: argparse.Namespace) -> list[str]:
    """Five seeds of the default model (NB, MLP, 10 latent dims) on Kang; the report timed per step."""
    import countvae as cv
    from countvae.diagnostics import fit_seeds

    adata = cv.data.load_dataset("kang2018")
    cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
    t0 = time.perf_counter()
    fits = fit_seeds(
        adata,
        seeds=range(args.seeds),
        model_kwargs={"n_latent": 10},
        train_kwargs={"max_epochs": args.epochs, "progress_bar": False},
        heldout_fraction=0.1,
        progress_bar=False,
        torch_threads=args.threads,
    )
    fit_seconds = time.perf_counter() - t0
    timings, save_seconds = _time_report(fits, fits.adata_heldout)
    analysis = timings["total"] + save_seconds
    return [
        f"Kang: {args.seeds} seeds, {fits.adata_heldout.n_obs} held-out cells x {adata.n_vars} genes; fits trained "
        f"{args.epochs} epochs (fit_seeds took {fit_seconds:.0f} s).",
        "",
        _table(timings, save_seconds),
        "",
        f"Analysis {analysis:.1f} s (report() and saving it; its share of a whole `countvae diagnose` run, fits "
        "trained to their stopping rule, is in section report-diagnose). Resident memory during report(): "
        f"{REPORT_MEMORY['before']:.0f} MB before, peak {REPORT_MEMORY['peak']:.0f} MB.",
    ]


def scale(args: argparse.Namespace) -> list[str]:
    """Two quick fits on 5,000 cells, then the report on ``--cells`` held-out cells.

    The held-out cells are drawn with replacement from 20,000 simulated cells (same
    model, so the same distribution) to keep the simulator's dense intermediate
    arrays small; the peak memory is then mostly the report's.
    """
    import anndata as ad

    import countvae as cv
    from countvae.diagnostics import CountVAEFit

    n_fit, n_pool = 5_000, 20_000
    sim = cv.data.simulate(n_cells=n_fit + n_pool, n_genes=args.genes, n_latent=5, decoder="mlp", sources="laplace")
    fit_data = sim[:n_fit].copy()
    rows = n_fit + np.random.default_rng(1).choice(n_pool, args.cells, replace=True)
    heldout = ad.AnnData(X=sim.X[rows], var=sim.var.copy())
    heldout.obs_names = [f"held{i}" for i in range(args.cells)]
    del sim
    cv.CountVAE.setup_anndata(fit_data)
    rss_data = peak_rss_mb()
    fits = []
    for seed in range(2):
        model = cv.CountVAE(fit_data, n_latent=5)
        model.train(early_stopping=False, max_epochs=args.epochs, batch_size=256, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    timings, save_seconds = _time_report(fits, heldout)
    return [
        f"Scale: 2 seeds, {heldout.n_obs} held-out cells x {heldout.n_vars} genes (simulated, MLP decoder).",
        "",
        _table(timings, save_seconds),
        "",
        f"Resident memory during report(): {REPORT_MEMORY['before']:.0f} MB before, peak "
        f"{REPORT_MEMORY['peak']:.0f} MB (process peak {peak_rss_mb():.0f} MB, {rss_data:.0f} MB of it while "
        "simulating the data).",
    ]


def diagnose(args: argparse.Namespace) -> list[str]:
    """``countvae diagnose`` on Kang at its default settings, end to end; wall time and the report's numbers."""
    from countvae.data import find_dataset

    data = find_dataset("kang2018")
    extra = ["--max-epochs", "1", "--seeds", "2"] if args.quick else []
    argv = [*map(str, [data, "--batch-key", "batch", "--labels-key", "cell_type"]), *extra]
    label = f"countvae diagnose {data.name} --batch-key batch --labels-key cell_type {' '.join(extra)}".strip()
    return _diagnose_section(args, argv, label, "default: 5 seeds, NB, MLP decoder, 10 latent dims, 10% held out")


def embedded(args: argparse.Namespace) -> list[str]:
    """``countvae diagnose`` on its embedded simulated data (5 known Laplace sources), as a new user runs it."""
    extra = ["--max-epochs", "2", "--seeds", "2"] if args.quick else []
    return _diagnose_section(
        args,
        extra,
        f"countvae diagnose {' '.join(extra)}".strip(),
        "embedded default: 3,000 simulated cells x 300 genes from 5 Laplace sources, 5 seeds, NB, MLP decoder, "
        "5 latent dims, 10% held out",
    )


def _diagnose_section(args: argparse.Namespace, argv: list[str], label: str, settings: str) -> list[str]:
    """Run ``countvae diagnose`` (resuming the fits of ``--keep`` if there are any) and describe its report."""
    import json

    import pandas as pd

    from countvae.cli import main as cli_main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp) / "diag"
        if (out / "report").exists():
            raise SystemExit(f"{out / 'report'} exists; remove it to rerun the report on the fits in {out / 'fits'}")
        resumed = (out / "fits").exists()
        t0 = time.perf_counter()
        code = cli_main(["diagnose", *argv, "--out", str(out), "--quiet"])
        wall = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"countvae diagnose exited with {code}")
        record = json.loads((out / "report" / "report.json").read_text())
    tables = record["tables"]
    columns = ["quantity", "metric", "agreement", "low", "high", "aligned_agreement", "threshold", "verdict"]
    invariants = pd.DataFrame(tables["invariants"])[columns]
    alignment = pd.DataFrame(tables["alignment_summary"])[["map", "error_diameter_mean", "error_rms_mean"]]
    predictive = pd.DataFrame(tables["predictive"])
    predictive = predictive[[c for c in ("fit", "lpd_per_cell", "se_per_cell", "share_khat_above") if c in predictive]]
    pairs = pd.DataFrame(tables.get("predictive_pairs", []))
    rhat = pd.DataFrame(tables["rhat"])
    rhat = rhat[
        [c for c in ("quantity", "rhat_median", "baseline_rhat_median", "fraction_above_baseline") if c in rhat]
    ]
    analysis = record["timings_seconds"]["total"]
    epochs = record["settings"]["fits"]["train_kwargs"]["max_epochs"]
    timing = (
        f"**{wall / 60:.1f} min wall time**, of which report() {analysis:.1f} s ({100 * analysis / wall:.1f}%)"
        if not resumed
        else f"report() {analysis:.1f} s, {wall / 60:.1f} min wall time on the {len(record['provenance']['fits'])} "
        f"fits of an earlier run of the same command, resumed from `{out}` (fitting time not included)"
    )
    steps = record["timings_seconds"]
    lpd_seconds = steps.get("of which held-out log p(x)")
    lpd_share = (
        f"Held-out log p(x) (the accurate estimator, {record['settings']['report']['n_lpd_samples']} final draws "
        f"per cell) took {lpd_seconds:.1f} s of report()'s per-fit outputs ({steps['per-fit outputs']:.1f} s): "
        + (f"**{100 * lpd_seconds / wall:.1f}% of the diagnose wall time**." if not resumed else "")
        if lpd_seconds is not None
        else ""
    )
    step_table = pd.DataFrame({"step": list(steps), "seconds": list(steps.values())})
    lines = [
        f"`{label}` ({settings}, {epochs} epochs): {timing}.",
        "",
        lpd_share,
        "",
        _frame(step_table),
        "",
        "Verdict, as the report states it:",
        "",
        *[f"- {line}" for line in record["headline"]],
        "",
        _frame(invariants),
        "",
        "Seed-pair alignment error (mean over pairs; fraction of the latent diameter / of the RMS distance):",
        "",
        _frame(alignment),
    ]
    ica = pd.DataFrame(tables.get("ica", []))
    if len(ica):
        keep = ["component", "worst_match", "low", "high", "same_fit_match", "excess_kurtosis", "gaussian", "verdict"]
        lines += ["", "ICA components across seeds:", "", _frame(ica[[c for c in keep if c in ica]])]
    truth = pd.DataFrame(tables.get("ground_truth", []))
    if len(truth):
        lines += ["", "Against the simulation's true sources (held-out cells):", "", _frame(truth)]
    lines += ["", "Held-out log p(x) per cell:", "", _frame(predictive)]
    if len(pairs):
        keep = ["fit_a", "fit_b", "diff_per_cell", "ci_low", "ci_high", "margin", "decision"]
        lines += ["", "Predictive equivalence per pair (nats per cell):", "", _frame(pairs[keep])]
    lines += ["", "Spread of guide draws across seeds (R-hat, seeds as chains) and its within-seed baseline:", ""]
    lines += [_frame(rhat)]
    return lines


def _frame(frame) -> str:
    cols = list(frame.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for values in frame.itertuples(index=False):
        cells = ["–" if v is None or v != v else f"{v:.4g}" if isinstance(v, float) else str(v) for v in values]
        cells = [c.replace("|", "\\|") for c in cells]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _table(timings: dict[str, float], save_seconds: float) -> str:
    lines = ["| step | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in timings.items() if k != "total"]
    lines += [f"| **report() total** | **{timings['total']:.2f}** |", f"| save (html, json, md) | {save_seconds:.2f} |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark and print its Markdown section."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["kang", "scale", "diagnose", "embedded"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5, help="training epochs per fit (not what is timed)")
    parser.add_argument("--cells", type=int, default=100_000, help="held-out cells for 'scale'")
    parser.add_argument("--genes", type=int, default=2_000, help="genes for 'scale'")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 seeds, 1 epoch, fewer cells")
    parser.add_argument(
        "--keep",
        default=None,
        help="'diagnose', 'embedded': write the run to this folder, not a temp dir (the fits of an earlier "
        "run there are reused once its report folder is removed)",
    )
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="RESULTS.md to write the section into")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.cells, args.genes = 2, 1, min(args.cells, 5_000), min(args.genes, 300)

    import torch

    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M")
    load_before = load_average()
    lines = {"kang": kang, "scale": scale, "diagnose": diagnose, "embedded": embedded}[args.which](args)
    body = "\n".join(
        [
            f"## Multi-seed diagnostics, {args.which} (`bench_report.py`)",
            "",
            f"Command: `{command_line()}` ({started}{', QUICK smoke run' if args.quick else ''})",
            "",
            f"Machine: {machine_line(args.threads)}. Load average before / after: {load_before} / {load_average()}.",
            "",
            *lines,
        ]
    )
    write_section(Path(args.results), f"report-{args.which}", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
