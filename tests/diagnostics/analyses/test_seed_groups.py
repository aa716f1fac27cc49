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
    PAIR_COLUMNS,
    SAME,
    UNDETERMINED,
    WORSE,
    SeedGroups,
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
        model.train(max_epochs=epochs, batch_size=128, lr=1e-2, early_stopping=False, progress_bar=False, seed=seed)
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


# ----- the grouping rules against hand-made evidence -------------------------------------------------------------
def _lpd_pair(a, b, diff, decision, half=0.3):
    return {"fit_a": a, "fit_b": b, "diff_per_cell": diff, "ci_low": diff - half, "ci_high": diff + half} | {
        "decision": decision
    }


def test_pair_relations_combine_decoded_means_and_log_p_x_as_documented():
    """Known relations: a, b and d have identical decoded means (concordance 1: agree), c is unrelated (differ).

    same solution = means agree and log p(x) not shown different (equivalent or undetermined); different = means
    differ, or log p(x) not equivalent. The table lists (a, b) as b - a = +0.4: oriented a - b it is -0.4, -0.7 to -0.1.
    """
    from countvae.diagnostics.analyses.predictive import EQUIVALENT, NOT_EQUIVALENT
    from countvae.diagnostics.analyses.predictive import UNDETERMINED as LPD_UNDETERMINED

    rng = np.random.default_rng(3)
    a = rng.normal(size=(80, 20))
    rates = {"a": a, "b": a.copy(), "c": rng.normal(size=(80, 20)), "d": a.copy()}
    lpd_pairs = pd.DataFrame(
        [
            _lpd_pair("b", "a", 0.4, NOT_EQUIVALENT),
            _lpd_pair("a", "c", 0.0, EQUIVALENT),
            _lpd_pair("a", "d", 0.1, LPD_UNDETERMINED),
            _lpd_pair("b", "c", 0.0, LPD_UNDETERMINED),
            _lpd_pair("b", "d", 0.0, EQUIVALENT),
            _lpd_pair("c", "d", 0.0, EQUIVALENT),
        ]
    )
    pairs = pair_relations(rates, lpd_pairs, n_replicates=50).set_index(["fit_a", "fit_b"])
    assert pairs["relation"].to_dict() == {
        ("a", "b"): DIFFERENT,  # decoded means agree, log p(x) not equivalent
        ("a", "c"): DIFFERENT,  # decoded means differ, log p(x) equivalent
        ("a", "d"): SAME,  # decoded means agree, log p(x) undetermined
        ("b", "c"): DIFFERENT,
        ("b", "d"): SAME,
        ("c", "d"): DIFFERENT,
    }
    ab = pairs.loc[("a", "b")]
    assert (ab["lpd_diff_per_cell"], ab["lpd_low"], ab["lpd_high"]) == pytest.approx((-0.4, -0.7, -0.1))


def test_pair_intervals_are_bonferroni_over_the_pairs(monkeypatch):
    """Four fits make 6 pairs: each decoded-means interval errs with alpha / 6 per side."""
    from countvae.diagnostics.analyses import seed_groups as module
    from countvae.diagnostics.analyses.predictive import EQUIVALENT

    seen = []
    real = module.percentile_interval

    def spy(value, reps, shrink, alpha, *args, **kwargs):
        seen.append(alpha)
        return real(value, reps, shrink, alpha, *args, **kwargs)

    monkeypatch.setattr(module, "percentile_interval", spy)
    rng = np.random.default_rng(0)
    rates = {k: rng.normal(size=(30, 5)) for k in "abcd"}
    table = pd.DataFrame([_lpd_pair(x, y, 0.0, EQUIVALENT) for i, x in enumerate("abcd") for y in "abcd"[i + 1 :]])
    pair_relations(rates, table, alpha=0.05, n_replicates=20)
    assert seen == pytest.approx([0.05 / 6] * 6)


