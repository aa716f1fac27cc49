"""The marker pitfall: a latent dimension's correlation with a marker is not an identification.

Under a N(0, I) prior the fit is only determined up to a rotation of ``z``, so "dimension 3 correlates with CD14" is
a statement about one seed's arbitrary coordinates: another seed spreads the same signal over other dimensions. The
rotation-invariant question is how much of the marker all latent dimensions together explain: the ``R^2`` of a
least-squares regression of the marker on ``[1, z]`` is unchanged by any invertible linear map of ``z``, so it should
agree across seeds that found equivalent solutions.

A marker is a gene (its ``log1p`` normalized counts, 10,000 per cell) or a column of ``obs``: a numeric column as it
is, a categorical (or string/boolean) column as one 0/1 indicator per category, named ``"column=category"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anndata as ad
import numpy as np
import pandas as pd

from countvae._warnings import warn_at_caller
from countvae.diagnostics.analyses.heldout_data import gene_variance, log1p_normalized
from countvae.errors import CountVAEWarning, InvalidArgumentError

#: Categories of an obs column expanded into indicators at most.
MAX_CATEGORIES = 50


def default_markers(adata: ad.AnnData, var_names: pd.Index, n: int = 8) -> list[str]:
    """The ``n`` genes with the largest variance of ``log1p`` normalized expression in ``adata``."""
    order = np.argsort(-gene_variance(adata, var_names), kind="stable")[:n]
    return [str(var_names[i]) for i in order]


def marker_matrix(adata: ad.AnnData, markers: Sequence[str], var_names: pd.Index) -> pd.DataFrame:
    """The marker values of each cell, (cells, marker columns).

    Genes are looked up among ``var_names`` first, then ``obs`` columns.

    Raises
    ------
    InvalidArgumentError
        If a marker is neither a gene of the fits nor a column of ``obs``, or a column has too many categories.

    """
    markers = marker_names(markers, adata.obs, var_names)
    genes = [m for m in markers if m in var_names]
    gene_values: dict[str, np.ndarray] = {}
    if genes:
        values = log1p_normalized(adata, var_names, pd.Index(genes)).toarray()
        gene_values = {g: values[:, i] for i, g in enumerate(genes)}
    parts: dict[str, np.ndarray] = {}
    for m in markers:
        parts.update({m: gene_values[m]} if m in gene_values else _obs_marker(adata.obs[m], m))
    return _varying(pd.DataFrame(parts, index=adata.obs_names))


def marker_names(markers: Sequence[str] | str, obs: pd.DataFrame, var_names: pd.Index) -> list[str]:
    """``markers`` as a list of distinct names, each a gene among ``var_names`` or a column of ``obs``.

    Raises
    ------
    InvalidArgumentError
        If ``markers`` is empty, or a marker is neither a gene of the fits nor a column of ``obs``.

    """
    markers = [markers] if isinstance(markers, str) else markers
    markers = list(dict.fromkeys(str(m) for m in markers))
    if not markers:
        raise InvalidArgumentError("markers is empty; pass gene names or obs columns, or None for the defaults.")
    missing = [m for m in markers if m not in var_names and m not in obs.columns]
    if missing:
        raise InvalidArgumentError(
            f"Markers {missing} are neither genes of the fitted models nor columns of adata.obs "
            f"(obs columns: {list(obs.columns)[:20]}; genes e.g. {list(var_names[:5])}). "
            "Check the spelling and case of the gene symbols."
        )
    return markers


def _varying(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without the markers that take fewer than two values on its cells, with a warning naming them.

    Such a marker (a constant column, one missing on every cell, a category no cell has) correlates with
    nothing: its correlations and ``R^2`` are undefined, and no latent dimension is its best.
    """
    flat = [str(name) for name in frame.columns if frame[name].dropna().nunique() < 2]
    if flat:
        warn_at_caller(
            f"Markers {flat} take fewer than two values on these {frame.shape[0]} cells (constant, missing, or a "
            "category none of them has); they are left out of the marker analysis.",
            CountVAEWarning,
        )
    return frame.drop(columns=flat)


def _obs_marker(series: pd.Series, name: str) -> dict[str, np.ndarray]:
    """A numeric obs column as it is; any other as one 0/1 indicator per category (NaN where missing)."""
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return {name: series.to_numpy(dtype=np.float64, na_value=np.nan)}
    categories = series.astype("category").cat.categories
    if len(categories) > MAX_CATEGORIES:
        raise InvalidArgumentError(
            f"obs column {name!r} has {len(categories)} categories; at most {MAX_CATEGORIES} can be markers."
        )
    missing = series.isna().to_numpy()
    out = {}
    for cat in categories:
        values = (series == cat).to_numpy(dtype=np.float64)
        values[missing] = np.nan
        out[f"{name}={cat}"] = values
    return out


