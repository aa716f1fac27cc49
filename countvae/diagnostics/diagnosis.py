"""``diagnose(adata)``: what ``countvae diagnose`` does, as one library call.

It chooses the genes (the most variable when the data has more than :data:`DIAGNOSE_N_TOP_GENES`), fits the seeds with
:func:`fit_seeds` on one shared held-out split, trained as :mod:`~countvae.diagnostics.fitting.default_training` says (a
budget of cell passes, early stopping), compares them with :func:`report`, and returns the :class:`DiagnosticReport`.
With ``out_dir`` the run is the command's: ``out_dir/fits`` is the resumable :func:`fit_seeds` folder (an interrupted
run called again with the same arguments refits only the seeds that had not finished), ``out_dir/report`` the saved
report, refused when it exists unless ``overwrite``; ``out_dir`` is locked from the first fit to the saved report
(:mod:`~countvae.diagnostics.fitting.run_lock`), so a second run on it stops at once, naming the first.
``write_h5ad`` also writes the analysed data to an .h5ad file with the report's columns
(:meth:`DiagnosticReport.write`) and the first seed's latent.

The defaults here are the command's: the command line only parses its options,
prints progress and calls :func:`diagnose`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import inspect
import logging
import math
import os
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

from countvae._checks import check_bool, check_int, check_number
from countvae._formatting import counted
from countvae._io import (
    check_writable,
    exists_as,
    explained_write_errors,
    interrupted_writes,
    pending_file,
    place_file,
    refuse_file_in_the_way,
    refuse_foreign_entries,
    refuse_non_folder,
    refuse_overlong_name,
    remove_interrupted_writes,
)
from countvae._report_files import REPORT_FOLDER
from countvae._settings import documents_settings, setting, takes_settings, unknown_setting
from countvae._warnings import warn_at_caller
from countvae.data.backed import read_into_memory
from countvae.data.file_cells import FileCells
from countvae.data.gene_selection import GeneChoice, choose_genes
from countvae.data.registry import get_registry, get_var_names
from countvae.data.validation import check_unique_names
from countvae.diagnostics.analyses.alignment import split_halves
from countvae.diagnostics.analyses.markers import marker_matrix, marker_names
from countvae.diagnostics.fitting.backends import DEFAULT_TORCH_THREADS, available_cores
from countvae.diagnostics.fitting.default_training import DIAGNOSE_N_TOP_GENES, diagnose_train_kwargs
from countvae.diagnostics.fitting.fit_seeds import (
    FitSeedsSettings,
    check_fit_batches,
    check_fit_genes,
    check_seeds,
    check_stored_fits,
    fit_models,
)
from countvae.diagnostics.fitting.heldout import fit_cells, heldout_split, resolve_heldout_fraction
from countvae.diagnostics.fitting.output_folder import (
    FITS_FOLDER,
    MANIFEST_FILE,
    check_stored_files,
    discard_folder,
    refuse_obstacles,
    stored_seeds,
)
from countvae.diagnostics.fitting.parallelism import AUTO, Parallelism, backed_remedy_off, plan_parallelism
from countvae.diagnostics.fitting.progress import Progress
from countvae.diagnostics.fitting.run_lock import locked
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.anndata_export import existing_report_keys
from countvae.diagnostics.reporting.collect import MIN_HELDOUT_CELLS, marker_list
from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest, de_groups
from countvae.diagnostics.reporting.pipeline import ReportSettings, report
from countvae.errors import (
    BrokenFitError,
    CountVAEWarning,
    InvalidArgumentError,
    OutputExistsError,
    OutputWriteError,
)
from countvae.model import anndata_results

logger = logging.getLogger(__name__)

#: Latent dimensions when ``model_kwargs`` does not name them.
DIAGNOSE_N_LATENT = 10


# The settings of diagnose and plan_diagnose are the fields of DiagnoseSettings, each written once there
# (countvae._settings says why this departs from scvi-tools' explicit keyword arguments).
@documents_settings()
@dataclass(frozen=True)
class DiagnoseSettings:
    """What :func:`diagnose` fits and reports, and where it writes (``countvae diagnose`` builds one from its options).

    Attributes
    ----------
    {settings}

    """

    seeds: int | Sequence[int] = setting(5, "Number of seeds (fitted as ``0..N-1``) or the seeds; at least 2.")
    model_kwargs: Mapping[str, Any] | None = setting(
        None, f"Settings of every model, as for :func:`fit_seeds`; ``n_latent`` defaults to {DIAGNOSE_N_LATENT}."
    )
    train_kwargs: Mapping[str, Any] | None = setting(
        None,
        """Training settings of every fit, as for :func:`fit_seeds`; ``max_epochs`` defaults to 600,000 cell
        passes (``default_epochs``), and early stopping is on with the rule ``DIAGNOSE_STOPPING`` unless
        ``early_stopping=False`` (``diagnose_train_kwargs``).""",
    )
    n_top_genes: int | str | None = setting(
        None,
        f"""Keep this many most variable genes (on the raw counts); ``None``: {DIAGNOSE_N_TOP_GENES:,} when the data
        has more; ``"all"``: every gene.""",
    )
    heldout_fraction: float | None = setting(
        None,
        """Share of the cells held out from every fit, in (0, 1); ``None``: 10%, raised to 300 cells on a small
        file as long as that is at most a quarter of it (``default_heldout_cells``: a file of 1,400 cells holds out
        300, where 140 leave more of the report's rows undecided).""",
    )
    split_seed: int = setting(0, "Seed of the held-out split shared by every fit.")
    markers: Sequence[str] | None = setting(
        None, "Genes or ``obs`` columns of the marker analysis, as for :func:`report` (``None``: its default)."
    )
    downstream: DownstreamRequest | None = setting(
        None, "Add the downstream section (DE, clusters, UMAP across seeds), as for :func:`report`."
    )
    report_kwargs: Mapping[str, Any] | None = setting(
        None,
        """Settings of the report, as for :func:`report` (the fields of :class:`ReportSettings`, e.g. ``ica``,
        ``n_lpd_samples``, ``equivalence_margin``).""",
    )
    n_jobs: int | str = setting(
        AUTO,
        """Seeds fitted at once in worker processes: ``"auto"`` one per usable core (at most the seeds, fewer when
        memory is short, as :func:`fit_seeds`), ``-1`` all cores, ``1`` in this process; the fits are the same.""",
    )
    out_dir: str | Path | None = setting(
        None,
        """Folder of the run: ``fits/`` (resumable, as for :func:`fit_seeds`) and ``report/``; ``None``: nothing
        written.""",
    )
    overwrite: bool = setting(
        False,
        """Refit every seed and replace a finished report (removed before the seeds are refitted, so that a run
        interrupted meanwhile resumes without ``overwrite``) or ``write_h5ad`` file.""",
    )
    refit_broken: bool = setting(False, "Move a damaged seed folder aside and refit only that seed.")
    write_h5ad: str | Path | None = setting(
        None,
        """Also write the analysed data to this .h5ad file with the report's per-cell and per-gene columns, the
        consensus latent and the first seed's latent (``obsm["X_countvae"]``). The path is not locked: a file put
        there during the run without ``overwrite``, or a folder with or without it, ends the run refused, with the
        run's copy kept beside it as ``.<name>.countvae-<random>.kept``; the message names it and the ``mv`` that
        puts it in place (the report is saved by then, so a rerun would be refused as finished).""",
    )
    progress_bar: bool = setting(False, "Progress bars over the seeds and the fits of the report.")


