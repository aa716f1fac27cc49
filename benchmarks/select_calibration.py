"""Calibration of compare_models' recommendation on simulations of known latent size, against the simple rules.

Each replicate simulates NB counts from a known number of sources (``cv.data.simulate``), fits every candidate
of a grid around the true size from the same seeds, and records per candidate what every rule needs: the
compare_models table (paired intervals against the best, margin, stability) and, on the same fits, the mean
training ELBO, seed 0's held-out ``log p(x)`` and the mean over seeds of the held-out ``log p(x)``. The rules are
then applied to the stored rows (:func:`rule_choices`), so a new rule is judged on the same fits without refitting.

The candidates are fitted as :func:`~countvae.diagnostics.compare_models` fits them at its defaults (three seeds,
its training defaults: no early stopping and the epochs of ``diagnose``'s cell-pass budget, capped at 400; all
candidates' seeds in one pool of workers; 100 importance samples per held-out cell), except that 20% of the cells are
held out (its default is 10%), and with CountVAE's default MLP (128 hidden units).

The true size *in the model family*. The MLP truth has 32 leaky-ReLU units and adds each batch's gene offsets after
the softmax; CountVAE's MLP decoder uses ReLU units with the batch as an input of its hidden layer. With 128 hidden
units the family holds the truth exactly (a leaky ReLU is the difference of two ReLUs; a unit driven by one batch's
indicator alone is constant within that batch, so it adds a per-batch offset to every gene's logit), so ``n_sources``
latent dimensions suffice. With 32 hidden units it does not, and extra latent dimensions make up for the missing
units: in pilots at 2,000 cells the held-out fit kept improving up to ``n_sources + 2`` (section select-calibration).
The simulator's linear truth is ``log mu = log l + b + W z`` with a size factor ``l`` independent of ``z``, while
countvae's linear decoder scales by the OBSERVED total count; the sources also move the library share
``log sum_g exp(b_g + W_g z)`` (a per-cell scalar, nonlinear in ``z``), which a log-linear decoder can only carry in
one more latent dimension (measured in RESULTS.md, section select-library-share). The true size of a linear setting
is therefore ``n_sources + 1``.

Usage (resumable: rows already in the CSV are skipped; more replicates extend it)::

    OMP_NUM_THREADS=1 python benchmarks/select_calibration.py --replicates 20 --minutes 45 --csv select_calibration.csv
    python benchmarks/select_calibration.py --csv select_calibration.csv --table-only --results benchmarks/RESULTS.md

The second writes section ``select-calibration`` of RESULTS.md from the CSV.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import countvae as cv
from countvae.diagnostics import compare_fits
from countvae.diagnostics.fitting.default_training import diagnose_train_kwargs
from countvae.diagnostics.fitting.fit_seeds import FitSeedsSettings, fit_models

try:
    from _common import command_line, machine_line, markdown_table, write_section
except ImportError:  # run from elsewhere than benchmarks/
    from benchmarks._common import command_line, machine_line, markdown_table, write_section

SECTION = "select-calibration"

#: (n_sources, decoder, n_batches) settings, in the order each round of replicates visits them.
SETTINGS = [(k, d, nb) for nb in (1, 2) for d in ("linear", "mlp") for k in (3, 5, 8)]
N_CELLS, N_GENES, HELDOUT = 2000, 200, 0.2
#: compare_models' default seeds.
SEEDS = (0, 1, 2)
#: Hidden units of the simulated MLP truth (the simulator's default); candidates keep CountVAE's default (128).
TRUE_HIDDEN = 32
N_LPD_SAMPLES = 100
GRID_HALF_WIDTH = 2
RULES = ("compare_models", "one_interval", "training_elbo", "single_seed_heldout", "heldout_argmax")


def true_size(n_sources: int, decoder: str) -> int:
    """Latent dimensions the model family needs for the simulation (see the module docstring)."""
    return n_sources + 1 if decoder == "linear" else n_sources


def grid(size: int) -> list[int]:
    """Candidate latent sizes: the true size and up to two steps either side (at least 1)."""
    return [k for k in range(size - GRID_HALF_WIDTH, size + GRID_HALF_WIDTH + 1) if k >= 1]


def replicate(n_sources: int, decoder: str, n_batches: int, rep: int) -> pd.DataFrame:
    """One replicate: every candidate's row of what the rules need."""
    sim_seed = 10_000 * SETTINGS.index((n_sources, decoder, n_batches)) + rep
    adata = cv.data.simulate(
        n_cells=N_CELLS,
        n_genes=N_GENES,
        n_latent=n_sources,
        decoder=decoder,
        n_batches=n_batches,
        n_hidden=TRUE_HIDDEN,
        seed=sim_seed,
    )
    cv.CountVAE.setup_anndata(adata, batch_key="batch" if n_batches > 1 else None)
    size = true_size(n_sources, decoder)
    settings = {f"n_latent={k}": {"n_latent": k, "decoder": decoder} for k in grid(size)}
    n_fit = round(N_CELLS * (1 - HELDOUT))
    train = diagnose_train_kwargs(None, n_fit, early_stopping=False)  # compare_models' training defaults
    runs = [
        FitSeedsSettings(seeds=SEEDS, model_kwargs=s, train_kwargs=train, heldout_fraction=HELDOUT)
        for s in settings.values()
    ]
    fits = dict(zip(settings, fit_models(adata, runs), strict=True))
    comparison = compare_fits(fits, settings, n_lpd_samples=N_LPD_SAMPLES)
    table = comparison.table.set_index("candidate")
    rows = []
    for name, seed_fits in fits.items():
        fit_cells = seed_fits.adata_fit
        row = table.loc[name]
        rows.append(
            {
                "n_sources": n_sources,
                "decoder": decoder,
                "n_batches": n_batches,
                "replicate": rep,
                "true_size": size,
                "n_latent": settings[name]["n_latent"],
                "lpd_per_cell": row["lpd_per_cell"],
                "diff_vs_best": row["diff_vs_best"],
                "diff_low": row["diff_low"],
                "diff_high": row["diff_high"],
                "margin": row["margin"],
                "reliable": bool(row["reliable"]),
                "stable": bool(row["stable"]),
                "fit_verdict": row["fit_verdict"],
                "recommended": name == comparison.recommended_name,
                "training_elbo": float(np.mean([f.model.get_elbo(fit_cells) for f in seed_fits])),
                "seed0_heldout_lpd": float(
                    seed_fits[0].log_predictive_density(seed_fits.adata_heldout, N_LPD_SAMPLES, 0)["lpd"].mean()
                ),
                "fit_seconds": row["fit_seconds"],
            }
        )
    return pd.DataFrame(rows)


