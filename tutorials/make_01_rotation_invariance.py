"""Write tutorials/01_rotation_invariance.ipynb (outputs cleared); run from the repository root."""

from __future__ import annotations

from _notebook import write

CELLS = [
    (
        "md",
        """# 01 · Rotation invariance: which outputs of a count VAE the data determine

A count VAE draws a latent vector `z ~ N(0, I)` for each cell and gives every gene a count
distribution whose log mean depends on `z`. For the log-linear Poisson model used here,

`log mu_g = log l + b_g + c_{donor, g} + W_g z`,

and for any orthogonal matrix `Q` the pair `z' = Q z`, `W' = W Q^T` gives every cell exactly the
same distribution of counts: `Q z` is again `N(0, I)` and `W' z' = W z`. So the data cannot tell
the two models apart, and **anything that changes between them is a choice of coordinates, not a
finding**.

This notebook fits such a model to real PBMC counts, rotates it with
`countvae.invariance.reparameterize`, and measures:

1. the held-out log predictive density and the decoded expression do not change (to rounding);
2. the coordinates, the per-dimension loadings and the per-dimension marker correlations do;
3. controls that *should* change `p(x)` do: a non-orthogonal map, and a prior that is not
   rotation-invariant;
4. `countvae.invariance.verify` runs all of this as one report.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

import countvae as cv
from countvae import invariance as inv
from countvae import plotting

torch.set_num_threads(1)
pd.set_option("display.width", 160)""",
    ),
    (
        "md",
        """## 1. Data: control PBMCs from five donors (Kang et al. 2018)

We take 3,000 random cells of the `kang2018` dataset (raw UMI counts, four cell types, five
donors) and 300 genes with the largest variance-to-mean ratio of counts per 10,000 among genes
detected in at least 5% of cells, plus ten well-known markers. Donors enter the model as batches
(a per-donor offset on each gene's log mean), which the rotation leaves untouched.""",
    ),
    (
        "code",
        """full = cv.data.load_dataset("kang2018")
rng = np.random.default_rng(0)
adata = full[np.sort(rng.choice(full.n_obs, 3000, replace=False))].copy()

counts = adata.X
per_10k = counts.multiply(1e4 / np.asarray(counts.sum(1))).tocsr()
mean = np.asarray(per_10k.mean(0)).ravel()
variance = np.asarray(per_10k.multiply(per_10k).mean(0)).ravel() - mean**2
detected = np.asarray((counts > 0).mean(0)).ravel()
fano = np.where(detected >= 0.05, variance / np.maximum(mean, 1e-12), -np.inf)
markers = ["LYZ", "CD14", "S100A9", "FCN1", "MS4A1", "CD79A", "CD3D", "IL7R", "GNLY", "NKG7"]
genes = list(adata.var_names[np.argsort(-fano)[:300]])
genes += [m for m in markers if m not in genes]
adata = adata[:, genes].copy()

cv.CountVAE.setup_anndata(adata, batch_key="batch")
fit_idx, held_idx = cv.data.split_indices(adata.n_obs, 0.9, seed=0)
fit, held = adata[fit_idx].copy(), adata[held_idx].copy()
print(adata.shape, "| fit:", fit.n_obs, "cells | held out:", held.n_obs, "cells")
print(held.obs["cell_type"].value_counts().to_string())""",
    ),
    (
        "md",
        """## 2. Fit the two-dimensional Poisson log-linear model

`decoder="linear"` makes `log mu` exactly linear in `z`; the encoder (the amortized guide) is a
small neural network. The held-out cells are never seen in training.""",
    ),
    (
        "code",
        """model = cv.CountVAE(fit, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=64)
model.train(max_epochs=60, lr=3e-3, early_stopping=False, progress_bar=False, seed=0)
print(model)
print("final training loss (negative ELBO per cell):", round(float(model.history["loss_train"].iloc[-1]), 1))""",
    ),
    (
        "md",
        """## 3. Rotate it

`reparameterize` returns a new fitted model: the decoder weight becomes `W Q^T`, the guide is
pushed forward to `N(Q mu, Q diag(sigma^2) Q^T)`, everything else (gene baselines, donor offsets,
library handling) is copied unchanged, and the original model is not modified. Its posterior
means are exactly `Z Q^T`.""",
    ),
    (
        "code",
        """Q = inv.random_rotation(2, seed=0)
print(f"rotation angle: {np.degrees(np.arctan2(Q[1, 0], Q[0, 0])):.1f} degrees")
rotated = inv.reparameterize(model, Q)

Z = model.get_latent_representation(held)
Z_rot = rotated.get_latent_representation(held)
print("max |Z_rot - Z Q^T| =", np.abs(Z_rot - Z @ Q.T).max())

fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.8))
plotting.latent_before_after(Z, Z_rot, labels=held.obs["cell_type"], titles=("fitted model", "rotated model"), axes=axes)
plt.tight_layout()""",
    ),
    (
        "md",
        """**The figure** shows the held-out cells' posterior means in the coordinates of the fitted
model (left) and of the rotated model (right). The cloud is the same up to a turn: every distance
between cells and every neighbourhood is unchanged. What changes is which cell types line up with
`z0` and `z1`; nothing in the data prefers either picture.

## 4. Held-out log predictive density and decoded expression: unchanged

`get_log_predictive_density` estimates each cell's `log p(x)` by importance sampling. Its default
(`method="mixture"`) fits a proposal to each cell and is the accurate one; here `method="guide"`
uses the guide as the only proposal because it makes the comparison exact: it draws its base noise from a generator seeded with `seed` in a fixed order,
so with the same seed the rotated model's draws are exactly `Q z`: every importance weight is the
same, and so is the estimate, up to floating-point rounding (**common random numbers**). With
different seeds the two estimates differ only by Monte Carlo noise. For the linear decoder and
two latent dimensions, `quadrature_log_marginal` computes `log p(x)` exactly (adaptive
Gauss-Hermite quadrature, independent of the guide), in float64.""",
    ),
    (
        "code",
        """model64 = inv.copy_model(model, torch.float64)  # evaluate in float64 so that rounding is ~1e-13
rotated64 = inv.reparameterize(model64, Q)
lpd = model64.get_log_predictive_density(held, n_samples=300, seed=0, method="guide")
lpd_rot = rotated64.get_log_predictive_density(held, n_samples=300, seed=0, method="guide")
lpd_rot_other_seed = rotated64.get_log_predictive_density(held, n_samples=300, seed=1, method="guide")
exact = inv.quadrature_log_marginal(model64, held)
exact_rot = inv.quadrature_log_marginal(rotated64, held)

diff_indep = lpd_rot_other_seed.lpd - lpd.lpd
se_indep = diff_indep.std() / np.sqrt(len(held))
summary = pd.Series(
    {
        "mean held-out log p(x) per cell (nats)": lpd.lpd.mean(),
        "same noise: max |difference| (nats)": np.abs(lpd_rot.lpd - lpd.lpd).max(),
        "other noise: mean difference (nats)": diff_indep.mean(),
        "other noise: mean difference / its standard error": diff_indep.mean() / se_indep,
        "exact (quadrature): max |difference| (nats)": np.abs(exact_rot - exact).max(),
        "importance sampling - exact, median over cells (nats)": np.median(lpd.lpd - exact),
    }
)
print(summary.to_string())

expr = model.get_normalized_expression(held, return_numpy=True)
expr_rot = rotated.get_normalized_expression(held, return_numpy=True)
print("decoded expression, max relative difference:", (np.abs(expr_rot - expr) / expr).max())""",
    ),
    (
        "md",
        """With the same noise the difference is a rounding error (around 1e-13 nats, for values around
-360 nats), and the exact values agree to the same level. With independent noise the mean
difference is about one standard error or less: Monte Carlo noise. The decoded expression
agrees to float32 rounding (the fitted model is float32). The last line of the table is a
reminder that the importance-sampling estimate itself has an error against the exact value
(the guide is an imperfect proposal); that error is the same for both models.

## 5. Loadings and marker correlations: changed

The loadings `W` (genes x 2) become `W Q^T`, and each latent dimension's correlation with a
marker gene mixes in the same way. Reading "`z0` is the monocyte axis" off one of the two models
would be reading the choice of `Q`.""",
    ),
    (
        "code",
        """W = model.get_loadings()
W_rot = rotated.get_loadings()
fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
plotting.loadings_before_after(W.to_numpy(), W_rot.to_numpy(), W.index, genes=markers, dim=0, ax=axes[0])
plotting.loadings_before_after(W.to_numpy(), W_rot.to_numpy(), W.index, genes=markers, dim=1, ax=axes[1])
plt.tight_layout()

log_expr = np.log1p(held[:, markers].X.toarray() / np.asarray(held.X.sum(1)) * 1e4)


def marker_correlations(latent):
    return pd.DataFrame(
        [[np.corrcoef(latent[:, k], log_expr[:, j])[0, 1] for k in range(2)] for j in range(len(markers))],
        index=markers,
        columns=["z0", "z1"],
    )


table = pd.concat({"fitted": marker_correlations(Z), "rotated": marker_correlations(Z_rot)}, axis=1)
print(table.round(2).to_string())
gram, gram_rot = W.to_numpy() @ W.to_numpy().T, W_rot.to_numpy() @ W_rot.to_numpy().T
print("W W^T unchanged: max |difference| =", np.abs(gram_rot - gram).max())""",
    ),
    (
        "md",
        """**The bars** compare each marker's loading on one latent dimension in the fitted (blue) and the
rotated model (orange); the table does the same for the correlation of each dimension with the
marker's log-normalized expression. Both change, sometimes in sign. What does not change is the
Gram matrix `W W^T` (the last line), i.e. how genes co-vary through the latent space: that is a
quantity the data determine.

## 6. Controls: what *does* change `p(x)`

The invariance comes from the prior, not from the decoder. Two controls show it:

* a **non-orthogonal map** `A` (here axis scaling by 2 and 1/2), with the decoder compensated by
  `A^{-1}` exactly as before, so every cell's decoded mean is unchanged: but `A z` is no longer
  `N(0, I)`, so `p(x)` changes;
* a model whose **prior is not rotation-invariant**: the same networks with a Laplace prior (its
  symmetries are only signed permutations). A rotation changes its `p(x)`, a signed permutation
  does not.""",
    ),
    (
        "code",
        """A = inv.default_scaling(2, 2.0)
scaled = inv.reparameterize(model64, A, check=False)
lpd_scaled = scaled.get_log_predictive_density(held, n_samples=300, seed=0, method="guide")
expr_scaled = scaled.get_normalized_expression(held, return_numpy=True)
exact_scaled = inv.quadrature_log_marginal(scaled, held)
expr64 = model64.get_normalized_expression(held, return_numpy=True)
print("scaling: decoded expression max relative difference:", (np.abs(expr_scaled - expr64) / expr64).max())
print("scaling: exact log p(x) change, mean over cells (nats):", (exact_scaled - exact).mean())

laplace = inv.with_prior(model64, "laplace")
lpd_laplace = laplace.get_log_predictive_density(held, n_samples=300, seed=0, method="guide")
for name, M in [("rotation", Q), ("signed permutation", inv.signed_permutation([1, 0], [1, -1]))]:
    moved = inv.reparameterize(laplace, M).get_log_predictive_density(held, n_samples=300, seed=0, method="guide")
    change = np.abs(moved.lpd - lpd_laplace.lpd).max()
    print(f"Laplace prior, {name}: max |log p(x) change| per cell = {change:.3g} nats")""",
    ),
    (
        "md",
        """Scaling leaves the decoded expression unchanged but moves the exact `log p(x)` by whole nats per
cell; under the Laplace prior a rotation changes `log p(x)` by up to about a nat while a signed
permutation changes it by a rounding error. Invariance is exact when, and only when, the map
preserves the prior.

## 7. All of it in one call: `verify`

`verify` repeats these measurements on the held-out cells for several maps (a Haar rotation, a
sign flip, a permutation, a signed permutation, a Haar orthogonal matrix) and the controls, and
judges each against the theory: the same-noise difference must be below 1e-9 nats in float64;
the independent-noise difference must be within Monte Carlo error; the exact quadrature values
must agree to 1e-10; and every control must change `log p(x)` by more than its Monte Carlo error
(measured twice, with two seeds). It also reports the ELBO: with the pushed-forward
full-covariance guide it is unchanged, but the best *mean-field* guide (refitted per cell in each
model's coordinates) is not rotation-invariant.""",
    ),
    (
        "code",
        """report = inv.verify(model, held, n_samples=200, elbo_cells=60, elbo_refit_steps=80, seed=0)
print(report.summary())""",
    ),
    (
        "code",
        """fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
plotting.lpd_differences(report.per_cell, threshold=1e-9, ax=axes[0])
plotting.output_changes(report.outputs, ax=axes[1])
plt.tight_layout()""",
    ),
    (
        "md",
        """**Left:** each held-out cell's `|log p(x)|` difference (same noise) for every map, on a log
scale; exact zeros are drawn at the dotted line. The maps that preserve the prior sit at exactly
0 or around 1e-13 nats, orders of magnitude below the 1e-9 tolerance (dashed); the controls sit
between 0.01 and 100 nats. **Right:** how much each output changes under each map (log10; dark
= no change). Decoded expression is unchanged even by the controls (the decoder is compensated);
distances, neighbour graphs and `W W^T` are unchanged by every orthogonal map; coordinates,
loadings and per-dimension correlations change under all of them (a pure axis scaling leaves the
correlations alone, since a correlation ignores scale).""",
    ),
    (
        "code",
        """frame = report.to_frame()
elbo = frame[frame["check"].str.startswith("elbo_refit") & (frame["transform"] == "rotation")]
print(elbo[["check", "value"]].to_string(index=False))""",
    ),
    (
        "md",
        """The refitted mean-field ELBO differs between the two coordinate systems by a fraction of a nat
per cell, far beyond its Monte Carlo error: a mean-field guide cannot represent the posterior
correlation a rotation creates (or removes), so ELBO training has a weak preference among
equivalent coordinate systems, while `p(x)` has none. That preference is the "near" in
near-identifiability; it is small, it comes from the approximation rather than the data, and the
fitted coordinates need not even be the ones it prefers (on this fit, the rotation can score
*higher*).

## What can and cannot be concluded

* **Can:** held-out log predictive density, decoded expression, latent distances and
  neighbourhoods, and `W W^T` of this model are determined by the data (given the model class):
  every equivalent rotated model gives the same numbers, to rounding.
* **Cannot:** that a particular latent coordinate, its loadings, or its correlation with a
  marker means something. Another model with exactly the same fit reports different ones. Use
  rotation-invariant summaries, compare fits by their latent subspaces, or add a restriction
  that breaks the symmetry (a non-Gaussian prior, ICA post-processing) and state it as a choice.
* The check is about the *model*; whether the model fits the data well is a separate question
  (compare held-out log predictive density against baselines).""",
    ),
]


if __name__ == "__main__":
    write(CELLS, "01_rotation_invariance.ipynb")
