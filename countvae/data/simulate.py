"""Counts simulated from the countvae model family, with the true parameters kept.

The simulator is the project's test oracle: latent sources, decoder weights, dispersions and batch effects are
stored next to the counts so that every estimate can be compared with the truth.
"""

from __future__ import annotations

from typing import Literal

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.special import log_softmax

from countvae._checks import check_choice, check_int, check_number
from countvae.data.validation import MAX_EXACT_COUNT
from countvae.errors import InvalidArgumentError

SourceKind = Literal["normal", "laplace", "uniform", "discrete"]
#: The largest gene mean simulated (numpy's Poisson sampler refuses means near 1e19).
MAX_MEAN = 1e12


def draw_sources(kind: SourceKind | list[SourceKind], n: int, n_latent: int, rng: np.random.Generator) -> np.ndarray:
    """Independent latent sources with mean 0 and variance 1.

    Parameters
    ----------
    kind
        Distribution of every source, or one per source: ``"normal"``, ``"laplace"``, ``"uniform"``, or
        ``"discrete"`` (three equally likely levels -1, 0, 1, rescaled).
    n
        Number of cells.
    n_latent
        Number of sources.
    rng
        Random generator.

    """
    kinds = [kind] * n_latent if isinstance(kind, str) else list(kind)
    if len(kinds) != n_latent:
        raise InvalidArgumentError(f"Got {len(kinds)} source kinds for n_latent={n_latent}.")
    columns = []
    for k in kinds:
        if k == "normal":
            columns.append(rng.standard_normal(n))
        elif k == "laplace":
            columns.append(rng.laplace(0.0, 1.0 / np.sqrt(2.0), n))
        elif k == "uniform":
            columns.append(rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), n))
        elif k == "discrete":
            columns.append(rng.integers(-1, 2, n) * np.sqrt(1.5))
        else:
            raise InvalidArgumentError(f"Unknown source kind {k!r}; use normal, laplace, uniform or discrete.")
    return np.stack(columns, axis=1)


