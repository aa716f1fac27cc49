"""compare_models: the candidate grid, the rule on a simulation of known latent size, bad input, files, the figure."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes

import countvae as cv
from countvae import diagnostics
from countvae.diagnostics.analyses import model_comparison as mc
from countvae.diagnostics.fitting.lpd_quantity import GIVEN_OBSERVED_LIBRARY, LIBRARY_INTEGRATED, with_quantity
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.compare_models import check_same_genes
from countvae.diagnostics.reporting.model_comparison_report import ModelComparison
from countvae.errors import BrokenFitError, InvalidArgumentError, InvalidDataError, OutputExistsError

TRAIN = {"max_epochs": 200, "batch_size": 128, "lr": 1e-2}


@pytest.fixture(scope="module")
def adata():
    data = cv.data.simulate(n_cells=600, n_genes=60, n_latent=2, decoder="linear", seed=0)
    cv.CountVAE.setup_anndata(data)
    return data


@pytest.fixture(scope="module")
def fits_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fits")


def _compare(adata, fits_dir):
    return diagnostics.compare_models(
        adata,
        {"n_latent": [2, 3, 4], "decoder": ["linear"]},
        seeds=range(2),
        train_kwargs=TRAIN,
        out_dir=fits_dir,
        n_lpd_samples=20,
    )


@pytest.fixture(scope="module")
def comparison(adata, fits_dir):
    return _compare(adata, fits_dir)


def test_grid_expands_to_the_product_and_lists_pass_through():
    grid = mc.expand_candidates({"n_latent": [2, 5], "decoder": ["linear", "mlp"]})
    assert grid == [
        {"n_latent": 2, "decoder": "linear"},
        {"n_latent": 2, "decoder": "mlp"},
        {"n_latent": 5, "decoder": "linear"},
        {"n_latent": 5, "decoder": "mlp"},
    ]
    assert mc.expand_candidates({"decoder": "linear"}) == [{"decoder": "linear"}]
    listed = [{"n_latent": 3}, {"n_latent": 1, "decoder": "linear"}]
    assert mc.expand_candidates(listed) == listed
    # a numpy array or a pandas column of values is a list of values (it was one value: "got array([2, 3, 4])")
    for values in (np.arange(2, 5), pd.Series([2, 3, 4]), pd.Index([2, 3, 4])):
        grid = mc.expand_candidates({"n_latent": values, "decoder": "linear"})
        assert grid == [{"n_latent": k, "decoder": "linear"} for k in (2, 3, 4)]
        assert all(type(c["n_latent"]) is int for c in grid)


def test_size_order_is_latents_then_linear_then_hidden_units():
    settings = [
        {"n_latent": 5, "decoder": "linear"},
        {"n_latent": 2, "decoder": "mlp", "n_hidden": 64},
        {"n_latent": 2, "decoder": "mlp", "n_hidden": 16},
        {"n_latent": 2, "decoder": "linear", "n_hidden": 512},
    ]
    ordered = sorted(settings, key=mc.size_key)
    assert ordered == [settings[3], settings[2], settings[1], settings[0]]


def _table(verdicts, stable, reliable, margin=0.1):
    n = len(verdicts)
    return pd.DataFrame(
        {
            "candidate": [f"c{i}" for i in range(n)],
            "fit_verdict": verdicts,
            "stable": stable,
            "reliable": reliable,
            "margin": margin,
            "lpd_per_cell": np.zeros(n),
        }
    )


def test_summary_says_why_no_margin_can_be_stated():
    # the candidates explain less than the no-latent baseline: the margin is NaN, which the summary must not print
    comparison = ModelComparison(
        table=_table([mc.BEST], [True], [True], margin=np.nan),
        recommended=None,
        recommended_name=None,
        best="c0",
        margin=np.nan,
        gain_over_baseline=-0.58,
        margin_share=0.02,
        alpha=0.05,
        n_heldout=20,
        seeds=[0, 1],
    )
    summary = comparison.summary()
    assert "nan" not in summary.lower()
    assert "margin: none can be stated (the best candidate's gain of -0.5800 nats/cell" in summary


def test_rule_takes_the_smallest_qualifying_candidate_or_none():
    settings = {"c0": {"n_latent": 1}, "c1": {"n_latent": 2}, "c2": {"n_latent": 4}}
    table = _table([mc.WORSE, mc.EQUIVALENT, mc.BEST], [True, True, True], [True, True, True])
    assert mc.recommend(table, settings) == "c1"
    table = _table([mc.WORSE, mc.EQUIVALENT, mc.BEST], [True, False, True], [True, True, True])
    assert mc.recommend(table, settings) == "c2"
    table = _table([mc.UNDETERMINED, mc.NOT_WORSE, mc.BEST], [True, True, False], [True, True, True])
    assert mc.recommend(table, settings) == "c1"
    assert mc.recommend(_table([mc.BEST, mc.WORSE, mc.WORSE], [False] * 3, [True] * 3), settings) is None
    assert mc.recommend(_table([mc.BEST, mc.EQUIVALENT, mc.BEST], [True] * 3, [True] * 3, np.nan), settings) is None


def test_the_rule_needs_reliable_estimates_whatever_the_fit_verdict_says():
    """c0 (1 latent dimension) fits as well as the best and is stable, but its estimates are unreliable: the rule asks
    for reliable estimates on their own, so the smallest qualifying candidate is c1 (2 dimensions); with c0 reliable
    it is c0. fit_table never writes an unreliable candidate's verdict as "equivalent"; recommend does not rely on
    that."""
    settings = {"c0": {"n_latent": 1}, "c1": {"n_latent": 2}, "c2": {"n_latent": 4}}
    verdicts = [mc.EQUIVALENT, mc.NOT_WORSE, mc.BEST]
    assert mc.recommend(_table(verdicts, [True] * 3, [False, True, True]), settings) == "c1"
    assert mc.recommend(_table(verdicts, [True] * 3, [True] * 3), settings) == "c0"
    assert mc.recommend(_table(verdicts, [True] * 3, [False, False, True]), settings) == "c2"


def test_of_equal_latent_size_the_fewer_parameters_then_the_better_fit_whatever_the_list_order():
    """NB and ZINB candidates of one latent size were ordered by the list: --likelihood zinb,nb recommended ZINB,
    --likelihood nb,zinb NB, on the same fits. Candidates that differ only in the prior are of one size: the better
    fit is recommended."""
    table = _table([mc.EQUIVALENT, mc.EQUIVALENT], [True, True], [True, True])
    sizes = {name: {"n_latent": 3, "decoder": "linear", "likelihood": name} for name in ("nb", "zinb")}
    for names in (["zinb", "nb"], ["nb", "zinb"]):
        for fits in ({"nb": -217.5, "zinb": -218.2}, {"nb": -218.2, "zinb": -217.5}):  # the smaller, however fit
            ordered = table.assign(candidate=names, lpd_per_cell=[fits[n] for n in names])
            assert mc.recommend(ordered, sizes) == "nb"
    priors = {"normal": {"n_latent": 3, "prior": "normal"}, "laplace": {"n_latent": 3, "prior": "laplace"}}
    for names, fits in ((["normal", "laplace"], [-218.2, -217.5]), (["laplace", "normal"], [-217.5, -218.2])):
        assert mc.recommend(table.assign(candidate=names, lpd_per_cell=fits), priors) == "laplace"


def test_a_gene_program_candidate_is_sized_by_its_programs():
    """A candidate given by three gene programs has three latent dimensions; it was sized as CountVAE's default 10,
    so a 4-d candidate was recommended over it."""
    from types import SimpleNamespace

    from countvae.diagnostics.reporting import compare_models as cm
    from countvae.model.settings import ModelSettings

    programs = {f"p{k}": [f"gene{g}" for g in range(10 * k, 10 * k + 10)] for k in range(3)}
    given = {"decoder": "linear", "gene_programs": programs}
    recorded = ModelSettings(**given)
    fit = SimpleNamespace(model=SimpleNamespace(settings=recorded), n_latent=recorded.n_latent)
    assert cm._size_settings(given, fit)["n_latent"] == 3
    four = {"decoder": "linear", "n_latent": 4}
    four_fit = SimpleNamespace(model=SimpleNamespace(settings=ModelSettings(**four)), n_latent=4)
    sizes = {"c0": cm._size_settings(four, four_fit), "c1": cm._size_settings(given, fit)}
    table = _table([mc.EQUIVALENT, mc.BEST], [True, True], [True, True])
    assert mc.recommend(table, sizes) == "c1"
    # an scvi-tools fit without the setting: its fits' latent size
    assert cm._size_settings({}, SimpleNamespace(n_latent=5))["n_latent"] == 5
    # the folder of such a candidate: a file name the file system takes, one per candidate
    name = cm.candidate_name(given)
    assert len(name) > 255 and len(cm._folder_name(name)) <= 120
    assert cm._folder_name(name) != cm._folder_name(cm.candidate_name({**given, "n_hidden": 64}))


def test_unreliable_candidates_are_never_best():
    rng = np.random.default_rng(0)
    base = rng.normal(-100, 5, size=200)
    lpds = {"a": base, "b": base + 1.0, "c": base + 0.01 * rng.normal(size=200)}
    table, best = mc.fit_table(lpds, {"a": True, "b": False, "c": True}, margin=0.5)
    assert best in {"a", "c"}
    assert table.set_index("candidate").loc["b", "fit_verdict"] == mc.UNRELIABLE
    assert table.set_index("candidate").loc[best, "fit_verdict"] == mc.BEST
    other = "a" if best == "c" else "c"
    assert table.set_index("candidate").loc[other, "fit_verdict"] == mc.EQUIVALENT


def test_without_a_margin_candidates_are_judged_by_k_hat_and_ranked_but_none_recommended():
    """Fits that gain nothing over the no-latent baseline have no margin; their estimates (k-hat 0.1, bias bound
    0.00005 nats) are not the problem, so no candidate is "unreliable": the best fit is named, the others are
    undetermined (no margin to judge a difference by), and nothing is recommended. One candidate with k-hat 0.9
    stays unreliable. Before, every candidate was "unreliable: not ranked", blaming the estimator."""
    n = 200
    noise = np.random.default_rng(1).normal(0.0, 0.5, size=n)
    lpds = {"A": -100.0 + noise, "B": -100.5 + noise, "C": -99.0 + noise}
    frames = {}
    for name, khat in (("A", 0.1), ("B", 0.1), ("C", 0.9)):
        frame = pd.DataFrame({"lpd": lpds[name], "mc_se": 0.01, "khat": khat, "reliable": khat <= 0.7})
        frames[name] = [frame, frame.copy()]
    table, best, margin, gain = mc.settled_fit_table(lpds, frames, np.full(n, -90.0), share=0.02)
    assert np.isnan(margin) and gain < 0 and best == "A"
    verdicts = table.set_index("candidate")["fit_verdict"].to_dict()
    assert verdicts == {"A": mc.BEST, "B": mc.UNDETERMINED, "C": mc.UNRELIABLE}
    table["stable"] = True
    assert mc.recommend(table, {name: {"n_latent": 2} for name in lpds}) is None


def test_reliability_is_judged_at_the_margin_the_table_reports():
    """A: best fit, unreliable (k-hat); B: bias bound 0.0295 nats, under a tenth of A's margin (0.30) but over a tenth
    of its own (0.29); C: precise. The margin is measured on the best reliable candidate, so B cannot be best at its
    own margin: C is, and the table's margin is C's (0.28). Judged at A's margin and reported at B's, B was best."""
    n = 200
    noise = np.random.default_rng(0).normal(0.0, 0.5, size=n)
    lpds = {"A": -100.0 + noise, "B": -101.0 + noise, "C": -102.0 + noise}

    def seeds(mc_se, khat):
        frame = pd.DataFrame({"lpd": lpds_of, "mc_se": mc_se, "khat": khat, "reliable": khat <= 0.7})
        return [frame, frame.copy()]

    frames = {}
    for name, mc_se, khat in (("A", 0.01, 0.9), ("B", np.sqrt(2 * 0.0295), 0.1), ("C", 0.01, 0.1)):
        lpds_of = lpds[name]
        frames[name] = seeds(np.full(n, mc_se), np.full(n, khat))
    table, best, margin, gain = mc.settled_fit_table(lpds, frames, np.full(n, -130.0), share=0.01)
    assert best == "C" and gain == pytest.approx(28.0 + noise.mean()) and margin == pytest.approx(0.01 * gain)
    assert table.set_index("candidate")["reliable"].to_dict() == {"A": False, "B": False, "C": True}
    assert (table["margin"] == margin).all()


def test_known_latent_size_fit_ordering(comparison):
    table = comparison.table.set_index("n_latent")
    margin = comparison.margin
    assert np.isfinite(margin) and margin > 0
    assert set(table.index) == {2, 3, 4}
    # Two sources need three dimensions of the observed-library log-linear decoder (the third carries the
    # library share the sources move): two are worse than three by more than the margin, four add nothing.
    assert table.loc[2, "lpd_per_cell"] - table.loc[3, "lpd_per_cell"] < -margin
    assert table.loc[2, "fit_verdict"] == mc.WORSE
    assert table.loc[4, "lpd_per_cell"] - table.loc[3, "lpd_per_cell"] < margin
    assert comparison.recommended == {"n_latent": 3, "decoder": "linear"}
    assert table["reliable"].dtype == bool
    for column in ("decoded_means", "distances", "knn", mc.COORDINATES, "fit_seconds", "seed_spread"):
        assert table[column].notna().all()
    assert (table["diff_low"] <= table["diff_vs_best"]).all()
    assert (table["diff_vs_best"] <= table["diff_high"]).all()
    for score in mc.STABILITY_THRESHOLDS:
        assert (table[f"{score}_low"] <= table[score]).all() and (table[score] <= table[f"{score}_high"]).all()
    assert comparison.rule.startswith("Recommended: the smallest candidate")
    assert "Recommendation:" in comparison.summary()


def test_each_candidate_says_which_seeds_reached_the_same_solution(comparison):
    table = comparison.table.set_index("n_latent")
    for groups in table["seed_groups"]:
        seeds = [s for group in groups.split(" (")[0].split(" | ") for s in group.split(", ")]
        assert sorted(seeds) == ["0", "1"]  # every seed in exactly one group
    # the recommended size is stable across seeds, and its two seeds reached one solution
    assert table.loc[3, "stable"] and table.loc[3, "seed_groups"] == "0, 1"


def _stored_fits(adata, fits_dir):
    """Two of the comparison's candidates, read back from its folders, and their settings."""
    fits = {
        f"n_latent={k}": diagnostics.load_seed_fits(fits_dir / f"n_latent={k}__decoder=linear", adata) for k in (2, 3)
    }
    return fits, {f"n_latent={k}": {"n_latent": k, "decoder": "linear"} for k in (2, 3)}


