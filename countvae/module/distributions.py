"""Count distributions over a cell's whole gene vector, parameterised by log means.

Pyro distributions (usable at ``pyro.sample`` sites) with event shape (genes,), computing the same log-probability
as Pyro's ``Poisson``, ``NegativeBinomial`` and ``ZeroInflatedNegativeBinomial`` (checked in
tests/module/test_distributions.py) with the arithmetic arranged for sparse counts:

* the terms without the mean, ``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)``, vanish where ``x = 0`` and are
  evaluated on the non-zero counts only (most entries of a single-cell matrix are zero, and ``lgamma`` with its
  ``digamma`` gradient dominated the training step in profiles); with one theta per gene, counts up to
  :data:`SMALL_COUNTS` read them from a per-gene table (:func:`_per_gene_theta_terms`);
* those terms do not depend on ``z``, so an importance sampler with S draws per cell evaluates them once per cell,
  not S times; a caller that evaluates the same cells many times (the ``log p(x)`` estimator's Newton steps, pilot
  and final draws) computes them once (:func:`count_log_constant`) and passes them to
  ``log_prob(value, count_constant=...)``.

Sample validation is off: counts are validated once, at ``setup_anndata``.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.nn import functional as F

#: Attribute under which a count tensor may carry the positions of its non-zero entries (see attach_nonzero_index).
_NONZERO_ATTR = "_countvae_nonzero"
#: Counts up to this value take their ``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` from a per-gene table.
SMALL_COUNTS = 8


def attach_nonzero_index(
    x: torch.Tensor,
    flat_positions: torch.Tensor,
    rows: torch.Tensor | None = None,
    genes: torch.Tensor | None = None,
    per_row: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attach the positions of the non-zero entries of ``x`` (cells, genes) to ``x``.

    ``flat_positions`` are the row-major flat positions (``row * n_genes + gene``), optionally with their ``rows`` and
    ``genes`` and the number of entries ``per_row`` (the loader knows them from the source sparse matrix). The
    likelihoods then skip a search over the dense block (``torch.nonzero``), the divisions that split flat positions and
    a count per row, a measurable share of a training step. The positions must be exactly those of the non-zero entries,
    in increasing order, and ``x`` must not be modified afterwards; a tensor derived from ``x`` (a copy, a move to
    another device) does not carry them and is searched as usual. Returns ``x``.
    """
    if rows is None or genes is None:
        rows, genes = _split_positions(flat_positions, x.shape[-1])
    if per_row is None:
        per_row = torch.bincount(rows, minlength=x.shape[0])
    setattr(x, _NONZERO_ATTR, (flat_positions, rows, genes, per_row))
    return x


