r"""Differential expression between two groups of cells from a fitted :class:`~countvae.CountVAE`.

This is scvi-tools' ``differential_expression(mode="change")`` (Boyeau et al. 2019, as implemented in scvi-tools 1.4):
the same definitions and column names, plus a seed, so that a call is reproducible (scvi-tools draws from numpy's
global generator); the Monte Carlo error of every estimate; and a default number of draws chosen so that the call set
barely moves when only the sampling seed changes.

What is computed
----------------
For groups ``A`` (``group1``/``idx1``) and ``B`` (``group2``/``idx2``), one draw is a pair ``(h_A, h_B)`` of expression
vectors over genes:

1. pick a cell ``a`` of ``A`` and a cell ``b`` of ``B`` uniformly at random, with replacement and independently;
2. draw ``z_a ~ q(z | x_a)`` and ``z_b ~ q(z | x_b)`` from the fitted encoder;
3. decode both: ``h = exp f(z, k)``, the expected count per unit library size (the model's normalised expression at
   ``library_size=1``; for the MLP decoder the library shares, scvi-tools' ``px_scale``). The batch ``k`` is the cell's
   own (``batch_correction=False``, scvi-tools' default), or one drawn uniformly from the training batches for the
   pair and used for both cells (``batch_correction=True``: the comparison averages over batches, as a cell of either
   group would look in each batch).

A pair's log fold change of gene ``g`` is ``LFC_g = log2(h_Ag + c) - log2(h_Bg + c)`` with a small pseudocount ``c``.
Its distribution mixes each cell's posterior uncertainty with the differences between cells within each group:
``proba_de`` asks how often a random cell of ``A`` and one of ``B`` differ by more than ``delta``, as in scvi-tools.
From ``S = n_samples_overall`` independent pairs:

=============================== ==================================================================
column                          definition (estimate from the ``S`` pairs)
=============================== ==================================================================
``proba_de``                    ``max(P(LFC >= delta), P(LFC < -delta))`` (``test_mode="three"``,
                                scvi's default) or ``P(|LFC| beyond delta)`` (``"two"``)
``proba_not_de``                ``1 - proba_de``
``bayes_factor``                ``log(proba_de + 1e-8) - log(1 - proba_de + 1e-8)`` (natural log)
``scale1``, ``scale2``          mean of ``h_A``, of ``h_B``
``pseudocounts``                ``c`` (given, or scvi's estimate from genes not expressed in a group)
``delta``                       the LFC threshold
``lfc_mean``, ``lfc_median``,   mean, median, standard deviation, minimum and maximum of ``LFC``
``lfc_std``, ``lfc_min``,       computed with the pseudocount ``c / 1000`` (as scvi-tools, so that
``lfc_max``                     the summaries are close to the plain log ratio)
``raw_mean1/2``                 mean observed count in each group (``all_stats``)
``non_zeros_proportion1/2``     share of the group's cells with a non-zero count
``raw_normalized_mean1/2``      mean count per 10,000 counts of the cell's library
``is_de_fdr_<t>``               the call: the largest set of genes with the highest ``proba_de``
                                whose mean ``1 - proba_de`` (posterior expected FDR) is at most
                                ``t = fdr_target``
``comparison``, ``group1``,     ``"<g1> vs <g2>"`` and the groups (``"Rest"`` for the other cells),
``group2``                      when groups come from ``groupby``
=============================== ==================================================================

Monte Carlo error (countvae only; exact to first order, the pairs being independent): ``proba_de_mc_se`` is the
binomial standard error ``sqrt(p (1 - p) / S)`` at ``p = (k + 1) / (S + 2)`` (nonzero when all pairs agree);
``bayes_factor_mc_se`` follows by the delta method; ``scale1_mc_se``, ``scale2_mc_se`` and ``lfc_mean_mc_se`` are
``sd / sqrt(S)``; ``lfc_median_mc_se`` is half the distance between the ``1/2 +- 1/(2 sqrt(S))`` quantiles
(distribution free); ``lfc_std_mc_se`` is ``sqrt((m4 - s^4) / S) / (2 s)`` (``m4`` the fourth central moment).
``lfc_min``/``lfc_max`` have none (extremes drift with ``S``). For the calls, ``n_bootstrap`` resamples of the pairs
(with replacement) give ``is_de_fdr_<t>_mc_frequency``, the share of resamples calling the gene, and ``mc_call_jaccard``
(one value per comparison), the mean Jaccard index between the call sets of two resamples, which predicts the agreement
of two runs with different seeds (two resamples differ by twice the sampling variance, as two runs do; measured against
real re-runs in ``benchmarks/bench_de.py``). A :class:`~countvae.errors.MonteCarloWarning` says when it is below 0.95.

Departures from scvi-tools: pairs are drawn independently (scvi decodes every cell ``S / n + 1`` times and resamples
those draws, which makes them dependent); under ``batch_correction=True`` each pair's batch is drawn at random rather
than allocated equally; ``mode="vanilla"``, ``batchid1/2``, outlier filtering and importance weights are not offered
(each refused by name, with what to do instead; ``mode="change"`` is accepted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae._checks import check_bool, check_int, check_number
from countvae._settings import refuses_keywords
from countvae._warnings import warn_at_caller
from countvae.data.loader import CountSource
from countvae.errors import InvalidArgumentError, MonteCarloWarning
from countvae.model.de_statistics import (
    change_statistics,
    check_test_settings,
    estimate_pseudocount,
    raw_count_properties,
)
from countvae.model.training import dtype_device, to_tensors
from countvae.module.vae import CountVAEModule, sample_latent

if TYPE_CHECKING:
    from countvae.model.countvae import CountVAE

#: Default number of pairs per comparison. On the benchmark data (benchmarks/bench_de.py, section de-known-truth of
#: benchmarks/RESULTS.md) two runs that differ only in the sampling seed then agree on the call set with Jaccard >= 0.95
#: for every pair of seeds: simulated counts with planted genes and two cell-type comparisons on Kang PBMCs. With
#: scvi-tools' 5,000 the harder Kang comparison (CD4 T against NK cells, ~330 calls) fell to 0.93.
DEFAULT_N_SAMPLES = 10_000
#: Predicted call-set agreement between two sampling seeds below which a warning suggests more pairs.
STABLE_CALL_JACCARD = 0.95
#: Resamples of the pairs for the Monte Carlo variability of the calls.
DEFAULT_N_BOOTSTRAP = 100
#: Pairs decoded per forward pass.
_DRAWS_PER_PASS = 1024

CellSelection = np.ndarray | Sequence[int] | Sequence[bool]


@torch.no_grad()
def sample_expression(
    module: CountVAEModule,
    source: CountSource,
    cells: np.ndarray,
    decode_batch: np.ndarray | None,
    rng: np.random.Generator,
    generator: torch.Generator,
    n_samples: int,
) -> np.ndarray:
    """Decoded expression of ``n_samples`` cells drawn from ``cells``, one posterior draw each.

    Parameters
    ----------
    module
        The fitted module (put in eval mode).
    source
        Counts and batch codes of the cells.
    cells
        Positions of the group's cells in ``source``.
    decode_batch
        Batch code to decode each draw in, (n_samples,); ``None``: each cell's own batch.
    rng, generator
        Draw the cells (numpy) and the latent noise (torch).
    n_samples
        Number of draws.

    Returns
    -------
    numpy.ndarray
        (n_samples, genes) float32: the expected count per unit library size, ``exp`` of the decoder's log rate.

    """
    module.eval()
    dtype, device = dtype_device(module)
    drawn = rng.choice(cells, size=n_samples, replace=True)
    unique, inverse = np.unique(drawn, return_inverse=True)
    minibatches = source.iterate(unique, _DRAWS_PER_PASS, drop_last_singleton=False)
    encoded = [module.encode(*to_tensors(mb, dtype, device)) for mb in minibatches]
    index = torch.as_tensor(inverse, device=device)
    loc = torch.cat([loc for loc, _ in encoded])[index]
    scale = torch.cat([scale for _, scale in encoded])[index]
    eps = torch.randn(loc.shape, generator=generator, dtype=dtype).to(device)
    z = sample_latent(loc, scale, eps)
    batch = source.batch[drawn] if decode_batch is None else np.asarray(decode_batch, dtype=np.int64)
    batch_t = torch.as_tensor(batch, dtype=torch.long, device=device)
    out = np.empty((n_samples, source.n_vars), dtype=np.float32)
    for start in range(0, n_samples, _DRAWS_PER_PASS):
        stop = min(start + _DRAWS_PER_PASS, n_samples)
        log_rate = module.decode(z[start:stop], batch_t[start:stop]).log_rate
        out[start:stop] = torch.exp(log_rate).cpu().numpy()
    return out


def _positions(selection: CellSelection, obs_names: pd.Index, name: str) -> np.ndarray:
    """Sorted positions from a boolean mask or integer positions, each cell given once."""
    n_obs = len(obs_names)
    if isinstance(selection, pd.Series) and selection.dtype == bool and not selection.index.equals(obs_names):
        raise InvalidArgumentError(
            f"{name} is a boolean pandas Series whose index is not adata.obs_names in order, and a mask is read by "
            f"position; pass {name}.reindex(adata.obs_names).to_numpy() (or .to_numpy() if it is in cell order)."
        )
    arr = np.asarray(selection)
    if arr.dtype == bool:
        if arr.shape != (n_obs,):
            raise InvalidArgumentError(
                f"{name} as a boolean mask must have one entry per cell ({n_obs}), got shape {arr.shape}."
            )
        return np.flatnonzero(arr)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidArgumentError(f"{name} must be a boolean mask or integer positions of cells.")
    if arr.size and (arr.min() < 0 or arr.max() >= n_obs):
        raise InvalidArgumentError(f"{name} has positions outside [0, {n_obs}).")
    unique = np.unique(arr.astype(np.int64))
    if len(unique) != arr.size:
        raise InvalidArgumentError(
            f"{name} gives {arr.size - len(unique)} cell position(s) more than once; give each cell once, e.g. "
            f"np.unique({name})."
        )
    return unique


def _comparisons(
    adata: ad.AnnData,
    groupby: str | None,
    group1: str | Sequence[str] | None,
    group2: str | None,
    idx1: CellSelection | None,
    idx2: CellSelection | None,
) -> list[tuple[str | None, str | None, np.ndarray, np.ndarray]]:
    """(group1 name, group2 name, cells of group 1, cells of group 2) for each comparison."""
    n_obs = adata.n_obs
    if idx1 is not None:
        if groupby is not None or group1 is not None or group2 is not None:
            raise InvalidArgumentError("Give the groups either as idx1/idx2 or as groupby/group1/group2, not both.")
        cells1 = _positions(idx1, adata.obs_names, "idx1")
        cells2 = np.setdiff1d(np.arange(n_obs), cells1) if idx2 is None else _positions(idx2, adata.obs_names, "idx2")
        return [(None, None, cells1, cells2)]
    if idx2 is not None:
        raise InvalidArgumentError("idx2 needs idx1.")
    if groupby is None:
        raise InvalidArgumentError("Name the obs column of the groups with groupby=..., or pass idx1 (and idx2).")
    if groupby not in adata.obs.columns:
        raise InvalidArgumentError(
            f"groupby {groupby!r} is not a column of adata.obs; pass one of {list(adata.obs.columns)}."
        )
    column = adata.obs[groupby]
    if int(column.isna().sum()):
        raise InvalidArgumentError(f"adata.obs[{groupby!r}] has missing values; give those cells a group or drop them.")
    labels = column.astype(str).to_numpy()
    categories = (
        [str(c) for c in column.cat.categories if str(c) in set(labels)]
        if isinstance(column.dtype, pd.CategoricalDtype)
        else sorted(set(labels))
    )
    if group1 is None:
        if len(categories) < 2:
            raise InvalidArgumentError(f"adata.obs[{groupby!r}] has a single group; DE needs two.")
        firsts = [c for c in categories if group2 is None or c != str(group2)]  # as scvi-tools: each other group
    else:
        firsts = [str(group1)] if np.ndim(group1) == 0 else [str(g) for g in group1]  # one group, or a list
        if not firsts:
            raise InvalidArgumentError("group1 is an empty list; name a group, a list of groups, or leave it None.")
        repeated = sorted({g for g in firsts if firsts.count(g) > 1})
        if repeated:  # each repeat was compared again, with its own random draws, under the same label
            raise InvalidArgumentError(f"group1 names {repeated} more than once; name each group once.")
    for g in [*firsts, *([] if group2 is None else [group2])]:
        if str(g) not in categories:
            raise InvalidArgumentError(f"Group {g!r} has no cells in adata.obs[{groupby!r}]; groups: {categories}.")
    out = []
    for g1 in firsts:
        if group2 is not None and str(g1) == str(group2):
            raise InvalidArgumentError(f"group1 and group2 are both {g1!r}; compare two different groups.")
        cells1 = np.flatnonzero(labels == str(g1))
        cells2 = np.flatnonzero(labels != str(g1)) if group2 is None else np.flatnonzero(labels == str(group2))
        out.append((str(g1), "Rest" if group2 is None else str(group2), cells1, cells2))
    return out


def _check_groups(cells1: np.ndarray, cells2: np.ndarray) -> None:
    """Refuse an empty group, or cells in both groups."""
    if len(cells1) == 0 or len(cells2) == 0:
        raise InvalidArgumentError(f"Both groups need cells; got {len(cells1)} and {len(cells2)}.")
    shared = np.intersect1d(cells1, cells2)
    if len(shared):
        raise InvalidArgumentError(
            f"{len(shared)} cells are in both groups (e.g. position {shared[0]}); the groups must be disjoint."
        )


def _library_sizes(source: CountSource, cells: np.ndarray) -> tuple[object, np.ndarray]:
    """The counts of ``cells`` (sorted positions) as stored, and each cell's total count."""
    counts = source.read_rows(cells)
    return counts, np.asarray(counts.sum(axis=1, dtype=np.float64)).ravel()  # float16 totals overflow at 65,504