#: What :func:`diagnose` passes to :func:`report` itself; ``report_kwargs`` cannot name them.
_SET_BY_DIAGNOSE = ("fits", "adata_heldout", "adata_fit", "markers", "downstream", "progress_bar", "settings")
#: The keywords :func:`report` takes.
_REPORT_KEYWORDS = tuple(inspect.signature(report).parameters)


@dataclass(frozen=True)
class DiagnosePlan:
    """What :func:`diagnose` fits, settled before any fitting (given to its ``before_fitting``).

    Attributes
    ----------
    adata
        The registered data to fit, after gene selection.
    genes
        How the genes were chosen.
    settings
        The settings as run: ``seeds`` a list, ``markers`` a list or ``None``, and ``model_kwargs``,
        ``train_kwargs`` and ``report_kwargs`` dictionaries with the defaults (epochs, stopping rule) filled in.
    cores, torch_threads
        The cores of this machine and the torch threads per fit.
    report_dir, h5ad_path
        Where the report and the .h5ad file will be written (``None``: not written).
    adata_fit, n_heldout
        The fit cells (in memory; for backed data a backed view, never read whole) and the number of held-out cells,
        once ``split()`` has applied the split (:func:`diagnose` does before ``before_fitting``); ``None`` before.
    fit_data
        What each fit's worker receives, once ``split()`` has applied the split: ``adata_fit``, or for backed data
        the :class:`~countvae.data.file_cells.FileCells` the workers read the file through (as :func:`fit_seeds`).

    """

    adata: ad.AnnData
    genes: GeneChoice
    settings: DiagnoseSettings
    cores: int
    torch_threads: int
    report_dir: Path | None
    h5ad_path: Path | None
    adata_fit: ad.AnnData | None = None
    n_heldout: int | None = None
    fit_data: ad.AnnData | FileCells | None = None

    def split(self) -> DiagnosePlan:
        """The plan with the held-out split applied (``adata_fit``, ``n_heldout``), checked as ``fit_seeds`` would."""
        s = self.settings
        fit_idx, heldout_idx = heldout_split(self.adata.n_obs, s.heldout_fraction, s.split_seed)
        registry = get_registry(self.adata)
        # a backed file's fit cells stay on disk, as the fits' (the warm-up reads only its own cells)
        adata_fit, fit_data = fit_cells(self.adata, fit_idx, registry, stream=self.adata.isbacked)
        check_fit_genes(adata_fit, registry)  # before the warm-up, which would fail less clearly
        check_fit_batches(adata_fit, registry, self.adata)
        return replace(self, adata_fit=adata_fit, n_heldout=len(heldout_idx), fit_data=fit_data)

    def seeds_to_fit(self) -> list[int]:
        """The seeds :meth:`fit` fits: those an earlier run did not store in ``out_dir/fits`` (all with overwrite).

        As :func:`fit_seeds` reuses them (stored fits without a manifest are refused before the block), and with
        ``refit_broken`` a stored seed whose files are damaged (``fit.json`` unreadable or of another seed, a model file
        missing, empty or not matching its checksum there) is counted too, as the fits move it aside and refit it;
        without it the fits refuse such a seed. Damage found only by loading the model (in a folder stored without
        checksums, by older versions) is not foreseen.
        """
        s = self.settings
        root = None if self.report_dir is None else self.report_dir.parent / "fits"
        if root is None or s.overwrite or not (root / MANIFEST_FILE).is_file():
            return list(s.seeds)
        stored = set(stored_seeds(root / FITS_FOLDER))
        return [seed for seed in s.seeds if seed not in stored or (s.refit_broken and _damaged(root, seed))]

    def parallelism(self) -> Parallelism:
        """How many of :meth:`seeds_to_fit` the fits run at once, as :func:`fit_seeds` plans them, after ``split()``.

        Its memory estimate is of what the workers hold (``fit_data``); its warning is left to the fits.
        """
        s = self.settings
        n_seeds = len(self.seeds_to_fit())
        return plan_parallelism(
            s.n_jobs, n_seeds, self.fit_data, self.torch_threads, train_kwargs=s.train_kwargs, warn=False
        )

    def report_settings(self) -> ReportSettings:
        """The report's settings: ``report_kwargs`` over the defaults."""
        fields = {f.name for f in dataclasses.fields(ReportSettings)}
        return ReportSettings().replace(**{k: v for k, v in self.settings.report_kwargs.items() if k in fields})

    def fit_settings(
        self, out_dir: str | os.PathLike | None, progress: Callable[[dict], None] | None = None
    ) -> FitSeedsSettings:
        """The settings :meth:`fit` gives :func:`fit_seeds` (stored in and resumed from ``out_dir``)."""
        s = self.settings
        return FitSeedsSettings(
            seeds=s.seeds,
            model_kwargs=s.model_kwargs,
            train_kwargs=s.train_kwargs,
            heldout_fraction=s.heldout_fraction,
            split_seed=s.split_seed,
            n_jobs=s.n_jobs,
            out_dir=out_dir,
            overwrite=s.overwrite,
            progress_bar=s.progress_bar,
            refit_broken=s.refit_broken,
            progress=progress,
        )

    def fit(
        self,
        out_dir: str | os.PathLike | None,
        progress: Callable[[dict], None] | None = None,
        fingerprint: dict[str, Any] | None = None,
    ) -> SeedFits:
        """The planned seeds, fitted as :func:`diagnose` fits them (stored in and resumed from ``out_dir``).

        ``fingerprint``: the checksum of the data that ``check_stored_fits`` returned, not computed again.
        """
        # gene selection needs the counts in memory, so the memory warning cannot advise a backed file
        with backed_remedy_off() if self.genes.selected else contextlib.nullcontext():
            return fit_models(self.adata, [self.fit_settings(out_dir, progress)], fingerprint)[0]