def test_complete_linkage_merges_the_pair_of_groups_with_the_largest_smallest_concordance():
    """Hand-run: c-d (0.99) merge first; then a-b (0.91) beats a-{c, d}, whose smallest concordance is a-d's 0.90
    (its largest, a-c's 0.98, must not count); b-d differ, so {a, b} and {c, d} stay apart."""
    concordance = {("a", "b"): 0.91, ("a", "c"): 0.98, ("a", "d"): 0.90, ("b", "c"): 0.93, ("c", "d"): 0.99}
    rows = [
        {"fit_a": x, "fit_b": y, "relation": SAME if (x, y) in concordance else DIFFERENT}
        | {"concordance": concordance.get((x, y), 0.5)}
        for i, x in enumerate("abcd")
        for y in "abcd"[i + 1 :]
    ]
    assert complete_linkage(list("abcd"), pd.DataFrame(rows)) == [["a", "b"], ["c", "d"]]


def test_intransitive_evidence_is_noted():
    from countvae.diagnostics.analyses.seed_groups import _notes

    names = ["s0", "s1", "s2"]
    pairs = _relations(names, {("s0", "s1"), ("s1", "s2")})
    groups = complete_linkage(names, pairs)
    notes = _notes(names, pairs, groups)
    assert len(notes) == 1 and notes[0].startswith("Intransitive evidence among s0, s1 and s2")
    assert not _notes(names, _relations(names, {("s0", "s1"), ("s1", "s2"), ("s0", "s2")}), [names])


@pytest.mark.parametrize(("margin", "versus"), [(5.0, AS_GOOD), (1.0, UNDETERMINED), (0.4, WORSE)])
def test_group_table_by_hand(margin, versus):
    """Hand computation on 4 cells.

    Group (p, q): per-cell mean [11, 12, 13, 14], mean 12.5, sd sqrt(5/3); its interval 12.5 +- t_3(0.95) se with
    t_3(0.95) = 2.353363. Group r = [10] * 4: difference from the best [-1, -2, -3, -4], -2.5 +- t_3(1 - 0.05 / 2) se
    (Bonferroni over the 2 groups compared; t_3(0.975) = 3.182446), i.e. -4.554 to -0.446: as good within a margin
    of 5, undetermined at 1 (straddles -1), worse at 0.4.
    """
    lpd = {
        "p": np.array([10.0, 12.0, 14.0, 16.0]),
        "q": np.full(4, 12.0),
        "r": np.full(4, 10.0),
        "s": np.array([-20.0, -19.0, -18.0, -16.0]),
    }
    table = group_table([["p", "q"], ["r"], ["s"]], lpd, margin=margin).set_index("group")
    se = np.sqrt(5.0 / 3.0) / 2.0
    assert table.loc[1, "fits"] == ("p", "q")
    assert table.loc[1, ["lpd_per_cell", "lpd_low", "lpd_high"]].tolist() == pytest.approx(
        [12.5, 12.5 - 2.353363 * se, 12.5 + 2.353363 * se], abs=1e-5
    )
    assert table.loc[2, "fits"] == ("r",)
    assert table.loc[2, ["diff_from_best", "diff_low", "diff_high"]].tolist() == pytest.approx(
        [-2.5, -2.5 - 3.182446 * se, -2.5 + 3.182446 * se], abs=1e-5
    )
    assert table.loc[2, "versus_best"] == versus
    assert table.loc[3, "versus_best"] == WORSE


def test_another_solution_that_predicts_as_well_is_said_so():
    log_rates, lpd, baseline = _synthetic()
    lpd["s3"] = _lpd_frame(lpd["s0"]["lpd"].to_numpy() - 0.01)  # another solution, 0.01 nats per cell below
    sentence = seed_groups_sentence(seed_groups(log_rates, lpd, baseline))
    assert "s3 reached another solution that predicts as well" in sentence


