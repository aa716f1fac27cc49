"""First contact on a raw file: the block printed before fitting, the warm-up estimate, --n-top-genes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.cli import main
from countvae.cli.first_contact import expected_seconds, n_jobs_value
from countvae.data.gene_selection import highly_variable_genes
from countvae.diagnostics.fitting import parallelism
from countvae.diagnostics.fitting.parallelism import Parallelism
from countvae.diagnostics.reporting.heldout_lpd import WORKER_START_SECONDS
from countvae.model import warmup
from countvae.model.training import default_max_epochs

FAST_DIAGNOSE = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "3", "--n-lpd-samples", "5"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", n_batches=2, seed=5)
    path = tmp_path_factory.mktemp("data") / "raw.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.fixture
def messages(caplog):
    caplog.set_level(logging.INFO, logger="countvae.cli")
    return caplog


def _block(caplog) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "countvae.cli"]
    start = next(i for i, line in enumerate(lines) if line.endswith("before fitting"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start:end]  # the header and its indented lines


def test_the_diagnose_estimate_counts_no_more_seeds_at_once_than_the_cores_run(
    data_file, tmp_path, messages, monkeypatch
):
    # --n-jobs 4 on 2 cores: 4 seeds were expected in one round, as if 4 fits ran at full speed on 2 cores
    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics.diagnosis import DiagnosePlan

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    timing = warmup.TrainingTimeEstimate(10.0, 1, 1.0, 10, 100, expected_epochs=1)  # 10 s per seed
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: timing)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(DiagnosePlan, "fit", stop)
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--seeds", "4", "--n-jobs", "4", "--out", str(tmp_path / "d")]
    assert main(argv) == 130
    block = "\n".join(_block(messages))
    assert "4 seeds at a time, 1 torch thread each" in block  # as the fits will run them
    # 2 at a time at full speed, and the workers' start-up, which the warm-up does not time
    assert "about 10 s per seed, about 30 s for 4 seeds (" in block and "about 10 s of it starting the workers" in block


def test_diagnose_seed_messages_time_the_fits_not_the_planning_and_warm_up(data_file, tmp_path, messages, monkeypatch):
    """The clock started before the gene selection, the checks and the warm-up, counted as if each seed spent them."""
    import re
    import time

    from countvae.cli import diagnose as diagnose_command

    warm_up = diagnose_command.estimate

    def slow_warm_up(*args):
        time.sleep(4.0)
        return warm_up(*args)

    monkeypatch.setattr(diagnose_command, "estimate", slow_warm_up)
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--n-jobs", "1", "--out", str(tmp_path / "d")]
    assert main(argv) == 0
    done = [r.getMessage() for r in messages.records if "of 2 seeds done" in r.getMessage()]
    first = re.match(r"1 of 2 seeds done \((\d+) s elapsed; about (\d+) s left\)\.", done[0])
    assert first is not None, done
    # 3 epochs of 225 cells take well under the 4 s the warm-up slept
    assert int(first.group(1)) < 4 and int(first.group(2)) < 4, done


def test_diagnose_prints_size_settings_estimate_and_shortcuts_then_records_genes(
    data_file, tmp_path, messages, capsys, monkeypatch
):
    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)  # room for 2 seeds at once, whatever runs the test
    out = tmp_path / "diag"
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--batch-key", "batch", "--n-top-genes", "15"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    block = "\n".join(_block(messages))
    assert "countvae diagnose: before fitting" in block
    assert "300 cells x 40 genes; 225 cells fitted, 75 held out" in block  # a small file: a quarter held out
    assert "the 15 most variable of 40, chosen on the raw counts (seurat_v3; --n-top-genes)" in block
    assert "nb likelihood, linear decoder, 2 latent dimensions" in block
    assert "2 seeds x 3 epochs, batch size 128" in block and "early stopping on" in block  # diagnose's default
    assert "s per seed, about" in block and "for 2 seeds" in block and "timed training steps" in block
    for option in ("--n-jobs N", "--max-epochs N", "--n-top-genes N", "early stopping is on"):
        assert option in block
    # --n-jobs auto (the default), as the fits decided it: 3 epochs of 2 minibatches end before workers would start,
    # so one seed at a time (the block said 2 seeds at a time: it did not count the minibatch steps)
    fitted = json.loads((out / "report" / "report.json").read_text())["settings"]["fits"]["parallelism"]
    assert fitted == Parallelism(1, 1, "").describe() and f"epochs), {fitted}" in block
    # The block comes before any seed is fitted.
    lines = [r.getMessage() for r in messages.records]
    assert lines.index("countvae diagnose: before fitting") < min(i for i, m in enumerate(lines) if "seeds done" in m)

    result = json.loads(capsys.readouterr().out)
    assert result["n_genes"] == 15
    # the printed estimate (present with log messages on; 3 epochs round to about 0 s) and the time it estimates
    assert result["seconds_seed_fits_estimated"] >= 0 and 0 < result["seconds_seed_fits"] <= result["seconds_fitting"]
    assert result["gene_selection"] == {
        "flavor": "seurat_v3",
        "n_top_genes": 15,
        "n_genes_before": 40,
        "counts": "adata.X",
        "batch_key": "batch",
    }
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", n_batches=2, seed=5)
    batches = adata.obs["batch"].astype(str).to_numpy()
    expected = list(adata.var_names[highly_variable_genes(adata.X, 15, batches)["highly_variable"].to_numpy()])
    recorded = json.loads((out / "report" / "report.json").read_text())["settings"]["fits"]["gene_selection"]
    assert recorded["genes"] == expected and recorded["n_top_genes"] == 15
    assert "gene selection" in (out / "report" / "report.html").read_text()


def test_fit_prints_the_block_and_records_the_genes(data_file, tmp_path, messages, capsys):
    out = tmp_path / "fit"
    argv = ["fit", str(data_file), "--n-latent", "2", "--max-epochs", "2", "--n-samples", "5", "--n-top-genes", "12"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    block = "\n".join(_block(messages))
    assert "countvae fit: before fitting" in block and "1 fit x 2 epochs" in block
    assert "the 12 most variable of 40" in block and "s per fit" in block
    assert "--n-jobs" not in block  # fit has no such option
    assert "--max-epochs N" in block and "early stopping is on: a fit stops" in block  # the default
    # the held-out log p(x) after training (on every held-out cell) is part of the estimate, with its options
    assert "then about" in block and "for the held-out log p(x) of 30 cells" in block
    assert "--heldout-fraction F holds out fewer cells" in block and "--n-samples N" in block
    # at the draws asked for, not at the default's
    assert "ms per cell at 5 draws, within" in block and "draws fewer per cell (now 5; default 800)" in block
    result = json.loads(capsys.readouterr().out)
    assert result["n_genes"] == 12 and result["gene_selection"]["n_top_genes"] == 12
    assert len(json.loads((out / "fit.json").read_text())["gene_selection"]["genes"]) == 12
    messages.clear()
    assert main([*argv, "--no-early-stopping", "--out", str(tmp_path / "full"), "--json"]) == 0
    block = "\n".join(_block(messages))
    assert "lr 0.001, early stopping off" in block and "--early-stopping stops when the validation loss stalls" in block
    assert json.loads(capsys.readouterr().out)["training"]["epochs_trained"] == 2


def test_quiet_skips_the_warmup(data_file, tmp_path, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise AssertionError("the warm-up ran under --quiet")

    monkeypatch.setattr("countvae.cli.first_contact.estimate_training_time", fail)
    argv = ["fit", str(data_file), "--n-latent", "2", "--max-epochs", "1", "--n-samples", "5", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "q")]) == 0
    assert "before fitting" not in capsys.readouterr().err


def test_default_keeps_all_genes_of_small_data_and_all_keeps_every_gene(data_file, tmp_path, messages):
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--no-ica", "--n-top-genes", "all"]
    assert main([*argv, "--out", str(tmp_path / "all"), "--quiet"]) == 0
    report = json.loads((tmp_path / "all" / "report" / "report.json").read_text())
    assert "gene_selection" not in report["settings"]["fits"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-top-genes", "41"], "more than the 40 genes"),
        (["--n-top-genes", "1"], "fewer than 2 (the latent dimensions)"),
        (["--n-top-genes", "10", "--markers", "gene0,gene1,gene2,gene3,gene4"], "not among the 10 most variable"),
    ],
)
def test_gene_selection_errors_are_one_line(data_file, tmp_path, capsys, extra, message):
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, *extra, "--out", str(tmp_path / "x")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and not (tmp_path / "x").exists()


def test_n_top_genes_must_be_positive_or_all(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit", "--n-top-genes", "0"])
    assert info.value.code == 2 and "positive integer or 'all'" in capsys.readouterr().err


class FakeClock:
    """perf_counter for the warm-up: each call advances by the next step."""

    def __init__(self, steps):
        self.now, self.steps = 0.0, list(steps)

    def __call__(self):
        self.now += self.steps.pop(0)
        return self.now


def test_warmup_extrapolates_the_timed_pass_per_cell_and_restores_threads(monkeypatch):
    adata = cv.data.simulate(n_cells=2000, n_genes=30, n_latent=2, decoder="linear", seed=6)
    cv.data.setup_anndata(adata)
    # started at 1; the untimed pass ends at 1 + 5; the timed pass takes 2 s; total read 1 s later.
    monkeypatch.setattr(warmup, "perf_counter", FakeClock([1.0, 5.0, 2.0, 1.0]))
    threads = torch.get_num_threads()
    rng_state = torch.random.get_rng_state()
    est = warmup.estimate_training_time(
        adata,
        {"n_latent": 2},
        {"batch_size": 50, "max_epochs": None, "early_stopping": False},
        n_steps=4,
        torch_threads=1,
    )
    monkeypatch.undo()
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng_state)
    # 4 minibatches of 50 training cells plus validation cells in the fit's proportion (0.9 / 0.1).
    assert est.warmup_steps == 4 and est.warmup_cells == 200 + 22
    assert est.seconds_per_epoch == pytest.approx(2.0 / 222 * 2000)
    assert est.epochs == default_max_epochs(1800) and est.warmup_seconds == pytest.approx(8.0)
    assert est.seconds_per_fit == pytest.approx(est.epochs * est.seconds_per_epoch)
    given = warmup.estimate_training_time(adata, {"n_latent": 2}, {"max_epochs": 7, "early_stopping": False}, n_steps=1)
    assert given.epochs == 7 and given.warmup_cells == min(2000, 128 + 14)
    assert est.expected_epochs == est.epochs  # no early stopping: every epoch


def test_estimate_expects_the_stop_of_the_shared_rule():
    adata = cv.data.simulate(n_cells=300, n_genes=20, n_latent=2, decoder="linear", seed=7)
    cv.data.setup_anndata(adata)
    stopping = warmup.estimate_training_time(adata, {"n_latent": 2}, {"max_epochs": 400, "early_stopping": True})
    assert stopping.epochs == 400
    assert stopping.expected_epochs == warmup.expected_stop_epoch(20, 270, 400) == 123
    assert stopping.seconds_per_fit == pytest.approx(stopping.expected_epochs * stopping.seconds_per_epoch)
    other_rule = {"max_epochs": 400, "early_stopping": True, "early_stopping_patience": 3}
    assert warmup.estimate_training_time(adata, {"n_latent": 2}, other_rule).expected_epochs == 400
    assert warmup.expected_stop_epoch(10**9, 10**6, 400) == warmup.MIN_STOP_EPOCH == 24  # 2 stages x (10 + 2)
    assert warmup.expected_stop_epoch(300, 2430, 30) == 30  # never beyond max_epochs
    # the embedded data (300 genes, 2,430 training cells) and Kang at diagnose's defaults (2,000 x 7,034)
    assert (warmup.expected_stop_epoch(300, 2430, 400), warmup.expected_stop_epoch(2000, 7034, 400)) == (63, 40)


#: Epochs at which the shared rule (with its learning-rate cut) stopped fits, by genes and training cells
#: (benchmarks/RESULTS.md, sections stopping-vs-full and stopping-variants): the embedded data and its variants
#: (linear, Poisson, ZINB, Laplace prior, horseshoe loadings, 2-d); 600 simulated cells; Kang (all, 3,000 cells, a
#: small file of 1,400 on 500 genes), pbmc_3tech (default, 2 layers, ZINB 20-d), simulated 3,000 (high depth) and
#: 10,000 cells; pbmc_small.
MEASURED_STOPS = {
    (300, 2430): [48, 58, 68, 56, 82, 48, 56, 70, 50],
    (300, 486): [74, 76, 82],
    (500, 1134): [52, 58],
    (2000, 7034): [32],
    (2000, 2430): [34, 34, 40, 58],
    (2000, 1620): [40, 40, 54, 40],
    (2000, 8100): [40],
    (230, 65): [60],
}


def test_expected_stop_is_within_the_stated_factor_of_every_measured_stop():
    ratios = [
        max(stop, predicted) / min(stop, predicted)
        for (genes, cells), stops in MEASURED_STOPS.items()
        for predicted in [warmup.expected_stop_epoch(genes, cells, 400)]
        for stop in stops
    ]
    assert max(ratios) <= 1.5


def test_expected_seconds_counts_rounds_of_parallel_seeds_the_cores_and_the_workers_start_up(monkeypatch):
    """Known answers on 2 usable cores, 20 s a fit: rounds of n_jobs seeds, no faster than 2 fits at full speed, and
    the workers' start-up (WORKER_START_SECONDS) whenever seeds run in workers."""
    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    timing = warmup.TrainingTimeEstimate(
        seconds_per_epoch=0.5, epochs=400, warmup_seconds=1.0, warmup_steps=10, warmup_cells=100, expected_epochs=40
    )
    start = WORKER_START_SECONDS

    def jobs(n: int) -> Parallelism:
        return Parallelism(n, 1, "")

    assert expected_seconds(timing, seeds=5, jobs=jobs(2)) == pytest.approx(3 * 20.0 + start)  # 2 + 2 + 1 seeds
    assert expected_seconds(timing, seeds=2, jobs=jobs(8)) == pytest.approx(20.0 + start)  # more workers than seeds
    assert expected_seconds(timing, seeds=3, jobs=jobs(3)) == pytest.approx(1.5 * 20.0 + start)  # 3 on 2 cores
    assert expected_seconds(timing, seeds=3, jobs=jobs(1)) == pytest.approx(60.0)  # in this process, no start-up
    assert expected_seconds(timing, seeds=3, jobs=None) == pytest.approx(60.0)  # one at a time


