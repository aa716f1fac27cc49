"""Refuse to compare held-out ``log p(x)`` values that are different quantities.

Fits whose frames name different quantities (given the observed library size, or with a latent library integrated
out: :mod:`countvae.diagnostics.fitting.lpd_quantity`) are not compared, as their difference says nothing about which
model fits better. A frame that does not name its quantity (no ``attrs["quantity"]``, e.g. built by another tool) is
compared on the caller's word.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from countvae.diagnostics.fitting.lpd_quantity import QUANTITY_ATTR
from countvae.errors import InvalidArgumentError


def lpd_quantity(frame: pd.DataFrame) -> str | None:
    """The quantity a per-cell log-predictive-density frame estimates, or ``None`` if it does not say."""
    value = frame.attrs.get(QUANTITY_ATTR)
    return None if value is None else str(value)


def require_same_quantity(lpds: Mapping[str, pd.DataFrame]) -> str | None:
    """The common quantity of several fits' held-out ``log p(x)``; raise if they differ.

    Parameters
    ----------
    lpds
        Fit name -> per-cell frame (as returned by ``FittedModel.log_predictive_density``).

    Returns
    -------
    str or None
        The quantity all frames that name one share (``None`` if none does).

    Raises
    ------
    InvalidArgumentError
        If two fits name different quantities.

    """
    named = {name: q for name, frame in lpds.items() if (q := lpd_quantity(frame)) is not None}
    kinds = sorted(set(named.values()))
    if len(kinds) > 1:
        listing = "; ".join(f"{name!r}: {q}" for name, q in named.items())
        raise InvalidArgumentError(
            f"These fits' held-out log p(x) are different quantities and cannot be compared ({listing}). "
            "For scvi-tools models, fit them all with the same use_observed_lib_size; countvae models "
            "condition on the observed library size (use_observed_lib_size=True)."
        )
    return kinds[0] if kinds else None
