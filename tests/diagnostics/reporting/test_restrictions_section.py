"""The restrictions section of the multi-seed report: it runs inside ``report(...)`` on restricted fits, its
tables are those of ``compare_restrictions`` on the same fits, it is refused without them, and it shows in
report.html, report.md and report.json (which its schema checks)."""

from __future__ import annotations

import copy
import importlib
import json

import numpy as np
import pandas as pd
import pytest
import torch
from diagnostics_helpers import assert_valid_report_json
from jsonschema import ValidationError

import countvae as cv
from countvae.diagnostics import compare_restrictions, load_report, report
from countvae.diagnostics.analyses.markers import marker_matrix
from countvae.diagnostics.analyses.restrictions import pair_agreement
from countvae.diagnostics.fitting.restrictions import MODEL_SETTINGS, fit_restrictions
from countvae.diagnostics.reporting.restriction_readout import RestrictionRequest
from countvae.diagnostics.reporting.sections.restrictions import REPORT_TABLES, TITLE
from countvae.errors import InvalidArgumentError

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_bootstrap=20)
#: The models compare_restrictions(adata, "laplace,ica", model_kwargs={"n_hidden": 16}) fits.
MODELS = {name: {"decoder": "linear", "n_hidden": 16, **MODEL_SETTINGS[name]} for name in ("unrestricted", "laplace")}
TRAIN = {"progress_bar": False, "max_epochs": 40, "lr": 1e-2}


@pytest.fixture(scope="module")
def fitted():
    """Two seeds of the unrestricted and the Laplace model on sparse Laplace sources, with split halves."""
    torch.set_num_threads(1)  # module fixtures run before conftest's autouse fixture fixes the threads
    adata = cv.data.simulate(
        n_cells=400, n_genes=60, n_latent=2, seed=0, sources="laplace", loading_sparsity=0.7, loading_scale=0.5
    )
    cv.CountVAE.setup_anndata(adata)
    fits = fit_restrictions(adata, MODELS, [0, 1], TRAIN, split_half=True, heldout_fraction=0.1, split_seed=0, n_jobs=1)
    return adata, fits


@pytest.fixture(scope="module")
def section_report(fitted):
    """The whole multi-seed report of the unrestricted seeds, with the restrictions section."""
    _, fits = fitted
    request = RestrictionRequest(fits, "laplace,ica", n_lpd_samples=10)
    return report(
        fits.fits["unrestricted"], fits.adata_heldout, adata_fit=fits.adata_fit, restrictions=request, **SMALL
    )


def test_the_section_runs_in_the_report_after_the_default_sections(section_report):
    names = [s.name for s in section_report.sections]
    assert names.index("truth") < names.index("restrictions") < names.index("calibration")
    table = section_report.tables["restrictions"].set_index("model")
    assert list(table.index) == ["unrestricted", "laplace", "ica"]
    assert table.loc["unrestricted", "predictive"] == "reference"
    assert table.loc["ica", "predictive"] == "unchanged model"
    assert table["split_half_agreement"].notna().all() and table["sources_mcc"].between(0, 1).all()
    verdict = section_report.settings["restrictions"]["verdict"]
    assert verdict[0] in section_report.headline and any("simulated truth" in line for line in verdict)


def test_the_sections_tables_are_those_of_compare_restrictions_on_the_same_fits(fitted, section_report, monkeypatch):
    """compare_restrictions, handed the same fits, reads them again and makes the same tables and sentences."""
    adata, fits = fitted
    asked = {}

    def the_same_fits(data, model_kwargs, seeds, train_kwargs, **options):
        asked.update(model_kwargs=model_kwargs, seeds=seeds, train_kwargs=train_kwargs, options=options)
        return fits

    module = importlib.import_module("countvae.diagnostics.reporting.compare_restrictions")
    monkeypatch.setattr(module, "fit_restrictions", the_same_fits)
    comparison = compare_restrictions(
        adata, "laplace,ica", seeds=[0, 1], model_kwargs={"n_hidden": 16}, train_kwargs=TRAIN, n_lpd_samples=10
    )
    # the fits are those compare_restrictions would have made itself
    assert asked["model_kwargs"] == MODELS and asked["seeds"] == [0, 1] and asked["train_kwargs"] == TRAIN
    assert asked["options"]["split_half"] and asked["options"]["split_seed"] == 0
    assert list(comparison.tables) == ["restrictions", "symmetry", "agreement_pairs", "split_half", "predictive_seeds"]
    for name, table in comparison.tables.items():
        pd.testing.assert_frame_equal(section_report.tables[REPORT_TABLES[name]], table)
    record = section_report.settings["restrictions"]
    assert record["verdict"] == comparison.headline
    assert record["markers"] == comparison.settings["markers"] and record["seeds"] == comparison.settings["seeds"]


