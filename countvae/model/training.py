"""The training loop: minibatch stochastic variational inference with a torch optimiser."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._settings import documents_settings, setting
from countvae.data.loader import CountSource, Minibatch
from countvae.errors import InvalidArgumentError, TrainingDivergedError
from countvae.module.distributions import attach_nonzero_index
from countvae.module.loss import minibatch_loss
from countvae.module.vae import CountVAEModule

logger = logging.getLogger(__name__)

#: The columns of a training history, one row per epoch (see :func:`train_module`).
HISTORY_COLUMNS = ("epoch", "loss_train", "loss_validation", "kl_weight", "lr")

#: scvi-tools' learning rate, ``CountVAE.train``'s without early stopping.
SCVI_LR = 1e-3

#: Values of ``CountVAE.train(accelerator=...)``: ``"gpu"`` and ``"cuda"`` are the same.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


@dataclass(frozen=True)
class StoppingRule:
    """The early-stopping rule of ``CountVAE.train`` and ``countvae diagnose``, defined once.

    Train at learning rate ``lr``; validate every ``check_val_every_n_epoch`` epochs; an improvement counts by
    ``relative_delta`` (:class:`ConvergenceRule`). When ``patience`` epochs pass without one, the rule *fires*: the
    first ``lr_reductions`` times it restores the parameters of the best validation loss, multiplies the learning rate
    by ``lr_factor`` and goes on with a fresh patience; the next time it stops, keeping the best parameters seen.

    The rate starts ten times above scvi-tools' 1e-3 and drops to it once, reaching a better held-out fit in fewer
    epochs than 1e-3 throughout; on the embedded simulation within 1-2.3 nats per cell of the full 400-epoch schedule
    (benchmarks/bench_stopping.py and bench_stopping_variants.py, sections "stopping-vs-full" and "stopping-variants" of
    benchmarks/RESULTS.md).
    """

    check_val_every_n_epoch: int = 2
    patience: int = 10
    relative_delta: float = 1e-3
    lr: float = 1e-2
    lr_reductions: int = 1
    lr_factor: float = 0.1

    def settings(self) -> dict[str, int | float]:
        """The rule as the stopping keywords of ``CountVAE.train`` (its learning rate included)."""
        return {
            "check_val_every_n_epoch": self.check_val_every_n_epoch,
            "early_stopping_patience": self.patience,
            "early_stopping_relative_delta": self.relative_delta,
            "lr": self.lr,
            "early_stopping_lr_reductions": self.lr_reductions,
            "early_stopping_lr_factor": self.lr_factor,
        }

    def train_kwargs(self) -> dict[str, int | float | bool]:
        """The rule as keywords of ``CountVAE.train``, early stopping on."""
        return {"early_stopping": True, **self.settings()}

    @property
    def fewest_epochs(self) -> int:
        """The earliest epoch at which the rule can stop a fit: each stage lasts at least a patience."""
        return (self.lr_reductions + 1) * (self.patience + self.check_val_every_n_epoch)


#: The one stopping rule: ``CountVAE.train``'s defaults and ``diagnose``'s come from it.
DEFAULT_STOPPING = StoppingRule()


def default_max_epochs(n_cells: int) -> int:
    """scvi-tools' default number of epochs: ``min(round(20000 / n_cells * 400), 400)``.

    scvi-tools applies it to every cell of the AnnData; countvae to the training cells (see ``TrainingPlan``'s
    ``max_epochs``).
    """
    return int(min(round(20000 / max(n_cells, 1) * 400), 400))


@documents_settings()
@dataclass(frozen=True)
class TrainingPlan:
    """The arguments of one call to ``CountVAE.train``, checked once when created.

    Each field is declared once here, with its description; ``CountVAE.train`` takes them as keywords (or a whole plan
    as ``plan=``) and generates its signature and "Parameters" section from them (``countvae._settings``).

    ``max_epochs=None`` means :func:`~countvae.model.training.default_max_epochs` of the number of training cells
    (:meth:`epochs_for`). ``CountVAE.train`` uses ``train_size`` and ``accelerator`` (the split and the device);
    :func:`~countvae.model.training.train_module` reads the rest.

    Attributes
    ----------
    {settings}

    """

    max_epochs: int | None = setting(
        None,
        """Passes over the training cells. ``None``: scvi-tools' rule ``min(round(20000 / n * 400), 400)``, but with
        ``n`` the number of training cells (``train_size`` of them), where scvi-tools counts every cell of the AnnData:
        above 20,000 cells countvae allows more epochs (with the default ``train_size=0.9``, 400 up to 22,222 cells,
        then about 11% more: 356 against scvi-tools' 320 on 25,000 cells, 178 against 160 on 50,000). This departure
        is kept because every default training length, and the benchmarks and verdict calibration measured with
        them, follow it; pass ``max_epochs`` to train scvi-tools' number.""",
    )
    batch_size: int = setting(128, "Cells per minibatch.")
    lr: float | None = setting(
        None,
        """Adam learning rate, set at the start of every call (also when continuing). ``None``: scvi-tools' 1e-3
        without early stopping; with it the shared rule's 1e-2 (``DEFAULT_STOPPING``), cut by
        ``early_stopping_lr_factor`` when the rule fires (``early_stopping_lr_reductions``).""",
    )
    train_size: float = setting(
        0.9,
        """Fraction of cells trained on; the rest report a validation loss. The first call fixes the split; a further
        call continues on it and refuses a ``train_size`` asking for another (scvi-tools splits again at each call):
        train a new model for another split.""",
    )
    early_stopping: bool = setting(
        True,
        """Stop (after any KL warm-up) when the validation loss has not improved for ``early_stopping_patience``
        epochs, restoring the parameters of the best validation loss (scvi-tools' Pyro models have no validation loss
        and reject this option). ``training_summary`` records the epochs trained and the epoch kept. On by default,
        with the shared rule ``DEFAULT_STOPPING`` that ``diagnose`` uses, where scvi-tools trains its whole schedule
        unless asked: against that schedule (400 epochs at 1e-3) the rule fits held-out cells 3.5-3.8 nats per cell
        better on all of Kang, 15-26 on pbmc_3tech and on 3,000 Kang cells and 8-30 on files of 80-400 Kang cells, in a
        tenth of the time or less, and is 1-2 nats per cell short on the embedded simulation (benchmarks/RESULTS.md,
        sections stopping-vs-full, stopping-vs-full-kang-all and stopping-small-files). Its latent space labels
        held-out cells as well and separates cell types more (Leiden at a given resolution makes more clusters), but
        on pbmc_3tech mixes the three technologies less (batch mixing 0.83 against 0.93; sections stopping-latent and
        stopping-latent-schedules: mixing grows with training, past the best held-out fit): to integrate batches with
        strong technical effects, compare with ``early_stopping=False``, which trains every epoch of ``max_epochs``, at
        scvi-tools' 1e-3 unless ``lr`` is given, and which training on every cell (``train_size=1.0``) needs.""",
    )
    seed: int = setting(0, "Seed of the fit.")
    progress_bar: bool = setting(True, "Show a tqdm progress bar.")
    early_stopping_patience: int = setting(
        DEFAULT_STOPPING.patience,
        "Epochs without an improvement that counts before stopping (default: the shared rule ``DEFAULT_STOPPING``).",
    )
    early_stopping_relative_delta: float = setting(
        DEFAULT_STOPPING.relative_delta,
        """An improvement counts when the validation loss falls below its value at the last improvement that counted
        by more than this fraction of that value's magnitude (the default ``1e-3``, of the shared rule
        ``DEFAULT_STOPPING``: 1.3 nats per cell on a loss of 1,300); 0 counts every improvement. Relative, unlike
        scvi-tools' absolute ``early_stopping_min_delta``, so one value suits data sets whose losses differ in scale (a
        negative ELBO per cell of hundreds to thousands of nats).""",
    )
    early_stopping_lr_reductions: int = setting(
        DEFAULT_STOPPING.lr_reductions,
        """With early stopping: how many times the stopping rule, when it fires, restores the parameters of the best
        validation loss, multiplies the learning rate by ``early_stopping_lr_factor`` and goes on with a fresh
        patience, before it stops training (default 1, the shared rule's; 0 stops at the first firing, as
        scvi-tools' early stopping does). Each cut is logged and recorded in the history's ``lr`` column.""",
    )
    early_stopping_lr_factor: float = setting(
        DEFAULT_STOPPING.lr_factor, "The factor (between 0 and 1) of each learning-rate cut of early stopping."
    )
    check_val_every_n_epoch: int | None = setting(
        None,
        """Compute the validation loss every this many epochs (and at the last epoch); the history holds NaN at the
        other epochs. ``None``: every ``DEFAULT_STOPPING.check_val_every_n_epoch`` (2) epochs with early stopping,
        every epoch without. It does not change the fit (the validation pass has its own random numbers), only the
        time it costs and the epochs at which early stopping can stop.""",
    )
    kl_warmup_epochs: int = setting(
        0,
        """Ramp the KL weight linearly from ``1 / kl_warmup_epochs`` to 1 over that many epochs (scvi-tools' SCVI
        default is 400; 0 trains the plain ELBO).""",
    )
    weight_decay: float = setting(0.0, "Adam weight decay (scvi-tools' training plan: 1e-6).")
    adam_eps: float = setting(
        1e-8,
        """Adam's epsilon, added to the root mean square of each gradient (torch's default 1e-8; scvi-tools' training
        plan uses 0.01, which damps the steps of parameters with small gradients and, on pbmc_3tech, slows
        overfitting: benchmarks/RESULTS.md, time to quality). Used when the optimiser is created (the first call).""",
    )
    accelerator: str = setting("auto", """``"auto"`` (GPU when torch sees one), ``"cpu"`` or ``"gpu"``.""")
    engine: Literal["direct", "pyro"] = setting(
        "direct",
        """``"direct"`` (default) or ``"pyro"``: same loss and gradients, see
        :func:`countvae.module.minibatch_loss`.""",
    )
    shuffle_block_cells: int | None = setting(
        None,
        """How minibatches are drawn. ``None`` (default): a uniform random permutation of the training cells each
        epoch for in-memory data, and block shuffling with blocks of 1,024 consecutive cells for backed data
        (``anndata.read_h5ad(..., backed="r")``), which reads the file in large contiguous slices and keeps memory
        bounded. An integer forces block shuffling with that block size; see :mod:`countvae.data.loader` for the
        exact order. In-memory and backed data give identical fits for the same value.""",
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every argument and store plain Python values.

        Raises
        ------
        InvalidArgumentError
            Naming the first argument that is out of range.

        """
        normalised = {
            "max_epochs": None if self.max_epochs is None else check_int("max_epochs", self.max_epochs, 1),
            "batch_size": check_int("batch_size", self.batch_size, 1),
            "lr": None if self.lr is None else check_number("lr", self.lr, 0.0, low_open=True),
            "train_size": check_number("train_size", self.train_size, 0.0, 1.0, low_open=True),
            "weight_decay": check_number("weight_decay", self.weight_decay, 0.0),
            "adam_eps": check_number("adam_eps", self.adam_eps, 0.0, low_open=True),
            "kl_warmup_epochs": check_int("kl_warmup_epochs", self.kl_warmup_epochs, 0),
            "early_stopping_patience": check_int("early_stopping_patience", self.early_stopping_patience, 1),
            "early_stopping_relative_delta": check_number(
                "early_stopping_relative_delta", self.early_stopping_relative_delta, 0.0, 1.0, high_open=True
            ),
            "early_stopping_lr_reductions": check_int(
                "early_stopping_lr_reductions", self.early_stopping_lr_reductions, 0
            ),
            "early_stopping_lr_factor": check_number(
                "early_stopping_lr_factor", self.early_stopping_lr_factor, 0.0, 1.0, low_open=True, high_open=True
            ),
            "check_val_every_n_epoch": None
            if self.check_val_every_n_epoch is None
            else check_int("check_val_every_n_epoch", self.check_val_every_n_epoch, 1),
            "engine": check_choice("engine", self.engine, ("direct", "pyro")),
            "seed": check_int("seed", self.seed, 0),
            "shuffle_block_cells": None
            if self.shuffle_block_cells is None
            else check_int("shuffle_block_cells", self.shuffle_block_cells, 1),
            "accelerator": check_choice("accelerator", self.accelerator, ACCELERATORS),
        }
        for name in ("early_stopping", "progress_bar"):
            normalised[name] = check_bool(name, getattr(self, name))
        for name, value in normalised.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, at creation

    @property
    def learning_rate(self) -> float:
        """``lr``, or its default: the shared rule's starting rate with early stopping, scvi-tools' without."""
        if self.lr is not None:
            return self.lr
        return DEFAULT_STOPPING.lr if self.early_stopping else SCVI_LR

    @property
    def validation_interval(self) -> int:
        """The number of epochs between validation passes (``check_val_every_n_epoch``, or its default)."""
        if self.check_val_every_n_epoch is not None:
            return self.check_val_every_n_epoch
        return DEFAULT_STOPPING.check_val_every_n_epoch if self.early_stopping else 1

    def epochs_for(self, n_train_cells: int) -> int:
        """``max_epochs``, or scvi-tools' rule applied to ``n_train_cells`` (not to all cells) when it is ``None``."""
        return self.max_epochs if self.max_epochs is not None else default_max_epochs(n_train_cells)


@dataclass(frozen=True)
class TrainingRun:
    """What one call to :func:`train_module` did.

    Attributes
    ----------
    history
        One row per epoch (see :func:`train_module`).
    optimizer
        The optimiser, to continue with.
    max_epochs
        Epochs the call could train.
    epochs
        Epochs it trained (fewer than ``max_epochs`` when it stopped early).
    stopped_early
        Whether the stopping rule ended training before ``max_epochs``.
    kept_epoch
        The epoch (numbered as in the history) whose parameters the module holds: the best validation loss's with
        early stopping, else the last.

    """

    history: pd.DataFrame
    optimizer: torch.optim.Optimizer
    max_epochs: int
    epochs: int
    stopped_early: bool
    kept_epoch: int


class ConvergenceRule:
    """Early stopping on the validation loss (lower is better), checked at the epochs with a validation pass.

    An improvement *counts* when the loss falls below the reference (the loss at the last improvement that counted) by
    more than ``relative_delta`` times the reference's magnitude; training stops once ``patience`` epochs have passed
    since then. The parameters of the best loss seen (counting or not) are kept. Why relative:
    ``TrainingPlan.early_stopping_relative_delta``.
    """

    def __init__(self, patience: int, relative_delta: float):
        self.patience = patience
        self.relative_delta = relative_delta
        self.reference = math.inf
        self.best = math.inf
        self.best_epoch = 0
        self.last_improvement = 0

    def update(self, epoch: int, loss: float) -> tuple[bool, bool]:
        """Record the validation loss of ``epoch``; return (is it the best so far, should training stop)."""
        is_best = loss < self.best
        if is_best:
            self.best, self.best_epoch = loss, epoch
        if math.isinf(self.reference) or loss < self.reference - self.relative_delta * abs(self.reference):
            if math.isfinite(loss):
                self.reference, self.last_improvement = loss, epoch
            return is_best, False
        return is_best, epoch - self.last_improvement >= self.patience

    def restart(self, epoch: int) -> None:
        """Begin a fresh patience at ``epoch`` (after a learning-rate cut); the best loss seen is kept.

        The next validation loss becomes the reference, as at the start: at a lower learning rate the loss moves on
        another scale than the old reference's.
        """
        self.reference, self.last_improvement = math.inf, epoch


class EarlyStopping:
    """What early stopping does at each validation: keep the best parameters, cut the learning rate, or stop.

    Parameters
    ----------
    plan
        The stopping settings (``early_stopping_*``) and the starting learning rate.
    live
        The module's live state (parameters and batch-norm statistics), restored in place.
    optimizer
        Its learning rate is set here.

    """

    def __init__(self, plan: TrainingPlan, live: list[torch.Tensor], optimizer: torch.optim.Optimizer):
        self.rule = ConvergenceRule(plan.early_stopping_patience, plan.early_stopping_relative_delta)
        self.cuts_left = plan.early_stopping_lr_reductions if plan.early_stopping else 0
        self.factor = plan.early_stopping_lr_factor
        self.live, self.optimizer = live, optimizer
        self.best_state: list[torch.Tensor] | None = None
        self.lr = plan.learning_rate
        _set_lr(optimizer, self.lr)

    def update(self, epoch: int, loss: float) -> bool:
        """Record the validation loss of ``epoch`` (1-based, of this call); whether to stop training now."""
        is_best, fired = self.rule.update(epoch, loss)
        if is_best:
            self.best_state = _snapshot(self.live, self.best_state)
        if not fired or self.cuts_left == 0 or self.best_state is None:
            return fired
        self.cuts_left -= 1
        self.lr *= self.factor
        _restore(self.live, self.best_state)
        _set_lr(self.optimizer, self.lr)
        self.rule.restart(epoch)
        logger.info(
            "The validation loss has not improved for %d epochs: learning rate cut to %g after epoch %d, "
            "continuing from the parameters of epoch %d.",
            self.rule.patience,
            self.lr,
            epoch,
            self.rule.best_epoch,
        )
        return False

    def restore_best(self) -> bool:
        """Put the parameters of the best validation loss back; whether there were any."""
        if self.best_state is None:
            return False
        _restore(self.live, self.best_state)
        return True


def to_tensors(mb: Minibatch, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts and batch codes of a minibatch as tensors on the module's device.

    The positions of the non-zero counts, when the loader knows them, travel with
    the counts (:func:`countvae.module.distributions.attach_nonzero_index`).
    """
    x = torch.as_tensor(mb.counts).to(device=device, dtype=dtype)
    b = torch.as_tensor(mb.batch, dtype=torch.long).to(device)
    if mb.nonzero is not None:
        positions = (mb.nonzero, mb.nonzero_rows, mb.nonzero_genes, mb.nonzero_per_row)
        attach_nonzero_index(x, *(torch.as_tensor(p, dtype=torch.long).to(device) for p in positions))
    return x, b


def make_optimizer(module: torch.nn.Module, lr: float, weight_decay: float, eps: float = 1e-8) -> torch.optim.Optimizer:
    """Adam over the module's parameters, with torch's fused kernel where it exists.

    The fused kernel updates all parameters at once, as the per-tensor loop does up to floating-point rounding; on CPU
    it took the optimiser step from about 3 ms to under 1 ms for the default architecture on 2,511 genes
    (benchmarks/RESULTS.md). ``eps`` is Adam's epsilon, ``TrainingPlan.adam_eps``.
    """
    try:
        return torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a device or dtype without a fused kernel
        return torch.optim.Adam(module.parameters(), lr=lr, weight_decay=weight_decay, eps=eps)


def total_grad_norm(parameters: list[torch.nn.Parameter]) -> torch.Tensor:
    """Euclidean norm of all gradients together (``inf``/``nan`` when any entry is), by ``get_total_norm``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())


def _kl_weight(epoch: int, warmup: int) -> float:
    return 1.0 if warmup <= 0 else min(1.0, (epoch + 1) / warmup)


@torch.no_grad()
def evaluate_loss(
    module: CountVAEModule,
    source: CountSource,
    indices: np.ndarray,
    batch_size: int,
    seed: int,
    n_train_cells: int | None = None,
) -> float:
    """Mean negative ELBO per cell on ``indices`` (eval mode, fixed noise).

    With a prior on the loadings each cell's loss carries, as in training, the global KL divided by ``n_train_cells``.
    """
    was_training = module.training
    module.eval()
    dtype, device = dtype_device(module)
    total, count = 0.0, 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for mb in source.iterate(indices, batch_size, drop_last_singleton=False):
            x, b = to_tensors(mb, dtype, device)
            cell_index = torch.as_tensor(mb.indices, device=device)  # without n_total, the minibatch is the data set
            loss = minibatch_loss(module, x, b, cell_index=cell_index, n_total=n_train_cells)
            total += float(loss) * len(mb.indices)
            count += len(mb.indices)
    module.train(was_training)
    return total / max(count, 1)


def validation_batch_size(plan: TrainingPlan) -> int:
    """Cells per minibatch of ``train_module``'s validation loss (``evaluate_loss``): ``batch_size``, at least 512."""
    return max(plan.batch_size, 512)


def dtype_device(module: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The floating-point type and the device of a module's parameters."""
    p = next(module.parameters())
    return p.dtype, p.device


def train_module(
    module: CountVAEModule,
    source: CountSource,
    train_indices: np.ndarray,
    validation_indices: np.ndarray,
    plan: TrainingPlan,
    optimizer: torch.optim.Optimizer | None = None,
    epoch_offset: int = 0,
    completed: list | None = None,
) -> TrainingRun:
    """Fit ``module`` by maximising the ELBO over minibatches of ``train_indices``.

    Each step checks that the loss and gradient norm are finite *before* the parameters change: a diverging step keeps
    the last good parameters and raises :class:`TrainingDivergedError` naming the epoch and step.

    The validation loss is computed every ``plan.validation_interval`` epochs and at the last epoch, in eval mode with
    noise from its own seeded generator, so its frequency does not change the fit. With ``plan.early_stopping``,
    :class:`EarlyStopping` decides at each validation (once the KL weight has reached 1) whether to go on, cut the
    learning rate or stop, and the parameters of the best validation loss are restored at the end.

    Parameters
    ----------
    module
        The count VAE (trained in place).
    source
        Counts and batches of all cells.
    train_indices, validation_indices
        Cells to train on, and to report the validation loss on (may be empty).
    plan
        Settings.
    optimizer
        The optimiser to continue with (kept between calls to ``train``); ``None``: a new Adam.
    epoch_offset
        Number of epochs already trained (for the history's epoch column).
    completed
        A list that receives each epoch's history row as the epoch ends, so that a caller keeps the epochs finished
        before an error or an interrupt.

    Returns
    -------
    TrainingRun
        Its ``history`` has one row per epoch: ``epoch``, ``loss_train`` (mean negative ELBO per training cell over
        the epoch's minibatches), ``loss_validation`` (negative ELBO per validation cell at the epoch's end; NaN at
        epochs without a validation pass or validation cells), ``kl_weight`` and ``lr`` (the epoch's learning rate).

    """
    if optimizer is None:
        optimizer = make_optimizer(module, plan.learning_rate, plan.weight_decay, plan.adam_eps)
    # Continued training (epoch_offset > 0) draws new minibatch orders and noise, still fixed by the seed.
    rng = np.random.default_rng([plan.seed, epoch_offset])
    rows: list[tuple[int, float, float, float, float]] = [] if completed is None else completed  # HISTORY_COLUMNS
    live = list(module.state_dict().values())
    last_good = _snapshot(live, None)
    stopping = EarlyStopping(plan, live, optimizer)
    n_epochs = plan.epochs_for(len(train_indices))
    stopped_early = False
    bar = tqdm(range(n_epochs), desc="Training", disable=not plan.progress_bar, unit="epoch")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(plan.seed if epoch_offset == 0 else int(rng.integers(2**62)))
        for epoch in bar:
            kl_weight, lr = _kl_weight(epoch_offset + epoch, plan.kl_warmup_epochs), stopping.lr
            loss_train = _train_epoch(
                module, source, train_indices, plan, optimizer, rng, kl_weight, epoch_offset + epoch, (live, last_good)
            )
            validate = len(validation_indices) > 0 and (
                (epoch + 1) % plan.validation_interval == 0 or epoch + 1 == n_epochs
            )
            loss_val = math.nan
            if validate:
                loss_val = evaluate_loss(
                    module, source, validation_indices, validation_batch_size(plan), plan.seed, len(train_indices)
                )
            rows.append((epoch_offset + epoch + 1, loss_train, loss_val, kl_weight, lr))
            bar.set_postfix(loss_train=f"{loss_train:.4g}", loss_validation=f"{loss_val:.4g}", refresh=False)
            if plan.early_stopping and validate and kl_weight >= 1.0 and stopping.update(epoch + 1, loss_val):
                stopped_early = epoch + 1 < n_epochs  # the rule firing on the last epoch ended nothing early
                _log_early_stop(stopping.rule, plan, epoch_offset, epoch + 1)
                break
    bar.close()
    kept = epoch_offset + (stopping.rule.best_epoch if stopping.restore_best() else len(rows))
    module.eval()
    return TrainingRun(
        history=pd.DataFrame(rows, columns=list(HISTORY_COLUMNS)),
        optimizer=optimizer,
        max_epochs=n_epochs,
        epochs=len(rows),
        stopped_early=stopped_early,
        kept_epoch=kept,
    )


def _train_epoch(
    module: CountVAEModule,
    source: CountSource,
    train_indices: np.ndarray,
    plan: TrainingPlan,
    optimizer: torch.optim.Optimizer,
    rng: np.random.Generator,
    kl_weight: float,
    epoch: int,
    guard: tuple[list[torch.Tensor], list[torch.Tensor]],
) -> float:
    """One pass over ``train_indices`` in shuffled minibatches; the mean negative ELBO per cell.

    ``guard`` is the module's live state and its copy at the last finite step, restored on divergence (see
    :func:`train_module`); ``epoch`` is 0-based, counted from the first training call.
    """
    live, last_good = guard
    dtype, device = dtype_device(module)
    parameters = list(module.parameters())
    module.train()
    running, seen = 0.0, 0
    minibatches = source.iterate(
        train_indices, plan.batch_size, shuffle=True, rng=rng, shuffle_block_cells=plan.shuffle_block_cells
    )
    for step, mb in enumerate(minibatches):
        x, b = to_tensors(mb, dtype, device)
        cell_index = torch.as_tensor(mb.indices, device=device)
        loss = minibatch_loss(module, x, b, kl_weight, plan.engine, cell_index=cell_index, n_total=len(train_indices))
        optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            _restore(live, last_good)
            _diverged(epoch, step, "loss", float(loss.detach()))
        loss.backward()
        grad_norm = total_grad_norm(parameters)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            _restore(live, last_good)
            _diverged(epoch, step, "gradient norm", float(grad_norm))
        _snapshot(live, last_good)  # the state at which the last finite loss was computed
        optimizer.step()
        running += float(loss.detach()) * len(mb.indices)
        seen += len(mb.indices)
    return running / max(seen, 1)


def _log_early_stop(rule: ConvergenceRule, plan: TrainingPlan, epoch_offset: int, epochs_done: int) -> None:
    logger.info(
        "Early stopping after epoch %d: the validation loss has not improved by more than %g of "
        "its value for %d epochs; restoring the parameters of epoch %d.",
        epoch_offset + epochs_done,
        plan.early_stopping_relative_delta,
        epochs_done - rule.last_improvement,
        epoch_offset + rule.best_epoch,
    )


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@torch.no_grad()
def _snapshot(live: list[torch.Tensor], store: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """Copy the parameters (and batch-norm statistics) into ``store``, made on first use, in one foreach call."""
    if store is None:
        return [t.detach().clone() for t in live]
    torch._foreach_copy_(store, live)
    return store


@torch.no_grad()
def _restore(live: list[torch.Tensor], store: list[torch.Tensor]) -> None:
    for target, value in zip(live, store, strict=True):
        target.copy_(value)


def _diverged(epoch: int, step: int, what: str, value: float) -> None:
    raise TrainingDivergedError(
        f"Training diverged at epoch {epoch + 1}, step {step + 1}: the {what} is {value}. The parameters "
        "of the last good step are kept. Lower the learning rate (lr=...), enable KL warm-up "
        "(kl_warmup_epochs=...), or train in float64 (dtype=torch.float64)."
    )


def resolve_device(accelerator: str) -> torch.device:
    """The torch device for ``accelerator``: ``"auto"`` (CUDA when torch sees it), ``"cpu"``, ``"gpu"``/``"cuda"``.

    Raises
    ------
    InvalidArgumentError
        For another value, or for ``"gpu"`` when torch sees no CUDA device.

    """
    check_choice("accelerator", accelerator, ACCELERATORS)
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidArgumentError("accelerator='gpu' was requested but torch sees no CUDA device.")
    return torch.device("cuda")