def test_warmup_leaves_fits_unchanged():
    adata = cv.data.simulate(n_cells=300, n_genes=20, n_latent=2, decoder="linear", seed=7)
    cv.data.setup_anndata(adata)

    def fit():
        model = cv.CountVAE(adata, n_latent=2, decoder="linear")
        model.train(max_epochs=2, seed=3, progress_bar=False)
        return model.get_latent_representation()

    before = fit()
    warmup.estimate_training_time(adata, {"n_latent": 2, "decoder": "linear"}, {"max_epochs": 2}, n_steps=2)
    np.testing.assert_array_equal(fit(), before)


def test_n_jobs_option_takes_auto_minus_one_or_a_positive_number():
    assert [n_jobs_value(t) for t in ("auto", "AUTO", "-1", "3")] == ["auto", "auto", -1, 3]
    for bad in ("0", "-2", "all", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected 'auto', -1 or a positive integer"):
            n_jobs_value(bad)


def test_parallelism_is_described_in_words():
    assert Parallelism(2, 1, "").describe() == "2 seeds at a time, 1 torch thread each"
    assert Parallelism(1, 4, "").describe() == "1 seed at a time, 4 torch threads each"


def test_the_held_out_log_p_x_estimate_follows_the_draws_asked_for(messages):
    """The printed per-cell time of the held-out log p(x) scales with ``--n-samples`` as a cell costing as much as
    ``LPD_FIXED_DRAWS`` (300) draws besides its own, and names the draws it assumes. Known answers, with 330 fit cells
    and 1 s per epoch (``LPD_CELL_EPOCHS`` 330: 1 s per cell at the default 800 draws): 1000 ms at the default,
    (300 + 3200) / 1100 = 3.18 s at 3200 draws and 400 / 1100 = 364 ms at 100 (not the default's time whatever the
    draws, nor the proportional 4 s and 125 ms)."""
    from countvae.cli.first_contact import DEFAULT_DRAWS, HeldoutLpd, announce
    from countvae.data import choose_genes
    from countvae.model import TrainingTimeEstimate

    adata = cv.data.simulate(n_cells=341, n_genes=20, n_latent=2, seed=0)
    cv.CountVAE.setup_anndata(adata)
    timing = TrainingTimeEstimate(1.0, 10, 1.0, 10, 1280, 10)
    model = {"n_layers": 1, "n_hidden": 16, "likelihood": "nb", "decoder": "mlp", "n_latent": 2}
    genes = choose_genes(adata, None, None, 2)
    common = {"data": "x.h5ad", "adata": adata, "n_fit": 330, "n_heldout": 11, "genes": genes}
    expected = {
        None: "(1000 ms per cell at 800 draws (the default), within about a factor 5)",
        3200: "(3182 ms per cell at 3200 draws, within about a factor 5)",
        100: "(364 ms per cell at 100 draws, within about a factor 5)",
    }
    for n_samples, text in expected.items():
        messages.clear()
        announce(
            "fit",
            **common,
            model_kwargs=model,
            train_kwargs={"batch_size": 128, "early_stopping": False},
            epochs=10,
            timing=timing,
            heldout_lpd=HeldoutLpd(11, DEFAULT_DRAWS if n_samples is None else n_samples),
        )
        block = "\n".join(r.getMessage() for r in messages.records)
        assert text in block
        now = "800, the default" if n_samples is None else f"{n_samples}; default 800"
        assert f"--n-samples N draws fewer per cell (now {now})" in block


def test_counts_of_one_are_singular_in_the_block(messages):
    """The block printed "2 seeds x 1 epochs", "x 1 epochs, from 1 timed training steps" and "1 latent dimensions"."""
    from countvae.cli.first_contact import announce
    from countvae.data import choose_genes
    from countvae.model import TrainingTimeEstimate

    adata = cv.data.simulate(n_cells=200, n_genes=20, n_latent=1, seed=0)
    cv.CountVAE.setup_anndata(adata)
    model = {"n_layers": 1, "n_hidden": 16, "likelihood": "nb", "decoder": "mlp", "n_latent": 1}
    announce(
        "diagnose",
        data="x.h5ad",
        adata=adata,
        n_fit=199,
        n_heldout=1,
        genes=choose_genes(adata, None, None, 1),
        model_kwargs=model,
        train_kwargs={"batch_size": 128, "early_stopping": False},
        epochs=1,
        timing=TrainingTimeEstimate(1.0, 1, 1.0, 1, 128, 1),
        seeds=2,
        n_jobs=1,
        cores=1,
        torch_threads=1,
    )
    block = "\n".join(r.getMessage() for r in messages.records)
    assert "199 cells fitted, 1 held out" in block and "1 latent dimension, 1 hidden layer of 16" in block
    assert (
        "2 seeds x 1 epoch, batch size 128" in block
        and "(1.00 s per epoch x 1 epoch, from 1 timed training step)" in block
    )
    assert "this machine has 1 usable core)" in block


def test_the_memory_warning_is_logged_once_by_the_fits_not_by_the_block(data_file, tmp_path, caplog, monkeypatch):
    """With memory for one worker only, the block printed before fitting logged the warning, and the fits again."""
    room = 1.5 * parallelism.WORKER_BASE_BYTES / parallelism.MEMORY_SHARE  # one worker's copy of these small data fits
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(room))
    caplog.set_level(logging.INFO, logger="countvae")
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--n-jobs", "2", "--no-ica", "--out", str(tmp_path / "d")]
    assert main(argv) == 0
    warned = [r.getMessage() for r in caplog.records if "at a time instead of 2" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("Fitting 1 seed at a time instead of 2: 2 workers would need")
    block = "\n".join(_block(caplog))
    assert "1 seed at a time, 1 torch thread each" in block


def test_a_resumed_diagnose_plans_and_estimates_only_the_seeds_left(data_file, tmp_path, messages, monkeypatch):
    """The block planned and timed every seed although the fits reuse the stored ones: with 1 of 3 seeds left and
    --n-jobs 2 it said "3 seeds x 3 epochs ... 2 seeds at a time" and "about 20 s for 3 seeds"."""
    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics.diagnosis import DiagnosePlan

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    messages.set_level(logging.INFO, logger="countvae")  # and the fits' messages
    fit = DiagnosePlan.fit

    def first_two_then_stop(plan, out_dir, progress=None, fingerprint=None):  # an interrupted run: 0 and 1 stored
        fit(dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, seeds=[0, 1])), out_dir, progress)
        raise KeyboardInterrupt

    out = tmp_path / "d"
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--seeds", "3", "--n-jobs", "2", "--no-ica", "--out", str(out)]
    monkeypatch.setattr(DiagnosePlan, "fit", first_two_then_stop)
    assert main(argv) == 130
    monkeypatch.setattr(DiagnosePlan, "fit", fit)
    timing = warmup.TrainingTimeEstimate(10.0, 1, 1.0, 10, 100, expected_epochs=1)  # 10 s per seed
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: timing)
    messages.clear()
    assert main([*argv, "--json"]) == 0
    block = "\n".join(_block(messages))
    assert "1 seed x 3 epochs (2 seeds stored by an earlier run, reused if made with these settings and data)" in block
    assert "changing a fit's settings or data refuses the stored seeds; --overwrite refits them all" in block
    assert "1 seed at a time, 1 torch thread each" in block and "about 10 s for 1 seed" in block
    fitting = [r.getMessage() for r in messages.records if r.getMessage().startswith("Fitting ")]
    assert len(fitting) == 1 and fitting[0].startswith("Fitting 1 seed")  # as the fits planned it
    assert fitting[0].endswith(": 1 seed at a time, 1 torch thread each (n_jobs as given).")


