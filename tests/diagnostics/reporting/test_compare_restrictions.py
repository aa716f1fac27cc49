"""What a restriction buys and costs: the analyses of ``compare_restrictions`` against known answers,
and the comparison run end to end on simulated data with a known truth."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.diagnostics import RestrictionComparisonSettings, compare_restrictions
from countvae.diagnostics.analyses.restrictions import (
    ALREADY,
    CLOSER,
    IDENTIFIED,
    LOWERS,
    NOT_CLOSER,
    NOT_IDENTIFIED,
    RECOVERS,
    SAME_CELLS,
    TOO_GAUSSIAN,
    UNDETERMINED,
    agreement_pairs,
    depth_residuals,
    identification_verdict,
    pair_agreement,
    predictive_cost,
    program_coherence,
    program_support,
    split_half_reading,
    summarize_agreement,
    truth_recovery,
    truth_verdict,
)
from countvae.diagnostics.fitting.fitted_model import CountVAEFit
from countvae.diagnostics.fitting.heldout import heldout_split
from countvae.diagnostics.fitting.restrictions import (
    Restriction,
    fit_restrictions,
    parse_restrictions,
    restriction_programs,
    split_half_cells,
)
from countvae.errors import BrokenFitError, InvalidArgumentError, InvalidDataError


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
    ("worst", "mean", "baseline", "split", "expected"),
    [
        (0.95, 0.97, 0.40, 0.93, IDENTIFIED),
        # the seeds agree, the independent halves do not: axes of this sample of cells, not credited
        (0.95, 0.97, 0.40, 0.60, SAME_CELLS),
        (0.95, 0.97, 0.40, np.nan, UNDETERMINED),  # no independent cells: no credit
        (0.50, 0.60, 0.40, 0.95, UNDETERMINED),  # better than without it, but not every pair agrees
        (0.30, 0.42, 0.40, 0.30, NOT_IDENTIFIED),
        (0.90, 0.93, 0.95, 0.90, ALREADY),  # the unrestricted seeds already agree: nothing to credit
        (0.30, 0.42, 0.95, 0.30, LOWERS),
        (np.nan, np.nan, 0.5, 0.5, UNDETERMINED),
    ],
)
def test_identification_verdict(worst, mean, baseline, split, expected):
    assert identification_verdict(worst, mean, baseline, split) == expected


def test_components_too_gaussian_are_never_credited_however_well_they_agree():
    assert identification_verdict(0.99, 0.99, 0.40, 0.99, too_gaussian=True) == TOO_GAUSSIAN
    assert identification_verdict(0.99, 0.99, 0.95, 0.99, too_gaussian=True) == ALREADY  # nothing credited either


def test_split_half_reading_separates_too_few_cells_from_no_identification():
    assert "too few cells" in split_half_reading(NOT_IDENTIFIED, 0.5, 0.3)
    assert "would not identify" in split_half_reading(NOT_IDENTIFIED, 0.5, 0.5)
    assert split_half_reading(IDENTIFIED, 0.95, 0.93) == "reproducible from independent halves of the cells"
    assert "close to too few cells" in split_half_reading(ALREADY, 0.95, 0.7)
    assert "see the same cells" in split_half_reading(SAME_CELLS, 0.95, 0.6)
    assert "does not show" in split_half_reading(UNDETERMINED, 0.95, np.nan)
    assert split_half_reading(NOT_IDENTIFIED, 0.5, np.nan) == "split half not measured"


@pytest.mark.parametrize(
    ("mcc", "worst", "baseline", "expected"),
    [
        (0.93, 0.90, 0.70, RECOVERS),
        (0.80, 0.78, 0.70, CLOSER),
        (0.93, 0.92, 0.90, NOT_CLOSER),
        (0.72, 0.71, 0.70, NOT_CLOSER),
        (0.85, 0.70, 0.70, NOT_CLOSER),  # a better mean from one lucky fit is not a recovery
    ],
)
def test_truth_verdict_needs_every_fit_beyond_a_margin_over_the_unrestricted_model(mcc, worst, baseline, expected):
    assert truth_verdict(mcc, worst, baseline) == expected


def test_truth_verdict_of_the_unrestricted_model_itself():
    assert truth_verdict(0.95, 0.9, None) == RECOVERS and truth_verdict(0.7, 0.6, None) == "reference"


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


def test_predictive_cost_is_undetermined_when_too_many_cells_have_unreliable_estimates():
    # The cost counted cells with Pareto k-hat above 0.7, which the estimator's warning says to leave out of
    # model comparisons; the package's one rule now decides, as compare_models does for a candidate.
    rng = np.random.default_rng(2)
    base = rng.normal(-200, 30, 400)
    d = rng.normal(-1.0, 0.5, 400)

    def judged(values, bad):
        frame = _lpd(values)
        frame["khat"] = np.where(np.arange(values.size) < bad, 0.9, 0.3)
        frame["reliable"] = frame["khat"] <= 0.7
        return frame

    # 20 of 400 cells (5%) flagged, in the restricted fit only: within the rule, the verdict stands
    within = predictive_cost({0: judged(base + d, 20)}, {0: judged(base, 0)}, margin=0.5)
    assert within["verdict"] == "costs" and within["n_unreliable"] == 20 and within["reliable"]
    # the union over the fits compared: 15 flagged in one, a different 15 in the other (30 cells, 7.5%)
    shifted = judged(base, 0)
    shifted.loc[np.arange(400) >= 385, ["khat", "reliable"]] = [0.9, False]
    union = predictive_cost({0: judged(base + d, 15)}, {0: shifted}, margin=0.5)
    assert union["n_unreliable"] == 30 and not union["reliable"] and union["verdict"] == "undetermined"
    assert union["difference_per_cell"] == pytest.approx(d.mean(), abs=1e-9)  # the estimate is still shown
    # frames without k-hat are taken on trust
    assert predictive_cost({0: _lpd(base + d)}, {0: _lpd(base)}, margin=0.5)["n_unreliable"] == 0

    from countvae.diagnostics.reporting.sections.restrictions import _cost_phrase

    row = pd.Series({"kind": "model", "lpd_difference_per_cell": union["difference_per_cell"], "margin": 0.5})
    row["lpd_se_per_cell"], row["predictive"] = union["se_per_cell"], union["verdict"]
    row["lpd_unreliable_cells"], row["lpd_cells"] = union["n_unreliable"], union["n_cells"]
    assert _cost_phrase(row).endswith(
        "cannot be judged: the estimates are unreliable (Pareto k-hat) on 30 of 400 held-out cells"
    )


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
    genes = [f"g{i}" for i in range(40)]
    programs = {"present": genes[:4], "absent": genes[6:10]}
    present = rng.normal(size=400)
    expression = rng.normal(size=(400, 40))
    expression[:, :4] += present[:, None]  # the present program's genes share a factor; the absent's do not
    latents = {f"seed {s}": np.column_stack([present, rng.normal(0, 0.01, 400)]) for s in range(3)}
    loadings = dict.fromkeys(latents, _program_loadings(genes, programs, {"present": True, "absent": False}))
    table = program_support(latents, loadings, expression, programs, genes).set_index("program")
    # the factor from the mean of 4 genes with unit noise: R^2 = 1 / (1 + 1/4) = 0.8
    assert table.loc["present", "supported"] and table.loc["present", "set_r2"] == pytest.approx(0.8, abs=0.05)
    assert table.loc["present", "in_program_share"] == pytest.approx(4 / (4 + 36 * 1e-4))
    assert table.loc["present", "coherence"] > 2 and table.loc["absent", "coherence"] <= 1.1
    assert not table.loc["absent", "supported"] and "no more than random" in table.loc["absent", "reason"]
    # the absent program's genes made coherent: now its unused dimension, then its loadings, are what fail
    expression[:, 6:10] += rng.normal(size=400)[:, None]
    table = program_support(latents, loadings, expression, programs, genes).set_index("program")
    assert not table.loc["absent", "supported"] and "unused" in table.loc["absent", "reason"]
    latents = {k: np.column_stack([v[:, 0], rng.normal(size=400)]) for k, v in latents.items()}
    table = program_support(latents, loadings, expression, programs, genes).set_index("program")
    assert not table.loc["absent", "supported"] and "credibly non-zero" in table.loc["absent", "reason"]
    assert table.loc["present", "supported"]


def test_program_support_says_when_coherence_cannot_be_measured():
    # A program of every gene has no random sets to compare with: its NaN coherence read "its genes co-vary no
    # more than random genes do", a finding that was never measured.
    rng = np.random.default_rng(0)
    genes = [f"g{i}" for i in range(10)]
    expression = rng.normal(size=(200, 10))
    latents = {"seed 0": rng.normal(size=(200, 1)), "seed 1": rng.normal(size=(200, 1))}
    loadings = dict.fromkeys(latents, _program_loadings(genes, {"ALL": genes}, {"ALL": True}))
    row = program_support(latents, loadings, expression, {"ALL": genes}, genes).iloc[0]
    assert np.isnan(row["coherence"]) and not row["supported"]
    assert row["reason"].startswith("its coherence cannot be measured")


def test_program_support_reason_counts_the_fits_that_fail_the_rule_the_median_hides():
    # Two fits with variances 0.089 and 0.0009: the table's median activity is 0.045, and the reason said
    # "variance of its posterior means below 0.01" beside it; the rule asks most fits, and one of two is not most.
    rng = np.random.default_rng(0)
    genes = [f"g{i}" for i in range(40)]
    programs = {"P": genes[:4]}
    factor = rng.normal(size=400)
    expression = rng.normal(size=(400, 40))
    expression[:, :4] += factor[:, None]
    latents = {"seed 0": 0.3 * factor[:, None], "seed 1": 0.03 * factor[:, None]}
    loadings = dict.fromkeys(latents, _program_loadings(genes, programs, {"P": True}))
    row = program_support(latents, loadings, expression, programs, genes).iloc[0]
    assert row["activity"] == pytest.approx((0.09 * factor.var() + 0.0009 * factor.var()) / 2)
    assert not row["supported"] and row["reason"].startswith("dimension unused in 1 of 2 fits (variance of its")
    # a third fit that uses it makes two of three: most fits, supported
    latents["seed 2"] = 0.3 * factor[:, None]
    loadings["seed 2"] = loadings["seed 0"]
    assert program_support(latents, loadings, expression, programs, genes).iloc[0]["supported"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_program_coherence_is_at_par_for_random_genes_and_above_it_for_a_shared_factor(seed):
    rng = np.random.default_rng(seed)
    x = rng.poisson(3.0, size=(300, 60)).astype(float)
    assert 0.8 < program_coherence(x, range(8), seed=seed) <= 1.1
    x[:, :8] += 0.7 * rng.normal(size=300)[:, None]
    # gene-gene correlation 0.49 / 3.49 = 0.14: top eigenvalue about 1 + 7 * 0.14 = 1.98, random sets about 1.35
    assert program_coherence(x, range(8), seed=seed) > 1.25
    x[:, 8] = 1.0
    assert np.isnan(program_coherence(x, [0, 8]))


def test_program_coherence_divides_by_the_95th_percentile_of_the_random_set_eigenvalue():
    """Known answer: 36 genes whose correlations are exact, so every gene set's top eigenvalue is known.

    Thirteen "loaded" genes share one factor with correlation exactly 0.5 between any two of them; the other 23
    are exactly uncorrelated with every gene (orthonormal centred columns). A set holding ``j`` loaded genes
    has top eigenvalue ``1 + (j - 1) * 0.5`` (1 when ``j <= 1``). Random 8-gene sets hold a hypergeometric
    ``j``: P(j <= 4) = 0.909 and P(j <= 5) = 0.984, so with 5,000 sets the 95th percentile of their
    eigenvalue is that of j = 5, 3.0, with overwhelming probability (the 90th would be 2.5, the 99th 3.5).
    Eight loaded genes have 1 + 7 * 0.5 = 4.5: coherence exactly 4.5 / 3.0 = 1.5.
    """
    from scipy.stats import hypergeom

    n_genes, n_loaded, set_size = 36, 13, 8
    cdf = hypergeom(n_genes, n_loaded, set_size).cdf
    assert 0.905 < cdf(4) < 0.915 and 0.98 < cdf(5) < 0.99  # the design: the 95th percentile sits inside j = 5
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(400, n_genes + 1))
    basis, _ = np.linalg.qr(raw - raw.mean(0))  # orthonormal columns, each orthogonal to the constant
    x = basis[:, 1:].copy()
    x[:, :n_loaded] = np.sqrt(0.5) * basis[:, [0]] + np.sqrt(0.5) * basis[:, 1 : n_loaded + 1]
    assert program_coherence(x, range(set_size), n_sets=5000, seed=3) == pytest.approx(1.5, abs=1e-9)
    # a set of free genes has eigenvalue 1 against the same reference
    assert program_coherence(x, range(20, 28), n_sets=5000, seed=3) == pytest.approx(1.0 / 3.0, abs=1e-9)


def test_depth_residuals_remove_a_trend_shared_through_sequencing_depth():
    rng = np.random.default_rng(0)
    library = np.exp(rng.normal(7, 0.5, 500))
    x = np.log(library)[:, None] * rng.uniform(0.5, 1.5, 10) + rng.normal(size=(500, 10))
    assert program_coherence(x, range(5)) > 1.5 or _top_corr(x) > 0.3  # the raw genes co-vary through depth
    residuals = depth_residuals(x, library)
    assert _top_corr(residuals) < 0.2
    np.testing.assert_allclose(residuals.mean(0), 0.0, atol=1e-9)


def _top_corr(x):
    c = np.corrcoef(x, rowvar=False)
    return float(np.max(np.abs(c - np.eye(len(c)))))


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


# ----- end to end on simulated data with a known truth -----------------------------------------------------
@pytest.fixture(scope="module")
def comparison():
    """Sparse Laplace sources; the true gene programs plus one made of genes no source loads on."""
    adata = cv.data.simulate(
        n_cells=400, n_genes=60, n_latent=2, seed=0, sources="laplace", loading_sparsity=0.7, loading_scale=0.5
    )
    cv.CountVAE.setup_anndata(adata)
    programs = cv.data.true_programs(adata)
    noise = [
        g for g, row in zip(adata.var_names, np.asarray(adata.uns["simulation"]["W"]), strict=True) if not row.any()
    ]
    programs["absent"] = noise[:6]
    report = compare_restrictions(
        adata,
        "laplace,programs,ica",
        seeds=[0, 1],
        gene_programs=programs,
        model_kwargs={"n_hidden": 16},
        train_kwargs={"max_epochs": 40, "lr": 1e-2},
        n_lpd_samples=10,
    )
    return adata, programs, report


def test_comparison_reports_every_model_with_its_cost_agreement_and_truth(comparison):
    adata, programs, report = comparison
    table = report.restrictions.set_index("model")
    assert list(table.index) == ["unrestricted", "laplace", "programs", "ica"]
    assert list(table["symmetry"]) == ["orthogonal", "signed permutation", "sign flip", "orthogonal"]
    assert table.loc["unrestricted", "predictive"] == "reference"
    assert table.loc["ica", "predictive"] == "unchanged model" and table.loc["ica", "lpd_difference_per_cell"] == 0
    for name in ("laplace", "programs"):
        row = table.loc[name]
        assert row["ci95_low"] < row["lpd_difference_per_cell"] < row["ci95_high"]
        assert row["predictive"] in {"costs", "gains", "equivalent", "undetermined"}
    assert table["sources_mcc"].between(0, 1).all() and table["loadings_mcc"].between(0, 1).all()
    assert table["split_half_agreement"].notna().all()
    # each model's declared symmetry checked numerically: the maps it keeps leave p(x) unchanged to rounding;
    # of the maps it breaks, the gene programs' change log p(x, W) far beyond the Monte Carlo error (a
    # briefly trained Laplace model's change under a rotation can be within it, and is then reported so)
    symmetry = report.tables["symmetry"]
    assert symmetry.loc[symmetry["p_x_expected"] == "unchanged", "confirmed"].all()
    assert symmetry.loc[symmetry["model"] == "programs", "confirmed"].all()
    assert set(report.tables["symmetry"]["model"]) == {"unrestricted", "laplace", "programs"}
    assert len(report.tables["agreement_pairs"]) == 4  # one pair of seeds per model
    assert any("simulated truth" in line for line in report.headline)


def test_comparison_says_which_gene_programs_the_data_support(comparison):
    _, programs, report = comparison
    table = report.programs.set_index("program")
    assert list(table.index) == list(programs)
    assert not table.loc["absent", "supported"] and "no more than random" in table.loc["absent", "reason"]
    assert table.loc[["source0", "source1"], "coherence"].gt(1.0).all()
    assert any("not supported: absent" in line for line in report.headline)


def test_comparison_report_is_saved_and_readable(comparison, tmp_path):
    _, _, report = comparison
    folder = report.save(tmp_path / "rep")
    record = json.loads((folder / "report.json").read_text())
    assert record["headline"] == report.headline and record["tables"]["restrictions"][0]["model"] == "unrestricted"
    assert report.headline[0] in (folder / "report.md").read_text()
    assert "<table" in (folder / "report.html").read_text()


def test_comparison_refuses_bad_requests_before_fitting():
    adata = cv.data.simulate(n_cells=60, n_genes=12, n_latent=2, seed=0)
    cv.CountVAE.setup_anndata(adata)
    with pytest.raises(InvalidArgumentError, match="'programs' is not among"):
        compare_restrictions(adata, "laplace", gene_programs={"a": ["gene0", "gene1"]})
    with pytest.raises(InvalidDataError, match="not in the data"):
        compare_restrictions(adata, "programs", gene_programs={"a": ["gene0", "NOPE"], "b": ["gene2", "gene3"]})
    with pytest.raises(InvalidArgumentError, match="leave n_latent out"):
        compare_restrictions(adata, "programs", gene_programs={"a": ["gene0", "gene1"]}, model_kwargs={"n_latent": 3})
    # "no" is truthy: the split-half fits and the symmetry check ran though asked away
    for name in ("split_half", "check_symmetry"):
        with pytest.raises(InvalidArgumentError, match=f"{name} must be True or False"):
            compare_restrictions(adata, "laplace", **{name: "no"})
    # a restriction's own setting given to every model made the unrestricted reference restricted, still so labelled
    for kwargs in ({"prior": "laplace"}, {"loadings_prior": "horseshoe"}):
        with pytest.raises(InvalidArgumentError, match=rf"model_kwargs sets \['{next(iter(kwargs))}'\].*restrictions="):
            compare_restrictions(adata, "laplace", model_kwargs=kwargs)
    # refused before any fit (they raised a raw TypeError/AttributeError/KeyError, or only after every fit)
    fitted = []
    import countvae.diagnostics.reporting.compare_restrictions as module

    def no_fits(*args, **kwargs):
        fitted.append(args)
        raise AssertionError("fitted before refusing")

    original, module.fit_restrictions = module.fit_restrictions, no_fits
    try:
        for kwargs, message in (
            ({"seeds": 3}, "seeds must be a sequence of integers"),
            ({"model_kwargs": {"decoder": "mlp"}, "restrictions": "horseshoe"}, "use decoder='linear'"),
            ({"markers": ["CD3E"]}, "CD3E"),
            ({"seed": -1}, "seed must be an integer >= 0"),
            ({"restrictions": [Restriction("lapalce")]}, "Unknown restriction 'lapalce'"),
            ({"unknown_genes": "bogus"}, "unknown_genes"),
            # dropping program genes when no restriction has programs did nothing, and the settings recorded it
            ({"unknown_genes": "drop"}, "unknown_genes='drop' applies to the genes of the 'programs' restriction"),
        ):
            with pytest.raises(InvalidArgumentError, match=message):
                compare_restrictions(adata, **{"restrictions": "laplace", **kwargs})
        with pytest.raises(InvalidArgumentError, match="expects an AnnData, got csr_matrix"):
            compare_restrictions(sp.csr_matrix(adata.X), "laplace")
    finally:
        module.fit_restrictions = original
    assert fitted == []
    # the reference's own values restrict nothing and are accepted
    from countvae.diagnostics.reporting.compare_restrictions import _model_settings

    _, by_model = _model_settings(parse_restrictions("laplace"), None, {"prior": "normal", "loadings_prior": "none"})
    assert by_model["unrestricted"]["prior"] == "normal" and by_model["laplace"]["prior"] == "laplace"


def test_a_gene_without_counts_in_a_split_half_is_refused_before_fitting(tmp_path):
    # The split halves were fitted after every seed of every model, and the first half's fit then refused the gene.
    adata = cv.data.simulate(n_cells=60, n_genes=12, n_latent=2, seed=0)
    fit_idx, _ = heldout_split(adata.n_obs, 0.25, 0)
    first_half = fit_idx[split_half_cells(len(fit_idx), 0)[0]]
    x = np.asarray(adata.X.todense() if hasattr(adata.X, "todense") else adata.X).copy()
    x[:, 3] = 1.0
    x[first_half, 3] = 0.0
    adata.X = x
    cv.CountVAE.setup_anndata(adata)
    with pytest.raises(InvalidDataError, match=r"1 genes have no counts in half 1 of the 45 fit cells.*'gene3'"):
        compare_restrictions(adata, "laplace", seeds=[0, 1], heldout_fraction=0.25, out_dir=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_comparison_takes_its_settings_as_keywords_or_one_object():
    """A misspelt keyword names the setting meant; a settings object is checked like the keywords."""
    adata = cv.data.simulate(n_cells=60, n_genes=12, n_latent=2, seed=0)
    cv.CountVAE.setup_anndata(adata)
    with pytest.raises(InvalidArgumentError, match="Did you mean 'margin'"):
        compare_restrictions(adata, "laplace", margn=1.0)
    with pytest.raises(InvalidArgumentError, match="'programs' is not among"):
        compare_restrictions(adata, "laplace", settings=RestrictionComparisonSettings(gene_programs={"a": ["gene0"]}))


def test_a_fit_declares_the_symmetry_of_its_whole_model():
    """The multi-seed report reads a fit's symmetry: a prior on the loadings narrows it as the z prior does."""
    adata = cv.data.simulate(n_cells=60, n_genes=12, n_latent=2, seed=0)
    cv.CountVAE.setup_anndata(adata)
    programs = {"a": ["gene0", "gene1"], "b": ["gene2", "gene3"]}
    expected = [
        ({}, "orthogonal"),
        ({"prior": "laplace"}, "signed permutation"),
        ({"loadings_prior": "horseshoe"}, "signed permutation"),
        ({"gene_programs": programs}, "sign flip"),
    ]
    for kwargs, symmetry in expected:
        model = cv.CountVAE(adata, n_latent=2, decoder="linear", **kwargs)
        assert CountVAEFit(model, seed=0).symmetry == symmetry


