"""Which seeds reached the same solution: known groupings from synthetic evidence and from real fits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import countvae as cv
from countvae.diagnostics import CountVAEFit
from countvae.diagnostics.analyses.seed_groups import (
    AS_GOOD,
    DIFFERENT,
    SAME,
    UNDETERMINED,
    WORSE,
    complete_linkage,
    group_table,
    pair_relations,
    seed_groups,
    seed_groups_sentence,
)
from countvae.diagnostics.reporting.collect import no_latent_baseline
from countvae.errors import InvalidArgumentError


def _relations(names: list[str], same: set[tuple[str, str]], undetermined: set[tuple[str, str]] = frozenset()):
    """A pair table with the given relations (concordance 0.95 for 'same', 0.5 otherwise)."""
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            key = (a, b)
            relation = SAME if key in same else UNDETERMINED if key in undetermined else DIFFERENT
            rows.append(
                {"fit_a": a, "fit_b": b, "relation": relation, "concordance": 0.95 if relation == SAME else 0.5}
            )
    return pd.DataFrame(rows)


def test_complete_linkage_groups_cliques_of_same_solution():
    names = ["s0", "s1", "s2", "s3", "s4"]
    pairs = _relations(names, {("s0", "s1"), ("s0", "s4"), ("s1", "s4"), ("s2", "s3")})
    assert complete_linkage(names, pairs) == [["s0", "s1", "s4"], ["s2", "s3"]]


def test_intransitive_evidence_keeps_fits_apart_and_says_so():
    names = ["s0", "s1", "s2"]
    # s0 ~ s1 and s1 ~ s2, but s0 and s2 differ: no group may hold s0 and s2 together.
    pairs = _relations(names, {("s0", "s1"), ("s1", "s2")})
    pairs.loc[(pairs["fit_a"] == "s1") & (pairs["fit_b"] == "s2"), "concordance"] = 0.97
    groups = complete_linkage(names, pairs)
    assert groups == [["s0"], ["s1", "s2"]]  # the stronger link (0.97) is merged first


def test_undetermined_pair_is_not_merged():
    names = ["s0", "s1", "s2"]
    pairs = _relations(names, {("s0", "s1")}, undetermined={("s0", "s2"), ("s1", "s2")})
    assert complete_linkage(names, pairs) == [["s0", "s1"], ["s2"]]


def _lpd_frame(values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {"lpd": values, "mc_se": np.full(values.size, 0.01)}, index=[f"c{i}" for i in range(values.size)]
    )


def _synthetic(n_cells: int = 400, seed: int = 0):
    """Fits s0, s1, s2 with one solution (decoded means nearly equal), s3 another, 7 nats per cell worse."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(n_cells, 50))
    other = rng.normal(size=(n_cells, 50))
    log_rates = {f"s{k}": truth + 0.05 * rng.normal(size=truth.shape) for k in range(3)} | {"s3": other}
    base = rng.normal(-300.0, 20.0, size=n_cells)
    lpd = {f"s{k}": _lpd_frame(base + 0.1 * rng.normal(size=n_cells)) for k in range(3)}
    lpd["s3"] = _lpd_frame(base - 7.0 + 0.1 * rng.normal(size=n_cells))
    return log_rates, lpd, base - 100.0  # gain over the baseline ~100 nats per cell: margin 2 at 2%


def test_seed_groups_finds_the_worse_optimum_and_its_gap():
    log_rates, lpd, baseline = _synthetic()
    result = seed_groups(log_rates, lpd, baseline)
    assert result.margin == pytest.approx(0.02 * (100.0 - 7.0 / 4), abs=0.05)
    assert result.partition == frozenset({frozenset({"s0", "s1", "s2"}), frozenset({"s3"})})
    assert result.decided and not result.notes
    best, worse = result.groups.iloc[0], result.groups.iloc[1]
    assert best["fits"] == ("s0", "s1", "s2") and best["versus_best"] == "best"
    assert worse["fits"] == ("s3",) and worse["versus_best"] == WORSE
    assert worse["diff_from_best"] == pytest.approx(-7.0, abs=0.05)
    assert worse["diff_low"] < -7.0 < worse["diff_high"]
    sentence = seed_groups_sentence(result)
    assert sentence.startswith("s0, s1 and s2 agree") and "s3 reached a worse optimum (-7.0 nats per cell" in sentence


def test_one_group_when_every_fit_agrees():
    log_rates, lpd, baseline = _synthetic()
    del log_rates["s3"], lpd["s3"]
    result = seed_groups(log_rates, lpd, baseline)
    assert len(result.groups) == 1 and result.groups["n_fits"].iloc[0] == 3
    assert "reached the same solution" in seed_groups_sentence(result)


def test_another_solution_that_predicts_as_well_is_a_separate_group_judged_as_good():
    log_rates, lpd, baseline = _synthetic()
    lpd["s3"] = _lpd_frame(lpd["s0"]["lpd"].to_numpy() + 0.01)  # different means, same log p(x)
    result = seed_groups(log_rates, lpd, baseline)
    assert result.partition == frozenset({frozenset({"s0", "s1", "s2"}), frozenset({"s3"})})
    assert set(result.groups["versus_best"]) == {"best", AS_GOOD}


