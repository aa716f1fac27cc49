"""verify(): exact invariance on held-out cells, the controls that must fail, and the report."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import countvae as cv
from countvae import invariance as inv
from countvae import plotting
from countvae.errors import InvalidArgumentError, InvalidDataError, NotTrainedError, OutputExistsError
from countvae.invariance import verification as verify_module
from countvae.invariance.checks import replication_ratio


@pytest.fixture(scope="module")
def poisson_fit():
    """A 2-d linear Poisson model fitted on 500 cells, and 150 held-out cells."""
    adata = cv.data.simulate(
        n_cells=650, n_genes=40, n_latent=2, likelihood="poisson", library_size=400, n_batches=2, seed=5
    )
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    fit, held = adata[:500].copy(), adata[500:].copy()
    model = cv.CountVAE(fit, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=32)
    model.train(max_epochs=80, lr=3e-3, progress_bar=False, seed=0)
    return model, held


@pytest.fixture(scope="module")
def poisson_report(poisson_fit):
    model, held = poisson_fit
    return inv.verify(model, held, n_samples=200, seed=0, elbo_refit_steps=20)


def _value(report, variant, transform, check):
    f = report.to_frame()
    row = f[(f["variant"] == variant) & (f["transform"] == transform) & (f["check"] == check)]
    assert len(row) == 1, (variant, transform, check)
    return row.iloc[0]


def test_verify_passes_and_controls_are_detected(poisson_report):
    rep = poisson_report
    assert rep.passed, rep.summary()
    assert rep.settings["quadrature"] and rep.settings["dtype"] == "float64"
    orthogonal = ["rotation", "reflection", "permutation", "signed permutation", "haar orthogonal"]
    for name in orthogonal:
        # 1. common random numbers: equal to rounding in float64
        assert _value(rep, "fitted", name, "crn_max_abs_diff").value <= 1e-9
        # exact reference: quadrature of the original and the transformed model agree to 1e-10
        assert _value(rep, "fitted", name, "quadrature_max_abs_diff").value <= 1e-10
        assert _value(rep, "fitted", name, "pointwise_loglik_max_abs_diff").value <= 1e-9
        assert _value(rep, "fitted", name, "prior_max_abs_diff").value <= 1e-12
        # the full-covariance push-forward guide has exactly the original ELBO
        assert _value(rep, "fitted", name, "elbo_pushforward_max_abs_diff").value <= 1e-9
        # and the coordinates did change
        assert _value(rep, "fitted", name, "coordinates_rel_change").value > 0.05
    for name in ["scaling (control)", "shear (control)"]:
        row = _value(rep, "fitted", name, "quadrature_mean_diff")
        assert abs(row.value) > 0.05  # the exact log p(x) moved
        assert _value(rep, "fitted", name, "crn_change_ratio").value > 3.0  # beyond Monte Carlo error
        assert _value(rep, "fitted", name, "prior_max_abs_diff").value > 0.1
        # the decoder is compensated: p(x | z) at matched z is unchanged, only the prior differs
        assert _value(rep, "fitted", name, "pointwise_loglik_max_abs_diff").value <= 1e-9
    assert _value(rep, "control: laplace prior", "rotation", "crn_change_ratio").value > 3.0
    assert _value(rep, "control: laplace prior", "signed permutation", "crn_max_abs_diff").value <= 1e-9
    assert _value(rep, "control: diagonal prior", "rotation", "quadrature_max_abs_diff").value > 0.05
    assert _value(rep, "control: diagonal prior", "reflection", "quadrature_max_abs_diff").value <= 1e-10
    verdicts = rep.verdicts()
    assert (verdicts["result"] == "ok").all()
    expected = dict(zip(verdicts["variant"] + " / " + verdicts["transform"], verdicts["p(x) expected"], strict=True))
    assert expected["control: laplace prior / rotation"] == "changes"
    assert expected["control: laplace prior / signed permutation"] == "invariant"
    assert expected["fitted / shear (control)"] == "changes"


def test_crn_numbers_agree_with_a_direct_computation(poisson_fit, poisson_report):
    model, held = poisson_fit
    rep = poisson_report
    rotated = inv.reparameterize(inv.copy_model(model, torch.float64), rep.transforms["rotation"])
    direct = rotated.get_log_predictive_density(held, n_samples=200, seed=0, method="guide").lpd.to_numpy()
    np.testing.assert_allclose(rep.per_cell["fitted / rotation"]["lpd_crn"], direct, rtol=0, atol=1e-12)
    exact = inv.quadrature_log_marginal(model, held)
    np.testing.assert_allclose(rep.per_cell["fitted / rotation"]["quadrature"], exact, atol=1e-6)


def test_outputs_table(poisson_report):
    out = poisson_report.outputs
    orthogonal = ["rotation", "reflection", "permutation", "signed permutation", "haar orthogonal"]
    controls = ["scaling (control)", "shear (control)"]
    assert (out.loc["decoded expression", orthogonal + controls] < 1e-9).all()
    assert (out.loc["posterior means Z' = Z A^T", orthogonal + controls] < 1e-9).all()
    assert (out.loc["latent pairwise distances", orthogonal] < 1e-9).all()
    assert (out.loc["latent k-NN graph", orthogonal] == 0).all()
    assert (out.loc["loading Gram W W^T", orthogonal] < 1e-9).all()
    assert (out.loc["latent pairwise distances", controls] > 0.05).all()
    assert (out.loc["latent k-NN graph", controls] > 0.01).all()
    for row in ["latent coordinates", "per-dimension loadings", "per-dimension gene correlations"]:
        assert (out.loc[row, orthogonal] > 0.05).all(), row
    assert out.loc["log p(x) (same noise)", "rotation"] <= 1e-9
    assert out.loc["log p(x) (same noise)", "scaling (control)"] > 0.1


def test_elbo_rows(poisson_report):
    rep = poisson_report
    # a signed permutation keeps a mean-field guide mean-field: its projection is the pushed-forward guide
    for name in ["reflection", "permutation", "signed permutation"]:
        assert _value(rep, "fitted", name, "elbo_projected_mean_diff").value == pytest.approx(0.0, abs=1e-9)
    # a rotation does not: the projected guide is a different distribution, with a different ELBO
    assert abs(_value(rep, "fitted", "rotation", "elbo_projected_mean_diff").value) > 1e-6
    refit = _value(rep, "fitted", "rotation", "elbo_refit_original_mean").value
    amortized = _value(rep, "fitted", "rotation", "elbo_original_mean").value
    assert refit > amortized  # refitting each cell's guide closes (part of) the amortization gap


def test_report_exports(poisson_report):
    rep = poisson_report
    d = rep.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["passed"] is True
    assert {"settings", "transforms", "variants", "verdicts", "checks", "outputs"} <= set(d)
    assert np.allclose(d["transforms"]["rotation"], rep.transforms["rotation"])
    frame = rep.to_frame()
    assert list(frame.columns) == [
        "variant",
        "transform",
        "kind",
        "p_x_expected",
        "check",
        "value",
        "threshold",
        "expect",
        "ok",
    ]
    assert set(frame.expect) == {"equal", "differs", "report"}
    assert frame.loc[frame.expect == "report", "ok"].isna().all()
    summary = rep.summary()
    assert "PASSED" in summary and "shear (control)" in summary and "control: laplace prior" in summary
    md = rep.to_markdown()
    assert md.startswith("# Rotation invariance check") and "| variant |" in md and "decoded expression" in md
    assert len(rep.failures) == 0
    tables = rep.tables
    assert set(tables) == {"verdicts", "checks", "outputs", "estimator_accuracy"}
    assert tables["verdicts"].equals(rep.verdicts()) and tables["checks"].equals(frame)
    assert set(tables["estimator_accuracy"]["check"]) == {"is_minus_quadrature_mean", "is_within_4se_fraction"}


def test_report_html_and_folder(poisson_report, tmp_path):
    rep = poisson_report
    page = rep.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") == 2
    assert "shear (control)" in page and "decoded expression" in page
    # text from the data is escaped
    renamed = dataclasses.replace(rep, checks=rep.checks.replace({"transform": {"rotation": "<script>x</script>"}}))
    assert "<script>x" not in renamed.to_html() and "&lt;script&gt;x" in renamed.to_html()
    folder = rep.save(tmp_path / "inv")
    assert sorted(p.name for p in folder.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((folder / "report.json").read_text()) == json.loads(json.dumps(rep.to_dict()))
    assert (folder / "report.md").read_text() == rep.to_markdown()
    with pytest.raises(OutputExistsError):
        rep.save(folder)
    (folder / "report.md").write_text("stale")
    rep.save(folder, overwrite=True)
    assert (folder / "report.md").read_text() == rep.to_markdown()


def test_verify_fails_when_the_expectation_is_wrong(poisson_fit, monkeypatch):
    # if the theory claimed every map preserved the prior, the controls would contradict it
    model, held = poisson_fit
    monkeypatch.setattr(verify_module, "prior_preserves", lambda prior, A, atol=1e-8: True)
    rep = inv.verify(model, held[:40], n_samples=50, prior_controls=False, elbo_refit_steps=0)
    assert not rep.passed
    failing = set(zip(rep.failures["transform"], rep.failures["check"], strict=True))
    assert ("scaling (control)", "crn_max_abs_diff") in failing
    assert ("shear (control)", "quadrature_max_abs_diff") in failing
    assert "FAILED" in rep.summary() and "Disagreements" in rep.summary()


def test_laplace_model_user_transforms(poisson_fit):
    model, held = poisson_fit
    laplace = inv.with_prior(model, "laplace")
    transforms = {"rotation 45": [[0.5**0.5, -(0.5**0.5)], [0.5**0.5, 0.5**0.5]], "swap": inv.permutation([1, 0])}
    rep = inv.verify(laplace, held, transforms, n_samples=200, controls=False, prior_controls=False, elbo_refit_steps=0)
    assert rep.passed, rep.summary()
    assert rep.settings["quadrature"] is False  # no quadrature for a Laplace prior
    v = rep.verdicts().set_index("transform")
    assert v.loc["rotation 45", "p(x) expected"] == "changes" and v.loc["swap", "p(x) expected"] == "invariant"
    assert v.loc["swap", "CRN max |diff|"] <= 1e-9
    assert v.loc["rotation 45", "change / MC error"] > 3.0


def test_float32_mlp_without_quadrature(trained_mlp):
    model = trained_mlp
    held = model.adata[model.validation_indices[:40]].copy()
    rep = inv.verify(
        model, held, n_samples=40, dtype=torch.float32, prior_controls=False, n_elbo_samples=8, elbo_refit_steps=5
    )
    assert rep.passed, rep.summary()
    assert rep.settings["dtype"] == "float32" and rep.settings["quadrature"] is False
    assert "quadrature_max_abs_diff" not in set(rep.to_frame().check)
    crn = _value(rep, "fitted", "rotation", "crn_max_abs_diff")
    assert crn.threshold > 1e-6 and crn.value <= crn.threshold
    # float32 arithmetic: the differences are rounding errors, not exact zeros
    assert "loading Gram W W^T" not in rep.outputs.index  # MLP decoder: no loadings Gram


def test_one_latent_dimension():
    adata = cv.data.simulate(n_cells=160, n_genes=20, n_latent=1, likelihood="nb", seed=1)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata[:120].copy(), n_latent=1, likelihood="nb", decoder="linear", n_hidden=16)
    model.train(max_epochs=150, lr=1e-2, progress_bar=False)
    rep = inv.verify(model, adata[120:].copy(), n_samples=100, elbo_refit_steps=10)
    assert rep.passed, rep.summary()
    assert set(rep.transforms) == {"reflection", "scaling (control)"}
    assert set(rep.variants) == {"fitted"}  # a 1-d latent has only sign flips: no prior controls


def test_bad_input(poisson_fit, small_adata):
    model, held = poisson_fit
    with pytest.raises(InvalidDataError, match="genes"):
        inv.verify(model, held[:, :30].copy())
    with pytest.raises(NotTrainedError, match="train"):
        inv.verify(cv.CountVAE(model.adata, n_latent=2), held)
    with pytest.raises(InvalidArgumentError, match="n_latent=2"):
        inv.verify(model, held, {"big": np.eye(3)})
    with pytest.raises(InvalidArgumentError, match="singular"):
        inv.verify(model, held, {"flat": np.ones((2, 2))})
    with pytest.raises(InvalidArgumentError, match="n_samples"):
        inv.verify(model, held, n_samples=1)
    with pytest.raises(InvalidArgumentError, match="AnnData"):
        inv.verify(model, held.X)
    with pytest.raises(InvalidArgumentError, match="quadrature"):
        inv.verify(model, held, quadrature="yes")
    with pytest.raises(InvalidArgumentError, match="at least 2"):
        inv.verify(model, held, indices=[3])
    mlp = cv.CountVAE(small_adata, n_latent=2, decoder="mlp", n_hidden=8)
    mlp.train(max_epochs=1, progress_bar=False)
    with pytest.raises(InvalidArgumentError, match="quadrature=True, but Quadrature needs decoder='linear'"):
        inv.verify(mlp, small_adata, quadrature=True)


def test_replication_ratio_is_one_without_change_and_grows_with_it():
    rng = np.random.default_rng(0)
    noise = rng.standard_t(df=3, size=(2, 4000))  # heavy-tailed Monte Carlo errors
    assert replication_ratio(noise[0], noise[1]) == pytest.approx(1.0, abs=0.1)
    change = rng.normal(0.0, 5.0, 4000)
    assert replication_ratio(change + noise[0], change + noise[1]) > 3.0
    assert replication_ratio(np.zeros(5), np.zeros(5)) == 0.0


def test_figures(poisson_fit, poisson_report):
    model, held = poisson_fit
    rep = poisson_report
    Z = rep.latent
    A = rep.transforms["rotation"]
    axes = plotting.latent_before_after(Z, Z @ A.T, labels=held.obs["batch"])
    assert len(axes) == 2 and len(axes[1].get_legend().get_texts()) == 2
    np.testing.assert_allclose(axes[1].collections[0].get_offsets()[:, 0], (Z @ A.T)[held.obs["batch"] == "batch0", 0])
    W = model.get_loadings().to_numpy()
    ax = plotting.loadings_before_after(W, W @ A.T, model.var_names, genes=["gene0", "gene3"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gene0", "gene3"]
    with pytest.raises(InvalidArgumentError, match="not found"):
        plotting.loadings_before_after(W, W, model.var_names, genes=["nope"])
    ax = plotting.lpd_differences(rep.per_cell, threshold=1e-9)
    assert ax.get_xscale() == "log" and len(ax.collections) == len(rep.per_cell)
    ax = plotting.output_changes(rep.outputs)
    assert len(ax.get_yticklabels()) == len(rep.outputs)
    with pytest.raises(InvalidArgumentError, match="two panels"):
        plotting.latent_before_after(Z, Z, axes=plotting.new_axes(ncols=3)[0])


def test_verify_an_already_reparameterized_model(poisson_fit):
    model, held = poisson_fit
    rotated = inv.reparameterize(model, inv.random_orthogonal(2, 11))
    rep = inv.verify(rotated, held[:60], n_samples=60, prior_controls=False, elbo_refit_steps=5, n_elbo_samples=8)
    assert rep.passed, rep.summary()
    assert _value(rep, "fitted", "rotation", "latent_map_max_abs_error").value < 1e-9
