"""What a restriction buys and what it costs: functions over arrays for ``compare_restrictions``.

A restriction (a non-Gaussian prior, a prior on the loadings, gene programs, ICA after the fact) is meant to fix the
latent axes that a N(0, I) prior leaves to chance. These functions measure whether it does, on the held-out cells
every fit shares:

Agreement after a signed permutation only
    For two fits ``a`` and ``b`` the signed permutation ``P`` matching ``a``'s dimensions to ``b``'s (Hungarian on
    |correlation|, :func:`countvae.diagnostics.analyses.maps.fit_signed_permutation`) is fitted on one random half
    of the held-out cells and scored on the other, so that choosing the best of ``L! 2^L`` matchings does not flatter
    itself. No rotation is allowed: a restriction that identifies the axes makes the dimensions agree one by one.

    * ``coordinates``: mean over dimensions of the Pearson correlation of ``(Z_a P)_k`` with ``(Z_b)_k`` on the
      scoring cells;
    * ``loadings``: the same across genes, of ``(W_a P)_k`` with ``(W_b)_k`` (linear decoders);
    * ``markers``: Lin's concordance of the (markers x dimensions) correlation matrices of ``Z_a P`` and ``Z_b`` on
      the scoring cells;
    * ``rotation_ceiling``: the coordinate agreement after the best orthogonal map instead (Procrustes, fitted on
      the same half): what a rotation would add, so a low agreement with a high ceiling means the fits share a latent
      space but not its axes.

Split half
    The same agreement between two fits on disjoint halves of the training cells, started from different seeds (the
    first two): agreement from independent data and independent initialisations. Fits from several seeds all see
    the same cells, so they can agree on axes that belong to this sample (directions in which its noise happens to
    look non-Gaussian, which a non-Gaussian prior or an ICA picks up the same way each time) rather than to the
    population; only agreement between independent halves shows that a restriction identifies the axes, so a
    restriction is credited only when both agree. When the split-half agreement is lower than the agreement across
    seeds, agreement grows with cells (too few cells, or axes of the sample).

Gene programs
    :func:`program_support`: whether each program's genes co-vary across the held-out cells more than random gene
    sets do once sequencing depth is regressed out (the data's own evidence, with no model), and whether its
    dimension is active, loads on the program's genes and is predicted by their expression (held-out ``R^2``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.linalg import orthogonal_procrustes
from sklearn.linear_model import Ridge

from countvae.diagnostics.analyses.alignment import split_halves
from countvae.diagnostics.analyses.invariants import concordance
from countvae.diagnostics.analyses.maps import fit_signed_permutation
from countvae.diagnostics.analyses.markers import dimension_correlations
from countvae.diagnostics.analyses.predictive import equivalence_table
from countvae.errors import InvalidArgumentError
from countvae.metrics import mcc
from countvae.module.importance import MAX_UNRELIABLE_SHARE, estimate_reliability

#: Variance of a dimension's posterior means over cells below which it is unused (Burda, Grosse, Salakhutdinov 2016).
ACTIVE_VARIANCE = 0.01
#: Agreement at or above which per-dimension coordinates count as reproducible (as the invariants table).
IDENTIFIED_AGREEMENT = 0.9
#: A split-half agreement lower than the cross-seed one by more than this means agreement still grows with cells.
GROWTH_MARGIN = 0.05
#: Default equivalence margin of the predictive cost, nats per cell (a convention, stated in the report).
DEFAULT_MARGIN = 0.5
#: Normal quantiles of the two-sided 95% interval and of the 90% interval used for equivalence.
Z95, Z90 = 1.959963984540054, 1.6448536269514722
#: Columns of :func:`agreement_pairs`.
AGREEMENT_COLUMNS = ("fit_a", "fit_b", "coordinates", "loadings", "markers", "rotation_ceiling")


def _mean_matched_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over columns of the Pearson correlation of column ``k`` of ``a`` with column ``k`` of ``b``."""
    values = [
        0.0 if np.std(a[:, k]) == 0 or np.std(b[:, k]) == 0 else float(np.corrcoef(a[:, k], b[:, k])[0, 1])
        for k in range(a.shape[1])
    ]
    return float(np.mean(values))


