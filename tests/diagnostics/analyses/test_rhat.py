"""Spread of guide draws across seeds: copies identical up to a rotation have raw R-hat >> 1 and invariant R-hat ~ 1."""

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import random_rotation

from countvae.diagnostics import CountVAEFit
from countvae.diagnostics.analyses.maps import AffineMap, PairMaps
from countvae.diagnostics.analyses.rhat import add_baseline, rhat_chains, rhat_table
from countvae.diagnostics.reporting.collect import guide_draws
from countvae.errors import InvalidArgumentError
from countvae.invariance import reparameterize


def collect_draws(fits, cells, n_draws=100, gene_positions=None, maps=None, seed=0):
    """Guide draws of every fit (chain c with seed + c, as the report draws them), as R-hat chains."""
    draws = {f.name: guide_draws(f, cells, n_draws, seed + c, gene_positions) for c, f in enumerate(fits)}
    decoded = {name: d.log_rate for name, d in draws.items()}
    return rhat_chains(
        {name: d.latent for name, d in draws.items()},
        decoded=None if any(v is None for v in decoded.values()) else decoded,
        maps=maps,
    )


@pytest.fixture(scope="module")
def rotated_summary(trained_linear):
    fits = [CountVAEFit(trained_linear, 0)] + [
        CountVAEFit(reparameterize(trained_linear, random_rotation(2, k)), k) for k in (1, 2, 3)
    ]
    adata = trained_linear.adata
    latents = {f.name: f.latent(adata) for f in fits}
    maps = PairMaps(latents).to_reference(fits[0].name)
    cells = adata[np.arange(0, 800, 40)].copy()
    draws = collect_draws(fits, cells, n_draws=100, gene_positions=np.arange(5), maps=maps, seed=0)
    summary, per_parameter = rhat_table(draws)
    return summary.set_index("quantity"), per_parameter, draws


def test_rotated_fits_raw_rhat_far_above_one_invariants_near_one(rotated_summary):
    summary, _, _ = rotated_summary
    assert summary.loc["raw coordinates", "rhat_median"] > 1.5
    assert summary.loc["raw coordinates", "ess_bulk_median"] < 20
    for quantity in ("aligned coordinates", "pairwise distances", "decoded log means"):
        assert summary.loc[quantity, "rhat_median"] < 1.02, quantity
        assert summary.loc[quantity, "rhat_max"] < 1.06, quantity
        assert summary.loc[quantity, "ess_bulk_median"] > 150, quantity


def test_within_seed_baseline_is_near_one_and_below_the_cross_seed_spread(trained_linear, trained_mlp):
    """Two independent draw sets of one fit: what R-hat is when nothing differs but the draws."""
    fit = CountVAEFit(trained_linear, 0)
    cells = trained_linear.adata[np.arange(0, 800, 40)].copy()
    first, second = (guide_draws(fit, cells, 100, seed, np.arange(5)) for seed in (0, 7))
    identity = AffineMap(np.eye(2), np.zeros(2))
    baseline = rhat_chains(
        {"draws": first.latent, "repeat": second.latent},
        decoded={"draws": first.log_rate, "repeat": second.log_rate},
        maps={"draws": identity, "repeat": identity},
    )
    other = CountVAEFit(trained_mlp, 1)
    cross = collect_draws([fit, other], cells, n_draws=100, gene_positions=np.arange(5))
    summary, per_parameter = rhat_table(cross)
    table = add_baseline(summary, per_parameter, baseline).set_index("quantity")
    assert (table["baseline_rhat_median"] < 1.02).all() and (table["baseline_rhat_max"] < 1.1).all()
    # A genuinely different model of the same data sits above the baseline on most cell pairs' distances.
    assert table.loc["pairwise distances", "fraction_above_baseline"] > 0.5
    assert table.loc["raw coordinates", "fraction_above_baseline"] > 0.5


