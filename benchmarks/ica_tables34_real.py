"""Tables 3 and 4 on count data: does whitening + ICA separate cell type from batch in a CountVAE embedding?

A CountVAE (n_latent 10, MLP decoder, NB) is fitted to real PBMC counts
*without* the batch covariate, so its latent space holds both cell-type and
batch (donor / technology) variation, like an embedding learned without batch
labels. Four versions of the same latent means are compared:

* Base: the posterior means as the model returns them;
* PCA-whitened: centred, rotated to principal axes and scaled to unit variance;
* PCA + ICA: whitened, then the ICA rotation (:class:`countvae.ica.ICARotation`);
* PCA + Rand: whitened, then a Haar-random rotation (the control: same
  information, arbitrary axes).

Table 3: a gradient-boosted classifier (scikit-learn HistGradientBoosting) is
trained on all batches but one and tested on the held-out batch; one-vs-rest
AUROC per cell type (mean over held-out batches) and the sparsity (normalized
Gini) of its permutation importances. Table 4: the share of between-cell-type
variance carried by the top 25% of features, next to the same share for
between-batch variance within cell types.

Run (per dataset about 5 minutes on 2 shared cores):
    PYTHONPATH=$PWD python benchmarks/ica_tables34_real.py --dataset kang2018
    PYTHONPATH=$PWD python benchmarks/ica_tables34_real.py --dataset pbmc_3tech
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from heldout_classification import heldout_batch_classification
from ica_common import (
    add_output_arguments,
    apply_quick,
    fit_countvae,
    ica_quietly,
    machine_note,
    markdown_table,
    mean_sd,
    quiet,
    write_section,
)
from scipy.stats import ortho_group

import countvae as cv
from countvae import metrics

EMBEDDINGS = ["Base", "PCA-whitened", "PCA + ICA", "PCA + Rand"]


def load(name: str, n_genes: int, max_cells: int | None = None):
    """The dataset (optionally a random subset of cells) with its most variable genes.

    Genes are ranked by the variance of log1p counts per 10,000.
    """
    adata = cv.data.load_dataset(name)
    if max_cells is not None and adata.n_obs > max_cells:
        keep = np.sort(np.random.default_rng(0).choice(adata.n_obs, max_cells, replace=False))
        adata = adata[keep].copy()
    if adata.n_vars > n_genes:
        x = adata.X.toarray()
        logged = np.log1p(x / x.sum(1, keepdims=True) * 1e4)
        keep = np.sort(np.argsort(logged.var(0))[::-1][:n_genes])
        adata = adata[:, keep].copy()
    adata = adata[np.asarray(adata.X.sum(1)).ravel() > 0].copy()  # a subset of genes can leave a cell empty
    cv.CountVAE.setup_anndata(adata)
    return adata


def embeddings(latents: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Base / PCA-whitened / PCA + ICA / PCA + Rand versions of one latent matrix."""
    sources, ica = ica_quietly(latents, random_state=seed)
    whitened = (latents - ica.mean_) @ ica.whitening_.T
    rotation = ortho_group.rvs(latents.shape[1], random_state=1000 + seed)
    return {"Base": latents, "PCA-whitened": whitened, "PCA + ICA": sources, "PCA + Rand": whitened @ rotation.T}


