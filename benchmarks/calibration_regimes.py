"""Verdicts calibrated against the truth about the fits, in the regimes analysts run.

A verdict claims that *these fits* agree (or differ) on cells from this
distribution. Its truth is the same computation on a large independent pool of
cells from the same distribution (the oracle): the report on ``n_heldout``
cells is scored against the report of the same fits on ``n_pool`` other cells.
Whether the seeds reached one solution is a separate question, answered by
:mod:`countvae.diagnostics.analyses.seed_groups` on both cell sets (one extra,
deliberately under-trained fit per replicate gives it a known different
solution).

Regimes (:data:`REGIMES`):

``semi-synthetic``
    Counts drawn from a default model (MLP decoder, NB, 10 latent dimensions,
    batch) fitted once to Kang (500 most variable genes); each replicate draws
    fresh counts for random Kang cells (a posterior predictive draw: each
    cell's latent from the generator's guide, its batch and library size), fits
    ``n_seeds`` default models with early stopping on ``n_fit`` cells, reports
    on ``n_heldout`` and scores against ``n_pool`` more cells. The generator is
    cached under ``--cache`` (not in the repository).
``semi-synthetic-10k``
    ``semi-synthetic`` at the size of a typical droplet experiment: 10,000
    cells, split as ``diagnose``'s default does (9,000 fitted, 1,000 held
    out). The source has fewer cells than a replicate needs, so they are drawn
    with replacement, each draw with its own latent and counts (as
    ``semi-pbmc3tech``).
``kang``
    The same on real Kang cells (500 most variable genes): each replicate
    shuffles the cells into fit, held-out and pool sets.
``kang-small-140`` and ``kang-small-300``
    A small file of 1,400 real Kang cells, split as ``diagnose``'s default 10%
    gives it (1,260 fitted, 140 held out) and with 300 held out (1,100 fitted):
    how many rows each split decides, and how often rightly.
``semi-pbmc3tech``
    As ``semi-synthetic``, with the generator fitted to all 2,000 pbmc_3tech
    cells (three 10x chemistries as the batch): a 2,000-cell file (1,700
    fitted, 300 held out). The source has fewer cells than a replicate needs,
    so its cells are drawn with replacement; each draw has its own latent (from
    the generator's guide) and its own counts, so no two cells are copies.
``scvi-kang-small-300``
    ``kang-small-300`` with scvi-tools' SCVI as analysts fit it (its defaults:
    ZINB, 10 latent dimensions, 1 x 128 hidden, the batch covariate; its own
    early stopping), audited through :class:`~countvae.diagnostics.SCVIFit`.
``linear-toy``
    The suite's simulation (``calibration.py``: a linear NB model with 3
    Laplace sources, 300 genes, 4,000 fit and 1,000 held-out cells, 150 epochs
    per seed), scored against the same oracle as every other regime. Its
    simulator draws as many cells as asked, so its ICA oracle is estimated on
    ``n_ica_pool`` more cells of the distribution (halves of 10,000 each) and
    matched on the pool: the truth about the seeds' ICA axes, not about their
    estimate on the fit cells the report uses.

In the other regimes the pool report's ICA is estimated, as the report's, on
halves of the fit cells (their pools are smaller than the fit cells), so there
the oracle checks the matching of the components, not their estimation.

A confident verdict (agree, agree after alignment, differ) is *correct* when
the oracle gives the same verdict, *wrong* when the oracle gives another
confident verdict, and *oracle undecided* when the oracle itself is
undetermined (not scored). Each replicate appends its rows to the CSV (and its
grouping inputs to ``<csv stem>_arrays/replicate_N.npz``); a rerun skips the
replicates already there.

    python benchmarks/calibration_regimes.py --regime semi-synthetic --replicates 20 --out /tmp/calreg/semi.csv
    python benchmarks/calibration_regimes.py --summarize /tmp/calreg/semi.csv --notes NOTES.md  # RESULTS section
    python benchmarks/calibration_regimes.py --regime kang --replicates 2 --quick --out /tmp/calreg/q.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_RESULTS, command_line, load_average, machine_line  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
#: The real files a regime's cells come from (all have ``obs["batch"]``).
SOURCES = {"kang": DATA / "kang2018_pbmc_ctrl_5donors.h5ad", "pbmc3tech": DATA / "pbmc_3tech_savercat.h5ad"}
KANG = SOURCES["kang"]
#: Genes a source keeps only where detected in at least this many of its cells: pbmc_3tech's most variable genes
#: include some seen in a handful of its 2,000 cells, which a generator fitted to them leaves at zero counts in
#: all fit cells of a replicate (a gene a model cannot be fitted to).
MIN_CELLS_PER_GENE = {"kang": 0, "pbmc3tech": 20}
#: Each regime's settings, where they differ from :class:`Config`'s.
REGIMES = {
    "semi-synthetic": {"synthetic": True},
    "semi-synthetic-10k": {"synthetic": True, "n_fit": 9000, "n_heldout": 1000},
    "kang": {},
    "kang-small-140": {"n_fit": 1260, "n_heldout": 140},
    "kang-small-300": {"n_fit": 1100, "n_heldout": 300},
    "semi-pbmc3tech": {"source": "pbmc3tech", "synthetic": True, "n_fit": 1700, "generator_cells": 2000},
    "scvi-kang-small-300": {"fitter": "scvi", "n_fit": 1100, "n_heldout": 300},
    "linear-toy": {
        "source": "simulated",
        "decoder": "linear",
        "n_latent": 3,
        "n_genes": 300,
        "n_fit": 4000,
        "n_heldout": 1000,
        "max_epochs": 150,
        "n_ica_pool": 20_000,
    },
}
AGREE, ALIGNED, DIFFER, UNDETERMINED = "agree", "agree after alignment", "differ", "undetermined"
CONFIDENT = (AGREE, ALIGNED, DIFFER)
#: Report settings of the oracle: every row on as many pool cells as is affordable (and the k-NN row's graph
#: sized as the analyst's: see ``run_replicate``).
ORACLE_SETTINGS = dict(max_lpd_cells=1000, max_ppc_cells=4000, max_expression_cells=4000, max_distance_cells=2000)


@dataclass(frozen=True)
class Config:
    """One replicate's cells and fits (countvae's default model: MLP decoder, NB, 10 latent dimensions, batch).

    ``source`` names the real file (:data:`SOURCES`); ``synthetic`` draws the
    cells' counts from a default model fitted to it instead of using its cells;
    ``fitter`` is ``"countvae"`` or ``"scvi"`` (scvi-tools' SCVI with its
    defaults, through :class:`~countvae.diagnostics.SCVIFit`). ``source``
    ``"simulated"`` is ``calibration.py``'s linear simulation (no real file):
    its seeds are trained ``max_epochs`` without early stopping, as there.
    ``n_ica_pool`` more cells, when positive, are drawn for the oracle's ICA.
    """

    regime: str = "semi-synthetic"
    source: str = "kang"
    synthetic: bool = False
    fitter: str = "countvae"
    n_genes: int = 500
    n_fit: int = 1500
    n_heldout: int = 300
    n_pool: int = 4000
    n_seeds: int = 3
    n_latent: int = 10
    short_epochs: tuple[int, ...] = (2, 20)
    generator_cells: int = 4000
    max_epochs: int | None = None  # None: the default for the number of cells, with early stopping
    decoder: str = "mlp"
    n_ica_pool: int = 0


QUICK = Config(n_fit=400, n_heldout=150, n_pool=600, n_genes=100, n_seeds=2, generator_cells=800, max_epochs=60)


def _kang(n_genes: int):
    return _real_cells("kang", n_genes)


def _real_cells(source: str, n_genes: int):
    """The ``n_genes`` most variable genes of a real file, set up with its batch."""
    import anndata as ad

    import countvae as cv

    adata = ad.read_h5ad(SOURCES[source])
    if MIN_CELLS_PER_GENE[source]:
        detected = np.asarray((adata.X > 0).sum(axis=0)).ravel()
        adata = adata[:, detected >= MIN_CELLS_PER_GENE[source]].copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    adata = cv.data.select_top_genes(adata, n_genes)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


def generator(cfg: Config, cache: Path):
    """The semi-synthetic generator: a default countvae fitted once to the source's cells, cached under ``cache``."""
    import countvae as cv

    adata = _real_cells(cfg.source, cfg.n_genes)
    folder = cache / f"generator_{cfg.source}_{cfg.n_genes}genes_{cfg.generator_cells}cells"
    if MIN_CELLS_PER_GENE[cfg.source]:
        folder = folder.with_name(folder.name + f"_min{MIN_CELLS_PER_GENE[cfg.source]}cells")
    if (folder / "model.pt").exists() or any(folder.glob("*")):
        return cv.CountVAE.load(folder, adata=adata), adata
    cells = adata[np.random.default_rng(0).permutation(adata.n_obs)[: cfg.generator_cells]].copy()
    cv.CountVAE.setup_anndata(cells, batch_key="batch")
    model = cv.CountVAE(cells, n_latent=cfg.n_latent)
    model.train(max_epochs=cfg.max_epochs, early_stopping=True, progress_bar=False, seed=0)
    model.save(folder, overwrite=True)
    return cv.CountVAE.load(folder, adata=adata), adata


