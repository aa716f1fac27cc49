"""Where a training step spends its time, and what each speed-up in countvae bought.

Part 1 times the pieces of one training step of the default model (n_latent 10,
1 x 128 hidden, NB, batch 128) on the Kang data: loading a minibatch, the loss
(forward), the backward pass, the finite-gradient check, the optimiser, and the
Pyro engine's extra cost (same step with ``engine="pyro"``); and the whole step
with 1 and 2 torch threads. Part 2 times each change made for speed against the
implementation it replaced, on the same inputs:

* float32 minibatches instead of a float64 round trip in the loader;
* the loader's non-zero index instead of ``torch.nonzero`` on the dense block;
* the NB term ``x d - (x + theta) softplus(d)`` instead of the ``logaddexp`` form;
* ``lgamma(theta)`` per gene instead of per non-zero count;
* fused Adam instead of the per-tensor loop.

    python benchmarks/bench_profile.py           # writes the "profile" section of RESULTS.md
    python benchmarks/bench_profile.py --quick
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
    kang_or_smoke_data,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def _allocator_line(kept: bool) -> str:
    if kept:
        return "glibc malloc keeps freed memory (`countvae._allocator.keep_freed_memory`, as in the fit workers)"
    return "glibc malloc at its defaults (as in a notebook's `model.train()`; `--keep-freed-memory` for the workers')"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="profile")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="apply countvae._allocator.keep_freed_memory first, as the command line and its fit workers do",
    )
    args = parser.parse_args(argv)
    if args.keep_freed_memory:
        from countvae._allocator import keep_freed_memory

        # not applied where the C library is not glibc or the environment already tunes malloc
        args.keep_freed_memory = keep_freed_memory()

    import torch
    import torch.nn.functional as F

    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix
    from countvae.model.training import make_optimizer, to_tensors, total_grad_norm
    from countvae.module.distributions import _nonzero_lgamma_terms, count_log_constant_sum
    from countvae.module.loss import minibatch_loss

    torch.set_num_threads(args.threads)
    adata = kang_or_smoke_data(args.quick)
    if args.quick:
        args.repeats = 5
    model = cv.CountVAE(adata, n_latent=10)
    module = model.module.train()
    matrix = get_count_matrix(adata, model.registry)
    source = CountSource(matrix, batch_codes(adata, model.registry))
    rng = np.random.default_rng(0)
    batches = [np.sort(rng.choice(adata.n_obs, 128, replace=False)) for _ in range(16)]
    cursor = {"i": 0}

    def next_rows():
        cursor["i"] = (cursor["i"] + 1) % len(batches)
        return batches[cursor["i"]]

    opt = make_optimizer(module, 1e-3, 0.0)
    params = list(module.parameters())
    state: dict = {}
    loads = [load_average()]

    def load():
        state["mb"] = source.rows(next_rows())
        state["x"], state["b"] = to_tensors(state["mb"], torch.float32, torch.device("cpu"))

    def forward(engine="direct"):
        mb = state["mb"]
        state["loss"] = minibatch_loss(
            module, state["x"], state["b"], 1.0, engine, cell_index=torch.as_tensor(mb.indices), n_total=source.n_obs
        )

    def backward():
        opt.zero_grad(set_to_none=True)
        state["loss"].backward()

    def whole(engine="direct"):
        load()
        forward(engine)
        backward()
        total_grad_norm(params)
        opt.step()

    load()
    parts = {
        "load minibatch (gather rows, densify, to tensor)": _median_ms(load, args.repeats),
        "loss forward (encoder, decoder, NB log-prob, KL)": _median_ms(forward, args.repeats),
    }
    forward()
    parts["backward"] = (
        _median_ms(lambda: (forward(), backward()), args.repeats)
        - parts["loss forward (encoder, decoder, NB log-prob, KL)"]
    )
    parts["finite-gradient check (total norm)"] = _median_ms(lambda: total_grad_norm(params), args.repeats)
    parts["optimiser (fused Adam)"] = _median_ms(opt.step, args.repeats)
    step_direct = _median_ms(whole, args.repeats)
    step_pyro = _median_ms(lambda: whole("pyro"), args.repeats)
    parts["Pyro trace overhead (engine='pyro' minus 'direct', whole step)"] = step_pyro - step_direct
    torch.set_num_threads(1)
    step_one = _median_ms(whole, args.repeats)
    torch.set_num_threads(args.threads)
    part_table = pd.DataFrame({"piece": list(parts), "ms": list(parts.values())})
    part_table.loc[len(part_table)] = ["whole step, engine='direct'", step_direct]
    part_table.loc[len(part_table)] = ["whole step, engine='pyro'", step_pyro]
    label = "1 thread" if args.threads != 1 else "1 thread again (a repeat: shows the run-to-run noise)"
    part_table.loc[len(part_table)] = [f"whole step, engine='direct', {label}", step_one]

    # ----- part 2: each change against what it replaced -------------------------------------------
    rows = next_rows()
    x = to_tensors(source.rows(rows), torch.float32, torch.device("cpu"))[0]
    loader_positions = torch.as_tensor(source.rows(rows).nonzero)
    g = torch.Generator().manual_seed(0)
    eta = torch.randn(x.shape, generator=g).requires_grad_()
    phi = torch.randn(x.shape[1], generator=g).requires_grad_()
    plain = x.clone()

    def nb_logaddexp():
        log_total = torch.logaddexp(phi, eta)
        (torch.exp(phi) * (phi - log_total) + x * (eta - log_total)).sum(-1).sum().backward()

    def nb_compact():
        d = eta - phi
        (x * d - (x + torch.exp(phi)) * F.softplus(d, threshold=40.0)).sum(-1).sum().backward()

    def lgamma_per_count(xx):
        n, genes = xx.shape
        flat = xx.reshape(-1)
        where = torch.nonzero(flat).squeeze(1)
        values = flat.index_select(0, where)
        th = torch.exp(phi).index_select(0, where % genes)
        terms = torch.lgamma(values + th) - torch.lgamma(th) - torch.lgamma(values + 1.0)
        xx.new_zeros(n).index_add(0, torch.div(where, genes, rounding_mode="floor"), terms).sum().backward()

    def lgamma_previous(xx):  # per count, positions from the loader, lgamma(theta) per gene, scatter-add per cell
        n, genes = xx.shape
        where = loader_positions
        values = xx.reshape(-1).index_select(0, where)
        gene_of = where % genes
        theta = torch.exp(phi)
        terms = (
            -torch.lgamma(values + 1.0)
            + torch.lgamma(values + theta.index_select(0, gene_of))
            - torch.lgamma(theta).index_select(0, gene_of)
        )
        xx.new_zeros(n).index_add(0, torch.div(where, genes, rounding_mode="floor"), terms).sum().backward()

    def lgamma_table(xx):
        _nonzero_lgamma_terms(xx, torch.exp(phi)).sum().backward()

    def lgamma_summed(xx):  # the training loss's form: one histogram of (count, gene) against the table
        count_log_constant_sum(xx, phi.unsqueeze(0)).backward()

    old_adam = torch.optim.Adam(module.parameters(), lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    changes = [
        (
            "minibatch rows: float64 round trip -> float32",
            lambda: torch.as_tensor(matrix[rows].toarray().astype(np.float64), dtype=torch.float32),
            lambda: torch.as_tensor(matrix[rows].toarray()),
        ),
        ("NB mean term fwd+bwd: logaddexp form -> compact form", nb_logaddexp, nb_compact),
        (
            "lgamma terms fwd+bwd: nonzero search, lgamma(theta) per count -> loader index, per gene",
            lambda: lgamma_per_count(plain),
            lambda: lgamma_previous(x),
        ),
        (
            "lgamma terms fwd+bwd: lgamma and digamma per count, scatter-add -> table for counts <= 8, segment sum",
            lambda: lgamma_previous(x),
            lambda: lgamma_table(x),
        ),
        (
            "lgamma terms in the training loss, fwd+bwd: per-cell table sums -> one histogram sum",
            lambda: lgamma_table(x),
            lambda: lgamma_summed(x),
        ),
        ("only the search: torch.nonzero -> loader index", lambda: torch.nonzero(plain.reshape(-1)), lambda: None),
        ("Adam step: per-tensor loop -> fused", old_adam.step, opt.step),
    ]
    change_rows = []
    for name, before, after in changes:
        b, a = _median_ms(before, args.repeats), _median_ms(after, args.repeats)
        change_rows.append({"change": name, "before ms": b, "after ms": a, "saved ms": b - a})
    loads.append(load_average())
    change_table = pd.DataFrame(change_rows)
    print(part_table.to_string(), change_table.to_string(), sep="\n")
    body = f"""## Where a training step spends its time (`bench_profile.py`)

