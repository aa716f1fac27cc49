"""Step 3 of the report: verdicts, decided from the analyses' numbers, intervals and thresholds alone.

Every rule that turns a number into a claim about the fits lives here; ``docs/concepts/report-rows.md`` ("How a verdict
is decided") states them for readers. In short: a row whose score has the interval ``[low, high]`` (level
``1 - 2 alpha``) ``agree``s when the whole interval meets its threshold, ``differ``s when none of it does, and is
``undetermined`` otherwise (with why, and about how many cells would decide it, since the width falls like
``1 / sqrt(cells)``); coordinate rows ``agree after alignment`` when only the score after the orthogonal Procrustes map
of each pair agrees. Rows with preconditions of their own: :data:`MIN_CELLS` (posterior predictive statistics, k-NN
graph), :func:`predictive_verdict` (held-out log p(x): the equivalence test, undetermined while the estimator is
unreliable) and :func:`judge_components` with :func:`ica_row_judgement` (ICA coordinates, per component).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.invariants import QUANTITY_BY_NAME, Threshold
from countvae.diagnostics.analyses.predictive import EQUIVALENT, MAX_BIAS_SHARE, NOT_EQUIVALENT, UNDETERMINED
from countvae.module.importance import KHAT_THRESHOLD, MAX_UNRELIABLE_SHARE

AGREE, ALIGNED, DIFFER, NOT_MEASURED = "agree", "agree after alignment", "differ", "not measured"
#: Every verdict of the invariants table, from best to worst (``not measured`` last).
VERDICTS = (AGREE, ALIGNED, DIFFER, UNDETERMINED, NOT_MEASURED)
#: Not measured (the predictive equivalence verdict when log p(x) is not available).
NOT_TESTED = "not tested"
#: Columns the verdicts step adds to the invariants table.
VERDICT_COLUMNS = ("verdict", "reason", "remedy", "report_instead")
#: The invariants row that takes the predictive-equivalence verdict.
LPD_QUANTITY = "held-out log p(x)"
#: The invariants row that takes the ICA components' verdict.
ICA_QUANTITY = "ICA coordinates"


@dataclass(frozen=True)
class Judgement:
    """A verdict with, for ``undetermined`` (and ``differ`` where it helps), why and what would decide it."""

    verdict: str
    reason: str = ""
    remedy: str = ""


def interval_verdict(threshold: Threshold, low: float, high: float) -> str:
    """``agree``, ``differ`` or ``undetermined`` from an interval and a threshold (see the module docstring)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return UNDETERMINED
    if threshold.higher_is_better:
        return AGREE if low >= threshold.value else DIFFER if high < threshold.value else UNDETERMINED
    return AGREE if high < threshold.value else DIFFER if low >= threshold.value else UNDETERMINED


def cells_needed(value: float, low: float, high: float, threshold: float, n_cells: int) -> int | None:
    """Cells at which the interval, narrowing like ``1 / sqrt(cells)``, would clear ``threshold`` at this score.

    ``None`` when the score sits on the threshold (no number of cells decides it) or nothing is known.
    """
    if not all(np.isfinite(v) for v in (value, low, high)) or n_cells <= 0:
        return None
    gap = abs(value - threshold)
    facing = (value - low) if value >= threshold else (high - value)
    if gap <= 1e-12 * max(1.0, abs(threshold)):
        return None
    return _ceil(n_cells * (facing / gap) ** 2)


def _ceil(value: float) -> int:
    """``ceil`` that does not round 400.00000000000006 up to 401."""
    return int(math.ceil(value - 1e-9 * max(1.0, abs(value))))


def _more_cells(needed: int | None, n_cells: int, setting: str, cap: int | None = None) -> str:
    if needed is None:
        return "more seeds or a closer look: the score sits on the threshold, so more cells alone will not decide it"
    return f"about {needed:,} cells instead of {n_cells:,}{_how_more_cells(setting, n_cells, cap, needed)}"


#: How an analyst gets more held-out cells, in the library's and the command's terms.
HOLD_OUT_MORE = "hold out that many cells: a larger heldout_fraction, --heldout-fraction on the command line"


