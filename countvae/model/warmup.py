"""How long training will take: a few timed training steps on the actual data and settings, extrapolated."""

from __future__ import annotations

import math
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import anndata as ad
import numpy as np
import torch

from countvae._checks import check_int
from countvae.data.backed import backed_view_counts, cells_in_memory
from countvae.data.loader import DEFAULT_BLOCK_CELLS, DEFAULT_BUFFER_BLOCKS, CountSource, block_shuffle_order
from countvae.data.registry import Registry, batch_codes, get_count_matrix, get_registry
from countvae.data.split import split_indices
from countvae.errors import InvalidArgumentError, SetupError
from countvae.model.countvae import CountVAE
from countvae.model.query import resolve_registry
from countvae.model.training import (
    DEFAULT_STOPPING,
    TrainingPlan,
    default_max_epochs,
    train_module,
    validation_batch_size,
)

#: Minibatches timed by default (after as many untimed ones, which absorb one-off allocation costs).
WARMUP_STEPS = 10
#: The epoch at which ``DEFAULT_STOPPING`` ends a fit:
#: ``STOP_EPOCH_SCALE * n_genes ** STOP_EPOCH_GENES_EXPONENT * n_train_cells ** STOP_EPOCH_CELLS_EXPONENT``, a power law
#: fitted by least squares on the logarithms of the measured stops of the rule with its learning-rate cut, then moved so
#: that its largest over- and under-prediction are the same factor: 25 fits on 230-2,000 genes and 65-8,100 training
#: cells (benchmarks/RESULTS.md, sections stopping-vs-full and stopping-variants; tests/cli/test_first_contact.py holds
#: them), every one within a factor 1.37 of its prediction. Fits on more genes stop sooner; the cells matter little.
STOP_EPOCH_SCALE = 310.43
STOP_EPOCH_GENES_EXPONENT = -0.201
STOP_EPOCH_CELLS_EXPONENT = -0.058
#: Fewest epochs predicted: no fit stops before each of the rule's stages has lasted a patience.
MIN_STOP_EPOCH = DEFAULT_STOPPING.fewest_epochs


def expected_stop_epoch(n_genes: int, n_train_cells: int, max_epochs: int) -> int:
    """The epoch at which the shared stopping rule is expected to end a fit on ``n_genes`` genes.

    Calibrated on measured runs (:data:`STOP_EPOCH_SCALE`); at least :data:`MIN_STOP_EPOCH`, at most ``max_epochs``;
    counts below 1 count as 1. An expectation for planning, not a bound: one data set's seeds stopped up to 1.4x apart.
    """
    predicted = (
        STOP_EPOCH_SCALE
        * max(int(n_genes), 1) ** STOP_EPOCH_GENES_EXPONENT
        * max(int(n_train_cells), 1) ** STOP_EPOCH_CELLS_EXPONENT
    )
    return int(min(max_epochs, max(MIN_STOP_EPOCH, round(predicted))))


@dataclass(frozen=True)
class TrainingTimeEstimate:
    """The time one fit is expected to take, from a timed warm-up.

    Attributes
    ----------
    seconds_per_epoch
        Extrapolated time of one epoch on all cells (training steps and the validation loss, at the fit's proportions),
        ``read_seconds_per_epoch`` included.
    epochs
        Epochs of the fit (``max_epochs``, or the default for its size); with early stopping, the most.
    expected_epochs
        Epochs the fit is expected to train: ``epochs``, or with early stopping at the
        shared rule's settings (``DEFAULT_STOPPING``) ``expected_stop_epoch``.
    warmup_seconds
        Wall time of the whole warm-up (timed and untimed steps).
    warmup_steps
        Training minibatches timed.
    warmup_cells
        Cells of the timed pass (training and validation).
    read_seconds_per_epoch
        Of a backed AnnData, the part of ``seconds_per_epoch`` an epoch spends reading the file, timed on reads made
        as the fit makes them (``_read_seconds_per_epoch``); 0 for counts in memory (a backed file's layers too).

    """

    seconds_per_epoch: float
    epochs: int
    warmup_seconds: float
    warmup_steps: int
    warmup_cells: int
    expected_epochs: int
    read_seconds_per_epoch: float = 0.0

    @property
    def seconds_per_fit(self) -> float:
        """The expected seconds of one fit, expected epochs times seconds per epoch (training only, not saving)."""
        return self.expected_epochs * self.seconds_per_epoch


