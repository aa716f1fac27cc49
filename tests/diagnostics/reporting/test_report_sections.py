"""The report's sections: the registry runs any subset in report order, refuses unknown names, resolves what a
section requires, and a section defined here appears in report.html, report.md and report.json with no other change."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from diagnostics_helpers import assert_valid_report_json
from jsonschema import ValidationError

from countvae.diagnostics import CountVAEFit, load_report, report
from countvae.diagnostics.reporting.sections import (
    DEFAULT_SECTIONS,
    Section,
    SectionResult,
    register_section,
    registered_sections,
    resolve_sections,
    unregister_section,
)
from countvae.diagnostics.reporting.sections.base import Paragraph, Table
from countvae.errors import InvalidArgumentError

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_bootstrap=20)


class LatentMeansSection(Section):
    """A tiny section: each fit's mean latent norm on the held-out cells (known answer: computed here again)."""

    name = "latent_norms"
    title = "Mean latent norm per seed"
    needs = frozenset({"latent"})
    requires = ("alignment",)

    def compute(self, collected, shared, settings):
        norms = {name: float((z**2).sum(axis=1).mean() ** 0.5) for name, z in collected.per_fit("latent").items()}
        n_pairs = len(shared.results["alignment"].tables["alignment"])
        frame = pd.DataFrame({"fit": list(norms), "rms_latent_norm": list(norms.values())})
        return SectionResult(
            tables={"latent_norms": frame},
            headline=[f"Latent norms: {len(norms)} fits, {n_pairs} alignment rows."],
            records={"latent_norms": {"fits": len(norms)}},
        )

    def layout(self, rep):
        return [Paragraph("Root mean square norm of the latent means."), Table(rep.tables["latent_norms"])]


def test_default_sections_in_report_order():
    names = [s.name for s in registered_sections()]
    assert names == [s.name for s in DEFAULT_SECTIONS]
    assert names[:5] == ["invariants", "predictive", "seed_groups", "alignment", "ica"] and names[-1] == "about"


def test_subset_keeps_report_order_and_adds_requirements():
    chosen = [s.name for s in resolve_sections(["markers", "invariants"])]
    # the invariants table requires the predictive, PPC and ICA sections (its rows' verdicts and inputs)
    assert chosen == ["invariants", "predictive", "ica", "markers", "ppc"]
    assert [s.name for s in resolve_sections(["subspace"])] == ["subspace"]


def test_unknown_or_repeated_section_is_refused_clearly():
    with pytest.raises(InvalidArgumentError, match=r"Unknown report section 'nope'.*'invariants'"):
        resolve_sections(["nope"])
    with pytest.raises(InvalidArgumentError, match="asked for twice"):
        resolve_sections(["markers", "markers"])
    with pytest.raises(InvalidArgumentError, match="is registered already"):
        register_section(DEFAULT_SECTIONS[0])


def test_a_requirement_that_names_no_section_is_refused():
    class Orphan(Section):
        name = "orphan"
        requires = ("no such section",)

    with pytest.raises(InvalidArgumentError, match="requires 'no such section', which is not a known section"):
        resolve_sections([Orphan()])


def test_a_subset_runs_only_its_sections_and_asks_the_fits_only_for_their_needs(seed_fits, monkeypatch):
    def not_needed(*args, **kwargs):
        raise AssertionError("the markers section needs only the latent means")

    for method in ("log_predictive_density", "posterior_predictive", "decoder_jacobian", "latent_samples"):
        monkeypatch.setattr(CountVAEFit, method, not_needed)
    rep = report(seed_fits, sections="markers", **SMALL)
    assert set(rep.tables) == {"markers", "marker_correlations", "marker_r2"}
    assert rep.headline[0].startswith("Markers:")
    html = rep.to_html()
    assert 'id="markers"' in html and 'id="invariants"' not in html and 'id="predictive"' not in html


def test_a_report_of_a_subset_reads_back_and_renders(seed_fits, tmp_path):
    # one name is one section (not the letters of "markers"); the saved file names the sections it was made
    # with, so the report read back renders them alone instead of asking for the invariants table it lacks
    rep = report(seed_fits, sections="markers", **SMALL)
    assert set(rep.tables) == {"markers", "marker_correlations", "marker_r2"}
    assert rep.settings["sections"] == ["markers"]
    folder = rep.save(tmp_path / "rep")
    record = json.loads((folder / "report.json").read_text())
    assert_valid_report_json(record)  # the schema asks a report of some sections for the tables of those
    without_markers = {**record, "tables": {k: v for k, v in record["tables"].items() if k != "markers"}}
    with pytest.raises(ValidationError, match="'markers' is a required property"):
        assert_valid_report_json(without_markers)
    naming_invariants = {**record, "settings": {**record["settings"], "sections": ["markers", "invariants"]}}
    with pytest.raises(ValidationError, match="'invariants' is a required property"):
        assert_valid_report_json(naming_invariants)
    loaded = load_report(folder)
    html = loaded.to_html()
    assert 'id="markers"' in html and 'id="invariants"' not in html
    assert loaded.to_markdown() == rep.to_markdown()
    assert loaded.model_card() == rep.model_card()
    assert "Markers:" in loaded._repr_html_()