def _how_more_cells(setting: str, n_cells: int, cap: int | None, needed: int | None = None) -> str:
    """How to get ``needed`` held-out cells: hold out more, and raise the report setting ``setting`` if it caps them.

    The setting is named where its value ``cap`` capped ``n_cells`` or is below ``needed``: holding out more cells
    alone would compare no more than ``cap``.

    The report settings are no options of ``countvae diagnose`` (only ``report(...)`` and
    ``diagnose(report_kwargs=...)`` in Python set them), so the text says so; ``heldout_fraction`` is named with its
    option, as the same report is read after the library and after the command.
    """
    if not setting:
        return ""
    held_out = HOLD_OUT_MORE
    capped = cap is not None and n_cells >= cap
    if capped or (cap is not None and needed is not None and needed > cap):
        # the cap alone may not do where it capped them: the held-out cells may be no more than it
        where = ", where fewer are held out" if capped else ""
        return (
            f" (the report setting {setting} {'capped' if capped else 'caps'} them at {cap:,}: raise it in Python, "
            f"report(fits, {setting}=N) or diagnose(report_kwargs={{'{setting}': N}}), countvae diagnose has no "
            f"option for it; and {held_out}{where})"
        )
    return f" ({held_out})"


def _straddle(low: float, high: float, threshold: Threshold) -> str:
    return f"its interval {low:.3g} to {high:.3g} contains the threshold ({threshold.comparison} {threshold.value:g})"


# ----- the invariants rows ------------------------------------------------------------------------------
TOO_FEW_CELLS_REASON = "too few held-out cells"


@dataclass(frozen=True)
class CellsPrecondition:
    """The held-out cells a row needs before some of its verdicts can be trusted, and why."""

    minimum: int
    guards: tuple[str, ...]
    why: str


#: Rows whose interval does not cover what a small sample of cells does to their score. On 40 held-out cells
#: they gave confident verdicts that the same fits contradict on all their 1,000 held-out cells
#: (benchmarks/RESULTS.md, section calibration, where the minimums are justified from subsets of 40 to 1,000
#: cells of the same fits).
MIN_CELLS: dict[str, CellsPrecondition] = {
    "posterior predictive statistics": CellsPrecondition(
        150,
        (AGREE, DIFFER),
        "its interval resamples genes, not cells, and on few cells the per-gene statistics move with the cells "
        "far more than it says",
    ),
    "k-NN graph": CellsPrecondition(
        300,
        (AGREE,),
        "with k neighbours among few cells a neighbourhood is a large share of all cells, so two graphs overlap "
        "more than the same seeds' graphs on more cells (the overlap keeps falling as cells are added, so a "
        "'differ' stands and an 'agree' speaks for graphs of about this many cells); counted on the graph's "
        "cells, which include the fit cells when the report has them",
    ),
}


#: Held-out cells per latent dimension an "agree after alignment" needs. The orthogonal map is fitted on the cells it
#: is scored on, and the bootstrap's correction for that optimism was checked at 10 per dimension (100 cells in 10
#: dimensions, tests/diagnostics/analyses/test_interval_coverage.py; the calibrated regimes have 14 or more); with 1-2
#: per dimension it removed 0.012 of an optimism of about 0.1, and the verdict was contradicted by the same map
#: fitted on other cells.
MIN_ALIGNED_CELLS_PER_DIMENSION = 10


