"""The architecture rules of docs/architecture.md, checked on the source: layers point down, no private names shared.

* The import-linter contracts in pyproject.toml (run with ``lint-imports``'s own
  entry point, one test per contract): the package's layers, and the three rooms
  of ``countvae.diagnostics``. import-linter follows every import statement,
  including imports inside functions, so a cycle cannot hide there.
* No module uses another module's private names: no ``from x import _name``, no
  ``obj._name`` on anything but ``self``, ``cls`` or a name the module defines,
  and no ``_``-prefixed module imported from elsewhere, except the package's
  shared plumbing modules (:data:`PLUMBING`). Third-party private names that
  cannot be avoided are listed in :data:`ALLOWED_PRIVATE` with the reason.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "countvae"

#: Package-private modules at the root of countvae that every layer may use (the bottom layer of the contract).
PLUMBING = {
    "_io",
    "_provenance",
    "_formatting",
    "_checks",
    "_arviz",
    "_report_files",
    "_allocator",
    "_settings",
    "_warnings",
}

#: (module path relative to countvae/, private name) -> why it is used.
ALLOWED_PRIVATE = {
    ("diagnostics/fitting/scvi_storage.py", "_seed"): (
        "scvi-tools' public seed setter reseeds every global random state; restoring the user's recorded seed after a "
        "fit must leave the states just restored alone"
    ),
    ("diagnostics/fitting/scvi_fit.py", "_validate_anndata"): (
        "scvi-tools has no public way to set up a new AnnData like the model's training data"
    ),
    ("diagnostics/fitting/scvi_fit.py", "_make_data_loader"): (
        "scvi-tools has no public way to iterate over an AnnData in the model's minibatches"
    ),
    ("data/backed.py", "_oidx"): (
        "anndata has no public way to get the rows of a view of a backed AnnData in its file; they let countvae "
        "read the view's cells from disk instead of loading them (a view of a view cannot be made, so it is one index)"
    ),
    ("data/backed.py", "_vidx"): (
        "the columns' counterpart of _oidx: the genes a view of a backed AnnData keeps, in its order, so that they are "
        "read from the file in that order"
    ),
    ("data/backed.py", "_adata_ref"): (
        "anndata has no public way to reach the backed AnnData a view was taken from; a view of a backed AnnData "
        "cannot be indexed again, so its cells are read through that parent (whose obs, var and uns it shares)"
    ),
    ("diagnostics/fitting/backends.py", "_exit"): (
        "os._exit is the standard library's public way to end a process at once: a joblib worker whose parent was "
        "killed must not wait for the fit running in its main thread"
    ),
    ("model/training.py", "_foreach_copy_"): (
        "torch has no public multi-tensor copy; the training loop keeps the last good parameters with one call "
        "per step instead of one copy per tensor"
    ),
}


def _lint_imports(contract: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache", "--contract", contract],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("contract", ["layers", "diagnostics-rooms"])
def test_import_contract_is_kept(contract):
    result = _lint_imports(contract)
    assert result.returncode == 0, f"import-linter contract {contract!r} is broken:\n{result.stdout}\n{result.stderr}"
    assert "KEPT" in result.stdout and "BROKEN" not in result.stdout


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_names(tree: ast.Module) -> set[str]:
    """The classes, functions and variables a module defines at its top level (not what it imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name))
    return names


def _private_module(parts: list[str]) -> bool:
    """Whether a countvae module path names a private module other than the shared plumbing."""
    if parts[0] != "countvae" or not any(_is_private(p) for p in parts[1:]):
        return False
    return not (len(parts) == 2 and parts[1] in PLUMBING)


def private_uses(path: Path) -> list[str]:
    """Every use of another module's private name in the file at ``path``, as ``"line: what"``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = module.split(".")
            if _private_module(parts):
                found.append(f"{node.lineno}: from {module} import ... (a private module)")
            for alias in node.names:
                if _is_private(alias.name) and not (parts == ["countvae"] and alias.name in PLUMBING):
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _private_module(alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name} (a private module)")
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in own):
                continue
            found.append(f"{node.lineno}: {ast.unparse(owner)}.{node.attr}")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def _violations() -> dict[str, list[str]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        uses = [use for use in private_uses(path) if (relative, use.rsplit(".", 1)[-1]) not in ALLOWED_PRIVATE]
        if uses:
            out[relative] = uses
    return out


def test_no_module_uses_another_modules_private_names():
    violations = _violations()
    listing = "\n".join(f"  countvae/{path}: {'; '.join(uses)}" for path, uses in violations.items())
    assert not violations, f"private names used across modules:\n{listing}"


def test_private_name_scan_finds_each_kind_of_use(tmp_path):
    source = tmp_path / "countvae" / "example.py"
    source.parent.mkdir()
    source.write_text(
        "from countvae.model.countvae import _dtype_name\n"
        "from countvae.diagnostics.fitting import _hidden\n"
        "from countvae._io import write_json_atomic\n"
        "from countvae import _formatting\n"
        "import countvae.module._secret\n"
        "class Mine:\n"
        "    _cache = None\n"
        "    def run(self, model):\n"
        "        self._cache = model._source\n"
        "        return Mine._cache, _formatting.format_value(1), model.__class__\n"
    )
    found = private_uses(source)
    assert [use.split(": ", 1)[1] for use in found] == [
        "from countvae.model.countvae import _dtype_name",
        "from countvae.diagnostics.fitting import _hidden",
        "import countvae.module._secret (a private module)",
        "model._source",
    ]


def test_allowed_private_names_are_still_used():
    """An allow-list entry whose use is gone must be removed, so that the list stays a list of real exceptions."""
    for relative, name in ALLOWED_PRIVATE:
        assert f".{name}" in (PACKAGE / relative).read_text(encoding="utf-8"), (relative, name)
