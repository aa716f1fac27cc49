"""``countvae.diagnostics.diagnose``: the library call that the ``countvae diagnose`` command runs."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.cli import main
from countvae.diagnostics import (
    DIAGNOSE_STOPPING,
    DiagnoseSettings,
    DownstreamRequest,
    ProgressEvent,
    ProgressKind,
    compare_models,
    diagnose,
    fit_seeds,
    heldout_split,
    plan_diagnose,
)
from countvae.errors import InvalidArgumentError, InvalidDataError, OutputExistsError, OutputWriteError, SetupError

FAST = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "5", "--n-lpd-samples", "10"]
#: What the command line above gives the fits (the command's defaults for the options not named).
MODEL = {"n_latent": 2, "likelihood": "nb", "decoder": "linear", "n_hidden": 128, "n_layers": 1}
TRAIN = {"max_epochs": 5, "batch_size": 128}  # the learning rate: the shared rule's, as the command


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", sources="laplace", seed=2)
    path = tmp_path_factory.mktemp("data") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def _registered(path):
    adata = ad.read_h5ad(path)
    cv.data.setup_anndata(adata)
    return adata


def _without_timings(record: dict) -> dict:
    record = dict(record)
    record.pop("timings_seconds")
    return record


def test_library_call_gives_the_report_of_the_command(data_file, tmp_path):
    markers = ["gene0", "gene5"]
    assert (
        main(["diagnose", str(data_file), *FAST, "--markers", ",".join(markers), "--out", str(tmp_path / "cli")]) == 0
    )
    rep = diagnose(
        _registered(data_file),
        seeds=2,
        model_kwargs=MODEL,
        train_kwargs=TRAIN,
        markers=markers,
        report_kwargs={"n_lpd_samples": 10},
        out_dir=tmp_path / "lib",
    )
    cli = json.loads((tmp_path / "cli" / "report" / "report.json").read_text())
    lib = json.loads((tmp_path / "lib" / "report" / "report.json").read_text())
    assert _without_timings(lib) == _without_timings(cli)
    assert rep.headline == cli["headline"]
    assert rep.invariants["verdict"].tolist() == [r["verdict"] for r in cli["tables"]["invariants"]]
    # The folder is the command's: called again, every seed is reused and the report is refused without overwrite.
    with pytest.raises(OutputExistsError, match="--overwrite"):
        diagnose(_registered(data_file), seeds=2, model_kwargs=MODEL, train_kwargs=TRAIN, out_dir=tmp_path / "lib")


def test_defaults_are_the_commands_and_bad_arguments_fail_before_fitting(data_file, tmp_path):
    adata = _registered(data_file)
    plan = plan_diagnose(adata, seeds=3).split()
    s = plan.settings
    assert s.seeds == [0, 1, 2] and s.model_kwargs["n_latent"] == 10
    assert s.train_kwargs["early_stopping"] is True
    assert {k: s.train_kwargs[k] for k in DIAGNOSE_STOPPING} == DIAGNOSE_STOPPING
    assert s.train_kwargs["max_epochs"] == 400  # 600,000 cell passes over 225 fit cells, at most 400
    # A small file: a quarter of its 300 cells held out (10% would be 30), and the fits told the share they use.
    assert plan.n_heldout == 75 and s.heldout_fraction == pytest.approx(0.25)
    assert plan.adata_fit.n_obs + plan.n_heldout == adata.n_obs and plan.report_dir is None
    assert plan_diagnose(adata, heldout_fraction=0.1).split().n_heldout == 30
    off = plan_diagnose(adata, train_kwargs={"early_stopping": False})
    assert not set(DIAGNOSE_STOPPING) & set(off.settings.train_kwargs)
    # A settings object and keywords give the same plan; keywords given with it replace its fields.
    given = DiagnoseSettings(seeds=[4, 7], split_seed=3, report_kwargs={"ica": False})
    assert plan_diagnose(adata, settings=given).settings == plan_diagnose(adata, settings=given, seeds=[4, 7]).settings
    assert plan_diagnose(adata, settings=given, seeds=2).settings.seeds == [0, 1]
    assert (
        plan_diagnose(adata, settings=given).settings
        == plan_diagnose(adata, seeds=[4, 7], split_seed=3, report_kwargs={"ica": False}).settings
    )
    with pytest.raises(InvalidArgumentError, match="at least 2"):
        diagnose(adata, seeds=1)
    # a number of seeds as numpy gives it; seeds that are no integers, repeated or a string are refused (floats were
    # truncated, a string read letter by letter, a repeated seed refused only after the warm-up fit)
    assert plan_diagnose(adata, seeds=np.int64(3)).settings.seeds == [0, 1, 2]
    for seeds, message in [
        (-1, "at least 2 to compare fits, got -1"),
        ([0.5, 1.7], r"Every seed must be an integer; got 0\.5"),
        ([0, 0], r"Seeds \[0\] are given more than once"),
        ("3", "seeds must be a sequence of integers"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            plan_diagnose(adata, seeds=seeds)
    with pytest.raises(InvalidArgumentError, match=r"split_seed \(--split-seed\)"):
        plan_diagnose(adata, split_seed=-1)
    with pytest.raises(InvalidArgumentError, match="NOT_A_GENE"):
        diagnose(adata, markers=["NOT_A_GENE"], out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_report_settings_are_checked_before_fitting(data_file, tmp_path):
    adata = _registered(data_file)
    with pytest.raises(InvalidArgumentError, match=r"'n_lpd_sample'\. Did you mean 'n_lpd_samples'"):
        diagnose(adata, report_kwargs={"n_lpd_sample": 10}, out_dir=tmp_path / "x")
    with pytest.raises(InvalidArgumentError, match="n_lpd_samples"):
        diagnose(adata, report_kwargs={"n_lpd_samples": 1}, out_dir=tmp_path / "x")
    with pytest.raises(InvalidArgumentError, match=r"cannot set \['markers'\].*markers="):
        diagnose(adata, report_kwargs={"markers": ["gene0"]}, out_dir=tmp_path / "x")
    with pytest.raises(InvalidArgumentError, match=r"'sede'\. Did you mean 'seeds'"):
        diagnose(adata, sede=3)
    with pytest.raises(SetupError, match=r"not set up; call countvae\.CountVAE\.setup_anndata"):
        diagnose(ad.read_h5ad(data_file), out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_values_given_as_numpy_scalars_or_one_string_are_read_as_meant(data_file):
    """A numpy seed reached torch's manual_seed after every fit; one marker was split into its letters; a float
    number of genes was truncated; DownstreamRequest() (clusters and UMAP only) was refused as a column None."""
    from countvae.diagnostics import DownstreamSettings, ReportSettings

    settings = ReportSettings().replace(seed=np.int64(3), alpha=np.float32(0.1))
    assert type(settings.seed) is int and settings.seed == 3 and type(settings.alpha) is float
    with pytest.raises(InvalidArgumentError, match="seed must be an integer >= 0"):
        ReportSettings().replace(seed=-1)
    adata = _registered(data_file)
    plan = plan_diagnose(adata, seeds=2, markers="gene1", downstream=DownstreamRequest())
    assert plan.settings.markers == ["gene1"]
    with pytest.raises(InvalidArgumentError, match="n_top_genes must be a positive integer or 'all'"):
        plan_diagnose(adata, seeds=2, n_top_genes=12.9)
    # made before any fit: a negative seed and switches that are not booleans were refused after every fit, or not
    for kwargs, message in (
        ({"seed": -1}, "DownstreamSettings seed must be an integer >= 0"),
        ({"batch_correction": 1}, "batch_correction must be True or False"),
        ({"clusters": "no"}, "clusters must be True or False"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            DownstreamSettings(**kwargs)
    assert type(DownstreamSettings(seed=np.int64(2)).seed) is int


def test_de_groups_without_held_out_cells_are_refused_before_fitting(data_file, tmp_path):
    # The DE runs on the held-out cells: a group whose cells all fit the models was refused only after every seed
    # was fitted.
    adata = _registered(data_file)
    fit_idx, _ = heldout_split(adata.n_obs, 0.25, 0)  # diagnose's default split of this 300-cell file
    group = ["b"] * adata.n_obs
    for i in fit_idx[:3]:
        group[i] = "a"
    adata.obs["group"] = group
    request = DownstreamRequest(groupby="group", group1="a", group2="b")
    with pytest.raises(InvalidArgumentError, match=r"--de group: .*single group \(b\).*75 held-out cells"):
        diagnose(adata, seeds=2, downstream=request, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_write_h5ad_naming_a_folder_is_refused_before_fitting(data_file, tmp_path, overwrite):
    # Without overwrite it said "exists; pass --overwrite"; with it, every seed was fitted and then writing the file
    # failed with an IsADirectoryError traceback.
    folder = tmp_path / "taken.h5ad"
    folder.mkdir()
    with pytest.raises(OutputExistsError, match="taken.h5ad is a folder; give --write-h5ad the name of a file"):
        diagnose(_registered(data_file), seeds=2, write_h5ad=folder, overwrite=overwrite, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists() and folder.is_dir()


def test_write_h5ad_at_a_dangling_link_is_refused_before_fitting(data_file, tmp_path, monkeypatch):
    # exists() follows the link: every seed was fitted and the report saved, then the final rename refused the link
    # as "another writer put a file there", and the saved report refused the rerun
    link = tmp_path / "analysed.h5ad"
    link.symlink_to(tmp_path / "nowhere.h5ad")
    monkeypatch.setattr(cv.CountVAE, "train", _never_trains)
    refused = f"^{link} is a symbolic link to the missing path .*nowhere.h5ad; remove it"
    with pytest.raises(OutputExistsError, match=refused):
        diagnose(_registered(data_file), seeds=2, write_h5ad=link, out_dir=tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["analysed.h5ad"] and link.is_symlink()


def test_write_h5ad_at_a_link_loop_is_replaced_with_overwrite_only(data_file, tmp_path):
    """Its check against the report folder followed the link: RuntimeError("Symlink loop from ...")."""
    (tmp_path / "a.h5ad").symlink_to("b.h5ad")
    (tmp_path / "b.h5ad").symlink_to("a.h5ad")
    kwargs = {"seeds": 2, "out_dir": tmp_path / "o", "write_h5ad": tmp_path / "a.h5ad"}
    with pytest.raises(
        OutputExistsError, match=r"a.h5ad is a symbolic link in a loop \(through .*b.h5ad\), .*--overwrite"
    ):
        plan_diagnose(_registered(data_file), **kwargs)
    assert plan_diagnose(_registered(data_file), overwrite=True, **kwargs).h5ad_path == tmp_path / "a.h5ad"


def test_repeated_cell_names_with_write_h5ad_are_refused_before_fitting(data_file, tmp_path):
    """The .h5ad is written by cell name: with two cells of one name every seed was fitted and the report made, then
    the write failed and the report was not saved."""
    adata = ad.read_h5ad(data_file)
    adata.obs_names = [adata.obs_names[0], *adata.obs_names[1:-1], adata.obs_names[0]]
    cv.data.setup_anndata(adata)
    with pytest.raises(InvalidDataError, match=r"names repeat \(1 names, e.g. \['cell0'\]\).*obs_names_make_unique"):
        diagnose(adata, seeds=2, write_h5ad=tmp_path / "a.h5ad", out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_write_h5ad_naming_the_data_file_is_refused_whatever_overwrite_says(data_file, tmp_path, capsys):
    """The error advised --overwrite, which replaced the analyst's file by the chosen genes' copy (400 x 300 became
    400 x 100). The command line reads the file into memory, the library sees it in a backed AnnData."""
    from countvae.cli import main

    data = tmp_path / "data.h5ad"
    data.write_bytes(data_file.read_bytes())
    before = data.read_bytes()
    for extra in ([], ["--overwrite"]):
        argv = ["diagnose", str(data), *FAST, "--no-ica", "--write-h5ad", str(data), "--out", str(tmp_path / "o")]
        assert main([*argv, *extra]) == 1
        assert "is the data file being analysed" in capsys.readouterr().err
    backed = ad.read_h5ad(data, backed="r")
    cv.data.setup_anndata(backed)
    with pytest.raises(OutputExistsError, match="is the data file being analysed"):
        diagnose(backed, seeds=2, write_h5ad=data, overwrite=True, out_dir=tmp_path / "o")
    backed.file.close()
    assert data.read_bytes() == before and not (tmp_path / "o").exists()


def test_results_in_the_data_are_replaced_in_the_analysed_copy_only_with_overwrite(data_file, tmp_path):
    """The analyst's earlier write_results (a 4-d latent, a normalized layer) and a column named like the report's
    were replaced without --overwrite, and the copy kept the other model's layer beside the new record."""
    adata = _registered(data_file)
    adata.obsm["X_countvae"] = np.zeros((adata.n_obs, 4))
    adata.layers["countvae_normalized"] = adata.X.copy()
    adata.obs["countvae_knn_agreement"] = 7.0
    settings = DiagnoseSettings(
        seeds=2,
        model_kwargs=MODEL,
        train_kwargs=TRAIN,
        n_jobs=1,
        out_dir=tmp_path / "x",
        write_h5ad=tmp_path / "a.h5ad",
        report_kwargs={"n_lpd_samples": 10, "ica": False},
    )
    message = r"obsm\['X_countvae'\], layers\['countvae_normalized'\], obs\['countvae_knn_agreement'\].*--overwrite"
    with pytest.raises(OutputExistsError, match=message):
        diagnose(adata, settings=settings)
    assert not (tmp_path / "x").exists()
    diagnose(adata, settings=settings, overwrite=True)
    copy = ad.read_h5ad(tmp_path / "a.h5ad")
    assert copy.obsm["X_countvae"].shape[1] == 2 and "countvae_normalized" not in copy.layers
    assert copy.obs["countvae_knn_agreement"].between(0, 1).all()
    assert adata.obsm["X_countvae"].shape[1] == 4 and (adata.obs["countvae_knn_agreement"] == 7.0).all()


