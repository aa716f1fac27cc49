"""Options and input handling shared by the subcommands."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import anndata as ad
import h5py

from countvae._formatting import json_ready
from countvae._io import exists_as, refuse_file_in_the_way, refuse_overlong_name
from countvae.cli.settings_options import add_setting_option, setting_values
from countvae.errors import DataFileNotFoundError, InvalidArgumentError, InvalidDataError, OutputExistsError
from countvae.model import ModelSettings, TrainingPlan
from countvae.model.settings import DEFAULT_N_LATENT

__all__ = [
    "MODEL_OPTIONS",
    "TRAINING_OPTIONS",
    "Subcommands",
    "add_data_arguments",
    "add_model_arguments",
    "add_output_arguments",
    "emit",
    "exit_codes",
    "fill_closed_standard_streams",
    "flush_stdout",
    "importance_samples",
    "model_kwargs_of",
    "progress_enabled",
    "read_h5ad",
    "refuse_existing_output",
    "refuse_data_file_as_h5ad_output",
    "refuse_file_as_output",
    "refuse_inputs_in_output",
    "say",
    "tell",
    "train_kwargs_of",
]

logger = logging.getLogger("countvae.cli")

#: The model options (fields of ModelSettings) and their help.
MODEL_OPTIONS = {
    "n_latent": "latent dimensions",
    "likelihood": "count distribution",
    "decoder": "decoder",
    "n_hidden": "hidden width of the encoder (and of the MLP decoder)",
    "n_layers": "hidden layers of the encoder (and of the MLP decoder)",
}
#: The training options (fields of TrainingPlan) and their help.
TRAINING_OPTIONS = {
    "max_epochs": "training epochs",
    "batch_size": "cells per minibatch",
    "lr": "Adam learning rate",
    "early_stopping": "stop when the validation loss stalls",
}


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


def importance_samples(text: str) -> int:
    """The ``type`` of ``--n-samples``: an integer of at least 2, refused before any fitting (exit code 2)."""
    # Checked here rather than by the library, whose error comes after the fits and names its argument.
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (the estimator's spread needs two draws), got {value}")
    return value


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


def add_model_arguments(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any] | None = None,
    default_text: Mapping[str, str] | None = None,
    help_text: Mapping[str, str] | None = None,
    unset_when_absent: bool = False,
) -> None:
    """The model and training options shared by ``fit``, ``diagnose`` and ``verify-invariance``.

    Each is a field of :class:`~countvae.model.ModelSettings` (:data:`MODEL_OPTIONS`) or
    :class:`~countvae.model.TrainingPlan` (:data:`TRAINING_OPTIONS`) with its default, unless a command gives its own
    by ``dest`` in ``defaults`` (``default_text`` saying how it reads) or another help in ``help_text``. With
    ``unset_when_absent`` each parses to ``None`` when not given (:func:`add_setting_option`).
    """
    defaults, default_text, help_text = dict(defaults or {}), dict(default_text or {}), dict(help_text or {})
    unknown = sorted((set(defaults) | set(default_text) | set(help_text)) - set(MODEL_OPTIONS) - set(TRAINING_OPTIONS))
    if unknown:
        raise ValueError(f"These name no model or training option: {unknown}")
    generic_text = {
        "max_epochs": "scvi-tools' rule applied to the training cells, not all cells",
        "lr": "1e-2 with early stopping, cut to 1e-3 when the validation loss stalls; 1e-3 without",
    }
    # a command's own default is shown as it is, not the generic text (verify-invariance trains 100 epochs)
    default_text = {**{k: v for k, v in generic_text.items() if k not in defaults}, **default_text}
    defaults = {"n_latent": DEFAULT_N_LATENT, **defaults}  # the model's resolved default, not None
    for cls, options in ((ModelSettings, MODEL_OPTIONS), (TrainingPlan, TRAINING_OPTIONS)):
        for name, text in options.items():
            extra = {"default": defaults[name]} if name in defaults else {}
            add_setting_option(
                parser,
                cls,
                name,
                help_text.get(name, text),
                default_text=default_text.get(name),
                unset_when_absent=unset_when_absent,
                **extra,
            )


def model_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """The model settings given on the command line (:data:`MODEL_OPTIONS`)."""
    return setting_values(args, ModelSettings, MODEL_OPTIONS)


def train_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings given on the command line (:data:`TRAINING_OPTIONS`)."""
    return setting_values(args, TrainingPlan, TRAINING_OPTIONS)


