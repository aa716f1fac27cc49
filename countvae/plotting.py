"""Figures of the multi-seed diagnostics: functions that take result tables and return matplotlib axes.

Each function draws into ``ax`` (or ``axes``) when given, otherwise into a new
figure made with :func:`new_axes`, which builds a :class:`matplotlib.figure.Figure`
on the Agg canvas without touching pyplot: library code never changes the
user's backend and never calls ``plt.show()``. In a notebook, pass axes from
``plt.subplots()`` to see the figure inline, or display ``ax.figure``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter

from countvae.errors import InvalidArgumentError

_MAP_ORDER = ("identity", "permutation", "orthogonal", "linear", "ica")
_VERDICT_COLOURS = {
    "stable": "#1b7837",
    "stable up to rotation": "#e08214",
    "unstable": "#b2182b",
    "not measured": "#999999",
}


def new_axes(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (4.8, 3.4)) -> np.ndarray:
    """A grid of axes on a fresh Agg-backed figure (no pyplot), shape (nrows, ncols)."""
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))


def _ax(ax: Axes | None, size: tuple[float, float] = (4.8, 3.4)) -> Axes:
    return ax if ax is not None else new_axes(size=size)[0, 0]


def _require(frame: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InvalidArgumentError(f"{what} needs the columns {missing}; pass the matching report table.")


def alignment_errors(alignment: pd.DataFrame, ax: Axes | None = None, column: str = "error_diameter") -> Axes:
    """Alignment error of every pair of seeds under each map class (points), with the mean (bar).

    Parameters
    ----------
    alignment
        ``DiagnosticReport.alignment`` (or :func:`countvae.diagnostics.analyses.alignment.alignment_errors`).
    ax
        Axes to draw into (default: a new figure).
    column
        ``"error_diameter"`` or ``"error_rms"``.

    """
    _require(alignment, ["map", column], "alignment_errors")
    ax = _ax(ax)
    maps = [m for m in _MAP_ORDER if m in set(alignment["map"])]
    rng = np.random.default_rng(0)
    for i, m in enumerate(maps):
        values = alignment.loc[alignment["map"] == m, column].to_numpy()
        ax.bar(i, np.mean(values), color="#c6dbef", edgecolor="#2171b5", width=0.6)
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(values)), values, s=14, color="#08306b", zorder=3)
    ax.set_xticks(range(len(maps)), maps, rotation=20, ha="right")
    label = "diameter" if column == "error_diameter" else "RMS distance"
    ax.set_ylabel(f"mean error / latent {label}")
    ax.set_title("Seed-pair alignment error by map class")
    ax.set_ylim(bottom=0)
    return ax


def principal_angles(subspace: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Principal angles (degrees) between the gene-space spans of each pair of seeds."""
    _require(subspace, ["fit_a", "fit_b", "angles_deg"], "principal_angles")
    ax = _ax(ax)
    for row in subspace.itertuples():
        angles = np.asarray(row.angles_deg, dtype=float)
        label = f"{row.fit_a} vs {row.fit_b}"
        ax.plot(np.arange(1, len(angles) + 1), angles, marker="o", ms=3, lw=1, alpha=0.8, label=label)
    ax.axhline(90, color="grey", lw=0.8, ls=":")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if 0 < len(subspace) <= 10:
        ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("principal angle index (smallest first)")
    ax.set_ylabel("angle (degrees)")
    ax.set_ylim(0, 92)
    ax.set_title("Gene-space spans: principal angles per seed pair")
    return ax


