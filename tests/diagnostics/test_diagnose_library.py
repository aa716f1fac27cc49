"""``countvae.diagnostics.diagnose``: the library call that the ``countvae diagnose`` command runs."""

from __future__ import annotations

import json

import anndata as ad
import pytest

import countvae as cv
from countvae.cli import main
from countvae.diagnostics import DIAGNOSE_STOPPING, DiagnoseSettings, diagnose, plan_diagnose
from countvae.errors import InvalidArgumentError, OutputExistsError, SetupError

FAST = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "5", "--n-lpd-samples", "10"]
#: What the command line above gives the fits (the command's defaults for the options not named).
MODEL = {"n_latent": 2, "likelihood": "nb", "decoder": "linear", "n_hidden": 128, "n_layers": 1}
TRAIN = {"max_epochs": 5, "batch_size": 128, "lr": 1e-3}


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
