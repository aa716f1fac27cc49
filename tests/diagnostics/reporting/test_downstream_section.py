"""The report's downstream section (DE, Leiden, UMAP across seeds) and ``countvae diagnose --de``.

Known answers: the section's numbers are the analysis functions' on the same
inputs; with planted differential expression the seeds' calls recover the
planted genes and agree far above the agreement of random call sets of the same
sizes; the expected chance Jaccard has a closed form on a small case.
"""

from __future__ import annotations

import json
import re
import sys
from html import unescape

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import assert_valid_report_json

import countvae as cv
from countvae.cli import main
from countvae.data import split_indices
from countvae.diagnostics import CountVAEFit, DownstreamRequest, DownstreamSettings, SeedFits, load_report, report
from countvae.diagnostics.analyses import downstream as ds
from countvae.diagnostics.analyses.subspace import subsample
from countvae.diagnostics.reporting.downstream_section import collect_de, de_groups, downstream_result, reading
from countvae.errors import InvalidArgumentError

N_DE = 2000
SETTINGS = DownstreamSettings(n_de_samples=N_DE, max_cells=150, k=10)
SMALL_REPORT = dict(
    n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_ppc_samples=4
)


def _planted(seed: int = 4, n_cells: int = 900):
    """Two groups with 8 of 60 genes planted at |log2 FC| 3 to 4.5 against a weak latent structure."""
    return cv.data.simulate(
        n_cells=n_cells,
        n_genes=60,
        n_latent=2,
        decoder="mlp",
        loading_scale=0.3,
        n_groups=2,
        n_de_genes=8,
        de_lfc=(3.0, 4.5),
        seed=seed,
    )