def _damaged(root: Path, seed: int) -> bool:
    """Whether seed ``seed``'s fit stored in ``root`` is damaged, as the fits find before loading it."""
    try:
        check_stored_files(root / FITS_FOLDER, seed, "countvae")  # diagnose fits countvae models only
    except BrokenFitError:
        return True
    return False


@takes_settings(DiagnoseSettings)
def plan_diagnose(adata: ad.AnnData, *, settings: DiagnoseSettings) -> DiagnosePlan:
    """Check the settings of :func:`diagnose` against registered data, choose the genes and fill in the defaults.

    Everything that can be refused is refused here, before any fitting.

    Parameters
    ----------
    adata
        Registered data (:func:`countvae.data.setup_anndata`).
    {settings}
    settings
        All of the above as one :class:`DiagnoseSettings`; keywords given with it replace its fields.

    Returns
    -------
    DiagnosePlan

    """
    s = settings
    for name in ("overwrite", "refit_broken", "progress_bar"):  # before anything is discarded or fitted
        check_bool(name, getattr(s, name))
    check_int("split_seed (--split-seed)", s.split_seed, 0)
    if s.heldout_fraction is not None:
        check_number(
            "heldout_fraction (--heldout-fraction)", s.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True
        )
    report_dir = _report_destination(s.out_dir, s.overwrite)
    source = Path(adata.filename) if adata.isbacked else None
    h5ad_path = _h5ad_destination(s.write_h5ad, s.overwrite, source, s.out_dir)
    if h5ad_path is not None:
        _refuse_h5ad_in_report(h5ad_path, report_dir)
        _check_analysed_copy(adata, s.overwrite, s.out_dir)
    seeds = _seed_list(s.seeds)
    model = dict(s.model_kwargs or {})
    if model.get("n_latent") is None:
        model["n_latent"] = DIAGNOSE_N_LATENT
    genes = choose_genes(adata, s.n_top_genes, DIAGNOSE_N_TOP_GENES, model["n_latent"])
    heldout_fraction = resolve_heldout_fraction(s.heldout_fraction, genes.adata.n_obs)
    fit_idx, heldout_idx = heldout_split(genes.adata.n_obs, heldout_fraction, s.split_seed)
    check_fit_genes(genes.adata[fit_idx], get_registry(genes.adata))  # as the fits would, before the warm-up
    check_fit_batches(genes.adata[fit_idx], get_registry(genes.adata), genes.adata)
    _check_heldout_cells(len(heldout_idx), genes.adata.n_obs)
    markers = marker_list(s.markers)
    _check_markers(markers, adata, genes)
    if s.downstream is not None and s.downstream.groupby is not None:  # groupby=None: clusters and UMAP only
        _check_de_groups(genes.adata.obs, s.downstream, heldout_idx)
    report_kwargs = _checked_report_kwargs(s.report_kwargs)
    _check_ica_cells(report_kwargs, len(heldout_idx), model["n_latent"])
    resolved = replace(
        s,
        seeds=seeds,
        model_kwargs=model,
        heldout_fraction=heldout_fraction,
        train_kwargs=diagnose_train_kwargs(s.train_kwargs, round((1.0 - heldout_fraction) * genes.adata.n_obs)),
        markers=markers,
        report_kwargs=report_kwargs,
    )
    return DiagnosePlan(
        adata=genes.adata,
        genes=genes,
        settings=resolved,
        cores=available_cores(),
        torch_threads=DEFAULT_TORCH_THREADS,
        report_dir=report_dir,
        h5ad_path=h5ad_path,
    )


