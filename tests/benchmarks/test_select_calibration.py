"""benchmarks/select_calibration.py: the true latent size its calibration scores against, and its rules.

The calibration's claim that ``n_sources`` latent dimensions suffice for an MLP candidate rests on the candidate
family holding the simulated truth exactly. The test builds that member by hand: a CountVAE MLP decoder with
128 ReLU units whose weights come from the simulator's 32 leaky-ReLU units and batch offsets, and compares its
decoded shares with the simulator's true means. It would fail if the simulator's formula, the decoder's
structure (where the batch enters, the activation, the softmax) or the construction were wrong.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from bench_modules import benchmark_module

import countvae as cv
from countvae.module.decoders import MLPDecoder


@pytest.fixture(scope="module")
def calibration():
    return benchmark_module("select_calibration")


def _true_log_shares(adata) -> np.ndarray:
    """Each cell's true expected share of its library per gene, logged, from the stored simulation parameters."""
    p = adata.uns["simulation"]
    z = adata.obsm["z_true"]
    pre = z @ p["V1"].T + p["a1"]
    hidden = np.where(pre > 0, pre, p["leaky_slope"] * pre)
    logits = p["b"] + hidden @ p["V2"].T + p["batch_offset"][adata.obs["batch"].cat.codes.to_numpy()]
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def _decoder_holding_the_truth(adata, n_hidden: int = 128) -> MLPDecoder:
    """A CountVAE MLP decoder whose weights reproduce the simulated truth (see the module docstring)."""
    p = adata.uns["simulation"]
    V1, a1, V2, slope = (np.asarray(p[k], dtype=np.float64) for k in ("V1", "a1", "V2", "leaky_slope"))
    offsets = np.asarray(p["batch_offset"])
    n_true, n_latent = V1.shape
    n_batches = offsets.shape[0]
    n_covariates = n_batches if n_batches > 1 else 0  # as CountVAE builds it: no one-hot for a single batch
    decoder = MLPDecoder(n_latent, adata.n_vars, n_batches=n_covariates, n_hidden=n_hidden).double().eval()
    linear, norm = decoder.hidden.linears[0], decoder.hidden.norms[0]
    w_in = np.zeros((n_hidden, n_latent))
    b_in = np.zeros(n_hidden)
    w_batch = np.zeros((n_hidden, n_batches))
    w_out = np.zeros((adata.n_vars, n_hidden))
    # leaky_relu(x) = relu(x) - slope * relu(-x): two ReLU units per true unit
    w_in[:n_true], b_in[:n_true], w_out[:, :n_true] = V1, a1, V2
    w_in[n_true : 2 * n_true], b_in[n_true : 2 * n_true] = -V1, -a1
    w_out[:, n_true : 2 * n_true] = -slope * V2
    # one unit per batch after the first: 1 in that batch, 0 elsewhere, carrying the batch's gene offsets
    for s in range(1, n_batches):
        unit = 2 * n_true + s - 1
        w_batch[unit, s] = 1.0
        w_out[:, unit] = offsets[s] - offsets[0]
    with torch.no_grad():
        linear.data.weight.copy_(torch.from_numpy(w_in))
        linear.data.bias.copy_(torch.from_numpy(b_in))
        if linear.covariate is not None:
            linear.covariate.weight.copy_(torch.from_numpy(w_batch))
        norm.running_mean.zero_()
        norm.running_var.fill_(1.0 - norm.eps)  # batch norm becomes the identity
        norm.weight.fill_(1.0)
        norm.bias.zero_()
        decoder.scale.weight.copy_(torch.from_numpy(w_out))
        decoder.scale.bias.copy_(torch.from_numpy(np.asarray(p["b"]) + offsets[0]))
    return decoder


@pytest.mark.parametrize("n_batches", [1, 2, 3])
def test_the_default_mlp_holds_the_simulated_truth_at_the_true_size(n_batches):
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=5, decoder="mlp", n_batches=n_batches, seed=3)
    decoder = _decoder_holding_the_truth(adata)
    z = torch.from_numpy(adata.obsm["z_true"])
    codes = torch.from_numpy(adata.obs["batch"].cat.codes.to_numpy().astype(np.int64))
    onehot = torch.nn.functional.one_hot(codes, n_batches).double() if n_batches > 1 else None
    with torch.no_grad():
        decoded = decoder(z, codes, onehot).log_rate.numpy()
    truth = _true_log_shares(adata)
    np.testing.assert_allclose(decoded, truth, atol=1e-9)
    # the check can fail: without the mirrored units the decoder is a ReLU network, not the leaky truth
    with torch.no_grad():
        decoder.scale.weight[:, 32:64] = 0.0
        broken = decoder(z, codes, onehot).log_rate.numpy()
    assert np.abs(broken - truth).max() > 0.05


def test_true_size_and_grid(calibration):
    assert calibration.true_size(5, "mlp") == 5
    assert calibration.true_size(5, "linear") == 6  # the library share needs one more dimension
    assert calibration.grid(3) == [1, 2, 3, 4, 5]
    assert calibration.grid(9) == [7, 8, 9, 10, 11]


def _replicate_rows(rows: list[tuple]) -> pd.DataFrame:
    columns = ["n_latent", "recommended", "reliable", "stable", "diff_high", "margin", "training_elbo"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["seed0_heldout_lpd"] = frame["training_elbo"]
    frame["lpd_per_cell"] = frame["training_elbo"]
    return frame


def test_rules_read_the_stored_rows(calibration):
    group = _replicate_rows(
        [
            (2, False, True, True, -3.0, 0.5, -20.0),
            (3, True, True, True, 0.1, 0.5, -10.0),
            (4, False, True, True, 0.2, 0.5, -9.0),
            (5, False, True, False, 0.0, 0.5, -8.5),
        ]
    )
    choices = calibration.rule_choices(group)
    assert choices["compare_models"] == 3
    assert choices["one_interval"] == 3
    assert choices["training_elbo"] == choices["heldout_argmax"] == choices["single_seed_heldout"] == 5
    undetermined = group.assign(recommended=False, stable=False)
    assert np.isnan(calibration.rule_choices(undetermined)["compare_models"])
    assert np.isnan(calibration.rule_choices(undetermined)["one_interval"])
