"""Which model to choose: held-out fit against the best candidate, cross-seed stability, and the rule that picks one.

Pure functions over arrays and tables; the fitted models are asked for their outputs elsewhere
(:mod:`countvae.diagnostics.reporting.compare_models`). Definitions (log densities in nats, higher is better):

- A candidate's per-cell held-out ``log p(x)`` is the mean over its seeds of each seed's estimate for that cell (the
  package's importance-sampling estimator); every candidate is evaluated on the same held-out cells, so differences
  are paired per cell.
- **Fit against the best**: the best candidate has the highest mean per-cell ``log p(x)`` among the candidates whose
  estimates are reliable. For every other candidate ``c`` the per-cell differences ``d_i = lpd_ci - lpd_best,i`` give a
  mean and a simultaneous interval ``mean +- t_{n-1}(1 - alpha / K) sd(d) / sqrt(n)``, Bonferroni over the ``K``
  comparisons with the best (level at least ``1 - 2 alpha`` for all of them at once, as the report's equivalence test).
- **Margin**: the report's rule (:func:`countvae.diagnostics.analyses.predictive.equivalence_margin`): a share of
  the best candidate's mean per-cell gain over the no-latent baseline.
- **Reliable**: every seed's estimates pass :func:`countvae.diagnostics.analyses.predictive.estimator_reliability` (the
  package's k-hat rule and the Monte Carlo bias bound); an unreliable candidate is never ranked on its point estimate.
- **Stability**: over every pair of seeds, the report's agreement scores of rotation-invariant outputs (decoded log
  means, gene-centred concordance; latent distances, concordance; k-NN overlap) and of coordinates after a signed
  permutation only (:func:`countvae.metrics.mcc`); beside each, its within-seed baseline
  (:func:`within_seed_baseline`: the same score between two draws of one fit's guide), and the gene-space subspace
  of the decoders (:func:`subspace_agreement`); the baselines and the subspace are shown, not judged. The invariant
  scores carry a cell-bootstrap interval of the worst pair (the report's weighted scores). A candidate is stable
  when the worst pair meets the report's thresholds for the invariant outputs; the coordinates are shown (with their
  range over pairs), not judged (a rotation leaves ``p(x)`` unchanged, so the data do not fix them).
- **Rule**: as ``RULE`` states it (:func:`rule_text`); :func:`recommend` returns ``None`` ("undetermined") when no
  candidate qualifies or no margin can be stated.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from scipy.spatial.distance import squareform

from countvae.diagnostics.analyses.invariants import (
    AGREEMENT_THRESHOLD,
    KNN_THRESHOLD,
    concordance,
    gene_centred_concordance,
    pairwise_distances,
)
from countvae.diagnostics.analyses.predictive import equivalence_margin, estimator_reliability
from countvae.diagnostics.analyses.resampling import (
    N_REPLICATES,
    CellBootstrap,
    cell_bootstrap,
    distance_concordance,
    pair_sums,
    weighted_concordance,
    weighted_mean,
    worst_interval,
)
from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets, weighted_overlap
from countvae.errors import InvalidArgumentError
from countvae.metrics import mcc

#: Verdicts of one candidate.
BEST, EQUIVALENT, NOT_WORSE, WORSE, UNDETERMINED, UNRELIABLE = (
    "best",
    "equivalent",
    "not worse than the margin",
    "worse",
    "undetermined",
    "unreliable",
)
#: Invariant stability scores, with the report's threshold each must meet on the worst pair of seeds.
STABILITY_THRESHOLDS = {"decoded_means": AGREEMENT_THRESHOLD, "distances": AGREEMENT_THRESHOLD, "knn": KNN_THRESHOLD}
#: Shown, not judged: coordinates after the best signed permutation.
COORDINATES = "coordinates_signed_permutation"
#: Neighbours of the k-NN overlap.
KNN_K = 15
#: Held-out cells whose decoder Jacobians give the gene-space subspace, at most.
MAX_JACOBIAN_CELLS = 300
#: Cells the latent-distance concordance uses at most (the distance matrix is quadratic).
MAX_DISTANCE_CELLS = 1_000
#: Held-out cells the comparison uses at most by default (``max_heldout_cells``): a random subset, the same for every
#: candidate and seed, so that the differences stay paired.
MAX_HELDOUT_CELLS = 2_000
#: Genes (largest variance of the held-out cells' log1p-normalized counts) whose decoded means are compared at most:
#: a fit's decoded means are kept for these only, not for every gene.
MAX_DECODED_GENES = 2_000

RULE = (
    "Recommended: the smallest candidate (fewest latent dimensions, then a linear before an MLP decoder, "
    "then fewer hidden units and layers, then Poisson before NB before ZINB and one dispersion per gene before one "
    "per gene and batch; of equal size, the better fit) whose held-out log p(x) estimates are reliable (k-hat rule), "
    "whose simultaneous interval of the per-cell difference from the best candidate lies above minus the equivalence "
    "margin (equivalent to the best, or not worse by more than the margin), and whose rotation-invariant outputs "
    "agree across seeds on the worst pair (decoded means and latent distances concordance >= {agree:g}, "
    "k-NN overlap >= {knn:g}). Undetermined when no candidate qualifies or no margin can be stated."
)


def rule_text() -> str:
    """The recommendation rule in words, with its thresholds."""
    return RULE.format(agree=AGREEMENT_THRESHOLD, knn=KNN_THRESHOLD)


def expand_candidates(candidates: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Candidate settings: a grid (setting -> values, expanded to the product) or a list of settings dicts.

    Raises
    ------
    InvalidArgumentError
        For an empty grid, a setting with no values, or something that is neither.
    """
    if isinstance(candidates, Mapping):
        if not candidates:
            raise InvalidArgumentError("The candidate grid is empty; give e.g. {'n_latent': [2, 5, 10]}.")
        keys = list(candidates)
        values = []
        for key, v in candidates.items():
            # a numpy array or a pandas column of values is a list of values, as a list or a range is
            many = isinstance(v, Sequence | np.ndarray | pd.Index | pd.Series) and not isinstance(v, str)
            v = [x.item() if isinstance(x, np.generic) else x for x in v] if many else [v]
            if not v:
                raise InvalidArgumentError(f"The candidate grid has no values for {key!r}; give at least one.")
            values.append(v)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]
    if isinstance(candidates, str) or not isinstance(candidates, Sequence):
        raise InvalidArgumentError(
            f"candidates must be a dict of lists (a grid) or a list of settings dicts, got {type(candidates).__name__}."
        )
    out = [dict(c) for c in candidates if isinstance(c, Mapping)]
    if len(out) != len(candidates):
        raise InvalidArgumentError("Each candidate of a list must be a dict of CountVAE arguments.")
    if not out:
        raise InvalidArgumentError("The candidate list is empty; give at least one settings dict.")
    return out


