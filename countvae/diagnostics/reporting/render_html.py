"""report.html: one self-contained page, verdict first, then the evidence (figures before tables).

Built with :mod:`countvae._report_files`: the style sheet is inline, figures
are inline PNG images, nothing is fetched, and every string that comes from the
data or the fits (gene names, obs categories, fit names) is HTML-escaped.
"""

from __future__ import annotations

import pandas as pd

from countvae._formatting import format_value
from countvae._report_files import (
    escape,
    html_details,
    html_figure,
    html_figure_row,
    html_key_values,
    html_list,
    html_page,
    html_table,
)
from countvae.diagnostics.analyses.invariants import METRIC_DEFINITIONS
from countvae.diagnostics.reporting.display import threshold_text
from countvae.diagnostics.reporting.figures import FIGURES, draw_figures
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.verdicts import AGREE, ALIGNED, DIFFER, NOT_MEASURED, UNDETERMINED

#: The report's own style rules, added to :data:`countvae._report_files.STYLE`.
_STYLE = """
.verdict{background:#f4f8fb;border-left:5px solid #2171b5;padding:.6em 1.2em}
.verdict li{margin:.35em 0}
.glance{display:grid;grid-template-columns:repeat(auto-fit,minmax(250px,1fr));gap:.8em;margin:1em 0}
.glance div{border:1px solid #ddd;border-top:5px solid;padding:.5em .8em;font-size:.9em}
.glance .g-agree{border-top-color:#1b7837}.glance .g-aligned{border-top-color:#e08214}
.glance .g-differ{border-top-color:#b2182b}.glance .g-undetermined{border-top-color:#6a51a3}
.glance .g-unmeasured{border-top-color:#999}
.glance b{display:block;margin-bottom:.2em}.glance span{color:#555;font-size:.9em}
.glance ul{margin:.3em 0 0 1.1em;padding:0}
.v-agree{color:#1b7837;font-weight:bold}.v-aligned{color:#e08214;font-weight:bold}
.v-differ{color:#b2182b;font-weight:bold}.v-undetermined{color:#6a51a3;font-weight:bold}
"""


def _verdict_class(verdict: str) -> str:
    return {AGREE: "v-agree", ALIGNED: "v-aligned", DIFFER: "v-differ", UNDETERMINED: "v-undetermined"}.get(verdict, "")


#: The verdict columns at a glance: verdict -> (CSS class, heading, what it means for the reader).
GLANCE = {
    AGREE: ("g-agree", "Agree", "agrees across seeds as it is, with confidence: report it"),
    ALIGNED: (
        "g-aligned",
        "Agree only after alignment",
        "agrees only after rotating the seeds onto each other: never read it one dimension at a time",
    ),
    DIFFER: ("g-differ", "Differ", "differs between seeds, with confidence: report the spread, or do not report it"),
    UNDETERMINED: (
        "g-undetermined",
        "Undetermined",
        "these cells cannot tell: see the reason and what would decide it",
    ),
    NOT_MEASURED: ("g-unmeasured", "Not measured", "not available for these fits"),
}


def _glance_html(frame: pd.DataFrame) -> str:
    """One box per verdict listing its quantities: the invariants table in one look."""
    boxes = []
    for verdict, (css, heading, meaning) in GLANCE.items():
        quantities = frame.loc[frame["verdict"] == verdict, "quantity"].tolist()
        if not quantities and verdict in (NOT_MEASURED, UNDETERMINED):
            continue
        items = html_list(quantities) or "<li>none</li>"
        boxes.append(f'<div class="{css}"><b>{escape(heading)}</b><span>{escape(meaning)}</span><ul>{items}</ul></div>')
    return f'<div class="glance">{"".join(boxes)}</div>'


def _interval(low: float, high: float) -> str:
    return "" if not (pd.notna(low) and pd.notna(high)) else f"[{format_value(low)}, {format_value(high)}]"


