"""Shared pieces of the benchmark scripts: machine description, RESULTS.md sections, workers, data.

Every benchmark is one command with sensible defaults and a ``--quick`` smoke mode.
Timings that are compared run in separate worker processes (so that each has its
own peak resident memory) in an interleaved order, and every section records the
exact command, the machine and the load average, because on a shared machine the
load decides the absolute numbers.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_RESULTS = BENCH_DIR / "RESULTS.md"
DEFAULT_DATA_DIR = BENCH_DIR / "_data"

if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/x.py` from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from dataclasses import replace  # noqa: E402

from countvae._io import atomic_file_path, write_text_atomic  # noqa: E402
from countvae.module.marginal import MarginalSettings  # noqa: E402

#: The package's default log p(x) estimator settings.
DEFAULT_MARGINAL = MarginalSettings()

#: Gold standard of the log p(x) benchmarks: 10x the draws (first pass and escalation) and pilot, twice the
#: restarts and restart steps, and every restart run to its own stop (no snapping to the first mode).
GOLD_MARGINAL = replace(
    DEFAULT_MARGINAL,
    n_draws=10 * DEFAULT_MARGINAL.n_draws,
    n_pilot=10 * DEFAULT_MARGINAL.n_pilot,
    pilot_restarts=2 * DEFAULT_MARGINAL.pilot_restarts,
    prior_restarts=2 * DEFAULT_MARGINAL.prior_restarts,
    restart_steps=2 * DEFAULT_MARGINAL.restart_steps,
    escalation_draws=10 * DEFAULT_MARGINAL.escalation_draws,
    snap_radius=0.0,
)


# ----- machine ---------------------------------------------------------------------------------
def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def cpu_model() -> str:
    """The processor's name as the kernel reports it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_line(threads: int) -> str:
    """One line describing the machine for RESULTS.md."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu_model()}, {cores} cores available, torch {torch.__version__} with {threads} threads, "
        f"Python {platform.python_version()}"
    )


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB.

    ``VmHWM`` where ``/proc/self/status`` has it: Linux carries ``ru_maxrss`` across ``fork`` and ``exec``, so a
    worker process reported its parent's peak whenever that was higher (bench_worker_memory.py's drivers reported the
    1.2 GB their parent had taken writing the data file, backed and in memory alike). Elsewhere ``ru_maxrss`` (KiB).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def command_line() -> str:
    """The command that ran this script, as a user would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO_ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])  # quoted: an argument may hold spaces