def test_with_refit_broken_the_diagnose_block_counts_a_damaged_stored_seed(data_file, tmp_path, messages, monkeypatch):
    """With --refit-broken and seed 1's params.pt emptied, the block said "0 seeds x 3 epochs" and "about 0 s for 0
    seeds" (so did --json's seconds_seed_fits_estimated), then the fits refitted seed 1."""
    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics import diagnosis

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(diagnosis, "report", stop)  # the seeds are stored, the report not made
    out = tmp_path / "d"
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--n-jobs", "1", "--no-ica", "--out", str(out)]
    with pytest.raises(Stop):
        main(argv)
    (out / "fits" / "fits" / "seed_1" / "model" / "params.pt").write_bytes(b"")
    timing = warmup.TrainingTimeEstimate(10.0, 1, 1.0, 10, 100, expected_epochs=1)  # 10 s per seed
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: timing)
    messages.set_level(logging.INFO, logger="countvae")  # and the fits' messages
    messages.clear()
    with pytest.raises(Stop):
        main([*argv, "--refit-broken"])
    block = "\n".join(_block(messages))
    assert "1 seed x 3 epochs (1 seed stored by an earlier run, reused if made with these settings and data)" in block
    assert "about 10 s for 1 seed" in block
    assert "refitting that seed" in messages.text and "Fitting 1 seed" in messages.text  # as the block said


