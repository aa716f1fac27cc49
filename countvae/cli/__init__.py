"""The ``countvae`` command line.

Each subcommand's module registers it with :func:`main`'s parser through ``register(subparsers)``.

Exit codes: 0 success; 1 failed input or run (bad data, missing file, diverged training), with a one-line message on
stderr; 2 a wrong command line (argparse's usage error); 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

from countvae import __version__
from countvae._allocator import keep_freed_memory
from countvae.cli import diagnose, fit, select, verify_invariance
from countvae.errors import CountVAEError, CountVAEWarning

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

_COMMANDS = (fit, verify_invariance, diagnose, select)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    keep_freed_memory()  # the process is ours: glibc keeps freed tensors' memory (see countvae._allocator)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        with one_line_warnings(args.command):
            return int(args.run(args) or EXIT_OK)
    except CountVAEError as exc:
        print(f"countvae {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"countvae {args.command}: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException | Warning | str) -> str:
    return " ".join(str(exc).split())


@contextlib.contextmanager
def one_line_warnings(command: str) -> Iterator[None]:
    """Show countvae's warnings as ``countvae COMMAND: warning: Category: message`` on stderr.

    A library user gets the file and line of their own call (:mod:`countvae._warnings`); on the command line that is
    the console script's ``sys.exit(main())``, which says nothing, so the warning is one line, as the errors are.
    Other packages' warnings keep Python's format and origin.
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
            print(f"countvae {command}: warning: {category.__name__}: {_one_line(message)}", file=sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
