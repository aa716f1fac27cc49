"""Settings written once: a dataclass field is a setting's name, type, default and description.

A public function that takes many settings (``CountVAE(...)``, ``CountVAE.train``, ``invariance.verify``,
``diagnostics.report``) is written over the settings dataclass it builds: :func:`setting` declares a field with its
description, and :func:`takes_settings` turns a function receiving the built object into one taking the fields as
keywords (or the object itself), with a signature and a "Parameters" section generated from the fields. No setting is
written again in a signature, a docstring and a repacking call.

This departs from scvi-tools, whose public methods write every keyword argument explicitly and describe each again in
the docstring: a name and a default then live in up to four places that can drift apart (here they had: ``CountVAE``'s
defaults of ``n_latent`` and ``dtype`` were not ``ModelSettings``'). The generated ``__signature__`` keeps what explicit
arguments give a user at runtime: ``help()``, IPython/Jupyter tab completion, ``inspect.signature`` and the API docs
show every setting with its default. A static checker (pyright, mypy) sees ``(...)`` and accepts every call unchecked;
the settings' own validation and the unknown-keyword error check the keywords.

Keywords of scvi-tools' methods that countvae's namesakes do not take are refused by name with what to do instead
(:func:`refuses_keywords`), rather than with Python's bare ``TypeError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import textwrap
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from countvae.errors import InvalidArgumentError, UnknownArgumentError

#: The line of a docstring that :func:`takes_settings` replaces by one entry per field.
MARKER = "{settings}"

_KEYWORD, _EITHER = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
_R = TypeVar("_R")
_F = TypeVar("_F", bound=Callable[..., Any])


def setting(default: Any, doc: str) -> Any:
    """A dataclass field with ``default`` and its description ``doc`` (numpy-docstring text, one paragraph)."""
    return dataclasses.field(default=default, metadata={"doc": " ".join(doc.split())})


def field_doc(field: dataclasses.Field) -> str:
    """The description of a field declared with :func:`setting` (empty for any other field)."""
    return field.metadata.get("doc", "")


def parameters_section(cls: type, indent: str = "") -> str:
    """Numpy-docstring "Parameters" entries of ``cls``'s fields, in field order, indented by ``indent``."""
    lines = []
    for field in dataclasses.fields(cls):
        lines.append(indent + field.name)
        wrapped = textwrap.wrap(field_doc(field), 88, break_long_words=False, break_on_hyphens=False)
        lines += [indent + "    " + line for line in wrapped]
    return "\n".join(lines)


def unknown_setting(name: str, known: list[str], where: str) -> UnknownArgumentError:
    """The error for a keyword ``name`` that is none of ``known``, naming the closest match."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return UnknownArgumentError(f"{where} got an unknown argument {name!r}.{hint} Valid: {', '.join(known)}.")


def refuses_keywords(ported: dict[str, str], where: str | None = None) -> Callable[[_F], _F]:
    """Refuse, each with what to do instead, the keywords scvi-tools' method of the same name takes and ``func`` not.

    Code ported from scvi-tools names them, and Python's ``TypeError`` ("unexpected keyword argument") says neither
    why nor what to use. The decorated function raises an :class:`~countvae.errors.UnknownArgumentError` (still a
    ``TypeError``, which ported code may catch) that names each such keyword with ``ported[name]`` (the countvae
    equivalent, or that it is not offered and why); any other keyword it does not take gets :func:`unknown_setting`'s
    error, listing the parameters after the first (the model).
    ``where`` names the function in the message (default: its qualified name). None is accepted and ignored: a keyword
    that changes scvi-tools' results would then give other results silently, and one that changes nothing there
    (``silent``, ``batch_size``) would seem to do something here; refusing it costs a ported call one edit.
    """

    def decorate(func: _F) -> _F:
        parameters = inspect.signature(func).parameters
        name = f"{where or func.__qualname__}()"

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            refused = [k for k in kwargs if k not in parameters]
            for key in refused:
                if key not in ported:
                    raise unknown_setting(key, list(parameters)[1:], name)  # not the first, the model (self)
            if refused:
                listed = " ".join(f"{key}: {ported[key]}." for key in refused)
                raise UnknownArgumentError(f"{name} does not take scvi-tools' {', '.join(refused)}. {listed}")
            return func(*args, **kwargs)

        return typing.cast(_F, wrapper)

    return decorate


def settings_docstring(doc: str, cls: type) -> str:
    """``doc`` (cleaned) with its line ``{settings}`` replaced by the "Parameters" entries of ``cls``'s fields.

    Raises
    ------
    TypeError
        If ``doc`` has no such line (a mistake in the package, found at import).

    """
    doc = inspect.cleandoc(doc)
    marker = next((line for line in doc.splitlines() if line.strip() == MARKER), None)
    if marker is None:
        raise TypeError(f"A docstring that should list the fields of {cls.__name__} has no {MARKER} line.")
    return doc.replace(marker, parameters_section(cls, marker[: len(marker) - len(marker.lstrip())]))


def documents_settings(cls: type | None = None) -> Callable[[type], type]:
    """A class decorator: the class docstring's ``{settings}`` line lists the fields of ``cls`` (default: its own)."""

    def decorate(klass: type) -> type:
        klass.__doc__ = settings_docstring(klass.__doc__ or "", cls or klass)
        return klass

    return decorate


