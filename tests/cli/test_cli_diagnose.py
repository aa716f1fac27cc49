"""countvae diagnose: the report on a file, resuming, refusing an existing report, one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

import countvae as cv
from countvae.cli import main


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", sources="laplace", seed=2)
    path = tmp_path_factory.mktemp("data") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def run(argv, capsys):
    code = main(["diagnose", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


FAST = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "5", "--n-lpd-samples", "10"]


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as info:
        main(["diagnose", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--seeds" in out and "--markers" in out and "--ica" in out


def test_help_says_which_graphs_max_fit_cells_limits(capsys, monkeypatch):
    # the k-NN row finds neighbours among every fit cell: the cap limits only the subsets' graphs
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping, which may break a line at a hyphen
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    option = out.split("--max-fit-cells N ", 1)[1].split(" --", 1)[0]
    assert "the k-NN graph holds them" not in option
    assert "the within-seed baseline, batch-mixing and placement graphs hold them" in option
    assert "(the k-NN row holds every fit cell whatever N is)" in option


def test_diagnose_writes_report_then_resumes_and_refuses(data_file, tmp_path, capsys):
    out = tmp_path / "diag"
    argv = [str(data_file), *FAST, "--markers", "gene0,gene5", "--equivalence-margin", "0.05", "--out", str(out)]
    code, stdout, _ = run([*argv, "--json"], capsys)
    assert code == 0
    result = json.loads(stdout)
    assert result["report"] == str(out / "report" / "report.html")
    assert sorted(p.name for p in (out / "report").iterdir()) == ["report.html", "report.json", "report.md"]
    assert result["seeds"] == [0, 1] and result["reused_seeds"] == []
    verdicts = ("agree", "agree_after_alignment", "differ", "undetermined")
    assert "per-dimension coordinates" in result["agree_after_alignment"] + result["differ"] + result["undetermined"]
    named = sorted(q for key in verdicts for q in result[key])
    assert named == sorted(
        r["quantity"]
        for r in json.loads((out / "report" / "report.json").read_text())["tables"]["invariants"]
        if r["verdict"] != "not measured"
    )
    assert result["predictive_equivalence"] in ("equivalent", "not equivalent", "undetermined")
    assert set(result["alignment_error_by_map"]) == {"identity", "permutation", "orthogonal", "linear", "ica"}
    first = json.loads((out / "report" / "report.json").read_text())
    assert first["settings"]["markers"] == ["gene0", "gene5"]
    assert first["settings"]["report"]["equivalence_margin"] == 0.05
    assert first["settings"]["predictive_equivalence"]["margin_fraction"] == 0.05
    # --ica (default on): ICA map class, efficiency, the invariants row and the per-component stability table.
    components = result["ica_components"]
    assert sorted(components["agree"] + components["differ"] + components["undetermined"]) == ["IC_0", "IC_1"]
    assert [row["component"] for row in first["tables"]["ica"]] == ["IC_0", "IC_1"]
    assert first["tables"]["ica_efficiency"] and "ICA coordinates" in [
        r["quantity"] for r in first["tables"]["invariants"]
    ]
    assert any(line.startswith("ICA components") for line in first["headline"])
    assert "## ICA components across seeds" in (out / "report" / "report.md").read_text()

    # A finished report is not replaced without --overwrite (one line on stderr, exit code 1).
    code, _, err = run([str(data_file), *FAST, "--out", str(out)], capsys)
    assert code == 1 and "--overwrite" in err and len(err.strip().splitlines()) == 1

    # An interrupted run (fits done, no report yet) resumes: every seed is reused, the numbers are identical.
    import shutil

    shutil.rmtree(out / "report")
    code, stdout, _ = run([*argv, "--json"], capsys)
    assert code == 0
    assert json.loads(stdout)["reused_seeds"] == [0, 1]
    second = json.loads((out / "report" / "report.json").read_text())
    assert second["tables"] == first["tables"]
    assert second["provenance"]["heldout_checksum_sha256"] == first["provenance"]["heldout_checksum_sha256"]


def test_embedded_default_with_overwrite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--seeds", "2", "--max-epochs", "2", "--n-lpd-samples", "10", "--no-ica", "--decoder", "linear"]
    code, stdout, _ = run([*argv, "--json"], capsys)
    assert code == 0
    result = json.loads(stdout)
    assert result["data"].startswith("embedded")
    record = json.loads((tmp_path / "countvae_diagnose" / "report" / "report.json").read_text())
    assert record["settings"]["markers"] == [f"true_source_{k}" for k in range(5)]
    assert set(result["alignment_error_by_map"]) == {"identity", "permutation", "orthogonal", "linear"}
    assert "ica_components" not in result and record["tables"]["ica"] == []
    assert 0 < result["seconds_seed_fits"] <= result["seconds_fitting"]
    estimated = result["seconds_seed_fits_estimated"]  # None where log messages are off (no warm-up then)
    assert estimated is None or estimated > 0
    code, stdout, _ = run([*argv, "--overwrite"], capsys)
    assert code == 0 and "Report:" in stdout and "Agree across both seeds" in stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "1"], "at least 2"),
        (["--markers", "NOT_A_GENE"], "NOT_A_GENE"),
        (["--markers", " , "], "--markers is empty"),
        (["--layer", "nope"], "nope"),
        (["--equivalence-margin", "0"], "error: --equivalence-margin must be a number in (0, 1], got 0.0."),
        # Names over the file system's 255 bytes reached the OS: a raw traceback, for --write-h5ad after every fit.
        (["--write-h5ad", "n" * 300 + ".h5ad"], "is 305 bytes long and the file system takes at most 255"),
        (["--out", "o" * 300], "is 300 bytes long and the file system takes at most 255"),
        (["--out", "o" * 300 + "/within"], "is 300 bytes long and the file system takes at most 255"),
    ],
)
def test_bad_input_one_line_errors(data_file, tmp_path, capsys, extra, message):
    argv = [str(data_file), *FAST, "--out", str(tmp_path / "o"), *extra]
    code, _, err = run(argv, capsys)
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_file(tmp_path, capsys):
    code, _, err = run([str(tmp_path / "missing.h5ad"), "--out", str(tmp_path / "o")], capsys)
    assert code == 1 and "does not exist" in err


def test_default_epochs_budget():
    from countvae.diagnostics.fitting.default_training import default_epochs

    assert default_epochs(7816) == 77  # Kang with 10% held out: 600,000 cell passes
    assert default_epochs(500) == 400  # small data: scvi-tools' cap
    assert default_epochs(1_000_000) == 20  # large data: at least 20 epochs


class _Stop(Exception):
    """Raised by the stand-in fit_seeds once it has recorded its arguments."""


@pytest.mark.parametrize("flag", [None, "--early-stopping", "--no-early-stopping"])
def test_early_stopping_default_reaches_the_fits(data_file, tmp_path, monkeypatch, flag):
    from countvae.diagnostics import DIAGNOSE_STOPPING, diagnosis

    seen = {}

    def record(adata, settings, fingerprint=None):
        seen.update(settings[0].train_kwargs)
        raise _Stop

    monkeypatch.setattr(diagnosis, "fit_models", record)
    argv = ["diagnose", str(data_file), *FAST, "--out", str(tmp_path / "d"), *([flag] if flag else [])]
    with pytest.raises(_Stop):
        main(argv)
    if flag == "--no-early-stopping":
        assert seen["early_stopping"] is False
        assert not set(DIAGNOSE_STOPPING) & set(seen)  # the model's own defaults then apply
    else:  # on by default, with the rule chosen in benchmarks/bench_stopping.py
        assert seen["early_stopping"] is True
        assert {k: seen[k] for k in DIAGNOSE_STOPPING} == {
            "check_val_every_n_epoch": 2,
            "early_stopping_patience": 10,
            "early_stopping_relative_delta": 1e-3,
            "lr": 1e-2,
            "early_stopping_lr_reductions": 1,
            "early_stopping_lr_factor": 0.1,
        }


def test_damaged_seed_is_named_with_its_remedy_then_refit_broken_refits_it(data_file, tmp_path, monkeypatch, capsys):
    from countvae.diagnostics import diagnosis

    def stop_after_fitting(fits, **kwargs):
        raise _Stop

    monkeypatch.setattr(diagnosis, "report", stop_after_fitting)
    out = tmp_path / "d"
    argv = [str(data_file), *FAST, "--out", str(out)]
    with pytest.raises(_Stop):
        run(argv, capsys)
    params = out / "fits" / "fits" / "seed_1" / "model" / "params.pt"
    params.write_bytes(params.read_bytes()[:200])
    kept = (out / "fits" / "fits" / "seed_0" / "model" / "params.pt").read_bytes()

    code, _, err = run(argv, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert str(params) in err and "--refit-broken" in err

    with pytest.raises(_Stop):  # the fits are complete again: the run reaches the report
        run([*argv, "--refit-broken"], capsys)
    assert [p.name.split(".")[0] for p in (out / "fits" / "broken").iterdir()] == ["seed_1"]
    assert (out / "fits" / "fits" / "seed_0" / "model" / "params.pt").read_bytes() == kept
    assert params.stat().st_size > 200


def test_stored_fits_of_other_settings_or_data_are_refused_before_the_block_and_the_warm_up(
    data_file, tmp_path, monkeypatch, capsys
):
    """A resumed run with another --max-epochs printed its block and timed its warm-up, then refused the stored fits."""
    import anndata as ad

    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics import diagnosis
    from countvae.diagnostics.fitting import fit_seeds

    def stop_after_fitting(fits, **kwargs):
        raise _Stop

    monkeypatch.setattr(diagnosis, "report", stop_after_fitting)
    out = tmp_path / "d"
    argv = [*FAST, "--out", str(out)]
    with pytest.raises(_Stop):  # an interrupted run: both seeds stored, no report
        run([str(data_file), *argv], capsys)
    other = ad.read_h5ad(data_file)
    other.X[0, 0] += 1
    other.write_h5ad(tmp_path / "other.h5ad")
    warm_ups = []
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: warm_ups.append(args))
    changes = {
        "train_kwargs": [str(data_file), *argv, "--max-epochs", "4"],
        "model_kwargs": [str(data_file), *argv, "--n-latent", "3"],
        "data: the fits were made on other data": [str(tmp_path / "other.h5ad"), *argv],
    }
    for difference, changed in changes.items():
        code, _, err = run(changed, capsys)
        assert code == 1 and "holds fits made with other settings or data" in err and f"- {difference}" in err
        assert "before fitting" not in err and warm_ups == []
    # the same command resumes, the data's checksum computed once: before the block, and given to the fits
    hashed, fingerprint = [], fit_seeds.data_fingerprint
    monkeypatch.setattr(fit_seeds, "data_fingerprint", lambda *args: hashed.append(args) or fingerprint(*args))
    with pytest.raises(_Stop):
        run([str(data_file), *argv], capsys)
    assert len(hashed) == 1 and len(warm_ups) == 1


def test_a_file_where_a_resumed_seed_is_stored_is_refused_before_any_work(data_file, tmp_path, monkeypatch, capsys):
    """A file at OUT/fits/fits/seed_1 was refused only once seed 1 was fitted, as its folder was moved into place."""
    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics import diagnosis

    def stop_after_fitting(fits, **kwargs):
        raise _Stop

    monkeypatch.setattr(diagnosis, "report", stop_after_fitting)
    out = tmp_path / "d"
    argv = [str(data_file), *FAST, "--out", str(out)]
    with pytest.raises(_Stop):
        run(argv, capsys)
    seed_1 = out / "fits" / "fits" / "seed_1"
    shutil.rmtree(seed_1)
    seed_1.write_text("not a fit")
    warm_ups = []
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: warm_ups.append(args))
    code, _, err = run(argv, capsys)
    assert code == 1 and "before fitting" not in err and warm_ups == [] and "fitted in" not in err
    assert err.strip().endswith(
        f"{seed_1} exists and is not a folder; the fit of seed 1 is stored there: move or rename it, or choose "
        "another out_dir (--out)."
    )
    assert seed_1.read_text() == "not a fit"
