"""The regime calibration driver: verdicts scored against the oracle, and a reduced run end to end."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


regimes = _load("calibration_regimes")


def _runs(pairs: list[tuple[str, str]]) -> pd.DataFrame:
    rows = []
    for i, (held, pool) in enumerate(pairs):
        for cells, verdict in (("heldout", held), ("pool", pool)):
            rows.append({"regime": "r", "replicate": i, "cells": cells, "row": "decoded means", "verdict": verdict})
    frame = pd.DataFrame(rows)
    return frame.assign(agreement=0.9, low=0.8, high=0.95, n_cells=300)


def test_a_confident_verdict_is_correct_when_the_oracle_repeats_it_and_wrong_when_it_contradicts_it():
    runs = _runs(
        [
            ("agree", "agree"),
            ("agree", "differ"),
            ("differ", "differ"),
            ("agree after alignment", "agree"),
            ("agree", "undetermined"),
            ("undetermined", "differ"),
        ]
    )
    scored = regimes.score(runs)
    assert scored["outcome"].tolist() == ["correct", "wrong", "correct", "wrong", "oracle undecided", "undetermined"]
    rate = regimes.rates(scored).iloc[0]
    assert (rate["correct"], rate["wrong"], rate["oracle undecided"], rate["undetermined"]) == (2, 2, 1, 1)
    assert rate["correct % of confident"] == pytest.approx(50.0)
    assert rate["undetermined %"] == pytest.approx(100 / 6)
    # 2 of 4 confirmed: the exact binomial bound, P(X >= 2 | p) = 0.05 at p = 0.0976
    assert rate["lower 95% bound"] == pytest.approx(9.76, abs=0.01)


def test_the_lower_bound_of_all_confirmed_is_the_level_root():
    assert regimes.correct_rate_lower_bound(20, 20) == pytest.approx(0.05 ** (1 / 20))  # 0.861
    assert regimes.correct_rate_lower_bound(59, 59) > 0.95 > regimes.correct_rate_lower_bound(58, 58)
    assert regimes.correct_rate_lower_bound(0, 3) == 0.0
    assert np.isnan(regimes.correct_rate_lower_bound(0, 0))


@pytest.mark.slow  # about 40 s on a free core (two seeds, an under-trained fit, two reports)
def test_a_reduced_kang_replicate_runs_end_to_end(tmp_path):
    summary = _load("calibration_regimes_summary")
    cfg = replace(
        regimes.QUICK,
        regime="kang",
        n_fit=300,
        n_heldout=120,
        n_pool=200,
        n_genes=100,
        max_epochs=25,
        short_epochs=(2,),
    )
    source = (None, regimes._kang(cfg.n_genes))
    rows = regimes.run_replicate(cfg, 0, source, tmp_path)
    frame = pd.DataFrame(rows)
    assert set(frame["cells"]) == {"heldout", "pool"}
    held, pool = (frame[frame["cells"] == c].set_index("row") for c in ("heldout", "pool"))
    assert list(held.index) == list(pool.index) and "k-NN graph" in held.index
    assert held.loc["decoded means", "n_cells"] == 120 and pool.loc["decoded means", "n_cells"] == 200
    arrays = summary.load_arrays(tmp_path / "replicate_0_heldout.npz")
    assert set(arrays["log_rate"]) == {"seed 0", "seed 1", "seed 2 (2 epochs)"}
    assert all(np.isfinite(f["lpd"]).all() for f in arrays["lpd"].values())
    assert set(arrays["latent_fit"]) == {"seed 0", "seed 1"}  # the report's fits
    csv = tmp_path / "runs.csv"
    frame.to_csv(csv, index=False)
    (tmp_path / "runs_arrays").mkdir()
    for p in tmp_path.glob("replicate_0_*.npz"):
        p.rename(tmp_path / "runs_arrays" / p.name)
    groups = summary.grouping_rows(csv).set_index("fits")
    # two epochs from scratch: in a group of its own, with a worse held-out log p(x) than the converged seeds
    assert bool(groups.loc["seeds + under-trained fit", "under-trained fit alone and worse"])


def test_a_summary_replaces_its_own_sections_regimes_and_keeps_the_others(tmp_path):
    """A second section (new regimes) must not drop the regimes another section recorded, nor keep its own stale."""
    import json

    summary = _load("calibration_regimes_summary")
    pairs = [("agree", "agree"), ("agree", "differ"), ("undetermined", "agree")]
    runs = _runs(pairs).assign(
        regime="scvi-kang-small-300", report_seconds=10.0, fit_seconds_per_seed=5.0, epochs="50;60;70"
    )
    csv = tmp_path / "scvi.csv"
    runs.to_csv(csv, index=False)
    record_file = tmp_path / "calibration.json"
    old = {"configuration": {}, "rows": {}}
    record_file.write_text(
        json.dumps(
            {
                "scenarios": {},
                "regimes": {
                    "kang-small-300": old,  # no section: recorded by the first section
                    "stale": old | {"section": "extra"},
                },
            }
        )
    )
    results = tmp_path / "RESULTS.md"
    body = summary.summarize([csv], results, "cmd", record_file, section="extra", title_suffix=", SCVI")
    assert body.startswith("## Verdicts against the same fits on a large pool of cells, in analyst regimes, SCVI")
    assert "<!-- section: extra -->" in results.read_text()
    regimes_now = json.loads(record_file.read_text())["regimes"]
    assert set(regimes_now) == {"kang-small-300", "scvi-kang-small-300"}
    entry = regimes_now["scvi-kang-small-300"]
    assert entry["section"] == "extra" and entry["configuration"]["model"] == "scvi-tools"
    assert entry["rows"]["decoded means"] == {
        "runs": 3,
        "correct": 1,
        "wrong": 1,
        "undetermined": 1,
        "oracle_undecided": 0,
    }


def test_the_knn_oracle_scales_k_when_the_analysts_graph_is_larger_than_the_pool(tmp_path):
    """A 10,000-cell file has a larger graph than the 4,000-cell pool: the pool's k is scaled up to speak for it.

    Known answer: seed 1 is a rotation of seed 0 (fit, held-out and pool latents alike), so every k-NN set is the
    same and every overlap is exactly 1; the column names give the graph sizes and the scaled k.
    """
    summary = _load("calibration_regimes_summary")
    rng = np.random.default_rng(0)
    rotation, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    held, fit, pool = (rng.normal(size=(n, 4)).astype(np.float32) for n in (50, 200, 100))
    arrays = tmp_path / "runs_arrays"
    arrays.mkdir()
    both = {"seed 0": lambda z: z, "seed 1": lambda z: (z @ rotation).astype(np.float32)}
    np.savez(
        arrays / "replicate_0_heldout.npz",
        baseline=np.zeros(50),
        **{f"latent/{n}": f(held) for n, f in both.items()},
        **{f"latent_fit/{n}": f(fit) for n, f in both.items()},
    )
    np.savez(
        arrays / "replicate_0_pool.npz", baseline=np.zeros(100), **{f"latent/{n}": f(pool) for n, f in both.items()}
    )
    row = summary.knn_rows(tmp_path / "runs.csv").iloc[0]
    from countvae.diagnostics.analyses.subspace import analyst_graph_k

    k_pool = analyst_graph_k(15, 100, 250)
    assert k_pool == 6  # 15 x 100 / 250
    assert f"oracle: graph on 100 pool cells, k={k_pool}" in row.index
    assert "held-out rows among 250 cells, k=15 (the report now)" in row.index
    assert row["reference"] == "fit cells"
    assert all(row[c] == pytest.approx(1.0) for c in row.index if c not in ("replicate", "reference"))


def test_the_linear_toy_oracle_estimates_each_fits_ica_on_its_own_large_draw():
    """Exact rotated copies of one fit: the oracle's ICA row, from ICAs on a separate draw of 3,000 cells matched on
    the pool, agrees at a corrected match of 1; the fit cells the report uses play no part in it."""
    from countvae.diagnostics import CountVAEFit
    from countvae.invariance import random_orthogonal, reparameterize

    cfg = replace(regimes.QUICK, regime="linear-toy", source="simulated", decoder="linear", n_latent=3)
    cfg = replace(cfg, n_fit=1000, n_heldout=100, n_pool=400, n_ica_pool=3000, n_genes=60)
    fit_cells, heldout, pool, ica_pool = regimes._simulated_cells(cfg, 0)
    assert (fit_cells.n_obs, heldout.n_obs, pool.n_obs, ica_pool.n_obs) == (1000, 100, 400, 3000)
    assert not set(pool.obs_names) & set(ica_pool.obs_names) and not set(fit_cells.obs_names) & set(pool.obs_names)
    model, _ = regimes.fit_one(cfg, fit_cells, 0, 80)  # 40 epochs on 600 cells leave one axis loose (split-half 0.949)
    fits = [model] + [CountVAEFit(reparameterize(model.model, random_orthogonal(3, seed=100 + k)), k) for k in (1, 2)]
    invariants = pd.DataFrame(
        {"quantity": ["ICA coordinates"], "verdict": ["undetermined"], "agreement": [0.0], "low": [0.0]}
        | {"high": [0.0], "n_cells": [0]}
    )
    row = regimes._with_pool_ica(invariants, fits, pool, ica_pool, {}).iloc[0]
    assert row["verdict"] == "agree" and row["agreement"] == pytest.approx(1.0, abs=0.01)
    assert row["n_cells"] == 400
    # The same oracle on the whole ICA pool and on each half of it: the whole pool's row is the driver's; exact
    # rotated copies match at a corrected 1 on every set of cells, and a half whose ICA does not reproduce within
    # one seed (750 cells per ICA) is undetermined, not "agree" (the rule's precondition).
    halves = _load("ica_oracle_halves").oracle_on_halves(fits, pool, ica_pool)
    assert (
        halves["ICA estimated on"].str.startswith(("whole ICA pool (3,000", "first half (1,500", "second half")).all()
    )
    assert halves.iloc[0]["verdict"] == row["verdict"]
    assert halves.iloc[0][["corrected match (min)", "low", "high"]].tolist() == [
        row["agreement"],
        row["low"],
        row["high"],
    ]
    assert halves["corrected match (min)"].to_numpy() == pytest.approx(1.0, abs=0.01)
    reproduced = halves["same seed's halves (min)"] >= 0.95
    assert halves["verdict"].tolist() == ["agree" if r else "undetermined" for r in reproduced]
    assert reproduced.iloc[0] and not reproduced.all()


def test_a_regime_summarized_again_keeps_its_place_in_the_record(tmp_path):
    """Ties in nearest_regime go to the regime recorded first, so rewriting a regime must not move it to the end."""
    import json

    summary = _load("calibration_regimes_summary")
    runs = _runs([("agree", "agree")]).assign(
        regime="semi-synthetic", report_seconds=10.0, fit_seconds_per_seed=5.0, epochs="50;60;70"
    )
    csv = tmp_path / "semi.csv"
    runs.to_csv(csv, index=False)
    record_file = tmp_path / "calibration.json"
    old = {"configuration": {}, "rows": {}}
    record = {"scenarios": {}, "regimes": {"semi-synthetic": old | {"section": "first"}, "kang-small-300": old}}
    record_file.write_text(json.dumps(record))
    for _ in range(2):  # once from another section's entry, once over its own
        summary.summarize([csv], tmp_path / "RESULTS.md", "cmd", record_file, section="again")
        regimes_now = json.loads(record_file.read_text())["regimes"]
        assert list(regimes_now) == ["semi-synthetic", "kang-small-300"]
        assert regimes_now["semi-synthetic"]["section"] == "again"
