"""Write tutorials/08_model_selection.ipynb (outputs empty; the test suite executes it).

Run from the repository root: ``python tutorials/make_08_model_selection.py``.
"""

from _notebook import write

CELLS = [
    (
        "md",
        """# 08 · Which latent size and decoder do the data support?

After fitting a VAE the first question is how many latent dimensions, and whether a nonlinear decoder is
worth it. A larger model always fits the training cells better; what matters is whether it predicts
*held-out* cells better by more than an immaterial margin, and whether what it outputs survives a re-run
with another seed. `diagnostics.compare_models` fits every candidate from the same seeds on the same cells,
evaluates them on the same held-out cells, and recommends one by a stated rule. This notebook asks, on
real PBMC counts:

1. which latent size (2, 5 or 10) and which decoder (linear or MLP) the data support;
2. what each larger model buys in held-out nats per cell, and what it costs in stability across seeds;
3. what the two seeds agree on at each candidate.

Data: control PBMCs of five donors (Kang et al. 2018), 1,500 cells and the 300 most variable genes,
trained briefly from 2 seeds so that the notebook runs in a few minutes on one core; the numbers describe
*these* fits.""",
    ),
    (
        "code",
        """import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scanpy as sc

import countvae as cv
from countvae import diagnostics
from countvae.errors import UnreliableEstimateWarning

plt.rcParams["figure.dpi"] = 72
pd.set_option("display.width", 160)
sc.settings.verbosity = 0
# Which held-out cells have an unreliable estimate is summarised per candidate in the table's "reliable" column.
warnings.filterwarnings("ignore", category=UnreliableEstimateWarning)

adata = cv.data.load_dataset("kang2018")
adata = adata[np.random.default_rng(0).choice(adata.n_obs, 1500, replace=False)].copy()
sc.pp.highly_variable_genes(adata, n_top_genes=300, flavor="seurat_v3")
adata = adata[:, adata.var["highly_variable"]].copy()
sc.pp.filter_cells(adata, min_counts=1)
print(adata.shape)""",
    ),
    (
        "md",
        """## Six candidates, two seeds, one split

The grid is every combination of `n_latent` in {2, 5, 10} and `decoder` in {linear, MLP} (negative binomial
likelihood). Each candidate is fitted from seeds 0 and 1 on the same 85% of the cells, with early stopping on
its validation loss (the shared rule: learning rate 1e-2, cut to 1e-3 from the best epoch when the loss first
stalls), and evaluated on the same 15% held-out cells.""",
    ),
    (
        "code",
        """cv.CountVAE.setup_anndata(adata)
started = time.perf_counter()
comparison = diagnostics.compare_models(
    adata,
    {"n_latent": [2, 5, 10], "decoder": ["linear", "mlp"]},
    seeds=range(2),
    heldout_fraction=0.15,
    train_kwargs={"max_epochs": 150, "early_stopping": True, "batch_size": 256},
    n_lpd_samples=50,
)
print(f"6 candidates x 2 seeds fitted and compared in {time.perf_counter() - started:.0f} s")""",
    ),
    (
        "md",
        """## The fit-stability frontier

Each point is a candidate: up, its held-out `log p(x)` per cell minus the best candidate's (paired on the
same cells, with a simultaneous interval); across, its stability (the lower of the two seed concordances, of
decoded means and of latent distances, with its interval). The dashed line is minus the equivalence margin
(2% of what the best model's latent variables explain over a model without them); the grey band is the seed
noise floor (the median spread of a candidate's estimate between its seeds).""",
    ),
    (
        "code",
        """fig, ax = plt.subplots(figsize=(6.5, 4))
comparison.plot_frontier(ax=ax)
plt.show()""",
    ),
    (
        "md",
        """## The fit of each candidate

One row per candidate: its held-out `log p(x)` per cell (mean of its seeds), the paired difference from the
best candidate with its simultaneous interval (nats per cell), whether its estimates are reliable (Pareto
k-hat rule), the spread of its estimate between its seeds, and the verdict of the rule.""",
    ),
    (
        "code",
        """columns = ["candidate", "lpd_per_cell", "diff_vs_best", "diff_low", "diff_high", "reliable", "seed_spread"]
comparison.table[columns + ["verdict"]].set_index("candidate").round(2)""",
    ),
    (
        "md",
        """## The recommendation, with its rule

The rule picks the *smallest* candidate that predicts held-out cells as well as the best one within the
margin and whose invariant outputs agree across seeds; when none qualifies it says "undetermined" rather
than fall back on the highest score. The summary states, for every other candidate, what it buys (nats per
cell against the recommendation, with an interval) and what it costs (stability, fit time).""",
    ),
    (
        "code",
        """print(comparison.summary())
print("recommended:", comparison.recommended)""",
    ),
    (
        "md",
        """## What the seeds agree on at each candidate

For the one pair of seeds, on the held-out cells: the concordance of decoded log means and of distances
between cells, the overlap of the 15-nearest-neighbour graphs, and the agreement of the latent coordinates
after the best signed permutation. The invariant outputs are what an analysis uses; the coordinates are not
identified (a rotation of the latent space leaves `p(x)` unchanged), so their agreement is shown but not
judged. `stable`: decoded means and distances concordant at 0.9 or more and k-NN overlap at 0.5 or more.""",
    ),
    (
        "code",
        """stability = ["decoded_means", "distances", "knn", "coordinates_signed_permutation", "stable"]
comparison.table[["candidate"] + stability].set_index("candidate").round(2)""",
    ),
    (
        "md",
        """## Reading it

On these cells the answer is **undetermined**, and the tables say why. The MLP decoders fit best: the 5-d
MLP is within about a nat per cell of the 10-d MLP (its interval straddles minus the margin), but the two
seeds of every MLP candidate disagree on which cells are neighbours (k-NN overlap 0.42-0.43) and, at 2 and 5
dimensions, on the decoded means (concordance below 0.9). The linear candidates reproduce best across seeds
(decoded means and distances concordant at 0.94-0.98), but every one predicts held-out cells worse than the
best by more than the margin; the 5-d linear model buys about 4.6 nats per cell over the 2-d one, the 10-d
only about 0.7 more. So no candidate is both as good as the best and reproducible: the data support more
than a linear decoder gives, and these short MLP fits do not yet reach one solution from both seeds. The
remedy the rule points to is more cells, longer training or more seeds, not a choice by the highest score
(which would take the 10-d MLP, whose neighbourhoods do not survive a re-run). The recommendation is the
same when another 15% of the cells is held out (`split_seed=1`), where one verdict moves: the 2-d MLP then fits
worse than the margin instead of undetermined.

## What the calibration found

On simulated counts of known size (`benchmarks/RESULTS.md`, section `select-calibration`: 2,000 cells x 200
genes, 3 seeds, the defaults of `compare_models`) the rule found the true latent size in 26 of 26 replicates,
linear and MLP decoders, with and without batches, where the rules users otherwise apply overshot: the highest
training ELBO in 3 of 26, the highest held-out `log p(x)` in 7 of 26. Two findings matter for reading this
notebook:

* **A linear decoder needs one dimension more than there are biological factors.** Its mean is
  `log mu = log(total count) + b + W z`, with no softmax over genes; when the factors move a cell's share of
  the total expression, the observed total count carries a nonlinear function of `z` that a log-linear decoder
  can only absorb in one extra, nearly gene-uniform dimension (`benchmarks/RESULTS.md`, section
  `select-library-share`). A linear candidate of size `K + 1` corresponds to `K` factors.
* **A narrow MLP decoder can need more dimensions than there are factors.** The calibration's candidates have
  CountVAE's default 128 hidden units, enough to hold the simulated truth exactly; with 32 units (fewer than
  the truth needs, in a smaller and shorter earlier run) extra latent dimensions made up for the missing units
  and the rule chose the true size in only half of the MLP replicates. Read a recommendation as the size in
  the candidates' family.

These are short fits on 1,500 cells; with more cells and longer training the intervals narrow and the
seeds agree more. `comparison.save(folder)` writes the same comparison as HTML (with the figure), JSON and
Markdown, and `countvae select DATA.h5ad --n-latent 2,5,10 --decoder linear,mlp` runs it from the command
line. The method, the rule and the calibration table are on the documentation page *Choosing the model*
(`docs/model-selection.md`).""",
    ),
]


if __name__ == "__main__":
    write(CELLS, "08_model_selection.ipynb")
