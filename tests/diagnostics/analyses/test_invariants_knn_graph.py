"""The k-NN row speaks about the analyst's graph (held-out and fit cells together), not a graph of the held-out cells.

The reference answers come from scikit-learn's ``kneighbors_graph`` on all the
cells at once, a different code path from the row's query of held-out cells
against the fit cells. What these tests cannot catch: whether an analyst's graph
(scanpy's approximate, weighted one) has the overlap of the exact graph here.
"""

import numpy as np
import pytest
from diagnostics_helpers import random_rotation
from sklearn.neighbors import kneighbors_graph

from countvae.diagnostics.analyses.invariants import InvariantInputs, KnnGraph, invariants_table
from countvae.diagnostics.analyses.subspace import subsample
from countvae.diagnostics.reporting.verdicts import TOO_FEW_CELLS_REASON, judge_invariants
from countvae.errors import InvalidArgumentError

N_CELLS, N_HELDOUT = 1800, 300


def _displaced_fits(seed: int, noise: float, n: int = N_CELLS) -> tuple[np.ndarray, np.ndarray]:
    """Latents of one fit and of a second whose cells are moved by Gaussian noise (``noise`` sd, 5 dimensions)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 5))
    return z, z + noise * rng.normal(size=z.shape)


def _whole_graph_overlap(a: np.ndarray, b: np.ndarray, rows: np.ndarray, k: int) -> float:
    """Mean Jaccard overlap, over ``rows``, of the two exact k-NN graphs on all the cells."""
    ga = kneighbors_graph(a, k, include_self=False).tolil().rows
    gb = kneighbors_graph(b, k, include_self=False).tolil().rows
    return float(np.mean([len(set(ga[i]) & set(gb[i])) / len(set(ga[i]) | set(gb[i])) for i in rows]))


def _knn_row(latents, max_knn_cells=5_000, **inputs):
    judged = judge_invariants(
        invariants_table(InvariantInputs(latents=latents, **inputs), max_knn_cells=max_knn_cells)[0]
    )
    return judged.set_index("quantity").loc["k-NN graph"]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_row_is_the_held_out_rows_of_the_graph_on_all_cells(seed):
    a, b = _displaced_fits(seed, noise=0.2)
    held, fit = np.arange(N_HELDOUT), np.arange(N_HELDOUT, N_CELLS)
    truth = _whole_graph_overlap(a, b, held, 15)
    alone = _knn_row({"s0": a[held], "s1": b[held]})
    analyst = _knn_row({"s0": a[held], "s1": b[held]}, reference_latents={"s0": a[fit], "s1": b[fit]})
    assert analyst.agreement == pytest.approx(truth, abs=1e-12)
    assert analyst.graph_cells == N_CELLS and "k=15 graph on 1,800 cells (held-out and fit cells)" in analyst.interval
    # The graph of the 300 held-out cells alone is coarser: it overlaps more, and here it says "agree" where the
    # analyst's graph differs (the case that the verdict on held-out cells alone got wrong against the oracle).
    assert alone.agreement > truth + 0.1
    assert (alone.verdict, analyst.verdict) == ("agree", "differ")


def test_held_out_cells_beyond_max_knn_cells_stay_in_the_graph():
    """Only 100 of the 300 held-out rows are compared, but on the graph of all 1,800 cells at k = 15 (no scaling)."""
    a, b = _displaced_fits(5, noise=0.2)
    held, fit = np.arange(N_HELDOUT), np.arange(N_HELDOUT, N_CELLS)
    rows = subsample(N_HELDOUT, 100, 0)  # the rows invariants_table compares (its seed 0)
    inputs = InvariantInputs(latents={"s0": a[held], "s1": b[held]}, reference_latents={"s0": a[fit], "s1": b[fit]})
    row = judge_invariants(invariants_table(inputs, max_knn_cells=100)[0]).set_index("quantity").loc["k-NN graph"]
    assert row.agreement == pytest.approx(_whole_graph_overlap(a, b, rows, 15), abs=1e-12)
    assert row.interval.endswith("their rows of the k=15 graph on 1,800 cells (held-out and fit cells)")
    alone = _knn_row({"s0": a[held], "s1": b[held]}, max_knn_cells=100)
    assert alone.agreement == pytest.approx(_whole_graph_overlap(a[held], b[held], rows, 15), abs=1e-12)
    assert alone.interval.endswith("their rows of the k=15 graph on 300 cells")


def test_a_stated_larger_graph_scales_k_to_keep_the_neighbourhoods_share():
    a, b = _displaced_fits(2, noise=0.2)
    held = np.arange(N_HELDOUT)
    row = _knn_row({"s0": a[held], "s1": b[held]}, graph_cells=N_CELLS)
    assert KnnGraph.of(N_HELDOUT, N_HELDOUT, 0, 15, N_CELLS).k == 2
    assert "k=2 graph on 300 cells" in row.interval and "scaled from 15" in row.interval
    # a graph barely larger scales k back to 15 by rounding: "k scaled from 15" to 15 said nothing
    barely = _knn_row({"s0": a[held], "s1": b[held]}, graph_cells=N_HELDOUT + 1)
    assert KnnGraph.of(N_HELDOUT, N_HELDOUT, 0, 15, N_HELDOUT + 1).k == 15
    assert barely.interval.endswith("their rows of the k=15 graph on 300 cells")
    assert row.agreement == pytest.approx(_whole_graph_overlap(a, b, held, 15), abs=0.05)


def test_a_pool_larger_than_the_stated_graph_scales_k_up():
    """The oracle's case: every pool cell's rows among pool and fit cells, standing for the analyst's smaller graph."""
    a, b = _displaced_fits(3, noise=0.2, n=5500)
    pool, fit = np.arange(4000), np.arange(4000, 5500)
    row = _knn_row({"s0": a[pool], "s1": b[pool]}, reference_latents={"s0": a[fit], "s1": b[fit]}, graph_cells=1800)
    assert KnnGraph.of(4000, 4000, 1500, 15, 1800).k == 46  # 15 x 5,500 / 1,800 = 45.8
    assert "k=46 graph on 5,500 cells" in row.interval
    analyst = _displaced_fits(3, noise=0.2, n=1800)
    assert row.agreement == pytest.approx(_whole_graph_overlap(*analyst, np.arange(1800), 15), abs=0.03)