def test_beyond_max_heldout_cells_every_fit_is_compared_on_one_random_subset(adata, comparison, fits_dir, monkeypatch):
    from dataclasses import replace

    from countvae.diagnostics.analyses.subspace import subsample
    from countvae.diagnostics.reporting import compare_models as module

    fits, settings = _stored_fits(adata, fits_dir)
    held = fits["n_latent=2"].adata_heldout
    assert held.n_obs == 60
    subset = subsample(60, 40, 3)  # the report's subsample of its held-out log p(x) cells, from the seed
    assert len(subset) == 40 and len(set(subset)) == 40
    estimated = []

    def recording(fit_list, cells, s):
        estimated.append((len(fit_list), list(cells.obs_names)))
        return heldout_lpd(fit_list, cells, s)

    heldout_lpd = module.heldout_lpd
    monkeypatch.setattr(module, "heldout_lpd", recording)
    capped = diagnostics.compare_fits(fits, settings, n_lpd_samples=10, max_heldout_cells=40, seed=3)
    # one pool of estimates, every candidate and seed on the same 40 cells: the differences stay paired
    assert estimated == [(4, list(held.obs_names[subset]))]
    assert (capped.n_heldout, capped.n_heldout_total) == (40, 60)
    assert "evaluated on the same 40 of the 60 held-out cells (a random subset: max_heldout_cells)" in capped.summary()
    # every number is the comparison of the same fits holding out those 40 cells only (intervals of 40 cells)
    only = {name: replace(f, adata_heldout=held[subset].copy()) for name, f in fits.items()}
    direct = diagnostics.compare_fits(only, settings, n_lpd_samples=10, seed=3)
    pd.testing.assert_frame_equal(capped.table, direct.table)
    # at or below the cap nothing changes
    full = diagnostics.compare_fits(fits, settings, n_lpd_samples=10, seed=3)
    pd.testing.assert_frame_equal(
        diagnostics.compare_fits(fits, settings, n_lpd_samples=10, max_heldout_cells=60, seed=3).table, full.table
    )
    assert (full.n_heldout, full.n_heldout_total) == (60, 60)
    assert "evaluated on the same 60 held-out cells." in full.summary()
    assert not capped.table["diff_vs_best"].equals(full.table["diff_vs_best"])