def test_a_subset_without_headline_or_main_table_reads_back_and_says_what_it_lacks(seed_fits, tmp_path):
    # The PPC section writes no headline sentence: its saved report was refused by load_report (the schema asked
    # for one); to_frame() and write() raised a bare KeyError, write() after changing the AnnData.
    rep = report(seed_fits, sections=["ppc"], **SMALL)
    assert rep.headline == []
    loaded = load_report(rep.save(tmp_path / "rep"))
    assert loaded.to_dict() == rep.to_dict()
    with pytest.raises(InvalidArgumentError, match=r"sections=\['ppc'\], without the 'invariants' section"):
        rep.to_frame()
    adata = seed_fits.adata_heldout.copy()
    before = (list(adata.obs.columns), list(adata.obsm), list(adata.uns))
    for made in (rep, report(seed_fits, sections=["per_cell"], **SMALL)):
        with pytest.raises(InvalidArgumentError, match="the 'per_cell' and 'invariants' sections|'invariants' section"):
            made.write(adata)
        assert (list(adata.obs.columns), list(adata.obsm), list(adata.uns)) == before  # nothing written


def test_one_marker_by_name_no_sections_and_a_switch_that_is_no_bool(seed_fits):
    gene = str(seed_fits.adata_heldout.var_names[0])
    rep = report(seed_fits, markers=gene, sections=["markers"], **SMALL)  # one marker, not its letters
    assert rep.markers["marker"].tolist() == [gene] and rep.settings["markers"] == [gene]
    with pytest.raises(InvalidArgumentError, match="sections is empty"):
        report(seed_fits, sections=[], **SMALL)
    with pytest.raises(InvalidArgumentError, match="sections must be a section name"):
        report(seed_fits, sections=5, **SMALL)  # was TypeError: 'int' object is not iterable
    with pytest.raises(InvalidArgumentError, match="markers must be a gene or obs column name"):
        report(seed_fits, markers=123, sections=["markers"], **SMALL)
    with pytest.raises(InvalidArgumentError, match="ica must be True or False, got 'no'"):
        report(seed_fits, sections=["markers"], ica="no", **SMALL)  # a non-empty string would have run ICA


def test_a_new_section_appears_in_html_markdown_and_json(seed_fits):
    register_section(LatentMeansSection())
    try:
        rep = report(seed_fits, sections=None, **SMALL)
    finally:
        unregister_section("latent_norms")
    latents = {f.name: f.latent(seed_fits.adata_heldout) for f in seed_fits.fits}
    expected = {name: float((z**2).sum(axis=1).mean() ** 0.5) for name, z in latents.items()}
    table = rep.tables["latent_norms"].set_index("fit")["rms_latent_norm"]
    assert table.to_dict() == pytest.approx(expected, rel=1e-6)
    n_pairs = len(rep.alignment)
    assert f"Latent norms: 3 fits, {n_pairs} alignment rows." in rep.headline
    html, markdown, record = rep.to_html(), rep.to_markdown(), json.loads(json.dumps(rep.to_dict()))
    assert '<h2 id="latent_norms">Mean latent norm per seed</h2>' in html and 'href="#latent_norms"' in html
    assert html.index('id="latent_norms"') < html.index('id="about"')
    assert "## Mean latent norm per seed" in markdown and "rms_latent_norm" in markdown
    assert [r["fit"] for r in record["tables"]["latent_norms"]] == list(expected)
    assert record["settings"]["latent_norms"] == {"fits": 3}
    assert "latent_norms" not in [s.name for s in registered_sections()]


class _NamingSection(Section):
    """A section whose result names what another section (or the report) already names."""

    name = "clashing"
    title = "Clashing names"
    needs = frozenset({"latent"})

    def __init__(self, result: SectionResult) -> None:
        self.result = result

    def compute(self, collected, shared, settings):
        return self.result

    def layout(self, rep):
        return []


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (SectionResult(tables={"alignment": pd.DataFrame({"a": [1]})}), "tables 'alignment', which section"),
        (SectionResult(records={"markers": {"note": "mine"}}), "records 'markers', which the report itself"),
        (SectionResult(records={"report": {"alpha": 0.25}}), "records 'report', which the report itself"),
        (SectionResult(attributes={"tables": {}}), "attributes 'tables', which the report itself"),
        (SectionResult(tables={"joined": pd.DataFrame([[1, 2]], columns=["x", "x"])}), r"repeated columns \['x'\]"),
    ],
)
def test_a_section_naming_what_the_report_already_has_is_refused(seed_fits, result, message):
    # The report merged by name: a section's "markers" record replaced the marker names, its "report" record every
    # report setting (report.json then failed its schema), a table named like another replaced it without a word;
    # a repeated column failed only at save() with an AttributeError.
    with pytest.raises(InvalidArgumentError, match=message):
        report(seed_fits, sections=["alignment", _NamingSection(result)], **SMALL)


@pytest.mark.parametrize(
    ("method", "section"),
    [
        ("posterior_predictive", "ppc"),
        ("latent_samples", "rhat"),
        ("decoder_jacobian", "subspace"),
        ("normalized_expression", "invariants"),
    ],
)
def test_a_fit_method_returning_none_is_named_unless_the_report_has_a_path_for_it(seed_fits, method, section):
    # A new model kind returning None from these failed deep in the analyses ("both arguments to matmul need to be
    # at least 1D"); only log_predictive_density (and loadings) have a "not measured" path.
    class Lacking(CountVAEFit):
        pass

    setattr(Lacking, method, lambda self, *args, **kwargs: None)
    fits = [Lacking(f.model, f.seed) for f in seed_fits.fits]
    with pytest.raises(InvalidArgumentError, match=rf"Fit 'seed 0': {method} returned None, but the report's"):
        report(fits, seed_fits.adata_heldout, sections=[section], **SMALL)
    Lacking.log_predictive_density = lambda self, *args, **kwargs: None
    setattr(Lacking, method, getattr(CountVAEFit, method))
    rep = report(fits, seed_fits.adata_heldout, sections=["predictive"], **SMALL)
    assert rep.settings["predictive_equivalence"]["state"] == "not tested"
    assert "Predictive equivalence not tested: held-out log p(x) is not available for these fits." in rep.headline
