""":class:`SCVIFit`: the :class:`~countvae.diagnostics.fitting.fitted_model.FittedModel` of an scvi-tools model.

scvi-tools is an optional dependency; this module does not import it (the model object brings its own classes). The
adapter calls scvi-tools' private methods (``_validate_anndata``, ``_make_data_loader``) because scvi-tools offers no
public way to set up a new AnnData like the training data or to iterate over it in the model's minibatches; these are
the calls its own ``get_marginal_ll`` makes.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae._warnings import warn_at_caller
from countvae.data.validation import validate_counts
from countvae.diagnostics.fitting.lpd_quantity import GIVEN_OBSERVED_LIBRARY, LIBRARY_INTEGRATED, with_quantity
from countvae.diagnostics.fitting.scvi_log_joint import SCVICells, float64_copy
from countvae.diagnostics.fitting.scvi_storage import preserved_global_rng, quiet_scvi, scvi_kind
from countvae.errors import InvalidArgumentError, InvalidDataError, NotTrainedError, UnreliableEstimateWarning
from countvae.model.query import check_genes
from countvae.module.importance import KHAT_THRESHOLD, ImportanceSummary
from countvae.module.marginal import MarginalSettings, estimate_log_marginal

#: Elements (samples x cells x genes) per forward pass when estimating scvi-tools' log p(x).
_LPD_ELEMENTS_PER_PASS = 1 << 22
#: Cells per forward pass through an scvi-tools decoder.
_CELLS_PER_CHUNK = 1024

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _keeps_global_rng(method: _Method) -> _Method:
    """Run ``method`` with Python's, numpy's and torch's global random states restored afterwards.

    countvae promises no global RNG side effects, but scvi-tools moves these states on calls that only read a model:
    validating an AnnData (a view or a new object) checks a few cells drawn from numpy's global generator,
    ``inference`` draws ``z`` from torch's even when the mean is asked for, and every torch ``DataLoader`` iteration
    draws a base seed from it.
    """

    @functools.wraps(method)
    def wrapper(self: SCVIFit, *args: Any, **kwargs: Any) -> Any:
        with preserved_global_rng():
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass
class SCVIFit:
    """:class:`FittedModel` over a trained ``scvi.model.SCVI`` or ``scvi.model.LinearSCVI``.

    scvi-tools' own transfer of the training registration sets up an AnnData passed to a method, on a copy (the
    caller's object is not modified) kept for the most recent AnnData.

    Where this adapter departs from calling scvi-tools' methods, and why:

    * :meth:`log_predictive_density` estimates ``log p(x)`` with countvae's estimator on the module's own log joint, in
      float64: scvi-tools' ``get_marginal_ll`` (guide importance sampling, float32) can be far too low where the
      guide is poor;
    * :meth:`normalized_expression` decodes the posterior *mean*, as the protocol asks, where
      ``get_normalized_expression`` decodes one posterior draw.

    Attributes
    ----------
    model
        The trained scvi-tools model.
    seed
        The seed it was trained from (``scvi.settings.seed``).
    name
        Label in reports (default ``"seed <seed>"``).
    kind
        ``"scvi"`` or ``"linearscvi"`` (default: from the model's class).
    batch_size
        Cells per minibatch (scvi-tools' default is 128).
    lpd_settings
        The settings of :meth:`log_predictive_density`'s estimator but its number of draws (default:
        :class:`~countvae.module.marginal.MarginalSettings`'s).

    """

    model: Any
    seed: int
    name: str = ""
    kind: str = ""
    batch_size: int = 128
    lpd_settings: MarginalSettings | None = None
    _cache: tuple[Any, ad.AnnData] | None = field(default=None, init=False, repr=False, compare=False)
    _module64: tuple[Any, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"seed {self.seed}"
        if not self.kind:
            self.kind = scvi_kind(type(self.model))
        if not self.model.is_trained:
            raise NotTrainedError("The scvi-tools model is not trained yet; call model.train() first.")
        module = self.model.module
        if getattr(module, "latent_distribution", "normal") != "normal":
            raise InvalidArgumentError(
                f"latent_distribution={module.latent_distribution!r}: the diagnostics need the normal latent "
                "(the N(0, I) prior whose rotations they measure)."
            )
        if module.gene_likelihood not in ("zinb", "nb", "poisson"):
            raise InvalidArgumentError(
                f"gene_likelihood={module.gene_likelihood!r} is not a count likelihood; use 'zinb', 'nb' or 'poisson'."
            )
        # From the model's registry: scvi-tools' VAE takes the covariates' sizes as arguments but does not keep them.
        stats = self.model.summary_stats
        if stats.get("n_extra_categorical_covs", 0) or stats.get("n_extra_continuous_covs", 0):
            raise InvalidArgumentError(
                "The scvi-tools model was set up with extra covariates (continuous_covariate_keys or "
                "categorical_covariate_keys); SCVIFit supports batch and labels only."
            )

    @property
    def symmetry(self) -> str:
        """Symmetry group of the N(0, I) latent prior."""
        return "orthogonal"

    @property
    def lpd_quantity(self) -> str:
        """Which ``log p(x)`` the model defines: given the observed library size, or with the library integrated.

        scvi-tools' ``use_observed_lib_size`` decides: ``True`` (SCVI's default) gives the first, ``False``
        (LinearSCVI's: a per-batch normal prior on the log library) the second
        (:mod:`countvae.diagnostics.fitting.lpd_quantity`).
        """
        return GIVEN_OBSERVED_LIBRARY if self.model.module.use_observed_lib_size else LIBRARY_INTEGRATED

    @property
    def var_names(self) -> pd.Index:
        """Genes, in the model's order."""
        return pd.Index(self.model.adata.var_names)

    @property
    def n_latent(self) -> int:
        """Latent dimensions."""
        return int(self.model.module.n_latent)

    # ----- data ----------------------------------------------------------------------------
    def _prepared(self, adata: ad.AnnData) -> ad.AnnData:
        """``adata`` itself if it is set up for the model, else a set-up copy (cached for the last one)."""
        if not isinstance(adata, ad.AnnData):
            raise InvalidArgumentError(f"Expected an AnnData, got {type(adata).__name__}.")
        check_genes(pd.Index(adata.var_names), self.var_names)
        if self._cache is not None and self._cache[0]() is adata:
            return self._cache[1]
        with quiet_scvi():  # asking scvi-tools about an AnnData it has not seen logs a transfer it has not made
            registered = self.model.get_anndata_manager(adata) is not None
        if registered:
            return adata
        self._check_counts(adata)
        self._check_batches(adata)
        copy = adata.copy()
        try:
            with quiet_scvi():
                copy = self.model._validate_anndata(copy)
        except (ValueError, KeyError) as exc:
            raise InvalidDataError(
                f"This AnnData cannot be set up like the scvi-tools model's training data: {exc}"
            ) from None
        self._cache = (weakref.ref(adata), copy)
        return copy

    def _check_batches(self, adata: ad.AnnData) -> None:
        """Refuse batches the model was not trained on, with countvae's remedy.

        scvi-tools' own message suggests ``extend_categories = True``, which no countvae call takes and which would
        score the cells with a batch effect nothing trained.
        """
        from scvi import REGISTRY_KEYS

        manager = self.model.adata_manager
        if REGISTRY_KEYS.BATCH_KEY not in manager.data_registry:
            return
        state = manager.get_state_registry(REGISTRY_KEYS.BATCH_KEY)
        key = state.original_key
        if key not in adata.obs.columns or adata.obs[key].isna().any():
            return  # scvi-tools' own set-up names a missing column or missing values
        known = [str(c) for c in state.categorical_mapping]
        unseen = sorted(set(adata.obs[key].astype(str)) - set(known))
        if unseen:
            raise InvalidDataError(
                f"Batch categories {unseen[:10]} in adata.obs[{key!r}] were not seen in training (known: {known}). "
                "A batch effect cannot be applied to an unseen batch; map those cells to a known batch or retrain "
                "with them."
            )

    def _check_counts(self, adata: ad.AnnData) -> None:
        """Refuse counts the model would read that are not raw counts, as countvae fits' cells are refused.

        scvi-tools only warns about non-integer counts, and NaN or negative ones fail inside torch.
        """
        source = self.model.adata_manager.data_registry["X"]
        if source.attr_name == "X":
            matrix, what = adata.X, "adata.X"
        elif source.attr_name == "layers" and source.attr_key in adata.layers:
            matrix, what = adata.layers[source.attr_key], f"adata.layers[{source.attr_key!r}]"
        else:
            return  # scvi-tools' own set-up names what is missing
        remedy = f"Pass cells with their raw counts in {what}, where the scvi-tools model reads them"
        validate_counts(matrix, what, allow_empty_genes=True, remedy=remedy)

    def _loader(self, prepared: ad.AnnData):
        return self.model._make_data_loader(adata=prepared, batch_size=self.batch_size, shuffle=False)

    def _covariates(self, prepared: ad.AnnData) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch index and labels of every cell, as the data loader gives them, shape (cells, 1)."""
        batches, labels = [], []
        for tensors in self._loader(prepared):
            batches.append(tensors["batch"])
            labels.append(tensors["labels"])
        return torch.cat(batches), torch.cat(labels)

    def _dtypes(self) -> tuple[torch.dtype, np.dtype]:
        """The module's floating-point type, in torch and in numpy."""
        dtype = next(self.model.module.parameters()).dtype
        return dtype, np.dtype(str(dtype).removeprefix("torch."))

    def _log_scale(self, z: torch.Tensor, batch: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Log ``px_scale`` (the decoder's expected share of each gene) at ``z`` (cells, n_latent)."""
        library = torch.zeros((z.shape[0], 1), dtype=z.dtype)
        px = self.model.module.generative(z=z, library=library, batch_index=batch, y=labels)["px"]
        return torch.log(px.scale)

    # ----- protocol --------------------------------------------------------------------------
    @_keeps_global_rng
    def latent(self, adata: ad.AnnData) -> np.ndarray:
        """Posterior means (``get_latent_representation(give_mean=True)``), (cells, n_latent)."""
        return np.asarray(self.model.get_latent_representation(self._prepared(adata), give_mean=True))

    @_keeps_global_rng
    def latent_samples(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """Draws from ``q(z | x) = N(mean, var)`` (``get_latent_representation(return_dist=True)``).

        Returns
        -------
        numpy.ndarray
            (n_samples, cells, n_latent); the noise comes from ``numpy.random.default_rng(seed)``.

        """
        mean, var = self.model.get_latent_representation(self._prepared(adata), return_dist=True)
        eps = np.random.default_rng(seed).standard_normal((n_samples, *mean.shape)).astype(mean.dtype)
        return mean[None] + np.sqrt(var)[None] * eps

    @_keeps_global_rng
    def log_predictive_density(self, adata: ad.AnnData, n_samples: int, seed: int) -> pd.DataFrame:
        """Per-cell ``log p(x)`` by countvae's estimator, through the scvi module's own generative pieces.

        The log joint is scvi's (``module.generative``'s likelihood, the N(0, I) prior, and the library-size prior when
        the library is latent), evaluated in float64 (:class:`~countvae.diagnostics.fitting.scvi_log_joint.SCVICells`);
        the estimator is :func:`countvae.module.marginal.estimate_log_marginal` (Newton to each cell's posterior mode, a
        Student-t/guide mixture proposal, Pareto k-hat, a second pass for unreliable cells), started from scvi's guide.

        Parameters
        ----------
        adata
            Cells to evaluate (set up like the training data on a copy if needed).
        n_samples
            Final importance draws per cell (``MarginalSettings.n_draws``; pilot, restarts and second pass as in
            :attr:`lpd_settings`).
        seed
            Seed of the estimator's ``torch.Generator``: same seed, same numbers.

        Returns
        -------
        pandas.DataFrame
            Columns ``lpd`` (nats, higher is better), ``mc_se`` (NaN where not reliable), ``ess``, ``khat`` and
            ``reliable``, by cell; ``attrs["quantity"]`` is :attr:`lpd_quantity` (a latent library is integrated out).

        Warns
        -----
        UnreliableEstimateWarning
            With the number of cells whose k-hat stays above the threshold, and the remedy.

        """
        if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 2:
            raise InvalidArgumentError(f"n_samples must be an integer >= 2; got {n_samples!r}.")
        settings = replace(self.lpd_settings or MarginalSettings(), n_draws=int(n_samples))
        prepared = self._prepared(adata)
        module = self._float64_module()
        generator = torch.Generator().manual_seed(int(seed))
        points = max(1, _LPD_ELEMENTS_PER_PASS // len(self.var_names))
        parts = []
        for tensors in self._loader(prepared):
            cells = SCVICells.from_tensors(module, tensors)
            loc, scale = cells.guide()
            parts.append(
                estimate_log_marginal(cells.log_joint, loc, scale, generator, settings, points_per_call=points)
            )
        summary = ImportanceSummary.concatenate(parts)
        n_bad = int((~summary.reliable).sum())
        if n_bad:
            warn_at_caller(
                f"{n_bad} of {summary.lpd.size} cells have a Pareto k-hat above {KHAT_THRESHOLD}: their log p(x) "
                "estimate is unreliable (column 'reliable' is False and 'mc_se' is NaN). To fix it, use more draws "
                "(a larger n_samples, or SCVIFit(..., lpd_settings=MarginalSettings(escalation_draws=...))) or "
                "train the scvi-tools model longer; until then leave these cells out of model comparisons.",
                UnreliableEstimateWarning,
            )
        return with_quantity(summary.to_frame(index=adata.obs_names), self.lpd_quantity)

    def _float64_module(self) -> Any:
        """The float64 copy of the module the log joint is evaluated on (made once, then kept)."""
        if self._module64 is None or self._module64[0] is not self.model.module:
            self._module64 = (self.model.module, float64_copy(self.model.module))
        return self._module64[1]

    @_keeps_global_rng
    def normalized_expression(self, adata: ad.AnnData, library_size: float = 1e4) -> np.ndarray:
        """``library_size * px_scale`` decoded at each cell's posterior mean, (cells, genes)."""
        return library_size * np.exp(self.decode_log_rate(adata, self.latent(adata)))

    @_keeps_global_rng
    @torch.no_grad()
    def decode_log_rate(self, adata: ad.AnnData, z: np.ndarray) -> np.ndarray:
        """Log ``px_scale`` at latent values ``z`` of shape (..., cells, n_latent), with the cells' batches."""
        prepared = self._prepared(adata)
        z = np.asarray(z)
        n_cells = prepared.n_obs
        if z.ndim < 2 or z.shape[-2:] != (n_cells, self.n_latent):
            raise InvalidArgumentError(
                f"z must have shape (..., {n_cells}, {self.n_latent}) for these cells, got {z.shape}."
            )
        self.model.module.eval()
        batch, labels = self._covariates(prepared)
        dtype, np_dtype = self._dtypes()
        flat = torch.as_tensor(z.reshape(-1, n_cells, self.n_latent), dtype=dtype)
        out = np.empty((flat.shape[0], n_cells, len(self.var_names)), dtype=np_dtype)
        for i in range(flat.shape[0]):
            for start in range(0, n_cells, _CELLS_PER_CHUNK):
                rows = slice(start, start + _CELLS_PER_CHUNK)
                out[i, rows] = self._log_scale(flat[i, rows], batch[rows], labels[rows]).numpy()
        return out.reshape(*z.shape[:-1], len(self.var_names))

    def loadings(self) -> np.ndarray | None:
        """``LinearSCVI.get_loadings()`` (batch norm folded in), (genes, n_latent); ``None`` for SCVI."""
        return self.model.get_loadings().to_numpy() if self.kind == "linearscvi" else None

    @_keeps_global_rng
    def decoder_jacobian(self, adata: ad.AnnData) -> np.ndarray:
        """Jacobian of log ``px_scale`` at each cell's posterior mean, (cells, genes, n_latent).

        Forward mode, one latent direction at a time, all cells at once (in eval mode a cell's output depends on its
        own ``z`` only).
        """
        prepared = self._prepared(adata)
        dtype, np_dtype = self._dtypes()
        loc = torch.as_tensor(self.latent(prepared), dtype=dtype)
        batch, labels = self._covariates(prepared)
        self.model.module.eval()
        out = np.empty((loc.shape[0], len(self.var_names), self.n_latent), dtype=np_dtype)
        for start in range(0, loc.shape[0], _CELLS_PER_CHUNK):
            rows = slice(start, start + _CELLS_PER_CHUNK)
            z0, b, y = loc[rows], batch[rows], labels[rows]
            for k in range(self.n_latent):
                tangent = torch.zeros_like(z0)
                tangent[:, k] = 1.0
                _, column = torch.func.jvp(lambda z, b=b, y=y: self._log_scale(z, b, y), (z0,), (tangent,))
                out[rows, :, k] = column.detach().numpy()
        return out

    @_keeps_global_rng
    def posterior_predictive(self, adata: ad.AnnData, n_samples: int, seed: int) -> np.ndarray:
        """``posterior_predictive_sample`` as a dense array (cells, genes, n_samples), seeded by ``seed``."""
        prepared = self._prepared(adata)
        torch.manual_seed(seed)  # the decorator restores the caller's state
        draws = self.model.posterior_predictive_sample(prepared, n_samples=n_samples)
        dense = np.asarray(draws.todense() if hasattr(draws, "todense") else draws)
        return dense[..., None] if dense.ndim == 2 else dense
