"""Helpers shared by the ICA benchmarks: model fitting, embeddings, alignment error, RESULTS.md sections."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _common import DEFAULT_RESULTS, load_average
from _common import write_section as _write_section

import countvae as cv

QUICK_NOTE = "QUICK run (smoke-test sizes: the numbers below are not meaningful)."


def quiet() -> None:
    """One torch thread (the machine is shared), no progress output from scvi-tools/Lightning."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in ("scvi", "lightning", "lightning.pytorch", "pytorch_lightning", "countvae"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def machine_note() -> str:
    """Python, torch and the load average, for the record next to every timing."""
    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, 1 torch thread, load average {load_average()}"
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results``, ``--quick`` and ``--no-write``, shared by the ICA benchmarks."""
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="RESULTS.md to update")
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds); marks the section QUICK")
    parser.add_argument("--no-write", action="store_true", help="print only; leave the results file alone")


def fit_countvae(adata, n_latent: int, seed: int, max_epochs: int, lr: float = 3e-3, **model_kwargs):
    """A CountVAE (MLP decoder, NB) trained without KL warm-up; returns (model, seconds)."""
    model = cv.CountVAE(adata, n_latent=n_latent, **{"likelihood": "nb", "decoder": "mlp", **model_kwargs})
    start = time.perf_counter()
    model.train(early_stopping=False, max_epochs=max_epochs, lr=lr, seed=seed, progress_bar=False)
    return model, time.perf_counter() - start


def fit_scvi(adata, n_latent: int, seed: int, max_epochs: int, lr: float = 3e-3, n_hidden: int = 128):
    """scvi-tools SCVI with NB likelihood, the same optimiser settings and no KL warm-up; returns (latent, seconds).

    scvi-tools' default warm-up (400 epochs) would leave the KL weight at a
    quarter after 100 epochs; it is switched off so that both models optimise
    the same ELBO.
    """
    import scvi

    scvi.settings.seed = seed
    data = adata.copy()
    scvi.model.SCVI.setup_anndata(data)
    model = scvi.model.SCVI(data, n_latent=n_latent, n_hidden=n_hidden, gene_likelihood="nb")
    start = time.perf_counter()
    model.train(
        max_epochs=max_epochs,
        batch_size=128,
        train_size=0.9,
        accelerator="cpu",
        enable_progress_bar=False,
        plan_kwargs={"lr": lr, "n_epochs_kl_warmup": None},
    )
    return model.get_latent_representation(), time.perf_counter() - start


def random_rotation(latents: np.ndarray, seed: int) -> np.ndarray:
    """Latents times a Haar-random orthogonal matrix."""
    from scipy.stats import ortho_group

    return latents @ ortho_group.rvs(latents.shape[1], random_state=seed).T


def ica_quietly(latents: np.ndarray, **params) -> tuple[np.ndarray, cv.ica.ICARotation]:
    """ICA sources and the fitted rotation, with the non-identifiability warning recorded instead of shown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cv.errors.NonIdentifiableComponentsWarning)
        ica = cv.ica.ICARotation(**params).fit(latents)
    return ica.transform(latents), ica


def pca_log_normalized(adata, n_components: int, seed: int = 0) -> np.ndarray:
    """PCA of log1p counts per 10,000 (the classical baseline embedding)."""
    from sklearn.decomposition import PCA

    x = adata.X.toarray() if hasattr(adata.X, "toarray") else np.asarray(adata.X)
    x = np.log1p(x / x.sum(1, keepdims=True) * 1e4)
    return PCA(n_components, random_state=seed).fit_transform(x)


def linear_alignment_error(za: np.ndarray, zb: np.ndarray, seed: int = 0) -> float:
    """Held-out error of the best affine map between two fits' latents (shared/notes section 1a).

    The map is fitted on a random half of the cells and scored on the other
    half: ``mean_i |T(z^a_i) - z^b_i| / sqrt(2 tr Cov(z^b))`` (the RMS pairwise
    distance of ``z^b``), averaged over both directions. 0 when one fit is an
    affine image of the other; about 1 for unrelated latents.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(za.shape[0])
    train, test = order[: za.shape[0] // 2], order[za.shape[0] // 2 :]

    def one_way(a, b):
        design = np.column_stack([a, np.ones(len(a))])
        coef, *_ = np.linalg.lstsq(design[train], b[train], rcond=None)
        residual = np.linalg.norm(design[test] @ coef - b[test], axis=1)
        return residual.mean() / np.sqrt(2.0 * np.trace(np.cov(b[test].T)))

    return 0.5 * (one_way(za, zb) + one_way(zb, za))


def mean_sd(values) -> str:
    """``mean ± sd`` over seeds with three decimals."""
    v = np.asarray(values, dtype=float)
    if v.size == 1:
        return f"{v[0]:.3f}"
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}"


def markdown_table(frame: pd.DataFrame) -> str:
    """A pipe table without extra dependencies."""
    header = "| " + " | ".join([str(frame.index.name or "")] + [str(c) for c in frame.columns]) + " |"
    rule = "|" + "---|" * (len(frame.columns) + 1)
    rows = ["| " + " | ".join([str(i)] + [str(v) for v in row]) + " |" for i, row in frame.iterrows()]
    return "\n".join([header, rule, *rows])


def write_section(args: argparse.Namespace, name: str, body: str) -> None:
    """Replace this script's section of ``args.results`` (marked QUICK for quick runs) unless ``--no-write``."""
    if args.no_write:
        return
    _write_section(args.results, name, (QUICK_NOTE + "\n\n" if args.quick else "") + body)


def apply_quick(args: argparse.Namespace, **sizes) -> argparse.Namespace:
    """With ``--quick``, replace the size arguments by the given smoke-test values."""
    if args.quick:
        for key, value in sizes.items():
            setattr(args, key, value)
    return args
