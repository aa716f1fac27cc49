"""countvae diagnose --restrictions: the comparison of restrictions from the command line, and its errors."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import countvae as cv
from countvae.cli import diagnose_restrictions, main


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    # loading_scale 0.5 keeps every count below 2**24, which countvae refuses (the default scale reaches 1e9 here)
    adata = cv.data.simulate(
        n_cells=240, n_genes=30, n_latent=2, sources="laplace", loading_sparsity=0.5, seed=2, loading_scale=0.5
    )
    path = tmp_path_factory.mktemp("data") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


FAST = ["--seeds", "2", "--n-latent", "2", "--max-epochs", "5", "--n-lpd-samples", "5", "--n-hidden", "16"]


def test_restrictions_write_their_report(data_file, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="countvae")
    out = tmp_path / "restr"
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", "laplace,horseshoe,ica"]
    assert main([*argv, "--margin", "0.25", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["restrictions"] == ["laplace", "horseshoe", "ica"] and result["seeds"] == [0, 1]
    assert list(result["identified"]) == ["unrestricted", "laplace", "horseshoe", "ica"]
    assert result["predictive"]["ica"] == "unchanged model" and result["headline"]
    assert sorted(p.name for p in (out / "report").iterdir()) == ["report.html", "report.json", "report.md"]
    assert sorted(p.name for p in (out / "fits").iterdir()) == ["horseshoe", "laplace", "unrestricted"]
    record = json.loads((out / "report" / "report.json").read_text())
    assert record["settings"]["margin_nats_per_cell"] == 0.25
    # what docs/cli.md says it prints: no block or time estimate before fitting, the comparison and its models
    messages = [r.getMessage() for r in caplog.records]
    assert not any("before fitting" in m for m in messages)
    assert messages[0] == "Comparing laplace, horseshoe, ica with the unrestricted model over 2 seeds (5 epochs each)."
    assert "Fitting 3 models from 2 seeds." in messages


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--restrictions", "horseshoe"], "add --decoder linear"),
        (["--restrictions", "lasso"], "Unknown restriction 'lasso'"),
        (["--decoder", "linear", "--restrictions", "programs"], "--restrictions programs needs a GMT file"),
        # the multi-seed report's options, once silently ignored (no .h5ad file, no DE)
        (["--restrictions", "laplace", "--write-h5ad", "x.h5ad"], "--write-h5ad sets the multi-seed report"),
        (["--restrictions", "laplace", "--de", "batch"], "--de sets the multi-seed report"),
        # the report's own settings, ignored without a word: the margin read was --margin's, ICA ran after --no-ica
        (["--restrictions", "laplace", "--equivalence-margin", "0.05"], "comparison's margin is --margin"),
        (["--restrictions", "ica", "--no-ica"], "--ica/--no-ica (the ICA comparison is --restrictions ica) sets"),
        (["--restrictions", "laplace", "--max-fit-cells", "50", "--ica"], "--max-fit-cells set the multi-seed"),
    ],
)
def test_bad_restrictions_are_one_line_errors(data_file, tmp_path, capsys, extra, message):
    assert main(["diagnose", str(data_file), *FAST, *extra, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert message in err and not (tmp_path / "o" / "report").exists()
    assert "gene_programs=" not in err  # a Python argument the command line cannot pass


def test_an_interrupted_overwrite_leaves_no_stale_report_and_resumes(data_file, tmp_path, capsys, monkeypatch):
    # The replaced report stayed beside the refitted seeds: the rerun was refused, and --overwrite refitted them all.
    out = tmp_path / "restr"
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", "laplace", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(diagnose_restrictions, "compare_restrictions", interrupted)
    assert main([*argv, "--quiet", "--overwrite"]) == 130
    assert not (out / "report").exists()
    monkeypatch.undo()
    assert main([*argv, "--quiet"]) == 0 and (out / "report" / "report.json").is_file()


def test_overwrite_refuses_a_linked_fits_folder_before_discarding_the_report(data_file, tmp_path, capsys, monkeypatch):
    # With out/fits/laplace/fits a link (the fits on another disk), --overwrite deleted the finished report, then
    # refused the link.
    out, elsewhere = tmp_path / "restr", tmp_path / "elsewhere"
    report = {f"report.{ext}": "earlier" for ext in ("html", "json", "md")}
    (out / "report").mkdir(parents=True)
    for name, text in report.items():
        (out / "report" / name).write_text(text)
    (out / "fits" / "laplace").mkdir(parents=True)
    elsewhere.mkdir()
    (out / "fits" / "laplace" / "fits").symlink_to(elsewhere)
    monkeypatch.setattr(diagnose_restrictions, "compare_restrictions", lambda *args, **kwargs: pytest.fail("fitted"))
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", "laplace", "--out", str(out)]
    assert main([*argv, "--quiet", "--overwrite"]) == 1
    assert f"error: {out / 'fits' / 'laplace' / 'fits'} is a symbolic link" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in (out / "report").iterdir()} == report


def test_program_genes_the_data_lack_are_dropped_on_request(data_file, tmp_path, capsys):
    """The error for unknown program genes named a --unknown-genes option that did not exist; it does now."""
    genes = [f"gene{g}" for g in range(20)]
    gmt = tmp_path / "two.gmt"
    gmt.write_text(f"p0\tna\t{chr(9).join(genes[:10])}\tNOTAGENE\np1\tna\t{chr(9).join(genes[10:])}\n")
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", f"programs:{gmt}", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "refused")]) == 1
    err = capsys.readouterr().err
    assert "p0: NOTAGENE" in err and "--unknown-genes 'drop'" in err
    assert main([*argv, "--unknown-genes", "drop", "--out", str(tmp_path / "dropped"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identified"]["programs"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--margin", "0.25"], "--margin (the multi-seed report's margin is --equivalence-margin"),
        (["--unknown-genes", "drop"], "--unknown-genes sets the comparison of restrictions; add --restrictions"),
        (["--no-split-half"], "--no-split-half sets the comparison of restrictions; add --restrictions"),
        # with restrictions but no programs, --unknown-genes was accepted and ignored
        (["--restrictions", "laplace", "--unknown-genes", "drop"], "--unknown-genes applies to the genes of"),
    ],
)
def test_options_of_the_comparison_are_refused_without_restrictions(data_file, tmp_path, capsys, extra, message):
    """A plain diagnose ignored --margin and --unknown-genes without a word."""
    assert main(["diagnose", str(data_file), *FAST, *extra, "--out", str(tmp_path / "o")]) == 1
    assert message in capsys.readouterr().err and not (tmp_path / "o" / "fits").exists()


def test_a_given_n_latent_that_is_not_the_number_of_programs_is_refused(data_file, tmp_path, capsys):
    """Gene programs fix the latent size (one dimension per program): --n-latent 2 with three programs was dropped
    without a word and both models fitted with three dimensions; it is refused, as compare_restrictions refuses it."""
    genes = [f"gene{g}" for g in range(30)]
    gmt = tmp_path / "three.gmt"
    gmt.write_text("".join(f"p{k}\tna\t" + "\t".join(genes[10 * k : 10 * k + 10]) + "\n" for k in range(3)))
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", f"programs:{gmt}"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "--n-latent 2 differs from the 3 gene programs" in err and "leave --n-latent out" in err
    # the command line cannot pass Python arguments: its message names none (it named model_kwargs and n_latent)
    assert "model_kwargs" not in err.replace(str(gmt), "") and "n_latent" not in err.replace(str(gmt), "")
    assert not (tmp_path / "o" / "fits").exists()


def test_program_genes_left_out_by_gene_selection_are_named_as_such(data_file, tmp_path, capsys):
    # They were called "not in the data", with --unknown-genes drop as the remedy, which would drop them from the fit.
    genes = [f"gene{g}" for g in range(30)]
    gmt = tmp_path / "two.gmt"
    gmt.write_text(f"p0\tna\t{chr(9).join(genes[:15])}\np1\tna\t{chr(9).join(genes[15:])}\n")
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", f"programs:{gmt}"]
    assert main([*argv, "--n-top-genes", "20", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "in the data but not among the 20 genes the gene selection kept" in err and "--n-top-genes all" in err
    assert not (tmp_path / "o" / "fits").exists()


def test_no_split_half_is_the_remedy_the_split_half_refusal_names(data_file, tmp_path, capsys, monkeypatch):
    # The refusal named split_half=False, which the command line did not have.
    from countvae.errors import InvalidDataError

    seen = {}

    def refuse(*args, **kwargs):
        seen.update(kwargs)
        raise InvalidDataError(
            "1 genes have no counts in half 1 ... compare without the split halves: split_half=False (--no-split-half)."
        )

    monkeypatch.setattr(diagnose_restrictions, "compare_restrictions", refuse)
    argv = ["diagnose", str(data_file), *FAST, "--restrictions", "laplace", "--out", str(tmp_path / "o")]
    assert main(argv) == 1
    err = capsys.readouterr().err  # the library's words, split_half=False (--no-split-half), as the option alone
    assert "compare without the split halves: --no-split-half." in err and seen["split_half"] is True
    assert main([*argv, "--no-split-half"]) == 1
    assert seen["split_half"] is False


def test_a_damaged_seed_of_a_later_model_is_refused_before_any_model_is_fitted(data_file, tmp_path, capsys):
    """A resumed comparison met a damaged stored seed of a later model only after fitting the earlier models' missing
    seeds; every model's stored fits are checked before the first fit."""
    out = tmp_path / "restr"
    argv = ["diagnose", str(data_file), *FAST, "--decoder", "linear", "--restrictions", "laplace", "--out", str(out)]
    assert main([*argv, "--quiet", "--no-split-half"]) == 0
    shutil.rmtree(out / "report")
    shutil.rmtree(out / "fits" / "unrestricted" / "fits" / "seed_1")  # to be refitted on resuming
    (out / "fits" / "laplace" / "fits" / "seed_0" / "model" / "params.pt").write_bytes(b"")
    capsys.readouterr()
    assert main([*argv, "--quiet", "--no-split-half"]) == 1
    err = capsys.readouterr().err
    assert "laplace/fits/seed_0 is damaged" in err and "--refit-broken" not in err
    assert not (out / "fits" / "unrestricted" / "fits" / "seed_1").exists()  # nothing fitted before the refusal
