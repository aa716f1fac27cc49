"""Step 2 of the report: every analysis, each a function of the collected arrays.

No fitted model is called here. The maps between fits are fitted once per pair
on each set of cells they are needed on: the alignment fits its own on half of
the held-out cells (it scores them on the other half), and one
:class:`~countvae.diagnostics.analyses.maps.PairMaps` on all held-out cells
serves the cross-seed spread of guide draws (maps to the first fit), the
consensus latent (the same maps) and the invariants table (maps between every pair). Each seed's ICA for the component
table is estimated once, on halves of the fit cells when they are known; the
invariants table's ICA row and the ground truth read that one result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.alignment import MAP_CLASSES, alignment_errors, ica_efficiency, summarize_alignment
from countvae.diagnostics.analyses.components import ComponentStability, empty_stability, ica_component_stability
from countvae.diagnostics.analyses.ground_truth import TRUTH_COLUMNS, ground_truth_table
from countvae.diagnostics.analyses.invariants import InvariantInputs, ResamplingSettings, invariants_table
from countvae.diagnostics.analyses.maps import PairMaps
from countvae.diagnostics.analyses.markers import marker_correlations, marker_r2_table, marker_summary
from countvae.diagnostics.analyses.ppc import PPCStatistics, observed_statistics, ppc_agreement, ppc_table
from countvae.diagnostics.analyses.predictive import (
    compare_table,
    equivalence_margin,
    equivalence_table,
    estimator_reliability,
    per_fit_table,
)
from countvae.diagnostics.analyses.resampling import cell_bootstrap
from countvae.diagnostics.analyses.rhat import add_baseline, rhat_chains, rhat_table
from countvae.diagnostics.analyses.stability_columns import (
    cell_knn_agreement,
    cell_knn_baseline,
    cell_lpd_summary,
    consensus_latent,
    gene_decoded_agreement,
)
from countvae.diagnostics.analyses.subspace import covariance_spectrum, geometry_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch


@dataclass
class Analyses:
    """The result of every analysis (tables by their name in the report).

    ``predictive_pairs``, ``predictive_reliability`` and ``predictive_compare``
    are ``None`` when a fit cannot estimate log p(x); ``ica_efficiency`` is
    ``None`` without ICA. ``invariants`` holds the agreement numbers, intervals
    and thresholds; the verdicts are added by :mod:`.verdicts`, as are those of
    the ICA components (``ica``). ``heldout_maps`` are the maps fitted on all
    held-out cells (shared by the guide spread, the consensus latent and the
    invariants table). ``cells``, ``genes`` and ``consensus`` are the per-cell and
    per-gene columns and the consensus latent (:func:`stability_columns`).
    """

    predictive: pd.DataFrame
    predictive_pairs: pd.DataFrame | None
    predictive_reliability: pd.DataFrame | None
    predictive_compare: pd.DataFrame | None
    margin: float
    gain: float
    alignment: pd.DataFrame
    alignment_summary: pd.DataFrame
    ica_efficiency: pd.DataFrame | None
    components: ComponentStability
    subspace: pd.DataFrame
    covariance_spectra: pd.DataFrame
    rhat: pd.DataFrame
    rhat_parameters: pd.DataFrame
    markers: pd.DataFrame
    marker_correlations: pd.DataFrame
    marker_r2: pd.DataFrame
    ppc: pd.DataFrame
    ppc_pairs: pd.DataFrame
    ppc_genes: pd.DataFrame
    invariants: pd.DataFrame
    invariant_pairs: pd.DataFrame
    ground_truth: pd.DataFrame
    heldout_maps: PairMaps
    cells: pd.DataFrame
    genes: pd.DataFrame
    consensus: np.ndarray


def analyze(c: Collected, s: ReportSettings, stopwatch: Stopwatch) -> Analyses:
    """Run every analysis on ``c`` with the sizes and seeds of ``s`` (steps timed by ``stopwatch``)."""
    latents = c.per_fit("latent")

    lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
    pairs = reliability = compare = None
    margin = gain = np.nan
    if len(lpds) == len(latents):
        margin, gain = equivalence_margin(lpds, c.baseline_lpd, s.equivalence_margin)
        pairs = equivalence_table(lpds, margin, s.alpha)
        reliability = estimator_reliability(lpds, margin)
        predictive = per_fit_table(lpds).merge(reliability, on="fit")
        compare = compare_table(lpds).reset_index()
    else:
        predictive = pd.DataFrame(columns=["fit"])
    stopwatch.lap("predictive")

    map_classes = MAP_CLASSES if s.ica else tuple(m for m in MAP_CLASSES if m != "ica")
    alignment = alignment_errors(latents, map_classes, seed=s.seed)
    alignment_summary = summarize_alignment(alignment)
    efficiency = ica_efficiency(alignment) if s.ica else None
    stopwatch.lap("alignment")

    if s.ica:
        fit_latents = c.per_fit("latent_fit")
        known = all(z is not None for z in fit_latents.values())
        components = ica_component_stability(
            latents,
            cell_bootstrap(c.n_cells, s.n_bootstrap, seed=s.seed + 2000, max_cells=s.max_bootstrap_cells),
            fit_cells=fit_latents if known else None,
            alpha=s.alpha,
            seed=s.seed,
        )
    else:
        components = empty_stability()
    stopwatch.lap("ica components")

    spans = c.per_fit("span")
    subspace = geometry_table(latents, spans, k=s.k, max_knn_cells=s.max_knn_cells, seed=s.seed)
    spectra = pd.DataFrame(
        [
            {"fit": name, "component": i, "eigenvalue": float(v)}
            for name, z in latents.items()
            for i, v in enumerate(covariance_spectrum(z))
        ]
    )
    stopwatch.lap("subspace")

    maps = PairMaps(latents, seed=s.seed)
    rhat, rhat_parameters = _guide_spread(c, maps)
    stopwatch.lap("rhat")
    cells, genes, consensus = stability_columns(c, s, maps)
    stopwatch.lap("per-cell and per-gene columns")

    markers = marker_summary(latents, c.markers)
    correlations = marker_correlations(latents, c.markers)
    r2 = marker_r2_table(latents, c.markers)
    stopwatch.lap("markers")

    observed = observed_statistics(c.ppc_counts)
    predicted = c.per_fit("ppc")
    ppc = ppc_table(observed, predicted)
    ppc_pairs = ppc_agreement(observed, c.per_fit("ppc_halves"), predicted)
    ppc_genes = _ppc_genes(c, observed, predicted)
    stopwatch.lap("ppc")

    first = next(iter(c.arrays.values()))
    invariants, invariant_pairs = invariants_table(
        InvariantInputs(
            latents=latents,
            symmetry=c.symmetry,
            lpd_pairs=pairs,
            ppc_pairs=ppc_pairs,
            ppc_predicted=predicted,
            log_rates=c.per_fit("log_rate"),
            normalized=c.per_fit("normalized"),
            spans=spans,
            grams=c.per_fit("gram"),
            loadings=c.per_fit("loadings"),
            loadings_are_weights=first.loadings_are_weights,
            jacobians=c.per_fit("jacobians"),
            gram_jacobians=c.per_fit("gram_jacobians"),
            markers=c.markers,
            components=components.table if s.ica else None,
            ica_threshold=s.ica_threshold,
        ),
        k=s.k,
        max_knn_cells=s.max_knn_cells,
        max_distance_cells=s.max_distance_cells,
        seed=s.seed,
        maps=maps,
        resampling=ResamplingSettings(s.alpha, s.n_bootstrap, s.seed, s.max_bootstrap_cells),
    )
    stopwatch.lap("invariants")

    if c.true_sources is not None:
        truth = ground_truth_table(latents, components.sources or None, c.true_sources, seed=s.seed)
    else:
        truth = pd.DataFrame(columns=list(TRUTH_COLUMNS))
    stopwatch.lap("ground truth")
    return Analyses(
        predictive=predictive,
        predictive_pairs=pairs,
        predictive_reliability=reliability,
        predictive_compare=compare,
        margin=margin,
        gain=gain,
        alignment=alignment,
        alignment_summary=alignment_summary,
        ica_efficiency=efficiency,
        components=components,
        subspace=subspace,
        covariance_spectra=spectra,
        rhat=rhat,
        rhat_parameters=rhat_parameters,
        markers=markers,
        marker_correlations=correlations,
        marker_r2=r2,
        ppc=ppc,
        ppc_pairs=ppc_pairs,
        ppc_genes=ppc_genes,
        invariants=invariants,
        invariant_pairs=invariant_pairs,
        ground_truth=truth,
        heldout_maps=maps,
        cells=cells,
        genes=genes,
        consensus=consensus,
    )


def stability_columns(c: Collected, s: ReportSettings, maps: PairMaps) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Per held-out cell and per gene, the agreement across seeds; and the consensus latent.

    Returns
    -------
    cells
        Indexed by the held-out cells' names: ``knn_agreement`` (mean over pairs of
        fits of the cell's k-NN Jaccard in the latent means), ``knn_agreement_within_seed``
        (the same between two guide draws of one fit, mean over fits), ``lpd_mean`` and
        ``lpd_sd`` (held-out log p(x) over seeds). NaN for cells outside the subsets
        they are computed on (``CellSubsets.knn``, ``CellSubsets.lpd``).
    genes
        Indexed by gene: ``decoded_agreement`` (mean over pairs of fits of Lin's
        concordance of the decoded log mean across ``CellSubsets.expression``), NaN
        outside ``CellSubsets.genes``.
    consensus
        (cells, n_latent): the fits' latent means mapped onto the first fit by
        their orthogonal maps, averaged.

    """
    sub, latents = c.subsets, c.per_fit("latent")
    names = c.obs_names if c.obs_names is not None else pd.RangeIndex(c.n_cells).astype(str)
    cells = pd.DataFrame(index=pd.Index(names, name=None))
    knn = sub.knn if sub.knn is not None else np.arange(c.n_cells)
    k = min(s.k, len(knn) - 1)
    columns = {
        "knn_agreement": (knn, cell_knn_agreement({n: z[knn] for n, z in latents.items()}, k)),
    }
    draws = c.per_fit("knn_draws")
    if all(d is not None for d in draws.values()):
        columns["knn_agreement_within_seed"] = (knn, cell_knn_baseline(draws, k))
    lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
    if len(lpds) == len(latents):
        mean, sd = cell_lpd_summary({name: frame["lpd"].to_numpy() for name, frame in lpds.items()})
        columns |= {"lpd_mean": (sub.lpd, mean), "lpd_sd": (sub.lpd, sd)}
    for column, (positions, values) in columns.items():
        full = np.full(c.n_cells, np.nan)
        full[positions] = values
        cells[column] = full
    decoded = np.full(len(c.var_names), np.nan)
    decoded[sub.genes] = gene_decoded_agreement(c.per_fit("log_rate"))
    genes = pd.DataFrame({"decoded_agreement": decoded}, index=pd.Index(c.var_names.astype(str)))
    consensus = consensus_latent(latents, maps.to_reference(c.names[0]))
    return cells, genes, consensus


