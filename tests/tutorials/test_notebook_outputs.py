"""The comparison of stored and fresh tutorial outputs: numbers must match, timings and the like need not."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tutorials"))
from _outputs import comparable_outputs, differences, normalise  # noqa: E402


def _notebook(*cells_outputs):
    cells = [new_markdown_cell("# title")]
    cells += [new_code_cell("x", outputs=list(outputs)) for outputs in cells_outputs]
    return new_notebook(cells=cells)


def _stdout(text):
    return new_output("stream", name="stdout", text=text)


def _stderr(text):
    return new_output("stream", name="stderr", text=text)


def _display(data, kind="display_data"):
    if kind == "execute_result":
        return new_output("execute_result", data=data, execution_count=1)
    return new_output("display_data", data=data)


def _same(a, b):
    return differences(_notebook(*a), _notebook(*b)) == []


# ----- numbers must match ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("held-out log p(x): -717.3 nats per cell", "held-out log p(x): -717.4 nats per cell"),
        ("agreement 0.77 (threshold 0.9)", "agreement 0.78 (threshold 0.9)"),
        ("5 seeds x 100 epochs", "6 seeds x 100 epochs"),
        ("(3000, 310) | fit: 2700 cells", "(3000, 310) | fit: 2701 cells"),
        ("k-NN overlap 0.51", "k-NN overlap 0.15"),
        ("decoded means: stable", "decoded means: unstable"),
        ("1e-09 nats", "1e-08 nats"),
        ("30 sources at 5 min_cells", "30 sources at 6 min_cells"),
    ],
)
def test_a_changed_number_or_word_in_printed_output_is_a_difference(old, new):
    assert not _same([[_stdout(old)]], [[_stdout(new)]])


def test_a_changed_number_in_a_table_is_a_difference():
    table = "<table><tr><td>decoded means</td><td>{}</td></tr></table>"
    old = _display({"text/html": table.format("0.981"), "text/plain": "decoded means  0.981"}, "execute_result")
    new = _display({"text/html": table.format("0.982"), "text/plain": "decoded means  0.982"}, "execute_result")
    assert not _same([[old]], [[new]])
    # a display with only HTML (a report's summary) is compared as HTML
    html_only = _display({"text/html": table.format("0.982")}, "execute_result")
    assert not _same([[_display({"text/html": table.format("0.981")}, "execute_result")]], [[html_only]])
    # with a text version beside it, the HTML (the same table again) is not compared twice
    same_text = _display({"text/html": table.format("0.982"), "text/plain": "decoded means  0.981"}, "execute_result")
    assert _same([[old]], [[same_text]])


def test_a_changed_number_in_a_warning_is_a_difference():
    old = "/a/countvae/ica.py:120: NonIdentifiableComponentsWarning: 2 of 5 components are too Gaussian"
    new = "/a/countvae/ica.py:120: NonIdentifiableComponentsWarning: 3 of 5 components are too Gaussian"
    assert not _same([[_stderr(old)]], [[_stderr(new)]])


def test_a_missing_output_or_figure_is_a_difference():
    figure = _display({"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480 with 1 Axes>"})
    assert not _same([[_stdout("a\n"), figure]], [[_stdout("a\n")]])
    assert not _same([[_display({"image/png": "iVBORw0KGgo="})]], [[]])
    assert not _same([[_stdout("a\n")]], [[]])
    assert not _same([[_stdout("a\n")]], [[_stdout("a\n")], []])


# ----- what may change ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("fitted 5 seeds in 12.3 s", "fitted 5 seeds in 47.9 s"),
        ("took 3 min", "took 11 minutes"),
        ("elapsed 0:01:02", "elapsed 0:03:58"),
        ("analysis 250 ms", "analysis 1200 ms"),
        ("<matplotlib.legend.Legend at 0x7f3a2c1b9d50>", "<matplotlib.legend.Legend at 0x7fe01a2b3c40>"),
        ("saved to /tmp/tmpab12cd/model", "saved to /tmp/tmpzz99yy/model"),
        ("report written 2026-11-30 11:40:02", "report written 2026-12-01 09:15:59"),
        (
            "/venv/lib/python3.11/site-packages/torch/x.py:12: UserWarning: w",
            "/opt/lib/site-packages/torch/x.py:99: UserWarning: w",
        ),
        ("/work/a/countvae/ica.py:120: Warn: w", "/ci/clone/countvae/ica.py:131: Warn: w"),
        ("trailing spaces   \n", "trailing spaces\n"),
    ],
)
def test_volatile_text_is_not_a_difference(old, new):
    assert _same([[_stdout(old)]], [[_stdout(new)]])


def test_progress_bars_and_redrawn_lines_are_not_a_difference():
    old = (
        "Epoch 1/5:  20%|██        | 1/5 [00:01<00:04, 1.1it/s]\rEpoch 5/5: 100%|██████████| 5/5 [00:05<00:00]\ndone\n"
    )
    new = "Epoch 5/5: 100%|██████████| 5/5 [00:09<00:00, 0.5it/s]\ndone\n"
    assert _same([[_stderr(old)]], [[_stderr(new)]])
    assert normalise("step 3\rstep 4\rfinal 0.5") == "final 0.5"


def test_figures_may_differ_pixel_by_pixel_and_streams_may_arrive_in_pieces():
    old = [_stdout("loss 1.25\nlpd "), _stderr("warn A\n"), _stdout("-3.5\n")]
    new = [_stdout("loss 1.25\n"), _stdout("lpd -3.5\n"), _stderr("warn A\n")]
    assert _same([old], [new])
    fig = _display({"image/png": "AAAA", "text/plain": "<Figure size 640x480 with 1 Axes>"})
    fig2 = _display({"image/png": "BBBB", "text/plain": "<Figure size 640x480 with 1 Axes>"})
    assert _same([[fig]], [[fig2]])
    embedded = '<img src="data:image/png;base64,{}">'
    assert _same(
        [[_display({"text/html": embedded.format("AAAA")})]], [[_display({"text/html": embedded.format("B/B+")})]]
    )


def test_comparable_outputs_keeps_the_order_of_displays():
    a = _display({"text/plain": "first"})
    b = _display({"text/plain": "second"})
    assert comparable_outputs(_notebook([a, b])) == [["text/plain: first", "text/plain: second"]]
    assert not _same([[a, b]], [[b, a]])


def test_the_kernel_runs_on_one_thread_with_fixed_hashing():
    from _execute import kernel_env

    probe = "import os; print(os.environ['OMP_NUM_THREADS'], hash('countvae'))"
    runs = [
        subprocess.run([sys.executable, "-c", probe], env=kernel_env(), capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    omp, first_hash = runs[0].stdout.split()
    assert omp == "1"  # fit_seeds fits on one torch thread by default, whatever the core count
    assert runs[1].stdout.split()[1] == first_hash


# ----- tolerances, free lines and agreements ---------------------------------------------------------------
def _differences_with(checks, old, new):
    from _outputs import differences

    return differences(_notebook([_stdout(old)]), _notebook([_stdout(new)]), checks)


def test_a_number_within_its_stated_tolerance_passes_and_beyond_it_fails():
    from _outputs import NotebookChecks, Tolerance

    checks = NotebookChecks(tolerances=[Tolerance(cells=(1,), abs=0.05, line="log p", why="3 Monte Carlo SE")])
    assert not _differences_with(checks, "log p(x): -425.53 nats", "log p(x): -425.51 nats")
    # 0.05 plus one unit of the last printed digit (0.01): 0.06 passes, 0.07 fails
    assert not _differences_with(checks, "log p(x): -425.53 nats", "log p(x): -425.47 nats")
    assert _differences_with(checks, "log p(x): -425.53 nats", "log p(x): -425.46 nats")
    # the rule covers its lines only; elsewhere numbers stay exact
    assert _differences_with(checks, "ARI = 0.626", "ARI = 0.625")
    # integers stay exact unless the rule covers them
    assert _differences_with(checks, "log p(x) on 527 cells", "log p(x) on 528 cells")


def test_a_prefix_rule_covers_only_the_number_it_names():
    from _outputs import NotebookChecks, Tolerance

    checks = NotebookChecks(
        tolerances=[
            Tolerance(cells=(1,), line="error", prefix="ica ", abs=0.25, why="ICA's unmixing"),
            Tolerance(cells=(1,), line="error", abs=0.01, why="alignment"),
        ]
    )
    assert not _differences_with(checks, "error: linear 0.090, ica 0.198.", "error: linear 0.091, ica 0.128.")
    assert _differences_with(checks, "error: linear 0.090, ica 0.198.", "error: linear 0.120, ica 0.198.")
    assert _differences_with(checks, "error: linear 0.090, ica 0.198.", "error: linear 0.090, ica 0.500.")


def test_an_above_rule_covers_only_the_numbers_in_its_range():
    from _outputs import NotebookChecks, Tolerance

    checks = NotebookChecks(
        tolerances=[
            Tolerance(cells=(1,), line="seed", above=45.0, abs=15.0, why="largest angle"),
            Tolerance(cells=(1,), line="seed", abs=0.03, rel=0.1, why="overlap and mean angle"),
        ]
    )
    assert not _differences_with(checks, "seed 0 seed 1 0.834 26.043 65.584", "seed 0 seed 1 0.840 27.000 58.767")
    assert _differences_with(checks, "seed 0 seed 1 0.834 26.043 65.584", "seed 0 seed 1 0.834 20.000 65.584")
    assert _differences_with(checks, "seed 0 seed 1 0.834 26.043 65.584", "seed 0 seed 1 0.834 26.043 40.000")


def test_a_relative_tolerance_and_integers_when_the_rule_says_so():
    from _outputs import NotebookChecks, Tolerance

    checks = NotebookChecks(tolerances=[Tolerance(cells=(1,), rel=0.2, integers=True, why="seed spread")])
    assert not _differences_with(checks, "calls per seed: 63 91", "calls per seed: 70 80")
    assert _differences_with(checks, "calls per seed: 63 91", "calls per seed: 90 91")
    assert not _differences_with(checks, "max |diff| 6.8e-13", "max |diff| 5.9e-13")


def test_a_changed_verdict_word_fails_whatever_the_tolerance():
    from _outputs import NotebookChecks, Tolerance

    checks = NotebookChecks(tolerances=[Tolerance(cells=(1,), abs=10.0, rel=1.0, integers=True, why="any")])
    assert _differences_with(checks, "latent distances 0.903 undetermined", "latent distances 0.913 agree")
    assert _differences_with(checks, "Agree across all 3 seeds: decoded means.", "Agree across all 3 seeds: none.")
    assert _differences_with(checks, "a\nb", "a")  # a line more or less is a difference


def test_free_lines_are_not_compared_word_for_word_but_other_lines_are():
    from _outputs import FreeLines, NotebookChecks

    checks = NotebookChecks(free_lines=[FreeLines(cells=(1,), line=r"^\s*\d+\s", why="clusters, compared by ARI")])
    old = "leiden  B cells  T cells\n0  586  6\n1  2  1284"
    assert not _differences_with(checks, old, "leiden  B cells  T cells\n0  3  1290\n1  580  5")
    assert _differences_with(checks, old, "leiden  B cells  NK cells\n0  586  6\n1  2  1284")


def test_anchored_rules_cover_the_first_line_of_an_output_as_any_other():
    from _outputs import FreeLines, NotebookChecks, Tolerance

    # The first line of each output follows its kind ("stdout: "), which a rule anchored at the line's start
    # must not see: a headline printed first is as free, and its numbers as tolerant, as on any other line.
    free = NotebookChecks(free_lines=[FreeLines(cells=(1,), line=r"^- Agree across all", why="borderline verdict")])
    assert not _differences_with(
        free, "- Agree across all 3 seeds: decoded means.\nx", "- Agree across all 3 seeds: none.\nx"
    )
    assert _differences_with(
        free, "- Agree across all 3 seeds: decoded means.\nx", "- Agree across all 3 seeds: none.\ny"
    )
    tolerant = NotebookChecks(tolerances=[Tolerance(cells=(1,), line=r"^negentropy", rel=0.1, why="a null's quantile")])
    assert not _differences_with(tolerant, "negentropy at most 2.8e-05", "negentropy at most 2.7e-05")
    assert _differences_with(tolerant, "negentropy at most 2.8e-05", "negentropy at most 2.1e-05")


def test_agreements_pass_above_their_bound_and_fail_below():
    from _outputs import Agreement, NotebookChecks, agreement_differences, agreement_score

    stored = {"clusters": {f"c{i}": str(i % 3) for i in range(300)}, "calls": ["A", "B", "C", "D"]}
    permuted = {f"c{i}": str((i + 1) % 3) for i in range(300)}  # the same partition, other names
    assert agreement_score("ari", stored["clusters"], permuted) == 1.0
    shuffled = {f"c{i}": str(np.random.default_rng(0).integers(3)) for i in range(300)}
    assert agreement_score("ari", stored["clusters"], shuffled) < 0.1
    assert agreement_score("jaccard", stored["calls"], ["A", "B", "C", "E"]) == 3 / 5
    checks = NotebookChecks(
        agreements=[
            Agreement("clusters", "x", "ari", 0.9, why="seed-to-seed ARI 0.95"),
            Agreement("calls", "y", "jaccard", 0.7, why="MC re-run Jaccard 0.96"),
        ]
    )
    assert not agreement_differences(checks, stored, {"clusters": permuted, "calls": ["A", "B", "C", "D"]})
    problems = agreement_differences(checks, stored, {"clusters": shuffled, "calls": ["A", "B", "C", "E"]})
    assert len(problems) == 2
    # labels of other cells are not comparable, and say so
    assert agreement_differences(checks, stored, {"clusters": {"other": "0"}, "calls": stored["calls"]})


def test_the_probe_cell_reports_series_as_labels_and_iterables_as_sorted_items():
    import pandas as pd
    from _outputs import CLAIMS_MARKER, Agreement, NotebookChecks, claims_from_probe

    checks = NotebookChecks(
        agreements=[
            Agreement("labels", "labels", "ari", 0.9, "b"),
            Agreement("genes", "{'B', 'A'}", "jaccard", 0.5, "b"),
        ]
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(checks.probe_source(), {"labels": pd.Series([1, 2], index=["c1", "c2"])})
    assert printed.getvalue().startswith(CLAIMS_MARKER)
    notebook = _notebook([_stdout(printed.getvalue())])
    assert claims_from_probe(notebook) == {"labels": {"c1": "1", "c2": "2"}, "genes": ["A", "B"]}


def test_masked_words_hide_only_their_pattern():
    from _outputs import MaskedWords, NotebookChecks

    checks = NotebookChecks(masked_words=[MaskedWords((1,), pattern=r"\bz\d+ \([+-]", why="best dimension")])
    assert not _differences_with(checks, "CD14 seed 0: z5 (+0.64) False", "CD14 seed 0: z2 (-0.64) False")
    assert _differences_with(checks, "CD14 seed 0: z5 (+0.64) False", "CD14 seed 0: z2 (-0.64) True")
    assert _differences_with(checks, "CD14 seed 0: z5 (+0.64) False", "CD14 seed 0: z2 (-0.70) False")


def test_an_optional_warning_may_come_and_go_but_other_warnings_may_not():
    from _outputs import NotebookChecks, OptionalWarning, differences

    checks = NotebookChecks(optional_warnings=[OptionalWarning((1,), pattern="Unreliable.*1 of 300", why="k-hat")])
    warning = "x.py:1: UnreliableEstimateWarning: 1 of 300 cells have a Pareto k-hat above 0.7\n  frame = f()\n"
    other = "x.py:1: UserWarning: something else\n  y = g()\n"
    with_warning = _notebook([_stdout("done\n"), _stderr(warning)])
    without = _notebook([_stdout("done\n")])
    assert not differences(with_warning, without, checks) and not differences(without, with_warning, checks)
    assert differences(_notebook([_stdout("done\n"), _stderr(other)]), without, checks)
    assert differences(without, with_warning)  # without the rule the warning is a difference