def simulate(
    n_cells: int = 2000,
    n_genes: int = 200,
    n_latent: int = 3,
    likelihood: Literal["poisson", "nb", "zinb"] = "nb",
    decoder: Literal["linear", "mlp"] = "linear",
    sources: SourceKind | list[SourceKind] = "normal",
    n_batches: int = 1,
    batch_effect: float = 0.5,
    loading_scale: float = 1.0,
    library_size: float = 2000.0,
    library_log_sd: float = 0.3,
    theta: float = 10.0,
    dropout: float = 0.1,
    n_hidden: int = 32,
    leaky_slope: float = 0.2,
    seed: int = 0,
    n_source_bins: int = 10,
    n_groups: int = 1,
    n_de_genes: int = 0,
    de_lfc: tuple[float, float] = (1.0, 2.0),
    loading_sparsity: float = 0.0,
    loadings: np.ndarray | None = None,
    large_counts: Literal["raise", "drop"] = "raise",
) -> ad.AnnData:
    """Simulate counts with known latent sources and decoder.

    For cell ``n`` with sources ``z_n`` (``obsm['z_true']``), batch ``s_n`` and size factor ``l_n``, gene ``g`` has
    mean ``l_n * exp(eta_ng)``, where ``eta_ng = b_g + W_g z_n + c_{s_n g}`` for the linear decoder, and for the MLP
    decoder ``eta_n = log_softmax(V2 leaky_relu(V1 z_n + a1) + a2) + c_{s_n}``. The MLP's shares sum to 1, so its
    observed library size is close to ``l_n``; the linear decoder's baseline ``b`` is a log-proportion
    (``sum_g exp(b_g) = 1``), but ``sum_g exp(b_g + W_g z_n)`` is not 1 away from ``z = 0``, and its libraries run
    larger (a median of 1.4-1.5 ``l_n`` with the defaults).

    Parameters
    ----------
    n_cells, n_genes, n_latent
        Shape of the data and number of sources.
    likelihood
        Count distribution: Poisson, negative binomial, or zero-inflated NB.
    theta
        Typical NB inverse dispersion; gene-wise values are drawn log-normally around it.
    dropout
        ZINB probability that a count is replaced by zero.
    decoder
        ``"linear"`` (log-linear) or ``"mlp"`` (one hidden layer of leaky-ReLU units).
    n_hidden
        Hidden units of the MLP decoder.
    leaky_slope
        Negative slope of the MLP's leaky ReLU: 1 is linear, 0 is a ReLU.
    sources
        Distribution of the sources, see :func:`draw_sources`.
    n_batches
        Number of batches, a known factor separate from the sources.
    batch_effect
        Standard deviation of each batch's log-scale gene offsets.
    loading_scale
        Standard deviation of each gene's total latent effect ``W_g z``.
    library_size, library_log_sd
        Median size factor and the standard deviation of its logarithm.
    seed
        Seed of every random draw.
    n_source_bins
        Continuous sources are also given as labels of this many equally populated bins (``obsm['z_true_labels']``);
        discrete sources keep their levels.
    n_groups
        Groups of cells (``obs['group']``, ``"group0"``, ``"group1"``, ...), assigned uniformly at random and
        independently of the sources and batches. With the default 1 nothing about groups is drawn or stored and the
        output is the same as without these arguments.
    n_de_genes
        Genes with planted differential expression in each group other than the reference ``group0``, chosen at
        random for each group. Gene ``g`` of group ``k`` gets ``eta_ng += log(2) * lfc_kg``, so its mean at fixed
        sources, batch and size factor is ``2 ** lfc_kg`` times the reference group's.
    de_lfc
        ``(low, high)``: each planted ``|lfc_kg|`` (log2 fold change) is uniform on this interval; its sign is + or -
        with probability 1/2.
    loading_sparsity
        Linear decoder: the share of loadings ``W_gk`` set to exactly 0, each independently (every source keeps at
        least 3 loaded genes). The others are scaled by ``1 / sqrt(1 - loading_sparsity)`` so that ``loading_scale``
        keeps its meaning on average. Each source then acts on its own gene set (its true program,
        :func:`true_programs`), and genes with a zero row are noise. The zeros come from a separate random stream:
        with the default 0 nothing is drawn and the output is the same as without this argument.
    loadings
        Linear decoder: the loadings ``W`` (genes x latent) to use instead of drawing them (``loading_scale`` and
        ``loading_sparsity`` then do not apply). Everything drawn before ``W`` (sources, batches, size factors, the
        baseline ``b``) is the same as without it for the same seed, shape and source kinds, and so are the
        dispersions between two calls that both give loadings: a design can be built on a first call.
    large_counts
        A drawn count above ``2**24`` (the largest integer float32 holds exactly, and the largest count the models
        accept): ``"raise"`` refuses the simulation, naming the settings to lower; ``"drop"`` leaves out the cells
        that drew one (every other cell is as drawn; ``uns['simulation']['n_dropped_cells']`` counts them), for
        heavy-tailed sources where a few cells in tens of thousands reach such rates.

    Returns
    -------
    AnnData
        CSR float32 integer counts in ``X`` (each at most ``2**24``, where float32 is exact: see ``large_counts``);
        ``obs['batch']`` (categorical), ``obs['size_factor']``; ``obsm['z_true']``; ``obsm['z_true_labels']``
        (integer labels of the sources, the discrete factors that InfoMEC needs);
        ``uns['simulation']`` with the true parameters (``W``, ``b``, ``batch_offset``, ``theta``, ``dropout``, the MLP
        weights, and ``source_kinds``, the distribution of each source). With ``n_groups > 1`` also ``obs['group']``,
        ``var['de_lfc_group<k>']`` (the planted log2 fold change of group ``k`` against ``group0``, 0 for genes without
        one) and in ``uns['simulation']`` ``de_lfc`` (groups x genes, row 0 zero) and ``group_names``;
        :func:`planted_lfc` gives the true log2 fold change between two groups. The groups and their effects come from a
        separate random stream, so the rest of the simulation is as with ``n_groups=1`` whenever ``n_de_genes=0``.

        The planted effect is on each gene's mean; a cell's expected share of its library (what a model's normalised
        expression estimates) also moves by ``-log2`` of the group's total fold change over all genes, which is small
        when few genes are planted with balanced signs.

    """
    loadings = _checked_design(
        likelihood, decoder, loading_sparsity, loadings, n_source_bins, n_cells, n_genes, n_latent, n_batches
    )
    _check_scales(
        likelihood, batch_effect, loading_scale, library_size, library_log_sd, theta, dropout, leaky_slope, seed
    )
    check_choice("large_counts", large_counts, ("raise", "drop"))
    loading_sparsity = float(loading_sparsity)
    groups, de_lfc_matrix = _draw_groups(n_cells, n_genes, n_groups, n_de_genes, de_lfc, seed)
    rng = np.random.default_rng(seed)
    z = draw_sources(sources, n_cells, n_latent, rng)
    batch = rng.integers(0, n_batches, n_cells)
    batch_offset = rng.normal(0.0, batch_effect, (n_batches, n_genes)) if n_batches > 1 else np.zeros((1, n_genes))
    log_size = np.log(library_size) + rng.normal(0.0, library_log_sd, n_cells)
    if decoder == "linear":
        eta, params = _linear_log_shares(z, n_genes, loadings, loading_scale, loading_sparsity, seed, rng)
    else:
        eta, params = _mlp_log_shares(z, n_genes, n_hidden, loading_scale, leaky_slope, rng)
    eta = eta + batch_offset[batch]
    if de_lfc_matrix is not None and n_de_genes > 0:
        eta = eta + np.log(2.0) * de_lfc_matrix[groups]
    mu = np.exp(log_size[:, None] + eta)
    if not np.all(mu <= MAX_MEAN):
        raise InvalidArgumentError(
            f"A simulated gene mean reaches {np.max(mu):.3g} counts (more than {MAX_MEAN:.0e}); lower loading_scale "
            f"({loading_scale}), library_size ({library_size}), batch_effect ({batch_effect}) or de_lfc ({de_lfc})."
        )
    theta_g = theta * np.exp(rng.normal(0.0, 0.3, n_genes))
    counts = _nonempty_counts(mu, likelihood, theta_g, dropout, rng, refuse_large=large_counts == "raise")
    params.update(
        batch_offset=batch_offset,
        theta=theta_g,
        dropout=float(dropout if likelihood == "zinb" else 0.0),
        likelihood=likelihood,
        decoder=decoder,
        sources=sources if isinstance(sources, str) else ",".join(sources),
        source_kinds=np.array([sources] * n_latent if isinstance(sources, str) else list(sources), dtype=str),
        seed=seed,
    )
    adata = _as_anndata(counts, batch, n_batches, log_size, z, n_source_bins, params)
    if de_lfc_matrix is not None:
        _store_groups(adata, groups, de_lfc_matrix)
    return _without_large_counts(adata, counts) if large_counts == "drop" else adata