def test_a_gene_seen_only_in_held_out_cells_is_refused_before_the_warm_up(data_file, tmp_path):
    # It was refused only when the fits started, after the command's timed warm-up fit, advising min_cells=3,
    # which does not prevent it.
    adata = _registered(data_file)
    _, heldout_idx = heldout_split(adata.n_obs, 0.25, 0)  # diagnose's default split of this 300-cell file
    counts = adata.X.toarray()
    counts[:, 3] = 0
    counts[heldout_idx[:3], 3] = 1
    adata.X = sp.csr_matrix(counts)
    warmed = []
    with pytest.raises(InvalidDataError, match=r"1 genes have no counts .*detected only in held-out.*min_cells=10"):
        diagnose(adata, seeds=2, out_dir=tmp_path / "x", before_fitting=warmed.append)
    # compare_models too (select's warm-up, without --quiet, failed first with the model's misleading remedy)
    with pytest.raises(InvalidDataError, match=r"1 genes have no counts .*detected only in held-out.*min_cells=10"):
        compare_models(adata, {"n_latent": [2, 3]}, range(2), 0.25, before_fitting=lambda *args: warmed.append(args))
    assert warmed == [] and not (tmp_path / "x").exists()


def test_a_backed_file_has_only_the_warm_up_cells_read_before_fitting(data_file, monkeypatch):
    """On a backed file, split() read every fit cell into memory in the process whose workers read the file
    themselves; now only the warm-up reads cells into memory, its own, and times them as the in-memory warm-up does
    (the fits' reads of the file, timed apart, keep nothing)."""
    from countvae.data import backed
    from countvae.model import estimate_training_time

    read, read_into_memory = [], backed.read_into_memory
    monkeypatch.setattr(backed, "read_into_memory", lambda cells: read.append(cells.n_obs) or read_into_memory(cells))
    adata = ad.read_h5ad(data_file, backed="r")
    cv.data.setup_anndata(adata)
    train = {**TRAIN, "batch_size": 16}  # a warm-up of fewer cells than the fits train on
    plan = plan_diagnose(adata, seeds=2, model_kwargs=MODEL, train_kwargs=train).split()
    assert read == []
    timing = estimate_training_time(plan.adata_fit, plan.settings.model_kwargs, plan.settings.train_kwargs)
    assert read == [timing.warmup_cells] and timing.warmup_cells < plan.adata_fit.n_obs
    in_memory = estimate_training_time(read_into_memory(plan.adata_fit), MODEL, plan.settings.train_kwargs)
    fields = ("epochs", "expected_epochs", "warmup_steps", "warmup_cells")
    assert [getattr(timing, f) for f in fields] == [getattr(in_memory, f) for f in fields]
    adata.file.close()