def test_a_damaged_stored_seed_and_a_foreign_fits_folder_are_refused_before_the_block(
    data_file, tmp_path, messages, monkeypatch, capsys
):
    """Without --refit-broken a damaged stored seed was refused only after the block and the timed warm-up (and then
    named all damaged seeds at once), and so was an OUT/fits holding other entries and no manifest ("not a fit_seeds
    output folder")."""
    from countvae.cli import diagnose as diagnose_command
    from countvae.diagnostics import diagnosis

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(diagnosis, "report", stop)  # the seeds are stored, the report not made
    out = tmp_path / "d"
    argv = ["diagnose", str(data_file), *FAST_DIAGNOSE, "--n-jobs", "1", "--no-ica", "--out", str(out)]
    with pytest.raises(Stop):
        main(argv)
    for seed in (0, 1):
        (out / "fits" / "fits" / f"seed_{seed}" / "model" / "params.pt").write_bytes(b"")
    monkeypatch.setattr(diagnose_command, "estimate", stop)  # the warm-up
    messages.clear()
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err  # every damaged seed at once, as the fits name them
    assert "2 stored fits are damaged" in err and "seed_0" in err and "seed_1" in err
    assert "before fitting" not in messages.text
    foreign = tmp_path / "e"
    (foreign / "fits").mkdir(parents=True)
    (foreign / "fits" / "notes.txt").write_text("mine")
    argv[argv.index(str(out))] = str(foreign)
    assert main(argv) == 1
    assert "is not a fit_seeds output folder" in capsys.readouterr().err and "before fitting" not in messages.text
    assert (foreign / "fits" / "notes.txt").read_text() == "mine"


