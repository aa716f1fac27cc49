"""Per-component ICA stability across seeds against known sources, and its verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import random_rotation

from countvae import plotting
from countvae.diagnostics.analyses.components import (
    COMPONENT_COLUMNS,
    FIT_CELLS,
    HELDOUT_CELLS,
    MATCH_COLUMNS,
    ica_component_stability,
)
from countvae.diagnostics.analyses.resampling import cell_bootstrap
from countvae.diagnostics.reporting.headline import ica_sentence
from countvae.diagnostics.reporting.verdicts import AGREE, DIFFER, UNDETERMINED, judge_components
from countvae.errors import InvalidArgumentError
from countvae.ica import ica_stability

N_CELLS, DIM = 2000, 4


def rotated_sources(kind: str, seed: int = 0, n: int = N_CELLS) -> np.ndarray:
    """Sources of one kind, unit variance, (cells, DIM)."""
    rng = np.random.default_rng(seed)
    s = rng.laplace(size=(n, DIM)) if kind == "laplace" else rng.standard_normal((n, DIM))
    return (s - s.mean(0)) / s.std(0)


def seed_latents(sources: np.ndarray, n_fits: int = 3, noise: float = 0.05, seed: int = 100) -> dict[str, np.ndarray]:
    """Each 'seed' sees the same sources in its own rotated coordinates, plus a little independent noise."""
    rng = np.random.default_rng(seed)
    return {
        f"seed {k}": sources @ random_rotation(DIM, 10 + k).T + noise * rng.standard_normal(sources.shape)
        for k in range(n_fits)
    }


def stability(kind: str, n_heldout: int = 300, fit_cells: bool = True, unrelated: bool = False):
    """Seeds' latents on held-out cells and (optionally) on fit cells of the same sources; judged at 0.95."""
    held_sources = rotated_sources(kind, seed=1, n=n_heldout)
    fit_sources = rotated_sources(kind, seed=2)
    if unrelated:  # each seed found other sources: no shared axes
        held = {f"seed {k}": rotated_sources(kind, seed=10 + k, n=n_heldout) for k in range(3)}
        fit = {f"seed {k}": rotated_sources(kind, seed=20 + k) for k in range(3)}
    else:
        held, fit = seed_latents(held_sources), seed_latents(fit_sources, seed=101)
    result = ica_component_stability(held, cell_bootstrap(n_heldout, 200, seed=3), fit if fit_cells else None)
    return result, judge_components(result.table, 0.95)


def test_rotated_laplace_sources_agree_on_every_component():
    result, judged = stability("laplace")
    table, matches = result.table, result.matches
    assert list(table.columns) == list(COMPONENT_COLUMNS) and list(matches.columns) == list(MATCH_COLUMNS)
    assert table["component"].tolist() == [f"IC_{i}" for i in range(DIM)]
    assert (table["reference_fit"] == "seed 0").all() and (table["estimated_on"] == FIT_CELLS).all()
    assert (judged["verdict"] == AGREE).all() and not table["gaussian"].any()
    assert table["worst_match"].min() > 0.97 and table["same_fit_match"].min() > 0.97
    assert (table["low"] <= table["worst_match"]).all() and (table["worst_match"] <= table["high"]).all()
    # Laplace sources have excess kurtosis 3; the recovered components are close to it.
    assert table["excess_kurtosis"].min() > 1.5  # 1,000 cells per half: kurtosis is noisy
    # One row per (other seed, component); the table's worst is the minimum over those rows.
    assert len(matches) == 2 * DIM and set(matches["fit"]) == {"seed 1", "seed 2"}
    worst = matches.groupby("component")["best_match"].min()
    np.testing.assert_allclose(worst.loc[table["component"]].to_numpy(), table["worst_match"].to_numpy())
    assert set(result.sources) == {"seed 0", "seed 1", "seed 2"}


def test_rotated_gaussian_sources_are_never_credited():
    result, judged = stability("normal")
    # Inside a Gaussian space every rotation is equally independent: the axes are noise.
    assert result.table["gaussian"].sum() >= 3
    assert not (judged["verdict"] == AGREE).any()
    assert (judged["verdict"] == UNDETERMINED).sum() >= 3
    assert judged.loc[result.table["gaussian"], "reason"].str.contains("Gaussian").all()
    assert np.abs(result.table["excess_kurtosis"]).max() < 0.5


def test_too_few_held_out_cells_are_undetermined_not_wrong():
    """40 held-out cells and no fit cells: the ICAs come from 20 cells each; nothing can be claimed either way."""
    result, judged = stability("laplace", n_heldout=40, fit_cells=False)
    assert (result.table["estimated_on"] == HELDOUT_CELLS).all()
    assert (judged["verdict"] != DIFFER).all()
    assert (judged["verdict"] == UNDETERMINED).all()
    assert judged["reason"].str.startswith("too few cells to estimate ICA").all()


