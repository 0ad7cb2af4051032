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

The pairs' tokens/s spread by ±10% here, so they cannot show a 1% cost. Each command's processes are
therefore also counted: their CPU seconds read from /proc every 0.1 s (the command and every process
under it: its Ray's daemons, the servers and workers), by kind. The records are made by the driver
alone (no worker or server records anything; a server answers an `info` every metrics.RECORD_SECONDS), so what they cost
shows as A's CPU above B's in the driver, the servers and Ray's daemons (its metrics agent exports
them); the workers' CPU, the bulk of a run and its noise, is reported beside but not counted. The
bound printed is that difference over the CPU seconds training had (the run's train seconds × its CPUs):
what the records could take from the workers if every CPU second of theirs came out of training.
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

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from doc2vec_dist import modeldir
from doc2vec_dist.memwatch import _Sampler, process_tree
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


# a process's kind, by what its command line holds (Ray names its workers `ray::<Actor>`): the first that matches
# (the raylet's names the agent's script among its flags)
KINDS = (("driver", "doc2vec_dist train"), ("servers", "ray::ParameterServer"), ("workers", "ray::Worker"),
         ("raylet", "raylet/raylet"), ("metrics agent", "dashboard/agent.py"), ("metrics agent", "ray::DashboardAgent"),
         ("gcs", "gcs_server"), ("log monitor", "log_monitor"), ("ray other", "ray"))
# what the records can cost: every kind but the workers' (which record nothing) and Ray's idle workers'
COUNTED = ("driver", "servers", "metrics agent", "raylet", "gcs", "log monitor", "ray other", "other")
CPUS = os.cpu_count() or 1


class ProcessCPU(_Sampler):
    """CPU seconds of a process and of every process under it (psutil's tree, as memwatch walks it), read
    every 0.1 s while it runs and summed by kind. A process ending between two reads loses at most its last
    0.1 s: the same for A and B."""

    def __init__(self, root: int, interval: float = 0.1):
        super().__init__(interval)
        self.root = root
        self.seen: dict[tuple[int, float], list] = {}  # (pid, start time) -> [CPU seconds, command line]

    def sample(self) -> None:
        for proc in process_tree(self.root):
            try:
                with proc.oneshot():
                    key, times, cmd = (proc.pid, proc.create_time()), proc.cpu_times(), " ".join(proc.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            entry = self.seen.setdefault(key, [0.0, cmd])
            entry[0] = max(entry[0], times.user + times.system)
            entry[1] = cmd or entry[1]  # a Ray worker takes its actor's title once it has one

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for seconds, cmd in self.seen.values():
            kind = next((k for k, mark in KINDS if mark in cmd), "other")
            if "ray::IDLE" in cmd:
                kind = "ray idle"
            out[kind] = out.get(kind, 0.0) + seconds
        return out


def run(args, records: bool) -> dict:
    out = os.path.join(args.work, "model-a" if records else "model-b")
    command = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", args.corpus, "--out", out, "--overwrite",
               "--no-progress", "--epochs", str(args.epochs), "--dim", str(args.dim), "--num-workers",
               str(args.workers), "--num-ps", str(args.servers), "--cpus-per-worker", "1"]
    env = {**os.environ, RECORDS_ENV: "1" if records else "0", "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with ProcessCPU(proc.pid) as cpu:
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, command)
    wall = time.perf_counter() - t0
    summary = modeldir.ModelDir(out).settings()["summary"]
    logged = os.path.exists(os.path.join(out, "training.jsonl"))
    assert logged == records, f"{out}: training log {'missing' if records else 'written'}"
    return {"tokens_per_second": summary["tokens_per_second"], "train_seconds": summary["train_seconds"],
            "wall": wall, "cpu": cpu.by_kind()}


def kinds(pairs: list[dict]) -> list[str]:
    return sorted({k for p in pairs for run in (p["a"], p["b"]) for k in run["cpu"]})


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}..{fmt.format(max(values))}]"


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
        extra = sum(a["cpu"].get(k, 0.0) for k in COUNTED) - sum(b["cpu"].get(k, 0.0) for k in COUNTED)
        pair = {"a": a, "b": b, "ratio": a["tokens_per_second"] / b["tokens_per_second"], "wall_ratio": a["wall"] / b["wall"],
                "extra_cpu": extra, "bound": extra / (a["train_seconds"] * CPUS)}
        pairs.append(pair)
        print(f"pair {p}: A {a['tokens_per_second'] / 1e6:.3f}M tok/s ({a['train_seconds']:.2f}s) "
              f"B {b['tokens_per_second'] / 1e6:.3f}M ({b['train_seconds']:.2f}s)  A/B {pair['ratio']:.3f}  "
              f"wall A/B {pair['wall_ratio']:.3f}  CPU s A/B: " + ", ".join(
                  f"{k} {a['cpu'].get(k, 0):.2f}/{b['cpu'].get(k, 0):.2f}" for k in sorted(set(a["cpu"]) | set(b["cpu"])))
              + f"  records' CPU {extra:+.2f}s = {pair['bound']:+.2%} of training's", flush=True)
    result = {"corpus": args.corpus, "epochs": args.epochs, "dim": args.dim, "pairs": pairs,
              "tokens_per_second_a": statistics.median(p["a"]["tokens_per_second"] for p in pairs),
              "tokens_per_second_b": statistics.median(p["b"]["tokens_per_second"] for p in pairs),
              "train_seconds_a": statistics.median(p["a"]["train_seconds"] for p in pairs),
              "ratio": spread([p["ratio"] for p in pairs]), "wall_ratio": spread([p["wall_ratio"] for p in pairs]),
              "extra_cpu_seconds": spread([p["extra_cpu"] for p in pairs], "{:+.2f}"),
              "bound": spread([p["bound"] for p in pairs], "{:+.2%}"), "cpus": CPUS,
              "cpu_by_kind_a": {k: statistics.median(p["a"]["cpu"].get(k, 0.0) for p in pairs) for k in kinds(pairs)},
              "cpu_by_kind_b": {k: statistics.median(p["b"]["cpu"].get(k, 0.0) for p in pairs) for k in kinds(pairs)}}
    print(f"{args.corpus}, {args.epochs} epochs, dim {args.dim}, {len(pairs)} pairs: tokens/s A "
          f"{result['tokens_per_second_a'] / 1e6:.3f}M, B {result['tokens_per_second_b'] / 1e6:.3f}M; "
          f"A/B {result['ratio']}; whole wall A/B {result['wall_ratio']}")
    print("CPU seconds by kind, median A / B: " + ", ".join(
        f"{k} {result['cpu_by_kind_a'][k]:.2f}/{result['cpu_by_kind_b'][k]:.2f}" for k in sorted(result["cpu_by_kind_a"])))
    print(f"records' CPU (A - B, every kind but the workers'): {result['extra_cpu_seconds']} s a run; over training's "
          f"CPU seconds (train seconds x {CPUS} CPUs): {result['bound']}")
    path = os.path.join(args.work, f"records-overhead-{os.path.basename(args.corpus.rstrip('/'))}-{args.epochs}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