def test_the_diagnose_block_estimates_the_report_s_held_out_log_p_x(data_file, tmp_path, messages, monkeypatch):
    """diagnose's block left out the report's held-out log p(x), which select's counts: every seed's, on at most
    ``max_lpd_cells`` held-out cells at ``--n-lpd-samples`` draws, by the helper fit and select use, run as the
    report runs them. Known answer: 0.1 s per epoch on 225 fit cells at 5 draws is 330 x 0.1 / 225 x 305 / 1100 =
    41 ms per cell and fit; 75 cells, 3 s a fit; the second fit's 3 s would not pay for workers' start, so 6 s."""
    from countvae.cli import diagnose as diagnose_command
    from countvae.cli.first_contact import lpd_seconds_per_cell
    from countvae.diagnostics.diagnosis import DiagnosePlan

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    monkeypatch.setattr(DiagnosePlan, "fit", stop)
    timing = warmup.TrainingTimeEstimate(0.1, 1, 1.0, 10, 100, expected_epochs=1)
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: timing)
    assert main(["diagnose", str(data_file), *FAST_DIAGNOSE, "--out", str(tmp_path / "d")]) == 130
    block = "\n".join(_block(messages))
    assert round(1000 * lpd_seconds_per_cell(timing, 225, 5)) == 41
    assert "then about 6 s for the held-out log p(x) of 75 cells x 2 fits (41 ms per cell and fit at 5 draws" in block
    assert "5 draws, 1 fit at a time, within about a factor 5)" in block
    # a backed file's reads slow its fits, not the held-out cells' log p(x), which the report computes in memory
    read_too = warmup.TrainingTimeEstimate(0.25, 1, 1.0, 10, 100, expected_epochs=1, read_seconds_per_epoch=0.15)
    assert lpd_seconds_per_cell(read_too, 225, 5) == pytest.approx(lpd_seconds_per_cell(timing, 225, 5))
    # 10x slower and 5 seeds: the 4 fits after the first (30.5 s each) go to 2 workers, which start in about 10 s
    slower = warmup.TrainingTimeEstimate(1.0, 1, 1.0, 10, 100, expected_epochs=1)
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: slower)
    messages.clear()
    assert main(["diagnose", str(data_file), *FAST_DIAGNOSE, "--seeds", "5", "--out", str(tmp_path / "e")]) == 130
    block = "\n".join(_block(messages))
    assert "about 1.7 min for the held-out log p(x) of 75 cells x 5 fits (407 ms per cell and fit" in block
    assert "2 fits at a time" in block
    assert "--n-lpd-samples N draws fewer per cell (now 5; default 100)" in block


