"""countvae: probabilistic count VAEs on Pyro, and measurements of what their outputs identify.

Entry points: :class:`CountVAE` (an scvi-tools-style model), :mod:`countvae.invariance` (orthogonal
reparameterizations and numerical checks that ``p(x)`` is unchanged by them), :mod:`countvae.diagnostics` (multi-seed
fits, alignment and the report) and :mod:`countvae.ica` (ICA axes for latents).
"""

from importlib import metadata as _metadata

from countvae import data, errors, ica, metrics
from countvae.model import CountVAE

try:
    __version__ = _metadata.version("countvae")
except _metadata.PackageNotFoundError:  # running from a source checkout
    __version__ = "0.0.0+unknown"

__all__ = ["CountVAE", "__version__", "data", "errors", "ica", "metrics"]
