"""The invariants table classifies known invariant and non-invariant quantities of real fits correctly."""

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import random_rotation

import countvae as cv
from countvae.diagnostics import CountVAEFit
from countvae.diagnostics.analyses.invariants import (
    QUANTITIES,
    QUANTITY_BY_NAME,
    InvariantInputs,
    Threshold,
    concordance,
    gene_centred_concordance,
    gram_cosine,
)
from countvae.diagnostics.analyses.invariants import invariants_table as invariant_numbers
from countvae.diagnostics.analyses.maps import PairMaps
from countvae.diagnostics.analyses.markers import marker_matrix
from countvae.diagnostics.analyses.reduced_jacobians import reduce_jacobians
from countvae.diagnostics.analyses.subspace import gene_contrasts, jacobian_span
from countvae.diagnostics.reporting.verdicts import judge_invariants
from countvae.errors import InvalidArgumentError
from countvae.invariance import reparameterize

INVARIANT = [
    "decoded means",
    "normalized expression",
    "latent distances",
    "k-NN graph",
    "latent subspace (gene space)",
    "W W^T / decoder Gram",
]
COORDINATE = ["per-dimension coordinates", "per-dimension loadings", "per-dimension marker correlations"]


def invariants_table(inputs, **kwargs):
    """The numbers of the invariants table, judged (verdicts added) as the report does."""
    numbers, pairs = invariant_numbers(inputs, **kwargs)
    return judge_invariants(numbers), pairs


def inputs_for(fits, adata, markers=("gene0", "gene1", "batch")):
    """What the report collects from each (real) fit, on the cells of ``adata``."""
    jac = {f.name: gene_contrasts(f.decoder_jacobian(adata[:100].copy())) for f in fits}
    return InvariantInputs(
        latents={f.name: f.latent(adata) for f in fits},
        log_rates={f.name: f.decode_log_rate(adata, f.latent(adata).astype(np.float32)) for f in fits},
        normalized={f.name: np.log1p(f.normalized_expression(adata)) for f in fits},
        spans={n: jacobian_span(j, j.shape[2]) for n, j in jac.items()},
        grams={n: np.einsum("cgl,chl->gh", j, j) / len(j) for n, j in jac.items()},
        loadings={f.name: f.loadings() for f in fits},
        loadings_are_weights=True,
        jacobians={n: reduce_jacobians(j) for n, j in jac.items()},
        gram_jacobians={n: reduce_jacobians(j) for n, j in jac.items()},
        markers=marker_matrix(adata, list(markers), fits[0].var_names),
    )


def exact_copies(model, seeds):
    """Real models: ``model`` and copies of it in other orthogonal latent coordinates."""
    return [
        CountVAEFit(model if s == 0 else reparameterize(model, random_rotation(model.n_latent, s)), s) for s in seeds
    ]


@pytest.fixture(scope="module")
def rotated_table(trained_linear):
    fits = exact_copies(trained_linear, [0, 1, 2])
    table, pairs = invariants_table(inputs_for(fits, trained_linear.adata[:400].copy()))
    return table.set_index("quantity"), pairs


def test_exactly_equivalent_fits_invariants_agree_coordinates_only_after_alignment(rotated_table):
    table, _ = rotated_table
    for quantity in INVARIANT:
        assert table.loc[quantity, "verdict"] == "agree", quantity
        assert table.loc[quantity, "invariant_in_theory"] == "yes"
        assert table.loc[quantity, "low"] > 0.999, quantity
    for quantity in COORDINATE:
        assert table.loc[quantity, "verdict"] == "agree after alignment", quantity
        assert table.loc[quantity, "invariant_in_theory"].startswith("no")
        assert table.loc[quantity, "high"] < 0.9, quantity
        assert table.loc[quantity, "aligned_low"] > 0.999, quantity
    # A linear decoder's loadings involve no cells: the interval is the score itself.
    assert table.loc["per-dimension loadings", "interval"].startswith("exact")
    # What is not supplied is reported as such, never guessed.
    assert table.loc["held-out log p(x)", "verdict"] == "not measured"
    assert table.loc["posterior predictive statistics", "verdict"] == "not measured"
    assert "ICA coordinates" not in table.index


