"""Per-component ICA stability across seeds, alone and in the multi-seed report, against known sources."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import RotatedFit, random_rotation

import countvae as cv
from countvae import plotting
from countvae.diagnostics import CountVAEFit, report
from countvae.diagnostics.analyses.components import (
    COMPONENT_COLUMNS,
    MATCH_COLUMNS,
    ica_component_stability,
)
from countvae.diagnostics.reporting.headline import ica_sentence
from countvae.errors import InvalidArgumentError

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30)
N_CELLS, DIM = 2000, 4


def rotated_sources(kind: str, seed: int = 0) -> np.ndarray:
    """Shared sources of one kind, unit variance, (cells, DIM)."""
    rng = np.random.default_rng(seed)
    s = rng.laplace(size=(N_CELLS, DIM)) if kind == "laplace" else rng.standard_normal((N_CELLS, DIM))
    return (s - s.mean(0)) / s.std(0)


def seed_latents(sources: np.ndarray, n_fits: int = 3, noise: float = 0.05) -> dict[str, np.ndarray]:
    """Each 'seed' sees the same sources in its own rotated coordinates, plus a little independent noise."""
    rng = np.random.default_rng(100)
    return {
        f"seed {k}": sources @ random_rotation(DIM, 10 + k).T + noise * rng.standard_normal(sources.shape)
        for k in range(n_fits)
    }


def test_rotated_laplace_sources_reproduce_every_component():
    table, matches = ica_component_stability(seed_latents(rotated_sources("laplace")))
    assert list(table.columns) == list(COMPONENT_COLUMNS)
    assert list(matches.columns) == list(MATCH_COLUMNS)
    assert table["component"].tolist() == [f"IC_{i}" for i in range(DIM)]
    assert (table["reference_fit"] == "seed 0").all()
    assert table["reproducible"].all() and not table["gaussian"].any()
    assert table["mean_match"].min() > 0.97
    assert table["same_fit_match"].min() > 0.97
    # Laplace sources have excess kurtosis 3; the recovered components are close to it.
    assert table["excess_kurtosis"].min() > 2.0
    # One row per (other seed, component); the table's mean is the mean over those rows.
    assert len(matches) == 2 * DIM and set(matches["fit"]) == {"seed 1", "seed 2"}
    per_component = matches.groupby("component")["best_match"].mean()
    np.testing.assert_allclose(per_component.loc[table["component"]].to_numpy(), table["mean_match"].to_numpy())


def test_rotated_gaussian_sources_are_flagged_and_do_not_reproduce():
    table, _ = ica_component_stability(seed_latents(rotated_sources("normal")))
    # Inside a Gaussian space every rotation is equally independent: the axes are noise.
    assert table["gaussian"].sum() >= 3
    assert table["reproducible"].sum() <= 1
    assert table["mean_match"].mean() < 0.9
    # Not a difference between seeds: within one seed the Gaussian axes do not reproduce either.
    assert table["same_fit_match"].mean() < 0.9
    assert np.abs(table["excess_kurtosis"]).max() < 0.5


def test_headline_names_the_components():
    table = pd.DataFrame(
        {
            "component": ["IC_0", "IC_1", "IC_2"],
            "mean_match": [0.99, 0.8, 0.7],
            "same_fit_match": [1.0, 0.99, 0.6],
            "gaussian": [False, True, False],
            "reproducible": [True, False, False],
        }
    )
    sentence = ica_sentence(table, 0.95)
    assert "1 of 3 reproduce across seeds (IC_0); IC_1, IC_2 do not, 1 of them too close to Gaussian" in sentence
    assert "1 reproduce between the two halves of the cells within one seed, so the seeds' solutions differ" in sentence
    assert "1 do not reproduce even within one seed" in sentence
    assert sentence.endswith("as one subspace, not as separate axes.")
    table["reproducible"] = True
    assert "all 3 reproduce" in ica_sentence(table, 0.95)
    assert ica_sentence(table.iloc[:0], 0.95) is None


def test_bad_input():
    with pytest.raises(InvalidArgumentError, match="at least two fits"):
        ica_component_stability({"seed 0": np.zeros((50, 2))})
    with pytest.raises(InvalidArgumentError, match="threshold"):
        ica_component_stability(seed_latents(rotated_sources("laplace")), threshold=1.5)
    base_table = pd.DataFrame({"component": ["IC_0"], "mean_match": [0.9], "gaussian": [False]})
    with pytest.raises(InvalidArgumentError, match="reproducible"):
        plotting.ica_stability(base_table)


def test_plot_bars_are_mean_matches_coloured_by_verdict():
    table, matches = ica_component_stability(seed_latents(rotated_sources("laplace")))
    table.loc[1, ["reproducible", "gaussian"]] = [False, True]
    ax = plotting.ica_stability(table, matches, threshold=0.9)
    bars = ax.patches[: len(table)]
    np.testing.assert_allclose([b.get_height() for b in bars], table["mean_match"].to_numpy())
    assert bars[1].get_hatch() == "///" and not bars[0].get_hatch()
    assert bars[0].get_facecolor() != bars[1].get_facecolor()
    threshold_lines = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.9, 0.9]]
    assert len(threshold_lines) == 1
    assert len(ax.collections[0].get_offsets()) == len(matches)
    np.testing.assert_allclose(ax.collections[1].get_offsets()[:, 1], table["same_fit_match"].to_numpy())


# ----- in the report -----------------------------------------------------------------------------------
class FixedLatentFit(RotatedFit):
    """A fit whose held-out latent means are given sources in its own rotated coordinates, plus noise.

    Only the latent means matter for the ICA table; every other output comes from the base fit.
    """

    sources: np.ndarray | None = None

    def latent(self, adata):
        rng = np.random.default_rng(1000 + self.seed)
        sources = self.sources[: adata.n_obs]  # the first cells' sources for a subset of the held-out cells
        return sources @ self.q.T + 0.05 * rng.standard_normal(sources.shape)


@pytest.fixture(scope="module")
def base_and_heldout():
    adata = cv.data.simulate(n_cells=N_CELLS + 300, n_genes=30, n_latent=DIM, decoder="linear", seed=4)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata[N_CELLS:].copy(), n_latent=DIM, decoder="linear")
    model.train(max_epochs=3, progress_bar=False, seed=0)
    return CountVAEFit(model, 0), adata[:N_CELLS].copy()


def fixed_fits(base, kind: str) -> list[FixedLatentFit]:
    sources = rotated_sources(kind)
    fits = []
    for s in (0, 1, 2):
        fit = FixedLatentFit(base, random_rotation(DIM, 10 + s), s)
        fit.sources = sources
        fits.append(fit)
    return fits


def test_report_known_answers_laplace_reproducible_gaussian_flagged(base_and_heldout, tmp_path):
    base, heldout = base_and_heldout
    laplace = report(fixed_fits(base, "laplace"), heldout, markers=["gene0"], **SMALL)
    assert len(laplace.ica) == DIM and laplace.ica["reproducible"].all()
    assert not laplace.ica["gaussian"].any()
    assert any("all 4 reproduce across seeds" in line for line in laplace.headline)
    assert len(laplace.tables["ica_matches"]) == 2 * DIM
    assert "ica components" in laplace.timings

    gaussian = report(fixed_fits(base, "normal"), heldout, markers=["gene0"], **SMALL)
    assert gaussian.ica["gaussian"].sum() >= 3 and gaussian.ica["reproducible"].sum() <= 1
    line = next(line for line in gaussian.headline if line.startswith("ICA components"))
    assert "too close to Gaussian" in line and "as one subspace" in line
    # The invariants table still carries its ICA coordinates row.
    assert "ICA coordinates" in set(gaussian.invariants["quantity"])

    out = gaussian.save(tmp_path / "rep")
    html = (out / "report.html").read_text()
    assert "ICA components: which reproduce across seeds" in html
    assert 'alt="ICA components across seeds"' in html
    md = (out / "report.md").read_text()
    assert "## ICA components across seeds" in md and "| IC_0 |" in md
    record = json.loads((out / "report.json").read_text())
    assert len(record["tables"]["ica"]) == DIM and len(record["tables"]["ica_matches"]) == 2 * DIM
    assert record["figures"]["ica_stability"]["tables"] == ["ica", "ica_matches"]
    assert record["settings"]["report"]["ica_threshold"] == 0.95


def test_report_without_ica_has_an_empty_table(base_and_heldout, tmp_path):
    base, heldout = base_and_heldout
    rep = report(fixed_fits(base, "laplace")[:2], heldout[:400].copy(), markers=["gene0"], ica=False, **SMALL)
    assert list(rep.ica.columns) == list(COMPONENT_COLUMNS) and len(rep.ica) == 0
    assert not any(line.startswith("ICA components") for line in rep.headline)
    html = (rep.save(tmp_path / "rep") / "report.html").read_text()
    assert "ICA components: which reproduce" not in html
    with pytest.raises(InvalidArgumentError, match="ica_threshold"):
        report(fixed_fits(base, "laplace")[:2], heldout[:400].copy(), ica_threshold=0.0, **SMALL)


def test_same_fit_baseline_separates_seed_differences_from_sampling():
    """Seeds whose solutions differ (unrelated Laplace latents): each reproduces its own axes, they share none."""
    latents = {f"seed {k}": rotated_sources("laplace", seed=k) for k in range(3)}
    table, _ = ica_component_stability(latents)
    assert table["same_fit_match"].min() > 0.97
    assert not table["reproducible"].any() and table["mean_match"].max() < 0.3
    sentence = ica_sentence(table, 0.95)
    assert f"{DIM} reproduce between the two halves of the cells within one seed" in sentence
