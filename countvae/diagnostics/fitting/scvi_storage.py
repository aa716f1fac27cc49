"""scvi-tools support for multi-seed fits: lazy import, data setup, and safe saving and loading.

scvi-tools is optional (the ``[scvi]`` extra) and takes seconds to import, so nothing here imports it at module level.

Saving departs from scvi-tools on purpose: ``SCVI.save`` pickles the model's attributes and ``SCVI.load`` reads them
back with ``torch.load(weights_only=False)``, which can run code stored in the file. countvae stores an scvi fit as
its own models: the module's ``state_dict`` as tensors (read back with ``torch.load(weights_only=True)``) and the
constructor arguments as JSON, with a SHA-256 of the tensor file. Loading rebuilds the model from the training AnnData
(set up again with the same fields) and the recorded arguments, then loads the tensors, restoring every parameter and
buffer (batch-norm statistics included) exactly.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import torch

from countvae._io import load_checked_tensors, read_versioned_json, sha256_file, write_json_atomic
from countvae.data.registry import Registry
from countvae.errors import InvalidArgumentError, ModelFileError

SCVI_FIT_FORMAT = "countvae-scvi-fit"
SCVI_FIT_VERSION = 1
_SETTINGS_FILE = "model.json"
_PARAMS_FILE = "params.pt"
_SUPPORTED = ("SCVI", "LinearSCVI")


def import_scvi():
    """Import scvi-tools, or explain how to install it."""
    try:
        import scvi  # optional (the [scvi] extra) and slow to import, so only when an scvi-tools model is used
    except ImportError as exc:
        raise InvalidArgumentError(
            f"model_cls is an scvi-tools class but scvi-tools cannot be imported ({exc}); "
            "install it with `pip install 'countvae[scvi]'`."
        ) from None
    return scvi


def is_scvi_class(model_cls: Any) -> bool:
    """Whether ``model_cls`` comes from scvi-tools (decided without importing scvi-tools)."""
    return isinstance(model_cls, type) and model_cls.__module__.split(".")[0] == "scvi"


def scvi_kind(model_cls: type) -> str:
    """``"linearscvi"`` or ``"scvi"`` for the supported scvi-tools classes.

    Raises
    ------
    InvalidArgumentError
        For any other scvi-tools class.

    """
    scvi = import_scvi()
    if issubclass(model_cls, scvi.model.LinearSCVI):
        return "linearscvi"
    if issubclass(model_cls, scvi.model.SCVI):
        return "scvi"
    raise InvalidArgumentError(
        f"fit_seeds supports the scvi-tools classes {_SUPPORTED}, got {model_cls.__name__}; other models lack "
        "the N(0, I) latent prior whose symmetry the diagnostics measure."
    )


def class_path(model_cls: type) -> str:
    """Importable name of a class, e.g. ``"scvi.model.SCVI"``."""
    public = {"scvi": "scvi.model", "countvae": "countvae"}.get(model_cls.__module__.split(".")[0])
    if public is not None:
        with contextlib.suppress(ImportError):
            if getattr(importlib.import_module(public), model_cls.__name__, None) is model_cls:
                return f"{public}.{model_cls.__name__}"
    return f"{model_cls.__module__}.{model_cls.__qualname__}"


#: What setting ``scvi.settings.seed`` writes to the environment (scvi-tools' XLA flag, Lightning's seeds).
_SEED_ENVIRONMENT = ("XLA_FLAGS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@contextlib.contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global random states, and scvi-tools' seed settings, on exit.

    scvi-tools seeds through ``scvi.settings.seed``, which reseeds all three, records the seed (and Lightning's
    ``PL_GLOBAL_SEED``, which seeds data-loader workers), sets cuDNN's determinism flags and appends to
    ``XLA_FLAGS``; countvae promises no global side effects, so fits run in this block.
    """
    import scvi

    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
    environment = {name: os.environ.get(name) for name in _SEED_ENVIRONMENT}
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    scvi_seed = scvi.settings.seed
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002 (restoring what scvi reseeds)
        torch.set_rng_state(torch_state)
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        # the setter would reseed everything just restored: the recorded value alone goes back
        scvi.settings._seed = scvi_seed