def too_few_cells(
    quantity: str,
    n_cells: int,
    verdict: str,
    setting: str = "",
    cap: int | None = None,
    in_graph: bool = False,
    graph_setting: int | None = None,
) -> Judgement | None:
    """``undetermined`` if ``verdict`` needs more held-out cells than ``n_cells`` (:data:`MIN_CELLS`), else ``None``.

    ``setting`` is the report setting that caps the row's cells and ``cap`` its value: the remedy names it only where
    it capped them or the minimum is above it. ``in_graph``: ``n_cells`` counts the k-NN graph's held-out and fit cells
    together, which only more cells in the data raise (not a larger ``heldout_fraction``, which moves fit cells to
    the held-out ones, nor the cap, which picks the held-out cells compared among the graph's), unless the report
    setting ``knn_graph_cells`` gave the graph's size (``graph_setting``, its value): then raising it does.
    """
    rule = MIN_CELLS.get(quantity)
    if rule is None or n_cells >= rule.minimum or verdict not in rule.guards:
        return None
    if in_graph and graph_setting is not None:
        return Judgement(
            UNDETERMINED,
            f"too few cells in the graph (n = {n_cells:,}, the report setting knn_graph_cells, < {rule.minimum:,}) "
            f"to say '{verdict}': {rule.why}",
            f"raise knn_graph_cells to >= {rule.minimum:,} in Python (report(fits, knn_graph_cells=N) or "
            "diagnose(report_kwargs={'knn_graph_cells': N})), or leave it unset: the graph then holds every held-out "
            "and fit cell",
        )
    if in_graph:
        return Judgement(
            UNDETERMINED,
            f"too few cells in the graph (n = {n_cells:,} held-out and fit cells together < {rule.minimum:,}) to "
            f"say '{verdict}': {rule.why}",
            f"use >= {rule.minimum:,} cells in the graph: more cells in the data (the graph holds every held-out and "
            "fit cell, so a larger heldout_fraction or max_knn_cells adds none)",
        )
    return Judgement(
        UNDETERMINED,
        f"{TOO_FEW_CELLS_REASON} (n = {n_cells:,} < {rule.minimum:,}) to say '{verdict}': {rule.why}",
        f"use >= {rule.minimum:,} held-out cells{_how_more_cells(setting, n_cells, cap, rule.minimum)}",
    )


def judge_row(row: pd.Series, caps: Mapping[str, int] | None = None) -> Judgement:
    """The verdict of one row from its numbers (rows with preconditions are judged by their own functions).

    ``caps``: the report settings that cap the rows' cells, by name (a remedy names one where it capped them or the
    cells needed exceed it).
    """
    if not np.isfinite(row["agreement"]):
        return Judgement(NOT_MEASURED, "not available for these fits")
    setting = str(row["cells_setting"])
    cap = (caps or {}).get(setting)
    judged = _judge_by_interval(row, cap)
    n_cells, in_graph = _precondition_cells(row)
    graph_setting = (caps or {}).get("knn_graph_cells")
    few = too_few_cells(str(row["quantity"]), n_cells, judged.verdict, setting, cap, in_graph, graph_setting)
    return judged if few is None else few


def _precondition_cells(row: pd.Series) -> tuple[int, bool]:
    """The cells a row's precondition counts, and whether they are its graph's (the k-NN row's, with the fit cells)."""
    graph = row.get("graph_cells", np.nan)
    if pd.notna(graph) and graph > row["n_cells"]:
        return int(graph), True
    return int(row["n_cells"]), False


def _judge_by_interval(row: pd.Series, cap: int | None = None) -> Judgement:
    threshold = Threshold(row["threshold"], row["comparison"])
    n, setting = int(row["n_cells"]), str(row["cells_setting"])
    if not (np.isfinite(row["low"]) and np.isfinite(row["high"])):
        return Judgement(UNDETERMINED, "no interval: the inputs cannot be resampled", "pass what the row needs")
    verdict = interval_verdict(threshold, row["low"], row["high"])
    if verdict == AGREE:
        return Judgement(AGREE)
    # A coordinate row that does not agree as it is is judged by its score after alignment.
    prefix, which = "", ""
    if np.isfinite(row["aligned_agreement"]):
        prefix, which = "after alignment, ", "aligned_"
        verdict = interval_verdict(threshold, row["aligned_low"], row["aligned_high"])
        if verdict == AGREE:
            # only where the map is fitted on the very cells the row is scored on (not the loadings')
            if QUANTITY_BY_NAME[row["quantity"]].cells != "heldout":
                return Judgement(ALIGNED)
            return _aligned_with_enough_cells(n, row.get("n_latent", np.nan), setting, cap)
    if verdict == DIFFER:
        return Judgement(DIFFER)
    low, high = row[f"{which}low"], row[f"{which}high"]
    if not QUANTITY_BY_NAME[row["quantity"]].narrows_with_cells:
        remedy = (
            "more cells will not narrow this interval (it resamples genes, the model's own); more seeds show "
            "whether the fits agree, and the per-gene statistics where they differ"
        )
        return Judgement(UNDETERMINED, prefix + _straddle(low, high, threshold), remedy)
    needed = cells_needed(row[f"{which}agreement"], low, high, threshold.value, n)
    return Judgement(UNDETERMINED, prefix + _straddle(low, high, threshold), _more_cells(needed, n, setting, cap))