def replicate_cells(cfg: Config, replicate: int, source):
    """Fit, held-out and pool cells of one replicate (disjoint; fresh counts in the semi-synthetic regime)."""
    import anndata as ad
    import scipy.sparse as sp

    import countvae as cv

    if cfg.source == "simulated":
        return _simulated_cells(cfg, replicate)
    model, adata = source
    n = cfg.n_fit + cfg.n_heldout + cfg.n_pool
    rng = np.random.default_rng(1_000 + replicate)
    if n <= adata.n_obs:
        order = rng.permutation(adata.n_obs)[:n]
    elif model is not None:
        # Fresh latents and counts for every draw, so a source cell drawn twice gives two different cells.
        order = rng.choice(adata.n_obs, size=n, replace=True)
    else:
        raise ValueError(f"{n} real cells asked for but the source has {adata.n_obs}; lower --n-pool.")
    if model is None:
        cells = adata[order].copy()
    elif n <= adata.n_obs:
        counts = model.posterior_predictive_sample(adata, indices=order, n_samples=1, seed=2_000 + replicate)
        cells = ad.AnnData(sp.csr_matrix(counts.astype(np.float32)), obs=adata.obs.iloc[order].copy(), var=adata.var)
    else:  # the drawn source cells as cells of their own (the model takes each cell once per call)
        drawn = ad.AnnData(adata.X[order], obs=adata.obs.iloc[order].reset_index(drop=True), var=adata.var)
        drawn.obs_names = [f"draw{i}" for i in range(n)]
        cv.CountVAE.setup_anndata(drawn, batch_key="batch")
        counts = model.posterior_predictive_sample(drawn, n_samples=1, seed=2_000 + replicate)
        cells = ad.AnnData(sp.csr_matrix(counts.astype(np.float32)), obs=drawn.obs.copy(), var=adata.var)
    cells.obs_names = [f"cell{i}" for i in range(cells.n_obs)]
    cv.CountVAE.setup_anndata(cells, batch_key="batch")
    cuts = np.cumsum([cfg.n_fit, cfg.n_heldout])
    return cells[: cuts[0]].copy(), cells[cuts[0] : cuts[1]].copy(), cells[cuts[1] :].copy()


