"""Analyses room: small functions over arrays that compare fits on shared held-out cells.

Each module takes latents, decoded means, log densities, draws or tables (NumPy and pandas) and returns numbers and
tables; none calls a fitted model. :mod:`.maps` fits the maps between two fits' latent spaces (once per pair, see
``PairMaps``), :mod:`.alignment` scores them, :mod:`.invariants` measures how well the fits agree on each quantity,
and :mod:`.heldout_data` reads the held-out counts.
"""
