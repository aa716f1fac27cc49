"""Cells of an .h5ad file named by path, so that a worker process opens them itself instead of receiving the data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import numpy as np

from countvae.data.backed import backed_columns, backed_positions
from countvae.data.registry import Registry, attach_registry
from countvae.errors import InvalidDataError


@dataclass(frozen=True)
class FileCells:
    """Cells of an .h5ad file, by position, with the registration they were checked under.

    ``columns`` are the genes' positions in the file when a view chose or reordered them (``None``: all, in order).
    Picklable and small (path, positions, registry), so a worker process can :meth:`open` the cells itself instead
    of receiving a copy of the data. :meth:`open` refuses a file whose recorded size or modification time changed.
    """

    path: str
    positions: np.ndarray
    registry: Registry
    size: int
    mtime_ns: int
    columns: np.ndarray | None = None

    @classmethod
    def of(cls, adata: ad.AnnData, positions: np.ndarray, registry: Registry) -> FileCells:
        """The cells at ``positions`` of backed ``adata`` (itself possibly a view of its file)."""
        path = Path(adata.filename).resolve()
        stat = os.stat(path)
        in_file = backed_positions(adata)[np.asarray(positions, dtype=np.int64)]
        return cls(str(path), in_file, registry, stat.st_size, stat.st_mtime_ns, backed_columns(adata))

    def open(self) -> ad.AnnData:
        """A backed view of the cells, registered as recorded (the counts are not checked again).

        Raises
        ------
        InvalidDataError
            If the file is missing or has changed since the cells were recorded.

        """
        path = Path(self.path)
        try:
            stat = os.stat(path)
        except OSError as exc:
            raise InvalidDataError(f"{path} cannot be opened here ({exc}); the fit's worker needs the file.") from None
        if (stat.st_size, stat.st_mtime_ns) != (self.size, self.mtime_ns):
            raise InvalidDataError(f"{path} has changed since the fit started; start it again on the current file.")
        full = ad.read_h5ad(path, backed="r")
        attach_registry(full, self.registry)
        return full[self.positions] if self.columns is None else full[self.positions, self.columns]