def test_a_batch_only_held_out_cells_have_is_refused_before_fitting(data_file, tmp_path, capsys):
    # setup_anndata on the whole file registers every batch, so a batch whose cells were all held out was fitted
    # without them and its held-out cells scored with an effect no fit cell trained (diagnose, fit_seeds, fit).
    adata = ad.read_h5ad(data_file)
    _, heldout_idx = heldout_split(adata.n_obs, 0.25, 0)
    batch = np.array(["main"] * adata.n_obs, dtype=object)
    batch[heldout_idx[:2]] = "tiny"
    adata.obs["batch"] = pd.Categorical(batch)
    cv.data.setup_anndata(adata, batch_key="batch")
    message = r"Batch categories \['tiny'\] of adata.obs\['batch'\] have no cell left for fitting"
    with pytest.raises(InvalidDataError, match=message):
        diagnose(adata, seeds=2, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(InvalidDataError, match=message):
        fit_seeds(adata, seeds=[0, 1], heldout_fraction=0.25, out_dir=tmp_path / "y")
    assert not (tmp_path / "y").exists()
    with pytest.raises(InvalidDataError, match=message):  # before compare_models' block before fitting
        compare_models(adata, {"n_latent": [2, 3]}, range(2), 0.25, before_fitting=_never_trains)
    # a batch that no cell of the data has (a subset made after registering) is no concern
    from countvae.diagnostics.fitting.fit_seeds import check_fit_batches

    subset = adata[adata.obs["batch"] == "main"].copy()
    check_fit_batches(subset[:100], cv.data.get_registry(subset), subset)
    path = tmp_path / "tiny.h5ad"
    adata.write_h5ad(path)
    argv = ["fit", str(path), "--batch-key", "batch", "--heldout-fraction", "0.25", "--max-epochs", "1", "--quiet"]
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "z")]) == 1
    assert "Batch categories ['tiny'] of adata.obs['batch'] have no cell left" in capsys.readouterr().err
    assert not (tmp_path / "z").exists()
    # countvae fit refuses a gene seen only in held-out cells as diagnose does, naming the split (the model's error
    # advised a filter_genes(min_counts=1) that keeps the gene)
    counts = adata.X.toarray()
    counts[:, 3] = 0
    counts[heldout_idx[:3], 3] = 1
    adata.obs["batch"] = "main"
    adata.X = sp.csr_matrix(counts)
    adata.write_h5ad(path)
    assert main([*argv, "--out", str(tmp_path / "z")]) == 1
    assert "detected only in held-out cells" in capsys.readouterr().err


