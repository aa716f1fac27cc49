"""Step 3 of the report: verdicts, decided from the analyses' numbers and thresholds alone.

Every rule that turns a number into a claim about the fits lives here, so that
changing how verdicts are made (intervals, calibration) touches this module only.

Invariants
----------
``stable``
    The worst pair of seeds meets the quantity's threshold as the quantity stands.
``stable up to rotation``
    It does not, but it does after the orthogonal alignment: the seeds agree
    on the thing itself, not on its coordinates.
``unstable``
    It does not, even after alignment. For a quantity that is invariant in
    theory this means the seeds reached different optima (or did not
    converge), not that they picked different coordinates.
``not measured``
    The fits' API does not provide what the quantity needs.

Predictive equivalence
----------------------
The fits are predictively equivalent when no pair differs in held-out log p(x)
by :data:`~countvae.diagnostics.analyses.predictive.EQUIVALENCE_Z` paired
standard errors or more (the ``equivalent`` column of the pairwise table).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.invariants import QUANTITY_BY_NAME, Threshold
from countvae.diagnostics.analyses.predictive import EQUIVALENCE_Z

STABLE, ROTATION, UNSTABLE, NOT_MEASURED = "stable", "stable up to rotation", "unstable", "not measured"
#: Every verdict of the invariants table, from best to worst (``not measured`` last).
VERDICTS = (STABLE, ROTATION, UNSTABLE, NOT_MEASURED)


def invariant_verdict(threshold: Threshold, agreement: float, aligned_agreement: float) -> str:
    """The verdict of one quantity from its worst-pair agreement, before and after alignment."""
    if not np.isfinite(agreement):
        return NOT_MEASURED
    if threshold.met(agreement):
        return STABLE
    if threshold.met(aligned_agreement):
        return ROTATION
    return UNSTABLE


def judge_invariants(numbers: pd.DataFrame) -> pd.DataFrame:
    """Add ``verdict`` and ``report_instead`` to the table of :func:`.invariants.invariants_table`.

    Each row's verdict comes from its ``agreement`` and ``aligned_agreement``
    against its ``threshold`` and ``comparison``; what to report instead comes
    from the quantity of that name (:data:`~countvae.diagnostics.analyses.invariants.QUANTITY_BY_NAME`).
    """
    out = numbers.copy()
    verdicts, instead = [], []
    for row in numbers.itertuples(index=False):
        verdict = invariant_verdict(Threshold(row.threshold, row.comparison), row.agreement, row.aligned_agreement)
        quantity = QUANTITY_BY_NAME[row.quantity]
        verdicts.append(verdict)
        instead.append(
            {
                STABLE: quantity.report_when_stable,
                ROTATION: quantity.report_when_rotation,
                UNSTABLE: quantity.report_when_unstable,
                NOT_MEASURED: "not available for these fits",
            }[verdict]
        )
    out["verdict"] = verdicts
    out["report_instead"] = instead
    return out


def quantities_by_verdict(invariants: pd.DataFrame) -> dict[str, list[str]]:
    """The quantities of each verdict, in table order."""
    return {v: invariants.loc[invariants["verdict"] == v, "quantity"].tolist() for v in VERDICTS}


@dataclass(frozen=True)
class PredictiveVerdict:
    """Whether the fits are predictively equivalent, and the pair that differs most.

    Attributes
    ----------
    equivalent
        ``True``/``False``, or ``None`` when log p(x) is not available for every fit.
    n_pairs, n_different
        Pairs compared, and pairs that differ by at least ``z_threshold`` paired standard errors.
    worst
        The row of the pairwise table with the largest ``|z|`` (``None`` when not measured).
    z_threshold
        The threshold, in paired standard errors.

    """

    equivalent: bool | None
    n_pairs: int = 0
    n_different: int = 0
    worst: pd.Series | None = None
    z_threshold: float = EQUIVALENCE_Z


def predictive_verdict(pairs: pd.DataFrame | None, z: float = EQUIVALENCE_Z) -> PredictiveVerdict:
    """Decide predictive equivalence from :func:`~countvae.diagnostics.analyses.predictive.pairwise_table`."""
    if pairs is None:
        return PredictiveVerdict(equivalent=None, z_threshold=z)
    return PredictiveVerdict(
        equivalent=bool(pairs["equivalent"].all()),
        n_pairs=len(pairs),
        n_different=int((~pairs["equivalent"]).sum()),
        worst=pairs.loc[pairs["z"].abs().idxmax()],
        z_threshold=z,
    )