def _invariants_html(frame: pd.DataFrame) -> str:
    text_head = ("quantity", "invariant in theory", "metric")
    number_head = ("agreement (worst pair)", "interval", "mean over pairs", "after rotation", "threshold")
    head = "".join(f"<th>{escape(c)}</th>" for c in text_head)
    head += "".join(f"<th class=num>{escape(c)}</th>" for c in number_head)
    head += "".join(f"<th>{escape(c)}</th>" for c in ("verdict", "why / to decide", "report instead"))
    rows = []
    for r in frame.itertuples():
        cells_html = "".join(f"<td>{escape(c)}</td>" for c in (r.quantity, r.invariant_in_theory, r.metric))
        aligned = format_value(r.aligned_agreement)
        if pd.notna(r.aligned_agreement):
            aligned += " " + _interval(r.aligned_low, r.aligned_high)
        numbers = (
            format_value(r.agreement),
            _interval(r.low, r.high),
            format_value(r.agreement_mean),
            aligned,
            threshold_text(r.threshold, r.comparison),
        )
        cells_html += "".join(f"<td class=num>{escape(c)}</td>" for c in numbers)
        cells_html += f'<td class="{_verdict_class(r.verdict)}">{escape(r.verdict)}</td>'
        why = "; to decide: ".join(t for t in (r.reason, r.remedy) if t)
        cells_html += f"<td>{escape(why)}</td><td>{escape(r.report_instead)}</td>"
        rows.append(f"<tr>{cells_html}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _level(rep: ReportContent) -> str:
    alpha = float(rep.settings.get("report", {}).get("alpha", 0.05))
    return f"{100 * (1 - 2 * alpha):g}%"


def _predictive_intro(rep: ReportContent) -> str:
    record = rep.settings.get("predictive_equivalence", {})
    margin = record.get("margin_nats_per_cell")
    fraction = record.get("margin_fraction")
    gain = record.get("gain_over_no_latent_nats_per_cell")
    state = record.get("state", "not tested")
    stated = (
        f"margin +-{format_value(margin)} nats per cell, {100 * fraction:g}% of the {format_value(gain)} nats per "
        "cell the latent variables add over a model without them"
        if margin is not None and fraction is not None and gain is not None and margin == margin
        else "no margin could be stated"
    )
    return (
        f"<p>Decision: <b>{escape(state)}</b> ({escape(stated)}). Two one-sided tests per pair of seeds on the "
        "paired per-cell differences, with intervals simultaneous over all pairs; a pair is equivalent when its "
        "interval lies inside the margin, not equivalent when it lies outside, undetermined otherwise. "
        f"{escape(record.get('reason', ''))}</p>"
    )


def summary_html(rep: ReportContent) -> str:
    """The verdict and the invariants table as an HTML fragment (for notebooks)."""
    return f"<b>Multi-seed diagnostics</b><ul>{html_list(rep.headline)}</ul>{_invariants_html(rep.invariants)}"


#: Section anchor -> title, in reading order after the verdict.
_SECTIONS = {
    "invariants": "1. The invariants table",
    "predictive": "2. Predictive equivalence",
    "alignment": "3. Alignment of latent spaces",
    "subspace": "4. Subspaces and geometry",
    "markers": "5. The marker pitfall",
    "rhat": "6. Spread of guide draws across seeds (R-hat)",
    "ppc": "7. Posterior predictive checks",
    "truth": "8. Against the simulation's truth",
    "calibration": "How often these verdicts are right",
    "about": "About this report",
}


def _h2(anchor: str) -> str:
    return f'<h2 id="{anchor}">{escape(_SECTIONS[anchor])}</h2>'


def render_html(rep: ReportContent) -> str:
    """The self-contained HTML report: verdict first, then the evidence, figures before tables."""
    images = draw_figures(rep)
    t = rep.tables

    def figure(name: str) -> str:
        if name not in images:
            return ""
        title, _, caption = FIGURES[name]
        return html_figure(images[name], title, caption)

    def figure_row(*names: str) -> str:
        return html_figure_row(figure(n) for n in names)

    fits = ", ".join(f"{f['name']} ({f['kind']})" for f in rep.provenance.get("fits", []))
    present = {"truth": "ground_truth" in t, "calibration": "calibration" in t}
    sections = {a: title for a, title in _SECTIONS.items() if present.get(a, True)}
    nav = " ".join(f'<a href="#{a}">{escape(title)}</a>' for a, title in sections.items())
    parts = [
        "<h1>Multi-seed diagnostics: what these fits identify</h1>",
        f'<p class="small">{len(rep.provenance.get("fits", []))} fits: {escape(fits)}; '
        f"{rep.provenance.get('heldout_cells')} held-out cells, {rep.provenance.get('genes')} genes.</p>",
        '<h2 id="verdict">Verdict</h2>',
        _glance_html(rep.invariants),
        '<div class="verdict"><ul>',
        html_list(rep.headline),
        "</ul></div>",
        f"<nav>Evidence: {nav}</nav>",
        _h2("invariants"),
        "<p>One row per output. <i>Invariant in theory</i>: whether the prior's symmetry (every rotation of the "
        "latent space) leaves it unchanged. <i>Agreement</i>: how closely the worst pair of seeds agrees (the "
        "metric is named; see the definitions at the end), with its interval over resamples of the held-out "
        f"cells (level {_level(rep)}). <i>Verdict</i>: agree (the whole interval meets the threshold), agree "
        "after alignment (only after rotating the seeds onto each other), differ (the whole interval misses "
        "it), undetermined (the interval contains the threshold: the row says why and what would decide "
        "it).</p>",
        figure("invariants"),
        _invariants_html(rep.invariants),
        _h2("predictive"),
        _predictive_intro(rep),
        figure_row("lpd_pairs", "lpd"),
        "<h3>Equivalence test per pair of seeds</h3>",
        html_table(t["predictive_pairs"]) if "predictive_pairs" in t else "<p>Not available.</p>",
        "<h3>Per seed, with the estimator's reliability</h3>",
        html_table(rep.predictive),
        html_details(
            "The arviz comparison",
            html_table(t["predictive_compare"]) if "predictive_compare" in t else "<p>Not available.</p>",
        ),
        _h2("alignment"),
        figure("alignment"),
        "<h3>Mean over seed pairs</h3>",
        html_table(t["alignment_summary"]),
    ]
    if "ica_efficiency" in t:
        parts += ["<h3>ICA efficiency per seed pair</h3>", html_table(t["ica_efficiency"])]
    if len(rep.ica):
        parts += [
            "<h3>ICA components: which reproduce across seeds</h3>",
            "<p>ICA picks the rotation that makes the coordinates most non-Gaussian. That choice is reproducible "
            "only along directions that are clearly non-Gaussian; inside a Gaussian subspace every rotation is "
            "equally good and the axes are noise. Each seed's ICA is estimated on other cells than those it is "
            "compared on; a component agrees when its worst match with another seed is at the threshold with "
            "confidence, and is undetermined when it is too close to Gaussian or does not reproduce even within "
            "one seed.</p>",
            figure("ica_stability"),
            html_table(rep.ica),
        ]
    parts += [
        html_details("Every seed pair and map class", html_table(rep.alignment)),
        _h2("subspace"),
        figure_row("angles", "spectra"),
        html_table(rep.subspace),
        _h2("markers"),
        "<p>A latent dimension's correlation with a marker gene is a property of one seed's coordinates. "
        "The R² of the marker on all dimensions together is not.</p>",
        figure("marker_heatmaps"),
        figure("marker_r2"),
        html_table(rep.markers),
        _h2("rhat"),
        "<p>Not a convergence diagnostic and not part of the verdicts: seeds as chains, draws of each seed's "
        "amortized guide as draws. The baseline columns give the same statistic for two independent draw sets "
        "of one seed. A guide's posterior for one cell is narrow, so seeds that agree on every invariant can "
        "still lie several posterior widths apart.</p>",
        figure("rhat"),
        html_table(rep.rhat),
        _h2("ppc"),
        figure("ppc"),
        html_table(rep.ppc),
        *(rep.downstream.html_parts() if rep.downstream is not None else []),  # the optional downstream section
    ]
    if "ground_truth" in t:
        parts += [
            _h2("truth"),
            "<p>The held-out cells were simulated: their true sources are known. MCC is the mean |correlation| of "
            "the true sources with their best-matched coordinates; InfoM the modularity of Hsu et al. (2023). Raw "
            "coordinates sit in an arbitrary rotation of the sources; ICA coordinates recover non-Gaussian "
            "sources up to order and sign.</p>",
            html_table(t["ground_truth"]),
        ]
    if "calibration" in t:
        parts += _calibration_html(rep)
    parts += [
        _h2("about"),
        *(["<h3>Training of each seed</h3>", html_table(t["training"])] if "training" in t else []),
        "<h3>What was subsampled</h3>",
        "<p>Quantities that are quadratic in cells, or expensive per cell, use random subsets:</p>",
        html_key_values(rep.subsampling),
        "<h3>Definitions</h3>",
        _DEFINITIONS,
        "<h3>Reproducibility</h3>",
        html_details(
            "Data checksum, package versions and settings",
            html_key_values(
                {
                    "held-out data checksum (SHA-256)": rep.provenance.get("heldout_checksum_sha256"),
                    **{f"version of {k}": v for k, v in rep.provenance.get("versions", {}).items()},
                    **{f"setting {k}": v for k, v in rep.settings.get("report", {}).items()},
                    "markers": ", ".join(rep.settings.get("markers", [])),
                    **_gene_selection(rep.settings.get("fits", {}).get("gene_selection")),
                }
            ),
        ),
        html_details("Time per step (seconds)", html_key_values(rep.timings)),
    ]
    return html_page("countvae multi-seed diagnostics", parts, extra_style=_STYLE)


def _calibration_html(rep: ReportContent) -> list[str]:
    """The calibration suite's rates for this report's rows: which fall short of the goal, then the table."""
    record = rep.settings.get("calibration", {})
    short = record.get("below_goal", [])
    verdict = (
        f"<p>Rows right in fewer than 95% of the replicates of a scenario:</p><ul>{html_list(short)}</ul>"
        if short
        else "<p>Every row of this report was right in at least 95% of the replicates of every scenario.</p>"
    )
    parts = [
        _h2("calibration"),
        f"<p>{escape(record.get('measured_by', ''))}</p>",
        verdict,
        html_details(
            "Correct, undetermined and wrong verdicts per scenario and row",
            html_table(rep.tables["calibration"], max_rows=None),
        ),
    ]
    oracle = rep.tables.get("calibration_oracle")
    if oracle is not None and len(oracle):
        parts.append(
            html_details(
                "The same with the truth conditioned on what an oracle shows the seeds reached",
                "<p>The scenario's truth assumes that seeds reach one solution. An oracle that re-fits them and "
                "compares them with the simulation's truth leaves out the replicates whose seeds reached different "
                "solutions (every row but ICA) and takes the ICA row's truth from a larger-sample estimate.</p>"
                + html_table(oracle, max_rows=None),
            )
        )
    return parts


def _gene_selection(record: dict | None) -> dict[str, str]:
    """The genes kept before fitting, when they were selected (``countvae.data.select_top_genes``)."""
    if not record:
        return {}
    per_batch = f", per batch of {record['batch_key']}" if record.get("batch_key") else ""
    return {
        "gene selection": f"the {record['n_top_genes']} most variable of {record['n_genes_before']} genes "
        f"({record['flavor']} on the raw counts in {record['counts']}{per_batch})",
        "genes kept": ", ".join(record["genes"]),
    }


# The rows' metrics are defined in analyses.invariants (the docs page shows the same words); the report
# lists them with the definitions of its other sections, mcc in fifth place as it always was.
_ROW_METRICS = list(METRIC_DEFINITIONS.items())
_DEFINITIONS = (
    "<ul>"
    + "".join(
        f"<li><b>{escape(k)}</b>: {escape(v)}</li>"
        for k, v in {
            **dict(_ROW_METRICS[:4]),
            "mcc": "mean correlation of ICA components after matching them by a signed permutation.",
            **dict(_ROW_METRICS[4:]),
            "alignment error": "mean Euclidean distance per held-out cell between mapped and target latent means, "
            "over the target's diameter (largest pairwise distance) or RMS pairwise distance, averaged over both "
            "directions.",
            "ICA efficiency": "(e_permutation - e_ICA) / (e_permutation - e_orthogonal).",
            "best-match |corr|": "for one ICA component of the first seed, the largest |correlation| with a "
            "component of another seed's ICA after matching all components one to one (Hungarian); a component "
            "agrees when the interval of its worst match over the other seeds lies at or above the threshold "
            "(0.95 by default).",
            "R-hat": "rank-normalised split R-hat (Vehtari et al. 2021, arviz) with seeds as chains and guide draws "
            "as draws: a description of the seed-to-seed spread, not a verdict.",
            "interval": "percentile interval of a paired bootstrap over the held-out cells (the same resampled cells "
            "for every pair of seeds; the row's replicate is its worst pair).",
            "predictively equivalent": "two one-sided tests per pair of seeds on the paired per-cell differences in "
            "held-out log p(x), against the margin, Bonferroni-corrected over pairs, on reliable estimates "
            "(Pareto k-hat <= 0.7 on at least 95% of cells).",
        }.items()
    )
    + "</ul>"
)