def test_a_split_with_fewer_held_out_cells_than_the_report_needs_is_refused_before_fitting(tmp_path):
    # 30 cells hold out 7: the report refused them after every seed was fitted, and the remedy (another
    # --heldout-fraction) was then refused as other settings for the saved fits.
    adata = cv.data.simulate(n_cells=30, n_genes=20, n_latent=2, seed=3)
    cv.data.setup_anndata(adata)
    with pytest.raises(InvalidArgumentError, match=r"keeps 7 of 30 cells; the report needs at least 8. Pass "):
        diagnose(adata, seeds=2, model_kwargs={"n_latent": 2}, report_kwargs={"ica": False}, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    plan = plan_diagnose(
        adata, seeds=2, model_kwargs={"n_latent": 2}, report_kwargs={"ica": False}, heldout_fraction=0.27
    )
    assert plan.split().n_heldout >= 8  # the fraction the message names


def test_too_few_held_out_cells_for_ica_are_refused_before_fitting(tmp_path):
    # An 80-cell file (as Seurat's pbmc_small) holds out 20 cells: the alignment fits each seed's ICA on 10 of them,
    # for 10 latent dimensions, and the report stopped after every seed was fitted ("ICA needs many more cells").
    adata = cv.data.simulate(n_cells=80, n_genes=40, n_latent=2, seed=3)
    cv.data.setup_anndata(adata)
    with pytest.raises(InvalidArgumentError, match=r"on 10 of the 20 held-out cells, fewer than the 12.*--no-ica"):
        diagnose(adata, seeds=2, out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    plan = plan_diagnose(adata, seeds=2, report_kwargs={"ica": False})  # the remedies
    assert plan.settings.model_kwargs["n_latent"] == 10
    assert plan_diagnose(adata, seeds=2, model_kwargs={"n_latent": 8}).settings.report_kwargs == {}


class _Interrupt:
    """A progress hook that interrupts the run once the first seed is stored (as Ctrl-C would)."""

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == ProgressKind.SEED_STORED:
            raise KeyboardInterrupt


def test_an_interrupted_overwrite_run_resumes_from_its_refitted_seeds(data_file, tmp_path):
    # The old report stayed beside the new fits: the rerun was refused ("already holds a finished report"), and the
    # rerun with overwrite discarded the seeds the interrupted run had refitted.
    adata, out = _registered(data_file), tmp_path / "diag"
    settings = DiagnoseSettings(seeds=3, model_kwargs=MODEL, train_kwargs=TRAIN, n_jobs=1, out_dir=out)
    diagnose(adata, settings=settings, report_kwargs={"n_lpd_samples": 10, "ica": False})
    with pytest.raises(KeyboardInterrupt):
        diagnose(adata, settings=settings, train_kwargs={**TRAIN, "lr": 2e-3}, overwrite=True, progress=_Interrupt())
    assert not (out / "report").exists() and sorted(p.name for p in (out / "fits" / "fits").iterdir()) == ["seed_0"]
    seen = []
    diagnose(
        adata,
        settings=settings,
        train_kwargs={**TRAIN, "lr": 2e-3},
        report_kwargs={"n_lpd_samples": 10, "ica": False},
        after_fitting=lambda fits: seen.append(fits.reused_seeds),
    )
    assert seen == [[0]] and (out / "report" / "report.json").is_file()


def test_an_overwrite_that_is_no_bool_is_refused_before_anything_is_discarded(data_file, tmp_path):
    # overwrite="no" is truthy: the finished report was removed and every seed refitted before save refused it
    adata, out = _registered(data_file), tmp_path / "diag"
    settings = DiagnoseSettings(seeds=2, model_kwargs=MODEL, train_kwargs=TRAIN, n_jobs=1, out_dir=out)
    diagnose(adata, settings=settings, report_kwargs={"n_lpd_samples": 10, "ica": False})
    stored = (out / "fits" / "fits" / "seed_0" / "model" / "params.pt").stat().st_mtime_ns
    for value in ("no", 0, None):
        with pytest.raises(InvalidArgumentError, match="overwrite must be True or False"):
            diagnose(adata, settings=settings, overwrite=value)
    assert (out / "report" / "report.json").is_file()
    assert (out / "fits" / "fits" / "seed_0" / "model" / "params.pt").stat().st_mtime_ns == stored


def test_a_run_interrupted_while_writing_the_h5ad_resumes(data_file, tmp_path, monkeypatch):
    # The report was saved before the .h5ad: a run interrupted while writing the .h5ad left a finished report, and
    # the same command was refused ("already holds a finished report"), the only remedy refitting every seed.
    from countvae.diagnostics import diagnosis

    adata, settings = _h5ad_settings(data_file, tmp_path)
    out, h5ad = settings.out_dir, settings.write_h5ad
    write = diagnosis.write_analysed_h5ad

    def interrupted(*args):
        write(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(diagnosis, "write_analysed_h5ad", interrupted)
    with pytest.raises(KeyboardInterrupt):
        diagnose(adata, settings=settings)
    assert not (out / "report").exists() and not h5ad.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".partial", "pending"))]
    monkeypatch.setattr(diagnosis, "write_analysed_h5ad", write)
    seen = []
    diagnose(adata, settings=settings, after_fitting=lambda fits: seen.append(fits.reused_seeds))
    assert seen == [[0, 1]] and (out / "report" / "report.json").is_file()
    assert "countvae_lpd_mean" in ad.read_h5ad(h5ad).obs
    # a full disk while saving the report is told about the report, not about the .h5ad written before it
    from countvae._io import explained_write_errors
    from countvae.diagnostics import DiagnosticReport

    def no_space(self, path, **kwargs):
        with explained_write_errors(Path(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(DiagnosticReport, "save", no_space)
    with pytest.raises(OutputWriteError, match=r"Could not write \S*other[/\\]report: the disk is full"):
        diagnose(adata, settings=settings, out_dir=tmp_path / "other", write_h5ad=tmp_path / "other.h5ad")
    assert not (tmp_path / "other.h5ad").exists() and not list(tmp_path.glob(".other.h5ad*"))


def test_a_file_put_at_the_h5ad_path_while_fitting_is_kept_and_the_result_set_aside(data_file, tmp_path, monkeypatch):
    # Without overwrite, the analysed copy was renamed over a file another writer put at its path during the run (the
    # path was checked only before fitting); two runs also shared one pending name, which each run's clean-up deleted.
    from countvae.diagnostics import diagnosis

    adata, settings = _h5ad_settings(data_file, tmp_path)
    h5ad, write, pending = settings.write_h5ad, diagnosis.write_analysed_h5ad, []

    def recorded(rep, fits, adata, path, overwrite):
        pending.append(path.name)
        write(rep, fits, adata, path, overwrite)

    def another_writer(fits):
        h5ad.write_text("another run's result")

    monkeypatch.setattr(diagnosis, "write_analysed_h5ad", recorded)
    with pytest.raises(OutputExistsError) as info:
        diagnose(adata, settings=settings, train_kwargs={**TRAIN, "max_epochs": 1}, after_fitting=another_writer)
    assert re.fullmatch(r"\.analysed\.h5ad\.countvae-[a-z0-9_]{8}\.partial", pending[0])  # a random part
    (kept,) = tmp_path.glob(".analysed.h5ad.*")
    message = str(info.value)
    assert message.startswith(f"Did not write {h5ad}, which changed while this run was writing: another writer put")
    assert f"this run's result is kept as {kept};" in message and kept.name.endswith(".kept")
    assert h5ad.read_text() == "another run's result" and "countvae_lpd_mean" in ad.read_h5ad(kept).obs
    # The report was saved, so a rerun is refused as finished: the message gave only "decide which to keep", and the
    # analyst had to work out the rename; it now gives the command that finishes the run.
    assert f"The report is saved in {settings.out_dir / 'report'}, so a rerun is refused as finished." in message
    command = re.search(r"To finish, run `([^`]+)`", message).group(1)
    assert command == f"mv -- {shlex.quote(str(kept))} {shlex.quote(str(h5ad))}"
    subprocess.run(shlex.split(command), check=True)
    assert not kept.exists() and "countvae_lpd_mean" in ad.read_h5ad(h5ad).obs


def test_the_commands_that_finish_a_run_refused_at_a_link_to_a_folder_put_the_copy_at_the_path(data_file, tmp_path):
    # A link to a folder put at the path was called "a file", and the message's mv moved the copy into that folder,
    # under its hidden name: the run was not finished, and a rerun was refused as finished.
    adata, settings = _h5ad_settings(data_file, tmp_path)
    h5ad, elsewhere = settings.write_h5ad, tmp_path / "elsewhere"

    def a_link(fits):
        elsewhere.mkdir()
        (elsewhere / "notes.txt").write_text("mine")
        h5ad.symlink_to(elsewhere)

    with pytest.raises(OutputExistsError) as info:
        diagnose(adata, settings=settings, train_kwargs={**TRAIN, "max_epochs": 1}, after_fitting=a_link)
    message = str(info.value)
    assert f"another writer put a symbolic link there (to {elsewhere})" in message and "a file" not in message
    finish = message.split("To finish, ")[1]
    for command in re.findall(r"`([^`]+)`", finish):
        subprocess.run(shlex.split(command), check=True)
    assert not h5ad.is_symlink() and "countvae_lpd_mean" in ad.read_h5ad(h5ad).obs
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.txt"]


def test_the_command_that_finishes_a_refused_run_works_for_a_name_starting_with_a_dash(
    data_file, tmp_path, monkeypatch
):
    # shlex.quote leaves -x.h5ad as it is: "mv .../.-x.h5ad.countvae-<random>.kept -x.h5ad" said "invalid option"
    monkeypatch.chdir(tmp_path)
    adata, settings = _h5ad_settings(data_file, tmp_path)
    h5ad = Path("-x.h5ad")
    with pytest.raises(OutputExistsError) as info:
        diagnose(
            adata,
            settings=settings,
            write_h5ad=h5ad,
            train_kwargs={**TRAIN, "max_epochs": 1},
            after_fitting=lambda fits: h5ad.write_text("another run's result"),
        )
    command = re.search(r"To finish, run `([^`]+)`", str(info.value)).group(1)
    subprocess.run(command, shell=True, check=True)
    assert "countvae_lpd_mean" in ad.read_h5ad(h5ad).obs


def test_a_folder_put_at_the_h5ad_path_during_an_overwrite_run_is_refused_not_replaced(data_file, tmp_path):
    # With overwrite, a folder put at the --write-h5ad path while fitting ended the run, after the report was saved,
    # in a bare IsADirectoryError; the folder is the analyst's and is never replaced.
    adata, settings = _h5ad_settings(data_file, tmp_path)
    h5ad = settings.write_h5ad

    def a_folder(fits):
        h5ad.mkdir()
        (h5ad / "notes.txt").write_text("mine")

    with pytest.raises(OutputExistsError) as info:
        diagnose(
            adata, settings=settings, overwrite=True, train_kwargs={**TRAIN, "max_epochs": 1}, after_fitting=a_folder
        )
    message = str(info.value)
    (kept,) = tmp_path.glob(".analysed.h5ad.*.kept")
    assert message.startswith(
        f"Did not write {h5ad}, which changed while this run was writing: another writer put a folder"
    )
    move = f"mv -- {shlex.quote(str(kept))} {shlex.quote(str(h5ad))}"
    assert f"To finish, move or rename the folder {h5ad}, then run `{move}`." in message
    assert (h5ad / "notes.txt").read_text() == "mine" and "countvae_lpd_mean" in ad.read_h5ad(kept).obs


def _never_trains(*args, **kwargs):
    raise AssertionError("trained before refusing")


def test_copies_that_killed_runs_left_beside_the_h5ad_path_are_named_and_kept(data_file, tmp_path):
    # The docstring said the next run removed them; none did, and each killed run added a hidden full-size copy.
    # No run can tell one from a copy another run is writing now (the path is not locked), so they are named.
    adata, settings = _h5ad_settings(data_file, tmp_path)
    left = [tmp_path / f".analysed.h5ad.countvae-{random}.partial" for random in ("5qi9tvo1", "5hqqr4vk")]
    for path in left:
        path.write_bytes(b"0" * 2**19)
    kept = tmp_path / ".analysed.h5ad.countvae-v00et_ge.kept"  # a copy an error named: the analyst's to judge
    kept.write_bytes(b"0")

    def stop(plan):
        raise KeyboardInterrupt

    with pytest.warns(cv.errors.CountVAEWarning) as record, pytest.raises(KeyboardInterrupt):
        diagnose(adata, settings=settings, before_fitting=stop)
    (message,) = [str(w.message) for w in record if "left beside it" in str(w.message)]
    assert message.startswith("2 copies of analysed.h5ad left beside it by runs killed while writing it (1.0 MiB in")
    assert f"{left[1]}, {left[0]}. No run removes them" in message and str(kept) not in message
    assert all(path.is_file() for path in [*left, kept])


def test_only_leftover_copies_are_counted_sized_and_named_a_few_at_a_time(data_file, tmp_path):
    # A .partial folder was counted at its entry's size (4 KiB for 1 MiB in it), a folder, a link and an .old name were
    # called copies of the file (a run makes only regular .partial files), and 300 leftovers made one 12 KB line.
    adata, settings = _h5ad_settings(data_file, tmp_path)
    left = [tmp_path / f".analysed.h5ad.countvae-{i:08d}.partial" for i in range(5)]
    for path in left:
        path.write_bytes(b"0" * 2**18)
    others = [tmp_path / f".analysed.h5ad.countvae-{name}" for name in ("folder01.partial", "dangling.partial")]
    others.append(tmp_path / ".analysed.h5ad.countvae-replaced.old")
    others[0].mkdir()
    (others[0] / "big").write_bytes(b"0" * 2**20)
    others[1].symlink_to(tmp_path / "gone")
    others[2].write_bytes(b"0" * 2**20)

    def stop(plan):
        raise KeyboardInterrupt

    with pytest.warns(cv.errors.CountVAEWarning) as record, pytest.raises(KeyboardInterrupt):
        diagnose(adata, settings=settings, before_fitting=stop)
    (message,) = [str(w.message) for w in record if "left beside it" in str(w.message)]
    assert message.startswith("5 copies of analysed.h5ad left beside it by runs killed while writing it (1.2 MiB in")
    assert f"{left[0]}, {left[1]}, {left[2]} and 2 more in {tmp_path}. No run removes them" in message
    assert not any(str(path) in message for path in [*left[3:], *others])


def _h5ad_settings(data_file, tmp_path):
    adata, out, h5ad = _registered(data_file), tmp_path / "diag", tmp_path / "analysed.h5ad"
    settings = DiagnoseSettings(
        seeds=2,
        model_kwargs=MODEL,
        train_kwargs=TRAIN,
        n_jobs=1,
        out_dir=out,
        write_h5ad=h5ad,
        report_kwargs={"n_lpd_samples": 10, "ica": False},
    )
    return adata, settings


def test_a_long_legal_h5ad_name_is_written(data_file, tmp_path):
    # A 229- to 255-character --write-h5ad name ended in a raw "File name too long" after every fit: the names of its
    # temporary files ('.<name>.pending', then '..<name>.pending.<random>.partial') exceeded 255 characters.
    adata, settings = _h5ad_settings(data_file, tmp_path)
    h5ad = tmp_path / ("h" * 250 + ".h5ad")
    diagnose(adata, settings=settings, write_h5ad=h5ad)
    assert "countvae_lpd_mean" in ad.read_h5ad(h5ad).obs
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["diag", h5ad.name])


def test_an_h5ad_the_disk_has_no_room_for_is_refused_before_and_after_fitting(data_file, tmp_path, monkeypatch):
    # HDF5 crashed the process (a segmentation fault) when the disk filled while it closed the file, leaving a
    # .partial file and the lock
    from countvae.diagnostics import diagnosis

    adata, settings = _h5ad_settings(data_file, tmp_path)
    out, h5ad = settings.out_dir, settings.write_h5ad
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=2**19))
    with pytest.raises(OutputWriteError) as info:
        diagnose(adata, settings=settings)
    message = str(info.value)
    assert message.startswith(f"Could not write {h5ad}: the analysed copy needs about ") and info.value.errno == 28
    assert "MiB and the disk of" in message and "has 0.5 MiB free. Free disk space" in message
    assert not (out / "fits" / "fits" / "seed_0").exists(), "refused only after fitting"
    # room before fitting, none when the copy is about to be written
    free = iter([usage.free, 2**19])
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=next(free)))
    with pytest.raises(OutputWriteError) as info:
        diagnose(adata, settings=settings)
    message = str(info.value)
    assert message.startswith(f"Could not write {h5ad}: ") and message.endswith("finished results are reused.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diag"] and not (out / "report").exists()
    assert (out / "fits" / "fits" / "seed_1").is_dir()
    assert diagnosis.estimated_h5ad_bytes(adata) > data_file.stat().st_size  # the data and more