def one_interval_choice(group: pd.DataFrame) -> float:
    """Smallest reliable, stable size whose interval against the best reaches above minus the margin.

    A one-standard-error style rule: a smaller model is kept unless the data show it worse than the best by more
    than the margin (its whole simultaneous interval below minus the margin).
    """
    ok = group["reliable"] & group["stable"] & (group["diff_high"] > -group["margin"])
    return float(group.loc[ok, "n_latent"].min()) if ok.any() else np.nan


def rule_choices(group: pd.DataFrame) -> dict[str, float]:
    """The latent size each rule picks in one replicate (NaN: undetermined)."""
    picked = group.loc[group["recommended"], "n_latent"]
    return {
        "compare_models": float(picked.iloc[0]) if len(picked) else np.nan,
        "one_interval": one_interval_choice(group),
        "training_elbo": float(group.loc[group["training_elbo"].idxmax(), "n_latent"]),
        "single_seed_heldout": float(group.loc[group["seed0_heldout_lpd"].idxmax(), "n_latent"]),
        "heldout_argmax": float(group.loc[group["lpd_per_cell"].idxmax(), "n_latent"]),
    }


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting and rule: replicates, share at the true size, share more than one step off, share undetermined."""
    keys = ["n_sources", "decoder", "n_batches", "replicate"]
    out = []
    for key, group in rows.groupby(keys):
        choices = rule_choices(group)
        truth = int(group["true_size"].iloc[0])
        for rule, k in choices.items():
            out.append({**dict(zip(keys, key, strict=True)), "true_size": truth, "rule": rule, "choice": k})
    picks = pd.DataFrame(out)
    picks["true"] = picks["choice"] == picks["true_size"]
    picks["off_by_more_than_one"] = (picks["choice"] - picks["true_size"]).abs() > 1
    picks["undetermined"] = picks["choice"].isna()
    picks["over"] = picks["choice"] > picks["true_size"]
    picks["under"] = picks["choice"] < picks["true_size"]
    setting = ["decoder", "n_batches", "n_sources", "true_size", "rule"]
    table = picks.groupby(setting, sort=False).agg(
        replicates=("true", "size"),
        true=("true", "mean"),
        over=("over", "mean"),
        under=("under", "mean"),
        off_gt_1=("off_by_more_than_one", "mean"),
        undetermined=("undetermined", "mean"),
    )
    overall = picks.groupby("rule", sort=False).agg(
        replicates=("true", "size"),
        true=("true", "mean"),
        over=("over", "mean"),
        under=("under", "mean"),
        off_gt_1=("off_by_more_than_one", "mean"),
        undetermined=("undetermined", "mean"),
    )
    return table.reset_index(), overall.reset_index()


def main() -> None:
    """Run replicates round by round until the time is up, appending each to the CSV; then print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", default="select_calibration.csv")
    parser.add_argument("--replicates", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=45.0, help="start no replicate after this")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--results", type=Path, default=None, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    path = Path(args.csv)
    start = time.time()
    if not args.table_only:
        warnings.simplefilter("ignore")
        for rep in range(args.replicates):
            for n_sources, decoder, n_batches in SETTINGS:
                done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["n_sources"])
                if (
                    len(done)
                    and (
                        (done["n_sources"] == n_sources)
                        & (done["decoder"] == decoder)
                        & (done["n_batches"] == n_batches)
                        & (done["replicate"] == rep)
                    ).any()
                ):
                    continue
                if time.time() - start > 60 * args.minutes:
                    break
                t = time.time()
                rows = replicate(n_sources, decoder, n_batches, rep)
                rows.to_csv(path, mode="a", header=not path.exists(), index=False)
                picks = rule_choices(rows)
                print(
                    f"{decoder} K={n_sources} batches={n_batches} rep={rep}: {picks} ({time.time() - t:.0f} s)",
                    flush=True,
                )
    rows = pd.read_csv(path)
    table, overall = summary_table(rows)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(overall.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.results is not None:
        write_section(args.results, SECTION, section_body(rows, table, overall))


def section_body(rows: pd.DataFrame, table: pd.DataFrame, overall: pd.DataFrame) -> str:
    """The RESULTS.md section: what was run, the overall and per-setting tables."""
    n_reps = rows.groupby(["n_sources", "decoder", "n_batches", "replicate"]).ngroups
    seconds = rows.groupby(["n_sources", "decoder", "n_batches", "replicate"])["fit_seconds"].sum()
    epochs = diagnose_train_kwargs(None, round(N_CELLS * (1 - HELDOUT)), early_stopping=False)["max_epochs"]
    return "\n".join(
        [
            "## Model selection on known truth: compare_models' recommendation against the simple rules",
            "",
            f"`{command_line()}` (the replicates themselves: `OMP_NUM_THREADS=1 python "
            "benchmarks/select_calibration.py --replicates 3 --minutes 72 --csv benchmarks/select_calibration.csv`, "
            "resumable). " + machine_line(1),
            "",
            f"{n_reps} replicates: NB counts, {N_CELLS} cells x {N_GENES} genes, sources 3, 5, 8 x decoder linear, "
            f"MLP (truth: {TRUE_HIDDEN} leaky-ReLU hidden units; candidates: CountVAE's default 128 ReLU units) x 1 or "
            "2 batches (visited round by round, so settings have equal counts or differ by one). Each candidate "
            f"(true size -{GRID_HALF_WIDTH}..+{GRID_HALF_WIDTH}) fitted as compare_models fits at its defaults: seeds "
            f"{list(SEEDS)}, {epochs} epochs (its training defaults: diagnose's cell-pass budget, no early stopping), "
            f"all seeds of all candidates in one pool of workers, {N_LPD_SAMPLES} importance samples per held-out "
            f"cell; held-out {HELDOUT:.0%} of the cells (its default: 10%). Fit seconds per replicate (all "
            f"candidates and seeds, each fit's own time): median {seconds.median():.0f} s. True size: sources for "
            "MLP, sources + 1 for linear (the library share, section select-library-share).",
            "",
            "Rules on the same fits: `compare_models` (the package's rule: smallest reliable, stable candidate whose "
            "simultaneous interval against the best lies above minus the margin); `one_interval` (smallest reliable, "
            "stable candidate not shown worse than the best by more than the margin: upper bound above minus the "
            "margin); `training_elbo` (highest mean training ELBO); `single_seed_heldout` (highest held-out log p(x) "
            "of seed 0); `heldout_argmax` (highest mean held-out log p(x)). Shares of replicates.",
            "",
            "### All settings",
            "",
            markdown_table(overall, "{:.2f}"),
            "",
            "### Per setting",
            "",
            markdown_table(table, "{:.2f}"),
        ]
    )


if __name__ == "__main__":
    main()