def _without_large_counts(adata: ad.AnnData, counts: np.ndarray) -> ad.AnnData:
    """``adata`` without the cells that drew a count above 2**24, counted in ``uns['simulation']``."""
    keep = counts.max(axis=1) <= MAX_EXACT_COUNT
    out = adata[keep].copy()
    out.uns["simulation"]["n_dropped_cells"] = int((~keep).sum())
    if out.n_obs == 0 or (counts[keep].sum(0) == 0).any():
        raise InvalidArgumentError(
            "Leaving out the cells with counts above 2**24 left no cells or a gene with zero counts; lower "
            "library_size or loading_scale."
        )
    return out


def _checked_design(
    likelihood: str,
    decoder: str,
    loading_sparsity: float,
    loadings: np.ndarray | None,
    n_source_bins: int,
    n_cells: int,
    n_genes: int,
    n_latent: int,
    n_batches: int,
) -> np.ndarray | None:
    """Check :func:`simulate`'s arguments; the given loadings as float64, or ``None``."""
    check_choice("likelihood", likelihood, ("poisson", "nb", "zinb"))
    check_choice("decoder", decoder, ("linear", "mlp"))
    loading_sparsity = check_number("loading_sparsity", loading_sparsity, 0.0, 1.0, high_open=True)
    if loading_sparsity > 0 and decoder != "linear":
        raise InvalidArgumentError("loading_sparsity sets loadings of the linear decoder to 0; use decoder='linear'.")
    check_int("n_source_bins", n_source_bins, 2)
    if loadings is not None:
        if decoder != "linear":
            raise InvalidArgumentError("loadings are the linear decoder's W; use decoder='linear'.")
        if loading_sparsity > 0:
            raise InvalidArgumentError("Give either loadings or loading_sparsity, not both.")
        loadings = np.asarray(loadings, dtype=np.float64)
        if loadings.shape != (n_genes, n_latent) or not np.isfinite(loadings).all():
            raise InvalidArgumentError(
                f"loadings must be finite, of shape (n_genes, n_latent) = ({n_genes}, {n_latent}); "
                f"got shape {loadings.shape}."
            )
    for name, value in (("n_cells", n_cells), ("n_genes", n_genes), ("n_latent", n_latent), ("n_batches", n_batches)):
        check_int(name, value, 1)
    return loadings


