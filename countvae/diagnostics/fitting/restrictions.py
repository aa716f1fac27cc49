"""Which restricted models to fit: the restriction names, their model settings, and the split-half fits.

A restriction is named as on the command line (``countvae diagnose --restrictions``):

``laplace``
    a Laplace prior on ``z`` (``CountVAE(prior="laplace")``);
``horseshoe``
    a regularized horseshoe prior on the loadings (``loadings_prior="horseshoe"``);
``programs`` or ``programs:<file.gmt>``
    named gene programs (``gene_programs=...``): from the file, or from the
    ``gene_programs`` argument of :func:`countvae.diagnostics.compare_restrictions`;
``ica``
    ICA of the unrestricted model's latents after the fact (nothing is refitted).

Several are separated by commas: ``laplace,horseshoe,programs:markers.gmt,ica``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anndata as ad
import numpy as np

from countvae.data.gene_sets import GenePrograms, read_gmt
from countvae.data.registry import get_registry
from countvae.diagnostics.fitting.broken_fits import without_refit_broken
from countvae.diagnostics.fitting.fit_seeds import (
    FitSeedsSettings,
    check_stored_fits,
    fit_models,
    genes_without_counts,
)
from countvae.diagnostics.fitting.fitted_model import CountVAEFit
from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
from countvae.errors import BrokenFitError, InvalidArgumentError, InvalidDataError
from countvae.model import CountVAE

#: The restriction names, in the order of the report.
RESTRICTION_NAMES = ("laplace", "horseshoe", "programs", "ica")
#: What each restriction is, in the report's words.
LABELS = {
    "unrestricted": "N(0, I) prior, free loadings",
    "laplace": "Laplace prior on z",
    "horseshoe": "horseshoe prior on the loadings",
    "programs": "gene programs",
    "ica": "ICA after the fact",
}
#: The model settings each restriction changes.
MODEL_SETTINGS: dict[str, dict[str, Any]] = {
    "unrestricted": {},
    "laplace": {"prior": "laplace"},
    "horseshoe": {"loadings_prior": "horseshoe"},
    "programs": {},
    "ica": {},
}
SYNTAX = "laplace, horseshoe, programs (or programs:<file.gmt>), ica; several separated by commas"


@dataclass(frozen=True)
class Restriction:
    """One restricted model of the comparison.

    Attributes
    ----------
    name
        ``"unrestricted"`` or one of :data:`RESTRICTION_NAMES`.
    gene_programs_file
        For ``programs:<file.gmt>``, the file.
    model_kwargs
        The model settings it changes (gene programs are added by the comparison).

    """

    name: str
    gene_programs_file: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """What the restriction is, in words."""
        return LABELS[self.name]

    @property
    def post_hoc(self) -> bool:
        """Whether it re-reads the unrestricted fits rather than fitting a model of its own."""
        return self.name == "ica"


UNRESTRICTED = Restriction("unrestricted")


def parse_restrictions(restrictions: str | Iterable[str | Restriction]) -> list[Restriction]:
    """Restrictions from their names (a comma-separated string or a list), in the given order.

    Raises
    ------
    InvalidArgumentError
        For an unknown name, a repeated one, or none at all.

    """
    items = restrictions.split(",") if isinstance(restrictions, str) else list(restrictions)
    out: list[Restriction] = []
    for item in items:
        if isinstance(item, Restriction):
            if item.name not in RESTRICTION_NAMES:
                raise InvalidArgumentError(f"Unknown restriction {item.name!r}; use {SYNTAX}.")
            out.append(item)
            continue
        if not isinstance(item, str):
            raise InvalidArgumentError(f"A restriction is named by a string ({SYNTAX}); got {item!r}.")
        text = item.strip()
        name, _, argument = text.partition(":")
        name = name.strip().lower()
        if name not in RESTRICTION_NAMES or (argument and name != "programs"):
            raise InvalidArgumentError(f"Unknown restriction {text!r}; use {SYNTAX}.")
        out.append(Restriction(name, argument.strip() or None, dict(MODEL_SETTINGS[name])))
    if not out:
        raise InvalidArgumentError(f"No restriction to compare; use {SYNTAX}.")
    names = [r.name for r in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidArgumentError(f"Restrictions {repeated} are given more than once.")
    return out


def restriction_programs(restriction: Restriction, gene_programs: GenePrograms | None) -> GenePrograms:
    """The gene programs of a ``programs`` restriction: its file's, else ``gene_programs``.

    Raises
    ------
    InvalidArgumentError
        If there are none, or both a file and ``gene_programs`` are given.

    """
    if restriction.gene_programs_file is not None:
        if gene_programs is not None:
            raise InvalidArgumentError(
                "Gene programs are given twice (programs:<file.gmt> and gene_programs=...); give one."
            )
        return read_gmt(restriction.gene_programs_file)
    if gene_programs is None:
        raise InvalidArgumentError(
            "The 'programs' restriction needs gene programs: 'programs:<file.gmt>', or gene_programs={name: [genes]}."
        )
    return gene_programs


def split_half_cells(n_obs: int, split_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of ``n_obs`` cells (sorted positions), drawn with ``split_seed``."""
    order = np.random.default_rng([int(split_seed), 0x4A1F]).permutation(n_obs)
    half = n_obs // 2
    return np.sort(order[:half]), np.sort(order[half:])