def test_decoded_means_are_kept_for_the_most_variable_genes_only(adata, comparison, fits_dir, monkeypatch):
    from countvae.diagnostics.analyses.heldout_data import gene_variance

    fits, settings = _stored_fits(adata, fits_dir)
    monkeypatch.setattr(mc, "MAX_DECODED_GENES", 20, raising=False)
    compared = []
    stability = mc.stability
    monkeypatch.setattr(
        mc, "stability", lambda z, rates, seed: compared.append(rates) or stability(z, rates, seed=seed)
    )
    diagnostics.compare_fits(fits, settings, n_lpd_samples=10)
    held = fits["n_latent=2"].adata_heldout
    top = np.sort(np.argsort(-gene_variance(held, held.var_names), kind="stable")[:20])  # the report's gene order
    assert len(compared) == 2 and all(r.shape == (60, 20) for rates in compared for r in rates)
    fit = fits["n_latent=2"][0]
    np.testing.assert_array_equal(compared[0][0], fit.decode_log_rate(held, fit.latent(held))[:, top])


def test_rerun_resumes_from_the_candidate_folders(adata, comparison, fits_dir):
    assert sorted(p.name for p in fits_dir.iterdir()) == sorted(f"n_latent={k}__decoder=linear" for k in (2, 3, 4))
    again = _compare(adata, fits_dir)
    assert (again.table["fit_seconds"] == comparison.table["fit_seconds"]).all()
    pd.testing.assert_series_equal(again.table["lpd_per_cell"], comparison.table["lpd_per_cell"])


@pytest.mark.parametrize(
    ("candidates", "seeds", "match"),
    [
        ({}, range(2), "grid is empty"),
        ([], range(2), "list is empty"),
        ({"n_latent": []}, range(2), "no values"),
        ({"n_latents": [2]}, range(2), "Did you mean 'n_latent'"),
        ({"n_latent": [60]}, range(2), "data allow fewer than 60"),
        ({"n_latent": [2]}, [0], "at least two seeds"),
    ],
)
def test_bad_input_is_refused_with_a_remedy(adata, candidates, seeds, match):
    with pytest.raises(InvalidArgumentError, match=match):
        diagnostics.compare_models(adata, candidates, seeds=seeds, train_kwargs=TRAIN)


@pytest.mark.parametrize(
    ("setting", "match"),
    [
        # a baseline on 1 cell gave a gain of 11,000 nats per cell and a margin to match; 0 cells gave NaN
        ({"max_baseline_cells": 1}, "max_baseline_cells must be an integer >= 10"),
        ({"max_baseline_cells": -5}, "max_baseline_cells must be an integer >= 10"),
        ({"seed": -1}, "seed must be an integer >= 0"),  # refused only after every candidate was fitted
        # fewer held-out cells than the k-NN overlap is judged on leave every candidate's stability undetermined
        ({"max_heldout_cells": 38}, "max_heldout_cells must be an integer >= 39"),
    ],
)
def test_comparison_settings_are_refused_before_fitting(adata, tmp_path, setting, match):
    with pytest.raises(InvalidArgumentError, match=match):
        diagnostics.compare_models(adata, {"n_latent": [2]}, seeds=range(2), out_dir=tmp_path / "c", **setting)
    assert not (tmp_path / "c").exists()


def test_unknown_key_names_the_valid_arguments(adata):
    with pytest.raises(InvalidArgumentError, match="Valid: n_latent, likelihood, decoder"):
        diagnostics.compare_models(adata, {"width": [2]}, seeds=range(2))


def test_mixed_gene_sets_are_refused():
    class Fit:
        def __init__(self, genes):
            self.var_names = pd.Index(genes)

    with pytest.raises(InvalidDataError, match="other genes"):
        check_same_genes({"a": [Fit(["g1", "g2"])], "b": [Fit(["g1", "g3"])]})
    check_same_genes({"a": [Fit(["g1", "g2"])], "b": [Fit(["g1", "g2"])]})


def test_save_writes_three_files_and_never_overwrites(comparison, tmp_path):
    folder = comparison.save(tmp_path / "sel")
    assert sorted(p.name for p in folder.iterdir()) == ["comparison.html", "comparison.json", "comparison.md"]
    record = json.loads((folder / "comparison.json").read_text())
    assert record["rule"] == comparison.rule
    assert len(record["table"]) == 3
    with pytest.raises(OutputExistsError):
        comparison.save(tmp_path / "sel")
    comparison.save(tmp_path / "sel", overwrite=True)


