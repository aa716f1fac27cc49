"""The documentation site: builds with warnings as errors, links resolve, opens offline, says what the code does.

One build (about 30 s on 2 cores) serves every test of the built site. Notebooks are not executed
by the build: the pages show the outputs stored in ``tutorials/*.ipynb``, which ``test_tutorials.py``
checks against a fresh run.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from html_links import broken_internal_links, parse_page, remote_loads

from countvae.cli import build_parser
from countvae.diagnostics.analyses.invariants import METRIC_DEFINITIONS, QUANTITIES, InvariantInputs, invariants_table
from countvae.diagnostics.reporting.display import invariants_for_display
from countvae.diagnostics.reporting.verdicts import VERDICTS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
from api_pages import NAMESPACES, public_names  # noqa: E402
from cli_help import help_texts, subcommands  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The HTML site built from this checkout with ``-W --keep-going -n`` into a fresh folder."""
    out = tmp_path_factory.mktemp("docs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
    command += ["-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    print(f"docs build: {time.perf_counter() - started:.1f} s")
    assert proc.returncode == 0, f"the docs build failed or warned:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out / "html"


def _text(path: Path) -> str:
    """The visible text of an HTML page, whitespace collapsed."""
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", path.read_text(encoding="utf-8"), flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())


def _strip_roles(rst: str) -> str:
    """``:class:`~a.B``` -> ``B``, ``:func:`f``` -> ``f``: the text Sphinx shows for a cross-reference."""
    return re.sub(r":[\w:]+:`(~?)([^`]*)`", lambda m: m.group(2).split(".")[-1] if m.group(1) else m.group(2), rst)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


# ----- the link checker itself, on known answers ---------------------------------------------------
def _tiny_site(root: Path, pages: dict[str, str]) -> Path:
    for name, body in pages.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"<html><head></head><body>{body}</body></html>", encoding="utf-8")
    return root


def test_link_checker_accepts_a_sound_site(tmp_path):
    site = _tiny_site(
        tmp_path,
        {
            "index.html": '<a href="sub/page.html#part">x</a><a href="#top" id="top">t</a><a href="sub/">dir</a>'
            '<a href="https://example.org/">out</a><img src="img/a.png"><a href="#">nothing</a>',
            "sub/page.html": '<h1 id="part">p</h1><a href="../index.html?highlight=x#top">back</a>',
            "sub/index.html": "<p>dir index</p>",
        },
    )
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"png")
    assert broken_internal_links(site) == []
    assert remote_loads(site) == []


def test_link_checker_finds_every_kind_of_broken_link(tmp_path):
    site = _tiny_site(
        tmp_path / "site",
        {
            "index.html": '<a href="missing.html">a</a><a href="page.html#nowhere">b</a><a href="#gone">c</a>'
            '<img src="img/none.png"><a href="../outside.html">d</a><a href="file:///etc/passwd">e</a>',
            "page.html": '<p id="here">p</p>',
        },
    )
    (tmp_path / "outside.html").write_text("<p>outside</p>", encoding="utf-8")
    problems = broken_internal_links(site)
    assert [p.split(" (")[0] for p in problems] == [
        "index.html: missing.html",
        "index.html: page.html#nowhere",
        "index.html: #gone",
        "index.html: img/none.png",
        "index.html: ../outside.html",
        "index.html: file:///etc/passwd",
    ], problems


def test_remote_loads_finds_scripts_styles_fonts_and_images(tmp_path):
    site = _tiny_site(
        tmp_path,
        {
            "index.html": '<script src="https://cdn.example/mathjax.js"></script><link rel="stylesheet" '
            'href="//fonts.example/css"><link rel="next" href="https://example.org/not-loaded">'
            '<img srcset="a.png 1x, http://example.org/b.png 2x"><a href="https://example.org/">a link</a>'
            "<style>@import 'https://example.org/x.css'; body{background:url(http://example.org/bg.png)}</style>",
        },
    )
    (tmp_path / "theme.css").write_text("@font-face{src:url('https://fonts.example/f.woff2')}", encoding="utf-8")
    assert remote_loads(site) == [
        "index.html: https://cdn.example/mathjax.js",
        "index.html: //fonts.example/css",
        "index.html: http://example.org/b.png",
        "index.html: https://example.org/x.css",
        "index.html: http://example.org/bg.png",
        "theme.css: https://fonts.example/f.woff2",
    ]
    assert parse_page('<a id="x" name="y"></a>').ids == {"x", "y"}