def _check_mode(mode: object) -> None:
    """Accept ``"change"``, the test implemented; refuse ``"vanilla"`` (and anything else), naming its nearest kin."""
    if not (isinstance(mode, str) and mode == "change"):
        raise InvalidArgumentError(
            f"mode must be 'change' (scvi-tools' change-based test, the one countvae implements), got {mode!r}. "
            "scvi-tools' mode='vanilla' (the share of draws where group 1's expression exceeds group 2's, without an "
            "LFC threshold) is not offered; for its nearest equivalent pass delta=0 and test_mode='three': proba_de is "
            "then max(P(h1 >= h2), P(h1 < h2)), bayes_factor the size of vanilla's and lfc_median's sign its direction."
        )


_IMPORTANCE = "importance weights are not offered; leave it out"


@refuses_keywords(
    {
        "batchid1": "not offered; pass batch_correction=True to decode both cells of a pair in one batch drawn from "
        "all the training batches",
        "batchid2": "not offered, as batchid1",
        "weights": f"draws are weighted uniformly, as scvi-tools' default weights='uniform'; {_IMPORTANCE}",
        "importance_weighting_kwargs": _IMPORTANCE,
        "filter_outlier_cells": "not offered (scvi-tools' default is False); leave it out, or leave the cells out "
        "of idx1/idx2",
        "silent": "it shows no progress bar; leave it out",
        "batch_size": f"it decodes {_DRAWS_PER_PASS} pairs per pass, and its memory is set by n_samples_overall; "
        "leave it out",
    },
    where="CountVAE.differential_expression",
)
def differential_expression(
    model: CountVAE,
    adata: ad.AnnData | None = None,
    groupby: str | None = None,
    group1: str | Sequence[str] | None = None,
    group2: str | None = None,
    idx1: CellSelection | None = None,
    idx2: CellSelection | None = None,
    *,
    mode: Literal["change"] = "change",
    delta: float = 0.25,
    fdr_target: float = 0.05,
    batch_correction: bool = False,
    n_samples_overall: int = DEFAULT_N_SAMPLES,
    test_mode: Literal["two", "three"] = "three",
    pseudocounts: float | None = None,
    all_stats: bool = True,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    seed: int = 0,
) -> pd.DataFrame:
    """Differential expression between groups of cells; :mod:`countvae.model.differential` has the definitions.

    Parameters
    ----------
    model
        A trained :class:`~countvae.CountVAE` (``self`` of :meth:`countvae.CountVAE.differential_expression`).
    adata
        Cells to compare (default: the model's training AnnData); must have the training genes.
    groupby
        Column of ``adata.obs`` holding the groups.
    group1
        A group, or a list of groups compared in turn; ``None``: each group against the rest (one-vs-all), or each
        other group against ``group2`` when it is given (as scvi-tools).
    group2
        The group to compare against; ``None``: all other cells (``"Rest"``).
    idx1, idx2
        Alternatively each group's cells, as boolean masks (a pandas Series indexed by ``adata.obs_names`` in order) or
        positions, each cell once (``idx2=None``: all other cells); no ``comparison``/``group1``/``group2`` columns.
    mode
        ``"change"`` (scvi-tools' ``mode="change"``), the only test offered; ported calls name it, scvi-tools 1.4
        defaulting to ``"vanilla"``. scvi-tools' other keywords (``batchid1``, ``weights``, ``silent``...) are
        refused by name, each with what to do instead (docs/concepts/scvi-tools.md).
    delta
        LFC threshold (log2 units) of the test.
    fdr_target
        Target posterior expected FDR of the ``is_de_fdr_<fdr_target>`` calls.
    batch_correction
        Decode both cells of each pair in one batch drawn uniformly from the training batches (compare the groups as if
        in the same batch), not in each cell's own.
    n_samples_overall
        Pairs of draws per comparison, ``S`` (see :data:`countvae.model.differential.DEFAULT_N_SAMPLES`). Peak memory is
        about six float32 arrays of ``S`` x genes (0.3 GB for 5,000 pairs and 2,500 genes).
    test_mode
        ``"three"`` (up and down separately, scvi's default) or ``"two"``.
    pseudocounts
        The pseudocount ``c`` of the test's LFC; ``None``: scvi-tools' estimate.
    all_stats
        Add the observed-count columns ``raw_mean``, ``non_zeros_proportion`` and ``raw_normalized_mean``.
    n_bootstrap
        Resamples of the pairs for ``is_de_fdr_<t>_mc_frequency`` and ``mc_call_jaccard``.
    seed
        Seed of the cells, latent draws and resamples: the same seed gives the same numbers.

    Returns
    -------
    pandas.DataFrame
        One row per gene and comparison (index: gene names), by decreasing ``proba_de`` within each comparison.

    """
    model.require_trained()
    _check_mode(mode)
    check_test_settings(delta, fdr_target, test_mode, n_bootstrap)  # before any sampling
    batch_correction = check_bool("batch_correction", batch_correction)
    all_stats = check_bool("all_stats", all_stats)
    check_int("n_samples_overall", n_samples_overall, 2)
    if pseudocounts is not None:
        check_number("pseudocounts", pseudocounts, 0.0, low_open=True)
    check_int("seed", seed, 0)
    cells = model.cells(adata)
    comparisons = _comparisons(cells.adata, groupby, group1, group2, idx1, idx2)
    for _, _, cells1, cells2 in comparisons:
        _check_groups(cells1, cells2)
    frames = _comparison_frames(
        model,
        cells.source,
        comparisons,
        delta=delta,
        fdr_target=fdr_target,
        batch_correction=batch_correction,
        n_samples_overall=n_samples_overall,
        test_mode=test_mode,
        pseudocounts=pseudocounts,
        all_stats=all_stats,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )
    _warn_unstable_calls(frames, n_samples_overall)
    return pd.concat(frames, axis=0) if len(frames) > 1 else frames[0]


