"""The command line's options are the library's settings: the same names and defaults, read back by name."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

import countvae as cv
from countvae.cli import build_parser
from countvae.cli import diagnose as diagnose_command
from countvae.cli.common import MODEL_OPTIONS, TRAINING_OPTIONS, model_kwargs_of, train_kwargs_of
from countvae.cli.verify_invariance import MODEL_DEFAULTS as VERIFY_DEFAULTS
from countvae.cli.verify_invariance import _fit_settings
from countvae.diagnostics import DiagnoseSettings, DownstreamRequest, ReportSettings
from countvae.model import ModelSettings, TrainingPlan

ROOT = Path(__file__).resolve().parents[2]


def _parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def _field_defaults(cls: type, names) -> dict:
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return {name: defaults[name] for name in names}


def test_every_diagnose_setting_is_an_option_or_made_from_options():
    fields = {f.name for f in dataclasses.fields(DiagnoseSettings)}
    own, built = set(diagnose_command.OWN_OPTIONS), set(diagnose_command.BUILT_FROM)
    assert own | built == fields and not own & built
    args = _parsed("diagnose")
    for dests in diagnose_command.BUILT_FROM.values():
        assert all(hasattr(args, dest) for dest in dests), dests
    assert {name: getattr(args, name) for name in own} == _field_defaults(DiagnoseSettings, own)
    report_options = diagnose_command.REPORT_OPTIONS
    parsed = {name: getattr(args, name) for name in report_options}
    # options left unset parse to None (--restrictions refuses them when given) and take the library's default
    unset = {name for name, value in parsed.items() if value is None}
    assert unset == {"ica", "equivalence_margin", "max_fit_cells"}
    _, settings = diagnose_command.diagnose_settings(args)
    assert settings.report_kwargs == _field_defaults(ReportSettings, report_options)


def test_model_and_training_options_have_the_library_defaults():
    args = _parsed("fit")
    resolved = ModelSettings()  # n_latent None resolves to the model's default
    assert model_kwargs_of(args) == {name: getattr(resolved, name) for name in MODEL_OPTIONS}
    assert train_kwargs_of(args) == _field_defaults(TrainingPlan, TRAINING_OPTIONS)
    # verify-invariance states its own defaults (a model small enough for the exact reference); the others are kept.
    # Its options parse to None when absent, so that --model refuses every one given; the fit fills in the defaults.
    verify = _parsed("verify-invariance")
    assert set(model_kwargs_of(verify).values()) | set(train_kwargs_of(verify).values()) == {None}
    model, train = _fit_settings(verify)
    assert model | train == model_kwargs_of(args) | train_kwargs_of(args) | VERIFY_DEFAULTS


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    adata = cv.data.simulate(n_cells=120, n_genes=30, n_latent=2, decoder="linear", seed=2)
    adata.obs["group"] = ["a", "b"] * 60
    path = tmp_path_factory.mktemp("data") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def test_the_command_line_gives_the_settings_it_names(data_file, tmp_path):
    argv = [str(data_file), "--seeds", "3", "--n-latent", "2", "--decoder", "linear", "--no-ica", "--quiet"]
    argv += ["--n-lpd-samples", "7", "--markers", "gene0, gene3", "--de", "group", "--out", str(tmp_path / "d")]
    _, settings = diagnose_command.diagnose_settings(_parsed("diagnose", *argv))
    library = DiagnoseSettings(
        seeds=3,
        model_kwargs={"n_latent": 2, "likelihood": "nb", "decoder": "linear", "n_hidden": 128, "n_layers": 1},
        train_kwargs={"max_epochs": None, "batch_size": 128, "lr": None, "early_stopping": True},
        markers=["gene0", "gene3"],
        downstream=DownstreamRequest(groupby="group"),
        report_kwargs={
            "ica": False,
            "n_lpd_samples": 7,
            "equivalence_margin": ReportSettings().equivalence_margin,
            "max_fit_cells": ReportSettings().max_fit_cells,
        },
        out_dir=str(tmp_path / "d"),
    )
    assert settings == library


def _imports(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [(alias.name, "") for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    found += [
        (node.module or "", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]
    return [(module, name) for module, name in found if module.split(".")[0] == "countvae"]


def _public_names(module_name: str) -> set[str]:
    """A module's ``__all__``, or without one the public names it defines (as the API pages list them)."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", "") == module_name}


def test_the_diagnose_command_imports_only_public_names():
    # Public: a public name of countvae or of one of its subpackages or modules (countvae.X), or the command
    # line's own modules.
    offenders = []
    for module, name in _imports(ROOT / "countvae" / "cli" / "diagnose.py"):
        if module.startswith("countvae.cli"):
            continue
        parts = module.split(".")
        public = len(parts) <= 2 and not any(p.startswith("_") for p in parts)
        if not public or name not in _public_names(module):
            offenders.append(f"{module}.{name}")
    assert offenders == []
    assert "InvalidArgumentError" in _public_names("countvae.errors")  # a module without __all__
    assert "default_epochs" not in _public_names("countvae.diagnostics")  # an internal name is refused