def test_seeds_with_different_solutions_differ_and_the_baseline_says_why():
    """Unrelated Laplace latents per seed: each reproduces its own axes within itself, they share none."""
    result, judged = stability("laplace", unrelated=True)
    assert result.table["same_fit_match"].min() > 0.97
    assert (judged["verdict"] == DIFFER).all() and result.table["worst_match"].max() < 0.3
    assert judged["reason"].str.contains("within one seed").all()
    sentence = ica_sentence(judged, 0.95)
    assert "IC_0, IC_1, IC_2, IC_3 differ between seeds" in sentence and "as one subspace" in sentence


def test_headline_names_the_components_by_verdict():
    table = pd.DataFrame(
        {
            "component": ["IC_0", "IC_1", "IC_2"],
            "verdict": [AGREE, UNDETERMINED, DIFFER],
            "reason": ["", "too close to Gaussian to be identified", "the seeds' solutions differ along it"],
            "remedy": ["", "a non-Gaussian restriction or more cells", ""],
            "estimated_on": FIT_CELLS,
            "n_estimation_cells": 1000,
            "n_matching_cells": 300,
        }
    )
    sentence = ica_sentence(table, 0.95)
    assert sentence.startswith("ICA components (each seed's ICA estimated on halves of the fit cells, 1,000 cells")
    assert "IC_0 agrees across seeds; IC_2 differs between seeds; IC_1 undetermined (too close to Gaussian" in sentence
    assert "to decide: a non-Gaussian restriction or more cells)" in sentence
    assert sentence.endswith("as one subspace, not as separate axes.")
    assert ica_sentence(table.iloc[:0], 0.95) is None


def test_bad_input():
    with pytest.raises(InvalidArgumentError, match="at least two fits"):
        ica_component_stability({"seed 0": np.zeros((50, 2))}, cell_bootstrap(50, 10))
    base_table = pd.DataFrame({"component": ["IC_0"], "worst_match": [0.9], "gaussian": [False]})
    with pytest.raises(InvalidArgumentError, match="verdict"):
        plotting.ica_stability(base_table)


def test_plot_bars_are_worst_matches_coloured_by_verdict():
    result, judged = stability("laplace")
    judged.loc[1, ["verdict", "gaussian"]] = [UNDETERMINED, True]
    ax = plotting.ica_stability(judged, result.matches, threshold=0.9)
    bars = ax.patches[: len(judged)]
    np.testing.assert_allclose([b.get_height() for b in bars], judged["worst_match"].to_numpy())
    assert bars[1].get_hatch() == "///" and not bars[0].get_hatch()
    assert bars[0].get_facecolor() != bars[1].get_facecolor()
    threshold_lines = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.9, 0.9]]
    assert len(threshold_lines) == 1


def _partly_shared(n: int, seed: int) -> dict[str, np.ndarray]:
    """Two seeds on the same cells: seed 1's first source is (s_0 + u) / sqrt(2), u a new Laplace source.

    Every other source is shared, so the population best match of seed 0's components with seed 1's is 1 for
    three of them and 1 / sqrt(2) = 0.707 for the first (both ICAs are exact in the limit of many cells).
    """
    rng = np.random.default_rng(seed)
    s = rng.laplace(size=(n, DIM + 1))
    s = (s - s.mean(0)) / s.std(0)
    other = s[:, :DIM].copy()
    other[:, 0] = (s[:, 0] + s[:, DIM]) / np.sqrt(2.0)
    return {"seed 0": s[:, :DIM] @ random_rotation(DIM, 10).T, "seed 1": other @ random_rotation(DIM, 11).T}


@pytest.mark.parametrize("n_per_half", [250, 400])
def test_the_corrected_match_recovers_the_population_match_that_estimation_on_few_cells_attenuates(n_per_half):
    """Known answer: population matches 0.707 and 1. With ICAs on a few hundred cells per half the raw match falls
    below them (each ICA misses its axis); divided by the same seed's split-half match it comes back to them.
    Fails if the correction is not applied (raw values), applied the wrong way, or taken from other cells."""
    n_held = 2000
    held, fit = _partly_shared(n_held, seed=5), _partly_shared(2 * n_per_half, seed=6)
    table = ica_component_stability(held, cell_bootstrap(n_held, 200, seed=3), fit).table
    mixed = table["worst_match"].idxmin()  # the component whose population match is 1/sqrt(2)
    shared = table.drop(index=mixed)
    corrected_error = np.abs(table["corrected_match"] - np.where(table.index == mixed, 1 / np.sqrt(2), 1.0))
    raw_error = np.abs(table["worst_match"] - np.where(table.index == mixed, 1 / np.sqrt(2), 1.0))
    assert corrected_error.max() < 0.03, table[["worst_match", "same_fit_match", "corrected_match"]]
    assert corrected_error.sum() < raw_error.sum()
    assert (shared["corrected_match"] >= shared["worst_match"]).all()
    assert (table["corrected_low"] <= table["corrected_match"]).all()
    assert (table["corrected_match"] <= table["corrected_high"]).all() and (table["corrected_high"] <= 1.0).all()


