"""Fit several candidate models from the same seeds on the same cells and choose by fit and stability.

:func:`compare_models` is the one place of the model comparison that asks fitted models for outputs
(held-out ``log p(x)``, latents, decoded means), once per seed; the arithmetic is in
:mod:`countvae.diagnostics.analyses.model_comparison`, the result object in
:mod:`countvae.diagnostics.reporting.model_comparison_report`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_int, check_number
from countvae._settings import unknown_setting
from countvae.data.backed import cells_in_memory
from countvae.data.gene_selection import GeneChoice, choose_genes
from countvae.data.registry import get_registry
from countvae.diagnostics.analyses import model_comparison as mc
from countvae.diagnostics.analyses import predictive
from countvae.diagnostics.analyses.heldout_data import gene_variance
from countvae.diagnostics.analyses.lpd_comparability import require_same_quantity
from countvae.diagnostics.analyses.seed_groups import UNDETERMINED as PAIR_UNDETERMINED
from countvae.diagnostics.analyses.seed_groups import seed_groups
from countvae.diagnostics.analyses.subspace import gene_contrasts, jacobian_span, subsample
from countvae.diagnostics.fitting.broken_fits import without_refit_broken
from countvae.diagnostics.fitting.default_training import DIAGNOSE_N_TOP_GENES, diagnose_train_kwargs
from countvae.diagnostics.fitting.fit_seeds import (
    FitSeedsSettings,
    check_fit_batches,
    check_fit_genes,
    check_stored_fits,
    fit_models,
)
from countvae.diagnostics.fitting.heldout import heldout_split
from countvae.diagnostics.fitting.output_folder import refuse_obstacles
from countvae.diagnostics.fitting.parallelism import AUTO, backed_remedy_off
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.collect import MIN_HELDOUT_CELLS, no_latent_baseline
from countvae.diagnostics.reporting.heldout_lpd import heldout_lpd
from countvae.diagnostics.reporting.model_comparison_report import ModelComparison
from countvae.diagnostics.reporting.settings import MINIMUM, ReportSettings
from countvae.errors import BrokenFitError, InvalidArgumentError, InvalidDataError
from countvae.model.settings import ModelSettings

__all__ = ["compare_fits", "compare_models"]

#: Settings of the size order that an scvi-tools candidate may leave at its defaults (its latent size is the fits').
_DEFAULTS = {"decoder": "mlp", "n_hidden": 128, "n_layers": 1}
#: Longest candidate folder name; longer ones (gene programs spelled out) end in a digest of the label.
_MAX_FOLDER_NAME = 120


def candidate_name(settings: Mapping[str, Any]) -> str:
    """A candidate's label, e.g. ``"n_latent=2, decoder=linear"``."""
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"


def _folder_name(name: str) -> str:
    folder = re.sub(r"[^A-Za-z0-9_.=-]+", "_", name.replace(", ", "__"))
    if len(folder) <= _MAX_FOLDER_NAME:
        return folder
    # a file system takes 255 bytes per name: three gene programs of 20 genes already exceed it
    return f"{folder[: _MAX_FOLDER_NAME - 17]}__{hashlib.sha256(name.encode()).hexdigest()[:15]}"


def check_candidates(
    candidates: list[dict[str, Any]], n_genes: int, n_cells: int, n_genes_before: int | None = None
) -> None:
    """Refuse unknown CountVAE arguments and candidates larger than the data allow.

    ``n_genes_before``: the genes before a selection kept ``n_genes`` of them (``None``: no selection).
    """
    known = [f.name for f in fields(ModelSettings)]
    genes = f"{n_genes} genes" if n_genes_before is None else f"{n_genes} of {n_genes_before}: n_top_genes={n_genes}"
    for settings in candidates:
        for key in settings:
            if key not in known:
                raise unknown_setting(key, known, "compare_models: a candidate")
        n_latent = ModelSettings(**settings).n_latent  # derived from gene programs where they give it
        if n_latent >= min(n_genes, n_cells):
            raise InvalidArgumentError(
                f"Candidate {candidate_name(settings)!r} has n_latent={n_latent}, but the data allow fewer than "
                f"{min(n_genes, n_cells)} latent dimensions ({genes}, {n_cells} fit cells). Remove it from "
                "the grid or use more genes and cells."
            )