def takes_settings(
    cls: type, positional: int = 0, chosen: str | None = None
) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Let ``func(head..., obj)`` be called with the fields of dataclass ``cls`` as keywords.

    ``func``'s last parameter receives an instance of ``cls``; its other parameters (the head) stay as they are. The
    returned function takes the head's positional parameters, the first ``positional`` fields (positional-or-keyword),
    the head's keyword-only parameters, the other fields (keyword-only), and last, by its name, a keyword-only base
    object: the fields given as keywords replace those of the base (:func:`dataclasses.replace`); without one they fill
    ``cls``'s defaults. A keyword that is neither a head parameter nor a field raises an
    :class:`~countvae.errors.UnknownArgumentError` naming the closest field. The line ``{settings}`` of ``func``'s
    docstring becomes the fields' entries. ``chosen``: the name of a keyword-only parameter of ``func``, left out of
    the returned function's signature, that receives the frozenset of the fields the caller chose (those given as
    arguments; every field when a base object is given), for a ``func`` that treats a value left at its default
    otherwise than the same value given.
    """
    fields = dataclasses.fields(cls)
    types = typing.get_type_hints(cls)  # real types, not strings: sphinx links them from any module
    hints = [types[f.name] for f in fields]

    def decorate(func: Callable[..., _R]) -> Callable[..., _R]:
        own = inspect.signature(func)
        *head, base = (p for p in own.parameters.values() if p.name != chosen)
        if positional and any(p.kind == _KEYWORD for p in head):
            raise TypeError(f"{func.__qualname__}: positional settings cannot follow keyword-only parameters.")
        fields_as = [
            inspect.Parameter(f.name, _EITHER if i < positional else _KEYWORD, default=f.default, annotation=hint)
            for i, (f, hint) in enumerate(zip(fields, hints, strict=True))
        ]
        params = [p for p in head if p.kind != _KEYWORD] + fields_as[:positional]
        params += [p for p in head if p.kind == _KEYWORD] + fields_as[positional:]
        params.append(base.replace(kind=_KEYWORD, default=None, annotation=cls | None))
        public = own.replace(parameters=params)
        head_names = [p.name for p in head]
        field_names = [f.name for f in fields]
        where = f"{func.__qualname__.removesuffix('.__init__')}()"

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> _R:
            for name in kwargs:
                if name not in public.parameters:
                    raise unknown_setting(name, [n for n in public.parameters if n != "self"], where)
            given = public.bind(*args, **kwargs).arguments
            obj = given.get(base.name)
            if obj is not None and not isinstance(obj, cls):
                raise InvalidArgumentError(f"{base.name} must be a {cls.__name__}, got {type(obj).__name__}.")
            values = {name: given[name] for name in field_names if name in given}
            choices = {chosen: frozenset(values if obj is None else field_names)} if chosen else {}
            obj = cls(**values) if obj is None else dataclasses.replace(obj, **values)
            return func(**{name: given[name] for name in head_names if name in given}, **choices, **{base.name: obj})

        wrapper.__signature__ = public  # type: ignore[attr-defined]
        if func.__doc__ is not None:  # an __init__ leaves its parameters to the class docstring (documents_settings)
            wrapper.__doc__ = settings_docstring(func.__doc__, cls)
        return wrapper

    return decorate