def test_save_overwrite_refuses_a_folder_holding_other_files(comparison, tmp_path):
    """save(dir, overwrite=True) replaced the folder whole: a data file in it was deleted."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.h5ad").write_bytes(b"the analyst's data")
    with pytest.raises(OutputExistsError, match=r"holds data\.h5ad, which a model-comparison folder does not hold"):
        comparison.save(project, overwrite=True)
    assert [p.name for p in project.iterdir()] == ["data.h5ad"]


def test_frontier_plot_returns_axes(comparison):
    frontier = comparison.frontier
    assert list(frontier["candidate"]) == list(comparison.table["candidate"])
    assert {"fit", "fit_low", "fit_high", "stability", "stability_low", "stability_high"} <= set(frontier)
    assert isinstance(comparison.plot_frontier(), Axes)


def test_stability_sees_rotations_as_agreement_of_invariants_not_coordinates():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(150, 3))
    w = rng.normal(size=(3, 20))
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    rotated = z @ q.T
    same = mc.stability([z, rotated], [z @ w, rotated @ (q @ w)])
    assert same["decoded_means"] == pytest.approx(1.0) and same["distances"] == pytest.approx(1.0)
    assert same["knn"] == pytest.approx(1.0) and same["stable"]
    assert same[mc.COORDINATES] < 0.99
    for score in mc.STABILITY_THRESHOLDS:
        assert same[f"{score}_low"] <= same[score] <= same[f"{score}_high"]
    permuted = mc.stability([z, -z[:, [2, 0, 1]]], [z @ w, z @ w])
    assert permuted[mc.COORDINATES] == pytest.approx(1.0)
    noise = rng.normal(size=(150, 3))
    unrelated = mc.stability([z, noise], [z @ w, noise @ w])
    assert not unrelated["stable"] and unrelated["knn"] < 0.5
    assert unrelated["knn_high"] < mc.KNN_THRESHOLD and unrelated["distances_high"] < mc.AGREEMENT_THRESHOLD


def test_gains_are_paired_differences_with_intervals():
    rng = np.random.default_rng(2)
    base = rng.normal(-50, 3, size=300)
    gains = mc.gains_over({"small": base, "large": base + 0.5 + 0.1 * rng.normal(size=300)}, "small")
    row = gains.set_index("candidate").loc["large"]
    assert row["gain_low"] < 0.5 < row["gain_high"] and row["gain"] == pytest.approx(0.5, abs=0.03)
    assert gains.set_index("candidate").loc["small", "gain"] == 0.0


def test_margin_share_and_repeated_candidates_are_checked(adata):
    with pytest.raises(InvalidArgumentError, match="equivalence_margin"):
        diagnostics.compare_models(adata, {"n_latent": [2]}, seeds=range(2), equivalence_margin=0.0)
    # alpha 0.9 inverted every interval, 1.5 failed in numpy after every estimate: both refused before any work
    for alpha in (0.9, 1.5, 0.0):
        with pytest.raises(InvalidArgumentError, match=r"alpha must be a number in \(0, 0\.5\)"):
            diagnostics.compare_models(adata, {"n_latent": [2]}, seeds=range(2), alpha=alpha)
        with pytest.raises(InvalidArgumentError, match=r"alpha must be a number in \(0, 0\.5\)"):
            diagnostics.compare_fits({"a": _stand_in()}, {"a": {}}, alpha=alpha)
    with pytest.raises(InvalidArgumentError, match="repeat"):
        diagnostics.compare_models(adata, [{"n_latent": 2}, {"n_latent": 2}], seeds=range(2))
    # one model written two ways (a default spelled out, keys in another order) would be fitted twice
    same = {
        "n_latent=2' and 'n_latent=2, decoder=mlp": [{"n_latent": 2}, {"n_latent": 2, "decoder": "mlp"}],
        "'n_latent=2, decoder=linear' and 'decoder=linear, n_latent=2": [
            {"n_latent": 2, "decoder": "linear"},
            {"decoder": "linear", "n_latent": 2},
        ],
    }
    for names, candidates in same.items():
        with pytest.raises(InvalidArgumentError, match=f"{names}' are the same model"):
            diagnostics.compare_models(adata, candidates, seeds=range(2))


class _StandInFit:
    """What compare_fits asks of a fit before any stability work: its seed, genes and held-out log p(x)."""

    def __init__(self, seed, quantity=GIVEN_OBSERVED_LIBRARY, genes=("g1", "g2")):
        self.seed, self.quantity, self.var_names = seed, quantity, pd.Index(genes)
        self.n_latent = 10  # what settings without n_latent say (CountVAE's default)

    def log_predictive_density(self, adata, n_samples, seed):
        return with_quantity(pd.DataFrame({"lpd": np.zeros(adata.n_obs)}), self.quantity)


def _stand_in(seeds=(0, 1), cells=("c1", "c2", "c3"), **kwargs):
    import anndata as ad

    held = ad.AnnData(np.ones((len(cells), 2), dtype=np.float32))
    held.obs_names = list(cells)
    return SeedFits(fits=[_StandInFit(s, **kwargs) for s in seeds], adata_fit=held, adata_heldout=held)


@pytest.mark.parametrize(
    ("fits", "settings", "match"),
    [
        ({}, {}, "No fitted candidates"),
        ({"a": _stand_in()}, {}, "No settings for candidates"),
        ({"a": _stand_in(seeds=(0,))}, {"a": {}}, "at least two seeds"),
        ({"a": _stand_in(), "b": _stand_in(seeds=(0, 2))}, {"a": {}, "b": {}}, "same seeds"),
        ({"a": _stand_in(), "b": _stand_in(cells=("c1", "c2", "c4"))}, {"a": {}, "b": {}}, "other cells"),
        (
            {"a": _stand_in(), "b": _stand_in(quantity=LIBRARY_INTEGRATED)},
            {"a": {}, "b": {}},
            "different quantities",
        ),
    ],
)
def test_compare_fits_refuses_fits_that_cannot_be_compared(fits, settings, match):
    with pytest.raises(InvalidArgumentError, match=match):
        diagnostics.compare_fits(fits, settings)


def test_compare_fits_refuses_settings_that_are_not_the_fits(adata, fits_dir):
    # Swapped or misspelled settings were taken on trust: they order candidates by size and label the table.
    with pytest.raises(InvalidArgumentError, match="say n_latent=3, but its fits have 10 latent dimensions"):
        diagnostics.compare_fits({"a": _stand_in()}, {"a": {"n_latent": 3}})
    fits = diagnostics.fit_seeds(
        adata, seeds=range(2), model_kwargs={"n_latent": 2, "decoder": "linear"}, train_kwargs={"max_epochs": 2}
    )
    with pytest.raises(InvalidArgumentError, match="say decoder='mlp', but its fits were made with decoder='linear'"):
        diagnostics.compare_fits({"a": fits}, {"a": {"n_latent": 2, "decoder": "mlp"}})
    with pytest.raises(InvalidArgumentError, match="'n_latnt'. Did you mean 'n_latent'"):
        diagnostics.compare_fits({"a": fits}, {"a": {"n_latent": 2, "decoder": "linear", "n_latnt": 2}})


def test_compare_fits_refuses_mixed_gene_sets():
    fits = {"a": _stand_in(), "b": _stand_in(genes=("g1", "g3"))}
    with pytest.raises(InvalidDataError, match="other genes"):
        diagnostics.compare_fits(fits, {"a": {}, "b": {}})


def test_linear_sources_move_the_library_share_that_one_more_dimension_carries():
    """Exact quadrature with the simulator's own parameters: under the observed library size the 2-source truth
    needs a third (library) dimension of the log-linear decoder, and with it comes within a few nats/cell of the
    density given the true size factors."""
    import torch

    from countvae.invariance.quadrature import log_marginal_linear

    data = cv.data.simulate(n_cells=200, n_genes=60, n_latent=2, decoder="linear", seed=0)
    sim = data.uns["simulation"]
    x = torch.tensor(data.X.toarray(), dtype=torch.float64)
    W, b, theta = (torch.tensor(sim[k]) for k in ("W", "b", "theta"))
    observed = torch.log(x.sum(1, keepdim=True)) + b
    true_library = torch.log(torch.tensor(data.obs["size_factor"].to_numpy()))[:, None] + b
    with_library = torch.cat([W, torch.full((60, 1), 0.5, dtype=torch.float64)], 1)
    two = log_marginal_linear(x, observed, W, theta, n_nodes=12).mean().item()
    three = log_marginal_linear(x, observed, with_library, theta, n_nodes=12).mean().item()
    given_size_factor = log_marginal_linear(x, true_library, W, theta, n_nodes=12).mean().item()
    assert three - two > 20.0
    assert abs(three - given_size_factor) < 5.0


def test_candidates_train_for_the_diagnose_budget_without_early_stopping(adata, monkeypatch):
    from countvae.diagnostics.fitting.default_training import DIAGNOSE_STOPPING, default_epochs
    from countvae.diagnostics.reporting import compare_models

    seen = []

    def record(data, runs, fingerprint=None):
        seen.append(runs[0].train_kwargs)
        raise StopIteration

    monkeypatch.setattr(compare_models, "fit_models", record)
    for given in (None, {"max_epochs": 7, "early_stopping": True}):
        with pytest.raises(StopIteration):
            diagnostics.compare_models(adata, {"n_latent": [2]}, seeds=range(2), train_kwargs=given)
    assert seen[0] == {"max_epochs": default_epochs(540), "early_stopping": False, "progress_bar": False}
    assert default_epochs(540) == 400  # 600 cells, 10% held out: the cap of 400 applies
    assert seen[1] == {"max_epochs": 7, **DIAGNOSE_STOPPING, "early_stopping": True, "progress_bar": False}


def test_early_stopping_on_a_few_hundred_cells_without_the_rate_cut_stops_within_a_few_dozen_steps(adata):
    """Why compare_models left early stopping off: the rule's patience is in epochs (4 minibatches here).

    Without the learning-rate cut the fit stops in the first quarter of its schedule (epoch 4 of 200 on one
    machine); with the shared rule's cut the same fit goes on past it (epoch 154 on one machine).
    """
    model = cv.CountVAE(adata, n_latent=3, decoder="linear")
    model.train(**TRAIN, early_stopping=True, early_stopping_lr_reductions=0, seed=0, progress_bar=False)
    summary = model.training_summary
    assert summary["stopped_early"]
    assert summary["kept_epoch"] <= TRAIN["max_epochs"] // 4
    with_cut = cv.CountVAE(adata, n_latent=3, decoder="linear")
    with_cut.train(**TRAIN, early_stopping=True, seed=0, progress_bar=False)
    assert with_cut.training_summary["kept_epoch"] > TRAIN["max_epochs"] // 4


def test_ray_backend_gives_the_comparison_of_local_workers(private_ray_temp):
    import ray  # the [ray] extra is part of [dev]

    data = cv.data.simulate(n_cells=160, n_genes=20, n_latent=2, decoder="linear", seed=4)
    cv.CountVAE.setup_anndata(data)
    args = {"seeds": range(2), "train_kwargs": {"max_epochs": 5}, "n_lpd_samples": 10, "n_jobs": 2}
    local = diagnostics.compare_models(data, {"n_latent": [1, 2], "decoder": ["linear"]}, **args)
    remote = diagnostics.compare_models(data, {"n_latent": [1, 2], "decoder": ["linear"]}, backend="ray", **args)
    assert not ray.is_initialized()
    columns = ["candidate", "lpd_per_cell", "diff_vs_best", "decoded_means", "seed_groups", "verdict"]
    pd.testing.assert_frame_equal(remote.table[columns], local.table[columns])
    assert remote.recommended == local.recommended


def test_within_seed_baseline_is_one_for_a_point_mass_and_low_for_independent_draws(comparison):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(120, 3))
    w = rng.normal(size=(3, 25))
    same = mc.within_seed_baseline([(z, z, z @ w, z @ w)] * 2)
    assert all(v == pytest.approx(1.0) for v in same.values())
    assert set(same) == {f"{s}_within_seed" for s in (*mc.STABILITY_THRESHOLDS, mc.COORDINATES)}
    z2 = rng.normal(size=(120, 3))
    independent = mc.within_seed_baseline([(z, z2, z @ w, z2 @ w)])
    assert independent["knn_within_seed"] < 0.3  # 15 of 119 neighbours drawn twice at random share about 7%
    assert abs(independent["decoded_means_within_seed"]) < 0.3 and abs(independent["distances_within_seed"]) < 0.3
    z3 = z + 0.05 * rng.normal(size=z.shape)
    slightly = mc.within_seed_baseline([(z, z3, z @ w, z3 @ w)])
    assert all(independent[k] < slightly[k] < 1.0 for k in slightly)
    table = comparison.table
    for score in (*mc.STABILITY_THRESHOLDS, mc.COORDINATES):
        assert table[f"{score}_within_seed"].between(-1.0, 1.0).all()
    # seeds of the stable size agree with each other about as well as one fit's own posterior draws do
    row = table.set_index("n_latent").loc[3]
    assert row["decoded_means"] > row["decoded_means_within_seed"] - 0.1


def test_gene_space_subspace_agreement_ignores_rotations_and_sees_other_directions(comparison):
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(40, 3))
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    assert mc.subspace_agreement([basis, basis @ q, 2.0 * basis]) == pytest.approx(1.0)
    other = np.linalg.qr(np.hstack([basis, rng.normal(size=(40, 3))]))[0][:, 3:]  # orthogonal to the basis
    assert mc.subspace_agreement([basis, other]) == pytest.approx(0.0, abs=1e-12)
    table = comparison.table.set_index("n_latent")
    assert table["subspace"].between(0.0, 1.0).all()
    assert table.loc[3, "subspace"] > 0.9  # the stable, recommended size: both seeds' loadings span one subspace


# ----- the selection rule's arithmetic against hand computations ------------------------------------------------
def test_critical_t_is_the_bonferroni_student_quantile_of_tables():
    """Known answers from Student-t tables: t_3(0.975) = 3.182446, t_10(0.95) = 1.812461, t_10(0.975) = 2.228139."""
    assert mc.critical_t(4, 2, 0.05) == pytest.approx(3.182446, abs=1e-6)  # 2 comparisons: 1 - 0.05 / 2
    assert mc.critical_t(11, 1, 0.05) == pytest.approx(1.812461, abs=1e-6)
    assert mc.critical_t(11, 2, 0.05) == pytest.approx(2.228139, abs=1e-6)


def test_paired_difference_is_the_mean_and_a_t_interval_with_the_sample_sd():
    """d = [1, 2, 3, 4]: mean 2.5, sd (ddof 1) sqrt(5/3), se sqrt(5/3) / 2; with t = 2: 2.5 +- 1.290994."""
    mean, low, high = mc.paired_difference(np.array([2.0, 4.0, 6.0, 8.0]), np.array([1.0, 2.0, 3.0, 4.0]), 2.0)
    half = 2.0 * np.sqrt(5.0 / 3.0) / 2.0
    assert (mean, low, high) == pytest.approx((2.5, 2.5 - half, 2.5 + half))


def _hand_lpds():
    """Three candidates on 4 cells: 'b' the best, 'a' = b + [-1, -2, -3, -4] (mean -2.5, se sqrt(5/3) / 2)."""
    b = np.array([-10.0, -11.0, -12.0, -13.0])
    return {"a": b + np.array([-1.0, -2.0, -3.0, -4.0]), "b": b, "c": b - 20.0}


@pytest.mark.parametrize(
    ("margin", "verdict"),
    [(5.0, mc.EQUIVALENT), (1.0, mc.UNDETERMINED), (0.4, mc.WORSE)],
)
def test_fit_table_by_hand(margin, verdict):
    """Best: the highest mean; 'a' against it: -2.5 +- t_3(1 - 0.05 / 2) se = (-4.554, -0.446), Bonferroni over the
    2 comparisons with the best. Margin 5: inside (-5, 5), equivalent; margin 1: straddles -1, undetermined; margin
    0.4: entirely below -0.4, worse."""
    table, best = mc.fit_table(_hand_lpds(), {"a": True, "b": True, "c": True}, margin=margin)
    assert best == "b"
    row = table.set_index("candidate").loc["a"]
    half = 3.182446 * np.sqrt(5.0 / 3.0) / 2.0
    assert row["diff_vs_best"] == pytest.approx(-2.5)
    assert (row["diff_low"], row["diff_high"]) == pytest.approx((-2.5 - half, -2.5 + half), abs=1e-5)
    assert row["fit_verdict"] == verdict
    assert table.set_index("candidate").loc["b", "fit_verdict"] == mc.BEST
    assert table.set_index("candidate").loc["c", "fit_verdict"] == (mc.WORSE if margin < 20 else mc.EQUIVALENT)


def test_fit_table_best_is_the_highest_mean_even_where_the_median_disagrees():
    """'skewed' is 0.2 nats worse than 'plain' on 9 of 10 cells and 5 nats better on one: a higher mean (-104.18
    against -104.5) but a lower median (-104.7 against -104.5). The documented ``lpd_per_cell`` is the mean, so
    'skewed' is the best.

    'plain' against it, by hand: d = [-5, 0.2 x 9], mean -0.32, sd (ddof 1) sqrt(2.704), se sqrt(2.704 / 10),
    interval -0.32 +- t_9(0.95) se with t_9(0.95) = 1.833113 (one comparison); inside (-2, 2): equivalent. Catches:
    the best chosen by any other location (median, trimmed mean), which would name 'plain'. Cannot catch: the
    reliability rule (both candidates are reliable here).
    """
    plain = -100.0 - np.arange(10.0)
    skewed = plain + np.array([5.0] + [-0.2] * 9)
    table, best = mc.fit_table({"plain": plain, "skewed": skewed}, {"plain": True, "skewed": True}, margin=2.0)
    assert best == "skewed"
    rows = table.set_index("candidate")
    assert rows["lpd_per_cell"].to_dict() == pytest.approx({"plain": -104.5, "skewed": -104.18})
    half = 1.833113 * np.sqrt(2.704 / 10)
    assert rows.loc["plain", ["diff_vs_best", "diff_low", "diff_high"]].tolist() == pytest.approx(
        [-0.32, -0.32 - half, -0.32 + half], abs=1e-6
    )
    assert rows["fit_verdict"].to_dict() == {"plain": mc.EQUIVALENT, "skewed": mc.BEST}


def test_gains_over_use_the_bonferroni_t_over_the_other_candidates():
    """Gain of 'b' over 'a' = +2.5 +- t_3(1 - 0.05 / 2) sqrt(5/3) / 2 (two other candidates compared with 'a')."""
    gains = mc.gains_over(_hand_lpds(), "a").set_index("candidate")
    half = 3.182446 * np.sqrt(5.0 / 3.0) / 2.0
    assert gains.loc["b", ["gain", "gain_low", "gain_high"]].tolist() == pytest.approx(
        [2.5, 2.5 - half, 2.5 + half], abs=1e-5
    )


def test_size_order_counts_layers_after_hidden_units_and_only_for_mlp_decoders():
    settings = [
        {"n_latent": 2, "decoder": "mlp", "n_hidden": 64, "n_layers": 1},
        {"n_latent": 2, "decoder": "mlp", "n_hidden": 16, "n_layers": 2},
        {"n_latent": 2, "decoder": "mlp", "n_hidden": 16, "n_layers": 1},
        {"n_latent": 2, "decoder": "linear", "n_hidden": 16, "n_layers": 3},
    ]
    assert sorted(settings, key=mc.size_key) == [settings[3], settings[2], settings[1], settings[0]]
    assert mc.size_key(settings[3]) == (2, 0, 0, 0, 1, False)  # NB, one dispersion per gene


def test_a_candidates_lpd_is_the_per_cell_mean_over_seeds_and_its_spread_the_range_of_seed_means():
    frames = [pd.DataFrame({"lpd": [1.0, 2.0]}), pd.DataFrame({"lpd": [3.0, 4.0]}), pd.DataFrame({"lpd": [2.0, 6.0]})]
    np.testing.assert_allclose(mc.candidate_lpd(frames), [2.0, 4.0])
    assert mc.seed_spread(frames) == pytest.approx(4.0 - 1.5)  # seed means 1.5, 3.5, 4.0


def test_stability_is_judged_on_the_worst_pair_of_three_seeds():
    """Seeds 0 and 1 are one solution up to a signed permutation, seed 2 is unrelated: the worst pair is the
    unrelated one (k-NN overlap near 15/149 at random), and the coordinates' range runs up to 1 (seeds 0, 1)."""
    rng = np.random.default_rng(4)
    z, noise = rng.normal(size=(150, 3)), rng.normal(size=(150, 3))
    w = rng.normal(size=(3, 20))
    copy = -z[:, [2, 0, 1]]
    out = mc.stability([z, copy, noise], [z @ w, z @ w, noise @ w])
    assert out["knn"] < 0.3 and out["knn_high"] < mc.KNN_THRESHOLD and not out["stable"]
    assert out["distances"] < 0.3
    assert out[f"{mc.COORDINATES}_high"] == pytest.approx(1.0)
    assert out[mc.COORDINATES] == out[f"{mc.COORDINATES}_low"] < 0.5