def check_same_genes(fits: Mapping[str, SeedFits]) -> None:
    """All candidates' fits must model the same genes, in the same order."""
    reference: pd.Index | None = None
    for name, seed_fits in fits.items():
        for fit in seed_fits:
            genes = pd.Index(fit.var_names)
            if reference is None:
                reference = genes
            elif not genes.equals(reference):
                raise InvalidDataError(
                    f"Candidate {name!r} was fitted on other genes than the first candidate ({len(genes)} vs "
                    f"{len(reference)}); compare models on one gene set: use a fresh out_dir or the same AnnData."
                )


def check_same_design(fits: Mapping[str, SeedFits], settings: Mapping[str, Mapping[str, Any]]) -> None:
    """Every candidate has settings, and all were fitted from the same (two or more) seeds and held-out cells."""
    if not fits:
        raise InvalidArgumentError("No fitted candidates to compare; give at least one label -> fit_seeds result.")
    missing = [name for name in fits if name not in settings]
    if missing:
        raise InvalidArgumentError(f"No settings for candidates {missing}; give settings for every label of fits.")
    first_name, first = next(iter(fits.items()))
    if len(first.seeds) < 2:
        raise InvalidArgumentError(
            f"Stability needs at least two seeds per candidate; {first_name!r} has {len(first.seeds)}."
        )
    held = pd.Index(first.adata_heldout.obs_names)
    for name, seed_fits in fits.items():
        if list(seed_fits.seeds) != list(first.seeds):
            raise InvalidArgumentError(
                f"Candidate {name!r} was fitted from seeds {list(seed_fits.seeds)}, {first_name!r} from "
                f"{list(first.seeds)}; fit every candidate from the same seeds."
            )
        if not pd.Index(seed_fits.adata_heldout.obs_names).equals(held):
            raise InvalidArgumentError(
                f"Candidate {name!r} holds out other cells than {first_name!r}; fit every candidate with the same "
                "heldout_fraction and split_seed on the same AnnData."
            )
        _check_settings_describe_fits(name, seed_fits.fits[0], settings[name])


def _check_settings_describe_fits(name: str, fit: Any, given: Mapping[str, Any]) -> None:
    """Refuse settings that are not the fits': they order the candidates by size and name them in the table.

    Only the settings given are checked (one left out may be one the model derives, as ``n_latent`` from gene
    programs).
    """
    if given.get("n_latent") is not None and given["n_latent"] != fit.n_latent:
        raise InvalidArgumentError(
            f"The settings of candidate {name!r} say n_latent={given['n_latent']}, but its fits have {fit.n_latent} "
            "latent dimensions; give each candidate the settings its fits were made with."
        )
    recorded = getattr(getattr(fit, "model", None), "settings", None)
    if not isinstance(recorded, ModelSettings):
        return  # an scvi-tools fit: its latent dimensions are all that is known here
    known = [f.name for f in fields(ModelSettings)]
    for key, value in given.items():
        if key not in known:
            raise unknown_setting(key, known, f"compare_fits: the settings of candidate {name!r}")
        try:
            same = replace(recorded, **{key: value}) == recorded
        except InvalidArgumentError:
            same = False  # a value the fits' other settings do not allow
        if not same:
            raise InvalidArgumentError(
                f"The settings of candidate {name!r} say {key}={value!r}, but its fits were made with "
                f"{key}={getattr(recorded, key)!r}; give each candidate the settings its fits were made with."
            )


def _size_settings(given: Mapping[str, Any], fit: Any) -> dict[str, Any]:
    """The settings that order a candidate by size.

    A countvae fit's own (the latent size gene programs give, CountVAE's defaults for what the candidate left out);
    for an scvi-tools fit, the settings given and its latent size.
    """
    recorded = getattr(getattr(fit, "model", None), "settings", None)
    if isinstance(recorded, ModelSettings):
        return recorded.to_dict()
    return {**_DEFAULTS, **given, "n_latent": fit.n_latent}


