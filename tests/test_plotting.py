"""countvae.plotting: each figure draws the numbers it is given, on Agg, without pyplot."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from countvae import plotting
from countvae.errors import InvalidArgumentError


def alignment_table():
    rows = []
    for pair, scale in (("a", 1.0), ("b", 2.0)):
        for i, m in enumerate(("identity", "permutation", "orthogonal", "linear", "ica")):
            rows.append({"fit_a": pair, "fit_b": "z", "map": m, "error_diameter": scale * (5 - i) / 10})
    return pd.DataFrame(rows)


def test_alignment_errors_bar_heights_are_means_per_map():
    ax = plotting.alignment_errors(alignment_table())
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights, [1.5 * (5 - i) / 10 for i in range(5)])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["identity", "permutation", "orthogonal", "linear", "ica"]
    assert plt.get_fignums() == []  # no pyplot figure was opened


def test_principal_angles_one_line_per_pair():
    table = pd.DataFrame({"fit_a": ["a", "a"], "fit_b": ["b", "c"], "angles_deg": [[1.0, 5.0], [2.0, 30.0]]})
    ax = plotting.principal_angles(table)
    lines = [line for line in ax.get_lines() if len(line.get_ydata()) == 2 and line.get_linestyle() == "-"]
    np.testing.assert_allclose(lines[1].get_ydata(), [2.0, 30.0])


def test_log_predictive_density_points_and_error_bars():
    table = pd.DataFrame(
        {"fit": ["s0", "s1"], "lpd_per_cell": [-10.0, -11.0], "se_per_cell": [0.5, 0.4], "mc_se_per_cell": [0.1, 0.1]}
    )
    ax = plotting.log_predictive_density(table)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [-10.0, -11.0])


def test_paired_differences_relative_to_the_best_seed():
    predictive = pd.DataFrame({"fit": ["s0", "s1", "s2"], "lpd_per_cell": [-10.0, -9.5, -9.8]})
    pairs = pd.DataFrame(
        {
            "fit_a": ["s0", "s0", "s1"],
            "fit_b": ["s1", "s2", "s2"],
            "diff_per_cell": [-0.5, -0.2, 0.3],
            "se_diff_per_cell": [0.1, 0.1, 0.05],
        }
    )
    ax = plotting.paired_lpd_differences(predictive, pairs)
    points = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
    np.testing.assert_allclose(np.asarray(points.get_ydata(), dtype=float), [-0.5, 0.0, -0.3])
    assert "s1" in ax.get_ylabel()


def test_marker_heatmaps_one_per_fit_with_the_correlations():
    rows = [
        {"fit": f, "marker": m, "dim": d, "corr": (1 if f == "s0" else -1) * (d + 1) / 10}
        for f in ("s0", "s1")
        for m in ("G1", "G2")
        for d in range(3)
    ]
    axes = plotting.marker_correlations(pd.DataFrame(rows))
    assert len(axes) == 2
    np.testing.assert_allclose(axes[1].images[0].get_array(), -np.tile([0.1, 0.2, 0.3], (2, 1)))


def test_marker_r2_rhat_invariants_ppc_spectra_draw_their_values():
    r2 = pd.DataFrame({"fit": ["a", "b"], "marker": ["G", "G"], "r2": [0.5, 0.52]})
    ax = plotting.marker_r2(r2)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [0.5, 0.52])

    rhat = pd.DataFrame({"quantity": ["raw", "dist"], "rhat_median": [2.0, 1.005], "rhat_max": [3.0, 1.02]})
    ax = plotting.rhat(rhat)
    np.testing.assert_allclose([p.get_height() for p in ax.patches], [1.0, 0.005])

    inv = pd.DataFrame(
        {
            "quantity": ["lpd", "distances", "coordinates"],
            "metric": ["|diff| / margin", "ccc", "ccc"],
            "agreement": [1.0, 0.97, 0.1],
            "aligned_agreement": [np.nan, np.nan, 0.95],
            "verdict": ["agree", "agree", "agree after alignment"],
        }
    )
    ax = plotting.invariants(inv)
    widths = [p.get_width() for p in ax.patches]
    assert widths[:2] == [0.97, 0.1] and widths[2] == pytest.approx(0.95)

    genes = pd.DataFrame(
        {"fit": ["a"] * 3, "observed_zero_fraction": [0.1, 0.5, 0.9], "predicted_zero_fraction": [0.2] * 3}
    )
    ax = plotting.zero_fraction(genes)
    np.testing.assert_allclose(ax.collections[0].get_offsets()[:, 0], [0.1, 0.5, 0.9])

    spectra = pd.DataFrame({"fit": ["a", "a"], "component": [0, 1], "eigenvalue": [4.0, 1.0]})
    ax = plotting.covariance_spectra(spectra)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [4.0, 1.0])


def test_draws_into_given_axes():
    fig, ax = plt.subplots()
    assert plotting.alignment_errors(alignment_table(), ax=ax) is ax
    plt.close(fig)


def test_missing_columns_are_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="rhat_median"):
        plotting.rhat(pd.DataFrame({"quantity": ["x"]}))


def test_empty_and_nan_tables_draw_or_fail_clearly():
    rhat_cols = {"quantity": [], "rhat_median": [], "rhat_max": []}
    assert isinstance(plotting.rhat(pd.DataFrame(rhat_cols)), plt.Axes)  # was a numpy reduction error
    nan_rhat = pd.DataFrame({"quantity": ["x"], "rhat_median": [np.nan], "rhat_max": [np.nan]})
    assert isinstance(plotting.rhat(nan_rhat), plt.Axes)  # was "Axis limits cannot be NaN"
    columns = ["quantity", "agreement", "aligned_agreement", "verdict", "metric"]
    assert isinstance(plotting.invariants(pd.DataFrame({c: [] for c in columns})), plt.Axes)
    predictive = pd.DataFrame({"fit": ["a", "b"], "lpd_per_cell": [1.0, 2.0]})
    pairs = pd.DataFrame({c: [] for c in ["fit_a", "fit_b", "diff_per_cell", "se_diff_per_cell"]})
    with pytest.raises(InvalidArgumentError, match="no row for 'a'"):
        plotting.paired_lpd_differences(predictive, pairs)  # was an IndexError
    with pytest.raises(InvalidArgumentError, match="finite"):
        plotting.paired_lpd_differences(predictive.assign(lpd_per_cell=np.nan), pairs)
    with pytest.raises(InvalidArgumentError, match="empty"):
        plotting.marker_correlations(pd.DataFrame({c: [] for c in ["fit", "marker", "dim", "corr"]}))
    assert plt.get_fignums() == []


def test_before_after_panels_check_shapes():
    Z = np.zeros((5, 2))
    with pytest.raises(InvalidArgumentError, match="dims"):
        plotting.latent_before_after(Z, Z, dims=(0, 3))
    with pytest.raises(InvalidArgumentError, match="labels has 2 entries"):
        plotting.latent_before_after(Z, Z, labels=["a", "b"])  # was a boolean-index error
    with pytest.raises(InvalidArgumentError, match="same shape"):
        plotting.latent_before_after(Z, Z[:, :1])
    with pytest.raises(InvalidArgumentError, match="dim"):
        plotting.loadings_before_after(Z, Z, list("abcde"), dim=2)
    with pytest.raises(InvalidArgumentError, match="gene name per row"):
        plotting.loadings_before_after(Z, Z, list("abc"), genes=["a"])


def test_cells_without_a_label_are_drawn():
    Z = np.arange(6.0).reshape(3, 2)
    axes = plotting.latent_before_after(Z, Z, labels=["a", None, "b"])
    drawn = np.vstack([c.get_offsets() for c in axes[0].collections])
    assert len(drawn) == 3  # the unlabelled cell was dropped
    assert "(no label)" in [t.get_text() for t in axes[1].get_legend().get_texts()]


def test_names_with_dollar_signs_are_drawn_as_written():
    # "$\nocommand$" is not valid TeX: read as mathtext it raised ValueError when the figure was drawn
    name = "$\\nocommand$"
    fig, given = plt.subplots()  # its title existed before the call, with pyplot's default parse_math
    given.set_title("made before")
    markers = pd.DataFrame({"fit": [name, "s1"], "marker": [name, name], "dim": [0, 0], "corr": [0.5, -0.5]})
    drawn = [
        plotting.marker_r2(pd.DataFrame({"fit": [name, "b"], "marker": [name, name], "r2": [0.5, 0.52]}), ax=given),
        *plotting.marker_correlations(markers),
        *plotting.latent_before_after(np.arange(6.0).reshape(3, 2), np.ones((3, 2)), labels=[name, "a", name]),
    ]
    for ax in drawn:
        ax.figure.canvas.draw()
    texts = [t.get_text() for ax in drawn for t in ax.findobj(Text)]
    assert any(name in t for t in texts)
    plt.close(fig)


def test_log_axes_label_their_ticks_in_plain_text():
    """The figures show text as written (no mathtext), so matplotlib's log labels appeared as
    '$\\mathdefault{10^{-16}}$', overlapping into an unreadable axis."""
    lpd = plotting.lpd_differences(
        {"fitted / rotation": pd.DataFrame({"lpd": [-100.0, -50.0], "lpd_crn": [-100.0 + 1e-13, -48.0]})},
        threshold=1e-9,
    )
    spectra = pd.DataFrame({"fit": ["seed 0"] * 3, "component": [0, 1, 2], "eigenvalue": [2.0, 0.5, 0.1]})
    cov = plotting.covariance_spectra(spectra)
    for labels in (lpd.get_xticklabels(), cov.get_yticklabels()):
        lpd.figure.canvas.draw()
        cov.figure.canvas.draw()
        texts = [t.get_text() for t in labels if t.get_text()]
        assert texts and not any("$" in t or "mathdefault" in t for t in texts), texts


def test_invariants_axis_shows_every_interval_end():
    """The left limit came from the agreements only: an interval reaching below them was drawn cut at the edge."""
    table = pd.DataFrame(
        {
            "quantity": ["posterior predictive statistics"],
            "metric": ["ccc"],
            "agreement": [0.05],
            "low": [-0.15],
            "high": [0.2],
            "aligned_agreement": [np.nan],
            "verdict": ["undetermined"],
            "threshold": [0.9],
        }
    )
    ax = plotting.invariants(table)
    assert ax.get_xlim()[0] <= -0.15
    plt.close(ax.figure)


def test_marker_heatmaps_refuse_fewer_axes_than_seeds_and_incomplete_tables():
    corr = pd.DataFrame(
        {"fit": ["seed 0", "seed 0", "seed 1", "seed 1"], "marker": ["CD14", "NKG7"] * 2, "dim": 0, "corr": 0.5}
    )
    fig, ax = plt.subplots()
    with pytest.raises(InvalidArgumentError, match="2 seeds, but 1 axes"):  # seed 1 was left out without a word
        plotting.marker_correlations(corr, axes=[ax])
    with pytest.raises(InvalidArgumentError, match=r"seed 'seed 1' has no rows for markers \['NKG7'\]"):
        plotting.marker_correlations(corr.iloc[:3], axes=[ax, ax])
    with pytest.raises(InvalidArgumentError, match="repeat a seed, marker and dimension"):
        plotting.marker_correlations(pd.concat([corr, corr.iloc[:1]]))
    plt.close(fig)


def test_cells_without_a_finite_lpd_difference_are_drawn_and_counted():
    """They were left out of the log axis, and the cells left read as exactly invariant."""
    per_cell = {
        "fitted / rotation": pd.DataFrame({"lpd": [-50.0, -60.0, np.nan, -70.0], "lpd_crn": [-50, -60, -55, np.inf]})
    }
    ax = plotting.lpd_differences(per_cell, threshold=1e-9)
    drawn = sum(len(c.get_offsets()) for c in ax.collections)
    assert drawn == 4
    assert any("NaN or infinite difference (2 cells)" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(ax.figure)


def test_output_changes_refuse_negative_sizes_and_colour_infinite_ones_at_the_top():
    outputs = pd.DataFrame({"rotation": [1e-14, np.nan, np.inf]}, index=["log p(x)", "decoded", "distances"])
    ax = plotting.output_changes(outputs)
    shown = ax.get_images()[0].get_array()
    assert np.ma.getmaskarray(shown).tolist() == [[False], [True], [False]]  # inf was blank, as a missing value
    assert float(shown[2, 0]) == pytest.approx(1.0)
    plt.close(ax.figure)
    with pytest.raises(InvalidArgumentError, match="never negative"):  # -0.5 was drawn as "none"
        plotting.output_changes(pd.DataFrame({"rotation": [-0.5]}, index=["log p(x)"]))


def test_frontier_refuses_an_interval_that_excludes_its_point_and_an_empty_frontier():
    frontier = pd.DataFrame(
        {"candidate": ["n_latent=2"], "stability": [0.9], "fit": [-1.0], "fit_low": [-0.5], "fit_high": [-0.2]}
    )
    with pytest.raises(InvalidArgumentError, match="does not contain its fit"):  # drawn as [-1.5, -0.2]
        plotting.model_frontier(frontier)
    with pytest.raises(InvalidArgumentError, match="empty frontier"):
        plotting.model_frontier(frontier.iloc[:0])
    on_its_end = frontier.assign(fit_low=-1.0 + 1e-15, fit_high=-0.2)  # rounding on an end is no gap
    plt.close(plotting.model_frontier(on_its_end).figure)


def test_integer_fit_names_find_their_pairs():
    predictive = pd.DataFrame(
        {"fit": [0, 1], "lpd_per_cell": [-3.0, -2.0], "se_per_cell": [1.0, 1.0], "mc_se_per_cell": [0.1, 0.1]}
    )
    pairs = pd.DataFrame({"fit_a": [0], "fit_b": [1], "diff_per_cell": [-1.0], "se_diff_per_cell": [0.1]})
    ax = plotting.paired_lpd_differences(predictive, pairs)  # said pairs had no row for '0' and '1'
    assert ax.lines or ax.containers
    plt.close(ax.figure)


def test_panel_arguments_are_checked_before_drawing():
    Z = np.zeros((5, 2))
    fig, ax = plt.subplots()
    for kwargs, message in (
        ({"axes": ax}, "got 1 axes"),  # len() of an unsized object
        ({"titles": ("only one",)}, "got 1 titles"),
        ({"dims": (0,)}, "dims names the two latent dimensions"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            plotting.latent_before_after(Z, Z, **kwargs)
    _, grid = plt.subplots(1, 2, squeeze=False)
    assert len(plotting.latent_before_after(Z, Z, axes=grid)) == 2  # was "got 1 axes"
    W = np.arange(4.0).reshape(2, 2)
    ax = plotting.loadings_before_after(W, W, ["CD14", "NKG7"], genes="CD14")  # was split into its letters
    assert [t.get_text() for t in ax.get_yticklabels()] == ["CD14"]
    with pytest.raises(InvalidArgumentError, match="gene_names repeats"):
        plotting.loadings_before_after(W, W, ["CD14", "CD14"])
    plt.close("all")
