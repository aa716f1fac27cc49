"""Rankings compared with a reference implementation up to ties within float tolerance.

Two implementations that compute the same scores in a different order of float operations agree on
every score to ~1e-12 relative, but where two genes' scores are that close their order is decided
by the last bits and can differ from one processor (or summation order) to the next. Such a swap is
not a disagreement. Any other difference in rank or selection is one, and these checks fail on it.
"""

from __future__ import annotations

import numpy as np

#: Scores closer than this (relative) count as tied: 1,000x the agreement of countvae's and scanpy's
#: normalized variances (rtol 1e-12 in the tests), so that a last-bit difference never breaks a tie
#: the other way without the check allowing it, and far below any real difference between genes.
TIE_RTOL = 1e-9


def tie_groups(scores: np.ndarray, rtol: float = TIE_RTOL) -> np.ndarray:
    """A group number per entry: entries whose sorted neighbours are within ``rtol`` share a group."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    ordered = scores[order]
    starts = np.r_[True, ~np.isclose(ordered[1:], ordered[:-1], rtol=rtol, atol=0.0)]
    groups = np.empty(len(scores), dtype=np.int64)
    groups[order] = np.cumsum(starts) - 1
    return groups


def _as_comparable(ranks: np.ndarray) -> np.ndarray:
    """Ranks with "not ranked" (NaN, genes outside the top) as +inf, so multisets of them compare."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(np.isnan(ranks), np.inf, ranks)


def rank_differences_beyond_ties(
    got: np.ndarray, expected: np.ndarray, scores_per_batch: np.ndarray, rtol: float = TIE_RTOL
) -> list[str]:
    """What differs between two rankings of the same genes beyond what ties in the scores explain.

    Parameters
    ----------
    got, expected
        One rank per gene (NaN: not among the top genes); with several batches, the median of the
        per-batch ranks, as Seurat v3 gene selection reports it.
    scores_per_batch
        (batches, genes) scores the ranks were computed from (the reference's or ours: they agree far
        more closely than ``rtol``).
    rtol
        Relative tolerance within which two scores are tied.

    Returns
    -------
    list of str
        Empty when the rankings agree up to ties. With one batch, the multiset of ranks in every tie
        group must be the same (a tie may only be broken the other way). With several, each gene whose
        median rank differs must be tied with another gene in some batch, and differ by less than the
        size of its largest tie group.
    """
    got, expected = _as_comparable(got), _as_comparable(expected)
    scores_per_batch = np.atleast_2d(np.asarray(scores_per_batch, dtype=np.float64))
    groups = np.vstack([tie_groups(s, rtol) for s in scores_per_batch])
    sizes = np.vstack([np.bincount(g)[g] for g in groups])  # per batch and gene: the size of its group
    problems = []
    if len(scores_per_batch) == 1:
        for group in np.unique(groups[0][got != expected]):
            members = np.flatnonzero(groups[0] == group)
            if sorted(got[members]) != sorted(expected[members]):
                problems.append(f"genes {members.tolist()}: ranks {got[members]} vs {expected[members]}")
        return problems
    largest = sizes.max(axis=0)
    for gene in np.flatnonzero(got != expected):
        if largest[gene] == 1 or not abs(got[gene] - expected[gene]) < largest[gene]:
            problems.append(f"gene {gene}: rank {got[gene]} vs {expected[gene]} (largest tie group {largest[gene]})")
    return problems


def selection_differences_beyond_ties(
    got_selected: np.ndarray, expected_selected: np.ndarray, got_rank: np.ndarray, expected_rank: np.ndarray
) -> list[str]:
    """Genes selected by one implementation and not the other whose ranks do not explain it.

    A gene may change sides of the cut only if its rank differs between the two (which
    :func:`rank_differences_beyond_ties` allows only within ties).
    """
    differs = np.flatnonzero(np.asarray(got_selected) != np.asarray(expected_selected))
    same_rank = _as_comparable(got_rank)[differs] == _as_comparable(expected_rank)[differs]
    return [f"gene {g}: selected {bool(got_selected[g])} vs {bool(expected_selected[g])}" for g in differs[same_rank]]