Command: `{command_line()}` ({time.strftime("%Y-%m-%d %H:%M")}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}. Load average before/after: {"; ".join(loads)}.
Allocator: {_allocator_line(args.keep_freed_memory)}.

Default model on {adata.n_obs} x {adata.n_vars} cells x genes, batch 128, float32; medians over {args.repeats}
repetitions (in ms). The pieces are timed separately, so they need not add up exactly to the whole step.

{markdown_table(part_table)}

Each change made for speed, against the code it replaced (same inputs, same results; the equality is tested in
tests/module/test_distributions.py, tests/module/test_module.py and tests/data/test_backed.py):

{markdown_table(change_table)}

Not pursued, each timed on the whole step of 128 cells x 2,000 genes (2 threads, interleaved runs) and not faster
than what it would replace: `torch.compile` of the NB term (inductor with gcc 12; 6.85-7.29 ms against 6.91-7.01
eager; it also needs a C++ toolchain at run time and recompiles for the shorter last minibatch), `torch.compile`
of the whole loss but its summed z-free terms (whose sizes change with every minibatch; one graph for encoder,
decoder, NB mean terms and KL, forward and backward: 5.80-5.96 ms against 6.13-6.41 eager, 7% for about 30 s of
compilation in every fresh worker process, more than a seed's whole fit on the embedded data), a hand-written
backward for the NB term (closed-form gradient, 6.0-6.4 ms either way; again on an AMD EPYC on 2026-12-04 as one
autograd Function for the whole NB log-probability, 11 passes over the block instead of about 19, 10 interleaved
rounds of 100 whole steps on Kang: median 10.64 against 10.44 ms/step), the encoder's `log1p` over the non-zero
counts only (6.1-6.2 against 5.8-6.1 ms dense), the encoder's first layer as a sparse product (the layer forward
and backward alone: 3.2 ms as torch CSR, 7.9 ms as COO, against 0.75 ms dense), minibatches read ahead in a
thread (epochs of 90,000 cells: 4.6-5.6 s either way), and a larger table of small counts for the summed z-free
terms (up to 16, 32 or 64 instead of 8: 0.83-0.97 ms forward and backward either way, 1.49 ms at 128; the
per-entry gathers and the histogram cost more than the few large counts evaluated directly). Where the rest of a
step goes, by leaving pieces out of the whole step (sim10k, 2 threads, 5 x 200 steps each): without the z-free
terms 5.1-5.4 ms against 6.1-6.5 ms with them (before the summed form), with the NB log-probability replaced by
one product of the log means and the counts 4.5-4.8 ms. So the z-free terms cost about 1 ms of a step, the
rest of the NB head about 0.6 ms, and the two networks, Adam, the finite-gradient check and loading the rest.
A torch sparse CSR copy of the matrix for row gathering is not possible (`index_select` is not implemented for
sparse CSR tensors in torch 2.13; scipy's row gather takes well under 1 ms for 128 rows). Removing the sparse terms
altogether (a lower bound for any change to them) took the step from 6.9 to 5.1 ms before the table, which is what
the table went after. Mixed precision (`torch.autocast("cpu", dtype=torch.bfloat16)` around the loss, on an AMD EPYC
with AVX512-BF16, 2026-12-04): the step's matmuls alone run 2.2x faster in bfloat16 (128 x 2,000 x 128, 1 thread:
0.36 against 0.81 ms), but the whole step only 6% (8 interleaved rounds of 50 steps on Kang, 2 threads: median 10.74
against 11.47 ms), since the casts and the element-wise NB head stay; bfloat16 keeps 8 bits of mantissa for the
decoder's log rates, and a CPU without bfloat16 instructions emulates it.
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    main()
