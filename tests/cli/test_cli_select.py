"""``countvae select``: parse the grid, call compare_models, save the comparison; refuse bad input with exit 1."""

from __future__ import annotations

import json

import pytest

import countvae as cv
from countvae.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("select") / "d.h5ad"
    cv.data.simulate(n_cells=200, n_genes=30, n_latent=2, decoder="linear", seed=0).write_h5ad(path)
    return path


def test_select_writes_the_comparison_and_resumes(data, tmp_path, capsys):
    out = tmp_path / "sel"
    args = ["select", str(data), "--n-latent", "1,2", "--decoder", "linear", "--seeds", "2", "--max-epochs", "3"]
    args += ["--n-samples", "10", "--out", str(out), "--json", "--quiet"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"recommended", "rule", "margin_nats_per_cell", "out"}
    assert result["rule"].startswith("Recommended: the smallest candidate")
    assert sorted(p.name for p in (out / "comparison").iterdir()) == [
        "comparison.html",
        "comparison.json",
        "comparison.md",
    ]
    assert sorted(p.name for p in (out / "fits").iterdir()) == [
        "n_latent=1__decoder=linear__likelihood=nb",
        "n_latent=2__decoder=linear__likelihood=nb",
    ]
    # the same command again refuses to overwrite the comparison
    assert main(args) == 1
    assert "already exists" in capsys.readouterr().err
    # --overwrite refits with other settings (it replaced only the comparison, and the recorded fits refused the run)
    changed = [*args[: args.index("--max-epochs") + 1], "4", *args[args.index("--max-epochs") + 2 :]]
    assert main([*changed, "--overwrite"]) == 0, capsys.readouterr().err
    fit_record = next((out / "fits" / "n_latent=1__decoder=linear__likelihood=nb").rglob("manifest.json"))
    assert '"max_epochs": 4' in fit_record.read_text()


def test_select_help_and_bad_grids(data, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["select", "--help"])
    assert "--n-latent" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["select", str(data), "--n-latent", "two"])
    assert exc.value.code == 2
    assert main(["select", str(data), "--seeds", "1", "--out", str(tmp_path / "x"), "--quiet"]) == 1
    assert "at least 2 seeds" in capsys.readouterr().err
    assert main(["select", str(data), "--n-latent", "30", "--out", str(tmp_path / "y"), "--quiet"]) == 1
    assert "data allow fewer than" in capsys.readouterr().err


def test_select_refuses_a_file_as_out_and_bad_numbers_before_fitting_in_one_line(data, tmp_path, capsys):
    # --out naming a file ended in a NotADirectoryError traceback; --heldout-fraction 1.5 said
    # "first_fraction must be a number in (0, 1], got -0.5".
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    fast = ["--n-latent", "1", "--decoder", "linear", "--seeds", "2", "--max-epochs", "2", "--quiet"]
    assert main(["select", str(data), *fast, "--out", str(taken), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("countvae select: error: ") and "is not a folder; choose another --out" in err
    assert taken.read_text() == "mine"
    assert main(["select", str(data), *fast, "--out", str(tmp_path / "s"), "--heldout-fraction", "1.5"]) == 1
    err = capsys.readouterr().err
    assert "error: --heldout-fraction must be a number in (0, 1), got 1.5" in err and len(err.strip().splitlines()) == 1
    assert main(["select", str(data), *fast, "--out", str(tmp_path / "m"), "--max-heldout-cells", "38"]) == 1
    err = capsys.readouterr().err
    assert "error: --max-heldout-cells must be an integer >= 39, got 38" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m" / "fits").exists()
    # refused as a wrong command line, naming this option (the library's error named compare_models' n_lpd_samples)
    with pytest.raises(SystemExit) as stop:
        main(["select", str(data), *fast, "--out", str(tmp_path / "n"), "--n-samples", "1"])
    assert stop.value.code == 2
    assert "argument --n-samples: must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "n").exists()


class _Stop(Exception):
    pass


@pytest.mark.parametrize("flag", [None, "--early-stopping"])
def test_select_trains_each_candidate_for_the_diagnose_budget(data, tmp_path, monkeypatch, flag):
    from countvae.diagnostics import DIAGNOSE_STOPPING
    from countvae.diagnostics.fitting.default_training import default_epochs
    from countvae.diagnostics.reporting import compare_models

    seen = {}

    def record(adata, runs):
        seen.update(runs[0].train_kwargs)
        raise _Stop

    monkeypatch.setattr(compare_models, "fit_models", record)
    args = ["select", str(data), "--n-latent", "1,2", "--out", str(tmp_path / "s"), "--quiet"]
    with pytest.raises(_Stop):
        main(args + ([flag] if flag else []))
    assert seen["max_epochs"] == default_epochs(180)  # 200 cells, 10% held out: the diagnose budget, capped at 400
    assert seen["batch_size"] == 128
    if flag is None:  # off by default: the model's own defaults apply (lr 1e-3 among them)
        assert seen["early_stopping"] is False
        assert not set(DIAGNOSE_STOPPING) & set(seen)
    else:
        assert seen["early_stopping"] is True
        assert {k: seen[k] for k in DIAGNOSE_STOPPING} == DIAGNOSE_STOPPING


def test_select_grids_over_likelihood_and_prior_on_the_chosen_backend(data, tmp_path, monkeypatch):
    from countvae.diagnostics.reporting import compare_models

    seen = {}

    def record(adata, runs):
        seen["candidates"] = [run.model_kwargs for run in runs]
        seen["backend"] = {run.backend for run in runs}
        raise _Stop

    monkeypatch.setattr(compare_models, "fit_models", record)
    args = ["select", str(data), "--n-latent", "2", "--decoder", "mlp", "--likelihood", "nb,zinb"]
    args += ["--prior", "normal,laplace", "--backend", "ray", "--out", str(tmp_path / "s"), "--quiet"]
    with pytest.raises(_Stop):
        main(args)
    assert seen["backend"] == {"ray"}
    got = {(c["likelihood"], c["prior"]) for c in seen["candidates"]}
    assert got == {("nb", "normal"), ("nb", "laplace"), ("zinb", "normal"), ("zinb", "laplace")}


@pytest.mark.parametrize("flag,value", [("--prior", "cauchy"), ("--likelihood", "nb,gaussian"), ("--decoder", "cnn")])
def test_select_refuses_unknown_settings_before_reading_the_data(data, flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["select", str(data), flag, value])
    assert exc.value.code == 2
    assert "unknown value" in capsys.readouterr().err


def test_select_refuses_a_folder_another_run_is_writing(data, tmp_path, capsys):
    """The whole run holds ``--out``: a second run stops at once, naming the first, before it fits or saves."""
    import os

    from countvae.diagnostics.fitting.run_lock import locked

    out = tmp_path / "sel"
    args = ["select", str(data), "--n-latent", "1", "--decoder", "linear", "--seeds", "2", "--max-epochs", "2"]
    with locked(out):  # stands for a first run, fitting or saving
        assert main([*args, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "is being written by another run" in err and f"pid {os.getpid()}" in err
    assert not (out / "fits").exists() and not (out / "comparison").exists()