def test_a_full_disk_while_writing_the_h5ad_names_the_path_asked_for(data_file, tmp_path, monkeypatch):
    # it named the internal temporary file ".analysed.h5ad.pending"
    from countvae.diagnostics import diagnosis

    adata, settings = _h5ad_settings(data_file, tmp_path)

    def no_space(rep, fits, adata, path, overwrite):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(diagnosis, "write_analysed_h5ad", no_space)
    with pytest.raises(OutputWriteError) as info:
        diagnose(adata, settings=settings)
    assert str(info.value).startswith(f"Could not write {settings.write_h5ad}: the disk is full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diag"]


def test_output_folders_that_cannot_be_written_are_refused_before_fitting(data_file, tmp_path, monkeypatch):
    # A read-only --out ended in a traceback from the lock; a read-only folder for --write-h5ad was found only after
    # every seed was fitted and the report saved, which then refused the rerun without overwrite.
    read_only = tmp_path / "read-only"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == read_only or read_only in self.parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    adata = _registered(data_file)
    with pytest.raises(OutputWriteError, match=r"Could not write .*read-only/diag: the file system is read-only"):
        diagnose(adata, seeds=2, out_dir=read_only / "diag")
    with pytest.raises(OutputWriteError, match=r"Could not write .*read-only/x\.h5ad: the file system is read-only"):
        diagnose(adata, seeds=2, out_dir=tmp_path / "diag", write_h5ad=read_only / "x.h5ad")
    assert not (tmp_path / "diag").exists()


