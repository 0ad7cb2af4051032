"""Training over capped links: tokens/s and bytes per trained token, in a cluster of network namespaces.

    python benchmarks/network_benchmark.py --corpus CORPUS --gbps 0 10 1 0.1 --workers 1 2 --epochs 2
    python benchmarks/network_benchmark.py --corpus CORPUS --gbps 1 --workers 1 --epochs 1 --json net.json
    python benchmarks/network_benchmark.py --corpus CORPUS --gbps 0 0.1 --workers 1 --dtypes float32 bfloat16

For each worker count W, one cluster of network namespaces (benchmarks/netcluster.py): the head, two `ps`
nodes holding one parameter server each, and W `trainer` nodes holding one worker each, every node
on a link of its own. That is the layout `plan`'s network bound assumes: a link per worker and one
per server. Then, for each rate (0: uncapped), every link is capped with tc's `tbf` and the same
training job runs by `ray job submit`, as a user would. Per run:

  - tokens/s, the trainer's own clock (training alone, not Ray's start-up);
  - bytes per trained token the workers moved to and from the servers (the engine's counters,
    client.TRAFFIC, in the model's summary);
  - bytes per trained token on the links (each node's `ip -s link` counters around the job: the
    trainer nodes' and the ps nodes' sent + received; this includes the job's start-up: its code,
    the servers' initial rows, Ray's own traffic);
  - `plan`'s network-bound tokens/s for that link rate (its bytes per token over a link per worker
    and one per server), and its expected rate as plan combines the bounds (streamed rows overlap
    compute, held rows add to it), with what the same cluster trained uncapped as the compute
    bound; measured ÷ expected.

The link has a namespace's sub-millisecond latency: tc's `netem` does not exist on these kernels, so
no delay is added and every figure here is bandwidth-bound, never latency-bound. gensim (corpus_file,
its fastest mode, as many threads as the trainer nodes have CPUs) trains the same corpus in the same
run on the machine itself, for the ratio. Needs root (namespaces, tc). Prints a markdown table and
writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import netcluster
from harness import save_json

from doc2vec_dist.config import TrainConfig
from doc2vec_dist.logs import to_terminal


def planned(corpus_path: str, config: TrainConfig, workers: int, gbps: float) -> dict:
    """plan's bytes per token (by kind) and network-bound tokens/s for W workers over links of `gbps`."""
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.plan_model import macro_batch_profile, scaling_plan

    corpus = Corpus(corpus_path)
    config = dataclasses.replace(config, num_workers=workers)
    row = scaling_plan(corpus, config, None, gbps or 1.0, macro_batch_profile(corpus, config), workers=(workers,))[0]
    return {"bytes_per_token": row["total_bytes_per_token"], "bytes": row["bytes_per_token"],
            "network": row["rates"]["network"] if gbps else None,
            "links": min(workers, config.num_ps) * (gbps or 1.0) * 1e9 / 8}


def train_args(corpus: str, out: str, config: TrainConfig, workers: int, cpus: int) -> list[str]:
    return ["python", "-m", "doc2vec_dist", "train", "--corpus", corpus, "--out", out, "--no-progress",
            "--epochs", str(config.epochs), "--num-ps", str(config.num_ps), "--num-workers", str(workers),
            "--cpus-per-worker", str(cpus), "--seed", str(config.seed), "--checkpoint-every", "0",
            "--dtype", config.dtype]


def run_one(cluster: netcluster.NetCluster, corpus: str, work: str, config: TrainConfig, workers: int, cpus: int,
            gbps: float, label: str = "") -> dict:
    for node in cluster.nodes:
        cluster.cap(node.name, gbps or None)
    label = label or f"w{workers}-{config.dtype}-{gbps:g}"
    out, log_path = os.path.join(work, f"model-{label}"), os.path.join(work, f"job-{label}.log")
    before = cluster.counters()
    t0 = time.monotonic()
    rc, text = cluster.run_job(train_args(corpus, out, config, workers, cpus), log_path)
    wall = time.monotonic() - t0
    moved = netcluster.traffic(before, cluster.counters())
    if rc != 0:
        raise RuntimeError(f"the job at {gbps:g} Gbit/s with {workers} worker(s) failed (log {log_path}):\n"
                           + text[-3000:])
    with open(os.path.join(out, "config.json")) as fh:
        s = json.load(fh)["summary"]
    tokens = s["tokens"]

    def link_bytes(role: str) -> int:
        return sum(t["tx_bytes"] + t["rx_bytes"] for name, t in moved.items() if role in cluster.node(name).roles)

    plan = planned(corpus, config, workers, gbps)
    return {"workers": workers, "dtype": config.dtype, "gbps": gbps, "tokens": tokens, "tokens_per_second": s["tokens_per_second"],
            "train_seconds": s["train_seconds"], "job_seconds": wall,
            "engine_bytes_per_token": sum(s["bytes"].values()) / tokens,
            "trainer_link_bytes_per_token": link_bytes("trainer") / tokens,
            "ps_link_bytes_per_token": link_bytes("ps") / tokens,
            "links": moved, "planned_bytes_per_token": plan["bytes_per_token"], "planned_network": plan["network"],
            "planned_bytes": plan["bytes"], "planned_link_bytes_per_second": plan["links"],
            "worker_seconds": s["worker_seconds"]}