def estimate_training_time(
    adata: ad.AnnData,
    model_kwargs: dict[str, Any] | None = None,
    train_kwargs: dict[str, Any] | None = None,
    *,
    n_steps: int = WARMUP_STEPS,
    seed: int = 0,
    torch_threads: int | None = None,
) -> TrainingTimeEstimate:
    """Time ``n_steps`` training minibatches of the model a fit would train, and extrapolate to the whole fit.

    A fresh :class:`~countvae.model.CountVAE` built on ``adata`` with ``model_kwargs`` trains on a random subset of
    ``n_steps`` minibatches of cells (and validation cells in the fit's proportion, their loss evaluated as in every
    epoch) once untimed, then once timed; the timed pass's time per cell, times the cells of ``adata``, is the time per
    epoch. Nothing of the warm-up is kept: the fits start from their own seeds.

    Parameters
    ----------
    adata
        The cells a fit trains on, registered with :func:`countvae.data.setup_anndata`. Of a backed AnnData (or a
        view of one) the warm-up's cells are read into memory and their steps timed as such, and the time the fit's
        reads of the file take is timed apart and added (``read_seconds_per_epoch``): the warm-up reads one shuffling
        buffer (``8 x shuffle_block_cells``, 8,192 cells by default) and one validation minibatch of the file, one at
        a time, no more than a fit holds. Counts in a layer are in memory (anndata reads layers whole): no reads.
    model_kwargs
        Constructor arguments of :class:`~countvae.model.CountVAE`.
    train_kwargs
        Arguments of :meth:`~countvae.model.CountVAE.train` (``max_epochs``, ``batch_size``, ``lr``, ``train_size``,
        ...). With ``early_stopping`` at the shared rule's settings the fit is expected to stop at
        ``expected_stop_epoch`` (other stopping settings: at its last epoch). The warm-up runs on the CPU.
    n_steps
        Minibatches timed (fewer when ``adata`` has fewer cells).
    seed
        Seed of the subset and of the warm-up model.
    torch_threads
        Torch threads during the warm-up (``None``: as set); give the number the fits use.

    Returns
    -------
    TrainingTimeEstimate

    Raises
    ------
    SetupError
        If ``adata`` is not registered.
    InvalidArgumentError
        For ``adata`` not an AnnData, ``n_steps`` or ``torch_threads`` below 1, or invalid model or training arguments.

    """
    n_steps = check_int("n_steps", n_steps, 1)
    if torch_threads is not None:
        torch_threads = check_int("torch_threads", torch_threads, 1)
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"adata must be an AnnData, got {type(adata).__name__}.")
    registry = get_registry(adata)
    if registry is None:
        raise SetupError("Register the AnnData with countvae.data.setup_anndata before estimating training time.")
    train = {k: v for k, v in (train_kwargs or {}).items() if k not in ("progress_bar", "seed")}
    plan = TrainingPlan(**{**train, "max_epochs": 1, "seed": seed, "progress_bar": False})
    n_cells = adata.n_obs
    n_train_cells = max(1, int(round(plan.train_size * n_cells)))
    max_epochs = train.get("max_epochs")
    epochs = default_max_epochs(n_train_cells) if max_epochs is None else int(max_epochs)

    n_train = min(n_train_cells, n_steps * plan.batch_size)
    n_validation = min(n_cells - n_train, int(round(n_train * (1.0 - plan.train_size) / plan.train_size)))
    cells = np.random.default_rng(seed).permutation(n_cells)[: n_train + n_validation]
    train_cells, validation_cells = np.sort(cells[:n_train]), np.sort(cells[n_train:])

    previous_threads = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        started = perf_counter()
        model = CountVAE(adata, **(model_kwargs or {}))  # on the CPU, where CountVAE builds it
        module = model.module
        # codes in the model's batches, as train reads them (a subset made after registering has fewer)
        codes = batch_codes(adata, resolve_registry(adata, model.registry))
        read = _read_seconds_per_epoch(adata, registry, codes, plan, seed) if adata.isbacked else 0.0
        source, train_at, validation_at = _warmup_source(adata, registry, codes, train_cells, validation_cells)
        train_module(module, source, train_at, validation_at, plan)
        timed_start = perf_counter()
        train_module(module, source, train_at, validation_at, plan)
        timed = perf_counter() - timed_start
        total = perf_counter() - started
    finally:
        torch.set_num_threads(previous_threads)
    timed_cells = n_train + n_validation
    stops = plan.early_stopping and _default_rule(plan)
    return TrainingTimeEstimate(
        seconds_per_epoch=timed / timed_cells * n_cells + read,
        epochs=int(epochs),
        expected_epochs=expected_stop_epoch(adata.n_vars, n_train_cells, int(epochs)) if stops else int(epochs),
        warmup_seconds=total,
        warmup_steps=int(math.ceil(n_train / plan.batch_size)),
        warmup_cells=int(timed_cells),
        read_seconds_per_epoch=read,
    )