def _comparison_frames(
    model: CountVAE,
    source: CountSource,
    comparisons: list[tuple[str | None, str | None, np.ndarray, np.ndarray]],
    *,
    delta: float,
    fdr_target: float,
    batch_correction: bool,
    n_samples_overall: int,
    test_mode: Literal["two", "three"],
    pseudocounts: float | None,
    all_stats: bool,
    n_bootstrap: int,
    seed: int,
) -> list[pd.DataFrame]:
    """The result frame of each comparison, each from its own random stream."""
    n_batch_categories = max(model.registry.n_batches, 1)
    call_column = f"is_de_fdr_{fdr_target}"
    frames = []
    for number, (name1, name2, cells1, cells2) in enumerate(comparisons):
        # one stream per comparison: adding a comparison does not change the others
        seed_seq = np.random.SeedSequence([int(seed), number])
        rng = np.random.default_rng(seed_seq)
        generator = torch.Generator().manual_seed(int(seed_seq.generate_state(1)[0]))
        decode_batch = rng.integers(0, n_batch_categories, n_samples_overall) if batch_correction else None
        scales1 = sample_expression(model.module, source, cells1, decode_batch, rng, generator, n_samples_overall)
        scales2 = sample_expression(model.module, source, cells2, decode_batch, rng, generator, n_samples_overall)
        counts1, library1 = _library_sizes(source, cells1)
        counts2, library2 = _library_sizes(source, cells2)
        raw = raw_count_properties(counts1, counts2, library1, library2)
        c = pseudocounts
        if c is None:
            c = estimate_pseudocount(scales1, scales2, raw["raw_mean1"], raw["raw_mean2"])
        stats = change_statistics(
            scales1,
            scales2,
            delta=delta,
            pseudocount=float(c),
            fdr_target=fdr_target,
            test_mode=test_mode,
            n_bootstrap=n_bootstrap,
            seed=int(rng.integers(2**31)),
        )
        del scales1, scales2
        frame = _frame(stats, raw if all_stats else {}, model.var_names, call_column, n_samples_overall)
        if name1 is not None:
            frame["comparison"] = f"{name1} vs {name2}"
            frame["group1"] = name1
            frame["group2"] = name2
        frames.append(frame)
    return frames


