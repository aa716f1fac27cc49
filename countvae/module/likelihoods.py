"""Count likelihoods ``p(x | z)``: Poisson, negative binomial and zero-inflated NB."""

from __future__ import annotations

from typing import Literal

import torch
from pyro.distributions import TorchDistribution
from torch import nn

from countvae.module.distributions import (
    NegativeBinomialLogMean,
    PoissonLogMean,
    ZeroInflatedNegativeBinomialLogMean,
    count_log_constant,
    count_log_constant_sum,
)

LikelihoodName = Literal["poisson", "nb", "zinb"]
DispersionName = Literal["gene", "gene-batch"]


class CountLikelihood(nn.Module):
    """Turn a log mean into a per-gene count distribution (event dimension: genes).

    Parameters
    ----------
    kind
        ``"poisson"``, ``"nb"`` or ``"zinb"``.
    n_genes, n_batches
        Sizes of the dispersion parameters.
    dispersion
        ``"gene"``: one inverse dispersion ``theta_g`` per gene; ``"gene-batch"``: one per gene and batch (as scVI's
        options of the same names).
    gene_gate
        For ZINB: learn one zero-inflation logit per gene (linear decoder; the MLP decoder predicts the logits per
        cell instead, as scVI).

    Notes
    -----
    The NB is parameterised by mean ``mu`` and inverse dispersion ``theta`` (variance ``mu + mu^2 / theta``), as Pyro's
    ``NegativeBinomial(total_count=theta, logits=log mu - log theta)``; see :mod:`countvae.module.distributions`.

    """

    def __init__(
        self,
        kind: LikelihoodName,
        n_genes: int,
        n_batches: int = 0,
        dispersion: DispersionName = "gene",
        gene_gate: bool = False,
    ):
        super().__init__()
        self.kind = kind
        self.dispersion = dispersion
        if kind in ("nb", "zinb"):
            rows = max(n_batches, 1) if dispersion == "gene-batch" else 1
            self.log_theta = nn.Parameter(torch.zeros(rows, n_genes))
        else:
            self.log_theta = None
        self.gate_logits = nn.Parameter(torch.full((n_genes,), -2.0)) if (kind == "zinb" and gene_gate) else None

    def log_theta_for(self, batch_index: torch.Tensor | None = None) -> torch.Tensor | None:
        """Log inverse dispersion broadcastable against (cells, genes); ``None`` for Poisson."""
        if self.log_theta is None:
            return None
        if self.dispersion == "gene-batch" and batch_index is not None:
            return self.log_theta[batch_index]
        return self.log_theta[0]

    def distribution(
        self, log_mean: torch.Tensor, batch_index: torch.Tensor | None = None, gate_logits: torch.Tensor | None = None
    ) -> TorchDistribution:
        """The distribution of a cell's counts given its log mean (shape (..., cells, genes))."""
        if self.kind == "poisson":
            return PoissonLogMean(log_mean)
        log_theta = self.log_theta_for(batch_index)
        if self.kind == "nb":
            return NegativeBinomialLogMean(log_mean, log_theta)
        gate = gate_logits if gate_logits is not None else self.gate_logits
        return ZeroInflatedNegativeBinomialLogMean(log_mean, log_theta, gate)

    def count_log_constant(self, x: torch.Tensor, batch_index: torch.Tensor | None = None) -> torch.Tensor:
        """Per cell, the terms of ``log p(x | log_mean)`` that do not involve the mean (shape (cells,)).

        See :func:`countvae.module.distributions.count_log_constant`; pass it as ``count_constant`` to the log
        probability of :meth:`distribution` for the same cells.
        """
        return count_log_constant(x, self.log_theta_for(batch_index))

    def count_log_constant_sum(self, x: torch.Tensor, batch_index: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`count_log_constant` summed over the cells, a scalar (the training loss's form).

        See :func:`countvae.module.distributions.count_log_constant_sum`.
        """
        if self.log_theta is None:
            return count_log_constant_sum(x, None)
        if self.dispersion == "gene-batch" and batch_index is not None:
            return count_log_constant_sum(x, self.log_theta, batch_index)
        return count_log_constant_sum(x, self.log_theta[:1])

    def log_mean_curvature(
        self,
        x: torch.Tensor,
        log_mean: torch.Tensor,
        batch_index: torch.Tensor | None = None,
        gate_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per gene, ``-d^2 log p(x | log_mean) / d log_mean^2``, floored at 0 (shape of ``log_mean``).

        Poisson: ``mu``; NB: ``theta mu (theta + x) / (theta + mu)^2`` (both >= 0). ZINB: the NB value for ``x > 0``;
        at ``x = 0``, with ``rho`` the posterior probability that the zero is an NB zero and
        ``a = theta mu / (theta + mu)``, ``rho theta a / (theta + mu) - rho (1 - rho) a^2``, which can be negative and
        is floored at 0. Gate logits are held fixed. Only for the Gauss-Newton curvature that shapes importance
        proposals (:meth:`countvae.module.vae.CountVAEModule.log_joint_neg_hessian`), never in an estimate.
        """
        mu = torch.exp(log_mean)
        if self.kind == "poisson":
            return mu
        theta = torch.exp(self.log_theta_for(batch_index)).to(mu.dtype)
        total = theta + mu
        curvature = theta * mu * (theta + x) / total**2
        if self.kind == "nb":
            return curvature
        gate = gate_logits if gate_logits is not None else self.gate_logits
        a = theta * mu / total
        log_nb_zero = theta * (torch.log(theta) - torch.log(total))
        rho = torch.sigmoid(log_nb_zero - gate)  # (1 - pi) r / (pi + (1 - pi) r)
        at_zero = rho * theta * a / total - rho * (1.0 - rho) * a**2
        return torch.where(x > 0, curvature, torch.clamp(at_zero, min=0.0))
