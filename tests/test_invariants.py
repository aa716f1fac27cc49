"""The invariants table classifies known invariant and non-invariant quantities correctly."""

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import ScrambledFit, random_rotation, rotated_copies

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
from countvae.diagnostics.reporting.verdicts import judge_invariants
from countvae.errors import InvalidArgumentError

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
    jac = {f.name: f.decoder_jacobian(adata[:100].copy()) for f in fits}
    return InvariantInputs(
        latents={f.name: f.latent(adata) for f in fits},
        log_rates={f.name: f.decode_log_rate(adata, f.latent(adata).astype(np.float32)) for f in fits},
        normalized={f.name: np.log1p(f.normalized_expression(adata)) for f in fits},
        spans={n: np.linalg.svd(j.mean(0), full_matrices=False)[0] for n, j in jac.items()},
        grams={n: np.einsum("cgl,chl->gh", j, j) / len(j) for n, j in jac.items()},
        loadings={f.name: f.loadings() for f in fits},
        markers=marker_matrix(adata, list(markers), fits[0].var_names),
        ica=False,
    )


@pytest.fixture(scope="module")
def rotated_table(trained_linear):
    fits = rotated_copies(CountVAEFit(trained_linear, 0), [0, 1, 2])
    table, pairs = invariants_table(inputs_for(fits, trained_linear.adata))
    return table.set_index("quantity"), pairs


def test_exactly_equivalent_fits_invariants_stable_coordinates_stable_up_to_rotation(rotated_table):
    table, _ = rotated_table
    for quantity in INVARIANT:
        assert table.loc[quantity, "verdict"] == "stable", quantity
        assert table.loc[quantity, "invariant_in_theory"] == "yes"
        assert table.loc[quantity, "agreement"] > 0.999, quantity
    for quantity in COORDINATE:
        assert table.loc[quantity, "verdict"] == "stable up to rotation", quantity
        assert table.loc[quantity, "invariant_in_theory"].startswith("no")
        assert table.loc[quantity, "agreement"] < 0.9, quantity
        assert table.loc[quantity, "aligned_agreement"] > 0.999, quantity
    # What is not supplied is reported as such, never guessed.
    assert table.loc["held-out log p(x)", "verdict"] == "not measured"
    assert table.loc["posterior predictive statistics", "verdict"] == "not measured"


def test_pairs_table_has_every_pair(rotated_table):
    _, pairs = rotated_table
    assert len(pairs[pairs["quantity"] == "latent distances"]) == 3
    assert set(pairs["fit_a"]) | set(pairs["fit_b"]) == {"seed 0", "seed 1", "seed 2"}


def test_unrelated_latents_are_unstable_even_after_alignment(trained_linear):
    base = CountVAEFit(trained_linear, 0)
    fits = [*rotated_copies(base, [0]), ScrambledFit(base, np.eye(2), 1)]
    table = invariants_table(inputs_for(fits, trained_linear.adata))[0].set_index("quantity")
    assert table.loc["latent distances", "verdict"] == "unstable"
    assert table.loc["k-NN graph", "verdict"] == "unstable"
    assert table.loc["per-dimension coordinates", "verdict"] == "unstable"
    assert table.loc["per-dimension marker correlations", "verdict"] == "unstable"
    # The decoder is shared, so decoded quantities at each fit's own latents still differ...
    assert table.loc["decoded means", "agreement"] < 0.9
    # ...while the decoder's gene-space span is identical.
    assert table.loc["latent subspace (gene space)", "verdict"] == "stable"


def test_ica_coordinates_stable_for_rotated_laplace_latents():
    rng = np.random.default_rng(0)
    z = rng.laplace(0, 1 / np.sqrt(2), (3000, 4))
    latents = {"a": z, "b": z @ random_rotation(4, 1).T + 0.02 * rng.standard_normal(z.shape)}
    table = invariants_table(InvariantInputs(latents=latents, ica=True))[0].set_index("quantity")
    assert table.loc["ICA coordinates", "verdict"] == "stable"
    assert table.loc["ICA coordinates", "agreement"] > 0.99
    assert table.loc["per-dimension coordinates", "verdict"] == "stable up to rotation"


def test_lpd_and_ppc_rows_use_their_thresholds():
    z = np.random.default_rng(1).standard_normal((200, 2))
    pairs = pd.DataFrame({"fit_a": ["a"], "fit_b": ["b"], "z": [-2.5]})
    table = invariants_table(InvariantInputs(latents={"a": z, "b": z}, lpd_pairs=pairs, ica=False))[0]
    row = table.set_index("quantity").loc["held-out log p(x)"]
    assert row["agreement"] == 2.5 and row["verdict"] == "unstable"
    assert row["threshold"] == 2.0 and row["comparison"] == "<"
    pairs["z"] = [1.2]
    table = invariants_table(InvariantInputs(latents={"a": z, "b": z}, lpd_pairs=pairs, ica=False))[0]
    assert table.set_index("quantity").loc["held-out log p(x)", "verdict"] == "stable"


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
    numbers, _ = invariant_numbers(InvariantInputs(latents={"a": z, "b": z @ random_rotation(2, 3).T}, ica=True))
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
    assert judged.loc["per-dimension coordinates", "verdict"] == "stable up to rotation"
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
    inputs = InvariantInputs(latents=latents, ica=True)
    alone, _ = invariant_numbers(inputs)
    maps = PairMaps(latents)
    shared, _ = invariant_numbers(inputs, maps=maps)
    pd.testing.assert_frame_equal(alone, shared)
    assert maps.fit_counts == {"orthogonal": 6, "ica axes": 4}
    # Another analysis asking for the maps (either direction) fits nothing more.
    maps.to_reference("s0")
    maps.orthogonal("s3", "s1")
    assert maps.fit_counts == {"orthogonal": 6, "ica axes": 4}
    with pytest.raises(InvalidArgumentError, match="other fits or cells"):
        invariant_numbers(inputs, maps=PairMaps({k: v[:100] for k, v in latents.items()}))
