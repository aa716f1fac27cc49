"""benchmarks/bench_select_cost.py: its projection of the default run against known answers, and a smoke run."""

from __future__ import annotations

import pytest
from bench_modules import benchmark_module


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("bench_select_cost")


def test_training_wall_fits_all_candidates_seeds_in_one_pool(bench):
    # 3 seeds on 2 workers: two waves, each as long as the mean seed (20 s).
    assert bench._training_wall([{"seed_seconds": [10.0, 20.0, 30.0], "n_jobs": 2}]) == pytest.approx(40.0)
    assert bench._training_wall([{"seed_seconds": [10.0, 20.0, 30.0], "n_jobs": 1}]) == pytest.approx(60.0)
    # two candidates of 3 seeds on 2 workers: 6 fits in 3 waves of the mean (20 s), not 2 x 2 waves
    two = [{"seed_seconds": [10.0, 20.0, 30.0], "n_jobs": 2}, {"seed_seconds": [20.0, 20.0, 20.0], "n_jobs": 2}]
    assert bench._training_wall(two) == pytest.approx(60.0)


def test_default_epochs_are_the_diagnose_budget_and_scvi_tools_rule(bench):
    # compare_models: 600,000 cell passes, 20 to 400 epochs; SCVI: min(20000 / n * 400, 400) on 90% of the cells.
    assert bench._default_epochs(9_000) == 67
    assert bench._default_epochs(1_000) == 400
    assert bench._scvi_default_epochs(9_000) == 400
    assert bench._scvi_default_epochs(30_000) == 296


def _result(max_epochs):
    record = {"n_latent": 5, "n_jobs": 2, "epochs": [40, 40, 40], "seed_seconds": [60.0, 60.0, 60.0]}
    select = {
        "seconds": 300.0,
        "phases": {"fits": 250.0, "held-out log p(x)": 30.0},
        "fits": [record],
        "table": [{"candidate": "n_latent=5", "lpd_per_cell": -900.0, "verdict": "recommended"}],
        "recommended": {"n_latent": 5},
        "cells": 10_000,
        "genes": 2_000,
    }
    run = {"n_latent": 5, "fit_seconds": 50.0, "marginal_ll_seconds": 10.0, "marginal_ll": -910.0, "epochs": 40}
    peer = {"runs": [run], "threads": 2, "n_fit": 9_000, "n_heldout": 1_000}
    return {"select": select, "peer": peer, "loads": ["1 1 1"] * 3, "max_epochs": max_epochs, "n_mc_samples": 1000}


def test_projection_scales_only_the_training_wall_time(bench):
    result = _result(40)
    # 67 / 40: 300 s + 0.675 x (2 waves x 60 s) = 381 s; SCVI at its 400 epochs: 50 s x 10 = 500 s.
    epochs, projected, scvi_epochs, scvi = bench.project_to_defaults(result["select"], result["peer"], 40)
    assert (epochs, projected, scvi_epochs, scvi) == (67, pytest.approx(381.0), 400, pytest.approx(500.0))


def test_a_run_at_the_defaults_is_not_projected(bench):
    result = _result(None)
    assert bench.project_to_defaults(result["select"], result["peer"], None) == (67, 300.0, 400, 50.0)


@pytest.mark.slow
def test_quick_run_writes_its_own_section(bench, tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- section: other -->\nkept\n<!-- end: other -->\n")
    assert bench.main(["--quick", "--settings", "b", "--n-mc-samples", "10", "--results", str(results)]) == 0
    text = results.read_text()
    assert "kept" in text
    body = text[
        text.index("<!-- section: select-cost-10k-quick -->") : text.index("<!-- end: select-cost-10k-quick -->")
    ]
    assert "QUICK" in body and "Command:" in body and "compare_models recommended:" in body
