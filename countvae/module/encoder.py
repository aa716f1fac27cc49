"""The amortized Gaussian encoder ``q(z | x) = Normal(mu(x), diag sigma(x)^2)``."""

from __future__ import annotations

import torch
from torch import nn

from countvae.module.networks import FullyConnected

#: Added to the encoder's variance, as scVI does, so that sigma never reaches 0.
VARIANCE_FLOOR = 1e-4


class GaussianEncoder(nn.Module):
    """Map counts (and batch one-hot) to the mean and standard deviation of ``q(z | x)``.

    The network reads ``log1p(x)``, as scVI does with ``log_variational=True``.

    Parameters
    ----------
    n_genes, n_latent, n_batches
        Input width, latent width and number of batch categories (0 for none).
    n_hidden, n_layers, dropout_rate, batch_norm
        Shape of the hidden network, see :class:`FullyConnected`.

    """

    def __init__(
        self,
        n_genes: int,
        n_latent: int,
        n_batches: int = 0,
        n_hidden: int = 128,
        n_layers: int = 1,
        dropout_rate: float = 0.1,
        batch_norm: bool = True,
    ):
        super().__init__()
        self.hidden = FullyConnected(n_genes, n_hidden, n_layers, n_batches, dropout_rate, batch_norm)
        self.mean = nn.Linear(n_hidden, n_latent)
        self.log_variance = nn.Linear(n_hidden, n_latent)

    def forward(self, x: torch.Tensor, batch_onehot: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(mu, sigma)``, each of shape (cells, n_latent)."""
        h = self.hidden(torch.log1p(x), batch_onehot)
        sigma = torch.sqrt(torch.exp(self.log_variance(h)) + VARIANCE_FLOOR)
        return self.mean(h), sigma
