"""The release: a wheel built from the repository installs into a clean environment and runs ``countvae diagnose``.

The wheel is built without network (``--no-isolation``, setuptools from the test environment) from a copy
of the files the build reads, and installed without dependencies into a new virtual environment; that
environment borrows the test environment's installed dependencies (torch, pyro, ...) through a ``.pth``
line, which adds their folder to ``sys.path`` but runs none of the ``.pth`` files in it, so the editable
countvae of the test environment stays invisible. The test asserts that countvae is imported from the
wheel's install location.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]
#: What the build reads: the build configuration, the files it names, and the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "countvae")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, **kwargs)
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{' '.join(command)} failed ({proc.returncode}):\n{output}"
    return proc


def _purelib(python: Path | str) -> Path:
    """The folder where ``python`` installs pure-Python packages."""
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run([str(python), "-c", probe]).stdout.strip())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)], cwd=source)
    wheels = list(dist.glob("countvae-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed (no editable install) and the test env's dependencies."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (_purelib(python) / "zz_test_dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n", encoding="utf-8")
    install = ["install", "--no-deps", "--no-index", "--quiet", str(wheel)]
    _run([sys.executable, "-m", "pip", "--python", str(python), *install])
    return venv


def _clean_env() -> dict[str, str]:
    """The environment without anything that would put a source checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def test_wheel_contents(wheel):
    assert wheel.name == f"countvae-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"countvae-{VERSION}.dist-info"
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "countvae").rglob("*.py")}
    assert modules - names == set(), f"modules missing from the wheel: {sorted(modules - names)}"
    assert "countvae/py.typed" in names
    package_data = {f"countvae/{p}" for p in PYPROJECT["tool"]["setuptools"]["package-data"]["countvae"]}
    assert "countvae/diagnostics/reporting/report.schema.json" in package_data
    missing = sorted(p for p in package_data if not fnmatch.filter(names, p))  # a pattern must match a file
    assert missing == [], f"package data missing from the wheel: {missing}"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "tutorials/", "docs/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "Requires-Dist: torch" in metadata and "Requires-Python: >=3.11" in metadata
    assert "[console_scripts]\ncountvae = countvae.cli:main" in entry_points


def test_installed_wheel_runs_countvae_diagnose_on_the_embedded_data(installed, tmp_path):
    python, script = installed / "bin" / "python", installed / "bin" / "countvae"
    probe = "import countvae, countvae.cli; print(countvae.__file__); print(countvae.__version__)"
    where, version = _run([str(python), "-c", probe], cwd=tmp_path, env=_clean_env()).stdout.split()
    assert Path(where).parent == _purelib(python) / "countvae", f"countvae imported from {where}, not from the wheel"
    assert version == VERSION
    assert script.is_file()
    assert "--max-epochs" in _run([str(script), "diagnose", "--help"], cwd=tmp_path, env=_clean_env()).stdout
    command = [str(script), "diagnose", "--out", "diag", "--seeds", "2", "--max-epochs", "2", "--n-lpd-samples", "10"]
    proc = _run([*command, "--json", "--quiet"], cwd=tmp_path, env=_clean_env(), timeout=600)
    result = json.loads(proc.stdout)
    report = tmp_path / "diag" / "report"
    for name in ("report.html", "report.json", "report.md"):
        assert (report / name).stat().st_size > 1000, name
    saved = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert saved["provenance"]["versions"]["countvae"] == VERSION
    assert len(saved["provenance"]["fits"]) == 2
    assert result
