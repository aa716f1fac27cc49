"""AnnData registration and validation, minibatches, splits, real and simulated datasets."""

from countvae.data.datasets import DATASETS, find_dataset, load_dataset
from countvae.data.gene_sets import as_gene_programs, check_gene_programs, read_gmt
from countvae.data.loader import CountSource, Minibatch
from countvae.data.registry import Registry, get_registry, setup_anndata
from countvae.data.simulate import draw_sources, planted_lfc, simulate, true_log_rate_jacobian, true_programs
from countvae.data.split import split_indices
from countvae.data.validation import CountSummary, validate_counts

__all__ = [
    "DATASETS",
    "CountSource",
    "CountSummary",
    "Minibatch",
    "Registry",
    "as_gene_programs",
    "check_gene_programs",
    "draw_sources",
    "find_dataset",
    "get_registry",
    "load_dataset",
    "planted_lfc",
    "read_gmt",
    "setup_anndata",
    "simulate",
    "split_indices",
    "true_log_rate_jacobian",
    "true_programs",
    "validate_counts",
]