def _simulated_cells(cfg: Config, replicate: int):
    """Fit, held-out, pool and ICA-pool cells of one simulated replicate (one draw of the linear Laplace model).

    Laplace sources have heavy tails: among tens of thousands of cells a few reach counts above 2**24, which no
    model here represents exactly (``setup_anndata`` refuses them). They are left out of every set alike, so the
    fits, the report and the oracle all see the same distribution (the simulator's, without its last 1e-4 or so).
    """
    import countvae as cv

    n = cfg.n_fit + cfg.n_heldout + cfg.n_pool + cfg.n_ica_pool
    adata = cv.data.simulate(
        n_cells=n + n // 100,
        n_genes=cfg.n_genes,
        n_latent=cfg.n_latent,
        decoder=cfg.decoder,
        sources="laplace",
        seed=30_000 + replicate,
        large_counts="drop",
    )
    adata = adata[:n].copy()
    if adata.n_obs < n:
        raise ValueError(f"replicate {replicate}: fewer than {n} simulated cells with counts below 2**24")
    cv.CountVAE.setup_anndata(adata)
    cuts = np.cumsum([cfg.n_fit, cfg.n_heldout, cfg.n_pool])
    parts = np.split(np.random.default_rng(1_000 + replicate).permutation(n), cuts)
    return tuple(adata[np.sort(p)].copy() for p in parts)


