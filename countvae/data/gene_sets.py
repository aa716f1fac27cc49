"""Gene sets (named gene programs): read from a GMT file or a dict, and checked against a data set's genes.

A gene program names a latent dimension by external knowledge: the loadings of dimension ``k`` are restricted to
program ``k``'s genes (see :class:`countvae.module.loadings.ProgramLoadings`). This module only turns what the user
passes into an ordered ``{name: [genes]}`` dict whose genes all exist in the data, or says clearly what does not fit.

The GMT format (Broad Institute, used by MSigDB) has one gene set per line, tab-separated: the set's name, a
description (may be empty), then its genes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from countvae.errors import DataFileNotFoundError, InvalidArgumentError, InvalidDataError

#: Fewest genes in the data a program may have: a program is the co-variation of several genes.
MIN_PROGRAM_GENES = 2

GenePrograms = dict[str, list[str]]


def read_gmt(path: str | os.PathLike) -> GenePrograms:
    """Read gene sets from a GMT file: ``{set name: [genes]}`` in the order of the file.

    Blank lines are skipped; genes repeated within a set are kept once.

    Raises
    ------
    DataFileNotFoundError
        If the file does not exist.
    InvalidDataError
        If the path is not a file or not UTF-8 text (a byte-order mark is allowed), a line has no genes, a set name
        is empty or repeated, or the file has no sets.

    """
    p = Path(path)
    if p.exists() and not p.is_file():
        raise InvalidDataError(f"Gene set file {p} is not a file (expected a GMT file).")
    if not p.is_file():
        raise DataFileNotFoundError(f"Gene set file {p} does not exist (expected a GMT file).")
    try:  # utf-8-sig: a byte-order mark (some Windows editors write one) is not part of the first set's name
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidDataError(
            f"{p} is not UTF-8 text (byte {exc.start} cannot be read as UTF-8; GMT files from some tools are Latin-1 "
            "or cp1252): save it as UTF-8."
        ) from None
    programs: GenePrograms = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        name, genes = fields[0], [g for g in fields[2:] if g]
        if not name:
            raise InvalidDataError(
                f"{p}, line {number}: the gene set has no name (GMT: name<TAB>description<TAB>genes)."
            )
        if not genes:
            raise InvalidDataError(
                f"{p}, line {number}: gene set {name!r} lists no genes; GMT lines are tab-separated: "
                "name, description, then the genes."
            )
        if name in programs:
            raise InvalidDataError(f"{p}, line {number}: gene set {name!r} appears twice.")
        programs[name] = list(dict.fromkeys(genes))
    if not programs:
        raise InvalidDataError(f"{p} holds no gene sets.")
    return programs


def as_gene_programs(programs: Mapping[str, Iterable[str]] | str | os.PathLike) -> GenePrograms:
    """Gene programs as an ordered ``{name: [genes]}`` dict of strings, from a dict or a GMT file path.

    Raises
    ------
    InvalidArgumentError
        If it is neither, is empty, or a name or gene is not a non-empty string.

    """
    if isinstance(programs, str | os.PathLike):
        return read_gmt(programs)
    if not isinstance(programs, Mapping):
        raise InvalidArgumentError(
            f"gene_programs must be a dict {{name: [genes]}} or the path of a GMT file, got {type(programs).__name__}."
        )
    if not programs:
        raise InvalidArgumentError("gene_programs is empty; give at least one {name: [genes]}.")
    out: GenePrograms = {}
    for name, genes in programs.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"Gene program names must be non-empty strings, got {name!r}.")
        if isinstance(genes, str) or not isinstance(genes, Iterable):
            raise InvalidArgumentError(f"Gene program {name!r} must be a list of gene names, got {genes!r}.")
        genes = list(genes)
        bad = [g for g in genes if not isinstance(g, str) or not g]
        if bad:
            raise InvalidArgumentError(f"Gene program {name!r} has entries that are not gene names: {bad[:5]}.")
        out[name] = list(dict.fromkeys(genes))
    return out


def check_gene_programs(
    programs: Mapping[str, Sequence[str]],
    var_names: Sequence[str],
    unknown_genes: Literal["error", "drop"] = "error",
    min_genes: int = MIN_PROGRAM_GENES,
) -> GenePrograms:
    """Programs checked against the data's genes: every gene known, every program with at least ``min_genes``.

    Parameters
    ----------
    programs
        ``{name: [genes]}`` (see :func:`as_gene_programs`).
    var_names
        The data's genes.
    unknown_genes
        ``"error"``: a gene not in ``var_names`` is an error naming it; ``"drop"``: such genes are left out (a
        gene set from a database lists many genes a filtered data set does not have).
    min_genes
        Fewest genes a program must keep.

    Returns
    -------
    dict
        The programs, in order, with the genes kept.

    Raises
    ------
    InvalidDataError
        Naming the unknown genes (``"error"``) or the programs with fewer than ``min_genes`` genes in the data.

    """
    if unknown_genes not in ("error", "drop"):
        raise InvalidArgumentError(f"unknown_genes must be 'error' or 'drop', got {unknown_genes!r}.")
    known = set(map(str, var_names))
    missing = {name: [g for g in genes if g not in known] for name, genes in programs.items()}
    missing = {name: genes for name, genes in missing.items() if genes}
    if missing and unknown_genes == "error":
        listed = "; ".join(
            f"{name}: {', '.join(genes[:10])}{' ...' if len(genes) > 10 else ''}" for name, genes in missing.items()
        )
        raise InvalidDataError(
            f"Gene programs name genes that are not in the data ({listed}). Fix the names, or leave out the genes "
            "the data lack: unknown_genes='drop' (compare_restrictions; for a model, "
            "gene_programs=countvae.data.check_gene_programs(programs, adata.var_names, unknown_genes='drop'))."
        )
    kept = {name: [g for g in genes if g in known] for name, genes in programs.items()}
    small = {name: len(genes) for name, genes in kept.items() if len(genes) < min_genes}
    if small:
        listed = ", ".join(f"{name} ({n})" for name, n in small.items())
        raise InvalidDataError(
            f"Gene programs with fewer than {min_genes} genes in the data: {listed}. A program names a latent "
            "dimension by the co-variation of its genes; add genes to these programs or remove them."
        )
    return kept
