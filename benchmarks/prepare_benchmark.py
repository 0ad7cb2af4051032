"""prepare with 1 process and with N, on the same inputs, in one run: time of each pass, peak memory of
every process, bytes written, and whether the corpora are the same (issue 30).

Each run is `doc2vec-dist prepare INPUTS --out DIR/p<N> --parallel N` as its own process, its whole tree
(with a local Ray's raylet and task workers) watched: each process's peak memory and CPU seconds
(ProcessWatch), the tree's peak PSS (memwatch.MemoryWatch). The pass times are corpus.json's
"seconds"; the wall time adds Python's and Ray's start and stop. The corpora are then compared table
by table (docs, vocab, shards: the same tables, record batches apart); it exits 1 if they differ.
DIR/result.json holds every figure.

With --engines tasks data, each run of N > 1 processes is made once by each engine (prepare --engine),
and with --repeat R the whole sequence R times, interleaved (tasks, data, tasks, data), so that a
machine whose load changes meanwhile weighs on both alike.

    python -m doc2vec_dist generate --users 1000000 --urls 200000 --out runs/g1m
    python benchmarks/prepare_benchmark.py runs/g1m --out runs/prepare-bench --parallel 1 2 -- --time-col ts
    python benchmarks/prepare_benchmark.py runs/g1m --out runs/engines --parallel 2 --engines tasks data \
        --repeat 2 -- --time-col ts
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psutil
import pyarrow as pa

from doc2vec_dist.memwatch import MemoryWatch, _Sampler, proc_status, process_tree


class ProcessWatch(_Sampler):
    """Each process of a tree, as last sampled: its CPU seconds (user and system: how much work a run did,
    whatever else the machine ran meanwhile, which stretches the wall time, not this), its peak resident
    memory (the kernel's high-water mark VmHWM) and peak private memory (RssAnon), and what it is:
    the driver (the tree's root), a Ray task worker (titled ray::count, ray::spill, ... while it runs
    a task), or Ray's own machinery by its program's name (raylet, gcs_server, ...)."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(interval)
        self.pid = pid
        self.procs: dict[int, dict] = {}

    def sample(self) -> None:
        for proc in process_tree(self.pid):
            try:
                times = proc.cpu_times()
                title = " ".join(proc.cmdline()[:3])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            status = proc_status(proc.pid, ("VmHWM", "RssAnon"))
            rec = self.procs.setdefault(proc.pid, {"pid": proc.pid, "what": None, "cpu_seconds": 0.0,
                                                   "peak_rss_bytes": 0, "peak_private_bytes": 0, "tasks": set()})
            if proc.pid == self.pid:
                rec["what"] = "driver"
            elif title.startswith("ray::") and not title.split()[0].endswith("Agent"):  # not Ray's agents
                rec["what"] = "task worker"
                if title.split()[0] != "ray::IDLE":
                    rec["tasks"].add(title.split()[0][len("ray::"):])
            elif title and rec["what"] != "task worker":
                # named by what it runs now: a process first seen between fork and exec (an empty command
                # line, or its parent's) takes its program's name once it has one
                rec["what"] = _program(title)
            rec["cpu_seconds"] = max(rec["cpu_seconds"], times.user + times.system)
            rec["peak_rss_bytes"] = max(rec["peak_rss_bytes"], status.get("VmHWM") or 0)
            rec["peak_private_bytes"] = max(rec["peak_private_bytes"], status.get("RssAnon") or 0)

    def table(self) -> list[dict]:
        """The processes, the biggest peak first, each with the tasks it ran."""
        rows = [{**r, "cpu_seconds": round(r["cpu_seconds"], 1), "tasks": sorted(r["tasks"])}
                for r in self.procs.values()]
        return sorted(rows, key=lambda r: -r["peak_rss_bytes"])


def _program(title: str) -> str:
    """A process's program: its executable's name, or the script a Python runs."""
    if title.startswith("ray::"):
        return title.split()[0]
    words = [os.path.basename(w) for w in title.split() if not w.startswith("-")]
    if words and words[0].startswith("python") and len(words) > 1:
        return words[1]
    return words[0] if words else "?"


def run(inputs: list[str], out: str, parallel: int, extra: list[str], engine: str = "tasks") -> dict:
    """One prepare as its own process: wall time, its corpus.json's pass times, every process's peak
    memory and CPU time, and the bytes written."""
    argv = [sys.executable, "-m", "doc2vec_dist", "prepare", *inputs, "--out", out, "--parallel", str(parallel),
            "--overwrite", "--no-progress", *(["--engine", engine] if engine != "tasks" else []), *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
    with MemoryWatch(proc.pid, interval=0.5) as watch, ProcessWatch(proc.pid) as processes:
        output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{output}")
    with open(os.path.join(out, "corpus.json")) as fh:
        meta = json.load(fh)
    written = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(out) for name in names)
    table = processes.table()
    return {"parallel": parallel, "engine": meta.get("engine"), "wall_seconds": round(wall, 1),
            "pass_seconds": meta["seconds"],
            # what the wall time holds besides the passes: Python's and (parallel > 1) Ray's start and stop
            "start_stop_seconds": round(wall - meta["seconds"]["total"], 1),
            "cpu_seconds": round(sum(p["cpu_seconds"] for p in table), 1),
            "peak_total_pss_bytes": watch.peak_total,
            "peak_task_rss_bytes": max([p["peak_rss_bytes"] for p in table if p["what"] in ("driver", "task worker")]),
            "processes": table, "bytes_written": written, "docs": meta["num_docs"], "tokens": meta["num_tokens"],
            "shards": meta["num_shards"]}


def same_corpus(a: str, b: str) -> bool:
    """Every Arrow file of two corpora holds the same table."""
    names = sorted(os.path.relpath(os.path.join(r, n), a) for r, _, ns in os.walk(a) for n in ns if n.endswith(".arrow"))
    for name in names:
        tables = [pa.ipc.open_file(pa.memory_map(os.path.join(d, name))).read_all() for d in (a, b)]
        if not tables[0].equals(tables[1]):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="prepare's inputs")
    ap.add_argument("--out", required=True, help="a directory for the corpora and result.json")
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 2], help="the --parallel of each run")
    ap.add_argument("--engines", nargs="+", default=["tasks"], choices=("tasks", "data"),
                    help="prepare --engine of each run of N > 1 processes, one run each")
    ap.add_argument("--repeat", type=int, default=1, help="the whole sequence of runs this many times, in turn")
    ap.add_argument("--keep", action="store_true", help="keep the corpora (default: removed after comparing)")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    os.makedirs(args.out, exist_ok=True)
    plan = [(parallel, engine, rep) for rep in range(args.repeat) for parallel in args.parallel
            for engine in (args.engines if parallel > 1 else ["tasks"])]
    rows, names = [], []
    for parallel, engine, rep in plan:
        names.append(f"p{parallel}" + (f"-{engine}" if engine != "tasks" else "") + (f"-{rep}" if args.repeat > 1 else ""))
        rows.append({"run": names[-1], **run(args.inputs, os.path.join(args.out, names[-1]), parallel, extra, engine)})
        print(json.dumps(rows[-1]), flush=True)
    first = os.path.join(args.out, names[0])
    for name, row in zip(names[1:], rows[1:]):
        row["same_corpus_as_first"] = same_corpus(first, os.path.join(args.out, name))
        row["speedup"] = round(rows[0]["wall_seconds"] / row["wall_seconds"], 2)
        row["speedup_of_the_passes"] = round(rows[0]["pass_seconds"]["total"] / row["pass_seconds"]["total"], 2)
    result = {"inputs": args.inputs, "extra": extra, "runs": rows}
    with open(os.path.join(args.out, "result.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps({r["run"]: {k: r.get(k) for k in ("wall_seconds", "cpu_seconds", "speedup", "speedup_of_the_passes",
                                                         "peak_task_rss_bytes", "bytes_written", "same_corpus_as_first")}
                      for r in rows}))
    if not all(r.get("same_corpus_as_first", True) for r in rows):
        print("error: the corpora differ", file=sys.stderr)
        return 1
    if not args.keep:
        for name in names:
            shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
