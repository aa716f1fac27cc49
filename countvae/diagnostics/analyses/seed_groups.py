"""Which seeds reached the same solution: groups of fits, each with its held-out log p(x).

When the report finds that seeds differ, the analyst asks which: a few seeds may share one solution while others sit in
a worse local optimum. This module answers from two pieces of evidence the report already computes, per pair of fits:

- **decoded means**: Lin's concordance of the two fits' decoded log means (gene-centred, as the invariants table's
  "decoded means" row), with a paired bootstrap interval over cells at level ``1 - 2 alpha / K`` for the ``K`` pairs
  (Bonferroni, so the pair decisions hold together); ``agree`` when the interval lies at or above the threshold,
  ``differ`` when below, else ``undetermined``;
- **held-out log p(x)**: the pair's decision in the equivalence table of
  :func:`countvae.diagnostics.analyses.predictive.equivalence_table` (paired differences against the report's margin).

A pair reached the **same solution** when its decoded means agree and its log p(x) is not confidently different (an
undecided log p(x) does not separate two fits whose decoded means agree: the difference it cannot rule out is below
what the cells can resolve); **different solutions** when its decoded means differ or its log p(x) is not
equivalent; otherwise **undetermined**.

Groups are built by complete linkage on "same solution": two groups merge only when *every* pair across them reached
the same solution, the pair of groups with the largest smallest concordance first, so every pair inside a group is
directly evidenced. Evidence can be intransitive (seeds 0 and 2 each agree with seed 1 but not with each other):
complete linkage then keeps them apart, and the result says so (:attr:`SeedGroups.notes`). A fit whose pairs are
undetermined stays in a group of its own, with the reason.

Each group's held-out log p(x) per cell is the mean over its fits (per cell), with a t interval over cells; its
difference from the best group is paired per cell, with a simultaneous (Bonferroni over the groups compared) t
interval, and judged against the same margin: ``worse`` (interval below ``-margin``), ``as good`` (interval inside
``(-margin, margin)``) or ``undetermined``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from countvae.diagnostics.analyses.invariants import AGREEMENT_THRESHOLD, gene_centred_concordance
from countvae.diagnostics.analyses.predictive import (
    EQUIVALENCE_MARGIN,
    NOT_EQUIVALENT,
    equivalence_margin,
    equivalence_table,
)
from countvae.diagnostics.analyses.resampling import (
    N_REPLICATES,
    cell_bootstrap,
    percentile_interval,
    weighted_concordance,
)
from countvae.errors import InvalidArgumentError

SAME, DIFFERENT, UNDETERMINED = "same solution", "different solutions", "undetermined"
AGREE, DIFFER = "agree", "differ"
WORSE, AS_GOOD = "worse", "as good"
#: Columns of :attr:`SeedGroups.pairs`.
PAIR_COLUMNS = (
    "fit_a",
    "fit_b",
    "concordance",
    "concordance_low",
    "concordance_high",
    "decoded_means",
    "lpd_diff_per_cell",
    "lpd_low",
    "lpd_high",
    "lpd_decision",
    "relation",
)
#: Columns of :attr:`SeedGroups.groups`.
GROUP_COLUMNS = (
    "group",
    "fits",
    "n_fits",
    "lpd_per_cell",
    "lpd_low",
    "lpd_high",
    "diff_from_best",
    "diff_low",
    "diff_high",
    "versus_best",
)


@dataclass(frozen=True)
class SeedGroups:
    """The pair evidence, the groups and what the grouping could not settle.

    Attributes
    ----------
    pairs
        One row per pair of fits, columns :data:`PAIR_COLUMNS`.
    groups
        One row per group (best held-out log p(x) first), columns :data:`GROUP_COLUMNS`; ``fits`` is a tuple of names.
    margin
        The equivalence margin used, nats per cell.
    notes
        Plain sentences on intransitive or undetermined evidence (empty when every pair was decided consistently).

    """

    pairs: pd.DataFrame
    groups: pd.DataFrame
    margin: float
    notes: list[str] = field(default_factory=list)

    @property
    def partition(self) -> frozenset[frozenset[str]]:
        """The groups as a set of sets of fit names (comparable across cell sets)."""
        return frozenset(frozenset(f) for f in self.groups["fits"])

    @property
    def decided(self) -> bool:
        """Whether every pair's relation is decided (no undetermined pair)."""
        return bool((self.pairs["relation"] != UNDETERMINED).all())


