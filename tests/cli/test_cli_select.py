"""``countvae select``: parse the grid, call compare_models, save the comparison; refuse bad input with exit 1."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anndata as ad
import pytest

import countvae as cv
from countvae.cli import main
from countvae.data.gene_selection import highly_variable_genes


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
    assert set(result) == {"recommended", "rule", "margin_nats_per_cell", "n_genes", "gene_selection", "out"}
    assert result["n_genes"] == 30 and result["gene_selection"] is None  # 30 genes: under the default, all kept
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

    def record(adata, runs, fingerprint=None):
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

    def record(adata, runs, fingerprint=None):
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
    assert err.rstrip().endswith("or use another out_dir (--out).")  # the command's option, not only the keyword
    assert not (out / "fits").exists() and not (out / "comparison").exists()


# ----- gene selection and the block printed before fitting ------------------------------------------------------
FAST = ["--n-latent", "1,2", "--decoder", "linear", "--seeds", "2", "--max-epochs", "1", "--n-samples", "10"]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A raw-like file with more genes than the runs below keep."""
    path = tmp_path_factory.mktemp("raw") / "raw.h5ad"
    cv.data.simulate(n_cells=240, n_genes=60, n_latent=2, decoder="linear", seed=1).write_h5ad(path)
    return path


@pytest.fixture
def messages(caplog):
    """The command's log messages (in-process, pytest keeps them from stderr)."""
    caplog.set_level(logging.INFO, logger="countvae.cli")
    return caplog


def _top_genes(path: Path, n: int) -> list[str]:
    adata = ad.read_h5ad(path)
    return list(adata.var_names[highly_variable_genes(adata.X, n)["highly_variable"].to_numpy()])


def _stored_genes(out: Path) -> dict[str, list[str]]:
    """Each stored fit's genes, by candidate folder and seed."""
    return {
        f"{folder.name}/{seed.name}": list(cv.CountVAE.load(seed / "model").var_names)
        for folder in sorted((out / "fits").iterdir())
        if folder.is_dir()
        for seed in sorted((folder / "fits").iterdir())
    }


def _command(*args: str) -> subprocess.CompletedProcess:
    """``python -m countvae`` on this checkout, as an analyst runs it (log messages on stderr)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "countvae", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_select_fits_every_candidate_on_the_chosen_genes(raw, tmp_path, capsys):
    """A raw file with more genes than --n-top-genes: every fit of every candidate on the same 20 most variable genes,
    chosen on the raw counts as diagnose chooses them, and the comparison and the result say how many."""
    out = tmp_path / "sel"
    assert main(["select", str(raw), *FAST, "--n-top-genes", "20", "--out", str(out), "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_genes"] == 20
    assert result["gene_selection"] == {
        "flavor": "seurat_v3",
        "n_top_genes": 20,
        "n_genes_before": 60,
        "counts": "adata.X",
        "batch_key": "",
    }
    assert json.loads((out / "comparison" / "comparison.json").read_text())["n_genes"] == 20
    stored = _stored_genes(out)
    assert len(stored) == 4  # 2 candidates x 2 seeds
    assert all(genes == _top_genes(raw, 20) for genes in stored.values())


def test_select_says_what_it_will_run_on_stderr_before_fitting(raw, tmp_path):
    """As an analyst runs it: the block before fitting on stderr (stdout holds the JSON alone), none with --quiet."""
    out = tmp_path / "sel"
    proc = _command("select", str(raw), *FAST, "--n-top-genes", "20", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n_genes"] == 20  # nothing but the result on stdout
    err = proc.stderr
    block = err[err.index("countvae select: before fitting") :]
    assert "240 cells x 60 genes; 216 cells fitted, 24 held out (24 compared" in block
    assert "the 20 most variable of 60, chosen on the raw counts (seurat_v3; --n-top-genes)" in block
    assert "2 (n_latent 1, 2 x decoder linear x likelihood nb) x 2 seeds = 4 fits" in block
    assert "1 epoch per fit, batch size 128, lr 0.001, early stopping off" in block
    assert "estimate    about" in block and "for the 4 fits" in block and "timed training steps" in block
    assert "for the held-out log p(x) of 24 cells x 4 fits" in block and "at 10 samples" in block
    for option in ("--seeds N", "fewer candidates", "--max-epochs N", "--n-top-genes N", "--n-jobs N"):
        assert option in block
    assert err.index("before fitting") < err.index("Seed 0: fitted")
    assert err.count("minibatch steps per seed") <= 1, "one seed at a time is said once, as the fits begin"
    # --quiet: no block (and no warm-up) before this rerun on other genes stops at the stored fits, in one line
    shutil.rmtree(out / "comparison")  # as a run interrupted before its comparison
    quiet = _command("select", str(raw), *FAST, "--n-top-genes", "25", "--out", str(out), "--json", "--quiet")
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert len(quiet.stderr.strip().splitlines()) == 1 and "holds fits made with other settings or data" in quiet.stderr


def test_the_fitting_estimate_counts_no_more_fits_at_once_than_the_cores_run(raw, tmp_path, messages, monkeypatch):
    """--n-jobs 4 on 2 cores: the estimate divided by 4, as if 4 fits ran at full speed (6 s expected, 67 s taken),
    and left out the workers' start-up, which the warm-up in the calling process does not time."""
    from countvae.cli import select as select_command
    from countvae.diagnostics.fitting import parallelism
    from countvae.diagnostics.reporting import compare_models
    from countvae.model.warmup import TrainingTimeEstimate

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    monkeypatch.setattr(select_command, "available_cores", lambda: 2)
    timing = TrainingTimeEstimate(10.0, 1, 1.0, 10, 100, expected_epochs=1)  # 10 s per fit
    monkeypatch.setattr(select_command, "estimate", lambda *args: timing)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_models, "fit_models", stop)
    assert main(["select", str(raw), *FAST, "--n-jobs", "4", "--out", str(tmp_path / "sel"), "--json"]) == 130
    block = messages.text
    assert "4 seeds at a time, 1 torch thread each" in block  # as the fits will run them
    # 4 fits of 10 s, 2 at a time at full speed, and the workers' start-up (WORKER_START_SECONDS)
    assert "estimate    about 30 s for the 4 fits" in block
    assert "per decoder, latent size and width), about 10 s of it starting the workers" in block
    assert "not counted: reading the data, the stability measures" in block
    # the held-out log p(x) of a fit takes long enough here (about 100 s) for the report to use both cores
    assert "samples, 2 fits at a time; within about a factor 5)" in block