def _readout_row(model, label, mean, worst, split, baseline_mean, loadings_mcc=np.nan):
    verdict = "reference" if baseline_mean is None else identification_verdict(worst, mean, baseline_mean, split)
    reading = "reference" if baseline_mean is None else split_half_reading(verdict, mean, split)
    return {
        "model": model,
        "label": label,
        "kind": "model",
        "coordinates_agreement": mean,
        "coordinates_agreement_min": worst,
        "rotation_ceiling": 0.86,
        "identified": verdict,
        "split_half_agreement": split,
        "split_half_reading": reading,
        "predictive": "equivalent",
        "lpd_difference_per_cell": 0.0,
        "lpd_se_per_cell": 0.1,
        "margin": 0.5,
        "sources_mcc": 0.7,
        "loadings_mcc": loadings_mcc,
        "truth": NOT_CLOSER,
    }


@pytest.mark.parametrize(
    ("mean", "worst", "split", "why"),
    [
        (0.83, 0.83, 0.49, "above the N(0, I) prior's, but below 0.9 on the worst pair"),
        (1.0, 1.0, np.nan, "every seed pair agrees, but the split half was not measured"),
        (0.93, 0.88, 0.95, "some seed pairs agree, some do not"),
    ],
)
def test_an_undetermined_restriction_is_worded_by_its_case(mean, worst, split, why):
    """Each of identification_verdict's undetermined cases gets its own reason; with one pair of seeds at 0.83,
    or every pair at 1.0, the headline said "some seed pairs agree, some do not"."""
    from countvae.diagnostics.reporting.sections.restrictions import headline

    table = pd.DataFrame(
        [
            _readout_row("unrestricted", "N(0, I) prior", 0.74, 0.74, 0.76, None),
            _readout_row("horseshoe", "horseshoe prior", mean, worst, split, 0.74),
        ]
    )
    assert table["identified"].iloc[1] == UNDETERMINED
    sentence = next(line for line in headline(table, 2, None) if line.startswith("The horseshoe prior"))
    assert f"undetermined ({why})" in sentence


