"""Figures of the diagnostics and the invariance checks: functions that take data and return matplotlib axes.

Each function draws into ``ax`` (or ``axes``) when given, otherwise into a new figure from :func:`new_axes`: a
:class:`matplotlib.figure.Figure` on the Agg canvas, without pyplot, so library code neither changes the user's backend
nor calls ``plt.show()``. In a notebook, pass axes from ``plt.subplots()`` to see it inline, or display ``ax.figure``.

Text is drawn as written: a gene, group or fit name with a pair of ``$`` is not read as matplotlib mathtext, which
fails on anything that is not valid TeX and would lose the figure.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.ticker import LogFormatter, MaxNLocator, NullFormatter, ScalarFormatter

from countvae.errors import InvalidArgumentError

#: Where exact zeros are drawn on a logarithmic axis (and labelled as such).
ZERO_FLOOR = 1e-17

_MAP_ORDER = ("identity", "permutation", "orthogonal", "linear", "ica")
_VERDICT_COLOURS = {
    "agree": "#1b7837",
    "agree after alignment": "#e08214",
    "differ": "#b2182b",
    "undetermined": "#6a51a3",
    "not measured": "#999999",
}


_Plot = TypeVar("_Plot", bound=Callable[..., Any])


def _text_as_written(plot: _Plot) -> _Plot:
    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> Any:
        with matplotlib.rc_context({"text.parse_math": False}):
            axes = plot(*args, **kwargs)
        # the rc setting reaches only texts made inside the call; an axes' title made before it needs its own
        for ax in np.ravel(axes):
            for text in ax.findobj(Text):
                text.set_parse_math(False)
        return axes

    return drawn  # type: ignore[return-value]


def _plain_log_ticks(axis: Any) -> None:
    """Log-axis tick labels as plain text ("1e-16").

    matplotlib's default writes them as mathtext, which the figures show as written (``_text_as_written``: labels
    from data must not be parsed), so the raw markup appeared under the axis.
    """
    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter())


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


@_text_as_written
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


@_text_as_written
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


@_text_as_written
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


@_text_as_written
def paired_lpd_differences(predictive: pd.DataFrame, pairs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Each seed's held-out log p(x) per cell minus the best seed's, with the equivalence test's intervals.

    Cells differ far more from each other than seeds do, so unpaired error bars hide every difference between seeds;
    paired per cell, the differences and their uncertainty are on the same scale. Bars: the pairs' simultaneous
    intervals (``ci_low``, ``ci_high``; ±2 paired standard errors without them); shaded band: the equivalence margin.

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
    lpd = predictive["lpd_per_cell"].astype(float)
    if not np.isfinite(lpd).any():
        raise InvalidArgumentError("paired_lpd_differences needs at least one fit with a finite lpd_per_cell.")
    ax = _ax(ax)
    best = str(predictive.loc[lpd.idxmax(), "fit"])
    fits = predictive["fit"].astype(str).tolist()
    intervals = {"ci_low", "ci_high"} <= set(pairs.columns)
    diff, below, above = [], [], []
    for fit in fits:
        if fit == best:
            diff.append(0.0)
            below.append(0.0)
            above.append(0.0)
            continue
        fit_a, fit_b = pairs["fit_a"].astype(str), pairs["fit_b"].astype(str)  # as the fits' names above
        found = pairs[((fit_a == fit) & (fit_b == best)) | ((fit_a == best) & (fit_b == fit))]
        if found.empty:
            raise InvalidArgumentError(
                f"paired_lpd_differences: pairs has no row for {fit!r} and the best fit {best!r}; pass the "
                "predictive_pairs table of the same report."
            )
        row = found.iloc[0]
        sign = 1.0 if str(row["fit_a"]) == fit else -1.0
        d = sign * float(row["diff_per_cell"])
        if intervals:
            lo, hi = sorted((sign * float(row["ci_low"]), sign * float(row["ci_high"])))
        else:
            lo, hi = d - 2.0 * float(row["se_diff_per_cell"]), d + 2.0 * float(row["se_diff_per_cell"])
        diff.append(d)
        below.append(d - lo)
        above.append(hi - d)
    x = np.arange(len(fits))
    if "margin" in pairs and np.isfinite(pairs["margin"].astype(float)).all():
        margin = float(pairs["margin"].iloc[0])
        ax.axhspan(-margin, margin, color="#c7e9c0", alpha=0.6, label=f"margin ±{margin:.3g}")
        ax.legend(fontsize=7)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.errorbar(x, diff, yerr=[below, above], fmt="o", color="#08306b", capsize=4)
    ax.set_xticks(x, fits, rotation=30, ha="right")
    ax.set_ylabel(f"log p(x) per cell minus {best} (nats)")
    ax.set_title("Paired difference to the best seed" + (" (simultaneous intervals)" if intervals else " (±2 SE)"))
    return ax


def _check_marker_table(correlations: pd.DataFrame, fits: list, markers: list) -> None:
    """One correlation per seed, marker and dimension, and every marker in every seed."""
    repeated = correlations.duplicated(["fit", "marker", "dim"])
    if repeated.any():
        first = correlations[repeated].iloc[0]
        raise InvalidArgumentError(
            f"marker_correlations: {int(repeated.sum())} rows repeat a seed, marker and dimension (e.g. "
            f"{first['fit']!r}, {first['marker']!r}, z{first['dim']}); pass one correlation for each."
        )
    for fit in fits:
        missing = sorted(set(markers) - set(correlations.loc[correlations["fit"] == fit, "marker"]))
        if missing:
            raise InvalidArgumentError(f"marker_correlations: seed {fit!r} has no rows for markers {missing[:5]}.")


@_text_as_written
def marker_correlations(
    correlations: pd.DataFrame, axes: np.ndarray | None = None, max_markers: int = 24
) -> np.ndarray:
    """One heatmap per seed: correlation of each latent dimension (columns) with each marker (rows).

    The same marker lights up different dimensions, with different signs, in different seeds: per-dimension
    correlations belong to the seed's coordinates, not to the data.
    """
    _require(correlations, ["fit", "marker", "dim", "corr"], "marker_correlations")
    if correlations.empty:
        raise InvalidArgumentError("marker_correlations got an empty table; there is nothing to draw.")
    fits = list(dict.fromkeys(correlations["fit"]))
    markers = list(dict.fromkeys(correlations["marker"]))[:max_markers]
    _check_marker_table(correlations, fits, markers)
    if axes is None:
        axes = new_axes(ncols=len(fits), size=(0.35 * correlations["dim"].nunique() + 1.8, 0.3 * len(markers) + 1.4))[0]
    axes = np.atleast_1d(np.asarray(axes, dtype=object)).ravel()
    if len(axes) < len(fits):  # zip would have left the other seeds out without a word
        raise InvalidArgumentError(
            f"marker_correlations draws one heatmap per seed: {len(fits)} seeds, but {len(axes)} axes were given."
        )
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


@_text_as_written
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


@_text_as_written
def rhat(summary: pd.DataFrame, ax: Axes | None = None, threshold: float = 1.01) -> Axes:
    """Median (bar) and maximum (tick) cross-seed R-hat of guide draws per quantity, log scale.

    With ``baseline_rhat_max`` in ``summary`` (two independent draw sets of one seed), diamonds mark that within-seed
    baseline: R-hat when only the draws differ. The dashed line is Vehtari et al.'s 1.01, for reference.
    """
    _require(summary, ["quantity", "rhat_median", "rhat_max"], "rhat")
    ax = _ax(ax)
    x = np.arange(len(summary))
    ax.bar(x, summary["rhat_median"] - 1, bottom=1, color="#9ecae1", edgecolor="#2171b5", label="median")
    ax.scatter(x, summary["rhat_max"], marker="_", s=300, color="#b2182b", label="max", zorder=3)
    if "baseline_rhat_max" in summary and summary["baseline_rhat_max"].notna().any():
        ax.scatter(
            x, summary["baseline_rhat_max"], marker="D", s=25, color="black", label="max within one seed", zorder=4
        )
    ax.axhline(threshold, color="grey", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    finite = summary["rhat_max"].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    top = float(finite.max(initial=threshold)) * 1.15
    ticks = [t for t in (1.0, 1.1, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= top]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_ylim(0.99, top)
    ax.set_xticks(x, summary["quantity"], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"R-hat of guide draws (dashed: {threshold:g})")
    ax.set_title("Spread of guide draws across seeds")
    ax.legend(fontsize=8)
    return ax


@_text_as_written
def invariants(table: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Cross-seed agreement of each quantity (worst pair) with its interval, coloured by verdict.

    Hollow dashed bars: the same after alignment (coordinate rows). Rows whose metric is not a 0-1 agreement (held-out
    log p(x): ``|diff| / margin``) are left out; the table states them.
    """
    _require(table, ["quantity", "agreement", "aligned_agreement", "verdict", "metric"], "invariants")
    ax = _ax(ax, size=(7.5, 4.0))
    keep = ["ccc", "jaccard", "weighted overlap", "cosine", "worst best-match |corr|", "mcc"]
    rows = table[table["metric"].isin(keep)].reset_index(drop=True)
    y = np.arange(len(rows))[::-1]
    colours = [_VERDICT_COLOURS.get(v, "#999999") for v in rows["verdict"]]
    ax.barh(y, rows["agreement"].fillna(0), color=colours, height=0.6)
    if {"low", "high"} <= set(rows.columns):
        value = rows["agreement"].to_numpy(dtype=float)
        low, high = rows["low"].to_numpy(dtype=float), rows["high"].to_numpy(dtype=float)
        ok = np.isfinite(low) & np.isfinite(high) & np.isfinite(value)
        ax.errorbar(
            value[ok], y[ok], xerr=[value[ok] - low[ok], high[ok] - value[ok]], fmt="none", color="black", capsize=3
        )
    aligned = rows["aligned_agreement"]
    has = aligned.notna().to_numpy()
    ax.barh(y[has], aligned[has], fill=False, edgecolor="black", height=0.6, ls="--")
    if "threshold" in rows:
        for yi, t in zip(y, rows["threshold"].astype(float), strict=True):
            ax.plot([t, t], [yi - 0.4, yi + 0.4], color="grey", lw=1.2)
    ax.set_yticks(y, rows["quantity"], fontsize=8)
    drawn = [rows[c].to_numpy(dtype=float) for c in ("agreement", "low", "aligned_agreement") if c in rows]
    left = min([0.0] + [float(v[np.isfinite(v)].min()) for v in drawn if np.isfinite(v).any()])
    ax.set_xlim(left, 1.0)  # every drawn interval end, not only the agreements (a low end below them was cut off)
    ax.set_xlabel("agreement across seeds (worst pair; bars: interval; grey ticks: threshold)")
    handles = [Patch(color=c, label=v) for v, c in _VERDICT_COLOURS.items() if v in set(rows["verdict"])]
    if has.any():
        handles.append(Patch(fill=False, edgecolor="black", ls="--", label="after rotation"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("What survives a re-run")
    return ax


@_text_as_written
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


@_text_as_written
def covariance_spectra(spectra: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Eigenvalues of each seed's latent covariance, largest first (log scale)."""
    _require(spectra, ["fit", "component", "eigenvalue"], "covariance_spectra")
    ax = _ax(ax)
    for fit, sub in spectra.groupby("fit", sort=False):
        ax.plot(sub["component"] + 1, sub["eigenvalue"], marker="o", ms=3, label=str(fit))
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue of latent covariance")
    ax.set_title("Latent covariance spectra")
    ax.legend(fontsize=7)
    return ax


@_text_as_written
def ica_stability(
    table: pd.DataFrame, matches: pd.DataFrame | None = None, ax: Axes | None = None, threshold: float = 0.95
) -> Axes:
    """Worst best-match |correlation| of each ICA component across seeds, with its interval and verdict.

    Bars (coloured by verdict: agree, differ, undetermined): the worst match over the other seeds, with the interval
    of :mod:`countvae.diagnostics.analyses.components`; hatched: too close to Gaussian to be identified. Points: the
    other seeds one by one. Black ticks (``same_fit_match``): the baseline within one seed, its ICA on the other half
    of the cells. Open diamonds (``corrected_match``): the worst match divided by that baseline, the value the verdict
    reads. Dashed line: the threshold.

    Parameters
    ----------
    table
        ``DiagnosticReport.ica`` (columns ``component``, ``worst_match``, ``gaussian``, ``verdict``).
    matches
        ``DiagnosticReport.tables["ica_matches"]``: adds one point per other seed.
    ax
        Axes to draw into (default: a new figure).
    threshold
        Line drawn at this best-match correlation.

    """
    _require(table, ["component", "worst_match", "gaussian", "verdict"], "ica_stability")
    ax = _ax(ax, size=(max(6.0, 0.5 * len(table) + 3.0), 3.4))
    x = np.arange(len(table))
    colours = [_VERDICT_COLOURS.get(v, "#999999") for v in table["verdict"]]
    value = table["worst_match"].to_numpy(dtype=float)
    bars = ax.bar(x, value, color=colours, width=0.6, alpha=0.8)
    for bar, gaussian in zip(bars, table["gaussian"], strict=True):
        if gaussian:
            bar.set_hatch("///")
            bar.set_edgecolor("black")
    if {"low", "high"} <= set(table.columns):
        low, high = table["low"].to_numpy(dtype=float), table["high"].to_numpy(dtype=float)
        ok = np.isfinite(low) & np.isfinite(high)
        ax.errorbar(x[ok], value[ok], yerr=[value[ok] - low[ok], high[ok] - value[ok]], fmt="none", color="black")
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
    if "corrected_match" in table:
        ax.scatter(
            x,
            table["corrected_match"].astype(float),
            marker="D",
            s=22,
            facecolors="none",
            edgecolors="black",
            zorder=5,
            label="corrected (worst / same seed)",
        )
    ax.axhline(threshold, color="grey", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_xticks(x, table["component"], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0.0, 1.02)
    ax.set_ylabel("worst best-match |corr| across seeds")
    ax.set_title("ICA components: do they agree across seeds?")
    handles = [Patch(color=c, label=v) for v, c in _VERDICT_COLOURS.items() if v in set(table["verdict"])]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="flagged Gaussian"))
    handles += ax.get_legend_handles_labels()[0]  # the points and lines drawn above
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


# ----- invariance checks (countvae.invariance.verify) ---------------------------------------------------------
def _check_latent_panels(panels: list[np.ndarray], labels: Sequence | None, dims: tuple[int, int]) -> None:
    """Both latent arrays (cells, L) of the same shape, ``dims`` among their columns, one label per cell."""
    if panels[0].ndim != 2 or panels[0].shape != panels[1].shape:
        raise InvalidArgumentError(
            f"latent_before_after needs two (cells, L) arrays of the same shape, got {panels[0].shape} and "
            f"{panels[1].shape}."
        )
    n_cells, n_dims = panels[0].shape
    if len(dims) != 2:
        raise InvalidArgumentError(f"dims names the two latent dimensions drawn; got {tuple(dims)}.")
    used = dims[:1] if n_dims == 1 else dims
    if any(not 0 <= d < n_dims for d in used):
        raise InvalidArgumentError(f"dims {tuple(dims)} must be latent dimensions in [0, {n_dims}).")
    if labels is not None and len(labels) != n_cells:
        raise InvalidArgumentError(f"labels has {len(labels)} entries for {n_cells} cells.")


@_text_as_written
def latent_before_after(
    latent: np.ndarray,
    latent_transformed: np.ndarray,
    labels: Sequence | None = None,
    dims: tuple[int, int] = (0, 1),
    titles: tuple[str, str] = ("original coordinates", "after the latent map"),
    axes: Sequence[Axes] | None = None,
) -> np.ndarray:
    """Scatter the latent means before and after a map, coloured by ``labels``.

    Parameters
    ----------
    latent, latent_transformed
        (cells, L) arrays, e.g. ``Z`` and ``Z A^T`` (``InvarianceReport.latent`` and its image).
    labels
        One category per cell (e.g. cell types), or ``None``.
    dims
        The two latent dimensions drawn (for ``L = 1`` the second axis is the cell index).
    titles
        Panel titles.
    axes
        Two axes to draw into (default: a new figure).

    Returns
    -------
    numpy.ndarray
        The two axes.

    """
    panels = [np.asarray(latent), np.asarray(latent_transformed)]
    _check_latent_panels(panels, labels, dims)
    if len(titles) != 2:
        raise InvalidArgumentError(f"titles names the two panels; got {len(titles)} titles.")
    axes = new_axes(ncols=2, size=(4.2, 3.8))[0] if axes is None else np.atleast_1d(np.asarray(axes, dtype=object))
    axes = axes.ravel()
    if len(axes) != 2:
        raise InvalidArgumentError(f"latent_before_after draws two panels; got {len(axes)} axes.")
    categories = pd.Categorical(labels) if labels is not None else None
    for ax, Z, title in zip(axes, panels, titles, strict=True):
        x = Z[:, dims[0]]
        y = Z[:, dims[1]] if Z.shape[1] > 1 else np.arange(len(Z))
        if categories is None:
            ax.scatter(x, y, s=4, alpha=0.6, color="0.3", rasterized=True)
        else:
            for code, name in enumerate(categories.categories):
                keep = categories.codes == code
                ax.scatter(x[keep], y[keep], s=4, alpha=0.6, label=str(name), rasterized=True)
            missing = categories.codes < 0  # cells without a label are drawn too, not dropped
            if missing.any():
                ax.scatter(x[missing], y[missing], s=4, alpha=0.6, color="0.6", label="(no label)", rasterized=True)
        ax.set_xlabel(f"z{dims[0]}")
        ax.set_ylabel(f"z{dims[1]}" if Z.shape[1] > 1 else "cell")
        ax.set_title(title)
        ax.set_aspect("equal" if Z.shape[1] > 1 else "auto", adjustable="datalim")
    if categories is not None:
        axes[1].legend(markerscale=3, fontsize="small", loc="best", frameon=False)
    return axes


@_text_as_written
def loadings_before_after(
    loadings: np.ndarray,
    loadings_transformed: np.ndarray,
    gene_names: Sequence[str],
    genes: Sequence[str] | None = None,
    dim: int = 0,
    ax: Axes | None = None,
) -> Axes:
    """Bar chart of one latent dimension's loadings for chosen genes, before and after a map.

    Parameters
    ----------
    loadings, loadings_transformed
        (genes, L) decoder weights, e.g. ``W`` and ``W A^T``.
    gene_names
        Names of the rows.
    genes
        Genes to show (default: the 12 with the largest loading norm).
    dim
        Which latent dimension.
    ax
        Axes to draw into (default: a new figure).

    Raises
    ------
    InvalidArgumentError
        If a gene of ``genes`` is not among ``gene_names``.

    """
    names = pd.Index([str(g) for g in gene_names])
    W0, W1 = np.asarray(loadings), np.asarray(loadings_transformed)
    if W0.ndim != 2 or W0.shape != W1.shape or W0.shape[0] != len(names):
        raise InvalidArgumentError(
            f"loadings_before_after needs two (genes, L) arrays of the same shape with one gene name per row; got "
            f"{W0.shape}, {W1.shape} and {len(names)} names."
        )
    if not 0 <= dim < W0.shape[1]:
        raise InvalidArgumentError(f"dim must be a latent dimension in [0, {W0.shape[1]}), got {dim}.")
    if names.has_duplicates:
        raise InvalidArgumentError(
            f"gene_names repeats {sorted(set(names[names.duplicated()]))[:5]}; each row needs its own name."
        )
    if isinstance(genes, str):  # one gene, not its letters
        genes = [genes]
    ax = _ax(ax, size=(5.0, 4.0))
    if genes is None:
        rows = np.argsort(-np.linalg.norm(W0, axis=1))[:12]
    else:
        rows = names.get_indexer([str(g) for g in genes])
        if (rows < 0).any():
            missing = [g for g, r in zip(genes, rows, strict=True) if r < 0]
            raise InvalidArgumentError(f"genes not found among gene_names: {missing}")
    y = np.arange(len(rows))
    ax.barh(y - 0.2, W0[rows, dim], height=0.4, label="original")
    ax.barh(y + 0.2, W1[rows, dim], height=0.4, label="after the map")
    ax.set_yticks(y, names[rows])
    ax.invert_yaxis()
    ax.axvline(0.0, color="0.5", lw=0.8)
    ax.set_xlabel(f"loading on z{dim}")
    ax.legend(frameon=False, fontsize="small")
    return ax


@_text_as_written
def lpd_differences(per_cell: dict[str, pd.DataFrame], threshold: float | None = None, ax: Axes | None = None) -> Axes:
    """Per-cell ``|log p(x) transformed - original|`` (same base noise) for every map, on a log scale.

    Exact zeros are drawn at ``ZERO_FLOOR`` (1e-17), and cells whose difference is NaN or infinite as red crosses at
    the right edge, counted in the legend. Prior-preserving maps sit at rounding level (about 1e-13 nats in float64),
    the controls at the size of a real change (about 1 nat).

    Parameters
    ----------
    per_cell
        ``InvarianceReport.per_cell``: one frame per ``"variant / map"`` with columns ``lpd`` and ``lpd_crn``.
    threshold
        Equality tolerance to draw as a line (e.g. 1e-9).
    ax
        Axes to draw into (default: a new figure).

    """
    for label, frame in per_cell.items():
        _require(frame, ["lpd", "lpd_crn"], f"lpd_differences ({label!r})")
    ax = _ax(ax, size=(6.5, 0.45 * len(per_cell) + 1.5))
    rng = np.random.default_rng(0)
    diffs = [np.abs(f["lpd_crn"].to_numpy(dtype=float) - f["lpd"].to_numpy(dtype=float)) for f in per_cell.values()]
    finite = np.concatenate([d[np.isfinite(d)] for d in diffs] + [np.zeros(1)])
    edge = 10.0 * max(float(finite.max()), 1.0)  # where cells without a finite difference are drawn
    n_bad = 0
    for row, diff in enumerate(diffs):
        bad = ~np.isfinite(diff)  # a log axis would leave them out, and the cells left would read as invariant
        shown = np.maximum(diff[~bad], ZERO_FLOOR)
        ax.scatter(shown, row + rng.uniform(-0.25, 0.25, len(shown)), s=5, alpha=0.5, rasterized=True)
        if bad.any():
            ax.scatter(np.full(bad.sum(), edge), row + rng.uniform(-0.25, 0.25, bad.sum()), marker="x", color="C3")
            n_bad += int(bad.sum())
    if n_bad:
        ax.scatter([], [], marker="x", color="C3", label=f"NaN or infinite difference ({n_bad} cells)")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_yticks(range(len(per_cell)), list(per_cell))
    ax.invert_yaxis()
    ax.axvline(ZERO_FLOOR, color="0.7", lw=0.8, ls=":")
    if threshold is not None:
        ax.axvline(threshold, color="C3", lw=1.0, ls="--", label=f"tolerance {threshold:g}")
    if threshold is not None or n_bad:
        ax.legend(frameon=False, fontsize="small", loc="lower right")
    ax.set_xlabel("|log p(x) transformed - original| per cell (nats; exact 0 drawn at the dotted line)")
    return ax


@_text_as_written
def output_changes(outputs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Heat map of the ``log10`` change of each model output (rows) under each latent map (columns).

    Parameters
    ----------
    outputs
        ``InvarianceReport.outputs`` (its ``"invariant under"`` column is shown in the row labels). A value not
        measured (NaN) is left blank; changes of 10 and more (infinite ones too) take the top colour.
    ax
        Axes to draw into (default: a new figure).

    """
    values = outputs.drop(columns=["invariant under"], errors="ignore").astype(float)
    if (values.to_numpy() < 0).any():  # drawn as "none" before
        raise InvalidArgumentError("output_changes: a change is a size, never negative; pass InvarianceReport.outputs.")
    ax = _ax(ax, size=(1.1 * values.shape[1] + 4.5, 0.45 * values.shape[0] + 1.8))
    # an infinite change takes the top colour, not the blank of a value not measured (NaN)
    shown = np.log10(np.clip(values.to_numpy(), ZERO_FLOOR, 10.0))
    image = ax.imshow(shown, aspect="auto", cmap="viridis", vmin=-17, vmax=1)
    ax.set_xticks(range(values.shape[1]), values.columns, rotation=40, ha="right")
    if "invariant under" in outputs:
        rows = [f"{i}  [{u}]" for i, u in zip(outputs.index, outputs["invariant under"], strict=True)]
    else:
        rows = list(values.index)
    ax.set_yticks(range(values.shape[0]), rows)
    ax.figure.colorbar(image, ax=ax, label="log10 change (-17: none)")
    return ax


@_text_as_written
def downstream_agreement(pairs: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Agreement of each compared pair per downstream output: between fits (filled) and within one fit (hollow).

    ``pairs``: the long table of the report's downstream section (columns ``output``, ``metric``, ``kind``, ``value``;
    ``kind`` is ``"between fits"`` or ``"within fit"``). One row per output and metric, top to bottom in table order.
    """
    _require(pairs, ["output", "metric", "kind", "value"], "downstream_agreement")
    rows = list(dict.fromkeys(zip(pairs["output"], pairs["metric"], strict=True)))
    ax = _ax(ax, size=(6.0, 0.5 + 0.45 * max(len(rows), 1)))
    offsets = {"between fits": 0.12, "within fit": -0.12}
    labelled: set[str] = set()
    for position, (output, metric) in enumerate(rows):
        y = len(rows) - 1 - position
        block = pairs[(pairs["output"] == output) & (pairs["metric"] == metric)]
        for kind, offset in offsets.items():
            values = block.loc[block["kind"] == kind, "value"].to_numpy(dtype=float)
            filled = kind == "between fits"
            ax.scatter(
                values,
                np.full(values.shape, y + offset),
                s=22,
                facecolors="#2171b5" if filled else "none",
                edgecolors="#2171b5" if filled else "#e08214",
                label=None if kind in labelled or not len(values) else kind,
            )
            if len(values):
                labelled.add(kind)
    ax.set_yticks(np.arange(len(rows))[::-1], [f"{o}: {m}" for o, m in rows], fontsize=8)
    ax.set_xlabel("agreement (1 = identical)")
    ax.legend(fontsize=7, loc="lower left", frameon=False)
    ax.set_title("Downstream results: between fits vs within one fit")
    return ax


def _interval_lengths(value: np.ndarray, low: pd.Series, high: pd.Series, name: str) -> np.ndarray:
    """The lengths below and above ``value`` of its interval, refused when the interval does not contain it.

    A difference of rounding size (the point on an end) is read as 0; ``np.abs`` of the lengths drew an interval
    that excludes its point as one that contains it.
    """
    lengths = np.vstack([value - low.to_numpy(dtype=float), high.to_numpy(dtype=float) - value])
    scale = 1e-9 * np.maximum(1.0, np.abs(value))
    if (lengths < -scale).any():
        raise InvalidArgumentError(
            f"model_frontier: an interval {name}_low..{name}_high does not contain its {name}; pass the frontier "
            "of ModelComparison."
        )
    return np.clip(lengths, 0.0, None)


@_text_as_written
def model_frontier(frontier: pd.DataFrame, ax: Axes | None = None, noise_floor: float = 0.0) -> Axes:
    """Fit against stability per candidate model: the frontier of a model comparison.

    ``frontier`` has one row per candidate: ``candidate``, ``stability`` (worst pair of seeds) with
    ``stability_low``/``stability_high`` (its interval), ``fit`` (nats/cell against the best) with
    ``fit_low``/``fit_high`` (simultaneous interval), ``margin`` and ``recommended``. The grey band is the
    seed noise floor (``+- noise_floor`` around 0), the dashed line minus the equivalence margin.
    """
    _require(frontier, ["candidate", "stability", "fit", "fit_low", "fit_high"], "model_frontier")
    if frontier.empty:
        raise InvalidArgumentError("model_frontier got an empty frontier; there is nothing to draw.")
    ax = _ax(ax)
    x = frontier["stability"].to_numpy(dtype=float)
    y = frontier["fit"].to_numpy(dtype=float)
    yerr = _interval_lengths(y, frontier["fit_low"], frontier["fit_high"], "fit")
    xerr = None
    if {"stability_low", "stability_high"} <= set(frontier.columns):
        xerr = _interval_lengths(x, frontier["stability_low"], frontier["stability_high"], "stability")
    if np.isfinite(noise_floor) and noise_floor > 0:
        ax.axhspan(-noise_floor, noise_floor, color="0.85", label="seed noise floor")
    if "margin" in frontier and np.isfinite(frontier["margin"].iloc[0]):
        ax.axhline(-float(frontier["margin"].iloc[0]), color="0.3", ls="--", lw=1, label="- margin")
    ax.errorbar(x, y, yerr=yerr, xerr=xerr, fmt="o", capsize=3)
    recommended = frontier.get("recommended", pd.Series(False, index=frontier.index)).to_numpy(dtype=bool)
    if recommended.any():
        ax.plot(x[recommended], y[recommended], "o", ms=12, mfc="none", mec="C3", label="recommended")
    for xi, yi, name in zip(x, y, frontier["candidate"], strict=True):
        ax.annotate(str(name), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("stability across seeds (worst pair)")
    ax.set_ylabel("held-out log p(x) vs best (nats/cell)")
    if ax.get_legend_handles_labels()[0]:  # no band, margin or recommendation: no legend to draw
        ax.legend(fontsize=7, loc="best")
    return ax
