"""``.. countvae-cli::``: the command line reference, from the parser itself at build time.

Each command's ``--help`` text is rendered as it prints in a terminal 80 columns wide, under a
section per command, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from countvae.cli import build_parser

COLUMNS = "80"


@contextmanager
def _terminal_width(columns: str):
    # argparse wraps help text to $COLUMNS; fix it so the page does not depend on who builds it.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = columns
    try:
        yield
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser``, by name, in the order they were registered."""
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def help_texts(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """``(command line, help text)`` for the parser and each of its subcommands."""
    with _terminal_width(COLUMNS):
        texts = [(parser.prog, parser.format_help())]
        texts += [(sub.prog, sub.format_help()) for sub in subcommands(parser).values()]
    return texts


class CliHelp(SphinxDirective):
    """One section per command, each holding the command's ``--help`` output."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        """The sections, from the parser of the countvae on ``sys.path`` (this checkout, see conf.py)."""
        out = []
        for prog, text in help_texts(build_parser()):
            section = nodes.section(ids=[nodes.make_id(prog)], names=[nodes.fully_normalize_name(prog)])
            section += nodes.title("", "", nodes.literal(text=prog))
            section += nodes.literal_block(text, text, language="none")
            self.state.document.note_implicit_target(section, section)
            out.append(section)
        return out


def setup(app: Sphinx) -> dict[str, bool]:
    """Register the directive."""
    app.add_directive("countvae-cli", CliHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