def _aligned_with_enough_cells(n_cells: int, n_latent: float, setting: str, cap: int | None = None) -> Judgement:
    """``agree after alignment``, or undetermined on too few cells per latent dimension.

    Fewer than :data:`MIN_ALIGNED_CELLS_PER_DIMENSION` cells per dimension; an unknown width (reports saved before it
    was recorded) is not judged.
    """
    needed = MIN_ALIGNED_CELLS_PER_DIMENSION * int(n_latent) if np.isfinite(n_latent) else 0
    if n_cells >= needed:
        return Judgement(ALIGNED)
    # these rows are on every held-out cell unless a setting caps them: holding out more is the way
    how = _how_more_cells(setting, n_cells, cap, needed) if setting else f" ({HOLD_OUT_MORE})"
    return Judgement(
        UNDETERMINED,
        f"{TOO_FEW_CELLS_REASON} (n = {n_cells:,} < {needed:,}, {MIN_ALIGNED_CELLS_PER_DIMENSION} per latent "
        f"dimension) to say '{ALIGNED}': the orthogonal map is fitted on the cells it is scored on, and with so few "
        "cells per dimension it agrees with them better than the correction for that can tell",
        f"use >= {needed:,} held-out cells{how}, or fewer latent dimensions",
    )


def judge_invariants(
    numbers: pd.DataFrame, decided: Mapping[str, Judgement] | None = None, caps: Mapping[str, int] | None = None
) -> pd.DataFrame:
    """Add :data:`VERDICT_COLUMNS` to the table of :func:`~countvae.diagnostics.analyses.invariants.invariants_table`.

    Parameters
    ----------
    numbers
        The invariants table (numbers, intervals, thresholds).
    decided
        Quantity -> its verdict where a report section decides the row by a rule of its own (the predictive
        section the held-out log p(x) row, with its precondition on the estimator; the ICA components section
        the ICA row); every other row is judged from its interval.
    caps
        The report settings that cap the rows' cells (``cells_setting``), by name: an undetermined row's remedy
        names its setting where it capped the row's cells or the cells needed exceed it (without ``caps``, never).

    """
    decided = decided or {}
    judged = [decided.get(row["quantity"]) or judge_row(row, caps) for _, row in numbers.iterrows()]
    out = _with_judgements(numbers, judged)
    out["report_instead"] = [
        _report_instead(name, j.verdict) for name, j in zip(numbers["quantity"], judged, strict=True)
    ]
    return out


def _report_instead(name: str, verdict: str) -> str:
    q = QUANTITY_BY_NAME[name]
    return {
        AGREE: q.report_when_agree,
        ALIGNED: q.report_when_aligned,
        DIFFER: q.report_when_differ,
        UNDETERMINED: f"until decided: {q.report_when_differ}",
        NOT_MEASURED: "not available for these fits",
    }[verdict]


def quantities_by_verdict(invariants: pd.DataFrame) -> dict[str, list[str]]:
    """The quantities of each verdict, in table order."""
    return {v: invariants.loc[invariants["verdict"] == v, "quantity"].tolist() for v in VERDICTS}


