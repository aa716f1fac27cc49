"""The report's downstream section: which part of the seed-to-seed variation of DE, clusters and UMAPs is the model's.

This module runs the analyses of :mod:`countvae.diagnostics.analyses.downstream` on the fits and the report's held-out
cells and returns a :class:`DownstreamSection`: the tables and a JSON-ready record (laid out by
:mod:`.sections.downstream`). The DE is asked of the fits by :func:`collect_de` (in the report's collect step);
everything else is a function of the collected latent means.

What is compared (each with a baseline that holds the fit fixed and varies only the downstream seed):

* **DE calls** between two groups of cells (:meth:`countvae.CountVAE.differential_expression`): fit ``i`` (in the order
  given) is sampled with seed ``seed + i``; the baseline recomputes (some of) the fits with seed ``seed + n_fits + i``.
  Agreement: Jaccard of the call sets, Spearman correlation of ``lfc_mean``.
* **Leiden clusters** as scanpy makes them: ``sc.pp.neighbors(use_rep=...)`` on each fit's latent means, then
  ``sc.tl.leiden`` with seed ``seed`` between fits, ``seed + 1`` for the baseline (the labels are scanpy's own for these
  settings). Agreement: ARI, NMI.
* **UMAP neighbourhoods**: ``sc.tl.umap`` of the same graph with seed ``seed``
  between fits, ``seed + 1`` for the baseline. Agreement: k-NN overlap in 2-D.
* **latent k-NN**: the k-NN overlap of the latent means themselves, a deterministic function of the fit (no downstream
  randomness: its baseline disagreement is 0), shown for reference.

The DE runs on the report's held-out cells, as the rest of the report: none of the fits was trained on them, and all see
the same cells. Leiden and UMAP need the extra ``countvae[downstream]`` (scanpy, igraph, leidenalg, umap-learn); without
it those rows say which extra to install and the rest of the section (and of the report) is unaffected.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool, check_int, check_number
from countvae._formatting import json_ready
from countvae.diagnostics.analyses.downstream import (
    BETWEEN,
    LEIDEN_FLAVORS,
    WITHIN,
    chance_jaccard,
    cluster_agreement,
    de_agreement,
    neighbourhood_agreement,
    umap_agreement,
)
from countvae.diagnostics.analyses.subspace import subsample
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel
from countvae.diagnostics.reporting.report_format import table_columns
from countvae.errors import InvalidArgumentError, MissingDependencyError, MonteCarloWarning
from countvae.model.differential import DEFAULT_N_SAMPLES, STABLE_CALL_JACCARD

#: Output -> (label in the report, what the baseline re-runs on one fit).
OUTPUTS = {
    "de": ("DE calls", "the DE sampling"),
    "clusters": ("Leiden clusters", "Leiden with another seed"),
    "umap": ("UMAP neighbourhoods", "UMAP with another seed"),
    "latent_knn": ("latent k-NN (reference)", "nothing (the latent means are deterministic)"),
}
#: Between-fit disagreement (1 - mean agreement) up to which the fits are said to agree closely.
CLOSE_AGREEMENT = 0.05
#: Model shares from which the wording says "mostly the model's" / up to which "mostly downstream".
#: These bins only choose words for the measured numbers; they are not a test.
MOSTLY_MODEL, MOSTLY_DOWNSTREAM = 2 / 3, 1 / 3
#: A summary over fewer pairs than these is flagged as a rough estimate.
FEW_BETWEEN_PAIRS, FEW_WITHIN_PAIRS = 3, 2
#: Groups named in a message about DE groups (a numeric column given as groups has hundreds).
MAX_LISTED_GROUPS = 10


# ----- what is asked ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownstreamSettings:
    """Sizes and seeds of the downstream section (recorded in the report).

    Attributes
    ----------
    n_de_samples
        Pairs of draws per DE (``n_samples_overall``).
    n_baseline_fits
        Fits (the first ones) also sampled with a second DE seed for the Monte Carlo baseline; ``None``: all.
    delta, fdr_target, batch_correction
        As in :meth:`countvae.CountVAE.differential_expression`.
    k
        Neighbours per cell of the k-NN graphs (``n_neighbors`` of ``sc.pp.neighbors``; overlaps).
    leiden_resolution
        Leiden's resolution parameter.
    leiden_flavor
        ``"igraph"`` (``sc.tl.leiden(..., flavor="igraph", n_iterations=2, directed=False)``,
        scanpy's recommended settings) or ``"leidenalg"`` (``sc.tl.leiden``'s defaults).
    max_cells
        Held-out cells (a random subset) clustered and embedded at most.
    clusters, umap
        Compute the Leiden and UMAP comparisons.
    seed
        Base seed of the DE sampling, Leiden, UMAP and the cell subset.

    """

    n_de_samples: int = DEFAULT_N_SAMPLES
    n_baseline_fits: int | None = None
    delta: float = 0.25
    fdr_target: float = 0.05
    batch_correction: bool = False
    k: int = 15
    leiden_resolution: float = 1.0
    leiden_flavor: str = "igraph"
    max_cells: int = 3_000
    clusters: bool = True
    umap: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        # checked when made, before any fit; the checked values are kept (numpy scalars become Python ones)
        checked = {
            "n_de_samples": check_int("n_de_samples", self.n_de_samples, 2),
            "delta": check_number("delta", self.delta, 0.0),
            "fdr_target": check_number("fdr_target", self.fdr_target, 0.0, 1.0, low_open=True, high_open=True),
            "k": check_int("k", self.k, 2),
            "leiden_resolution": check_number("leiden_resolution", self.leiden_resolution, 0.0, low_open=True),
            "max_cells": check_int("max_cells", self.max_cells, 3),
            "seed": check_int("DownstreamSettings seed", self.seed, 0),
        }
        if self.n_baseline_fits is not None:
            checked["n_baseline_fits"] = check_int("n_baseline_fits", self.n_baseline_fits, 1)
        for name in ("batch_correction", "clusters", "umap"):
            checked[name] = check_bool(name, getattr(self, name))
        if self.leiden_flavor not in LEIDEN_FLAVORS:
            raise InvalidArgumentError(
                f"leiden_flavor must be one of {sorted(LEIDEN_FLAVORS)}, got {self.leiden_flavor!r}."
            )
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # a frozen dataclass


@dataclass(frozen=True)
class DownstreamRequest:
    """Ask the report for the downstream section.

    Attributes
    ----------
    groupby
        ``obs`` column of the groups to compare by DE; ``None``: clusters and UMAP only.
    group1, group2
        The groups compared (``group2=None``: ``group1`` against all other cells). Without ``group1`` the column must
        have exactly two groups, compared in the order of its categories.
    settings
        Sizes and seeds.

    """

    groupby: str | None = None
    group1: str | None = None
    group2: str | None = None
    settings: DownstreamSettings = field(default_factory=DownstreamSettings)


def _listed(names: list[str]) -> str:
    """``names`` as a list, cut after :data:`MAX_LISTED_GROUPS` with their number (a message stays readable)."""
    if len(names) <= MAX_LISTED_GROUPS:
        return str(names)
    return f"{str(names[:MAX_LISTED_GROUPS])[:-1]}, ... ({len(names)} in all)]"


def de_groups(obs: pd.DataFrame, groupby: str, group1: str | None = None, group2: str | None = None) -> tuple[str, str]:
    """The two groups a DE request compares, checked against ``obs``: ``(group1, group2 or "Rest")``.

    Raises
    ------
    InvalidArgumentError
        For a column not in ``obs``, missing values, a single group, more than two groups without ``group1``, a group
        without cells, ``group2`` without ``group1``, or the same group twice.

    """
    if groupby not in obs.columns:
        raise InvalidArgumentError(
            f"DE groups: {groupby!r} is not an obs column; columns: {list(map(str, obs.columns))}."
        )
    column = obs[groupby]
    if int(column.isna().sum()):
        raise InvalidArgumentError(f"DE groups: obs[{groupby!r}] has missing values; give those cells a group.")
    present = set(column.astype(str))
    levels = (
        [str(c) for c in column.cat.categories if str(c) in present]
        if isinstance(column.dtype, pd.CategoricalDtype)
        else sorted(present)
    )
    if len(levels) < 2:
        raise InvalidArgumentError(
            f"DE groups: obs[{groupby!r}] has a single group ({levels[0] if levels else 'none'}); DE compares two."
        )
    if group1 is None:
        if group2 is not None:
            raise InvalidArgumentError("DE groups: group2 needs group1.")
        if len(levels) > MAX_LISTED_GROUPS and pd.api.types.is_numeric_dtype(column.dtype):
            raise InvalidArgumentError(
                f"DE groups: obs[{groupby!r}] holds numbers ({len(levels)} distinct values), not groups of cells; "
                f"give a column of cell groups (such as cell types). Values: {_listed(levels)}."
            )
        if len(levels) != 2:
            raise InvalidArgumentError(
                f"DE groups: obs[{groupby!r}] has {len(levels)} groups; name the two to compare (--de-groups G1 G2, "
                f"or G1 alone for G1 against all other cells). Groups: {_listed(levels)}."
            )
        return levels[0], levels[1]
    for g in (group1, group2):
        if g is not None and str(g) not in present:
            raise InvalidArgumentError(f"DE groups: {g!r} has no cells in obs[{groupby!r}]; groups: {_listed(levels)}.")
    if group2 is not None and str(group1) == str(group2):
        raise InvalidArgumentError(f"DE groups: both groups are {group1!r}; compare two different groups.")
    return str(group1), "Rest" if group2 is None else str(group2)


# ----- the result ----------------------------------------------------------------------------------------------------
@dataclass
class DownstreamSection:
    """The downstream section of a report.

    Attributes
    ----------
    summary
        One row per output and metric: ``output``, ``metric``, the columns of
        :func:`~countvae.diagnostics.analyses.downstream.model_share` (means,
        pair counts, disagreements, ``model_share``), ``chance_mean`` (DE Jaccard: the mean over pairs of fits of the
        agreement random call sets of the same sizes would reach) and ``reading`` (the sentence).
    pairs
        Long table of every compared pair: ``output``, ``metric``, ``kind`` (between fits / within fit), ``fit_a``,
        ``fit_b``, ``value`` and, for the DE Jaccard, ``chance``: the expected Jaccard of random call sets of the pair's
        sizes (:func:`~countvae.diagnostics.analyses.downstream.chance_jaccard`).
    de_per_fit
        Per fit: sampling seeds, number of calls, the DE's own predicted agreement of two sampling seeds
        (``mc_call_jaccard``) and, for the baseline fits, the calls with the second seed.
    de_calls
        Genes (the fits' order) x fits: whether each fit calls the gene DE with
        its own sampling seed; no columns without DE.
    status
        Output -> ``"computed"``, ``"not requested"`` or why not (e.g. which extra to install).
    statements
        The plain-language reading, one sentence per output.
    settings
        What was compared, on how many cells, with which seeds.
    timings
        Seconds per output.

    """

    summary: pd.DataFrame
    pairs: pd.DataFrame
    de_per_fit: pd.DataFrame
    status: dict[str, str]
    statements: list[str]
    settings: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    de_calls: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """The section's tables by name: ``summary``, ``pairs``, ``de_per_fit``."""
        return {"summary": self.summary, "pairs": self.pairs, "de_per_fit": self.de_per_fit}

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values (NaN becomes ``None``; ``table_columns``: each table's columns, dtypes)."""
        return json_ready(
            {
                "statements": self.statements,
                "status": self.status,
                **self.tables,
                "table_columns": table_columns(self.tables),
                "settings": self.settings,
                "timings_seconds": self.timings,
            }
        )


INTRO = (
    "Each output is compared between fits with different model seeds (between fits) and between two runs of the "
    "downstream step on one fit that differ only in its seed (within fit: the baseline). The model's share is the "
    "part of the between-fit disagreement (1 - agreement) that the within-fit baseline does not reach, "
    "(d_between - d_within) / d_between; it is a difference of means over few pairs, so read it with the pair counts."
)
CAPTION = (
    "Agreement of each compared pair (1 = identical): between fits with different seeds (filled) and within one fit, "
    "re-running only the downstream step with another seed (hollow). Points of both kinds at the same height: the "
    "downstream step alone explains the differences between fits."
)
SUMMARY_COLUMNS = [
    "output",
    "metric",
    "between_mean",
    "between_min",
    "n_between",
    "within_mean",
    "n_within",
    "chance_mean",
    "model_share",
    "reading",
]


# ----- wording --------------------------------------------------------------------------------------------------------
def reading(output: str, metric: str, row: Mapping[str, float]) -> str:
    """One calibrated sentence for a summary row: the numbers, the pair counts, and what they support.

    The wording bins (:data:`CLOSE_AGREEMENT`, :data:`MOSTLY_MODEL`, :data:`MOSTLY_DOWNSTREAM`) only choose words;
    the numbers and pair counts are always stated.
    """
    label, rerun = OUTPUTS[output]
    n_between, n_within = int(row["n_between"]), int(row["n_within"])
    numbers = (
        f"{label} ({metric}): fits agree {row['between_mean']:.2f} on average (lowest {row['between_min']:.2f}, "
        f"{n_between} pairs of fits)"
    )
    if n_within:
        numbers += f"; re-running {rerun} on one fit agrees {row['within_mean']:.2f} ({n_within} pairs)"
    share = row["model_share"]
    d_between = row["disagreement_between"]
    chance = row.get("chance_mean", np.nan)
    if chance is not None and np.isfinite(chance):
        if chance == 1.0:  # every pair's call sets are both empty or both every gene: they cannot differ
            return (
                f"{label} ({metric}): every fit calls no gene, or every fit calls every gene, with its own sampling "
                f"seed ({n_between} pairs of fits): the calls cannot differ, so there is nothing to compare."
            )
        numbers += f"; random call sets of the same sizes would agree {chance:.2f}"
    if not np.isfinite(share):
        meaning = "identical across fits: nothing varies."
    elif d_between <= CLOSE_AGREEMENT:
        meaning = "the fits agree closely, so there is little variation to attribute."
    elif not n_within:
        meaning = "this output has no downstream randomness, so all of its variation is the model's."
    else:
        percent = f"about {10 * round(share * 10):.0f}% of the disagreement between fits exceeds the baseline"
        if share >= MOSTLY_MODEL:
            meaning = f"{percent}: most of the variation is the model's (its seed), not {rerun}."
        elif share <= MOSTLY_DOWNSTREAM:
            meaning = (
                f"{percent}: re-running {rerun} on one fit already changes it nearly as much, "
                "so most of the variation is not the model's."
            )
        else:
            meaning = f"{percent}: the model's seed and {rerun} both contribute."
    few = n_between < FEW_BETWEEN_PAIRS or (0 < n_within < FEW_WITHIN_PAIRS)
    return f"{numbers}: {meaning}" + (" Few pairs: a rough estimate." if few else "")


# ----- computing it --------------------------------------------------------------------------------------------------
def fit_differential_expression(
    fit: FittedModel, adata: ad.AnnData, groupby: str, group1: str, group2: str, seed: int, s: DownstreamSettings
) -> pd.DataFrame:
    """One fit's DE between the groups, in the fits' gene order (CountVAE fits only)."""
    if not isinstance(fit, CountVAEFit):
        raise InvalidArgumentError(
            f"DE across seeds needs countvae fits (CountVAEFit); {fit.name!r} is {fit.kind!r}, whose DE has no "
            "sampling seed to hold fixed."
        )
    with warnings.catch_warnings():
        # the section states the DE's own Monte Carlo prediction (and measures it) instead of warning
        warnings.simplefilter("ignore", MonteCarloWarning)
        frame = fit.model.differential_expression(
            adata,
            groupby=groupby,
            group1=group1,
            group2=None if group2 == "Rest" else group2,
            delta=s.delta,
            fdr_target=s.fdr_target,
            batch_correction=s.batch_correction,
            n_samples_overall=s.n_de_samples,
            all_stats=False,
            seed=seed,
        )
    return frame.reindex(pd.Index(fit.var_names))


def _chance(
    pairs: pd.DataFrame, calls: Mapping[str, np.ndarray], resampled: Mapping[str, np.ndarray], n_genes: int
) -> np.ndarray:
    """Per pair, the Jaccard index random call sets of the two pair members' sizes reach by chance."""
    out = []
    for kind, a, b in zip(pairs["kind"], pairs["fit_a"], pairs["fit_b"], strict=True):
        other = calls[b] if kind == BETWEEN else resampled[a]
        out.append(chance_jaccard(int(calls[a].sum()), int(other.sum()), n_genes))
    return np.asarray(out)


def _long(pairs: pd.DataFrame, output: str, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per pair and metric; ``chance`` (DE Jaccard only) is the agreement of random call sets."""
    frame = pairs.melt(id_vars=["kind", "fit_a", "fit_b"], value_vars=list(metrics), var_name="metric")
    frame.insert(0, "output", output)
    chance = pairs["chance"].to_numpy() if "chance" in pairs else np.full(len(pairs), np.nan)
    frame["chance"] = np.where(frame["metric"] == "jaccard", np.tile(chance, len(metrics)), np.nan)
    return frame[["output", "metric", "kind", "fit_a", "fit_b", "value", "chance"]]


def _summary(summary: pd.DataFrame, output: str) -> pd.DataFrame:
    out = summary.copy()
    out.insert(0, "output", output)
    if "chance_mean" not in out:
        out["chance_mean"] = np.nan
    out["reading"] = [reading(output, r["metric"], r) for r in out.to_dict("records")]
    return out


@dataclass
class DECalls:
    """What the fits' DE between two groups gave (asked of each fit once, by the report's collect step).

    Attributes
    ----------
    groupby, group1, group2
        The compared groups (``group2`` is ``"Rest"`` for all other cells).
    frames
        Fit name -> its DE with its own sampling seed (``seed + i``).
    baseline_frames
        Fit name -> its DE with the baseline seed (``seed + n_fits + i``), for the baseline fits.
    seeds, baseline_seeds
        The sampling seeds by fit name.
    var_names
        The fits' genes.
    seconds
        Time the DE took.

    """

    groupby: str
    group1: str
    group2: str
    frames: dict[str, pd.DataFrame]
    baseline_frames: dict[str, pd.DataFrame]
    seeds: dict[str, int]
    baseline_seeds: dict[str, int]
    var_names: pd.Index
    seconds: float = 0.0


def collect_de(fits: Sequence[FittedModel], adata: ad.AnnData, request: DownstreamRequest) -> DECalls | None:
    """Each fit's DE between the request's groups on ``adata`` (and again with a second seed for the baseline).

    ``None`` when the request asks for no DE (``groupby`` is ``None``).

    Raises
    ------
    InvalidArgumentError
        For bad DE groups (:func:`de_groups`), or DE asked of fits that are not countvae fits.

    """
    if request.groupby is None:
        return None
    s, started = request.settings, time.perf_counter()
    try:
        group1, group2 = de_groups(adata.obs, request.groupby, request.group1, request.group2)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc} (DE runs on the report's {adata.n_obs} held-out cells.)") from None
    n_baseline = len(fits) if s.n_baseline_fits is None else min(s.n_baseline_fits, len(fits))
    seeds = {fit.name: s.seed + i for i, fit in enumerate(fits)}
    again_seeds = {fit.name: s.seed + len(fits) + i for i, fit in enumerate(fits[:n_baseline])}
    frames, again = {}, {}
    for fit in fits:
        frames[fit.name] = fit_differential_expression(fit, adata, request.groupby, group1, group2, seeds[fit.name], s)
        if fit.name in again_seeds:
            seed = again_seeds[fit.name]
            again[fit.name] = fit_differential_expression(fit, adata, request.groupby, group1, group2, seed, s)
    var_names, seconds = pd.Index(fits[0].var_names), time.perf_counter() - started
    return DECalls(request.groupby, group1, group2, frames, again, seeds, again_seeds, var_names, seconds)


def _de_part(de: DECalls, s: DownstreamSettings) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The DE rows of the section: long pairs, summary, per-fit table and the call matrix."""
    call_column = f"is_de_fdr_{s.fdr_target}"
    calls = {name: f[call_column].to_numpy(bool) for name, f in de.frames.items()}
    lfc = {name: f["lfc_mean"].to_numpy(float) for name, f in de.frames.items()}
    calls2 = {name: f[call_column].to_numpy(bool) for name, f in de.baseline_frames.items()}
    lfc2 = {name: f["lfc_mean"].to_numpy(float) for name, f in de.baseline_frames.items()}
    rows = [
        {
            "fit": name,
            "sampling_seed": de.seeds[name],
            "n_calls": int(calls[name].sum()),
            "predicted_resampling_jaccard": float(frame["mc_call_jaccard"].iloc[0]),
            "baseline_sampling_seed": de.baseline_seeds.get(name),
            "n_calls_baseline": int(calls2[name].sum()) if name in calls2 else None,
        }
        for name, frame in de.frames.items()
    ]
    pairs, summary = de_agreement(calls, lfc, calls2, lfc2)
    pairs["chance"] = _chance(pairs, calls, calls2, len(de.var_names))
    summary["chance_mean"] = np.where(
        summary["metric"] == "jaccard", pairs.loc[pairs["kind"] == BETWEEN, "chance"].mean(), np.nan
    )
    de_calls = pd.DataFrame(calls, index=de.var_names.astype(str))
    return _long(pairs, "de", ["jaccard", "spearman"]), _summary(summary, "de"), pd.DataFrame(rows), de_calls


def downstream_result(
    de: DECalls | None, latents: Mapping[str, np.ndarray], n_cells: int, s: DownstreamSettings
) -> DownstreamSection:
    """The section from the collected DE calls and the fits' latent means of the ``n_cells`` held-out cells."""
    if len(latents) < 2:
        raise InvalidArgumentError(f"The downstream section compares fits; got {len(latents)}.")
    status = dict.fromkeys(OUTPUTS, "not requested")
    long_parts, summaries = [], []
    timings: dict[str, float] = {}
    settings: dict[str, Any] = {"cells": int(n_cells), **json_ready(vars(s))}
    de_per_fit = de_calls = pd.DataFrame()
    if de is not None:
        started = time.perf_counter()
        pairs_long, summary, de_per_fit, de_calls = _de_part(de, s)
        long_parts.append(pairs_long)
        summaries.append(summary)
        status["de"] = "computed"
        settings.update(groupby=de.groupby, group1=de.group1, group2=de.group2, n_genes=len(de.var_names))
        timings["de"] = de.seconds + time.perf_counter() - started

    cells = subsample(n_cells, s.max_cells, s.seed)
    sub = {name: np.asarray(z, dtype=np.float64)[cells] for name, z in latents.items()}
    k = min(s.k, len(cells) - 1)
    settings.update(cells_clustered_and_embedded=len(cells), k_used=k)
    for output, wanted, compute, metrics in (
        ("latent_knn", True, lambda: neighbourhood_agreement(sub, None, k), ["knn_overlap"]),
        (
            "clusters",
            s.clusters,
            lambda: cluster_agreement(sub, k, s.leiden_resolution, (s.seed, s.seed + 1), s.leiden_flavor),
            ["ari", "nmi"],
        ),
        ("umap", s.umap, lambda: umap_agreement(sub, k, (s.seed, s.seed + 1), k), ["knn_overlap"]),
    ):
        if not wanted:
            continue
        started = time.perf_counter()
        try:
            pairs, summary = compute()
        except MissingDependencyError as exc:
            status[output] = f"not computed: {exc}"
            continue
        long_parts.append(_long(pairs, output, metrics))
        summaries.append(_summary(summary, output))
        status[output] = "computed"
        timings[output] = time.perf_counter() - started

    summary_frame = pd.concat(summaries, ignore_index=True)
    order = {name: i for i, name in enumerate(OUTPUTS)}
    summary_frame = summary_frame.sort_values("output", key=lambda c: c.map(order), kind="stable", ignore_index=True)
    return DownstreamSection(
        summary=summary_frame,
        pairs=pd.concat(long_parts, ignore_index=True),
        de_per_fit=de_per_fit,
        status=status,
        statements=_statements(summary_frame, de_per_fit, status, s),
        settings=settings,
        timings=timings,
        de_calls=de_calls,
    )


def _statements(
    summary: pd.DataFrame, de_per_fit: pd.DataFrame, status: Mapping[str, str], s: DownstreamSettings
) -> list[str]:
    """The section's reading: one sentence per summary row, then the DE sampling note and what was not computed."""
    statements = list(summary["reading"])
    if len(de_per_fit):
        noisy = de_per_fit.loc[de_per_fit["predicted_resampling_jaccard"] < STABLE_CALL_JACCARD, "fit"].tolist()
        if noisy:
            statements.append(
                f"DE sampling: with {s.n_de_samples} pairs of draws, the DE's own Monte Carlo estimate predicts a "
                f"call-set Jaccard below {STABLE_CALL_JACCARD} between two sampling seeds for {', '.join(noisy)} "
                "(column predicted_resampling_jaccard); more draws (n_de_samples) would narrow the baseline."
            )
    statements += [f"{OUTPUTS[o][0]}: {m}" for o, m in status.items() if m.startswith("not computed")]
    if status["de"] == "not requested":
        statements.append(
            "DE calls: not requested (give an obs column of groups, e.g. `countvae diagnose --de GROUPBY`)."
        )
    return statements


__all__ = [
    "BETWEEN",
    "WITHIN",
    "DownstreamRequest",
    "DownstreamSection",
    "DownstreamSettings",
    "DECalls",
    "collect_de",
    "de_groups",
    "downstream_result",
    "reading",
]
