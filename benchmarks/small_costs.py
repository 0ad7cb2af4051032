"""Two small costs that tests once held by the clock, measured here instead (a loaded machine moves a
clock's ratios; the tests check what the code does, this script what it costs):

    python benchmarks/small_costs.py                   # both, printed, and JSON under --work
    python benchmarks/small_costs.py --repeats 15 --no-first-push

- rounding: a float16 table's stochastic rounding (precision.narrow) against bfloat16's on the same
  20,000 × 64 values, interleaved, the best of --repeats each. A float16 rounding 8× slower than
  bfloat16's (nextafter and a division per value) cost the delta path its quality on the sample.
- first push: a parameter server's first push in a fresh process, with numba's machinery loaded while
  the server starts (ps.load_compiled) and without. The first compiled call of a process costs about
  0.3 s; a server that loads it as it starts does not pay it in its first push. And a server of small
  float32 tables (ps.NUMPY_TABLE_ELEMENTS), which adds with numpy and loads nothing compiled, with its
  process's CPU seconds at that push beside the compiled one's.

Speed needs a quiet machine: nothing else running.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from harness import save_json

FIRST_PUSH = """
import os, sys, threading, time
import numpy as np
from doc2vec_dist import ps
from doc2vec_dist.config import TableSpec
if sys.argv[1] == "off":
    ps.load_compiled = lambda: None
rows = 100 if sys.argv[1] == "small" else ps.NUMPY_TABLE_ELEMENTS // 8  # small: numpy's adds
server = ps.ParameterServer(0, 1, {"docs": TableSpec("docs", rows, 8)}, seed=1)
for thread in threading.enumerate():
    if thread.name == "load-compiled":
        thread.join()
ids = np.arange(10, dtype=np.int64)
rows = np.ones((10, 8), dtype=np.float32)
t0 = time.perf_counter()
server.push({"docs": ids}, rows, assign=True)
seconds = time.perf_counter() - t0
print(sum(os.times()[:2]), seconds)
"""


def rounding_seconds(repeats: int) -> dict[str, float]:
    """The best seconds of narrowing 20,000 × 64 float32 values to each 16-bit dtype, interleaved so that
    a load on the machine falls on both."""
    import numpy as np

    from doc2vec_dist import precision

    values = np.random.default_rng(0).normal(0, 0.3, (20_000, 64)).astype(np.float32)
    best = {"bfloat16": float("inf"), "float16": float("inf")}
    for k in range(repeats):
        for dtype in ("bfloat16", "float16"):
            t0 = time.perf_counter()
            precision.narrow(values, dtype, precision.rng_of(k))
            best[dtype] = min(best[dtype], time.perf_counter() - t0)
    return best


def first_push_seconds(mode: str, cpu: bool = False) -> float:
    """A fresh process's server's first push, numba's machinery loaded as it started ("on") or not ("off"), or
    a small server's that adds with numpy ("small"); with `cpu`, the process's CPU seconds by then instead."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", FIRST_PUSH, mode], capture_output=True, text=True, check=True,
                         env=env)
    process_cpu, seconds = map(float, out.stdout.split()[-2:])
    return process_cpu if cpu else seconds


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="rounds of each measurement (the best is kept)")
    ap.add_argument("--no-rounding", action="store_true")
    ap.add_argument("--no-first-push", action="store_true")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "small_costs"))
    args = ap.parse_args(argv)
    result: dict = {}
    if not args.no_rounding:
        best = rounding_seconds(args.repeats)
        result["rounding"] = {"seconds": best, "float16_over_bfloat16": best["float16"] / best["bfloat16"]}
        print(f"rounding 20,000 x 64: bfloat16 {best['bfloat16'] * 1e3:.2f} ms, float16 {best['float16'] * 1e3:.2f} ms "
              f"({result['rounding']['float16_over_bfloat16']:.1f}x)")
    if not args.no_first_push:
        first_push_seconds("on")  # compiles whatever numba's cache lacks (a fresh clone): what is measured is loading
        loaded = min(first_push_seconds("on") for _ in range(args.repeats))
        cold = min(first_push_seconds("off") for _ in range(args.repeats))
        small = min(first_push_seconds("small") for _ in range(args.repeats))
        cpu = {mode: min(first_push_seconds(mode, cpu=True) for _ in range(args.repeats)) for mode in ("on", "small")}
        result["first_push"] = {"loaded_at_start": loaded, "not_loaded": cold, "not_loaded_over_loaded": cold / loaded,
                                "small_numpy": small, "process_cpu": {"compiled": cpu["on"], "small_numpy": cpu["small"]}}
        print(f"a server's first push: {loaded * 1e3:.1f} ms with numba loaded as it started, {cold * 1e3:.1f} ms "
              f"without ({cold / loaded:.0f}x); a small server's (numpy) {small * 1e3:.2f} ms; the process's CPU by "
              f"then {cpu['on']:.2f} s compiled, {cpu['small']:.2f} s small")
    os.makedirs(args.work, exist_ok=True)
    save_json(result, os.path.join(args.work, "small_costs.json"))
    return result


if __name__ == "__main__":
    main()
