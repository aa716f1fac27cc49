"""Priors on the loadings ``W`` of the linear decoder: ``W`` as a global latent variable with its own guide.

With free loadings (the default) ``W`` is a parameter fitted by maximum likelihood, and ``W`` can absorb any rotation
of the latent axes. A prior on ``W`` that is not rotation-invariant is a restriction: it prefers some axes. Two are
offered, each a Pyro model over the loadings with a mean-field guide, so loadings come with posterior uncertainty:

* :class:`HorseshoeLoadings`, the regularized horseshoe of Piironen and Vehtari (2017, Electron. J. Statist.
  11:5018): ``W_gk ~ N(0, tau^2 lt_gk^2)`` with ``lt_gk^2 = c^2 l_gk^2 / (c^2 + tau^2 l_gk^2)``, local scales
  ``l_gk ~ HalfCauchy(1)``, a global scale ``tau ~ HalfCauchy(tau0)`` and a slab
  ``c^2 ~ InvGamma(nu / 2, nu s^2 / 2)``. Most loadings are shrunk to zero, a few escape: sparse loadings. Its
  density is kept by every signed permutation of the columns of ``W`` and by no other orthogonal map (for generic
  ``W``).
* :class:`ProgramLoadings`, named gene programs: column ``k`` belongs to program ``k`` and ``W_gk ~ N(0, s_in^2)``
  for genes of the program, ``N(0, s_out^2)`` (``s_out`` small) for the others, so a gene set names each latent
  dimension. Its density is kept by sign flips of single columns, not by rotations or permutations (columns with
  exactly the same gene set share a prior, and any rotation among them is kept: give each dimension its own set).

The guide of ``W`` is ``N(loc, diag(scale^2))`` with ``loc`` the decoder's own weight (``LinearDecoder.weight``): the
posterior mean is what the decoder uses outside training, what ``get_loadings`` returns and what a reparameterization
rewrites. Hyper-parameters of the horseshoe have log-normal guides.

Departure from scvi-tools: ``LinearSCVI`` has point-estimated loadings with no prior; here the global latent enters
the minibatch ELBO once per data set, so its KL divergence is divided by the number of training cells in the per-cell
loss (:func:`countvae.module.loss.minibatch_loss`), as a Pyro plate subsample scales it.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from torch import nn
from torch.distributions import kl_divergence

#: Nodes of the trapezoid rule over ``u = log(local scale)`` in :meth:`HorseshoeLoadings.log_density`.
_MARGINAL_NODES = 801
#: Upper end of that grid; the integrand decays like ``exp(-u)`` beyond it.
_MARGINAL_UPPER = 45.0
#: How far below ``log(|w| / tau)`` the grid starts; the Gaussian factor is ``exp(-exp(2 * 8) / 2)`` there.
_MARGINAL_BELOW = 8.0


def kl_or_monte_carlo(q: dist.TorchDistribution, p: dist.TorchDistribution, value: torch.Tensor) -> torch.Tensor:
    """KL(q || p) in closed form where torch has it, else ``log q - log p`` at ``value`` (as Pyro's mean-field ELBO)."""
    try:
        return kl_divergence(q, p)
    except NotImplementedError:
        return q.log_prob(value) - p.log_prob(value)


class LoadingsPrior(nn.Module):
    """A prior ``p(W)`` on the genes x latent loadings with a mean-field Normal guide around the decoder weight.

    Subclasses define the prior (:meth:`prior_sites`, :meth:`log_density`), the
    symmetry group they declare, and which latent maps keep their density.

    Parameters
    ----------
    n_genes, n_latent
        Shape of ``W``.
    init_scale
        Initial posterior standard deviation of every loading.

    """

    #: Name of the prior (``ModelSettings.loadings_prior``).
    kind: str = ""
    #: The group of latent maps that leaves ``p(W)`` unchanged (see :mod:`countvae.module.symmetry`).
    symmetry: str = "orthogonal"

    def __init__(self, n_genes: int, n_latent: int, init_scale: float = 0.01):
        super().__init__()
        self.n_genes = n_genes
        self.n_latent = n_latent
        self.weight_log_scale = nn.Parameter(torch.full((n_genes, n_latent), math.log(init_scale)))

    # ----- the guide of W --------------------------------------------------------------------------
    def weight_scale(self) -> torch.Tensor:
        """Posterior standard deviations of the loadings, genes x latent."""
        return torch.exp(self.weight_log_scale)

    def weight_guide(self, loc: torch.Tensor) -> dist.TorchDistribution:
        """``q(W) = N(loc, diag scale^2)`` with event shape (genes, latent)."""
        return dist.Normal(loc, self.weight_scale().to(loc.dtype)).to_event(2)

    # ----- what subclasses define ------------------------------------------------------------------
    def hyper_guides(self, like: torch.Tensor) -> dict[str, dist.TorchDistribution]:
        """Guides of the hyper-parameters, by site name, in sampling order (none by default)."""
        return {}

    def hyper_priors(self, like: torch.Tensor) -> dict[str, dist.TorchDistribution]:
        """Priors of the hyper-parameters, by site name, in the order of :meth:`hyper_guides`."""
        return {}

    def weight_prior(self, hyper: dict[str, torch.Tensor], like: torch.Tensor) -> dist.TorchDistribution:
        """``p(W | hyper-parameters)`` with event shape (genes, latent)."""
        raise TypeError(f"{type(self).__name__} does not define its prior on the loadings.")

    def log_density(self, weight: torch.Tensor) -> torch.Tensor:
        """``log p(W)`` (a scalar, nats) at the guide's point estimate of the hyper-parameters."""
        raise TypeError(f"{type(self).__name__} does not define its log density.")

    # ----- Pyro sites and the same draws without tracing -------------------------------------------
    def model_sites(self, like: torch.Tensor) -> torch.Tensor:
        """Sample the hyper-parameters and ``W`` from the prior as Pyro sites; returns ``W``."""
        hyper = {name: pyro.sample(name, prior) for name, prior in self.hyper_priors(like).items()}
        return pyro.sample("W", self.weight_prior(hyper, like))

    def guide_sites(self, loc: torch.Tensor) -> torch.Tensor:
        """Sample the hyper-parameters and ``W`` from the guide as Pyro sites (same order as the model)."""
        for name, guide in self.hyper_guides(loc).items():
            pyro.sample(name, guide)
        return pyro.sample("W", self.weight_guide(loc))

    def sample_with_kl(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One reparameterized draw of ``W`` from the guide and the KL divergence of the global sites.

        Drawn in the order of :meth:`guide_sites`, so with the same torch random state this is the draw Pyro's
        ``TraceMeanField_ELBO`` makes; as there, the KL is in closed form where torch has it (``W`` given the
        hyper-parameters) and ``log q - log p`` at the draw otherwise.

        Returns
        -------
        weight, kl
            ``W`` (genes x latent) and the KL divergence (a scalar, nats).

        """
        priors = self.hyper_priors(loc)
        hyper, kl = {}, loc.new_zeros(())
        for name, guide in self.hyper_guides(loc).items():
            hyper[name] = guide.rsample()
            kl = kl + kl_or_monte_carlo(guide, priors[name], hyper[name])
        q_weight = self.weight_guide(loc)
        weight = q_weight.rsample()
        return weight, kl + kl_or_monte_carlo(q_weight, self.weight_prior(hyper, loc), weight)

    @torch.no_grad()
    def map_guide(self, inverse_map: torch.Tensor) -> None:
        """Rewrite the guide for latent coordinates ``z' = A z`` (``W' = W A^-1``), given ``A^-1``.

        The decoder rewrites the posterior mean exactly. The mean-field variances become ``var' = var @ (A^-1)^2``
        (entrywise square), the exact marginal variances of ``W A^-1``; only their correlations are dropped, so a
        signed permutation maps the guide exactly.
        """
        mix = inverse_map.to(self.weight_log_scale.dtype) ** 2
        var = torch.exp(2.0 * self.weight_log_scale) @ mix
        self.weight_log_scale.copy_(0.5 * torch.log(var))


class ProgramLoadings(LoadingsPrior):
    """Named gene programs: ``W_gk ~ N(0, s_in^2)`` for genes in program ``k``, ``N(0, s_out^2)`` otherwise.

    Parameters
    ----------
    membership
        Boolean genes x latent, True where gene ``g`` is in program ``k``; an all-``True`` column is a free dimension.
    inside_scale
        Prior standard deviation of a program's own loadings.
    outside_scale
        Prior standard deviation of every other loading (small: strongly shrunk, not masked).

    """

    kind = "programs"
    symmetry = "sign flip"

    def __init__(self, membership: torch.Tensor, inside_scale: float = 1.0, outside_scale: float = 0.01):
        membership = torch.as_tensor(membership, dtype=torch.bool)
        super().__init__(*membership.shape)
        self.inside_scale = float(inside_scale)
        self.outside_scale = float(outside_scale)
        scale = torch.where(membership, torch.tensor(self.inside_scale), torch.tensor(self.outside_scale))
        self.register_buffer("prior_scale", scale.to(torch.float32))

    @property
    def membership(self) -> torch.Tensor:
        """Boolean genes x latent: which loadings belong to their dimension's program."""
        return self.prior_scale == self.inside_scale

    def weight_prior(self, hyper: dict[str, torch.Tensor], like: torch.Tensor) -> dist.TorchDistribution:
        """``N(0, prior_scale^2)`` entrywise."""
        return dist.Normal(torch.zeros_like(like), self.prior_scale.to(like.dtype)).to_event(2)

    def log_density(self, weight: torch.Tensor) -> torch.Tensor:
        """The Gaussian log density of ``W``."""
        return self.weight_prior({}, weight).log_prob(weight)


class HorseshoeLoadings(LoadingsPrior):
    """The regularized horseshoe prior on the loadings (see the module docstring).

    Parameters
    ----------
    n_genes, n_latent
        Shape of ``W``.
    global_scale
        ``tau0``, the scale of the half-Cauchy prior on the global shrinkage ``tau``.
    slab_scale, slab_df
        ``s`` and ``nu`` of the slab: loadings well above ``s`` are regularized as
        by a Student-t with ``nu`` degrees of freedom and scale ``s``.

    """

    kind = "horseshoe"
    symmetry = "signed permutation"

    def __init__(
        self, n_genes: int, n_latent: int, global_scale: float = 0.1, slab_scale: float = 2.0, slab_df: float = 4.0
    ):
        super().__init__(n_genes, n_latent)
        self.global_scale = float(global_scale)
        self.slab_scale = float(slab_scale)
        self.slab_df = float(slab_df)
        self.tau_loc = nn.Parameter(torch.tensor(math.log(global_scale)))
        self.tau_log_scale = nn.Parameter(torch.tensor(math.log(0.1)))
        self.slab_loc = nn.Parameter(torch.tensor(2.0 * math.log(slab_scale)))
        self.slab_log_scale = nn.Parameter(torch.tensor(math.log(0.1)))
        self.local_loc = nn.Parameter(torch.zeros(n_genes, n_latent))
        self.local_log_scale = nn.Parameter(torch.full((n_genes, n_latent), math.log(0.1)))

    def hyper_guides(self, like: torch.Tensor) -> dict[str, dist.TorchDistribution]:
        """Log-normal guides of ``tau``, ``c^2`` and the local scales."""
        dtype = like.dtype
        return {
            "loadings_tau": dist.LogNormal(self.tau_loc.to(dtype), torch.exp(self.tau_log_scale).to(dtype)),
            "loadings_slab": dist.LogNormal(self.slab_loc.to(dtype), torch.exp(self.slab_log_scale).to(dtype)),
            "loadings_local": dist.LogNormal(
                self.local_loc.to(dtype), torch.exp(self.local_log_scale).to(dtype)
            ).to_event(2),
        }

    def hyper_priors(self, like: torch.Tensor) -> dict[str, dist.TorchDistribution]:
        """``tau ~ HalfCauchy(tau0)``, ``c^2 ~ InvGamma(nu / 2, nu s^2 / 2)``, local scales ``~ HalfCauchy(1)``."""
        one = like.new_ones(())
        return {
            "loadings_tau": dist.HalfCauchy(one * self.global_scale),
            "loadings_slab": dist.InverseGamma(one * self.slab_df / 2.0, one * self.slab_df * self.slab_scale**2 / 2.0),
            "loadings_local": dist.HalfCauchy(torch.ones_like(like)).to_event(2),
        }

    @staticmethod
    def regularized_scale(tau: torch.Tensor, local: torch.Tensor, slab: torch.Tensor) -> torch.Tensor:
        """``tau * lt``: the prior standard deviation of each loading given its local scale and the slab ``c^2``."""
        tl = tau * local
        return tl / torch.sqrt(1.0 + tl**2 / slab)

    def weight_prior(self, hyper: dict[str, torch.Tensor], like: torch.Tensor) -> dist.TorchDistribution:
        """``W_gk ~ N(0, tau^2 lt_gk^2)``."""
        scale = self.regularized_scale(hyper["loadings_tau"], hyper["loadings_local"], hyper["loadings_slab"])
        return dist.Normal(torch.zeros_like(like), scale).to_event(2)

    def point_hyper(self) -> tuple[float, float]:
        """The guide's medians of ``tau`` and ``c^2``."""
        return float(torch.exp(self.tau_loc)), float(torch.exp(self.slab_loc))

    @torch.no_grad()
    def log_density(self, weight: torch.Tensor) -> torch.Tensor:
        """``log p(W | tau, c^2)`` with each local scale integrated out, at the guide's medians of ``tau`` and ``c^2``.

        For every entry, ``log int_0^inf N(w; 0, tau^2 lt(l)^2) 2 / (pi (1 + l^2)) dl`` by the trapezoid rule in
        ``u = log l`` (the integrand is smooth in ``u`` and decays on both sides, where the rule converges
        geometrically), from :data:`_MARGINAL_BELOW` below ``log(|w| / tau)`` up to :data:`_MARGINAL_UPPER`, in float64.
        The density depends on each entry alone and is even in it, so only signed permutations of the columns of ``W``
        keep it, in general. (At ``w = 0`` the horseshoe density is infinite; a fitted loading is never exactly 0.)
        """
        tau, slab = self.point_hyper()
        w = weight.detach().to(torch.float64).abs().clamp_min(1e-300).reshape(-1)
        log_tau, log_slab = math.log(tau), math.log(slab)
        grid = torch.linspace(0.0, 1.0, _MARGINAL_NODES, dtype=torch.float64)
        out = []
        for chunk in torch.split(w, max(1, 2**22 // _MARGINAL_NODES)):
            lower = torch.log(chunk) - log_tau - _MARGINAL_BELOW
            u = lower[:, None] + (_MARGINAL_UPPER - lower)[:, None] * grid[None, :]
            log_var = (
                2.0 * log_tau + log_slab + 2.0 * u - torch.logaddexp(torch.tensor(log_slab), 2.0 * log_tau + 2.0 * u)
            )
            log_f = (
                -0.5 * (math.log(2.0 * math.pi) + log_var)
                - 0.5 * chunk[:, None] ** 2 * torch.exp(-log_var)
                + math.log(2.0 / math.pi)
                + u
                - torch.nn.functional.softplus(2.0 * u)
            )
            step = (_MARGINAL_UPPER - lower) / (_MARGINAL_NODES - 1)
            weights = torch.ones(_MARGINAL_NODES, dtype=torch.float64)
            weights[0] = weights[-1] = 0.5
            out.append(torch.logsumexp(log_f + torch.log(weights), dim=1) + torch.log(step))
        return torch.cat(out).sum()

    @torch.no_grad()
    def map_guide(self, inverse_map: torch.Tensor) -> None:
        """As :meth:`LoadingsPrior.map_guide`; the local scales' guides are averaged with the weights ``(A^-1)^2``.

        For a signed permutation that is the same permutation of their columns (exact); for other maps the local scales
        have no counterpart, and the average is only a starting point (they do not enter ``log_density``).
        """
        super().map_guide(inverse_map)
        mix = inverse_map.to(self.local_loc.dtype) ** 2
        mix = mix / mix.sum(0, keepdim=True)
        self.local_loc.copy_(self.local_loc @ mix)
        self.local_log_scale.copy_(self.local_log_scale @ mix)
