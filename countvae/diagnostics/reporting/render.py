"""Writing a :class:`DiagnosticReport` as report.html, report.json and report.md.

The HTML file is self-contained: figures are inline PNG (base64) images, the
style sheet is inline, and nothing is fetched from a network. Every string
that comes from the data or the fits (gene names, obs categories, fit names,
file names) is HTML-escaped, through :func:`html.escape` or pandas'
``to_html(escape=True)``.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from countvae import plotting
from countvae._formatting import format_value, json_ready, markdown_table
from countvae._io import atomic_directory, write_json_atomic, write_text_atomic
from countvae.diagnostics._hooks import checkpoint

if TYPE_CHECKING:
    from countvae.diagnostics.reporting.pipeline import DiagnosticReport

#: JSON/report format version of the report files.
REPORT_FORMAT = 1

_MAIN_TABLES = ("invariants", "alignment", "predictive", "subspace", "rhat", "markers", "ppc", "ica")

#: Figure name -> (title, tables whose numbers it shows, caption).
FIGURES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "invariants": (
        "What survives a re-run",
        ("invariants",),
        "Agreement between seeds for each quantity (worst pair of seeds; 1 is perfect agreement), coloured by "
        "verdict. Dashed outlines: the same after rotating each pair of seeds onto each other. A quantity that "
        "only agrees after rotation is a property of the arbitrary coordinates, not of the data.",
    ),
    "lpd": (
        "Held-out log predictive density per seed",
        ("predictive",),
        "Mean held-out log p(x) per cell with ±2 standard errors over cells (blue) and ±2 Monte Carlo standard "
        "errors of the importance sampler (orange). Cells differ far more than seeds, so these bars are wide.",
    ),
    "lpd_pairs": (
        "Paired difference to the best seed",
        ("predictive", "predictive_pairs"),
        "Each seed's held-out log p(x) per cell minus the best seed's, with ±2 standard errors of the per-cell "
        "paired difference. Bars crossing zero: no detectable difference in predictive fit.",
    ),
    "alignment": (
        "Seed-pair alignment by map class",
        ("alignment",),
        "Mean distance per cell between one seed's latent means mapped onto another's, as a fraction of the "
        "latent diameter, for maps fitted on half of the held-out cells and scored on the other half. A large "
        "drop from 'permutation' to 'orthogonal' means the seeds differ by a rotation, not by a relabelling "
        "of dimensions.",
    ),
    "ica_stability": (
        "ICA components across seeds",
        ("ica", "ica_matches"),
        "For each ICA component of the first seed (IC_0 is its most non-Gaussian), the best-match |correlation| "
        "with the ICA components of each other seed (points) and its mean (bar), with each seed's ICA estimated on "
        "a different half of the held-out cells. Green: reproduces (mean at or above the dashed threshold); red: "
        "does not; hatched: too close to Gaussian to be identified. Black ticks: the same comparison within the "
        "first seed (its own ICA on the other half): high there but low across seeds means the seeds' solutions "
        "differ; low in both means too few cells to fix that axis. Only reproducible components can be read as "
        "axes; the others are identified as a subspace at most. A random rotation of a d-dimensional Gaussian "
        "space gives about 0.90 (d = 2) to 0.7 (d = 6) by chance.",
    ),
    "angles": (
        "Principal angles between gene-space spans",
        ("subspace",),
        "Angles between the gene-space directions the decoders of two seeds move along (loadings for a "
        "linear decoder, Jacobians for an MLP). Small angles: the seeds span the same programmes, whatever "
        "their coordinates.",
    ),
    "spectra": (
        "Latent covariance spectra",
        ("covariance_spectra",),
        "Eigenvalues of each seed's latent covariance; a rotation leaves them unchanged.",
    ),
    "marker_heatmaps": (
        "Per-dimension marker correlations, per seed",
        ("marker_correlations",),
        "Correlation of each latent dimension (columns) with each marker (rows). The same marker lights up "
        "different dimensions with different signs in different seeds: reading a dimension as 'the CD14 axis' "
        "is a statement about one seed's coordinates.",
    ),
    "marker_r2": (
        "Rotation-invariant marker association",
        ("marker_r2",),
        "R² of each marker regressed on all latent dimensions, one point per seed. It does not depend on the "
        "coordinates, so it is what can be reported.",
    ),
    "rhat": (
        "Cross-seed R-hat",
        ("rhat",),
        "Seeds as chains, draws from each seed's posterior as draws. Raw coordinates have R-hat far above 1 "
        "because every seed sits in its own rotation; invariant quantities and aligned coordinates near 1 "
        "mean the seeds agree within their posterior uncertainty. Dashed line: 1.01.",
    ),
    "ppc": (
        "Posterior predictive check: zero fraction per gene",
        ("ppc_genes",),
        "Observed against predicted fraction of zero counts per gene, one colour per seed. Points on the "
        "diagonal: the model reproduces the sparsity of the data.",
    ),
}

_STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.05em;margin:1.2em 0 .3em}
.verdict{background:#f4f8fb;border-left:5px solid #2171b5;padding:.6em 1.2em}
.verdict li{margin:.35em 0}
.glance{display:grid;grid-template-columns:repeat(auto-fit,minmax(250px,1fr));gap:.8em;margin:1em 0}
.glance div{border:1px solid #ddd;border-top:5px solid;padding:.5em .8em;font-size:.9em}
.glance .g-stable{border-top-color:#1b7837}.glance .g-rotation{border-top-color:#e08214}
.glance .g-unstable{border-top-color:#b2182b}.glance .g-unmeasured{border-top-color:#999}
.glance b{display:block;margin-bottom:.2em}.glance span{color:#555;font-size:.9em}
.glance ul{margin:.3em 0 0 1.1em;padding:0}
nav{font-size:.9em;color:#444;margin:1em 0}nav a{color:#2171b5;text-decoration:none;margin-right:.9em}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0}th.num,td.num{text-align:right;font-variant-numeric:tabular-nums}.nw{white-space:nowrap}
.figrow{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:1em;align-items:start}
figure{margin:1em 0}figcaption{font-size:.88em;color:#444;max-width:900px}
img{max-width:100%;height:auto}
details{margin:.8em 0}summary{cursor:pointer;color:#2171b5}
.v-stable{color:#1b7837;font-weight:bold}.v-rotation{color:#e08214;font-weight:bold}
.v-unstable{color:#b2182b;font-weight:bold}.small{font-size:.85em;color:#555}
"""


