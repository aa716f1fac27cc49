"""Write tutorials/07_restrictions.ipynb (outputs empty; the test suite executes it).

Run from the repository root: ``python tutorials/make_07_restrictions.py``.
"""

from _notebook import write

CELLS = [
    (
        "md",
        """# 07 · Which restriction does the interpretive work?

With a standard normal prior `N(0, I)` on the latent variables, rotating the latent space (while the
decoder rotates back) leaves the probability of the data unchanged: the data cannot choose the axes.
Anyone who reads "dimension 3 is the monocyte axis" is relying on something else to have fixed them: a
non-Gaussian prior, sparse loadings, known gene programs, or ICA after the fact. Each of these is a
*restriction*, and an interpretation is only as good as the restriction behind it.

`countvae.diagnostics.compare_restrictions` turns the choice into a measurement. It fits the
unrestricted model and each restricted one from the same seeds on the same cells, and reports per
restriction:

* **what it identifies**: do the latent dimensions agree across seeds one by one (after a signed
  permutation only, no rotation)? And does that agreement hold between two fits on disjoint halves
  of the cells from different seeds (*split half*)? Seeds that see the same cells can agree on axes of
  that sample alone, so a restriction is credited only when the independent halves agree too.
* **what it costs**: held-out log p(x) against the unrestricted model of the same seed, paired cell by
  cell, with a 95% interval and an equivalence margin;
* **for gene programs**: whether the data support each program at all;
* **its declared symmetry**, checked numerically with `countvae.invariance.verify`.

Data: control PBMCs of five donors (Kang et al. 2018; raw UMI counts). To run in a few minutes on two
cores we keep 800 cells and about 200 genes and train briefly, with two seeds. The numbers describe
*these* short fits; a real analysis uses more cells, more seeds and full training.""",
    ),
    (
        "code",
        """import warnings

import numpy as np
import pandas as pd
import scanpy as sc
import torch

import countvae as cv
from countvae import diagnostics

pd.set_option("display.width", 160)
sc.settings.verbosity = 0
torch.set_num_threads(1)  # models this small run fastest on one thread
warnings.filterwarnings("ignore", message=".*converge.*")  # ICA on two briefly trained fits

adata = cv.data.load_dataset("kang2018")
adata = adata[np.random.default_rng(0).choice(adata.n_obs, 800, replace=False)].copy()""",
    ),
    (
        "md",
        """## Gene programs from well-known markers

A gene program names one latent dimension: its loadings are shrunk to 0 outside the program's genes,
so the dimension can only move those genes. We write down marker sets of the PBMC cell types and one
of the interferon response. These control cells were not stimulated with interferon, so that program
may have little to explain; the comparison says for each program whether the data support it (its genes
co-vary more than random genes, its dimension is used, its loadings are credible) rather than name a
dimension after it.""",
    ),
    (
        "code",
        """programs = {
    "T cell": ["CD3D", "CD3E", "IL7R", "CD2", "LTB"],
    "B cell": ["MS4A1", "CD79A"],
    "monocyte": ["CD14", "LYZ", "S100A9", "S100A8", "FCN1"],
    "NK": ["GNLY", "NKG7", "GZMB", "PRF1", "KLRD1"],
    "interferon": ["ISG15", "IFI6", "MX1", "ISG20", "IFITM3"],
}
markers = sorted({g for genes in programs.values() for g in genes})
sc.pp.highly_variable_genes(adata, n_top_genes=200, flavor="seurat_v3")
adata = adata[:, adata.var["highly_variable"] | adata.var_names.isin(markers)].copy()
cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
adata""",
    ),
    (
        "md",
        """## The comparison

Restrictions are named as on the command line (`countvae diagnose --restrictions ...`):
`laplace` (a Laplace prior on z), `horseshoe` (a regularized horseshoe prior on the loadings: sparse,
with posterior uncertainty), `programs` (the gene programs above) and `ica` (ICA of the unrestricted
fits, after the fact). Every model has a linear decoder and one latent dimension per program (5).""",
    ),
    (
        "code",
        """report = diagnostics.compare_restrictions(
    adata,
    ["laplace", "horseshoe", "programs", "ica"],
    seeds=[0, 1],
    gene_programs=programs,
    model_kwargs={"n_hidden": 64},
    train_kwargs={"max_epochs": 25, "lr": 5e-3, "early_stopping": False},
    heldout_fraction=0.2,
    n_lpd_samples=20,
)
print(report.summary())""",
    ),
    (
        "md",
        """The headline is meant to be pasted into a methods section: it states which restriction makes the
axes reproducible (if any), at what price in held-out fit, and whether the data support each gene
program. The table behind it:""",
    ),
    (
        "code",
        """columns = [
    "model",
    "symmetry",
    "coordinates_agreement",
    "coordinates_agreement_min",
    "rotation_ceiling",
    "identified",
    "split_half_agreement",
    "lpd_difference_per_cell",
    "lpd_se_per_cell",
    "predictive",
]
report.restrictions[columns].round(2)""",
    ),
    (
        "md",
        """The same table as a picture: what each restriction identifies (agreement of the coordinates
across seeds, one axis at a time) against what it costs (held-out log p(x) per cell against the
unrestricted model, with a 95% interval; the unrestricted model is the reference at 0).""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt

table = report.restrictions
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=72)
cost = table["lpd_difference_per_cell"].fillna(0.0)
error = 1.96 * table["lpd_se_per_cell"].fillna(0.0)
ax.errorbar(table["coordinates_agreement"], cost, yerr=error, fmt="o", capsize=3)
for name, x, y in zip(table["model"], table["coordinates_agreement"], cost, strict=True):
    ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
ax.axhline(0.0, color="grey", lw=0.8)
ax.set_xlabel("agreement of coordinates across seeds (no rotation)")
ax.set_ylabel("log p(x) vs unrestricted (nats/cell)")
plt.show()""",
    ),
    (
        "md",
        """**How to read it.**

* `symmetry`: the latent maps that leave the model's p(x) unchanged. `orthogonal` means any rotation:
  no single axis of that model can be read. A Laplace prior or a horseshoe keeps only signed
  permutations (the axes are fixed up to order and sign); gene programs only sign flips (each dimension
  is named).
* `coordinates_agreement`: mean correlation of each latent dimension with its match in the other seed,
  after a signed permutation only; `rotation_ceiling`: the same after the best rotation. A low agreement
  with a high ceiling means the seeds found the same latent space but not the same axes.
* `identified`: `identified` when every pair of seeds agrees at 0.9 or more while the unrestricted seeds
  do not, and the split half agrees at 0.9 or more too; `agrees on the same cells only` when the seeds
  agree but the independent halves do not (axes of this sample, or too few cells); `agrees without it`
  when the unrestricted seeds already agree (nothing to credit); `not identified` / `undetermined`
  otherwise.
* `split_half_agreement`: the first two seeds fitted on two disjoint halves of the training cells, one
  each. When it is lower than the agreement across seeds, the seeds' agreement depends on sharing the
  cells: too few cells, or axes of this sample, not of the population.
* `lpd_difference_per_cell`: held-out log p(x) of the restricted model minus the unrestricted one,
  nats per cell (negative: the restriction costs fit), with its standard error; `predictive` says
  whether it costs, gains, is equivalent within the margin, or is undetermined. Seeds that disagree
  widen the interval: with two seeds and brief training it is wide.""",
    ),
    (
        "md",
        """## Are the gene programs supported by the data?

A program is supported when (1) its genes co-vary across the held-out cells more than random gene sets
of its size do, once sequencing depth is regressed out (`coherence` above 1: the data's own evidence,
with no model), (2) its dimension is used (variance of the posterior means at least 0.01) and (3) at
least two of its genes have a credibly non-zero loading. `set_r2` is how much of the dimension the
program's genes explain on held-out cells.""",
    ),
    (
        "code",
        """report.programs.round(2)""",
    ),
    (
        "md",
        """## Each model's symmetry, checked

The declared symmetry is a claim about the model, and `countvae.invariance.verify` tests it on the first
seed's fit: the maps a model keeps must leave log p(x) (with the loadings, log p(x, W)) unchanged to
rounding; the maps it breaks must change it by more than the Monte Carlo error.""",
    ),
    (
        "code",
        """report.tables["symmetry"][["model", "map", "p_x_expected", "measurement", "value", "threshold", "confirmed"]]""",
    ),
    (
        "md",
        """## What to take away

* State the restriction behind every axis you read, and measure it: a named dimension is only as
  trustworthy as the agreement the comparison reports for its restriction, and the split half says
  whether that agreement holds on independent cells.
* A restriction can cost held-out fit; the comparison gives the price with an interval, so "identified,
  at a cost of ..." and "identified, at no detectable cost" are different findings.
* Gene programs name dimensions by external knowledge, but the data decide whether each program is
  there: a program whose genes do not co-vary should not be interpreted, whatever its dimension does.
* The same comparison runs from the command line and writes an HTML/JSON/Markdown report:
  `countvae diagnose counts.h5ad --decoder linear --restrictions laplace,horseshoe,programs:markers.gmt,ica`.
  `report.save("restrictions_report")` writes the same files from Python.""",
    ),
]

if __name__ == "__main__":
    write(CELLS, "07_restrictions.ipynb")
