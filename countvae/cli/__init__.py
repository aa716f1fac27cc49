"""The ``countvae`` command line.

Each subcommand's module registers it with :func:`main`'s parser through ``register(subparsers)``.

Exit codes: 0 success; 1 failed input or run (bad data, missing file, diverged training), with a one-line message on
stderr; 2 a wrong command line (argparse's usage error); 130 interrupted by Ctrl-C. A reader of the output that stops
early (``| head -1``) changes none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from countvae import __version__
from countvae._allocator import keep_freed_memory
from countvae.cli import diagnose, fit, select, verify_invariance
from countvae.cli.common import fill_closed_standard_streams, flush_stdout, in_option_terms, tell
from countvae.diagnostics.fitting.parallelism import backed_remedy_off
from countvae.errors import CountVAEError, CountVAEWarning

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

_COMMANDS = (fit, verify_invariance, diagnose, select)


class _Parser(argparse.ArgumentParser):
    """A parser that takes only whole option names, and makes its subcommands' parsers of the same class.

    With argparse's prefix matching, ``countvae diagnose --seed 3`` was taken as ``--seeds 3`` (the number of
    seeds), where ``fit --seed`` is a seed; a misspelt or partial option is a wrong command line (exit code 2).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)
        #: Each subcommand's parser by name (set by :func:`build_parser`).
        self.commands: dict[str, argparse.ArgumentParser] = {}


def build_parser() -> _Parser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="countvae",
        description=(
            "Fit probabilistic count VAEs to single-cell counts and measure which of their outputs "
            "the data determine and which are an arbitrary choice of latent coordinates."
        ),
        epilog=(
            "Exit codes: 0 success, 1 bad input or a failed run (one-line message on stderr), "
            "2 wrong command line, 130 interrupted. Every command takes --json (the result as JSON on stdout) "
            "and --quiet. Run 'countvae COMMAND --help' for each command's options and examples."
        ),
    )
    parser.add_argument("--version", action="version", version=f"countvae {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in _COMMANDS:
        module.register(sub)
    parser.commands = dict(sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    keep_freed_memory()  # the process is ours: glibc keeps freed tensors' memory (see countvae._allocator)
    fill_closed_standard_streams()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = getattr(parser, "commands", {}).get(args.command)  # a parser built elsewhere may not have them
        negatable = [] if command is None else _negatable(command, vars(args))
        return _run(args, {**vars(args), **{f"no_{name}": True for name in negatable}})
    finally:
        # Left to the interpreter's exit, a reader gone (``| head -1``) would be a BrokenPipeError and exit code 120.
        flush_stdout()


def _negatable(command: argparse.ArgumentParser, options: dict[str, object]) -> list[str]:
    """The ``options`` whose switch has a ``--no-`` form in ``command`` (``--early-stopping/--no-early-stopping``).

    Read from the command's help, which lists every option string (argparse keeps its actions in private fields).
    """
    usage = command.format_help()
    return [name for name in options if re.search(rf"--no-{name.replace('_', '-')}(?![\w-])", usage)]


def _run(args: argparse.Namespace, options: dict[str, object]) -> int:
    """Run the parsed command; ``options``: its destinations, and ``no_NAME`` for each switch with a ``--no-`` form."""
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        with one_line_warnings(args.command, options), backed_remedy_off():  # the command reads files whole
            return int(args.run(args) or EXIT_OK)
    except CountVAEError as exc:
        tell(f"countvae {args.command}: error: {in_option_terms(_one_line(exc), options)}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        tell(f"countvae {args.command}: interrupted")
        return 130


def _one_line(exc: BaseException | Warning | str) -> str:
    return " ".join(str(exc).split())


@contextlib.contextmanager
def one_line_warnings(command: str, options: dict[str, object] | None = None) -> Iterator[None]:
    """Show countvae's warnings as ``countvae COMMAND: warning: Category: message`` on stderr.

    A library user gets the file and line of their own call (:mod:`countvae._warnings`); on the command line that is
    the console script's ``sys.exit(main())``, which says nothing, so the warning is one line, as the errors are.
    Other packages' warnings keep Python's format and origin. ``options``: the command's arguments, whose names the
    message gives as options (:func:`in_option_terms`).
    """
    previous = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, CountVAEWarning):
            text = in_option_terms(_one_line(message), options or {})
            tell(f"countvae {command}: warning: {category.__name__}: {text}")
        else:
            previous(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
