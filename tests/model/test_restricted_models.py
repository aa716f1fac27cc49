"""Restricted models: priors on the loadings (horseshoe, gene programs) as Pyro global latents, their
symmetry declarations, and the numerical invariance evidence for them."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pyro
import pytest
import torch
from scipy import integrate
from scipy.stats import ortho_group

import countvae as cv
from countvae import invariance
from countvae.errors import InvalidArgumentError, InvalidDataError
from countvae.invariance.controls import loadings_preserve, model_preserves
from countvae.module import CountVAEModule, minibatch_loss
from countvae.module.loadings import HorseshoeLoadings, ProgramLoadings
from countvae.module.symmetry import intersect_symmetries


def _data(n_cells=64, n_genes=30, seed=1):
    adata = cv.data.simulate(n_cells=n_cells, n_genes=n_genes, n_latent=3, n_batches=2, seed=seed)
    x = torch.tensor(adata.X.toarray(), dtype=torch.float64)
    b = torch.tensor(adata.obs["batch"].cat.codes.to_numpy(), dtype=torch.long)
    return x, b


def _loadings_prior(kind: str, n_genes: int = 30, n_latent: int = 3):
    if kind == "horseshoe":
        return HorseshoeLoadings(n_genes, n_latent)
    membership = torch.zeros(n_genes, n_latent, dtype=torch.bool)
    for k in range(n_latent):
        membership[k * 10 : k * 10 + 12, k] = True
    return ProgramLoadings(membership)


def _module(kind: str, prior: str = "normal", likelihood: str = "nb") -> CountVAEModule:
    torch.manual_seed(0)
    return CountVAEModule(
        30, 3, 2, likelihood, "linear", n_hidden=16, prior=prior, loadings_prior=_loadings_prior(kind)
    ).double()


# ----- the Pyro model and the direct loss ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["horseshoe", "programs"])
@pytest.mark.parametrize("prior", ["normal", "laplace"])
@pytest.mark.parametrize("likelihood", ["poisson", "nb"])
def test_direct_loss_equals_pyro_trace_with_a_prior_on_the_loadings(kind, prior, likelihood):
    """Same value and gradients from Pyro's TraceMeanField_ELBO and the direct loss, global sites included."""
    x, b = _data()
    module = _module(kind, prior, likelihood).eval()
    values, grads = [], []
    for engine in ("direct", "pyro"):
        module.zero_grad()
        torch.manual_seed(42)  # the same draws of the global sites and of z in both engines
        loss = minibatch_loss(module, x, b, kl_weight=0.7, engine=engine, cell_index=torch.arange(64), n_total=640)
        loss.backward()
        values.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None]))
    assert len(grads[0]) == len(grads[1]) == sum(p.numel() for p in module.parameters())
    torch.testing.assert_close(values[0], values[1], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("kind", ["horseshoe", "programs"])
def test_global_kl_enters_once_per_data_set(kind):
    """loss(n) = per-cell part + KL / n with KL the global sites' divergence: recovered from two data-set sizes."""
    x, b = _data()
    module = _module(kind).eval()
    losses = {}
    for n in (640, 6400):
        torch.manual_seed(3)
        with torch.no_grad():
            losses[n] = float(minibatch_loss(module, x, b, cell_index=torch.arange(64), n_total=n))
    torch.manual_seed(3)
    with torch.no_grad():
        _, kl = module.sample_loadings()  # the first draws of the loss: the global sites
    implied = (losses[640] - losses[6400]) / (1 / 640 - 1 / 6400)
    assert implied == pytest.approx(float(kl), rel=1e-8)
    assert abs(float(kl)) > 1.0  # not trivially zero


def test_global_sites_sit_outside_the_cell_plate():
    x, b = _data()
    module = _module("horseshoe")
    trace = pyro.poutine.trace(module.model).get_trace(x, b, cell_index=torch.arange(64), n_total=640)
    assert trace.nodes["z"]["scale"] == pytest.approx(10.0)
    for site in ("W", "loadings_tau", "loadings_slab", "loadings_local"):
        assert trace.nodes[site]["scale"] == 1.0
        assert trace.nodes[site]["cond_indep_stack"] == ()
    guide = pyro.poutine.trace(module.guide).get_trace(x, b)
    assert [n for n, s in guide.nodes.items() if s["type"] == "sample" and n != "cells"] == [
        "loadings_tau",
        "loadings_slab",
        "loadings_local",
        "W",
        "z",
    ]


@pytest.mark.parametrize("kind", ["horseshoe", "programs"])
def test_log_joint_is_the_models_cell_sites_at_the_posterior_mean_loadings(kind):
    x, b = _data()
    module = _module(kind).eval()
    z = torch.randn(64, 3, dtype=torch.float64)
    data = {"z": z, "W": module.decoder.weight.detach()}
    trace = pyro.poutine.trace(pyro.poutine.condition(module.model, data=data)).get_trace(x, b)
    trace.compute_log_prob()
    expected = trace.nodes["x"]["log_prob"] + trace.nodes["z"]["log_prob"]
    torch.testing.assert_close(module.log_joint(z, x, b), expected, rtol=1e-12, atol=1e-9)


# ----- the horseshoe's marginal density ------------------------------------------------------------------
def _quad_log_marginal(w: float, tau: float, slab: float) -> float:
    def integrand(lam):
        sd = tau * lam / math.sqrt(1.0 + (tau * lam) ** 2 / slab)
        return math.exp(-0.5 * (w / sd) ** 2) / (math.sqrt(2 * math.pi) * sd) * 2.0 / (math.pi * (1.0 + lam**2))

    # split at the scale where the Gaussian factor switches on, so that quad sees both regimes
    knee = abs(w) / tau
    parts = [
        integrate.quad(integrand, lo, hi, limit=400, epsabs=0, epsrel=1e-12)[0]
        for lo, hi in ((0, knee / 10), (knee / 10, knee * 10), (knee * 10, np.inf))
    ]
    return math.log(sum(parts))


@pytest.mark.parametrize("w", [1e-4, 0.02, 0.3, 1.5, 8.0, -0.7])
@pytest.mark.parametrize(("tau", "slab"), [(0.1, 4.0), (1.0, 0.5), (0.02, 100.0)])
def test_horseshoe_marginal_density_matches_adaptive_quadrature(w, tau, slab):
    prior = HorseshoeLoadings(1, 1)
    with torch.no_grad():
        prior.tau_loc.fill_(math.log(tau))
        prior.slab_loc.fill_(math.log(slab))
    ours = float(prior.log_density(torch.tensor([[w]], dtype=torch.float64)))
    assert ours == pytest.approx(_quad_log_marginal(w, tau, slab), abs=1e-7)


def test_horseshoe_marginal_density_within_the_published_bounds():
    """Carvalho, Polson and Scott (2010), Thm 1: K/2 log(1 + 4/w^2) < p(w) < K log(1 + 2/w^2), tau = 1, no slab."""
    prior = HorseshoeLoadings(1, 1)
    with torch.no_grad():
        prior.tau_loc.fill_(0.0)
        prior.slab_loc.fill_(math.log(1e12))
    K = 1.0 / math.sqrt(2 * math.pi**3)
    for w in (0.01, 0.1, 1.0, 3.0, 10.0):
        p = math.exp(float(prior.log_density(torch.tensor([[w]], dtype=torch.float64))))
        assert K / 2 * math.log(1 + 4 / w**2) < p < K * math.log(1 + 2 / w**2)


# ----- symmetry declarations ----------------------------------------------------------------------------
def test_symmetry_groups_intersect_to_the_smallest():
    assert intersect_symmetries("orthogonal", "signed permutation") == "signed permutation"
    assert intersect_symmetries("signed permutation", "sign flip") == "sign flip"
    assert intersect_symmetries("orthogonal") == "orthogonal"
    with pytest.raises(InvalidArgumentError, match="Unknown symmetry"):
        intersect_symmetries("rotation")
    assert _module("horseshoe").symmetry == "signed permutation"
    assert _module("programs", prior="laplace").symmetry == "sign flip"


def _density_kept(prior, A, seed=0) -> bool:
    """Brute force: does log p(W A^-1) equal log p(W) for random W?"""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        W = torch.as_tensor(rng.normal(0, 0.3, (prior.n_genes, prior.n_latent)))
        mapped = W @ torch.as_tensor(np.linalg.inv(A))
        if abs(float(prior.log_density(W)) - float(prior.log_density(mapped))) > 1e-8:
            return False
    return True


@pytest.mark.parametrize("kind", ["horseshoe", "programs"])
def test_declared_invariance_matches_the_density_itself(kind):
    """``loadings_preserve`` (the rule) agrees with evaluating the prior density before and after the map."""
    prior = _loadings_prior(kind).double()
    maps = {
        "rotation": ortho_group.rvs(3, random_state=1),
        "sign flip": np.diag([1.0, -1.0, 1.0]),
        "permutation": np.eye(3)[[1, 2, 0]],
        "signed permutation": np.diag([-1.0, 1.0, -1.0]) @ np.eye(3)[[2, 0, 1]],
    }
    expected = {
        "horseshoe": {"rotation": False, "sign flip": True, "permutation": True, "signed permutation": True},
        "programs": {"rotation": False, "sign flip": True, "permutation": False, "signed permutation": False},
    }[kind]
    for name, A in maps.items():
        assert loadings_preserve(prior, A) is expected[name], name
        assert _density_kept(prior, A) is expected[name], name


def test_programs_with_the_same_gene_set_keep_every_rotation_between_them():
    """Two columns with one gene set have the same prior, so any rotation of the two is kept (and detected)."""
    rotation = ortho_group.rvs(2, random_state=0)
    membership = torch.zeros(20, 2, dtype=torch.bool)
    membership[:8, :] = True
    same = ProgramLoadings(membership).double()
    assert loadings_preserve(same, rotation) and _density_kept(same, rotation)
    membership[7, 1] = False  # one gene apart
    different = ProgramLoadings(membership).double()
    assert not loadings_preserve(different, rotation) and not _density_kept(different, rotation)
    module = CountVAEModule(20, 2, 0, "nb", "linear", loadings_prior=different)
    assert model_preserves(module, np.diag([-1.0, 1.0])) and not model_preserves(module, rotation)


# ----- the user class -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sparse_data():
    # loading_scale 0.5 keeps every count far below 2**24 (at the default scale the Laplace tails reach 3e7)
    adata = cv.data.simulate(
        n_cells=400, n_genes=40, n_latent=2, seed=0, sources="laplace", loading_sparsity=0.6, loading_scale=0.5
    )
    cv.CountVAE.setup_anndata(adata)
    return adata


@pytest.fixture(scope="module")
def programs(sparse_data):
    return {"first": [f"gene{i}" for i in range(0, 20)], "second": [f"gene{i}" for i in range(15, 40)]}


def test_gene_programs_name_the_dimensions_and_loadings_have_a_posterior(sparse_data, programs, tmp_path):
    model = cv.CountVAE(sparse_data, decoder="linear", gene_programs=programs, n_hidden=16)
    assert model.n_latent == 2 and model.settings.loadings_prior == "programs"
    model.train(max_epochs=3, progress_bar=False)
    mean, sd = model.get_loadings(return_uncertainty=True)
    assert list(mean.columns) == ["first", "second"] and (sd.to_numpy() > 0).all()
    table = model.loadings_posterior(credible_mass=0.9)
    assert len(table) == 80 and table["in_program"].sum() == 45
    row = table.iloc[0]
    assert row["upper"] - row["mean"] == pytest.approx(1.6448536 * row["sd"], rel=1e-6)
    model.save(tmp_path / "m")
    loaded = cv.CountVAE.load(tmp_path / "m", adata=sparse_data)
    assert loaded.settings.gene_programs == programs
    np.testing.assert_array_equal(loaded.get_loadings(return_uncertainty=True)[1], sd)
    np.testing.assert_array_equal(loaded.get_latent_representation(), model.get_latent_representation())


def test_gene_programs_from_a_gmt_file(sparse_data, tmp_path):
    gmt = tmp_path / "programs.gmt"
    gmt.write_text("alpha\tfirst set\tgene1\tgene2\tgene3\n\nbeta\t\tgene4\tgene5\tgene5\n")
    assert cv.data.read_gmt(gmt) == {"alpha": ["gene1", "gene2", "gene3"], "beta": ["gene4", "gene5"]}
    model = cv.CountVAE(sparse_data, decoder="linear", gene_programs=str(gmt))
    assert model.latent_names == ["alpha", "beta"]


def test_gene_program_errors_name_what_is_wrong(sparse_data, tmp_path):
    with pytest.raises(InvalidDataError, match="not in the data.*first: CD3D, NOPE"):
        cv.CountVAE(
            sparse_data, decoder="linear", gene_programs={"first": ["CD3D", "NOPE", "gene1"], "b": ["gene2", "gene3"]}
        )
    with pytest.raises(InvalidDataError, match=r"fewer than 2 genes in the data: lonely \(1\)"):
        cv.CountVAE(sparse_data, decoder="linear", gene_programs={"lonely": ["gene1"], "b": ["gene2", "gene3"]})
    kept = cv.data.check_gene_programs({"a": ["CD3D", "gene1", "gene2"]}, sparse_data.var_names, unknown_genes="drop")
    assert kept == {"a": ["gene1", "gene2"]}
    with pytest.raises(InvalidDataError, match="fewer than 2"):
        cv.data.check_gene_programs({"a": ["CD3D", "gene1"]}, sparse_data.var_names, unknown_genes="drop")
    with pytest.raises(InvalidArgumentError, match="set n_latent=2"):
        cv.CountVAE(
            sparse_data, n_latent=3, decoder="linear", gene_programs={"a": ["gene1", "gene2"], "b": ["gene3", "gene4"]}
        )
    with pytest.raises(InvalidArgumentError, match="use decoder='linear'"):
        cv.CountVAE(sparse_data, loadings_prior="horseshoe")
    with pytest.raises(InvalidArgumentError, match="needs gene_programs"):
        cv.CountVAE(sparse_data, decoder="linear", loadings_prior="programs")
    bad = tmp_path / "bad.gmt"
    bad.write_text("empty\tno genes here\n")
    with pytest.raises(InvalidDataError, match="line 1: gene set 'empty' lists no genes"):
        cv.data.read_gmt(bad)
    # Latin-1 text (some tools write it) and a folder were a raw UnicodeDecodeError and "does not exist"
    bad.write_bytes(b"A\tdesc\tgene0\tg\xe8ne1\n")
    with pytest.raises(InvalidDataError, match=r"is not UTF-8 text \(byte 14.*save it as UTF-8"):
        cv.data.read_gmt(bad)
    with pytest.raises(InvalidDataError, match="is not a file"):
        cv.data.read_gmt(tmp_path)
    # a byte-order mark is not part of the first program's name
    bad.write_bytes("\ufeffA\tdesc\tgene1\tgene2\n".encode())
    assert list(cv.data.read_gmt(bad)) == ["A"]


def test_point_estimated_loadings_have_no_posterior(trained_linear):
    with pytest.raises(InvalidArgumentError, match="point estimates"):
        trained_linear.get_loadings(return_uncertainty=True)


def test_simulate_defaults_are_unchanged_and_sparsity_zeroes_loadings():
    adata = cv.data.simulate(n_cells=200, n_genes=30, n_latent=3, seed=7, sources="laplace", n_batches=2)
    digest = hashlib.sha256()
    for array in (adata.X.toarray(), np.asarray(adata.uns["simulation"]["W"]), adata.obsm["z_true"]):
        digest.update(array.tobytes())
    # computed on main before loading_sparsity existed
    assert digest.hexdigest() == "61ce388551cbf32103647dfd7e8c0674772f737e75b6daa9980897853a16e295"
    sparse = cv.data.simulate(n_cells=200, n_genes=30, n_latent=3, seed=7, sources="laplace", loading_sparsity=0.8)
    W = np.asarray(sparse.uns["simulation"]["W"])
    assert 0.6 < (W == 0).mean() < 0.95 and ((W != 0).sum(0) >= 3).all()
    programs = cv.data.true_programs(sparse)
    assert [len(g) for g in programs.values()] == list((W != 0).sum(0))
    with pytest.raises(InvalidArgumentError, match="decoder='linear'"):
        cv.data.simulate(n_cells=50, n_genes=20, decoder="mlp", loading_sparsity=0.5)


def test_simulate_with_given_loadings_uses_them_and_keeps_every_earlier_draw():
    drawn = cv.data.simulate(n_cells=200, n_genes=30, n_latent=3, seed=7, sources="laplace")
    W = np.zeros((30, 3))
    W[:10, 0], W[10:20, 1], W[20:, 2] = 0.5, -0.5, 0.5
    given = cv.data.simulate(n_cells=200, n_genes=30, n_latent=3, seed=7, sources="laplace", loadings=W)
    np.testing.assert_array_equal(given.uns["simulation"]["W"], W)
    np.testing.assert_array_equal(given.obsm["z_true"], drawn.obsm["z_true"])
    np.testing.assert_array_equal(given.uns["simulation"]["b"], drawn.uns["simulation"]["b"])
    # the counts follow the given loadings: each block of genes rises with its own source
    x = np.log1p(given.X.toarray())
    z = given.obsm["z_true"]
    block_means = np.column_stack([x[:, :10].mean(1), x[:, 10:20].mean(1), x[:, 20:].mean(1)])
    correlation = np.corrcoef(block_means.T, z.T)[:3, 3:]
    assert (np.abs(np.diag(correlation)) > 0.5).all() and (
        np.abs(correlation - np.diag(np.diag(correlation))) < 0.2
    ).all()
    assert np.corrcoef(block_means[:, 1], z[:, 1])[0, 1] < 0
    for bad, message in [
        ({"loadings": W[:, :2]}, "shape"),
        ({"loadings": W, "loading_sparsity": 0.5}, "not both"),
        ({"loadings": W, "decoder": "mlp"}, "decoder='linear'"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            cv.data.simulate(n_cells=50, n_genes=30, n_latent=3, **bad)


# ----- numerical confirmation of the declarations --------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "kept", "changed"),
    [
        ({"loadings_prior": "horseshoe"}, {"reflection", "permutation", "signed permutation"}, {"rotation"}),
        ({"gene_programs": "programs"}, {"reflection"}, {"rotation", "permutation", "signed permutation"}),
    ],
)
def test_verify_confirms_the_declared_symmetry(sparse_data, programs, kwargs, kept, changed):
    if "gene_programs" in kwargs:
        kwargs = {"gene_programs": programs}
    model = cv.CountVAE(sparse_data[:300].copy(), decoder="linear", n_latent=2, n_hidden=16, **kwargs)
    model.train(max_epochs=5, progress_bar=False)
    report = invariance.verify(
        model,
        sparse_data[300:].copy(),
        n_samples=40,
        prior_controls=False,
        controls=False,
        quadrature=False,
        elbo_refit_steps=0,
        n_elbo_samples=4,
    )
    rows = report.to_frame()
    fitted = rows[rows["variant"] == "fitted"]
    for name in kept:
        assert report.settings["expected_invariant"][name], name
        row = fitted[(fitted["transform"] == name) & (fitted["check"] == "joint_abs_change")].iloc[0]
        assert row["ok"] and row["value"] <= row["threshold"]
    for name in changed:
        assert not report.settings["expected_invariant"][name], name
        row = fitted[(fitted["transform"] == name) & (fitted["check"] == "joint_change_over_mc_error")].iloc[0]
        assert row["ok"] and row["value"] > row["threshold"]
        prior_row = fitted[(fitted["transform"] == name) & (fitted["check"] == "loadings_log_prior_abs_diff")]
        assert prior_row["value"].iloc[0] > 1e-3  # a real change of log p(W), not rounding
    assert report.variants["fitted"]["symmetry"] == model.module.symmetry