def _warmup_source(
    adata: ad.AnnData, registry: Registry, codes: np.ndarray, train_cells: np.ndarray, validation_cells: np.ndarray
) -> tuple[CountSource, np.ndarray, np.ndarray]:
    """The counts the warm-up trains on, and the positions of its train and validation cells in them.

    Of a backed AnnData only the warm-up's cells are read, into memory: the rest stay on disk, and the timed pass
    trains as on data in memory (the fits' block-shuffled reading of a file, whose blocks around a few scattered
    cells would span it all, is timed apart by ``_read_seconds_per_epoch``).
    """
    if not adata.isbacked or registry.layer is not None:  # anndata holds a backed file's layers in memory
        return CountSource(get_count_matrix(adata, registry), codes), train_cells, validation_cells
    cells = np.sort(np.concatenate([train_cells, validation_cells]))
    source = CountSource(get_count_matrix(cells_in_memory(adata, cells), registry), codes[cells])
    return source, np.searchsorted(cells, train_cells), np.searchsorted(cells, validation_cells)


def _read_seconds_per_epoch(
    adata: ad.AnnData, registry: Registry, codes: np.ndarray, plan: TrainingPlan, seed: int
) -> float:
    """Seconds an epoch of a fit on backed ``adata`` spends reading the file, from reads made as the fit makes them.

    The fit's training split and first shuffling buffers (block shuffling, read as contiguous row slices; at least one
    default buffer's cells, or all training cells) and its first validation minibatch (read as runs of rows) are read
    from the file and timed; their time per cell, times the training cells, plus the validation cells' at the fit's
    validation interval, is the epoch's. What the fit does with the rows once read is in the timed training pass.
    """
    if registry.layer is None and not registry.use_raw and adata.is_view and backed_view_counts(adata) is None:
        return 0.0  # anndata reads the cells of such a view into memory, for the fit too: no file reads to time
    source = CountSource(get_count_matrix(adata, registry), codes)
    if not source.is_backed:
        return 0.0  # counts in memory (a layer of a backed file): the timed pass counts their reads
    train, validation = split_indices(adata.n_obs, plan.train_size, seed)
    block_cells = plan.shuffle_block_cells or DEFAULT_BLOCK_CELLS
    rng = np.random.default_rng(seed)
    order, buffers = block_shuffle_order(train, block_cells, DEFAULT_BUFFER_BLOCKS, rng)
    cells, started = 0, perf_counter()
    for start, stop in buffers:
        source.read_rows(np.sort(order[start:stop]))
        cells += stop - start
        if cells >= DEFAULT_BLOCK_CELLS * DEFAULT_BUFFER_BLOCKS:
            break
    seconds = (perf_counter() - started) / max(cells, 1) * len(train)
    if len(validation):
        first = validation[: validation_batch_size(plan)]
        started = perf_counter()
        source.read_rows(first)
        seconds += (perf_counter() - started) / len(first) * len(validation) / plan.validation_interval
    return seconds


def _default_rule(plan: TrainingPlan) -> bool:
    """Whether ``plan``, with early stopping, stops by the shared rule's settings (``expected_stop_epoch``'s)."""
    rule = DEFAULT_STOPPING.settings()
    resolved = {name: getattr(plan, name) for name in rule}
    resolved.update(lr=plan.learning_rate, check_val_every_n_epoch=plan.validation_interval)  # defaults resolved
    return resolved == rule