def test_knn_overlap_is_not_judged_where_unrelated_graphs_would_pass_by_chance():
    # On 16 or fewer held-out cells every neighbourhood is every other cell: three unrelated "seeds" scored 1.0
    # with a zero-width interval, and passed the 0.5 threshold on up to about 23 cells.
    from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets

    rng = np.random.default_rng(0)
    for n in (24, 30, 60):  # the closed form against unrelated graphs (ratio of means, within sampling)
        measured = np.mean(
            [
                knn_jaccard_per_cell(
                    knn_sets(rng.normal(size=(n, 5)), 15), knn_sets(rng.normal(size=(n, 5)), 15)
                ).mean()
                for _ in range(30)
            ]
        )
        assert measured == pytest.approx(mc.knn_chance_overlap(n), abs=0.03)
    assert mc.knn_chance_overlap(16) == 1.0 and mc.KNN_MIN_CELLS == 39
    for n in (8, 16, 23, 38):
        latents = [rng.normal(size=(n, 5)) for _ in range(3)]
        out = mc.stability(latents, [rng.normal(size=(n, 50)) for _ in range(3)], seed=0)
        assert np.isnan(out["knn"]) and np.isnan(out["knn_low"]) and not out["stable"]
    same = rng.normal(size=(39, 5))
    out = mc.stability([same, same.copy()], [same @ np.ones((5, 8))] * 2, seed=0)
    assert out["knn"] == 1.0 and out["stable"]

    from types import SimpleNamespace

    from countvae.diagnostics.reporting.compare_models import _verdict

    row = SimpleNamespace(candidate="x", fit_verdict=mc.EQUIVALENT, stable=False, reliable=True, knn=np.nan)
    assert _verdict(row, "r") == "stability undetermined: too few held-out cells for the k-NN overlap"