def read_h5ad(path: str) -> ad.AnnData:
    """Read an .h5ad file, turning every way it can fail into a one-line :class:`CountVAEError`."""
    p = Path(path)
    if not p.exists():
        # a link that leads nowhere (in a loop, or to a missing path) at the path or above it is named, as for --out
        link = next((q for q in (p, *p.parents) if q.is_symlink() and not q.exists()), None)
        missing = f"{path} does not exist"
        if link is not None:
            missing = f"{link} {exists_as(link)}" + ("" if link == p else f", so {path} cannot be read")
        raise DataFileNotFoundError(f"{missing}; check the path, or pass the .h5ad file to read.")
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
    """Print a result: JSON on stdout (a non-finite number as ``null``), or ``key: value`` lines."""
    if as_json:
        say(json.dumps(json_ready(result), indent=2, allow_nan=False))
        return
    for key, value in result.items():
        say(f"{key}: {value}")


def fill_closed_standard_streams() -> None:
    """Give each closed standard descriptor (``<&-``, ``>&-``, ``2>&-``) devnull, and Python a stream on it.

    What is written there is then dropped rather than failing. joblib's worker processes flush ``sys.stderr`` as they
    start, so ``--n-jobs 2`` with stderr closed ended with an AttributeError that no one saw (exit 1). Devnull is put on
    the closed number itself (with stdin closed too, the lowest free descriptor is 0, not 2), and inherited as a
    standard descriptor is: worker processes start with it, and a file opened later cannot take descriptor 2 and
    receive what C libraries and worker processes write there.
    """
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)  # inheritable, as dup2 makes it
                os.close(null)
            os.set_inheritable(fd, True)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115 (as long as the process)


def say(text: str = "") -> None:
    """Print a line of a command's result on stdout.

    Nothing where there is no stdout (``>&-``), nor once its reader has stopped reading (``| head -1``): what is left
    for it then goes to :data:`os.devnull`, as Python's documentation of SIGPIPE recommends, so that the command ends
    as it would have, with its exit code and without a BrokenPipeError.
    """
    if sys.stdout is None:
        return
    try:
        sys.stdout.write(f"{text}\n")
    except BrokenPipeError:
        _stdout_to_devnull()


def flush_stdout() -> None:
    """Write out what stdout holds now, rather than at the interpreter's exit; see :func:`say` for a reader gone."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stream without a file descriptor: its writes keep failing
        pass
    finally:
        os.close(devnull)


def tell(text: str) -> None:
    """Print a message line (a warning, an error) on stderr.

    Nothing where there is no stderr (``2>&-``, where ``sys.stderr`` is None and :func:`print` would write the message
    on stdout, into the ``--json`` result), nor once its reader has stopped reading (``2>&1 | head -1``): as logging
    does with its records.
    """
    if sys.stderr is None:
        return
    with contextlib.suppress(BrokenPipeError):
        print(text, file=sys.stderr)


def progress_enabled(args: argparse.Namespace) -> bool:
    """Progress bars unless ``--quiet`` or stderr is not a terminal (logs stay readable)."""
    if args.quiet:
        return False
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _within(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, as written (``..`` resolved) or with links followed."""
    written = Path(os.path.abspath(path)), Path(os.path.abspath(folder))
    try:
        pairs = (written, (path.resolve(), folder.resolve()))
    except (RuntimeError, OSError):  # a link loop at or above an input, which reading it refuses; --out's is refused
        pairs = (written,)
    return any(p.is_relative_to(f) for p, f in pairs)


def refuse_inputs_in_output(out: str, inputs: Mapping[str, str | None], replaced: Iterable[str] = ("",)) -> None:
    """Fail before any work when ``--out`` is empty, a file, or writing it could delete an input or the working folder.

    Parameters
    ----------
    out
        The ``--out`` folder.
    inputs
        Each input as the message names it (``"the data file"``) and its path (``None``: not given).
    replaced
        The folders under ``out`` that the command writes whole and replaces with ``--overwrite`` (``""``: ``out``
        itself): whatever they hold would be deleted, so they must hold no input (checked with or without
        ``--overwrite``, whose remedy the existing folder would otherwise suggest), and none may be a file.

    Raises
    ------
    InvalidArgumentError
        If ``out`` is empty.
    OutputExistsError
        If ``out`` or a replaced folder is a file, or a replaced folder is or holds an input or the working folder.

    """
    if not out.strip():
        raise InvalidArgumentError("--out is empty; give the folder to write, e.g. --out results.")
    refuse_file_as_output(out)
    named = {**{label: Path(path) for label, path in inputs.items() if path}, "the working folder": Path.cwd()}
    for sub in replaced:
        folder = Path(out, sub)
        refuse_file_as_output(str(folder))
        for label, path in named.items():
            if _within(path, folder):
                where = f"--out {out}" if not sub else str(folder)
                shown = label if label == "the working folder" else f"{label} {path}"
                verb = "is" if _within(folder, path) else "holds"
                raise OutputExistsError(
                    f"{where} {verb} {shown}; this command replaces {folder} whole, so it would be deleted. Choose "
                    "another --out (a new folder)."
                )