def test_the_truth_sentence_brackets_loadings_only_for_models_that_have_them():
    """An MLP decoder has no loadings (MCC NaN): no "(loadings nan)"; a linear one's loadings MCC is bracketed."""
    from countvae.diagnostics.reporting.sections.restrictions import headline

    rows = [_readout_row("unrestricted", "N(0, I) prior", 0.74, 0.74, 0.76, None)]
    rows.append(_readout_row("laplace", "Laplace prior on z", 0.75, 0.7, 0.7, 0.74))
    mlp = " ".join(headline(pd.DataFrame(rows), 2, None))
    assert "nan" not in mlp and "loadings MCC in brackets" not in mlp
    rows[1]["loadings_mcc"] = 0.81
    linear = " ".join(headline(pd.DataFrame(rows), 2, None))
    assert "0.70 (loadings 0.81) under the Laplace prior on z" in linear and "in brackets" in linear


def test_a_damaged_stored_seed_is_named_with_a_remedy_the_comparison_can_follow(tmp_path):
    data = cv.data.simulate(n_cells=200, n_genes=30, n_latent=2, decoder="linear", seed=1)
    cv.CountVAE.setup_anndata(data)

    def fit():
        return fit_restrictions(
            data, {"free": {"n_latent": 2, "decoder": "linear"}}, [0, 1], {"max_epochs": 2},
            split_half=False, heldout_fraction=0.2, split_seed=0, out_dir=str(tmp_path / "rs"),
        )  # fmt: skip

    fit()
    seeds = tmp_path / "rs" / "free" / "fits"
    (seeds / "seed_1" / "model" / "params.pt").write_bytes(b"junk")
    with pytest.raises(BrokenFitError) as info:
        fit()
    assert "refit_broken" not in str(info.value) and f"Move {seeds / 'seed_1'} out of" in str(info.value)
    (seeds / "seed_1").rename(tmp_path / "seed_1")
    assert fit().fits["free"][1].seed == 1


