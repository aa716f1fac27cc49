"""Figures for the invariance checks: each function takes data, draws on matplotlib axes and returns them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

#: Where exact zeros are drawn on a logarithmic axis (and labelled as such).
ZERO_FLOOR = 1e-17


def _axes(ax, ncols: int = 1, figsize=None):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax
    _, created = plt.subplots(1, ncols, figsize=figsize or (4.2 * ncols, 3.6), squeeze=False)
    return created[0] if ncols > 1 else created[0, 0]


def plot_latent_before_after(
    latent: np.ndarray,
    latent_transformed: np.ndarray,
    labels: Sequence | None = None,
    dims: tuple[int, int] = (0, 1),
    titles: tuple[str, str] = ("original coordinates", "after the latent map"),
    axes=None,
):
    """Scatter the latent means before and after a map, coloured by ``labels``.

    Parameters
    ----------
    latent, latent_transformed
        (cells, L) arrays, e.g. ``Z`` and ``Z A^T``.
    labels
        One category per cell (e.g. cell types), or ``None``.
    dims
        The two latent dimensions drawn (for ``L = 1`` the second axis is the cell index).
    titles
        Panel titles.
    axes
        Two matplotlib axes, or ``None`` to create them.

    Returns
    -------
    numpy.ndarray
        The two axes.

    """
    axes = _axes(axes, ncols=2, figsize=(8.4, 3.8))
    categories = pd.Categorical(labels) if labels is not None else None
    for ax, Z, title in zip(axes, (latent, latent_transformed), titles, strict=True):
        Z = np.asarray(Z)
        x = Z[:, dims[0]]
        y = Z[:, dims[1]] if Z.shape[1] > 1 else np.arange(len(Z))
        if categories is None:
            ax.scatter(x, y, s=4, alpha=0.6, color="0.3", rasterized=True)
        else:
            for code, name in enumerate(categories.categories):
                keep = categories.codes == code
                ax.scatter(x[keep], y[keep], s=4, alpha=0.6, label=str(name), rasterized=True)
        ax.set_xlabel(f"z{dims[0]}")
        ax.set_ylabel(f"z{dims[1]}" if Z.shape[1] > 1 else "cell")
        ax.set_title(title)
        ax.set_aspect("equal" if Z.shape[1] > 1 else "auto", adjustable="datalim")
    if categories is not None:
        axes[1].legend(markerscale=3, fontsize="small", loc="best", frameon=False)
    return axes


def plot_loadings(
    loadings: np.ndarray,
    loadings_transformed: np.ndarray,
    gene_names: Sequence[str],
    genes: Sequence[str] | None = None,
    dim: int = 0,
    ax=None,
):
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
        Axes, or ``None`` to create one.

    Returns
    -------
    matplotlib.axes.Axes

    """
    ax = _axes(ax, figsize=(5.0, 4.0))
    names = pd.Index([str(g) for g in gene_names])
    W0, W1 = np.asarray(loadings), np.asarray(loadings_transformed)
    if genes is None:
        rows = np.argsort(-np.linalg.norm(W0, axis=1))[:12]
    else:
        rows = names.get_indexer([str(g) for g in genes])
        if (rows < 0).any():
            missing = [g for g, r in zip(genes, rows, strict=True) if r < 0]
            raise ValueError(f"genes not found: {missing}")
    y = np.arange(len(rows))
    ax.barh(y - 0.2, W0[rows, dim], height=0.4, label="original")
    ax.barh(y + 0.2, W1[rows, dim], height=0.4, label="after the map")
    ax.set_yticks(y, names[rows])
    ax.invert_yaxis()
    ax.axvline(0.0, color="0.5", lw=0.8)
    ax.set_xlabel(f"loading on z{dim}")
    ax.legend(frameon=False, fontsize="small")
    return ax


def plot_differences(per_cell: dict[str, pd.DataFrame], threshold: float | None = None, ax=None):
    """Per-cell ``|log p(x) transformed - original|`` (same base noise) for every map, on a log scale.

    Exact zeros are drawn at :data:`ZERO_FLOOR`. The maps that preserve the
    prior sit at rounding level (about 1e-13 nats in float64); the controls sit
    at the size of a real change (about 1 nat).

    Parameters
    ----------
    per_cell
        ``InvarianceReport.per_cell``: one frame per ``"variant / map"`` with
        columns ``lpd`` and ``lpd_crn``.
    threshold
        Equality tolerance to draw as a line (e.g. 1e-9).
    ax
        Axes, or ``None`` to create one.

    Returns
    -------
    matplotlib.axes.Axes

    """
    ax = _axes(ax, figsize=(6.5, 0.45 * len(per_cell) + 1.5))
    labels = list(per_cell)
    rng = np.random.default_rng(0)
    for row, label in enumerate(labels):
        frame = per_cell[label]
        diff = np.abs(frame["lpd_crn"].to_numpy() - frame["lpd"].to_numpy())
        shown = np.maximum(diff, ZERO_FLOOR)
        jitter = rng.uniform(-0.25, 0.25, len(shown))
        ax.scatter(shown, row + jitter, s=5, alpha=0.5, rasterized=True)
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.axvline(ZERO_FLOOR, color="0.7", lw=0.8, ls=":")
    if threshold is not None:
        ax.axvline(threshold, color="C3", lw=1.0, ls="--", label=f"tolerance {threshold:g}")
        ax.legend(frameon=False, fontsize="small", loc="lower right")
    ax.set_xlabel("|log p(x) transformed - original| per cell (nats; exact 0 drawn at the dotted line)")
    return ax


def plot_outputs(outputs: pd.DataFrame, ax=None):
    """Heat map of ``log10`` change of each output (rows) under each map (columns).

    Parameters
    ----------
    outputs
        ``InvarianceReport.outputs`` (its ``"invariant under"`` column is shown in the row labels).
    ax
        Axes, or ``None`` to create one.

    Returns
    -------
    matplotlib.axes.Axes

    """
    values = outputs.drop(columns=["invariant under"], errors="ignore").astype(float)
    ax = _axes(ax, figsize=(1.1 * values.shape[1] + 4.5, 0.45 * values.shape[0] + 1.8))
    shown = np.log10(np.maximum(values.to_numpy(), ZERO_FLOOR))
    image = ax.imshow(shown, aspect="auto", cmap="viridis", vmin=-17, vmax=1)
    ax.set_xticks(range(values.shape[1]), values.columns, rotation=40, ha="right")
    if "invariant under" in outputs:
        rows = [f"{i}  [{u}]" for i, u in zip(outputs.index, outputs["invariant under"], strict=True)]
    else:
        rows = list(values.index)
    ax.set_yticks(range(values.shape[0]), rows)
    ax.figure.colorbar(image, ax=ax, label="log10 change (-17: none)")
    return ax
