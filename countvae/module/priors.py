"""Priors on the latent variables and the symmetry group each leaves ``p(x)`` invariant under."""

from __future__ import annotations

import math
from typing import Literal

import pyro.distributions as dist
import torch
from torch import nn

PriorName = Literal["normal", "laplace", "diagonal"]


class LatentPrior(nn.Module):
    """A factorised prior ``p(z)`` over ``n_latent`` dimensions.

    Parameters
    ----------
    kind
        ``"normal"``: N(0, I), kept by every orthogonal map (the default; the rotation symmetry the project measures).
        ``"laplace"``: independent unit-variance Laplace; only signed permutations keep it.
        ``"diagonal"``: N(0, diag(s^2)), ``s`` learned; only sign flips (and permutations among equal scales) keep it.
    n_latent
        Number of latent dimensions.

    """

    def __init__(self, kind: PriorName, n_latent: int):
        super().__init__()
        self.kind = kind
        self.n_latent = n_latent
        self.log_scale = nn.Parameter(torch.zeros(n_latent)) if kind == "diagonal" else None

    @property
    def symmetry(self) -> str:
        """The group of latent maps that leaves this prior, and therefore p(x), unchanged."""
        return {"normal": "orthogonal", "laplace": "signed permutation", "diagonal": "sign flip"}[self.kind]

    def distribution(self, n_cells: int, like: torch.Tensor) -> dist.TorchDistribution:
        """The prior of ``n_cells`` cells, batched over cells, event dimension ``n_latent``."""
        zeros = like.new_zeros((n_cells, self.n_latent))
        if self.kind == "normal":
            return dist.Normal(zeros, 1.0).to_event(1)
        if self.kind == "laplace":
            return dist.Laplace(zeros, 1.0 / math.sqrt(2.0)).to_event(1)
        return dist.Normal(zeros, torch.exp(self.log_scale).to(like.dtype).expand_as(zeros)).to_event(1)

    def curvature(self, like: torch.Tensor) -> torch.Tensor:
        """``-d^2 log p(z) / dz_k^2`` per dimension, shape (n_latent,), in ``like``'s dtype.

        N(0, I): 1; N(0, diag(s^2)): ``1 / s^2``; Laplace: 0 (its kink at 0 is left to the likelihood's curvature).
        Only shapes importance proposals, never in an estimate.
        """
        if self.kind == "diagonal":
            return torch.exp(-2.0 * self.log_scale.detach()).to(dtype=like.dtype, device=like.device)
        return torch.full((self.n_latent,), 1.0 if self.kind == "normal" else 0.0, dtype=like.dtype, device=like.device)
