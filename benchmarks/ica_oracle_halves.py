"""Is the linear-toy regime's ICA oracle a property of the fits? The oracle on its whole ICA pool and on each half.

The ``linear-toy`` regime of ``calibration_regimes.py`` scores the report's ICA row against the same fits' ICA
estimated on halves of 20,000 further cells (``n_ica_pool``) and matched on the pool. This script refits the
replicates named (training is deterministic on one machine, so these are the run's fits) and judges the oracle's
ICA row three times: on the whole ICA pool, as the run did, and on each of its two halves alone (half the cells
per ICA). Where the three disagree, the oracle's verdict rests on which cells the pool happened to hold, not on the
fits; for each, the smallest corrected match (cross-seed over same-seed) and the smallest same-seed split-half
match over the components.

    python benchmarks/ica_oracle_halves.py --replicates 18
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_regimes import REGIMES, Config, fit_one, pool_ica_components, replicate_cells  # noqa: E402


def oracle_on_halves(fits, pool, ica_pool, settings: dict | None = None) -> pd.DataFrame:
    """The oracle's ICA row on the whole ``ica_pool`` and on each half of it: one row per cell set."""
    from countvae.diagnostics.reporting.verdicts import ica_row_judgement

    half = ica_pool.n_obs // 2
    rows = []
    for name, cells in (
        ("whole ICA pool", ica_pool),
        ("first half", ica_pool[:half]),
        ("second half", ica_pool[half:]),
    ):
        judged = pool_ica_components(fits, pool, cells, settings or {})
        rows.append(
            {
                "ICA estimated on": f"{name} ({cells.n_obs:,} cells, halves of {cells.n_obs // 2:,})",
                "verdict": ica_row_judgement(judged).verdict,
                "corrected match (min)": float(judged["corrected_match"].min()),
                "low": float(judged["corrected_low"].min()),
                "high": float(judged["corrected_high"].min()),
                "same seed's halves (min)": float(judged["same_fit_match"].min()),
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    """Refit each replicate named and print the oracle's ICA row on the whole ICA pool and on its halves."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", default="18", help="comma-separated replicate numbers")
    parser.add_argument("--regime", default="linear-toy", choices=[r for r in REGIMES if REGIMES[r].get("n_ica_pool")])
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cfg = replace(Config(), regime=args.regime, **REGIMES[args.regime])
    for replicate in (int(r) for r in args.replicates.split(",")):
        fit_cells, _, pool, ica_pool = replicate_cells(cfg, replicate, None)
        fits = [fit_one(cfg, fit_cells, seed, cfg.max_epochs)[0] for seed in range(cfg.n_seeds)]
        print(f"replicate {replicate}:")
        print(oracle_on_halves(fits, pool, ica_pool).round(3).to_string(index=False), flush=True)


if __name__ == "__main__":
    main()