def log_predictive_density(predictive: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Held-out log predictive density per cell for each seed, with sampling (±2 SE) and Monte Carlo error bars."""
    _require(predictive, ["fit", "lpd_per_cell", "se_per_cell", "mc_se_per_cell"], "log_predictive_density")
    ax = _ax(ax)
    x = np.arange(len(predictive))
    y = predictive["lpd_per_cell"].to_numpy()
    ax.errorbar(x, y, yerr=2 * predictive["se_per_cell"], fmt="o", color="#08306b", capsize=4, label="±2 SE (cells)")
    ax.errorbar(x, y, yerr=2 * predictive["mc_se_per_cell"], fmt="none", ecolor="#e08214", lw=3, label="±2 MC SE")
    ax.set_xticks(x, predictive["fit"].astype(str), rotation=30, ha="right")
    ax.set_ylabel("held-out log p(x) per cell (nats)")
    ax.set_title("Predictive fit per seed")
    ax.legend(fontsize=8)
    return ax


def paired_lpd_differences(predictive: pd.DataFrame, pairs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Each seed's held-out log p(x) per cell minus the best seed's, with ±2 paired standard errors.

    Cells differ far more from each other than seeds do, so unpaired error bars
    hide every difference between seeds; paired per cell, the differences and
    their uncertainty are on the same scale.

    Parameters
    ----------
    predictive
        ``DiagnosticReport.predictive``.
    pairs
        ``DiagnosticReport.tables["predictive_pairs"]``.
    ax
        Axes to draw into (default: a new figure).

    """
    _require(predictive, ["fit", "lpd_per_cell"], "paired_lpd_differences")
    _require(pairs, ["fit_a", "fit_b", "diff_per_cell", "se_diff_per_cell"], "paired_lpd_differences")
    ax = _ax(ax)
    best = str(predictive.loc[predictive["lpd_per_cell"].idxmax(), "fit"])
    fits = predictive["fit"].astype(str).tolist()
    diff, err = [], []
    for fit in fits:
        if fit == best:
            diff.append(0.0)
            err.append(0.0)
            continue
        row = pairs[
            ((pairs["fit_a"] == fit) & (pairs["fit_b"] == best)) | ((pairs["fit_a"] == best) & (pairs["fit_b"] == fit))
        ]
        sign = 1.0 if row["fit_a"].iloc[0] == fit else -1.0
        diff.append(sign * float(row["diff_per_cell"].iloc[0]))
        err.append(2.0 * float(row["se_diff_per_cell"].iloc[0]))
    x = np.arange(len(fits))
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.errorbar(x, diff, yerr=err, fmt="o", color="#08306b", capsize=4)
    ax.set_xticks(x, fits, rotation=30, ha="right")
    ax.set_ylabel(f"log p(x) per cell minus {best} (nats)")
    ax.set_title("Paired difference to the best seed (±2 SE)")
    return ax


def marker_correlations(
    correlations: pd.DataFrame, axes: np.ndarray | None = None, max_markers: int = 24
) -> np.ndarray:
    """One heatmap per seed: correlation of each latent dimension (columns) with each marker (rows).

    The same marker lights up different dimensions, with different signs, in
    different seeds: per-dimension correlations are a property of the seed's
    coordinates, not of the data.
    """
    _require(correlations, ["fit", "marker", "dim", "corr"], "marker_correlations")
    fits = list(dict.fromkeys(correlations["fit"]))
    markers = list(dict.fromkeys(correlations["marker"]))[:max_markers]
    if axes is None:
        axes = new_axes(ncols=len(fits), size=(0.35 * correlations["dim"].nunique() + 1.8, 0.3 * len(markers) + 1.4))[0]
    axes = np.asarray(axes).ravel()
    image = None
    for ax, fit in zip(axes, fits, strict=False):
        sub = correlations[(correlations["fit"] == fit) & correlations["marker"].isin(markers)]
        table = sub.pivot(index="marker", columns="dim", values="corr").loc[markers]
        image = ax.imshow(table.to_numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xticks(range(table.shape[1]), [f"z{d}" for d in table.columns], fontsize=7)
        ax.set_yticks(range(len(markers)), markers if ax is axes[0] else [""] * len(markers), fontsize=7)
        ax.set_title(str(fit), fontsize=9)
    if image is not None:
        axes[0].figure.colorbar(image, ax=list(axes[: len(fits)]), shrink=0.8, label="correlation")
    return axes


def marker_r2(r2: pd.DataFrame, ax: Axes | None = None, max_markers: int = 24) -> Axes:
    """Rotation-invariant R^2 of each marker on all latent dimensions, one point per seed."""
    _require(r2, ["fit", "marker", "r2"], "marker_r2")
    ax = _ax(ax)
    markers = list(dict.fromkeys(r2["marker"]))[:max_markers]
    for i, m in enumerate(markers):
        values = r2.loc[r2["marker"] == m, "r2"].to_numpy()
        ax.plot([i] * len(values), values, "o", color="#08306b", alpha=0.7, ms=4)
    ax.set_xticks(range(len(markers)), markers, rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("R² of marker on all latent dims")
    ax.set_title("Invariant marker association (one point per seed)")
    return ax


def rhat(summary: pd.DataFrame, ax: Axes | None = None, threshold: float = 1.01) -> Axes:
    """Median (bar) and maximum (tick) cross-seed R-hat per quantity, log scale."""
    _require(summary, ["quantity", "rhat_median", "rhat_max"], "rhat")
    ax = _ax(ax)
    x = np.arange(len(summary))
    ax.bar(x, summary["rhat_median"] - 1, bottom=1, color="#9ecae1", edgecolor="#2171b5", label="median")
    ax.scatter(x, summary["rhat_max"], marker="_", s=300, color="#b2182b", label="max", zorder=3)
    ax.axhline(threshold, color="grey", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    top = max(float(np.nanmax(summary["rhat_max"])), threshold) * 1.15
    ticks = [t for t in (1.0, 1.1, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= top]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_ylim(0.99, top)
    ax.set_xticks(x, summary["quantity"], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"R-hat (seeds as chains; dashed: {threshold:g})")
    ax.set_title("Cross-seed R-hat")
    ax.legend(fontsize=8)
    return ax


def invariants(table: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Cross-seed agreement of each quantity (worst pair), coloured by verdict; hollow bars after alignment.

    Rows whose metric is not a 0-1 agreement (held-out log p(x), predictive
    statistics) are left out of the bars; the table states them.
    """
    _require(table, ["quantity", "agreement", "aligned_agreement", "verdict", "metric"], "invariants")
    ax = _ax(ax, size=(7.5, 4.0))
    rows = table[table["metric"].isin(["ccc", "jaccard", "weighted overlap", "cosine", "mcc"])].reset_index(drop=True)
    y = np.arange(len(rows))[::-1]
    colours = [_VERDICT_COLOURS.get(v, "#999999") for v in rows["verdict"]]
    ax.barh(y, rows["agreement"].fillna(0), color=colours, height=0.6)
    aligned = rows["aligned_agreement"]
    has = aligned.notna().to_numpy()
    ax.barh(y[has], aligned[has], fill=False, edgecolor="black", height=0.6, ls="--")
    ax.set_yticks(y, rows["quantity"], fontsize=8)
    ax.set_xlim(min(0.0, float(np.nanmin(rows["agreement"].fillna(0)))), 1.0)
    ax.set_xlabel("agreement across seeds (worst pair)")
    handles = [Patch(color=c, label=v) for v, c in _VERDICT_COLOURS.items() if v in set(rows["verdict"])]
    if has.any():
        handles.append(Patch(fill=False, edgecolor="black", ls="--", label="after rotation"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("What survives a re-run")
    return ax


def zero_fraction(genes: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Observed against predicted zero fraction per gene, one colour per seed (posterior predictive check)."""
    _require(genes, ["fit", "observed_zero_fraction", "predicted_zero_fraction"], "zero_fraction")
    ax = _ax(ax)
    for fit, sub in genes.groupby("fit", sort=False):
        ax.scatter(sub["observed_zero_fraction"], sub["predicted_zero_fraction"], s=5, alpha=0.5, label=str(fit))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
    ax.set_xlabel("observed zero fraction")
    ax.set_ylabel("predicted zero fraction")
    ax.set_title("Posterior predictive check per gene")
    ax.legend(fontsize=7, markerscale=2)
    return ax


def covariance_spectra(spectra: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Eigenvalues of each seed's latent covariance, largest first (log scale)."""
    _require(spectra, ["fit", "component", "eigenvalue"], "covariance_spectra")
    ax = _ax(ax)
    for fit, sub in spectra.groupby("fit", sort=False):
        ax.plot(sub["component"] + 1, sub["eigenvalue"], marker="o", ms=3, label=str(fit))
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue of latent covariance")
    ax.set_title("Latent covariance spectra")
    ax.legend(fontsize=7)
    return ax


def ica_stability(
    table: pd.DataFrame, matches: pd.DataFrame | None = None, ax: Axes | None = None, threshold: float = 0.95
) -> Axes:
    """Best-match |correlation| of each ICA component across seeds (bar: mean; points: one per other seed).

    Bars are green for components that reproduce and red for those that do not;
    hatched bars mark components too close to Gaussian to be identified. Black
    ticks (``same_fit_match``, when present) are the baseline within one seed:
    its ICA on the other half of the cells. The dashed line is the
    reproducibility threshold.

    Parameters
    ----------
    table
        ``DiagnosticReport.ica`` (or the first table of
        :func:`countvae.diagnostics.analyses.components.ica_component_stability`).
    matches
        ``DiagnosticReport.tables["ica_matches"]``: adds one point per other seed.
    ax
        Axes to draw into (default: a new figure).
    threshold
        Line drawn at this best-match correlation.

    """
    _require(table, ["component", "mean_match", "gaussian", "reproducible"], "ica_stability")
    ax = _ax(ax, size=(max(6.0, 0.5 * len(table) + 3.0), 3.4))
    x = np.arange(len(table))
    colours = [_VERDICT_COLOURS["stable"] if r else _VERDICT_COLOURS["unstable"] for r in table["reproducible"]]
    bars = ax.bar(x, table["mean_match"].astype(float), color=colours, width=0.6, alpha=0.8)
    for bar, gaussian in zip(bars, table["gaussian"], strict=True):
        if gaussian:
            bar.set_hatch("///")
            bar.set_edgecolor("black")
    if matches is not None and len(matches):
        _require(matches, ["component", "best_match"], "ica_stability")
        position = {c: i for i, c in enumerate(table["component"])}
        rng = np.random.default_rng(0)
        pts = matches[matches["component"].isin(position)]
        xs = pts["component"].map(position).to_numpy(dtype=float) + rng.uniform(-0.15, 0.15, len(pts))
        ax.scatter(xs, pts["best_match"].astype(float), s=12, color="#08306b", zorder=3, label="one other seed")
    if "same_fit_match" in table:
        ax.scatter(
            x, table["same_fit_match"].astype(float), marker="_", s=250, color="black", zorder=4, label="same seed"
        )
    ax.axhline(threshold, color="grey", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_xticks(x, table["component"], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0.0, 1.02)
    ax.set_ylabel("best-match |corr| across seeds")
    ax.set_title("ICA components: reproducible across seeds?")
    handles = [
        Patch(color=_VERDICT_COLOURS["stable"], label="reproducible"),
        Patch(color=_VERDICT_COLOURS["unstable"], label="not reproducible"),
        Patch(facecolor="white", edgecolor="black", hatch="///", label="flagged Gaussian"),
    ]
    ax.legend(
        handles=handles + ax.get_legend_handles_labels()[0],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    return ax