@takes_settings(DiagnoseSettings)
def diagnose(
    adata: ad.AnnData,
    *,
    progress: Progress | None = None,
    before_fitting: Callable[[DiagnosePlan], None] | None = None,
    after_fitting: Callable[[SeedFits], None] | None = None,
    settings: DiagnoseSettings,
) -> DiagnosticReport:
    """Fit several seeds on one held-out split and report which results survive a re-run (``countvae diagnose``).

    Parameters
    ----------
    adata
        Registered data (:func:`countvae.data.setup_anndata`).
    progress
        A callable given every progress event (of the seeds and of the report files).
    before_fitting
        Called with the :class:`DiagnosePlan` once the settings and any fits stored in ``out_dir`` are checked (the
        command prints its block then).
    after_fitting
        Called with the :class:`SeedFits` once the seeds are fitted.
    {settings}
    settings
        All of the above as one :class:`DiagnoseSettings`; keywords given with it replace its fields
        (``diagnose(adata, settings=s, seeds=3)``).

    Returns
    -------
    DiagnosticReport

    """
    plan = plan_diagnose(adata, settings=settings).split()
    with contextlib.ExitStack() as stack:
        if plan.report_dir is not None:  # one writer from the first fit to the saved report, not only while fitting
            stack.enter_context(locked(plan.report_dir.parent))
        return _diagnose_planned(plan, progress, before_fitting, after_fitting)


def _diagnose_planned(
    plan: DiagnosePlan,
    progress: Progress | None,
    before_fitting: Callable[[DiagnosePlan], None] | None,
    after_fitting: Callable[[SeedFits], None] | None,
) -> DiagnosticReport:
    """:func:`diagnose` after its plan (and with the output folder locked): fit, report, save."""
    s = plan.settings
    if plan.h5ad_path is not None:
        # a folder found unwritable after the report is saved would make the rerun refuse without overwrite
        check_writable(plan.h5ad_path, reused=True)
        refuse_without_room(plan.h5ad_path, plan.adata)
        _warn_interrupted_h5ad(plan.h5ad_path)
    fits_dir = None if plan.report_dir is None else plan.report_dir.parent / "fits"
    # stored fits of other settings or data are refused before the block and its warm-up, not once the fits start
    fingerprint = check_stored_fits(plan.adata, [plan.fit_settings(fits_dir)])
    if before_fitting is not None:
        before_fitting(plan)
    if plan.report_dir is not None and s.overwrite:
        discard_replaced_report(plan.report_dir)
    fits = plan.fit(fits_dir, progress, fingerprint)
    if after_fitting is not None:
        after_fitting(fits)
    rep = report(
        fits, markers=s.markers, progress_bar=s.progress_bar, downstream=s.downstream, **(s.report_kwargs or {})
    )
    # The .h5ad is written first, complete, under a name of its own and renamed after the report is saved, so that a
    # run interrupted while writing it has no finished report yet and resumes (a finished report refuses a rerun).
    with contextlib.ExitStack() as stack:
        pending = None
        if plan.h5ad_path is not None:
            refuse_without_room(plan.h5ad_path, plan.adata)  # checked again: the fits may have filled the disk
            # told about the path asked for, not the pending name
            with explained_write_errors(plan.h5ad_path, reused=True):
                pending = stack.enter_context(pending_file(plan.h5ad_path))
                write_analysed_h5ad(rep, fits, plan.adata, pending, s.overwrite)
        if plan.report_dir is not None:
            remove_interrupted_report(plan.report_dir)
            with explained_write_errors(plan.report_dir, reused=True):
                rep.save(plan.report_dir, overwrite=s.overwrite, progress=progress)  # in one atomic step
        if pending is not None:
            with explained_write_errors(plan.h5ad_path, reused=True):
                try:  # refuses a file put there meanwhile, and any folder, with the result kept aside
                    place_file(pending, plan.h5ad_path, s.overwrite)
                except OutputExistsError as exc:
                    raise _h5ad_refused(exc, plan.h5ad_path, plan.report_dir) from None
            logger.info("Wrote %s with the report's columns.", plan.h5ad_path)
    return rep


