"""Property-based bad input: every public entry point works or raises a documented countvae error."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import countvae as cv
from countvae.errors import CountVAEError


@st.composite
def anndatas(draw):
    n = draw(st.integers(1, 12))
    g = draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    X = rng.poisson(draw(st.sampled_from([0.3, 3.0, 3.0])), (n, g)).astype(np.float64)
    X[np.arange(n), np.arange(n) % g] += 1  # no empty cells unless a corruption makes one
    X[np.arange(g) % n, np.arange(g)] += 1  # no empty genes either
    corruption = draw(st.sampled_from(["none"] * 7 + ["nan", "inf", "negative", "fraction", "zero_row", "zero_col"]))
    i, j = rng.integers(0, n), rng.integers(0, g)
    if corruption == "nan":
        X[i, j] = np.nan
    elif corruption == "inf":
        X[i, j] = np.inf
    elif corruption == "negative":
        X[i, j] = -2
    elif corruption == "fraction":
        X[i, j] = 0.5
    elif corruption == "zero_row":
        X[i] = 0
    elif corruption == "zero_col":
        X[:, j] = 0
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64]))
    if dtype is np.int64 and corruption in ("nan", "inf", "fraction"):
        dtype = np.float64
    X = X.astype(dtype)
    fmt = draw(st.sampled_from(["dense", "csr", "csc"]))
    matrix = {"dense": X, "csr": sp.csr_matrix(X), "csc": sp.csc_matrix(X)}[fmt]
    a = ad.AnnData(X=matrix)
    a.obs_names = [f"c{k}" for k in range(n)]
    names = [f"g{k}" for k in range(g)]
    if g > 1 and draw(st.integers(0, 5)) == 0:
        names[1] = names[0]
    a.var_names = names
    levels = ["a", "b", "a", "b", None] if draw(st.integers(0, 3)) == 0 else ["a", "b"]
    batch = [draw(st.sampled_from(levels)) for _ in range(n)]
    a.obs["batch"] = pd.Categorical(batch) if draw(st.booleans()) else pd.Series(batch, dtype=object).to_numpy()
    return a


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    adata=anndatas(),
    use_batch=st.booleans(),
    n_latent=st.integers(0, 4),
    likelihood=st.sampled_from(["poisson", "nb", "zinb"]),
)
def test_entry_points_work_or_raise_documented_errors(adata, use_batch, n_latent, likelihood):
    try:
        cv.CountVAE.setup_anndata(adata, batch_key="batch" if use_batch else None)
        model = cv.CountVAE(adata, n_latent=n_latent, likelihood=likelihood, n_hidden=4)
        model.train(max_epochs=1, batch_size=4, progress_bar=False)
        z = model.get_latent_representation()
        lpd = model.get_log_predictive_density(n_samples=4)
        expr = model.get_normalized_expression(return_numpy=True)
    except CountVAEError:
        return
    # when it works, nothing is NaN and nothing was dropped
    assert z.shape == (adata.n_obs, n_latent) and np.isfinite(z).all()
    assert len(lpd) == adata.n_obs and np.isfinite(lpd["lpd"]).all()
    assert expr.shape == adata.shape and np.isfinite(expr).all()
