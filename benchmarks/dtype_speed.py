"""The tables' dtypes against each other on one corpus, interleaved: training tokens/s and the host feed.

    python benchmarks/dtype_speed.py --corpus CORPUS --rounds 3                     # float32, bfloat16, float16
    python benchmarks/dtype_speed.py --corpus CORPUS --rounds 3 --dtypes float32 bfloat16 --epochs 2
    python benchmarks/dtype_speed.py --corpus CORPUS --rounds 6 --no-train           # the host feed alone

Each round trains the corpus once per dtype, one after another (`doc2vec-dist train`, its own local Ray,
the default settings otherwise), then gensim's fastest mode (corpus_file, all cores) once, so that a
machine's drift during the run falls on every dtype alike and the ratio to gensim is of the same
minutes. Then, per dtype and round, the host feed of one worker without the kernel over --feed-epochs epochs
(benchmarks/feed_rate.py: pulls, pushes and building the examples, the ceiling a device could be fed
at). Prints the mean and spread per dtype and each one's ratio to float32 and to gensim; writes JSON.
Speed needs a quiet machine: nothing else running.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from compare import run_trainer, write_config
from harness import save_json
from scaling import run_gensim

from doc2vec_dist.config import TrainConfig
from doc2vec_dist.logs import to_terminal

DTYPES = ("float32", "bfloat16", "float16")


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean / 1e6:.3f}M ± {statistics.pstdev(values) / 1e6:.3f}M"


def report(r: dict) -> str:
    base = statistics.fmean(r["train"]["float32"]) if r["train"].get("float32") else None
    gensim = statistics.fmean(r["gensim"]) if r["gensim"] else None
    feed_base = statistics.fmean(r["feed"]["float32"]) if r["feed"].get("float32") else None
    lines = [f"corpus {r['corpus']}: {r['tokens']:,} tokens, {r['epochs']} epoch(s), {r['rounds']} round(s), "
             f"interleaved; gensim corpus_file {r['gensim_threads']} thread(s)"
             + (f" {gensim / 1e6:.3f}M tokens/s" if gensim else ""), "",
             "| dtype | train tokens/s (mean ± sd) | vs float32 | vs gensim | feed tokens/s, no kernel | feed vs float32 |",
             "|---|---|---|---|---|---|"]
    for dtype, values in r["train"].items():
        mean = statistics.fmean(values) if values else None
        feed = r["feed"].get(dtype) or []
        lines.append(f"| {dtype} | " + (f"{spread(values)} | {mean / base:.2f}× | " if mean and base else "- | - | ")
                     + (f"{mean / gensim:.2f}×" if gensim and mean else "-") + " | "
                     + (f"{spread(feed)} | {statistics.fmean(feed) / feed_base:.2f}×" if feed and feed_base else "- | -")
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a prepared corpus")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--gensim-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-gensim", action="store_true")
    ap.add_argument("--no-feed", action="store_true")
    ap.add_argument("--no-train", action="store_true", help="the feed only (and no gensim)")
    ap.add_argument("--feed-epochs", type=int, default=4,
                    help="epochs each feed run times, after one untimed (default 4: one epoch of the 200k "
                         "corpus is a quarter of a second's feed, where a hiccup of Ray's is a large share)")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "dtype_speed"))
    ap.add_argument("--json", help="default: WORK/dtype_speed.json")
    args = ap.parse_args(argv)
    from doc2vec_dist.corpus import Corpus

    corpus = os.path.abspath(args.corpus)
    os.makedirs(args.work, exist_ok=True)
    config = TrainConfig(epochs=args.epochs, progress=False, checkpoint_every=0.0)
    result: dict = {"corpus": corpus, "tokens": Corpus(corpus).num_tokens * args.epochs, "epochs": args.epochs,
                    "rounds": args.rounds, "gensim_threads": args.gensim_threads, "machine": f"{os.cpu_count()} cores",
                    "train": {d: [] for d in args.dtypes}, "feed": {}, "gensim": []}
    for r in range(0 if args.no_train else args.rounds):
        for dtype in args.dtypes:
            path = write_config(dataclasses.replace(config, dtype=dtype), os.path.join(args.work, f"{dtype}.yaml"))
            run = run_trainer("train", corpus, os.path.join(args.work, f"model-{dtype}"), path, [])
            result["train"][dtype].append(run["tokens_per_second"])
            print(f"[dtype_speed] round {r + 1}: {dtype} {run['tokens_per_second'] / 1e6:.3f}M tokens/s",
                  file=sys.stderr, flush=True)
        if not args.no_gensim:
            g = run_gensim(corpus, args.work, config, args.gensim_threads)["tokens_per_second"]
            result["gensim"].append(g)
            print(f"[dtype_speed] round {r + 1}: gensim {g / 1e6:.3f}M tokens/s", file=sys.stderr, flush=True)
    if not args.no_feed:
        import ray
        from feed_rate import feed
        from harness import local_ray

        started_here = local_ray(max(os.cpu_count() or 1, config.num_ps + 1), logging_level="ERROR",
                                 log_to_driver=False)
        try:
            for r in range(args.rounds):
                for dtype in args.dtypes:
                    one = dataclasses.replace(config, dtype=dtype, num_workers=1, epochs=args.feed_epochs + 1)
                    rate = feed(corpus, one, kernel=False, timed=args.feed_epochs)["tokens_per_second"]
                    result["feed"].setdefault(dtype, []).append(rate)
                    print(f"[dtype_speed] feed round {r + 1}: {dtype} {rate / 1e6:.2f}M tokens/s", file=sys.stderr,
                          flush=True)
        finally:
            if started_here:
                ray.shutdown()
    print(report(result))
    save_json(result, args.json or os.path.join(args.work, "dtype_speed.json"))
    return result


if __name__ == "__main__":
    main()