def refuse_data_file_as_h5ad_output(write_h5ad: str | None, data: str | None) -> None:
    """Fail before any work when ``--write-h5ad`` is a name too long to write, or the data file being analysed.

    The library sees the data in memory, not its file, so the command line checks the file itself.
    """
    if write_h5ad is None:
        return
    written = Path(write_h5ad)
    refuse_overlong_name(written)
    if data is not None and written.exists() and Path(data).exists() and written.samefile(data):
        raise OutputExistsError(
            f"--write-h5ad {written} is the data file being analysed; the analysed copy holds only the chosen "
            "genes, so --overwrite would replace the file's other counts. Write it to another file."
        )


def refuse_file_as_output(out: str) -> None:
    """Fail before any work when ``--out`` names a file (perhaps the data just read), or a name too long to write.

    A file or a symbolic link that leads nowhere (to a missing path, or in a loop) at ``out`` or a folder above it is
    named (:func:`~countvae._io.refuse_file_in_the_way`), before any ``resolve()`` meets the loop.
    """
    refuse_overlong_name(out)
    refuse_file_in_the_way(out, "choose another --out")


def refuse_existing_output(out: str, overwrite: bool) -> None:
    """Fail before any work when the output folder exists and ``--overwrite`` was not given, or is a file."""
    refuse_file_as_output(out)
    if Path(out).exists() and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it, or choose another --out.")


# ``name=value`` in a message, not inside a call's argument list (after "(" or ", ") nor inside a word, a path or a
# quoted label (only after a space, a backtick or the start: "fits/n_latent=2__decoder=linear" is a folder), with
# optional backticks and an optional parenthesised option that already says the same ("overwrite=True (--overwrite)",
# "(countvae diagnose --overwrite)", "(--overwrite on the command line)"), dropped with the argument it repeats.
_ARGUMENT = re.compile(
    r"(?<![(,] )(?<![^\s`])`?\b([a-z][a-z0-9_]*)=(\.\.\.|None|True|False|'[^']*'|[\w.+-]+)`?"
    r"( \((?:countvae [a-z-]+ )?--[\w-]+(?: on the command line)?\))?"
)

#: Library arguments a command sets through an option of another name, by command: diagnose's report estimates each
#: held-out cell's log p(x) with ``n_samples`` set to its ``--n-lpd-samples`` (the estimator's warnings name
#: ``n_samples``); ``select`` and ``fit`` call that option ``--n-samples``.
PASSED_AS: dict[str, dict[str, str]] = {"diagnose": {"n_samples": "n_lpd_samples"}}

# An argument check's ``name must be ...`` (countvae._checks) at the start of the message or of a sentence.
_CHECKED = re.compile(r"(?:^|(?<=[.!?] ))([a-z][a-z0-9_]*)(?= must be\b)")


def in_option_terms(message: str, options: dict[str, object]) -> str:
    """The library's remedies in the command's own terms: ``layer=...`` becomes ``--layer NAME``.

    The package's errors name Python arguments (they are raised by the library a script calls); on the command line
    each argument that is one of the command's ``options`` (argparse's destinations, ``--n-top-genes`` for
    ``n_top_genes``) is named as its option: ``name=True`` as the flag, ``name=None`` as "no ``--name``", ``name=...``
    as ``--name VALUE``, ``name=5`` as ``--name 5``, ``name=False`` as ``--no-name`` where that is the option (the
    destination ``no_name``: verify-invariance's ``--no-controls`` for ``controls=False``, or a ``no_name`` entry that
    ``main`` adds for each switch with a ``--no-`` form, such as ``--no-early-stopping``), and an argument
    check's ``name must be ...`` at the start of a sentence as ``--name must be ...``. Arguments of a call
    (``setup_anndata(adata, layer=...)``) and names that are not options are left as written. An argument the
    command sets through another option (:data:`PASSED_AS`, by the ``command`` in ``options``) is named as that option.
    """
    passed_as = PASSED_AS.get(str(options.get("command")), {})

    def is_option(name: str) -> bool:
        return name in options and name not in ("command", "run")

    def option(match: re.Match[str]) -> str:
        name, value = passed_as.get(match.group(1), match.group(1)), match.group(2)
        if value == "False" and is_option(f"no_{name}"):
            return "--no-" + name.replace("_", "-")
        if not is_option(name):
            return match.group(0)
        flag = "--" + name.replace("_", "-")
        if value == "True":
            return flag
        if value == "None":
            return f"no {flag}"
        return f"{flag} {'VALUE' if value == '...' else value}"

    def checked(match: re.Match[str]) -> str:
        name = passed_as.get(match.group(1), match.group(1))
        return "--" + name.replace("_", "-") if is_option(name) else name

    return _CHECKED.sub(checked, _ARGUMENT.sub(option, message))
