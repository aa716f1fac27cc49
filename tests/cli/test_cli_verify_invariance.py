"""The ``countvae verify-invariance`` command."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import countvae as cv
from countvae.cli import main

FAST_CHECK = ["--max-cells", "60", "--n-samples", "60", "--elbo-refit-steps", "0", "--quiet"]
FAST = ["--max-epochs", "30", *FAST_CHECK]


@pytest.fixture(scope="module")
def h5ad(tmp_path_factory):
    adata = cv.data.simulate(n_cells=400, n_genes=30, n_latent=2, likelihood="poisson", library_size=300, seed=4)
    path = tmp_path_factory.mktemp("data") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def test_embedded_default_writes_the_report_folder(tmp_path, capsys):
    out = tmp_path / "inv"
    assert main(["verify-invariance", "--out", str(out), *FAST, "--no-prior-controls"]) == 0
    printed = capsys.readouterr().out
    assert (
        "VERIFIED NUMERICALLY" in printed and "rotation" in printed and str(out / "report" / "report.html") in printed
    )
    # the files InvarianceReport.save writes, and nothing else, in OUT/report
    assert sorted(p.name for p in (out / "report").iterdir()) == ["report.html", "report.json", "report.md"]
    record = json.loads((out / "report" / "report.json").read_text())
    assert record["passed"] is True and record["status"] == "verified numerically"
    run = record["settings"]["run"]
    assert run["data"] == "embedded simulation" and run["n_heldout_evaluated"] == 60
    assert record["settings"]["quadrature"] is True
    md = (out / "report" / "report.md").read_text()
    assert md.startswith("# Rotation invariance check") and "CRN max \\|diff\\|" in md
    page = (out / "report" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "embedded simulation" in page
    assert (out / "model" / "model.json").is_file()
    # the folder exists now: a second run refuses it with a one-line error
    assert main(["verify-invariance", "--out", str(out), *FAST]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and err.strip().count("\n") == 0


def test_saved_model_and_json_output(h5ad, tmp_path, capsys):
    assert (
        main(
            [
                "fit",
                str(h5ad),
                "--n-latent",
                "2",
                "--decoder",
                "linear",
                "--likelihood",
                "poisson",
                "--max-epochs",
                "20",
                "--n-samples",
                "20",
                "--n-top-genes",
                "25",
                "--out",
                str(tmp_path / "fit"),
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    # the model has the 25 genes fit chose; verify-invariance reads those of the file (it refused the other 5)
    args = ["verify-invariance", str(h5ad), "--model", str(tmp_path / "fit" / "model"), "--out", str(tmp_path / "v")]
    assert main([*args, *FAST, "--json"]) == 1  # --max-epochs sets the model fitted without --model
    assert "--max-epochs set the model this command fits without --model" in capsys.readouterr().err
    assert main([*args, *FAST_CHECK, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["passed"] is True
    run = json.loads((tmp_path / "v" / "report" / "report.json").read_text())["settings"]["run"]
    assert run["model"].endswith("model") and not (tmp_path / "v" / "model").exists()
    # the held-out cells are those `countvae fit` held out (same split function, fraction and seed)
    held = cv.data.split_indices(400, 0.9, 0)[1]
    assert run["n_heldout_evaluated"] == min(60, len(held))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--heldout-fraction", "0"], "--heldout-fraction"),
        (["--n-samples", "1"], "--n-samples"),
        (["--model", "/nonexistent/model"], "not a model folder"),
    ],
)
def test_bad_input_is_one_line_exit_1(h5ad, tmp_path, capsys, extra, message):
    assert main(["verify-invariance", str(h5ad), "--out", str(tmp_path / "o"), *FAST_CHECK, *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()


def test_genes_mismatch_with_saved_model(h5ad, tmp_path, capsys):
    other = cv.data.simulate(n_cells=200, n_genes=25, n_latent=2, seed=9)
    cv.CountVAE.setup_anndata(other)
    model = cv.CountVAE(other, n_latent=2, decoder="linear")
    model.train(max_epochs=1, progress_bar=False)
    model.save(tmp_path / "m")
    rc = main(
        ["verify-invariance", str(h5ad), "--model", str(tmp_path / "m"), "--out", str(tmp_path / "o"), *FAST_CHECK]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "genes" in err and err.strip().count("\n") == 0


def test_an_unverified_result_exits_1_with_the_reason(tmp_path, capsys, monkeypatch):
    import importlib

    module = importlib.import_module("countvae.invariance.verification")
    real_verify = module.verify
    # a node budget too small for the quadrature to converge: the evidence is not sound
    monkeypatch.setattr(
        importlib.import_module("countvae.cli.verify_invariance"),
        "verify",
        lambda *args, **kwargs: real_verify(*args, **{**kwargs, "quadrature_max_nodes": 17}),
    )
    rc = main(["verify-invariance", "--out", str(tmp_path / "o"), *FAST, "--no-prior-controls", "--no-controls"])
    captured = capsys.readouterr()
    assert rc == 1 and "NOT VERIFIED" in captured.out
    assert "not verified: " in captured.err and "quadrature_max_nodes" in captured.err
    assert captured.err.strip().count("\n") == 0
    assert json.loads((tmp_path / "o" / "report" / "report.json").read_text())["status"] == "not verified"


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["verify-invariance", "--help"])
    text = capsys.readouterr().out
    assert "--model" in text and "latent dimensions (default: 2)" in text and "OUT/report/report.html" in text


def test_a_failed_check_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import importlib

    module = importlib.import_module("countvae.invariance.verification")
    monkeypatch.setattr(module, "prior_preserves", lambda prior, A, atol=1e-8: True)  # a wrong theory
    rc = main(["verify-invariance", "--out", str(tmp_path / "o"), *FAST, "--no-prior-controls"])
    captured = capsys.readouterr()
    assert rc == 1 and "FAILED" in captured.out
    assert "checks disagree with the theory" in captured.err and captured.err.strip().count("\n") == 0
    assert json.loads((tmp_path / "o" / "report" / "report.json").read_text())["passed"] is False
    assert str(tmp_path / "o" / "report" / "report.md") in captured.err


@pytest.fixture(scope="module")
def model_folder(h5ad, tmp_path_factory):
    """A project folder holding a model of the data's genes, briefly trained, in ``model/``."""
    import anndata as ad

    adata = ad.read_h5ad(h5ad)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, decoder="linear", likelihood="poisson")
    model.train(max_epochs=1, progress_bar=False)
    folder = tmp_path_factory.mktemp("project")
    model.save(folder / "model")
    return folder