def _check_scales(
    likelihood: str,
    batch_effect: float,
    loading_scale: float,
    library_size: float,
    library_log_sd: float,
    theta: float,
    dropout: float,
    leaky_slope: float,
    seed: int,
) -> None:
    """Refuse :func:`simulate`'s scales outside their ranges (numpy's samplers fail on them with their own words)."""
    for name, value in (
        ("batch_effect", batch_effect),
        ("loading_scale", loading_scale),
        ("library_log_sd", library_log_sd),
    ):
        check_number(name, value, 0.0)
    check_number("library_size", library_size, 0.0, low_open=True)
    if likelihood != "poisson":  # the Poisson's counts use neither
        check_number("theta", theta, 0.0, low_open=True)
    if likelihood == "zinb":
        check_number("dropout", dropout, 0.0, 1.0, high_open=True)
    check_number("leaky_slope", leaky_slope)
    check_int("seed", seed, 0)


def _baseline(n_genes: int, rng: np.random.Generator) -> np.ndarray:
    """Each gene's baseline log-proportion ``b`` (``sum_g exp(b_g) = 1``)."""
    base = rng.normal(0.0, 1.0, n_genes)
    return base - np.log(np.exp(base).sum())


def _linear_log_shares(
    z: np.ndarray,
    n_genes: int,
    loadings: np.ndarray | None,
    loading_scale: float,
    loading_sparsity: float,
    seed: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict]:
    """``eta = b + z W^T`` of the linear decoder (cells x genes), and the true parameters drawn for it."""
    b = _baseline(n_genes, rng)
    params: dict = {}
    if loadings is not None:
        W = loadings.copy()
    else:
        n_latent = z.shape[1]
        W = rng.normal(0.0, loading_scale / np.sqrt(n_latent), (n_genes, n_latent))
        if loading_sparsity > 0:
            W = W * _loading_mask(n_genes, n_latent, loading_sparsity, seed) / np.sqrt(1.0 - loading_sparsity)
            params["loading_sparsity"] = float(loading_sparsity)
    params.update(W=W, b=b)
    return b + z @ W.T, params


def _mlp_log_shares(
    z: np.ndarray, n_genes: int, n_hidden: int, loading_scale: float, leaky_slope: float, rng: np.random.Generator
) -> tuple[np.ndarray, dict]:
    """``eta = log_softmax(b + V2 leaky_relu(V1 z + a1))`` of the MLP decoder, and its true parameters."""
    b = _baseline(n_genes, rng)
    n_latent = z.shape[1]
    V1 = rng.normal(0.0, 1.0 / np.sqrt(n_latent), (n_hidden, n_latent))
    a1 = rng.normal(0.0, 0.5, n_hidden)
    V2 = rng.normal(0.0, loading_scale / np.sqrt(n_hidden), (n_genes, n_hidden))
    hidden = z @ V1.T + a1
    logits = b + np.where(hidden > 0, hidden, leaky_slope * hidden) @ V2.T  # a leaky ReLU layer
    return log_softmax(logits, axis=1), {"V1": V1, "a1": a1, "V2": V2, "b": b, "leaky_slope": leaky_slope}


