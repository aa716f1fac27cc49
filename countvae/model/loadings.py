"""Restrictions on the loadings of a CountVAE: building the prior, naming the axes, reading the posterior.

The priors (regularized horseshoe, gene programs) are Pyro models in :mod:`countvae.module.loadings`; this module
builds one from the validated :class:`~countvae.model.settings.ModelSettings`, names each latent dimension (by its
gene program, if any) and summarises the loadings' posterior for the user.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm

from countvae._checks import check_number
from countvae.model.settings import ModelSettings
from countvae.module.loadings import HorseshoeLoadings, LoadingsPrior, ProgramLoadings
from countvae.module.vae import CountVAEModule

#: Prior standard deviation of a gene program's own loadings (``ProgramLoadings.inside_scale``).
PROGRAM_INSIDE_SCALE = 1.0


def latent_names(n_latent: int, gene_programs: dict[str, list[str]] | None) -> list[str]:
    """Names of the latent dimensions: the gene programs' names, or ``Z_0``, ``Z_1``, ..."""
    return list(gene_programs) if gene_programs else [f"Z_{i}" for i in range(n_latent)]


def program_membership(gene_programs: dict[str, list[str]], var_names: Sequence[str]) -> np.ndarray:
    """Boolean genes x programs: whether each gene belongs to each program."""
    index = {str(g): i for i, g in enumerate(var_names)}
    member = np.zeros((len(var_names), len(gene_programs)), dtype=bool)
    for k, genes in enumerate(gene_programs.values()):
        member[[index[g] for g in genes], k] = True
    return member


def build_loadings_prior(settings: ModelSettings, var_names: Sequence[str]) -> LoadingsPrior | None:
    """The prior on the loadings a model's validated settings ask for (``None`` for ``"none"``)."""
    if settings.loadings_prior == "horseshoe":
        return HorseshoeLoadings(len(var_names), settings.n_latent, global_scale=settings.horseshoe_scale)
    if settings.loadings_prior == "programs":
        membership = torch.as_tensor(program_membership(settings.gene_programs, var_names))
        return ProgramLoadings(membership, PROGRAM_INSIDE_SCALE, settings.program_outside_scale)
    return None


@torch.no_grad()
def loadings_posterior(
    module: CountVAEModule, var_names: Sequence[str], names: Sequence[str], credible_mass: float = 0.9
) -> pd.DataFrame:
    """One row per gene and latent dimension: posterior mean, standard deviation and credible interval of ``W``.

    The guide of ``W`` is Gaussian, so the central interval holding ``credible_mass`` of it is ``mean +- z sd`` with
    ``z`` the standard normal quantile.

    Returns
    -------
    pandas.DataFrame
        Columns ``gene``, ``dimension``, ``mean``, ``sd``, ``lower``, ``upper``, ``nonzero`` (the interval excludes 0)
        and, for gene programs, ``in_program`` (the gene belongs to the dimension's program).

    """
    check_number("credible_mass", credible_mass, 0.0, 1.0, low_open=True, high_open=True)
    prior = module.loadings_prior
    mean = module.decoder.weight.detach().cpu().double().numpy()
    sd = prior.weight_scale().detach().cpu().double().numpy()
    half = norm.ppf(0.5 + credible_mass / 2.0) * sd
    frame = pd.DataFrame(
        {
            "gene": np.repeat(np.asarray(var_names, dtype=object), mean.shape[1]),
            "dimension": np.tile(np.asarray(names, dtype=object), mean.shape[0]),
            "mean": mean.ravel(),
            "sd": sd.ravel(),
            "lower": (mean - half).ravel(),
            "upper": (mean + half).ravel(),
        }
    )
    frame["nonzero"] = (frame["lower"] > 0) | (frame["upper"] < 0)
    if isinstance(prior, ProgramLoadings):
        frame["in_program"] = prior.membership.cpu().numpy().ravel()
    return frame