def test_shapes_and_per_parameter_table(rotated_summary):
    summary, per_parameter, draws = rotated_summary
    assert draws["raw coordinates"].shape == (4, 100, 20 * 2)
    assert draws["pairwise distances"].shape == (4, 100, 20 * 19 // 2)
    assert draws["decoded log means"].shape == (4, 100, 20 * 5)
    assert summary.loc["pairwise distances", "n_parameters"] == 190
    assert set(per_parameter["quantity"]) == set(summary.index)
    assert np.all(per_parameter["rhat"] > 0.9)


def test_different_posteriors_are_flagged(trained_linear, trained_mlp):
    # Two genuinely different models of the same data: their invariants disagree too.
    fits = [CountVAEFit(trained_linear, 0), CountVAEFit(trained_mlp, 1)]
    cells = trained_linear.adata[np.arange(0, 800, 80)].copy()
    draws = collect_draws(fits, cells, n_draws=50, seed=0)
    summary, _ = rhat_table(draws)
    assert summary.set_index("quantity").loc["pairwise distances", "rhat_max"] > 1.1


def test_bad_inputs(trained_linear):
    fit = CountVAEFit(trained_linear, 0)
    with pytest.raises(InvalidArgumentError, match="2 cells"):
        collect_draws([fit, fit], trained_linear.adata[:1].copy())
    with pytest.raises(InvalidArgumentError, match="4 draws"):
        collect_draws([fit, fit], trained_linear.adata[:5].copy(), n_draws=2)
    with pytest.raises(InvalidArgumentError, match="chains"):
        rhat_table({"x": np.zeros((1, 10, 3))})
    with pytest.raises(InvalidArgumentError, match="alike for every fit"):
        rhat_chains({"a": np.zeros((10, 3, 2)), "b": np.zeros((10, 4, 2))})


def shifted_chains(shifts, n_draws=2000, seed=0):
    """Two chains of iid N(0, 1) draws per parameter, the second one's mean moved by each shift: (2, draws, params)."""
    rng = np.random.default_rng(seed)
    draws = rng.standard_normal((2, n_draws, len(shifts)))
    draws[1] += np.asarray(shifts, dtype=float)
    return draws


def test_pairwise_distances_are_euclidean_between_the_cells():
    # Cells at (0, 0), (3, 4) and (6, 8) in every draw: distances 5, 10, 5 (pairs (0,1), (0,2), (1,2)).
    z = np.tile(np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]]), (4, 1, 1))
    chains = rhat_chains({"a": z, "b": z + 1.0})
    np.testing.assert_allclose(chains["pairwise distances"], np.tile([5.0, 10.0, 5.0], (2, 4, 1)))
    np.testing.assert_allclose(chains["raw coordinates"][1], z.reshape(4, -1) + 1.0)
    assert set(chains) == {"raw coordinates", "pairwise distances"}
    with pytest.raises(InvalidArgumentError, match="4 draws"):
        rhat_chains({"a": z[:3], "b": z[:3]})


def test_rhat_table_summary_of_known_spreads():
    # Split R-hat of two chains whose means differ by d (unit variance) is about sqrt(1 + d^2 / 4): ~1 for d = 0,
    # ~1.02 for d = 0.35 (above the 1.01 threshold, below 1.1), far above 1 for d = 10 (disjoint chains; rank
    # normalisation caps it near 1.8).
    draws = shifted_chains([0.0, 0.0, 0.35, 10.0])
    summary, per = rhat_table({"x": draws})
    row = summary.iloc[0]
    rhat = per["rhat"].to_numpy()
    assert rhat[0] < 1.005 and rhat[1] < 1.005 and 1.015 < rhat[2] < 1.06 and rhat[3] > 1.5
    assert row["fraction_above"] == 0.5
    assert row["rhat_max"] == rhat[3] and row["rhat_median"] == pytest.approx(np.median(rhat))
    assert (row["n_chains"], row["n_draws"], row["n_parameters"]) == (2, 2000, 4)
    # iid draws: bulk ESS near the 4000 draws in all; disjoint chains: a handful.
    assert per["ess_bulk"].iloc[0] > 3000 and row["ess_bulk_min"] < 50


def test_add_baseline_counts_parameters_above_the_baseline_maximum():
    # Baseline R-hat: ~1.00, ~1.00 and ~1.2 (chains shifted by 1.3): median ~1.00, maximum ~1.2.
    # Cross-seed R-hat set by hand to 1.1, 1.5, 3.0: two of three above the maximum (all three above the median).
    # A quantity without baseline draws gets NaN.
    baseline = {"q": shifted_chains([0.0, 0.0, 1.3], seed=1)}
    summary = pd.DataFrame({"quantity": ["q", "r"]})
    per = pd.DataFrame({"quantity": ["q", "q", "q", "r", "r"], "rhat": [1.1, 1.5, 3.0, 5.0, 5.0]})
    table = add_baseline(summary, per, baseline).set_index("quantity")
    assert table.loc["q", "baseline_rhat_median"] < 1.01
    assert 1.12 < table.loc["q", "baseline_rhat_max"] < 1.4
    assert table.loc["q", "fraction_above_baseline"] == pytest.approx(2 / 3)
    assert table.loc["r"].isna().all()