def _nonempty_counts(
    mu: np.ndarray,
    likelihood: str,
    theta: np.ndarray,
    dropout: float,
    rng: np.random.Generator,
    refuse_large: bool = True,
) -> np.ndarray:
    """Counts drawn with means ``mu``; a cell that comes out empty is redrawn from the same model (up to 20 times)."""
    counts = _draw_counts(mu, likelihood, theta, dropout, rng)
    for _ in range(20):
        empty = counts.sum(1) == 0
        if not empty.any():
            break
        counts[empty] = _draw_counts(mu[empty], likelihood, theta, dropout, rng)
    if (counts.sum(1) == 0).any() or (counts.sum(0) == 0).any():
        raise InvalidArgumentError(
            "The simulation produced cells or genes with zero counts; raise library_size or n_cells."
        )
    if refuse_large and counts.max() > MAX_EXACT_COUNT:  # stored as float32, it would not be the count drawn
        raise InvalidArgumentError(
            f"The simulation drew a count of {counts.max():.0f}, above 2**24 = {MAX_EXACT_COUNT:,}, the largest "
            "integer float32 holds exactly (and the largest count the models accept): some gene's rate in some "
            "cell was that large. Lower library_size or library_log_sd, or loading_scale or loading_sparsity (larger "
            "loadings, and Laplace sources' heavier tails, reach larger rates)."
        )
    return counts


def _as_anndata(
    counts: np.ndarray,
    batch: np.ndarray,
    n_batches: int,
    log_size: np.ndarray,
    z: np.ndarray,
    n_source_bins: int,
    params: dict,
) -> ad.AnnData:
    """The simulated data set: CSR float32 counts, batches, size factors, true sources and parameters."""
    n_cells, n_genes = counts.shape
    adata = ad.AnnData(X=sp.csr_matrix(counts.astype(np.float32)))
    adata.obs_names = [f"cell{i}" for i in range(n_cells)]
    adata.var_names = [f"gene{g}" for g in range(n_genes)]
    adata.obs["batch"] = pd.Categorical(
        [f"batch{s}" for s in batch], categories=[f"batch{s}" for s in range(n_batches)]
    )
    adata.obs["size_factor"] = np.exp(log_size)
    adata.obsm["z_true"] = z
    adata.obsm["z_true_labels"] = source_labels(z, n_source_bins)
    adata.uns["simulation"] = params
    return adata


def _store_groups(adata: ad.AnnData, groups: np.ndarray, de_lfc_matrix: np.ndarray) -> None:
    """The simulated groups in ``obs['group']`` and their planted log2 fold changes in ``var`` and ``uns``."""
    n_groups = de_lfc_matrix.shape[0]
    names = [f"group{k}" for k in range(n_groups)]
    adata.obs["group"] = pd.Categorical([names[k] for k in groups], categories=names)
    for k in range(1, n_groups):
        adata.var[f"de_lfc_{names[k]}"] = de_lfc_matrix[k]
    adata.uns["simulation"].update(de_lfc=de_lfc_matrix, group_names=np.array(names, dtype=str))


#: Fewest genes each source loads on with ``loading_sparsity > 0``.
MIN_LOADED_GENES = 3


def _loading_mask(n_genes: int, n_latent: int, sparsity: float, seed: int) -> np.ndarray:
    """Which loadings are non-zero (genes x latent), from a random stream of its own."""
    rng = np.random.default_rng([int(seed), 0x5A])
    mask = rng.random((n_genes, n_latent)) >= sparsity
    for k in range(n_latent):
        short = MIN_LOADED_GENES - int(mask[:, k].sum())
        if short > 0:
            mask[rng.choice(np.flatnonzero(~mask[:, k]), min(short, n_genes), replace=False), k] = True
    return mask


def true_programs(adata: ad.AnnData) -> dict[str, list[str]]:
    """The genes each simulated source loads on, ``{"source<k>": [genes]}`` (linear decoder).

    Every gene for dense loadings; with ``loading_sparsity > 0`` each source's own gene set.
    """
    params = adata.uns.get("simulation", {})
    if params.get("decoder") != "linear":
        raise InvalidArgumentError("true_programs needs data simulated with decoder='linear'.")
    W = np.asarray(params["W"])
    names = np.asarray(adata.var_names)
    return {f"source{k}": [str(g) for g in names[W[:, k] != 0]] for k in range(W.shape[1])}