def _finite_rows(values: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isfinite(values)
    return values[keep], z[keep]


def dimension_correlations(z: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Pearson correlation of each latent dimension with the marker (NaN cells dropped), (d,)."""
    v, zz = _finite_rows(values, z)
    vc, zc = v - v.mean(), zz - zz.mean(0)
    denom = np.linalg.norm(zc, axis=0) * np.linalg.norm(vc)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (zc.T @ vc) / denom, np.nan)


def r_squared(z: np.ndarray, values: np.ndarray) -> float:
    """In-sample ``R^2`` of least squares of the marker on ``[1, z]`` (NaN cells dropped).

    Invariant under every invertible affine map of ``z``: the column span of ``[1, z A + c]`` is that of ``[1, z]``.
    """
    v, zz = _finite_rows(values, z)
    if v.size <= zz.shape[1] + 1 or np.var(v) == 0:
        return np.nan
    design = np.column_stack([np.ones(len(v)), zz])
    coef, *_ = np.linalg.lstsq(design, v, rcond=None)
    resid = v - design @ coef
    return float(1.0 - resid @ resid / np.sum((v - v.mean()) ** 2))


def marker_correlations(latents: Mapping[str, np.ndarray], markers: pd.DataFrame) -> pd.DataFrame:
    """Correlation of every latent dimension with every marker, per fit (long format).

    Returns
    -------
    pandas.DataFrame
        Columns ``fit``, ``marker``, ``dim`` (0-based), ``corr``.

    """
    rows = []
    for fit, z in latents.items():
        z = np.asarray(z, dtype=np.float64)
        for marker in markers.columns:
            corr = dimension_correlations(z, markers[marker].to_numpy())
            rows.extend({"fit": fit, "marker": marker, "dim": k, "corr": float(c)} for k, c in enumerate(corr))
    return pd.DataFrame(rows)


def marker_r2_table(latents: Mapping[str, np.ndarray], markers: pd.DataFrame) -> pd.DataFrame:
    """The invariant ``R^2`` of every marker on all latent dimensions, per fit (columns ``fit``, ``marker``, ``r2``)."""
    rows = []
    for fit, z in latents.items():
        z = np.asarray(z, dtype=np.float64)
        rows.extend({"fit": fit, "marker": m, "r2": r_squared(z, markers[m].to_numpy())} for m in markers.columns)
    return pd.DataFrame(rows)


def marker_summary(latents: Mapping[str, np.ndarray], markers: pd.DataFrame) -> pd.DataFrame:
    """Per marker: the per-dimension story (differs across seeds) against the invariant ``R^2`` (agrees).

    Returns
    -------
    pandas.DataFrame
        One row per marker: ``marker``; ``r2_mean``, ``r2_min``, ``r2_max`` (the invariant ``R^2`` over fits);
        ``best_dims`` (per fit, the dimension with the largest absolute correlation and that correlation);
        ``best_dim_agrees`` (every fit picks the same dimension with the same sign); ``max_abs_corr_mean``;
        ``same_dim_corr_range`` (mean over dimensions of the range across fits of that dimension's correlation).

    """
    corr = marker_correlations(latents, markers)
    r2_all = marker_r2_table(latents, markers)
    rows = []
    for marker in markers.columns:
        r2 = r2_all.loc[r2_all["marker"] == marker, "r2"].to_numpy()
        sub = corr[corr["marker"] == marker]
        table = sub.pivot(index="fit", columns="dim", values="corr").loc[list(latents)]
        best_dim = table.abs().to_numpy().argmax(axis=1)
        best_corr = table.to_numpy()[np.arange(len(table)), best_dim]
        best = [f"{fit}: z{d} ({c:+.2f})" for fit, d, c in zip(table.index, best_dim, best_corr, strict=True)]
        measured = r2[np.isfinite(r2)]  # none on as few cells as latent dimensions + 1 (no residual to score)
        rows.append(
            {
                "marker": marker,
                "r2_mean": float(measured.mean()) if measured.size else np.nan,
                "r2_min": float(measured.min()) if measured.size else np.nan,
                "r2_max": float(measured.max()) if measured.size else np.nan,
                "best_dims": "; ".join(best),
                "best_dim_agrees": bool(len(set(zip(best_dim, np.sign(best_corr), strict=True))) == 1),
                "max_abs_corr_mean": float(np.mean(np.abs(best_corr))),
                "same_dim_corr_range": float(np.mean(table.max(axis=0) - table.min(axis=0))),
            }
        )
    return pd.DataFrame(rows)