@pytest.mark.parametrize(
    "given",
    [
        ["--n-latent", "2"],
        ["--likelihood", "poisson"],
        ["--decoder", "linear"],
        ["--n-hidden", "128"],
        ["--batch-size", "128"],
        ["--early-stopping"],
        ["--no-early-stopping"],  # was named --early-stopping, the option not given
    ],
)
def test_with_model_a_model_option_is_refused_even_at_its_default(h5ad, model_folder, tmp_path, capsys, given):
    # options equal to the command's defaults were silently ignored; only other values were refused
    args = ["verify-invariance", str(h5ad), "--model", str(model_folder / "model"), "--out", str(tmp_path / "v")]
    assert main([*args, *FAST_CHECK, *given]) == 1
    err = capsys.readouterr().err
    assert f"{given[0]} set the model this command fits without --model" in err and err.count("\n") == 1
    assert not (tmp_path / "v").exists()


def test_help_shows_the_epochs_the_command_trains():
    """The help said "as scvi-tools, from the data size"; the model fitted without --model trains 100 epochs."""
    from countvae.cli import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["verify-invariance"].format_help().split())
    assert "training epochs (default: 100)" in text


def test_overwrite_refuses_an_out_holding_other_files_first(h5ad, model_folder, tmp_path, capsys, monkeypatch):
    # --overwrite replaced --out whole: a file the command never writes, kept in it, was deleted
    out = tmp_path / "inv"
    (out / "report").mkdir(parents=True)
    (out / "report" / "notes.txt").write_text("the analyst's")

    def verify(*args, **kwargs):
        raise AssertionError("the command checked the model before refusing --out")

    monkeypatch.setattr("countvae.cli.verify_invariance.verify", verify)
    args = ["verify-invariance", str(h5ad), "--model", str(model_folder / "model"), "--out", str(out), "--overwrite"]
    assert main([*args, *FAST_CHECK]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"countvae verify-invariance: error: {out} holds report/notes.txt, which a `countvae verify-invariance` output "
    )
    assert "another --out" in err and (out / "report" / "notes.txt").read_text() == "the analyst's"


def test_overwrite_replaces_an_earlier_release_output(h5ad, model_folder, tmp_path):
    """An --out an earlier release wrote (invariance.json and invariance.md beside model/) is still replaced."""
    out = tmp_path / "inv"
    out.mkdir()
    for name in ("invariance.json", "invariance.md"):
        (out / name).write_text("old")
    args = ["verify-invariance", str(h5ad), "--model", str(model_folder / "model"), "--out", str(out), "--overwrite"]
    main([*args, *FAST_CHECK])
    assert [p.name for p in out.iterdir()] == ["report"]


