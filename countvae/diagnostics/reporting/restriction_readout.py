"""The restriction comparison's collect step: every restricted fit read once, into arrays.

The one place where the models of a restriction comparison are asked for anything (:func:`read_restrictions`): each
model's fits on the held-out cells (coordinates, loadings, held-out ``log p(x)`` per cell from the importance sampler
of ``get_log_predictive_density``), the split-half fits, the unrestricted fits re-read in ICA axes, and
:func:`countvae.invariance.verify` on each model's first fit for the maps its declaration keeps and breaks.
:func:`collect_restrictions` adds what the data alone give (markers, the simulated truth, the expression of gene
programs' genes) and returns :class:`RestrictionArrays`, from which the restrictions section
(:mod:`.sections.restrictions`) computes its tables without touching a model.

It serves both the multi-seed report (``report(fits, held, restrictions=RestrictionRequest(...))``,
through :func:`..collect.collect`) and :func:`..compare_restrictions.compare_restrictions`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool, check_int, check_number
from countvae.data.gene_sets import GenePrograms
from countvae.diagnostics.analyses.heldout_data import library_sizes, log1p_normalized
from countvae.diagnostics.analyses.restrictions import DEFAULT_MARGIN
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel
from countvae.diagnostics.fitting.restrictions import (
    UNRESTRICTED,
    Restriction,
    RestrictionFits,
    parse_restrictions,
    split_half_cells,
)
from countvae.errors import InvalidArgumentError
from countvae.ica import ICARotation
from countvae.invariance import random_reflection, random_rotation, random_signed_permutation, verify
from countvae.invariance.controls import ROTATION_DEGREES_FROM_AXES
from countvae.model import CountVAE

#: Training cells an ICA is fitted on at most (a random subset beyond that).
MAX_ICA_CELLS = 5_000
#: Held-out cells on which each model's declared symmetry is checked numerically.
SYMMETRY_CELLS = 200
#: Importance samples per cell in that check.
SYMMETRY_SAMPLES = 50
#: The checks of :func:`countvae.invariance.verify` that decide whether a map keeps ``p(x)`` as declared.
SYMMETRY_CHECKS = (
    "crn_max_abs_diff",
    "control_z",
    "loadings_log_prior_abs_diff",
    "joint_abs_change",
    "joint_change_over_mc_error",
)
#: Importance samples per held-out cell of each fit's ``log p(x)`` (as ``compare_restrictions``).
DEFAULT_LPD_SAMPLES = 100


# ----- what is asked for, and what comes back ------------------------------------------------------------
@dataclass(frozen=True)
class RestrictionRequest:
    """Ask the multi-seed report for the restrictions section: these fits against restricted models.

    ``report(fitted.fits["unrestricted"], fitted.adata_heldout, restrictions=RestrictionRequest(fitted))``
    with ``fitted`` from :func:`~countvae.diagnostics.fitting.restrictions.fit_restrictions`: the report's
    fits are the unrestricted model's seeds.

    Attributes
    ----------
    fits
        Every model of the comparison fitted over the same seeds and cells (``"unrestricted"`` among them).
    restrictions
        The restrictions compared, by name (``"laplace,ica"``, as ``compare_restrictions`` takes them) or as
        ``Restriction`` objects; default: every restricted model in ``fits``. ``"ica"`` re-reads the
        unrestricted fits and needs no fits of its own.
    margin
        Equivalence margin of the predictive cost, nats per cell.
    n_lpd_samples
        Importance samples per held-out cell of each fit's ``log p(x)``.
    seed
        Seed of the analyses (cell halves, ICA, importance sampling).
    check_symmetry
        Run :func:`countvae.invariance.verify` on each model's first fit.

    """

    fits: RestrictionFits
    restrictions: str | Sequence[str | Restriction] | None = None
    margin: float = DEFAULT_MARGIN
    n_lpd_samples: int = DEFAULT_LPD_SAMPLES
    seed: int = 0
    check_symmetry: bool = True

    def chosen(self) -> list[Restriction]:
        """The restrictions compared, each restricted model checked to be among the fits.

        Raises
        ------
        InvalidArgumentError
            If ``fits`` is not a ``RestrictionFits`` with unrestricted fits, a restriction is unknown, or a
            restricted model was not fitted.

        """
        if not isinstance(self.fits, RestrictionFits) or UNRESTRICTED.name not in self.fits.fits:
            raise InvalidArgumentError(
                "RestrictionRequest.fits must be the RestrictionFits of fit_restrictions, with the unrestricted fits."
            )
        fitted = [name for name in self.fits.fits if name != UNRESTRICTED.name]
        chosen = parse_restrictions(self.restrictions if self.restrictions is not None else fitted)
        missing = [r.name for r in chosen if not r.post_hoc and r.name not in self.fits.fits]
        if missing:
            raise InvalidArgumentError(
                f"No fits of the restricted models {missing}; the fitted models are {list(self.fits.fits)}."
            )
        return chosen

    def check(self, fits: Sequence[FittedModel], adata_heldout: ad.AnnData) -> list[Restriction]:
        """The restrictions compared, after checking the settings, and that ``fits`` and the cells are the request's.

        ``fits`` must be the request's unrestricted fits themselves (the same objects, in order), and
        ``adata_heldout`` its held-out cells.

        Raises
        ------
        InvalidArgumentError
            For a bad setting, or ``fits`` or ``adata_heldout`` other than the request's.

        """
        chosen = self.chosen()
        check_number("margin", self.margin, 0.0, low_open=True)
        check_int("n_lpd_samples", self.n_lpd_samples, 2)
        check_int("seed", self.seed)
        check_bool("check_symmetry", self.check_symmetry)
        unrestricted = self.fits.fits[UNRESTRICTED.name]
        same_fits = len(fits) == len(unrestricted) and all(f is g for f, g in zip(fits, unrestricted, strict=False))
        held = self.fits.adata_heldout
        same_cells = adata_heldout.n_obs == held.n_obs and bool((adata_heldout.obs_names == held.obs_names).all())
        if not same_fits or not same_cells:
            raise InvalidArgumentError(
                "The restrictions section compares the report's fits, on its held-out cells, with restricted models "
                "fitted alongside them from the same seeds and cells; these are not the request's unrestricted fits "
                f"({[f.name for f in unrestricted]}) and {held.n_obs} held-out cells. Pass "
                "report(r.fits.fits['unrestricted'], r.fits.adata_heldout, restrictions=r)."
            )
        return chosen


@dataclass
class ModelReadout:
    """One model's fits read on the held-out cells: arrays only (the models themselves are not kept).

    Attributes
    ----------
    restriction
        The model's restriction (``UNRESTRICTED`` for the unrestricted model).
    symmetry
        The symmetry group its declaration leaves.
    seconds
        Seed -> seconds of fitting.
    latents
        Fit name -> held-out coordinates, (cells, L).
    loadings
        Fit name -> loadings (genes, L), or ``None``.
    lpd
        Seed -> per-cell held-out ``log p(x)`` and its Monte Carlo error (empty for ICA).
    symmetry_rows
        The check of its declared symmetry (:func:`symmetry_rows`), or empty.
    split
        The two split-half fits' coordinates and loadings ``(za, zb, wa, wb)``, or ``None``.
    gaussian_components
        ICA only: the most components flagged too Gaussian to identify in any one ICA.
    posterior_loadings
        Gene programs only: each fit's posterior loadings table.

    """

    restriction: Restriction
    symmetry: str
    seconds: dict[int, float]
    latents: dict[str, np.ndarray] = field(default_factory=dict)
    loadings: dict[str, np.ndarray | None] = field(default_factory=dict)
    lpd: dict[int, pd.DataFrame] = field(default_factory=dict)
    symmetry_rows: list[dict[str, Any]] = field(default_factory=list)
    split: tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None] | None = None
    gaussian_components: int = 0
    posterior_loadings: dict[str, pd.DataFrame] = field(default_factory=dict)


@dataclass
class RestrictionArrays:
    """What the restrictions section computes on: every model's read-out, and the held-out data's arrays.

    Attributes
    ----------
    readouts
        Model name -> its read-out, the unrestricted model first, then the restrictions in the order asked.
    markers
        Marker values of the held-out cells, (cells, markers).
    truth
        The held-out cells' true sources and the true loadings (simulated data), or ``None``.
    programs
        The gene programs of the ``programs`` model, or ``None``.
    expression, library
        With gene programs: the held-out cells' ``log1p`` normalized expression (cells, genes) and total counts.
    var_names
        The genes.

    """

    readouts: dict[str, ModelReadout]
    markers: np.ndarray
    truth: tuple[np.ndarray, np.ndarray | None] | None
    var_names: pd.Index
    programs: GenePrograms | None = None
    expression: np.ndarray | None = None
    library: np.ndarray | None = None


# ----- reading the fits ---------------------------------------------------------------------------------
def read_model(
    restriction: Restriction,
    fits: list[CountVAEFit],
    seconds: dict[int, float],
    adata_heldout: ad.AnnData,
    n_lpd_samples: int,
    seed: int,
    check_symmetry: bool,
) -> ModelReadout:
    """One model's fits on the held-out cells: coordinates, loadings, ``log p(x)``, and its symmetry check."""
    out = ModelReadout(restriction, fits[0].model.module.symmetry, dict(seconds))
    for fit in fits:
        out.latents[fit.name] = np.asarray(fit.latent(adata_heldout), dtype=np.float64)
        out.loadings[fit.name] = fit.loadings()
        out.lpd[fit.seed] = fit.log_predictive_density(adata_heldout, n_lpd_samples, seed)
    if restriction.name == "programs":
        out.posterior_loadings = {f.name: f.model.loadings_posterior() for f in fits}
    if check_symmetry:
        out.symmetry_rows = symmetry_rows(fits[0], restriction.name, adata_heldout, seed)
    return out


