"""Options and input handling shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import anndata as ad
import h5py

from countvae.errors import DataFileNotFoundError, InvalidDataError, OutputExistsError

__all__ = [
    "Subcommands",
    "add_data_arguments",
    "add_model_arguments",
    "add_output_arguments",
    "emit",
    "exit_codes",
    "progress_enabled",
    "read_h5ad",
    "refuse_existing_output",
]

logger = logging.getLogger("countvae.cli")


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns (argparse names its class only privately)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add a subcommand's parser."""


def exit_codes(failure_also: str = "") -> str:
    """The exit-code paragraph of a command's ``--help`` (the same codes for every command)."""
    return (
        "exit codes:\n"
        "  0    success\n"
        f"  1    bad input or a failed run, with a one-line message on stderr{failure_also}\n"
        "  2    wrong command line (unknown option, invalid value)\n"
        "  130  interrupted (Ctrl-C)\n"
    )


def add_data_arguments(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """``DATA`` (an .h5ad path; optional where an embedded default exists), ``--layer``, ``--batch-key``."""
    parser.add_argument(
        "data",
        nargs=None if required else "?",
        metavar="DATA.h5ad",
        help="AnnData file with raw counts" + ("" if required else " (default: embedded simulated data)"),
    )
    parser.add_argument("--layer", default=None, help="layer holding raw counts (default: X)")
    parser.add_argument("--use-raw", action="store_true", help="read counts from adata.raw")
    parser.add_argument("--batch-key", default=None, help="obs column with batches")
    parser.add_argument("--labels-key", default=None, help="obs column with cell labels (reports)")


def add_output_arguments(parser: argparse.ArgumentParser, default_out: str) -> None:
    """``--out``, ``--overwrite``, ``--json``, ``--quiet``."""
    parser.add_argument("--out", default=default_out, help=f"output folder (default: {default_out})")
    parser.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or log messages")


def add_model_arguments(parser: argparse.ArgumentParser, help_text: Mapping[str, str] | None = None) -> None:
    """Model and training options shared by ``fit``, ``diagnose`` and ``verify-invariance``.

    ``help_text`` replaces the help of options by their ``dest`` (e.g. where a
    command sets other defaults than ``fit``).
    """
    options: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        (("--n-latent",), {"type": int, "default": 10, "help": "latent dimensions (default: 10)"}),
        (("--likelihood",), {"choices": ["poisson", "nb", "zinb"], "default": "nb"}),
        (("--decoder",), {"choices": ["linear", "mlp"], "default": "mlp"}),
        (("--n-hidden",), {"type": int, "default": 128}),
        (("--n-layers",), {"type": int, "default": 1}),
        (
            ("--max-epochs",),
            {"type": int, "default": None, "help": "default: as scvi-tools, from the data size"},
        ),
        (("--batch-size",), {"type": int, "default": 128}),
        (("--lr",), {"type": float, "default": 1e-3}),
        (
            ("--early-stopping",),
            {
                "action": argparse.BooleanOptionalAction,
                "default": False,
                "help": "stop when the validation loss stalls (default: off)",
            },
        ),
    ]
    help_text = dict(help_text or {})
    for flags, kwargs in options:
        dest = flags[0].removeprefix("--").replace("-", "_")
        if dest in help_text:
            kwargs = {**kwargs, "help": help_text.pop(dest)}
        parser.add_argument(*flags, **kwargs)
    if help_text:
        raise ValueError(f"help_text names options that do not exist: {sorted(help_text)}")


def read_h5ad(path: str) -> ad.AnnData:
    """Read an .h5ad file, turning every way it can fail into a one-line :class:`CountVAEError`."""
    p = Path(path)
    if not p.exists():
        raise DataFileNotFoundError(f"{path} does not exist; check the path, or pass the .h5ad file to read.")
    if p.is_dir():
        raise InvalidDataError(f"{path} is a folder, not an .h5ad file; pass the path of the .h5ad file inside it.")
    if not h5py.is_hdf5(p):
        raise InvalidDataError(
            f"{path} is not an HDF5/.h5ad file; pass a file written by anndata's write_h5ad (adata.write_h5ad(path))."
        )
    try:
        return ad.read_h5ad(p)
    except Exception as exc:  # anndata raises many types for damaged files
        raise InvalidDataError(
            f"{path} could not be read as AnnData ({type(exc).__name__}: {exc}); check that the file is complete "
            "(copy it again) and was written by anndata's write_h5ad."
        ) from None


def emit(result: dict, as_json: bool) -> None:
    """Print a result: JSON on stdout, or ``key: value`` lines."""
    if as_json:
        json.dump(result, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    for key, value in result.items():
        print(f"{key}: {value}")


def progress_enabled(args: argparse.Namespace) -> bool:
    """Progress bars unless ``--quiet`` or stderr is not a terminal (logs stay readable)."""
    if args.quiet:
        return False
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def refuse_existing_output(out: str, overwrite: bool) -> None:
    """Fail before any work when the output folder exists and ``--overwrite`` was not given."""
    if Path(out).exists() and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it, or choose another --out.")
