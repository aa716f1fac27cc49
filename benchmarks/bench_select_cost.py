"""What `compare_models` costs against fitting the same candidates with scvi-tools, and the 10k x 2k goal.

    python benchmarks/bench_select_cost.py                # setting A (Kang), then setting B (10k x 2k simulated)
    python benchmarks/bench_select_cost.py --settings a   # one setting only
    python benchmarks/bench_select_cost.py --settings b --b-max-epochs 30   # B at 30 epochs a fit, projected
    python benchmarks/bench_select_cost.py --quick        # smoke run: tiny data, 5 epochs

Setting A (peer comparison): Kang PBMCs, a random 1,500 cells and the 300 most variable genes (as tutorial 08),
candidates ``n_latent`` in {2, 5, 10} with the default MLP decoder (NB, batch covariate: donor), 2 seeds.
``compare_models`` runs at its defaults (``n_jobs="auto"``: one worker per core, all candidates' seeds in one pool;
``diagnose``'s budget of 600,000 cell passes a fit, no early stopping) and is timed end to end: the fits, the held-
out ``log p(x)``, the stability measures and the recommendation. The peer fits scvi-tools ``SCVI`` for the same
candidates (same ``n_latent``, ``n_hidden=128``, gene dispersion, NB likelihood, batch covariate) on the same fit
cells, from the same seeds (``scvi.settings.seed``), with the epochs compare_models' fits trained and no early
stopping, one fit at a time in one process with torch's threads over the cores, as an scvi-tools user sweeping
``n_latent`` would, and evaluates each with SCVI's own ``get_marginal_ll`` on the same held-out cells (its default
1,000 importance samples, the quantity scvi-tools' maintainers advise sweeping, scvi-tools issue #730).

Setting B (the goal: 5 candidates x 3 seeds on 10,000 cells x 2,000 genes in under 30 minutes on 2 cores):
simulated NB counts (MLP decoder, 5 true latent dimensions, 2 batches), candidates ``n_latent`` in
{2, 3, 5, 8, 12}, 3 seeds, ``compare_models`` at its defaults with ``n_jobs="auto"``; the peer is one SCVI fit of
the 5-d candidate at SCVI's default training on the same fit cells, and its ``get_marginal_ll``.

At its defaults setting B trains 15 fits of 67 epochs each (600,000 cell passes on 9,000 fit cells; the SCVI
peer at its defaults trains 400); ``--b-max-epochs N`` runs the same comparison with ``N`` epochs a fit
(compare_models and the SCVI peer alike) and projects the default runs: the fits' phase scales with the epochs
(every epoch the same minibatches and one validation pass), the other phases do not depend on them.

Each timed job runs in a fresh process, one at a time. Inside the compare_models process the time is split
into the fits, the held-out ``log p(x)``, the stability inputs and measures, and the rest (by timing wrappers
around the package functions compare_models calls; the package is not changed). Each setting writes its own
section of RESULTS.md as soon as it is done: select-cost-kang (A) and select-cost-10k (B), with ``-quick``
appended for ``--quick``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    run_worker,
    write_section,
)

#: Setting A: Kang cells and genes as tutorial 08 takes them.
KANG_CELLS, KANG_GENES, A_LATENTS, A_SEEDS = 1_500, 300, [2, 5, 10], 2
#: Setting B: the goal's size and grid.
B_CELLS, B_GENES, B_TRUE_LATENT, B_LATENTS, B_SEEDS, B_PEER_LATENT = 10_000, 2_000, 5, [2, 3, 5, 8, 12], 3, 5
GOAL_MINUTES = 30.0
#: --quick: tiny data and 5 epochs, for a smoke run of the whole pipeline.
QUICK = {"cells": 400, "genes": 60, "a_latents": [2, 3], "b_latents": [2, 3], "b_seeds": 2, "epochs": 5}
#: compare_models' defaults that the peer must match (heldout_fraction, split_seed; CountVAE's batch size).
HELDOUT_FRACTION, SPLIT_SEED, BATCH_SIZE = 0.1, 0, 128


# ----- data (the same in every worker) ------------------------------------------------------------
def setting_data(setting: str, quick: bool):
    """Setting A's Kang subset or setting B's simulated counts, with ``obs['batch']``."""
    import numpy as np

    import countvae as cv

    if setting == "a":
        import scanpy as sc

        n_cells, n_genes = (QUICK["cells"], QUICK["genes"]) if quick else (KANG_CELLS, KANG_GENES)
        adata = cv.data.load_dataset("kang2018")
        adata = adata[np.random.default_rng(0).choice(adata.n_obs, n_cells, replace=False)].copy()
        sc.pp.highly_variable_genes(adata, n_top_genes=n_genes, flavor="seurat_v3")
        adata = adata[:, adata.var["highly_variable"]].copy()
        sc.pp.filter_cells(adata, min_counts=1)
        return adata
    n_cells, n_genes = (QUICK["cells"], QUICK["genes"]) if quick else (B_CELLS, B_GENES)
    return cv.data.simulate(
        n_cells=n_cells,
        n_genes=n_genes,
        n_latent=B_TRUE_LATENT if not quick else 2,
        likelihood="nb",
        decoder="mlp",
        n_batches=2,
        seed=0,
    )


def setting_grid(setting: str, quick: bool) -> tuple[list[int], int]:
    """The candidates' latent sizes and the number of seeds."""
    if setting == "a":
        return (QUICK["a_latents"] if quick else A_LATENTS), A_SEEDS
    return (QUICK["b_latents"], QUICK["b_seeds"]) if quick else (B_LATENTS, B_SEEDS)