def test_an_h5ad_inside_the_report_folder_is_refused_before_fitting(data_file, tmp_path):
    """Its folder, made for the .h5ad, made the report's save refuse the run after every fit; with overwrite the
    report folder was discarded and the disk check ended in a FileNotFoundError traceback."""
    adata = _registered(data_file)
    out = tmp_path / "o"
    for overwrite in (False, True):
        with pytest.raises(InvalidArgumentError, match=r"lies inside .*report, the report folder diagnose writes"):
            diagnose(adata, seeds=2, out_dir=out, write_h5ad=out / "report" / "a.h5ad", overwrite=overwrite)
    assert not out.exists()


@pytest.mark.parametrize("where", ["report", "fits"])
def test_a_file_where_diagnose_writes_a_folder_is_refused_whatever_overwrite_says(data_file, tmp_path, where):
    """A file named out_dir/report was deleted by overwrite=True without a word (without it, the error advised
    overwrite); beside a file named out_dir/fits, overwrite discarded the earlier report before the fits refused it."""
    adata, out = _registered(data_file), tmp_path / "diag"
    kept = {where: "my notes"}
    if where == "fits":
        kept |= {f"report/report.{ext}": "earlier" for ext in ("html", "json", "md")}
    for name, text in kept.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=f"{where} exists and is not a folder; .*another --out"):
            diagnose(adata, seeds=2, n_jobs=1, out_dir=out, overwrite=overwrite)
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if not p.is_dir()} == kept