def pair_relations(
    log_rates: Mapping[str, np.ndarray],
    lpd_pairs: pd.DataFrame,
    threshold: float = AGREEMENT_THRESHOLD,
    alpha: float = 0.05,
    n_replicates: int = N_REPLICATES,
    seed: int = 0,
) -> pd.DataFrame:
    """Per pair of fits: decoded-means concordance with its interval, the log p(x) decision, and the relation.

    Parameters
    ----------
    log_rates
        Fit name -> decoded log means (cells, genes), the same cells and genes for every fit.
    lpd_pairs
        :func:`~countvae.diagnostics.analyses.predictive.equivalence_table` of the same fits (columns ``fit_a``,
        ``fit_b``, ``diff_per_cell``, ``ci_low``, ``ci_high``, ``decision``).
    threshold
        Concordance at or above which decoded means agree (the invariants table's threshold).
    alpha
        Each side of the pairs' intervals errs with ``alpha / K`` for ``K`` pairs.
    n_replicates, seed
        The paired bootstrap over cells (the same resampled cells for every pair).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`PAIR_COLUMNS`.

    """
    names = list(log_rates)
    if len(names) < 2:
        raise InvalidArgumentError(f"Grouping seeds needs at least two fits, got {len(names)}.")
    shapes = {np.shape(v) for v in log_rates.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise InvalidArgumentError(
            f"The decoded log means must be (cells, genes) arrays of one shape for every fit; got {sorted(shapes)}."
        )
    lpd = {
        frozenset((a, b)): row
        for a, b, row in zip(lpd_pairs["fit_a"], lpd_pairs["fit_b"], lpd_pairs.to_dict("records"), strict=True)
    }
    missing = [f"{a} / {b}" for a, b in combinations(names, 2) if frozenset((a, b)) not in lpd]
    if missing:
        raise InvalidArgumentError(f"The log p(x) pair table lacks the pairs {missing}; pass the same fits to both.")
    values = {n: np.asarray(v, dtype=np.float64) for n, v in log_rates.items()}
    n_cells = next(iter(shapes))[0]
    boot = cell_bootstrap(n_cells, n_replicates, seed=seed)
    pair_alpha = alpha / (len(names) * (len(names) - 1) / 2)
    rows = []
    for a, b in combinations(names, 2):
        value = gene_centred_concordance(values[a], values[b])
        reps = weighted_concordance(boot.weights, values[a][boot.positions], values[b][boot.positions], True)
        interval = percentile_interval(value, reps, boot.shrink, pair_alpha)
        means = AGREE if interval.low >= threshold else DIFFER if interval.high < threshold else UNDETERMINED
        p = lpd[frozenset((a, b))]
        sign = 1.0 if p["fit_a"] == a else -1.0  # orient the difference as a - b
        low, high = sorted((sign * p["ci_low"], sign * p["ci_high"]))
        decision = p["decision"]
        relation = (
            DIFFERENT if means == DIFFER or decision == NOT_EQUIVALENT else SAME if means == AGREE else UNDETERMINED
        )
        rows.append(
            {
                "fit_a": a,
                "fit_b": b,
                "concordance": value,
                "concordance_low": interval.low,
                "concordance_high": interval.high,
                "decoded_means": means,
                "lpd_diff_per_cell": sign * p["diff_per_cell"],
                "lpd_low": low,
                "lpd_high": high,
                "lpd_decision": decision,
                "relation": relation,
            }
        )
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))