def evaluate(features: np.ndarray, adata, seed: int, n_repeats: int) -> dict:
    cell_type = adata.obs["cell_type"].astype(str).to_numpy()
    batch = adata.obs["batch"].astype(str).to_numpy()
    clf = heldout_batch_classification(features, cell_type, batch, n_repeats=n_repeats, random_state=seed)
    return {
        "auroc": clf.auroc.mean(axis=0),  # per cell type, mean over held-out batches
        "mean AUROC": clf.mean_auroc,
        "importance Gini": float(clf.sparsity.mean()),
        "cell-type conc@25%": metrics.concentration(features, cell_type),
        "batch conc@25%": metrics.concentration(features, batch, within=cell_type),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["kang2018", "pbmc_3tech"], default="kang2018")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--n-genes", type=int, default=2000)
    parser.add_argument("--n-latent", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=None, help="default: 30 (kang2018) or 100 (pbmc_3tech)")
    parser.add_argument("--n-repeats", type=int, default=3, help="permutations per feature for the importances")
    parser.add_argument("--max-cells", type=int, default=None, help="random subset of cells (default: all)")
    add_output_arguments(parser)
    args = apply_quick(parser.parse_args(), seeds=[0], n_genes=200, epochs=2, n_repeats=1, max_cells=900)
    quiet()
    epochs = args.epochs or (30 if args.dataset == "kang2018" else 100)
    start = time.perf_counter()
    adata = load(args.dataset, args.n_genes, args.max_cells)
    results: dict[str, list[dict]] = {name: [] for name in EMBEDDINGS}
    flags = []
    for seed in args.seeds:
        model, seconds = fit_countvae(adata, args.n_latent, seed, epochs)
        latents = model.get_latent_representation()
        flags.append(int(ica_quietly(latents, random_state=seed)[1].gaussian_.sum()))
        for name, features in embeddings(latents, seed).items():
            results[name].append(evaluate(features, adata, seed, args.n_repeats))
        print(f"seed {seed}: fit {seconds:.0f} s, evaluated at {time.perf_counter() - start:.0f} s", flush=True)

    label = f"embedding (mean ± sd, {len(args.seeds)} seeds)"
    per_type = pd.DataFrame(
        {name: pd.concat([r["auroc"] for r in runs], axis=1).mean(axis=1) for name, runs in results.items()}
    ).T.map(lambda v: f"{v:.3f}")
    per_type.index.name = "embedding (AUROC, mean over seeds)"
    summary = pd.DataFrame(
        {
            name: {
                key: mean_sd([r[key] for r in runs])
                for key in ("mean AUROC", "importance Gini", "cell-type conc@25%", "batch conc@25%")
            }
            for name, runs in results.items()
        }
    ).T.rename_axis(label)
    print(per_type.to_string())
    print(summary.to_string())
    minutes = (time.perf_counter() - start) / 60
    lowest = min(np.mean([r["mean AUROC"] for r in runs]) for runs in results.values())
    saturation = (
        f"The held-out AUROC is saturated (every embedding >= {lowest:.3f}): these cell types are separable "
        "in any version of the latent space, so Table 3a cannot show a gain from ICA here; the sparsity and "
        "concentration columns are the informative ones.\n\n"
        if lowest >= 0.99
        else ""
    )
    batches = ", ".join(f"{b} ({n})" for b, n in adata.obs["batch"].value_counts().sort_index().items())
    body = f"""## Tables 3 and 4 on count data ({args.dataset}): whitening + ICA, cell type vs batch

Command: `PYTHONPATH=$PWD python benchmarks/ica_tables34_real.py --dataset {args.dataset}`
({minutes:.1f} min; {machine_note()}).

Data: `{args.dataset}`, {adata.n_obs} cells, the {adata.n_vars} most variable genes (variance of log1p
counts per 10,000); batches: {batches}. Model: CountVAE(n_latent={args.n_latent}, MLP decoder, NB),
no batch covariate, {epochs} epochs, lr 3e-3; seeds {args.seeds}. ICA components flagged as
Gaussian per seed: {flags}. Classifier: HistGradientBoostingClassifier (default settings), trained on
all batches but one, tested on the held-out batch, every batch held out in turn; importances:
drop in mean AUROC when a feature is permuted in the held-out batch ({args.n_repeats} permutations),
clipped at 0; sparsity: normalized Gini, mean over held-out batches. Concentration@25%: share of
between-group variance in the top 25% of features (cell type; batch within cell type); 0.25 = even.

Table 3a: one-vs-rest AUROC per cell type on held-out batches.

{markdown_table(per_type)}

Table 3b/4: summary.

{markdown_table(summary)}

{saturation}Reading: whitening, ICA and the random rotation are invertible linear maps of the same latents,
so they carry the same information; differences come from how an axis-aligned learner (trees)
and axis-wise summaries (importance sparsity, concentration) see the axes. Base coordinates have
unequal scales, which the tree classifier ignores but the concentration share does not.
"""
    write_section(args, f"ica-tables34-{args.dataset}", body)


if __name__ == "__main__":
    main()
