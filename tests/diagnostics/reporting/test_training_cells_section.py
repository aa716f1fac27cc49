"""The training-cells section: seeds that are exact rotations of one fit agree perfectly on their training cells,
fit cells planted to disagree (held-out cells agreeing) turn the latent rows' verdicts and say so in the headline,
and the section reads back from report.json."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from diagnostics_helpers import saved_and_loaded

from countvae.diagnostics import load_report
from countvae.diagnostics.analyses.invariants import InvariantInputs, invariants_table
from countvae.diagnostics.reporting.sections.training_cells import (
    comparison_table,
    training_cell_rows,
    training_sentences,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import judge_invariants

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_bootstrap=50)


def test_exact_rotations_of_one_fit_agree_perfectly_on_their_training_cells(copies_report):
    """Seeds 1 and 2 are seed 0 in other orthogonal coordinates: distances, neighbours and aligned axes are equal."""
    table = copies_report.tables["training_cells"].set_index("quantity")
    assert list(table.index) == ["latent distances", "k-NN graph", "per-dimension coordinates"]
    assert table["training_agreement"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert table.loc["latent distances", "training_verdict"] == "agree"
    assert table.loc["k-NN graph", "training_verdict"] == "agree"
    assert table.loc["per-dimension coordinates", "training_verdict"] == "agree after alignment"
    assert bool(table.loc["per-dimension coordinates", "aligned"])
    assert (table["training_verdict"] == table["heldout_verdict"]).all()
    assert (table["n_cells"] > 0).all()


def _planted(noise: float, n_held: int = 300, n_fit: int = 700, seed: int = 0):
    """Two fits equal (up to a rotation) on the held-out cells; on the fit cells the second adds ``noise``."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    held, fit = rng.normal(size=(n_held, 3)), rng.normal(size=(n_fit, 3))
    latents = {"latent": {"a": held, "b": held @ rotation}}
    latents["latent_fit"] = {"a": fit, "b": (fit + noise * rng.normal(size=fit.shape)) @ rotation}
    latents["latent_fit_all"] = {"a": None, "b": None}  # latent_fit holds every fit cell
    return SimpleNamespace(
        per_fit=latents.__getitem__, n_cells=n_held, n_fit_cells=n_fit, symmetry="orthogonal", names=["a", "b"]
    )


def test_fit_cells_planted_to_disagree_turn_the_verdicts_and_the_headline_says_so():
    s = ReportSettings(**SMALL)
    c = _planted(noise=1.0)
    numbers, _ = invariants_table(InvariantInputs(latents=c.per_fit("latent")), k=s.k, seed=s.seed)
    heldout = judge_invariants(numbers)
    training, n_cells = training_cell_rows(c, s)
    assert n_cells == 300
    table = comparison_table(heldout, training).set_index("quantity")
    # held-out cells: the two fits are one up to a rotation
    assert table["heldout_agreement"].to_numpy() == pytest.approx(1.0, abs=1e-9)
    # fit cells: noise as large as the latents' own spread leaves little of the distances and neighbours
    assert table.loc["latent distances", "training_agreement"] < 0.8
    assert table.loc["latent distances", "training_high"] < 0.9
    assert table.loc["latent distances", "training_verdict"] == "differ"
    assert table.loc["k-NN graph", "training_verdict"] == "differ"
    sentence, line = training_sentences(table.reset_index(), n_cells)
    assert line.startswith("Training cells: latent distances differ (")
    assert "where held-out cells say agree (1.00)" in line
    assert sentence.startswith("On 300 cells the fits were trained on, the worst pair of seeds gives: latent distances")


def test_without_noise_the_training_rows_equal_their_exact_answer():
    s = ReportSettings(**SMALL)
    training, _ = training_cell_rows(_planted(noise=0.0), s)
    assert training["agreement"].to_numpy()[:2] == pytest.approx(1.0, abs=1e-9)
    assert training.set_index("quantity").loc["per-dimension coordinates", "aligned_agreement"] == pytest.approx(1.0)


def test_without_fit_cells_nothing_is_measured():
    c = _planted(noise=0.0)
    no_fit = SimpleNamespace(
        **{**vars(c), "per_fit": {"latent": c.per_fit("latent"), "latent_fit": {}, "latent_fit_all": {}}.__getitem__}
    )
    assert training_cell_rows(no_fit, ReportSettings(**SMALL)) is None


def test_the_training_cells_table_reads_back_from_its_file(seed_report, tmp_path):
    assert 'id="training_cells"' in seed_report.to_html()
    assert any(line.startswith("Training cells:") for line in seed_report.headline)
    loaded = saved_and_loaded(
        seed_report, tmp_path / "rep", "training_cells", "training_verdict", "fine", "is not one of"
    )
    assert loaded.tables["training_cells"].equals(seed_report.tables["training_cells"])


def test_the_model_card_gives_the_training_cells_verdicts_and_reads_back(seed_report, tmp_path):
    sentence = seed_report.settings["training_cells"]["sentence"]
    table = seed_report.tables["training_cells"]
    same = (table["training_verdict"] == table["heldout_verdict"]).all()
    expected = "the same verdicts as on held-out cells" if same else "(held-out: "
    card = seed_report.model_card()
    line = next(line for line in card.splitlines() if line.startswith("- **Training cells** ("))
    assert expected in line and line.endswith(sentence)
    assert load_report(seed_report.save(tmp_path / "rep")).model_card() == card


def test_a_new_row_reading_only_the_latents_joins_the_training_cells_table(seed_fits, monkeypatch):
    # The section listed its rows by name, so a row added to QUANTITIES as docs/architecture.md says (per-cell
    # latent norms, rotation-invariant) was measured on held-out cells but never on the training cells.
    import countvae.diagnostics.analyses.invariants as inv

    def norms(z):
        return np.linalg.norm(z, axis=1)

    row = inv.Quantity(
        "latent norms",
        report_when_agree="latent norms",
        report_when_differ="their spread",
        score=lambda c, a, b: inv.concordance(norms(c.latents[a]), norms(c.latents[b])),
    )
    monkeypatch.setattr(inv, "QUANTITIES", (*inv.QUANTITIES, row))
    monkeypatch.setitem(inv.QUANTITY_BY_NAME, "latent norms", row)
    from countvae.diagnostics import report

    rep = report(seed_fits, sections=["training_cells"], **SMALL)
    rows = list(rep.tables["training_cells"]["quantity"])
    assert rows == ["latent distances", "k-NN graph", "per-dimension coordinates", "latent norms"]
    # its training-cell agreement is the concordance of the norms on the cells the section chose
    assert 0.0 < rep.tables["training_cells"].set_index("quantity").loc["latent norms", "training_agreement"] <= 1.0
