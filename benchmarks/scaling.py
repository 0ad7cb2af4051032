"""Scaling: tokens/s of ours over workers and over threads, in one local Ray, beside gensim's threads.

    python benchmarks/scaling.py --users 200000 --urls 100000 --workers 1 2 4 8 --threads 1 2 4 8 16
    python benchmarks/scaling.py --corpus CORPUS --workers 1 2 --threads 1 2 --epochs 2     # this 2-core machine

Two series on the same corpus (generated under --workdir and reused, or given), PV-DBOW, dim 100,
negative 5, sample 0 unless flags say otherwise:

  workers   W workers of --cpus-per-worker CPUs each (the block schedule from 2 workers on): tokens/s,
            parallel efficiency (tokens/s ÷ (W × one worker's)), where the workers' time went, the
            servers' busy seconds, and the bytes moved per token (the workers' counters) beside
            `plan`'s prediction of them; with --through-servers each W > 1 again with its blocks going
            home through the servers at each round's end and pulled again (settings.HANDOVER_ENV=0, the
            path before the blocks were handed from worker to worker);
  threads   one worker with T threads (--cpus-per-worker T), beside gensim (corpus_file mode, its
            fastest) with T threads.

Every figure is the training alone (the trainer's own clock), one run each, after a warm-up run on
a tiny corpus (numba compiles its kernels once per machine). The local Ray gets as
many logical CPUs as the largest point needs (the --num-ps servers reserve none). Prints a table and
writes JSON (--json). Quality is not measured here: benchmarks/quality.py --workers does that.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from benchmark import worker_split
from harness import save_json

from doc2vec_dist.cli import add_config_flags
from doc2vec_dist.config import TrainConfig, build, load_yaml
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.run import time_split


def run_ours(corpus: str, work: str, config: TrainConfig, label: str) -> dict:
    from doc2vec_dist.trainer import train

    t0 = time.perf_counter()
    s = train(corpus, os.path.join(work, f"model-{label}"), config, overwrite=True)
    busy = sum(s["worker_seconds"].values()) or 1.0
    return {"tokens_per_second": s["tokens_per_second"], "train_seconds": s["train_seconds"],
            "wall_seconds": time.perf_counter() - t0, "split": {k: v / busy for k, v in s["worker_seconds"].items()},
            "worker_seconds": s["worker_seconds"],
            "bytes_per_token": s["bytes_per_token"], "server_busy_seconds": s.get("server_busy_seconds")}


def run_gensim(corpus: str, work: str, config: TrainConfig, threads: int) -> dict:
    from doc2vec_dist.baseline import train_gensim

    s = train_gensim(corpus, os.path.join(work, f"gensim-{threads}"), config, workers=threads, overwrite=True,
                     gensim_mode="corpus_file")
    return {"tokens_per_second": s["tokens_per_second"], "train_seconds": s.get("train_seconds")}


def main(argv: list[str] | None = None) -> dict:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="a prepared corpus (default: a synthetic one, made under --workdir)")
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--urls", type=int, default=100_000)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "runs", "scaling"))
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4, 8], help="worker counts (none: skip)")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2, 4, 8, 16],
                    help="thread counts of one worker and of gensim (none: skip)")
    ap.add_argument("--no-gensim", action="store_true", help="threads of ours only")
    ap.add_argument("--through-servers", action="store_true",
                    help="also run each W > 1 with the blocks going home through the servers each round")
    ap.add_argument("--no-warmup", action="store_true",
                    help="measure from the first run (by default a tiny corpus trains first, so that numba's "
                         "kernels are compiled and cached before any timed run)")
    ap.add_argument("--network-gbps", type=float, default=10.0, help="for plan's predicted bytes (none here)")
    ap.add_argument("--json", help="default: WORKDIR/scaling.json")
    ap.add_argument("--config", help="YAML of training flags")
    add_config_flags(ap, TrainConfig)
    ap.set_defaults(epochs=3, sample=0.0, cpus_per_worker=1, checkpoint_every=0.0)
    args = ap.parse_args(argv)
    base = build(TrainConfig, load_yaml(args.config) if args.config else {}, vars(args))
    base = dataclasses.replace(base, progress=False)
    os.makedirs(args.workdir, exist_ok=True)
    if args.corpus:
        corpus = args.corpus
    else:
        from compare import synthetic

        corpus = synthetic(args.workdir, args.users, args.urls, seed=1, progress=False)[0]

    import ray
    from harness import local_ray

    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.plan_model import bytes_per_token
    from doc2vec_dist.settings import resolve

    found = Corpus(corpus)
    cpus = max([w * base.cpus_per_worker for w in args.workers] + list(args.threads) + [os.cpu_count() or 1])
    started = local_ray(cpus)  # (a caller's Ray is used as it is)
    result: dict = {"corpus": {"path": found.path, "docs": found.num_docs, "tokens": found.num_tokens,
                               "vocab": found.vocab_size}, "config": dataclasses.asdict(base), "cpus": os.cpu_count(),
                    "workers": [], "threads": []}
    partial = (args.json or os.path.join(args.workdir, "scaling.json")) + ".partial"
    try:
        if not args.no_warmup:  # numba compiles each kernel once per machine (its cache): not in a measured run
            from compare import synthetic

            tiny = synthetic(args.workdir, 2000, 500, seed=2, progress=False)[0]
            for w in sorted({1, 2} & set(args.workers or [1])):
                run_ours(tiny, args.workdir, dataclasses.replace(base, num_workers=w, epochs=1), f"warmup{w}")
        for w in args.workers:
            config = dataclasses.replace(base, num_workers=w)
            row = {"workers": w, **run_ours(corpus, args.workdir, config, f"w{w}"),
                   "planned_bytes_per_token": bytes_per_token(found, config, w),
                   "segments": resolve(config, found).segments}  # the default's, unless --config gives them
            if args.through_servers and w > 1:
                from doc2vec_dist.settings import HANDOVER_ENV

                os.environ[HANDOVER_ENV] = "0"
                try:
                    row["through_servers"] = run_ours(corpus, args.workdir, config, f"w{w}-servers")
                finally:
                    del os.environ[HANDOVER_ENV]
                print(f"[scaling] {w} worker(s), blocks through the servers: "
                      f"{row['through_servers']['tokens_per_second'] / 1e6:.3f}M tokens/s; "
                      f"worker time {worker_split(row['through_servers']['worker_seconds'])}", file=sys.stderr, flush=True)
            result["workers"].append(row)
            # the split said at once and the figures saved after each run: a run killed by a time limit (the
            # GPU machine's) keeps what it measured
            print(f"[scaling] {w} worker(s), {row['segments']} segment(s): {row['tokens_per_second'] / 1e6:.3f}M tokens/s; "
                  f"worker time {worker_split(row['worker_seconds'])}", file=sys.stderr, flush=True)
            save_json(result, partial, say=False)
        for t in args.threads:
            config = dataclasses.replace(base, num_workers=1, cpus_per_worker=t)
            same = [r for r in result["workers"] if r["workers"] == 1 and base.cpus_per_worker == t]
            row = {"threads": t, "ours": same[0] if same else run_ours(corpus, args.workdir, config, f"t{t}")}
            if not args.no_gensim:
                row["gensim"] = run_gensim(corpus, args.workdir, config, t)
            result["threads"].append(row)
            print(f"[scaling] {t} thread(s): ours {row['ours']['tokens_per_second'] / 1e6:.3f}M tokens/s"
                  + (f", gensim {row['gensim']['tokens_per_second'] / 1e6:.3f}M" if "gensim" in row else ""),
                  file=sys.stderr, flush=True)
            save_json(result, partial, say=False)
    finally:
        if started:
            ray.shutdown()
    if result["workers"]:
        one = result["workers"][0]["tokens_per_second"] / result["workers"][0]["workers"]
        for row in result["workers"]:
            row["efficiency"] = row["tokens_per_second"] / (row["workers"] * one)
            if "through_servers" in row:
                row["through_servers"]["efficiency"] = row["through_servers"]["tokens_per_second"] / (row["workers"] * one)
    print(report(result))
    save_json(result, args.json or os.path.join(args.workdir, "scaling.json"))
    if os.path.exists(partial):
        os.remove(partial)
    return result


def report(r: dict) -> str:
    c = r["corpus"]
    lines = [(f"scaling: {c['path']} ({c['docs']:,} docs, {c['tokens']:,} tokens, vocabulary {c['vocab']:,}); "
              f"{r['cpus']} cores; {r['config']['epochs']} epochs")]
    if r["workers"]:
        lines.append(f"{'workers':>8} {'tokens/s':>10} {'efficiency':>11} {'bytes/token':>12} {'planned':>8} "
                     f"{'servers busy':>13}  worker time")
        for row in r["workers"]:
            measured = sum(row["bytes_per_token"].values())
            planned = sum(row["planned_bytes_per_token"].values())
            lines.append(f"{row['workers']:>8} {row['tokens_per_second'] / 1e6:>9.3f}M {row['efficiency']:>11.2f} "
                         f"{measured:>12.1f} {planned:>8.1f} {row['server_busy_seconds'] or 0:>12.1f}s  "
                         f"{time_split(row['worker_seconds'])}")
            if "through_servers" in row:
                o = row["through_servers"]
                lines.append(f"{'(servers)':>8} {o['tokens_per_second'] / 1e6:>9.3f}M {o['efficiency']:>11.2f} "
                             f"{sum(o['bytes_per_token'].values()):>12.1f} {'':>8} {o['server_busy_seconds'] or 0:>12.1f}s  "
                             f"{time_split(o['worker_seconds'])}")
    if r["threads"]:
        lines.append(f"{'threads':>8} {'ours':>10} {'gensim':>10} {'ours/gensim':>12}")
        for row in r["threads"]:
            ours = row["ours"]["tokens_per_second"]
            theirs = row.get("gensim", {}).get("tokens_per_second")
            lines.append(f"{row['threads']:>8} {ours / 1e6:>9.3f}M "
                         + (f"{theirs / 1e6:>9.3f}M {ours / theirs:>12.2f}" if theirs else f"{'-':>10} {'-':>12}"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
