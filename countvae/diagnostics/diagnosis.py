"""``diagnose(adata)``: what ``countvae diagnose`` does, as one library call.

It chooses the genes (the most variable when the data has more than
:data:`DIAGNOSE_N_TOP_GENES`), fits the seeds with :func:`fit_seeds` on one
shared held-out split, trained for :func:`default_epochs` epochs with the
stopping rule :data:`DIAGNOSE_STOPPING`, compares them with :func:`report`, and
returns the :class:`DiagnosticReport`. With ``out_dir`` the run is the command's:
``out_dir/fits`` is the resumable :func:`fit_seeds` folder (an interrupted run
called again with the same arguments refits only the seeds that had not
finished), ``out_dir/report`` the saved report, refused when it exists unless
``overwrite``. With ``write_h5ad`` the analysed data is also written to an .h5ad
file with the report's columns (:meth:`DiagnosticReport.write`) and the first
seed's latent.

The defaults here are the command's: the command line only parses its options,
prints progress and calls :func:`diagnose`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anndata as ad

from countvae._checks import check_number
from countvae._io import atomic_file_path, remove_interrupted_writes
from countvae.data.gene_selection import GeneChoice, choose_genes
from countvae.data.registry import get_registry, get_var_names
from countvae.diagnostics.analyses.markers import marker_matrix
from countvae.diagnostics.analyses.predictive import EQUIVALENCE_MARGIN
from countvae.diagnostics.fitting.backends import DEFAULT_TORCH_THREADS, available_cores
from countvae.diagnostics.fitting.fit_seeds import check_fit_genes, fit_seeds
from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
from countvae.diagnostics.fitting.parallelism import AUTO
from countvae.diagnostics.fitting.progress import Progress
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest, de_groups
from countvae.diagnostics.reporting.pipeline import ReportSettings, report
from countvae.errors import InvalidArgumentError, OutputExistsError
from countvae.model.training import DEFAULT_STOPPING

logger = logging.getLogger(__name__)

#: Latent dimensions when ``model_kwargs`` does not name them.
DIAGNOSE_N_LATENT = 10
#: Cells visited per seed by default (epochs x training cells): about 2.5 minutes per seed for data
#: like Kang (7,800 cells x 2,500 genes, ~1.3 s per epoch on one core), so 5 seeds fit in 15 minutes.
CELL_PASSES_PER_SEED = 600_000
#: Genes kept by default (the most variable, on the raw counts) when the data has more: fitting time
#: grows with the genes, and a raw file of 11,533 genes took 6 minutes per seed with all of them
#: (benchmarks/RESULTS.md, first-contact). scvi-tools' tutorials keep 1,200 to 4,000.
DIAGNOSE_N_TOP_GENES = 2_000
#: The stopping rule of ``diagnose`` (on unless ``train_kwargs`` has ``early_stopping=False``), chosen in
#: benchmarks/bench_stopping.py (section "stopping" of benchmarks/RESULTS.md): on Kang it stopped 3 seeds after
#: 52-54 of the 77 default epochs, with a held-out ELBO no worse than training all 77 epochs. A single
#: ``CountVAE.train`` keeps the TrainingPlan defaults (early stopping off).
DIAGNOSE_STOPPING = DEFAULT_STOPPING.settings()


def default_epochs(n_fit_cells: int) -> int:
    """Epochs per seed when ``max_epochs`` is not given: 600,000 cell passes, between 20 and 400.

    scvi-tools' default (``min(20000 / n * 400, 400)``, 400 epochs below 20,000 cells)
    is made for one fit; ``diagnose`` fits several, so it trains each for a fixed
    number of cell passes instead (77 epochs on 7,800 cells). The number is fixed
    rather than a time budget, so that a resumed run reproduces the same fits.
    """
    return int(min(400, max(20, round(CELL_PASSES_PER_SEED / max(n_fit_cells, 1)))))


@dataclass(frozen=True)
class DiagnosePlan:
    """What :func:`diagnose` fits, settled before any fitting (given to its ``before_fitting``).

    Attributes
    ----------
    adata
        The registered data to fit, after gene selection.
    heldout_fraction, split_seed
        The held-out split shared by every fit.
    genes
        How the genes were chosen.
    seeds
        The seeds to fit.
    model_kwargs, train_kwargs
        The settings of every fit, defaults (epochs, stopping rule) filled in.
    markers
        Genes or ``obs`` columns of the marker analysis, or ``None`` for the default.
    n_jobs, cores, torch_threads
        Seeds fitted at once (``-1``: all cores), the cores of this machine,
        torch threads per fit.
    report_dir, h5ad_path
        Where the report and the .h5ad file will be written (``None``: not written).
    adata_fit, n_heldout
        The fit cells (in memory) and the number of held-out cells, once ``split()`` has applied the split
        (:func:`diagnose` does before ``before_fitting``); ``None`` before.

    """

    adata: ad.AnnData
    heldout_fraction: float
    split_seed: int
    genes: GeneChoice
    seeds: list[int]
    model_kwargs: dict[str, Any]
    train_kwargs: dict[str, Any]
    markers: list[str] | None
    n_jobs: int | str
    cores: int
    torch_threads: int
    report_dir: Path | None
    h5ad_path: Path | None
    adata_fit: ad.AnnData | None = None
    n_heldout: int | None = None

    def split(self) -> DiagnosePlan:
        """The plan with the held-out split applied (``adata_fit``, ``n_heldout``), checked as ``fit_seeds`` would."""
        fit_idx, heldout_idx = heldout_split(self.adata.n_obs, self.heldout_fraction, self.split_seed)
        adata_fit = cells_at(self.adata, fit_idx)
        check_fit_genes(adata_fit, get_registry(adata_fit))  # before the warm-up, which would fail less clearly
        return replace(self, adata_fit=adata_fit, n_heldout=len(heldout_idx))


def plan_diagnose(
    adata: ad.AnnData,
    *,
    seeds: int | Sequence[int] = 5,
    model_kwargs: Mapping[str, Any] | None = None,
    train_kwargs: Mapping[str, Any] | None = None,
    n_top_genes: int | str | None = None,
    heldout_fraction: float = 0.1,
    split_seed: int = 0,
    markers: Sequence[str] | None = None,
    n_lpd_samples: int = 100,
    equivalence_margin: float = EQUIVALENCE_MARGIN,
    downstream: DownstreamRequest | None = None,
    n_jobs: int | str = AUTO,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    write_h5ad: str | Path | None = None,
) -> DiagnosePlan:
    """Check the arguments of :func:`diagnose` against registered data, choose the genes and fill in the defaults.

    Everything that can be refused is refused here, before any fitting. The
    arguments are those of :func:`diagnose`.
    """
    report_dir = _report_destination(out_dir, overwrite)
    h5ad_path = _h5ad_destination(write_h5ad, overwrite)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if len(seed_list) < 2:
        raise InvalidArgumentError(f"--seeds must be at least 2 to compare fits, got {len(seed_list)}.")
    model = dict(model_kwargs or {})
    if model.get("n_latent") is None:
        model["n_latent"] = DIAGNOSE_N_LATENT
    genes = choose_genes(adata, n_top_genes, DIAGNOSE_N_TOP_GENES, model["n_latent"])
    marker_list = None if markers is None else list(markers)
    if marker_list is not None and genes.selected:
        dropped = _missing_marker_genes(marker_list, adata, genes.adata)
        if dropped:
            raise InvalidArgumentError(
                f"Marker genes {dropped} are not among the {genes.adata.n_vars:,} most variable genes kept for "
                "fitting; pass a larger --n-top-genes (n_top_genes), 'all', or other markers."
            )
    adata = genes.adata
    if marker_list is not None:  # fail before hours of fitting, not after
        marker_matrix(adata, marker_list, get_var_names(adata, get_registry(adata)))
    ReportSettings().replace(n_lpd_samples=n_lpd_samples, equivalence_margin=equivalence_margin)
    if downstream is not None:
        try:
            de_groups(adata.obs, downstream.groupby, downstream.group1, downstream.group2)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"--de {downstream.groupby}: {exc}") from None
    check_number("--heldout-fraction", heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
    return DiagnosePlan(
        adata=adata,
        heldout_fraction=heldout_fraction,
        split_seed=split_seed,
        genes=genes,
        seeds=seed_list,
        model_kwargs=model,
        train_kwargs=diagnose_train_kwargs(train_kwargs, round((1.0 - heldout_fraction) * adata.n_obs)),
        markers=marker_list,
        n_jobs=n_jobs,
        cores=available_cores(),
        torch_threads=DEFAULT_TORCH_THREADS,
        report_dir=report_dir,
        h5ad_path=h5ad_path,
    )


def diagnose_train_kwargs(train_kwargs: Mapping[str, Any] | None, n_fit_cells: int) -> dict[str, Any]:
    """``train_kwargs`` with the defaults of :func:`diagnose` filled in.

    ``max_epochs``: ``default_epochs``; ``early_stopping``: on, with
    ``DIAGNOSE_STOPPING`` for the settings not given (none of them when
    early stopping is off, so that the model's own defaults apply); no progress bar.
    """
    given = {k: v for k, v in (train_kwargs or {}).items() if v is not None}
    kwargs: dict[str, Any] = {"max_epochs": default_epochs(n_fit_cells), "early_stopping": True, **given}
    if kwargs["early_stopping"]:
        kwargs = {**DIAGNOSE_STOPPING, **kwargs}
    return {**kwargs, "progress_bar": False}


def diagnose(
    adata: ad.AnnData,
    *,
    seeds: int | Sequence[int] = 5,
    model_kwargs: Mapping[str, Any] | None = None,
    train_kwargs: Mapping[str, Any] | None = None,
    n_top_genes: int | str | None = None,
    heldout_fraction: float = 0.1,
    split_seed: int = 0,
    markers: Sequence[str] | None = None,
    ica: bool = True,
    n_lpd_samples: int = 100,
    equivalence_margin: float = EQUIVALENCE_MARGIN,
    downstream: DownstreamRequest | None = None,
    n_jobs: int | str = AUTO,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    refit_broken: bool = False,
    write_h5ad: str | Path | None = None,
    progress_bar: bool = False,
    progress: Progress | None = None,
    before_fitting: Callable[[DiagnosePlan], None] | None = None,
    after_fitting: Callable[[SeedFits], None] | None = None,
) -> DiagnosticReport:
    """Fit several seeds on one held-out split and report which results survive a re-run (``countvae diagnose``).

    Parameters
    ----------
    adata
        Registered data (:func:`countvae.data.setup_anndata`).
    seeds
        Number of seeds (fitted as ``0..N-1``) or the seeds; at least 2.
    model_kwargs, train_kwargs
        Settings of every fit, as for :func:`fit_seeds`; ``n_latent`` defaults to 10, ``max_epochs`` to
        ``default_epochs``, and early stopping is on with ``DIAGNOSE_STOPPING`` unless
        ``early_stopping=False`` (``diagnose_train_kwargs``).
    n_top_genes
        Keep this many most variable genes (on the raw counts); ``None``: ``DIAGNOSE_N_TOP_GENES`` when the
        data has more; ``"all"``: every gene.
    heldout_fraction, split_seed, n_jobs
        The held-out cells shared by every fit; seeds fitted at once in worker processes (``"auto"``: one per
        usable core, as :func:`fit_seeds`).
    markers, ica, n_lpd_samples, equivalence_margin, downstream
        As for :func:`report`.
    out_dir, overwrite, refit_broken
        Folder of the run, ``fits/`` (resumable) and ``report/`` (``None``: nothing written); refit every seed and
        replace a finished report; move a damaged seed folder aside and refit only that seed.
    write_h5ad
        Also write the analysed data with the report's per-cell and per-gene columns, the consensus latent and
        the first seed's latent (``obsm["X_countvae"]``) to this .h5ad file.
    progress_bar, progress
        Progress bars; a callable given every progress event (of the seeds and of the report files).
    before_fitting, after_fitting
        Called with the :class:`DiagnosePlan` once the arguments are checked, and with the :class:`SeedFits`
        once the seeds are fitted (the command prints its messages from them).

    Returns
    -------
    DiagnosticReport

    """
    plan = plan_diagnose(
        adata,
        seeds=seeds,
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        n_top_genes=n_top_genes,
        heldout_fraction=heldout_fraction,
        split_seed=split_seed,
        markers=markers,
        n_lpd_samples=n_lpd_samples,
        equivalence_margin=equivalence_margin,
        downstream=downstream,
        n_jobs=n_jobs,
        out_dir=out_dir,
        overwrite=overwrite,
        write_h5ad=write_h5ad,
    ).split()
    if before_fitting is not None:
        before_fitting(plan)
    fits = _fit(plan, overwrite, refit_broken, progress_bar, progress)
    if after_fitting is not None:
        after_fitting(fits)
    rep = report(
        fits,
        markers=plan.markers,
        ica=ica,
        n_lpd_samples=n_lpd_samples,
        equivalence_margin=equivalence_margin,
        progress_bar=progress_bar,
        downstream=downstream,
    )
    if plan.report_dir is not None:
        _save(rep, plan.report_dir, overwrite, progress)
    if plan.h5ad_path is not None:
        write_analysed_h5ad(rep, fits, plan.adata, plan.h5ad_path, overwrite)
    return rep


def _fit(
    plan: DiagnosePlan,
    overwrite: bool,
    refit_broken: bool,
    progress_bar: bool,
    progress: Progress | None,
) -> SeedFits:
    """The seeds' fits, in ``fits/`` beside the report when the run has a folder."""
    return fit_seeds(
        plan.adata,
        seeds=plan.seeds,
        model_kwargs=plan.model_kwargs,
        train_kwargs=plan.train_kwargs,
        heldout_fraction=plan.heldout_fraction,
        split_seed=plan.split_seed,
        n_jobs=plan.n_jobs,
        out_dir=None if plan.report_dir is None else plan.report_dir.parent / "fits",
        overwrite=overwrite,
        progress_bar=progress_bar,
        refit_broken=refit_broken,
        progress=progress,
    )


def _save(rep: DiagnosticReport, report_dir: Path, overwrite: bool, progress: Progress | None) -> None:
    """Save the report in one atomic step, first removing what an interrupted save left."""
    for path in remove_interrupted_writes(report_dir.parent, report_dir.name):
        logger.info("Removed %s, left by a run interrupted while writing its report.", path)
    rep.save(report_dir, overwrite=overwrite, progress=progress)


def _report_destination(out_dir: str | Path | None, overwrite: bool) -> Path | None:
    """``out_dir/report``, refused before any fitting when it holds a finished report without ``overwrite``."""
    if out_dir is None:
        return None
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a folder; choose another --out.")
    report_dir = out / "report"
    if report_dir.exists() and not overwrite:
        raise OutputExistsError(
            f"{report_dir} already holds a finished report; pass --overwrite to refit and replace it, "
            "or choose another --out."
        )
    return report_dir


def _h5ad_destination(path: str | Path | None, overwrite: bool) -> Path | None:
    """The ``write_h5ad`` file, refused before any fitting when it exists without ``overwrite``."""
    if path is None:
        return None
    out = Path(path)
    if out.suffix != ".h5ad":
        raise InvalidArgumentError(f"--write-h5ad {path}: give a file name ending in .h5ad.")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite to replace it, or choose another --write-h5ad.")
    return out


def _missing_marker_genes(markers: Sequence[str], before: ad.AnnData, after: ad.AnnData) -> list[str]:
    """Markers that were genes of ``before`` but are neither genes nor obs columns of ``after``."""
    genes_before = set(get_var_names(before, get_registry(before)))
    kept = set(after.var_names) | set(after.obs.columns)
    return [m for m in markers if m in genes_before and m not in kept]


def write_analysed_h5ad(
    rep: DiagnosticReport, fits: SeedFits, adata: ad.AnnData, path: Path, overwrite: bool = False
) -> Path:
    """Write ``adata`` (in memory) with the first seed's latent and the report's columns to ``path``, atomically."""
    adata = adata.to_memory() if adata.isbacked else adata.copy()
    fits.fits[0].model.write_results(adata, layer=None, overwrite=True)
    rep.write(adata, overwrite=True)
    with atomic_file_path(path, overwrite=overwrite) as tmp:
        adata.write_h5ad(tmp)
    logger.info("Wrote %s (%d cells, %d genes) with the report's columns.", path, adata.n_obs, adata.n_vars)
    return path