def check_split_half_genes(adata: ad.AnnData, heldout_fraction: float, split_seed: int) -> None:
    """Refuse, before any fit, genes without counts in one of the split halves of the fit cells.

    A model fitted on that half would refuse them, but only after every seed of every model was fitted.

    Raises
    ------
    InvalidDataError
        Naming the half, how many genes and a few of them, and the remedy.

    """
    registry = get_registry(adata)
    fit_idx, _ = heldout_split(adata.n_obs, heldout_fraction, split_seed)
    for number, half in enumerate(split_half_cells(len(fit_idx), split_seed), start=1):
        n_empty, names = genes_without_counts(cells_at(adata, fit_idx[half]), registry)
        if n_empty:
            raise InvalidDataError(
                f"{n_empty} genes have no counts in half {number} of the {len(fit_idx)} fit cells, on which the "
                f"comparison of restrictions fits each model again (e.g. {names}). Remove rarely detected genes first "
                "(e.g. scanpy.pp.filter_genes(adata, min_cells=10)), or compare without the split halves: "
                "split_half=False (--no-split-half)."
            )


def fit_split_halves(
    adata_fit: ad.AnnData,
    model_kwargs: dict[str, Any],
    train_kwargs: dict[str, Any],
    seeds: tuple[int, int],
    split_seed: int = 0,
) -> tuple[CountVAEFit, CountVAEFit]:
    """The same model fitted on two disjoint random halves of the training cells, each from its own seed.

    ``adata_fit`` must be registered (``CountVAE.setup_anndata``); the halves are :func:`split_half_cells` with
    ``split_seed``. Different seeds keep the fits from agreeing through a shared initialisation, so their agreement
    comes from the data and the model alone. An explicit ``max_epochs`` is doubled: each half gets as many optimizer
    steps as a fit on all the cells. Returns the fits ``"half 1"`` and ``"half 2"``.
    """
    if len(seeds) != 2 or seeds[0] == seeds[1]:
        raise InvalidArgumentError(f"The split halves are fitted from two different seeds; got {seeds!r}.")
    train = {"progress_bar": False, **train_kwargs}
    if train.get("max_epochs") is not None:
        # The halves then differ from a fit on all the cells in cells, not in optimisation (a rotation that a
        # restriction drives is slow to settle; fewer steps would look like fewer cells). The default max_epochs
        # already grows as the cells shrink.
        train["max_epochs"] = 2 * int(train["max_epochs"])
    fits = []
    halves = split_half_cells(adata_fit.n_obs, split_seed)
    for number, (positions, seed) in enumerate(zip(halves, seeds, strict=True), start=1):
        model = CountVAE(cells_at(adata_fit, positions), **model_kwargs)
        model.train(**{**train, "seed": seed})
        fits.append(CountVAEFit(model, seed, name=f"half {number}"))
    return fits[0], fits[1]


@dataclass
class RestrictionFits:
    """Every model of a restriction comparison fitted over the same seeds and cells.

    Attributes
    ----------
    fits
        Model name (``"unrestricted"`` first) -> its fits, in seed order.
    seconds
        Model name -> seconds of fitting per seed.
    halves
        Model name -> its two split-half fits (empty without split halves).
    adata_heldout, adata_fit
        The held-out and the training cells every model shares.
    split_seed
        The seed of the split halves of the training cells (:func:`split_half_cells`).

    """

    fits: dict[str, list[CountVAEFit]]
    seconds: dict[str, dict[int, float]]
    halves: dict[str, tuple[CountVAEFit, CountVAEFit]]
    adata_heldout: ad.AnnData
    adata_fit: ad.AnnData
    split_seed: int = 0


def fit_restrictions(
    adata: ad.AnnData,
    model_kwargs: dict[str, dict[str, Any]],
    seeds: list[int],
    train_kwargs: dict[str, Any],
    *,
    split_half: bool,
    heldout_fraction: float,
    split_seed: int,
    **fit_seeds_kwargs: Any,
) -> RestrictionFits:
    """Fit each model (name -> its settings, the unrestricted one first) from ``seeds`` with :func:`fit_seeds`.

    All models share the training and held-out cells (``heldout_fraction``, ``split_seed``); with ``split_half`` each
    is fitted again on two disjoint halves of the training cells, from the first two seeds (:func:`fit_split_halves`).
    ``fit_seeds_kwargs`` go to :func:`fit_seeds` (``n_jobs``, ``progress_bar``, ``overwrite``, ``out_dir``: each model
    in ``out_dir/<name>``).
    """
    out_dir = fit_seeds_kwargs.pop("out_dir", None)
    if split_half:
        check_split_half_genes(adata, heldout_fraction, split_seed)
    runs = {
        name: FitSeedsSettings(
            seeds=seeds,
            model_kwargs=kwargs,
            train_kwargs=train_kwargs,
            heldout_fraction=heldout_fraction,
            split_seed=split_seed,
            out_dir=None if out_dir is None else f"{out_dir}/{name}",
            **fit_seeds_kwargs,
        )
        for name, kwargs in model_kwargs.items()
    }
    fits, seconds, heldout, adata_fit = {}, {}, None, None
    try:
        # every model's stored fits, before the first is fitted; the data's checksum computed once
        fingerprint = check_stored_fits(adata, list(runs.values()))
        for name, run in runs.items():
            (fitted,) = fit_models(adata, [run], fingerprint)  # as fit_seeds, one model at a time
            fits[name], seconds[name] = list(fitted.fits), fitted.seconds
            heldout, adata_fit = fitted.adata_heldout, fitted.adata_fit
    except BrokenFitError as exc:
        raise without_refit_broken(exc) from None
    halves = {}
    if split_half:
        first = next(iter(fits.values()))
        pair = (first[0].seed, first[1].seed)
        halves = {
            name: fit_split_halves(adata_fit, kwargs, train_kwargs, pair, split_seed)
            for name, kwargs in model_kwargs.items()
        }
    return RestrictionFits(fits, seconds, halves, heldout, adata_fit, split_seed)
