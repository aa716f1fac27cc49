"""Oracle for the ``seeds`` scenario of ``calibration.py``: did each seed reach the simulating model?

Re-fits the seeds of chosen replicates exactly as ``calibration.py`` does (same
simulated data, split, seeds and training; fits are deterministic on CPU) and
compares each seed with the simulation's truth, which the report never sees:

* ``decoded_vs_truth``: concordance of the seed's decoded log means at the
  posterior mean with the true log means on the held-out cells, both centred
  per cell (library size) and per gene;
* ``min_source_r2``: the smallest R^2 of a true source regressed on the seed's
  held-out posterior means (as ``calibration.source_recovery``, per seed);
* ``ica_vs_truth``: the smallest best-match |correlation| of the seed's ICA
  components (estimated on all fit cells) with the true sources, on the
  held-out cells.

Per pair of seeds it also writes the report's decoded-means score on all
held-out cells (``decoded_pair``, to check that the re-fits are the fits of the
calibration run) and the worst best-match |correlation| between the two seeds'
ICA components, each estimated on all fit cells (``ica_pair``).

With ``--ica-pool N`` (``kind`` ``ica_pool``, one row per replicate): each seed's ICA estimated on halves of
``N`` fresh cells drawn from the simulation's own parameters (the report's design: seed 0 on one half, the
others on the other), matched on the held-out cells, with the report's rule: the worst match (``ica_worst``),
the same seed's split-half match (``ica_same_fit``), their ratio (``ica_corrected``) and the verdict
(``verdict``). Twenty thousand cells fix each ICA far better than the 2,000-cell halves of the fit cells.

Subsets (``kind`` ``subset``): the report on random subsets of the held-out
cells (``--sizes``, ``--subsets`` draws each; 20 cells for log p(x), whose row
is not scored here) and on all of them, one row per (size, draw, report row)
with its verdict and interval: how few cells a row needs before its verdict on
a subset stops contradicting its verdict on all held-out cells of the same fits.

    python benchmarks/calibration_oracle.py --replicates 1,9 --out oracle.csv
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import Config, _fit  # noqa: E402

from countvae._io import write_text_atomic


def _double_centred(x: np.ndarray) -> np.ndarray:
    x = x - x.mean(axis=1, keepdims=True)
    return x - x.mean(axis=0, keepdims=True)


def fresh_cells(adata, n: int, seed: int):
    """``n`` new cells of a linear simulation, drawn from the parameters ``simulate`` stored (same genes)."""
    import anndata as ad
    import scipy.sparse as sp

    import countvae as cv

    p = adata.uns["simulation"]
    rng = np.random.default_rng(seed)
    z = cv.data.draw_sources(str(p["sources"]), n, p["W"].shape[1], rng)
    observed = np.log(adata.obs["size_factor"].to_numpy())  # the simulation's own log library sizes
    log_size = rng.normal(observed.mean(), observed.std(), n)
    mu = np.exp(log_size[:, None] + p["b"] + z @ p["W"].T)
    counts = rng.poisson(rng.gamma(shape=p["theta"], scale=mu / p["theta"]))
    cells = ad.AnnData(sp.csr_matrix(counts[counts.max(axis=1) <= 2**24].astype(np.float32)), var=adata.var.copy())
    cells.obs_names = [f"fresh{i}" for i in range(cells.n_obs)]
    cv.CountVAE.setup_anndata(cells)
    return cells


def ica_pool_row(replicate: int, fits, heldout, pool) -> dict:
    """The report's ICA rule with each seed's ICA estimated on halves of ``pool``, matched on ``heldout``."""
    from countvae.diagnostics import ReportSettings
    from countvae.diagnostics.analyses.components import ica_component_stability
    from countvae.diagnostics.analyses.resampling import cell_bootstrap
    from countvae.diagnostics.reporting.verdicts import ica_row_judgement, judge_components

    s = ReportSettings()
    table = ica_component_stability(
        {f.name: np.asarray(f.latent(heldout), dtype=np.float64) for f in fits},
        cell_bootstrap(heldout.n_obs, s.n_bootstrap, seed=s.seed + 2000, max_cells=s.max_bootstrap_cells),
        fit_cells={f.name: np.asarray(f.latent(pool), dtype=np.float64) for f in fits},
    ).table
    judged = judge_components(table, s.ica_threshold)
    return {
        "replicate": replicate,
        "kind": "ica_pool",
        "a": pool.n_obs,
        "ica_worst": float(judged["worst_match"].min()),
        "ica_same_fit": float(judged["same_fit_match"].min()),
        "ica_corrected": float(judged["corrected_match"].min()),
        "verdict": ica_row_judgement(judged).verdict,
    }


def oracle_replicate(
    replicate: int, cfg: Config, sizes: tuple[int, ...] = (), n_subsets: int = 2, ica_pool: int = 0
) -> list[dict]:
    """Per seed and per pair of seeds of one replicate: agreement with the truth and with each other."""
    import torch

    torch.set_num_threads(1)
    from bilipschitz import true_log_rate_jacobian

    import countvae as cv
    from countvae.diagnostics import CountVAEFit, report
    from countvae.diagnostics.analyses.invariants import concordance, gene_centred_concordance
    from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
    from countvae.errors import NonIdentifiableComponentsWarning
    from countvae.ica import ICARotation
    from countvae.metrics import match_components

    adata = cv.data.simulate(
        n_cells=cfg.n_cells,
        n_genes=cfg.n_genes,
        n_latent=cfg.n_latent,
        decoder="linear",
        sources="laplace",
        seed=10_000 + 2 * replicate,
        large_counts="drop",  # as calibration.py
    )
    cv.CountVAE.setup_anndata(adata)
    fit_idx, held_idx = heldout_split(adata.n_obs, cfg.heldout_fraction, replicate)
    fit_cells, heldout = cells_at(adata, fit_idx), cells_at(adata, held_idx)
    true_log_mean, _ = true_log_rate_jacobian(heldout)
    truth = heldout.obsm["z_true"]
    rows, per_seed, fits = [], {}, []
    for seed in range(cfg.n_seeds):
        started = time.perf_counter()
        model = _fit(cv, fit_cells, cfg, seed, cfg.epochs)
        fit = CountVAEFit(model, seed)
        fits.append(fit)
        z_held, z_fit = fit.latent(heldout), fit.latent(fit_cells)
        log_rate = fit.decode_log_rate(heldout, z_held)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonIdentifiableComponentsWarning)
            ica = ICARotation(random_state=0).fit(z_fit)
        s_held = ica.transform(z_held)
        design = np.column_stack([np.ones(len(z_held)), z_held])
        coef, *_ = np.linalg.lstsq(design, truth, rcond=None)
        centred = truth - truth.mean(axis=0)
        r2 = 1.0 - ((truth - design @ coef) ** 2).sum(axis=0) / (centred**2).sum(axis=0)
        per_seed[seed] = (log_rate, s_held)
        rows.append(
            {
                "replicate": replicate,
                "kind": "seed",
                "a": seed,
                "b": "truth",
                "decoded_vs_truth": concordance(_double_centred(log_rate), _double_centred(true_log_mean)),
                "min_source_r2": float(r2.min()),
                "ica_vs_truth": float(np.abs(match_components(truth, s_held).correlations).min()),
                "fit_seconds": time.perf_counter() - started,
            }
        )
    for a, b in combinations(range(cfg.n_seeds), 2):
        (rate_a, s_a), (rate_b, s_b) = per_seed[a], per_seed[b]
        rows.append(
            {
                "replicate": replicate,
                "kind": "pair",
                "a": a,
                "b": b,
                "decoded_pair": gene_centred_concordance(rate_a, rate_b),
                "ica_pair": float(np.abs(match_components(s_a, s_b).correlations).min()),
            }
        )
    if ica_pool:
        rows.append(ica_pool_row(replicate, fits, heldout, fresh_cells(adata, ica_pool, 50_000 + replicate)))
    rng = np.random.default_rng(replicate)
    draws = [(heldout.n_obs, 0)] + [(n, d) for n in sizes for d in range(n_subsets)] if sizes else []
    for n, d in draws:
        cells = heldout if n == heldout.n_obs else heldout[np.sort(rng.choice(heldout.n_obs, n, replace=False))].copy()
        rep = report(fits, cells, adata_fit=fit_cells, max_lpd_cells=20, n_lpd_samples=cfg.n_lpd_samples)
        for r in rep.invariants.itertuples(index=False):
            rows.append(
                {
                    "replicate": replicate,
                    "kind": "subset",
                    "a": n,
                    "b": d,
                    "row": r.quantity,
                    "verdict": r.verdict,
                    "agreement": r.agreement,
                    "low": r.low,
                    "high": r.high,
                    "aligned_low": r.aligned_low,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the oracle on the given replicates and write one CSV (rewritten after each replicate)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", required=True, help="comma-separated replicate numbers")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument(
        "--sizes",
        default="40,80,160,320,640",
        help="comma-separated subset sizes (held-out cells); empty: no reports, the oracle alone",
    )
    parser.add_argument("--subsets", type=int, default=2, help="random subsets per size")
    parser.add_argument("--ica-pool", type=int, default=0, help="fresh cells for each seed's ICA (0: none)")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for r in (int(v) for v in args.replicates.split(",")):
        sizes = tuple(int(v) for v in args.sizes.split(",") if v)
        rows += oracle_replicate(r, Config(), sizes, args.subsets, args.ica_pool)
        write_text_atomic(args.out, pd.DataFrame(rows).to_csv(index=False), overwrite=True)
        mine = pd.DataFrame([x for x in rows if x["replicate"] == r and x["kind"] != "subset"])
        print(mine.round(3).to_string(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
