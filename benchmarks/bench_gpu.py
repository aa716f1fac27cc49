"""Time per epoch on CPU and GPU against scvi-tools' SCVI, and a check that both devices give the same numbers.

Run on a machine with a CUDA GPU:

    python benchmarks/bench_gpu.py                # Kang data, 10 epochs per device
    python benchmarks/bench_gpu.py --quick        # small simulated data, 2 epochs

Without a GPU the script compares the CPU with itself (so it cannot rot) and says so.

On each device countvae and SCVI train the same architecture (10 latent dimensions, one
hidden layer of 128 units, NB with gene-wise dispersion, batch one-hot into encoder and
decoder, batch size 128, 90% of the cells for training; SCVI as in bench_training.py) for
the same number of epochs; the table gives both tools' time per epoch after the first
(which carries start-up costs such as CUDA kernels' compilation) and their ratio.

What "the same numbers" means here. Training draws its Monte Carlo noise from the
device's own generator, so CPU and GPU fits follow different random paths and are
compared by their final losses only (loosely). The deterministic outputs of one
fitted model are compared tightly: the model trained on the CPU is copied to the
GPU and its latent means, normalized expression and importance-sampled log
predictive density (whose noise is drawn on the CPU with a seeded generator, so it
is identical on both devices) must agree up to float32 rounding.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_RESULTS,
    command_line,
    kang_or_smoke_data,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)


def _fit(adata, accelerator: str, epochs: int):
    import countvae as cv

    model = cv.CountVAE(adata, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    options = {"batch_size": 128, "train_size": 0.9, "progress_bar": False, "accelerator": accelerator}
    options["early_stopping"] = False  # every epoch, so both devices train the same steps
    t0 = time.perf_counter()
    model.train(max_epochs=1, seed=0, **options)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    if epochs > 1:
        model.train(max_epochs=epochs - 1, seed=1, **options)
    rest = (time.perf_counter() - t0) / max(epochs - 1, 1)
    return model, first, rest


def _fit_scvi(adata, accelerator: str, epochs: int) -> tuple[float, float]:
    """SCVI's first epoch and mean later epoch (seconds) on a copy of ``adata``, as bench_training.py trains it."""
    from bench_training import _train_scvi

    seconds = _train_scvi({"epochs": epochs, "lpd": False, "accelerator": accelerator}, adata.copy(), None)[
        "epoch_seconds"
    ]
    return seconds[0], float(np.mean(seconds[1:])) if len(seconds) > 1 else seconds[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="gpu")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    adata = kang_or_smoke_data(args.quick, n_cells=800, n_genes=100)
    if args.quick:
        args.epochs = 2
    has_gpu = torch.cuda.is_available()
    other = "gpu" if has_gpu else "cpu"
    device_name = torch.cuda.get_device_name(0) if has_gpu else "none (CPU compared with itself)"
    loads = [load_average()]
    cpu_model, cpu_first, cpu_rest = _fit(adata, "cpu", args.epochs)
    dev_model, dev_first, dev_rest = _fit(adata, other, args.epochs)
    scvi_cpu_first, scvi_cpu_rest = _fit_scvi(adata, "cpu", args.epochs)
    scvi_dev_first, scvi_dev_rest = _fit_scvi(adata, other, args.epochs)
    loads.append(load_average())

    # the CPU-trained model, evaluated on the other device
    moved = copy.copy(cpu_model)
    moved.module = copy.deepcopy(cpu_model.module).to(torch.device("cuda" if has_gpu else "cpu"))
    moved.device = next(moved.module.parameters()).device
    idx = cpu_model.validation_indices[:200]
    checks = []
    for name, fn in (
        ("latent means", lambda m: m.get_latent_representation(indices=idx)),
        ("normalized expression", lambda m: m.get_normalized_expression(indices=idx, return_numpy=True)),
        (
            "log predictive density",
            lambda m: m.get_log_predictive_density(indices=idx, n_samples=50, method="guide")["lpd"].values,
        ),
    ):
        a, b = fn(cpu_model), fn(moved)
        rel = float(np.max(np.abs(a - b) / (np.abs(a) + 1e-6)))
        checks.append({"output": name, "max relative difference": rel, "within 1e-3": bool(rel < 1e-3)})
    loss_cpu = float(cpu_model.history["loss_validation"].iloc[-1])
    loss_dev = float(dev_model.history["loss_validation"].iloc[-1])
    checks.append(
        {
            "output": f"validation loss after {args.epochs} epochs (separate fits)",
            "max relative difference": abs(loss_cpu - loss_dev) / abs(loss_cpu),
            "within 1e-3": bool(abs(loss_cpu - loss_dev) / abs(loss_cpu) < 1e-3),
        }
    )
    dev_label = other + ("" if has_gpu else " (again)")
    timing = pd.DataFrame(
        [
            {
                "device": device,
                "countvae first epoch s": first,
                "countvae s/epoch": rest,
                "SCVI first epoch s": scvi_first,
                "SCVI s/epoch": scvi_rest,
                "countvae / SCVI per epoch": rest / scvi_rest,
            }
            for device, first, rest, scvi_first, scvi_rest in (
                ("cpu", cpu_first, cpu_rest, scvi_cpu_first, scvi_cpu_rest),
                (dev_label, dev_first, dev_rest, scvi_dev_first, scvi_dev_rest),
            )
        ]
    )
    check_table = pd.DataFrame(checks)
    print(timing.to_string(), check_table.to_string(), sep="\n")
    ok = all(c["within 1e-3"] for c in checks[:3])
    if not ok:
        print("FAILED: deterministic outputs differ between devices beyond float32 rounding", file=sys.stderr)
    if not args.no_write:
        body = f"""## CPU and GPU (`bench_gpu.py`)

Command: `{command_line()}` ({time.strftime("%Y-%m-%d %H:%M")}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}; GPU: {device_name}. Load average before/after: {"; ".join(loads)}.

{adata.n_obs} x {adata.n_vars} cells x genes, default architecture, batch 128, {args.epochs} epochs per device and
tool (s/epoch: the mean of the epochs after the first; SCVI as in bench_training.py, the same architecture).

{markdown_table(timing)}

{markdown_table(check_table)}

The first three rows evaluate one CPU-trained model on both devices (same parameters, same seeded noise) and must
agree to float32 rounding; the last row compares two separate fits, whose Monte Carlo noise comes from each
device's own generator, so it only agrees loosely.
"""
        write_section(Path(args.results), args.section, body)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
