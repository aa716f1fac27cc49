"""Command-line options made from the fields of a settings dataclass.

An option made here has the field's name as ``dest``, the field's default (unless the command states another), a
``Literal`` field's values as ``choices``, an ``int``, ``float`` or ``str`` field's ``type``, and a help ending with
the default. :func:`setting_values` reads the settings back from the parsed arguments by field name, so a setting's
name and default are written once, in its dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin

__all__ = ["add_setting_option", "setting_values"]

#: Marks "no default given by the command": the field's own default applies.
_FIELD_DEFAULT: Any = object()


def _choices(cls: type, name: str) -> list[Any] | None:
    """The values of a ``Literal`` field (``Literal[...] | None`` too), else ``None``."""
    hint = typing.get_type_hints(cls)[name]
    options = get_args(hint) if get_origin(hint) is not Literal else (hint,)
    literals = [arg for arg in options if get_origin(arg) is Literal]
    return None if len(literals) != 1 else list(get_args(literals[0]))


def _scalar_type(cls: type, name: str) -> type | None:
    """``int``, ``float`` or ``str`` when the field is one of them (or it or ``None``), else ``None``."""
    hint = typing.get_type_hints(cls)[name]
    options = [arg for arg in (get_args(hint) or (hint,)) if arg is not type(None)]
    return options[0] if len(options) == 1 and options[0] in (int, float, str) else None


def add_setting_option(
    parser: argparse.ArgumentParser,
    cls: type,
    name: str,
    help: str,  # noqa: A002 - argparse's own name for it
    *,
    default: Any = _FIELD_DEFAULT,
    default_text: str | None = None,
    unset_when_absent: bool = False,
    **kwargs: Any,
) -> argparse.Action:
    """Add ``--name`` (underscores as hyphens) for the field ``name`` of ``cls``.

    Parameters
    ----------
    parser
        The command's parser.
    cls, name
        The settings dataclass and its field.
    help
        What the option does; ``" (default: ...)"`` is appended.
    default
        The command's default, where it differs from the field's (e.g. an embedded data set's).
    default_text
        How the default reads in the help, where its value alone would not say it.
    unset_when_absent
        Parse to ``None`` when the option is not given, so the command can tell a given option from its default;
        the help still shows the default, which the settings object applies.
    **kwargs
        Given to :meth:`argparse.ArgumentParser.add_argument` (``type``, ``metavar``, ...). A
        ``bool`` field is a ``--name/--no-name`` pair unless ``action`` is given.

    """
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if field is None:  # a mistake in the package, found when the parser is built
        raise ValueError(f"{cls.__name__} has no field {name!r}; an option must name one of its fields.")
    value = field.default if default is _FIELD_DEFAULT else default
    if isinstance(field.default, bool) and "action" not in kwargs:
        kwargs["action"] = argparse.BooleanOptionalAction
    choices = _choices(cls, name)
    if choices is not None and "choices" not in kwargs:
        kwargs["choices"] = choices
    scalar = _scalar_type(cls, name)
    if scalar is not None and not {"type", "action", "choices"} & set(kwargs):
        kwargs["type"] = scalar
    if default_text is None:
        default_text = "on" if value is True else "off" if value is False else value
    text = f"{help} (default: {default_text})".replace("%", "%%")
    value = None if unset_when_absent else value
    return parser.add_argument("--" + name.replace("_", "-"), dest=name, default=value, help=text, **kwargs)


def setting_values(args: argparse.Namespace, cls: type, names: typing.Iterable[str] | None = None) -> dict[str, Any]:
    """The parsed values of the options named like fields of ``cls`` (of ``names`` only, when given)."""
    wanted = [f.name for f in dataclasses.fields(cls)] if names is None else list(names)
    return {name: getattr(args, name) for name in wanted if hasattr(args, name)}
