"""The count VAE as a Pyro model and guide over a torch module's parameters.

Departure from the scvi-tools Pyro pattern (``PyroModule`` + ``pyro.module``): countvae's networks are plain
``torch.nn.Module`` objects, and the model and guide never call ``pyro.param`` or ``pyro.module``. Parameters enter
the Pyro trace through torch autograd, and a torch optimiser trains ``module.parameters()``. Pyro's *global* parameter
store is never touched, so several models in one process (the multi-seed diagnostics) each train for real; with the
global store, fitting model B silently stops model A from training (shared/notes/scvi_pyro_anchors.md, section 2).
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
from countvae.module.loadings import LoadingsPrior
from countvae.module.priors import LatentPrior, PriorName
from countvae.module.symmetry import intersect_symmetries


def log_library_size(x: torch.Tensor) -> torch.Tensor:
    """Log of each cell's observed total count, shape (cells, 1): the offset of every count model here."""
    return torch.log(x.sum(-1, keepdim=True))


def sample_latent(loc: torch.Tensor, scale: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Reparameterized draws ``z = loc + scale eps`` from the guide's parameters (see :meth:`CountVAEModule.encode`).

    ``scale`` is a vector per cell (mean-field guide; ``loc + scale * eps``) or a matrix per cell (after a
    reparameterization; ``loc + scale @ eps``). ``eps``: standard normal, (..., cells, L), the result's shape.
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
        Per-gene log share of all counts: the decoder's initial output bias, so training starts from the mean profile.
    loadings_prior
        ``None`` (the loadings ``W`` are a parameter), or a :class:`countvae.module.loadings.LoadingsPrior`: ``W`` is
        then a global latent variable with that prior (site ``"W"``, outside the cell plate), the decoder's weight
        the mean of its guide. Linear decoder only.

    Attributes
    ----------
    latent_map
        ``None``, or an invertible L x L matrix ``A`` set by :func:`countvae.invariance.reparameterize`: the guide
        then returns the law of ``A z`` for ``z ~ Normal(mu, diag sigma^2)``: a full-covariance Gaussian, mean
        ``A mu``, covariance ``A diag(sigma^2) A^T``.

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
        loadings_prior: LoadingsPrior | None = None,
    ):
        super().__init__()
        if loadings_prior is not None and decoder != "linear":
            raise ValueError("A prior on the loadings needs the linear decoder.")
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
        self.loadings_prior = loadings_prior
        self.register_buffer("latent_map", None)

    @property
    def symmetry(self) -> str:
        """The group of latent maps that leaves the whole model's ``p(x)`` unchanged (see :mod:`.symmetry`).

        The prior on ``z`` and, when the loadings have one, the prior on ``W`` each
        keep a group; the model keeps the maps both keep.
        """
        groups = [self.prior.symmetry]
        if self.loadings_prior is not None:
            groups.append(self.loadings_prior.symmetry)
        return intersect_symmetries(*groups)

    # ----- pieces shared by the model, the guide and the estimators ---------------------------
    def batch_onehot(self, batch_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
        """One-hot batch covariates for the networks (``None`` with fewer than two batches)."""
        if self.n_batches < 2:
            return None
        return F.one_hot(batch_index, self.n_batches).to(like.dtype)

    def encode(self, x: torch.Tensor, batch_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Guide parameters ``(loc, scale)``.

        ``scale`` is the vector ``sigma`` (cells, L) for the mean-field guide, or the matrix ``A diag(sigma)``
        (cells, L, L) after a reparameterization (see :func:`sample_latent`).
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

    def decode(self, z: torch.Tensor, batch_index: torch.Tensor, weight: torch.Tensor | None = None) -> DecoderOutput:
        """Decoder output for latent values of shape (cells, L) or (samples, cells, L).

        ``weight`` replaces the linear decoder's loadings (a draw of ``W``); default: the decoder's own weight (for a
        prior on ``W``: its posterior mean).
        """
        if weight is None:
            return self.decoder(z, batch_index, self.batch_onehot(batch_index, z))
        return self.decoder(z, batch_index, self.batch_onehot(batch_index, z), weight=weight)

    def conditional(
        self, z: torch.Tensor, log_library: torch.Tensor, batch_index: torch.Tensor, weight: torch.Tensor | None = None
    ) -> dist.TorchDistribution:
        """``p(x | z)`` (``p(x | z, W = weight)`` when given) for cells with log library sizes of shape (cells, 1)."""
        out = self.decode(z, batch_index, weight)
        return self.likelihood.distribution(log_library + out.log_rate, batch_index, out.gate_logits)

    def log_joint(
        self,
        z: torch.Tensor,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        log_library: torch.Tensor | None = None,
        count_constant: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``log p(x | z, batch, library) + log p(z)`` per cell, in nats, for ``z`` of shape (..., cells, L).

        The log density of the sample sites of :meth:`model` (tested against its Pyro trace), through which every
        estimator of ``log p(x)`` in the package and the invariance checks evaluate it. With a prior on the loadings
        it is ``log p(x | z, W) + log p(z)`` at ``W`` = the posterior mean (the decoder's weight); ``log p(W)`` is
        :meth:`log_prior_loadings`. ``log_library`` defaults to :func:`log_library_size` of ``x``.
        ``count_constant`` (cells,) is :meth:`count_log_constant` of the same ``x`` and ``batch_index``, for callers
        that evaluate the same cells at many ``z`` (computed here when not given). Returns shape (..., cells).
        """
        if log_library is None:
            log_library = log_library_size(x)
        if count_constant is not None and count_constant.shape != x.shape[:1]:
            raise ValueError(
                f"count_constant must have one value per cell of x, shape {tuple(x.shape[:1])}; got "
                f"{tuple(count_constant.shape)}. Compute it with count_log_constant(x, batch_index) for the same cells."
            )
        log_lik = self.conditional(z, log_library, batch_index).log_prob(x, count_constant=count_constant)
        return log_lik + self.prior.distribution(x.shape[0], x).log_prob(z)

    def count_log_constant(self, x: torch.Tensor, batch_index: torch.Tensor) -> torch.Tensor:
        """The part of :meth:`log_joint` that depends on neither ``z`` nor the decoder's output, per cell.

        ``sum_g lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` (Poisson: ``-sum_g lgamma(x + 1)``),
        shape (cells,). Pass it back as ``count_constant`` to skip recomputing it at every ``z``.
        """
        return self.likelihood.count_log_constant(x, batch_index)

    def log_joint_neg_hessian(
        self, z: torch.Tensor, x: torch.Tensor, batch_index: torch.Tensor, log_library: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Gauss-Newton approximation of ``-d^2 log_joint / dz^2`` at ``z`` (cells, L); shape (cells, L, L).

        ``J^T diag(c) J + diag(prior curvature)`` with ``J = d eta / d z`` the Jacobian of the genes' log means and
        ``c`` from :meth:`CountLikelihood.log_mean_curvature`. Positive semi-definite for every decoder; the exact
        negative Hessian for the linear decoder with a Poisson or NB likelihood and a Gaussian prior. It only shapes
        importance proposals (:mod:`countvae.module.marginal`), so its approximation error never biases an estimate.

        ``J`` is exact for the MLP decoder in evaluation mode
        (:meth:`~countvae.module.decoders.MLPDecoder.log_rate_jacobian`: one matrix product per cell, no softmax at
        perturbed points); otherwise forward differences, one decoder call on ``L + 1`` points per cell.
        """
        if log_library is None:
            log_library = log_library_size(x)
        if isinstance(self.decoder, MLPDecoder) and not self.training:
            with torch.no_grad():
                onehot = self.batch_onehot(batch_index, z)
                out, jac = self.decoder.log_rate_jacobian(z.detach(), batch_index, onehot)
                log_mean = out.log_rate + log_library
                curvature = self.likelihood.log_mean_curvature(x, log_mean, batch_index, out.gate_logits)
                gauss_newton = torch.bmm(jac * curvature.unsqueeze(1), jac.transpose(1, 2))
            return gauss_newton + torch.diag(self.prior.curvature(z))
        L = z.shape[-1]
        h = 1e-5 if z.dtype == torch.float64 else 1e-2
        eye = torch.eye(L, dtype=z.dtype, device=z.device).unsqueeze(1)  # (L, 1, L)
        points = torch.cat([z.detach().unsqueeze(0), z.detach().unsqueeze(0) + h * eye], dim=0)
        with torch.no_grad():
            out = self.decode(points, batch_index)
            gate = None if out.gate_logits is None else out.gate_logits[0]
            curvature = self.likelihood.log_mean_curvature(x, out.log_rate[0] + log_library, batch_index, gate)
            # h * J per cell, (cells, L, genes) (the library cancels); J^T diag(c) J as one batched product,
            # and the 1 / h^2 on the small result: about 30% faster than an einsum on J itself.
            jac = (out.log_rate[1:] - out.log_rate[0]).permute(1, 0, 2)
            gauss_newton = torch.bmm(jac * curvature.unsqueeze(1), jac.transpose(1, 2)) / h**2
        return gauss_newton + torch.diag(self.prior.curvature(z))

    def log_prior_loadings(self) -> torch.Tensor | None:
        """``log p(W)`` at the posterior mean of the loadings (nats), or ``None`` without a prior on them.

        See :meth:`countvae.module.loadings.LoadingsPrior.log_density` for each prior's definition.
        """
        if self.loadings_prior is None:
            return None
        return self.loadings_prior.log_density(self.decoder.weight)

    def sample_loadings(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A draw of ``W`` from its guide and the KL divergence of the global sites; ``None`` without a prior on ``W``.

        Draws in the order of the guide's global sites (see :meth:`guide`).
        """
        if self.loadings_prior is None:
            return None
        return self.loadings_prior.sample_with_kl(self.decoder.weight)

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
        """Generative model: (``W ~ p(W)``), ``z ~ p(z)``, ``x ~ p(x | z, (W,) batch, library)``.

        ``cell_index`` and ``n_total`` subsample the plate from ``n_total`` cells, scaling minibatch terms to the
        whole data set; ``kl_weight`` scales the latent sites (KL warm-up). With a prior on the loadings, ``W`` and
        its hyper-parameters are global sites, outside the plate.
        """
        log_library = log_library_size(x)
        weight = None
        if self.loadings_prior is not None:
            with poutine.scale(scale=kl_weight):
                weight = self.loadings_prior.model_sites(self.decoder.weight)
        with self._plate(x, cell_index, n_total):
            with poutine.scale(scale=kl_weight):
                z = pyro.sample("z", self.prior.distribution(x.shape[0], x))
            pyro.sample("x", self.conditional(z, log_library, batch_index, weight), obs=x)

    def guide(
        self,
        x: torch.Tensor,
        batch_index: torch.Tensor,
        cell_index: torch.Tensor | None = None,
        n_total: int | None = None,
        kl_weight: float = 1.0,
    ) -> None:
        """Amortized guide ``q(z | x, batch)`` (after ``q(W)`` and its hyper-parameters, with a prior on ``W``)."""
        if self.loadings_prior is not None:
            with poutine.scale(scale=kl_weight):
                self.loadings_prior.guide_sites(self.decoder.weight)
        with self._plate(x, cell_index, n_total), poutine.scale(scale=kl_weight):
            pyro.sample("z", self.posterior_distribution(x, batch_index))
