"""Write one API reference page per public namespace of countvae, from what the namespace exports.

The pages list the namespace's ``__all__`` (or, without one, the public functions and classes it
defines) in autosummary tables; autosummary then writes a page per object. The constants it exports are
shown on the namespace's page with their values. Moving code between
private modules therefore changes nothing here: only a new or renamed public namespace needs an
entry in :data:`NAMESPACES`. An object that several namespaces export (``CountVAE`` is in both
``countvae`` and ``countvae.model``) is documented once, under the first of them in
:data:`NAMESPACES`, so that every cross-reference to it has one target.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType

#: Public namespaces of the API reference, in page order; each gets a page listing what it exports.
NAMESPACES = [
    "countvae",
    "countvae.model",
    "countvae.data",
    "countvae.invariance",
    "countvae.diagnostics",
    "countvae.ica",
    "countvae.metrics",
    "countvae.plotting",
    "countvae.errors",
]

#: Section title and the predicate that puts an object in it, in page order.
_GROUPS = (
    ("Classes", lambda obj: inspect.isclass(obj) and not issubclass(obj, BaseException | Warning)),
    ("Functions", inspect.isroutine),
    ("Exceptions and warnings", lambda obj: inspect.isclass(obj) and issubclass(obj, BaseException | Warning)),
)


def public_names(module: ModuleType) -> list[str]:
    """The functions and classes a namespace offers: its ``__all__``, or the public ones it defines itself."""
    if hasattr(module, "__all__"):
        names = [n for n in module.__all__ if not n.startswith("_")]
    else:
        names = [
            n
            for n, obj in vars(module).items()
            if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__
        ]
    return sorted(n for n in names if inspect.isclass(getattr(module, n)) or inspect.isroutine(getattr(module, n)))


def public_constants(module: ModuleType) -> list[str]:
    """The values a namespace exports in ``__all__`` that are neither classes, functions nor modules."""
    return sorted(
        n
        for n in getattr(module, "__all__", [])
        if not n.startswith("_")
        and not (inspect.isclass(obj := getattr(module, n)) or inspect.isroutine(obj) or inspect.ismodule(obj))
    )


def home_namespaces(namespaces: list[str]) -> dict[str, dict[str, str]]:
    """Per namespace, each public name and the namespace whose page documents it: the first one exporting it."""
    home: dict[int, str] = {}
    homes = {}
    for namespace in namespaces:
        module = importlib.import_module(namespace)
        names = public_names(module)
        homes[namespace] = {n: home.setdefault(id(getattr(module, n)), namespace) for n in names}
    return homes


def namespace_page(namespace: str, homes: dict[str, str]) -> str:
    """The reStructuredText of one namespace's page: its docstring, then one autosummary table per kind.

    ``homes`` maps each public name of the namespace to the namespace that documents it; names
    documented elsewhere are listed as links after the tables.
    """
    module = importlib.import_module(namespace)
    lines = [f"``{namespace}``", "=" * (len(namespace) + 4), "", f".. automodule:: {namespace}", "   :no-members:", ""]
    lines += [f".. currentmodule:: {namespace}", ""]
    own = [n for n, home in homes.items() if home == namespace]
    for title, belongs in _GROUPS:
        members = [n for n in own if belongs(getattr(module, n))]
        if not members:
            continue
        lines += [title, "-" * len(title), "", ".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
        lines += [f"   {n}" for n in members] + [""]
    # constants by name (equal values are not one object: 10 is cached), on the first namespace exporting them
    constants = [n for n in public_constants(module) if _constant_home(n) == namespace]
    if constants:
        lines += ["Constants", "-" * 9, ""]
        for n in constants:
            # py:data with the value and the "#:" comment of its definition (autodata would show a dict's own
            # docstring, as a re-exported value carries no comment of its own)
            lines += [f".. py:data:: {n}", f"   :value: {getattr(module, n)!r}", ""]
            lines += [f"   {_definition_comment(n, getattr(module, n))}", ""]
    elsewhere = [f":obj:`~{home}.{n}`" for n, home in homes.items() if home != namespace]
    if elsewhere:
        lines += ["Also importable from here", "-" * 25, "", ", ".join(elsewhere) + ".", ""]
    return "\n".join(lines)


def _definition_comment(name: str, value: object) -> str:
    """The ``#:`` comment above the package's definition of ``name`` (the module whose global it is)."""
    from sphinx.pycode import ModuleAnalyzer, PycodeError

    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("countvae") and vars(module).get(name) is value:
            try:
                comment = ModuleAnalyzer.for_module(module_name).find_attr_docs().get(("", name))
            except PycodeError:
                continue
            if comment:
                return " ".join(line.strip() for line in comment if line.strip())
    return "A constant of the public API."


def _constant_home(name: str) -> str:
    return next(ns for ns in NAMESPACES if name in public_constants(importlib.import_module(ns)))


def index_page(namespaces: list[str]) -> str:
    """The reStructuredText of the reference's front page: one entry per namespace, in the given order."""
    lines = ["API reference", "=============", ""]
    lines += ["Every public function, class and constant, by the namespace it is imported from.", ""]
    lines += [".. toctree::", "   :maxdepth: 1", ""] + [f"   {namespace}" for namespace in namespaces]
    return "\n".join(lines) + "\n"


def _write_if_changed(path: Path, text: str) -> None:
    # unchanged pages keep their timestamps, so incremental builds stay incremental
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def write_api_pages(namespaces: list[str], out_dir: Path) -> None:
    """Write ``index.rst`` and ``<namespace>.rst`` for each namespace into ``out_dir``.

    Pages of namespaces or objects that no longer exist (autosummary's stubs in ``generated/``) are
    removed, so a renamed function leaves no page behind that fails to import.
    """
    (out_dir / "generated").mkdir(parents=True, exist_ok=True)
    _write_if_changed(out_dir / "index.rst", index_page(namespaces))
    objects = set()
    for namespace, homes in home_namespaces(namespaces).items():
        _write_if_changed(out_dir / f"{namespace}.rst", namespace_page(namespace, homes))
        objects |= {f"{namespace}.{name}.rst" for name, home in homes.items() if home == namespace}
    wanted = {"index.rst", *(f"{namespace}.rst" for namespace in namespaces)}
    for stale in [p for p in out_dir.glob("*.rst") if p.name not in wanted]:
        stale.unlink()
    for stale in [p for p in (out_dir / "generated").glob("*.rst") if p.name not in objects]:
        stale.unlink()
