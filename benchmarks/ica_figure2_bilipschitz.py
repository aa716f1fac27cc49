"""Figure 2 on count data: decoder bi-Lipschitz constant B(z) and cross-seed ambiguity.

Counts are simulated from three Laplace sources through decoders of increasing
nonlinearity: the log-linear decoder, then one-hidden-layer MLPs with
leaky-ReLU slopes 1 (linear inside a softmax), 0.5, 0.2 and 0 (ReLU), 8 hidden units. For
each, ``B(z) = sqrt(sigma_max / sigma_min)`` of the decoder under the NB Fisher
metric (`benchmarks/bilipschitz.py`) is computed for the *true*
decoder at the true sources and for each fitted CountVAE at its posterior means,
with the k-NN distance-ratio cross-check. Three CountVAE seeds per decoder give
the cross-seed quantities: the held-out error of the best affine map between
two seeds' latents, the ICA component stability across seeds
(:func:`countvae.ica.ica_stability`, split halves) and the MCC of ICA
components with the true sources.

Run (about 5 minutes on 2 shared cores):
    PYTHONPATH=$PWD python benchmarks/ica_figure2_bilipschitz.py
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pandas as pd
from bilipschitz import bilipschitz_constant, fisher_singular_values, model_bilipschitz, true_log_rate_jacobian
from ica_common import (
    add_output_arguments,
    apply_quick,
    fit_countvae,
    ica_quietly,
    linear_alignment_error,
    machine_note,
    markdown_table,
    quiet,
    write_section,
)
from scipy.stats import spearmanr

import countvae as cv
from countvae.metrics import mcc

DECODERS = [("linear", 1.0), ("mlp", 1.0), ("mlp", 0.5), ("mlp", 0.2), ("mlp", 0.0)]
FIGURE = Path(__file__).resolve().parent / "figures" / "ica_figure2_bilipschitz.png"


def label(decoder: str, slope: float) -> str:
    return "log-linear" if decoder == "linear" else f"MLP slope {slope:g}"


def true_b(adata, library_size: float) -> np.ndarray:
    """B(z) of the simulating decoder at the true sources, at a common library size."""
    log_mean, jac = true_log_rate_jacobian(adata)
    log_mean = log_mean - np.log(adata.obs["size_factor"].to_numpy())[:, None] + np.log(library_size)
    theta = np.asarray(adata.uns["simulation"]["theta"])
    return bilipschitz_constant(fisher_singular_values(jac, np.exp(log_mean), theta))


def run_decoder(decoder: str, slope: float, args) -> tuple[dict, dict[str, np.ndarray]]:
    adata = cv.data.simulate(
        n_cells=args.n_cells,
        n_genes=args.n_genes,
        n_latent=3,
        sources="laplace",
        decoder=decoder,
        leaky_slope=slope,
        n_hidden=args.sim_hidden,
        likelihood="nb",
        seed=args.data_seed,
    )
    cv.CountVAE.setup_anndata(adata)
    library = float(np.median(np.asarray(adata.X.sum(1)).ravel()))
    b_true = true_b(adata, library)
    latents, b_model, knn_rho, b_knn = [], [], [], []
    for seed in args.seeds:
        model, _ = fit_countvae(adata, 3, seed, args.epochs, n_hidden=64)
        latents.append(model.get_latent_representation())
        table = model_bilipschitz(model, adata, library_size=library)
        b_model.append(table["b"].to_numpy())
        b_knn.append(float(table["b_knn"].median()))
        knn_rho.append(spearmanr(table["b"], table["b_knn"]).statistic)
    truth = adata.obsm["z_true"]
    pairs = list(itertools.combinations(range(len(latents)), 2))
    stability = cv.ica.ica_stability(latents)
    row = {
        "decoder": label(decoder, slope),
        "true B median": np.median(b_true),
        "true B 90%": np.quantile(b_true, 0.9, method="nearest"),
        "true B infinite": np.mean(np.isinf(b_true)),
        "model B median": np.mean([np.median(b) for b in b_model]),
        "k-NN B median": np.mean(b_knn),
        "rho(B, k-NN)": np.mean(knn_rho),
        "cross-seed affine error": np.mean([linear_alignment_error(latents[i], latents[j]) for i, j in pairs]),
        "ICA cross-seed match": float(stability.mcc.mean()),
        "MCC raw": np.mean([mcc(z, truth) for z in latents]),
        "MCC ICA": np.mean([mcc(ica_quietly(z, random_state=0)[0], truth) for z in latents]),
    }
    return row, {"true": b_true, "model": np.concatenate(b_model)}


def draw(frame: pd.DataFrame, distributions: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    names = list(distributions)
    positions = np.arange(len(names))
    for offset, key, color in ((-0.18, "true", "tab:gray"), (0.18, "model", "tab:blue")):
        parts = axes[0].boxplot(
            [distributions[n][key][np.isfinite(distributions[n][key])] for n in names],
            positions=positions + offset,
            widths=0.3,
            showfliers=False,
            patch_artist=True,
        )
        for box in parts["boxes"]:
            box.set_facecolor(color)
        axes[0].plot([], [], color=color, lw=6, label=f"{key} decoder")
    axes[0].set_xticks(positions, names, rotation=20)
    axes[0].set_ylabel("B(z) = sqrt(sigma_max / sigma_min)")
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[0].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].set_yticks([1, 1.5, 2, 3, 4, 6])
    axes[0].legend(frameon=False)
    axes[0].set_title("Decoder bi-Lipschitz constant per cell")
    ax = axes[1]
    ax.plot(frame["model B median"], frame["cross-seed affine error"], "o-", label="cross-seed affine error")
    ax.plot(frame["model B median"], 1 - frame["ICA cross-seed match"], "s-", label="1 - ICA cross-seed match")
    ax.plot(frame["model B median"], 1 - frame["MCC ICA"], "^-", label="1 - MCC(ICA, truth)")
    for _, r in frame.iterrows():
        ax.annotate(r["decoder"], (r["model B median"], r["cross-seed affine error"]), fontsize=7)
    ax.set_xlabel("median B(z) of the fitted decoders")
    ax.set_ylabel("error")
    ax.legend(frameon=False, fontsize=8)
    ax.set_title("Ambiguity left across seeds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--n-cells", type=int, default=1500)
    parser.add_argument("--n-genes", type=int, default=150)
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--sim-hidden", type=int, default=8, help="hidden units of the simulating MLP decoder")
    parser.add_argument("--figure", type=Path, default=FIGURE, help="where to write the figure")
    add_output_arguments(parser)
    args = apply_quick(parser.parse_args(), seeds=[0, 1], n_cells=400, n_genes=60, epochs=3)
    quiet()
    start = time.perf_counter()
    rows, distributions = [], {}
    for decoder, slope in DECODERS:
        row, dist = run_decoder(decoder, slope, args)
        rows.append(row)
        distributions[row["decoder"]] = dist
        print(f"{row['decoder']}: done at {time.perf_counter() - start:.0f} s", flush=True)
    frame = pd.DataFrame(rows)
    shown = frame.set_index("decoder").map(lambda v: f"{v:.3f}")
    print(shown.to_string())
    minutes = (time.perf_counter() - start) / 60
    rho = {
        "cross-seed affine error": spearmanr(frame["model B median"], frame["cross-seed affine error"]).statistic,
        "ICA cross-seed match": spearmanr(frame["model B median"], -frame["ICA cross-seed match"]).statistic,
        "MCC ICA": spearmanr(frame["model B median"], -frame["MCC ICA"]).statistic,
    }
    if args.no_write:
        return
    draw(frame, distributions, args.figure)
    body = f"""## Figure 2 on count data: decoder bi-Lipschitz constant and cross-seed ambiguity

