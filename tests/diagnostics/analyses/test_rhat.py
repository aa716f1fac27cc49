"""Spread of guide draws across seeds: copies identical up to a rotation have raw R-hat >> 1 and invariant R-hat ~ 1."""

import numpy as np
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
