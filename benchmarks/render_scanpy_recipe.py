"""The figure of the scanpy recipe in docs/scanpy.md: a report's stability columns on a UMAP, drawn by scanpy.

Fits a few seeds on Kang, makes the report, writes it into the whole data set's
AnnData (``DiagnosticReport.write``: the held-out and fit cells), round-trips the file
through h5ad, then runs the recipe of the docs on the cells the report measured:
``sc.pp.neighbors(use_rep="X_countvae_consensus")``, ``sc.tl.umap`` and
``sc.pl.umap(color=[...])``. Writes ``benchmarks/figures/scanpy_recipe.png`` and prints
the mean of each column on held-out and on fit cells.

Usage::

    python benchmarks/render_scanpy_recipe.py --quick   # 3 seeds, 10 epochs (~3 min on 2 cores)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import anndata as ad
import matplotlib
import torch
from _common import BENCH_DIR

import countvae as cv
from countvae.diagnostics import fit_seeds, report

FIGURE = BENCH_DIR / "figures" / "scanpy_recipe.png"


def main() -> None:
    """Fit, report, write, read back, plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 epochs per fit instead of 40")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import scanpy as sc

    torch.set_num_threads(1)
    adata = cv.data.load_dataset("kang2018")
    cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
    fits = fit_seeds(
        adata,
        seeds=range(args.seeds),
        model_kwargs={"n_latent": 10},
        train_kwargs={"max_epochs": 10 if args.quick else 40, "progress_bar": False},
        heldout_fraction=0.2,
        progress_bar=False,
    )
    rep = report(fits, max_lpd_cells=400)
    rep.write(adata)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "analysed.h5ad"
        adata.write_h5ad(path)
        adata = ad.read_h5ad(path)
    cells = adata[adata.obs["countvae_knn_agreement"].notna()].copy()
    columns = ["countvae_knn_agreement", "countvae_knn_agreement_within_seed"]
    print(cells.obs.groupby("countvae_heldout")[columns].mean().round(3).to_string())
    sc.pp.neighbors(cells, use_rep="X_countvae_consensus")
    sc.tl.umap(cells, random_state=0)
    sc.pl.umap(
        cells,
        color=["cell_type", *columns],
        ncols=3,
        wspace=0.35,
        show=False,
    )
    FIGURE.parent.mkdir(exist_ok=True)
    plt.gcf().savefig(FIGURE, dpi=70, bbox_inches="tight")
    print(f"wrote {FIGURE} ({FIGURE.stat().st_size / 1024:.0f} KiB)")
    print(rep.model_card())


if __name__ == "__main__":
    main()