def compare_models(
    adata: ad.AnnData,
    candidates: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
    seeds: Iterable[int] = range(3),
    heldout_fraction: float = 0.1,
    split_seed: int = 0,
    train_kwargs: dict[str, Any] | None = None,
    out_dir: str | os.PathLike | None = None,
    n_jobs: int | str = AUTO,
    equivalence_margin: float | None = None,
    *,
    backend: str = "local",
    n_lpd_samples: int = 100,
    alpha: float = 0.05,
    max_baseline_cells: int = 5_000,
    max_heldout_cells: int = mc.MAX_HELDOUT_CELLS,
    seed: int = 0,
    n_top_genes: int | str | None = None,
    overwrite: bool = False,
    progress_bar: bool = False,
    before_fitting: Callable[[GeneChoice, list[FitSeedsSettings]], None] | None = None,
) -> ModelComparison:
    """Fit each candidate from the same seeds on the same cells; compare held-out fit and cross-seed stability.

    Parameters
    ----------
    adata
        Cells x genes, registered with :meth:`countvae.CountVAE.setup_anndata`.
    candidates
        A grid (CountVAE argument -> values, expanded to every combination, e.g.
        ``{"n_latent": [2, 5, 10], "decoder": ["linear", "mlp"]}``) or a list of settings dicts.
    seeds
        At least two seeds; every candidate is fitted from each.
    heldout_fraction, split_seed
        The held-out split, the same for every candidate (see :func:`countvae.diagnostics.fit_seeds`).
    train_kwargs
        Arguments of ``CountVAE.train``, the same for every candidate. ``max_epochs`` not given:
        :func:`~countvae.diagnostics.diagnose`'s budget of 600,000 cell passes (20 to 400 epochs; scvi-tools' rule
        would train 400 epochs on anything under 20,000 cells). Early stopping is off unless ``early_stopping=True``
        (then with ``diagnose``'s rule): its patience is counted in epochs, a few dozen steps on a few hundred cells,
        and the recommendation is calibrated without it (docs/model-selection.md).
    out_dir
        Folder of the fits: each candidate in its own subfolder ``out_dir/<candidate>``, so a rerun resumes (see
        :func:`~countvae.diagnostics.fit_seeds`; fits of other settings or data, other genes among them, are refused
        unless ``overwrite``). ``None``: in memory only.
    n_jobs
        Fits at once (``"auto"``: one per usable core, as :func:`~countvae.diagnostics.fit_seeds`); the seeds of
        all candidates share one pool of workers.
    equivalence_margin
        The margin as a share, in (0, 1], of the best candidate's per-cell gain over the no-latent baseline (the
        report's rule; ``None``: its default, :data:`~countvae.diagnostics.analyses.predictive.EQUIVALENCE_MARGIN`).
    backend
        ``"local"`` (worker processes on this machine) or ``"ray"`` (each seed of each candidate a Ray task, as
        :func:`~countvae.diagnostics.fit_seeds`; the ``[ray]`` extra).
    n_lpd_samples
        Importance samples per cell of the held-out ``log p(x)`` estimator (run as the report runs it: one torch
        thread per fit, in worker processes when that saves time; :mod:`~countvae.diagnostics.reporting.heldout_lpd`).
    max_heldout_cells
        Held-out cells that held-out ``log p(x)`` and stability use at most (at least 39, the k-NN overlap's): beyond,
        a random subset (from ``seed``), the same for every candidate and seed, so differences stay paired.
    alpha, max_baseline_cells, seed
        Error rate of the simultaneous intervals, in (0, 0.5) (Bonferroni over the comparisons with the best); fit
        cells the no-latent baseline is estimated on at most; seed of the estimator and of the cell subsamples.
    n_top_genes
        Genes kept for every candidate and seed, chosen once on the raw counts before fitting as
        :func:`~countvae.diagnostics.diagnose` chooses them (``DiagnoseSettings.n_top_genes``): the genes it then fits.
    overwrite, progress_bar, before_fitting
        Refit candidates already stored in ``out_dir``; show a progress bar over each candidate's seeds; a callable
        given the chosen genes and each candidate's fit settings after every check, before the first fit.

    Returns
    -------
    ModelComparison
        ``.table``, ``.recommended``, ``.rule``, ``.frontier``, ``.plot_frontier()``, ``.summary()``, ``.save()``.

    Raises
    ------
    InvalidArgumentError
        An empty grid, unknown CountVAE arguments (the valid ones are named), a candidate with as many latent
        dimensions as the chosen genes or cells (or more than ``n_top_genes``), fewer than two seeds, fits in
        ``out_dir`` whose held-out ``log p(x)`` are different quantities (see :func:`compare_fits`).
    InvalidDataError
        Candidates on other genes, a cell without counts in the chosen genes, a gene or batch no fit cell has.

    Notes
    -----
    A linear decoder is log-linear in ``z`` with the observed total count as its scale; factors that change a
    cell's total expression then need one more latent dimension (the library share), so a linear candidate
    with ``K + 1`` dimensions for ``K`` factors is expected (docs/model-selection.md).
    """
    numbers = {"alpha": alpha, "max_baseline_cells": max_baseline_cells, "max_heldout_cells": max_heldout_cells}
    _checked_numbers(equivalence_margin, seed=seed, **numbers)  # refused before any fitting
    check_int("n_lpd_samples", n_lpd_samples, 2)  # refused by every fit's log p(x), but only after the fitting
    seeds = list(seeds)
    named, genes, n_fit_cells = _checked_candidates(candidates, seeds, adata, heldout_fraction, split_seed, n_top_genes)
    train_kwargs = diagnose_train_kwargs(train_kwargs, n_fit_cells, early_stopping=False)
    shared = {"seeds": seeds, "train_kwargs": train_kwargs, "heldout_fraction": heldout_fraction, "backend": backend}
    shared |= {"split_seed": split_seed, "n_jobs": n_jobs, "overwrite": overwrite, "progress_bar": progress_bar}
    fits = _fit_candidates(genes, named, out_dir, shared, before_fitting)
    return compare_fits(fits, named, equivalence_margin, n_lpd_samples=n_lpd_samples, seed=seed, **numbers)