def _draw_groups(
    n_cells: int, n_genes: int, n_groups: int, n_de_genes: int, de_lfc: tuple[float, float], seed: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Group of each cell and the planted log2 fold changes (groups x genes), from their own random stream."""
    check_int("n_groups", n_groups, 1)
    check_int("n_de_genes", n_de_genes, 0, n_genes)
    if n_de_genes > 0 and n_groups < 2:
        raise InvalidArgumentError("n_de_genes > 0 plants differences between groups; set n_groups to 2 or more.")
    low, high = (float(v) for v in de_lfc)
    if not 0.0 < low <= high:
        raise InvalidArgumentError(f"de_lfc must be (low, high) with 0 < low <= high, got {de_lfc!r}.")
    if n_groups == 1:
        return None, None
    # A stream of its own keeps every draw of the base simulation unchanged.
    rng = np.random.default_rng([int(seed), 0xDE])
    groups = rng.integers(0, n_groups, n_cells)
    lfc = np.zeros((n_groups, n_genes))
    for k in range(1, n_groups):
        genes = rng.choice(n_genes, n_de_genes, replace=False)
        lfc[k, genes] = rng.uniform(low, high, n_de_genes) * rng.choice([-1.0, 1.0], n_de_genes)
    return groups, lfc


def planted_lfc(adata: ad.AnnData, group1: str, group2: str | None = None) -> pd.Series:
    """True log2 fold change of each gene's mean between two simulated groups.

    Parameters
    ----------
    adata
        Output of :func:`simulate` with ``n_groups > 1``.
    group1, group2
        Group names (``"group0"``, ...). ``group2=None`` means the other cells, defined only with two groups (with
        more, the rest is a mixture whose fold change depends on each cell's sources).

    Returns
    -------
    pandas.Series
        ``lfc[group1] - lfc[group2]`` per gene (index: gene names), the log2 ratio of the means at fixed sources,
        batch and size factor.

    """
    params = adata.uns.get("simulation", {})
    if "de_lfc" not in params:
        raise InvalidArgumentError("This AnnData has no simulated groups; simulate with n_groups >= 2.")
    names = [str(n) for n in np.asarray(params["group_names"])]
    if group2 is None:
        if len(names) != 2:
            raise InvalidArgumentError(f"group2=None (the other cells) needs exactly 2 groups, got {len(names)}.")
        group2 = names[1 - names.index(group1)] if group1 in names else None
    for g in (group1, group2):
        if g not in names:
            raise InvalidArgumentError(f"Unknown group {g!r}; the simulated groups are {names}.")
    lfc = np.asarray(params["de_lfc"])
    return pd.Series(lfc[names.index(group1)] - lfc[names.index(group2)], index=adata.var_names, name="lfc_true")


def source_labels(z: np.ndarray, n_bins: int) -> np.ndarray:
    """Integer labels of each column: its levels if it has at most ``n_bins`` values, else quantile bins.

    The labels of ``obsm["z_true_labels"]``; :func:`countvae.metrics.discretize` on checked input.
    """
    labels = np.empty(z.shape, dtype=np.int64)
    for j in range(z.shape[1]):
        levels = np.unique(z[:, j])
        if levels.size <= n_bins:
            labels[:, j] = np.searchsorted(levels, z[:, j])
        else:
            edges = np.quantile(z[:, j], np.linspace(0.0, 1.0, n_bins + 1)[1:-1])
            labels[:, j] = np.searchsorted(edges, z[:, j], side="right")
    return labels


def _draw_counts(
    mu: np.ndarray, likelihood: str, theta: np.ndarray, dropout: float, rng: np.random.Generator
) -> np.ndarray:
    if likelihood == "poisson":
        return rng.poisson(mu)
    rate = rng.gamma(shape=theta, scale=mu / theta)
    counts = rng.poisson(rate)
    if likelihood == "zinb":
        counts = np.where(rng.random(mu.shape) < dropout, 0, counts)
    return counts