@contextlib.contextmanager
def quiet_scvi() -> Iterator[None]:
    """Silence scvi-tools' and Lightning's INFO messages (setup transfer, "GPU available", seeds).

    Lightning sets levels on its sub-loggers (``lightning.pytorch``, ``lightning.fabric``), so every existing logger
    under these prefixes is raised to WARNING for the block, then restored.
    """
    prefixes = ("scvi", "lightning", "lightning_fabric", "pytorch_lightning")
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in prefixes]
    loggers = [logging.getLogger(n) for n in sorted(set(names) | set(prefixes))]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def setup_for_scvi(adata: ad.AnnData, registry: Registry, model_cls: type) -> ad.AnnData:
    """A copy of ``adata`` registered with ``model_cls.setup_anndata`` using countvae's registration.

    The counts layer, batch key and labels key are those given to ``CountVAE.setup_anndata``. The batch and labels
    columns get the whole data set's categories, so a subset lacking a batch encodes batches as the held-out cells do.
    """
    if registry.use_raw:
        raise InvalidArgumentError(
            "scvi-tools models cannot read counts from adata.raw; copy them into a layer "
            "(adata.layers['counts'] = adata.raw.X) and call CountVAE.setup_anndata(adata, layer='counts')."
        )
    out = adata.copy()
    for key, categories in (
        (registry.batch_key, registry.batch_categories),
        (registry.labels_key, registry.labels_categories),
    ):
        if key is not None:
            out.obs[key] = pd.Categorical(out.obs[key].astype(str), categories=categories)
    # setup_anndata checks the counts of a few cells drawn from numpy's global generator: keep the caller's.
    with preserved_global_rng(), quiet_scvi():
        model_cls.setup_anndata(out, layer=registry.layer, batch_key=registry.batch_key, labels_key=registry.labels_key)
    return out


def history_record(model: Any) -> dict[str, list[float | None]]:
    """scvi-tools' training history (a dict of one-column DataFrames) as JSON lists."""
    out = {}
    for key, frame in (getattr(model, "history", None) or {}).items():
        values = np.asarray(frame, dtype=np.float64).ravel()
        out[key] = [None if not np.isfinite(v) else float(v) for v in values]
    return out


def training_summary(model: Any) -> dict[str, Any]:
    """Epochs an scvi-tools model trained (the length of its loss history), as ``CountVAE.training_summary``."""
    history = getattr(model, "history", None) or {}
    for key in ("elbo_train", "train_loss_epoch"):
        if key in history:
            return {"epochs_trained": len(history[key])}
    return {}


def save_scvi_fit(model: Any, folder: Path, model_kwargs: dict[str, Any]) -> None:
    """Write a trained scvi-tools model into an existing empty ``folder`` (see module docstring)."""
    params = folder / _PARAMS_FILE
    torch.save({k: v.detach().cpu() for k, v in model.module.state_dict().items()}, params)
    record = {
        "format": SCVI_FIT_FORMAT,
        "format_version": SCVI_FIT_VERSION,
        "model_class": class_path(type(model)),
        "model_kwargs": model_kwargs,
        "var_names": [str(v) for v in model.adata.var_names],
        "history": history_record(model),
        "checksums": {_PARAMS_FILE: sha256_file(params)},
    }
    write_json_atomic(folder / _SETTINGS_FILE, record)


def load_scvi_fit(folder: Path, model_cls: type, adata_scvi: ad.AnnData) -> Any:
    """Rebuild a model written by :func:`save_scvi_fit` on ``adata_scvi`` (set up by :func:`setup_for_scvi`).

    Raises
    ------
    ModelFileError
        If a file is missing, altered (checksum), of another format, or holds more than tensors.

    """
    settings_path = folder / _SETTINGS_FILE
    record = read_versioned_json(settings_path, SCVI_FIT_FORMAT, SCVI_FIT_VERSION, "a complete scvi-tools fit")
    if record.get("model_class") != class_path(model_cls):
        raise ModelFileError(f"{settings_path} holds a {record.get('model_class')} fit, not a {class_path(model_cls)}.")
    state = load_checked_tensors(folder / _PARAMS_FILE, record.get("checksums", {}).get(_PARAMS_FILE))
    if [str(v) for v in adata_scvi.var_names] != record.get("var_names"):
        raise ModelFileError(f"{folder} was fitted on other genes than the AnnData given to load it.")
    with preserved_global_rng(), quiet_scvi():
        model = model_cls(adata_scvi, **record["model_kwargs"])
    try:
        model.module.load_state_dict(state)
    except RuntimeError as exc:
        where = folder / _PARAMS_FILE
        raise ModelFileError(f"{where}: its parameters do not fit the recorded settings: {exc}") from None
    model.is_trained_ = True
    model.module.eval()
    return model


def fit_scvi(
    model_cls: type, adata_scvi: ad.AnnData, model_kwargs: dict[str, Any], train_kwargs: dict[str, Any], seed: int
) -> Any:
    """Construct and train an scvi-tools model from ``seed`` (``scvi.settings.seed`` before both)."""
    scvi = import_scvi()
    with preserved_global_rng(), quiet_scvi():
        scvi.settings.seed = int(seed)
        model = model_cls(adata_scvi, **model_kwargs)
        model.train(**{"enable_progress_bar": False, **train_kwargs})
    model.module.eval()
    return model
