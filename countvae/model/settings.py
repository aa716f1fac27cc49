"""What a :class:`countvae.CountVAE` is built from: its settings and what it keeps of its training data.

Both are plain, validated dataclasses, so that ``CountVAE.__init__`` and ``CountVAE.load`` build a model alike: from a
:class:`ModelSettings` and a :class:`DataSummary` (from an AnnData, or read back from a model folder).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._settings import documents_settings, setting
from countvae.data.gene_sets import as_gene_programs, check_gene_programs
from countvae.data.registry import Registry, batch_codes, get_count_matrix, get_registry, get_var_names
from countvae.data.validation import checked_count_totals
from countvae.errors import InvalidArgumentError, InvalidDataError, SetupError

LIKELIHOODS = ("poisson", "nb", "zinb")
DECODERS = ("linear", "mlp")
DISPERSIONS = ("gene", "gene-batch")
PRIORS = ("normal", "laplace", "diagonal")
LOADINGS_PRIORS = ("none", "horseshoe", "programs")
#: Latent dimensions when neither ``n_latent`` nor ``gene_programs`` gives them.
DEFAULT_N_LATENT = 10

#: Floating-point types a model can use, by the name stored in its settings.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``"float32"`` or ``"float64"`` for a torch dtype or its name.

    Raises
    ------
    InvalidArgumentError
        For any other type.

    """
    for name, value in DTYPES.items():
        if dtype in (value, name):
            return name
    raise InvalidArgumentError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}.")