def test_an_out_holding_the_model_is_refused_before_any_work(h5ad, model_folder, capsys):
    # --out DIR --overwrite with --model DIR/model replaced DIR: the model being checked was deleted
    model = model_folder / "model"
    args = ["verify-invariance", str(h5ad), "--model", str(model), "--out", str(model_folder), "--overwrite"]
    assert main([*args, *FAST_CHECK]) == 1
    assert capsys.readouterr().err == (
        f"countvae verify-invariance: error: --out {model_folder} holds the --model folder {model}; this command "
        f"replaces {model_folder} whole, so it would be deleted. Choose another --out (a new folder).\n"
    )
    assert (model / "model.json").is_file() and (model / "params.pt").is_file()


def test_with_model_use_raw_takes_the_models_genes_from_raw(tmp_path, capsys):
    adata = cv.data.simulate(n_cells=400, n_genes=30, n_latent=2, likelihood="poisson", library_size=300, seed=4)
    adata.raw = adata  # scanpy's layout: raw counts in .raw, normalized values in .X
    adata.X = adata.X.multiply(1e4 / adata.X.sum(axis=1)).tocsr()
    path = tmp_path / "norm.h5ad"
    adata.write_h5ad(path)
    fit = ["fit", str(path), "--use-raw", "--n-top-genes", "20", "--n-latent", "2", "--decoder", "linear"]
    fit += ["--likelihood", "poisson", "--max-epochs", "20", "--n-samples", "20", "--quiet"]
    assert main([*fit, "--out", str(tmp_path / "fit")]) == 0
    args = ["verify-invariance", str(path), "--model", str(tmp_path / "fit" / "model"), *FAST_CHECK]
    assert main([*args, "--out", str(tmp_path / "v")]) == 1
    assert "--use-raw when they are in adata.raw" in capsys.readouterr().err
    capsys.readouterr()
    # with a layer too, the pair is refused as such (the raw counts had replaced the data, whose layer then was "not
    # in adata.layers")
    assert main([*args, "--use-raw", "--layer", "counts", "--out", str(tmp_path / "w")]) == 1
    assert "either --layer" in capsys.readouterr().err
    assert main([*args, "--use-raw", "--out", str(tmp_path / "v")]) == 0, capsys.readouterr().err


def test_a_briefly_trained_nb_model_passes_every_orthogonal_check(tmp_path, capsys):
    """An NB model fitted 2 epochs (dispersion still large, so the posterior is near the prior): every orthogonal map
    agrees and the Laplace prior's rotation changes log p(x) too little to see. That control was reported as "1 checks
    disagree with the theory"; it is inconclusive now, and the run "not verified" with the reason and what to do."""
    adata = cv.data.simulate(n_cells=400, n_genes=30, n_latent=2, likelihood="poisson", library_size=300, seed=4)
    adata.raw = adata
    adata.X = adata.X.multiply(1e4 / adata.X.sum(axis=1)).tocsr()
    path = tmp_path / "norm.h5ad"
    adata.write_h5ad(path)
    fit = ["fit", str(path), "--use-raw", "--n-top-genes", "20", "--n-latent", "2", "--decoder", "linear"]
    assert main([*fit, "--likelihood", "nb", "--max-epochs", "2", "--quiet", "--out", str(tmp_path / "fit")]) == 0
    capsys.readouterr()
    args = ["verify-invariance", str(path), "--model", str(tmp_path / "fit" / "model"), "--use-raw", *FAST_CHECK]
    assert main([*args, "--out", str(tmp_path / "v")]) == 1
    out, err = capsys.readouterr()
    assert "disagree" not in err and "not verified: control: laplace prior / rotation: inconclusive" in err
    # its remedies in the command's options, on stderr and in the summary on stdout
    assert "(a larger --n-samples VALUE), or leave the control out: --no-prior-controls drops" in err
    assert "prior_controls=False" not in err + out and "n_samples=" not in err + out
    assert "--no-prior-controls drops the prior controls and --no-controls the map controls" in out
    record = json.loads((tmp_path / "v" / "report" / "report.json").read_text())
    assert record["status"] == "not verified"
    verdicts = pd.DataFrame(record["verdicts"])
    kept = verdicts["p(x) expected"] == "invariant"
    assert (verdicts.loc[kept, "result"] == "ok").all() and len(verdicts[kept]) == 7
    assert set(verdicts.loc[~kept, "result"]) <= {"ok", "inconclusive"}
