"""Throughput of the held-out log predictive density estimator (cells per second), float32 and float64.

A countvae NB MLP model (n_latent 10, 1 x 128 hidden) is trained for one epoch on
the Kang data (on simulated data with ``--quick``); its estimator
``countvae.model.inference.log_predictive_density`` with ``method="guide"`` (the
estimator this section was recorded with; the default is timed in lpd_accuracy.py) is then timed on held-out cells
for several numbers of cells, importance samples and cells per chunk. The cost
should be linear in cells x samples: the column ``us per cell-sample`` should be
flat.

    python benchmarks/bench_lpd.py            # writes the "lpd" section of RESULTS.md
    python benchmarks/bench_lpd.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)


def _data(quick: bool):
    import countvae as cv

    if quick:
        return cv.data.simulate(n_cells=400, n_genes=80, n_latent=3, n_batches=2, seed=0)
    return cv.data.load_dataset("kang2018")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="lpd")
    args = parser.parse_args(argv)

    import torch

    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix
    from countvae.model.inference import log_predictive_density

    torch.set_num_threads(args.threads)
    adata = _data(args.quick)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    loads = [load_average()]
    grid = (
        [(40, 20, 128), (80, 20, 128), (40, 40, 128)]
        if args.quick
        else [(256, 100, 128), (512, 100, 128), (1024, 100, 128), (512, 200, 128), (512, 400, 128), (512, 200, 512)]
    )
    rows = []
    for dtype in (torch.float32, torch.float64):
        model = cv.CountVAE(adata, n_latent=10 if not args.quick else 3, dtype=dtype)
        model.train(early_stopping=False, max_epochs=1, progress_bar=False, seed=0)
        source = CountSource(get_count_matrix(adata, model.registry), batch_codes(adata, model.registry))
        held = model.validation_indices
        log_predictive_density(model.module, source, held[:32], 10, 0, method="guide")  # warm-up
        for n_cells, n_samples, chunk in grid:
            idx = held[:n_cells]
            t0 = time.perf_counter()
            frame = log_predictive_density(
                model.module, source, idx, n_samples, 0, cells_per_chunk=chunk, method="guide"
            )
            seconds = time.perf_counter() - t0
            rows.append(
                {
                    "dtype": str(dtype).replace("torch.", ""),
                    "cells": len(idx),
                    "samples": n_samples,
                    "cells per chunk": chunk,
                    "seconds": seconds,
                    "cells/s": len(idx) / seconds,
                    "us per cell-sample": 1e6 * seconds / (len(idx) * n_samples),
                    "mean LPD": float(frame["lpd"].mean()),
                }
            )
            print(rows[-1], flush=True)
    loads.append(load_average())
    table = pd.DataFrame(rows)
    print(table.to_string())
    per = table.groupby("dtype")["us per cell-sample"]
    spread = (per.max() / per.min()).to_dict()
    body = f"""## Held-out log predictive density: estimator throughput (`bench_lpd.py`)

Command: `{command_line()}` ({time.strftime("%Y-%m-%d %H:%M")}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}. Load average before/after: {"; ".join(loads)}.

Importance-sampled log p(x) per held-out cell ({adata.n_vars} genes, model trained one epoch; the speed does not
depend on the fit). Genes x samples x cells are evaluated in chunks of at most 2**22 elements.

{markdown_table(table)}

Linearity: the cost per cell-sample varies by a factor of
{", ".join(f"{k} {v:.2f}" for k, v in spread.items())} (max/min) across {len(grid)} settings that span
{table["cells"].min()}-{table["cells"].max()} cells and {table["samples"].min()}-{table["samples"].max()} samples.
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
