"""The count VAE as a Pyro model and guide over a torch module's parameters.

Departure from the scvi-tools Pyro pattern (``PyroModule`` + ``pyro.module``):
countvae's networks are plain ``torch.nn.Module`` objects and the model and
guide never call ``pyro.param`` or ``pyro.module``. Parameters enter the Pyro
trace through torch autograd, and training uses a torch optimiser over
``module.parameters()``. Pyro's *global* parameter store is therefore never
touched, so several models in one process (the multi-seed diagnostics) each
train for real; with the global store, fitting model B silently stops model A
from training (shared/notes/scvi_pyro_anchors.md, section 2).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn
from torch.nn import functional as F

from countvae.module.decoders import DecoderOutput, LinearDecoder, MLPDecoder
from countvae.module.encoder import GaussianEncoder
from countvae.module.likelihoods import CountLikelihood, DispersionName, LikelihoodName
from countvae.module.priors import LatentPrior, PriorName


def log_library_size(x: torch.Tensor) -> torch.Tensor:
    """Log of each cell's observed total count, shape (cells, 1): the offset of every count model here."""
    return torch.log(x.sum(-1, keepdim=True))


def sample_latent(loc: torch.Tensor, scale: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Reparameterized draws ``z = loc + scale eps`` from the guide's parameters (see :meth:`CountVAEModule.encode`).

    ``scale`` is a vector per cell (mean-field guide; ``loc + scale * eps``) or a
    matrix per cell (after a reparameterization; ``loc + scale @ eps``). ``eps``
    has shape (..., cells, L), standard normal; the result has its shape.
    """
    if scale.dim() == loc.dim():
        return loc + scale * eps
    return loc + torch.einsum("nij,...nj->...ni", scale, eps)


class CountVAEModule(nn.Module):
    """Generative model ``p(z) p(x | z, batch, library)`` and amortized guide ``q(z | x, batch)``.

    Parameters
    ----------
    n_genes, n_latent, n_batches
        Data width, latent width and number of batch categories (0 without batches).
    likelihood
        ``"poisson"``, ``"nb"`` or ``"zinb"``.
    decoder
        ``"linear"`` (log-linear, :class:`LinearDecoder`) or ``"mlp"`` (:class:`MLPDecoder`).
    n_hidden, n_layers, dropout_rate
        Hidden width, depth and encoder dropout; the MLP decoder has no dropout (as scVI).
    dispersion
        ``"gene"`` or ``"gene-batch"`` inverse dispersion for NB/ZINB.
    prior
        ``"normal"`` (N(0, I)), ``"laplace"`` or ``"diagonal"``, see :class:`LatentPrior`.
    batch_norm
        Batch normalisation in the encoder and MLP decoder hidden layers (scVI's default).
    init_log_proportions
        Optional per-gene log share of all counts; initialises the decoder's
        output bias so that training starts from the per-gene mean profile.

    Attributes
    ----------
    latent_map
        ``None``, or an invertible L x L matrix ``A`` set by
        :func:`countvae.invariance.reparameterize`: the guide then returns the
        law of ``A z`` for ``z ~ Normal(mu, diag sigma^2)``, a full-covariance
        Gaussian with mean ``A mu`` and covariance ``A diag(sigma^2) A^T``.

    """

    def __init__(
        self,
        n_genes: int,
        n_latent: int,
        n_batches: int = 0,
        likelihood: LikelihoodName = "nb",
        decoder: str = "mlp",
        n_hidden: int = 128,
        n_layers: int = 1,
        dropout_rate: float = 0.1,
        dispersion: DispersionName = "gene",
        prior: PriorName = "normal",
        batch_norm: bool = True,
        init_log_proportions: torch.Tensor | None = None,
    ):
        super().__init__()
        self.n_genes = n_genes
        self.n_latent = n_latent
        self.n_batches = n_batches
        n_cov = n_batches if n_batches > 1 else 0
        self.encoder = GaussianEncoder(n_genes, n_latent, n_cov, n_hidden, n_layers, dropout_rate, batch_norm)
        if decoder == "linear":
            self.decoder = LinearDecoder(n_latent, n_genes, n_batches, init_bias=init_log_proportions)
        else:
            self.decoder = MLPDecoder(
                n_latent,
                n_genes,
                n_cov,
                n_hidden,
                n_layers,
                0.0,
                batch_norm,
                predict_gate=likelihood == "zinb",
                init_bias=init_log_proportions,
            )
        self.likelihood = CountLikelihood(
            likelihood, n_genes, n_batches, dispersion, gene_gate=(likelihood == "zinb" and decoder == "linear")
        )
        self.prior = LatentPrior(prior, n_latent)
        self.register_buffer("latent_map", None)

    # ----- pieces shared by the model, the guide and the estimators ---------------------------
    def batch_onehot(self, batch_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
        """One-hot batch covariates for the networks (``None`` with fewer than two batches)."""
        if self.n_batches < 2:
            return None
        return F.one_hot(batch_index, self.n_batches).to(like.dtype)

    def encode(self, x: torch.Tensor, batch_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Guide parameters ``(loc, scale)``.

        ``scale`` is the vector ``sigma`` (cells, L) for the mean-field guide, or the
        matrix ``A diag(sigma)`` (cells, L, L) after a reparameterization, so that
        ``z = loc + scale @ eps`` with ``eps ~ N(0, I)`` in both cases.
        """
        mu, sigma = self.encoder(x, self.batch_onehot(batch_index, x))
        if self.latent_map is None:
            return mu, sigma
        A = self.latent_map.to(mu.dtype)
        return mu @ A.T, A * sigma.unsqueeze(-2)

    def posterior_distribution(self, x: torch.Tensor, batch_index: torch.Tensor) -> dist.TorchDistribution:
        """``q(z | x)`` as a distribution with event dimension ``n_latent``."""
        loc, scale = self.encode(x, batch_index)
        if scale.dim() == loc.dim():
            return dist.Normal(loc, scale).to_event(1)
        return dist.MultivariateNormal(loc, scale_tril=torch.linalg.cholesky(scale @ scale.transpose(-1, -2)))

    def decode(self, z: torch.Tensor, batch_index: torch.Tensor) -> DecoderOutput:
        """Decoder output for latent values of shape (cells, L) or (samples, cells, L)."""
        return self.decoder(z, batch_index, self.batch_onehot(batch_index, z))

    def conditional(
        self, z: torch.Tensor, log_library: torch.Tensor, batch_index: torch.Tensor
    ) -> dist.TorchDistribution:
        """``p(x | z)`` for cells with the given log library sizes (shape (cells, 1))."""
        out = self.decode(z, batch_index)
        return self.likelihood.distribution(log_library + out.log_rate, batch_index, out.gate_logits)

    def log_joint(
        self,
        z: torch.Tensor,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        log_library: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``log p(x | z, batch, library) + log p(z)`` per cell, in nats, for ``z`` of shape (..., cells, L).

        This is the log density of the sample sites of :meth:`model` (tested against
        its Pyro trace); every estimator of ``log p(x)`` in the package and the
        invariance checks evaluate it through this method. ``log_library`` defaults to
        :func:`log_library_size` of ``x``. Returns shape (..., cells).
        """
        if log_library is None:
            log_library = log_library_size(x)
        log_lik = self.conditional(z, log_library, batch_index).log_prob(x)
        return log_lik + self.prior.distribution(x.shape[0], x).log_prob(z)

    def log_joint_neg_hessian(
        self,
        z: torch.Tensor,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        log_library: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Gauss-Newton approximation of ``-d^2 log_joint / dz^2`` at ``z`` (cells, L); shape (cells, L, L).

        ``J^T diag(c) J + diag(prior curvature)`` with ``J = d eta / d z`` the Jacobian of the
        genes' log means (forward differences: one decoder call on ``L + 1`` points per cell)
        and ``c`` from :meth:`CountLikelihood.log_mean_curvature`. Positive semi-definite for
        every decoder; for the linear decoder with a Poisson or NB likelihood and a Gaussian
        prior it is the exact negative Hessian. It only shapes importance proposals
        (:mod:`countvae.module.marginal`), so its approximation error never biases an estimate.
        """
        if log_library is None:
            log_library = log_library_size(x)
        L = z.shape[-1]
        h = 1e-5 if z.dtype == torch.float64 else 1e-2
        eye = torch.eye(L, dtype=z.dtype, device=z.device).unsqueeze(1)  # (L, 1, L)
        points = torch.cat([z.detach().unsqueeze(0), z.detach().unsqueeze(0) + h * eye], dim=0)
        with torch.no_grad():
            out = self.decode(points, batch_index)
            eta = out.log_rate + log_library
            gate = None if out.gate_logits is None else out.gate_logits[0]
            curvature = self.likelihood.log_mean_curvature(x, eta[0], batch_index, gate)
            jac = (eta[1:] - eta[0]) / h  # (L, cells, genes)
            gauss_newton = torch.einsum("ng,kng,lng->nkl", curvature, jac, jac)
        return gauss_newton + torch.diag(self.prior.curvature(z))

    # ----- Pyro model and guide ------------------------------------------------------------------
    def _plate(self, x: torch.Tensor, cell_index: torch.Tensor | None, n_total: int | None):
        if cell_index is None or n_total is None:
            return pyro.plate("cells", x.shape[0])
        return pyro.plate("cells", n_total, subsample=cell_index)

    def model(
        self,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        cell_index: torch.Tensor | None = None,
        n_total: int | None = None,
        kl_weight: float = 1.0,
    ) -> None:
        """Generative model: ``z ~ p(z)``, ``x ~ p(x | z, batch, library)``.

        ``cell_index`` and ``n_total`` make the plate a subsample of ``n_total``
        cells, so minibatch terms are scaled to the whole data set;
        ``kl_weight`` scales the latent site (KL warm-up).
        """
        log_library = log_library_size(x)
        with self._plate(x, cell_index, n_total):
            with poutine.scale(scale=kl_weight):
                z = pyro.sample("z", self.prior.distribution(x.shape[0], x))
            pyro.sample("x", self.conditional(z, log_library, batch_index), obs=x)

    def guide(
        self,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        cell_index: torch.Tensor | None = None,
        n_total: int | None = None,
        kl_weight: float = 1.0,
    ) -> None:
        """Amortized guide ``q(z | x, batch)``."""
        with self._plate(x, cell_index, n_total):
            with poutine.scale(scale=kl_weight):
                pyro.sample("z", self.posterior_distribution(x, batch_index))