def _checked_numbers(
    equivalence_margin: float | None, alpha: float, max_baseline_cells: int, max_heldout_cells: int, seed: int
) -> tuple[float, int, int, int]:
    """The margin (its default for ``None``), the baseline's and the comparison's cells and the seed, checked.

    A baseline fitted on 1 cell gave a gain of 11,000 nats per cell and a margin to match; 0 cells gave NaN. Fewer
    than :data:`~countvae.diagnostics.analyses.model_comparison.KNN_MIN_CELLS` held-out cells leave every candidate's
    stability undetermined.
    """
    share = predictive.EQUIVALENCE_MARGIN if equivalence_margin is None else equivalence_margin
    check_number("equivalence_margin", share, 0.0, 1.0, low_open=True)
    check_number("alpha", alpha, 0.0, 0.5, low_open=True, high_open=True)  # as the report's intervals
    cells = check_int("max_baseline_cells", max_baseline_cells, MINIMUM["max_baseline_cells"])
    heldout = check_int("max_heldout_cells", max_heldout_cells, mc.KNN_MIN_CELLS)
    return float(share), cells, heldout, check_int("seed", seed, 0)


def _fit_candidates(
    genes: GeneChoice,
    candidates: Mapping[str, Mapping[str, Any]],
    out_dir: str | os.PathLike | None,
    shared: Mapping[str, Any],
    before_fitting: Callable[[GeneChoice, list[FitSeedsSettings]], None] | None,
) -> dict[str, SeedFits]:
    """Every candidate's seeds on the chosen genes, in one pool of workers so that no core waits between candidates."""
    runs = [
        FitSeedsSettings(
            **shared,
            model_kwargs=dict(settings),
            out_dir=None if out_dir is None else Path(out_dir) / _folder_name(name),
        )
        for name, settings in candidates.items()
    ]
    for run in runs:  # before the block and its warm-ups, not once the fits start
        if run.out_dir is not None:
            refuse_obstacles(Path(run.out_dir), "choose another out_dir (--out)")
    try:  # compare_models and select take no refit_broken: the remedy is to move the damaged folder aside
        fingerprint = check_stored_fits(genes.adata, runs)  # fits of other settings or data, as early
        if before_fitting is not None:
            before_fitting(genes, runs)
        # as diagnose: gene selection needs the counts in memory, so the memory warning cannot advise a backed file
        with backed_remedy_off() if genes.selected else contextlib.nullcontext():
            return dict(zip(candidates, fit_models(genes.adata, runs, fingerprint), strict=True))
    except BrokenFitError as exc:
        raise without_refit_broken(exc) from None