@documents_settings()
@dataclass(frozen=True)
class ModelSettings:
    """The constructor settings of a :class:`countvae.CountVAE`, checked when created.

    Each field is declared once here, with its description; ``CountVAE(adata, ...)`` takes them as keywords (or all as
    ``settings=ModelSettings(...)``) and generates its signature and "Parameters" section from them
    (``countvae._settings``). An instance holds resolved values: ``n_latent``, ``loadings_prior`` and ``gene_programs``
    as they follow from one another, ``dtype`` by name (:meth:`validate`).

    Attributes
    ----------
    {settings}

    """

    n_latent: int | None = setting(
        None,
        """Latent dimensions; at least 1 and fewer than the number of genes and cells (default 10, or the number of
        ``gene_programs``).""",
    )
    likelihood: Literal["poisson", "nb", "zinb"] = setting(
        "nb",
        """``"poisson"``, ``"nb"`` (default) or ``"zinb"``. scvi-tools' ``SCVI`` defaults to
        ``gene_likelihood="zinb"``: a port that relied on that default fits an NB model here unless it passes
        ``likelihood="zinb"``.""",
    )
    decoder: Literal["linear", "mlp"] = setting("mlp", """``"linear"`` or ``"mlp"``.""")
    n_hidden: int = setting(128, "Hidden width of the encoder (and of the MLP decoder).")
    n_layers: int = setting(1, "Hidden layers of the encoder (and of the MLP decoder).")
    dropout_rate: float = setting(0.1, "Dropout rate of the encoder.")
    dispersion: Literal["gene", "gene-batch"] = setting(
        "gene", """``"gene"`` or ``"gene-batch"`` inverse dispersion (NB/ZINB)."""
    )
    prior: Literal["normal", "laplace", "diagonal"] = setting(
        "normal",
        """The prior on ``z``: ``"normal"`` (default, N(0, I): any rotation of the axes fits equally well).
        ``"laplace"`` (independent unit-variance Laplace) is a restriction: only signed permutations of the axes
        leave ``p(x)`` unchanged, so non-Gaussian sources can fix the axes (measure what it buys with
        :func:`countvae.diagnostics.compare_restrictions`). ``"diagonal"`` (learned scales) exists as a control for
        the invariance checks.""",
    )
    batch_norm: bool = setting(True, "Batch normalisation in hidden layers (scVI's default).")
    dtype: Literal["float32", "float64"] | torch.dtype = setting(
        "float32", """``torch.float32`` (default) or ``torch.float64`` (or its name; stored by name)."""
    )
    loadings_prior: Literal["none", "horseshoe", "programs"] | None = setting(
        None,
        """A prior on the linear decoder's loadings ``W``, which then has a posterior
        (``get_loadings(return_uncertainty=True)``, :meth:`countvae.CountVAE.loadings_posterior`): ``"horseshoe"``
        (regularized horseshoe: sparse loadings; axes fixed up to signed permutations) or ``"programs"`` (named gene
        programs, see ``gene_programs``). Default: ``"programs"`` when ``gene_programs`` are given, else ``"none"``
        (point-estimated ``W``). See :mod:`countvae.module.loadings`.""",
    )
    gene_programs: dict[str, list[str]] | str | os.PathLike | None = setting(
        None,
        """``{name: [genes]}`` or the path of a GMT file: latent dimension ``k`` is program ``k``, its loadings are
        shrunk to 0 outside the program's genes (prior sd ``program_outside_scale``, against 1 inside), and the
        dimension is named by it. Every gene must be in the data and every program needs at least 2
        (:func:`countvae.data.check_gene_programs` drops unknown genes first if asked). ``n_latent`` defaults to the
        number of programs. Stored as the ``{name: [genes]}`` dict.""",
    )
    horseshoe_scale: float = setting(
        0.1, "Scale ``tau0`` of the half-Cauchy prior on the horseshoe's global shrinkage."
    )
    program_outside_scale: float = setting(
        0.01, "Prior standard deviation of the loadings outside a dimension's program."
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every setting and store plain, resolved values (numpy integers and torch dtypes are accepted).

        Raises
        ------
        InvalidArgumentError
            Naming the first setting that is out of range.

        """
        if self.gene_programs is not None:  # a GMT path is read once, here
            object.__setattr__(self, "gene_programs", as_gene_programs(self.gene_programs))
        n_latent = self.n_latent if self.n_latent is not None else len(self.gene_programs or ()) or DEFAULT_N_LATENT
        normalised = {
            "n_latent": check_int("n_latent", n_latent, 1),
            "likelihood": check_choice("likelihood", self.likelihood, LIKELIHOODS),
            "decoder": check_choice("decoder", self.decoder, DECODERS),
            "n_hidden": check_int("n_hidden", self.n_hidden, 1),
            "n_layers": check_int("n_layers", self.n_layers, 1),
            "dropout_rate": check_number("dropout_rate", self.dropout_rate, 0.0, 1.0, high_open=True),
            "dispersion": check_choice("dispersion", self.dispersion, DISPERSIONS),
            "prior": check_choice("prior", self.prior, PRIORS),
            "dtype": dtype_name(self.dtype),
        }
        normalised["batch_norm"] = check_bool("batch_norm", self.batch_norm)
        normalised.update(self._loadings_settings(normalised["n_latent"], normalised["decoder"]))
        for name, value in normalised.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, at creation

    def _loadings_settings(self, n_latent: int, decoder: str) -> dict[str, Any]:
        programs = self.gene_programs
        kind = self.loadings_prior if self.loadings_prior is not None else ("programs" if programs else "none")
        kind = check_choice("loadings_prior", kind, LOADINGS_PRIORS)
        if kind == "programs" and programs is None:
            raise InvalidArgumentError("loadings_prior='programs' needs gene_programs={name: [genes]} (or a GMT path).")
        if programs is not None and kind != "programs":
            raise InvalidArgumentError(
                f"gene_programs were given with loadings_prior={kind!r}; gene programs are their own prior on the "
                "loadings (leave loadings_prior unset, or set it to 'programs')."
            )
        if kind != "none" and decoder != "linear":
            raise InvalidArgumentError(
                f"loadings_prior={kind!r} puts a prior on the loadings of the linear decoder; use decoder='linear'."
            )
        if programs is not None and len(programs) != n_latent:
            raise InvalidArgumentError(
                f"{len(programs)} gene programs were given with n_latent={n_latent}: each latent dimension is one "
                f"program, so set n_latent={len(programs)} (or leave it unset)."
            )
        return {
            "loadings_prior": kind,
            "gene_programs": programs,
            "horseshoe_scale": check_number("horseshoe_scale", self.horseshoe_scale, 0.0, low_open=True),
            "program_outside_scale": check_number(
                "program_outside_scale", self.program_outside_scale, 0.0, 1.0, low_open=True, high_open=True
            ),
        }

    @property
    def torch_dtype(self) -> torch.dtype:
        """The floating-point type of the parameters."""
        return DTYPES[self.dtype]

    def check_data(self, data: DataSummary) -> None:
        """Check the settings against the training data they will be used with.

        Raises
        ------
        InvalidArgumentError
            If ``n_latent`` >= the number of genes or cells, or ``dispersion="gene-batch"`` has no registered batch key.
        InvalidDataError
            If a gene program names genes the data lack, or keeps fewer than
            :data:`countvae.data.gene_sets.MIN_PROGRAM_GENES` of them.

        """
        n_genes = len(data.var_names)
        if self.n_latent >= n_genes or (data.n_cells is not None and self.n_latent >= data.n_cells):
            raise InvalidArgumentError(
                f"n_latent={self.n_latent} is too large for {data.n_cells} cells x {n_genes} genes: it must be "
                "smaller than both (a latent space as large as the data cannot compress it)."
            )
        if self.dispersion == "gene-batch" and data.registry.batch_key is None:
            raise InvalidArgumentError("dispersion='gene-batch' needs a batch_key registered with setup_anndata.")
        if self.gene_programs is not None:
            check_gene_programs(self.gene_programs, data.var_names)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-safe dictionary (the keyword arguments of ``CountVAE``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ModelSettings:
        """Settings from :meth:`to_dict` output (keys it does not know are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise InvalidArgumentError(f"Unknown model settings {unknown}; known: {sorted(known)}.")
        return cls(**record)


@dataclass(frozen=True)
class DataSummary:
    """What a model keeps of its training data: enough to build it again without the data.

    Attributes
    ----------
    registry
        Where the AnnData keeps its counts and covariates (:func:`countvae.data.setup_anndata`).
    var_names
        The training genes, in order.
    log_proportions
        Each gene's log share of all training counts (float64); initialises the decoder's output bias.
    n_cells
        Number of training cells, or ``None`` when unknown (a model folder saved before training).

    """

    registry: Registry
    var_names: pd.Index
    log_proportions: np.ndarray
    n_cells: int | None = None

    @classmethod
    def from_anndata(cls, adata: ad.AnnData) -> DataSummary:
        """The summary of an AnnData registered with :func:`countvae.data.setup_anndata`.

        Raises
        ------
        InvalidArgumentError
            If ``adata`` is not an AnnData.
        SetupError
            If it is not registered.
        InvalidDataError
            If the counts are not raw counts (:func:`countvae.data.validate_counts`), or a cell or a gene has no counts
            at all (possible when an AnnData is subset or changed after registration).

        """
        if not isinstance(adata, ad.AnnData):
            raise InvalidArgumentError(f"CountVAE expects an AnnData, got {type(adata).__name__}.")
        registry = get_registry(adata)
        if registry is None:
            raise SetupError("This AnnData is not set up; call CountVAE.setup_anndata(adata, ...) first.")
        # Checked again, not only counted: the counts may have been changed in place (e.g. normalised) since setup.
        totals = checked_count_totals(get_count_matrix(adata, registry), registry.describe_counts())
        gene_totals = totals.gene_totals
        n_empty_cells = int(np.count_nonzero(totals.cell_totals == 0))
        if n_empty_cells:
            raise InvalidDataError(
                f"{n_empty_cells} of {len(totals.cell_totals)} cells have zero total counts in the training genes (a "
                "subset taken after setup can leave cells empty); a cell without counts has no library size. Remove "
                "them (e.g. `sc.pp.filter_cells(adata, min_counts=1)`) and call CountVAE.setup_anndata again."
            )
        n_empty = int(np.count_nonzero(gene_totals == 0))
        if n_empty:
            raise InvalidDataError(
                f"{n_empty} of {len(gene_totals)} genes have zero total counts in the training cells; a model cannot "
                "learn their expression. Remove them (e.g. `sc.pp.filter_genes(adata, min_counts=1)`) and call "
                "CountVAE.setup_anndata again."
            )
        log_proportions = np.log(gene_totals / float(np.sum(gene_totals)))
        registry = _batches_of_the_cells(adata, registry)
        return cls(registry, pd.Index(get_var_names(adata, registry)), log_proportions, int(adata.n_obs))


def _batches_of_the_cells(adata: ad.AnnData, registry: Registry) -> Registry:
    """The registration with only the batches ``adata``'s cells have, in the registered order.

    A subset taken after registering keeps every registered batch; a model sized from them would have an effect for
    batches none of its cells has, never trained, and would score such cells with it instead of refusing them as
    unseen (a registration made on the subset itself would). Codes are read through the model's categories
    (:func:`countvae.model.query.resolve_registry`), so its cells' codes follow the narrowed list.
    """
    if registry.batch_key is None:
        return registry
    present = np.unique(batch_codes(adata, registry))
    if len(present) == registry.n_batches:
        return registry
    return replace(registry, batch_categories=[registry.batch_categories[i] for i in present])