def test_the_report_and_ica_stability_measure_one_thing_on_the_same_cells():
    """The report's table and the public ``ica_stability`` share their estimation (``split_half_icas``): given the
    same latents to estimate and match on, their worst match, split-half baseline and corrected match are equal,
    and both call the mixed component of the partly shared seeds not reproducible. Fails if either drifts to
    another split, other ICA starts, another baseline or another correction."""
    latents = _partly_shared(1600, seed=7)
    table = ica_component_stability(latents, cell_bootstrap(1600, 50, seed=3), latents).table.set_index("component")
    public = ica_stability(list(latents.values())).table
    np.testing.assert_allclose(public["min"], table["worst_match"], atol=1e-12)
    np.testing.assert_allclose(public["same_fit"], table["same_fit_match"], atol=1e-12)
    np.testing.assert_allclose(public["corrected"], table["corrected_match"], atol=1e-12)
    judged = judge_components(table.reset_index(), 0.95).set_index("component")
    assert public["reproducible"].to_dict() == (judged["verdict"] == AGREE).to_dict()
    assert public["reproducible"].sum() == DIM - 1


def test_worst_and_mean_match_with_one_noisy_seed():
    """Seed 2 sees the sources through noise of sd 0.6: its best match is about 1 / sqrt(1 + 0.36) = 0.86.

    Seed 1 matches to about 1. The worst match and its interval come from seed 2's bootstrap replicates (not the
    best seed's); the mean match is the average of the two seeds' matches, not their minimum.
    """
    n = 600
    held_sources, fit_sources = rotated_sources("laplace", seed=1, n=n), rotated_sources("laplace", seed=2)
    held, fit = seed_latents(held_sources), seed_latents(fit_sources, seed=101)
    rng = np.random.default_rng(5)
    held["seed 2"] = held["seed 2"] + 0.6 * rng.standard_normal(held["seed 2"].shape)
    fit["seed 2"] = fit["seed 2"] + 0.6 * rng.standard_normal(fit["seed 2"].shape)
    result = ica_component_stability(held, cell_bootstrap(n, 200, seed=3), fit)
    table = result.table.set_index("component")
    by_fit = result.matches.pivot(index="component", columns="fit", values="best_match").loc[table.index]
    assert (by_fit["seed 1"] > 0.97).all()
    np.testing.assert_allclose(by_fit["seed 2"], 1 / np.sqrt(1.36), atol=0.06)
    np.testing.assert_allclose(table["worst_match"], by_fit["seed 2"])
    np.testing.assert_allclose(table["mean_match"], (by_fit["seed 1"] + by_fit["seed 2"]) / 2)
    assert (table["low"] <= table["worst_match"]).all() and (table["worst_match"] <= table["high"]).all()
    assert (table["high"] < 0.95).all()
    # The interval's width is seed 2's sampling error: a correlation r over n cells has standard error about
    # (1 - r^2) / sqrt(n) = 0.011 here (seed 1's, at r near 1, is a hundred times smaller).
    assert ((table["high"] - table["low"]) > 0.015).all()


def test_the_corrected_match_interval_is_the_ratio_of_the_same_bootstrap_replicates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two fits of 3 Laplace sources on 400 cells, the second rotated and noisy (sd 0.3): matches about 0.97.

    The cross-fit and same-fit best matches and their bootstrap replicates are recorded as the analysis computes
    them; the corrected interval must be the percentile interval of ``cross / same_fit`` with replicates
    ``cross_replicates / same_fit_replicates`` (one pair, so the worst-pair interval is the percentile interval), and
    it has a width (about 0.01 here). Catches the replicate ratio taken against the wrong replicates (e.g. the
    cross-fit's own, which collapses the interval to a point); not how the matches themselves are computed.
    """
    from scipy.stats import ortho_group

    from countvae.diagnostics.analyses import components
    from countvae.diagnostics.analyses.resampling import percentile_interval

    recorded = []
    original = components._best_matches

    def recording(*args: object) -> tuple[np.ndarray, np.ndarray]:
        recorded.append(original(*args))
        return recorded[-1]

    monkeypatch.setattr(components, "_best_matches", recording)
    rng = np.random.default_rng(0)
    s = rng.laplace(size=(400, 3))
    held = {
        "a": s @ ortho_group.rvs(3, random_state=1),
        "b": s @ ortho_group.rvs(3, random_state=2) + 0.3 * rng.normal(size=(400, 3)),
    }
    bootstrap = cell_bootstrap(400, 200, seed=0)
    table = ica_component_stability(held, bootstrap, seed=0).table
    (cross, cross_rep), (same, same_rep) = recorded  # the other fit's matches first, then the reference's own
    for c in range(3):
        expected = percentile_interval(cross[c] / same[c], cross_rep[c] / same_rep[c], bootstrap.shrink, 0.05)
        row = table.iloc[c]
        got = (row["corrected_match"], row["corrected_low"], row["corrected_high"])
        assert got == pytest.approx((expected.value, expected.low, expected.high), abs=1e-12)
        assert row["corrected_low"] < row["corrected_match"] < row["corrected_high"] < 1.0