def _checked_candidates(
    candidates: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
    seeds: list[int],
    adata: ad.AnnData,
    heldout_fraction: float,
    split_seed: int,
    n_top_genes: int | str | None,
) -> tuple[dict[str, dict[str, Any]], GeneChoice, int]:
    """The candidates' settings by name, the genes chosen and the fit cells' number, refused if not comparable."""
    settings_list = mc.expand_candidates(candidates)
    if len(seeds) < 2:
        raise InvalidArgumentError(
            f"compare_models needs at least two seeds to measure stability, got {len(seeds)}; e.g. seeds=range(3)."
        )
    fit_idx, heldout_idx = heldout_split(adata.n_obs, heldout_fraction, split_seed)
    n_fit_cells = len(fit_idx)
    if len(heldout_idx) < MIN_HELDOUT_CELLS:
        raise InvalidArgumentError(
            f"The held-out split keeps {len(heldout_idx)} of {adata.n_obs} cells; comparing candidates needs at least "
            f"{MIN_HELDOUT_CELLS} (and their k-NN stability {mc.KNN_MIN_CELLS}); pass a larger heldout_fraction."
        )
    check_candidates(settings_list, adata.n_vars, n_fit_cells)  # unknown settings first, then the sizes
    largest = max(ModelSettings(**s).n_latent for s in settings_list)
    # scvi-tools fits the genes it is given (choosing them is a scanpy step before); like diagnose, this chooses them
    # itself by default, so that a raw file is not fitted on every gene, once per candidate and seed
    genes = choose_genes(adata, n_top_genes, DIAGNOSE_N_TOP_GENES, largest)
    if genes.selected:
        check_candidates(settings_list, genes.adata.n_vars, n_fit_cells, genes.n_genes_before)
    names = [candidate_name(s) for s in settings_list]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("The candidates repeat a setting; give each candidate once.")
    _refuse_same_models(settings_list, names)
    # as the fits would, before select's warm-up estimate trains on the fit cells and fails less clearly
    check_fit_genes(genes.adata[fit_idx], get_registry(genes.adata))
    check_fit_batches(genes.adata[fit_idx], get_registry(genes.adata), genes.adata)
    return dict(zip(names, settings_list, strict=True)), genes, n_fit_cells


def _refuse_same_models(settings_list: list[dict[str, Any]], names: list[str]) -> None:
    """Refuse two candidates that are one model (their settings differ only in defaults written out, or in order)."""
    seen: dict[str, str] = {}
    for name, settings in zip(names, settings_list, strict=True):
        key = repr(sorted(ModelSettings(**settings).to_dict().items()))
        if key in seen:
            raise InvalidArgumentError(
                f"The candidates {seen[key]!r} and {name!r} are the same model (they differ only in CountVAE's "
                "defaults written out, or in order); give each candidate once."
            )
        seen[key] = name


def _fit_seconds(seed_fits: SeedFits) -> float:
    return float(
        sum(seed_fits.records.get(s, {}).get("seconds", seed_fits.seconds.get(s, 0.0)) for s in seed_fits.seeds)
    )


