"""The comparison of stored and fresh tutorial outputs: numbers must match, timings and the like need not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tutorials"))
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
    new = _display({"text/html": table.format("0.982"), "text/plain": "decoded means  0.981"}, "execute_result")
    assert not _same([[old]], [[new]])


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