def test_the_diagnose_block_plans_the_memory_of_workers_reading_a_backed_file(data_file, messages, monkeypatch):
    """On a backed file the block estimated each worker's memory from the fit cells read into memory (a copy each,
    held twice while received), where the workers read the file (its layers whole, none here): with room for two
    workers reading it, the block planned one seed at a time, and the fits then ran two."""
    import anndata as ad

    from countvae.cli import diagnose as diagnose_command
    from countvae.data.backed import read_into_memory
    from countvae.data.file_cells import FileCells
    from countvae.diagnostics import plan_diagnose

    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)
    adata = ad.read_h5ad(data_file, backed="r")
    cv.CountVAE.setup_anndata(adata)
    model = {"n_latent": 2, "likelihood": "nb", "decoder": "linear", "n_layers": 1, "n_hidden": 16}  # as the CLI's
    train = {"max_epochs": 3, "batch_size": 128}
    settings = cv.diagnostics.DiagnoseSettings(seeds=2, n_jobs=2, model_kwargs=model, train_kwargs=train)
    plan = plan_diagnose(adata, settings=settings).split()
    # what each in-memory worker's copy would weigh (the plan's fit cells stay in the file)
    in_memory = parallelism.counts_nbytes(read_into_memory(plan.adata_fit))
    room = (2 * parallelism.WORKER_BASE_BYTES + in_memory) / parallelism.MEMORY_SHARE  # two backed workers fit
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(room))
    monkeypatch.setattr(diagnose_command, "estimate", lambda *args: None)
    diagnose_command._Observer(str(data_file), diagnose_command.SeedProgressMessages(2)).before_fitting(plan)
    assert "2 seeds at a time" in "\n".join(_block(messages))
    assert isinstance(plan.fit_data, FileCells)  # what the fits give the workers
    assert parallelism.worker_memory_estimate(plan.fit_data) == parallelism.WORKER_BASE_BYTES  # no layers to read
    # with room for one, the plan's reason names what the workers hold: the file's layers, not a copy of the data
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(1.5 * parallelism.WORKER_BASE_BYTES))
    reason = plan.parallelism().reason
    assert "the file's layers, read whole" in reason and "0.78 GiB each" in reason