def complete_linkage(names: Sequence[str], pairs: pd.DataFrame) -> list[list[str]]:
    """Groups of fits in which every pair reached the same solution (see the module docstring), in input order."""
    relation = {
        frozenset((a, b)): (r, c)
        for a, b, r, c in pairs[["fit_a", "fit_b", "relation", "concordance"]].itertuples(index=False)
    }
    groups = [[n] for n in names]
    while True:
        best, best_score = None, -np.inf
        for i, j in combinations(range(len(groups)), 2):
            cross = [relation[frozenset((a, b))] for a in groups[i] for b in groups[j]]
            if all(r == SAME for r, _ in cross) and min(c for _, c in cross) > best_score:
                best, best_score = (i, j), min(c for _, c in cross)
        if best is None:
            break
        i, j = best
        groups[i] = groups[i] + groups[j]
        del groups[j]
    order = {n: k for k, n in enumerate(names)}
    return sorted((sorted(g, key=order.get) for g in groups), key=lambda g: order[g[0]])


def _connected(names: Sequence[str], pairs: pd.DataFrame) -> list[set[str]]:
    """Connected components of the "same solution" pairs (single linkage)."""
    component = {n: {n} for n in names}
    for a, b in pairs.loc[pairs["relation"] == SAME, ["fit_a", "fit_b"]].itertuples(index=False):
        if component[a] is not component[b]:
            merged = component[a] | component[b]
            for n in merged:
                component[n] = merged
    unique: list[set[str]] = []
    for c in component.values():
        if not any(c is u for u in unique):
            unique.append(c)
    return unique


def _mean_interval(values: np.ndarray, alpha: float) -> tuple[float, float, float]:
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return mean, np.nan, np.nan
    half = float(stats.t.ppf(1.0 - alpha, df=n - 1) * values.std(ddof=1) / np.sqrt(n))
    return mean, mean - half, mean + half


def group_table(
    groups: list[list[str]], lpd: Mapping[str, np.ndarray], margin: float, alpha: float = 0.05
) -> pd.DataFrame:
    """Each group's held-out log p(x) per cell and its paired difference from the best, best group first.

    Columns :data:`GROUP_COLUMNS`.
    """
    per_cell = {tuple(g): np.mean([np.asarray(lpd[n], dtype=np.float64) for n in g], axis=0) for g in groups}
    ranked = sorted(per_cell, key=lambda g: -per_cell[g].mean())
    best = per_cell[ranked[0]]
    n_compared = max(len(ranked) - 1, 1)
    rows = []
    for k, g in enumerate(ranked, start=1):
        mean, low, high = _mean_interval(per_cell[g], alpha)
        if k == 1:
            diff, d_low, d_high, versus = 0.0, 0.0, 0.0, "best"
        else:
            diff, d_low, d_high = _mean_interval(per_cell[g] - best, alpha / n_compared)
            versus = WORSE if d_high < -margin else AS_GOOD if -margin < d_low and d_high < margin else UNDETERMINED
        rows.append(
            {
                "group": k,
                "fits": g,
                "n_fits": len(g),
                "lpd_per_cell": mean,
                "lpd_low": low,
                "lpd_high": high,
                "diff_from_best": diff,
                "diff_low": d_low,
                "diff_high": d_high,
                "versus_best": versus,
            }
        )
    return pd.DataFrame(rows, columns=list(GROUP_COLUMNS))