def pair_agreement(
    za: np.ndarray,
    zb: np.ndarray,
    wa: np.ndarray | None = None,
    wb: np.ndarray | None = None,
    markers: np.ndarray | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Agreement of two fits after a signed permutation only (see the module docstring).

    Parameters
    ----------
    za, zb
        Latent coordinates of the same held-out cells, (cells, L) each.
    wa, wb
        Loadings (genes, L), or ``None``.
    markers
        Marker values of the same cells, (cells, markers), or ``None``.
    seed
        Seed of the split of the cells into the half that fits the maps and the half that scores them.

    Returns
    -------
    dict
        ``coordinates``, ``loadings``, ``markers``, ``rotation_ceiling`` (NaN where an input is missing).

    """
    za, zb = np.asarray(za, dtype=np.float64), np.asarray(zb, dtype=np.float64)
    if za.shape != zb.shape:
        raise InvalidArgumentError(f"Latents of different shapes cannot be compared: {za.shape} and {zb.shape}.")
    fit, score = split_halves(za.shape[0], seed)
    P = fit_signed_permutation(za[fit], zb[fit])
    out = {"coordinates": _mean_matched_correlation(za[score] @ P, zb[score])}
    ma, mb = za[fit].mean(0), zb[fit].mean(0)
    R, _ = orthogonal_procrustes(za[fit] - ma, zb[fit] - mb)
    out["rotation_ceiling"] = _mean_matched_correlation((za[score] - ma) @ R, zb[score])
    out["loadings"] = np.nan if wa is None or wb is None else _mean_matched_correlation(wa @ P, wb)
    if markers is None or markers.shape[1] == 0:
        out["markers"] = np.nan
    else:
        mk = np.asarray(markers, dtype=np.float64)[score]
        ca = np.stack([dimension_correlations(za[score] @ P, mk[:, j]) for j in range(mk.shape[1])])
        cb = np.stack([dimension_correlations(zb[score], mk[:, j]) for j in range(mk.shape[1])])
        out["markers"] = concordance(ca, cb)
    return out


def agreement_pairs(
    latents: Mapping[str, np.ndarray],
    loadings: Mapping[str, np.ndarray | None] | None = None,
    markers: np.ndarray | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """:func:`pair_agreement` for every pair of fits; one row per pair (columns :data:`AGREEMENT_COLUMNS`)."""
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError("Agreement across fits needs at least two fits.")
    loadings = loadings or {}
    rows = []
    for a, b in combinations(names, 2):
        scores = pair_agreement(latents[a], latents[b], loadings.get(a), loadings.get(b), markers, seed)
        rows.append({"fit_a": a, "fit_b": b, **scores})
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))


def summarize_agreement(pairs: pd.DataFrame) -> dict[str, float]:
    """Mean (and, for coordinates, worst pair) of each agreement over pairs of fits."""
    out = {f"{c}_agreement": float(pairs[c].mean()) for c in ("coordinates", "loadings", "markers")}
    out["coordinates_agreement_min"] = float(pairs["coordinates"].min())
    out["rotation_ceiling"] = float(pairs["rotation_ceiling"].mean())
    return out


# ----- verdicts -------------------------------------------------------------------------------------------
IDENTIFIED = "identified"
NOT_IDENTIFIED = "not identified"
UNDETERMINED = "undetermined"
ALREADY = "agrees without it"
LOWERS = "agrees less than without it"
SAME_CELLS = "agrees on the same cells only"
TOO_GAUSSIAN = "too Gaussian to identify"


def identification_verdict(
    agreement_min: float, agreement_mean: float, baseline_mean: float, split_half: float, too_gaussian: bool = False
) -> str:
    """Whether a restriction makes per-dimension coordinates reproducible across seeds and cells.

    ``identified``: every pair of seeds agrees (worst pair at least :data:`IDENTIFIED_AGREEMENT`) while the
    unrestricted model's seeds do not on average, and the split half (see the module docstring) reaches it too.
    ``agrees on the same cells only``: the seeds agree but the independent halves do not (the axes are then a
    property of this sample of cells, or there are too few cells); a split half that was not measured leaves the
    verdict ``undetermined``. When the unrestricted model's seeds already agree (the axes then come from the fit
    itself, e.g. the mean-field guide, and no restriction is credited with them): ``agrees without it`` if the
    restriction keeps that agreement (within :data:`GROWTH_MARGIN`), ``agrees less than without it`` if it loses
    more. Otherwise ``not identified``: the mean agreement is below the threshold and no better than the unrestricted
    model's plus :data:`GROWTH_MARGIN`; ``undetermined`` in the other cases: every pair agrees but the split half was
    not measured, the worst pair is below the threshold while the mean agreement is above it (some pairs agree, some
    not) or above the unrestricted model's plus :data:`GROWTH_MARGIN`, or the agreement could not be measured.
    ``too Gaussian to identify`` (ICA, ``too_gaussian=True``): some component is no more non-Gaussian than what ICA
    finds in Gaussian noise of the same size (:class:`countvae.ica.ICARotation`'s null), so its axis cannot be
    identified by non-Gaussianity however well the fits agree.
    """
    if not np.isfinite(agreement_mean):
        return UNDETERMINED
    if baseline_mean >= IDENTIFIED_AGREEMENT:
        return ALREADY if agreement_mean >= baseline_mean - GROWTH_MARGIN else LOWERS
    if too_gaussian:
        return TOO_GAUSSIAN
    if agreement_min >= IDENTIFIED_AGREEMENT:
        if not np.isfinite(split_half):
            return UNDETERMINED
        return IDENTIFIED if split_half >= IDENTIFIED_AGREEMENT else SAME_CELLS
    if agreement_mean < IDENTIFIED_AGREEMENT and agreement_mean <= baseline_mean + GROWTH_MARGIN:
        return NOT_IDENTIFIED
    return UNDETERMINED


def split_half_reading(verdict: str, cross_seed: float, split_half: float) -> str:
    """What the split-half agreement (disjoint halves of the cells, two seeds) adds to the cross-seed verdict."""
    if not np.isfinite(split_half):
        if verdict == UNDETERMINED and np.isfinite(cross_seed) and cross_seed >= IDENTIFIED_AGREEMENT:
            return (
                "split half not measured: agreement across seeds that all see the same cells does not show "
                "that the restriction identifies the axes"
            )
        return "split half not measured"
    if verdict == SAME_CELLS:
        return (
            f"not reproducible from independent halves of the cells (split half {split_half:.2f}): the seeds agree "
            "because they see the same cells; the axes belong to this sample, or there are too few cells (or too few "
            "training steps) to settle them"
        )
    if verdict in (IDENTIFIED, ALREADY):
        if split_half >= IDENTIFIED_AGREEMENT:
            return "reproducible from independent halves of the cells"
        return "not reproducible from independent halves of the cells: close to too few cells"
    if split_half < cross_seed - GROWTH_MARGIN:
        return (
            "independent halves agree less than seeds on the same cells: too few cells to identify the axes "
            "(more cells may), or the seeds share axes of this sample"
        )
    return (
        "agreement does not grow with cells: more cells would not identify the axes (longer training might, "
        "if the fits have not settled)"
    )


# ----- recovery of a simulated truth --------------------------------------------------------------------
def truth_recovery(
    latents: Mapping[str, np.ndarray],
    loadings: Mapping[str, np.ndarray | None],
    z_true: np.ndarray,
    w_true: np.ndarray | None = None,
) -> dict[str, float]:
    """How well the fits recover known sources and loadings (simulated data), axis by axis.

    ``sources_mcc``: mean over fits of the mean |correlation| of each true source with its Hungarian-matched latent
    dimension (:func:`countvae.metrics.mcc`; 1 exactly when the dimensions are the sources up to a signed permutation
    and scaling). ``loadings_mcc``: the same between the true and fitted loadings, correlation across genes (NaN
    without loadings). ``sources_mcc_min``: the worst fit.
    """
    z_scores = [mcc(z, z_true) for z in latents.values()]
    w_scores = [mcc(w, w_true) for w in loadings.values() if w is not None and w_true is not None]
    return {
        "sources_mcc": float(np.mean(z_scores)),
        "sources_mcc_min": float(np.min(z_scores)),
        "loadings_mcc": float(np.mean(w_scores)) if w_scores else np.nan,
    }


#: Sources MCC at or above which a model recovers the simulated sources (as :data:`IDENTIFIED_AGREEMENT`).
RECOVERED_MCC = IDENTIFIED_AGREEMENT
RECOVERS = "recovers the sources"
CLOSER = "closer to the sources than without it"
NOT_CLOSER = "no closer to the sources than without it"
NO_CLAIM = "no claim: too Gaussian to identify"


def truth_verdict(sources_mcc: float, worst_mcc: float, baseline_mcc: float | None) -> str:
    """Whether a model recovers simulated sources, against the unrestricted model's :func:`truth_recovery`.

    ``sources_mcc`` is the mean over the model's fits, ``worst_mcc`` its worst fit, ``baseline_mcc`` the
    unrestricted model's mean. ``recovers the sources``: even the worst fit is above the unrestricted mean by more
    than :data:`GROWTH_MARGIN`, and the mean is at least :data:`RECOVERED_MCC`; ``closer to the sources than without
    it``: the worst fit is above by that margin only; else ``no closer to the sources than without it`` (a better
    mean alone can be one lucky fit). For the unrestricted model itself (``baseline_mcc=None``): ``recovers the
    sources`` at a mean of at least :data:`RECOVERED_MCC`, else ``reference``.
    """
    if baseline_mcc is None:
        return RECOVERS if sources_mcc >= RECOVERED_MCC else "reference"
    if worst_mcc > baseline_mcc + GROWTH_MARGIN:
        return RECOVERS if sources_mcc >= RECOVERED_MCC else CLOSER
    return NOT_CLOSER


# ----- predictive cost ----------------------------------------------------------------------------------
def predictive_cost(
    restricted: Mapping[int, pd.DataFrame], unrestricted: Mapping[int, pd.DataFrame], margin: float = DEFAULT_MARGIN
) -> dict[str, float | str]:
    """Held-out ``log p(x)`` of the restricted model minus the unrestricted one's, per cell, with an interval.

    Each seed's restricted fit is paired with the unrestricted fit of the same seed on the same held-out cells,
    through :func:`countvae.diagnostics.analyses.predictive.equivalence_table` (paired differences). The estimate is
    the per-cell difference averaged over seeds and cells; its standard error combines the spread over cells of the
    seed-averaged per-cell differences (the table's paired ``se_diff_per_cell``) with the spread of the per-seed
    differences (``sd / sqrt(seeds)``).

    Verdict (a stand-in for a two one-sided tests procedure with margin ``margin``): ``equivalent`` when the 90%
    interval lies within ``(-margin, margin)``; else ``costs`` when the 95% interval lies below 0, ``gains`` when
    above; else ``undetermined``. The estimates are judged by the package's one rule
    (:func:`countvae.module.importance.estimate_reliability`): a cell is unreliable when its estimate is in any of the
    fits compared, and when more than :data:`~countvae.module.importance.MAX_UNRELIABLE_SHARE` of the cells are, the
    verdict is ``undetermined`` whatever the interval says (as :func:`~countvae.diagnostics.compare_models` does not
    rank such a candidate). Frames without k-hat are taken on trust.

    Returns
    -------
    dict
        ``difference_per_cell`` (negative: the restriction costs), ``se_per_cell``, ``ci95_low``, ``ci95_high``,
        ``margin``, ``verdict``, ``n_cells``, ``n_unreliable`` (cells unreliable in any fit compared), ``reliable``,
        ``n_seeds``, ``seed_differences`` (per-seed estimates, comma-separated).

    """
    seeds = [s for s in restricted if s in unrestricted]
    if not seeds:
        raise InvalidArgumentError("The restricted and unrestricted fits share no seed.")
    per_seed = [
        equivalence_table({"restricted": restricted[s], "unrestricted": unrestricted[s]}, margin).iloc[0] for s in seeds
    ]
    diffs = np.array([row["diff_per_cell"] for row in per_seed])

    def averaged(frames: Mapping[int, pd.DataFrame]) -> pd.DataFrame:
        lpd = np.mean([frames[s]["lpd"].to_numpy() for s in seeds], axis=0)
        mc = np.sqrt(np.mean([frames[s]["mc_se"].to_numpy() ** 2 for s in seeds], axis=0) / len(seeds))
        return pd.DataFrame({"lpd": lpd, "mc_se": mc}, index=frames[seeds[0]].index)

    pooled = equivalence_table(
        {"restricted": averaged(restricted), "unrestricted": averaged(unrestricted)}, margin
    ).iloc[0]
    seed_var = float(np.var(diffs, ddof=1)) / len(seeds) if len(seeds) > 1 else 0.0
    se = float(np.sqrt(pooled["se_diff_per_cell"] ** 2 + seed_var))
    diff = float(pooled["diff_per_cell"])
    n_unreliable = _unreliable_cells([*(restricted[s] for s in seeds), *(unrestricted[s] for s in seeds)])
    reliable = n_unreliable <= MAX_UNRELIABLE_SHARE * int(pooled["n_cells"])
    if not reliable:
        verdict = "undetermined"
    elif abs(diff) + Z90 * se < margin:
        verdict = "equivalent"
    elif diff + Z95 * se < 0:
        verdict = "costs"
    elif diff - Z95 * se > 0:
        verdict = "gains"
    else:
        verdict = "undetermined"
    return {
        "difference_per_cell": diff,
        "se_per_cell": se,
        "ci95_low": diff - Z95 * se,
        "ci95_high": diff + Z95 * se,
        "margin": float(margin),
        "verdict": verdict,
        "n_cells": int(pooled["n_cells"]),
        "n_unreliable": n_unreliable,
        "reliable": reliable,
        "n_seeds": len(seeds),
        "seed_differences": ", ".join(f"{d:.3g}" for d in diffs),
    }


def _unreliable_cells(frames: Sequence[pd.DataFrame]) -> int:
    """Cells whose ``log p(x)`` estimate is unreliable in any of the frames (frames without k-hat: none)."""
    flagged = np.zeros(len(frames[0]), dtype=bool)
    for frame in frames:
        judged = estimate_reliability(frame)
        if np.isfinite(judged.share):
            flagged |= np.asarray(judged.unreliable, dtype=bool)
    return int(flagged.sum())


# ----- gene programs ------------------------------------------------------------------------------------
def program_dimension_r2(z: np.ndarray, expression: np.ndarray, seed: int = 0, alpha: float = 1.0) -> float:
    """Held-out ``R^2`` of a latent coordinate from a gene set's expression (ridge, fit on one half of cells)."""
    fit, score = split_halves(len(z), seed)
    x = np.asarray(expression, dtype=np.float64)
    centre, scale = x[fit].mean(0), x[fit].std(0)
    scale[scale == 0] = 1.0
    x = (x - centre) / scale
    model = Ridge(alpha=alpha).fit(x[fit], z[fit])
    residual = z[score] - model.predict(x[score])
    total = np.sum((z[score] - z[score].mean()) ** 2)
    return float(1.0 - np.sum(residual**2) / total) if total > 0 else np.nan


def depth_residuals(expression: np.ndarray, library: np.ndarray) -> np.ndarray:
    """Expression with the sequencing depth regressed out, gene by gene.

    ``log1p`` normalized expression still rises with depth for lowly expressed genes (more of their zeros become
    counts), which makes every such gene co-vary with every other; the least-squares fit on ``1, log(library),
    log(library)^2`` per gene removes that shared trend.
    """
    x = np.asarray(expression, dtype=np.float64)
    log_library = np.log(np.asarray(library, dtype=np.float64))
    design = np.column_stack([np.ones_like(log_library), log_library, log_library**2])
    coefficients, *_ = np.linalg.lstsq(design, x, rcond=None)
    return x - design @ coefficients


def _top_eigenvalue(x: np.ndarray) -> float:
    return float(np.linalg.eigvalsh(np.corrcoef(x, rowvar=False))[-1])


def program_coherence(residuals: np.ndarray, columns: Sequence[int], n_sets: int = 100, seed: int = 0) -> float:
    """Whether a gene set co-varies across cells more than random gene sets of its size do: a ratio, 1 at par.

    The largest eigenvalue of the set's gene-gene correlation matrix over cells, divided by the 95th percentile of
    the same eigenvalue over ``n_sets`` random sets of as many genes drawn from all non-constant genes of
    ``residuals`` (cells x genes, e.g. :func:`depth_residuals`). Above 1: the set's genes move together more than
    95% of random sets (evidence for a shared program from the data alone, with no model); at or below 1: no more
    than chance genes. Random sets, rather than each gene permuted on its own, are the reference because
    normalization makes all genes co-vary a little (through the library composition), and a program must stand out
    from that. NaN when fewer than 2 of the set's genes vary, or when no random set of its size can be drawn from the
    other varying genes.
    """
    x = np.asarray(residuals, dtype=np.float64)
    varying = x.std(0) > 0
    cols = [c for c in columns if varying[c]]
    pool = np.flatnonzero(varying)
    if len(cols) < 2 or len(pool) <= len(cols):
        return np.nan
    rng = np.random.default_rng([int(seed), 0xC0E])
    null = [_top_eigenvalue(x[:, rng.choice(pool, len(cols), replace=False)]) for _ in range(n_sets)]
    return _top_eigenvalue(x[:, cols]) / float(np.quantile(null, 0.95))


def _program_verdict(coherence: float, per_fit: pd.DataFrame, min_credible_genes: int) -> tuple[bool, str]:
    """Whether a program is supported, and the first condition it fails.

    The reason counts the fits that fail: the table shows medians over fits, while the rule asks most fits.
    """
    unused = int((per_fit["activity"] < ACTIVE_VARIANCE).sum())
    few = int((per_fit["credible_genes"] < min_credible_genes).sum())
    n = len(per_fit)
    if not np.isfinite(coherence):
        return False, (
            "its coherence cannot be measured (fewer than 2 of its genes vary on these cells, or it holds every "
            "varying gene and leaves none to draw random sets from)"
        )
    if coherence <= 1.0:
        return False, "its genes co-vary no more than random genes do (no shared program in the data)"
    if unused >= n / 2:
        return False, (
            f"dimension unused in {unused} of {n} fits (variance of its posterior means below {ACTIVE_VARIANCE}; most "
            "fits must use it)"
        )
    if few >= n / 2:
        return False, (
            f"fewer than {min_credible_genes} program genes with a credibly non-zero loading in {few} of {n} fits "
            "(most fits must have them)"
        )
    return True, "used, on its own genes"


def program_support(
    latents: Mapping[str, np.ndarray],
    loadings: Mapping[str, pd.DataFrame],
    expression: np.ndarray,
    programs: Mapping[str, Sequence[str]],
    var_names: Sequence[str],
    library: np.ndarray | None = None,
    seed: int = 0,
    min_credible_genes: int = 2,
) -> pd.DataFrame:
    """Per gene program, over fits: whether its dimension is used, on its genes, and explained by them.

    Parameters
    ----------
    latents
        Fit name -> held-out latent coordinates (cells, programs), columns in the order of ``programs``.
    loadings
        Fit name -> :meth:`countvae.CountVAE.loadings_posterior` table.
    expression
        ``log1p`` normalized expression of the held-out cells, (cells, genes) in the order of ``var_names``.
    library
        Their total counts, or ``None`` (the expression is then used as it is for the coherence).
    programs
        ``{name: [genes]}``, the dimensions' programs.
    var_names
        Genes.
    seed
        Seed of the half split for ``set_r2``.
    min_credible_genes
        A program is supported when its genes co-vary across the held-out cells more than random gene sets do
        (:func:`program_coherence` of the depth residuals above 1: evidence from the data alone), its dimension is
        active (variance of its posterior means at least :data:`ACTIVE_VARIANCE`) in most fits, and at least this
        many of its genes have a credibly non-zero loading (90% interval excluding 0) in most fits. A dimension can be
        active on genes that do not co-vary (it then fits their noise); coherence tells the two apart.

    Returns
    -------
    pandas.DataFrame
        One row per program: ``program``, ``n_genes``, ``coherence`` (:func:`program_coherence` of its genes),
        ``activity`` (median over fits), ``in_program_share`` (loading energy on the program's genes),
        ``credible_genes``, ``set_r2`` (held-out R^2 of the dimension from its genes), ``supported`` and ``reason``.

    """
    index = {str(g): i for i, g in enumerate(var_names)}
    residuals = expression if library is None else depth_residuals(expression, library)
    rows = []
    for k, (name, genes) in enumerate(programs.items()):
        cols = [index[g] for g in genes]
        per_fit = []
        for fit, z in latents.items():
            table = loadings[fit]
            dim = table[table["dimension"] == name]
            inside = dim["in_program"].to_numpy()
            energy = dim["mean"].to_numpy() ** 2
            per_fit.append(
                {
                    "activity": float(np.var(z[:, k])),
                    "in_program_share": float(energy[inside].sum() / energy.sum()) if energy.sum() > 0 else np.nan,
                    "credible_genes": int(dim.loc[inside, "nonzero"].sum()),
                    "set_r2": program_dimension_r2(z[:, k], expression[:, cols], seed),
                }
            )
        frame = pd.DataFrame(per_fit)
        coherence = program_coherence(residuals, cols, seed=seed)
        supported, reason = _program_verdict(coherence, frame, min_credible_genes)
        rows.append(
            {
                "program": name,
                "n_genes": len(genes),
                "coherence": coherence,
                "activity": float(frame["activity"].median()),
                "in_program_share": float(frame["in_program_share"].median()),
                "credible_genes": float(frame["credible_genes"].median()),
                "set_r2": float(frame["set_r2"].median()),
                "supported": supported,
                "reason": reason,
            }
        )
    return pd.DataFrame(rows)
