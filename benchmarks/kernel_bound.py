"""The machine's own bound on parallel efficiency: the CPU kernel alone, in N processes at once.

    python benchmarks/kernel_bound.py --processes 1 2 4 8 16 --json bound.json

Each process trains its own tables (one worker's share: --docs document rows, --urls URL rows, as one
block of the schedule holds them) with the engine's kernel (cpu_kernel.train_tokens, one thread),
PV-DBOW, dim 100, negative 5, on Zipf-distributed tokens; nothing is shared, no Ray, no servers, no
rounds. N processes start together and each reports its tokens/s; the bound is the summed rate over
N times one process's. No schedule of W one-CPU workers can do better than this figure at N = W: what
it loses is the machine's (shared caches and memory bandwidth, two hardware threads on one core, a
clock that drops as more cores are busy), not the trainer's. lscpu's threads per core is printed
beside it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from harness import save_json


def _one(args: tuple) -> float:
    """One process: warm the kernel up, wait at the barrier, train --tokens tokens; its tokens/s."""
    barrier, docs, urls, tokens, dim, seed = args
    from doc2vec_dist.cpu_kernel import train_tokens
    from doc2vec_dist.sampling import NegativeTable

    rng = np.random.default_rng(seed)
    counts = np.maximum(1, (1e6 / np.arange(1, urls + 1)) ** 0.9).astype(np.int64)  # Zipf-like URL counts
    table = NegativeTable(counts, 0.75)
    stream = rng.choice(urls, size=tokens, p=counts / counts.sum()).astype(np.int32)
    doc_of = np.sort(rng.integers(0, docs, tokens)).astype(np.int64)
    inputs = ((rng.random((docs, dim), dtype=np.float32) * 2 - 1) / dim).astype(np.float32)
    outputs = np.zeros((urls, dim), np.float32)
    keep = np.ones(urls, np.float32)

    def run(n: int, salt: int) -> None:
        train_tokens(inputs, outputs, doc_of[:n], stream[:n], keep, table.accept, table.alias, 5.0, 0.025, 0.0001,
                     seed * 1_000_003 + salt, threads=1)

    run(min(tokens, 50_000), 0)  # numba's load and compile (cached per machine) off the clock
    barrier.wait()
    t0 = time.perf_counter()
    run(tokens, 1)
    return tokens / (time.perf_counter() - t0)


def measure(n: int, docs: int, urls: int, tokens: int, dim: int) -> list[float]:
    """Tokens/s of each of n processes training at once."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as pool:
            return pool.map(_one, [(barrier, docs, urls, tokens, dim, 100 + i) for i in range(n)])


def threads_per_core() -> str:
    try:
        out = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    for line in out.splitlines():
        if line.lower().startswith("thread(s) per core"):
            return line.split(":", 1)[1].strip()
    return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--docs", type=int, default=60_000, help="document rows per process (one worker's)")
    ap.add_argument("--urls", type=int, default=30_000, help="URL rows per process (one block's)")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="tokens each process trains on the clock")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    if min(a.processes) < 1 or a.tokens < 1:
        ap.error("--processes and --tokens must be at least 1")

    tpc = threads_per_core()
    print(f"[bound] {os.cpu_count()} logical CPUs, threads per core {tpc}; each process {a.tokens:,} tokens, "
          f"{a.docs:,} document rows, {a.urls:,} URL rows, dim {a.dim}", flush=True)
    runs, base = [], None
    for n in [1] + [p for p in a.processes if p != 1]:  # one process first: the others' reference
        rates = measure(n, a.docs, a.urls, a.tokens, a.dim)
        base = base or rates[0]
        total = float(sum(rates))
        runs.append({"processes": n, "tokens_per_second": total, "per_process": [float(r) for r in rates],
                     "efficiency": total / (n * base)})
        print(f"[bound] {n:>2} processes: {total / 1e6:.3f}M tokens/s in all, slowest {min(rates) / 1e6:.3f}M, "
              f"efficiency {total / (n * base):.2f}", flush=True)
    if a.json:
        save_json({"cpus": os.cpu_count(), "threads_per_core": tpc, "tokens": a.tokens,
                           "docs": a.docs, "urls": a.urls, "dim": a.dim, "runs": runs}, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
