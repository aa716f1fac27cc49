"""Training losses: the negative ELBO per cell, through Pyro or computed directly.

Sign convention of the whole package: an ELBO or a log-likelihood is a log
density (higher is better); a *loss* is its negative. Nothing here mixes them.
"""

from __future__ import annotations

from typing import Literal

import torch
from pyro.infer import TraceMeanField_ELBO

from countvae.module.loadings import kl_or_monte_carlo
from countvae.module.vae import CountVAEModule, log_library_size

LossEngine = Literal["direct", "pyro"]


def per_cell_elbo(
    module: CountVAEModule,
    x: torch.Tensor,
    batch_index: torch.Tensor,
    kl_weight: float = 1.0,
    weight: torch.Tensor | None = None,
    count_constant: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-sample ELBO of each cell, with the KL in closed form where it exists.

    Pyro's ``TraceMeanField_ELBO`` estimator for :meth:`CountVAEModule.model` and :meth:`CountVAEModule.guide`,
    written out without tracing: ``log p(x | z) - kl_weight * KL(q(z | x) || p(z))`` with one reparameterized draw
    ``z ~ q``; where the KL has no closed form (Laplace prior, full-covariance guide), ``log q(z) - log p(z)`` at the
    same draw, as Pyro does. ``tests/module/test_module.py`` checks that both give the same number from the same draw.

    ``weight``: a draw of the loadings ``W`` when they are a latent variable (:meth:`CountVAEModule.sample_loadings`);
    default: the decoder's own weight (their posterior mean). The KL divergence of ``W`` is not a per-cell term:
    :func:`minibatch_loss` adds it.

    ``count_constant`` (cells,) replaces the likelihood's terms that involve neither ``z`` nor the mean
    (:meth:`CountVAEModule.count_log_constant`); computed when not given.

    Returns
    -------
    torch.Tensor
        ELBO per cell, shape (cells,), in nats (a log density: higher is better).

    """
    q = module.posterior_distribution(x, batch_index)
    z = q.rsample()
    p = module.prior.distribution(x.shape[0], x)
    log_lik = module.conditional(z, log_library_size(x), batch_index, weight).log_prob(x, count_constant=count_constant)
    return log_lik - kl_weight * kl_or_monte_carlo(q, p, z)


def minibatch_loss(
    module: CountVAEModule,
    x: torch.Tensor,
    batch_index: torch.Tensor,
    kl_weight: float = 1.0,
    engine: LossEngine = "direct",
    cell_index: torch.Tensor | None = None,
    n_total: int | None = None,
) -> torch.Tensor:
    """Negative ELBO averaged over the cells of a minibatch (the training loss).

    Parameters
    ----------
    module
        The count VAE.
    x, batch_index
        Counts (cells, genes) and batch codes (cells,) of the minibatch.
    kl_weight
        Weight of the KL term (KL warm-up).
    engine
        ``"direct"`` evaluates :func:`per_cell_elbo`; ``"pyro"`` traces ``module.model`` and ``module.guide`` with
        ``TraceMeanField_ELBO`` (Monte Carlo KL where no closed form exists). Same value and gradients; ``"direct"``
        skips Pyro's tracing overhead (measured in benchmarks/RESULTS.md).
    cell_index, n_total
        For ``"pyro"``: positions of the minibatch's cells among ``n_total``, so the plate scales minibatch terms to
        the whole data set (the result is divided back to a per-cell mean). Both engines treat them alike: with both
        given, the data set has ``n_total`` cells, else it is the minibatch. With a prior on the loadings (a global
        latent) ``n_total`` must be the number of training cells: the KL divergence of the global sites enters the
        data set's ELBO once, so the per-cell loss carries ``KL / n_total``.

    """
    cells = n_total if (cell_index is not None and n_total is not None) else x.shape[0]
    if engine == "direct":
        draw = module.sample_loadings()  # global sites first, in the guide's order
        weight, global_kl = (None, None) if draw is None else draw
        # Only the mean over cells is needed, so the terms free of z and of the mean enter
        # as their sum, whose gradient costs no per-entry scatter (count_log_constant_sum).
        constant = module.likelihood.count_log_constant_sum(x, batch_index) / x.shape[0]
        elbo = per_cell_elbo(module, x, batch_index, kl_weight, weight, count_constant=x.new_zeros(x.shape[0]))
        loss = -(elbo.mean() + constant)
        return loss if global_kl is None else loss + kl_weight * global_kl / cells
    elbo = TraceMeanField_ELBO()  # closed-form KL where torch has one, else a Monte Carlo KL
    loss = elbo.differentiable_loss(
        module.model, module.guide, x, batch_index, cell_index=cell_index, n_total=n_total, kl_weight=kl_weight
    )
    return loss / cells
