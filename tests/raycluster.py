"""Fit seeds on a real two-node Ray cluster on the loopback address.

For tests/diagnostics/fitting/test_fitting_backed.py.

Usage::

    python tests/raycluster.py DATA.h5ad OUT_DIR OPTIONS_JSON

Starts a head node and a second node on 127.0.0.1 (one CPU and an 80 MiB object
store each, separate raylet processes, no dashboard, Ray's temporary folder under
``$RAY_TMPDIR``, which the caller makes for this run alone), connects to the
head by its address, fits the seeds of ``fit_seeds(**OPTIONS, backend="ray")`` on the
backed file into OUT_DIR, prints the alive nodes' ids as JSON, and shuts the cluster
down. It runs in its own process because Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
when it is imported: with it off, Ray keeps 127.0.0.1 as the nodes' address instead of
replacing it by the machine's network address (where nothing listens). The test kills
this process's group if it hangs; Ray's reaper then stops the nodes.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import anndata as ad  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import countvae as cv  # noqa: E402
from countvae.diagnostics import fit_seeds  # noqa: E402


def main(data: str, out_dir: str, options: dict) -> None:
    """Start the cluster, fit, print the node ids, shut everything down (also on failure)."""
    started = time.perf_counter()
    # Ray writes the cluster's address to $RAY_TMPDIR/ray whatever the nodes' temp_dir: one folder for both.
    private = os.environ.get("RAY_TMPDIR")
    if not private or not Path(private, "ray").is_dir():
        raise SystemExit("set RAY_TMPDIR to a short folder of this run's own, with a `ray` folder in it")
    temp_dir = str(Path(private, "ray"))
    node = {
        "num_cpus": 1,
        "object_store_memory": 80 * 1024**2,
        "temp_dir": temp_dir,
        "node_ip_address": "127.0.0.1",
        "include_dashboard": False,
    }
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=node)
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        print(f"cluster up after {time.perf_counter() - started:.1f} s", file=sys.stderr)
        # The nodes' workers inherit this process's environment (its PYTHONPATH: the countvae under test).
        ray.init(address=cluster.address, log_to_driver=False)
        adata = ad.read_h5ad(data, backed="r")
        cv.CountVAE.setup_anndata(adata, batch_key="batch")
        fit_seeds(adata, backend="ray", out_dir=out_dir, **options)
        print(f"fits done after {time.perf_counter() - started:.1f} s", file=sys.stderr)
        if not ray.is_initialized():
            raise RuntimeError("fit_seeds shut down a Ray instance it did not start")
        print(json.dumps(sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])))
    finally:
        ray.shutdown()
        if cluster is not None:
            for node_ in [*cluster.worker_nodes, cluster.head_node]:  # no grace period: nothing to save
                if node_ is not None:
                    cluster.remove_node(node_, allow_graceful=False)
            cluster.shutdown()
        print(f"cluster down after {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