#: Parameters per gene beyond the rate, in the size order: a dispersion (NB), and a dropout (ZINB).
_LIKELIHOOD_SIZE = {"poisson": 0, "nb": 1, "zinb": 2}


def size_key(settings: Mapping[str, Any]) -> tuple:
    """Order of candidates from smallest to largest.

    n_latent, then linear before MLP, then hidden units, layers, then the likelihood's parameters per gene (Poisson,
    NB, ZINB), then per-gene before per-gene-and-batch dispersion. The prior is not part of the order (a diagonal
    prior's learned variances are not counted): candidates that differ only in it go to the better fit.
    """
    decoder = 0 if settings.get("decoder") == "linear" else 1
    hidden = 0 if decoder == 0 else settings.get("n_hidden", 0)
    layers = settings.get("n_layers", 0) if decoder else 0
    likelihood = _LIKELIHOOD_SIZE.get(settings.get("likelihood", "nb"), 1)
    per_batch = settings.get("dispersion") == "gene-batch"
    return (settings.get("n_latent", 0), decoder, hidden, layers, likelihood, per_batch)


def candidate_lpd(frames: Sequence[pd.DataFrame]) -> np.ndarray:
    """A candidate's per-cell held-out ``log p(x)``: the mean over its seeds' estimates of each cell."""
    return np.mean([f["lpd"].to_numpy(dtype=np.float64) for f in frames], axis=0)


def reliability(frames: Mapping[str, Sequence[pd.DataFrame]], margin: float) -> pd.Series:
    """Per candidate, whether every seed's estimates pass the report's reliability rule at this margin."""
    return pd.Series(
        {
            name: bool(estimator_reliability(dict(enumerate(seeds)), margin)["reliable"].all())
            for name, seeds in frames.items()
        }
    )