@pytest.mark.parametrize("entry", ["file", "dangling link"])
def test_an_out_dir_under_a_file_names_the_file(data_file, tmp_path, entry):
    # diagnose took the run lock on out_dir first, whose mkdir raised the OS's bare NotADirectoryError (FileExistsError
    # of a path that does not exist under a dangling link)
    afile = tmp_path / "afile"
    if entry == "file":
        afile.write_text("mine")
    else:
        afile.symlink_to(tmp_path / "gone")
    refused = "exists and is not a folder" if entry == "file" else "is a symbolic link to the missing path .*gone"
    for out in (afile / "sub", afile):
        so = f", so {out} cannot" if out != afile else "; choose another"
        with pytest.raises(OutputExistsError, match=f"^{afile} {refused}{so}"):
            diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out)
        with pytest.raises(OutputExistsError, match=f"^{afile} {refused}[,;]"):
            compare_models(_registered(data_file), {"n_latent": [2]}, seeds=range(2), n_jobs=1, out_dir=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("kind", ["link", "file"])
def test_overwrite_refuses_a_fits_folder_it_cannot_discard_before_discarding_the_report(data_file, tmp_path, kind):
    """With out_dir/fits/fits a link (the fits on another disk) or a file, overwrite=True deleted the finished report
    and only then refused what it was to discard next."""
    adata, out = _registered(data_file), tmp_path / "diag"
    report = {f"report.{ext}": "earlier" for ext in ("html", "json", "md")}
    (out / "report").mkdir(parents=True)
    for name, text in report.items():
        (out / "report" / name).write_text(text)
    (out / "fits").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "link":
        (out / "fits" / "fits").symlink_to(elsewhere)
    else:
        (out / "fits" / "fits").write_text("my notes")
    refused = "is a symbolic link" if kind == "link" else "exists and is not a folder"
    with pytest.raises(OutputExistsError, match=f"fits/fits {refused}"):
        diagnose(adata, seeds=2, n_jobs=1, out_dir=out, overwrite=True)
    assert {p.name: p.read_text() for p in (out / "report").iterdir()} == report
    assert sorted(p.name for p in out.iterdir()) == ["fits", "report"]


def _never(*args):
    raise AssertionError("the run went on to its block and warm-up")


def test_a_dangling_link_at_the_fits_folder_is_refused_before_any_work(data_file, tmp_path):
    """A link to a missing path at out_dir/fits was refused only after the block and its warm-up, and with overwrite
    after the finished report was deleted; compare_models refused one above a candidate's folder after its block."""
    out = tmp_path / "diag"
    report = {f"report.{ext}": "earlier" for ext in ("html", "json", "md")}
    (out / "report").mkdir(parents=True)
    for name, text in report.items():
        (out / "report" / name).write_text(text)
    (out / "fits").symlink_to(tmp_path / "gone")
    refused = f"^{out / 'fits'} is a symbolic link to the missing path .*gone"
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=refused):
            diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out, overwrite=overwrite, before_fitting=_never)
    assert {p.name: p.read_text() for p in (out / "report").iterdir()} == report
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=refused + ", so .* cannot be made"):
            compare_models(
                _registered(data_file),
                {"n_latent": [2]},
                seeds=range(2),
                n_jobs=1,
                out_dir=out / "fits",
                overwrite=overwrite,
                before_fitting=_never,
            )
    assert sorted(p.name for p in out.iterdir()) == ["fits", "report"]


@pytest.mark.parametrize("entry", ["nothing", "a folder report.json", "a report.json"])
def test_only_a_report_folder_holding_report_json_is_called_a_finished_report(data_file, tmp_path, entry):
    """An empty report folder, or one holding a folder report.json, was refused as "a finished report" with the advice
    to pass overwrite, which then refused the folder report.json."""
    report_dir = tmp_path / "diag" / "report"
    report_dir.mkdir(parents=True)
    if entry == "a folder report.json":
        (report_dir / "report.json").mkdir()
    elif entry == "a report.json":
        (report_dir / "report.json").write_text("{}")
    said = {
        "nothing": "already exists and holds no finished report \\(no report.json\\). Remove it",
        "a folder report.json": "holds report.json/, which a report folder does not hold; .* Move them out",
        "a report.json": "already holds a finished report; pass --overwrite",
    }
    with pytest.raises(OutputExistsError, match=f"^{report_dir} {said[entry]}"):
        diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=tmp_path / "diag", before_fitting=_never)


def test_the_remedy_for_a_report_folder_without_a_report_resumes_from_the_stored_fits(data_file, tmp_path, monkeypatch):
    """An empty report folder was refused with --overwrite as the only remedy, which discards the stored fits; the
    message now gives the command that removes the folder alone, after which the run goes on to fit (or resume)."""
    from countvae.diagnostics import diagnosis

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # the seeds are stored, the report not made

    monkeypatch.setattr(diagnosis, "report", stop)
    out = tmp_path / "diag"
    run = {"seeds": 2, "n_jobs": 1, "train_kwargs": {"max_epochs": 1}, "out_dir": out}
    with pytest.raises(KeyboardInterrupt):
        diagnose(_registered(data_file), **run)
    stored = (out / "fits" / "fits" / "seed_0" / "fit.json").read_bytes()
    (out / "report").mkdir()
    with pytest.raises(OutputExistsError) as info:
        diagnose(_registered(data_file), **run, before_fitting=_never)
    assert "--overwrite to refit every seed" in str(info.value)
    (command,) = re.findall(r"`(rm -r -- [^`]+)`", str(info.value))
    subprocess.run(command, shell=True, check=True)
    with pytest.raises(AssertionError, match="went on to its block"):
        diagnose(_registered(data_file), **run, before_fitting=_never)
    assert (out / "fits" / "fits" / "seed_0" / "fit.json").read_bytes() == stored


@pytest.mark.parametrize("name", ["manifest.json", ".lock", ".lock.owner.json"])
def test_a_folder_at_a_file_of_the_fits_folder_is_refused_before_anything_is_discarded(data_file, tmp_path, name):
    """A folder at out_dir/fits/manifest.json was refused, with overwrite, only after the report and the stored fits
    were deleted; without it, after the block, as a folder holding "['manifest.json'] and no manifest.json"."""
    out = tmp_path / "diag"
    kept = {f"report/report.{ext}": "earlier" for ext in ("html", "json", "md")}
    kept |= {"fits/fits/seed_0/fit.json": "{}", f"fits/{name}/notes.txt": "mine"}
    for path, text in kept.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
    refused = f"^{out / 'fits' / name} is a folder; a file is written there"
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=refused):
            diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out, overwrite=overwrite, before_fitting=_never)
        with pytest.raises(OutputExistsError, match=refused):
            fit_seeds(_registered(data_file), seeds=range(2), n_jobs=1, out_dir=out / "fits", overwrite=overwrite)
    assert {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()} == kept


def test_a_fits_folder_whose_manifest_is_no_file_says_so(data_file, tmp_path):
    root = tmp_path / "fits"
    root.mkdir()
    (root / "manifest.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(OutputExistsError, match=r"holds \['manifest.json'\]; manifest.json is not a file\); choose"):
        fit_seeds(_registered(data_file), seeds=range(2), n_jobs=1, out_dir=root)


