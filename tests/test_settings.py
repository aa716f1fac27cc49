"""Settings written once: a public function's keywords, signature and docstring come from its settings dataclass."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import countvae as cv
from countvae import diagnostics, invariance
from countvae._settings import field_doc
from countvae.invariance import VerifySettings
from countvae.model import ModelSettings, TrainingPlan

# (public function, its settings dataclass, the keyword that takes a whole settings object, the docstring)
SETTINGS_FUNCTIONS = [
    (cv.CountVAE, ModelSettings, "settings", cv.CountVAE.__doc__),
    (cv.CountVAE.train, TrainingPlan, "plan", cv.CountVAE.train.__doc__),
    (invariance.verify, VerifySettings, "settings", invariance.verify.__doc__),
    (diagnostics.report, diagnostics.ReportSettings, "settings", diagnostics.report.__doc__),
    (diagnostics.diagnose, diagnostics.DiagnoseSettings, "settings", diagnostics.diagnose.__doc__),
    (diagnostics.plan_diagnose, diagnostics.DiagnoseSettings, "settings", diagnostics.plan_diagnose.__doc__),
    (diagnostics.fit_seeds, diagnostics.FitSeedsSettings, "settings", diagnostics.fit_seeds.__doc__),
    (
        diagnostics.compare_restrictions,
        diagnostics.RestrictionComparisonSettings,
        "settings",
        diagnostics.compare_restrictions.__doc__,
    ),
]


def _documented_parameters(doc: str) -> list[str]:
    """The names of a numpy docstring's "Parameters" entries, in order."""
    section = doc.split("Parameters\n----------\n", 1)[1].split("\n\n", 1)[0]  # entries end at the blank line
    return [line for line in section.splitlines() if line and not line.startswith(" ")]


@pytest.mark.parametrize(("function", "settings", "keyword", "doc"), SETTINGS_FUNCTIONS)
def test_signature_and_docstring_list_every_field_with_its_default(function, settings, keyword, doc):
    parameters = inspect.signature(function).parameters
    for field in dataclasses.fields(settings):
        assert field.name in parameters, field.name
        assert parameters[field.name].default == field.default, field.name
        assert field_doc(field), f"{settings.__name__}.{field.name} has no description"
    assert parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY and parameters[keyword].default is None
    documented = _documented_parameters(doc)
    assert documented == [n for n in parameters if n != "self"]  # every parameter once, in signature order
    assert "{settings}" not in doc


def test_positional_forms_of_the_public_contract_are_kept():
    model = inspect.signature(cv.CountVAE).parameters
    assert [n for n, p in model.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        "adata",
        "n_latent",
        "likelihood",
        "decoder",
    ]
    train = inspect.signature(cv.CountVAE.train).parameters
    assert [n for n, p in train.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        "self",
        "max_epochs",
        "batch_size",
        "lr",
        "train_size",
        "early_stopping",
        "seed",
        "progress_bar",
    ]


def test_keywords_positions_and_a_settings_object_build_the_same_settings(small_adata):
    by_keyword = cv.CountVAE(small_adata, n_latent=2, likelihood="poisson", decoder="linear", dtype=torch.float64)
    by_position = cv.CountVAE(small_adata, 2, "poisson", "linear", dtype="float64")
    assert by_keyword.settings == by_position.settings
    assert by_keyword.settings == ModelSettings(n_latent=2, likelihood="poisson", decoder="linear", dtype="float64")
    copied = cv.CountVAE(small_adata, settings=by_keyword.settings)
    assert copied.settings == by_keyword.settings
    changed = cv.CountVAE(small_adata, settings=by_keyword.settings, n_hidden=16)
    assert changed.settings == dataclasses.replace(by_keyword.settings, n_hidden=16)
    assert cv.CountVAE(small_adata).settings == ModelSettings()  # defaults: one source
    assert ModelSettings().n_latent == 10


def test_train_with_a_plan_equals_train_with_its_keywords(small_adata):
    plan = TrainingPlan(max_epochs=2, batch_size=64, seed=3, progress_bar=False)
    a = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(plan=plan)
    b = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(2, 64, seed=3, progress_bar=False)
    c = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(plan=dataclasses.replace(plan, seed=0), seed=3)
    for other in (b, c):
        assert a.history["loss_train"].tolist() == other.history["loss_train"].tolist()


def test_an_unknown_keyword_names_the_closest_valid_one(small_adata):
    with pytest.raises(cv.errors.InvalidArgumentError, match=r"'max_epoch'\. Did you mean 'max_epochs'\?"):
        cv.CountVAE(small_adata, n_latent=2).train(max_epoch=3)
    with pytest.raises(cv.errors.InvalidArgumentError, match=r"'n_latnt'\. Did you mean 'n_latent'\?.*settings"):
        cv.CountVAE(small_adata, n_latnt=2)
    with pytest.raises(cv.errors.InvalidArgumentError, match="plan must be a TrainingPlan"):
        cv.CountVAE(small_adata, n_latent=2).train(plan={"max_epochs": 2})
    with pytest.raises(TypeError, match="multiple values"):
        cv.CountVAE(small_adata, 2, n_latent=3)