# ----- the built site ----------------------------------------------------------------------------------
def test_every_internal_link_and_anchor_resolves(site):
    problems = broken_internal_links(site)
    assert not problems, "\n".join(problems[:30])


def test_the_site_loads_nothing_from_the_network(site):
    problems = remote_loads(site)
    assert not problems, "pages that need the network to render:\n" + "\n".join(problems[:30])
    assert "mathjax" not in (site / "index.html").read_text(encoding="utf-8").lower()


def _expected_objects() -> dict[str, list[str]]:
    """Per namespace, the public classes and functions a user can import from it (independent of api_pages)."""
    expected = {}
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        names = getattr(module, "__all__", None) or [
            n for n, o in vars(module).items() if not n.startswith("_") and getattr(o, "__module__", "") == namespace
        ]
        objects = [getattr(module, n) for n in names]
        expected[namespace] = [
            n for n, o in zip(names, objects, strict=True) if inspect.isclass(o) or inspect.isfunction(o)
        ]
    return expected


def test_api_reference_has_one_page_per_public_function_and_class(site):
    expected = _expected_objects()
    assert "CountVAE" in expected["countvae"] and "verify" in expected["countvae.invariance"]
    assert "ICARotation" in expected["countvae.ica"] and "infomec" in expected["countvae.metrics"]
    assert "ModelSettings" in expected["countvae.model"] and "ProgressEvent" in expected["countvae.diagnostics"]
    # an object exported by several namespaces (CountVAE by countvae and countvae.model) has exactly one page,
    # under one of them, so that every cross-reference to it has one target
    pages: dict[int, list[Path]] = {}
    exported_as: dict[int, str] = {}
    for namespace, names in expected.items():
        for name in names:
            obj = getattr(importlib.import_module(namespace), name)
            page = site / "api" / "generated" / f"{namespace}.{name}.html"
            pages.setdefault(id(obj), [])
            exported_as.setdefault(id(obj), f"{namespace}.{name}")
            if page.is_file():
                pages[id(obj)].append(page)
    problems = [f"{exported_as[key]}: {len(found)} pages" for key, found in pages.items() if len(found) != 1]
    for key, found in pages.items():
        if len(found) != 1:
            continue
        # the page shows the object's own docstring, not just a title
        namespace, name = exported_as[key].rsplit(".", 1)
        summary = inspect.getdoc(getattr(importlib.import_module(namespace), name)).split("\n")[0]
        if " ".join(_words(_strip_roles(summary))[:6]) not in " ".join(_words(_text(found[0]))):
            problems.append(f"{found[0].relative_to(site)} (docstring not shown)")
    assert not problems, problems
    # methods are documented on their class's page, inherited ones included
    assert "get_log_predictive_density" in _text(site / "api" / "generated" / "countvae.CountVAE.html")
    report_page = _text(site / "api" / "generated" / "countvae.diagnostics.DiagnosticReport.html")
    assert "DiagnosticReport.invariants" in report_page and "one row per quantity" in report_page


def test_cli_reference_is_every_commands_help(site):
    text = _text(site / "cli.html")
    parser = build_parser()
    assert set(subcommands(parser)) >= {"fit", "diagnose", "verify-invariance"}
    for command, sub in subcommands(parser).items():
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, f"countvae {command} {option} is missing from the CLI reference"
    for _, help_text in help_texts(parser):
        first = " ".join(help_text.split("\n\n")[1].split()) if "\n\n" in help_text else ""
        assert first in text


def test_tutorial_pages_show_their_stored_outputs_and_figures(site):
    notebooks = sorted((ROOT / "tutorials").glob("*.ipynb"))
    assert notebooks
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        page = site / "tutorials" / f"{path.stem}.html"
        figures = sum(
            "image/png" in o.get("data", {}) for c in notebook.cells if c.cell_type == "code" for o in c.outputs
        )
        shown = page.read_text(encoding="utf-8").count('src="../_images/')
        assert figures > 0 and shown >= figures, f"{path.name}: {figures} figures stored, {shown} shown"
        printed = [
            o.text for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream"
        ]
        assert printed, f"{path.name} is stored without printed output; run python tutorials/build_all.py"
        last_line = next(line for line in reversed(printed[-1].splitlines()) if line.strip())
        assert " ".join(last_line.split()) in _text(page)


