"""Quantities computed from a fitted module on a set of cells.

Every function takes the module, a :class:`CountSource` and the positions of the cells, visits them in minibatches in
eval mode without gradients, and returns numpy arrays in the order of the given positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._warnings import warn_at_caller
from countvae.data.loader import CountSource
from countvae.errors import InvalidArgumentError, UnreliableEstimateWarning
from countvae.model.training import dtype_device, to_tensors
from countvae.module.decoders import LinearDecoder
from countvae.module.importance import KHAT_THRESHOLD, ImportanceSummary, summarize_log_weights
from countvae.module.loss import per_cell_elbo
from countvae.module.marginal import MarginalSettings, estimate_log_marginal
from countvae.module.vae import CountVAEModule, log_library_size, sample_latent

#: Cells per pass of the per-cell outputs that decode or simulate (normalized expression, ELBO, draws).
CELLS_PER_PASS = 512

#: Largest number of (sample x cell x gene) elements the importance sampler holds at once.
_ELEMENTS_PER_CHUNK = 2**22


def _ordered(indices: np.ndarray, visited: np.ndarray) -> np.ndarray:
    """Positions that put rows gathered in sorted order back into the order of ``indices``."""
    return np.searchsorted(visited, indices)


def _check_unique(indices: np.ndarray) -> None:
    if len(np.unique(indices)) != len(indices):
        raise InvalidArgumentError("indices contain duplicates; pass each cell once.")


def _per_cell(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    batch_size: int,
    compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    torch_seed: int | None = None,
) -> np.ndarray:
    """``compute(x, batch_index)`` over the minibatches of the cells ``indices`` (each once), rows in their order.

    With ``torch_seed``, torch's global random state is seeded with it for the call and restored after.
    """
    _check_unique(indices)
    module.eval()
    dtype, device = dtype_device(module)
    with torch.random.fork_rng(devices=[], enabled=torch_seed is not None):
        if torch_seed is not None:
            torch.manual_seed(torch_seed)
        order = np.unique(indices)
        batches = source.iterate(order, batch_size, drop_last_singleton=False)
        out = [compute(*to_tensors(mb, dtype, device)).cpu().numpy() for mb in batches]
    return np.concatenate(out, axis=0)[_ordered(indices, order)]


@torch.no_grad()
def latent_representation(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    give_mean: bool = True,
    seed: int = 0,
    batch_size: int = 1024,
) -> np.ndarray:
    """Posterior means (or one posterior draw per cell) of ``z``, shape (cells, n_latent)."""
    give_mean = check_bool("give_mean", give_mean)
    check_int("batch_size", batch_size, 1)
    gen = torch.Generator().manual_seed(check_int("seed", seed, 0))

    def latent(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        loc, scale = module.encode(x, b)
        if give_mean:
            return loc
        return sample_latent(loc, scale, torch.randn(loc.shape, generator=gen, dtype=x.dtype).to(x.device))

    return _per_cell(module, source, indices, batch_size, latent)


@torch.no_grad()
def normalized_expression(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    library_size: float = 1e4,
    n_samples: int = 1,
    transform_batch: int | None = None,
    seed: int = 0,
    batch_size: int = CELLS_PER_PASS,
) -> np.ndarray:
    """Expected counts of each gene at library size ``library_size``, shape (cells, genes); before zero inflation.

    ``n_samples == 1`` decodes the posterior mean of ``z``; more average over draws from ``q(z | x)``.
    ``transform_batch`` (an integer code) decodes every cell as if from that batch.
    """
    check_number("library_size", library_size, 0.0, low_open=True)
    check_int("n_samples", n_samples, 1)
    gen = torch.Generator().manual_seed(check_int("seed", seed, 0))

    def expression(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        loc, scale = module.encode(x, b)
        decode_batch = b if transform_batch is None else torch.full_like(b, transform_batch)
        if n_samples == 1:
            return library_size * torch.exp(module.decode(loc, decode_batch).log_rate)
        eps = torch.randn((n_samples, *loc.shape), generator=gen, dtype=x.dtype).to(x.device)
        return library_size * torch.exp(module.decode(sample_latent(loc, scale, eps), decode_batch).log_rate).mean(0)

    return _per_cell(module, source, indices, batch_size, expression)


#: The estimators of ``log p(x)`` that :func:`log_predictive_density` offers; the first is the default.
LPD_METHODS = ("mixture", "guide")

#: Draws per cell of the guide estimator when ``n_samples`` is not given.
GUIDE_SAMPLES = 1000


def default_marginal_settings(module: CountVAEModule) -> MarginalSettings:
    """The :class:`MarginalSettings` used when none are given: without restarts where the posterior is log-concave.

    With a linear decoder, a Poisson or NB likelihood and a Gaussian prior (normal or diagonal),
    ``log p(x | z) + log p(z)`` is smooth and strictly concave in ``z``: Newton's method from the encoder's mean finds
    its one mode, and the pilot and restarts would only cost time (benchmarks/RESULTS.md, lpd-accuracy: the single-mode
    mixture met the accuracy targets on all 18 linear models). The Laplace prior's log joint is concave too, but the
    Newton curvature misses its kink at 0; it keeps the restarts as a precaution (not measured either way).
    """
    concave = (
        isinstance(module.decoder, LinearDecoder)
        and module.likelihood.kind in ("poisson", "nb")
        and module.prior.kind in ("normal", "diagonal")
    )
    return MarginalSettings(n_pilot=0, pilot_restarts=0, prior_restarts=0) if concave else MarginalSettings()


def _guide_log_weights(
    module: CountVAEModule, x: torch.Tensor, b: torch.Tensor, n_samples: int, gen: torch.Generator, per_draw: int
) -> torch.Tensor:
    """Log weights (S, cells) of ``S`` draws ``z = loc + scale @ eps`` from the guide ``q(z | x)``."""
    loc, scale = module.encode(x, b)
    q = module.posterior_distribution(x, b)
    precise = x.to(torch.float64)  # see mixture_log_marginal
    log_library = log_library_size(precise)
    constant = module.count_log_constant(precise, b)
    log_w = []
    for start in range(0, n_samples, per_draw):
        k = min(per_draw, n_samples - start)
        eps = torch.randn((k, *loc.shape), generator=gen, dtype=loc.dtype).to(loc.device)
        z = sample_latent(loc, scale, eps)
        log_w.append(module.log_joint(z, precise, b, log_library, constant) - q.log_prob(z))
    return torch.cat(log_w, dim=0)


def mixture_log_marginal(
    module: CountVAEModule,
    x: torch.Tensor,
    b: torch.Tensor,
    settings: MarginalSettings,
    gen: torch.Generator,
    points_per_call: int,
    start: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> ImportanceSummary:
    """:func:`countvae.module.marginal.estimate_log_marginal` on one chunk of cells, through the module.

    ``start``: the proposal's starting Gaussian ``(loc, scale)`` per cell (default: the guide ``q(z | x)``). The
    curvature is the module's Gauss-Newton :meth:`~countvae.module.vae.CountVAEModule.log_joint_neg_hessian`.

    The decoder runs in the module's dtype; the log likelihood after it (and the terms without ``z``) in float64,
    whatever that dtype. A deep cell's log joint is a sum over genes of terms (``x log mu``, ``lgamma(x + 1)``,
    ``(x + theta) log(mu + theta)``) that cancel to a small fraction of their size: in float32 its rounding error was
    up to 0.01 nats on Kang's deepest cells (7k counts) and 0.2-3 nats at 0.3-1M simulated counts, noise that
    the log-sum-exp of the weights turns into an upward bias (0.05-0.1 nats on a 278k-count cell, 3-5 standard
    errors). scvi-tools models are evaluated in float64 throughout (:mod:`countvae.diagnostics.fitting.scvi_fit`).
    """
    loc, scale = module.encode(x, b) if start is None else start
    precise = x.to(torch.float64)
    log_library = log_library_size(precise)
    curvature_library = log_library.to(x.dtype)
    constant = module.count_log_constant(precise, b)  # once per cell, not at every Newton step and draw
    rows_per_call = max(1, points_per_call // (module.n_latent + 1))

    def log_joint(z: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return module.log_joint(z, precise[cells], b[cells], log_library[cells], constant[cells])

    def neg_hessian(z: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        parts = [
            module.log_joint_neg_hessian(z[i : i + rows_per_call], x[c], b[c], curvature_library[c])
            for i in range(0, z.shape[0], rows_per_call)
            for c in [cells[i : i + rows_per_call]]
        ]
        return torch.cat(parts, dim=0)

    return estimate_log_marginal(
        log_joint, loc, scale, gen, settings, neg_hessian=neg_hessian, points_per_call=points_per_call
    )


def _warn_unreliable(summary: ImportanceSummary, method: str) -> None:
    n_bad = int((~summary.reliable).sum())
    if n_bad == 0:
        return
    if method == "guide":
        remedy = "use the default method='mixture', whose proposals are fitted to each cell"
    else:
        remedy = (
            "estimate them with more draws (a larger n_samples=..., or "
            "settings=MarginalSettings(escalation_draws=...)) or train longer (a better-fitted encoder starts the "
            "search closer to the posterior)"
        )
    warn_at_caller(
        f"{n_bad} of {summary.lpd.size} cells have a Pareto k-hat above {KHAT_THRESHOLD}: their log p(x) estimate "
        f"is unreliable (column 'reliable' is False and 'mc_se' is NaN). To fix it, {remedy}; until then leave "
        "these cells out of model comparisons.",
        UnreliableEstimateWarning,
    )


@torch.no_grad()
def log_predictive_density(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int | None = None,
    seed: int = 0,
    cells_per_chunk: int = 128,
    progress_bar: bool = False,
    method: str = "mixture",
    settings: MarginalSettings | None = None,
) -> pd.DataFrame:
    """Importance-sampling estimate of each cell's ``log p(x)`` with its standard error and reliability.

    ``method="mixture"`` (the default) is :func:`countvae.module.marginal.estimate_log_marginal`, described with its
    verified accuracy in :meth:`countvae.CountVAE.get_log_predictive_density` and that module's docstring.

    ``method="guide"``, scvi-tools' ``get_marginal_ll``, proposes from the amortized guide ``q(z | x)`` alone: ``S``
    draws ``z_s = loc + scale @ eps_s`` and the estimate ``log mean_s w_s`` with ``w_s = p(x, z_s) / q(z_s | x)`` (the
    importance-weighted bound of Burda et al. 2016). Where the posterior is much narrower than, or offset from, the
    guide (high-count cells, Poisson models) it falls far below ``log p(x)`` (by up to 10 nats/cell on average in
    RESULTS.md); k-hat flags most such cells. Its noise ``eps`` comes from a generator seeded with ``seed`` in a fixed
    order (cells in sorted chunks of ``cells_per_chunk``), so two models evaluated on the same cells with the same
    seed share their base noise (common random numbers).

    Parameters
    ----------
    module, source, indices
        The fitted module, the counts and the positions of the cells to evaluate.
    n_samples
        Draws per cell in the estimate, at least 2: ``MarginalSettings.n_draws`` for ``"mixture"`` (default 800, its
        pilot and second pass on top), the guide draws for ``"guide"`` (default 1000).
    seed
        Seed of every random number: the same seed gives the same numbers.
    cells_per_chunk
        Cells estimated together (a cell's draws depend on its chunk: keep it fixed for reproducible numbers).
    progress_bar
        Show a progress bar over cells.
    method
        One of :data:`LPD_METHODS`.
    settings
        :class:`countvae.module.marginal.MarginalSettings` of the ``"mixture"`` method
        (default :func:`default_marginal_settings`; ``n_samples``, when given, replaces its ``n_draws``).

    Returns
    -------
    pandas.DataFrame
        Columns ``lpd`` (nats), ``mc_se`` (NaN where unreliable), ``ess``, ``khat`` and ``reliable``, a row per cell in
        the order of ``indices``; a :class:`countvae.errors.UnreliableEstimateWarning` counts the unreliable cells.

    """
    _check_unique(indices)
    check_choice("method", method, LPD_METHODS)
    seed = check_int("seed", seed, 0)
    check_bool("progress_bar", progress_bar)
    if n_samples is not None:
        check_int("n_samples", n_samples, 2)  # a Monte Carlo standard error needs two draws
    if settings is not None and method != "mixture":
        raise InvalidArgumentError("settings apply to method='mixture' only; drop them or use that method.")
    if settings is not None and not isinstance(settings, MarginalSettings):
        raise InvalidArgumentError(f"settings must be a MarginalSettings; got {type(settings).__name__}.")
    if method == "mixture":
        settings = settings if settings is not None else default_marginal_settings(module)
        if n_samples is not None:
            settings = replace(settings, n_draws=n_samples)
    module.eval()
    dtype, device = dtype_device(module)
    gen = torch.Generator().manual_seed(seed)
    n_genes = source.n_vars
    parts: list[ImportanceSummary] = []
    order = np.unique(indices)
    bar = tqdm(total=len(order), desc="log p(x)", unit="cell", disable=not progress_bar)
    for mb in source.iterate(order, cells_per_chunk, drop_last_singleton=False):
        x, b = to_tensors(mb, dtype, device)
        n = x.shape[0]
        if method == "guide":
            per_draw = max(1, _ELEMENTS_PER_CHUNK // (n * n_genes))
            n_guide = GUIDE_SAMPLES if n_samples is None else n_samples
            parts.append(summarize_log_weights(_guide_log_weights(module, x, b, n_guide, gen, per_draw)))
        else:
            parts.append(mixture_log_marginal(module, x, b, settings, gen, max(1, _ELEMENTS_PER_CHUNK // n_genes)))
        bar.update(n)
    bar.close()
    summary = ImportanceSummary.concatenate(parts).take(_ordered(indices, order))
    _warn_unreliable(summary, method)
    return summary.to_frame()


@torch.no_grad()
def elbo_per_cell(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int = 10,
    seed: int = 0,
    batch_size: int = CELLS_PER_PASS,
) -> np.ndarray:
    """ELBO of each cell (analytic KL where available), averaged over ``n_samples`` draws."""
    check_int("n_samples", n_samples, 1)
    seed = check_int("seed", seed, 0)

    def elbo(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([per_cell_elbo(module, x, b) for _ in range(n_samples)]).mean(0)

    return _per_cell(module, source, indices, batch_size, elbo, torch_seed=seed)


@torch.no_grad()
def posterior_predictive(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int = 1,
    seed: int = 0,
    batch_size: int = CELLS_PER_PASS,
) -> np.ndarray:
    """Counts drawn from ``p(x | z)`` with ``z ~ q(z | x)``; shape (cells, genes, n_samples)."""
    check_int("n_samples", n_samples, 1)
    seed = check_int("seed", seed, 0)

    def draws(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        loc, scale = module.encode(x, b)
        eps = torch.randn((n_samples, *loc.shape), dtype=x.dtype).to(x.device)
        return module.conditional(sample_latent(loc, scale, eps), log_library_size(x), b).sample().permute(1, 2, 0)

    return _per_cell(module, source, indices, batch_size, draws, torch_seed=seed)