def test_too_few_held_out_cells_are_refused_before_fitting(tmp_path):
    # select on 30 cells held out 3 and compared the candidates on them (a raw numpy warning was the only sign).
    adata = cv.data.simulate(n_cells=30, n_genes=20, n_latent=2, seed=3)
    cv.data.setup_anndata(adata)
    with pytest.raises(InvalidArgumentError, match=r"keeps 3 of 30 cells; comparing candidates needs at least 8"):
        diagnostics.compare_models(adata, {"n_latent": [1, 2]}, seeds=[0, 1], out_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_subspace_agreement_is_the_worst_pair():
    rng = np.random.default_rng(5)
    basis = rng.normal(size=(40, 3))
    other = np.linalg.qr(np.hstack([basis, rng.normal(size=(40, 3))]))[0][:, 3:]
    assert mc.subspace_agreement([basis, 3.0 * basis, other]) == pytest.approx(0.0, abs=1e-12)


def test_a_candidate_is_reliable_only_when_every_seed_is():
    """Known answer of the package's k-hat rule: a seed whose every cell has k-hat 1.0 (above 0.7) is unreliable."""
    good = pd.DataFrame({"lpd": np.zeros(50), "mc_se": np.full(50, 0.01), "khat": np.full(50, 0.1)})
    bad = good.assign(khat=1.0)
    out = mc.reliability({"ok": [good, good], "one bad seed": [good, bad]}, margin=1.0)
    assert out.to_dict() == {"ok": True, "one bad seed": False}


def test_size_settings_fill_countvaes_defaults_without_overriding_the_candidates():
    """A candidate that leaves the decoder unset is CountVAE's default, an MLP, in the size order (from its fits'
    settings; for an scvi-tools fit, from the defaults the size order assumes, which are CountVAE's)."""
    from dataclasses import fields
    from types import SimpleNamespace

    from countvae.diagnostics.reporting.compare_models import _DEFAULTS, _size_settings
    from countvae.model.settings import ModelSettings

    def fit(given):
        return SimpleNamespace(model=SimpleNamespace(settings=ModelSettings(**given)), n_latent=given["n_latent"])

    defaults = {f.name: f.default for f in fields(ModelSettings)}
    assert {k: defaults[k] for k in ("decoder", "n_hidden", "n_layers")} == _DEFAULTS
    linear, default = {"n_latent": 3, "decoder": "linear"}, {"n_latent": 3}
    assert _size_settings(linear, fit(linear))["n_latent"] == 3
    assert _size_settings(default, fit(default))["decoder"] == "mlp"
    assert _size_settings(default, SimpleNamespace(n_latent=3))["decoder"] == "mlp"
    sizes = {"c0": _size_settings(default, fit(default)), "c1": _size_settings(linear, fit(linear))}
    assert mc.recommend(_table([mc.EQUIVALENT, mc.BEST], [True, True], [True, True]), sizes) == "c1"


def test_seed_groups_column_tells_undetermined_separations_from_different_solutions():
    # Seeds the evidence could not place together or apart read "2 | 1 | 0" like three solutions; the pairs
    # left undetermined are now named after the groups.
    from countvae.diagnostics.reporting.compare_models import _seed_groups

    rng = np.random.default_rng(1)
    n = 30
    a = rng.normal(size=(n, 40))
    # concordance near the 0.9 threshold with noise that varies between cells: the interval over 30 cells straddles it
    near = a + np.sqrt(0.222 * rng.exponential(size=(n, 1)) ** 2 / 2) * rng.normal(size=a.shape)
    other = rng.normal(size=(n, 40))  # a different solution: concordance about 0
    base = rng.normal(-300.0, 20.0, size=n)

    def frame(values):
        return pd.DataFrame({"lpd": values, "mc_se": np.full(n, 0.01)}, index=[f"c{i}" for i in range(n)])

    lpd = [frame(base), frame(base + 0.01 * rng.normal(size=n))]
    assert _seed_groups({"0": a, "1": near}, lpd, margin=2.0, alpha=0.05, seed=0) == "0 | 1 (undetermined: 0-1)"
    assert _seed_groups({"0": a, "1": other}, lpd, margin=2.0, alpha=0.05, seed=0) == "0 | 1"
    assert _seed_groups({"0": a, "1": a + 0.01 * rng.normal(size=a.shape)}, lpd, 2.0, 0.05, 0) == "0, 1"


def test_each_candidates_verdict_names_the_first_condition_it_fails():
    from types import SimpleNamespace

    from countvae.diagnostics.reporting.compare_models import _verdict

    def row(fit_verdict, stable, reliable=True, candidate="x"):
        return SimpleNamespace(candidate=candidate, fit_verdict=fit_verdict, stable=stable, reliable=reliable, knn=0.9)

    assert _verdict(row(mc.EQUIVALENT, True, candidate="r"), "r") == "recommended"
    assert _verdict(row(mc.UNRELIABLE, True, reliable=False), "r") == "unreliable: not ranked"
    assert _verdict(row(mc.WORSE, True), "r") == "fits worse than the margin"
    assert _verdict(row(mc.WORSE, False), "r") == "fits worse than the margin"
    assert _verdict(row(mc.UNDETERMINED, True), "r") == "fit undetermined"
    assert _verdict(row(mc.EQUIVALENT, False), "r") == "unstable across seeds"
    assert _verdict(row(mc.EQUIVALENT, True), "r") == "qualifies, not the smallest"


def test_lpd_frames_of_one_quantity_are_compared_and_unnamed_frames_are_taken_on_trust():
    from countvae.diagnostics.analyses.lpd_comparability import require_same_quantity

    frame = pd.DataFrame({"lpd": [0.0]})
    named = with_quantity(frame.copy(), GIVEN_OBSERVED_LIBRARY)
    assert require_same_quantity({"a": named, "b": with_quantity(frame.copy(), GIVEN_OBSERVED_LIBRARY)}) == (
        GIVEN_OBSERVED_LIBRARY
    )
    assert require_same_quantity({"a": named, "b": frame}) == GIVEN_OBSERVED_LIBRARY
    assert require_same_quantity({"a": frame, "b": frame}) is None


def test_every_candidate_is_fitted_on_the_genes_chosen_once_before_fitting(adata, monkeypatch):
    """``n_top_genes`` as diagnose takes it: the genes are chosen on the raw counts before any fit, the same for every
    candidate, and ``before_fitting`` sees them and every candidate's fit settings before the first fit. As in
    diagnose, the fits' memory warning then does not advise a backed file (gene selection needs the counts in
    memory)."""
    from countvae.data import choose_genes
    from countvae.diagnostics.fitting import parallelism
    from countvae.diagnostics.reporting import compare_models as module

    calls, advises_backed = [], []

    class Stop(Exception):
        pass

    def record(data, runs, fingerprint=None):
        calls.append(("fit", list(data.var_names), [r.model_kwargs["n_latent"] for r in runs]))
        advises_backed.append(parallelism._BACKED_REMEDY.get())
        raise Stop

    monkeypatch.setattr(module, "fit_models", record)
    with pytest.raises(Stop):
        diagnostics.compare_models(
            adata,
            {"n_latent": [1, 2]},
            seeds=range(2),
            n_top_genes=20,
            before_fitting=lambda genes, runs: calls.append(("before", list(genes.adata.var_names), len(runs))),
        )
    chosen = list(choose_genes(adata, 20, None, 2).adata.var_names)
    assert calls == [("before", chosen, 2), ("fit", chosen, [1, 2])]
    with pytest.raises(Stop):
        diagnostics.compare_models(adata, {"n_latent": [1, 2]}, seeds=range(2), n_top_genes="all")
    assert calls[-1] == ("fit", list(adata.var_names), [1, 2]) and advises_backed == [False, True]
    calls = calls[:2]
    with pytest.raises(InvalidArgumentError, match="n_top_genes=1 is fewer than 2 .the latent dimensions."):
        diagnostics.compare_models(adata, {"n_latent": [1, 2]}, seeds=range(2), n_top_genes=1)
    assert len(calls) == 2  # refused before fitting


def test_frontier_and_noise_floor_by_hand():
    """The frontier's stability is the lower of the two concordances, and so are its interval's ends (each taken
    apart); the noise floor is the median of the candidates' seed spreads (0.5 here: the mean is 1.2, the largest 3)."""
    table = pd.DataFrame(
        {
            "candidate": ["a", "b", "c"],
            "diff_vs_best": [-2.0, 0.0, -0.1],
            "diff_low": [-2.5, 0.0, -0.3],
            "diff_high": [-1.5, 0.0, 0.1],
            "decoded_means": [0.95, 0.80, 0.99],
            "decoded_means_low": [0.93, 0.70, 0.98],
            "decoded_means_high": [0.97, 0.85, 0.995],
            "distances": [0.90, 0.85, 0.97],
            "distances_low": [0.88, 0.80, 0.96],
            "distances_high": [0.99, 0.90, 0.98],
            "knn": [0.7, 0.6, 0.8],
            "stable": [True, False, True],
            "reliable": [True, True, True],
            "margin": 0.5,
            "fit_seconds": [1.0, 2.0, 3.0],
            "seed_spread": [0.1, 0.5, 3.0],
        }
    )
    comparison = ModelComparison(table, {"n_latent": 3}, "c", "b", 0.5, 25.0, 0.02, 0.05, 100, seeds=[0, 1])
    frontier = comparison.frontier.set_index("candidate")
    assert frontier["stability"].tolist() == [0.90, 0.80, 0.97]
    assert frontier["stability_low"].tolist() == [0.88, 0.70, 0.96]
    assert frontier["stability_high"].tolist() == [0.97, 0.85, 0.98]
    assert frontier["fit"].tolist() == [-2.0, 0.0, -0.1] and frontier["recommended"].tolist() == [False, False, True]
    assert comparison.noise_floor == 0.5


def test_gains_are_measured_over_the_recommendation_not_the_best(comparison):
    """Each candidate's gain is its paired mean difference from the recommended candidate: the difference of the
    two mean per-cell log p(x) (0 for the recommendation itself), whichever candidate fits best."""
    table = comparison.table.set_index("candidate")
    recommended = comparison.recommended_name
    assert recommended is not None
    expected = table["lpd_per_cell"] - table.loc[recommended, "lpd_per_cell"]
    np.testing.assert_allclose(table["gain"], expected, rtol=0, atol=1e-9)
    assert table.loc[recommended, ["gain", "gain_low", "gain_high"]].tolist() == [0.0, 0.0, 0.0]


def test_summary_names_the_unreliable_candidates():
    """Two of three candidates with unreliable log p(x) estimates: the summary names them (labels hold commas, so
    they are joined with semicolons), and says that no candidate is recommended."""
    table = _table([mc.UNRELIABLE, mc.BEST, mc.UNRELIABLE], [True] * 3, [False, True, False])
    table["candidate"] = ["n_latent=2, decoder=mlp", "n_latent=3", "n_latent=4"]
    comparison = ModelComparison(table, None, None, "n_latent=3", 0.5, 25.0, 0.02, 0.05, 100, seeds=[0, 1])
    lines = comparison.summary().splitlines()
    assert lines[2] == "Unreliable estimates (not ranked): n_latent=2, decoder=mlp; n_latent=4."
    assert lines[3].startswith("Recommendation: undetermined")


def test_a_damaged_stored_seed_is_named_with_a_remedy_compare_models_can_follow(tmp_path):
    data = cv.data.simulate(n_cells=200, n_genes=30, n_latent=2, decoder="linear", seed=1)
    cv.CountVAE.setup_anndata(data)

    def compare():
        return diagnostics.compare_models(
            data, {"n_latent": [2], "decoder": ["linear"]}, seeds=range(2), train_kwargs={"max_epochs": 2},
            out_dir=tmp_path / "sel", n_lpd_samples=2,
        )  # fmt: skip

    compare()
    seeds = next((tmp_path / "sel").iterdir()) / "fits"
    (seeds / "seed_1" / "model" / "params.pt").write_bytes(b"junk")
    kept = (seeds / "seed_0" / "fit.json").read_bytes()
    with pytest.raises(BrokenFitError) as info:
        compare()
    message = str(info.value)
    assert "refit_broken" not in message and "--refit-broken" not in message, message
    assert f"Move {seeds / 'seed_1'} out of the run's folder" in message
    (seeds / "seed_1").rename(tmp_path / "seed_1")
    compare()
    assert (seeds / "seed_0" / "fit.json").read_bytes() == kept and (seeds / "seed_1" / "fit.json").is_file()