def _h5ad_refused(exc: OutputExistsError, path: Path, report_dir: Path | None) -> OutputExistsError:
    """``exc``, the refusal of the analysed copy at its end, with the command that finishes the run by hand.

    The report is saved by then, so a rerun would be refused as finished: the message gives the ``mv`` that puts the
    kept copy (complete, with the report's columns) where it was asked for.
    """
    if exc.kept is None:
        return exc
    # "--": shlex.quote leaves a name such as -x.h5ad as it is, which mv and rm would take for options
    move = f"mv -- {shlex.quote(str(exc.kept))} {shlex.quote(str(path))}"
    if path.is_symlink() and path.is_dir():  # mv would move the copy into the folder the link leads to
        finish = (
            f"remove the link (`rm -- {shlex.quote(str(path))}`; the folder it leads to is kept), then run `{move}`"
        )
    elif path.is_dir():
        finish = f"move or rename the folder {path}, then run `{move}`"
    else:
        now = "symbolic link" if path.is_symlink() else "file"
        finish = f"run `{move}` (it replaces the {now} now at {path}), or move the copy to another name to keep both"
    saved = "" if report_dir is None else f" The report is saved in {report_dir}, so a rerun is refused as finished."
    error = OutputExistsError(f"{exc}{saved} To finish, {finish}.")
    error.kept = exc.kept
    return error


def _seed_list(seeds: int | Sequence[int]) -> list[int]:
    """The seeds: ``range(seeds)`` for a number (at least 2), else the seeds given, checked as fit_seeds checks them."""
    if isinstance(seeds, int | np.integer) and not isinstance(seeds, bool):
        if seeds < 2:
            raise InvalidArgumentError(f"seeds (--seeds) must be at least 2 to compare fits, got {seeds}.")
        return list(range(int(seeds)))
    return check_seeds(seeds)