@pytest.fixture(scope="module")
def planted_fits():
    """Three seeds of a CountVAE on planted-DE counts, with a shared held-out split."""
    adata = _planted()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    fit_idx, held_idx = split_indices(adata.n_obs, 0.7, 0)
    fit_data, held = adata[fit_idx].copy(), adata[held_idx].copy()
    fits = []
    for seed in (0, 1, 2):
        model = cv.CountVAE(fit_data, n_latent=4, decoder="mlp", n_hidden=32)
        model.train(max_epochs=40, batch_size=128, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    return SeedFits(fits=fits, adata_fit=fit_data, adata_heldout=held)


def downstream_section(fits, adata, request):
    """The downstream section of ``fits`` on ``adata``, in the report's two steps (collect, then compute)."""
    latents = {f.name: np.asarray(f.latent(adata), dtype=np.float64) for f in fits}
    return downstream_result(collect_de(fits, adata, request), latents, adata.n_obs, request.settings)


@pytest.fixture(scope="module")
def section(planted_fits):
    request = DownstreamRequest("group", "group1", "group0", settings=SETTINGS)
    return downstream_section(planted_fits.fits, planted_fits.adata_heldout, request)


# ----- known answers ----------------------------------------------------------------------------------------
def test_chance_jaccard_closed_form_and_edges():
    # 4 genes, two sets of 2: shared 0, 1, 2 with probabilities 1/6, 4/6, 1/6 -> Jaccard 0, 1/3, 1.
    assert ds.chance_jaccard(2, 2, 4) == pytest.approx(4 / 6 / 3 + 1 / 6)
    assert ds.chance_jaccard(0, 0, 10) == 1.0  # two empty call sets agree, as de_statistics.jaccard says
    assert ds.chance_jaccard(0, 3, 10) == 0.0
    assert ds.chance_jaccard(10, 10, 10) == pytest.approx(1.0)
    assert ds.chance_jaccard(3, 4, 60) < 0.05
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        ds.chance_jaccard(11, 2, 10)


def test_section_numbers_are_the_analysis_functions(section, planted_fits):
    fits, held = planted_fits.fits, planted_fits.adata_heldout
    calls, lfc, calls2, lfc2 = {}, {}, {}, {}
    for i, fit in enumerate(fits):
        for seed, (call_sets, lfcs) in ((i, (calls, lfc)), (len(fits) + i, (calls2, lfc2))):
            frame = fit.model.differential_expression(
                held, groupby="group", group1="group1", group2="group0", n_samples_overall=N_DE, seed=seed
            ).loc[fit.var_names]
            call_sets[fit.name] = frame["is_de_fdr_0.05"].to_numpy(bool)
            lfcs[fit.name] = frame["lfc_mean"].to_numpy(float)
    _, de_summary = ds.de_agreement(calls, lfc, calls2, lfc2)
    cells = subsample(held.n_obs, SETTINGS.max_cells, SETTINGS.seed)
    latents = {f.name: f.latent(held)[cells] for f in fits}
    _, cluster_summary = ds.cluster_agreement(latents, 10, 1.0, (0, 1))
    _, umap_summary = ds.umap_agreement(latents, 10, (0, 1), 10)
    _, knn_summary = ds.neighbourhood_agreement(latents, None, 10)
    expected = pd.concat(
        [s.assign(output=o) for o, s in (("de", de_summary), ("clusters", cluster_summary), ("umap", umap_summary))]
        + [knn_summary.assign(output="latent_knn")]
    ).set_index(["output", "metric"])
    got = section.summary.set_index(["output", "metric"])
    assert sorted(got.index) == sorted(expected.index)
    numbers = ["between_mean", "between_min", "within_mean", "n_between", "n_within", "model_share"]
    pd.testing.assert_frame_equal(got.loc[expected.index, numbers], expected[numbers], check_dtype=False)
    assert set(section.status.values()) == {"computed"}
    per_fit = section.de_per_fit.set_index("fit")
    assert per_fit["n_calls"].to_dict() == {name: int(c.sum()) for name, c in calls.items()}
    assert per_fit["sampling_seed"].tolist() == [0, 1, 2] and per_fit["baseline_sampling_seed"].tolist() == [3, 4, 5]


def test_planted_de_calls_agree_across_seeds_far_above_chance(section, planted_fits):
    truth = cv.data.planted_lfc(planted_fits.adata_heldout, "group1", "group0")
    planted = truth.abs() > 0
    for fit in planted_fits.fits:  # each seed's calls recover the planted genes (known truth)
        frame = fit.model.differential_expression(
            planted_fits.adata_heldout, groupby="group", group1="group1", group2="group0", n_samples_overall=N_DE
        )
        called = frame["is_de_fdr_0.05"].reindex(truth.index)
        assert (called & planted).sum() >= 0.75 * planted.sum(), fit.name
        assert (called & ~planted).sum() <= 1, fit.name
    row = section.summary.set_index(["output", "metric"]).loc[("de", "jaccard")]
    assert row["n_between"] == 3 and row["n_within"] == 3
    assert row["chance_mean"] < 0.15  # ~8 of 60 genes called: random call sets share little
    assert row["between_mean"] >= 0.8 and row["between_mean"] > row["chance_mean"] + 0.6
    de_pairs = section.pairs[(section.pairs["output"] == "de") & (section.pairs["metric"] == "jaccard")]
    assert (
        de_pairs["chance"].notna().all()
        and section.pairs.loc[section.pairs["metric"] != "jaccard", "chance"].isna().all()
    )
    statement = next(s for s in section.statements if s.startswith("DE calls (jaccard)"))
    assert "3 pairs of fits" in statement and "random call sets of the same sizes would agree" in statement


# ----- wording ----------------------------------------------------------------------------------------------
def _row(between, within, n_between=10, n_within=5, chance=np.nan):
    return {**ds.model_share([between] * n_between, [within] * n_within), "chance_mean": chance}


def test_reading_is_calibrated_to_the_numbers():
    model = reading("clusters", "ari", _row(0.5, 0.95))
    assert "most of the variation is the model's" in model and "10 pairs of fits" in model and "(5 pairs)" in model
    assert "about 90%" in model
    downstream = reading("clusters", "ari", _row(0.5, 0.55))
    assert "not the model's" in downstream and "about 10%" in downstream
    both = reading("umap", "knn_overlap", _row(0.6, 0.8))
    assert "both contribute" in both
    close = reading("de", "spearman", _row(0.98, 0.99))
    assert "agree closely" in close and "model's" not in close
    assert "rough estimate" in reading("de", "jaccard", _row(0.5, 0.9, n_between=1, n_within=1, chance=0.1))
    assert "rough estimate" not in model
    nothing = reading("de", "jaccard", _row(1.0, 1.0, n_between=3, n_within=3, chance=1.0))
    # random call sets agree perfectly (chance 1) when every set is empty and when every set holds every gene
    assert ds.chance_jaccard(0, 0, 8) == 1.0 and ds.chance_jaccard(8, 8, 8) == 1.0
    assert "every fit calls no gene, or every fit calls every gene" in nothing and "3 pairs of fits" in nothing
    reference = reading("latent_knn", "knn_overlap", _row(0.4, 0.0, n_within=0))
    assert "no downstream randomness" in reference


# ----- missing extra, bad groups ------------------------------------------------------------------------------------
def test_missing_extra_gives_the_plain_message_not_a_crash(planted_fits, monkeypatch):
    monkeypatch.setitem(sys.modules, "scanpy", None)
    request = DownstreamRequest(settings=DownstreamSettings(max_cells=100, k=8))
    sec = downstream_section(planted_fits.fits, planted_fits.adata_heldout, request)
    for output in ("clusters", "umap"):
        assert sec.status[output].startswith("not computed") and "countvae[downstream]" in sec.status[output]
    assert sec.status["latent_knn"] == "computed" and sec.status["de"] == "not requested"
    assert list(sec.summary["output"]) == ["latent_knn"]
    assert sum("pip install 'countvae[downstream]'" in s for s in sec.statements) == 2
    assert any(s.startswith("DE calls: not requested") for s in sec.statements)


def test_de_groups_refuses_bad_requests():
    obs = pd.DataFrame({"kind": pd.Categorical(["a", "b", "c", "a"]), "two": ["x", "y", "x", "y"], "one": ["z"] * 4})
    assert de_groups(obs, "two") == ("x", "y")
    assert de_groups(obs, "kind", "b") == ("b", "Rest")
    assert de_groups(obs, "kind", "c", "a") == ("c", "a")
    for args, message in (
        (("nope",), "not an obs column"),
        (("one",), "single group"),
        (("kind",), "name the two to compare"),
        (("kind", "d"), "'d' has no cells"),
        (("kind", "a", "d"), "'d' has no cells"),
        (("kind", "a", "a"), "both groups are"),
        (("kind", None, "a"), "group2 needs group1"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            de_groups(obs, *args)
    with pytest.raises(InvalidArgumentError, match="missing values"):
        de_groups(pd.DataFrame({"g": ["a", None, "b"]}), "g")


def test_de_groups_of_a_numeric_column_say_so_in_one_short_line():
    # A column of counts per cell given as the groups listed all of its hundreds of values.
    obs = pd.DataFrame({"n_counts": np.arange(300, dtype=float), "label": [f"c{i}" for i in range(300)]})
    with pytest.raises(InvalidArgumentError, match=r"holds numbers \(300 distinct values\), not groups") as numeric:
        de_groups(obs, "n_counts")
    with pytest.raises(InvalidArgumentError, match=r"has 300 groups") as many:
        de_groups(obs, "label")
    with pytest.raises(InvalidArgumentError, match=r"'x' has no cells") as missing:
        de_groups(obs, "label", "x")
    for exc in (numeric, many, missing):
        assert len(str(exc.value)) < 400 and "(300 in all)]" in str(exc.value)


# ----- in the report --------------------------------------------------------------------------------------------
def test_report_section_round_trips_through_json_html_and_markdown(planted_fits, tmp_path):
    request = DownstreamRequest("group", settings=DownstreamSettings(n_de_samples=500, max_cells=120, k=8))
    rep = report(planted_fits, downstream=request, ica=False, **SMALL_REPORT)
    sec = rep.downstream
    assert sec is not None and sec.settings["group1"] == "group0" and sec.settings["group2"] == "group1"
    folder = rep.save(tmp_path / "rep")
    record = json.loads((folder / "report.json").read_text())["downstream"]
    assert record == json.loads(json.dumps(sec.to_dict()))
    back = pd.DataFrame(record["summary"])
    pd.testing.assert_frame_equal(
        back[["between_mean", "n_between", "n_within"]],
        sec.summary[["between_mean", "n_between", "n_within"]],
        check_dtype=False,
    )
    assert record["statements"] == sec.statements and record["status"] == sec.status
    assert_valid_report_json(json.loads((folder / "report.json").read_text()))
    loaded = load_report(folder)  # the section comes back with the rest of the report
    assert loaded.to_dict() == rep.to_dict() and loaded.downstream.statements == sec.statements
    for name, table in sec.tables.items():
        pd.testing.assert_frame_equal(loaded.downstream.tables[name], table)
    pd.testing.assert_frame_equal(loaded.ica, rep.ica)  # no rows (ica=False): columns and dtypes kept
    html = (folder / "report.html").read_text()
    markdown = (folder / "report.md").read_text()
    assert 'id="downstream"' in html and "## Downstream results across seeds" in markdown
    for statement in sec.statements:
        assert statement in unescape(html) and statement in markdown
    # n_baseline_fits=None (all fits) is a dash in the settings table, as every missing value, not Python's None
    assert sec.settings["n_baseline_fits"] is None
    assert re.search(r"n_baseline_fits</td><td[^>]*>–</td>", unescape(html)) and ">None<" not in html
    # reports without the request have no section
    assert report(planted_fits, ica=False, **SMALL_REPORT).downstream is None


# ----- the command line ---------------------------------------------------------------------------------------------
FAST = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "3", "--n-lpd-samples", "10"]


@pytest.fixture(scope="module")
def groups_file(tmp_path_factory):
    adata = _planted(seed=7, n_cells=400)
    adata.obs["three"] = pd.Categorical(np.array(["a", "b", "c"])[np.arange(adata.n_obs) % 3])
    adata.obs["single"] = "only"
    path = tmp_path_factory.mktemp("data") / "groups.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--de", "nope"], "'nope' is not an obs column"),
        (["--de", "group", "--de-groups", "group7"], "'group7' has no cells"),
        (["--de", "single"], "single group"),
        (["--de", "three"], "name the two to compare"),
        (["--de", "three", "--de-groups", "a", "b", "c"], "one or two groups"),
        (["--de-groups", "a"], "--de-groups needs --de"),
    ],
)
def test_bad_de_arguments_fail_before_fitting(groups_file, tmp_path, capsys, extra, message):
    out = tmp_path / "diag"
    code = main(["diagnose", str(groups_file), *FAST, "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1
    assert not (out / "fits").exists()  # refused before any seed was fitted


def test_diagnose_de_adds_the_section(groups_file, tmp_path, capsys):
    out = tmp_path / "diag"
    argv = ["diagnose", str(groups_file), *FAST, "--no-ica", "--out", str(out), "--json", "--de", "group"]
    assert main([*argv, "--de-groups", "group1", "group0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"de jaccard", "de spearman", "clusters ari", "umap knn_overlap"} <= set(result["downstream"])
    assert result["downstream"]["de jaccard"]["n_between"] == 1
    assert result["downstream"]["not_computed"] == {}
    record = json.loads((out / "report" / "report.json").read_text())["downstream"]
    assert record["settings"]["group1"] == "group1" and record["settings"]["group2"] == "group0"


def test_agreement_figure_draws_every_pair_at_its_value():
    pairs = pd.DataFrame(
        {
            "output": ["de", "de", "de", "clusters"],
            "metric": ["jaccard", "jaccard", "jaccard", "ari"],
            "kind": [ds.BETWEEN, ds.BETWEEN, ds.WITHIN, ds.BETWEEN],
            "value": [0.7, 0.8, 0.95, 0.4],
        }
    )
    ax = cv.plotting.downstream_agreement(pairs)
    drawn = sorted(float(x) for c in ax.collections for x in c.get_offsets()[:, 0])
    assert drawn == [0.4, 0.7, 0.8, 0.95]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["de: jaccard", "clusters: ari"]
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == [ds.BETWEEN, ds.WITHIN]
    with pytest.raises(InvalidArgumentError, match="kind"):
        cv.plotting.downstream_agreement(pairs.drop(columns="kind"))


def test_settings_refuse_values_that_cannot_work():
    for bad in (dict(n_de_samples=1), dict(k=1), dict(fdr_target=1.0), dict(max_cells=2), dict(n_baseline_fits=0)):
        with pytest.raises(InvalidArgumentError):
            DownstreamSettings(**bad)


def test_cluster_labels_of_a_fit_are_scanpys_leiden_labels(planted_fits):
    """The labels the section compares are those sc.tl.leiden gives an analyst on the fit's X_countvae."""
    import scanpy as sc

    fit, held = planted_fits.fits[0], planted_fits.adata_heldout.copy()
    fit.model.write_results(held, layer=None, uns_key=None)
    sc.pp.neighbors(held, use_rep="X_countvae", n_neighbors=10)
    sc.tl.leiden(held, resolution=0.8, random_state=2, flavor="igraph", n_iterations=2, directed=False)
    collected = np.asarray(fit.latent(held), dtype=np.float64)  # the report keeps latents as float64
    ours = ds.scanpy_leiden(ds.scanpy_graph(collected, 10), resolution=0.8, seed=2)
    np.testing.assert_array_equal(ours, held.obs["leiden"].astype(int).to_numpy())
    assert len(np.unique(ours)) > 1