def test_decoded_means_above_the_threshold_agree_only_when_the_interval_does():
    """A pair whose concordance is above the threshold but whose interval's low end is below it is undetermined.

    30 cells, the second fit's decoded means the first's plus noise sized for a concordance near 0.9: on this draw the
    concordance is about 0.91 and its bootstrap interval about 0.89 to 0.92 (asserted first, so a change of draw
    shows as a failed precondition, not a pass). Catches "agree" judged on the point value instead of the interval,
    which would merge the two fits into one solution; it says nothing about where the interval's ends lie.
    """
    from countvae.diagnostics.analyses.predictive import EQUIVALENT

    rng = np.random.default_rng(0)
    truth = rng.normal(size=(30, 20))
    rates = {"s0": truth, "s1": truth + np.sqrt(0.2 / 1.9) * 1.4 * rng.normal(size=truth.shape)}
    lpd_pairs = pd.DataFrame([_lpd_pair("s0", "s1", 0.0, EQUIVALENT)])
    row = pair_relations(rates, lpd_pairs).iloc[0]
    assert row["concordance_low"] < 0.9 <= row["concordance"]
    assert row["decoded_means"] == UNDETERMINED and row["relation"] == UNDETERMINED


def test_a_groups_log_p_x_is_the_mean_over_its_fits_per_cell():
    """A 3-fit group's log p(x) per cell is the mean of its fits (not the median, which differs only from 3 fits on).

    By hand on 4 cells: p = [10, 11, 12, 13], q = p - 0.3, r = p - 3, so group (p, q, r) is p - 1.1 per cell
    (mean 10.4; the median would give p - 0.3, 11.2). The lone fit s = p - 1 (mean 10.5) is then the best group and
    (p, q, r) lies exactly 0.1 below it on every cell (zero spread, so a zero-width interval): as good within a
    margin of 0.5. With the median, (p, q, r) would rank first and s would be 0.7 worse.
    """
    p = np.array([10.0, 11.0, 12.0, 13.0])
    lpd = {"p": p, "q": p - 0.3, "r": p - 3.0, "s": p - 1.0}
    table = group_table([["p", "q", "r"], ["s"]], lpd, margin=0.5).set_index("group")
    assert table.loc[1, "fits"] == ("s",) and table.loc[2, "fits"] == ("p", "q", "r")
    assert table.loc[2, "lpd_per_cell"] == pytest.approx(10.4, abs=1e-12)
    assert table.loc[2, ["diff_from_best", "diff_low", "diff_high"]].tolist() == pytest.approx([-0.1] * 3, abs=1e-12)
    assert table.loc[2, "versus_best"] == AS_GOOD


def test_the_grouping_is_decided_only_when_no_pair_is_undetermined():
    """One undetermined pair among three leaves the grouping undecided; three decided pairs decide it."""
    pairs = _relations(["s0", "s1", "s2"], {("s0", "s1")}, undetermined={("s1", "s2")})
    assert not SeedGroups(pairs, pd.DataFrame(), margin=1.0).decided
    decided = _relations(["s0", "s1", "s2"], {("s0", "s1")})
    assert SeedGroups(decided, pd.DataFrame(), margin=1.0).decided


def test_the_sentence_of_a_lone_best_fit_does_not_say_it_agrees():
    """By hand: s1 alone has the best held-out log p(x); s0 and s2 agree with each other, 3 nats per cell worse."""
    best = {"group": 1, "fits": ("s1",), "n_fits": 1, "lpd_per_cell": -250.0, "lpd_low": -251.0, "lpd_high": -249.0}
    worse = {"group": 2, "fits": ("s0", "s2"), "n_fits": 2, "lpd_per_cell": -253.0, "lpd_low": -254.0}
    gap = {"lpd_high": -252.0, "diff_from_best": -3.0, "diff_low": -3.5, "diff_high": -2.5, "versus_best": WORSE}
    groups = pd.DataFrame(
        [best | {"diff_from_best": 0.0, "diff_low": 0.0, "diff_high": 0.0, "versus_best": "best"}, worse | gap]
    )
    result = SeedGroups(pd.DataFrame(columns=list(PAIR_COLUMNS)), groups, margin=1.0)
    assert seed_groups_sentence(result) == (
        "s1 has the best held-out log p(x) (-250.0 nats per cell); s0 and s2 reached a worse optimum (-3.0 nats per "
        "cell, interval -3.5 to -2.5)."
    )


