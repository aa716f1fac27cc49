"""Multi-seed fits, their alignment, and the report of which quantities are stable across fits."""

from countvae.diagnostics.adapters import CountVAEFit, FittedModel, SCVIFit
from countvae.diagnostics.fitting import fit_seeds, heldout_split, load_seed_fits
from countvae.diagnostics.seedfits import SeedFits

__all__ = ["CountVAEFit", "FittedModel", "SCVIFit", "SeedFits", "fit_seeds", "heldout_split", "load_seed_fits"]
