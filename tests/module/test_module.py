"""The Pyro model/guide and the direct loss agree, and Pyro's global state is never used."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch
from scipy.special import gammaln

import countvae as cv
from countvae.module import CountVAEModule, minibatch_loss


@pytest.mark.parametrize(
    ("likelihood", "dispersion"), [("poisson", "gene"), ("nb", "gene"), ("zinb", "gene"), ("nb", "gene-batch")]
)
@pytest.mark.parametrize("decoder", ["linear", "mlp"])
@pytest.mark.parametrize("prior", ["normal", "laplace", "diagonal"])
def test_direct_loss_equals_pyro_trace(likelihood, dispersion, decoder, prior):
    adata = cv.data.simulate(n_cells=64, n_genes=30, n_latent=3, n_batches=2, seed=1)
    x = torch.tensor(adata.X.toarray(), dtype=torch.float64)
    b = torch.tensor(adata.obs["batch"].cat.codes.to_numpy(), dtype=torch.long)
    torch.manual_seed(0)
    module = CountVAEModule(30, 3, 2, likelihood, decoder, n_hidden=16, prior=prior, dispersion=dispersion)
    module = module.double().eval()
    if dispersion == "gene-batch":  # distinct thetas per batch, so a batch reading another's row shows
        torch.nn.init.normal_(module.likelihood.log_theta)
    values, grads = [], []
    for engine in ("direct", "pyro"):
        module.zero_grad()
        torch.manual_seed(42)  # same draw of z in both engines
        loss = minibatch_loss(module, x, b, engine=engine, cell_index=torch.arange(64), n_total=640)
        loss.backward()
        values.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None]))
    torch.testing.assert_close(values[0], values[1], rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-8, atol=1e-8)


def test_model_has_named_sites_and_cell_plate():
    module = CountVAEModule(10, 2, 0, "nb", "linear")
    x = torch.poisson(torch.ones(5, 10) * 3) + 1
    b = torch.zeros(5, dtype=torch.long)
    trace = pyro.poutine.trace(module.model).get_trace(x, b, cell_index=torch.arange(5), n_total=50)
    trace.compute_log_prob()
    assert {"z", "x", "cells"} <= set(trace.nodes)
    assert trace.nodes["x"]["is_observed"]
    assert trace.nodes["z"]["scale"] == pytest.approx(10.0)  # minibatch of 5 out of 50 cells
    guide_trace = pyro.poutine.trace(module.guide).get_trace(x, b)
    assert guide_trace.nodes["z"]["fn"].event_shape == (2,)


def test_training_never_touches_the_global_param_store(small_adata):
    pyro.clear_param_store()
    cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(max_epochs=2, progress_bar=False, engine="pyro")
    assert len(pyro.get_param_store().keys()) == 0


@pytest.mark.parametrize("likelihood", ["poisson", "nb", "zinb"])
@pytest.mark.parametrize("decoder", ["linear", "mlp"])
@pytest.mark.parametrize("prior", ["normal", "laplace", "diagonal"])
def test_log_joint_is_the_log_density_of_the_pyro_models_sites(likelihood, decoder, prior):
    """``module.log_joint`` (used by every estimator) equals the model trace's per-cell log p(x|z) + log p(z)."""
    adata = cv.data.simulate(n_cells=40, n_genes=25, n_latent=2, n_batches=2, seed=4)
    x = torch.tensor(adata.X.toarray(), dtype=torch.float64)
    b = torch.tensor(adata.obs["batch"].cat.codes.to_numpy(), dtype=torch.long)
    torch.manual_seed(3)
    module = CountVAEModule(25, 2, 2, likelihood, decoder, n_hidden=8, prior=prior).double().eval()
    if prior == "diagonal":
        with torch.no_grad():
            module.prior.log_scale.copy_(torch.tensor([0.4, -0.3]))
    z = torch.randn(40, 2, dtype=torch.float64)
    trace = pyro.poutine.trace(pyro.poutine.condition(module.model, data={"z": z})).get_trace(x, b)
    trace.compute_log_prob()
    expected = trace.nodes["x"]["log_prob"] + trace.nodes["z"]["log_prob"]
    torch.testing.assert_close(module.log_joint(z, x, b), expected, rtol=1e-12, atol=1e-9)
    # batched over draws: (draws, cells, L) -> (draws, cells), each draw as its own trace
    zs = torch.randn(3, 40, 2, dtype=torch.float64)
    stacked = module.log_joint(zs, x, b)
    for s in range(3):
        torch.testing.assert_close(stacked[s], module.log_joint(zs[s], x, b), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("likelihood", ["poisson", "nb", "zinb"])
@pytest.mark.parametrize("dispersion", ["gene", "gene-batch"])
def test_count_constant_is_the_closed_form_and_passing_it_leaves_the_log_joint_unchanged(likelihood, dispersion):
    """The estimators compute the z-free terms once per cell; the log joint given them is the same number."""
    adata = cv.data.simulate(n_cells=30, n_genes=20, n_latent=2, n_batches=2, seed=6)
    x = torch.tensor(adata.X.toarray(), dtype=torch.float64)
    b = torch.tensor(adata.obs["batch"].cat.codes.to_numpy(), dtype=torch.long)
    torch.manual_seed(5)
    module = CountVAEModule(20, 2, 2, likelihood, "mlp", n_hidden=8, dispersion=dispersion).double().eval()
    constant = module.count_log_constant(x, b)
    expected = -gammaln(x.numpy() + 1.0).sum(1)
    if likelihood != "poisson":
        with torch.no_grad():  # distinct dispersions per gene (and batch), so a wrong gather shows
            module.likelihood.log_theta.copy_(torch.randn_like(module.likelihood.log_theta))
        constant = module.count_log_constant(x, b)
        rows = b.numpy() if dispersion == "gene-batch" else np.zeros(30, dtype=int)
        theta = np.exp(module.likelihood.log_theta.detach().numpy())[rows]
        expected = expected + (gammaln(x.numpy() + theta) - gammaln(theta)).sum(1)
    np.testing.assert_allclose(constant.detach().numpy(), expected, rtol=1e-12, atol=1e-9)
    # as the estimator passes it: the constants of all cells, gathered for the cells of a call
    cells = torch.tensor([3, 0, 17, 17, 29])
    z = torch.randn(4, cells.numel(), 2, dtype=torch.float64)
    given = module.log_joint(z, x[cells], b[cells], count_constant=constant[cells])
    torch.testing.assert_close(given, module.log_joint(z, x[cells], b[cells]), rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="one value per cell"):
        module.log_joint(z, x[cells], b[cells], count_constant=constant[:1])


@pytest.mark.parametrize(
    ("n_layers", "batch_norm", "likelihood"), [(1, True, "nb"), (2, True, "zinb"), (2, False, "nb")]
)
def test_mlp_log_rate_jacobian_is_the_autograd_jacobian(n_layers, batch_norm, likelihood):
    """The MLP decoder's closed-form Jacobian (used for the Gauss-Newton curvature) equals autograd's, with
    batch-norm running statistics away from (0, 1), ReLUs on both sides of 0 and a batch covariate."""
    torch.manual_seed(4)
    module = CountVAEModule(30, 3, 2, likelihood, "mlp", n_hidden=16, n_layers=n_layers, batch_norm=batch_norm)
    module = module.double().eval()
    if batch_norm:
        with torch.no_grad():
            for norm in module.decoder.hidden.norms:
                norm.running_mean.uniform_(-0.5, 0.5)
                norm.running_var.uniform_(0.3, 3.0)
                norm.weight.uniform_(0.5, 2.0)
                norm.bias.uniform_(-0.3, 0.3)
    z = torch.randn(7, 3, dtype=torch.float64)
    b = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    onehot = module.batch_onehot(b, z)
    out, jac = module.decoder.log_rate_jacobian(z, b, onehot)
    plain = module.decoder(z, b, onehot)
    torch.testing.assert_close(out.log_rate, plain.log_rate, rtol=0, atol=1e-12)
    if likelihood == "zinb":
        torch.testing.assert_close(out.gate_logits, plain.gate_logits, rtol=0, atol=1e-12)
    for cell in range(7):
        expected = torch.autograd.functional.jacobian(
            lambda point, cell=cell: module.decoder(point, b[cell : cell + 1], onehot[cell : cell + 1]).log_rate[0],
            z[cell : cell + 1],
        )[:, 0, :]  # (genes, L)
        torch.testing.assert_close(jac[cell], expected.T, rtol=1e-10, atol=1e-12)
    module.train()
    with pytest.raises(RuntimeError, match="evaluation mode"):
        module.decoder.log_rate_jacobian(z, b, onehot)


@pytest.mark.parametrize("likelihood", ["poisson", "nb"])
@pytest.mark.parametrize("decoder", ["linear", "mlp"])
def test_gauss_newton_curvature_against_autograd(likelihood, decoder):
    """``log_joint_neg_hessian`` is ``J^T diag(c) J + prior precision`` with ``J`` the autograd Jacobian of the
    log means, and for the linear decoder (concave log joint) minus the autograd Hessian of ``log_joint``."""
    adata = cv.data.simulate(n_cells=6, n_genes=20, n_latent=3, n_batches=2, seed=5)
    x = torch.tensor(adata.X.toarray(), dtype=torch.float64)
    b = torch.tensor(adata.obs["batch"].cat.codes.to_numpy(), dtype=torch.long)
    torch.manual_seed(2)
    module = CountVAEModule(20, 3, 2, likelihood, decoder, n_hidden=8).double().eval()
    z = torch.randn(6, 3, dtype=torch.float64)
    got = module.log_joint_neg_hessian(z, x, b)
    log_library = torch.log(x.sum(-1, keepdim=True))
    for cell in range(6):
        zc = z[cell : cell + 1]

        def log_mean(point, cell=cell):
            return module.decode(point, b[cell : cell + 1]).log_rate[0] + log_library[cell]

        jac = torch.autograd.functional.jacobian(log_mean, zc)[:, 0, :]  # (genes, L)
        c = module.likelihood.log_mean_curvature(x[cell : cell + 1], log_mean(zc).unsqueeze(0), b[cell : cell + 1])[0]
        expected = jac.T @ (c.unsqueeze(-1) * jac) + torch.eye(3, dtype=torch.float64)
        torch.testing.assert_close(got[cell], expected, rtol=1e-4, atol=1e-6)
        if decoder == "linear":
            hessian = torch.autograd.functional.hessian(
                lambda point, cell=cell: module.log_joint(point, x[cell : cell + 1], b[cell : cell + 1]).sum(), zc
            )[0, :, 0, :]
            torch.testing.assert_close(got[cell], -hessian, rtol=1e-4, atol=1e-6)