def test_benchmarks_page_is_results_md(site):
    text = _text(site / "benchmarks.html")
    headings = re.findall(r"^#+ (.+)$", (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"), re.M)
    assert len(headings) > 5
    page_words = " ".join(_words(text))
    for heading in headings:
        assert " ".join(_words(heading)) in page_words, heading


def test_citing_page_has_citation_cff(site):
    text = _text(site / "citing.html")
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    title = re.search(r'^title: "(.+)"$', cff, re.M).group(1)
    assert title in text and "Lopez, Regier, Cole, Jordan, Yosef (2018)" in text


# ----- the concepts page against the code ---------------------------------------------------------------
def _code_rows() -> pd.DataFrame:
    """The invariants table's rows, from the code, with every input present (values do not matter here)."""
    rng = np.random.default_rng(0)
    fits, n, latent, genes = ("a", "b"), 40, 2, 6

    def per_fit(*shape):
        return {f: rng.normal(size=shape) for f in fits}

    pairs = pd.DataFrame(
        {"fit_a": ["a"], "fit_b": ["b"], "n_cells": [n], "diff_per_cell": [0.1], "ci_low": [0.0], "ci_high": [0.2]}
        | {"margin": [0.5], "agreement": [0.99]}
    )
    components = pd.DataFrame(
        {"component": ["IC_0"], "worst_match": [1.0], "low": [1.0], "high": [1.0], "n_matching_cells": [n]}
        | {"corrected_match": [1.0], "corrected_low": [1.0], "corrected_high": [1.0]}
    )
    inputs = InvariantInputs(
        latents=per_fit(n, latent),
        lpd_pairs=pairs,
        ppc_pairs=pairs,
        log_rates=per_fit(n, genes),
        normalized=per_fit(n, genes),
        spans=per_fit(genes, latent),
        grams={f: np.eye(genes) for f in fits},
        loadings=per_fit(genes, latent),
        markers=pd.DataFrame(rng.normal(size=(n, 2)), columns=["m1", "m2"]),
        components=components,
    )
    table, _ = invariants_table(inputs)
    return invariants_for_display(table)[["quantity", "invariant_in_theory", "metric", "threshold"]]


def _page_rows(page: Path) -> list[list[str]]:
    text = page.read_text(encoding="utf-8")
    block = text[text.index("<!-- rows:start -->") : text.index("<!-- rows:end -->")]
    lines = [line for line in block.splitlines() if line.startswith("|")][2:]  # skip header and rule
    return [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_concepts_page_lists_the_report_rows_of_the_code():
    code = _code_rows()
    expected = [[str(v) for v in row] for row in code.itertuples(index=False)]
    page = DOCS / "concepts" / "report-rows.md"
    assert _page_rows(page) == expected, (
        f"{page.relative_to(ROOT)} no longer matches the invariants table of the code; paste these rows:\n"
        + "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in expected)
    )
    text = page.read_text(encoding="utf-8")
    for verdict in VERDICTS:
        assert f"\n{verdict}\n: " in text, f"the verdict {verdict!r} is not explained on {page.name}"


def _metric_block() -> str:
    """The list of metric definitions that report-rows.md shows, generated from the one source."""
    return "\n".join(
        f"`{name}`\n" + textwrap.fill(words, 110, initial_indent=": ", subsequent_indent="  ") + "\n"
        for name, words in METRIC_DEFINITIONS.items()
    )


def test_concepts_page_defines_the_metrics_in_the_words_of_the_code():
    assert {q.definition for q in QUANTITIES} <= set(METRIC_DEFINITIONS.values())  # every row has one
    page = DOCS / "concepts" / "report-rows.md"
    text = page.read_text(encoding="utf-8")
    shown = text[text.index("<!-- metrics:start -->\n") + 23 : text.index("<!-- metrics:end -->")]
    expected = _metric_block()
    assert shown == expected, f"{page.relative_to(ROOT)} defines the metrics unlike the code; paste:\n{expected}"


# ----- the README --------------------------------------------------------------------------------------------
def test_readme_is_short_keeps_the_fresh_machine_commands_and_links_to_pages_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= 10_000, f"README.md has {len(text):,} characters; move detail into docs/ (limit 10,000)"
    for command in (
        "bash scripts/setup.sh && .venv/bin/countvae diagnose --out countvae_diagnose",
        "bash scripts/setup.sh && bash scripts/test.sh",
    ):
        assert f"```bash\n{command}\n```" in text, command
    assert "`.ci/run` runs exactly the second command" in text
    assert text.count("![") == 1, "the README shows one figure"
    for target in re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)\)", text):
        assert (ROOT / target).is_file(), f"README.md links to {target}, which does not exist"
    # the second command is what CI runs
    assert "bash scripts/setup.sh\nbash scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


# ----- docstrings against signatures ---------------------------------------------------------------------------
#: A default stated in a parameter's entry: ``(default 500)``, ``(default: "nb")``, ``default ``0.95````.
_STATED_DEFAULT = re.compile(r"\(default:? (?:``)?(?P<a>[-+\w.\"']+?)(?:``)?[),;]|[Dd]efault:? ``(?P<b>[-+\w.\"']+)``")


def _parameters_section(doc: str | None) -> list[tuple[list[str], str]] | None:
    """The entries of a numpy-style "Parameters" section: (names, text) each, or ``None`` without one."""
    lines = inspect.cleandoc(doc or "").splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() != "Parameters" or set(lines[i + 1].strip()) != {"-"}:
            continue
        indent = len(line) - len(line.lstrip())
        entries: list[tuple[list[str], str]] = []
        for j in range(i + 2, len(lines)):
            text = lines[j]
            if not text.strip():
                continue
            if len(text) - len(text.lstrip()) > indent:
                if entries:
                    entries[-1] = (entries[-1][0], entries[-1][1] + " " + text.strip())
                continue
            if j + 1 < len(lines) and lines[j + 1].strip() and set(lines[j + 1].strip()) == {"-"}:
                break  # the next section
            head = text.strip().split(" : ")[0].rstrip(":")
            entries.append(([n.strip().lstrip("*") for n in head.split(",")], ""))
        return entries
    return None


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _public_callables():
    """(qualified name, callable) for every public function, class and method of the API reference's namespaces."""
    seen: set[int] = set()
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        for name in public_names(module):
            obj = getattr(module, name)
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{namespace}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    func = getattr(member, "__func__", member)
                    if not attr.startswith("_") and inspect.isfunction(func):
                        yield f"{namespace}.{name}.{attr}", func


def _docstring_problems() -> list[str]:
    problems = []
    for qualname, obj in _public_callables():
        doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        entries = _parameters_section(doc)
        if entries is None:
            continue  # parameters described in prose, or none
        try:
            params = {n: p for n, p in inspect.signature(obj).parameters.items() if n not in ("self", "cls")}
        except (TypeError, ValueError):
            continue
        documented = [n for names, _ in entries for n in names]
        missing = [n for n in params if n not in documented]
        unknown = [n for n in documented if n not in params]
        twice = sorted({n for n in documented if documented.count(n) > 1})
        if missing or unknown or twice:
            problems.append(f"{qualname}: undocumented {missing}, not parameters {unknown}, twice {twice}")
        for names, text in entries:
            for name in names:
                default = params[name].default if name in params else None
                if default is None or default is inspect.Parameter.empty:
                    continue  # a computed default, described in words
                for match in _STATED_DEFAULT.finditer(text):
                    stated = _literal(match["a"] or match["b"])
                    if stated is not None and stated != default:
                        problems.append(
                            f"{qualname}({name}=...): the docstring says default {stated!r}, the code {default!r}"
                        )
    return problems


def test_docstring_parameters_are_the_signatures_parameters_with_their_defaults():
    problems = _docstring_problems()
    assert not problems, "\n".join(problems)


def test_no_public_docstring_shows_an_unexpanded_settings_placeholder():
    # ``{settings}`` is replaced by the fields' entries (countvae._settings.documents_settings / takes_settings)
    shown = [q for q, obj in _public_callables() if "{settings}" in (obj.__doc__ or "")]
    assert not shown, f"docstrings that show the literal {{settings}} line: {shown}"


def test_exported_constants_are_shown_with_their_values_once(site):
    # DIAGNOSE_STOPPING (which the docs name as where the stopping rule is defined), DATASETS and ALL_GENES were in
    # __all__ but on no page of the site.
    page = (site / "api" / "countvae.diagnostics.html").read_text(encoding="utf-8")
    assert 'id="countvae.diagnostics.DIAGNOSE_STOPPING"' in page and "patience" in page
    assert 'id="countvae.diagnostics.DIAGNOSE_N_LATENT"' in page
    data = (site / "api" / "countvae.data.html").read_text(encoding="utf-8")
    assert 'id="countvae.data.DATASETS"' in data and 'id="countvae.data.ALL_GENES"' in data
    assert "kang2018_pbmc_ctrl_5donors.h5ad" in data
