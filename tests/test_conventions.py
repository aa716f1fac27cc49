"""House rules a user relies on: progress bars that can be silenced, no prints, warnings at the caller's line, one arviz
module, the CLI contract."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import countvae as cv
from countvae import diagnostics
from countvae.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "countvae"
COMMANDS = ("fit", "verify-invariance", "diagnose", "select")


def _calls_and_imports(path: Path) -> tuple[list[str], list[str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    imports = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imports += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    return calls, imports


def test_library_code_never_prints():
    offenders = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if "cli" not in path.relative_to(PACKAGE).parts and "print" in _calls_and_imports(path)[0]
    ]
    assert offenders == [], f"print() in library code (use logging): {offenders}"


def test_warnings_are_raised_at_the_callers_line():
    # warnings.warn with a fixed stacklevel names the right line for one call path only; warn_at_caller for all
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr == "warn" and getattr(func.value, "id", "") == "warnings":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    expected = [f"countvae/_warnings.py:{_warn_line()}"]
    assert offenders == expected, f"use countvae._warnings.warn_at_caller: {offenders}"


def _warn_line() -> int:
    """The line of warn_at_caller's own call of warnings.warn."""
    lines = (PACKAGE / "_warnings.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith("warnings.warn("))


def test_arviz_is_imported_by_one_module_only():
    importers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(m == "arviz" or m.startswith("arviz.") for m in _calls_and_imports(path)[1])
    }
    assert importers == {"_arviz.py"}


@pytest.fixture(scope="module")
def tiny():
    adata = cv.data.simulate(n_cells=120, n_genes=20, n_latent=2, decoder="linear", seed=2)
    cv.CountVAE.setup_anndata(adata)
    return adata


def _quiet_and_shown(capfd, run, label: str) -> None:
    capfd.readouterr()
    run(False)
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), f"{label}: output although progress_bar=False: {out!r} {err!r}"
    run(True)
    out, err = capfd.readouterr()
    assert label in err, f"no {label!r} progress bar on stderr: {err[-300:]!r}"
    assert out == ""


def test_progress_bars_on_long_steps_and_silence_without_them(tiny, capfd):
    model = cv.CountVAE(tiny, n_latent=2, decoder="linear")
    _quiet_and_shown(capfd, lambda show: model.train(max_epochs=2, progress_bar=show), "Training")
    _quiet_and_shown(capfd, lambda show: model.get_log_predictive_density(n_samples=4, progress_bar=show), "log p(x)")
    options = {"model_kwargs": {"n_latent": 2}, "train_kwargs": {"max_epochs": 2}, "torch_threads": 1}
    runs = {}

    def fit(show):
        runs[show] = diagnostics.fit_seeds(tiny, seeds=[0, 1], progress_bar=show, **options)

    _quiet_and_shown(capfd, fit, "Seeds")
    small = {"n_lpd_samples": 4, "max_lpd_cells": 8, "n_rhat_draws": 8, "n_rhat_cells": 4, "ica": False}
    _quiet_and_shown(capfd, lambda show: diagnostics.report(runs[True], progress_bar=show, **small), "diagnostics")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_documents_examples_json_and_exit_codes(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"countvae {command}" in text
    assert "--json" in text and "--quiet" in text
    assert "exit codes:" in text
    for code in ("0 ", "1 ", "2 ", "130"):
        assert f"\n  {code}" in text, (command, code)


def test_every_registered_command_is_checked():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert tuple(sub.choices) == COMMANDS


def test_python_dash_m_and_the_console_script():
    proc = subprocess.run([sys.executable, "-m", "countvae", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("countvae "), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "countvae"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "COMMAND" in proc.stderr
    # `pip install .` creates the `countvae` command from this entry point.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"countvae": "countvae.cli:main"}
    module, function = scripts["countvae"].split(":")
    assert getattr(__import__(module, fromlist=[function]), function) is main
