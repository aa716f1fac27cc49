"""``CountVAE``: the user-facing model, with scvi-tools' calling conventions.

The class holds state (the AnnData registration, the Pyro module, the training history) and delegates each task to
a plain function: settings in :mod:`countvae.model.settings`, training in :mod:`countvae.model.training`, reading
cells in :mod:`countvae.model.query`, per-cell quantities in :mod:`countvae.model.inference`, files in
:mod:`countvae.model.persistence`. ICA and the invariance checks, in the layers above, take a model (or its latents).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Collection
from dataclasses import replace

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae._checks import check_bool
from countvae._settings import documents_settings, refuses_keywords, takes_settings
from countvae._warnings import warn_at_caller
from countvae.data.registry import Registry, batch_codes, get_count_matrix
from countvae.data.registry import setup_anndata as _setup_anndata
from countvae.data.split import first_part_size, split_indices
from countvae.errors import (
    CountVAEWarning,
    InvalidArgumentError,
    InvalidDataError,
    ModelFileError,
    NotTrainedError,
    SetupError,
)
from countvae.model import anndata_results, differential, inference
from countvae.model.loadings import build_loadings_prior, latent_names, loadings_posterior
from countvae.model.persistence import read_model_folder, write_model_folder
from countvae.model.query import ModelCells, cells_fingerprint, counts_fingerprint, query_source, resolve_registry
from countvae.model.settings import DataSummary, ModelSettings, dtype_name
from countvae.model.training import HISTORY_COLUMNS, TrainingPlan, make_optimizer, resolve_device, train_module
from countvae.module.marginal import MarginalSettings
from countvae.module.priors import LatentPrior
from countvae.module.vae import CountVAEModule

logger = logging.getLogger(__name__)


@documents_settings(ModelSettings)
class CountVAE:
    """A count VAE with a N(0, I) prior and a Poisson, NB or ZINB decoder, fitted with Pyro.

    Each cell has latent ``z ~ N(0, I_{n_latent})``; gene ``g`` has mean ``l * exp(f_g(z, batch))`` with ``l`` the
    cell's observed total count and ``f`` a log-linear (``decoder="linear"``) or MLP (``decoder="mlp"``) decoder. The
    encoder ``q(z | x) = N(mu(x), diag sigma(x)^2)`` is amortized.

    Parameters
    ----------
    adata
        AnnData registered with :meth:`setup_anndata`; or the :class:`countvae.model.DataSummary` that :meth:`load`
        passes (registration, genes and gene shares of the training data, without the data).
    {settings}
    settings
        All of the above as one :class:`countvae.model.ModelSettings` (``model.settings`` of another model, say);
        keywords given with it replace its fields.

    Attributes
    ----------
    registry, var_names
        Where the training AnnData keeps its counts, and the training genes.
    adata
        The training AnnData (``None`` for a model loaded without data). Every method that reads it, :meth:`train` and
        :meth:`save` with ``save_anndata=True`` included, refuses it when its counts were changed into values that are
        not counts after the model was built (normalized in place, say), and warns when they were changed into other
        counts; keep raw counts in a layer and register it to normalize ``adata.X``.
    module
        The Pyro module (:class:`countvae.module.CountVAEModule`).
    history, train_indices, validation_indices, is_trained, device
        Training state.
    training_cells
        SHA-256 of the training cells' names in order (``None`` before training, and in folders saved before it was
        recorded): further training refuses an AnnData of other cells, whose positions the split would misread.
    training_counts
        Shape and checksum of each cell's weighted counts in ``adata`` when the model was built or loaded with it, the
        same in any dtype or storage (:func:`countvae.model.query.counts_fingerprint`; ``None`` without data): the
        methods, :meth:`train` and :meth:`save` with ``save_anndata=True`` check the counts in full again only when
        they no longer match.
    training_summary
        How the last :meth:`train` call ended, epochs of earlier calls included: ``epochs_trained`` (in the history),
        ``max_epochs`` (the most possible), ``stopped_early`` (early stopping ended training before ``max_epochs``),
        ``kept_epoch`` (whose parameters the model holds: the best validation loss's with early stopping, else the last)
        and ``early_stopping``; ``max_epochs``, ``stopped_early`` and ``kept_epoch`` are ``None`` after a call ended by
        an error or an interrupt, which keeps its finished epochs. Empty before training and for models saved before
        it was recorded.

    Examples
    --------
    >>> import countvae as cv
    >>> adata = cv.data.simulate(n_cells=500, n_genes=100, seed=0)
    >>> cv.CountVAE.setup_anndata(adata, batch_key="batch")
    >>> model = cv.CountVAE(adata, n_latent=3, decoder="linear").train(max_epochs=5, progress_bar=False)
    >>> model.get_latent_representation().shape
    (500, 3)

    ICA axes are a separate, scikit-learn-style step on the latents:

    >>> from countvae.ica import ICARotation
    >>> ica = ICARotation().fit(model.get_latent_representation())  # doctest: +SKIP
    >>> sources = ica.transform(model.get_latent_representation(adata_new))  # doctest: +SKIP

    """

    # The keywords after adata are the fields of ModelSettings, each written once there (countvae._settings says why
    # this departs from scvi-tools' explicit keyword arguments); n_latent, likelihood and decoder may be positional.
    @takes_settings(ModelSettings, positional=3)
    def __init__(self, adata: ad.AnnData | DataSummary, settings: ModelSettings):
        data = adata if isinstance(adata, DataSummary) else DataSummary.from_anndata(adata)
        settings.check_data(data)
        self._settings = settings
        self._data = data
        self.registry: Registry = data.registry
        self.var_names: pd.Index = data.var_names
        self.adata: ad.AnnData | None = None if isinstance(adata, DataSummary) else adata
        self.is_trained = False
        self.history = pd.DataFrame(columns=list(HISTORY_COLUMNS))
        self.training_summary: dict = {}
        self.train_indices = np.arange(0)
        self.validation_indices = np.arange(0)
        self.device = torch.device("cpu")
        self._optimizer: torch.optim.Optimizer | None = None
        self.training_cells: str | None = None
        self.training_counts: tuple | None = None
        if self.adata is not None:
            self.training_counts = counts_fingerprint(get_count_matrix(self.adata, data.registry))
        self.module = self._build_module(seed=0)

    def _build_module(self, seed: int) -> CountVAEModule:
        s = self._settings
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = CountVAEModule(
                n_genes=len(self.var_names),
                n_latent=s.n_latent,
                n_batches=self.registry.n_batches,
                likelihood=s.likelihood,
                decoder=s.decoder,
                n_hidden=s.n_hidden,
                n_layers=s.n_layers,
                dropout_rate=s.dropout_rate,
                dispersion=s.dispersion,
                prior=s.prior,
                batch_norm=s.batch_norm,
                init_log_proportions=torch.tensor(self._data.log_proportions, dtype=torch.float32),
                loadings_prior=build_loadings_prior(s, self.var_names),
            )
        return module.to(dtype=s.torch_dtype, device=self.device)

    @staticmethod
    def setup_anndata(
        adata: ad.AnnData,
        layer: str | None = None,
        batch_key: str | None = None,
        labels_key: str | None = None,
        *,
        use_raw: bool = False,
    ) -> None:
        """Register where ``adata`` keeps raw counts and covariates (checks the counts first).

        See :func:`countvae.data.setup_anndata`.
        """
        _setup_anndata(adata, layer=layer, batch_key=batch_key, labels_key=labels_key, use_raw=use_raw)

    # ----- properties ------------------------------------------------------------------------
    @property
    def settings(self) -> ModelSettings:
        """The constructor settings (a frozen :class:`countvae.model.ModelSettings`)."""
        return self._settings

    @property
    def data_summary(self) -> DataSummary:
        """What the model keeps of its training data (registry, genes, gene shares, number of cells)."""
        return self._data

    @property
    def n_latent(self) -> int:
        """Number of latent dimensions."""
        return self._settings.n_latent

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point type of the parameters."""
        return self._settings.torch_dtype

    def __repr__(self) -> str:
        s = self._settings
        status = "trained" if self.is_trained else "not trained"
        batches = f", {self.registry.n_batches} batches" if self.registry.batch_key else ""
        return (
            f"CountVAE(n_latent={s.n_latent}, likelihood={s.likelihood!r}, decoder={s.decoder!r}, "
            f"prior={s.prior!r}, {len(self.var_names)} genes{batches}, {s.dtype}; {status})"
        )

    # ----- training --------------------------------------------------------------------------
    # The keywords of train are the fields of TrainingPlan, each written once there (countvae._settings says why
    # this departs from scvi-tools' explicit keyword arguments); the first seven may also be given by position.
    @takes_settings(TrainingPlan, positional=7, chosen="chosen")
    def train(self, plan: TrainingPlan, *, chosen: frozenset[str] = frozenset()) -> CountVAE:  # noqa: D417 (chosen: filled by takes_settings)
        """Fit the model by stochastic variational inference on minibatches.

        On the first call ``seed`` fixes everything random (initial parameters, train/validation split, minibatch
        order, Monte Carlo noise), so the same seed gives the same numbers on CPU. A further call continues from the
        current parameters and optimiser state (a fresh optimiser after :meth:`load` or :func:`copy_model`, which do not
        keep it), on the same split: unlike scvi-tools, which splits the cells again at each call, it refuses a
        ``train_size`` that asks for another split (a new model trains on another split). The AnnData's counts are
        checked as every method checks them (:meth:`cells`).

        Parameters
        ----------
        {settings}
        plan
            A whole :class:`countvae.model.TrainingPlan` (e.g. one kept from an earlier call); keywords given
            with it replace its fields, ``model.train(plan=plan, seed=1)``.

        Returns
        -------
        CountVAE
            ``self``, so calls can be chained.

        """
        if self.adata is None:
            raise SetupError("This model was loaded without data; pass adata to CountVAE.load to train it.")
        device = resolve_device(plan.accelerator)
        source, _ = query_source(self.adata, self.registry, self.var_names, built_with=self.training_counts)
        if self.is_trained and "train_size" in chosen:
            self._check_same_split(plan.train_size)
        split = self._training_split(plan, source.n_obs)  # checked before anything changes
        if split is not None:
            self.device = device
            self.module = self._build_module(plan.seed)
            self.train_indices, self.validation_indices = split
            self.training_cells = cells_fingerprint(self.adata.obs_names)
            self._optimizer = None
        elif device != self.device:
            self.module.to(device)
            self.device = device
            self._optimizer = None
        offset = int(self.history["epoch"].max()) if len(self.history) else 0
        if self._optimizer is None:
            self._optimizer = make_optimizer(self.module, plan.learning_rate, plan.weight_decay, plan.adam_eps)
        completed: list = []
        try:
            run = train_module(
                self.module,
                source,
                self.train_indices,
                self.validation_indices,
                plan,
                self._optimizer,
                offset,
                completed,
            )
        except BaseException:
            # An error or Ctrl-C: the parameters are those of the interruption (the last good step after a divergence).
            # The epochs that finished are kept, and a model with none stays untrained, so the next call starts afresh.
            if completed:
                self._record_training(pd.DataFrame(completed, columns=list(HISTORY_COLUMNS)), plan, offset, None, None)
            raise
        self._record_training(run.history, plan, offset, run.stopped_early, run.kept_epoch, run.max_epochs)
        return self

    def _record_training(
        self,
        history: pd.DataFrame,
        plan: TrainingPlan,
        offset: int,
        stopped_early: bool | None,
        kept_epoch: int | None,
        max_epochs: int | None = None,
    ) -> None:
        """Append a call's epochs to the history and summarise it (``None``: the call was interrupted)."""
        self.is_trained = True
        self.history = pd.concat([self.history, history], ignore_index=True) if len(self.history) else history
        self.training_summary = {
            "epochs_trained": offset + len(history),
            "max_epochs": None if max_epochs is None else offset + max_epochs,
            "stopped_early": stopped_early,
            "kept_epoch": kept_epoch,
            "early_stopping": plan.early_stopping,
        }

    def _check_same_split(self, train_size: float) -> None:
        """Refuse a ``train_size`` given to a further call that asks for another split than the model's own."""
        n_train, n_validation = len(self.train_indices), len(self.validation_indices)
        asked = first_part_size(n_train + n_validation, train_size)
        if asked != n_train:
            own = f"{n_train / (n_train + n_validation):.4g}"
            raise InvalidArgumentError(
                f"train_size={train_size} asks for {asked} training cells of {n_train + n_validation}, but this "
                f"model keeps the train/validation split of its first training ({n_train} training and "
                f"{n_validation} validation cells, train_size={own}): further calls continue on it. Leave train_size "
                f"out to continue training (a plan= carries one: pass dataclasses.replace(plan, train_size={own})), "
                f"or train a new model, CountVAE(adata, ...).train(train_size={train_size}), for another split."
            )

    def _training_split(self, plan: TrainingPlan, n_obs: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The train/validation split of a first call (``None`` when continuing), after checking ``plan`` fits it."""
        if self.is_trained:
            n_split = len(self.train_indices) + len(self.validation_indices)
            if n_split != n_obs:
                raise InvalidDataError(
                    f"This model was trained on {n_split} cells, but its AnnData has {n_obs}; further training "
                    "continues on the training cells and their split. Pass the training AnnData to CountVAE.load to "
                    "train on, or train a new model on these cells."
                )
            if self.training_cells not in (None, cells_fingerprint(self.adata.obs_names)):
                raise InvalidDataError(
                    "This model was trained on other cells, or on these in another order; further training continues "
                    "the training cells' train/validation split, by position. Pass the training AnnData, its cells "
                    "in their order, to CountVAE.load to train on, or train a new model on these cells."
                )
            split, n_validation = None, len(self.validation_indices)
        else:
            split = split_indices(n_obs, plan.train_size, plan.seed)
            if len(split[0]) < 2:
                raise InvalidArgumentError("Training needs at least 2 cells in the training split.")
            n_validation = len(split[1])
            self._warn_batches_only_in_validation(split[0])
        if self._settings.batch_norm and plan.batch_size < 2:
            raise InvalidArgumentError(
                "batch_size=1 cannot train batch normalisation, which needs at least 2 cells per minibatch; pass "
                "batch_size >= 2, or build the model with batch_norm=False."
            )
        if plan.early_stopping and n_validation == 0:
            raise InvalidArgumentError(
                "Early stopping (on by default) needs validation cells, but the model's train/validation split has "
                "none (train_size=1.0 at the first call to train, or too few cells); pass early_stopping=False to "
                "train every epoch on every cell, or train a new model with train_size below 1."
            )
        return split

    def _warn_batches_only_in_validation(self, train_positions: np.ndarray) -> None:
        """Warn of batches whose every cell fell in the validation split: their effect is never trained."""
        if self.registry.n_batches < 2:
            return
        codes = batch_codes(self.adata, resolve_registry(self.adata, self.registry))
        untrained = sorted(set(range(self.registry.n_batches)) - set(codes[train_positions].tolist()))
        if untrained:
            names = [self.registry.batch_categories[i] for i in untrained]
            warn_at_caller(
                f"Batch categories {names[:10]} of adata.obs[{self.registry.batch_key!r}] have cells only in the "
                "validation split (a share 1 - train_size of the cells, drawn by seed): their batch effect is never "
                "trained, and those cells are scored with its starting value. Merge such small batches into another, "
                "or train with another seed or a larger train_size.",
                CountVAEWarning,
            )

    # ----- cells ----------------------------------------------------------------------------
    def require_trained(self) -> None:
        """Raise :class:`countvae.errors.NotTrainedError` unless :meth:`train` has run."""
        if not self.is_trained:
            raise NotTrainedError("The model is not trained yet; call model.train() first.")

    def cells(self, adata: ad.AnnData | None = None, indices: np.ndarray | None = None) -> ModelCells:
        """The cells of ``adata`` as the model reads them, checked against the training data.

        Every per-cell method, and every estimator built on a model (:mod:`countvae.invariance`, the diagnostics), reads
        cells through this: counts and batch codes in the model's registration and gene order, at positions ``indices``.

        Parameters
        ----------
        adata
            Cells with the training genes (default: the training AnnData). A new AnnData is checked (genes, batch
            categories, counts); it may be registered on its own with the same batch key, or not at all. The training
            AnnData's counts are checked again only when they changed since the model was built (their shape or
            values, in whatever dtype or storage; :func:`countvae.model.query.check_own_counts`).
        indices
            Positions of a subset of the cells (default: all, in order).

        Returns
        -------
        countvae.model.query.ModelCells
            The AnnData, a :class:`countvae.data.CountSource` over it and the positions.

        Raises
        ------
        SetupError
            If ``adata`` is omitted for a model loaded without data, or is registered with another batch key.
        InvalidDataError
            If its genes, batches or counts do not fit the model, e.g. the training AnnData's counts were normalized in
            place.

        Warns
        -----
        CountVAEWarning
            If the training AnnData holds other counts than those the model was built with.

        """
        if adata is None:
            if self.adata is None:
                raise SetupError("This model was loaded without data; pass adata=... explicitly.")
            adata = self.adata
        # scvi-tools reads its AnnData unchecked once set up; normalizing adata.X in place then goes unnoticed. Here
        # the model's own counts are compared with a fingerprint taken when it was built, and checked when they differ.
        built_with = self.training_counts if adata is self.adata else None
        source, idx = query_source(adata, self.registry, self.var_names, indices=indices, built_with=built_with)
        return ModelCells(adata=adata, source=source, indices=idx)

    def _trained_cells(self, adata: ad.AnnData | None, indices: np.ndarray | None) -> ModelCells:
        self.require_trained()
        return self.cells(adata, indices)

    # ----- per-cell outputs ------------------------------------------------------------------
    @refuses_keywords(
        {
            "mc_samples": "the posterior of z is normal, so give_mean=True returns its exact mean (scvi-tools samples "
            "only a logistic-normal latent's mean); leave it out",
            "return_dist": "not offered; pass give_mean=False for one posterior draw per cell, and several seeds for "
            "the spread",
        }
    )
    def get_latent_representation(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        give_mean: bool = True,
        seed: int = 0,
        batch_size: int = 1024,
    ) -> np.ndarray:
        """Posterior mean of ``z`` per cell (or one draw with ``give_mean=False``).

        The coordinates are determined only up to an orthogonal map (:mod:`countvae.invariance`). For ICA axes, fit
        :class:`countvae.ica.ICARotation` to these latents and transform them.

        Parameters
        ----------
        adata, indices
            Cells to encode (default: the training AnnData, all cells).
        give_mean
            Posterior means (default) or one draw per cell.
        seed
            Seed of the draw.
        batch_size
            Cells per forward pass.

        Returns
        -------
        numpy.ndarray
            Shape (cells, n_latent).

        Notes
        -----
        scvi-tools' ``mc_samples`` and ``return_dist`` are refused by name, each with what to do instead.

        """
        c = self._trained_cells(adata, indices)
        return inference.latent_representation(self.module, c.source, c.indices, give_mean, seed, batch_size)

    @refuses_keywords(
        {
            "gene_list": "select the genes from the result instead, model.get_normalized_expression(...)[genes] (the "
            "values do not depend on which genes are returned)",
            "return_mean": "the draws are always averaged, as scvi-tools' default return_mean=True; draw-by-draw "
            "values (return_mean=False) are not offered",
            "n_samples_overall": "not offered; pass the cells to draw as indices=, e.g. "
            "np.random.default_rng(0).choice(adata.n_obs, n)",
            "weights": "importance weights are not offered; leave it out",
            "batch_size": f"it decodes {inference.CELLS_PER_PASS} cells per pass; leave it out",
            "silent": "it shows no progress bar; leave it out",
        }
    )
    def get_normalized_expression(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        library_size: float = 1e4,
        n_samples: int = 1,
        transform_batch: str | None = None,
        seed: int = 0,
        return_numpy: bool = False,
    ) -> pd.DataFrame | np.ndarray:
        """Expected counts per gene for a cell of library size ``library_size``.

        For a zero-inflated model these are the negative binomial's means, before zero inflation (as scvi-tools';
        the expected counts, zeros included, are smaller by the probability of a dropout). Decodes the posterior mean
        of ``z`` (or averages ``n_samples`` posterior draws). With the MLP decoder (a softmax over genes) the default
        1e4 gives counts per 10,000 as ``sc.pp.normalize_total``, and scvi-tools' ``library_size=1`` proportions. The
        linear decoder's rate ``exp(b + W z)`` is not normalised over genes (unlike scvi-tools' ``LinearSCVI``, whose
        linear decoder ends in a softmax): its values are the model's expected counts at that library size, and a
        cell's total differs from ``library_size`` by what the model predicts for its depth. How far varies with the
        fit: for ``CountVAE(adata, likelihood="nb", decoder="linear").train(seed=s)`` on pbmc_small's 80 cells
        (``countvae.data.load_dataset("pbmc_small")``, other settings at their defaults), the totals at 1e4 were
        6,993-15,199 (median 10,018) for seed 0 and 6,028-23,613 over seeds 0-4 (medians 9,368-10,069).

        Parameters
        ----------
        adata, indices
            Cells to evaluate: an AnnData and positions of some of its cells (default: the training AnnData, all cells).
        library_size
            Library size to scale the expected shares (MLP decoder) or rates (linear decoder) to.
        n_samples
            Posterior draws to average (1: decode the posterior mean).
        transform_batch
            Decode every cell as if from this batch category (an integer label such as ``3`` matches ``"3"``). One
            category only: scvi-tools' list of batches to average over is refused; average the results of one call per
            batch instead.
        seed
            Seed of the posterior draws.
        return_numpy
            Return an array instead of a DataFrame.

        Returns
        -------
        pandas.DataFrame or numpy.ndarray
            Cells x genes, labelled unless ``return_numpy``.

        Notes
        -----
        scvi-tools' ``gene_list`` (select columns of the result instead), ``return_mean``, ``n_samples_overall``,
        ``weights``, ``batch_size`` and ``silent`` are refused by name, each with what to do instead.

        """
        check_bool("return_numpy", return_numpy)
        c = self._trained_cells(adata, indices)
        code = None
        if transform_batch is not None:
            if isinstance(transform_batch, Collection) and not isinstance(transform_batch, str | bytes):
                raise InvalidArgumentError(
                    f"transform_batch takes one batch category, got {transform_batch!r}; scvi-tools' average over "
                    "several batches is not offered: call get_normalized_expression(transform_batch=b) for each batch "
                    "b and take the mean, e.g. sum(model.get_normalized_expression(transform_batch=b) for b in "
                    "batches) / len(batches)."
                )
            label = str(transform_batch)  # batch labels are recorded as strings, as each cell's batch is read
            if label not in self.registry.batch_categories:
                raise InvalidArgumentError(
                    f"transform_batch {transform_batch!r} is not a training batch; "
                    f"known: {self.registry.batch_categories}."
                )
            code = self.registry.batch_categories.index(label)
        values = inference.normalized_expression(self.module, c.source, c.indices, library_size, n_samples, code, seed)
        return values if return_numpy else pd.DataFrame(values, index=c.obs_names, columns=self.var_names)

    def get_log_predictive_density(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        n_samples: int | None = None,
        seed: int = 0,
        progress_bar: bool = False,
        method: str = "mixture",
        settings: MarginalSettings | None = None,
    ) -> pd.DataFrame:
        """Importance-sampled ``log p(x)`` per cell, in nats, with its standard error and reliability.

        On held-out cells it compares models by predictive fit. The default ``method="mixture"`` fits a proposal to each
        cell (Student-t's at its posterior modes, found by Newton's method from the encoder's mean, mixed with the
        guide) and redoes cells whose Pareto k-hat exceeds 0.7 with more draws. Verified (benchmarks/RESULTS.md, section
        lpd-accuracy): on 18 linear Poisson/NB models with 1-3 latent dimensions, within 0.012 nats/cell of exact
        quadrature on average with >= 99% of cells within 3 reported SE; on default NB/MLP models, within 0.06
        nats/cell of a 10^5-draw gold standard on average. ``method="guide"``, the amortized-guide estimator
        (scvi-tools' ``get_marginal_ll``), can fall many nats below ``log p(x)``; see
        :func:`countvae.model.inference.log_predictive_density`.

        Parameters
        ----------
        adata, indices
            Cells to evaluate (default: the model's AnnData, all cells).
        n_samples
            Draws per cell that enter the estimate (default 800 for ``"mixture"``, which adds a
            200-draw pilot; 1000 for ``"guide"``).
        seed
            Seed of every random number: the same seed gives the same numbers.
        progress_bar
            Show a progress bar over cells.
        method
            ``"mixture"`` (default) or ``"guide"``.
        settings
            :class:`countvae.module.marginal.MarginalSettings` for ``"mixture"``.

        Returns
        -------
        pandas.DataFrame
            Index: cell names; columns ``lpd`` (higher is better), ``mc_se`` (Monte Carlo standard error; NaN where
            unreliable), ``ess`` (effective sample size of the importance weights), ``khat`` (Pareto k-hat) and
            ``reliable`` (k-hat <= 0.7). A :class:`countvae.errors.UnreliableEstimateWarning` gives the number of
            unreliable cells and the remedy.

        """
        c = self._trained_cells(adata, indices)
        frame = inference.log_predictive_density(
            self.module,
            c.source,
            c.indices,
            n_samples,
            seed,
            progress_bar=progress_bar,
            method=method,
            settings=settings,
        )
        frame.index = c.obs_names
        return frame

    @refuses_keywords(
        {
            "batch_size": f"it evaluates {inference.CELLS_PER_PASS} cells per pass; leave it out",
            "dataloader": "not offered; pass the cells as adata= and indices=",
        }
    )
    def get_elbo(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        n_samples: int = 10,
        seed: int = 0,
        return_mean: bool = True,
    ) -> float | np.ndarray:
        """ELBO per cell (a log density, higher is better); the mean over cells unless ``return_mean=False``."""
        check_bool("return_mean", return_mean)
        c = self._trained_cells(adata, indices)
        values = inference.elbo_per_cell(self.module, c.source, c.indices, n_samples, seed)
        return float(values.mean()) if return_mean else values

    @refuses_keywords(
        {
            "gene_list": "select the genes from the result instead, draws[:, model.var_names.get_indexer(genes)]",
            "transform_batch": "not offered (the counts are simulated in each cell's own batch); leave it out",
            "batch_size": f"it simulates {inference.CELLS_PER_PASS} cells per pass; leave it out",
            "silent": "it shows no progress bar; leave it out",
        }
    )
    def posterior_predictive_sample(
        self, adata: ad.AnnData | None = None, indices: np.ndarray | None = None, n_samples: int = 1, seed: int = 0
    ) -> np.ndarray:
        """Counts simulated from the fitted model for each cell.

        scvi-tools' ``gene_list`` (select columns of the result instead), ``transform_batch``, ``batch_size`` and
        ``silent`` are refused by name, each with what to do instead.

        Returns
        -------
        numpy.ndarray
            (cells, genes) for ``n_samples=1``, else (cells, genes, n_samples) (scvi-tools returns a ``sparse.GCXS``).

        """
        c = self._trained_cells(adata, indices)
        draws = inference.posterior_predictive(self.module, c.source, c.indices, n_samples, seed)
        return draws[..., 0] if n_samples == 1 else draws

    # Differential expression as scvi-tools' mode="change": countvae.model.differential's function, documented there.
    differential_expression = differential.differential_expression

    @property
    def latent_names(self) -> list[str]:
        """The names of the latent dimensions (the gene programs' names, else ``Z_0``, ``Z_1``, ...)."""
        return latent_names(self.n_latent, self._settings.gene_programs)

    def get_loadings(self, return_uncertainty: bool = False) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
        """Decoder weights ``W`` of the linear decoder, genes x latent (like ``LinearSCVI.get_loadings``).

        Free loadings (the default) are determined only up to an orthogonal transformation (see
        :mod:`countvae.invariance`): compare them across fits by their span, not column by column. With a prior on the
        loadings this is their posterior mean, determined up to what that prior keeps (signed permutations for the
        horseshoe, sign flips for gene programs, whose names are the columns).

        Parameters
        ----------
        return_uncertainty
            Also return the posterior standard deviations (needs a prior on the
            loadings; :meth:`loadings_posterior` gives credible intervals).

        Returns
        -------
        pandas.DataFrame, or (mean, sd) DataFrames
            Genes x latent dimensions.

        """
        if self._settings.decoder != "linear":
            raise InvalidArgumentError("get_loadings() needs decoder='linear'; an MLP decoder has no loadings.")
        check_bool("return_uncertainty", return_uncertainty)
        self.require_trained()
        weight = self.module.decoder.weight.detach().cpu().numpy()
        mean = pd.DataFrame(weight, index=self.var_names, columns=self.latent_names)
        if not return_uncertainty:
            return mean
        if self.module.loadings_prior is None:
            raise InvalidArgumentError(
                "These loadings are point estimates (loadings_prior='none'); posterior uncertainty needs a prior on "
                "them: CountVAE(..., loadings_prior='horseshoe') or gene_programs=..."
            )
        sd = self.module.loadings_prior.weight_scale().detach().cpu().numpy()
        return mean, pd.DataFrame(sd, index=self.var_names, columns=self.latent_names)

    def loadings_posterior(self, credible_mass: float = 0.9) -> pd.DataFrame:
        """The posterior of the loadings, one row per gene and dimension (needs a prior on the loadings).

        Columns ``gene``, ``dimension``, ``mean``, ``sd``, ``lower``, ``upper`` (the central ``credible_mass`` interval
        of the Gaussian guide), ``nonzero`` (it excludes 0), and ``in_program`` for gene programs
        (:func:`countvae.model.loadings.loadings_posterior`).
        """
        self.get_loadings(return_uncertainty=True)  # the checks
        return loadings_posterior(self.module, self.var_names, self.latent_names, credible_mass)

    # Results stored in adata for scanpy: countvae.model.anndata_results.write_results, documented there.
    write_results = anndata_results.write_results

    # ----- files -----------------------------------------------------------------------------
    def save(self, dir_path: str | os.PathLike, overwrite: bool = False, save_anndata: bool = False) -> None:
        """Write the model to a folder (built under a temporary name, then renamed).

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing model folder; otherwise an existing folder is an error. Unlike scvi-tools, which
            writes its files among others, countvae replaces the folder whole (it appears complete or not at all),
            so a folder holding anything but a saved model's ``model.json``, ``params.pt`` and ``adata.h5ad`` (the
            training data, notes) is refused, whatever ``overwrite`` says; so is a file or a symbolic link at
            ``dir_path`` (the renames would replace the link, not the folder it points to: save to that folder).
        save_anndata
            Also write the training AnnData as ``adata.h5ad``, its counts checked first as every method checks them
            (:meth:`cells`): :meth:`load` reads that file and refuses values that are not counts.

        Raises
        ------
        OutputExistsError
            If ``dir_path`` exists and ``overwrite`` is False, it holds files a model folder does not hold, or it is
            a file or a symbolic link.
        SetupError
            If ``save_anndata`` is True for a model loaded without data.
        InvalidDataError
            If ``save_anndata`` is True and the AnnData's counts were changed into values that are not counts after the
            model was built (normalized in place, say); nothing is written.

        Warns
        -----
        CountVAEWarning
            If ``save_anndata`` is True and the AnnData holds other counts than those the model was built with.

        """
        check_bool("overwrite", overwrite)
        check_bool("save_anndata", save_anndata)
        if save_anndata:
            if self.adata is None:
                raise SetupError("save_anndata=True, but this model holds no AnnData.")
            # scvi-tools writes its AnnData as it is; a folder whose adata.h5ad holds normalized values could not be
            # loaded, and overwrite=True would replace a loadable one: the counts are checked before any writing.
            self.cells()
        tensors = {f"module.{k}": v for k, v in self.module.state_dict().items()}
        tensors["train_indices"] = torch.as_tensor(self.train_indices, dtype=torch.long)
        tensors["validation_indices"] = torch.as_tensor(self.validation_indices, dtype=torch.long)
        tensors["log_proportions"] = torch.as_tensor(self._data.log_proportions)
        settings = {
            "settings": self._settings.to_dict(),
            "registry": self.registry.to_dict(),
            "var_names": [str(v) for v in self.var_names],
            "is_trained": self.is_trained,
            "has_latent_map": self.module.latent_map is not None,
            "history": self.history.astype(float).replace({np.nan: None}).to_dict(orient="list"),
            "training": self.training_summary,
            "training_cells": self.training_cells,
        }
        write_model_folder(dir_path, settings, tensors, overwrite, self.adata if save_anndata else None)

    @classmethod
    def load(cls, dir_path: str | os.PathLike, adata: ad.AnnData | None = None, accelerator: str = "cpu") -> CountVAE:
        """Read a model saved with :meth:`save`.

        The constructor builds the model from the saved settings and :class:`countvae.model.DataSummary`, then it is
        given the saved parameters and training state.

        Parameters
        ----------
        dir_path
            The model folder.
        adata
            Data to attach, checked as any new data is (the training genes in order, known batches, raw counts);
            ``None`` reads the folder's ``adata.h5ad`` if present. To train further, pass the training AnnData: training
            continues on its cells and their train/validation split.
        accelerator
            Device for the parameters.

        Raises
        ------
        ModelFileError
            If the folder is incomplete, corrupted or of another format version.
        InvalidArgumentError, InvalidDataError, SetupError
            If ``adata`` is not an AnnData, or its genes, batches or counts do not fit the model.

        """
        record, tensors, adata_path = read_model_folder(dir_path)
        device = resolve_device(accelerator)
        n_cells = len(tensors["train_indices"]) + len(tensors["validation_indices"])
        data = DataSummary(
            registry=Registry.from_dict(record["registry"]),
            var_names=pd.Index(record["var_names"]),
            log_proportions=tensors["log_proportions"].numpy(),
            n_cells=n_cells or None,
        )
        model = cls(data, settings=ModelSettings.from_dict(record["settings"]))
        module = model.module
        if record.get("has_latent_map"):
            module.latent_map = torch.zeros(model.n_latent, model.n_latent, dtype=model.dtype)
        state = {k[len("module.") :]: v for k, v in tensors.items() if k.startswith("module.")}
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:
            raise ModelFileError(f"{dir_path}: its parameters do not fit the recorded settings: {exc}") from None
        model.device = device
        module.to(device)
        model.train_indices = tensors["train_indices"].numpy()
        model.validation_indices = tensors["validation_indices"].numpy()
        model.is_trained = bool(record["is_trained"])
        model.history = pd.DataFrame(record["history"]).astype(float)
        model.training_summary = dict(record.get("training", {}))  # absent in folders saved before it was recorded
        model.training_cells = record.get("training_cells")  # absent before: only the number of cells is checked
        if len(model.history):
            model.history["epoch"] = model.history["epoch"].astype(int)
        if adata is None and adata_path is not None:
            adata = ad.read_h5ad(adata_path)
        if adata is not None:
            source, _ = query_source(adata, model.registry, model.var_names)  # genes, batches, counts: as new data
            model.adata = adata
            model.training_counts = counts_fingerprint(source.matrix)
        module.eval()
        return model


def copy_model(
    model: CountVAE, dtype: torch.dtype | str | None = None, *, prior: LatentPrior | None = None
) -> CountVAE:
    """An independent copy of a model, optionally in another floating-point type or with another prior.

    The constructor builds the copy from the model's settings and :class:`countvae.model.DataSummary` (as
    :meth:`CountVAE.load` does), then it gets a deep copy of the module and of the training state. The AnnData is shared
    by reference (it is never modified); the optimiser state is not copied (further training starts a fresh optimiser).

    Parameters
    ----------
    model
        The model to copy.
    dtype
        ``torch.float32`` or ``torch.float64`` (or their names); ``None`` keeps the model's.
    prior
        A :class:`countvae.module.LatentPrior` replacing the model's (copied, and moved to the copy's dtype and
        device); the copy's ``settings.prior`` becomes its kind. The networks are unchanged.

    Raises
    ------
    InvalidArgumentError
        If ``model`` is not a ``CountVAE``, ``dtype`` not float32 or float64, or ``prior`` not a ``LatentPrior``.

    """
    if not isinstance(model, CountVAE):
        raise InvalidArgumentError(f"Expected a countvae.CountVAE, got {type(model).__name__}.")
    settings = model.settings if dtype is None else replace(model.settings, dtype=dtype_name(dtype))
    if prior is not None:
        if not isinstance(prior, LatentPrior):
            raise InvalidArgumentError(f"prior must be a countvae.module.LatentPrior, got {type(prior).__name__}.")
        settings = replace(settings, prior=prior.kind)
    new = CountVAE(model.data_summary, **settings.to_dict())
    new.module = copy.deepcopy(model.module)
    if prior is not None:
        new.module.prior = copy.deepcopy(prior)
    new.module.to(dtype=settings.torch_dtype, device=model.device)
    new.device = model.device
    new.adata = model.adata
    new.training_counts = model.training_counts
    new.is_trained = model.is_trained
    new.history = model.history.copy()
    new.training_summary = dict(model.training_summary)
    new.training_cells = model.training_cells
    new.train_indices = model.train_indices.copy()
    new.validation_indices = model.validation_indices.copy()
    return new