def test_the_sections_agreement_is_measured_on_the_fits_themselves(fitted, section_report):
    """Known answer: the unrestricted pair's agreement, computed here from the two fits' latents and loadings."""
    _, fits = fitted
    held = fits.adata_heldout
    a, b = fits.fits["unrestricted"]
    markers = marker_matrix(held, section_report.settings["restrictions"]["markers"], a.var_names)
    expected = pair_agreement(
        a.latent(held), b.latent(held), a.loadings(), b.loadings(), markers.to_numpy(dtype=np.float64), seed=0
    )
    pairs = section_report.tables["restriction_agreement_pairs"]
    row = pairs[pairs["model"] == "unrestricted"].iloc[0]
    for column in ("coordinates", "loadings", "markers", "rotation_ceiling"):
        assert row[column] == pytest.approx(expected[column], rel=1e-9)


def test_the_section_without_restricted_fits_is_refused_with_what_to_pass(fitted):
    _, fits = fitted
    unrestricted, held = fits.fits["unrestricted"], fits.adata_heldout
    with pytest.raises(InvalidArgumentError, match=r"pass restrictions=RestrictionRequest\(fit_restrictions"):
        report(unrestricted, held, sections=["restrictions"])
    with pytest.raises(InvalidArgumentError, match=r"not the request's unrestricted fits"):
        report(fits.fits["laplace"], held, sections=["markers"], restrictions=RestrictionRequest(fits))
    with pytest.raises(InvalidArgumentError, match=r"No fits of the restricted models \['horseshoe'\]"):
        report(unrestricted, held, sections=["markers"], restrictions=RestrictionRequest(fits, "laplace,horseshoe"))
    with pytest.raises(InvalidArgumentError, match="margin"):
        report(unrestricted, held, sections=["markers"], restrictions=RestrictionRequest(fits, margin=0.0))


def test_a_subset_of_sections_runs_the_restrictions_section_alone(fitted, section_report):
    """Without the ICA and the symmetry check: the other rows are those of the whole report."""
    _, fits = fitted
    rep = report(
        fits.fits["unrestricted"],
        fits.adata_heldout,
        sections=["restrictions"],
        restrictions=RestrictionRequest(fits, "laplace", n_lpd_samples=10, check_symmetry=False),
        **SMALL,
    )
    assert [s.name for s in rep.sections] == ["restrictions"]
    assert set(rep.tables) == {REPORT_TABLES[name] for name in REPORT_TABLES if name != "programs"}
    assert rep.tables["restriction_symmetry"].empty and rep.settings["restrictions"]["restrictions"] == ["laplace"]
    pd.testing.assert_frame_equal(rep.tables["restrictions"], section_report.tables["restrictions"].iloc[:2])


def test_the_section_shows_in_html_markdown_and_json(section_report, tmp_path):
    html, markdown = section_report.to_html(), section_report.to_markdown()
    verdict = section_report.settings["restrictions"]["verdict"]
    assert f'<h2 id="restrictions">{TITLE}</h2>' in html and 'href="#restrictions"' in html
    assert html.index('id="restrictions"') < html.index('id="about"')
    assert "<h3>Per restriction</h3>" in html and "<h3>Split half</h3>" in html
    assert (
        f"## {TITLE}" in markdown and "### Per restriction" in markdown and "### Predictive cost per seed" in markdown
    )
    assert all(line in markdown for line in verdict)
    folder = section_report.save(tmp_path / "report")
    record = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert_valid_report_json(record)
    assert [row["model"] for row in record["tables"]["restrictions"]] == ["unrestricted", "laplace", "ica"]
    assert record["settings"]["restrictions"]["verdict"] == verdict
    corrupted = copy.deepcopy(record)
    corrupted["tables"]["restrictions"][0]["predictive"] = "fine"
    with pytest.raises(ValidationError):
        assert_valid_report_json(corrupted)
    # the layout needs only the report's tables and records: a report read back shows the same section
    assert load_report(folder).to_markdown() == markdown