def seed_spread(frames: Sequence[pd.DataFrame]) -> float:
    """Largest difference in mean per-cell ``log p(x)`` between two seeds of one candidate (nats/cell)."""
    means = [float(f["lpd"].mean()) for f in frames]
    return float(max(means) - min(means))


def paired_difference(a: np.ndarray, b: np.ndarray, t: float) -> tuple[float, float, float]:
    """Mean of ``a - b`` per cell and its interval ``mean +- t se``."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    mean = float(d.mean())
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else np.nan
    return mean, mean - t * se, mean + t * se


def critical_t(n_cells: int, n_comparisons: int, alpha: float) -> float:
    """Student-t quantile of the simultaneous intervals (Bonferroni over ``n_comparisons``)."""
    return float(stats.t.ppf(1.0 - alpha / max(n_comparisons, 1), df=max(n_cells - 1, 1)))


def fit_table(lpds: Mapping[str, np.ndarray], reliable: Mapping[str, bool], margin: float, alpha: float = 0.05):
    """Each candidate's mean per-cell ``log p(x)`` and its difference from the best, with simultaneous intervals.

    Returns
    -------
    (pandas.DataFrame, str or None)
        Columns ``candidate``, ``lpd_per_cell``, ``diff_vs_best``, ``diff_low``, ``diff_high``, ``margin``,
        ``reliable``, ``fit_verdict``; and the best candidate (``None`` when none is reliable).
    """
    names = list(lpds)
    ranked = [n for n in names if reliable[n]]
    best = max(ranked, key=lambda n: float(np.mean(lpds[n]))) if ranked else None
    n_cells = len(next(iter(lpds.values())))
    t = critical_t(n_cells, len(names) - 1, alpha)
    rows = []
    for name in names:
        row = {"candidate": name, "lpd_per_cell": float(np.mean(lpds[name])), "margin": margin}
        if best is None:
            row.update(diff_vs_best=np.nan, diff_low=np.nan, diff_high=np.nan)
        elif name == best:
            row.update(diff_vs_best=0.0, diff_low=0.0, diff_high=0.0)
        else:
            mean, low, high = paired_difference(lpds[name], lpds[best], t)
            row.update(diff_vs_best=mean, diff_low=low, diff_high=high)
        row["reliable"] = bool(reliable[name])
        row["fit_verdict"] = _fit_verdict(row, name == best, margin)
        rows.append(row)
    return pd.DataFrame(rows), best


def settled_fit_table(
    lpds: Mapping[str, np.ndarray],
    frames: Mapping[str, Sequence[pd.DataFrame]],
    baseline: np.ndarray | None,
    share: float,
    alpha: float = 0.05,
) -> tuple[pd.DataFrame, str | None, float, float]:
    """:func:`fit_table` at a margin and a reliability that agree: ``(table, best, margin, gain)``.

    The margin is ``share`` of the best reliable candidate's gain over the no-latent ``baseline``, and reliability (a
    Monte Carlo bias bound under a tenth of the margin) is judged at that margin; each depends on the other. Starting
    from the best-fitting candidate, the best is moved to the best candidate reliable at the current margin until it
    stays: the margin only shrinks as the best moves down, so this ends within one step per candidate. Without any
    reliable candidate the margin is that of the last best tried.
    """
    best = max(lpds, key=lambda n: float(np.mean(lpds[n])))
    for _ in range(len(lpds)):
        margin, gain = equivalence_margin({best: pd.DataFrame({"lpd": lpds[best]})}, baseline, share)
        table, chosen = fit_table(lpds, reliability(frames, margin).to_dict(), margin, alpha)
        if chosen is None or chosen == best:
            break
        best = chosen
    return table, chosen, margin, gain


def _fit_verdict(row: Mapping[str, Any], is_best: bool, margin: float) -> str:
    if not row["reliable"]:
        return UNRELIABLE
    if is_best:
        return BEST
    low, high = row["diff_low"], row["diff_high"]
    if not (np.isfinite(margin) and np.isfinite(low) and np.isfinite(high)):
        return UNDETERMINED
    if -margin < low and high < margin:
        return EQUIVALENT
    if low > -margin:
        return NOT_WORSE
    if high < -margin:
        return WORSE
    return UNDETERMINED


def _pair_scores(za: np.ndarray, zb: np.ndarray, ra: np.ndarray, rb: np.ndarray, boot: CellBootstrap) -> dict:
    """Each score of one pair of seeds with its bootstrap replicates (element 0: the score on the resampled cells)."""
    pos, w = boot.positions, boot.weights
    da = squareform(pairwise_distances(za[pos]))
    db = squareform(pairwise_distances(zb[pos]))
    k = min(KNN_K, len(za) - 1)
    knn = knn_jaccard_per_cell(knn_sets(za, k), knn_sets(zb, k))
    return {
        "decoded_means": (
            gene_centred_concordance(ra, rb),
            weighted_concordance(w, ra[pos], rb[pos], centre_columns=True),
        ),
        "distances": (None, distance_concordance(w, da, db, pair_sums(w, da), pair_sums(w, db))),
        "knn": (float(np.mean(knn)), weighted_mean(w, knn[pos])),
        COORDINATES: (mcc(za, zb), None),
    }


def knn_chance_overlap(n_cells: int, k: int = KNN_K) -> float:
    """Expected k-NN overlap (Jaccard) of two unrelated graphs on ``n_cells`` cells.

    Each cell's ``k`` neighbours are ``k`` of its ``n_cells - 1`` others drawn independently in the two graphs:
    ``E|A & B| = k^2 / (n - 1)``, over ``2k - E|A & B|`` (the ratio of the expectations). On 16 or fewer cells
    (``k = 15``) every neighbourhood is every other cell and the overlap is 1 whatever the fits.
    """
    k = min(k, n_cells - 1)
    shared = k * k / max(n_cells - 1, 1)
    return float(shared / (2 * k - shared)) if k > 0 else 1.0


#: The k-NN overlap is judged only where unrelated graphs would reach at most half its threshold by chance
#: (:func:`knn_chance_overlap`: 39 held-out cells or more with 15 neighbours); below, a candidate's stability is
#: undetermined, whatever its other scores.
KNN_CHANCE_LIMIT = STABILITY_THRESHOLDS["knn"] / 2
#: The fewest held-out cells on which the k-NN overlap is judged.
KNN_MIN_CELLS = next(n for n in range(2, 100_000) if knn_chance_overlap(n) <= KNN_CHANCE_LIMIT)


def stability(
    latents: Sequence[np.ndarray],
    log_rates: Sequence[np.ndarray],
    seed: int = 0,
    n_replicates: int = N_REPLICATES,
    level: float = 0.95,
) -> dict[str, Any]:
    """Cross-seed agreement of one candidate's outputs on the held-out cells, over every pair of seeds.

    Parameters
    ----------
    latents
        Per seed, the (cells, n_latent) posterior means.
    log_rates
        Per seed, the (cells, genes) decoded log means at those latents.
    seed
        Seed of the cell bootstrap (and of the subsample of at most :data:`MAX_DISTANCE_CELLS` cells the
        distance concordance is computed on).
    n_replicates
        Bootstrap replicates over cells.
    level
        Level of the intervals.

    Returns
    -------
    dict
        For each score ``s``: ``s`` (the worst pair of seeds), ``s_low`` and ``s_high`` (the cell-bootstrap
        interval of the worst pair, at ``level``; for the coordinates, which are not judged, the range over
        pairs); and ``stable``: the worst pair meets :data:`STABILITY_THRESHOLDS`. On cells so few that unrelated
        k-NN graphs overlap by chance more than :data:`KNN_CHANCE_LIMIT`, the ``knn`` scores are NaN and the
        candidate is not stable (undetermined).
    """
    if len(latents) < 2 or len(latents) != len(log_rates):
        raise InvalidArgumentError("Stability compares at least two seeds, each with latents and decoded means.")
    boot = cell_bootstrap(len(latents[0]), n_replicates, seed, max_cells=MAX_DISTANCE_CELLS)
    pairs = [
        _pair_scores(latents[a], latents[b], log_rates[a], log_rates[b], boot)
        for a, b in itertools.combinations(range(len(latents)), 2)
    ]
    out: dict[str, Any] = {}
    alpha = (1.0 - level) / 2.0
    for score in STABILITY_THRESHOLDS:
        values = [p[score][1][0] if p[score][0] is None else p[score][0] for p in pairs]
        interval = worst_interval(values, [p[score][1] for p in pairs], boot.shrink, alpha, higher_is_better=True)
        out[score], out[f"{score}_low"], out[f"{score}_high"] = interval.value, interval.low, interval.high
    coordinates = np.array([p[COORDINATES][0] for p in pairs], dtype=np.float64)
    out[COORDINATES] = float(np.nanmin(coordinates))
    out[f"{COORDINATES}_low"], out[f"{COORDINATES}_high"] = float(np.nanmin(coordinates)), float(np.nanmax(coordinates))
    if knn_chance_overlap(len(latents[0])) > KNN_CHANCE_LIMIT:
        out["knn"] = out["knn_low"] = out["knn_high"] = np.nan
    out["stable"] = bool(all(out[s] >= threshold for s, threshold in STABILITY_THRESHOLDS.items()))
    return out


def subspace_agreement(spans: Sequence[np.ndarray]) -> float:
    """The gene-space subspace overlap of the worst pair of seeds (shown, not judged by the rule).

    ``spans`` are each seed's leading gene-space directions of its decoder
    (:func:`~countvae.diagnostics.analyses.subspace.jacobian_span` of the gene contrasts of its Jacobians: the
    loadings' span for a linear decoder); the score of a pair is their
    :func:`~countvae.diagnostics.analyses.subspace.weighted_overlap`, the report's, invariant under rotations.
    """
    return float(min(weighted_overlap(a, b) for a, b in itertools.combinations(spans, 2)))


def within_seed_baseline(draw_pairs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> dict:
    """Each stability score between two draws from one fit's guide, averaged over seeds: the within-seed baseline.

    How much decoded means, latent distances, neighbourhoods and coordinates move under each fit's own
    posterior uncertainty, with the seed held fixed. The cross-seed scores compare posterior means, so they can
    lie above it: a cross-seed score at or above its baseline says the seeds differ no more than one fit's
    posterior is uncertain; far below it, that they reached other solutions.

    Parameters
    ----------
    draw_pairs
        Per seed, ``(z_a, z_b, r_a, r_b)``: two draws of the latents on the held-out cells, (cells, n_latent),
        and the decoded log means at each, (cells, genes).

    Returns
    -------
    dict
        ``<score>_within_seed`` for ``decoded_means``, ``distances``, ``knn`` and the coordinates.
    """
    scores: dict[str, list[float]] = {s: [] for s in (*STABILITY_THRESHOLDS, COORDINATES)}
    for za, zb, ra, rb in draw_pairs:
        cells = slice(0, MAX_DISTANCE_CELLS)
        k = min(KNN_K, len(za) - 1)
        scores["decoded_means"].append(gene_centred_concordance(ra, rb))
        scores["distances"].append(concordance(pairwise_distances(za[cells]), pairwise_distances(zb[cells])))
        scores["knn"].append(float(np.mean(knn_jaccard_per_cell(knn_sets(za, k), knn_sets(zb, k)))))
        scores[COORDINATES].append(mcc(za, zb))
    return {f"{name}_within_seed": float(np.mean(values)) for name, values in scores.items()}


def recommend(table: pd.DataFrame, settings: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The candidate the rule picks (see :func:`rule_text`), or ``None`` when none qualifies or no margin exists."""
    if table.empty or not np.isfinite(table["margin"].iloc[0]):
        return None
    fit_ok = table["fit_verdict"].isin([BEST, EQUIVALENT, NOT_WORSE])
    qualifying = table.loc[fit_ok & table["reliable"] & table["stable"], "candidate"].tolist()
    if not qualifying:
        return None
    fit = table.set_index("candidate")["lpd_per_cell"]
    # of equal size, the better fit; the list order never decides
    return min(qualifying, key=lambda name: (size_key(settings[name]), -float(fit[name]), name))


def gains_over(lpds: Mapping[str, np.ndarray], reference: str, alpha: float = 0.05) -> pd.DataFrame:
    """What each candidate buys over ``reference``: mean per-cell ``log p(x)`` difference, simultaneous interval.

    Columns ``candidate``, ``gain``, ``gain_low``, ``gain_high`` (nats per cell; Bonferroni over the others).
    """
    n_cells = len(lpds[reference])
    t = critical_t(n_cells, len(lpds) - 1, alpha)
    rows = []
    for name, values in lpds.items():
        mean, low, high = (0.0, 0.0, 0.0) if name == reference else paired_difference(values, lpds[reference], t)
        rows.append({"candidate": name, "gain": mean, "gain_low": low, "gain_high": high})
    return pd.DataFrame(rows)
