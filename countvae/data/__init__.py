"""AnnData registration and validation, minibatches, splits, real and simulated datasets."""

from countvae.data.datasets import DATASETS, find_dataset, load_dataset
from countvae.data.file_cells import FileCells
from countvae.data.gene_selection import (
    ALL_GENES,
    GeneChoice,
    choose_genes,
    get_gene_selection,
    highly_variable_genes,
    select_top_genes,
)
from countvae.data.gene_sets import as_gene_programs, check_gene_programs, read_gmt
from countvae.data.loader import CountSource, Minibatch
from countvae.data.registry import Registry, get_registry, setup_anndata
from countvae.data.simulate import draw_sources, planted_lfc, simulate, true_programs
from countvae.data.split import split_indices
from countvae.data.validation import CountSummary, validate_counts

__all__ = [
    "ALL_GENES",
    "DATASETS",
    "CountSource",
    "CountSummary",
    "FileCells",
    "GeneChoice",
    "Minibatch",
    "Registry",
    "as_gene_programs",
    "check_gene_programs",
    "choose_genes",
    "draw_sources",
    "find_dataset",
    "get_gene_selection",
    "get_registry",
    "highly_variable_genes",
    "load_dataset",
    "planted_lfc",
    "select_top_genes",
    "read_gmt",
    "setup_anndata",
    "simulate",
    "split_indices",
    "true_programs",
    "validate_counts",
]
