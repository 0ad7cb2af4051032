"""URL normalisation measured (issue 47, item 5): a messy log, prepared as written and by the rule.

    python benchmarks/messy_urls.py                       # 10k users × 15k URLs, seeds 1 2 3 (a minute on 2 cores)
    python benchmarks/messy_urls.py --quick               # a smoke run: 1,500 users, 2 epochs, seed 1
    python benchmarks/messy_urls.py --users 200000 --urls 50000 --seeds 1
    python benchmarks/messy_urls.py --time-prepare 3 --users 200000 --urls 50000   # what the rule costs prepare

Steps, in one process and one local Ray:

  generate  `generate --users U --urls M` (seed 0): browsing events with planted communities, so each
            user has a label (truth/users.parquet: community)
  mess      every event's URL rewritten, with probability --messy (seeded), into one of the ways a log
            writes the same page: host upper-cased, a trailing slash (the root without its slash), an
            anchor (#comments), a utm_source parameter, the default port (:443), an unreserved character
            %-escaped (- as %2D; the root's scheme upper-cased). www. is left alone: the rule keeps it by
            default (urls.py says why)
  per seed  prepare the messy log twice, --no-normalize and the default rule (--holdout 0.2, the seed's
            split), train each with the same settings and seed, and score each: held-out recall@10
            (evaluate --heldout: the hidden pairs of its own corpus) and 10-NN label accuracy of the
            communities (evaluate --labels, its fixed 80/20 split)

Prints pages against words (the distinct pages of the log, and each corpus's vocabulary), then each
figure by seed with the mean and spread (max − min), and writes it all as JSON (--json). The messy log
and the generated events stay under --work and are reused by a run of the same sizes.

--time-prepare R instead times `prepare` (this process, --time-col ts, no hold-out) with --no-normalize
and with the rule, in turn, R times each, on data/sample, the generated log and the messy one: the median
of corpus.json's "seconds" (in all, and each pass's: count, partition, shards).

As written, a page's held-out visit is one of its written forms, and the model must name that form to
score: the figure is what a user of the raw corpus gets, not a bound on the model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package

from doc2vec_dist.runners import calm_openmp

calm_openmp()  # before faiss is imported

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import to_terminal

WAYS = ("host case", "trailing slash", "anchor", "utm_source", "default port", "escaped")
# share of events written another way: 0.2 gives about the log (14,847 pages as 33,840 words: 2.3 forms
# a page), the page's own form the most common, as in a log
MESSY = 0.2
TRAIN = {"dim": 100, "epochs": 10, "num_ps": 1, "num_workers": 1, "cpus_per_worker": 2, "progress": False}


def written_otherwise(url: str, way: str) -> str:
    """`url` (as `generate` writes it: https://host/ or https://host/section/slug) written one other way."""
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    path = "/" + path
    root = path == "/"
    if way == "host case":
        return f"{scheme}://{host.upper()}{path}"
    if way == "trailing slash":
        return f"{scheme}://{host}" if root else f"{url}/"
    if way == "anchor":
        return f"{url}#comments"
    if way == "utm_source":
        return f"{url}?utm_source=newsletter"
    if way == "default port":
        return f"{scheme}://{host}:443{path}"
    if way == "escaped":
        return f"{scheme.upper()}://{host}{path}" if root or "-" not in path else url.replace("-", "%2D", 1)
    raise ValueError(way)


def messy_log(generated: str, out: str, messy: float, seed: int = 0) -> dict:
    """The generated events with each URL written another way with probability `messy` (one of WAYS, at
    random): written to `out` (Parquet); returns the log's pages and written forms."""
    events = pq.read_table(os.path.join(generated, "events"))
    encoded = pc.dictionary_encode(events["url"].combine_chunks())
    pages = encoded.dictionary.to_pylist()
    forms = pa.array([written_otherwise(url, way) for url in pages for way in WAYS])  # page p, way w: p * len + w
    rng = np.random.default_rng(seed)
    page = encoded.indices.to_numpy()
    way = rng.integers(0, len(WAYS), size=len(page))
    other = rng.random(len(page)) < messy
    written = pc.if_else(pa.array(other), forms.take(pa.array(page * len(WAYS) + way)),
                         encoded.dictionary.take(encoded.indices))
    pq.write_table(events.set_column(events.schema.get_field_index("url"), "url", written), out)
    return {"events": len(page), "pages": len(pages), "written_forms": len(pc.unique(written)),
            "rewritten": int(other.sum())}


def run_seed(seed: int, log: str, labels: str, work: str, train: dict) -> dict:
    from doc2vec_dist.evaluate import heldout_metrics, labels_metrics
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.trainer import train as train_model

    found = {}
    for name, rule in (("as written", {"no_normalize": True}), ("normalised", {})):
        where = os.path.join(work, f"seed{seed}-{'raw' if rule else 'norm'}")
        shutil.rmtree(where, ignore_errors=True)
        heldout = os.path.join(where, "heldout.parquet")
        t = time.perf_counter()
        corpus = prepare([log], os.path.join(where, "corpus"), PrepareConfig(
            time_col="ts", holdout=0.2, holdout_out=heldout, seed=seed, **rule), progress=False)
        prepared = time.perf_counter() - t
        t = time.perf_counter()
        train_model(corpus.path, os.path.join(where, "model"), TrainConfig(**train, seed=seed))
        trained = time.perf_counter() - t
        model = os.path.join(where, "model")
        h = heldout_metrics(model, heldout, k=10, max_users=None)
        lab = labels_metrics(model, labels, k=10, key_col="user_id", label_col="community")
        found[name] = {"words": corpus.vocab_size, "read_words": corpus.meta["distinct_tokens"]["read"],
                       "recall@10": h["model_recall@10"], "popularity_recall@10": h["popularity_recall@10"],
                       "knn_accuracy@10": lab["knn_accuracy@10"],
                       "prepare_seconds": prepared, "train_seconds": trained}
        shutil.rmtree(where)
    return {"seed": seed, **found}


def time_prepare(inputs: dict[str, str], repeat: int, work: str) -> list[dict]:
    """prepare's seconds (corpus.json's) with --no-normalize and with the rule, in turn, `repeat` times each."""
    from doc2vec_dist.prepare import prepare

    rows = []
    for name, path in inputs.items():
        found: dict[str, list[dict]] = {"--no-normalize": [], "the rule": []}
        for _ in range(repeat):
            for mode, runs in found.items():
                out = os.path.join(work, "timed-corpus")
                shutil.rmtree(out, ignore_errors=True)
                corpus = prepare([path], out, PrepareConfig(time_col="ts", no_normalize=mode == "--no-normalize"),
                                 progress=False)
                runs.append({**corpus.meta["seconds"], "words": corpus.vocab_size,
                                    "read": corpus.meta["distinct_tokens"]["read"], "events": corpus.num_tokens})
                shutil.rmtree(out)
        for mode, runs in found.items():
            rows.append({"input": name, "mode": mode, "events": runs[0]["events"], "read": runs[0]["read"],
                         "words": runs[0]["words"], "runs": [r["total"] for r in runs],
                         **{k: statistics.median(r[k] for r in runs)
                            for k in ("total", "count", "partition", "shards")}})
    return rows


def time_table(rows: list[dict]) -> str:
    lines = [(f"{'input':<34}{'mode':<16}{'events':>11}{'as read → words':>20}{'total':>9}{'count':>8}"
              f"{'partition':>10}{'shards':>9}")]
    for r in rows:
        lines.append(f"{r['input']:<34}{r['mode']:<16}{r['events']:>11,}{r['read']:>10,} → {r['words']:<7,}"
                     f"{r['total']:>8.2f}s{r['count']:>7.2f}s{r['partition']:>9.2f}s{r['shards']:>8.2f}s")
    return "\n".join(lines)


def table(results: list[dict], log: dict) -> str:
    lines = [(f"messy log: {log['events']:,} events of {log['pages']:,} pages, {log['rewritten']:,} written another "
             f"way; {log['written_forms']:,} written forms"),
             (f"words: as written {results[0]['as written']['words']:,}, normalised "
             f"{results[0]['normalised']['words']:,} (pages {log['pages']:,})"), ""]
    seeds = [r["seed"] for r in results]
    lines.append(f"{'':<28}" + "".join(f"{'seed ' + str(s):>10}" for s in seeds) + f"{'mean':>10}{'spread':>10}")
    for metric in ("recall@10", "knn_accuracy@10"):
        for name in ("as written", "normalised"):
            values = [r[name][metric] for r in results]
            lines.append(f"{metric + ' ' + name:<28}" + "".join(f"{v:>10.4f}" for v in values)
                         + f"{statistics.mean(values):>10.4f}{max(values) - min(values):>10.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import logging

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--urls", type=int, default=15_000)
    ap.add_argument("--messy", type=float, default=MESSY, help="share of events written another way")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=TRAIN["epochs"])
    ap.add_argument("--dim", type=int, default=TRAIN["dim"])
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "messy_urls"),
                    help="where the generated events, the messy log and the results go (runs/ is not tracked)")
    ap.add_argument("--json", help="where the results go (default: WORK/messy_urls.json)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1,500 users, 2,000 URLs, 2 epochs, seed 1")
    ap.add_argument("--time-prepare", type=int, metavar="R", help="instead, time prepare with and without the rule, R "
                                                                  "times each, on data/sample and the logs")
    args = ap.parse_args(argv)
    if args.quick:
        args.users, args.urls, args.epochs, args.seeds = 1500, 2000, 2, [1]
    to_terminal(logging.WARNING)
    try:
        from doc2vec_dist.cluster import ray_connection
        from doc2vec_dist.synthetic import generate

        work = os.path.abspath(args.work)
        generated = os.path.join(work, f"generated-{args.users}x{args.urls}")
        if not os.path.isdir(generated):
            generate(generated, args.users, args.urls, seed=0, progress=False)
        log_path = os.path.join(work, f"messy-{args.users}x{args.urls}-{args.messy:g}.parquet")
        log = messy_log(generated, log_path, args.messy)
        if args.time_prepare:
            rows = time_prepare({"data/sample": os.path.join(ROOT, "data", "sample"),
                                 f"generate {args.users}x{args.urls}": generated,
                                 f"the same, {args.messy:.0%} written otherwise": log_path}, args.time_prepare, work)
            print(time_table(rows))
            with open(args.json or os.path.join(work, "prepare_times.json"), "w") as fh:
                json.dump({"settings": vars(args), "log": log, "rows": rows}, fh, indent=2)
            return 0
        train = {**TRAIN, "epochs": args.epochs, "dim": args.dim}
        with ray_connection(None):
            results = [run_seed(seed, log_path, os.path.join(generated, "truth", "users.parquet"), work, train)
                       for seed in args.seeds]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"\nmessy URLs: {args.users:,} users × {args.urls:,} URLs, dim {args.dim}, {args.epochs} epochs, "
          f"holdout 0.2, seeds {' '.join(map(str, args.seeds))}")
    print(table(results, log))
    path = args.json or os.path.join(work, "messy_urls.json")
    with open(path, "w") as fh:
        json.dump({"settings": {**vars(args), "train": train}, "log": log, "results": results}, fh, indent=2)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
