"""Counts in .X, in a layer, or in .raw (scanpy's layouts) give the same fits, outputs and diagnostics.

Known answer: the three AnnData objects hold the same raw counts, so every number
computed from them must be identical; only where the counts live differs. The
``.raw`` layout is scanpy's usual one after feature selection: ``.raw`` keeps
all genes as counts, ``.X`` holds log-normalized values of a subset of genes.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.diagnostics import fit_seeds, report
from countvae.errors import InvalidDataError

MODEL = {"n_latent": 2, "decoder": "linear", "n_hidden": 16}
TRAIN = {"max_epochs": 15, "batch_size": 64}
SMALL = dict(n_lpd_samples=20, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, ica=False)
N_SELECTED = 25


def _log_normalized(counts: sp.csr_matrix) -> sp.csr_matrix:
    totals = np.asarray(counts.sum(axis=1)).ravel()
    out = sp.csr_matrix(sp.diags(1e4 / totals) @ counts)
    out.data = np.log1p(out.data)
    return out.astype(np.float32)


@pytest.fixture(scope="module")
def layouts():
    sim = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", n_batches=2, seed=21)
    counts = sp.csr_matrix(sim.X, dtype=np.float32)
    obs = sim.obs[["batch"]].copy()
    var = pd.DataFrame(index=sim.var_names)

    in_x = ad.AnnData(counts.copy(), obs=obs.copy(), var=var.copy())
    cv.CountVAE.setup_anndata(in_x, batch_key="batch")

    in_layer = ad.AnnData(_log_normalized(counts), obs=obs.copy(), var=var.copy())
    in_layer.layers["counts"] = counts.copy()
    cv.CountVAE.setup_anndata(in_layer, layer="counts", batch_key="batch")

    full = ad.AnnData(counts.copy(), obs=obs.copy(), var=var.copy())
    full.raw = full  # scanpy: keep every gene's counts before selecting genes
    full.X = _log_normalized(counts)
    in_raw = full[:, sim.var_names[:N_SELECTED]].copy()  # .X: a subset of genes; .raw: all 40
    cv.CountVAE.setup_anndata(in_raw, use_raw=True, batch_key="batch")
    assert in_raw.n_vars == N_SELECTED and in_raw.raw.n_vars == 40
    return {"X": in_x, "layer": in_layer, "raw": in_raw}


@pytest.fixture(scope="module")
def models(layouts):
    out = {}
    for name, adata in layouts.items():
        model = cv.CountVAE(adata, likelihood="nb", **MODEL)
        model.train(**TRAIN, seed=0, progress_bar=False)
        out[name] = model
    return out


@pytest.mark.parametrize("layout", ["layer", "raw"])
def test_model_outputs_do_not_depend_on_where_the_counts_are(models, layouts, layout):
    reference, model = models["X"], models[layout]
    assert list(model.var_names) == list(reference.var_names)  # .raw: all 40 genes, not the 25 of .X
    np.testing.assert_array_equal(model.history["loss_train"], reference.history["loss_train"])
    held = layouts[layout][:40]
    held_reference = layouts["X"][:40]
    np.testing.assert_array_equal(
        model.get_latent_representation(held), reference.get_latent_representation(held_reference)
    )
    np.testing.assert_array_equal(
        model.get_normalized_expression(held, return_numpy=True),
        reference.get_normalized_expression(held_reference, return_numpy=True),
    )
    np.testing.assert_array_equal(
        model.get_log_predictive_density(held, n_samples=20)["lpd"],
        reference.get_log_predictive_density(held_reference, n_samples=20)["lpd"],
    )
    np.testing.assert_array_equal(
        model.get_elbo(held, return_mean=False), reference.get_elbo(held_reference, return_mean=False)
    )
    np.testing.assert_array_equal(
        model.posterior_predictive_sample(held), reference.posterior_predictive_sample(held_reference)
    )


def test_write_results_with_counts_in_raw_follows_the_genes_of_x(models, layouts):
    adata = layouts["raw"].copy()
    models["raw"].write_results(adata)
    expected = models["X"].get_normalized_expression(layouts["X"], return_numpy=True)[:, :N_SELECTED]
    assert adata.layers["countvae_normalized"].shape == (adata.n_obs, N_SELECTED)
    np.testing.assert_allclose(adata.layers["countvae_normalized"], expected, rtol=1e-6)
    np.testing.assert_array_equal(adata.varm["countvae_loadings"], models["X"].get_loadings().to_numpy()[:N_SELECTED])
    np.testing.assert_array_equal(adata.obsm["X_countvae"], models["X"].get_latent_representation(layouts["X"]))


def test_write_results_refuses_repeated_gene_names_of_x_when_counts_are_in_raw(models, layouts):
    """.raw's names are the model's (unique); a gene of .X renamed to another's got that gene's layer and loadings."""
    adata = layouts["raw"].copy()
    adata.var_names = [adata.var_names[0], *adata.var_names[1:-1], adata.var_names[0]]
    with pytest.raises(
        InvalidDataError, match=r"genes' names repeat \(1 names, e.g. \['gene0'\]\).*var_names_make_unique"
    ):
        models["raw"].write_results(adata)
    assert "countvae_normalized" not in adata.layers and "X_countvae" not in adata.obsm  # nothing written
    models["raw"].write_results(adata, layer=None, loadings_key=None)  # the embedding is written by row


def test_a_raw_model_on_a_raw_with_other_genes_is_told_how_to_rebuild_raw(models, layouts):
    """``adata[:, model.var_names]`` subsets .X, not .raw, and raised a KeyError for the .raw genes .X lacks."""
    model, adata = models["raw"], layouts["raw"].copy()
    raw = adata.raw.to_adata()
    extra = raw[:, :3].copy()
    extra.var_names = ["extra0", "extra1", "extra2"]
    adata.raw = ad.concat([raw, extra], axis=1)
    cv.CountVAE.setup_anndata(adata, use_raw=True, batch_key="batch")
    advice = "`adata.raw = adata.raw.to_adata()[:, model.var_names]`"
    with pytest.raises(InvalidDataError, match="The AnnData's .raw genes differ") as info:
        model.get_latent_representation(adata)
    assert f"Subset to the training genes with {advice}" in str(info.value)
    adata.raw = adata.raw.to_adata()[:, model.var_names]  # the advice, followed
    np.testing.assert_array_equal(
        model.get_latent_representation(adata), model.get_latent_representation(layouts["raw"])
    )


@pytest.mark.parametrize("layout", ["layer", "raw"])
def test_multi_seed_diagnostics_do_not_depend_on_where_the_counts_are(layouts, layout):
    marker = str(layouts["X"].var_names[-1])  # for .raw: a gene of .raw that is not in .X
    reports = {}
    for name in ("X", layout):
        fits = fit_seeds(
            layouts[name],
            seeds=[0, 1],
            model_kwargs=MODEL,
            train_kwargs=TRAIN,
            heldout_fraction=0.3,
            progress_bar=False,
            torch_threads=1,
        )
        assert len(fits[0].var_names) == 40
        reports[name] = report(fits, markers=[marker, "batch"], **SMALL)
    reference, other = reports["X"], reports[layout]
    pd.testing.assert_frame_equal(other.predictive, reference.predictive)
    pd.testing.assert_frame_equal(other.invariants, reference.invariants)
    pd.testing.assert_frame_equal(other.markers, reference.markers)
    assert other.provenance["heldout_checksum_sha256"] == reference.provenance["heldout_checksum_sha256"]
