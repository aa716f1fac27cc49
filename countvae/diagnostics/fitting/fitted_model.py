"""One interface over fitted models, so that diagnostics treat countvae and scvi-tools fits alike.

The diagnostics call a :class:`FittedModel`, never a model's own methods: :class:`CountVAEFit` wraps a
:class:`countvae.CountVAE`, :class:`~countvae.diagnostics.fitting.scvi_fit.SCVIFit` an scvi-tools model. A method a
model's API cannot support may return ``None`` where the report has a path for it: ``log_predictive_density`` (the
held-out log p(x) rows then read "not measured" rather than guessed) and ``loadings`` (the mean decoder Jacobian
stands in). Every other method must return its array; ``None`` there is refused, naming the fit and the method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae.diagnostics.fitting.lpd_quantity import GIVEN_OBSERVED_LIBRARY, with_quantity
from countvae.model import CountVAE
from countvae.model.training import to_tensors
from countvae.module.vae import sample_latent


@runtime_checkable
class FittedModel(Protocol):
    """What the diagnostics need from one fitted model (one seed).

    Attributes
    ----------
    name
        Label in reports, e.g. ``"seed 3"``.
    seed
        The seed of the fit.
    kind
        ``"countvae"``, ``"scvi"`` or ``"linearscvi"``.
    symmetry
        The group of latent maps leaving the model's ``p(x)`` unchanged: ``"orthogonal"`` for a N(0, I) prior.
    var_names
        Genes, in the model's order.
    n_latent
        Latent dimensions.

    """

    name: str
    seed: int
    kind: str
    symmetry: str
    var_names: pd.Index
    n_latent: int

    def latent(self, adata: ad.AnnData) -> np.ndarray:
        """Posterior means of ``z``, (cells, n_latent)."""

    def latent_samples(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """Draws from ``q(z | x)``, (n_samples, cells, n_latent)."""

    def log_predictive_density(self, adata: ad.AnnData, n_samples: int, seed: int) -> pd.DataFrame | None:
        """Per-cell ``log p(x)`` (nats), indexed by cell.

        Columns ``lpd``, ``mc_se``, ``ess``, ``khat`` and ``reliable`` (Pareto k-hat <= 0.7; ``mc_se`` is NaN where
        not), from :func:`countvae.module.marginal.estimate_log_marginal`. ``frame.attrs["quantity"]``
        (:mod:`countvae.diagnostics.fitting.lpd_quantity`) says which ``log p(x)``: given the observed library size, or
        with a latent one integrated out. Fits of different quantities are not compared.
        """

    def normalized_expression(self, adata: ad.AnnData, library_size: float = 1e4) -> np.ndarray:
        """Expected counts at ``library_size`` decoded from the posterior mean, (cells, genes)."""

    def decode_log_rate(self, adata: ad.AnnData, z: np.ndarray) -> np.ndarray:
        """Log expected share (log rate per unit library) at latent values ``z`` (..., cells, n_latent)."""

    def loadings(self) -> np.ndarray | None:
        """Decoder weight on ``z`` in gene space, (genes, n_latent); ``None`` for non-linear decoders."""

    def decoder_jacobian(self, adata: ad.AnnData) -> np.ndarray:
        """Jacobian of the log rate with respect to ``z`` at each cell's posterior mean, (cells, genes, n_latent)."""

    def posterior_predictive(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """Counts drawn from the fitted model for each cell, (cells, genes, n_samples)."""


@dataclass
class CountVAEFit:
    """:class:`FittedModel` over a trained :class:`countvae.CountVAE`.

    Attributes
    ----------
    model, seed, name, kind
        The fit, its seed, its label in reports (default ``"seed <seed>"``) and its family. Held-out ``log p(x)`` is
        the model's :meth:`~countvae.CountVAE.get_log_predictive_density` (default ``method="mixture"``).

    """

    model: CountVAE
    seed: int
    name: str = ""
    kind: str = "countvae"

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"seed {self.seed}"

    @property
    def symmetry(self) -> str:
        """The symmetry group of the whole model (its prior on ``z`` and any prior on the loadings)."""
        return self.model.module.symmetry

    @property
    def var_names(self) -> pd.Index:
        """Genes."""
        return self.model.var_names

    @property
    def n_latent(self) -> int:
        """Latent dimensions."""
        return self.model.n_latent

    def latent(self, adata: ad.AnnData) -> np.ndarray:
        """Posterior means."""
        return self.model.get_latent_representation(adata)

    @torch.no_grad()
    def latent_samples(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """Posterior draws, (n_samples, cells, n_latent)."""
        module, (x, b) = self.tensors(adata)
        loc, scale = module.encode(x, b)
        eps = torch.randn((n_samples, *loc.shape), generator=torch.Generator().manual_seed(seed), dtype=loc.dtype)
        return sample_latent(loc, scale, eps).numpy()

    def log_predictive_density(self, adata: ad.AnnData, n_samples: int, seed: int) -> pd.DataFrame:
        """Per-cell ``log p(x | observed library size)`` by the package's estimator (``method="mixture"``).

        ``n_samples`` final draws; countvae scales each cell's mean by its observed total count.
        """
        frame = self.model.get_log_predictive_density(adata, n_samples=n_samples, seed=seed, method="mixture")
        return with_quantity(frame, GIVEN_OBSERVED_LIBRARY)

    def normalized_expression(self, adata: ad.AnnData, library_size: float = 1e4) -> np.ndarray:
        """Decoded expected counts at the posterior mean."""
        return self.model.get_normalized_expression(adata, library_size=library_size, return_numpy=True)

    @torch.no_grad()
    def decode_log_rate(self, adata: ad.AnnData, z: np.ndarray) -> np.ndarray:
        """Log rate at given latent values (cells' batches taken from ``adata``)."""
        module, (_, b) = self.tensors(adata)
        zt = torch.as_tensor(z, dtype=next(module.parameters()).dtype)
        return module.decode(zt, b).log_rate.numpy()

    def loadings(self) -> np.ndarray | None:
        """Linear decoder weight, else ``None``."""
        return self.model.get_loadings().to_numpy() if self.model.settings.decoder == "linear" else None

    def decoder_jacobian(self, adata: ad.AnnData) -> np.ndarray:
        """Jacobian of the log rate at posterior means: one forward-mode pass per latent direction.

        In eval mode a cell's output depends on its own ``z`` only, so the tangent ``e_k`` pushed for all cells at once
        gives column ``k`` of each cell's Jacobian.
        """
        module, (x, b) = self.tensors(adata)
        with torch.no_grad():
            loc, _ = module.encode(x, b)
        columns = []
        for k in range(loc.shape[-1]):
            tangent = torch.zeros_like(loc)
            tangent[:, k] = 1.0
            _, col = torch.func.jvp(lambda z: module.decode(z, b).log_rate, (loc,), (tangent,))
            columns.append(col.detach())
        return torch.stack(columns, dim=-1).numpy()

    def posterior_predictive(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """Posterior predictive counts, (cells, genes, n_samples)."""
        draws = self.model.posterior_predictive_sample(adata, n_samples=n_samples, seed=seed)
        return draws[..., None] if n_samples == 1 else draws

    def tensors(self, adata: ad.AnnData) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
        """The model's module (in eval mode) and the counts and batch indices of ``adata``'s cells as tensors.

        Raises
        ------
        NotTrainedError
            If the model is not trained.

        """
        m = self.model
        m.require_trained()
        cells = m.cells(adata)
        mb = cells.source.rows(cells.indices)
        module = m.module.eval()
        return module, to_tensors(mb, next(module.parameters()).dtype, torch.device("cpu"))