def _report_capturing(fits, heldout, adata_fit, settings):
    """The report, and the per-fit arrays it collected (captured by wrapping the pipeline's ``collect``)."""
    from countvae.diagnostics import report
    from countvae.diagnostics.reporting import pipeline

    captured = {}
    original = pipeline.collect

    def collect(*args, **kwargs):
        captured["collected"] = original(*args, **kwargs)
        return captured["collected"]

    pipeline.collect = collect
    try:
        rep = report(fits, heldout, adata_fit=adata_fit, **settings)
    finally:
        pipeline.collect = original
    return rep, captured["collected"]


def _grouping_inputs(collected, extra, heldout, settings) -> dict[str, np.ndarray]:
    """What the seed grouping reads, for the report's fits and the extra fits, on the report's cell subsets."""
    from countvae.diagnostics import ReportSettings

    s = ReportSettings(**settings)
    sub = collected.subsets
    out: dict[str, np.ndarray] = {"baseline": np.asarray(collected.baseline_lpd, dtype=np.float64)}
    for name, arrays in collected.arrays.items():
        out[f"log_rate/{name}"] = arrays.log_rate
        out[f"lpd/{name}"] = arrays.lpd["lpd"].to_numpy(dtype=np.float64)
        out[f"mc_se/{name}"] = arrays.lpd["mc_se"].to_numpy(dtype=np.float64)
        out[f"latent/{name}"] = arrays.latent.astype(np.float32)
        if arrays.latent_fit is not None:
            out[f"latent_fit/{name}"] = arrays.latent_fit.astype(np.float32)
    expression, lpd_cells = heldout[sub.expression].copy(), heldout[sub.lpd].copy()
    for fit in extra:
        z = np.asarray(fit.latent(expression), dtype=np.float32)
        out[f"log_rate/{fit.name}"] = np.asarray(fit.decode_log_rate(expression, z), dtype=np.float64)[:, sub.genes]
        frame = fit.log_predictive_density(lpd_cells, s.n_lpd_samples, s.seed)
        out[f"lpd/{fit.name}"] = frame["lpd"].to_numpy(dtype=np.float64)
        out[f"mc_se/{fit.name}"] = frame["mc_se"].to_numpy(dtype=np.float64)
        out[f"latent/{fit.name}"] = np.asarray(fit.latent(heldout), dtype=np.float32)
    return out