@pytest.mark.parametrize("view", [False, True])
def test_the_size_estimate_of_a_backed_file_is_that_of_its_uncompressed_cells(tmp_path, view):
    """A backed X was counted as the file's size: a third of the copy written from a gzip file, and the whole file
    for a view of a few of its cells. The estimate is meant to be at or above the size written, within a few times."""
    from countvae.diagnostics import diagnosis

    dense = cv.data.simulate(n_cells=2000, n_genes=300, n_latent=2, seed=1)
    dense.X = sp.csr_matrix(dense.X)
    path = tmp_path / "gzip.h5ad"
    dense.write_h5ad(path, compression="gzip")
    backed = ad.read_h5ad(path, backed="r")
    cells = backed[:500] if view else backed
    estimate = diagnosis.estimated_h5ad_bytes(cells)
    # a folder not made yet is measured at its nearest existing parent (it raised FileNotFoundError)
    diagnosis.refuse_without_room(tmp_path / "not" / "yet" / "a.h5ad", cells)
    written = tmp_path / "copy.h5ad"
    cells.to_memory().write_h5ad(written)
    ratio = estimate / written.stat().st_size
    assert 1.0 <= ratio <= 3.0, ratio


def _store_fake_seed(out: Path) -> Path:
    """A stored seed's folder as the output folder holds it (only its name counts here)."""
    record = out / "fits" / "fits" / "seed_0" / "fit.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    return record


def test_stored_fits_without_their_manifest_are_refused_not_discarded(data_file, tmp_path):
    """Stored fits whose manifest was missing (deleted, or a folder at its path moved aside as the refusal advised)
    were deleted and refitted without a word; they are refused before any work, and discarded only with overwrite."""
    out = tmp_path / "diag"
    record = _store_fake_seed(out)
    refused = r"holds 1 stored fit but .* has no manifest.json.*restore .*--overwrite"
    with pytest.raises(OutputExistsError, match=refused):
        diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out, before_fitting=_never)
    with pytest.raises(OutputExistsError, match=refused):
        fit_seeds(
            _registered(data_file), seeds=range(2), n_jobs=1, out_dir=out / "fits", train_kwargs={"max_epochs": 1}
        )
    assert record.read_text() == "{}"
    with pytest.raises(AssertionError, match="went on to its block"):
        diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out, overwrite=True, before_fitting=_never)


def test_the_analysed_copy_refusals_say_overwrite_discards_the_stored_fits_and_give_a_remedy_that_keeps_them(
    data_file, tmp_path
):
    """The refusals of an existing --write-h5ad file and of results in the data advised --overwrite "to replace it
    in the copy" alone, which also discards and refits every stored seed; they say so, and the file's own remedy
    (`rm -- FILE`), followed, lets the run go on with the stored fits kept."""
    out = tmp_path / "diag"
    record = _store_fake_seed(out)
    (out / "fits" / "laplace" / "fits" / "seed_0").mkdir(parents=True)  # --restrictions' fits, which it keeps
    copy = tmp_path / "-copy.h5ad"
    copy.write_text("earlier")
    discards = f"also discards the 1 fit stored in {out / 'fits' / 'fits'}, and fits this run's seeds afresh"
    with pytest.raises(OutputExistsError, match=re.escape(discards)) as info:
        diagnose(_registered(data_file), seeds=2, n_jobs=1, out_dir=out, write_h5ad=copy, before_fitting=_never)
    (command,) = re.findall(r"`(rm -- [^`]+)`", str(info.value))
    subprocess.run(command, shell=True, check=True, cwd=tmp_path)
    assert not copy.exists() and record.read_text() == "{}"
    adata = _registered(data_file)
    adata.obsm["X_countvae"] = np.zeros((adata.n_obs, 2))
    with pytest.raises(OutputExistsError, match=r"already hold countvae results.*also discards the 1 fit stored"):
        diagnose(adata, seeds=2, n_jobs=1, out_dir=out, write_h5ad=copy, before_fitting=_never)
    with pytest.raises(OutputExistsError, match="already hold countvae results.*not changed\\)\\.$"):
        diagnose(adata, seeds=2, n_jobs=1, out_dir=tmp_path / "new", write_h5ad=copy, before_fitting=_never)


def test_stored_seeds_are_only_the_folders_a_run_stores_and_leftovers_of_killed_writes_are_no_foreign_entries(
    tmp_path,
):
    """A copy named seed_02 was read as seed 2's fit (seed_2 does not exist), so a resume was refused naming a
    missing folder; a manifest or fits folder left half-written by a killed run made the folder "not a fit_seeds
    output folder", and a fits folder moved aside by a killed overwrite stayed on disk for good."""
    from countvae.diagnostics.fitting import output_folder

    root = tmp_path / "fits"
    for name in ("seed_0", "seed_02", "seed_12", "seed_x", "seed_\u00b2", "seed_-1"):
        (root / "fits" / name).mkdir(parents=True)
    assert output_folder.stored_seeds(root / "fits") == [0, 12]
    shutil.rmtree(root / "fits")
    leftovers = [root / ".manifest.json.countvae-abcd1234.partial", root / ".fits.countvae-abcd_234.old"]
    leftovers[0].parent.mkdir(parents=True, exist_ok=True)
    leftovers[0].write_text("{")
    leftovers[1].mkdir()
    output_folder.refuse_unrecorded_fits(root)  # leftovers only: no refusal
    output_folder.prepare(root, {"settings": {}}, overwrite=False)
    assert not any(p.exists() for p in leftovers) and (root / "manifest.json").is_file()
    (root / "manifest.json").unlink()
    (root / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"not a fit_seeds output folder \(it holds \['notes.txt'\]"):
        output_folder.refuse_unrecorded_fits(root)


def test_marker_genes_of_a_backed_file_are_checked_by_name_before_the_block(data_file):
    """On a backed file the marker check read the counts through scipy and failed with a raw ValueError ("does not
    support dtype object") before any fitting; the genes are now checked by name (their values are read later, on
    the report's cells)."""
    adata = ad.read_h5ad(data_file, backed="r")
    cv.data.setup_anndata(adata)
    gene = str(adata.var_names[0])
    with pytest.raises(AssertionError, match="went on to its block"):
        diagnose(adata, seeds=2, n_jobs=1, markers=[gene], before_fitting=_never)
    with pytest.raises(InvalidArgumentError, match=r"Markers \['nosuchgene'\] are neither genes"):
        diagnose(adata, seeds=2, n_jobs=1, markers=[gene, "nosuchgene"], before_fitting=_never)
    for data in (adata, _registered(data_file)):  # an empty list was let through to the report, after every fit
        with pytest.raises(InvalidArgumentError, match="markers is empty"):
            diagnose(data, seeds=2, n_jobs=1, markers=[], before_fitting=_never)
        # neither a name nor a list: refused as report refuses it, not a raw TypeError
        with pytest.raises(InvalidArgumentError, match="markers must be a gene or obs column name, or a list of them"):
            diagnose(data, seeds=2, n_jobs=1, markers=5, before_fitting=_never)