def _split_positions(flat: torch.Tensor, n_genes: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.div(flat, n_genes, rounding_mode="floor"), flat % n_genes


def _nonzero_index(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(flat positions, rows, genes, entries per row) of the non-zero entries of a (cells, genes) block."""
    index = getattr(x, _NONZERO_ATTR, None)
    if index is None:
        where = torch.nonzero(x.reshape(-1)).squeeze(1)
        rows, genes = _split_positions(where, x.shape[-1])
        index = (where, rows, genes, torch.bincount(rows, minlength=x.shape[0]))
    return index


def _small_count_table(theta: torch.Tensor) -> torch.Tensor:
    """``lgamma(theta + k) - lgamma(theta) - lgamma(k + 1)`` for ``k = 1..SMALL_COUNTS``, shape (SMALL_COUNTS, n).

    ``theta`` has shape (n,). ``lgamma(theta + k) - lgamma(theta) = sum_{j < k} log(theta + j)``, a cumulative sum of
    logarithms with a sum of reciprocals as gradient: no ``lgamma`` and no ``digamma`` in theta (several times slower
    than the other element-wise operations on CPU).
    """
    steps = torch.arange(SMALL_COUNTS, dtype=theta.dtype, device=theta.device).unsqueeze(1)
    return torch.cumsum(torch.log(theta + steps), dim=0) - torch.lgamma(steps + 2.0)


def _direct_terms(values: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` entry by entry (``theta`` matched to ``values``)."""
    return torch.lgamma(values + theta) - torch.lgamma(theta) - torch.lgamma(values + 1.0)


def _small_counts(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each value's table row (``k - 1``, clipped into the table) and whether the table holds it exactly."""
    whole = values.clamp(1.0, SMALL_COUNTS).floor_()
    return whole.to(torch.long) - 1, values == whole


def _per_gene_theta_terms(values: torch.Tensor, genes: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` at non-zero counts ``values`` with one theta per gene.

    Single-cell counts are mostly small. For a whole count ``k`` up to :data:`SMALL_COUNTS` the term depends only on
    ``k`` and the gene and is read from :func:`_small_count_table` (``lgamma`` and ``digamma`` per count took a
    quarter of a training step on 2,000 genes). Every other value (larger counts, anything not a whole number from 1
    to SMALL_COUNTS) is evaluated directly, so the result is the same function for any non-negative ``values``.
    """
    row, small = _small_counts(values)
    terms = _small_count_table(theta).reshape(-1).index_select(0, row * theta.shape[0] + genes)
    direct = torch.nonzero(~small).squeeze(1)
    if direct.numel() == 0:
        return terms
    exact = _direct_terms(values.index_select(0, direct), theta.index_select(0, genes.index_select(0, direct)))
    return terms.index_copy(0, direct, exact)


def count_log_constant_sum(
    x: torch.Tensor, log_theta: torch.Tensor | None, theta_row: torch.Tensor | None = None
) -> torch.Tensor:
    """The sum over cells of :func:`count_log_constant`, a scalar, for a loss that averages over cells.

    ``log_theta`` has shape (rows, genes) (``None``: Poisson); cell ``c`` uses row ``theta_row[c]`` (``None``: row 0 for
    every cell). Same value as ``count_log_constant(x, log_theta[theta_row]).sum()``, arranged for a training step: the
    small whole counts go into one histogram per (count, gene, row), multiplied with :func:`_small_count_table`, so the
    gradient is one product of the histogram with the table's, where the per-cell form sends a gradient back to every
    non-zero entry (a gather forward, a scatter backward; together about a sixth of a training step on 2,000 genes).
    """
    where, rows, genes, _ = _nonzero_index(x)
    values = x.reshape(-1).index_select(0, where)
    if log_theta is None:
        return -torch.lgamma(values + 1.0).sum()
    theta = torch.exp(log_theta).reshape(-1)  # row-major (rows, genes)
    columns = genes if theta_row is None else theta_row.index_select(0, rows) * x.shape[-1] + genes
    row, small = _small_counts(values)
    bins = row * theta.shape[0] + columns
    histogram = torch.bincount(bins, weights=small.to(values.dtype), minlength=SMALL_COUNTS * theta.shape[0])
    total = torch.dot(histogram, _small_count_table(theta).reshape(-1))
    direct = torch.nonzero(~small).squeeze(1)
    if direct.numel() == 0:
        return total
    theta_direct = theta.index_select(0, columns.index_select(0, direct))
    return total + _direct_terms(values.index_select(0, direct), theta_direct).sum()


def _nonzero_lgamma_terms(x: torch.Tensor, theta: torch.Tensor | None) -> torch.Tensor:
    """Sum over genes of ``lgamma(x+theta) - lgamma(theta) - lgamma(x+1)`` (``theta=None``: Poisson's ``-lgamma(x+1)``).

    ``x`` has shape (cells, genes); ``theta`` broadcasts against it. Returns shape (cells,). Only the non-zero counts
    are visited (the terms vanish at ``x = 0``): their positions (attached by the loader, or one ``nonzero`` call),
    gathers, and a sum per cell over the entries, in row order (a segment sum: about half the time of a
    scatter-add). With one ``theta`` per gene, see :func:`_per_gene_theta_terms`.
    """
    n_cells, n_genes = x.shape
    where, _, genes, per_row = _nonzero_index(x)
    values = x.reshape(-1).index_select(0, where)
    if theta is None:
        terms = -torch.lgamma(values + 1.0)
    elif theta.dim() == 1 and theta.shape[0] == n_genes:
        terms = _per_gene_theta_terms(values, genes, theta)
    else:
        terms = _direct_terms(values, theta.expand(n_cells, n_genes).reshape(-1).index_select(0, where))
    return torch.segment_reduce(terms, "sum", lengths=per_row, unsafe=True)


def _gene_dot(block: torch.Tensor, per_cell: torch.Tensor) -> torch.Tensor:
    """``(block * per_cell).sum(-1)`` for a block (..., cells, genes) and a (cells, genes) matrix.

    One contraction (a batched matrix-vector product) instead of a product block and a sum.
    """
    if per_cell.dim() == 2 and block.dim() > 2 and block.shape[-2:] == per_cell.shape:
        return torch.einsum("...cg,cg->...c", block, per_cell)
    return (block * per_cell).sum(-1)


def count_log_constant(x: torch.Tensor, log_theta: torch.Tensor | None) -> torch.Tensor:
    """The terms of the log probability of counts ``x`` (cells, genes) that do not involve the mean.

    Per cell, the sum over genes of ``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` (``log_theta`` None, Poisson:
    ``-lgamma(x + 1)``), ``log_theta`` broadcasting against ``x``; the same for the zero-inflated NB, which adds them at
    every gene (they vanish at ``x = 0``). Shape (cells,), in the dtype of ``x``: float64 counts with float32
    parameters give the terms in float64 (their sum over a deep cell's genes cancels to a few thousandths of its parts,
    below float32's resolution).
    """
    return _nonzero_lgamma_terms(x, None if log_theta is None else torch.exp(log_theta.to(x.dtype)))


class _GeneVectorDistribution(TorchDistribution):
    """Shared plumbing: batch shape (..., cells), event shape (genes,)."""

    arg_constraints: dict = {}
    support = constraints.independent(constraints.nonnegative_integer, 1)
    has_rsample = False

    def __init__(self, log_mean: torch.Tensor):
        self.log_mean = log_mean
        super().__init__(batch_shape=log_mean.shape[:-1], event_shape=log_mean.shape[-1:], validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        """Expected counts."""
        return torch.exp(self.log_mean)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        raise NotImplementedError("count distributions are built at their final batch shape")


class PoissonLogMean(_GeneVectorDistribution):
    """Independent Poisson counts per gene with mean ``exp(log_mean)``."""

    def log_prob(self, value: torch.Tensor, count_constant: torch.Tensor | None = None) -> torch.Tensor:
        """Log probability summed over genes, shape (..., cells).

        ``count_constant``: :func:`count_log_constant` of ``value``, when the caller has it.
        """
        const = _nonzero_lgamma_terms(value, None) if count_constant is None else count_constant
        return (value * self.log_mean - torch.exp(self.log_mean)).sum(-1) + const

    def sample(self, sample_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """Draw counts."""
        with torch.no_grad():
            return dist.Poisson(torch.exp(self.log_mean)).sample(sample_shape)


class NegativeBinomialLogMean(_GeneVectorDistribution):
    """Independent NB counts per gene with mean ``exp(log_mean)`` and inverse dispersion ``theta``.

    Variance ``mu + mu^2 / theta``; it is Pyro's ``NegativeBinomial(total_count=theta, logits=log_mean - log(theta))``.
    """

    def __init__(self, log_mean: torch.Tensor, log_theta: torch.Tensor):
        self.log_theta = log_theta
        super().__init__(log_mean)

    def _mean_terms(self, value: torch.Tensor) -> torch.Tensor:
        """Per-gene ``theta log(theta/(theta+mu)) + x log(mu/(theta+mu))``.

        Written as ``x d - (x + theta) softplus(d)`` with ``d = log mu - log theta``: the same number, in fewer passes
        over the (cells, genes) block forward and backward than the ``logaddexp`` form (about 35% less time for this
        term, benchmarks/RESULTS.md). The softplus threshold of 40 keeps it exact to double precision (``exp(-40)`` is
        below float64 resolution at 40).
        """
        d = self.log_mean - self.log_theta
        return value * d - (value + torch.exp(self.log_theta)) * F.softplus(d, threshold=40.0)

    def log_prob(self, value: torch.Tensor, count_constant: torch.Tensor | None = None) -> torch.Tensor:
        """Log probability summed over genes, shape (..., cells).

        ``count_constant``: :func:`count_log_constant` of ``value`` and this ``log_theta``, when the caller has it.

        The sum of :meth:`_mean_terms` over genes is taken as contractions with the counts,
        ``x . log mu - x . log theta - (x + theta) . softplus(d)``, passing over a block of (draws, cells, genes) log
        means half as often as the per-gene form (the importance sampler's evaluations: 40% less time forward, 25%
        with the gradient, for 100 draws of 128 cells x 2,000 genes in float32).
        """
        const = count_log_constant(value, self.log_theta) if count_constant is None else count_constant
        d = self.log_mean - self.log_theta
        summed = (
            _gene_dot(self.log_mean, value)
            - (value * self.log_theta).sum(-1)
            - _gene_dot(F.softplus(d, threshold=40.0), value + torch.exp(self.log_theta))
        )
        return summed + const

    def sample(self, sample_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """Draw counts (gamma-Poisson mixture)."""
        with torch.no_grad():
            theta = torch.exp(self.log_theta).expand_as(self.log_mean)
            return dist.GammaPoisson(theta, theta / torch.exp(self.log_mean)).sample(sample_shape)


class ZeroInflatedNegativeBinomialLogMean(NegativeBinomialLogMean):
    """NB counts per gene set to zero with probability ``sigmoid(gate_logits)``."""

    def __init__(self, log_mean: torch.Tensor, log_theta: torch.Tensor, gate_logits: torch.Tensor):
        self.gate_logits = gate_logits
        super().__init__(log_mean, log_theta)

    @property
    def mean(self) -> torch.Tensor:
        """Expected counts, ``(1 - pi) mu``."""
        return torch.sigmoid(-self.gate_logits) * torch.exp(self.log_mean)

    def log_prob(self, value: torch.Tensor, count_constant: torch.Tensor | None = None) -> torch.Tensor:
        """Log probability summed over genes, shape (..., cells).

        ``count_constant``: as for :meth:`NegativeBinomialLogMean.log_prob`.
        """
        const = count_log_constant(value, self.log_theta) if count_constant is None else count_constant
        nb_terms = self._mean_terms(value)  # NB log-prob less the lgamma terms (which are 0 at x = 0)
        log_keep = -torch.nn.functional.softplus(self.gate_logits)  # log(1 - pi)
        log_gate = self.gate_logits + log_keep  # log(pi)
        at_zero = torch.logaddexp(log_gate, log_keep + nb_terms)
        per_gene = torch.where(value > 0, log_keep + nb_terms, at_zero)
        return per_gene.sum(-1) + const

    def sample(self, sample_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """Draw counts."""
        with torch.no_grad():
            counts = super().sample(sample_shape)
            gate = torch.bernoulli(torch.sigmoid(self.gate_logits).expand_as(counts))
            return counts * (1 - gate)