def fit_one(cfg: Config, fit_cells, seed: int, max_epochs: int | None = None, early_stopping: bool = True):
    """One fit of the regime's model as a :class:`FittedModel`, and the epochs it trained."""
    if cfg.fitter == "scvi":
        return _scvi_fit(fit_cells, seed, max_epochs, early_stopping)
    import countvae as cv
    from countvae.diagnostics import CountVAEFit

    if cfg.source == "simulated":  # calibration.py's fits: a fixed schedule, its learning rate and batch size
        model = cv.CountVAE(fit_cells, n_latent=cfg.n_latent, decoder=cfg.decoder, likelihood="nb")
        model.train(early_stopping=False, max_epochs=max_epochs, batch_size=256, lr=1e-2, progress_bar=False, seed=seed)
        return CountVAEFit(model, seed), int(max_epochs)
    model = cv.CountVAE(fit_cells, n_latent=cfg.n_latent)
    model.train(max_epochs=max_epochs, early_stopping=early_stopping, progress_bar=False, seed=seed)
    return CountVAEFit(model, seed), int(model.training_summary["epochs_trained"])


def _scvi_fit(fit_cells, seed: int, max_epochs: int | None, early_stopping: bool):
    """scvi-tools' SCVI with its defaults (ZINB, 10-d, batch), trained as its ``train`` does by default."""
    import scvi

    from countvae.diagnostics import SCVIFit
    from countvae.diagnostics.fitting.scvi_storage import quiet_scvi

    cells = fit_cells.copy()
    with quiet_scvi():
        scvi.settings.seed = seed
        scvi.model.SCVI.setup_anndata(cells, batch_key="batch")
        model = scvi.model.SCVI(cells)
        model.train(
            max_epochs=max_epochs,
            early_stopping=early_stopping,
            accelerator="cpu",
            devices=1,
            enable_progress_bar=False,
        )
    return SCVIFit(model, seed=seed), len(model.history["elbo_train"])


def run_replicate(cfg: Config, replicate: int, source, arrays_dir: Path) -> list[dict]:
    """One replicate: fits, the report on the held-out cells and on the pool; one row per report row."""
    import torch

    torch.set_num_threads(1)
    fit_cells, heldout, pool, *ica_pool = replicate_cells(cfg, replicate, source)
    started = time.perf_counter()
    fits, epochs = zip(*(fit_one(cfg, fit_cells, seed, cfg.max_epochs) for seed in range(cfg.n_seeds)), strict=True)
    fit_seconds = (time.perf_counter() - started) / cfg.n_seeds
    short = cfg.short_epochs[replicate % len(cfg.short_epochs)]
    bad, _ = fit_one(cfg, fit_cells, cfg.n_seeds, short, early_stopping=False)
    bad.name = f"seed {cfg.n_seeds} ({short} epochs)"
    extra = [bad]
    rows = []
    # The oracle's k-NN row speaks for the analyst's graph (fit and held-out cells), not for pool and fit cells.
    oracle = ORACLE_SETTINGS | {"knn_graph_cells": cfg.n_fit + cfg.n_heldout}
    for where, cells, settings in (("heldout", heldout, {}), ("pool", pool, oracle)):
        started = time.perf_counter()
        rep, collected = _report_capturing(list(fits), cells, fit_cells, settings)
        invariants = rep.invariants
        if where == "pool" and ica_pool and ica_pool[0].n_obs:
            invariants = _with_pool_ica(invariants, fits, cells, ica_pool[0], settings)
        seconds = time.perf_counter() - started
        np.savez_compressed(
            arrays_dir / f"replicate_{replicate}_{where}.npz", **_grouping_inputs(collected, extra, cells, settings)
        )
        rows += [
            {
                "regime": cfg.regime,
                "replicate": replicate,
                "cells": where,
                "row": r.quantity,
                "verdict": r.verdict,
                "agreement": r.agreement,
                "low": r.low,
                "high": r.high,
                "n_cells": r.n_cells,
                "report_seconds": seconds,
                "fit_seconds_per_seed": fit_seconds,
                "epochs": ";".join(str(e) for e in epochs),
                "short_epochs": short,
            }
            for r in invariants.itertuples(index=False)
        ]
    return rows


