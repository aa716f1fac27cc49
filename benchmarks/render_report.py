"""Render a multi-seed report (report.html) in headless Chromium and keep screenshots of it.

The report must open in a browser with no network and read top to bottom, verdict
first. This script checks both the way a reader would meet it: it builds a report
with ``countvae diagnose`` on the embedded default (or takes an existing report
folder), lists every reference in the HTML that would make the browser fetch
something (there must be none), renders the page in headless Chromium, and writes

* ``<name>_top.png``: the first screen at full resolution (title, verdict, invariants);
* ``<name>_full.png``: the whole page at half width, to judge its layout;

under ``benchmarks/figures/`` (``--out-dir``). Chromium is not a dependency of
countvae; on Debian or Ubuntu install it with ``apt-get install chromium``.

    python benchmarks/render_report.py                          # countvae diagnose, 3 seeds x 30 epochs
    python benchmarks/render_report.py --report diag/report     # an existing report folder
    python benchmarks/render_report.py --seeds 5 --max-epochs 100 --name report_default
"""

from __future__ import annotations

import argparse
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image  # a dependency of matplotlib

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_OUT = BENCH_DIR / "figures"
INSTALL_HINT = "install Chromium (Debian/Ubuntu: `apt-get install chromium`) or set COUNTVAE_CHROMIUM to its path"

#: Flags that keep headless Chromium off the network and away from the user's profile.
_QUIET_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)
#: Tall enough for a whole report; the blank space below the page is trimmed afterwards.
FULL_PAGE_HEIGHT = 14_000
TOP_HEIGHT = 1_400
WIDTH = 1_280