def test_marker_genes_of_a_backed_file_are_checked_by_name_before_any_fit(tmp_path, monkeypatch):
    """On a backed file the marker check read the counts through scipy and failed with a raw ValueError ("does not
    support dtype object") before any fitting; the genes are checked by name, obs markers and misspellings as before."""
    import anndata as ad

    import countvae.diagnostics.reporting.compare_restrictions as module

    path = tmp_path / "sim.h5ad"
    cv.data.simulate(n_cells=200, n_genes=30, n_latent=2, decoder="linear", seed=1).write_h5ad(path)
    backed = ad.read_h5ad(path, backed="r")
    cv.data.setup_anndata(backed)

    def no_fits(*args, **kwargs):
        raise AssertionError("went on to fit")

    monkeypatch.setattr(module, "fit_restrictions", no_fits)
    gene = str(backed.var_names[0])
    with pytest.raises(AssertionError, match="went on to fit"):
        compare_restrictions(backed, "laplace", markers=[gene])
    with pytest.raises(InvalidArgumentError, match=r"Markers \['nosuchgene'\] are neither genes"):
        compare_restrictions(backed, "laplace", markers=[gene, "nosuchgene"])
    # neither a name nor a list: refused as report refuses it, not a raw TypeError
    with pytest.raises(
        InvalidArgumentError, match="markers must be a gene or obs column name, or a list of them, got 5"
    ):
        compare_restrictions(backed, "laplace", markers=5)
