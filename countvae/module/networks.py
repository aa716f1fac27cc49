"""Fully connected layers with covariates injected into every layer, as in scVI."""

from __future__ import annotations

import torch
from torch import nn


class CovariateLinear(nn.Module):
    """``W x + V c + bias``: a linear layer whose input is split into data and covariates.

    The weight on the data input (``W``, attribute ``data``) is kept apart from the weight on the batch one-hot
    covariates (``V``, attribute ``covariate``), so the invariance module can rewrite the former alone.
    """

    def __init__(self, n_in: int, n_out: int, n_covariates: int = 0, bias: bool = True):
        super().__init__()
        self.data = nn.Linear(n_in, n_out, bias=bias)
        self.covariate = nn.Linear(n_covariates, n_out, bias=False) if n_covariates > 0 else None

    def forward(self, x: torch.Tensor, covariates: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer."""
        out = self.data(x)
        if self.covariate is not None:
            out = out + self.covariate(covariates)
        return out


class FullyConnected(nn.Module):
    """A stack of (linear, batch norm, ReLU, dropout) blocks with covariate injection.

    Parameters
    ----------
    n_in
        Input width.
    n_hidden
        Width of every hidden layer (the output width).
    n_layers
        Number of blocks (at least 1).
    n_covariates
        Width of the one-hot covariates concatenated to each block's input.
    dropout_rate
        Dropout after each activation.
    batch_norm
        Batch normalisation before each activation (scVI's momentum 0.01, eps 1e-3).

    """

    def __init__(
        self,
        n_in: int,
        n_hidden: int,
        n_layers: int = 1,
        n_covariates: int = 0,
        dropout_rate: float = 0.1,
        batch_norm: bool = True,
    ):
        super().__init__()
        self.linears = nn.ModuleList(
            CovariateLinear(n_in if i == 0 else n_hidden, n_hidden, n_covariates) for i in range(n_layers)
        )
        self.norms = nn.ModuleList(
            nn.BatchNorm1d(n_hidden, momentum=0.01, eps=1e-3) if batch_norm else nn.Identity() for _ in range(n_layers)
        )
        self.dropout = nn.Dropout(dropout_rate) if dropout_rate > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, covariates: torch.Tensor | None = None) -> torch.Tensor:
        """Apply every block."""
        for linear, norm in zip(self.linears, self.norms, strict=True):
            x = self.dropout(torch.relu(norm(linear(x, covariates))))
        return x

    def forward_with_jacobian(
        self, x: torch.Tensor, covariates: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The output (rows, n_hidden) for inputs ``x`` (rows, n_in) and its Jacobian in ``x``, (rows, n_hidden, n_in).

        Exact, in evaluation mode only: batch norm then applies its running statistics (an affine map per unit) and
        dropout is the identity; in training mode batch norm couples the rows, and there is no per-row Jacobian.
        """
        if self.training:
            raise RuntimeError("FullyConnected.forward_with_jacobian needs evaluation mode (call .eval() first).")
        jacobian = None
        for linear, norm in zip(self.linears, self.norms, strict=True):
            pre = norm(linear(x, covariates))
            weight = linear.data.weight  # (n_hidden, inputs)
            jacobian = weight.expand(x.shape[0], *weight.shape) if jacobian is None else weight @ jacobian
            gain = (pre > 0).to(pre.dtype)
            if isinstance(norm, nn.BatchNorm1d):
                gain = gain * _batch_norm_gain(norm).to(pre.dtype)
            jacobian = gain.unsqueeze(-1) * jacobian
            x = torch.relu(pre)
        return x, jacobian


def _batch_norm_gain(norm: nn.BatchNorm1d) -> torch.Tensor:
    """Per-unit slope of a batch norm in evaluation mode, ``weight / sqrt(running_var + eps)``."""
    if norm.running_var is None:
        raise RuntimeError("a batch norm without running statistics has no per-row Jacobian.")
    gain = torch.rsqrt(norm.running_var + norm.eps)
    return gain * norm.weight if norm.affine else gain