def _with_pool_ica(invariants: pd.DataFrame, fits, pool, ica_pool, settings: dict) -> pd.DataFrame:
    """The oracle's ICA row from each fit's ICA on halves of ``ica_pool``, matched on ``pool``, judged as the report.

    The report estimates each ICA on halves of the fit cells; the truth about the fits' ICA axes is their ICA on
    the distribution, which a large independent draw approximates.
    """
    from countvae.diagnostics.reporting.verdicts import ICA_QUANTITY, ica_row_judgement

    judged = pool_ica_components(fits, pool, ica_pool, settings)
    out = invariants.copy()
    at = out["quantity"] == ICA_QUANTITY
    out.loc[at, "verdict"] = ica_row_judgement(judged).verdict
    out.loc[at, "agreement"] = float(judged["corrected_match"].min())
    out.loc[at, "low"] = float(judged["corrected_low"].min())
    out.loc[at, "high"] = float(judged["corrected_high"].min())
    out.loc[at, "n_cells"] = pool.n_obs
    return out


def pool_ica_components(fits, pool, ica_pool, settings: dict) -> pd.DataFrame:
    """Each ICA component of the fits, estimated on halves of ``ica_pool`` and matched on ``pool``, judged."""
    from countvae.diagnostics import ReportSettings
    from countvae.diagnostics.analyses.components import ica_component_stability
    from countvae.diagnostics.analyses.resampling import cell_bootstrap
    from countvae.diagnostics.reporting.verdicts import judge_components

    s = ReportSettings(**settings)
    stability = ica_component_stability(
        {f.name: np.asarray(f.latent(pool), dtype=np.float64) for f in fits},
        cell_bootstrap(pool.n_obs, s.n_bootstrap, seed=s.seed + 2000, max_cells=s.max_bootstrap_cells),
        fit_cells={f.name: np.asarray(f.latent(ica_pool), dtype=np.float64) for f in fits},
        alpha=s.alpha,
        seed=s.seed,
    )
    return judge_components(stability.table, s.ica_threshold)