def seed_groups(
    log_rates: Mapping[str, np.ndarray],
    lpd: Mapping[str, pd.DataFrame],
    baseline: np.ndarray | None = None,
    margin: float | None = None,
    margin_fraction: float = EQUIVALENCE_MARGIN,
    threshold: float = AGREEMENT_THRESHOLD,
    alpha: float = 0.05,
    seed: int = 0,
) -> SeedGroups:
    """Group the fits by the solution they reached, from their decoded means and held-out log p(x).

    Parameters
    ----------
    log_rates
        Fit name -> decoded log means on shared held-out cells (cells, genes), e.g. the report's collected
        ``log_rate`` per fit.
    lpd
        Fit name -> per-cell frame with columns ``lpd`` and ``mc_se`` on shared held-out cells (the report's ``lpd``
        per fit), the same fits as ``log_rates``.
    baseline, margin_fraction
        Per-cell log p(x) of the no-latent baseline on those cells, and the margin's share of the gain over it (the
        report's ``equivalence_margin``); used when ``margin`` is not given.
    margin
        The equivalence margin in nats per cell (e.g. the report's).
    threshold, alpha, seed
        Decoded means agree at or above ``threshold``; intervals at ``1 - 2 alpha`` overall; bootstrap seed.

    """
    names = list(log_rates)
    if set(lpd) != set(names):
        raise InvalidArgumentError(
            f"log_rates and lpd must cover the same fits; got {sorted(names)} and {sorted(lpd)}."
        )
    frames = {n: lpd[n] for n in names}
    if margin is None:
        margin, _ = equivalence_margin(frames, baseline, margin_fraction)
    if not np.isfinite(margin):
        raise InvalidArgumentError(
            "No equivalence margin: pass margin=, or a baseline on which the fits gain log p(x)."
        )
    lpd_pairs = equivalence_table(frames, margin, alpha)
    pairs = pair_relations(log_rates, lpd_pairs, threshold, alpha, seed=seed)
    groups = complete_linkage(names, pairs)
    table = group_table(groups, {n: frames[n]["lpd"].to_numpy() for n in names}, margin, alpha)
    return SeedGroups(pairs, table, float(margin), _notes(names, pairs, groups))


def _listing(names: Sequence[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _notes(names: Sequence[str], pairs: pd.DataFrame, groups: list[list[str]]) -> list[str]:
    notes = []
    grouped = [set(g) for g in groups]
    for component in _connected(names, pairs):
        if not any(component == g for g in grouped):
            ordered = [n for n in names if n in component]
            split = [g for g in groups if set(g) <= component]
            notes.append(
                f"Intransitive evidence among {_listing(ordered)}: each is linked to the others through fits that "
                f"reached the same solution, but not every pair did; they are kept in {len(split)} groups "
                f"({'; '.join(_listing(g) for g in split)}), in which every pair agrees."
            )
    undecided = pairs[pairs["relation"] == UNDETERMINED]
    if len(undecided):
        listed = "; ".join(f"{a} / {b}" for a, b in undecided[["fit_a", "fit_b"]].itertuples(index=False))
        notes.append(
            f"Undetermined pairs ({listed}): their decoded-means interval contains the threshold, so they are not "
            "grouped together; more held-out cells would decide."
        )
    return notes


def seed_groups_sentence(result: SeedGroups) -> str:
    """One plain sentence: which fits agree, and how much worse the other groups' held-out log p(x) is."""
    g = result.groups
    if len(g) == 1:
        fits = _listing(g["fits"].iloc[0])
        return f"{fits} reached the same solution (decoded means agree, held-out log p(x) not shown to differ)."
    first = g.iloc[0]
    best = f"{first['lpd_per_cell']:.1f} nats per cell"
    if first["n_fits"] > 1:
        parts = [f"{_listing(first['fits'])} agree (the best held-out log p(x), {best})"]
    else:
        parts = [f"{first['fits'][0]} has the best held-out log p(x) ({best})"]
    for row in g.iloc[1:].itertuples(index=False):
        who = _listing(row.fits)
        gap = f"{row.diff_from_best:+.1f} nats per cell, interval {row.diff_low:+.1f} to {row.diff_high:+.1f}"
        if row.versus_best == WORSE:
            parts.append(f"{who} reached a worse optimum ({gap})")
        elif row.versus_best == AS_GOOD:
            parts.append(
                f"{who} reached another solution that predicts as well ({gap}, within the margin +-{result.margin:.2g})"
            )
        else:
            parts.append(
                f"{who} reached another solution, not shown better or worse ({gap}; margin +-{result.margin:.2g})"
            )
    return "; ".join(parts) + "."