def test_few_held_out_cells_can_agree_when_the_graph_holds_the_fit_cells():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(600, 4))
    q = random_rotation(4, seed=5)
    held, fit = np.arange(100), np.arange(100, 600)
    latents = {"s0": z[held], "s1": z[held] @ q.T}
    alone = _knn_row(latents)
    assert alone.verdict == "undetermined" and TOO_FEW_CELLS_REASON in alone.reason
    with_fit = _knn_row(latents, reference_latents={"s0": z[fit], "s1": z[fit] @ q.T})
    assert with_fit.verdict == "agree" and with_fit.agreement == pytest.approx(1.0)


def test_reference_latents_must_match_the_fits_and_the_graph_its_cells():
    z = np.random.default_rng(6).normal(size=(50, 3))
    latents = {"s0": z, "s1": z}
    with pytest.raises(InvalidArgumentError, match="reference_latents are for fits"):
        invariants_table(InvariantInputs(latents=latents, reference_latents={"s0": z}))
    with pytest.raises(InvalidArgumentError, match="of one shape"):
        invariants_table(InvariantInputs(latents=latents, reference_latents={"s0": z, "s1": z[:10]}))
    with pytest.raises(InvalidArgumentError, match="of one shape"):
        invariants_table(InvariantInputs(latents=latents, reference_latents={"s0": z[:, :2], "s1": z[:, :2]}))