# ----- scoring ------------------------------------------------------------------------------------------
def score(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (regime, replicate, report row): the verdict on the held-out cells, the oracle's, the outcome.

    ``outcome`` is ``correct`` (a confident verdict the oracle repeats),
    ``wrong`` (a confident verdict the oracle contradicts with another
    confident one), ``oracle undecided`` (a confident verdict where the oracle
    is undetermined) or ``undetermined`` (the report on the held-out cells is).
    """
    keys = ["regime", "replicate", "row"]
    held = runs[runs["cells"] == "heldout"].set_index(keys)
    pool = runs[runs["cells"] == "pool"].set_index(keys)
    out = held[["verdict", "agreement", "low", "high", "n_cells"]].join(
        pool[["verdict", "agreement", "low", "high", "n_cells"]], rsuffix="_oracle", how="inner"
    )

    def outcome(verdict: str, oracle: str) -> str:
        if verdict not in CONFIDENT:
            return "undetermined"
        if oracle not in CONFIDENT:
            return "oracle undecided"
        return "correct" if verdict == oracle else "wrong"

    out["outcome"] = [outcome(v, o) for v, o in zip(out["verdict"], out["verdict_oracle"], strict=True)]
    return out.reset_index()


def correct_rate_lower_bound(correct: int, confident: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound on the share of confident verdicts that are correct (NaN for none).

    With every verdict confirmed it is ``(1 - level) ** (1 / confident)``: 20 of 20 bound the rate only
    above 86%, so the goal of 95% is shown, not just met, from 59 of 59.
    """
    from scipy.stats import beta

    if confident == 0:
        return float("nan")
    return float(beta.ppf(1.0 - level, correct, confident - correct + 1)) if correct else 0.0


def rates(scored: pd.DataFrame) -> pd.DataFrame:
    """Per regime and row: confident verdicts, the share the oracle confirms, and the share undetermined."""
    rows = []
    for (regime, row), g in scored.groupby(["regime", "row"], sort=False):
        counts = g["outcome"].value_counts()
        confident = int(counts.get("correct", 0) + counts.get("wrong", 0))
        rows.append(
            {
                "regime": regime,
                "row": row,
                "replicates": len(g),
                "confident (oracle decided)": confident,
                "correct": int(counts.get("correct", 0)),
                "wrong": int(counts.get("wrong", 0)),
                "oracle undecided": int(counts.get("oracle undecided", 0)),
                "undetermined": int(counts.get("undetermined", 0)),
                "correct % of confident": 100.0 * counts.get("correct", 0) / confident if confident else np.nan,
                "lower 95% bound": 100.0 * correct_rate_lower_bound(int(counts.get("correct", 0)), confident),
                "undetermined %": 100.0 * counts.get("undetermined", 0) / len(g),
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regime", choices=REGIMES, default="semi-synthetic")
    parser.add_argument("--replicates", type=int, default=20)
    parser.add_argument("--first", type=int, default=0, help="first replicate number")
    parser.add_argument("--out", type=Path, default=Path("/tmp/countvae_calibration/regimes.csv"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/countvae_calibration"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--wall-minutes", type=float, default=0.0, help="stop starting replicates after this long")
    parser.add_argument("--summarize", type=Path, nargs="*", help="CSV(s) to summarize into RESULTS.md")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--notes", type=Path, help="hand-written notes appended to the section")
    parser.add_argument("--section", default="calibration-regimes", help="the RESULTS.md section to write")
    parser.add_argument("--title-suffix", default="", help="added to the section's title")
    parser.add_argument(
        "--calibration-file",
        type=Path,
        default=None,
        help="with --summarize: the record whose regimes it writes (default: the bundled one, which reports read)",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        from calibration_regimes_summary import summarize

        summarize(
            args.summarize,
            args.results,
            command_line(),
            **({"calibration_file": args.calibration_file} if args.calibration_file else {}),
            notes=args.notes,
            section=args.section,
            title_suffix=args.title_suffix,
        )
        return
    settings = REGIMES[args.regime]
    if args.quick:  # QUICK's sizes, the regime's cells and model
        kinds = {k: v for k, v in settings.items() if k in ("source", "synthetic", "fitter", "decoder", "n_latent")}
        cfg = replace(QUICK, regime=args.regime, n_ica_pool=min(settings.get("n_ica_pool", 0), 2000), **kinds)
    else:
        cfg = Config(regime=args.regime, **settings)
    import torch

    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    arrays_dir = args.out.with_name(args.out.stem + "_arrays")
    arrays_dir.mkdir(exist_ok=True)
    done = set(pd.read_csv(args.out)["replicate"]) if args.out.exists() else set()
    args.cache.mkdir(parents=True, exist_ok=True)
    if cfg.source == "simulated":
        source = None
    else:
        source = generator(cfg, args.cache) if cfg.synthetic else (None, _real_cells(cfg.source, cfg.n_genes))
    print(machine_line(1), "| load", load_average(), "| config", asdict(cfg), flush=True)
    started = time.perf_counter()
    for replicate in range(args.first, args.first + args.replicates):
        if replicate in done:
            continue
        if args.wall_minutes and time.perf_counter() - started > 60 * args.wall_minutes:
            print(f"stopping after {args.wall_minutes} min", flush=True)
            break
        t = time.perf_counter()
        rows = run_replicate(cfg, replicate, source, arrays_dir)
        frame = pd.DataFrame(rows)
        frame.to_csv(args.out, mode="a", header=not args.out.exists(), index=False)
        held = frame[frame["cells"] == "heldout"].set_index("row")["verdict"]
        oracle = frame[frame["cells"] == "pool"].set_index("row")["verdict"]
        flips = [r for r in held.index if held[r] in CONFIDENT and oracle[r] in CONFIDENT and held[r] != oracle[r]]
        print(f"replicate {replicate}: {time.perf_counter() - t:.0f} s; contradicted: {flips}", flush=True)


if __name__ == "__main__":
    main()
