"""Every error a user meets names its remedy: each main failure kind is triggered and its message read.

A message passes when it is one of countvae's own errors and contains an
imperative remedy ("pass ...", "remove ...", "rerun ...", "install ..."): saying
only what is wrong leaves the user to guess the fix.
"""

from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest
import scipy.sparse as sp
from filelock import FileLock

import countvae as cv
from countvae.cli.common import read_h5ad
from countvae.diagnostics import fit_seeds
from countvae.errors import CountVAEError

REMEDY = re.compile(
    r"\b(pass|use|remove|rerun|set|install|call|choose|check|restore|free|wait|map|retrain|filter|delete|refit|"
    r"train|make|stop)\b",
    re.IGNORECASE,
)
SMALL = {"seeds": [0, 1], "model_kwargs": {"n_latent": 2, "n_hidden": 8}, "train_kwargs": {"max_epochs": 1}}


def _counts(n_cells: int = 60, n_genes: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).poisson(3.0, size=(n_cells, n_genes)).astype(np.float32) + 1


def _setup(matrix, **kwargs):
    adata = cv.data.simulate(n_cells=matrix.shape[0], n_genes=matrix.shape[1], n_latent=2, seed=0)
    adata.X = matrix
    cv.CountVAE.setup_anndata(adata, **kwargs)
    return adata


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    adata = cv.data.simulate(n_cells=120, n_genes=20, n_latent=2, n_batches=2, seed=1)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(adata, n_latent=2, n_hidden=8)
    model.train(max_epochs=1, progress_bar=False)
    folder = tmp_path_factory.mktemp("model") / "m"
    model.save(folder)
    return adata, model, folder


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    adata = cv.data.simulate(n_cells=120, n_genes=20, n_latent=2, seed=2)
    cv.CountVAE.setup_anndata(adata)
    out = tmp_path_factory.mktemp("seeds") / "out"
    fit_seeds(adata, out_dir=out, progress_bar=False, **SMALL)
    return adata, out


def _fractions():
    x = _counts()
    x[0, 0] = 0.5
    return _setup(x)


def _nan():
    x = _counts()
    x[1, 2] = np.nan
    return _setup(sp.csr_matrix(x))


def _negative():
    x = _counts()
    x[3, 1] = -2
    return _setup(x)


def _empty_cell():
    x = _counts()
    x[4] = 0
    return _setup(x)


def _empty_gene():
    x = _counts()
    x[:, 5] = 0
    return _setup(x)


def _unknown_batch(trained):
    adata, model, _ = trained
    query = adata.copy()
    query.obs["batch"] = query.obs["batch"].astype(str)
    query.obs.loc[query.obs_names[:3], "batch"] = "unseen"
    return model.get_latent_representation(query)


def _damaged_model(trained, tmp_path):
    _, _, folder = trained
    copy = tmp_path / "m"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    params = copy / "params.pt"
    params.write_bytes(params.read_bytes()[:100])
    return cv.CountVAE.load(copy)


def _broken_seed(seed_run):
    adata, out = seed_run
    (out / "fits" / "seed_1" / "fit.json").write_text("{")
    return fit_seeds(adata, out_dir=out, progress_bar=False, **SMALL)


def _lock_held(seed_run):
    adata, out = seed_run
    with FileLock(out / ".lock", timeout=0):
        return fit_seeds(adata, out_dir=out, progress_bar=False, **SMALL)


def _disk_full(trained, tmp_path, monkeypatch):
    _, model, _ = trained

    def replace(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", replace)
    return model.save(tmp_path / "new")


def _other_settings(seed_run):
    adata, out = seed_run
    return fit_seeds(adata, out_dir=out, progress_bar=False, **{**SMALL, "train_kwargs": {"max_epochs": 2}})


class _Context:
    """What a failure needs: the test's tmp_path and monkeypatch, and the shared fits, built on first use."""

    def __init__(self, request, tmp_path, monkeypatch):
        self._request = request
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch

    @property
    def trained(self):
        return self._request.getfixturevalue("trained")

    @property
    def seed_run(self):
        return self._request.getfixturevalue("seed_run")


KINDS = {
    "non-integer counts": lambda c: _fractions(),
    "NaN counts": lambda c: _nan(),
    "negative counts": lambda c: _negative(),
    "cell with no counts": lambda c: _empty_cell(),
    "gene with no counts": lambda c: _empty_gene(),
    "non-numeric matrix": lambda c: _setup(_counts().astype(str).astype(object)),
    "missing layer": lambda c: _setup(_counts(), layer="counts"),
    "missing batch column": lambda c: _setup(_counts(), batch_key="donor"),
    "not set up": lambda c: cv.CountVAE(cv.data.simulate(n_cells=30, n_genes=8, n_latent=2, seed=0)),
    "not trained": lambda c: cv.CountVAE(c.trained[0], n_latent=2).get_latent_representation(),
    "unknown batch": lambda c: _unknown_batch(c.trained),
    "missing model folder": lambda c: cv.CountVAE.load(c.tmp_path / "nowhere"),
    "missing data file": lambda c: read_h5ad(str(c.tmp_path / "nowhere.h5ad")),
    "damaged model file": lambda c: _damaged_model(c.trained, c.tmp_path),
    "model folder exists": lambda c: c.trained[1].save(c.trained[2]),
    "broken seed folder": lambda c: _broken_seed(c.seed_run),
    "output folder locked": lambda c: _lock_held(c.seed_run),
    "other settings in out_dir": lambda c: _other_settings(c.seed_run),
    "disk full": lambda c: _disk_full(c.trained, c.tmp_path, c.monkeypatch),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_error_names_its_remedy(kind, request, tmp_path, monkeypatch):
    with pytest.raises(CountVAEError) as info:
        KINDS[kind](_Context(request, tmp_path, monkeypatch))
    message = str(info.value)
    assert REMEDY.search(message), f"{kind}: the message names no remedy: {message}"