# ----- Chromium -------------------------------------------------------------------------------
def find_chromium() -> str | None:
    """Path of a Chromium (or Chrome) binary: ``$COUNTVAE_CHROMIUM``, /usr/bin/chromium, or one on PATH."""
    candidates = [os.environ.get("COUNTVAE_CHROMIUM"), "/usr/bin/chromium"]
    candidates += [shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _chromium(binary: str | None, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    binary = binary or find_chromium()
    if binary is None:
        raise FileNotFoundError(f"No Chromium found; {INSTALL_HINT}.")
    with tempfile.TemporaryDirectory(prefix="countvae-chromium-") as profile:
        command = [binary, *_QUIET_FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=profile)
    if proc.returncode != 0:
        raise RuntimeError(f"Chromium failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def screenshot(
    html_path: Path,
    png_path: Path,
    width: int = WIDTH,
    height: int = FULL_PAGE_HEIGHT,
    binary: str | None = None,
    timeout: float = 180.0,
) -> Path:
    """Render ``html_path`` in a ``width`` x ``height`` headless window and save the PNG to ``png_path``."""
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    _chromium(
        binary,
        [f"--window-size={width},{height}", f"--screenshot={png_path}", Path(html_path).resolve().as_uri()],
        timeout,
    )
    if not png_path.is_file():
        raise RuntimeError(f"Chromium exited without writing {png_path}.")
    return png_path


def dump_dom(html_path: Path, binary: str | None = None, timeout: float = 180.0) -> str:
    """The DOM Chromium built from ``html_path``, serialised as HTML (what a reader's browser shows)."""
    return _chromium(binary, ["--dump-dom", Path(html_path).resolve().as_uri()], timeout).stdout


# ----- what the page would fetch ----------------------------------------------------------------
class _References(html.parser.HTMLParser):
    """Collects every attribute value and style text through which a page can load a resource."""

    _URL_ATTRIBUTES = {"src", "href", "srcset", "poster", "data", "action", "formaction", "background", "xlink:href"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if name in self._URL_ATTRIBUTES:
                self.urls += [part.strip().split(" ")[0] for part in value.split(",")] if name == "srcset" else [value]
            elif name == "style":
                self.urls += _css_urls(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += _css_urls(data)


def _css_urls(css: str) -> list[str]:
    found = re.findall(r"url\(\s*['\"]?([^'\")]*)['\"]?\s*\)", css, flags=re.IGNORECASE)
    return found + re.findall(r"@import\s+['\"]([^'\"]+)['\"]", css, flags=re.IGNORECASE)


def external_references(html_text: str) -> list[str]:
    """References the browser would fetch: everything but inline ``data:`` URIs and in-page ``#`` anchors."""
    parser = _References()
    parser.feed(html_text)
    parser.close()
    return [u for u in parser.urls if u.strip() and not u.strip().lower().startswith(("data:", "#"))]


# ----- images -----------------------------------------------------------------------------------
def content_fraction(png_path: Path) -> float:
    """Fraction of pixels that differ from the page background (the most common colour)."""
    pixels = np.asarray(Image.open(png_path).convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[np.argmax(counts)]
    return float(np.mean(np.any(pixels != background, axis=1)))


def _trim_bottom(image: Image.Image, margin: int = 40) -> Image.Image:
    """Cut the blank window area below the end of the page."""
    pixels = np.asarray(image.convert("L"))
    rows = np.flatnonzero((pixels != pixels[-1, 0]).any(axis=1))
    bottom = min(image.height, (int(rows[-1]) + margin) if rows.size else image.height)
    return image.crop((0, 0, image.width, bottom))


def _save_small(image: Image.Image, path: Path) -> None:
    """An adaptive 256-colour palette keeps text sharp and the file a fraction of its RGB size."""
    image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def keep_screenshots(raw_png: Path, out_dir: Path, name: str) -> tuple[Path, Path]:
    """Write ``<name>_top.png`` (first screen, full size) and ``<name>_full.png`` (whole page, half size)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page = _trim_bottom(Image.open(raw_png))
    top_path, full_path = out_dir / f"{name}_top.png", out_dir / f"{name}_full.png"
    _save_small(page.crop((0, 0, page.width, min(page.height, TOP_HEIGHT))), top_path)
    half = page.resize((page.width // 2, max(1, page.height // 2)), Image.Resampling.LANCZOS)
    _save_small(half, full_path)
    return top_path, full_path


# ----- building a report ----------------------------------------------------------------------------
def build_report(out: Path, seeds: int, max_epochs: int) -> Path:
    """Run ``countvae diagnose`` on the embedded default into ``out``; return the report folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable,
        "-m",
        "countvae",
        "diagnose",
        "--seeds",
        str(seeds),
        "--max-epochs",
        str(max_epochs),
        "--out",
        str(out),
        "--quiet",
        "--json",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"countvae diagnose failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return out / "report"


def render(report_dir: Path, out_dir: Path, name: str, binary: str | None = None) -> dict[str, object]:
    """Check and render ``report_dir/report.html``; returns what was measured."""
    html_path = report_dir / "report.html" if report_dir.is_dir() else report_dir
    text = html_path.read_text(encoding="utf-8")
    external = external_references(text)
    with tempfile.TemporaryDirectory(prefix="countvae-render-") as tmp:
        raw = screenshot(html_path, Path(tmp) / "page.png", binary=binary)
        top, full = keep_screenshots(raw, out_dir, name)
    dom = dump_dom(html_path, binary=binary)
    return {
        "report": str(html_path),
        "external_references": external,
        "script_elements_in_dom": len(re.findall(r"<script\b", dom, flags=re.IGNORECASE)),
        "verdict_in_dom": "<h2>Verdict</h2>" in dom or 'class="verdict"' in dom,
        "content_fraction_top": round(content_fraction(top), 3),
        "screenshots": {str(top): top.stat().st_size, str(full): full.stat().st_size},
        "page_height_px": Image.open(full).height * 2,
    }


def main(argv: list[str] | None = None) -> int:
    """Build (or take) a report, check it and keep its screenshots."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, default=None, help="an existing report folder (or report.html)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the diagnose run (default 3)")
    parser.add_argument("--max-epochs", type=int, default=30, help="epochs per seed of the diagnose run (default 30)")
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_OUT, help=f"where screenshots go (default {DEFAULT_OUT})"
    )
    parser.add_argument("--name", default="report", help="file name prefix of the screenshots (default 'report')")
    parser.add_argument("--keep", type=Path, default=None, help="keep the diagnose output folder here")
    args = parser.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print(f"render_report: no Chromium found; {INSTALL_HINT}.", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="countvae-diagnose-") as tmp:
        report_dir = args.report
        if report_dir is None:
            report_dir = build_report(args.keep or Path(tmp) / "diagnose", args.seeds, args.max_epochs)
        result = render(report_dir, args.out_dir, args.name, binary)
    for key, value in result.items():
        print(f"{key}: {value}")
    problems = []
    if result["external_references"]:
        problems.append(f"report.html references external resources: {result['external_references'][:5]}")
    if result["script_elements_in_dom"]:
        problems.append(f"the rendered DOM holds {result['script_elements_in_dom']} <script> elements")
    if not result["verdict_in_dom"]:
        problems.append("the rendered DOM has no verdict")
    if result["content_fraction_top"] < 0.01:
        problems.append("the first screen is blank")
    for problem in problems:
        print(f"render_report: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