Command: `PYTHONPATH=$PWD python benchmarks/ica_figure2_bilipschitz.py` ({minutes:.1f} min; {machine_note()}).
Figure: `benchmarks/figures/{args.figure.name}`.

Data: `cv.data.simulate(n_cells={args.n_cells}, n_genes={args.n_genes}, n_latent=3, sources="laplace",
likelihood="nb", n_hidden={args.sim_hidden}, seed={args.data_seed})` with each decoder below (few hidden
units, so that leaky-ReLU kinks matter: with slope 0 some cells have fewer than 3 active units and
an infinite B, the share "true B infinite"; the box plots show the finite values). Models: CountVAE (MLP decoder, NB,
n_hidden 64), {args.epochs} epochs, lr 3e-3, seeds {args.seeds}. B(z) = sqrt(sigma_max / sigma_min)
under the NB Fisher metric at a common library size (the median total count); "true" at the true
sources with the simulating decoder, "model" at the posterior means (median per seed, averaged).
k-NN: sqrt(max / min) of the variance-stabilized distance ratios to the 10 nearest cells (a
lower estimate); rho: Spearman correlation of B and its k-NN estimate across cells. Cross-seed
affine error: held-out error of the best affine map between two seeds' latents / RMS pairwise
distance (0: affine images of each other). ICA cross-seed match: mean best-match |corr| of ICA
components across seeds (split halves). MCC: against the true sources.

{markdown_table(shown)}

Across the decoders, Spearman correlation of the fitted decoders' median B(z) with the cross-seed
affine error: {rho["cross-seed affine error"]:+.2f}; with 1 - ICA cross-seed match:
{rho["ICA cross-seed match"]:+.2f}; with 1 - MCC(ICA, truth): {rho["MCC ICA"]:+.2f} ({len(frame)} decoders).

Reading: B(z) is invariant to rotations of the latents, so it is comparable across seeds and
models. "log-linear" is the simulator's unnormalized log-linear decoder, whose library size varies
with z; the CountVAE conditions on the observed library size, so it fits this decoder only
approximately.
"""
    write_section(args, "ica-figure2", body)


if __name__ == "__main__":
    main()