# ----- JSON ---------------------------------------------------------------------------------------------
def report_to_dict(rep: DiagnosticReport) -> dict[str, Any]:
    """Everything in the report as JSON-safe objects."""
    tables = {name: getattr(rep, name) for name in _MAIN_TABLES}
    tables.update(rep.tables)
    return json_ready(
        {
            "format": REPORT_FORMAT,
            "headline": rep.headline,
            "tables": tables,
            "figures": {name: {"title": t, "tables": list(src), "caption": c} for name, (t, src, c) in FIGURES.items()},
            "settings": rep.settings,
            "subsampling": rep.subsampling,
            "provenance": rep.provenance,
            "timings_seconds": rep.timings,
        }
    )


# ----- figures --------------------------------------------------------------------------------------------
def _png(draw: Callable[[], Any]) -> str:
    """Run a plotting call that returns axes and encode its figure as a base64 PNG."""
    result = draw()
    first = np.asarray(result).ravel()[0] if isinstance(result, np.ndarray) else result
    fig = first.figure
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figures(rep: DiagnosticReport) -> dict[str, str]:
    t = rep.tables
    draw: dict[str, Callable[[], Any]] = {
        "invariants": lambda: plotting.invariants(rep.invariants),
        "alignment": lambda: plotting.alignment_errors(rep.alignment),
        "spectra": lambda: plotting.covariance_spectra(t["covariance_spectra"]),
        "rhat": lambda: plotting.rhat(rep.rhat),
        "ppc": lambda: plotting.zero_fraction(t["ppc_genes"]),
    }
    if len(rep.predictive) and "lpd_per_cell" in rep.predictive:
        draw["lpd"] = lambda: plotting.log_predictive_density(rep.predictive)
        if "predictive_pairs" in t:
            draw["lpd_pairs"] = lambda: plotting.paired_lpd_differences(rep.predictive, t["predictive_pairs"])
    if len(rep.ica):
        threshold = float(rep.settings.get("report", {}).get("ica_threshold", 0.95))
        draw["ica_stability"] = lambda: plotting.ica_stability(rep.ica, t.get("ica_matches"), threshold=threshold)
    if "angles_deg" in rep.subspace:
        draw["angles"] = lambda: plotting.principal_angles(rep.subspace)
    if len(t.get("marker_correlations", ())):
        draw["marker_heatmaps"] = lambda: plotting.marker_correlations(t["marker_correlations"])
        draw["marker_r2"] = lambda: plotting.marker_r2(t["marker_r2"])
    return {name: _png(fn) for name, fn in draw.items()}