def _checked_report_kwargs(report_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``report_kwargs`` as a dictionary, refused now when :func:`report` would refuse it after the fits."""
    kwargs = dict(report_kwargs or {})
    taken = sorted(set(kwargs) & set(_SET_BY_DIAGNOSE))
    if taken:
        raise InvalidArgumentError(
            f"report_kwargs cannot set {taken}: diagnose sets them (give markers= and downstream= to diagnose itself)."
        )
    known = [name for name in _REPORT_KEYWORDS if name not in _SET_BY_DIAGNOSE]
    for name in kwargs:
        if name not in known:
            raise unknown_setting(name, known, "diagnose(report_kwargs=...)")
    fields = {f.name for f in dataclasses.fields(ReportSettings)}
    ReportSettings().replace(**{k: v for k, v in kwargs.items() if k in fields})
    return kwargs


def _check_markers(markers: list[str] | None, adata: ad.AnnData, genes: GeneChoice) -> None:
    """Refuse, before hours of fitting, markers that gene selection dropped or that are neither genes nor columns."""
    if markers is None:
        return
    if genes.selected:  # markers that were genes before the selection, now neither genes nor obs columns
        genes_before = set(get_var_names(adata, get_registry(adata)))
        kept = set(genes.adata.var_names) | set(genes.adata.obs.columns)
        dropped = [m for m in markers if m in genes_before and m not in kept]
        if dropped:
            raise InvalidArgumentError(
                f"Marker genes {dropped} are not among the {genes.adata.n_vars:,} most variable genes kept for "
                "fitting; pass a larger --n-top-genes (n_top_genes), 'all', or other markers."
            )
    var_names = get_var_names(genes.adata, get_registry(genes.adata))
    if genes.adata.isbacked:  # genes by name only: their values would read every cell's counts from the file
        markers = [m for m in marker_names(markers, genes.adata.obs, var_names) if m not in var_names]
        if not markers:
            return
    marker_matrix(genes.adata, markers, var_names)


def _check_de_groups(obs: pd.DataFrame, request: DownstreamRequest, heldout_idx: np.ndarray) -> None:
    """Refuse DE groups before fitting: among all cells, and among the held-out cells the DE runs on."""
    where = ""
    try:
        de_groups(obs, request.groupby, request.group1, request.group2)
        where = f" (DE runs on the report's {len(heldout_idx)} held-out cells.)"
        de_groups(obs.iloc[heldout_idx], request.groupby, request.group1, request.group2)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--de {request.groupby}: {exc}{where}") from None


def _check_heldout_cells(n_heldout: int, n_cells: int) -> None:
    """Refuse, before fitting, a split the report would refuse after every fit."""
    if n_heldout < MIN_HELDOUT_CELLS:
        share = math.ceil(100 * MIN_HELDOUT_CELLS / n_cells) / 100
        raise InvalidArgumentError(
            f"The held-out split keeps {n_heldout} of {n_cells} cells; the report needs at least {MIN_HELDOUT_CELLS}. "
            f"Pass heldout_fraction={share:g} or more (the verdicts need far more held-out cells to decide: see the "
            "verdicts' remedies), or use a larger file."
        )


def _check_ica_cells(report_kwargs: Mapping[str, Any], n_heldout: int, n_latent: int) -> None:
    """Refuse before fitting the ICA map class on too few held-out cells, which would stop the report after the fits.

    The alignment fits each seed's ICA axes on its half of the held-out cells, and ICA needs ``n_latent + 2`` cells
    at least (:class:`countvae.ica.ICARotation`).
    """
    n_cells = len(split_halves(n_heldout, 0)[0])
    if report_kwargs.get("ica", ReportSettings().ica) and n_cells < n_latent + 2:
        raise InvalidArgumentError(
            f"ICA (ica, --no-ica) fits each seed's axes on {n_cells} of the {n_heldout} held-out cells, fewer than the "
            f"{n_latent + 2} it needs for {n_latent} latent dimensions; turn it off (--no-ica), choose fewer latent "
            "dimensions (--n-latent) or hold out more cells (--heldout-fraction)."
        )


def discard_replaced_report(report_dir: Path) -> None:
    """Remove the report that ``overwrite`` replaces, before the fits it describes are discarded.

    Left beside the new fits, it would refuse the rerun that resumes an interrupted run (which could then only
    pass ``overwrite`` again and discard the seeds already refitted). Moved aside first, so that a run killed
    meanwhile leaves either the whole report or none (what it leaves aside, :func:`remove_interrupted_report` removes).
    A folder holding anything but a report's files is refused (:class:`~countvae.errors.OutputExistsError`).
    """
    if not report_dir.exists():
        return
    refuse_foreign_entries(report_dir, True, REPORT_FOLDER)
    discard_folder(report_dir)
    logger.info("Removed the report in %s, which the refitted seeds will replace (overwrite).", report_dir)


def _warn_interrupted_h5ad(path: Path) -> None:
    """Name the copies of ``path`` that killed runs left beside it, and their size; none is removed.

    ``path`` is not locked (unlike ``--out``), so a run cannot tell a killed run's copy from one that another run is
    writing now, and deleting that would lose its result. Only the regular ``.partial`` files that
    :func:`~countvae._io.pending_file` makes are copies; a folder, a link or an ``.old`` name is none of them.
    """
    left = [
        p
        for p in interrupted_writes(path.parent, path.name)
        if p.suffix == ".partial" and p.is_file() and not p.is_symlink()
    ]
    if left:
        size = 0
        for leftover in left:
            with contextlib.suppress(OSError):  # placed or deleted meanwhile by the run writing it
                size += leftover.lstat().st_size
        shown = ", ".join(str(p) for p in left[:3]) + (
            f" and {len(left) - 3} more in {path.parent}" if len(left) > 3 else ""
        )
        warn_at_caller(
            f"{len(left)} {'copy' if len(left) == 1 else 'copies'} of {path.name} left beside it by runs killed while "
            f"writing it ({size / 2**20:.1f} MiB in all), unless a run at work now writes one: {shown}. No run "
            f"removes them, as {path} is not locked; delete them once no other run writes {path}.",
            CountVAEWarning,
        )


def remove_interrupted_report(report_dir: Path) -> None:
    """Remove what a run interrupted while writing its report into ``report_dir`` left, before saving it again."""
    for path in remove_interrupted_writes(report_dir.parent, report_dir.name):
        logger.info("Removed %s, left by a run interrupted while writing its report.", path)


def _report_destination(out_dir: str | Path | None, overwrite: bool) -> Path | None:
    """``out_dir/report``, refused before any fitting when it holds a report without ``overwrite``, or more with it.

    A file or a symbolic link to a missing path at ``out_dir``, ``out_dir/fits``, a fits folder
    (``out_dir/fits/fits``, or ``out_dir/fits/<model>/fits`` for ``--restrictions``) or ``out_dir/report``, a folder
    at a file that ``fit_seeds`` writes (``manifest.json``, the lock files) and a link at ``out_dir/report`` are
    refused with or without ``overwrite``; with it, so is a link at a fits folder that it discards. ``fit_seeds``
    refuses them too, but only after the report is gone.
    """
    if out_dir is None:
        return None
    out = Path(out_dir)
    refuse_overlong_name(out)
    refuse_file_in_the_way(out, "choose another --out")
    for root in _fits_roots(out):
        refuse_obstacles(root, "choose another --out")
        if overwrite:
            refuse_non_folder(root / FITS_FOLDER)
    report_dir = out / "report"
    # without overwrite too: a folder holding other entries is no finished report, and --overwrite would refuse it
    refuse_foreign_entries(report_dir, report_dir.is_dir(), REPORT_FOLDER)
    if report_dir.exists() and not overwrite:
        if not (report_dir / "report.json").is_file():  # an empty folder, or a report.html alone
            # --overwrite would refit every seed: removing the folder resumes from the fits stored beside it
            raise OutputExistsError(
                f"{report_dir} already exists and holds no finished report (no report.json). Remove it "
                f"(`rm -r -- {shlex.quote(str(report_dir))}`) to fit or resume into {out}, keeping any fits stored in "
                f"{out / 'fits'}; pass --overwrite to refit every seed and replace it; or choose another --out."
            )
        raise OutputExistsError(
            f"{report_dir} already holds a finished report; pass --overwrite to refit and replace it, "
            "or choose another --out."
        )
    return report_dir


def _fits_roots(out: Path) -> list[Path]:
    """The fits folders of a run writing ``out``: ``out/fits``, and the model folders ``--restrictions`` puts in it."""
    fits = out / "fits"
    models = [e for e in fits.iterdir() if e.is_dir() and e.name != FITS_FOLDER] if fits.is_dir() else []
    return [fits, *models]


def _overwrite_also(out_dir: str | Path | None) -> str:
    """What ``--overwrite`` discards besides the analysed copy: the seeds stored in ``out_dir`` (``""``: none).

    Only ``out_dir/fits/fits``: the analysed copy is written by a plain diagnose alone, which leaves the folders of
    ``--restrictions`` and ``select`` beside it untouched.
    """
    if out_dir is None:
        return ""
    fits_dir = Path(out_dir) / "fits" / FITS_FOLDER
    n_stored = len(stored_seeds(fits_dir))
    if not n_stored:
        return ""
    return f" (it also discards the {counted(n_stored, 'fit')} stored in {fits_dir}, and fits this run's seeds afresh)"


def _h5ad_destination(
    path: str | Path | None, overwrite: bool, source: Path | None = None, out_dir: str | Path | None = None
) -> Path | None:
    """The ``write_h5ad`` file, refused before any fitting when it exists without ``overwrite``, or is ``source``.

    The refusal's remedies keep the fits stored in ``out_dir``, and say that ``overwrite`` would discard them.
    """
    if path is None:
        return None
    out = Path(path)
    if out.suffix != ".h5ad":
        raise InvalidArgumentError(f"--write-h5ad {path}: give a file name ending in .h5ad.")
    refuse_overlong_name(out)
    refuse_file_in_the_way(out.parent, "choose another --write-h5ad")  # a link loop above it too, before resolve()
    if out.is_dir():
        raise OutputExistsError(f"{out} is a folder; give --write-h5ad the name of a file to write.")
    refuse_input_as_h5ad_output(out, source)
    if os.path.lexists(out) and not overwrite:  # a dangling link too, which the final rename would not replace
        raise OutputExistsError(
            f"{out} {exists_as(out)}; remove it (`rm -- {shlex.quote(str(out))}`) or choose another --write-h5ad, or "
            f"pass --overwrite to replace it{_overwrite_also(out_dir)}."
        )
    return out


def _refuse_h5ad_in_report(h5ad_path: Path, report_dir: Path | None) -> None:
    """Refuse ``write_h5ad`` inside the report folder, which diagnose writes whole and replaces with ``overwrite``.

    Its folder, made for the .h5ad, made the report's own save refuse the run after every fit. A link at the path
    itself is replaced (with ``overwrite``), not followed, so only its folder is resolved (a link loop there was
    refused by :func:`_h5ad_destination`; one at the path would raise ``RuntimeError`` in ``resolve()``).
    """
    if report_dir is not None and (h5ad_path.parent.resolve() / h5ad_path.name).is_relative_to(report_dir.resolve()):
        raise InvalidArgumentError(
            f"--write-h5ad {h5ad_path} lies inside {report_dir}, the report folder diagnose writes whole (and replaces "
            f"with --overwrite); write the analysed copy elsewhere, e.g. {report_dir.parent / h5ad_path.name}."
        )


def refuse_input_as_h5ad_output(out: Path, source: Path | None) -> None:
    """Refuse ``write_h5ad`` naming the data file analysed, whatever ``overwrite`` says.

    The analysed copy holds the chosen genes only (and with ``use_raw`` the raw counts as ``X``), so replacing the
    input with it would lose the other genes' counts.
    """
    if source is not None and out.exists() and source.exists() and out.samefile(source):
        raise OutputExistsError(
            f"--write-h5ad {out} is the data file being analysed; the analysed copy holds only the chosen genes, so "
            "it would replace the file's other counts. Write it to another file."
        )


def _check_analysed_copy(adata: ad.AnnData, overwrite: bool, out_dir: str | Path | None = None) -> None:
    """Refuse, before any fitting, an analysed copy that could not be written, or would replace results unasked.

    The refusal says that ``overwrite`` would also discard the fits stored in ``out_dir``.
    """
    check_unique_names(
        adata.obs_names,
        "obs",
        "--write-h5ad writes the report's columns by cell name",
        after=", then write the file again for the command line",
    )
    model_keys = {
        "obsm": anndata_results.LATENT_KEY,
        "varm": anndata_results.LOADINGS_KEY,
        "layers": anndata_results.LAYER_KEY,
        "uns": anndata_results.UNS_KEY,
    }
    taken = [f"{slot}[{key!r}]" for slot, key in model_keys.items() if key in getattr(adata, slot)]
    taken += existing_report_keys(adata)
    if taken and not overwrite:
        raise OutputExistsError(
            f"The data already hold countvae results ({', '.join(taken)}), which the analysed copy (--write-h5ad) "
            "would replace; remove them from the data first, or pass --overwrite to replace them in the copy (the "
            f"data file itself is not changed){_overwrite_also(out_dir)}."
        )


def write_analysed_h5ad(
    rep: DiagnosticReport, fits: SeedFits, adata: ad.AnnData, path: Path, overwrite: bool = False
) -> None:
    """Write ``adata`` (in memory) with the first seed's latent and the report's columns to ``path``.

    With ``overwrite``, earlier countvae results in the copy are replaced, and a normalized-expression layer that an
    earlier ``write_results`` wrote is removed: this copy records no layer, and the layer is of another model.
    """
    adata = read_into_memory(adata) if adata.isbacked else adata.copy()
    if overwrite:
        adata.layers.pop(anndata_results.LAYER_KEY, None)
    fits.fits[0].model.write_results(adata, layer=None, overwrite=overwrite)
    rep.write(adata, overwrite=overwrite)
    adata.write_h5ad(path)


def _nbytes(value: Any) -> int:
    """Bytes of an array, sparse matrix or table in memory (0 for what has no size, e.g. a backed dataset)."""
    if sp.issparse(value):
        return sum(
            getattr(value, name).nbytes for name in ("data", "indices", "indptr", "row", "col") if hasattr(value, name)
        )
    if isinstance(value, pd.DataFrame):
        return int(value.memory_usage(deep=True).sum())
    return int(getattr(value, "nbytes", 0) or 0)


def estimated_h5ad_bytes(adata: ad.AnnData) -> int:
    """About the size of ``adata`` written as .h5ad (uncompressed, as ``write_h5ad`` writes by default).

    Its arrays and tables (a backed ``X`` by its stored arrays, uncompressed, for the share of the file's cells it
    holds: the file's own size is that of the compressed arrays of every cell) plus a tenth and 1 MiB for HDF5's own
    structures and the report's columns, which the analysed copy adds.
    """
    arrays = [
        *adata.layers.values(),
        *adata.obsm.values(),
        *adata.varm.values(),
        *adata.obsp.values(),
        *adata.varp.values(),
        adata.obs,
        adata.var,
    ]
    if adata.raw is not None:
        arrays += [adata.raw.X, adata.raw.var]
    total = sum(_nbytes(value) for value in arrays)
    total += _backed_x_bytes(adata) if adata.isbacked else _nbytes(adata.X)
    return int(1.1 * total) + 2**20


def _backed_x_bytes(adata: ad.AnnData) -> int:
    """Bytes of a backed AnnData's ``X`` once read, uncompressed, for the cells it holds (a view holds some)."""
    stored = adata.file["X"]
    if isinstance(stored, h5py.Dataset):
        return int(stored.size * stored.dtype.itemsize * adata.n_obs / max(stored.shape[0], 1))
    arrays = sum(stored[name].size * stored[name].dtype.itemsize for name in ("data", "indices", "indptr"))
    return int(arrays * adata.n_obs / max(int(stored.attrs["shape"][0]), 1))


def refuse_without_room(path: Path, adata: ad.AnnData) -> None:
    """Refuse to write ``adata`` to ``path`` when the disk of ``path``'s folder has not room for it.

    HDF5 can crash the process (a segmentation fault) when the disk fills while it closes the file, leaving the
    file half-written and the output folder locked, so a write that would not fit is not started.

    Raises
    ------
    OutputWriteError
        If the free space is less than :func:`estimated_h5ad_bytes`.

    """
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folder is made when written: its nearest parent
        folder = folder.parent
    needed, free = estimated_h5ad_bytes(adata), shutil.disk_usage(folder).free
    if needed > free:
        error = OutputWriteError(
            f"Could not write {path}: the analysed copy needs about {needed / 2**20:.1f} MiB and the disk of "
            f"{path.parent} has {free / 2**20:.1f} MiB free. Free disk space, or choose a write_h5ad path "
            "(--write-h5ad) on another disk, and rerun: finished results are reused."
        )
        error.errno = errno.ENOSPC
        error.filename = str(path)
        raise error