def expected(rows: list[dict]) -> None:
    """Each capped row's expected rate, as plan combines its bounds (plan_model.expected_rate): its network
    rate, and for compute what the same cluster trained uncapped; and measured ÷ expected."""
    from doc2vec_dist.plan_model import expected_rate

    for row in rows:
        free = [r["tokens_per_second"] for r in rows
                if r["workers"] == row["workers"] and r["dtype"] == row["dtype"] and not r["gbps"]]
        if row["gbps"] and row["planned_network"]:
            rates = {"compute": free[0] if free else None, "servers": None, "network": row["planned_network"]}
            row["expected"], row["bound"] = expected_rate(rates, row["planned_bytes"],
                                                           row["planned_link_bytes_per_second"])
            row["measured_over_expected"] = row["tokens_per_second"] / row["expected"]


def report(r: dict) -> str:
    g = r.get("gensim")
    lines = [f"corpus {r['corpus']}: {r['tokens']:,} tokens, {r['epochs']} epoch(s); links capped with tbf, no "
             "added delay (netem does not exist here)" + (f"; gensim corpus_file {g['threads']} thread(s) "
                                                          f"{g['tokens_per_second'] / 1e6:.3f}M tokens/s" if g else ""),
             "",
             ("| workers | dtype | link | tokens/s | vs gensim | engine B/token | trainer links B/token | ps links B/token "
             "| plan B/token | plan network bound | expected (bound) | measured/expected |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["runs"]:
        link = f"{row['gbps']:g} Gbit/s" if row["gbps"] else "uncapped"
        ratio = f"{row['tokens_per_second'] / g['tokens_per_second']:.2f}×" if g else "-"
        bound = f"{row['planned_network'] / 1e6:.3f}M" if row["planned_network"] else "-"
        want = (f"{row['expected'] / 1e6:.3f}M ({row['bound']}) | {row['measured_over_expected']:.2f}"
                if row.get("expected") else "- | -")
        lines.append(f"| {row['workers']} | {row['dtype']} | {link} | {row['tokens_per_second'] / 1e6:.3f}M | {ratio} "
                     f"| {row['engine_bytes_per_token']:.1f} | {row['trainer_link_bytes_per_token']:.1f} "
                     f"| {row['ps_link_bytes_per_token']:.1f} | {row['planned_bytes_per_token']:.1f} | {bound} "
                     f"| {want} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a prepared corpus (its path must be readable from every node: "
                                                    "the namespaces share this machine's files)")
    ap.add_argument("--gbps", type=float, nargs="+", default=[0, 10, 1, 0.1],
                    help="link rates in Gbit/s, 0 for uncapped (default: 0 10 1 0.1)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, one trainer node each")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                    help="CPUs of all the trainer nodes together, split evenly among the workers (default: all)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--num-ps", type=int, default=2, help="parameter servers, one `ps` node each (default: 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                    help="the tables' dtypes, each run at every rate in the same cluster (default: float32)")
    ap.add_argument("--no-gensim", action="store_true")
    ap.add_argument("--no-warmup", action="store_true",
                    help="time from the cluster's first job (by default a one-epoch job runs first, untimed: numba "
                         "compiles its kernels in each cluster's copy of the code)")
    ap.add_argument("--work", help="models and job logs (default: a new temporary folder)")
    ap.add_argument("--warmup-corpus", help="the corpus of the untimed first job (default: --corpus; a small one "
                                            "saves an epoch of a large corpus)")
    ap.add_argument("--ps-memory-gib", type=float, default=4.0,
                    help="Ray `memory` of each ps node, GiB: at least its server's slice of the tables (plan says)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    why = netcluster.available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)
    from doc2vec_dist.corpus import Corpus

    corpus = os.path.abspath(args.corpus)
    found = Corpus(corpus)
    config = TrainConfig(epochs=args.epochs, num_ps=args.num_ps, seed=args.seed, progress=False)
    work = args.work or tempfile.mkdtemp(prefix="network-benchmark-")
    os.makedirs(work, exist_ok=True)
    result: dict = {"corpus": corpus, "tokens": found.num_tokens, "epochs": args.epochs, "runs": [],
                    "machine": f"{os.cpu_count()} cores, {os.uname().nodename}"}
    for w in args.workers:
        cpus = max(1, args.cpus // w)
        nodes = ["head"] + ["ps"] * args.num_ps + ["trainer"] * w
        with netcluster.NetCluster(nodes, ps_units=1, trainer_units=1, trainer_cpus=cpus,
                                   ps_memory=int(args.ps_memory_gib * 1024) * netcluster.MiB) as cluster:
            print(f"[network] {w} worker(s), {cpus} CPU(s) each:\n{cluster.describe()}", file=sys.stderr, flush=True)
            if not args.no_warmup:  # numba compiles its kernels in each new cluster's copy of the code: not timed
                warm = os.path.abspath(args.warmup_corpus or corpus)
                run_one(cluster, warm, work, dataclasses.replace(config, epochs=1), w, cpus, 0, f"warmup-w{w}")
            for gbps, dtype in ((g, d) for g in args.gbps for d in args.dtypes):  # the dtypes interleaved
                row = run_one(cluster, corpus, work, dataclasses.replace(config, dtype=dtype), w, cpus, gbps)
                result["runs"].append(row)
                print(f"[network] {w} worker(s), {dtype}, " + (f"{gbps:g} Gbit/s" if gbps else "uncapped") + ": "
                      f"{row['tokens_per_second'] / 1e6:.3f}M tokens/s, {row['trainer_link_bytes_per_token']:.1f} "
                      "B/token on the trainer links", file=sys.stderr, flush=True)
    if not args.no_gensim:
        from scaling import run_gensim

        threads = args.cpus
        result["gensim"] = {"threads": threads, **run_gensim(corpus, work, config, threads)}
    expected(result["runs"])
    print(report(result))
    save_json(result, args.json or os.path.join(work, "network.json"))
    return result


if __name__ == "__main__":
    main()
