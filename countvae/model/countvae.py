"""``CountVAE``: the user-facing model, with scvi-tools' calling conventions.

The class holds state (the AnnData registration, the Pyro module, the training
history) and delegates each task to a plain function beside its concern:
training in :mod:`countvae.model.training`, per-cell quantities in
:mod:`countvae.model.inference`, files in :mod:`countvae.model.persistence`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae.data.loader import CountSource
from countvae.data.registry import (
    Registry,
    batch_codes,
    get_count_matrix,
    get_registry,
    get_var_names,
)
from countvae.data.registry import setup_anndata as _setup_anndata
from countvae.data.split import split_indices
from countvae.data.validation import column_totals
from countvae.errors import InvalidArgumentError, InvalidDataError, ModelFileError, NotTrainedError, SetupError
from countvae.ica import ICARotation
from countvae.model import anndata_results, differential, inference
from countvae.model.persistence import read_model_folder, write_model_folder
from countvae.model.query import check_genes, query_source, resolve_registry
from countvae.model.training import TrainingPlan, default_max_epochs, train_module
from countvae.module.vae import CountVAEModule

logger = logging.getLogger(__name__)

_LIKELIHOODS = ("poisson", "nb", "zinb")
_DECODERS = ("linear", "mlp")
_DISPERSIONS = ("gene", "gene-batch")
_PRIORS = ("normal", "laplace", "diagonal")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _dtype_name(dtype: torch.dtype | str) -> str:
    for name, value in _DTYPES.items():
        if dtype in (value, name):
            return name
    raise InvalidArgumentError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}.")


def _resolve_device(accelerator: str) -> torch.device:
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise InvalidArgumentError("accelerator='gpu' was requested but torch sees no CUDA device.")
        return torch.device("cuda")
    raise InvalidArgumentError(f"accelerator must be 'auto', 'cpu' or 'gpu', got {accelerator!r}.")


class CountVAE:
    """A count VAE with a N(0, I) prior and a Poisson, NB or ZINB decoder, fitted with Pyro.

    Each cell has latent ``z ~ N(0, I_{n_latent})``; gene ``g`` has mean
    ``l * exp(f_g(z, batch))`` with ``l`` the cell's observed total count and
    ``f`` a log-linear (``decoder="linear"``) or MLP (``decoder="mlp"``) decoder.
    ``q(z | x) = N(mu(x), diag sigma(x)^2)`` is an amortized encoder.

    Parameters
    ----------
    adata
        AnnData registered with :meth:`setup_anndata`.
    n_latent
        Latent dimensions; at least 1 and fewer than the number of genes and cells.
    likelihood
        ``"poisson"``, ``"nb"`` or ``"zinb"``.
    decoder
        ``"linear"`` or ``"mlp"``.
    n_hidden, n_layers, dropout_rate
        Encoder (and MLP decoder) hidden width and depth; encoder dropout.
    dispersion
        ``"gene"`` or ``"gene-batch"`` inverse dispersion (NB/ZINB).
    prior
        ``"normal"`` (default). ``"laplace"`` and ``"diagonal"`` break the
        rotation symmetry; they exist as controls for the invariance checks.
    batch_norm
        Batch normalisation in hidden layers (scVI's default).
    dtype
        ``torch.float32`` (default) or ``torch.float64``.

    Examples
    --------
    >>> import countvae as cv
    >>> adata = cv.data.simulate(n_cells=500, n_genes=100, seed=0)
    >>> cv.CountVAE.setup_anndata(adata, batch_key="batch")
    >>> model = cv.CountVAE(adata, n_latent=3, decoder="linear")
    >>> model.train(max_epochs=5, progress_bar=False)
    >>> model.get_latent_representation().shape
    (500, 3)

    """

    def __init__(
        self,
        adata: ad.AnnData,
        n_latent: int = 10,
        likelihood: Literal["poisson", "nb", "zinb"] = "nb",
        decoder: Literal["linear", "mlp"] = "mlp",
        *,
        n_hidden: int = 128,
        n_layers: int = 1,
        dropout_rate: float = 0.1,
        dispersion: Literal["gene", "gene-batch"] = "gene",
        prior: Literal["normal", "laplace", "diagonal"] = "normal",
        batch_norm: bool = True,
        dtype: torch.dtype | str = torch.float32,
    ):
        if not isinstance(adata, ad.AnnData):
            raise InvalidArgumentError(f"CountVAE expects an AnnData, got {type(adata).__name__}.")
        registry = get_registry(adata)
        if registry is None:
            raise SetupError("This AnnData is not set up; call CountVAE.setup_anndata(adata, ...) first.")
        var_names = get_var_names(adata, registry)
        gene_totals = column_totals(get_count_matrix(adata, registry))
        n_empty = int(np.count_nonzero(gene_totals == 0))
        if n_empty:
            # possible when a registered AnnData is subset after setup_anndata
            raise InvalidDataError(
                f"{n_empty} of {len(gene_totals)} genes have zero total counts in the training cells; a model cannot "
                "learn their expression. Remove them (e.g. `sc.pp.filter_genes(adata, min_counts=1)`) and call "
                "CountVAE.setup_anndata again."
            )
        self._configure(
            registry,
            pd.Index(var_names),
            n_cells=adata.n_obs,
            settings=dict(
                n_latent=n_latent,
                likelihood=likelihood,
                decoder=decoder,
                n_hidden=n_hidden,
                n_layers=n_layers,
                dropout_rate=dropout_rate,
                dispersion=dispersion,
                prior=prior,
                batch_norm=batch_norm,
                dtype=_dtype_name(dtype),
            ),
            gene_totals=gene_totals,
        )
        self.adata: ad.AnnData | None = adata
        self.module = self._build_module(seed=0)

    # ----- construction --------------------------------------------------------------------
    def _configure(
        self, registry: Registry, var_names: pd.Index, n_cells: int, settings: dict[str, Any], gene_totals
    ) -> None:
        s = settings
        n_genes = len(var_names)
        n_latent = s["n_latent"]
        if not isinstance(n_latent, int | np.integer) or isinstance(n_latent, bool) or n_latent < 1:
            raise InvalidArgumentError(f"n_latent must be a positive integer, got {n_latent!r}.")
        if n_latent >= n_genes or n_latent >= n_cells:
            raise InvalidArgumentError(
                f"n_latent={n_latent} is too large for {n_cells} cells x {n_genes} genes: it must be smaller "
                "than both (a latent space as large as the data cannot compress it)."
            )
        for key, allowed in (
            ("likelihood", _LIKELIHOODS),
            ("decoder", _DECODERS),
            ("dispersion", _DISPERSIONS),
            ("prior", _PRIORS),
        ):
            if s[key] not in allowed:
                raise InvalidArgumentError(f"{key} must be one of {allowed}, got {s[key]!r}.")
        if s["dispersion"] == "gene-batch" and registry.batch_key is None:
            raise InvalidArgumentError("dispersion='gene-batch' needs a batch_key registered with setup_anndata.")
        if not (
            isinstance(s["n_hidden"], int)
            and s["n_hidden"] >= 1
            and isinstance(s["n_layers"], int)
            and s["n_layers"] >= 1
        ):
            raise InvalidArgumentError("n_hidden and n_layers must be positive integers.")
        if not 0.0 <= float(s["dropout_rate"]) < 1.0:
            raise InvalidArgumentError(f"dropout_rate must lie in [0, 1), got {s['dropout_rate']!r}.")
        self.registry = registry
        self.var_names = var_names
        self._settings = dict(s, n_latent=int(n_latent))
        self._log_proportions = np.log(np.asarray(gene_totals, dtype=np.float64) / float(np.sum(gene_totals)))
        self.is_trained = False
        self.history = pd.DataFrame(columns=["epoch", "loss_train", "loss_validation", "kl_weight"])
        self.train_indices = np.arange(0)
        self.validation_indices = np.arange(0)
        self._optimizer: torch.optim.Optimizer | None = None
        self.device = torch.device("cpu")
        self.ica: ICARotation | None = None

    def _build_module(self, seed: int) -> CountVAEModule:
        s = self._settings
        dtype = _DTYPES[s["dtype"]]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = CountVAEModule(
                n_genes=len(self.var_names),
                n_latent=s["n_latent"],
                n_batches=self.registry.n_batches,
                likelihood=s["likelihood"],
                decoder=s["decoder"],
                n_hidden=s["n_hidden"],
                n_layers=s["n_layers"],
                dropout_rate=s["dropout_rate"],
                dispersion=s["dispersion"],
                prior=s["prior"],
                batch_norm=s["batch_norm"],
                init_log_proportions=torch.tensor(self._log_proportions, dtype=torch.float32),
            )
        return module.to(dtype=dtype, device=self.device)

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
    def n_latent(self) -> int:
        """Number of latent dimensions."""
        return self._settings["n_latent"]

    @property
    def settings(self) -> dict[str, Any]:
        """Constructor settings (a copy)."""
        return dict(self._settings)

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point type of the parameters."""
        return _DTYPES[self._settings["dtype"]]

    def __repr__(self) -> str:
        s = self._settings
        status = "trained" if self.is_trained else "not trained"
        batches = f", {self.registry.n_batches} batches" if self.registry.batch_key else ""
        return (
            f"CountVAE(n_latent={s['n_latent']}, likelihood={s['likelihood']!r}, decoder={s['decoder']!r}, "
            f"prior={s['prior']!r}, {len(self.var_names)} genes{batches}, {s['dtype']}; {status})"
        )

    # ----- training --------------------------------------------------------------------------
    def train(
        self,
        max_epochs: int | None = None,
        batch_size: int = 128,
        lr: float = 1e-3,
        train_size: float = 0.9,
        early_stopping: bool = False,
        seed: int = 0,
        progress_bar: bool = True,
        *,
        early_stopping_patience: int = 20,
        kl_warmup_epochs: int = 0,
        weight_decay: float = 0.0,
        accelerator: str = "auto",
        engine: Literal["direct", "pyro"] = "direct",
        shuffle_block_cells: int | None = None,
    ) -> CountVAE:
        """Fit the model by stochastic variational inference on minibatches.

        On the first call ``seed`` fixes everything random: the initial
        parameters, the train/validation split, the minibatch order and the
        Monte Carlo noise, so the same seed gives the same numbers on CPU. A
        further call continues from the current parameters and optimiser state,
        on the same split.

        Parameters
        ----------
        max_epochs
            Passes over the training cells; default ``min(round(20000 / n_cells * 400), 400)``
            as in scvi-tools.
        batch_size
            Cells per minibatch.
        lr
            Adam learning rate.
        train_size
            Fraction of cells trained on; the rest report a validation loss each epoch.
        early_stopping
            Stop when the validation loss has not improved for ``early_stopping_patience``
            epochs and restore the best parameters (unlike scvi-tools' Pyro models,
            which have no validation loss and reject this option).
        early_stopping_patience
            Epochs without improvement before stopping.
        seed
            Seed of the fit.
        progress_bar
            Show a tqdm progress bar.
        kl_warmup_epochs
            Ramp the KL weight linearly from ``1 / kl_warmup_epochs`` to 1 over that many
            epochs (scvi-tools' SCVI default is 400; 0 trains the plain ELBO).
        weight_decay
            Adam weight decay.
        accelerator
            ``"auto"`` (GPU when torch sees one), ``"cpu"`` or ``"gpu"``.
        engine
            ``"direct"`` (default) or ``"pyro"``: same loss and gradients, see
            :func:`countvae.module.minibatch_loss`.
        shuffle_block_cells
            How minibatches are drawn. ``None`` (default): a uniform random
            permutation of the training cells each epoch for in-memory data, and block
            shuffling with blocks of 1,024 consecutive cells for backed data
            (``anndata.read_h5ad(..., backed="r")``), which reads the file in large
            contiguous slices and keeps memory bounded. An integer forces block
            shuffling with that block size; see :mod:`countvae.data.loader` for the
            exact order. In-memory and backed data give identical fits for the same value.

        Returns
        -------
        CountVAE
            ``self``, so calls can be chained.

        """
        if self.adata is None:
            raise SetupError("This model was loaded without data; pass adata to CountVAE.load to train it.")
        for name, value in (("batch_size", batch_size), ("early_stopping_patience", early_stopping_patience)):
            if not isinstance(value, int | np.integer) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}.")
        if max_epochs is not None and (not isinstance(max_epochs, int | np.integer) or max_epochs < 1):
            raise InvalidArgumentError(f"max_epochs must be a positive integer, got {max_epochs!r}.")
        if not (isinstance(lr, float | int) and lr > 0):
            raise InvalidArgumentError(f"lr must be a positive number, got {lr!r}.")
        if shuffle_block_cells is not None and (
            not isinstance(shuffle_block_cells, int | np.integer) or shuffle_block_cells < 1
        ):
            raise InvalidArgumentError(f"shuffle_block_cells must be a positive integer, got {shuffle_block_cells!r}.")
        if engine not in ("direct", "pyro"):
            raise InvalidArgumentError(f"engine must be 'direct' or 'pyro', got {engine!r}.")
        device = _resolve_device(accelerator)
        source = CountSource(get_count_matrix(self.adata, self.registry), batch_codes(self.adata, self.registry))
        if not self.is_trained:
            self.device = device
            self.module = self._build_module(seed)
            self.train_indices, self.validation_indices = split_indices(source.n_obs, train_size, seed)
            self._optimizer = None
            if len(self.train_indices) < 2:
                raise InvalidArgumentError("Training needs at least 2 cells in the training split.")
        elif device != self.device:
            self.module.to(device)
            self.device = device
            self._optimizer = None
        epochs = max_epochs if max_epochs is not None else default_max_epochs(len(self.train_indices))
        plan = TrainingPlan(
            max_epochs=int(epochs),
            batch_size=int(batch_size),
            lr=float(lr),
            weight_decay=float(weight_decay),
            kl_warmup_epochs=int(kl_warmup_epochs),
            early_stopping=bool(early_stopping),
            early_stopping_patience=int(early_stopping_patience),
            engine=engine,
            seed=int(seed),
            progress_bar=progress_bar,
            shuffle_block_cells=None if shuffle_block_cells is None else int(shuffle_block_cells),
        )
        offset = int(self.history["epoch"].max()) if len(self.history) else 0
        self.ica = None  # the latents are about to change; a stored ICA fit would no longer apply
        try:
            history, self._optimizer = train_module(
                self.module, source, self.train_indices, self.validation_indices, plan, self._optimizer, offset
            )
        finally:
            self.is_trained = True
        self.history = pd.concat([self.history, history], ignore_index=True) if len(self.history) else history
        return self

    # ----- per-cell outputs ------------------------------------------------------------------
    def _require_trained(self) -> None:
        if not self.is_trained:
            raise NotTrainedError("The model is not trained yet; call model.train() first.")

    def _source(self, adata: ad.AnnData | None, indices) -> tuple[ad.AnnData, CountSource, np.ndarray]:
        self._require_trained()
        if adata is None:
            if self.adata is None:
                raise SetupError("This model was loaded without data; pass adata=... explicitly.")
            adata = self.adata
        source, idx = query_source(
            adata, self.registry, self.var_names, indices=indices, validate=adata is not self.adata
        )
        return adata, source, idx

    def get_latent_representation(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        give_mean: bool = True,
        seed: int = 0,
        batch_size: int = 1024,
        rotation: Literal["ica"] | ICARotation | None = None,
    ) -> np.ndarray:
        """Posterior mean of ``z`` per cell (or one draw with ``give_mean=False``).

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
        rotation
            ``None``: the model's own (arbitrary) coordinates. ``"ica"``: ICA
            coordinates, from an :class:`countvae.ica.ICARotation` fitted once to
            the posterior means of all training cells and kept in ``model.ica``,
            so every call uses the same axes (training again discards it). An
            ``ICARotation``: used as is when fitted; fitted to the training
            cells' posterior means and kept in ``model.ica`` when not. The ICA
            map whitens and is therefore not orthogonal: see :mod:`countvae.ica`
            for what it preserves.

        Returns
        -------
        numpy.ndarray
            Shape (cells, n_latent), or (cells, n_components) in ICA coordinates.

        """
        _, source, idx = self._source(adata, indices)
        z = inference.latent_representation(self.module, source, idx, give_mean, seed, batch_size)
        if rotation is None:
            return z
        return self._ica_for(rotation).transform(z)

    def _ica_for(self, rotation: Literal["ica"] | ICARotation) -> ICARotation:
        if isinstance(rotation, ICARotation) and hasattr(rotation, "components_"):
            return rotation
        if isinstance(rotation, str) and rotation == "ica":
            # A reparameterized copy (countvae.invariance) inherits ``ica`` but not its coordinates.
            if self.ica is not None and getattr(self, "_ica_coordinates", None) == self._latent_coordinates():
                return self.ica
            rotation = ICARotation()
        if not isinstance(rotation, ICARotation):
            raise InvalidArgumentError(f"rotation must be None, 'ica' or an ICARotation, got {rotation!r}.")
        if self.adata is None:
            raise SetupError("Fitting the ICA needs the training cells; this model was loaded without data.")
        _, source, idx = self._source(None, None)
        self.ica = rotation.fit(inference.latent_representation(self.module, source, idx, True, 0, 1024))
        self._ica_coordinates = self._latent_coordinates()
        return self.ica

    def _latent_coordinates(self) -> bytes | None:
        """Identifies the latent coordinates: the latent map set by a reparameterization, if any."""
        latent_map = self.module.latent_map
        return None if latent_map is None else latent_map.detach().cpu().numpy().tobytes()

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

        Decodes the posterior mean of ``z`` (or averages ``n_samples`` posterior
        draws). scvi-tools' default ``library_size=1`` gives proportions; the
        default here, 1e4, gives counts per 10,000 as in ``sc.pp.normalize_total``.

        Parameters
        ----------
        adata
            Cells to evaluate (default: the training AnnData).
        indices
            Positions of a subset of cells.
        library_size
            Library size to scale the expected shares to.
        n_samples
            Posterior draws to average (1: decode the posterior mean).
        transform_batch
            Decode every cell as if it came from this batch category.
        seed
            Seed of the posterior draws.
        return_numpy
            Return an array instead of a DataFrame.

        Returns
        -------
        pandas.DataFrame or numpy.ndarray
            Cells x genes, labelled unless ``return_numpy``.

        """
        adata, source, idx = self._source(adata, indices)
        code = None
        if transform_batch is not None:
            if transform_batch not in self.registry.batch_categories:
                raise InvalidArgumentError(
                    f"transform_batch {transform_batch!r} is not a training batch; "
                    f"known: {self.registry.batch_categories}."
                )
            code = self.registry.batch_categories.index(transform_batch)
        values = inference.normalized_expression(self.module, source, idx, library_size, n_samples, code, seed)
        if return_numpy:
            return values
        return pd.DataFrame(values, index=adata.obs_names[idx], columns=self.var_names)

    def get_log_predictive_density(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        n_samples: int = 1000,
        seed: int = 0,
        progress_bar: bool = False,
    ) -> pd.DataFrame:
        """Importance-sampled ``log p(x)`` per cell, in nats, with its Monte Carlo standard error.

        Evaluate it on held-out cells (cells not used in training) to compare
        models by predictive fit. See :func:`countvae.model.inference.log_predictive_density`.

        Returns
        -------
        pandas.DataFrame
            Index: cell names; columns ``lpd`` (a log density: higher is better),
            ``mc_se`` and ``ess`` (effective sample size of the importance weights).

        """
        adata, source, idx = self._source(adata, indices)
        frame = inference.log_predictive_density(self.module, source, idx, n_samples, seed, progress_bar=progress_bar)
        frame.index = adata.obs_names[idx]
        return frame

    def get_elbo(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        n_samples: int = 10,
        seed: int = 0,
        return_mean: bool = True,
    ) -> float | np.ndarray:
        """ELBO per cell (a log density, higher is better); the mean over cells unless ``return_mean=False``."""
        _, source, idx = self._source(adata, indices)
        values = inference.elbo_per_cell(self.module, source, idx, n_samples, seed)
        return float(values.mean()) if return_mean else values

    def posterior_predictive_sample(
        self,
        adata: ad.AnnData | None = None,
        indices: np.ndarray | None = None,
        n_samples: int = 1,
        seed: int = 0,
    ) -> np.ndarray:
        """Counts simulated from the fitted model for each cell.

        Returns
        -------
        numpy.ndarray
            Shape (cells, genes) for ``n_samples=1``, else (cells, genes, n_samples).
            scvi-tools returns a ``sparse.GCXS`` array of the second shape.

        """
        _, source, idx = self._source(adata, indices)
        draws = inference.posterior_predictive(self.module, source, idx, n_samples, seed)
        return draws[..., 0] if n_samples == 1 else draws

    def differential_expression(
        self,
        adata: ad.AnnData | None = None,
        groupby: str | None = None,
        group1: str | list[str] | None = None,
        group2: str | None = None,
        idx1: np.ndarray | list[int] | list[bool] | None = None,
        idx2: np.ndarray | list[int] | list[bool] | None = None,
        *,
        delta: float = 0.25,
        fdr_target: float = 0.05,
        batch_correction: bool = False,
        n_samples_overall: int = differential.DEFAULT_N_SAMPLES,
        test_mode: Literal["two", "three"] = "three",
        pseudocounts: float | None = None,
        all_stats: bool = True,
        n_bootstrap: int = differential.DEFAULT_N_BOOTSTRAP,
        seed: int = 0,
    ) -> pd.DataFrame:
        """Differential expression between groups of cells, as scvi-tools' ``mode="change"``.

        Per gene: the posterior probability that the log2 fold change exceeds
        ``delta`` (``proba_de``), the Bayes factor, LFC summaries, mean expression
        per group, the FDR-controlled call ``is_de_fdr_<fdr_target>``, and the Monte
        Carlo error of each. See :mod:`countvae.model.differential` for the
        definitions and :func:`countvae.model.differential.differential_expression`
        for every argument.

        Returns
        -------
        pandas.DataFrame
            One row per gene (and comparison), sorted by ``proba_de``.

        """
        return differential.differential_expression(
            self,
            adata,
            groupby,
            group1,
            group2,
            idx1,
            idx2,
            delta=delta,
            fdr_target=fdr_target,
            batch_correction=batch_correction,
            n_samples_overall=n_samples_overall,
            test_mode=test_mode,
            pseudocounts=pseudocounts,
            all_stats=all_stats,
            n_bootstrap=n_bootstrap,
            seed=seed,
        )

    def get_loadings(self) -> pd.DataFrame:
        """Decoder weights ``W`` of the linear decoder, genes x latent (like ``LinearSCVI.get_loadings``).

        The columns are only determined up to an orthogonal transformation
        (see :mod:`countvae.invariance`): compare loadings across fits by their
        span, not column by column.
        """
        if self._settings["decoder"] != "linear":
            raise InvalidArgumentError("get_loadings() needs decoder='linear'; an MLP decoder has no loadings.")
        self._require_trained()
        weight = self.module.decoder.weight.detach().cpu().numpy()
        return pd.DataFrame(weight, index=self.var_names, columns=[f"Z_{i}" for i in range(self.n_latent)])

    def write_results(
        self,
        adata: ad.AnnData | None = None,
        *,
        latent_key: str | None = anndata_results.LATENT_KEY,
        layer: str | None = anndata_results.LAYER_KEY,
        loadings_key: str | None = anndata_results.LOADINGS_KEY,
        uns_key: str | None = anndata_results.UNS_KEY,
        library_size: float = 1e4,
        overwrite: bool = False,
    ) -> dict[str, str]:
        """Store the embedding, normalized expression, loadings and a record in ``adata``, for scanpy.

        Default keys: ``obsm["X_countvae"]``, ``layers["countvae_normalized"]``,
        ``varm["countvae_loadings"]`` (linear decoder only) and ``uns["countvae"]``.
        See :func:`countvae.model.anndata_results.write_results` for every
        argument; existing keys are kept unless ``overwrite=True``.

        Returns
        -------
        dict
            The slots written and their keys.

        """
        return anndata_results.write_results(
            self,
            adata,
            latent_key=latent_key,
            layer=layer,
            loadings_key=loadings_key,
            uns_key=uns_key,
            library_size=library_size,
            overwrite=overwrite,
        )

    # ----- files -----------------------------------------------------------------------------
    def save(self, dir_path: str | os.PathLike, overwrite: bool = False, save_anndata: bool = False) -> None:
        """Write the model to a folder (built under a temporary name, then renamed).

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing folder; otherwise an existing folder is an error.
        save_anndata
            Also write the training AnnData as ``adata.h5ad``.

        """
        latent_map = self.module.latent_map
        tensors = {f"module.{k}": v for k, v in self.module.state_dict().items()}
        tensors["train_indices"] = torch.as_tensor(self.train_indices, dtype=torch.long)
        tensors["validation_indices"] = torch.as_tensor(self.validation_indices, dtype=torch.long)
        tensors["log_proportions"] = torch.as_tensor(self._log_proportions)
        settings = {
            "settings": self._settings,
            "registry": self.registry.to_dict(),
            "var_names": [str(v) for v in self.var_names],
            "is_trained": self.is_trained,
            "has_latent_map": latent_map is not None,
            "history": self.history.astype(float).replace({np.nan: None}).to_dict(orient="list"),
        }
        if save_anndata and self.adata is None:
            raise SetupError("save_anndata=True, but this model holds no AnnData.")
        write_model_folder(dir_path, settings, tensors, overwrite, self.adata if save_anndata else None)

    @classmethod
    def load(cls, dir_path: str | os.PathLike, adata: ad.AnnData | None = None, accelerator: str = "cpu") -> CountVAE:
        """Read a model saved with :meth:`save`.

        Parameters
        ----------
        dir_path
            The model folder.
        adata
            Data to attach (checked to have the training genes); when ``None`` the
            folder's ``adata.h5ad`` is read if present.
        accelerator
            Device for the parameters.

        Raises
        ------
        ModelFileError
            If the folder is incomplete, corrupted or of another format version.

        """
        record, tensors, adata_path = read_model_folder(dir_path)
        registry = Registry.from_dict(record["registry"])
        var_names = pd.Index(record["var_names"])
        if adata is None and adata_path is not None:
            adata = ad.read_h5ad(adata_path)
        self = cls.__new__(cls)
        log_proportions = tensors["log_proportions"].numpy()
        n_cells = len(tensors["train_indices"]) + len(tensors["validation_indices"])
        self._configure(
            registry,
            var_names,
            max(n_cells, record["settings"]["n_latent"] + 1),
            record["settings"],
            np.exp(log_proportions),
        )
        self.device = _resolve_device(accelerator)
        self.module = self._build_module(seed=0)
        if record.get("has_latent_map"):
            self.module.latent_map = torch.zeros(self.n_latent, self.n_latent, dtype=self.dtype, device=self.device)
        state = {k[len("module.") :]: v for k, v in tensors.items() if k.startswith("module.")}
        try:
            self.module.load_state_dict(state)
        except RuntimeError as exc:
            raise ModelFileError(f"{dir_path}: its parameters do not fit the recorded settings: {exc}") from None
        self.module.to(self.device)
        self.train_indices = tensors["train_indices"].numpy()
        self.validation_indices = tensors["validation_indices"].numpy()
        self.is_trained = bool(record["is_trained"])
        self.history = pd.DataFrame(record["history"]).astype(float)
        if len(self.history):
            self.history["epoch"] = self.history["epoch"].astype(int)
        self.adata = None
        if adata is not None:
            check_genes(get_var_names(adata, resolve_registry(adata, registry)), var_names)
            self.adata = adata
        self.module.eval()
        return self
