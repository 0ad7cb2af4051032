"""The report page at scale: `doc2vec-dist report` on a synthetic model of N users x M URLs, timed, with its peak memory.

    nice -n 10 python benchmarks/report_benchmark.py --users 20000000 --urls 1000000 --work /tmp/report-20m
    python benchmarks/report_benchmark.py --users 200000 --urls 100000 --work /tmp/report-200k --heldout-users 20000

WORK is the benchmark's own: a new or empty directory, which it marks (BENCHMARK_MARK), or one it marked before
(its corpus and model are reused when their sizes fit). It writes there, without training:

  corpus/   N users, each with 1 + Poisson(--events - 1) events over M URLs drawn Zipf-like by rank (exponent 1,
            what `generate` draws), in --shards shard files as prepare writes them; URLs on 500 hosts
  model/    a model directory in the checkpoint layout: docs (N x --dim) and words_out (M x --dim) in --parts
            parts (row r in part r % parts), synthetic clustered rows (serving_benchmark.synthetic_rows), its
            config.json, and a training log (training.jsonl) of a 4-worker, 5-epoch run as a run writes it
  heldout.parquet   with --heldout-users K: one hidden URL for each of K users, for the quality section

Then it runs the report as its own process (serving_benchmark.popen_wait4: wall time, CPU time, peak private
and resident memory from /proc) without, and with --heldout-users, with the held-out pairs. Figures are
printed and saved as WORK/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from serving_benchmark import memory, popen_wait4, synthetic_rows

from doc2vec_dist import checkpoint, modeldir, outputs
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import DOCS_SCHEMA, VOCAB_SCHEMA, write_shard
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import command

BENCHMARK_MARK = "report-benchmark.json"
HOSTS = 500


def claim(work: str) -> None:
    if os.path.isdir(work) and os.listdir(work) and not os.path.exists(os.path.join(work, BENCHMARK_MARK)):
        raise UserError(f"--work {work}: not empty and not this benchmark's; give a new or empty directory")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, BENCHMARK_MARK), "w") as fh:
        json.dump({"benchmark": "report"}, fh)


def zipf_ranks(rng: np.random.Generator, n: int, urls: int) -> np.ndarray:
    """URL ids drawn Zipf-like by rank (P(rank r) ~ 1/r): the log of a uniform draw over log(urls + 1)."""
    return np.minimum((np.exp(rng.random(n) * np.log(urls + 1)) - 1).astype(np.int64), urls - 1).astype(np.int32)


def write_corpus(corpus: str, users: int, urls: int, events: int, shards: int, seed: int) -> dict:
    meta_path = os.path.join(corpus, "corpus.json")
    if os.path.exists(meta_path):
        with open(meta_path) as fh:
            meta = json.load(fh)
        if (meta["num_docs"], meta["vocab_size"]) == (users, urls):
            print(f"corpus: reusing {corpus}", file=sys.stderr)
            return meta
    os.makedirs(corpus, exist_ok=True)
    outputs.write_marker(corpus, "corpus")
    counts = np.zeros(urls, np.int64)
    lengths = np.zeros(users, np.int64)
    entries = []
    for s in range(shards):
        rng = np.random.default_rng([seed, s])
        ids = np.arange(s, users, shards, dtype=np.int64)  # by key hash in a real corpus: any spread will do
        mine = 1 + rng.poisson(events - 1, len(ids))
        tokens = zipf_ranks(rng, int(mine.sum()), urls)
        counts += np.bincount(tokens, minlength=urls)
        lengths[ids] = mine
        entries.append(write_shard(corpus, s, ids, mine, tokens))
        print(f"corpus: shard {s + 1}/{shards}", file=sys.stderr)
    ids = np.arange(users, dtype=np.int64)
    with pa.OSFile(os.path.join(corpus, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, DOCS_SCHEMA) as writer:
        for start in range(0, users, 1 << 20):
            part = pa.array(ids[start:start + (1 << 20)])
            writer.write_batch(pa.record_batch([pc.binary_join_element_wise("u", pc.cast(part, pa.string()), ""), part,
                                                pa.array(lengths[start:start + (1 << 20)])], schema=DOCS_SCHEMA))
    word = pa.array(np.arange(urls, dtype=np.int32))
    host = pc.cast(pa.array(np.arange(urls) % HOSTS), pa.string())
    token = pc.binary_join_element_wise("https://www.host", host, ".example/page", pc.cast(word, pa.string()), "")
    vocab = pa.table({"token": token, "count": pa.array(counts), "id": word}, schema=VOCAB_SCHEMA)
    with pa.OSFile(os.path.join(corpus, "vocab.arrow"), "wb") as sink, pa.ipc.new_file(sink, VOCAB_SCHEMA) as writer:
        writer.write_table(vocab)
    meta = {"format_version": 1, "num_docs": users, "num_tokens": int(lengths.sum()), "vocab_size": urls,
            "num_shards": shards, "shards": entries, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "time_range": [1.7e9, 1.7e9 + 30 * 86400], "format": "events", "synthetic": "benchmarks/report_benchmark.py"}
    with open(meta_path, "w") as fh:
        json.dump(meta, fh)
    return meta


def write_model(model: str, corpus: str, meta: dict, dim: int, parts: int, seed: int) -> None:
    users, urls = meta["num_docs"], meta["vocab_size"]
    if os.path.exists(os.path.join(model, "LATEST")):
        found = modeldir.ModelDir(model)
        if (found.spec("docs")["rows"], found.spec("words_out")["rows"], found.spec("docs")["dim"]) == (users, urls, dim):
            print(f"model: reusing {model}", file=sys.stderr)
            return
    if os.path.exists(model):
        import shutil

        shutil.rmtree(model)
    checkpoint.start_model_dir(model, corpus, overwrite=False)
    rng = np.random.default_rng(seed)
    spectrum = (np.arange(1, dim + 1) ** -0.8).astype(np.float32)
    spectrum /= np.sqrt((spectrum ** 2).sum() / dim)
    mean = rng.standard_normal(dim).astype(np.float32) * 0.6
    centers = rng.standard_normal((HOSTS, dim)).astype(np.float32) * spectrum
    entries: dict[str, list] = {"docs": [], "words_out": []}
    for table, rows in (("docs", users), ("words_out", urls)):
        for s in range(parts):
            ids = np.arange(s, rows, parts, dtype=np.int64)
            matrix = np.empty((len(ids), dim), np.float32)
            for start in range(0, len(ids), 1 << 20):
                n = min(1 << 20, len(ids) - start)
                matrix[start:start + n] = synthetic_rows(n, dim, np.random.default_rng([seed, s, start, rows]),
                                                         centers, mean, 0.8)
            entries[table].append(checkpoint.write_slice(model, 1, table, s, parts, ids, matrix))
            del matrix
            print(f"model: {table} part {s + 1}/{parts}", file=sys.stderr)
    config = TrainConfig(dim=dim, epochs=5, num_ps=parts, num_workers=4, cpus_per_worker=4)
    checkpoint.commit(model, 1, entries, {"docs": dim, "words_out": dim},
                      {"epoch": 5, "positions": None, "config": {**config.__dict__}, "corpus": corpus,
                       "trainer": "synthetic (benchmarks/report_benchmark.py)"}, keep=1)
    tokens = meta["num_tokens"] * 5
    summary = {"tokens": tokens, "train_seconds": tokens / 8e6, "startup_seconds": 20.0, "checkpoint_seconds": 60.0,
               "tokens_per_second": 8e6, "loss_per_epoch": [3.1, 2.6, 2.4, 2.3, 2.25], "version": 1}
    checkpoint.write_config(model, config, corpus, summary=summary)
    write_log(model, meta["num_tokens"], config)


def write_log(model: str, epoch_tokens: int, config: TrainConfig) -> None:
    """training.jsonl as a 4-worker, 5-epoch run writes it (runlog), with made-up but plausible figures."""
    rng = np.random.default_rng(0)
    t = time.time() - 3600
    lines = [{"event": "start", "run": "synthetic", "t": t, "resumed_from": None, "epoch": 0,
              "config": config.__dict__, "where": ["node 10.0.0.1 (synthetic) runs parameter servers",
                                                   "node 10.0.0.2 (synthetic) runs workers 0, 1, 2, 3"]}]
    for epoch in range(1, 6):
        wall = epoch_tokens / 8e6
        t += wall
        workers = [{"worker": i, "tokens": epoch_tokens // 4, "pairs": epoch_tokens // 4, "loss": 0.0,
                    "tokens_per_second": epoch_tokens / 4 / wall * rng.uniform(0.9, 1.1),
                    "seconds": {k: wall * f for k, f in zip(("read", "sample", "pull", "wait", "compute", "push",
                                                             "barrier"), rng.dirichlet(np.ones(7)))},
                    "bytes": {"pulled": epoch_tokens * 50, "pushed": epoch_tokens * 50}} for i in range(4)]
        lines.append({"event": "epoch", "run": "synthetic", "t": t, "epoch": epoch, "wall_seconds": wall,
                      "tokens": epoch_tokens, "pairs": epoch_tokens, "loss": [3.1, 2.6, 2.4, 2.3, 2.25][epoch - 1],
                      "tokens_per_second": epoch_tokens / wall, "seconds": {}, "bytes": {}, "workers": workers})
        t += 12
        lines.append({"event": "checkpoint", "run": "synthetic", "t": t, "version": epoch, "epoch": epoch,
                      "mid_epoch": False, "seconds": 12})
    lines.append({"event": "end", "run": "synthetic", "t": t})
    with open(os.path.join(model, "training.jsonl"), "w") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)


def write_heldout(path: str, corpus: str, users: int, urls: int, count: int, seed: int) -> None:
    rng = np.random.default_rng([seed, 99])
    ids = np.sort(rng.choice(users, count, replace=False))
    with pa.memory_map(os.path.join(corpus, "vocab.arrow")) as source:
        tokens = pa.ipc.open_file(source).read_all().column("token")
    pq.write_table(pa.table({"key": pc.binary_join_element_wise("u", pc.cast(pa.array(ids), pa.string()), ""),
                             "token": tokens.take(pa.array(zipf_ranks(rng, count, urls)))},
                            metadata=outputs.parquet_metadata("heldout")), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=20_000_000)
    ap.add_argument("--urls", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=10, help="mean events per user")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--parts", type=int, default=8, help="checkpoint parts (parameter servers)")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--heldout-users", type=int, default=0, help="also time the page with this many users' pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", required=True)
    args = ap.parse_args(argv)

    def work() -> None:
        claim(args.work)
        corpus, model = os.path.join(args.work, "corpus"), os.path.join(args.work, "model")
        meta = write_corpus(corpus, args.users, args.urls, args.events, args.shards, args.seed)
        write_model(model, corpus, meta, args.dim, args.parts, args.seed)
        cli = [sys.executable, "-m", "doc2vec_dist", "report", "--model", model]
        results = {"users": args.users, "urls": args.urls, "dim": args.dim, "tokens": meta["num_tokens"],
                   "docs_bytes": sum(p["bytes"] for p in modeldir.ModelDir(model).spec("docs")["parts"])}
        results["page"] = popen_wait4([*cli, "--out", os.path.join(args.work, "report.html")])
        print(f"page: {results['page']['seconds']} s ({results['page']['cpu_seconds']} s CPU), "
              f"{memory(results['page'])}")
        if args.heldout_users:
            heldout = os.path.join(args.work, "heldout.parquet")
            write_heldout(heldout, corpus, args.users, args.urls, args.heldout_users, args.seed)
            results["page_heldout"] = popen_wait4([*cli, "--heldout", heldout, "--out",
                                                   os.path.join(args.work, "report-heldout.html")])
            print(f"page with --heldout ({args.heldout_users:,} users): {results['page_heldout']['seconds']} s "
                  f"({results['page_heldout']['cpu_seconds']} s CPU), {memory(results['page_heldout'])}")
        with open(os.path.join(args.work, "results.json"), "w") as fh:
            json.dump(results, fh, indent=2)

    return command(work)


if __name__ == "__main__":
    sys.exit(main())