def test_pairs_table_has_every_pair(rotated_table):
    _, pairs = rotated_table
    assert len(pairs[pairs["quantity"] == "latent distances"]) == 3
    assert set(pairs["fit_a"]) | set(pairs["fit_b"]) == {"seed 0", "seed 1", "seed 2"}


def test_fits_of_other_data_differ(trained_linear):
    """A real fit of other simulated data (other loadings and sources), read on the same cells: nothing agrees."""
    other_data = cv.data.simulate(n_cells=800, n_genes=60, n_latent=2, decoder="linear", n_batches=2, seed=99)
    cv.CountVAE.setup_anndata(other_data, batch_key="batch")
    other = cv.CountVAE(other_data, n_latent=2, decoder="linear", likelihood="nb")
    other.train(max_epochs=30, progress_bar=False, seed=0)
    fits = [CountVAEFit(trained_linear, 0), CountVAEFit(other, 1)]
    table = invariants_table(inputs_for(fits, trained_linear.adata[:400].copy()))[0].set_index("quantity")
    for quantity in ("decoded means", "latent subspace (gene space)", "W W^T / decoder Gram", "k-NN graph"):
        assert table.loc[quantity, "verdict"] == "differ", (quantity, table.loc[quantity].to_dict())
    assert table.loc["per-dimension coordinates", "verdict"] == "differ"


def test_lpd_ppc_and_ica_rows_take_their_numbers_from_their_analyses():
    z = np.random.default_rng(1).standard_normal((200, 2))
    pairs = pd.DataFrame(
        {
            "fit_a": ["a"],
            "fit_b": ["b"],
            "n_cells": [200],
            "diff_per_cell": [-0.3],
            "ci_low": [-0.6],
            "ci_high": [-0.1],
            "margin": [0.5],
        }
    )
    components = pd.DataFrame(
        {"component": ["IC_0", "IC_1"], "worst_match": [0.97, 0.88], "low": [0.96, 0.83], "high": [0.975, 0.9]}
        | {"corrected_match": [0.99, 0.9], "corrected_low": [0.98, 0.85], "corrected_high": [0.995, 0.93]}
        | {"n_matching_cells": [200, 200]}
    )
    inputs = InvariantInputs(latents={"a": z, "b": z}, lpd_pairs=pairs, components=components)
    table = invariants_table(inputs)[0].set_index("quantity")
    row = table.loc["held-out log p(x)"]
    # |diff| / margin = 0.6, inside the box of the interval's distances from zero: 0.1 / 0.5 to 0.6 / 0.5
    assert row["agreement"] == pytest.approx(0.6) and row["low"] == pytest.approx(0.2)
    assert row["high"] == pytest.approx(1.2) and (row["threshold"], row["comparison"]) == (1.0, "<")
    ica = table.loc["ICA coordinates"]  # the match corrected for the ICA's estimation, not the raw match
    assert (ica["agreement"], ica["low"], ica["high"]) == (0.9, 0.85, 0.93)
    assert (ica["threshold"], ica["comparison"]) == (0.95, ">=")
    assert np.isnan(table.loc["posterior predictive statistics", "agreement"])  # not supplied: not measured
    judged = judge_invariants(table.reset_index()).set_index("quantity")
    assert judged.loc["held-out log p(x)", "verdict"] == "undetermined"  # the interval reaches past the margin
    assert judged.loc["ICA coordinates", "verdict"] == "differ"  # without component verdicts: by the interval


