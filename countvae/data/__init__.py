"""AnnData registration and validation, minibatches, splits, real and simulated datasets."""

from countvae.data.datasets import DATASETS, find_dataset, load_dataset
from countvae.data.file_cells import FileCells
from countvae.data.loader import CountSource, Minibatch
from countvae.data.registry import Registry, get_registry, setup_anndata
from countvae.data.simulate import draw_sources, planted_lfc, simulate, true_log_rate_jacobian
from countvae.data.split import split_indices
from countvae.data.validation import CountSummary, validate_counts

__all__ = [
    "DATASETS",
    "CountSource",
    "CountSummary",
    "FileCells",
    "Minibatch",
    "Registry",
    "draw_sources",
    "find_dataset",
    "get_registry",
    "load_dataset",
    "planted_lfc",
    "setup_anndata",
    "simulate",
    "split_indices",
    "true_log_rate_jacobian",
    "validate_counts",
]