def test_the_section_puts_its_sentence_in_the_verdict_only_when_the_seeds_split():
    """Three fits of one solution: the section records its sentence but adds no verdict line; with a fourth fit in a
    worse optimum, its sentence is the verdict's line."""
    from types import SimpleNamespace

    from countvae.diagnostics.reporting.sections.base import Shared
    from countvae.diagnostics.reporting.sections.seed_groups import SeedGroupsSection
    from countvae.diagnostics.reporting.settings import ReportSettings

    log_rates, lpd, baseline = _synthetic()

    def collected(names):
        arrays = {"log_rate": {n: log_rates[n] for n in names}, "lpd": {n: lpd[n] for n in names}}
        return SimpleNamespace(per_fit=arrays.__getitem__, arrays=dict.fromkeys(names), baseline_lpd=baseline)

    one = SeedGroupsSection().compute(collected(["s0", "s1", "s2"]), Shared(), ReportSettings())
    assert len(one.tables["seed_groups"]) == 1 and one.headline == []
    assert one.records["seed_groups"]["sentence"].startswith("s0, s1 and s2 reached the same solution")
    two = SeedGroupsSection().compute(collected(["s0", "s1", "s2", "s3"]), Shared(), ReportSettings())
    assert len(two.tables["seed_groups"]) == 2 and two.headline == [two.records["seed_groups"]["sentence"]]


def test_the_section_groups_no_seeds_when_a_fit_has_no_held_out_log_p_x():
    """A fit without held-out log p(x) (None in the collected arrays): no grouping, rather than one of the others."""
    from types import SimpleNamespace

    from countvae.diagnostics.reporting.sections.base import Shared
    from countvae.diagnostics.reporting.sections.seed_groups import SeedGroupsSection
    from countvae.diagnostics.reporting.settings import ReportSettings

    log_rates, lpd, baseline = _synthetic()
    arrays = {"log_rate": log_rates, "lpd": {**lpd, "s2": None}}
    c = SimpleNamespace(per_fit=arrays.__getitem__, arrays=dict.fromkeys(log_rates), baseline_lpd=baseline)
    result = SeedGroupsSection().compute(c, Shared(), ReportSettings())
    assert result.tables == {} and result.headline == [] and result.records == {}


@pytest.mark.parametrize(
    ("gain", "share"),
    [(-1.0, 0.02), (0.25, 5e-324)],
    ids=["fits worse than the baseline", "margin rounds to zero nats"],
)
def test_the_section_groups_no_seeds_without_a_positive_margin(gain, share):
    """No margin to judge log p(x) differences by: the section says so and shows no groups.

    The fits explain 1 nat per cell less than the no-latent baseline (no margin: NaN); or they gain 0.25 nats per cell
    and the margin's share is the smallest positive number, 5e-324, so the margin 0.25 * 5e-324 rounds to 0.0 nats:
    under a zero margin no two fits can be equivalent, so grouping by it would be no evidence either.
    """
    from types import SimpleNamespace

    from countvae.diagnostics.reporting.sections.base import Shared
    from countvae.diagnostics.reporting.sections.seed_groups import NO_MARGIN, SeedGroupsSection
    from countvae.diagnostics.reporting.settings import ReportSettings

    log_rates, lpd, _ = _synthetic()
    baseline = np.mean([frame["lpd"].to_numpy() for frame in lpd.values()], axis=0) - gain
    arrays = {"log_rate": log_rates, "lpd": lpd}
    c = SimpleNamespace(per_fit=arrays.__getitem__, arrays=dict.fromkeys(log_rates), baseline_lpd=baseline)
    result = SeedGroupsSection().compute(c, Shared(), ReportSettings(equivalence_margin=share))
    assert result.tables == {} and result.headline == []
    assert result.records == {"seed_groups": {"sentence": NO_MARGIN, "notes": []}}
