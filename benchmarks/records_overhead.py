"""What training pays for its training log and Ray metrics (issue 52's ≤1%): interleaved `train` commands with
them (A) and without (B: DOC2VEC_DIST_RUN_RECORDS=0, the same code otherwise), pair by pair.

    python benchmarks/records_overhead.py --corpus CORPUS --pairs 6 --epochs 200 --dim 32 --work /tmp/ovh
    python benchmarks/records_overhead.py --corpus CORPUS --pairs 6 --epochs 3 --dim 64 --lock /tmp/d2v-cpu.lock

Each pair runs A and B one after the other (the order alternates: A B, B A, ...), each `train` its own
process with its own local Ray, 2 workers x 1 CPU and 2 servers unless told otherwise; one warm-up pair
first, not counted. With --lock FILE each pair holds that flock (a machine shared with other jobs). The
figure is the run's own tokens/s (its summary: checkpoints not counted; the records are made inside the
epochs, the log lines between them), A/B pair by pair, and the whole command's wall time beside it.
Prints the medians with min and max, and writes WORK/records-overhead-*.json.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from doc2vec_dist import modeldir
from doc2vec_dist.run import RECORDS_ENV


@contextlib.contextmanager
def held(lock: str | None):
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run(args, records: bool) -> dict:
    out = os.path.join(args.work, "model-a" if records else "model-b")
    command = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", args.corpus, "--out", out, "--overwrite",
               "--no-progress", "--epochs", str(args.epochs), "--dim", str(args.dim), "--num-workers",
               str(args.workers), "--num-ps", str(args.servers), "--cpus-per-worker", "1"]
    env = {**os.environ, RECORDS_ENV: "1" if records else "0", "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    summary = modeldir.ModelDir(out).settings()["summary"]
    logged = os.path.exists(os.path.join(out, "training.jsonl"))
    assert logged == records, f"{out}: training log {'missing' if records else 'written'}"
    return {"tokens_per_second": summary["tokens_per_second"], "train_seconds": summary["train_seconds"],
            "wall": wall}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}..{max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--work", default="/tmp/records-overhead")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--lock", help="a flock held for each pair")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    pairs = []
    for p in range(args.pairs + 1):  # the first pair warms up: not counted
        order = (True, False) if p % 2 == 0 else (False, True)
        with held(args.lock):
            got = {records: run(args, records) for records in order}
        if p == 0:
            continue
        a, b = got[True], got[False]
        pair = {"a": a, "b": b, "ratio": a["tokens_per_second"] / b["tokens_per_second"], "wall_ratio": a["wall"] / b["wall"]}
        pairs.append(pair)
        print(f"pair {p}: A {a['tokens_per_second'] / 1e6:.3f}M tok/s ({a['train_seconds']:.2f}s) "
              f"B {b['tokens_per_second'] / 1e6:.3f}M ({b['train_seconds']:.2f}s)  A/B {pair['ratio']:.3f}  "
              f"wall A/B {pair['wall_ratio']:.3f}", flush=True)
    result = {"corpus": args.corpus, "epochs": args.epochs, "dim": args.dim, "pairs": pairs,
              "tokens_per_second_a": statistics.median(p["a"]["tokens_per_second"] for p in pairs),
              "tokens_per_second_b": statistics.median(p["b"]["tokens_per_second"] for p in pairs),
              "train_seconds_a": statistics.median(p["a"]["train_seconds"] for p in pairs),
              "ratio": spread([p["ratio"] for p in pairs]), "wall_ratio": spread([p["wall_ratio"] for p in pairs])}
    print(f"{args.corpus}, {args.epochs} epochs, dim {args.dim}, {len(pairs)} pairs: tokens/s A "
          f"{result['tokens_per_second_a'] / 1e6:.3f}M, B {result['tokens_per_second_b'] / 1e6:.3f}M; "
          f"A/B {result['ratio']}; whole wall A/B {result['wall_ratio']}")
    path = os.path.join(args.work, f"records-overhead-{os.path.basename(args.corpus.rstrip('/'))}-{args.epochs}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
