"""report.html as a reader meets it: no network fetches, rendered in headless Chromium, verdict first.

The Chromium tests skip when no Chromium is installed, except under COUNTVAE_REQUIRE_BROWSER=1 (set by
.ci/run, which installs it), where they fail; everything that can be checked without a browser runs everywhere.
"""

from __future__ import annotations

import html
import importlib.util
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REQUIRE_BROWSER_ENV
from diagnostics_helpers import RotatedFit, random_rotation
from PIL import Image

import countvae as cv
from countvae.diagnostics import CountVAEFit, report
from countvae.diagnostics.reporting.sections.invariants import GLANCE

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
EVIL_GENE = "<script>alert(1)</script>"
SMALL = dict(n_lpd_samples=20, max_lpd_cells=150, n_rhat_draws=40, n_rhat_cells=8, max_jacobian_cells=60)


def _render_module():
    spec = importlib.util.spec_from_file_location("render_report_under_test", BENCH / "render_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rr = _render_module()


def _require_chromium() -> str:
    binary = rr.find_chromium()
    if binary is None:
        message = (
            "Chromium is not installed, so report.html cannot be rendered; install it with "
            "`apt-get install chromium` (Debian/Ubuntu) or set COUNTVAE_CHROMIUM to a Chromium/Chrome binary."
        )
        if os.environ.get(REQUIRE_BROWSER_ENV) == "1":
            pytest.fail(f"{REQUIRE_BROWSER_ENV}=1 and {message}")
        pytest.skip(message)
    return binary


@pytest.fixture(scope="module")
def saved_report(tmp_path_factory):
    """A small report whose data carry HTML (a gene named like a script tag), saved to a folder."""
    adata = cv.data.simulate(n_cells=400, n_genes=30, n_latent=2, decoder="linear", seed=5)
    adata.var_names = [EVIL_GENE, *adata.var_names[1:]]
    adata.obs["label"] = pd.Categorical(np.where(np.arange(400) % 2 == 0, "a", "b"))
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, decoder="linear")
    model.train(max_epochs=5, progress_bar=False, seed=0)
    base = CountVAEFit(model, 0)
    fits = [RotatedFit(base, np.eye(2), 0), RotatedFit(base, random_rotation(2, 1), 1)]
    rep = report(fits, adata[:200].copy(), markers=[EVIL_GENE, "label"], **SMALL)
    return rep, rep.save(tmp_path_factory.mktemp("render") / "report")


# ----- without a browser -------------------------------------------------------------------------
def test_external_references_finds_every_kind_of_fetch():
    page = """<html><head><link rel="stylesheet" href="https://cdn.example/x.css">
    <style>body{background:url('http://example.org/bg.png')} @import "theme.css";</style></head>
    <body><img src="data:image/png;base64,AAAA"><a href="#verdict">in page</a>
    <img srcset="a.png 1x, //example.org/b.png 2x"><script src="//example.org/app.js"></script>
    <div style="background-image:url(data:image/gif;base64,R0lG)"></div><iframe src="file:///etc/passwd"></iframe>
    </body></html>"""
    assert sorted(rr.external_references(page)) == sorted(
        [
            "https://cdn.example/x.css",
            "http://example.org/bg.png",
            "theme.css",
            "a.png",
            "//example.org/b.png",
            "//example.org/app.js",
            "file:///etc/passwd",
        ]
    )


def test_report_html_fetches_nothing(saved_report):
    _, folder = saved_report
    text = (folder / "report.html").read_text(encoding="utf-8")
    assert rr.external_references(text) == []
    assert "<script" not in text.lower()
    assert text.count('src="data:image/png;base64,') >= 8


def test_report_reads_verdict_first_then_evidence(saved_report):
    rep, folder = saved_report
    text = (folder / "report.html").read_text(encoding="utf-8")
    order = [
        text.index('<h2 id="verdict">'),
        text.index('class="glance"'),
        text.index('<h2 id="invariants">'),
        text.index('<h2 id="predictive">'),
        text.index('<h2 id="alignment">'),
        text.index('<h2 id="about">'),
    ]
    assert order == sorted(order)
    # Every quantity of the invariants table sits in the at-a-glance box of its verdict.
    glance = text[text.index('class="glance"') : text.index('class="verdict"')]
    for quantity, verdict in zip(rep.invariants["quantity"], rep.invariants["verdict"], strict=True):
        box = glance[glance.index(f'class="{GLANCE[verdict][0]}"') :].split("</div>", 1)[0]
        assert f"<li>{html.escape(quantity)}</li>" in box, (quantity, verdict)


def test_content_fraction_known_answers(tmp_path):
    white = np.full((100, 200, 3), 255, dtype=np.uint8)
    Image.fromarray(white).save(tmp_path / "blank.png")
    assert rr.content_fraction(tmp_path / "blank.png") == 0.0
    white[:20, :100] = 0  # a black block on a tenth of the page
    Image.fromarray(white).save(tmp_path / "block.png")
    assert rr.content_fraction(tmp_path / "block.png") == pytest.approx(0.1)


# ----- in Chromium -------------------------------------------------------------------------------
def test_missing_chromium_skips_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(rr, "find_chromium", lambda: None)
    monkeypatch.delenv(REQUIRE_BROWSER_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        _require_chromium()
    assert rr.main(["--report", "unused"]) == 1
    assert "apt-get install chromium" in capsys.readouterr().err


def test_missing_chromium_fails_where_the_browser_is_required(monkeypatch):
    monkeypatch.setattr(rr, "find_chromium", lambda: None)
    monkeypatch.setenv(REQUIRE_BROWSER_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_BROWSER_ENV}=1 and Chromium is not installed"):
        _require_chromium()


def test_chromium_renders_a_non_blank_page_with_the_verdict(saved_report, tmp_path):
    binary = _require_chromium()
    rep, folder = saved_report
    png = rr.screenshot(folder / "report.html", tmp_path / "page.png", width=1280, height=2000, binary=binary)
    image = Image.open(png)
    assert image.size == (1280, 2000)
    assert rr.content_fraction(png) > 0.05, "the first 2000 pixels of the report are (nearly) blank"
    dom = rr.dump_dom(folder / "report.html", binary=binary)
    assert '<h2 id="verdict">Verdict</h2>' in dom
    assert html.escape(rep.headline[0], quote=False) in dom
    # The gene named like a script tag is shown as text; the DOM holds no script element at all.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert "<script" not in dom.lower()


def test_render_script_keeps_small_screenshots(saved_report, tmp_path):
    _require_chromium()
    _, folder = saved_report
    out = tmp_path / "figures"
    assert rr.main(["--report", str(folder), "--out-dir", str(out), "--name", "tiny"]) == 0
    top, full = out / "tiny_top.png", out / "tiny_full.png"
    assert Image.open(top).width == 1280 and Image.open(full).width == 640
    assert Image.open(full).height > Image.open(top).height // 2, "the full page is longer than its first screen"
    for path in (top, full):
        assert path.stat().st_size < 1_500_000, path
        assert rr.content_fraction(path) > 0.02, path