# ----- the compare_models worker ------------------------------------------------------------------
def _timed(clock: dict[str, float], phase: str, function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            clock[phase] += time.perf_counter() - start

    return wrapper


def _instrument(clock: dict[str, float], fit_records: list[dict]) -> None:
    """Time the phases of compare_models by wrapping what it calls (the package is not changed)."""
    from countvae.diagnostics.analyses import model_comparison
    from countvae.diagnostics.fitting.fitted_model import CountVAEFit
    from countvae.diagnostics.reporting import compare_models as module

    fit_models = module.fit_models

    def recorded_fit_models(adata, runs, *args, **kwargs):
        all_fits = fit_models(adata, runs, *args, **kwargs)
        for settings, fits in zip(runs, all_fits, strict=True):
            fit_records.append(
                {
                    "n_latent": settings.model_kwargs.get("n_latent"),
                    "n_jobs": fits.settings.get("n_jobs"),
                    "epochs": [int(e) for e in fits.training["epochs_trained"]],
                    "seed_seconds": [float(fits.seconds.get(s, float("nan"))) for s in fits.seeds],
                }
            )
        return all_fits

    module.fit_models = _timed(clock, "fits", recorded_fit_models)
    module.no_latent_baseline = _timed(clock, "no-latent baseline", module.no_latent_baseline)
    model_comparison.stability = _timed(clock, "stability measures", model_comparison.stability)
    # the estimates may run in worker processes (heldout_lpd): timed as one phase here
    module.heldout_lpd = _timed(clock, "held-out log p(x)", module.heldout_lpd)
    CountVAEFit.latent = _timed(clock, "stability inputs (latents, decoded means)", CountVAEFit.latent)
    CountVAEFit.decode_log_rate = _timed(
        clock, "stability inputs (latents, decoded means)", CountVAEFit.decode_log_rate
    )


def select_worker(spec: dict) -> dict:
    """compare_models at its defaults on the setting's data, timed end to end and by phase."""
    import torch

    import countvae as cv
    from countvae.diagnostics import compare_models

    adata = setting_data(spec["setting"], spec["quick"])
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    latents, n_seeds = setting_grid(spec["setting"], spec["quick"])
    clock: dict[str, float] = defaultdict(float)
    fit_records: list[dict] = []
    _instrument(clock, fit_records)
    train_kwargs = {"max_epochs": spec["max_epochs"]} if spec["max_epochs"] else None
    start = time.perf_counter()
    comparison = compare_models(
        adata, {"n_latent": latents}, seeds=range(n_seeds), train_kwargs=train_kwargs, n_jobs="auto"
    )
    seconds = time.perf_counter() - start
    columns = ["candidate", "lpd_per_cell", "diff_vs_best", "reliable", "stable", "fit_seconds", "verdict"]
    table = comparison.table[columns].to_dict(orient="records")
    return {
        "seconds": seconds,
        "phases": dict(clock),
        "fits": fit_records,
        "table": json.loads(json.dumps(table, default=lambda v: v.item() if hasattr(v, "item") else str(v))),
        "recommended": comparison.recommended,
        "cells": adata.n_obs,
        "genes": adata.n_vars,
        "n_heldout": comparison.n_heldout,
        "threads": torch.get_num_threads(),
    }


# ----- the scvi-tools worker ----------------------------------------------------------------------
def scvi_worker(spec: dict) -> dict:
    """SCVI fits of the candidates on compare_models' fit cells, one at a time, and their get_marginal_ll."""
    import scvi
    import torch

    from countvae.diagnostics.fitting.heldout import heldout_split

    adata = setting_data(spec["setting"], spec["quick"])
    fit_idx, held_idx = heldout_split(adata.n_obs, HELDOUT_FRACTION, SPLIT_SEED)
    adata_fit, adata_held = adata[fit_idx].copy(), adata[held_idx].copy()
    runs = []
    for n_latent in spec["latents"]:
        for seed in range(spec["seeds"]):
            start = time.perf_counter()
            scvi.settings.seed = seed
            scvi.model.SCVI.setup_anndata(adata_fit, batch_key="batch")
            model = scvi.model.SCVI(adata_fit, n_latent=n_latent, n_hidden=128, dispersion="gene", gene_likelihood="nb")
            model.train(
                max_epochs=spec["max_epochs"],
                batch_size=BATCH_SIZE,
                early_stopping=False,
                accelerator="cpu",
                enable_progress_bar=False,
            )
            fit_seconds = time.perf_counter() - start
            start = time.perf_counter()
            per_cell = model.get_marginal_ll(adata_held, n_mc_samples=spec["n_mc_samples"], return_mean=False)
            marginal_ll = float(per_cell.mean())
            runs.append(
                {
                    "n_latent": n_latent,
                    "seed": seed,
                    "fit_seconds": fit_seconds,
                    "marginal_ll_seconds": time.perf_counter() - start,
                    "marginal_ll": marginal_ll,
                    "epochs": len(model.history["elbo_train"]),
                }
            )
    return {"runs": runs, "threads": torch.get_num_threads(), "n_fit": len(fit_idx), "n_heldout": len(held_idx)}


# ----- the driver ---------------------------------------------------------------------------------
def run_setting(setting: str, quick: bool, threads: int, n_mc_samples: int, max_epochs: int | None) -> dict:
    """compare_models, then the SCVI peer, each in a fresh process; with the load averages around them.

    ``max_epochs``: ``None`` for compare_models' defaults, else the epochs of every fit.
    """
    loads = [load_average()]
    select = run_worker(
        Path(__file__),
        {"kind": "select", "setting": setting, "quick": quick, "threads": threads, "max_epochs": max_epochs},
    )
    loads.append(load_average())
    print(f"setting {setting}: compare_models {select['seconds']:.0f} s", flush=True)
    latents, n_seeds = setting_grid(setting, quick)
    epochs = {e for record in select["fits"] for e in record["epochs"]}
    if len(epochs) != 1:
        raise RuntimeError(f"compare_models' fits trained different epoch counts {sorted(epochs)}; cannot match")
    peer_grid = {"latents": latents, "seeds": n_seeds} if setting == "a" else {"latents": [B_PEER_LATENT], "seeds": 1}
    if quick and setting == "b":
        peer_grid["latents"] = [latents[-1]]
    peer = run_worker(
        Path(__file__),
        {
            "kind": "scvi",
            "setting": setting,
            "quick": quick,
            "threads": threads,
            "max_epochs": epochs.pop(),
            "n_mc_samples": n_mc_samples,
            **peer_grid,
        },
    )
    loads.append(load_average())
    total = sum(r["fit_seconds"] + r["marginal_ll_seconds"] for r in peer["runs"])
    print(f"setting {setting}: SCVI {total:.0f} s", flush=True)
    return {"select": select, "peer": peer, "loads": loads, "max_epochs": max_epochs}


def _phase_lines(select: dict) -> str:
    phases = dict(select["phases"])
    phases["the rest (checks, split, tables, recommendation)"] = select["seconds"] - sum(phases.values())
    return "; ".join(f"{name} {seconds:.0f} s ({seconds / select['seconds']:.0%})" for name, seconds in phases.items())


def _candidate_rows(result: dict) -> list[dict[str, Any]]:
    """One row per candidate: countvae's fits and log p(x), SCVI's fits and get_marginal_ll."""
    select, peer = result["select"], result["peer"]
    rows = []
    for record, row in zip(select["fits"], select["table"], strict=True):
        scvi_runs = [r for r in peer["runs"] if r["n_latent"] == record["n_latent"]]
        rows.append(
            {
                "candidate": row["candidate"],
                "countvae s per fit": sum(record["seed_seconds"]) / len(record["seed_seconds"]),
                "countvae epochs": ", ".join(str(e) for e in record["epochs"]),
                "countvae log p(x)/cell": row["lpd_per_cell"],
                "verdict": row["verdict"],
                "SCVI s per fit": _mean([r["fit_seconds"] for r in scvi_runs]),
                "SCVI get_marginal_ll s": _mean([r["marginal_ll_seconds"] for r in scvi_runs]),
                "SCVI marginal ll/cell": _mean([r["marginal_ll"] for r in scvi_runs]),
            }
        )
    return rows


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def section_a(result: dict) -> str:
    """Setting A's paragraph and table."""
    select, peer = result["select"], result["peer"]
    scvi_fit = sum(r["fit_seconds"] for r in peer["runs"])
    scvi_ll = sum(r["marginal_ll_seconds"] for r in peer["runs"])
    n_fits = len(peer["runs"])
    n_jobs = sorted({str(r["n_jobs"]) for r in select["fits"]})
    n_candidates = len(select["fits"])
    return f"""### A. Kang, {select["cells"]:,} cells x {select["genes"]} genes: \
{n_candidates} candidates x {n_fits // n_candidates} seeds

Load average before / after compare_models / after SCVI: {" / ".join(result["loads"])}.
compare_models fitted each candidate's seeds with n_jobs = {", ".join(n_jobs)} (torch 1 thread per fit; its own
process, which computes the stability, {select["threads"]} threads; held-out log p(x) 1 thread per fit);
SCVI fitted one at a time with torch {peer["threads"]} threads. {peer["n_fit"]:,} fit cells, \
{peer["n_heldout"]} held out (the same on both sides).

| | compare_models (fits + held-out log p(x) + stability + recommendation) | SCVI fits + get_marginal_ll |
|---|---|---|
| total | {select["seconds"]:.0f} s | {scvi_fit + scvi_ll:.0f} s ({scvi_fit:.0f} s fits + {scvi_ll:.0f} s \
get_marginal_ll) |
| per fit ({n_fits} fits) | {select["seconds"] / n_fits:.1f} s (all of it) | {(scvi_fit + scvi_ll) / n_fits:.1f} s \
({scvi_fit / n_fits:.1f} s fit) |
| ratio compare_models / SCVI | {select["seconds"] / (scvi_fit + scvi_ll):.2f} | |

Where compare_models' time went: {_phase_lines(select)}. (The fits' phase is wall time with
the seeds in parallel; the per-fit seconds below are each fit's own training time.)

{markdown_table(pd_frame(_candidate_rows(result)), floatfmt="{:.3g}")}

compare_models recommended: {_recommendation(select)}.
"""


def _default_epochs(n_fit: int) -> int:
    """The epochs compare_models' fits train at their defaults: ``diagnose``'s budget of cell passes."""
    from countvae.diagnostics.fitting.default_training import default_epochs

    return default_epochs(n_fit)


def _scvi_default_epochs(n_fit: int) -> int:
    """The epochs of an SCVI fit at its defaults (scvi-tools' rule on the 90% of the fit cells it trains on)."""
    from countvae.model.training import TrainingPlan, default_max_epochs

    return default_max_epochs(round(TrainingPlan().train_size * n_fit))


def _training_wall(records: list[dict]) -> float:
    """The training wall time of all candidates' seeds in one pool of ``n_jobs``: waves as long as the mean fit."""
    seconds = [s for record in records for s in record["seed_seconds"]]
    n_jobs = int(records[0]["n_jobs"]) if str(records[0]["n_jobs"]).isdigit() else 1
    return math.ceil(len(seconds) / max(n_jobs, 1)) * sum(seconds) / len(seconds)


def project_to_defaults(select: dict, peer: dict, max_epochs: int | None) -> tuple[int, float, int, float]:
    """compare_models' default epochs and seconds projected to them; the same for the first SCVI fit.

    Only training scales with the epochs: the pool's training wall time (:func:`_training_wall`) is multiplied
    by ``default / max_epochs``; worker starts, held-out ``log p(x)`` and stability stay as measured. SCVI's
    fit scales to SCVI's own default epochs. With ``max_epochs=None`` the runs were at the defaults and the
    measured seconds are returned.
    """
    default_epochs, scvi_epochs = _default_epochs(peer["n_fit"]), _scvi_default_epochs(peer["n_fit"])
    scvi_seconds = peer["runs"][0]["fit_seconds"]
    if max_epochs is None:
        return default_epochs, select["seconds"], scvi_epochs, scvi_seconds
    extra = (default_epochs / max_epochs - 1.0) * _training_wall(select["fits"])
    return default_epochs, select["seconds"] + extra, scvi_epochs, scvi_seconds * scvi_epochs / max_epochs


def section_b(result: dict) -> str:
    """Setting B's paragraph and table; with reduced epochs, the projection of the default run."""
    select, peer = result["select"], result["peer"]
    run = peer["runs"][0]
    minutes = select["seconds"] / 60
    n_fits = sum(len(r["epochs"]) for r in select["fits"])
    n_jobs = sorted({str(r["n_jobs"]) for r in select["fits"]})
    epochs = result["max_epochs"]
    with_ll = run["fit_seconds"] + run["marginal_ll_seconds"]
    lines = [
        f"### B. Simulated, {select['cells']:,} cells x {select['genes']:,} genes: {len(select['fits'])} candidates "
        f"x {n_fits // len(select['fits'])} seeds (the goal: < {GOAL_MINUTES:.0f} min on 2 cores)",
        "",
        f"Load average before / after compare_models / after SCVI: {' / '.join(result['loads'])}.",
        f"Truth: NB counts from an MLP decoder with {B_TRUE_LATENT} latent dimensions, 2 batches. compare_models "
        + ("at its defaults" if epochs is None else f"at its defaults except **{epochs} epochs a fit**")
        + f", n_jobs = {', '.join(n_jobs)} (torch 1 thread per fit; its own process {select['threads']} threads; "
        "held-out log p(x) 1 thread per fit).",
        "",
        f"compare_models end to end: **{minutes:.1f} min** ({select['seconds']:.0f} s), "
        f"{select['seconds'] / n_fits:.0f} s per fit of the {n_fits}. Where its time went: {_phase_lines(select)}.",
        "",
    ]
    default_epochs, projected, scvi_epochs, scvi_projected = project_to_defaults(select, peer, epochs)
    if epochs is None:
        meets = "**meets**" if minutes < GOAL_MINUTES else "**misses**"
        lines.append(f"At its defaults compare_models {meets} the goal.")
    else:
        scale = default_epochs / epochs
        meets = "would meet" if projected / 60 < GOAL_MINUTES else "would **miss**"
        lines.append(
            f"Projected to the defaults' {default_epochs} epochs a fit (the training wall time of all candidates' "
            f"seeds in one pool, in waves of n_jobs, x {scale:.3g}; worker starts and the other phases as "
            f"measured): **{projected / 60:.0f} min**, which {meets} the goal of < {GOAL_MINUTES:.0f} min. "
            "This is a projection from the shortened run, not a measurement of the default run."
        )
    lines += [
        "",
        f"Peer: one SCVI fit of n_latent={run['n_latent']} (n_hidden 128, gene dispersion, NB, batch covariate) on "
        f"the same {peer['n_fit']:,} fit cells ({run['epochs']} epochs, no early stopping, torch {peer['threads']} "
        f"threads): {run['fit_seconds']:.0f} s; its get_marginal_ll on the same {peer['n_heldout']:,} held-out cells "
        f"({result['n_mc_samples']} samples): {run['marginal_ll_seconds']:.0f} s. compare_models costs "
        f"{select['seconds'] / run['fit_seconds']:.1f} SCVI fits ({select['seconds'] / with_ll:.1f} fits with their "
        "get_marginal_ll)"
        + (
            "."
            if epochs is None
            else f"; projected to the defaults, {projected / scvi_projected:.1f} SCVI fits of its default "
            f"{scvi_epochs} epochs (about {scvi_projected / 60:.0f} min each)."
        ),
        "",
        markdown_table(pd_frame(_candidate_rows(result)), floatfmt="{:.3g}"),
        "",
        f"compare_models recommended: {_recommendation(select)} (truth: n_latent={B_TRUE_LATENT})"
        + ("." if epochs is None else f", from fits of {epochs} epochs."),
    ]
    return "\n".join(lines) + "\n"


def pd_frame(rows: list[dict]):
    """The rows as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(rows)


def _recommendation(select: dict) -> str:
    return "undetermined (None)" if select["recommended"] is None else f"`{select['recommended']}`"


def main(argv: list[str] | None = None) -> int:
    """Run the settings one after the other and write the section."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--settings", default="a,b", help="comma-separated: a (Kang vs SCVI), b (10k x 2k goal)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny data, 5 epochs")
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads of the SCVI peer and of compare_models' own process (its fits: 1 each; default 2)",
    )
    parser.add_argument(
        "--n-mc-samples", type=int, default=1000, help="SCVI get_marginal_ll importance samples (its default 1000)"
    )
    parser.add_argument(
        "--b-max-epochs",
        type=int,
        default=None,
        help="setting B: epochs a fit, projected to the defaults' (default: compare_models' defaults, 400 epochs)",
    )
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    if args.b_max_epochs is not None and args.b_max_epochs < 1:
        parser.error(f"--b-max-epochs must be a positive number of epochs, got {args.b_max_epochs}")
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(select_worker(spec) if spec["kind"] == "select" else scvi_worker(spec)))
        return 0
    settings = [s.strip().lower() for s in args.settings.split(",") if s.strip()]
    unknown = sorted(set(settings) - {"a", "b"})
    if unknown or not settings:
        parser.error(f"--settings takes a, b or a,b; got {args.settings!r}")
    for setting in settings:
        started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
        epochs = QUICK["epochs"] if args.quick else (args.b_max_epochs if setting == "b" else None)
        result = run_setting(setting, args.quick, args.threads, args.n_mc_samples, epochs)
        result["n_mc_samples"] = args.n_mc_samples
        name, body = ("kang", section_a(result)) if setting == "a" else ("10k", section_b(result))
        training = (
            "compare_models' training defaults (diagnose's 600,000 cell passes a fit, no early stopping)"
            if epochs is None
            else f"{epochs} epochs a fit (no early stopping)"
        )
        text = f"""## What compare_models costs against scvi-tools: setting {setting.upper()} (`bench_select_cost.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run: tiny data, 5 epochs" if args.quick else ""}; \
{(time.perf_counter() - t_start) / 60:.1f} min for this setting)

Machine: {machine_line(1)} (each of compare_models' fits; compare_models' own process and the SCVI peer:
{args.threads} threads). Each timed job in
a fresh process, one at a time. compare_models: held-out 10% (split seed 0), {training}, batch 128, lr 1e-3,
100 importance samples per held-out cell; SCVI with the same epochs, batch size and no early stopping.

{body}"""
        write_section(args.results, f"select-cost-{name}" + ("-quick" if args.quick else ""), text)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