def compare_fits(
    fits: Mapping[str, SeedFits],
    settings: Mapping[str, Mapping[str, Any]],
    equivalence_margin: float | None = None,
    *,
    n_lpd_samples: int = 100,
    alpha: float = 0.05,
    max_baseline_cells: int = 5_000,
    max_heldout_cells: int = mc.MAX_HELDOUT_CELLS,
    seed: int = 0,
) -> ModelComparison:
    """Compare candidates already fitted (each a :func:`~countvae.diagnostics.fit_seeds` result) as compare_models does.

    Parameters
    ----------
    fits
        Candidate label -> its fits, all from the same seeds, held-out split and genes.
    settings
        Candidate label -> its CountVAE settings (what the size order and ``.recommended`` read).
    equivalence_margin, n_lpd_samples, alpha, max_baseline_cells, max_heldout_cells, seed
        As in :func:`compare_models`.

    Raises
    ------
    InvalidArgumentError
        No candidates, labels without settings, fewer than two seeds, candidates fitted from different seeds or
        held-out cells, or held-out ``log p(x)`` of different quantities (observed vs integrated library size).
    InvalidDataError
        Candidates fitted on different genes.
    """
    share, max_baseline_cells, max_heldout_cells, seed = _checked_numbers(
        equivalence_margin, alpha, max_baseline_cells, max_heldout_cells, seed
    )
    check_same_design(fits, settings)
    check_same_genes(fits)
    first = next(iter(fits.values()))
    var_names = pd.Index(first[0].var_names)
    heldout = _compared_cells(first.adata_heldout, max_heldout_cells, seed)
    genes = _decoded_genes(heldout, var_names, seed)
    stab: dict[str, dict[str, Any]] = {}
    rates: dict[str, dict[str, np.ndarray]] = {}
    frames = _heldout_lpds(fits, heldout, n_lpd_samples, seed)
    # Observed-library and library-integrated densities differ by the library's own density, not by fit.
    require_same_quantity(
        {f"{n}, seed {fit.seed}": f for n, fs in frames.items() for fit, f in zip(fits[n], fs, strict=True)}
    )
    for name, seed_fits in fits.items():
        latents = [fit.latent(heldout) for fit in seed_fits]
        log_rates = [fit.decode_log_rate(heldout, z)[:, genes] for fit, z in zip(seed_fits, latents, strict=True)]
        stab[name] = mc.stability(latents, log_rates, seed=seed)
        stab[name] |= mc.within_seed_baseline([_draw_pair(fit, heldout, seed, genes) for fit in seed_fits])
        cells = heldout[: mc.MAX_JACOBIAN_CELLS]
        spans = [jacobian_span(gene_contrasts(fit.decoder_jacobian(cells)), fit.n_latent, seed) for fit in seed_fits]
        stab[name]["subspace"] = mc.subspace_agreement(spans)
        rates[name] = {str(fit.seed): r for fit, r in zip(seed_fits, log_rates, strict=True)}
    lpds = {name: mc.candidate_lpd(fs) for name, fs in frames.items()}
    baseline, _ = no_latent_baseline(heldout, first.adata_fit, var_names, max_baseline_cells, seed)
    # The margin is a share of what the latent variables add, measured on the best reliable candidate.
    fit, best, margin, gain = mc.settled_fit_table(lpds, frames, baseline, share, alpha)
    table = fit.merge(pd.DataFrame([{"candidate": n, **stab[n]} for n in fits]), on="candidate")
    table["seed_spread"] = [mc.seed_spread(frames[n]) for n in table["candidate"]]
    table["fit_seconds"] = [_fit_seconds(fits[n]) for n in table["candidate"]]
    table["seed_groups"] = [_seed_groups(rates[n], frames[n], margin, alpha, seed) for n in table["candidate"]]
    recommended = mc.recommend(table, {n: _size_settings(s, fits[n].fits[0]) for n, s in settings.items()})
    if recommended is not None:
        table = table.merge(mc.gains_over(lpds, recommended, alpha), on="candidate")
    table["verdict"] = [_verdict(row, recommended) for row in table.itertuples()]
    settings_frame = pd.DataFrame([dict(s) for s in settings.values()], index=list(settings))
    if "n_latent" in settings_frame:  # a candidate that left it out (gene programs give it) shows its fits'
        settings_frame["n_latent"] = [fits[n].fits[0].n_latent for n in settings_frame.index]
    table = settings_frame.reset_index(names="candidate").merge(table, on="candidate")
    return ModelComparison(
        table=table,
        recommended=None if recommended is None else dict(settings[recommended]),
        recommended_name=recommended,
        best=best,
        margin=float(margin),
        gain_over_baseline=float(gain),
        margin_share=share,
        alpha=alpha,
        n_heldout=heldout.n_obs,
        seeds=list(first.seeds),
        n_heldout_total=first.adata_heldout.n_obs,
        n_genes=len(var_names),
    )


def _compared_cells(heldout: ad.AnnData, max_cells: int, seed: int) -> ad.AnnData:
    """The held-out cells compared: all, or ``max_cells`` of them at random, the same for every candidate and seed.

    Drawn as the report draws its held-out ``log p(x)`` cells (:func:`subsample` from ``seed``).
    """
    kept = subsample(heldout.n_obs, max_cells, seed)
    return heldout if len(kept) == heldout.n_obs else cells_in_memory(heldout, kept)


