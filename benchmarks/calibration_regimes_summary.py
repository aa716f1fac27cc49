"""Summaries of ``calibration_regimes.py`` runs: verdicts against the oracle, seed groups, the k-NN row's cells.

Reads the CSV(s) and the grouping arrays next to them
(``<csv stem>_arrays/replicate_N_{heldout,pool}.npz``), writes the RESULTS.md
section ``calibration-regimes`` and the per-regime tables of the bundled
calibration record (``regimes`` in ``verdict_calibration.json``; the scenarios
of ``calibration.py`` are kept as they are).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _common import markdown_table, write_section

from countvae._io import write_text_atomic
from countvae.diagnostics.reporting.verdict_calibration import CALIBRATION_FILE, report_configuration

SECTION = "calibration-regimes"
#: The report's configuration in each regime (what :func:`nearest_regime` compares a report with).
CONFIGURATIONS = {
    "semi-synthetic": report_configuration("mlp", 10, 300, 500, True, data="simulated"),
    "semi-synthetic-10k": report_configuration("mlp", 10, 1000, 500, True, data="simulated"),
    "kang": report_configuration("mlp", 10, 300, 500, True),
    "kang-small-140": report_configuration("mlp", 10, 140, 500, True),
    "kang-small-300": report_configuration("mlp", 10, 300, 500, True),
    "semi-pbmc3tech": report_configuration("mlp", 10, 300, 500, True, data="simulated"),
    # SCVI's defaults; scvi-tools does not record early stopping on the model, so neither side names it
    "scvi-kang-small-300": report_configuration(
        "mlp", 10, 300, 500, True, model="scvi-tools", likelihood="zinb", early_stopping=None
    ),
    "linear-toy": report_configuration("linear", 3, 1000, 300, False, early_stopping=False, data="simulated"),
}
DESCRIPTIONS = {
    "semi-synthetic": "counts simulated from a default countvae (MLP/NB/10-d, batch) fitted to Kang, 500 genes, "
    "3 seeds with early stopping on 1,500 cells, report on 300 held-out cells",
    "semi-synthetic-10k": "counts simulated from the same generator (a default countvae fitted to Kang), a file of "
    "10,000 cells split as diagnose's default 10% does: 500 genes, 3 seeds with early stopping on 9,000 cells, "
    "report on 1,000 held-out cells",
    "kang": "real Kang cells, 500 genes, 3 seeds with early stopping on 1,500 cells, report on 300 held-out cells",
    "kang-small-140": "a small file of 1,400 real Kang cells split as fit_seeds' default 10% does (diagnose holds out "
    "300 of a file this size): 500 genes, 3 seeds with early stopping on 1,260 cells, report on 140 held-out cells",
    "kang-small-300": "the same small file of 1,400 real Kang cells with 300 held out: 500 genes, 3 seeds with early "
    "stopping on 1,100 cells, report on 300 held-out cells",
    "semi-pbmc3tech": "counts simulated from a default countvae (MLP/NB/10-d, batch = 3 chemistries) fitted to the "
    "2,000 pbmc_3tech cells, 500 genes, 3 seeds with early stopping on 1,700 cells, report on 300 held-out cells",
    "scvi-kang-small-300": "scvi-tools SCVI with its defaults (ZINB, 10-d, 1 x 128, batch; its early stopping) on the "
    "small file of 1,400 real Kang cells, 500 genes, 3 seeds on 1,100 cells, report on 300 held-out cells",
    "linear-toy": "the linear toy: simulated linear NB counts of 3 Laplace sources, 300 genes, 3 seeds of 150 epochs "
    "on 4,000 cells, report on 1,000 held-out cells",
}
POOL_CELLS = 4000
#: Regimes whose oracle differs from the report on the pool alone (the record's ``truth``).
_SHARED_ICA = (
    f"the verdict of the same fits on {POOL_CELLS:,} independent cells of the same distribution (for the ICA row, "
    "each fit's ICA estimated on halves of the same fit cells as the report's, so that row's oracle is not "
    "independent of the report)"
)
TRUTHS = {
    "linear-toy": f"the verdict of the same fits on {POOL_CELLS:,} independent cells of the same distribution, "
    "each fit's ICA estimated on halves of 20,000 more",
} | {name: _SHARED_ICA for name in CONFIGURATIONS if name != "linear-toy"}


def _lpd_frame(values: np.ndarray, mc_se: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"lpd": values, "mc_se": mc_se}, index=[f"c{i}" for i in range(values.size)])


def load_arrays(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """``{"baseline": array, "log_rate": {fit: array}, "lpd": {fit: frame}, "latent": {fit: array}}``."""
    with np.load(path) as z:
        out: dict = {"baseline": z["baseline"], "log_rate": {}, "lpd": {}, "latent": {}, "mc_se": {}, "latent_fit": {}}
        for key in z.files:
            if "/" in key:
                kind, name = key.split("/", 1)
                out[kind][name] = z[key]
    out["lpd"] = {n: _lpd_frame(v, out["mc_se"][n]) for n, v in out["lpd"].items()}
    return out


def grouping_rows(csv: Path) -> pd.DataFrame:
    """Per replicate and fit set: the seed groups on the held-out cells and on the pool, and whether they match."""
    from countvae.diagnostics.analyses.seed_groups import WORSE, seed_groups

    folder = csv.with_name(csv.stem + "_arrays")
    rows = []
    for held_path in sorted(folder.glob("replicate_*_heldout.npz")):
        replicate = int(held_path.stem.split("_")[1])
        pool_path = folder / f"replicate_{replicate}_pool.npz"
        if not pool_path.exists():
            continue
        held, pool = load_arrays(held_path), load_arrays(pool_path)
        names = list(held["log_rate"])
        seeds = [n for n in names if "epochs" not in n]
        for label, fits in (("seeds", seeds), ("seeds + under-trained fit", names)):
            results = {}
            for where, arrays in (("heldout", held), ("pool", pool)):
                results[where] = seed_groups(
                    {n: arrays["log_rate"][n] for n in fits},
                    {n: arrays["lpd"][n] for n in fits},
                    arrays["baseline"],
                )
            h, o = results["heldout"], results["pool"]
            bad = [n for n in fits if "epochs" in n]
            isolated = None
            if bad:
                g = h.groups
                own = g[[tuple(f) == (bad[0],) for f in g["fits"]]]
                isolated = bool(len(own) and own["versus_best"].iloc[0] == WORSE)
            rows.append(
                {
                    "replicate": replicate,
                    "fits": label,
                    "groups (held-out)": "; ".join(", ".join(f) for f in h.groups["fits"]),
                    "groups (oracle)": "; ".join(", ".join(f) for f in o.groups["fits"]),
                    "decided": h.decided,
                    "oracle decided": o.decided,
                    "same partition": h.partition == o.partition,
                    "under-trained fit alone and worse": isolated,
                    "sentence": _sentence(h),
                }
            )
    return pd.DataFrame(rows)


def _sentence(result) -> str:
    from countvae.diagnostics.analyses.seed_groups import seed_groups_sentence

    return seed_groups_sentence(result)


def knn_rows(csv: Path, k: int = 15, n_analyst: int = 1800, n_subsets: int = 3) -> pd.DataFrame:
    """Per replicate: the seeds' worst-pair k-NN overlap as the report computes it and as the analyst's graph has it.

    The analyst's graph is the k-NN graph on all of their cells (fit and
    held-out: counted from the run's fit-cell latents where it kept them, else
    ``n_analyst``); its oracle here is the overlap on pool subsets of that
    size. Next to it: the overlap on the held-out cells alone (``k`` neighbours
    among them, as the report computed it before), with ``k`` scaled by
    :func:`analyst_graph_k`, and the held-out rows of the graph on the held-out
    and fit cells together (:func:`knn_sets_among`, as the report computes it
    now; the fit cells' latents where the run kept them, else pool cells as
    stand-ins).
    """
    from countvae.diagnostics.analyses.subspace import analyst_graph_k

    folder = csv.with_name(csv.stem + "_arrays")
    rows = []
    for held_path in sorted(folder.glob("replicate_*_heldout.npz")):
        replicate = int(held_path.stem.split("_")[1])
        pool_path = folder / f"replicate_{replicate}_pool.npz"
        if not pool_path.exists():
            continue
        held_arrays = load_arrays(held_path)
        held, pool = held_arrays["latent"], load_arrays(pool_path)["latent"]
        seeds = [n for n in held if "epochs" not in n]
        n_held, n_pool = len(held[seeds[0]]), len(pool[seeds[0]])
        fit_latents = held_arrays["latent_fit"]
        has_fit = set(seeds) <= set(fit_latents)
        if has_fit:  # the analyst's cells: every fit cell (the report keeps up to 10,000) and the held-out ones
            n_analyst = n_held + len(fit_latents[seeds[0]])
        rng = np.random.default_rng(replicate)
        if n_analyst <= n_pool:
            subsets = [np.sort(rng.choice(n_pool, n_analyst, replace=False)) for _ in range(n_subsets)]
        else:  # the analyst's graph has more cells than the pool: the whole pool, k scaled up to speak for it
            subsets = [np.arange(n_pool)]
        if has_fit:
            reference, where = {n: fit_latents[n] for n in seeds}, "fit cells"
        else:
            stand_in = np.sort(rng.choice(n_pool, n_analyst - n_held, replace=False))
            reference, where = {n: pool[n][stand_in] for n in seeds}, "pool stand-ins"
        rows.append(
            {"replicate": str(replicate)}
            | _knn_overlaps(held, pool, reference, subsets, k, analyst_graph_k(k, n_held, n_analyst))
            | {"reference": where}
        )
    return pd.DataFrame(rows)


def _knn_overlaps(held, pool, reference, subsets, k: int, k_scaled: int) -> dict[str, float]:
    from countvae.diagnostics.analyses.downstream import neighbourhood_overlap as knn_jaccard
    from countvae.diagnostics.analyses.subspace import analyst_graph_k, knn_jaccard_per_cell, knn_sets_among

    seeds = list(reference)
    pairs = [(a, b) for i, a in enumerate(seeds) for b in seeds[i + 1 :]]

    def worst(score) -> float:
        return float(min(score(a, b) for a, b in pairs))

    def among(a: str, b: str) -> float:
        sets = [knn_sets_among(held[n], reference[n], k) for n in (a, b)]
        return float(knn_jaccard_per_cell(*sets).mean())

    n_held, n_oracle, n_pool = len(held[seeds[0]]), len(subsets[0]), len(pool[seeds[0]])
    n_analyst = n_held + len(reference[seeds[0]])
    k_oracle = analyst_graph_k(k, n_oracle, n_analyst) if n_oracle < n_analyst else k
    return {
        f"{n_held} held-out alone, k={k} (the report before)": worst(lambda a, b: knn_jaccard(held[a], held[b], k)),
        f"{n_held} held-out, k={k_scaled} (scaled)": worst(lambda a, b: knn_jaccard(held[a], held[b], k_scaled)),
        f"held-out rows among {n_analyst} cells, k={k} (the report now)": worst(among),
        f"oracle: graph on {n_oracle} pool cells, k={k_oracle}": float(
            np.mean([worst(lambda a, b, c=c: knn_jaccard(pool[a][c], pool[b][c], k_oracle)) for c in subsets])
        ),
        f"pool {n_pool}, k={k}": worst(lambda a, b: knn_jaccard(pool[a], pool[b], k)),
    }


def regime_record(scored: pd.DataFrame, regime: str, command: str, section: str = SECTION) -> dict:
    """The bundled record of one regime: its configuration, how it was measured, and the counts per row."""
    sub = scored[scored["regime"] == regime]
    rows = {}
    for row, g in sub.groupby("row", sort=False):
        c = g["outcome"].value_counts()
        rows[row] = {
            "runs": len(g),
            "correct": int(c.get("correct", 0)),
            "wrong": int(c.get("wrong", 0)),
            "undetermined": int(c.get("undetermined", 0)),
            "oracle_undecided": int(c.get("oracle undecided", 0)),
        }
    return {
        "description": DESCRIPTIONS[regime],
        "configuration": CONFIGURATIONS[regime],
        "command": command,
        "written": time.strftime("%Y-%m-%d %H:%M"),
        "replicates": int(sub["replicate"].nunique()),
        "oracle_cells": POOL_CELLS,
        "adequate": True,
        "section": section,
        "rows": rows,
    } | ({"truth": TRUTHS[regime]} if regime in TRUTHS else {})


def summarize(
    csvs: list[Path],
    results: Path,
    command: str,
    calibration_file: Path = CALIBRATION_FILE,
    notes: Path | None = None,
    section: str = SECTION,
    title_suffix: str = "",
) -> str:
    """Write a RESULTS.md section (with ``notes`` appended) and the record's per-regime tables; return the section.

    The record's regimes of ``section`` become exactly those of ``csvs``;
    regimes recorded from another section are kept (each names its own).
    """
    from calibration_regimes import rates, score

    runs = pd.concat([pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in csvs], ignore_index=True)
    scored = score(runs)
    table = rates(scored)
    lines = [
        "## Verdicts against the same fits on a large pool of cells, in analyst regimes"
        f"{title_suffix} (`calibration_regimes.py`)",
        "",
        f"Command: `{command}`",
        "",
        "A verdict on the report's held-out cells is scored against the same fits' verdict on "
        f"{POOL_CELLS:,} independent cells of the same distribution (the oracle: the report with every row on as "
        "many of them as affordable: coordinates on all, log p(x) on 1,000, distances on 2,000; the k-NN row on "
        "every pool cell's neighbours among the pool and fit cells, with k scaled so that the graph speaks for the "
        "analyst's, of fit and held-out cells). "
        "'correct % of confident' = correct / (correct + wrong), with its one-sided 95% Clopper-Pearson lower "
        "bound; 'oracle undecided' verdicts are not scored.",
        "",
    ]
    for regime in table["regime"].unique():
        sub = scored[scored["regime"] == regime]
        reps = sorted(sub["replicate"].unique())
        held = runs[(runs["regime"] == regime) & (runs["cells"] == "heldout")]
        pool = runs[(runs["regime"] == regime) & (runs["cells"] == "pool")]
        lines += [
            f"### Regime **{regime}**: {DESCRIPTIONS[regime]}",
            "",
            f"{len(reps)} replicates ({', '.join(map(str, reps))}). Per replicate: each seed's fit "
            f"{held.groupby('replicate')['fit_seconds_per_seed'].first().median():.0f} s, the report on the held-out "
            f"cells {held.groupby('replicate')['report_seconds'].first().median():.0f} s and on the pool "
            f"{pool.groupby('replicate')['report_seconds'].first().median():.0f} s (medians; the machine and its "
            f"load are in the notes); epochs trained per seed (early stopping): "
            f"{', '.join(held.groupby('replicate')['epochs'].first().astype(str))}.",
            "",
            markdown_table(table[table["regime"] == regime].drop(columns="regime"), floatfmt="{:.1f}"),
            "",
        ]
        wrong = sub[sub["outcome"] == "wrong"]
        if len(wrong):
            lines += [
                "Contradicted verdicts:",
                "",
                markdown_table(
                    wrong[
                        ["replicate", "row", "verdict", "low", "high", "verdict_oracle", "low_oracle", "high_oracle"]
                    ],
                    floatfmt="{:.3f}",
                ),
                "",
            ]
        else:
            lines += ["No confident verdict on the held-out cells was contradicted by the oracle.", ""]
    for csv in csvs:
        groups = grouping_rows(csv)
        if len(groups):
            lines += _grouping_lines(csv, groups)
        knn = knn_rows(csv)
        if len(knn):
            lines += [
                f"k-NN overlap (worst pair of seeds, `{csv.name}`) by the cells it is computed on:",
                "",
                markdown_table(knn, floatfmt="{:.3f}"),
                "",
            ]
    if notes is not None:
        lines += [Path(notes).read_text(encoding="utf-8").strip(), ""]
    body = "\n".join(lines)
    record = json.loads(Path(calibration_file).read_text(encoding="utf-8"))
    # The record holds the regimes of this summary and those of other sections. "linear toy" was the seeds scenario
    # of calibration.py against its re-fitting oracle, before the linear toy became a regime of its own here.
    # Each regime keeps its place in the record (nearest_regime gives ties to the first); a regime this section
    # wrote before and no longer holds is dropped.
    fresh = {regime: regime_record(scored, regime, command, section) for regime in table["regime"].unique()}
    before = {n: e for n, e in record.get("regimes", {}).items() if n != "linear toy"}
    kept = {n: fresh.get(n, e) for n, e in before.items() if n in fresh or e.get("section", SECTION) != section}
    record["regimes"] = kept | {n: e for n, e in fresh.items() if n not in kept}
    write_text_atomic(calibration_file, json.dumps(record, indent=1) + "\n", overwrite=True)
    write_section(Path(results), section, body)
    print(body)
    return body


def _grouping_lines(csv: Path, groups: pd.DataFrame) -> list[str]:
    lines = [
        f"Seed groups (`seed_groups`) on the held-out cells against the same grouping on the pool (`{csv.name}`):",
        "",
    ]
    summary = []
    for label, g in groups.groupby("fits", sort=False):
        decided = g[g["decided"] & g["oracle decided"]]
        summary.append(
            {
                "fits": label,
                "replicates": len(g),
                "grouping decided (held-out)": int(g["decided"].sum()),
                "decided on both": len(decided),
                "same partition when decided on both": int(decided["same partition"].sum()),
                "same partition (all)": int(g["same partition"].sum()),
                "under-trained fit alone and worse": (
                    int(g["under-trained fit alone and worse"].eq(True).sum())
                    if g["under-trained fit alone and worse"].notna().any()
                    else ""
                ),
            }
        )
    lines += [markdown_table(pd.DataFrame(summary)), ""]
    lines += [
        markdown_table(
            groups[["replicate", "fits", "groups (held-out)", "groups (oracle)", "decided", "same partition"]]
        ),
        "",
        "What the report would print for the first replicates (held-out cells):",
        "",
    ]
    lines += [f"- replicate {r.replicate}, {r.fits}: {r.sentence}" for r in groups.head(4).itertuples(index=False)]
    return [*lines, ""]
