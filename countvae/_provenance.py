"""What a result was computed from: package versions and checksums of count data.

One canonical form for each, so a model folder, a fit manifest and a report record the same thing the same way.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any

import numpy as np
import scipy.sparse as sp

#: Packages whose versions can change a fit's or an analysis's numbers.
NUMERIC_PACKAGES = ("countvae", "torch", "pyro-ppl", "numpy", "scipy", "pandas", "anndata", "scikit-learn")

_ROWS_PER_BLOCK = 4096


def package_versions(*extra: str) -> dict[str, str]:
    """Versions of Python, the :data:`NUMERIC_PACKAGES` and the packages named in ``extra``.

    A package that is not installed is recorded as ``"not installed"``.
    """
    versions = {"python": platform.python_version()}
    for name in (*NUMERIC_PACKAGES, *extra):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def json_sha256(obj: Any) -> str:
    """SHA-256 of an object's JSON form with sorted keys (lists of names, settings)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def names_sha256(names: Iterable[Any]) -> str:
    """SHA-256 of a sequence of names (cells, genes, batch labels), order included."""
    return json_sha256([str(v) for v in names])


def _canonical_row_blocks(matrix: Any) -> Iterator[sp.csr_matrix]:
    """Row blocks of a count matrix as canonical CSR: float64 values, sorted indices, no stored zeros."""
    if sp.issparse(matrix) and matrix.format != "csr":
        matrix = matrix.tocsr()
    for start in range(0, matrix.shape[0], _ROWS_PER_BLOCK):
        block = matrix[start : min(start + _ROWS_PER_BLOCK, matrix.shape[0])]
        block = block.tocsr().astype(np.float64) if sp.issparse(block) else sp.csr_matrix(np.asarray(block, np.float64))
        block.sum_duplicates()
        block.eliminate_zeros()
        block.sort_indices()
        yield block


def counts_sha256(matrix: Any) -> str:
    """SHA-256 of a cells x genes count matrix, identical for dense, CSR, CSC or backed storage of the same values.

    Hashed per block of rows as canonical CSR: the non-zero values (float64), their
    column indices and the number of non-zeros per row (int64), each stream separately.
    """
    values, columns, row_nnz = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for block in _canonical_row_blocks(matrix):
        values.update(np.ascontiguousarray(block.data, dtype="<f8").tobytes())
        columns.update(np.ascontiguousarray(block.indices, dtype="<i8").tobytes())
        row_nnz.update(np.ascontiguousarray(np.diff(block.indptr), dtype="<i8").tobytes())
    return hashlib.sha256((values.hexdigest() + columns.hexdigest() + row_nnz.hexdigest()).encode("ascii")).hexdigest()