# ----- ICA components -----------------------------------------------------------------------------------
GAUSSIAN_REASON = "too close to Gaussian to be identified"
FEW_CELLS_REASON = "does not reproduce even within one seed (too few cells to fix the axis)"
TOO_FEW_REASON = "too few cells to estimate ICA"
#: How each reason reads after the components it concerns: (one component, several).
_PREDICATES = {
    GAUSSIAN_REASON: (f"is {GAUSSIAN_REASON}", f"are {GAUSSIAN_REASON}"),
    FEW_CELLS_REASON: (FEW_CELLS_REASON, "do not" + FEW_CELLS_REASON.removeprefix("does not")),
}
#: Cells per half and per latent dimension below which no ICA component is judged (its estimation error,
#: which the intervals over matching cells do not cover, is then comparable to the threshold's margin).
MIN_ICA_CELLS_PER_DIMENSION = 100


def judge_components(table: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Add ``verdict``, ``reason`` and ``remedy`` to each ICA component.

    ``undetermined`` when each half of the estimation cells holds fewer than :data:`MIN_ICA_CELLS_PER_DIMENSION`
    cells per dimension, when the component is too close to Gaussian, or when it does not reproduce within one
    seed (split-half match below ``threshold``); otherwise decided by the interval of its match corrected for the
    ICA's own estimation error (``corrected_low``-``corrected_high``, see :mod:`..analyses.components`).
    """
    min_cells = MIN_ICA_CELLS_PER_DIMENSION * len(table)
    return _with_judgements(
        table, [_judge_component(row, threshold, min_cells, len(table)) for row in table.itertuples(index=False)]
    )


def _judge_component(row: Any, threshold: float, min_cells: int, n_dims: int) -> Judgement:
    if int(row.n_estimation_cells) < min_cells:
        return Judgement(
            UNDETERMINED,
            f"{TOO_FEW_REASON}: {int(row.n_estimation_cells):,} per half ({row.estimated_on}) for {n_dims} dimensions",
            f"at least {min_cells:,} cells per half ({2 * min_cells:,} fit cells, or held-out cells without them)",
        )
    if bool(row.gaussian):
        return Judgement(
            UNDETERMINED,
            GAUSSIAN_REASON,
            "none: a Gaussian direction has no preferred axis; report the span of these components",
        )
    if row.same_fit_match < threshold:
        return Judgement(
            UNDETERMINED,
            f"{FEW_CELLS_REASON}: split-half match {row.same_fit_match:.2f} < {threshold:g}",
            f"more cells to estimate ICA on (now {int(row.n_estimation_cells):,} per half, {row.estimated_on})",
        )
    rule = Threshold(threshold, ">=")
    low, high = row.corrected_low, row.corrected_high
    verdict = interval_verdict(rule, low, high)
    if verdict == UNDETERMINED:
        needed = cells_needed(row.corrected_match, low, high, threshold, int(row.n_matching_cells))
        return Judgement(UNDETERMINED, _straddle(low, high, rule), _more_cells(needed, int(row.n_matching_cells), ""))
    if verdict == DIFFER:
        return Judgement(
            DIFFER,
            f"reproduces within one seed ({row.same_fit_match:.2f}) but not across seeds "
            f"({row.worst_match:.2f}, {row.corrected_match:.2f} corrected for the ICA's estimation): "
            "the seeds' solutions differ along it",
        )
    return Judgement(AGREE)


def _with_judgements(frame: pd.DataFrame, judged: list[Judgement]) -> pd.DataFrame:
    """A copy of ``frame`` with the columns ``verdict``, ``reason`` and ``remedy`` of ``judged`` (one per row)."""
    out = frame.copy()
    out["verdict"] = [j.verdict for j in judged]
    out["reason"] = [j.reason for j in judged]
    out["remedy"] = [j.remedy for j in judged]
    return out


def reason_in_number(reason: str, n_components: int) -> str:
    """``reason`` with its verb in the number of ``n_components`` (``does not reproduce`` / ``do not reproduce``)."""
    if n_components > 1 and reason == FEW_CELLS_REASON:
        return _PREDICATES[reason][1]
    return reason


def components_clause(names: list[str], reason: str) -> str:
    """The components followed by why they are undetermined, verb agreeing with their number."""
    listed = ", ".join(names)
    forms = _PREDICATES.get(reason)
    if forms is None:
        return f"{listed}: {reason}"
    return f"{listed} {forms[len(names) > 1]}"


def ica_row_judgement(components: pd.DataFrame) -> Judgement:
    """The ICA row's verdict from the judged components: agree if all agree, differ if one differs."""
    if not len(components):
        return Judgement(NOT_MEASURED, "ICA was not part of this report")
    verdicts = components["verdict"]
    if (verdicts == AGREE).all():
        return Judgement(AGREE)
    if (verdicts == DIFFER).any():
        bad = components.loc[verdicts == DIFFER, "component"].tolist()
        if len(bad) == 1:
            return Judgement(DIFFER, f"{bad[0]} differs between seeds (it reproduces within one seed)")
        return Judgement(DIFFER, f"{', '.join(bad)} differ between seeds (each reproduces within one seed)")
    groups, remedies = undetermined_by_reason(components)
    reason = "; ".join(components_clause(names, why) for why, names in groups.items())
    return Judgement(UNDETERMINED, reason, "; ".join(dict.fromkeys(remedies.values())))


def undetermined_by_reason(components: pd.DataFrame) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The undetermined components by their reason (the text before any ``:``), and each reason's first remedy."""
    groups: dict[str, list[str]] = {}
    remedies: dict[str, str] = {}
    for row in components[components["verdict"] == UNDETERMINED].itertuples(index=False):
        key = row.reason.split(":")[0]
        groups.setdefault(key, []).append(row.component)
        remedies.setdefault(key, row.remedy)
    return groups, remedies


# ----- predictive equivalence ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PredictiveVerdict:
    """Whether the fits are predictively equivalent: the decision, why, and the numbers behind it.

    Attributes
    ----------
    state
        ``"equivalent"``, ``"not equivalent"``, ``"undetermined"`` or ``"not tested"``.
    reason, remedy
        Why it is undetermined (or not tested), and what would decide it.
    pairs
        The equivalence table (one row per pair), or ``None``.
    reliability
        The estimator's reliability per fit, or ``None``.
    margin, gain, margin_fraction
        The margin (nats per cell), the mean per-cell gain over the no-latent baseline, and the margin's share of it.
    alpha
        Error per side of the tests (for all pairs together).

    """

    state: str
    reason: str = ""
    remedy: str = ""
    pairs: pd.DataFrame | None = None
    reliability: pd.DataFrame | None = None
    margin: float = np.nan
    gain: float = np.nan
    margin_fraction: float = np.nan
    alpha: float = 0.05
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def equivalent(self) -> bool | None:
        """``True`` / ``False`` when decided, ``None`` when undetermined or not tested."""
        return {EQUIVALENT: True, NOT_EQUIVALENT: False}.get(self.state)

    @property
    def worst(self) -> pd.Series | None:
        """The pair with the largest ``|diff_per_cell|``."""
        if self.pairs is None or not len(self.pairs):
            return None
        return self.pairs.loc[self.pairs["diff_per_cell"].abs().idxmax()]

    def as_row_judgement(self) -> Judgement:
        """The held-out log p(x) row's verdict."""
        verdict = {EQUIVALENT: AGREE, NOT_EQUIVALENT: DIFFER, UNDETERMINED: UNDETERMINED}.get(self.state, NOT_MEASURED)
        return Judgement(verdict, self.reason, self.remedy)


def predictive_verdict(
    pairs: pd.DataFrame | None,
    reliability: pd.DataFrame | None = None,
    margin: float = np.nan,
    gain: float = np.nan,
    margin_fraction: float = np.nan,
    alpha: float = 0.05,
    n_lpd_samples: int | None = None,
    max_lpd_cells: int | None = None,
) -> PredictiveVerdict:
    """Decide predictive equivalence from the equivalence table and the estimator's reliability.

    See :mod:`countvae.diagnostics.analyses.predictive` for the test; the decision is ``equivalent`` when every pair
    is, ``not equivalent`` when one pair is, and ``undetermined`` otherwise, or whatever the pairs when the estimates
    are unreliable or no margin can be stated. ``max_lpd_cells``, the report setting that caps the pairs' cells, is
    named in an undetermined verdict's remedy where it capped them or the cells needed exceed it.
    """
    if pairs is None:
        return PredictiveVerdict(NOT_TESTED, "held-out log p(x) is not available for these fits")
    common = dict(
        pairs=pairs,
        reliability=reliability,
        margin=margin,
        gain=gain,
        margin_fraction=margin_fraction,
        alpha=alpha,
        counts={d: int((pairs["decision"] == d).sum()) for d in (EQUIVALENT, NOT_EQUIVALENT, UNDETERMINED)},
    )
    if not np.isfinite(margin):
        if np.isfinite(gain):
            return PredictiveVerdict(
                UNDETERMINED,
                f"no margin can be stated: the fits' held-out log p(x) is {gain:.3g} nats per cell above a model "
                "without latent variables, so they explain nothing beyond it",
                "check the fits (training, likelihood) before comparing them",
                **common,
            )
        return PredictiveVerdict(
            UNDETERMINED,
            "no margin: the no-latent baseline could not be evaluated on these cells",
            "pass held-out cells with counts for the fits' genes",
            **common,
        )
    if reliability is not None and not reliability["reliable"].all():
        return PredictiveVerdict(UNDETERMINED, *_unreliable(reliability, margin, n_lpd_samples), **common)
    decisions = pairs["decision"]
    if (decisions == NOT_EQUIVALENT).any():
        return PredictiveVerdict(NOT_EQUIVALENT, **common)
    if (decisions == EQUIVALENT).all():
        return PredictiveVerdict(EQUIVALENT, **common)
    return PredictiveVerdict(UNDETERMINED, *_undecided_pairs(pairs, margin, max_lpd_cells), **common)


def _unreliable(reliability: pd.DataFrame, margin: float, n_lpd_samples: int | None) -> tuple[str, str]:
    problems = []
    for row in reliability[~reliability["reliable"]].itertuples(index=False):
        if not np.isfinite(row.share_khat_above):
            problems.append(f"{row.fit}: no Pareto k-hat to check the estimates against")
        elif row.share_khat_above > MAX_UNRELIABLE_SHARE:
            problems.append(
                f"{row.fit}: unreliable (Pareto k-hat above {KHAT_THRESHOLD:g}) "
                f"on {100 * row.share_khat_above:.0f}% of cells"
            )
        if not np.isfinite(row.mc_bias_bound):
            problems.append(f"{row.fit}: no Monte Carlo standard error on any cell")
        elif row.mc_bias_bound > MAX_BIAS_SHARE * margin:
            problems.append(
                f"{row.fit}: Monte Carlo bias up to {row.mc_bias_bound:.2g} nats per cell, more than "
                f"{MAX_BIAS_SHARE:g} of the margin ({margin:.2g})"
            )
    samples = f", now {n_lpd_samples}" if n_lpd_samples else ""
    return (
        "unreliable log p(x): " + "; ".join(problems),
        f"more importance samples per cell (n_lpd_samples{samples}) or an estimator whose proposal fits each "
        "cell's posterior",
    )


def _undecided_pairs(pairs: pd.DataFrame, margin: float, cap: int | None) -> tuple[str, str]:
    undecided = pairs[pairs["decision"] == UNDETERMINED]
    n = int(pairs["n_cells"].iloc[0])
    needed = []
    for row in undecided.itertuples(index=False):
        half = row.ci_high - row.diff_per_cell
        gap = abs(margin - abs(row.diff_per_cell))
        needed.append(_ceil(n * (half / gap) ** 2) if gap > 1e-12 else None)
    intervals = "the interval of 1" if len(undecided) == 1 else f"the intervals of {len(undecided)}"
    contain = "contains" if len(undecided) == 1 else "contain"
    reason = f"{intervals} of {len(pairs)} pairs {contain} the margin (+-{margin:.3g} nats per cell)"
    if any(v is None for v in needed):
        return reason, "more seeds or a closer look: a difference sits on the margin, so more cells will not decide it"
    how = _how_more_cells("max_lpd_cells", n, cap, max(needed))
    return reason, f"about {max(needed):,} held-out cells instead of {n:,}{how}"
