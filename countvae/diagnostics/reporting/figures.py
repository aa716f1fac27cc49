"""The report's figures: which :mod:`countvae.plotting` function draws each, from which table, with what caption.

The figures are drawn from the report's tables only (plotting functions take
data and return axes) and embedded in report.html as PNG images.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from countvae import plotting
from countvae._report_files import figure_png_base64
from countvae.diagnostics.reporting.report_content import ReportContent

#: Figure name -> (title, tables whose numbers it shows, caption).
FIGURES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "invariants": (
        "What survives a re-run",
        ("invariants",),
        "Agreement between seeds for each quantity (worst pair of seeds; 1 is perfect agreement) with its "
        "interval over resamples of the held-out cells, coloured by verdict; grey ticks mark the thresholds. "
        "A row agrees when its whole interval meets the threshold, differs when the whole interval misses it, "
        "and is undetermined otherwise. Dashed outlines: the same after rotating each pair of seeds onto each "
        "other. A quantity that only agrees after rotation is a property of the arbitrary coordinates, not of "
        "the data.",
    ),
    "lpd": (
        "Held-out log predictive density per seed",
        ("predictive",),
        "Mean held-out log p(x) per cell with ±2 standard errors over cells (blue) and ±2 Monte Carlo standard "
        "errors of the importance sampler (orange). Cells differ far more than seeds, so these bars are wide.",
    ),
    "lpd_pairs": (
        "Paired difference to the best seed",
        ("predictive", "predictive_pairs"),
        "Each seed's held-out log p(x) per cell minus the best seed's, with the equivalence test's intervals "
        "(simultaneous over all pairs of seeds). Green band: the equivalence margin. An interval inside the "
        "band: equivalent; outside it: not equivalent; across its edge: undetermined.",
    ),
    "alignment": (
        "Seed-pair alignment by map class",
        ("alignment",),
        "Mean distance per cell between one seed's latent means mapped onto another's, as a fraction of the "
        "latent diameter, for maps fitted on half of the held-out cells and scored on the other half. A large "
        "drop from 'permutation' to 'orthogonal' means the seeds differ by a rotation, not by a relabelling "
        "of dimensions.",
    ),
    "ica_stability": (
        "ICA components across seeds",
        ("ica", "ica_matches"),
        "For each ICA component of the first seed (IC_0 is its most non-Gaussian), the best-match |correlation| "
        "with the ICA components of each other seed (points) and the worst of them (bar, with its interval over "
        "resamples of the held-out cells), each seed's ICA estimated on a different half of the fit cells (or of "
        "the held-out cells when the fit cells are not known). Green: agrees (whole interval at or above the "
        "dashed threshold); red: differs; purple: undetermined; hatched: too close to Gaussian to be identified. "
        "Black ticks: the same comparison within the first seed (its own ICA on the other half): high there but "
        "low across seeds means the seeds' solutions differ; low in both means too few cells to fix that axis. "
        "Only components that agree can be read as axes; the others are identified as a subspace at most. A "
        "random rotation of a d-dimensional Gaussian space gives about 0.90 (d = 2) to 0.7 (d = 6) by chance.",
    ),
    "angles": (
        "Principal angles between gene-space spans",
        ("subspace",),
        "Angles between the gene-space directions the decoders of two seeds move along (loadings for a "
        "linear decoder, Jacobians for an MLP). Small angles: the seeds span the same programmes, whatever "
        "their coordinates.",
    ),
    "spectra": (
        "Latent covariance spectra",
        ("covariance_spectra",),
        "Eigenvalues of each seed's latent covariance; a rotation leaves them unchanged.",
    ),
    "marker_heatmaps": (
        "Per-dimension marker correlations, per seed",
        ("marker_correlations",),
        "Correlation of each latent dimension (columns) with each marker (rows). The same marker lights up "
        "different dimensions with different signs in different seeds: reading a dimension as 'the CD14 axis' "
        "is a statement about one seed's coordinates.",
    ),
    "marker_r2": (
        "Rotation-invariant marker association",
        ("marker_r2",),
        "R² of each marker regressed on all latent dimensions, one point per seed. It does not depend on the "
        "coordinates, so it is what can be reported.",
    ),
    "rhat": (
        "Spread of guide draws across seeds",
        ("rhat",),
        "R-hat with seeds as chains and draws of each seed's amortized guide as draws: not a convergence "
        "diagnostic and not a verdict. Raw coordinates are far above 1 because every seed sits in its own "
        "rotation. Diamonds: the largest value for two independent draw sets of one seed (nothing differs but "
        "the draws). A guide's posterior for one cell is narrow, so seeds that agree on every invariant still "
        "sit far above that baseline. Dashed line: 1.01.",
    ),
    "ppc": (
        "Posterior predictive check: zero fraction per gene",
        ("ppc_genes",),
        "Observed against predicted fraction of zero counts per gene, one colour per seed. Points on the "
        "diagonal: the model reproduces the sparsity of the data.",
    ),
}


def draw_figures(rep: ReportContent) -> dict[str, str]:
    """Every figure that the report's tables support, as base64 PNGs by name (see :data:`FIGURES`)."""
    t = rep.tables
    draw: dict[str, Callable[[], Any]] = {
        "invariants": lambda: plotting.invariants(rep.invariants),
        "alignment": lambda: plotting.alignment_errors(rep.alignment),
        "spectra": lambda: plotting.covariance_spectra(t["covariance_spectra"]),
        "rhat": lambda: plotting.rhat(rep.rhat),
        "ppc": lambda: plotting.zero_fraction(t["ppc_genes"]),
    }
    if len(rep.predictive) and "lpd_per_cell" in rep.predictive:
        draw["lpd"] = lambda: plotting.log_predictive_density(rep.predictive)
        if "predictive_pairs" in t:
            draw["lpd_pairs"] = lambda: plotting.paired_lpd_differences(rep.predictive, t["predictive_pairs"])
    if len(rep.ica):
        threshold = float(rep.settings.get("report", {}).get("ica_threshold", 0.95))
        draw["ica_stability"] = lambda: plotting.ica_stability(rep.ica, t.get("ica_matches"), threshold=threshold)
    if "angles_deg" in rep.subspace:
        draw["angles"] = lambda: plotting.principal_angles(rep.subspace)
    if len(t.get("marker_correlations", ())):
        draw["marker_heatmaps"] = lambda: plotting.marker_correlations(t["marker_correlations"])
        draw["marker_r2"] = lambda: plotting.marker_r2(t["marker_r2"])
    return {name: figure_png_base64(fn()) for name, fn in draw.items()}
