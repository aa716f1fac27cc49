"""Write tutorials/06_de_across_seeds.ipynb (outputs empty; the test suite executes it).

Run from the repository root: ``python tutorials/make_06_de_across_seeds.py``.
"""

from _notebook import write

CELLS = [
    (
        "md",
        """# 06 · Differential expression across seeds: which DE genes survive a re-run?

Analysts publish differentially expressed genes, clusters and UMAPs, not latent coordinates. DE between
two groups of cells is computed from decoded expression, which no rotation of the latent space changes,
so the prior's symmetry does not threaten it. What can move the calls is the fit itself (another training
seed lands on another solution) and the Monte Carlo sampling of the DE posterior. This notebook fits one
model from five seeds on real PBMC counts and asks:

1. which genes are called DE between CD4 T cells and NK cells by all five seeds, and which by only some;
2. how much of the seed-to-seed change in the calls, in Leiden clusters and in UMAP neighbourhoods is the
   model's, and how much re-running only the downstream step on one fit already produces.

Data: control PBMCs of five donors (Kang et al. 2018), 2,500 cells and 600 genes, trained briefly so that
the notebook runs in a few minutes on two cores; the numbers describe *these* fits.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scanpy as sc

import countvae as cv
from countvae import diagnostics, plotting

plt.rcParams["figure.dpi"] = 72
pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 200)
sc.settings.verbosity = 0

adata = cv.data.load_dataset("kang2018")
adata = adata[np.random.default_rng(0).choice(adata.n_obs, 2500, replace=False)].copy()
sc.pp.highly_variable_genes(adata, n_top_genes=600, flavor="seurat_v3")
adata = adata[:, adata.var["highly_variable"]].copy()
sc.pp.filter_cells(adata, min_counts=1)
adata.obs["cell_type"].value_counts()""",
    ),
    (
        "md",
        """## Five seeds on one shared split

The same model (negative binomial, 6 latent dimensions, linear decoder) from seeds 0 to 4, with 20% of
the cells held out from every fit.""",
    ),
    (
        "code",
        """cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
fits = diagnostics.fit_seeds(
    adata,
    seeds=range(5),
    model_kwargs={"n_latent": 6, "likelihood": "nb", "decoder": "linear"},
    train_kwargs={"max_epochs": 40, "batch_size": 256, "lr": 3e-3, "early_stopping": False},
    heldout_fraction=0.2,
    progress_bar=False,
)
print(f"{len(fits)} fits; {fits.adata_fit.n_obs} training cells, {fits.adata_heldout.n_obs} held-out cells")""",
    ),
    (
        "md",
        """## DE calls per seed

`differential_expression` compares random cells of the two groups through each fit's posterior and calls
the genes whose posterior expected false discovery rate stays below 5% (scvi-tools' `mode="change"`;
`delta = 0.25` log2 units). Each seed is sampled with its own sampling seed, as an analyst re-running the
whole pipeline would. The column `mc_call_jaccard` is the DE's own prediction of how much another
*sampling* seed of the same fit would change the call set. We draw 30,000 pairs of cells (three times the
default) so that the sampling moves few calls and the seeds' differences stand out.""",
    ),
    (
        "code",
        """calls, lfc, mc = {}, {}, {}
for fit in fits:
    de = fit.model.differential_expression(
        groupby="cell_type", group1="NK cells", group2="CD4 T cells", seed=fit.seed, n_samples_overall=30_000
    )
    calls[fit.name] = de["is_de_fdr_0.05"]
    lfc[fit.name] = de["lfc_mean"]
    mc[fit.name] = de["mc_call_jaccard"].iloc[0]
calls, lfc = pd.DataFrame(calls), pd.DataFrame(lfc)
pd.DataFrame({"calls": calls.sum(), "mc_call_jaccard": pd.Series(mc).round(3)})""",
    ),
    (
        "md",
        """How many seeds call each gene? Genes called by all five are results that survive a re-run; genes
called by only some seeds sit near the decision boundary and should be reported with that caveat.""",
    ),
    (
        "code",
        """n_seeds = calls.sum(axis=1)
print("genes called by k of 5 seeds:", n_seeds[n_seeds > 0].value_counts().sort_index(ascending=False).to_dict())
summary = pd.DataFrame(
    {"seeds calling": n_seeds, "lfc mean over seeds": lfc.mean(axis=1), "lfc sd over seeds": lfc.std(axis=1)}
)
summary = summary[summary["seeds calling"] > 0].sort_values(["seeds calling", "lfc mean over seeds"], ascending=False)
print("called by every seed, largest LFC first:", ", ".join(summary.index[summary["seeds calling"] == 5][:15]))
summary[summary["seeds calling"] < 5].round(2)""",
    ),
    (
        "md",
        """## Which part of the variation is the model's?

The report's downstream section repeats the comparison on the held-out cells and adds a baseline for
each output: the same fit re-run with only the downstream seed changed (a second DE sampling seed, a
second Leiden seed on the same k-NN graph, a second UMAP seed). The model's share is the part of the
between-seed disagreement that the baseline does not reach. It is a difference of means over few pairs
(10 pairs of fits, 5 baseline pairs here), so it is stated in round numbers. Next to the DE Jaccard,
the agreement that random call sets of the same sizes would reach by chance.""",
    ),
    (
        "code",
        """request = diagnostics.DownstreamRequest(
    "cell_type", "NK cells", "CD4 T cells", settings=diagnostics.DownstreamSettings(n_de_samples=30_000)
)
rep = diagnostics.report(
    fits, downstream=request, ica=False, n_lpd_samples=20, max_lpd_cells=100, n_rhat_draws=20, max_jacobian_cells=50
)
for sentence in rep.downstream.statements:
    print("-", sentence)""",
    ),
    (
        "code",
        """fig, ax = plt.subplots(figsize=(7, 3.2))
plotting.downstream_agreement(rep.downstream.pairs, ax=ax)
plt.show()
columns = ["output", "metric", "between_mean", "n_between", "within_mean", "n_within", "chance_mean", "model_share"]
rep.downstream.summary[columns].round(3)""",
    ),
    (
        "md",
        """Reading it: where the between-seed points sit far below the within-fit points, the seed of the model
moves the result; where both overlap, re-running the downstream step alone moves it as much, and fixing
the model's seed would not make the result reproducible. The latent k-NN row has no downstream randomness
and is shown for reference. The same section is in `report.html` (`rep.save(folder)`), and on the
command line `countvae diagnose data.h5ad --de cell_type --de-groups "NK cells" "CD4 T cells"` adds it.""",
    ),
]


if __name__ == "__main__":
    write(CELLS, "06_de_across_seeds.ipynb")
