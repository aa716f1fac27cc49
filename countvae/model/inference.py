"""Quantities computed from a fitted module on a set of cells.

Every function takes the module, a :class:`CountSource` and the positions of the
cells, visits them in minibatches, and returns numpy arrays in the order of the
given positions. All of them run in eval mode without gradients.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from countvae._checks import check_int, check_number
from countvae.data.loader import CountSource
from countvae.errors import InvalidArgumentError
from countvae.model.training import to_tensors
from countvae.module.importance import ImportanceSummary, summarize_log_weights
from countvae.module.loss import per_cell_elbo
from countvae.module.vae import CountVAEModule, log_library_size, sample_latent

#: Largest number of (sample x cell x gene) elements the importance sampler holds at once.
_ELEMENTS_PER_CHUNK = 2**22


def _dtype_device(module: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    p = next(module.parameters())
    return p.dtype, p.device


def _ordered(indices: np.ndarray, visited: np.ndarray) -> np.ndarray:
    """Positions that put rows gathered in sorted order back into the order of ``indices``."""
    return np.searchsorted(visited, indices)


def _iterate_sorted(source: CountSource, indices: np.ndarray, batch_size: int):
    return source.iterate(np.unique(indices), batch_size, drop_last_singleton=False)


def _check_unique(indices: np.ndarray) -> None:
    if len(np.unique(indices)) != len(indices):
        raise InvalidArgumentError("indices contain duplicates; pass each cell once.")


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
    _check_unique(indices)
    module.eval()
    dtype, device = _dtype_device(module)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for mb in _iterate_sorted(source, indices, batch_size):
        x, b = to_tensors(mb, dtype, device)
        loc, scale = module.encode(x, b)
        if not give_mean:
            eps = torch.randn(loc.shape, generator=gen, dtype=dtype).to(device)
            loc = sample_latent(loc, scale, eps)
        out.append(loc.cpu().numpy())
    z = np.concatenate(out, axis=0)
    return z[_ordered(indices, np.unique(indices))]


@torch.no_grad()
def normalized_expression(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    library_size: float = 1e4,
    n_samples: int = 1,
    transform_batch: int | None = None,
    seed: int = 0,
    batch_size: int = 512,
) -> np.ndarray:
    """Expected counts of each gene at library size ``library_size``, shape (cells, genes).

    ``n_samples == 1`` decodes the posterior mean of ``z``; more samples average
    the decoded expression over draws from ``q(z | x)``. ``transform_batch``
    decodes every cell as if it came from that batch (integer code).
    """
    check_number("library_size", library_size, 0.0, low_open=True)
    check_int("n_samples", n_samples, 1)
    _check_unique(indices)
    module.eval()
    dtype, device = _dtype_device(module)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for mb in _iterate_sorted(source, indices, batch_size):
        x, b = to_tensors(mb, dtype, device)
        loc, scale = module.encode(x, b)
        decode_batch = b if transform_batch is None else torch.full_like(b, transform_batch)
        if n_samples == 1:
            rate = torch.exp(module.decode(loc, decode_batch).log_rate)
        else:
            eps = torch.randn((n_samples, *loc.shape), generator=gen, dtype=dtype).to(device)
            rate = torch.exp(module.decode(sample_latent(loc, scale, eps), decode_batch).log_rate).mean(0)
        out.append((library_size * rate).cpu().numpy())
    values = np.concatenate(out, axis=0)
    return values[_ordered(indices, np.unique(indices))]


@torch.no_grad()
def log_predictive_density(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int = 1000,
    seed: int = 0,
    cells_per_chunk: int = 128,
    progress_bar: bool = False,
) -> pd.DataFrame:
    """Importance-sampling estimate of each cell's ``log p(x)`` with the guide as proposal.

    With ``S = n_samples`` draws ``z_s = loc + scale @ eps_s`` from ``q(z | x)`` and
    weights ``w_s = p(x | z_s) p(z_s) / q(z_s | x)``, the estimate is
    ``log(mean_s w_s)`` (the importance-weighted bound of Burda et al. 2016, a
    lower bound in expectation that tightens as ``S`` grows; it is what scvi-tools'
    ``get_marginal_ll`` computes). The standard error, effective sample size and
    Pareto k-hat are those of :func:`countvae.module.importance.summarize_log_weights`.

    The noise ``eps`` is drawn from a generator seeded with ``seed`` in a fixed
    order (cells in sorted chunks of ``cells_per_chunk``), so two models
    evaluated on the same cells with the same seed share their base noise
    (common random numbers), which the invariance checks rely on.

    Returns
    -------
    pandas.DataFrame
        Columns ``lpd`` (nats), ``mc_se``, ``ess`` and ``khat``, one row per cell in the order of ``indices``.

    """
    _check_unique(indices)
    check_int("n_samples", n_samples, 2)  # a Monte Carlo standard error needs two draws
    module.eval()
    dtype, device = _dtype_device(module)
    gen = torch.Generator().manual_seed(seed)
    n_genes = source.n_vars
    parts: list[ImportanceSummary] = []
    order = np.unique(indices)
    bar = tqdm(total=len(order), desc="log p(x)", unit="cell", disable=not progress_bar)
    for mb in source.iterate(order, cells_per_chunk, drop_last_singleton=False):
        x, b = to_tensors(mb, dtype, device)
        n = x.shape[0]
        loc, scale = module.encode(x, b)
        q = module.posterior_distribution(x, b)
        log_library = log_library_size(x)
        per_draw = max(1, _ELEMENTS_PER_CHUNK // (n * n_genes))
        log_w = []
        for start in range(0, n_samples, per_draw):
            k = min(per_draw, n_samples - start)
            eps = torch.randn((k, n, module.n_latent), generator=gen, dtype=dtype).to(device)
            z = sample_latent(loc, scale, eps)
            log_w.append(module.log_joint(z, x, b, log_library) - q.log_prob(z))
        parts.append(summarize_log_weights(torch.cat(log_w, dim=0)))
        bar.update(n)
    bar.close()
    return ImportanceSummary.concatenate(parts).take(_ordered(indices, order)).to_frame()


@torch.no_grad()
def elbo_per_cell(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int = 10,
    seed: int = 0,
    batch_size: int = 512,
) -> np.ndarray:
    """ELBO of each cell (analytic KL where available), averaged over ``n_samples`` draws."""
    check_int("n_samples", n_samples, 1)
    _check_unique(indices)
    module.eval()
    dtype, device = _dtype_device(module)
    out = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mb in _iterate_sorted(source, indices, batch_size):
            x, b = to_tensors(mb, dtype, device)
            values = torch.stack([per_cell_elbo(module, x, b) for _ in range(n_samples)]).mean(0)
            out.append(values.cpu().numpy())
    values = np.concatenate(out)
    return values[_ordered(indices, np.unique(indices))]


@torch.no_grad()
def posterior_predictive(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    n_samples: int = 1,
    seed: int = 0,
    batch_size: int = 512,
) -> np.ndarray:
    """Counts drawn from ``p(x | z)`` with ``z ~ q(z | x)``; shape (cells, genes, n_samples)."""
    check_int("n_samples", n_samples, 1)
    _check_unique(indices)
    module.eval()
    dtype, device = _dtype_device(module)
    out = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mb in _iterate_sorted(source, indices, batch_size):
            x, b = to_tensors(mb, dtype, device)
            loc, scale = module.encode(x, b)
            eps = torch.randn((n_samples, *loc.shape), dtype=dtype).to(device)
            draws = module.conditional(sample_latent(loc, scale, eps), log_library_size(x), b).sample()
            out.append(draws.permute(1, 2, 0).cpu().numpy())
    values = np.concatenate(out, axis=0)
    return values[_ordered(indices, np.unique(indices))]