def test_the_lpd_estimate_runs_in_as_many_workers_as_the_report_will(raw, tmp_path, messages, monkeypatch):
    """The block said "2 at a time" (one per core) where the report, whose workers would save less than their
    start-up on 24 cells, estimated every fit in 1."""
    from countvae.cli import select as select_command
    from countvae.diagnostics.fitting import parallelism
    from countvae.diagnostics.reporting import compare_models

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    monkeypatch.setattr(select_command, "available_cores", lambda: 2)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_models, "fit_models", stop)
    assert main(["select", str(raw), *FAST, "--out", str(tmp_path / "sel")]) == 130
    assert "at 10 samples, 1 fit at a time; within about a factor 5)" in messages.text


def test_a_rerun_on_other_genes_refuses_the_stored_fits(raw, tmp_path, capsys, messages, monkeypatch):
    """The fits in OUT/fits are resumed only on the genes they were made on: another --n-top-genes is refused, before
    the block, its warm-ups and any fit, naming the genes, and leaves the stored fits alone."""
    from countvae.cli import select as select_command
    from countvae.model.warmup import TrainingTimeEstimate

    out = tmp_path / "sel"
    assert main(["select", str(raw), *FAST, "--n-top-genes", "20", "--out", str(out), "--quiet"]) == 0
    shutil.rmtree(out / "comparison")  # as a run interrupted before its comparison
    before = _stored_genes(out)
    warm_ups = []
    timing = TrainingTimeEstimate(10.0, 1, 1.0, 10, 100, expected_epochs=1)
    monkeypatch.setattr(select_command, "estimate", lambda *args: warm_ups.append(args) or timing)
    messages.clear()
    assert main(["select", str(raw), *FAST, "--n-top-genes", "25", "--out", str(out)]) == 1
    assert warm_ups == [] and "before fitting" not in messages.text
    err = capsys.readouterr().err
    assert "holds fits made with other settings or data" in err and "differing: genes" in err
    assert "240 cells x 20 genes; this AnnData has 240 x 25" in err
    # how many genes differ and a few of them, not the two whole lists of chosen genes (thousands on real data)
    added = sorted(set(_top_genes(raw, 25)) - set(_top_genes(raw, 20)))
    said = re.search(
        r"0 of the 20 genes the fits were made on are not chosen now, 5 of the 25 chosen now were not \(([^)]*)\)", err
    )
    assert sorted(said.group(1).split(", ")) == added and len(re.findall(r"\bgene\d+\b", err)) == 5
    assert "; --n-top-genes 20 on the same data chooses the recorded genes again" in err
    assert _stored_genes(out) == before


def test_select_keeps_every_gene_with_all_and_diagnoses_default_otherwise(raw, tmp_path, monkeypatch, messages):
    from countvae.diagnostics.reporting import compare_models

    seen = []

    def record(adata, runs, fingerprint=None):
        seen.append(list(adata.var_names))
        raise _Stop

    monkeypatch.setattr(compare_models, "fit_models", record)
    for flag in (["--n-top-genes", "all"], []):
        with pytest.raises(_Stop):
            main(["select", str(raw), *FAST, *flag, "--out", str(tmp_path / "s")])
    assert seen == [list(ad.read_h5ad(raw).var_names)] * 2  # 60 genes: fewer than the default 2,000, all kept
    assert "all 60 (--n-top-genes N keeps the N most variable)" in messages.text
    # with more genes than diagnose's default, that default: its number of most variable genes
    monkeypatch.setattr(compare_models, "DIAGNOSE_N_TOP_GENES", 30)
    with pytest.raises(_Stop):
        main(["select", str(raw), *FAST, "--out", str(tmp_path / "s")])
    assert seen[2] == _top_genes(raw, 30)
    assert "the 30 most variable of 60, chosen on the raw counts (seurat_v3; the default --n-top-genes" in messages.text


@pytest.mark.parametrize(
    ("genes", "message"),
    [
        ("3", "--n-top-genes 3 is fewer than 5 (the latent dimensions); a model cannot have more latent dimensions"),
        ("5", "allow fewer than 5 latent dimensions (5 of 60: --n-top-genes 5, 216 fit cells)"),
    ],
)
def test_a_latent_size_larger_than_the_chosen_genes_allow_is_refused_before_fitting(
    raw, tmp_path, monkeypatch, capsys, genes, message
):
    def fail(*args, **kwargs):
        raise AssertionError("fitted")

    monkeypatch.setattr("countvae.diagnostics.reporting.compare_models.fit_models", fail)
    argv = ["select", str(raw), "--n-latent", "2,5", "--n-top-genes", genes, "--out", str(tmp_path / "s"), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s" / "fits").exists()