def _decoded_genes(heldout: ad.AnnData, var_names: pd.Index, seed: int) -> slice | np.ndarray:
    """Positions of the genes whose decoded means are compared: all, or the ``MAX_DECODED_GENES`` most variable.

    Ordered as the report orders its ``max_genes`` (variance of the held-out cells' log1p-normalized counts). The
    report keeps 500; the comparison keeps
    :data:`~countvae.diagnostics.analyses.model_comparison.MAX_DECODED_GENES` (2,000), so that data prepared for
    ``diagnose`` (its 2,000 genes by default) keeps every gene.
    """
    if len(var_names) <= mc.MAX_DECODED_GENES:
        return slice(None)
    order = np.argsort(-gene_variance(heldout, var_names, seed=seed), kind="stable")
    return np.sort(order[: mc.MAX_DECODED_GENES])


def _heldout_lpds(
    fits: Mapping[str, SeedFits], cells: ad.AnnData, n_lpd_samples: int, seed: int
) -> dict[str, list[pd.DataFrame]]:
    """Every fit's held-out ``log p(x)`` on ``cells``, by the report's :func:`heldout_lpd` (all fits in one pool).

    Unlike scvi-tools' ``get_marginal_ll``, which runs on the caller's threads, every estimate runs on one torch thread
    (``ReportSettings.lpd_threads``): the numbers then do not depend on the machine's cores or on the workers.
    """
    settings = ReportSettings().replace(n_lpd_samples=n_lpd_samples, seed=seed)
    estimates = iter(heldout_lpd([fit for seed_fits in fits.values() for fit in seed_fits], cells, settings))
    return {name: [next(estimates) for _ in seed_fits] for name, seed_fits in fits.items()}


def _draw_pair(
    fit: Any, heldout: ad.AnnData, seed: int, genes: slice | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two draws from a fit's guide on the held-out cells and the decoded log means at each, for ``genes``."""
    za, zb = fit.latent_samples(heldout, 2, seed)
    ra, rb = fit.decode_log_rate(heldout, za)[:, genes], fit.decode_log_rate(heldout, zb)[:, genes]
    return tuple(np.asarray(v, dtype=np.float64) for v in (za, zb, ra, rb))


def _seed_groups(
    log_rates: Mapping[str, np.ndarray], frames: Sequence[pd.DataFrame], margin: float, alpha: float, seed: int
) -> str:
    """Which of a candidate's seeds reached the same solution, e.g. ``"0, 1 | 2"`` (best first; ``""``: no margin).

    The report's grouping (:func:`~countvae.diagnostics.analyses.seed_groups.seed_groups`: decoded means concordant and
    held-out ``log p(x)`` not shown to differ by more than the margin, complete linkage). Seeds in separate groups
    whose pair the evidence did not settle are listed after the groups, ``"0 | 1 (undetermined: 0-1)"``, so that
    they do not read as different solutions.
    """
    if not (np.isfinite(margin) and margin > 0):
        return ""
    result = seed_groups(log_rates, dict(zip(log_rates, frames, strict=True)), margin=margin, alpha=alpha, seed=seed)
    groups = list(result.groups["fits"])
    text = " | ".join(", ".join(group) for group in groups)
    group_of = {name: i for i, group in enumerate(groups) for name in group}
    undecided = [
        f"{a}-{b}"
        for a, b, relation in result.pairs[["fit_a", "fit_b", "relation"]].itertuples(index=False)
        if relation == PAIR_UNDETERMINED and group_of[a] != group_of[b]
    ]
    return f"{text} (undetermined: {', '.join(undecided)})" if undecided else text


def _verdict(row: Any, recommended: str | None) -> str:
    if row.candidate == recommended:
        return "recommended"
    if not row.reliable:
        return "unreliable: not ranked"
    if row.fit_verdict == mc.WORSE:
        return "fits worse than the margin"
    if row.fit_verdict == mc.UNDETERMINED:
        return "fit undetermined"
    if not row.stable and not np.isfinite(row.knn):
        return "stability undetermined: too few held-out cells for the k-NN overlap"
    if not row.stable:
        return "unstable across seeds"
    return "qualifies, not the smallest"