def _guide_spread(c: Collected, maps: PairMaps) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cross-seed R-hat of guide draws with its within-seed baseline (two draw sets of the first fit)."""
    guides = c.per_fit("guide")
    decoded = {name: g.log_rate for name, g in guides.items()}
    with_genes = all(v is not None for v in decoded.values())
    chains = rhat_chains(
        {name: g.latent for name, g in guides.items()},
        decoded=decoded if with_genes else None,
        maps=maps.to_reference(c.names[0]),
    )
    rhat, per_parameter = rhat_table(chains)
    first = c.arrays[c.names[0]]
    if first.guide_repeat is None:
        return rhat, per_parameter
    pair = {"draws": first.guide.latent, "repeat": first.guide_repeat.latent}
    same = {"draws": first.guide.log_rate, "repeat": first.guide_repeat.log_rate}
    identity = maps.to_reference(c.names[0])[c.names[0]]
    baseline = rhat_chains(pair, decoded=same if with_genes else None, maps={"draws": identity, "repeat": identity})
    return add_baseline(rhat, per_parameter, baseline), per_parameter


def _ppc_genes(c: Collected, observed: PPCStatistics, predicted: dict[str, PPCStatistics]) -> pd.DataFrame:
    """Observed and predicted zero fraction and CV per gene and fit, on the compared genes."""
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "fit": name,
                    "gene": [str(g) for g in c.var_names],
                    "observed_zero_fraction": observed.zero_fraction,
                    "predicted_zero_fraction": stats.zero_fraction,
                    "observed_cv": observed.cv_gene,
                    "predicted_cv": stats.cv_gene,
                }
            ).iloc[c.subsets.genes]
            for name, stats in predicted.items()
        ],
        ignore_index=True,
    )
