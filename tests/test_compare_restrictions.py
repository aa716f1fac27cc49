"""What a restriction buys and costs: the analyses of ``compare_restrictions`` against known answers,
and the comparison run end to end on simulated data with a known truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from countvae.diagnostics.analyses.restrictions import (
    ALREADY,
    IDENTIFIED,
    LOWERS,
    NOT_IDENTIFIED,
    UNDETERMINED,
    agreement_pairs,
    identification_verdict,
    pair_agreement,
    predictive_cost,
    program_support,
    split_half_reading,
    summarize_agreement,
    truth_recovery,
)
from countvae.diagnostics.fitting.restrictions import parse_restrictions, restriction_programs
from countvae.errors import InvalidArgumentError


def _sources(n=600, k=3, seed=0):
    return np.random.default_rng(seed).laplace(size=(n, k))


def _signed_permutation(order, signs):
    return np.eye(len(order))[:, order] * np.asarray(signs, dtype=float)


def _half_turn_of_two_axes(k=3):
    """A 45 degree rotation in the plane of the first two axes: as far from every signed permutation as it gets."""
    R = np.eye(k)
    c = np.sqrt(0.5)
    R[:2, :2] = [[c, -c], [c, c]]
    return R


# ----- agreement after a signed permutation only --------------------------------------------------------
def test_agreement_is_one_after_a_signed_permutation_and_the_loadings_follow():
    z = _sources()
    w = np.random.default_rng(1).normal(size=(40, 3))
    Q = _signed_permutation([2, 0, 1], [1, -1, 1])
    markers = z @ np.random.default_rng(2).normal(size=(3, 4))
    scores = pair_agreement(z, z @ Q, w, w @ Q, markers)
    assert scores["coordinates"] == pytest.approx(1.0, abs=1e-12)
    assert scores["loadings"] == pytest.approx(1.0, abs=1e-12)
    assert scores["markers"] == pytest.approx(1.0, abs=1e-12)
    assert scores["rotation_ceiling"] == pytest.approx(1.0, abs=1e-9)


def test_a_rotation_lowers_coordinate_agreement_but_not_the_rotation_ceiling():
    """Two fits that share the latent space but not its axes: low per-dimension agreement, ceiling 1."""
    z = _sources()
    R = _half_turn_of_two_axes()
    scores = pair_agreement(z, z @ R)
    # two dimensions correlate at cos 45 degrees with their match, the third at 1
    assert scores["coordinates"] == pytest.approx((2 * np.sqrt(0.5) + 1) / 3, abs=0.03)
    assert scores["rotation_ceiling"] == pytest.approx(1.0, abs=1e-9)
    assert np.isnan(scores["loadings"]) and np.isnan(scores["markers"])
    with pytest.raises(InvalidArgumentError, match="different shapes"):
        pair_agreement(z, z[:, :2])


def test_agreement_pairs_and_their_summary():
    z = _sources()
    fits = {"a": z, "b": z @ _signed_permutation([1, 0, 2], [1, 1, -1]), "c": z @ _half_turn_of_two_axes()}
    pairs = agreement_pairs(fits)
    assert list(zip(pairs["fit_a"], pairs["fit_b"], strict=True)) == [("a", "b"), ("a", "c"), ("b", "c")]
    summary = summarize_agreement(pairs)
    assert summary["coordinates_agreement"] == pytest.approx(pairs["coordinates"].mean())
    assert summary["coordinates_agreement_min"] == pytest.approx(pairs["coordinates"].min())
    assert summary["coordinates_agreement_min"] < 0.85
    with pytest.raises(InvalidArgumentError, match="at least two fits"):
        agreement_pairs({"a": z})


@pytest.mark.parametrize(
    ("worst", "mean", "baseline", "expected"),
    [
        (0.95, 0.97, 0.40, IDENTIFIED),
        (0.50, 0.60, 0.40, UNDETERMINED),  # better than without it, but not every pair agrees
        (0.30, 0.42, 0.40, NOT_IDENTIFIED),
        (0.90, 0.93, 0.95, ALREADY),  # the unrestricted seeds already agree: nothing to credit
        (0.30, 0.42, 0.95, LOWERS),
        (np.nan, np.nan, 0.5, UNDETERMINED),
    ],
)
def test_identification_verdict(worst, mean, baseline, expected):
    assert identification_verdict(worst, mean, baseline) == expected


def test_split_half_reading_separates_too_few_cells_from_no_identification():
    assert "too few cells" in split_half_reading(NOT_IDENTIFIED, 0.5, 0.3)
    assert "would not identify" in split_half_reading(NOT_IDENTIFIED, 0.5, 0.5)
    assert split_half_reading(IDENTIFIED, 0.95, 0.93) == "reproducible from half of the cells"
    assert "close to too few cells" in split_half_reading(IDENTIFIED, 0.95, 0.7)
    assert split_half_reading(IDENTIFIED, 0.95, np.nan) == "split half not measured"


# ----- predictive cost --------------------------------------------------------------------------------------
def _lpd(values):
    return pd.DataFrame({"lpd": values, "mc_se": np.zeros_like(values)})


def test_predictive_cost_is_the_paired_mean_difference_with_its_standard_error():
    rng = np.random.default_rng(0)
    base = rng.normal(-200, 30, 2000)  # cells differ a lot; the paired difference does not see it
    d = rng.normal(-1.0, 0.5, 2000)
    unrestricted = {s: _lpd(base) for s in (0, 1, 2)}
    restricted = {s: _lpd(base + d) for s in (0, 1, 2)}
    cost = predictive_cost(restricted, unrestricted, margin=0.5)
    assert cost["difference_per_cell"] == pytest.approx(d.mean(), abs=1e-9)
    assert cost["se_per_cell"] == pytest.approx(d.std(ddof=1) / np.sqrt(2000), rel=1e-9)
    assert cost["verdict"] == "costs" and cost["n_seeds"] == 3 and cost["n_cells"] == 2000

    # seeds that disagree widen the interval by their spread: sd of the per-seed means / sqrt(seeds)
    shifts = {0: -0.4, 1: 0.0, 2: 0.4}
    spread = predictive_cost({s: _lpd(base + d + shifts[s]) for s in shifts}, unrestricted, margin=0.5)
    assert spread["se_per_cell"] == pytest.approx(np.sqrt(cost["se_per_cell"] ** 2 + 0.16 / 3), rel=1e-9)

    tiny = predictive_cost({s: _lpd(base + d + 1.0) for s in (0, 1)}, unrestricted, margin=0.5)
    assert tiny["verdict"] == "equivalent"
    assert predictive_cost({0: _lpd(base + 3.0 + d)}, unrestricted)["verdict"] == "gains"
    with pytest.raises(InvalidArgumentError, match="share no seed"):
        predictive_cost({7: _lpd(base)}, unrestricted)


def test_predictive_cost_undetermined_when_the_interval_is_wide():
    rng = np.random.default_rng(1)
    base = rng.normal(-200, 30, 50)
    d = rng.normal(-0.3, 5.0, 50)
    cost = predictive_cost({0: _lpd(base + d)}, {0: _lpd(base)}, margin=0.5)
    assert cost["ci95_low"] < 0 < cost["ci95_high"] and cost["verdict"] == "undetermined"


# ----- gene programs and the simulated truth -------------------------------------------------------------
def _program_loadings(genes, programs, nonzero):
    rows = []
    for name, members in programs.items():
        for g in genes:
            inside = g in members
            rows.append(
                {
                    "gene": g,
                    "dimension": name,
                    "mean": 1.0 if inside else 0.01,
                    "in_program": inside,
                    "nonzero": inside and nonzero[name],
                }
            )
    return pd.DataFrame(rows)


def test_program_support_tells_a_used_program_from_an_absent_one():
    rng = np.random.default_rng(0)
    genes = [f"g{i}" for i in range(12)]
    programs = {"present": genes[:4], "absent": genes[6:10]}
    expression = rng.normal(size=(400, 12))
    present = expression[:, :4].sum(1) / 2 + rng.normal(0, 0.2, 400)
    latents = {f"seed {s}": np.column_stack([present, rng.normal(0, 0.01, 400)]) for s in range(3)}
    loadings = dict.fromkeys(latents, _program_loadings(genes, programs, {"present": True, "absent": False}))
    table = program_support(latents, loadings, expression, programs, genes).set_index("program")
    assert table.loc["present", "supported"] and table.loc["present", "set_r2"] > 0.9
    assert table.loc["present", "in_program_share"] == pytest.approx(4 / (4 + 8 * 1e-4))
    assert not table.loc["absent", "supported"] and "unused" in table.loc["absent", "reason"]
    # used, but on no credible gene of its own
    latents = {k: np.column_stack([v[:, 0], rng.normal(size=400)]) for k, v in latents.items()}
    table = program_support(latents, loadings, expression, programs, genes).set_index("program")
    assert not table.loc["absent", "supported"] and "credibly non-zero" in table.loc["absent", "reason"]


def test_truth_recovery_is_one_for_the_sources_up_to_signed_permutation_and_scale():
    z = _sources()
    w = np.random.default_rng(3).normal(size=(30, 3))
    Q = _signed_permutation([1, 2, 0], [-1, 1, 1])
    scores = truth_recovery({"a": 2.0 * z @ Q, "b": z}, {"a": w @ Q, "b": None}, z, w)
    assert scores["sources_mcc"] == pytest.approx(1.0) and scores["loadings_mcc"] == pytest.approx(1.0)
    rotated = truth_recovery({"a": z @ _half_turn_of_two_axes()}, {"a": None}, z)
    assert rotated["sources_mcc"] < 0.9 and np.isnan(rotated["loadings_mcc"])


# ----- naming the restrictions ---------------------------------------------------------------------------
def test_restrictions_are_parsed_from_names_with_clear_errors(tmp_path):
    chosen = parse_restrictions(" Laplace , horseshoe,programs:my.gmt,ica")
    assert [r.name for r in chosen] == ["laplace", "horseshoe", "programs", "ica"]
    assert chosen[0].model_kwargs == {"prior": "laplace"} and chosen[2].gene_programs_file == "my.gmt"
    assert chosen[3].post_hoc and not chosen[0].post_hoc
    for bad, message in [
        ("lasso", "Unknown restriction 'lasso'"),
        ("laplace:x", "Unknown restriction"),
        ("laplace,laplace", "more than once"),
        ([], "No restriction"),
        ([3], "named by a string"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_restrictions(bad)
    gmt = tmp_path / "p.gmt"
    gmt.write_text("a\t\tg1\tg2\n")
    (from_file,) = parse_restrictions(f"programs:{gmt}")
    assert restriction_programs(from_file, None) == {"a": ["g1", "g2"]}
    with pytest.raises(InvalidArgumentError, match="given twice"):
        restriction_programs(from_file, {"a": ["g1", "g2"]})
    with pytest.raises(InvalidArgumentError, match="needs gene programs"):
        restriction_programs(parse_restrictions("programs")[0], None)
