"""Ours against gensim on the same corpus, in one run: speed, memory and every quality figure.

For each mode (PV-DBOW, PV-DBOW with dbow_words, PV-DM) both trainers run as their own process
(`doc2vec-dist train` through a local Ray, `doc2vec-dist baseline` with gensim on all cores), with
the same corpus, flags and epochs. Their whole process trees are watched for peak memory. Then both
models are evaluated the same way: held-out URL prediction (recall@k, MRR) and, when labels are
known (the synthetic generator's planted communities), k-NN label accuracy. With --lee the Lee
corpus runs too (Pearson with human similarity, mean over seeds).

    python benchmarks/compare.py --generate 200000 --urls 100000 --epochs 5      # synthetic, made if missing
    python benchmarks/compare.py --corpus CORPUS --heldout HELDOUT.parquet --modes dbow dm
    python benchmarks/compare.py --lee --lee-only                                # the Lee corpus only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import yaml

from doc2vec_dist.cli import add_config_flags
from doc2vec_dist.config import PrepareConfig, TrainConfig, build
from doc2vec_dist.evaluate import heldout_metrics, labels_metrics
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.memwatch import MemoryWatch

MODES = {"dbow": {}, "dbow_words": {"dbow_words": True}, "dm": {"mode": "dm"},
         # ours only, measured against gensim's PV-DBOW (gensim has neither)
         "dbow_shared_negatives": {"shared_negatives": 64}, "dbow_adagrad": {"optimizer": "adagrad", "alpha": 0.05}}
GENSIM_MODE = {"dbow_shared_negatives": "dbow", "dbow_adagrad": "dbow"}
TRAINERS = (("doc2vec-dist", "train"), ("gensim", "baseline"))


def synthetic(work: str, users: int, urls: int, seed: int, events_per_user: float = 30.0,
              progress: bool = True) -> tuple[str, str, str]:
    """Generate and prepare (once) a synthetic corpus with 20% of each user's URLs held out; a corpus
    already under `work` is reused. The seconds each step took are kept in timings.json beside it."""
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.synthetic import generate

    name = f"synthetic-{users}x{urls}-s{seed}" + ("" if events_per_user == 30.0 else f"-e{events_per_user:g}")
    data = os.path.join(work, name)
    corpus, heldout = os.path.join(data, "corpus"), os.path.join(data, "heldout.parquet")
    timings_path = os.path.join(data, "timings.json")
    timings = {}
    if not os.path.exists(os.path.join(data, "generate.json")):
        t0 = time.perf_counter()
        generate(data, users, urls, seed=seed, events_per_user=events_per_user, progress=progress)
        timings["generate_seconds"] = time.perf_counter() - t0
    elif os.path.exists(timings_path):
        with open(timings_path) as fh:
            timings = json.load(fh)
    if not os.path.exists(os.path.join(corpus, "corpus.json")):
        t0 = time.perf_counter()
        prepare([os.path.join(data, "events")], corpus, PrepareConfig(time_col="ts", holdout=0.2, holdout_out=heldout,
                seed=seed), overwrite=True, progress=progress)
        timings["prepare_seconds"] = time.perf_counter() - t0
    with open(timings_path, "w") as fh:
        json.dump(timings, fh)
    return corpus, heldout, os.path.join(data, "truth", "users.parquet")


def write_config(config: TrainConfig, path: str) -> str:
    """The training flags as a YAML file both trainers' command lines take (--config)."""
    with open(path, "w") as fh:
        skip = {"progress", "address", "resume"}
        yaml.safe_dump({k: v for k, v in dataclasses.asdict(config).items() if k not in skip}, fh)
    return path