# ----- HTML -----------------------------------------------------------------------------------------------
def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _cell_html(text: str, numeric: bool) -> str:
    """A table cell; numbers and short labels (``seed 0``) are kept on one line."""
    classes = [c for c, wanted in (("num", numeric), ("nw", numeric or len(text) <= 16)) if wanted]
    attribute = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attribute}>{html.escape(text)}</td>"


def _html_table(frame: pd.DataFrame, max_rows: int = 60) -> str:
    """A table with escaped cells; numeric columns right-aligned, text left-aligned."""
    numeric = [_is_numeric(frame[c]) for c in frame.columns]
    head = "".join(
        f"<th{' class=num' if num else ''}>{html.escape(str(c))}</th>"
        for c, num in zip(frame.columns, numeric, strict=True)
    )
    rows = []
    for row in frame.head(max_rows).itertuples(index=False):
        cells = "".join(_cell_html(format_value(v), num) for v, num in zip(row, numeric, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    out = f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    if len(frame) > max_rows:
        out += f'<p class="small">First {max_rows} of {len(frame)} rows; all rows are in report.json.</p>'
    return out


def _figure_html(name: str, images: dict[str, str]) -> str:
    if name not in images:
        return ""
    title, _, caption = FIGURES[name]
    return (
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{images[name]}">'
        f"<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)}</figcaption></figure>"
    )


def _figure_row(names: tuple[str, ...], images: dict[str, str]) -> str:
    """Figures side by side (they wrap onto separate lines on narrow screens)."""
    figures = "".join(_figure_html(n, images) for n in names)
    return f'<div class="figrow">{figures}</div>' if figures else ""


def _details(summary: str, body: str) -> str:
    """A collapsed block for tables that back up a figure (opened with a click, no script)."""
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def _verdict_class(verdict: str) -> str:
    return {"stable": "v-stable", "stable up to rotation": "v-rotation", "unstable": "v-unstable"}.get(verdict, "")


#: The verdict columns at a glance: verdict -> (CSS class, heading, what it means for the reader).
_GLANCE = {
    "stable": ("g-stable", "Stable", "agrees across seeds as it is: report it"),
    "stable up to rotation": (
        "g-rotation",
        "Stable only up to a rotation",
        "agrees only after aligning the seeds: never read it one dimension at a time",
    ),
    "unstable": ("g-unstable", "Unstable", "differs between seeds: report the spread, or do not report it"),
    "not measured": ("g-unmeasured", "Not measured", "not available for these fits"),
}


def _glance_html(frame: pd.DataFrame) -> str:
    """One box per verdict listing its quantities: the invariants table in one look."""
    boxes = []
    for verdict, (css, heading, meaning) in _GLANCE.items():
        quantities = frame.loc[frame["verdict"] == verdict, "quantity"].tolist()
        if not quantities and verdict == "not measured":
            continue
        items = "".join(f"<li>{html.escape(str(q))}</li>" for q in quantities) or "<li>none</li>"
        boxes.append(
            f'<div class="{css}"><b>{html.escape(heading)}</b><span>{html.escape(meaning)}</span><ul>{items}</ul></div>'
        )
    return f'<div class="glance">{"".join(boxes)}</div>'


def _invariants_html(frame: pd.DataFrame) -> str:
    text_head = ("quantity", "invariant in theory", "metric")
    number_head = ("agreement (worst pair)", "mean over pairs", "after rotation", "threshold")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in text_head)
    head += "".join(f"<th class=num>{html.escape(c)}</th>" for c in number_head)
    head += "".join(f"<th>{html.escape(c)}</th>" for c in ("verdict", "report instead"))
    rows = []
    for r in frame.itertuples():
        cells_html = "".join(f"<td>{html.escape(str(c))}</td>" for c in (r.quantity, r.invariant_in_theory, r.metric))
        numbers = (
            format_value(r.agreement),
            format_value(r.agreement_mean),
            format_value(r.aligned_agreement),
            r.threshold,
        )
        cells_html += "".join(f"<td class=num>{html.escape(str(c))}</td>" for c in numbers)
        cells_html += f'<td class="{_verdict_class(r.verdict)}">{html.escape(r.verdict)}</td>'
        cells_html += f"<td>{html.escape(r.report_instead)}</td>"
        rows.append(f"<tr>{cells_html}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _dict_html(mapping: dict[str, Any]) -> str:
    shown = {str(k): str(v) if isinstance(v, dict) else format_value(v) for k, v in mapping.items()}
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in shown.items())
    return f"<table><tbody>{rows}</tbody></table>"


def summary_html(rep: DiagnosticReport) -> str:
    """The verdict and the invariants table as an HTML fragment (for notebooks)."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in rep.headline)
    return f"<b>Multi-seed diagnostics</b><ul>{items}</ul>{_invariants_html(rep.invariants)}"


#: Section anchor -> title, in reading order after the verdict.
_SECTIONS = {
    "invariants": "1. The invariants table",
    "predictive": "2. Predictive equivalence",
    "alignment": "3. Alignment of latent spaces",
    "subspace": "4. Subspaces and geometry",
    "markers": "5. The marker pitfall",
    "rhat": "6. Cross-seed R-hat",
    "ppc": "7. Posterior predictive checks",
    "about": "About this report",
}


def _h2(anchor: str) -> str:
    return f'<h2 id="{anchor}">{html.escape(_SECTIONS[anchor])}</h2>'


def render_html(rep: DiagnosticReport) -> str:
    """The self-contained HTML report: verdict first, then the evidence, figures before tables."""
    images = _figures(rep)
    t = rep.tables
    fits = ", ".join(f"{f['name']} ({f['kind']})" for f in rep.provenance.get("fits", []))
    nav = " ".join(f'<a href="#{a}">{html.escape(title)}</a>' for a, title in _SECTIONS.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>countvae multi-seed diagnostics</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Multi-seed diagnostics: what these fits identify</h1>",
        f'<p class="small">{len(rep.provenance.get("fits", []))} fits: {html.escape(fits)}; '
        f"{rep.provenance.get('heldout_cells')} held-out cells, {rep.provenance.get('genes')} genes.</p>",
        '<h2 id="verdict">Verdict</h2>',
        _glance_html(rep.invariants),
        '<div class="verdict"><ul>',
        *(f"<li>{html.escape(line)}</li>" for line in rep.headline),
        "</ul></div>",
        f"<nav>Evidence: {nav}</nav>",
        _h2("invariants"),
        "<p>One row per output. <i>Invariant in theory</i>: whether the prior's symmetry (every rotation of the "
        "latent space) leaves it unchanged. <i>Agreement</i>: how closely the seeds agree (the metric is named; "
        "see the definitions at the end). <i>Verdict</i>: stable (agrees as it is), stable up to rotation "
        "(agrees only after rotating the seeds onto each other), unstable (does not agree).</p>",
        _figure_html("invariants", images),
        _invariants_html(rep.invariants),
        _h2("predictive"),
        _figure_row(("lpd_pairs", "lpd"), images),
        _html_table(rep.predictive),
        _details(
            "Pairwise paired differences and the arviz comparison",
            "<h3>Pairwise paired differences</h3>"
            + (_html_table(t["predictive_pairs"]) if "predictive_pairs" in t else "<p>Not available.</p>")
            + "<h3>arviz comparison</h3>"
            + (_html_table(t["predictive_compare"]) if "predictive_compare" in t else "<p>Not available.</p>"),
        ),
        _h2("alignment"),
        _figure_html("alignment", images),
        "<h3>Mean over seed pairs</h3>",
        _html_table(t["alignment_summary"]),
    ]
    if "ica_efficiency" in t:
        parts += ["<h3>ICA efficiency per seed pair</h3>", _html_table(t["ica_efficiency"])]
    if len(rep.ica):
        parts += [
            "<h3>ICA components: which reproduce across seeds</h3>",
            "<p>ICA picks the rotation that makes the coordinates most non-Gaussian. That choice is reproducible "
            "only along directions that are clearly non-Gaussian; inside a Gaussian subspace every rotation is "
            "equally good and the axes are noise.</p>",
            _figure_html("ica_stability", images),
            _html_table(rep.ica),
        ]
    parts += [
        _details("Every seed pair and map class", _html_table(rep.alignment)),
        _h2("subspace"),
        _figure_row(("angles", "spectra"), images),
        _html_table(rep.subspace),
        _h2("markers"),
        "<p>A latent dimension's correlation with a marker gene is a property of one seed's coordinates. "
        "The R² of the marker on all dimensions together is not.</p>",
        _figure_html("marker_heatmaps", images),
        _figure_html("marker_r2", images),
        _html_table(rep.markers),
        _h2("rhat"),
        _figure_html("rhat", images),
        _html_table(rep.rhat),
        _h2("ppc"),
        _figure_html("ppc", images),
        _html_table(rep.ppc),
        _h2("about"),
        "<h3>What was subsampled</h3>",
        "<p>Quantities that are quadratic in cells, or expensive per cell, use random subsets:</p>",
        _dict_html(rep.subsampling),
        "<h3>Definitions</h3>",
        _DEFINITIONS,
        "<h3>Reproducibility</h3>",
        _details(
            "Data checksum, package versions and settings",
            _dict_html(
                {
                    "held-out data checksum (SHA-256)": rep.provenance.get("heldout_checksum_sha256"),
                    **{f"version of {k}": v for k, v in rep.provenance.get("versions", {}).items()},
                    **{f"setting {k}": v for k, v in rep.settings.get("report", {}).items()},
                    "markers": ", ".join(rep.settings.get("markers", [])),
                }
            ),
        ),
        _details("Time per step (seconds)", _dict_html(rep.timings)),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


_DEFINITIONS = (
    "<ul>"
    + "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
        for k, v in {
            "ccc": "Lin's concordance correlation of two seeds' values (1 only if equal; penalises shifts and scale). "
            "Expression matrices are first centred per gene.",
            "jaccard": "mean over cells of the overlap of the k nearest neighbours (shared / union).",
            "weighted overlap": "share of one seed's decoder variation in gene space that lies in the other seed's "
            "gene-space span (1 = same span), averaged over both directions.",
            "cosine": "cosine similarity of two gene-by-gene decoder Gram matrices (W W^T, or mean Jacobian Gram).",
            "mcc": "mean correlation of ICA components after matching them by a signed permutation.",
            "|z|": "largest paired difference in held-out log p(x) between two seeds, in paired standard errors.",
            "noise ratio": "seed-to-seed difference of the predicted per-gene coefficient of variation and zero "
            "fraction, over the difference between two halves of one seed's draws (about 1 when the seeds agree).",
            "alignment error": "mean Euclidean distance per held-out cell between mapped and target latent means, "
            "over the target's diameter (largest pairwise distance) or RMS pairwise distance, averaged over both "
            "directions.",
            "ICA efficiency": "(e_permutation - e_ICA) / (e_permutation - e_orthogonal).",
            "best-match |corr|": "for one ICA component of the first seed, the largest |correlation| with a "
            "component of another seed's ICA after matching all components one to one (Hungarian); a component "
            "reproduces when its mean over the other seeds is at least the threshold (0.95 by default).",
            "R-hat": "rank-normalised split R-hat (Vehtari et al. 2021, arviz) with seeds as chains.",
            "predictively equivalent": "every pair of seeds differs in held-out log p(x) by less than 2 paired "
            "standard errors.",
        }.items()
    )
    + "</ul>"
)


# ----- Markdown -------------------------------------------------------------------------------------------
def _md(frame: pd.DataFrame) -> str:
    return markdown_table(frame, max_rows=60, note="all rows are in report.json")


def render_markdown(rep: DiagnosticReport) -> str:
    """The report as Markdown (tables only; the figures are in report.html)."""
    t = rep.tables
    sections = [
        "# Multi-seed diagnostics: what these fits identify",
        "## Verdict",
        "\n".join(f"- {line}" for line in rep.headline),
        "## Invariants",
        _md(rep.invariants),
        "## Predictive equivalence",
        _md(rep.predictive),
    ]
    if "predictive_pairs" in t:
        sections.append(_md(t["predictive_pairs"]))
    sections += ["## Alignment (mean over seed pairs)", _md(t["alignment_summary"])]
    if "ica_efficiency" in t:
        sections.append(_md(t["ica_efficiency"]))
    if len(rep.ica):
        sections += ["## ICA components across seeds", _md(rep.ica)]
    sections += [
        "## Subspaces and geometry",
        _md(rep.subspace),
        "## Markers",
        _md(rep.markers),
        "## Cross-seed R-hat",
        _md(rep.rhat),
        "## Posterior predictive checks",
        _md(rep.ppc),
        "## Subsampling",
        "\n".join(f"- {k}: {v}" for k, v in rep.subsampling.items()),
        "## Provenance",
        f"- held-out data SHA-256: {rep.provenance.get('heldout_checksum_sha256')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in rep.provenance.get("versions", {}).items()),
    ]
    return "\n\n".join(sections) + "\n"


# ----- saving ---------------------------------------------------------------------------------------------
def save_report(rep: DiagnosticReport, path: Path, overwrite: bool = False) -> Path:
    """Write the three report files into ``path`` atomically (see :func:`countvae._io.atomic_directory`)."""
    html_text = render_html(rep)
    markdown = render_markdown(rep)
    record = report_to_dict(rep)
    with atomic_directory(path, overwrite=overwrite) as tmp:
        write_text_atomic(tmp / "report.html", html_text)
        checkpoint("report_writing")  # the interruption tests kill the run here, mid-report
        write_json_atomic(tmp / "report.json", record)
        write_text_atomic(tmp / "report.md", markdown)
    return path
