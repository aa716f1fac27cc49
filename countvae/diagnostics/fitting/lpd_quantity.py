"""Which ``log p(x)`` a fitted model's held-out log predictive density is.

Two models can both report "held-out log p(x)" and estimate different quantities. countvae's models, and scvi-tools
models with ``use_observed_lib_size=True`` (the SCVI default), condition on each cell's observed library size:
``log p(x | observed library size)``. An scvi-tools model with a latent library size (LinearSCVI's default) has a
prior on the log library, and its ``log p(x)`` integrates the library out, adding the density of the observed total
count. The two kinds differ by that term, not by how well the models fit, so they must not be compared.

:meth:`FittedModel.log_predictive_density` frames carry the quantity in ``frame.attrs["quantity"]`` (an attribute,
not a column, so the values stay numeric).
"""

from __future__ import annotations

import pandas as pd

#: Key of ``DataFrame.attrs`` that names the quantity a log-predictive-density frame estimates.
QUANTITY_ATTR = "quantity"

#: ``log p(x | l)`` with ``l`` the cell's observed total count (countvae; scvi-tools with an observed library).
GIVEN_OBSERVED_LIBRARY = "log p(x | observed library size)"

#: ``log p(x)`` with the (latent) library size integrated against its prior (scvi-tools' latent library).
LIBRARY_INTEGRATED = "log p(x), library size integrated out"


def with_quantity(frame: pd.DataFrame, quantity: str) -> pd.DataFrame:
    """``frame`` with ``attrs[QUANTITY_ATTR]`` set to ``quantity`` (the frame itself, returned for chaining)."""
    frame.attrs[QUANTITY_ATTR] = quantity
    return frame