def run_trainer(command: str, corpus: str, model: str, config_file: str, extra: list[str]) -> dict:
    """One trainer as its own process; wall time, peak memory (of the tree, and of each process:
    driver, ps0…, worker0…, Ray's own) and its own summary."""
    argv = [sys.executable, "-m", "doc2vec_dist", command, "--corpus", corpus, "--out", model, "--config",
            config_file, "--overwrite", "--no-progress", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # every 0.1 s: reading /proc/PID/status of a dozen processes costs ~0.4 ms, and a short run's
    # workers live only a few seconds (a 0.5 s period missed them on the bundled sample)
    with MemoryWatch(proc.pid, interval=0.1) as watch:
        output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{output}")
    with open(os.path.join(model, "config.json")) as fh:
        summary = json.load(fh)["summary"]
    return {"wall_seconds": wall, "train_seconds": summary["train_seconds"],
            "tokens_per_second": summary["tokens_per_second"], "mtok_s": summary["tokens_per_second"] / 1e6,
            "peak_memory_bytes": watch.peak_total, "peak_gb": watch.peak_total / 2**30,
            "peak_rss_by_role": watch.by_role(), "processes": watch.processes(), "summary": summary}


def compare_modes(args, config: TrainConfig, corpus: str, heldout: str, labels: str | None) -> list[dict]:
    rows = []
    for mode in args.modes:
        for who, command in TRAINERS:
            run_as = GENSIM_MODE.get(mode, mode) if command == "baseline" else mode
            done = next((r for r in rows if r["trainer"] == who and r["ran_as"] == run_as), None)
            if done:  # gensim's PV-DBOW already ran: it is the reference of our variants too
                rows.append({**done, "mode": mode})
                continue
            cfg = dataclasses.replace(config, **MODES[run_as])
            config_file = write_config(cfg, os.path.join(args.work, f"config-{run_as}.yaml"))
            model = os.path.join(args.work, f"{who}-{run_as}")
            extra = ["--workers", str(args.gensim_workers)] if command == "baseline" else []
            print(f"[compare] {run_as}: {who} ...", file=sys.stderr, flush=True)
            row = {"mode": mode, "ran_as": run_as, "trainer": who,
                   **run_trainer(command, corpus, model, config_file, extra)}
            if heldout:
                m = heldout_metrics(model, heldout, k=args.k)
                row.update({f"recall@{args.k}": m[f"model_recall@{args.k}"], "mrr": m["model_mrr"],
                            f"popularity_recall@{args.k}": m[f"popularity_recall@{args.k}"]})
            if labels:
                m = labels_metrics(model, labels, k=args.k, key_col=args.key_col, label_col=args.label_col)
                row["label_accuracy"] = m[f"knn_accuracy@{args.k}"]
            rows.append(row)
    return rows


def compare_lee(args, config: TrainConfig) -> list[dict]:
    import lee

    rows = []
    for mode in args.lee_modes:
        cfg = dataclasses.replace(config, **MODES[mode])
        result = lee.run(os.path.join(args.work, "lee"), args.seeds, cfg.epochs, dim=cfg.dim,
                         mode=cfg.mode, dbow_words=cfg.dbow_words)
        for who, r in result.items():
            rows.append({"mode": mode, "trainer": who, "pearson": r["mean"], "pearson_per_seed": r["pearson"],
                         "tokens_per_second": r["tokens_per_second"], "mtok_s": r["tokens_per_second"] / 1e6})
    return rows


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    widths = [max(len(title), 12) for title, _, _ in columns]
    print("  ".join(f"{title:>{w}}" for (title, _, _), w in zip(columns, widths)))
    for row in rows:
        cells = []
        for i, (title, key, fmt) in enumerate(columns):
            value = row.get(key)
            text = "-" if value is None else format(value, fmt) if fmt else str(value)
            cells.append(f"{text:>{widths[i]}}")
        print("  ".join(cells))


def ratios(rows: list[dict], keys: list[str]) -> list[dict]:
    """Per mode: ours/gensim for speed, ours − gensim for quality."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        ours = next(r for r in rows if r["mode"] == mode and r["trainer"] == "doc2vec-dist")
        theirs = next(r for r in rows if r["mode"] == mode and r["trainer"] == "gensim")
        d = {"mode": mode, "speed_ratio": ours["tokens_per_second"] / theirs["tokens_per_second"]}
        for k in keys:
            if k in ours and k in theirs:
                d[f"{k}_diff"] = ours[k] - theirs[k]
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> None:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("corpus")
    src.add_argument("--corpus", help="a prepared corpus")
    src.add_argument("--heldout", help="its held-out file (prepare --holdout-out)")
    src.add_argument("--labels", help="Parquet/CSV of key, label for k-NN label accuracy")
    src.add_argument("--key-col", default="user_id")
    src.add_argument("--label-col", default="community")
    src.add_argument("--generate", type=int, metavar="USERS", help="synthetic corpus of this many users")
    src.add_argument("--urls", type=int, default=100_000, help="URLs of the synthetic corpus")
    src.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                    help="modes to compare (default: all; the last two are ours only, against gensim's dbow)")
    ap.add_argument("--lee", action="store_true", help="also run the Lee corpus (Pearson, mean over --seeds)")
    ap.add_argument("--lee-only", action="store_true", help="only the Lee corpus")
    ap.add_argument("--lee-modes", nargs="+", default=["dbow"], choices=["dbow", "dbow_words", "dm"])
    ap.add_argument("--lee-epochs", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--gensim-workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", default="runs/compare")
    ap.add_argument("--config", help="YAML of training flags")
    add_config_flags(ap, TrainConfig)
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    from doc2vec_dist.config import load_yaml

    config = build(TrainConfig, load_yaml(args.config) if args.config else {}, vars(args)).validate()
    result: dict = {"config": dataclasses.asdict(config)}

    if not args.lee_only:
        corpus, heldout, labels = args.corpus, args.heldout, args.labels
        if args.generate:
            corpus, heldout, truth = synthetic(args.work, args.generate, args.urls, args.data_seed)
            labels = labels or truth
        if not corpus:
            ap.error("give --corpus, --generate USERS or --lee-only")
        rows = compare_modes(args, config, corpus, heldout, labels)
        k = args.k
        print(f"\ncorpus {corpus}, dim {config.dim}, {config.epochs} epochs, negative {config.negative}, "
              f"sample {config.sample}")
        print_table(rows, [("mode", "mode", ""), ("trainer", "trainer", ""), ("ran as", "ran_as", ""),
                           ("wall s", "wall_seconds", ".1f"),
                           ("train s", "train_seconds", ".1f"), ("Mtok/s", "mtok_s", ".3f"),
                           ("peak GB", "peak_gb", ".2f"), (f"recall@{k}", f"recall@{k}", ".4f"),
                           ("MRR", "mrr", ".4f"), (f"pop recall@{k}", f"popularity_recall@{k}", ".4f"),
                           ("label acc", "label_accuracy", ".4f")])
        diffs = ratios(rows, [f"recall@{k}", "mrr", "label_accuracy"])
        print()
        print_table(diffs, [("mode", "mode", ""), ("ours/gensim tok/s", "speed_ratio", ".2f"),
                            (f"recall@{k} ours-gensim", f"recall@{k}_diff", "+.4f"), ("MRR diff", "mrr_diff", "+.4f"),
                            ("label acc diff", "label_accuracy_diff", "+.4f")])
        result.update({"corpus": corpus, "runs": rows, "differences": diffs})

    if args.lee or args.lee_only:
        lee_config = dataclasses.replace(config, epochs=args.lee_epochs)
        rows = compare_lee(args, lee_config)
        print(f"\nLee corpus, dim {lee_config.dim}, {lee_config.epochs} epochs, seeds {args.seeds}")
        print_table(rows, [("mode", "mode", ""), ("trainer", "trainer", ""), ("Pearson", "pearson", ".4f"),
                           ("Mtok/s", "mtok_s", ".3f")])
        diffs = ratios(rows, ["pearson"])
        print_table(diffs, [("mode", "mode", ""), ("ours/gensim tok/s", "speed_ratio", ".2f"),
                            ("Pearson ours-gensim", "pearson_diff", "+.4f")])
        result.update({"lee": rows, "lee_differences": diffs})

    path = os.path.join(args.work, "compare.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