def test_pair_decisions_follow_the_interval_and_the_threshold():
    log_rates, lpd, baseline = _synthetic()
    result = seed_groups(log_rates, lpd, baseline)
    p = result.pairs.set_index(["fit_a", "fit_b"])
    assert (p.loc[("s0", "s1"), "concordance_low"] >= 0.9) and p.loc[("s0", "s1"), "relation"] == SAME
    assert p.loc[("s0", "s3"), "concordance_high"] < 0.9 and p.loc[("s0", "s3"), "relation"] == DIFFERENT
    # oriented a - b: s0 minus s3 is +7
    assert p.loc[("s0", "s3"), "lpd_diff_per_cell"] == pytest.approx(7.0, abs=0.05)


def test_near_threshold_on_few_cells_is_undetermined_and_noted():
    rng = np.random.default_rng(1)
    n = 30
    a = rng.normal(size=(n, 40))
    # concordance near the 0.9 threshold, with noise that varies a lot between cells: on 30 cells the
    # bootstrap interval over cells straddles the threshold
    noise_sd = np.sqrt(0.222 * rng.exponential(size=(n, 1)) ** 2 / 2)
    b = a + noise_sd * rng.normal(size=a.shape)
    base = rng.normal(-300.0, 20.0, size=n)
    lpd = {"s0": _lpd_frame(base), "s1": _lpd_frame(base + 0.01 * rng.normal(size=n))}
    result = seed_groups({"s0": a, "s1": b}, lpd, base - 100.0)
    row = result.pairs.iloc[0]
    assert row["concordance_low"] < 0.9 <= row["concordance_high"]
    assert row["relation"] == UNDETERMINED and len(result.groups) == 2
    assert any("Undetermined pairs (s0 / s1)" in n for n in result.notes)


def test_bad_inputs_say_what_is_wrong():
    log_rates, lpd, baseline = _synthetic()
    with pytest.raises(InvalidArgumentError, match="same fits"):
        seed_groups(log_rates, {k: v for k, v in lpd.items() if k != "s3"}, baseline)
    with pytest.raises(InvalidArgumentError, match="margin"):
        seed_groups(log_rates, lpd, None)
    with pytest.raises(InvalidArgumentError, match="one shape"):
        pair_relations({"a": np.zeros((3, 2)), "b": np.zeros((4, 2))}, pd.DataFrame())
    with pytest.raises(InvalidArgumentError, match="at least two"):
        pair_relations({"a": np.zeros((3, 2))}, pd.DataFrame())


def test_group_table_intervals_cover_a_known_mean():
    rng = np.random.default_rng(1)
    lpd = {"a": rng.normal(-10.0, 1.0, size=2000), "b": rng.normal(-10.0, 1.0, size=2000) - 3.0}
    table = group_table([["a"], ["b"]], lpd, margin=1.0)
    assert table["fits"].tolist() == [("a",), ("b",)]
    assert table["lpd_low"].iloc[0] < -10.0 < table["lpd_high"].iloc[0]
    assert table["diff_low"].iloc[1] < -3.0 < table["diff_high"].iloc[1] and table["versus_best"].iloc[1] == WORSE


def test_real_fits_a_badly_trained_seed_lands_in_its_own_worse_group():
    adata = cv.data.simulate(n_cells=900, n_genes=50, n_latent=2, decoder="linear", n_batches=1, seed=21)
    cv.CountVAE.setup_anndata(adata)
    fit_cells, heldout = adata[:600].copy(), adata[600:].copy()
    fits = []
    for seed, epochs in ((0, 60), (1, 60), (2, 2)):
        model = cv.CountVAE(fit_cells, n_latent=2, decoder="linear", likelihood="nb")
        model.train(max_epochs=epochs, batch_size=128, lr=1e-2, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    log_rates = {
        f.name: np.asarray(f.decode_log_rate(heldout, f.latent(heldout).astype(np.float32)), dtype=np.float64)
        for f in fits
    }
    lpd = {f.name: f.log_predictive_density(heldout, 30, 0) for f in fits}
    baseline, _ = no_latent_baseline(heldout, fit_cells, fits[0].var_names, 5000, 0)
    result = seed_groups(log_rates, lpd, baseline)
    assert result.partition == frozenset({frozenset({"seed 0", "seed 1"}), frozenset({"seed 2"})})
    worse = result.groups.set_index("group").loc[2]
    assert worse["fits"] == ("seed 2",) and worse["versus_best"] == WORSE and worse["diff_high"] < -result.margin

    # The report's section finds the same groups from the arrays it collects, and says so in the verdict.
    from countvae.diagnostics import report

    rep = report(fits, heldout, sections=["seed_groups"], n_lpd_samples=30, progress_bar=False)
    groups = rep.tables["seed_groups"]
    assert sorted(groups["fits"]) == ["seed 0, seed 1", "seed 2"]
    assert groups.set_index("fits").loc["seed 2", "versus_best"] == WORSE
    assert any("seed 2 reached a worse optimum" in line for line in rep.headline)
    assert "seed_groups" in rep.to_dict()["tables"] and "reached a worse optimum" in rep.to_html()
    assert "reached a worse optimum" in rep.to_markdown()