# ----- RESULTS.md ----------------------------------------------------------------------------------
def write_section(results: Path, name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of ``results``, leaving every other section alone.

    Sections are delimited by ``<!-- section: NAME -->`` and ``<!-- end: NAME -->``.
    """
    results = Path(results)
    text = (
        results.read_text() if results.exists() else "# Benchmark results\n\nEach section is written by one script.\n"
    )
    block = f"<!-- section: {name} -->\n{body.strip()}\n<!-- end: {name} -->"
    pattern = re.compile(rf"<!-- section: {re.escape(name)} -->.*?<!-- end: {re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
    write_text_atomic(results, text, overwrite=True)


def markdown_table(frame: pd.DataFrame, floatfmt: str = "{:.5g}") -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, float | np.floating) else str(v) for v in row.tolist()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----- workers -------------------------------------------------------------------------------------
def run_worker(script: Path, spec: dict, timeout: float | None = None) -> dict:
    """Run ``script --worker SPEC_JSON`` in a fresh process and return the JSON it prints last."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    threads = str(spec.get("threads", 1))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    proc = subprocess.run(
        [sys.executable, str(script), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {spec} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Stopwatch:
    """Wall-clock timestamps."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.marks: list[float] = []

    def mark(self) -> None:
        """Record the current time."""
        self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between the start and the first mark, then between consecutive marks."""
        points = [self.t0, *self.marks]
        return [b - a for a, b in zip(points[:-1], points[1:], strict=True)]


# ----- simulated data -------------------------------------------------------------------------------
def kang_or_smoke_data(quick: bool, n_cells: int = 600, n_genes: int = 120):
    """The Kang PBMC data (or, with ``quick``, small simulated counts), registered with its batch key.

    The single-model benchmarks (flops, profile, gpu) all time the default architecture on this data.
    """
    import countvae as cv

    if quick:
        adata = cv.data.simulate(n_cells=n_cells, n_genes=n_genes, n_latent=3, n_batches=2, seed=0)
    else:
        adata = cv.data.load_dataset("kang2018")
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


def _leaky_relu(x: np.ndarray, slope: float = 0.2) -> np.ndarray:
    return np.where(x > 0, x, slope * x)


def simulate_h5ad(
    path: Path,
    n_cells: int,
    n_genes: int,
    seed: int = 0,
    n_batches: int = 3,
    n_latent: int = 10,
    chunk_cells: int = 10_000,
    library_size: float = 1500.0,
    overwrite: bool = False,
) -> Path:
    """Write NB counts from a random MLP decoder to an h5ad file (CSR float32), chunk by chunk.

    Never more than ``chunk_cells`` dense rows exist at once, so a million cells
    are written in bounded memory. The file is built under a temporary name and
    renamed. ``obs['batch']`` holds the batch; cells are in random order.
    """
    import anndata as ad
    import h5py
    from anndata.io import sparse_dataset, write_elem
    from scipy.special import log_softmax

    path = Path(path)
    if path.exists() and not overwrite:
        return path
    root = np.random.SeedSequence(seed)
    param_seq, batch_seq, *chunk_seqs = root.spawn(2 + -(-n_cells // chunk_cells))
    rng = np.random.default_rng(param_seq)
    n_hidden = 32
    base = rng.normal(0.0, 1.5, n_genes)
    V1 = rng.normal(0.0, 1.0 / np.sqrt(n_latent), (n_hidden, n_latent))
    a1 = rng.normal(0.0, 0.5, n_hidden)
    V2 = rng.normal(0.0, 1.0 / np.sqrt(n_hidden), (n_genes, n_hidden))
    offsets = rng.normal(0.0, 0.3, (n_batches, n_genes))
    theta = (5.0 * np.exp(rng.normal(0.0, 0.5, n_genes))).astype(np.float32)
    batch = np.random.default_rng(batch_seq).integers(0, n_batches, n_cells)
    obs = pd.DataFrame(
        {"batch": pd.Categorical([f"b{k}" for k in batch], categories=[f"b{k}" for k in range(n_batches)])},
        index=pd.Index([f"cell{i}" for i in range(n_cells)]),
    )
    var = pd.DataFrame(index=pd.Index([f"gene{g}" for g in range(n_genes)]))
    with atomic_file_path(path, overwrite=overwrite) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        write_elem(f, "obs", obs)
        write_elem(f, "var", var)
        for key in ("obsm", "varm", "layers", "obsp", "varp"):
            write_elem(f, key, {})
        write_elem(f, "uns", {"simulation": f"simulate_h5ad(n_cells={n_cells}, n_genes={n_genes}, seed={seed})"})
        for k, seq in enumerate(chunk_seqs):
            crng = np.random.default_rng(seq)
            lo, hi = k * chunk_cells, min((k + 1) * chunk_cells, n_cells)
            n = hi - lo
            z = crng.standard_normal((n, n_latent))
            eta = log_softmax(base + _leaky_relu(z @ V1.T + a1) @ V2.T, axis=1) + offsets[batch[lo:hi]]
            mu = np.exp(np.log(library_size) + crng.normal(0.0, 0.4, (n, 1)) + eta).astype(np.float32)
            del eta
            rate = crng.standard_gamma(np.broadcast_to(theta, (n, n_genes)), dtype=np.float32) * (mu / theta)
            del mu
            counts = crng.poisson(rate).astype(np.float32)
            del rate
            empty = counts.sum(1) == 0
            counts[empty, int(np.argmax(base))] = 1.0  # a cell needs a library size; rare at these sizes
            block = sp.csr_matrix(counts)
            del counts
            if k == 0:
                write_elem(f, "X", block)
            else:
                sparse_dataset(f["X"]).append(block)
    check = ad.read_h5ad(path, backed="r")
    assert check.shape == (n_cells, n_genes), check.shape
    check.file.close()
    return path
