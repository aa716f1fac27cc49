"""Decoders from latent ``z`` (and batch) to each gene's log rate per unit of library size.

A cell with observed library size ``l`` has mean counts ``l * exp(log_rate)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from countvae.module.networks import FullyConnected


@dataclass
class DecoderOutput:
    """What a decoder produces for a set of cells.

    Attributes
    ----------
    log_rate
        Log mean count per unit library size, shape (..., cells, genes).
    gate_logits
        Zero-inflation logits per cell and gene when the MLP decoder predicts them (ZINB likelihood), else ``None``.

    """

    log_rate: torch.Tensor
    gate_logits: torch.Tensor | None = None


class LinearDecoder(nn.Module):
    """The log-linear decoder ``log_rate = b + W z + c_batch``.

    Unlike scvi-tools' LDVAE decoder, no batch normalisation and no softmax: the log mean is exactly linear in ``z``,
    which makes the rotation symmetry ``(z, W) -> (Qz, W Q^T)`` exact and visible, and keeps the log-joint concave in
    ``z`` (used by the quadrature reference).

    Attributes
    ----------
    weight
        ``W``, genes x latent (the loadings).
    bias
        ``b``, per gene.
    batch_offset
        ``c``, batches x genes, with the first batch as the reference (row fixed to 0); absent without batches.

    """

    def __init__(self, n_latent: int, n_genes: int, n_batches: int = 0, init_bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_genes, n_latent) / n_latent**0.5 * 0.1)
        self.bias = nn.Parameter(init_bias.clone() if init_bias is not None else torch.zeros(n_genes))
        self.batch_offset = nn.Parameter(torch.zeros(n_batches - 1, n_genes)) if n_batches > 1 else None

    @property
    def latent_weight(self) -> torch.Tensor:
        """The weight applied to ``z`` (genes x latent)."""
        return self.weight

    def forward(
        self,
        z: torch.Tensor,
        batch_index: torch.Tensor | None = None,
        batch_onehot: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """Decode ``z`` of shape (..., cells, n_latent), with ``weight`` in place of ``W`` when given.

        ``weight``: a draw of the loadings when they are a latent variable (:mod:`countvae.module.loadings`);
        ``self.weight`` is then their posterior mean.
        """
        W = self.weight if weight is None else weight
        log_rate = torch.matmul(z, W.T) + self.bias
        if self.batch_offset is not None:
            offsets = torch.cat([torch.zeros_like(self.batch_offset[:1]), self.batch_offset], dim=0)
            log_rate = log_rate + offsets[batch_index]
        return DecoderOutput(log_rate=log_rate)


class MLPDecoder(nn.Module):
    """scVI's decoder: hidden layers on ``[z, batch one-hot]``, then a softmax over genes.

    ``log_rate = log_softmax(V h + a)``: the log of each gene's expected share of the library, as scVI's
    ``px_scale``. With a ZINB likelihood a second head predicts the zero-inflation logits from the same hidden layer.
    """

    def __init__(
        self,
        n_latent: int,
        n_genes: int,
        n_batches: int = 0,
        n_hidden: int = 128,
        n_layers: int = 1,
        dropout_rate: float = 0.0,
        batch_norm: bool = True,
        predict_gate: bool = False,
        init_bias: torch.Tensor | None = None,
    ):
        super().__init__()
        self.hidden = FullyConnected(n_latent, n_hidden, n_layers, n_batches, dropout_rate, batch_norm)
        self.scale = nn.Linear(n_hidden, n_genes)
        if init_bias is not None:
            with torch.no_grad():
                self.scale.bias.copy_(init_bias)
        self.gate = nn.Linear(n_hidden, n_genes) if predict_gate else None

    @property
    def latent_weight(self) -> torch.Tensor:
        """The first layer's weight on ``z`` (hidden x latent)."""
        return self.hidden.linears[0].data.weight

    def forward(
        self, z: torch.Tensor, batch_index: torch.Tensor | None = None, batch_onehot: torch.Tensor | None = None
    ) -> DecoderOutput:
        """Decode ``z`` of shape (cells, n_latent) or (samples, cells, n_latent)."""
        lead = z.shape[:-1]
        flat = z.reshape(-1, z.shape[-1])
        onehot = None
        if batch_onehot is not None:
            onehot = batch_onehot.expand(*lead, batch_onehot.shape[-1]).reshape(-1, batch_onehot.shape[-1])
        h = self.hidden(flat, onehot)
        log_rate = torch.log_softmax(self.scale(h), dim=-1).reshape(*lead, -1)
        gate = self.gate(h).reshape(*lead, -1) if self.gate is not None else None
        return DecoderOutput(log_rate=log_rate, gate_logits=gate)

    def log_rate_jacobian(
        self, z: torch.Tensor, batch_index: torch.Tensor | None = None, batch_onehot: torch.Tensor | None = None
    ) -> tuple[DecoderOutput, torch.Tensor]:
        """The output at ``z`` (cells, n_latent) and ``d log_rate / d z`` as (cells, n_latent, genes), exactly.

        ``log_rate = logits - logsumexp(logits)``, so its Jacobian is ``A - 1 p^T A`` with
        ``A = d logits / d z = V d h / d z`` and ``p`` the softmax: one matrix product per
        cell, where forward differences decode ``n_latent + 1`` points. Evaluation mode only
        (see :meth:`FullyConnected.forward_with_jacobian`).
        """
        h, dh = self.hidden.forward_with_jacobian(z, batch_onehot)  # dh: (cells, hidden, n_latent)
        log_rate = torch.log_softmax(self.scale(h), dim=-1)
        logits_t = dh.transpose(1, 2) @ self.scale.weight.T  # (cells, n_latent, genes): row k = d logits / d z_k
        mean_slope = logits_t @ torch.exp(log_rate).unsqueeze(-1)  # (cells, n_latent, 1): p^T A, per latent
        gate = self.gate(h) if self.gate is not None else None
        return DecoderOutput(log_rate=log_rate, gate_logits=gate), logits_t - mean_slope
