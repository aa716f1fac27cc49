"""Step 2 of the report: every analysis, each a function of the collected arrays.

No fitted model is called here. The maps between fits are fitted once per pair
on each set of cells they are needed on: the alignment fits its own on half of
the held-out cells (it scores them on the other half), and one
:class:`~countvae.diagnostics.analyses.maps.PairMaps` on all held-out cells
serves the cross-seed R-hat (maps to the first fit) and the invariants table
(maps between every pair, and each fit's ICA axes).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from countvae.diagnostics.analyses.alignment import MAP_CLASSES, alignment_errors, ica_efficiency, summarize_alignment
from countvae.diagnostics.analyses.components import empty_tables, ica_component_stability
from countvae.diagnostics.analyses.invariants import InvariantInputs, invariants_table
from countvae.diagnostics.analyses.maps import PairMaps
from countvae.diagnostics.analyses.markers import marker_correlations, marker_r2_table, marker_summary
from countvae.diagnostics.analyses.ppc import PPCStatistics, observed_statistics, ppc_agreement, ppc_table
from countvae.diagnostics.analyses.predictive import compare_table, pairwise_table, per_fit_table
from countvae.diagnostics.analyses.rhat import rhat_chains, rhat_table
from countvae.diagnostics.analyses.subspace import covariance_spectrum, geometry_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch


@dataclass
class Analyses:
    """The result of every analysis (tables by their name in the report).

    ``predictive_pairs`` and ``predictive_compare`` are ``None`` when a fit
    cannot estimate log p(x); ``ica_efficiency`` is ``None`` without ICA.
    ``invariants`` holds the agreement numbers and thresholds; the verdicts
    are added by :mod:`.verdicts`. ``heldout_maps`` are the maps fitted on all
    held-out cells (shared by the R-hat and the invariants table).
    """

    predictive: pd.DataFrame
    predictive_pairs: pd.DataFrame | None
    predictive_compare: pd.DataFrame | None
    alignment: pd.DataFrame
    alignment_summary: pd.DataFrame
    ica_efficiency: pd.DataFrame | None
    ica: pd.DataFrame
    ica_matches: pd.DataFrame
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
    heldout_maps: PairMaps


def analyze(c: Collected, s: ReportSettings, stopwatch: Stopwatch) -> Analyses:
    """Run every analysis on ``c`` with the sizes and seeds of ``s`` (steps timed by ``stopwatch``)."""
    latents = c.per_fit("latent")

    lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
    if len(lpds) == len(latents):
        predictive, pairs, compare = per_fit_table(lpds), pairwise_table(lpds), compare_table(lpds).reset_index()
    else:
        predictive, pairs, compare = pd.DataFrame(columns=["fit"]), None, None
    stopwatch.lap("predictive")

    map_classes = MAP_CLASSES if s.ica else tuple(m for m in MAP_CLASSES if m != "ica")
    alignment = alignment_errors(latents, map_classes, seed=s.seed)
    alignment_summary = summarize_alignment(alignment)
    efficiency = ica_efficiency(alignment) if s.ica else None
    stopwatch.lap("alignment")

    if s.ica:
        ica, ica_matches = ica_component_stability(latents, threshold=s.ica_threshold, seed=s.seed)
    else:
        ica, ica_matches = empty_tables()
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
    guides = c.per_fit("guide")
    decoded = {name: g.log_rate for name, g in guides.items()}
    chains = rhat_chains(
        {name: g.latent for name, g in guides.items()},
        decoded=decoded if all(v is not None for v in decoded.values()) else None,
        maps=maps.to_reference(c.names[0]),
    )
    rhat, rhat_parameters = rhat_table(chains)
    stopwatch.lap("rhat")

    markers = marker_summary(latents, c.markers)
    correlations = marker_correlations(latents, c.markers)
    r2 = marker_r2_table(latents, c.markers)
    stopwatch.lap("markers")

    observed = observed_statistics(c.ppc_counts)
    predicted = c.per_fit("ppc")
    ppc = ppc_table(observed, predicted)
    ppc_pairs = ppc_agreement(observed, c.per_fit("ppc_halves"))
    ppc_genes = _ppc_genes(c, observed, predicted)
    stopwatch.lap("ppc")

    invariants, invariant_pairs = invariants_table(
        InvariantInputs(
            latents=latents,
            symmetry=c.symmetry,
            lpd_pairs=pairs,
            ppc_pairs=ppc_pairs,
            log_rates=c.per_fit("log_rate"),
            normalized=c.per_fit("normalized"),
            spans=spans,
            grams=c.per_fit("gram"),
            loadings=c.per_fit("loadings"),
            markers=c.markers,
            ica=s.ica,
        ),
        k=s.k,
        max_knn_cells=s.max_knn_cells,
        max_distance_cells=s.max_distance_cells,
        seed=s.seed,
        maps=maps,
    )
    stopwatch.lap("invariants")
    return Analyses(
        predictive=predictive,
        predictive_pairs=pairs,
        predictive_compare=compare,
        alignment=alignment,
        alignment_summary=alignment_summary,
        ica_efficiency=efficiency,
        ica=ica,
        ica_matches=ica_matches,
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
        heldout_maps=maps,
    )


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
