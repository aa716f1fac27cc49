"""Every benchmark script runs end to end in its --quick mode and writes only its own RESULTS.md sections."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_script(name: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n<!-- section: other -->\nkept as is\n<!-- end: other -->\n")
    return path


def _section(text: str, name: str) -> str:
    start = text.index(f"<!-- section: {name} -->")
    return text[start : text.index(f"<!-- end: {name} -->", start)]


def test_write_section_replaces_only_its_own(results):
    common = _module("_common")
    common.write_section(results, "mine", "first")
    common.write_section(results, "mine", "second")
    text = results.read_text()
    assert text.count("<!-- section: mine -->") == 1 and "second" in text and "first" not in text
    assert "kept as is" in text


def test_matmul_flop_count_of_a_step():
    flops = _module("bench_flops").step_matmul_flops(batch=128, genes=2000, hidden=128, latent=10, covariates=0)
    # encoder first layer: forward + weight gradient (its input is data); decoder output: forward + 2 gradients
    assert flops["encoder hidden (genes -> hidden)"] == 2 * 2 * 128 * 2000 * 128
    assert flops["decoder output (hidden -> genes)"] == 3 * 2 * 128 * 128 * 2000
    assert flops["encoder covariates"] == 0


def test_bench_training_quick(results, tmp_path):
    out = _run_script(
        "bench_training",
        "--quick",
        "--runners",
        "countvae-pyro,scvi",
        "--results",
        str(results),
        "--data-dir",
        str(tmp_path),
    )
    assert "countvae-pyro" in out and "scvi" in out
    text = results.read_text()
    body = _section(text, "training-sim600x120")
    assert "ratio to SCVI" in body and "QUICK" in body and "kept as is" in text


def test_bench_scale_quick(results, tmp_path):
    plot = tmp_path / "scale.png"
    _run_script("bench_scale", "--quick", "--results", str(results), "--data-dir", str(tmp_path), "--plot", str(plot))
    body = _section(results.read_text(), "scale")
    assert "2000" in body and "peak RSS MiB" in body
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "name",
    ["bench_lpd", "bench_flops", "bench_gpu", "bench_diagnose_budget", "bench_profile", "bench_stopping_small_files"],
)
def test_in_process_benchmarks_quick(name, results):
    _module(name).main(["--quick", "--results", str(results)])
    section = {
        "bench_lpd": "lpd",
        "bench_flops": "flops",
        "bench_gpu": "gpu",
        "bench_diagnose_budget": "diagnose-budget",
        "bench_profile": "profile",
        "bench_stopping_small_files": "stopping-small-files",
    }
    body = _section(results.read_text(), section[name])
    assert "QUICK" in body and "Command:" in body
    if name == "bench_gpu":  # issue 17: the peer's time per epoch on the same device, in the same run
        assert "| SCVI s/epoch |" in body and "countvae / SCVI per epoch" in body


def test_bench_profile_with_the_workers_allocator_says_so(results):
    # in its own process: the allocator's settings are process-wide
    _run_script("bench_profile", "--quick", "--keep-freed-memory", "--results", str(results))
    body = _section(results.read_text(), "profile")
    assert "QUICK" in body and "keeps freed memory" in body


def test_bench_lpd_workers_quick(results, tmp_path):
    args = ["--quick", "--datasets", "embedded", "--rounds", "1", "--work", str(tmp_path), "--results", str(results)]
    _module("bench_lpd_workers").main(args)
    body = _section(results.read_text(), "report-lpd-workers")
    assert "QUICK" in body and "Command:" in body
    assert "| embedded | 2 x 300 | True |" in body  # one thread: the same numbers here and in workers
    assert "kept as is" in results.read_text()


def test_simulate_h5ad_writes_chunked_csr_counts_atomically(tmp_path):
    import anndata as ad
    import numpy as np

    from countvae._io import atomic_file_path

    common = _module("_common")
    path = common.simulate_h5ad(tmp_path / "sim.h5ad", n_cells=250, n_genes=30, seed=3, chunk_cells=100)
    backed = ad.read_h5ad(path, backed="r")
    assert backed.shape == (250, 30) and backed.X.format == "csr"
    memory = ad.read_h5ad(path)
    counts = memory.X.toarray()
    assert np.array_equal(counts, np.round(counts)) and (counts >= 0).all() and (counts.sum(1) > 0).all()
    # the same seed and chunking give the same file
    again = common.simulate_h5ad(tmp_path / "again.h5ad", n_cells=250, n_genes=30, seed=3, chunk_cells=100)
    assert np.array_equal(ad.read_h5ad(again).X.toarray(), counts)
    # a failing writer leaves nothing behind
    with pytest.raises(RuntimeError), atomic_file_path(tmp_path / "broken.h5ad") as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("writer failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.h5ad", "sim.h5ad"]


def test_bench_de_quick(results, tmp_path):
    figure = tmp_path / "de.png"
    _run_script("bench_de", "--quick", "--results", str(results), "--figure", str(figure))
    body = _section(results.read_text(), "de-known-truth")
    assert "QUICK" in body and "Command:" in body and "sensitivity" in body and "Jaccard min" in body
    assert "| scvi |" in body and "| countvae |" in body
    assert figure.read_bytes()[:4] == b"\x89PNG"


def test_time_to_quality_counts_setup_training_and_every_kth_validation():
    bench = _module("bench_time_to_quality")
    run = {
        "setup_seconds": 1.0,
        "rows": [{"epoch": e, "train_s": 2.0, "val_s": 0.5} for e in range(1, 7)],
        "checkpoints": [{"epoch": 2, "lpd": -10.0}, {"epoch": 4, "lpd": -5.0}, {"epoch": 6, "lpd": -4.0}],
    }
    # epoch 4 is the first check at or above -6: set-up 1 + 4 epochs x 2 s + validations at epochs 2 and 4
    assert bench.time_to_quality(run, target=-6.0, check_every=2) == (1.0 + 8.0 + 1.0, 4)
    # validation every 3 epochs: only epoch 3's counts before epoch 4
    assert bench.time_to_quality(run, target=-6.0, check_every=3) == (1.0 + 8.0 + 0.5, 4)
    seconds, epoch = bench.time_to_quality(run, target=-1.0, check_every=2)
    assert math.isnan(seconds) and epoch is None


def test_bench_time_to_quality_quick_stops_at_scvis_quality(results, tmp_path):
    args = ("--quick", "--stop-at-target", "--results", str(results), "--data-dir", str(tmp_path))
    _run_script("bench_time_to_quality", *args, "--countvae-kl-warmup", "5", "--countvae-adam-eps", "0.01")
    body = _section(results.read_text(), "time-to-quality-quick")
    assert "QUICK" in body and "Command:" in body and "SCVIFit.log_predictive_density" in body
    assert "`train(kl_warmup_epochs=5, adam_eps=0.01, weight_decay=0)`" in body and "- sim600, SCVI" in body
    assert "| sim600 |" in body and "time-to-quality ratio" in body and "kept as is" in results.read_text()


def test_stop_forecast_is_exact_on_a_power_law_and_replays_the_rule(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its shared module as `_common`
    forecast = _module("stop_forecast")
    epochs = np.arange(1, 401, dtype=float)
    # A loss that is exactly a + b t^-c: the fit to epochs 2..20 recovers it, so the forecast is the rule's own stop.
    curve = 700.0 + 300.0 * epochs**-0.8
    stop = forecast.rule_stop(curve)
    assert 12 <= stop < 400 and forecast.forecast(curve, 20) == stop
    # The rule by hand: a loss that stops improving after epoch 30 ends the fit once patience (10) epochs pass
    # without an improvement that counts (validation every 2 epochs).
    flat = np.where(epochs <= 30, 1000.0 - 10.0 * epochs, 700.0)
    assert forecast.rule_stop(flat) == 40
    # A loss that turns up (overfitting) stops the rule where no decaying curve fitted to the start can predict.
    turning = 700.0 + 300.0 * epochs**-0.8 + 0.05 * np.maximum(epochs - 20, 0) ** 2
    assert forecast.rule_stop(turning) < forecast.forecast(turning, 20) / 1.5


def test_stopping_replay_is_the_package_rule_and_its_window_smooths_the_signal(monkeypatch):
    from countvae.model.training import ConvergenceRule

    monkeypatch.syspath_prepend(str(BENCH))
    stopping = _module("bench_stopping")
    rng = np.random.default_rng(0)
    # Window 1 is the package's rule: the same stop and kept epoch on noisy decreasing curves, several settings.
    for every, patience, delta in [(1, 3, 0.0), (2, 10, 1e-3), (2, 20, 1e-4), (5, 15, 3e-4)]:
        for _ in range(20):
            curve = 800.0 + 200.0 * np.exp(-np.arange(1, 201) / 40.0) + rng.normal(0.0, 2.0, 200)
            rule = ConvergenceRule(patience, delta)
            expected = 200
            for epoch in range(every, 201, every):
                if rule.update(epoch, float(curve[epoch - 1]))[1]:
                    expected = epoch
                    break
            assert stopping.replay(curve, every, patience, delta, 200) == (expected, rule.best_epoch)
    # By hand: a single bad validation after an early low stops the raw rule at epoch 4 (patience 2, kept 2);
    # the mean of the last two losses (8, 7.5, 8, 6, 4.5, ...) keeps improving after epoch 4, so it trains on.
    losses = np.array([10.0, 6.0, 9.0, 7.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5])
    assert stopping.replay(losses, 1, 2, 0.0, 10) == (4, 2)
    assert stopping.replay(losses, 1, 2, 0.0, 10, window=2) == (10, 10)
    # The kept epoch is judged on validations averaged within the half-width: here epochs 2-6 around epoch 4.
    assert stopping.smoothed_validation(losses, 4, half_width=2) == pytest.approx((6 + 9 + 7 + 5 + 4) / 5)


def test_small_files_pairs_each_variant_with_the_shared_rule_cell_by_cell(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    small = _module("bench_stopping_small_files")
    # Patience of at least S steps: 72 training cells are one step an epoch, 360 are three (ceil(360 / 128)).
    assert small._variants(72, [40], 400)["patience >= 40 steps"]["early_stopping_patience"] == 40
    assert small._variants(360, [40], 400)["patience >= 40 steps"]["early_stopping_patience"] == 14
    assert small._variants(5000, [40], 400)["patience >= 40 steps"]["early_stopping_patience"] == 10
    assert small._variants(72, [], 400)[small.FULL_SCHEDULE] == {"max_epochs": 400, "early_stopping": False}

    def record(replicate, variant, lpd):
        return {"n_cells": 80, "replicate": replicate, "variant": variant, "epochs": 60, "seconds": 1.0, "lpd": lpd}

    # Replicate 0: the other variant is 2 nats better on the two cells both estimate reliably (the third is
    # unreliable under the shared rule and left out); replicate 1: 4 nats worse on every cell.
    records = [
        record(0, small.REFERENCE, [-10.0, -20.0, None]),
        record(0, "other", [-8.0, -18.0, -500.0]),
        record(1, small.REFERENCE, [-10.0, -10.0, -10.0]),
        record(1, "other", [-14.0, -14.0, -14.0]),
    ]
    table = small.paired_table(records).set_index("variant")
    # Mean of +2 and -4 is -1; the standard error over replicates is |2 - (-4)| / 2 = 3.
    assert table.loc["other", "minus shared rule (SE over replicates)"] == "-1.00 (3.00)"
    assert table.loc["other", "per replicate"] == "+2.00, -4.00"
    assert table.loc["other", "log p(x) per cell (mean)"] == pytest.approx((-13.0 + -14.0) / 2)
    assert table.loc[small.REFERENCE, "minus shared rule (SE over replicates)"] == "+0.00 (0.00)"


def test_latent_metrics_of_the_stopping_benchmark_have_their_known_values(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    latent_bench = _module("bench_stopping_latent")
    rng = np.random.default_rng(0)
    # Two tight, far-apart clusters of 40 cells: labels read perfectly from neighbours and from Leiden.
    centres = np.repeat([[0.0, 0.0], [50.0, 0.0]], 40, axis=0)
    latent = centres + rng.normal(scale=0.1, size=centres.shape)
    labels = np.repeat(["a", "b"], 40)
    fit = np.arange(80) % 4 != 0  # every fourth cell held out
    accuracy, balanced = latent_bench.knn_label_accuracy(latent[fit], labels[fit], latent[~fit], labels[~fit])
    assert accuracy == balanced == 1.0
    neighbours = latent_bench.knn_sets(latent, latent_bench.N_NEIGHBORS)
    # Batch = cluster: no cell has a neighbour from the other batch, so mixing is 0.
    assert latent_bench.batch_mixing(neighbours, labels).mean() == 0.0
    # Batches alternating within each cluster, neighbours drawn at random within it: mixing near 1. Each cell's
    # expected share of other-batch cells among its 39 cluster mates is 20/39; random mixing over all 80 cells
    # expects 40/79, so the ratio is (20/39) / (40/79) = 1.0128 on average.
    alternating = np.tile(["x", "y"], 40)
    assert latent_bench.batch_mixing(neighbours, alternating).mean() == pytest.approx(79 / 78, abs=0.08)
    clusters = latent_bench.leiden_labels(latent, resolutions=(0.1,))
    assert len(np.unique(clusters[0.1])) == 2
    # The same latent twice: every neighbourhood and every cluster agree across "seeds".
    metrics = {"neighbours": neighbours, "clusters": labels}
    assert latent_bench.across_seeds([metrics, metrics]) == (1.0, 1.0)
    # Each cell's 15 neighbours replaced by 15 others: overlap 0.
    shifted = {"neighbours": neighbours + 1000, "clusters": labels}
    assert latent_bench.across_seeds([metrics, shifted])[0] == 0.0


def test_latent_benchmark_schedules_are_the_package_rule_and_scvi_tools_schedule(monkeypatch):
    from countvae.model.training import DEFAULT_STOPPING, TrainingPlan

    monkeypatch.syspath_prepend(str(BENCH))
    latent_bench = _module("bench_stopping_latent")
    assert latent_bench.schedule_kwargs("stopped") == {**DEFAULT_STOPPING.train_kwargs(), "max_epochs": 400}
    full = TrainingPlan(**latent_bench.schedule_kwargs("full"))
    assert (full.early_stopping, full.learning_rate, full.max_epochs) == (False, 1e-3, 400)
    assert latent_bench.schedule_kwargs("200 epochs at 1e-3", max_epochs=30)["max_epochs"] == 30  # the smoke cap
    for name in latent_bench.SCHEDULES:  # every schedule is a valid plan
        TrainingPlan(**latent_bench.schedule_kwargs(name))


def test_batch_mixing_benchmark_with_every_fit_cell_is_the_whole_graph(monkeypatch):
    from countvae.diagnostics.reporting.settings import ReportSettings

    monkeypatch.syspath_prepend(str(BENCH))
    bench = _module("bench_batch_mixing")
    monkeypatch.setattr(bench, "SUBSET_FIT_CELLS", 150)
    monkeypatch.setattr(bench, "DRAWS", 5)
    rng = np.random.default_rng(4)
    # two batches, half of the cells of each in a cluster of their own: mixing about 1/2 of random
    batches = rng.choice(["a", "b"], size=500)
    apart = rng.random(500) < 0.5
    z = rng.normal(size=(500, 3)) + np.where(apart[:, None], (batches == "a")[:, None] * 40.0 + 20.0, 0.0)
    row = bench.embedding_row("sim", "planted", z[100:], z[:100], batches[100:], batches[:100], ReportSettings())
    assert abs(row["error, all fit cells"]) < 1e-12  # every cell at hand: the section's row is the graph's mixing
    assert row["truth (all cells)"] == pytest.approx(0.5, abs=0.1)
    assert abs(row["mean error over draws"]) < 0.1 and 0.0 <= row["coverage over draws"] <= 1.0
    assert "(k=" in row["report, 150 fit cells (first draw)"]
    quarter = [key for key in row if key.startswith("quarter of cells") and key.endswith(": coverage")]
    assert len(quarter) == 1 and 0.0 <= row[quarter[0]] <= 1.0
    # the widened interval contains the bootstrap's own, so it covers at least as often
    assert row["coverage over draws"] >= row["coverage, bootstrap alone over draws"]


def test_placement_benchmark_relabels_to_the_known_answer_one(monkeypatch):
    from countvae.diagnostics.reporting.settings import ReportSettings

    monkeypatch.syspath_prepend(str(BENCH))
    bench = _module("bench_placement")
    rng = np.random.default_rng(5)
    z = rng.normal(size=(400, 3)) + 30.0 * (rng.random(400) < 0.5)[:, None]  # two clusters, kinds at random
    row = bench.relabelled_coverage(z[:40], z[40:], 20, ReportSettings(n_bootstrap=50))
    assert row["relabelled: mean placement"] == pytest.approx(1.0, abs=0.05)
    assert row["relabelled: coverage of 1"] >= row["relabelled: coverage, bootstrap alone"]


def test_training_cells_benchmark_finds_fit_cells_planted_to_disagree(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = _module("bench_training_cells")
    rng = np.random.default_rng(6)
    held, fit = rng.normal(size=(200, 3)), rng.normal(size=(600, 3))
    fits = {
        f"stopped {seed}": {
            "latent_held": held.tolist(),
            "latent_fit": (fit + seed * rng.normal(size=fit.shape)).tolist(),
        }
        for seed in (0, 1)
    }
    c = bench.collected_latents(fits)
    tables = bench.training_tables(c, 2)
    rows = {r["row"]: r for r in bench.schedule_rows("sim", "stopped", c, tables)}
    assert rows["latent distances"]["held-out (worst pair)"] == pytest.approx(1.0)
    assert rows["latent distances"]["held-out minus training"] > 0.2
    assert rows["latent distances"]["held-out verdict"] == "agree"
    assert rows["latent distances"]["training verdicts"] == "differ 2/2"
    truth = bench.training_truth(c.per_fit("latent_fit"), c.per_fit("latent"), 15)
    assert truth["latent distances"][0] < 0.8 and truth["latent distances"][1] == "differ"
    assert 0.0 < truth["k-NN graph"][0] < 0.5
    # the fits are one fit on the held-out cells, not on the fit cells: their aligned coordinates differ there
    assert truth["per-dimension coordinates"][0] < 0.9 and truth["per-dimension coordinates"][1] == "differ"
    calibration = {r["row"]: r for r in bench.calibration_rows("sim", "stopped", tables, truth)}
    assert calibration["latent distances"]["verdict on all fit cells"] == "differ"
    assert calibration["latent distances"]["correct"] == 2 and calibration["latent distances"]["wrong"] == 0


def test_cell_columns_benchmark_summarises_each_kind_of_cell(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = _module("bench_cell_columns")
    obs = pd.DataFrame(
        {
            "countvae_heldout": [True, True, False, False, False],
            "cell_type": ["T", "B", "T", "T", "B"],
            "countvae_knn_agreement": [0.2, 0.4, 0.1, 0.3, np.nan],
            "countvae_knn_agreement_within_seed": [0.1, 0.1, 0.0, 0.2, np.nan],
        }
    )
    obs = obs.assign(**{"cells of": bench.roles(obs)})
    table = bench.column_summary(obs, ["cells of"]).set_index("cells of")
    assert table.loc["fit", "cells"] == 3 and table.loc["fit", "measured"] == 2
    assert table.loc["fit", "k-NN agreement"] == pytest.approx(0.2) and table.loc["held-out", "k-NN agreement"] == 0.3
    assert "batch mixing" not in table  # not written for data without a batch
    by_type = bench.column_summary(obs, ["cell_type", "cells of"]).set_index(["cell_type", "cells of"])
    assert by_type.loc[("B", "fit"), "measured"] == 0 and by_type.loc[("T", "fit"), "within-seed baseline"] == 0.1