def ica_axes(model: CountVAE, adata_fit: ad.AnnData, cells: np.ndarray, seed: int) -> ICARotation:
    """An ICA of a model's posterior means on the given training cells (at most :data:`MAX_ICA_CELLS`).

    Its ``gaussian_`` flags the components no more non-Gaussian than what ICA
    finds in Gaussian noise of the same size: their axes are not identified.
    """
    if len(cells) > MAX_ICA_CELLS:
        cells = np.sort(np.random.default_rng(seed).choice(cells, MAX_ICA_CELLS, replace=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-Gaussian components are counted by gaussian_components
        return ICARotation(random_state=seed).fit(model.get_latent_representation(adata_fit, indices=cells))


def ica_readout(unrestricted: ModelReadout, fits: list[CountVAEFit], adata_fit: ad.AnnData, seed: int) -> ModelReadout:
    """The unrestricted ``fits`` re-read in ICA axes (fitted on the training cells): sources and ``W @ mixing``."""
    out = ModelReadout(Restriction("ica"), "orthogonal", dict.fromkeys(unrestricted.seconds, 0.0))
    for fit in fits:
        ica = ica_axes(fit.model, adata_fit, np.arange(adata_fit.n_obs), seed)
        out.gaussian_components = max(out.gaussian_components, int(ica.gaussian_.sum()))
        out.latents[fit.name] = ica.transform(unrestricted.latents[fit.name])
        weight = unrestricted.loadings[fit.name]
        out.loadings[fit.name] = None if weight is None else weight @ ica.mixing_
    return out


def symmetry_rows(fit: CountVAEFit, model_name: str, adata_heldout: ad.AnnData, seed: int) -> list[dict[str, Any]]:
    """Whether each map keeps or changes ``p(x)`` as declared: :func:`countvae.invariance.verify` on ``fit``."""
    L = fit.n_latent
    if L < 2:
        return []
    maps = {
        "rotation": random_rotation(L, seed, ROTATION_DEGREES_FROM_AXES),  # one that must change a Laplace prior
        "signed permutation": random_signed_permutation(L, seed),
        "sign flip": random_reflection(L, seed),
    }
    n = min(adata_heldout.n_obs, SYMMETRY_CELLS)
    rep = verify(
        fit.model,
        adata_heldout,
        maps,
        indices=np.arange(n),
        n_samples=SYMMETRY_SAMPLES,
        seed=seed,
        controls=False,
        prior_controls=False,
        quadrature=False,
        elbo_refit_steps=0,
        n_elbo_samples=2,
        elbo_cells=min(n, 20),
    )
    checks = rep.to_frame()
    with_loadings = fit.model.module.loadings_prior is not None
    rows = []
    for name in maps:
        kept = bool(rep.settings["expected_invariant"][name])
        judged = checks[(checks["variant"] == "fitted") & (checks["transform"] == name)]
        relevant = judged[judged["check"].isin(SYMMETRY_CHECKS) & judged["ok"].notna()]
        if with_loadings:
            key = "joint_abs_change" if kept else "joint_change_over_mc_error"
        else:
            key = "crn_max_abs_diff" if kept else "control_z"
        main = relevant[relevant["check"] == key].iloc[0]
        rows.append(
            {
                "model": model_name,
                "declared_symmetry": fit.model.module.symmetry,
                "map": name,
                "p_x_expected": "unchanged" if kept else "changes",
                "measurement": key,
                "value": float(main["value"]),
                "threshold": float(main["threshold"]),
                "confirmed": bool(relevant["ok"].astype(bool).all()),
            }
        )
    return rows


def simulated_truth(heldout: ad.AnnData, var_names: pd.Index) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The held-out cells' true sources and the true loadings, for data made by :func:`countvae.data.simulate`.

    ``None`` unless the held-out cells carry ``obsm["z_true"]``; the loadings are
    those of their ``uns["simulation"]["W"]`` when it has one row per gene of the data.
    """
    if "z_true" not in heldout.obsm:
        return None
    w = heldout.uns.get("simulation", {}).get("W")
    w = None if w is None else np.asarray(w, dtype=np.float64)
    if w is not None and w.shape[0] != len(var_names):
        w = None
    return np.asarray(heldout.obsm["z_true"], dtype=np.float64), w


def read_restrictions(
    fitted: RestrictionFits, chosen: list[Restriction], n_lpd_samples: int, seed: int, check_symmetry: bool
) -> dict[str, ModelReadout]:
    """Every fit read once on the held-out cells (the one step that asks the models), ICA re-reads included.

    Returns the read-outs by model name: the unrestricted model first, then ``chosen`` in order.
    """
    heldout = fitted.adata_heldout
    models = [UNRESTRICTED, *(r for r in chosen if not r.post_hoc)]
    readouts = {
        r.name: read_model(r, fitted.fits[r.name], fitted.seconds[r.name], heldout, n_lpd_samples, seed, check_symmetry)
        for r in models
    }
    if any(r.post_hoc for r in chosen):
        readouts["ica"] = ica_readout(
            readouts[UNRESTRICTED.name], fitted.fits[UNRESTRICTED.name], fitted.adata_fit, seed
        )
    _read_split_halves(fitted, readouts, seed)
    return {name: readouts[name] for name in [UNRESTRICTED.name, *(r.name for r in chosen)]}


def _read_split_halves(fitted: RestrictionFits, readouts: dict[str, ModelReadout], seed: int) -> None:
    """Each model's split-half fits on the held-out cells (the unrestricted ones also in ICA axes of their halves)."""
    heldout, adata_fit = fitted.adata_heldout, fitted.adata_fit
    halves = split_half_cells(adata_fit.n_obs, fitted.split_seed)
    for name, (a, b) in fitted.halves.items():
        if name not in readouts:
            continue
        za, zb, wa, wb = a.latent(heldout), b.latent(heldout), a.loadings(), b.loadings()
        readouts[name].split = (za, zb, wa, wb)
        if name == UNRESTRICTED.name and "ica" in readouts:
            # each half's fit re-read by an ICA of its own cells: nothing shared between the halves
            ia = ica_axes(a.model, adata_fit, halves[0], seed)
            ib = ica_axes(b.model, adata_fit, halves[1], seed)
            ica = readouts["ica"]
            ica.gaussian_components = max(ica.gaussian_components, int(ia.gaussian_.sum()), int(ib.gaussian_.sum()))
            ica.split = (
                ia.transform(za),
                ib.transform(zb),
                None if wa is None else wa @ ia.mixing_,
                None if wb is None else wb @ ib.mixing_,
            )


def collect_restrictions(request: RestrictionRequest, markers: np.ndarray, var_names: pd.Index) -> RestrictionArrays:
    """Every fit of ``request`` read once, with the held-out data's arrays: what the restrictions section needs.

    ``markers`` are the marker values of the held-out cells (cells, markers), as the report collects them.
    """
    heldout = request.fits.adata_heldout
    readouts = read_restrictions(
        request.fits, request.chosen(), request.n_lpd_samples, request.seed, request.check_symmetry
    )
    out = RestrictionArrays(
        readouts, np.asarray(markers, dtype=np.float64), simulated_truth(heldout, var_names), pd.Index(var_names)
    )
    if "programs" in readouts:
        out.programs = request.fits.fits["programs"][0].model.settings.gene_programs
        out.expression = log1p_normalized(heldout, var_names).toarray()
        out.library = library_sizes(heldout, var_names)
    return out