def test_agreement_scores_known_values():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert concordance(a, a) == 1.0
    centred = a - a.mean()
    assert concordance(centred, -centred) == pytest.approx(-1.0)
    # Lin's CCC of a and a + 1: 2 var / (2 var + 1) with var = 1.25.
    assert concordance(a, a + 1.0) == pytest.approx(2.5 / 3.5)
    # Per-gene offsets shared by both fits do not count as agreement.
    rng = np.random.default_rng(0)
    offsets = 100.0 * rng.standard_normal(50)
    x, y = rng.standard_normal((30, 50)) + offsets, rng.standard_normal((30, 50)) + offsets
    assert concordance(x, y) > 0.99 and abs(gene_centred_concordance(x, y)) < 0.2
    g = rng.standard_normal((5, 5))
    assert gram_cosine(g, 3 * g) == pytest.approx(1.0)


def test_needs_two_fits():
    with pytest.raises(InvalidArgumentError):
        invariants_table(InvariantInputs(latents={"a": np.zeros((5, 2))}))


def test_rows_are_tied_to_their_quantities_by_name():
    """Each row carries its own quantity's metric and threshold, whatever the order of the registry."""
    z = np.random.default_rng(2).standard_normal((300, 2))
    components = pd.DataFrame(
        {"component": ["IC_0"], "worst_match": [1.0], "low": [1.0], "high": [1.0], "n_matching_cells": [300]}
        | {"corrected_match": [1.0], "corrected_low": [1.0], "corrected_high": [1.0]}
    )
    numbers, _ = invariant_numbers(
        InvariantInputs(latents={"a": z, "b": z @ random_rotation(2, 3).T}, components=components)
    )
    assert list(numbers["quantity"]) == [q.name for q in QUANTITIES]
    for row in numbers.itertuples():
        quantity = QUANTITY_BY_NAME[row.quantity]
        assert (row.metric, row.threshold, row.comparison) == (
            quantity.metric,
            quantity.threshold.value,
            quantity.threshold.comparison,
        )
    # Rotated copies: distances agree exactly, coordinates only after the map; the verdicts follow.
    judged = judge_invariants(numbers).set_index("quantity")
    assert judged.loc["latent distances", "agreement"] == pytest.approx(1.0)
    assert judged.loc["per-dimension coordinates", "verdict"] == "agree after alignment"
    assert judged.loc["decoded means", "verdict"] == "not measured"


def test_threshold_directions():
    agree, discrepancy = Threshold(0.9, ">="), Threshold(2.0, "<")
    assert agree.met(0.9) and not agree.met(0.89) and not agree.met(np.nan)
    assert discrepancy.met(1.99) and not discrepancy.met(2.0)
    assert agree.worst([0.95, 0.91, np.nan]) == 0.91 and discrepancy.worst([0.5, 3.0]) == 3.0
    assert np.isnan(agree.worst([np.nan]))
    with pytest.raises(InvalidArgumentError, match="comparison"):
        Threshold(1.0, ">")


def test_shared_maps_give_the_same_table_and_are_fitted_once_per_pair():
    rng = np.random.default_rng(0)
    z = rng.laplace(0, 1 / np.sqrt(2), (800, 3))
    latents = {f"s{k}": z @ random_rotation(3, k).T + 0.05 * rng.standard_normal(z.shape) for k in range(4)}
    inputs = InvariantInputs(latents=latents)
    alone, _ = invariant_numbers(inputs)
    maps = PairMaps(latents)
    shared, _ = invariant_numbers(inputs, maps=maps)
    pd.testing.assert_frame_equal(alone, shared)
    assert maps.fit_counts == {"orthogonal": 6}
    # Another analysis asking for the maps (either direction) fits nothing more.
    maps.to_reference("s0")
    maps.orthogonal("s3", "s1")
    assert maps.fit_counts == {"orthogonal": 6}
    with pytest.raises(InvalidArgumentError, match="other fits or cells"):
        invariant_numbers(inputs, maps=PairMaps({k: v[:100] for k, v in latents.items()}))
