"""The command line: help, the embedded default, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from countvae import CountVAE
from countvae.cli import main
from countvae.cli.common import emit


def _write_counts(path, fraction=False, **obs):
    rng = np.random.default_rng(0)
    X = rng.poisson(4.0, (120, 30)).astype(np.float32) + (1.5 if fraction else 1)
    a = ad.AnnData(X=sp.csr_matrix(X))
    a.obs_names = [f"c{i}" for i in range(120)]
    a.var_names = [f"g{j}" for j in range(30)]
    for k, v in obs.items():
        a.obs[k] = v
    a.write_h5ad(path)
    return path


def test_help_lists_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "fit" in out and "Exit codes" in out


def test_fit_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "examples:" in capsys.readouterr().out


def test_fit_on_file_writes_results(tmp_path, capsys):
    data = _write_counts(tmp_path / "d.h5ad", batch=["a", "b"] * 60)
    out = tmp_path / "out"
    code = main(
        [
            "fit",
            str(data),
            "--batch-key",
            "batch",
            "--n-latent",
            "2",
            "--max-epochs",
            "3",
            "--n-samples",
            "20",
            "--out",
            str(out),
            "--json",
            "--quiet",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_cells"] == 120 and result["n_heldout"] == 12 and result["heldout_lpd_per_cell"] < 0
    assert 0 <= result["heldout_lpd_n_unreliable"] <= 12
    # the training record is write_results': the epoch whose parameters the saved model holds, and its losses
    saved = CountVAE.load(out / "model")
    kept = saved.training_summary["kept_epoch"]
    assert result["training"] == json.loads((out / "fit.json").read_text())["training"]
    assert {k: result["training"][k] for k in saved.training_summary} == saved.training_summary
    at_kept = saved.history.set_index("epoch").loc[kept]
    assert result["training"]["loss_train_kept_epoch"] == pytest.approx(float(at_kept["loss_train"]), rel=1e-12)
    assert sorted(p.name for p in out.iterdir()) == ["fit.json", "heldout_lpd.csv", "latent.csv", "model"]
    lpd = pd.read_csv(out / "heldout_lpd.csv", index_col=0)
    assert list(lpd.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]
    assert result["heldout_lpd_n_unreliable"] == int((~lpd["reliable"]).sum())
    # the same command again refuses to overwrite, before doing any work
    assert main(["fit", str(data), "--out", str(out), "--quiet"]) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "make, args, message",
    [
        (lambda p: None, [], "does not exist"),
        (lambda p: p.write_text("not an hdf5 file"), [], "not an HDF5"),
        (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64), [], "could not be read as AnnData"),
        (lambda p: _write_counts(p), ["--layer", "counts"], "layer 'counts' is not in adata.layers"),
        (lambda p: _write_counts(p), ["--layer", "counts"], "or no --layer for adata.X"),
        (lambda p: _write_counts(p), ["--use-raw"], "--use-raw but adata.raw is None; pass --layer VALUE"),
        (lambda p: _write_counts(p, fraction=True), [], "with --layer VALUE (or --use-raw when"),
        (lambda p: _write_counts(p), ["--batch-key", "donor"], "--batch-key 'donor' is not a column"),
        (lambda p: _write_counts(p), ["--n-latent", "500"], "--n-latent 500 is too large"),
    ],
)
def test_bad_input_gives_one_line_error(tmp_path, make, args, message):
    """One line, no traceback, nothing written; remedies name the command's options, not Python arguments."""
    path = tmp_path / "data.h5ad"
    make(path)
    proc = subprocess.run(
        [sys.executable, "-m", "countvae", "fit", str(path), "--out", str(tmp_path / "o"), "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["fit", "diagnose"])
def test_a_data_file_through_a_link_loop_is_named_a_loop(tmp_path, capsys, command):
    """A data file that was a link in a loop, or under one, was refused as one that "does not exist"."""
    (tmp_path / "a.h5ad").symlink_to("b.h5ad")
    (tmp_path / "b.h5ad").symlink_to("a.h5ad")
    (tmp_path / "up").symlink_to("up")
    for data, named, loop in [("a.h5ad", "a.h5ad", "b.h5ad"), ("up/d.h5ad", "up", "up")]:
        assert main([command, str(tmp_path / data), "--out", str(tmp_path / "o"), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert f"{tmp_path / named} is a symbolic link in a loop (through {tmp_path / loop})" in err
        assert (named == data) != (f"so {tmp_path / data} cannot be read" in err)
        assert "does not exist" not in err and not (tmp_path / "o").exists()


def test_fit_never_replaces_a_file_named_by_out(tmp_path, capsys):
    # --out naming the input .h5ad with --overwrite replaced the data file by the output folder.
    data = _write_counts(tmp_path / "d.h5ad")
    before = data.read_bytes()
    argv = ["fit", str(data), "--n-latent", "2", "--max-epochs", "2", "--quiet", "--out", str(data), "--overwrite"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("countvae fit: error: ") and "is not a folder; choose another --out" in err
    assert data.is_file() and data.read_bytes() == before


def test_fit_refuses_one_held_out_cell_and_a_batch_key_the_embedded_data_lacks(tmp_path, capsys):
    # one held-out cell crashed after training (a NaN standard error in fit.json), losing the model; an unknown
    # --batch-key was ignored without a data file
    for extra, message in [
        (["--heldout-fraction", "0.0004"], "holds out 1 of 3000 cells; hold out at least 2"),
        (["--batch-key", "nonexistent"], "nonexistent"),
    ]:
        assert main(["fit", "--quiet", "--max-epochs", "1", "--out", str(tmp_path / "o"), *extra]) == 1
        err = capsys.readouterr().err
        assert message in err and err.strip().count("\n") == 0 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("fraction", ["1.5", "1", "-0.2"])
def test_fit_names_its_option_for_a_heldout_fraction_out_of_range(tmp_path, capsys, fraction):
    # It said "first_fraction must be a number in (0, 1], got -0.5.", an internal name and another number.
    data = _write_counts(tmp_path / "d.h5ad")
    assert main(["fit", str(data), "--quiet", "--out", str(tmp_path / "o"), "--heldout-fraction", fraction]) == 1
    err = capsys.readouterr().err
    assert f"heldout_fraction (--heldout-fraction) must be a number in [0, 1), got {float(fraction)}" in err
    assert not (tmp_path / "o").exists()


def test_json_output_is_strict_json_with_null_for_non_finite_numbers(capsys):
    # select --json printed "margin_nats_per_cell": NaN when no margin could be stated, which JSON parsers refuse.
    # numpy scalars that are not Python floats (float32, int64) are numbers too, not their str
    emit(
        {
            "margin": float("nan"),
            "values": [np.float64("inf"), 1.5, np.float32("nan"), np.float32(0.5), np.int64(3)],
            "nested": {"x": -np.inf, "n": 2},
        },
        True,
    )
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON")) == {
        "margin": None,
        "values": [None, 1.5, None, 0.5, 3],
        "nested": {"x": None, "n": 2},
    }


def test_wrong_command_line_is_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--likelihood", "gaussian"])
    assert info.value.code == 2


def test_countvae_warnings_are_one_line_and_others_keep_their_origin(monkeypatch, capsys):
    import argparse
    import warnings

    import countvae.cli as cli
    from countvae._warnings import warn_at_caller
    from countvae.errors import MonteCarloWarning

    def run(args):
        warn_at_caller("too few draws:\n   raise n_samples", MonteCarloWarning)
        warnings.warn("a third-party warning", UserWarning, stacklevel=1)
        return 0

    def parser():
        p = argparse.ArgumentParser(prog="countvae")
        sub = p.add_subparsers(dest="command")
        cmd = sub.add_parser("demo")
        cmd.add_argument("--quiet", action="store_true")
        cmd.set_defaults(run=run)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    with pytest.warns(UserWarning, match="third-party") as record:  # handed on to whoever showed warnings before
        assert cli.main(["demo"]) == 0
    err = capsys.readouterr().err
    assert "countvae demo: warning: MonteCarloWarning: too few draws: raise n_samples\n" in err
    assert [w.category for w in record] == [UserWarning] and record[0].filename == __file__
    shown = warnings.showwarning
    assert getattr(shown, "__module__", "") != "countvae.cli"  # restored after the command


def test_the_unreliable_estimate_warning_names_the_fit_commands_option():
    """Its remedy said "a larger n_samples", which the command line left as a Python argument."""
    from countvae.cli import build_parser, in_option_terms
    from countvae.errors import UnreliableEstimateWarning
    from countvae.model.inference import _warn_unreliable
    from countvae.module.importance import ImportanceSummary

    summary = ImportanceSummary(*(np.zeros(2) for _ in range(3)), khat=np.array([0.9, 0.1]), flat=np.zeros(2, bool))
    with pytest.warns(UnreliableEstimateWarning) as record:
        _warn_unreliable(summary, "mixture")
    assert "a larger --n-samples VALUE" in in_option_terms(str(record[0].message), {"n_samples": 20})
    # diagnose has no --n-samples: its report passes --n-lpd-samples on as the estimator's n_samples
    for command, option in (("diagnose", "--n-lpd-samples"), ("select", "--n-samples"), ("fit", "--n-samples")):
        args = vars(build_parser().parse_args([command, "data.h5ad", "--batch-key", "batch"]))
        assert f"a larger {option} VALUE," in in_option_terms(str(record[0].message), args), command


def test_a_refusal_of_what_another_writer_put_at_an_output_names_a_valid_command_line(tmp_path):
    # "which overwrite=False (no --overwrite) keeps" came out as "which --overwrite False (no --overwrite) keeps"
    from countvae._io import atomic_directory, atomic_file_path
    from countvae.cli import in_option_terms
    from countvae.errors import OutputExistsError

    for what, write in (("file", atomic_file_path), ("folder", atomic_directory)):
        path = tmp_path / what
        with pytest.raises(OutputExistsError) as info, write(path):
            path.write_text("theirs") if what == "file" else path.mkdir()
        message = in_option_terms(str(info.value), {"overwrite": False})
        assert f"another writer put a {what} there, which is kept without --overwrite. So" in message
        assert "--overwrite False" not in message


def test_a_switch_with_a_no_form_and_an_option_already_named_are_rewritten_as_one_valid_option(tmp_path, capsys):
    """'pass early_stopping=False' came out as '--early-stopping False', which the parser refuses, where the option is
    --no-early-stopping; 'overwrite=True (--overwrite on the command line)' as '--overwrite (--overwrite on the
    command line)'."""
    from countvae.cli import in_option_terms

    rng = np.random.default_rng(0)
    adata = ad.AnnData(rng.poisson(3.0, size=(4, 6)).astype(np.float32))
    adata.write_h5ad(tmp_path / "four.h5ad")
    argv = ["fit", str(tmp_path / "four.h5ad"), "--max-epochs", "2", "--n-latent", "2", "--out", str(tmp_path / "f")]
    assert main(argv) == 1
    assert "pass --no-early-stopping to train every epoch" in capsys.readouterr().err
    options = {"overwrite": False, "refit_broken": False}
    for library, command in (
        ("pass overwrite=True (--overwrite on the command line) to discard", "pass --overwrite to discard"),
        ("pass refit_broken=True (countvae diagnose --refit-broken) to refit", "pass --refit-broken to refit"),
        ("pass overwrite=True (countvae diagnose --overwrite) now", "pass --overwrite now"),
    ):
        assert in_option_terms(library, options) == command


def test_folder_paths_and_quoted_candidate_labels_are_not_rewritten_as_options():
    """A resumed select named 'r4/fits/--n-latent 2__decoder=linear', a folder that does not exist, and labels were
    rewritten in part ("Candidate --n-latent 60, decoder=linear")."""
    from countvae.cli import in_option_terms

    options = {"n_latent": 2, "layer": None}
    folder = "r4/fits/n_latent=2__decoder=linear__likelihood=nb holds fits made with other settings"
    assert in_option_terms(folder, options) == folder
    label = "Candidate 'n_latent=60, decoder=linear' has n_latent=60, but the data allow fewer"
    assert (
        in_option_terms(label, options)
        == "Candidate 'n_latent=60, decoder=linear' has --n-latent 60, but the data allow fewer"
    )
    assert in_option_terms("pass `layer=...` or setup_anndata(adata, layer=...)", options) == (
        "pass --layer VALUE or setup_anndata(adata, layer=...)"
    )


def _never_trains(monkeypatch):
    from countvae.model import CountVAE

    def train(*args, **kwargs):
        raise AssertionError("the command trained a model before refusing its command line")

    monkeypatch.setattr(CountVAE, "train", train)


def test_fit_refuses_an_out_holding_its_data_file_before_any_work(tmp_path, capsys, monkeypatch):
    # --out naming the folder of the data file, with --overwrite, replaced the folder: the data file was deleted.
    project = tmp_path / "proj"
    project.mkdir()
    data = _write_counts(project / "data.h5ad")
    (project / "notes.txt").write_text("notes")
    before = data.read_bytes()
    _never_trains(monkeypatch)
    for overwrite in (["--overwrite"], []):  # without it, the remedy must not be --overwrite
        assert main(["fit", str(data), "--quiet", "--out", str(project), *overwrite]) == 1
        err = capsys.readouterr().err
        assert err == (
            f"countvae fit: error: --out {project} holds the data file {data}; this command replaces {project} "
            "whole, so it would be deleted. Choose another --out (a new folder).\n"
        )
    assert data.read_bytes() == before and (project / "notes.txt").is_file()


@pytest.mark.parametrize("extra", ["notes.txt", "model/data.h5ad"])
def test_fit_overwrite_refuses_an_out_holding_other_files_before_any_work(tmp_path, capsys, monkeypatch, extra):
    # --overwrite replaced --out whole: a file the command never writes, kept in it, was deleted
    data = _write_counts(tmp_path / "data.h5ad")
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "fit.json").write_text("{}")
    (out / extra).write_text("the analyst's")
    _never_trains(monkeypatch)
    assert main(["fit", str(data), "--quiet", "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"countvae fit: error: {out} holds {extra}, which a `countvae fit` output folder does not ")
    assert "another --out" in err and err.count("\n") == 1
    assert (out / extra).read_text() == "the analyst's" and (out / "fit.json").is_file()


def test_fit_overwrite_replaces_its_own_earlier_output(tmp_path, capsys):
    data = _write_counts(tmp_path / "data.h5ad")
    argv = ["fit", str(data), "--n-latent", "2", "--max-epochs", "1", "--n-samples", "20", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert main([*argv, "--out", str(tmp_path / "out"), "--overwrite"]) == 0, capsys.readouterr().err
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["fit.json", "heldout_lpd.csv", "latent.csv", "model"]


def test_fit_keeps_an_output_another_run_wrote_while_it_worked(tmp_path, capsys, monkeypatch):
    # Two `countvae fit --out X` at once both ended with 0: the later swap deleted the first one's output.
    from countvae.model import CountVAE

    data, out = _write_counts(tmp_path / "data.h5ad"), tmp_path / "out"
    lpd = CountVAE.get_log_predictive_density

    def lpd_while_another_run_finishes(self, *args, **kwargs):  # the held-out log p(x): a long step of the block
        out.mkdir()
        (out / "fit.json").write_text("the other run's")
        return lpd(self, *args, **kwargs)

    monkeypatch.setattr(CountVAE, "get_log_predictive_density", lpd_while_another_run_finishes)
    argv = ["fit", str(data), "--n-latent", "2", "--max-epochs", "1", "--n-samples", "20", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    (kept,) = tmp_path.glob(".out.countvae-*.kept")
    assert err.startswith(f"countvae fit: error: Did not write {out}, which changed while this run was writing: ")
    assert f"this run's result is kept as {kept};" in err and err.count("\n") == 1
    assert (out / "fit.json").read_text() == "the other run's" and (kept / "model" / "model.json").is_file()


@pytest.mark.parametrize(
    ("out", "message"),
    [(".", "--out . is the working folder"), ("..", "--out .. holds the working folder"), ("", "--out is empty")],
)
def test_fit_refuses_the_working_folder_and_an_empty_out_before_fitting(tmp_path, capsys, monkeypatch, out, message):
    # --out . trained, then crashed with an OSError traceback (EBUSY renaming '.'); --out "" had an empty name
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    _never_trains(monkeypatch)
    assert main(["fit", "--quiet", "--max-epochs", "1", "--out", out, "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"countvae fit: error: {message}") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]


def test_replacing_the_working_folder_is_one_write_error_not_a_traceback(tmp_path, monkeypatch):
    from countvae._io import atomic_directory
    from countvae.errors import OutputWriteError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputWriteError, match=r"Could not write \.: Device or resource busy \(EBUSY\)"):
        with atomic_directory(".", overwrite=True) as tmp:
            (tmp / "x.txt").write_text("x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "inside"),
    [("diagnose", "report"), ("diagnose", "fits/fits"), ("select", "comparison"), ("select", "fits/c")],
)
def test_diagnose_and_select_refuse_an_input_in_the_folders_they_replace(
    tmp_path, capsys, monkeypatch, command, inside
):
    # they replace only OUT/report, OUT/fits... (not OUT), so a data file there was deleted with --overwrite
    out = tmp_path / "out"
    (out / inside).mkdir(parents=True)
    data = _write_counts(out / inside / "data.h5ad")
    _never_trains(monkeypatch)
    fast = ["--seeds", "2", "--max-epochs", "1", "--n-jobs", "1", "--quiet", "--overwrite"]
    assert main([command, str(data), *fast, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    replaced = out / inside.split("/")[0]
    assert f"error: {replaced} holds the data file {data}; this command replaces {replaced} whole" in err
    assert data.is_file()
    # beside the folders the command replaces, in OUT itself, the data file is safe and not refused
    from countvae.cli.common import refuse_inputs_in_output

    refuse_inputs_in_output(str(out), {"the data file": str(out / "data.h5ad")}, replaced=("report", "fits"))


@pytest.mark.parametrize(
    ("command", "folder", "options"),
    [
        ("diagnose", "report", []),
        ("diagnose", "report", ["--decoder", "linear", "--restrictions", "laplace"]),
        ("select", "comparison", []),
    ],
)
def test_diagnose_and_select_refuse_to_replace_a_report_folder_holding_other_files(
    tmp_path, capsys, monkeypatch, command, folder, options
):
    # --overwrite replaced OUT/report (OUT/comparison) whole: a file the command never writes, kept there, was deleted
    out = tmp_path / "out"
    (out / folder).mkdir(parents=True)
    (out / folder / "notes.txt").write_text("notes")
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    fast = ["--seeds", "2", "--max-epochs", "1", "--n-jobs", "1", "--quiet", "--overwrite"]
    assert main([command, str(data), *options, *fast, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"error: {out / folder} holds notes.txt, which a " in err and "another --out" in err
    assert (out / folder / "notes.txt").read_text() == "notes"


@pytest.mark.parametrize(
    ("command", "where", "options"),
    [
        ("diagnose", "report", []),
        ("diagnose", "report", ["--restrictions", "laplace"]),
        ("diagnose", "fits", []),
        ("diagnose", "fits/fits", []),
        ("select", "comparison", []),
        ("select", "fits", []),
        ("select", "fits/n_latent=1__decoder=linear__likelihood=nb/fits", []),
    ],
)
def test_diagnose_and_select_refuse_a_file_where_they_write_a_folder(
    tmp_path, capsys, monkeypatch, command, where, options
):
    # a file named OUT/report was moved aside and deleted by --overwrite, without a word; OUT/fits/fits was hidden
    # away as OUT/fits/.fits.<random>.old even without it; a file OUT/fits ended select in a NotADirectoryError
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    fast = ["--n-latent", "1", "--decoder", "linear", "--seeds", "2", "--max-epochs", "1", "--n-jobs", "1", "--quiet"]
    for overwrite in (["--overwrite"], []):
        out = tmp_path / f"out{len(overwrite)}"
        (out / where).parent.mkdir(parents=True)
        (out / where).write_text("my notes")
        assert main([command, str(data), *options, *fast, *overwrite, "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert f"error: {out / where} exists and is not a folder; " in err
        assert "another --out" in err or "another out_dir (--out)" in err  # the library's words for select's fits
        assert (out / where).read_text() == "my notes"
        assert [p.name for p in out.rglob(".*") if not p.name.startswith(".lock")] == []


@pytest.mark.parametrize("command", ["diagnose", "select"])
def test_seed_is_not_taken_as_an_abbreviation_of_seeds(command, capsys):
    # diagnose --seed 3 ran seeds 0, 1, 2 (argparse expanded it to --seeds 3), where fit --seed 3 is a seed
    with pytest.raises(SystemExit) as info:
        main([command, "data.h5ad", "--seed", "3"])
    assert info.value.code == 2 and "unrecognized arguments: --seed 3" in capsys.readouterr().err


def test_no_option_of_any_command_can_be_abbreviated(capsys):
    import argparse

    from countvae.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in commands.items():
        options = {o for a in sub._actions for o in a.option_strings}
        for option in sorted(o for o in options if o.startswith("--") and len(o) > 4):
            prefix = option[:-1]
            if prefix in options:
                continue
            with pytest.raises(SystemExit) as info:
                parser.parse_args([name, "data.h5ad", prefix, "1"])
            assert info.value.code == 2, f"countvae {name} {prefix} was taken as {option}"
    capsys.readouterr()


def test_the_docs_name_every_option_in_full():
    """An abbreviated option in the docs would be a wrong command line (exit code 2): options are never abbreviated."""
    import argparse
    import re
    from pathlib import Path

    from countvae.cli import build_parser

    parser = build_parser()
    options = {o for a in parser._actions for o in a.option_strings}
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    options |= {o for sub in commands.values() for a in sub._actions for o in a.option_strings}
    root = Path(__file__).resolve().parents[2]
    for page in (root / "docs" / "cli.md", root / "README.md"):
        named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", page.read_text(encoding="utf-8")))
        assert named and named <= options, f"{page.name} names {sorted(named - options)}, which are not options"


def test_commands_never_advise_opening_the_data_backed(monkeypatch):
    # the commands read the whole file: a memory warning advising a backed file would name a remedy they cannot use
    import argparse

    import countvae.cli as cli
    from countvae.diagnostics.fitting import parallelism

    seen = []

    def parser():
        p = argparse.ArgumentParser(prog="countvae")
        cmd = p.add_subparsers(dest="command").add_parser("demo")
        cmd.add_argument("--quiet", action="store_true")
        cmd.set_defaults(run=lambda args: seen.append(parallelism._BACKED_REMEDY.get()) or 0)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    assert cli.main(["demo"]) == 0 and seen == [False]
    assert parallelism._BACKED_REMEDY.get()  # restored after the command


def test_fit_checks_n_samples_before_fitting(tmp_path, capsys, monkeypatch):
    # --n-samples 0 was refused only after training, and the trained model was thrown away
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    for value in ("0", "1", "x"):
        with pytest.raises(SystemExit) as info:
            main(["fit", str(data), "--quiet", "--out", str(tmp_path / "o"), "--n-samples", value])
        assert info.value.code == 2 and "--n-samples" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-latent", "0"], "--n-latent must be a positive integer, got 0."),
        (["--max-epochs", "0"], "--max-epochs must be a positive integer, got 0."),
        (["--lr", "-1"], "--lr must be a positive number, got -1.0."),
        (["--seed", "-1"], "--seed must be an integer >= 0, got -1."),
    ],
)
def test_argument_checks_name_the_option(tmp_path, capsys, args, message):
    # they named the Python argument: "n_latent must be a positive integer, got 0."
    data = _write_counts(tmp_path / "d.h5ad")
    assert main(["fit", str(data), "--quiet", "--out", str(tmp_path / "o"), *args]) == 1
    assert capsys.readouterr().err == f"countvae fit: error: {message}\n"


def test_a_leading_name_must_be_is_rewritten_only_for_the_commands_options():
    from countvae.cli import in_option_terms

    options = {"n_latent": 0, "batch_size": 0, "command": "fit"}
    assert in_option_terms("n_latent must be a positive integer, got 0.", options) == (
        "--n-latent must be a positive integer, got 0."
    )
    assert in_option_terms("Too small. batch_size must be a positive integer.", options) == (
        "Too small. --batch-size must be a positive integer."
    )
    for kept in (
        "dropout_rate must be a number in [0, 1), got 2.",  # not an option of the command
        "heldout_fraction (--heldout-fraction) must be a number",  # names its option already
        "the n_latent must be positive",  # not at the start of a sentence
        "command must be one of",
    ):
        assert in_option_terms(kept, options) == kept


def test_fit_on_a_full_disk_is_one_line_without_the_resume_remedy(tmp_path, capsys, monkeypatch):
    # torch.save's RuntimeError ("[enforce fail at inline_container.cc] unexpected pos") ended in a traceback
    import errno
    import os

    data = _write_counts(tmp_path / "d.h5ad")
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        if "params.pt" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)
    out = tmp_path / "o"
    argv = ["fit", str(data), "--quiet", "--n-latent", "2", "--max-epochs", "1", "--n-samples", "10", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"countvae fit: error: Could not write {out}: the disk is full") and err.count("\n") == 1
    assert err.endswith("and rerun.\n") and not (out.exists() or list(tmp_path.glob(".o.*")))


@pytest.mark.parametrize("command", ["fit", "verify-invariance"])
def test_fit_and_verify_refuse_an_unwritable_out_before_training(tmp_path, capsys, monkeypatch, command):
    # they learnt that --out could not be written only when saving, after the whole training (and every check)
    import errno
    import os
    import tempfile

    data = _write_counts(tmp_path / "d.h5ad")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    real_temporary_file = tempfile.TemporaryFile

    def temporary_file(*args, dir=None, **kwargs):
        if dir is not None and read_only in (Path(dir), *Path(dir).parents):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_temporary_file(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", temporary_file)
    _never_trains(monkeypatch)
    out = read_only / "fit"
    assert main([command, str(data), "--quiet", "--n-latent", "2", "--max-epochs", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"countvae {command}: error: Could not write {out}: the file system is read-only")
    assert err.count("\n") == 1 and list(read_only.iterdir()) == []


def test_diagnose_refuses_a_gene_programs_file_in_the_folders_it_replaces(tmp_path, capsys, monkeypatch):
    # only the data file was checked: --overwrite deleted a GMT file kept in OUT/report or OUT/fits
    out = tmp_path / "out"
    (out / "report").mkdir(parents=True)
    gmt = out / "report" / "programs.gmt"
    gmt.write_text("p1\tna\tg0\tg1\np2\tna\tg2\tg3\n")
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    argv = ["diagnose", str(data), "--decoder", "linear", "--restrictions", f"programs:{gmt}", "--seeds", "2"]
    assert main([*argv, "--max-epochs", "1", "--n-jobs", "1", "--quiet", "--overwrite", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"error: {out / 'report'} holds the gene programs file {gmt}; this command replaces" in err
    assert gmt.is_file()


#: A command that warns, prints a result of ``--n`` numbers (JSON with ``--json``) and exits with ``--code``.
_DEMO = """
import argparse, sys
import countvae.cli as cli
from countvae._warnings import warn_at_caller
from countvae.cli.common import emit
from countvae.errors import CountVAEWarning

def run(args):
    warn_at_caller("a warning", CountVAEWarning)
    emit({"values": list(range(args.n))}, args.json)
    return args.code

def parser():
    p = argparse.ArgumentParser(prog="countvae")
    cmd = p.add_subparsers(dest="command").add_parser("demo")
    cmd.add_argument("--quiet", action="store_true")
    cmd.add_argument("--json", action="store_true")
    cmd.add_argument("--n", type=int, default=3)
    cmd.add_argument("--code", type=int, default=0)
    cmd.set_defaults(run=run)
    return p

cli.build_parser = parser
sys.exit(cli.main(sys.argv[1:]))
"""


def _command_env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


def _with_stderr_closed(folder, *command, closed: str = "2>&-") -> tuple[int, str]:
    """Exit code and stdout of ``python *command`` run in ``folder`` with descriptor 2 (or ``closed``) closed."""
    proc = subprocess.run(
        ["sh", "-c", f'exec "$@" {closed}', "sh", sys.executable, *command],
        stdout=subprocess.PIPE,
        text=True,
        env=_command_env(),
        cwd=folder,
        timeout=300,
    )
    return proc.returncode, proc.stdout


def test_with_stderr_closed_warnings_and_errors_stay_out_of_the_json_on_stdout(tmp_path):
    # With fd 2 closed (2>&-), sys.stderr is None and print(..., file=sys.stderr) wrote on stdout: the warnings and
    # the error line went into the --json result.
    expected = '{\n  "values": [\n    0,\n    1,\n    2\n  ]\n}\n'
    assert _with_stderr_closed(tmp_path, "-c", _DEMO, "demo", "--json") == (0, expected)
    assert _with_stderr_closed(tmp_path, "-m", "countvae", "fit", str(tmp_path / "missing.h5ad"), "--json") == (1, "")


@pytest.mark.parametrize("closed", ["2>&-", "<&- 2>&-"])
def test_parallel_fits_run_with_stderr_closed(tmp_path, closed):
    # joblib's workers flush sys.stderr as they start, and Python gave them none: --n-jobs 2 with 2>&- ended with exit 1
    # and no message (an AttributeError in the parent, then "sys.stderr is None" in each worker, printed on stdout).
    # With stdin closed too, devnull opened for stderr took descriptor 0, and the workers again started without a 2.
    fast = ["--seeds", "2", "--max-epochs", "2", "--n-lpd-samples", "20", "--no-ica", "--n-jobs", "2"]
    code, out = _with_stderr_closed(
        tmp_path, "-m", "countvae", "diagnose", *fast, "--out", "o", "--json", closed=closed
    )
    assert code == 0 and "Traceback" not in out, out[-2000:]
    assert json.loads(out)["seeds"] == [0, 1]


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["-c", _DEMO, "demo", "--json", "--n", "100000"], 0),  # more than a pipe holds: written while running
        (["-c", _DEMO, "demo", "--code", "1"], 1),  # a failure told after the result keeps its exit code
        (["-m", "countvae", "--help"], 0),
    ],
)
def test_a_reader_that_stops_reading_early_changes_no_exit_code(tmp_path, command, code):
    # `countvae ... | head -1` after a successful run ended in a BrokenPipeError traceback and exit code 1.
    proc = subprocess.Popen(
        [sys.executable, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_command_env(),
        cwd=tmp_path,
    )
    proc.stdout.close()  # the reader is gone before the command has written anything
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == code, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_fit_succeeds_when_the_reader_of_its_result_has_gone(tmp_path):
    data = _write_counts(tmp_path / "d.h5ad")
    out = tmp_path / "o"
    for args in (["--json"], []):
        fit = ["-m", "countvae", "fit", str(data), "--n-latent", "2", "--max-epochs", "1", "--out", str(out), *args]
        proc = subprocess.Popen(
            [sys.executable, *fit, "--overwrite", "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_command_env(),
            cwd=tmp_path,
        )
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 0, err
        assert err == "" and (out / "fit.json").is_file()


@pytest.mark.parametrize(
    ("command", "where"),
    [(c, w) for c in ("diagnose", "select", "fit") for w in ("--out", "--out under")] + [("diagnose", "--write-h5ad")],
)
def test_a_link_loop_at_or_above_an_output_is_refused_in_one_line_naming_it(
    tmp_path, capsys, monkeypatch, command, where
):
    # Path.resolve() raised RuntimeError("Symlink loop from ...") while the inputs were checked against --out, and
    # while --write-h5ad was checked against the report folder: a traceback
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    fast = ["--n-latent", "1", "--max-epochs", "1", "--quiet"]
    fast += [] if command == "fit" else ["--seeds", "2", "--n-jobs", "1", "--decoder", "linear"]
    out = {"--out": ["--out", "loop1"], "--out under": ["--out", "loop1/sub"]}.get(where)
    out = out or ["--out", "o", "--write-h5ad", "loop1/x.h5ad"]
    monkeypatch.chdir(tmp_path)
    assert main([command, str(data), *fast, *out]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"countvae {command}: error: loop1 is a symbolic link in a loop (through loop2), "), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5ad", "loop1", "loop2"]


def test_a_data_file_in_a_link_loop_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    # the check of the inputs against --out resolved it first: RuntimeError("Symlink loop from ...")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "loop1", "--max-epochs", "1", "--out", "o"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("countvae fit: error: loop1 ") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("entry", ["file", "dangling link"])
@pytest.mark.parametrize("command", ["diagnose", "select", "fit"])
def test_an_out_under_a_file_is_refused_in_one_line_naming_the_file(tmp_path, capsys, monkeypatch, command, entry):
    # diagnose and select ended in a NotADirectoryError traceback from their run lock (a FileExistsError under a
    # dangling link); fit said "File exists (EEXIST)" of the --out that did not exist, not naming the entry in the way
    data = _write_counts(tmp_path / "d.h5ad")
    _never_trains(monkeypatch)
    if entry == "file":
        (tmp_path / "afile").write_text("mine")
    else:
        (tmp_path / "afile").symlink_to(tmp_path / "gone")
    fast = ["--n-latent", "1", "--max-epochs", "1", "--quiet"]
    fast += [] if command == "fit" else ["--seeds", "2", "--n-jobs", "1", "--decoder", "linear"]
    assert main([command, str(data), *fast, "--out", str(tmp_path / "afile" / "sub")]) == 1
    err = capsys.readouterr().err
    refused = "exists and is not a folder" if entry == "file" else f"is a symbolic link to the missing path {tmp_path}"
    assert err.startswith(f"countvae {command}: error: {tmp_path / 'afile'} {refused}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "d.h5ad"]


def test_a_switch_turned_off_by_its_no_option_is_named_as_that_option():
    """verify's refusal of a transform named as a control said "pass controls=False" on the command line too, where the
    option is --no-controls (the destination no_controls, which the rewriting did not know as controls)."""
    from countvae.cli import build_parser, in_option_terms
    from countvae.errors import InvalidArgumentError
    from countvae.invariance.verification import _resolve_transforms

    with pytest.raises(InvalidArgumentError) as info:
        _resolve_transforms({"shear (control)": np.eye(2)}, 2, 0, controls=True)
    library = str(info.value)
    assert library.endswith("rename it, or pass controls=False.")  # the library's own words
    options = vars(build_parser().parse_args(["verify-invariance"]))
    assert in_option_terms(library, options).endswith("rename it, or pass --no-controls.")
    # the same for diagnose --restrictions' --no-split-half, which its message names itself
    options = vars(build_parser().parse_args(["diagnose", "--restrictions", "ica"]))
    assert in_option_terms("pass split_half=False (--no-split-half).", options) == "pass --no-split-half."
