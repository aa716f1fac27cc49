"""The ICA row on stored latents by the raw rule and by the corrected one, against the regime's oracle.

Reads a ``calibration_regimes.py`` run (its CSVs and ``<csv stem>_arrays``), re-runs
:func:`~countvae.diagnostics.analyses.components.ica_component_stability` on each
replicate's held-out and fit-cell latents as the report did, and judges each component
twice: by the corrected match (the report's rule) and by the raw worst match with the
same preconditions (the rule it replaced). Prints one row per replicate, with the
oracle's verdict from the CSV, and writes it as a CSV.

    python benchmarks/ica_rule_comparison.py /tmp/lintoy/linear_toy_a.csv /tmp/lintoy/linear_toy_b.csv --out rules.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from countvae.diagnostics import ReportSettings
from countvae.diagnostics.analyses.components import ica_component_stability
from countvae.diagnostics.analyses.resampling import cell_bootstrap
from countvae.diagnostics.reporting.verdicts import (
    AGREE,
    DIFFER,
    ICA_QUANTITY,
    UNDETERMINED,
    Threshold,
    ica_row_judgement,
    interval_verdict,
    judge_components,
)


def _raw_row(judged: pd.DataFrame, threshold: float) -> str:
    """The row by the raw interval: components the preconditions leave undetermined stay so, the rest by low-high."""
    decided = judged["corrected_low"].notna() & (judged["verdict"] != UNDETERMINED) | judged["reason"].str.contains(
        "contains the threshold", na=False
    )
    verdicts = [
        interval_verdict(Threshold(threshold, ">="), r.low, r.high) if ok else UNDETERMINED
        for r, ok in zip(judged.itertuples(), decided, strict=True)
    ]
    return DIFFER if DIFFER in verdicts else AGREE if set(verdicts) == {AGREE} else UNDETERMINED


def compare(csvs: list[Path]) -> pd.DataFrame:
    """One row per replicate: both rules' verdicts on the held-out cells, the oracle's, and the minima behind them."""
    runs = pd.concat([pd.read_csv(p) for p in csvs], ignore_index=True)
    s = ReportSettings()
    rows = []
    for csv in csvs:
        for path in sorted(csv.with_name(csv.stem + "_arrays").glob("replicate_*_heldout.npz")):
            replicate = int(path.stem.split("_")[1])
            with np.load(path) as z:
                names = [k.split("/", 1)[1] for k in z.files if k.startswith("latent_fit/")]
                held = {n: z[f"latent/{n}"].astype(np.float64) for n in names}
                fit = {n: z[f"latent_fit/{n}"].astype(np.float64) for n in names}
            n = len(held[names[0]])
            boot = cell_bootstrap(n, s.n_bootstrap, seed=s.seed + 2000, max_cells=s.max_bootstrap_cells)
            table = ica_component_stability(held, boot, fit_cells=fit, alpha=s.alpha, seed=s.seed).table
            judged = judge_components(table, s.ica_threshold)
            oracle = runs[(runs["replicate"] == replicate) & (runs["row"] == ICA_QUANTITY) & (runs["cells"] == "pool")]
            rows.append(
                {
                    "replicate": replicate,
                    "raw rule": _raw_row(judged, s.ica_threshold),
                    "corrected rule": ica_row_judgement(judged).verdict,
                    "oracle": oracle["verdict"].iloc[0],
                    "worst raw": judged["worst_match"].min(),
                    "same fit (min)": judged["same_fit_match"].min(),
                    "corrected": judged["corrected_match"].min(),
                    "oracle corrected": oracle["agreement"].iloc[0],
                }
            )
    return pd.DataFrame(rows).sort_values("replicate", ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csvs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    table = compare(args.csvs)
    print(table.round(3).to_string(index=False))
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
