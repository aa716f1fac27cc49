"""Write tutorials/02_multi_seed_diagnostics.ipynb (outputs empty; the test suite executes it).

Run from the repository root: ``python tutorials/make_02_multi_seed_diagnostics.py``.
"""

from _notebook import write

CELLS = [
    (
        "md",
        """# 02 · Multi-seed diagnostics: which results survive a re-run?

A count VAE with a standard normal prior fits the data exactly as well after any rotation of its latent
space (`z -> Qz`, decoder weights `W -> W Q^T`). Two fits from different seeds therefore land on
different latent coordinates even when they found the same solution. This notebook fits one model from
three seeds on real PBMC counts and measures, on cells none of the fits saw:

1. whether the seeds predict held-out cells equally well (predictive equivalence);
2. which outputs agree across seeds as they are, which agree only after rotating one seed onto another,
   and which do not agree at all (the invariants table);
3. the marker pitfall: a latent dimension's correlation with a marker gene changes from seed to seed,
   while the marker's R² on all dimensions does not.

Data: control PBMCs of five donors (Kang et al. 2018; raw UMI counts, cell types annotated). To run in
about a minute on two cores we keep 3,500 cells and 600 genes and train briefly; the conclusions are
about *these* fits, and a real analysis would train longer (see `countvae diagnose`).""",
    ),
    (
        "code",
        """import tempfile

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scanpy as sc

import countvae as cv
from countvae import diagnostics, plotting

plt.rcParams["figure.dpi"] = 72
pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 60)
sc.settings.verbosity = 0

adata = cv.data.load_dataset("kang2018")
adata = adata[np.random.default_rng(0).choice(adata.n_obs, 3500, replace=False)].copy()
markers = ["CD14", "LYZ", "FCGR3A", "MS4A1", "CD79A", "CD3D", "IL7R", "NKG7", "GNLY"]
sc.pp.highly_variable_genes(adata, n_top_genes=600, flavor="seurat_v3")
keep = adata.var["highly_variable"] | adata.var_names.isin(markers)
adata = adata[:, keep].copy()
sc.pp.filter_cells(adata, min_counts=1)
sc.pp.filter_genes(adata, min_counts=1)
adata""",
    ),
    (
        "md",
        """## Fit three seeds on one shared split

`fit_seeds` holds out 20% of the cells from every fit and trains the same model from seeds 0, 1 and 2:
a negative binomial likelihood, 6 latent dimensions and a *linear* decoder (log mean = b + W z, as in
LDVAE), whose loadings `W` are what analysts like to read one column at a time. Given `out_dir`,
`fit_seeds` saves each fit as it finishes, and a rerun reuses the finished seeds.""",
    ),
    (
        "code",
        """cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
fits = diagnostics.fit_seeds(
    adata,
    seeds=range(3),
    model_kwargs={"n_latent": 6, "likelihood": "nb", "decoder": "linear"},
    train_kwargs={"max_epochs": 60, "batch_size": 256, "lr": 3e-3, "early_stopping": False},
    heldout_fraction=0.2,
    progress_bar=False,
)
print(f"{len(fits)} fits; {fits.adata_fit.n_obs} training cells, {fits.adata_heldout.n_obs} held-out cells")
print({seed: f"{seconds:.1f} s" for seed, seconds in fits.seconds.items()})""",
    ),
    (
        "md",
        """## The report

`report` compares the fits on the held-out cells. Markers can be genes or `obs` columns; a categorical
column such as `cell_type` becomes one indicator per category. The verdict comes first, in plain words.
Two of its last lines are measurements, not verdicts. Batch mixing: how well the registered batch (here the
donors) mixes in each seed's latent space and in a PCA of the normalized counts made without a model (1 is as
if batch were random; an embedding that keeps less structure mixes more, so read it beside the markers).
Placement: whether the held-out cells land among the training cells (1 is as if at random; an overfitted fit
places cells it never saw apart). The last line checks the verdicts on the cells you will actually read: the
rows that need only the latent means (distances, neighbours, aligned coordinates) measured again on as many
training cells; seeds can agree less on cells their encoders were fitted to than on new ones.""",
    ),
    (
        "code",
        """rep = diagnostics.report(fits, markers=[*markers, "cell_type"], n_lpd_samples=50)
print(rep.summary())""",
    ),
    (
        "md",
        """## The invariants table

One row per output. *Invariant in theory*: whether a rotation of the latent space can change it.
*Agreement*: how closely the worst pair of seeds agrees (1 is perfect for concordance, overlap, cosine
and MCC; for held-out log p(x) it is the largest difference in paired standard errors). *After rotation*:
the same once each pair of seeds is aligned by the best orthogonal map.""",
    ),
    (
        "code",
        """columns = ["quantity", "invariant_in_theory", "metric", "agreement", "aligned_agreement", "verdict"]
rep.invariants[columns].round(3)""",
    ),
    (
        "code",
        """fig, ax = plt.subplots(figsize=(8, 4))
plotting.invariants(rep.invariants, ax=ax)
plt.show()""",
    ),
    (
        "md",
        """**What the figure shows.** Solid bars: agreement between the least similar pair of seeds, coloured by
verdict; the threshold for *stable* is 0.9 (0.5 for the k-NN graph). Dashed outlines: agreement after
rotating one seed onto the other. Per-dimension quantities (coordinates, loadings, marker correlations)
agree poorly as they are, often with negative concordance, and far better after rotation: the seeds found
similar solutions in different coordinates. Quantities that a rotation cannot change (distances between
cells, decoded means, the decoder's Gram matrix) need no alignment at all.

**What can be concluded.** Report the invariant quantities; do not report "dimension 3" of one seed as a
biological axis. A quantity that is invariant in theory but still falls short of its threshold (on real
data and short training this is often the k-NN graph, whose exact neighbour sets are fragile) differs
between seeds for a reason other than the symmetry: the seeds did not reach the same solution. Read its
number, not only its verdict. **What cannot.** Agreement across three briefly trained seeds is evidence,
not proof, that a longer run would agree as well; the thresholds are conventions, stated in the report.""",
    ),
    (
        "md",
        """## Predictive equivalence

Left: held-out log p(x) per cell for each seed, with ±2 standard errors over cells and the Monte Carlo
error of the importance sampler; cells differ so much that these bars hide any difference between seeds.
Right: each seed minus the best seed, cell by cell, with the simultaneous interval of that paired
difference (Bonferroni over the pairs, as the predictive table's `ci_low` and `ci_high`), which removes the
cell-to-cell variation all seeds share.""",
    ),
    (
        "code",
        """fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
plotting.log_predictive_density(rep.predictive, ax=axes[0])
plotting.paired_lpd_differences(rep.predictive, rep.tables["predictive_pairs"], ax=axes[1])
plt.show()
rep.tables["predictive_pairs"][["fit_a", "fit_b", "diff_per_cell", "ci_low", "ci_high", "margin", "decision"]].round(3)""",
    ),
    (
        "md",
        """The report tests *equivalence*, not the absence of a detected difference: a pair is equivalent when
its simultaneous interval for the per-cell difference (`ci_low` to `ci_high`, Bonferroni-corrected over
pairs) lies inside the margin, a small share of what the latent variables add per cell over a model
without them. When every pair is equivalent, held-out fit cannot prefer one seed over another, so any
difference in their coordinates is a choice, not a finding. An interval outside the margin means the
optimisation ended in different places (after short training, a sign to train longer); an interval that
straddles it is *undetermined*, and more held-out cells would decide it. Unreliable log p(x) estimates
(Pareto k-hat above 0.7 on too many cells) also make the verdict undetermined.""",
    ),
    (
        "md",
        """## Aligning the latent spaces

Maps from one seed's latent means to another's, fitted on half of the held-out cells and scored on the
other half: identity, signed permutation, orthogonal (rotation), general linear, and ICA (each seed rotated
separately into maximally non-Gaussian axes). The error is the mean distance per cell as a fraction of
the latent diameter.""",
    ),
    (
        "code",
        """fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
plotting.alignment_errors(rep.alignment, ax=axes[0])
plotting.principal_angles(rep.subspace, ax=axes[1])
plt.show()
rep.tables["alignment_summary"].round(3)""",
    ),
    (
        "md",
        """**Left.** Relabelling and flipping dimensions (permutation) leaves a large error; a rotation removes
most of it, and a general linear map little more. The seeds differ mainly by a rotation, exactly the
symmetry of the N(0, I) prior. ICA, which never sees the pairing of cells when choosing its rotation, gets
close to the best rotation when the latents are non-Gaussian; its efficiency is in `rep.tables["ica_efficiency"]`.
**Right.** Principal angles between the gene-space spans of the seeds' loadings: small angles mean the
seeds use the same gene programmes, whatever their coordinates; larger angles are directions that the
seeds determine less well. The spans are compared as wholes, because their columns are not comparable.""",
    ),
    (
        "md",
        """## The marker pitfall

Correlation of each latent dimension with each marker, per seed, and the rotation-invariant R² of each
marker regressed on all latent dimensions.""",
    ),
    (
        "code",
        """corr = rep.tables["marker_correlations"]
fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
plotting.marker_correlations(corr, axes=axes)
plt.show()
fig, ax = plt.subplots(figsize=(6, 3))
plotting.marker_r2(rep.tables["marker_r2"], ax=ax)
plt.show()
rep.markers[["marker", "r2_min", "r2_max", "best_dims", "best_dim_agrees"]].round(3)""",
    ),
    (
        "md",
        """**What the heatmaps show.** Markers such as CD14 and LYZ (monocytes) or NKG7 and GNLY (NK cells) light up
different dimensions, with different signs, in different seeds (the `best_dims` column names them). A sentence like "latent dimension 4 is the monocyte axis"
describes one seed's arbitrary coordinates and would not survive a re-run. **What to report instead.**
The R² of the marker on all dimensions is the same in every seed (points on top of each other): the
latent space as a whole does encode the marker, reproducibly. Correlation with a coordinate is not
identification of a process.""",
    ),
    (
        "md",
        """## Cross-seed R-hat and posterior predictive checks

Seeds are treated as chains and draws from each seed's posterior as draws. Raw coordinates have R-hat far
above 1 because each seed sits in its own rotation. Invariant quantities and aligned coordinates near 1
mean the seeds agree within their posterior uncertainty; above 1.01 means they differ by more than that
uncertainty, which is common for briefly trained models and is worth reading alongside the predictive
comparison.""",
    ),
    (
        "code",
        """fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
plotting.rhat(rep.rhat, ax=axes[0])
plotting.zero_fraction(rep.tables["ppc_genes"], ax=axes[1])
plt.show()
rep.ppc.round(3)""",
    ),
    (
        "md",
        """The right panel compares the fraction of zero counts per gene in the held-out data with the fraction
in counts simulated from each seed. Points on the diagonal mean the model reproduces the sparsity of the
data; the seeds should agree with each other up to Monte Carlo noise, since these checks cannot depend
on the latent coordinates.""",
    ),
    (
        "md",
        """## Back into your AnnData: every cell's stability

`rep.write(adata)` puts the report's per-cell findings into the AnnData the fits came from: each cell's k-NN
agreement across seeds (the share of its 15 nearest neighbours two seeds have in common, mean over pairs), the
same between two draws of one fit's posterior (the within-seed baseline), and the consensus latent in
`obsm["X_countvae_consensus"]`. They are measured on the held-out cells *and* on the training cells the report
reads (up to 10,000), on one k-NN graph of both, so the cells you cluster carry their own stability;
`countvae_heldout` tells them apart, and held-out log p(x) is left NaN on training cells. Per cell type and kind
of cell:""",
    ),
    (
        "code",
        """written = rep.write(adata)
columns = ["countvae_knn_agreement", "countvae_knn_agreement_within_seed"]
measured = adata.obs[adata.obs["countvae_knn_agreement"].notna()]
print(f"{len(measured)} of {adata.n_obs} cells measured; {int(measured['countvae_heldout'].sum())} of them held out")
measured.groupby(["cell_type", "countvae_heldout"], observed=True)[columns].mean().round(3)""",
    ),
    (
        "md",
        """## Saving the report

`rep.save(folder)` writes a self-contained `report.html` (figures inline, no network), `report.json`
(every number, the settings, package versions and a checksum of the held-out data) and `report.md`.
From the command line, `countvae diagnose data.h5ad --batch-key batch --labels-key cell_type --out DIR`
runs the whole pipeline.""",
    ),
    (
        "code",
        """with tempfile.TemporaryDirectory() as tmp:
    folder = rep.save(f"{tmp}/report")
    print(sorted(p.name for p in folder.iterdir()))""",
    ),
]


if __name__ == "__main__":
    write(CELLS, "02_multi_seed_diagnostics.ipynb")