def _warn_unstable_calls(frames: list[pd.DataFrame], n_samples_overall: int) -> None:
    """Warn when another sampling seed is predicted to change the call set of some comparison."""
    unstable = [
        (frame["comparison"].iloc[0] if "comparison" in frame else "idx1 vs idx2", frame["mc_call_jaccard"].iloc[0])
        for frame in frames
        if frame["mc_call_jaccard"].iloc[0] < STABLE_CALL_JACCARD
    ]
    if unstable:
        listed = ", ".join(f"{name} ({value:.2f})" for name, value in unstable)
        warn_at_caller(
            f"With n_samples_overall={n_samples_overall}, another sampling seed would change the call set: predicted "
            f"Jaccard agreement below {STABLE_CALL_JACCARD} for {listed} (column mc_call_jaccard). Raise "
            "n_samples_overall (the Monte Carlo error falls as 1/sqrt(n)) for calls that survive a re-run.",
            MonteCarloWarning,
        )


def _frame(
    stats: dict, raw: dict[str, np.ndarray], var_names: pd.Index, call_column: str, n_samples: int
) -> pd.DataFrame:
    """The result columns in scvi-tools' order, then the Monte Carlo columns; sorted by ``proba_de``."""
    scvi_columns = [
        "proba_de",
        "proba_not_de",
        "bayes_factor",
        "scale1",
        "scale2",
        "pseudocounts",
        "delta",
        "lfc_mean",
        "lfc_median",
        "lfc_std",
        "lfc_min",
        "lfc_max",
    ]
    columns = {key: stats[key] for key in scvi_columns}
    columns.update(raw)
    columns[call_column] = stats["is_de"]
    for key in ("proba_de", "bayes_factor", "scale1", "scale2", "lfc_mean", "lfc_median", "lfc_std"):
        columns[f"{key}_mc_se"] = stats[f"{key}_mc_se"]
    columns[f"{call_column}_mc_frequency"] = stats["is_de_mc_frequency"]
    columns["mc_call_jaccard"] = stats["mc_call_jaccard"]
    columns["n_samples"] = n_samples
    frame = pd.DataFrame(columns, index=pd.Index(var_names, name=None))
    return frame.iloc[np.argsort(-frame["proba_de"].to_numpy(), kind="stable")]
