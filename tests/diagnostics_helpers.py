"""Fits with a known relation to each other, for known-answer tests of the diagnostics.

``RotatedFit`` is an exactly equivalent copy of a trained fit in rotated latent
coordinates (``z' = z Q^T``, decoder ``f(z' Q)``): every invariant quantity is
identical to the base fit's and every coordinate-level quantity is rotated.
``ScrambledFit`` keeps the base fit's decoder outputs but replaces its latents
by unrelated noise, so its latent geometry agrees with nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import ortho_group

from countvae.diagnostics import CountVAEFit


def random_rotation(dim: int, seed: int) -> np.ndarray:
    """A Haar-random orthogonal matrix (reflections included)."""
    if dim == 1:
        return np.array([[-1.0]])
    return ortho_group.rvs(dim, random_state=seed)


@dataclass
class RotatedFit:
    """``base`` in the latent coordinates ``z' = z @ q.T``."""

    base: CountVAEFit
    q: np.ndarray
    seed: int
    name: str = ""
    kind: str = "countvae"

    def __post_init__(self):
        self.name = self.name or f"seed {self.seed}"

    @property
    def symmetry(self) -> str:
        return self.base.symmetry

    @property
    def var_names(self) -> pd.Index:
        return self.base.var_names

    @property
    def n_latent(self) -> int:
        return self.base.n_latent

    def latent(self, adata):
        return self.base.latent(adata) @ self.q.T

    def latent_samples(self, adata, n_samples, seed):
        return self.base.latent_samples(adata, n_samples, seed) @ self.q.T

    def log_predictive_density(self, adata, n_samples, seed):
        return self.base.log_predictive_density(adata, n_samples, seed)

    def normalized_expression(self, adata, library_size=1e4):
        return self.base.normalized_expression(adata, library_size)

    def decode_log_rate(self, adata, z):
        return self.base.decode_log_rate(adata, (np.asarray(z, dtype=np.float64) @ self.q).astype(np.float32))

    def loadings(self):
        w = self.base.loadings()
        return None if w is None else w @ self.q.T

    def decoder_jacobian(self, adata):
        return self.base.decoder_jacobian(adata) @ self.q.T

    def posterior_predictive(self, adata, n_samples, seed):
        return self.base.posterior_predictive(adata, n_samples, seed)


@dataclass
class ScrambledFit(RotatedFit):
    """``base`` with its latent means replaced by independent standard normal noise."""

    def latent(self, adata):
        rng = np.random.default_rng(1000 + self.seed)
        return rng.standard_normal((adata.n_obs, self.n_latent))


def rotated_copies(base: CountVAEFit, seeds: list[int]) -> list[RotatedFit]:
    """One rotated copy of ``base`` per seed (seed 0 keeps the base coordinates)."""
    return [RotatedFit(base, np.eye(base.n_latent) if s == 0 else random_rotation(base.n_latent, s), s) for s in seeds]
