"""Benchmark: ours (through Ray, end to end) against gensim on one corpus, with the time and memory of
every stage and process, and a sweep of our speed over macro-batch size and number of workers.

Both trainers run as their own process on the same corpus, flags and epochs (`doc2vec-dist train`
with a local Ray; `doc2vec-dist baseline`, gensim on all cores), each process tree watched for
memory. Then both models are exported (docs → Parquet) and scored on held-out URLs (recall@k). The
sweep trains ours alone for --sweep-epochs at each macro-batch size (with --num-workers) and each
number of workers (with --macro-batch), in one local Ray sized for the largest point.

    python benchmarks/benchmark.py --users 200000 --urls 100000 --epochs 5              # the target's setting
    python benchmarks/benchmark.py --users 50000 --urls 50000 --epochs 2 --plan         # also `plan`, vs measured
    python benchmarks/benchmark.py --corpus CORPUS --heldout HELDOUT.parquet --sweep-macro-batch --sweep-workers

Prints one table (tokens/s, wall time per stage, peak memory of each process, recall@k, ours/gensim
and the targets), writes it as JSON (--out-json) and plots tokens/s against macro-batch size and
workers (--out-png, needs matplotlib: pip install -e '.[bench]').

Memory per process: peak RSS (resident, shared pages included) and peak private memory (RssAnon:
heap and numpy arrays). A parameter server's RSS also counts the object-store pages it mapped while
serving pulls and pushes, which are shared and counted once per node; its private memory is its
tables plus the process, so that is the figure set against the raw bytes of the rows it owns.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from compare import run_trainer, synthetic, write_config

from doc2vec_dist.cli import add_config_flags
from doc2vec_dist.config import TrainConfig, build, load_yaml
from doc2vec_dist.logs import to_terminal

TARGET_SPEED_RATIO = 1.5  # ours/gensim tokens/s, 200k users, dbow, dim 100, negative 5
TARGET_PS_MEMORY_RATIO = 1.2  # a server's memory / the raw bytes of the rows it owns (optimiser state included)
GiB = 1 << 30


# -- pieces (importable; tests call them) ---------------------------------------------------------------

def ps_raw_bytes(config: TrainConfig, num_docs: int, vocab_size: int) -> list[int]:
    """Raw bytes of the rows each parameter server owns: rows on it × (dim + optimiser columns) × 4."""
    from types import SimpleNamespace

    from doc2vec_dist.plan_model import shard_table_bytes
    from doc2vec_dist.ps import table_specs

    tables = table_specs(config, SimpleNamespace(num_docs=num_docs, vocab_size=vocab_size))
    return [sum(t.values()) for t in shard_table_bytes(tables, config.num_ps)]


def process_rows(processes: list[dict], raw: list[int], empty_ps: int | None) -> list[dict]:
    """Each watched process with, for servers, the raw bytes of its rows and private/raw ratios.

    psN is numbered by process start, not by shard: shards differ by at most one row, so shard N's
    raw bytes stand for it. (private − empty PS)/raw takes the process's own cost (Python, torch,
    Ray: an empty server, measured) out, leaving what the tables cost against their raw size.
    """
    out = []
    for p in processes:
        row = dict(p)
        if p["role"] == "ps":
            i = int(p["label"][2:])
            r = raw[i] if i < len(raw) else raw[-1]
            row["raw_bytes"] = r
            row["private_over_raw"] = p["private"] / r if r else None
            if empty_ps is not None and r:
                row["tables_over_raw"] = max(0, p["private"] - empty_ps) / r
        out.append(row)
    return out


def stage_seconds(run: dict, export_seconds: float | None) -> dict:
    """Wall seconds per stage of one trainer's run, from its summary and the export timed here."""
    s = run["summary"]
    return {"startup": s.get("startup_seconds"), "train": s["train_seconds"], "checkpoint": s.get("checkpoint_seconds"),
            "export": export_seconds, "process": run["wall_seconds"]}


def in_stage_order(seconds: dict) -> dict:
    """Worker seconds in the order of a macro-batch (read, sample, pull, wait, compute, push); the
    model's config.json keeps them sorted by name."""
    from doc2vec_dist.worker import STAGES

    return {**{k: seconds[k] for k in STAGES if k in seconds}, **{k: v for k, v in seconds.items() if k not in STAGES}}


def worker_split(seconds: dict, digits: int = 1) -> str:
    """'read 0.1 s (1%)  sample …': where the workers' time went, summed over workers."""
    busy = sum(seconds.values()) or 1.0
    return "  ".join(f"{k} {v:.{digits}f} s ({100 * v / busy:.0f}%)" for k, v in in_stage_order(seconds).items())


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "gb":
        return f"{value / GiB:.2f} GiB" if value >= 0.1 * GiB else f"{value / 2**20:.0f} MiB"
    if fmt == "s":
        return f"{value:.1f} s"
    if fmt == "M":
        return f"{value / 1e6:.3f}M"
    return format(value, fmt)


def _table(header: list[str], rows: list[list[str]], first: int = 34) -> list[str]:
    widths = [max(first, *(len(r[0]) + 2 for r in rows))]
    widths += [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(header) if i]

    def line(cells: list[str]) -> str:
        return "".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header)] + [line(r) for r in rows]


def report(result: dict) -> str:
    """The benchmark's table as text."""
    c, cfg, k = result["corpus"], result["config"], result["k"]
    ours, theirs = result["ours"], result.get("gensim")  # gensim's faster mode: the speed reference
    best = result.get("gensim_quality")  # its iterable mode: the quality reference
    lines = [f"benchmark: {c['path']}"]
    lines.append(f"  {c['docs']:,} users, {c['tokens']:,} tokens an epoch, vocabulary {c['vocab']:,}; "
                 f"{cfg['mode']}{' + dbow_words' if cfg['dbow_words'] else ''}, dim {cfg['dim']}, "
                 f"negative {cfg['negative']}, sample {cfg['sample']}, {cfg['epochs']} epochs; ours "
                 f"{cfg['num_ps']} PS + {cfg['num_workers']} workers, gensim {result.get('gensim_workers')} threads")
    if result.get("ours_only_options"):
        lines.append("  ours only (gensim has no such option): "
                     + ", ".join(f"{k} {v}" for k, v in result["ours_only_options"].items()))
    lines.append("")
    speed = ours["tokens_per_second"] / theirs["tokens_per_second"] if theirs else None
    recall_diff = (ours["recall"] - best["recall"]
                   if best and ours.get("recall") is not None and best.get("recall") is not None else None)
    rows = [["tokens/s", _fmt(ours["tokens_per_second"], "M"), _fmt(theirs and theirs["tokens_per_second"], "M"),
             _fmt(speed, ".2f"), f"≥ {TARGET_SPEED_RATIO:.2f}: " + ("-" if speed is None else
                                                                  "met" if speed >= TARGET_SPEED_RATIO else "missed")],
            [f"recall@{k} (held out; gensim {best and best['gensim_mode']})", _fmt(ours.get("recall"), ".4f"),
             _fmt(best and best.get("recall"), ".4f"),
             _fmt(recall_diff, "+.4f"),
             "≥ gensim's: " + ("-" if recall_diff is None else "met" if recall_diff >= 0 else "missed")],
            [f"  popularity recall@{k}", _fmt(ours.get("popularity_recall"), ".4f"), "", "", ""]]
    prep = result.get("prepare") or {}
    prep_s = sum(v for v in prep.values() if v) or None
    rows.append(["wall: prepare (shared)", _fmt(prep_s, "s"), "", "",
                 ", ".join(f"{k.split('_')[0]} {v:.1f} s" for k, v in prep.items() if v) or "reused, not timed"])
    for stage in ("startup", "train", "checkpoint", "export", "process"):
        a, b = ours["stages"].get(stage), theirs and theirs["stages"].get(stage)
        name = {"startup": "startup (Ray, actors)", "process": "whole process", "export": "export (docs → Parquet)"}
        rows.append([f"wall: {name.get(stage, stage)}", _fmt(a, "s"), _fmt(b, "s"),
                     _fmt(a / b if a and b else None, ".2f"), ""])
    rows.append(["peak memory, process tree (PSS)", _fmt(ours["peak_memory_bytes"], "gb"),
                 _fmt(theirs and theirs["peak_memory_bytes"], "gb"),
                 _fmt(ours["peak_memory_bytes"] / theirs["peak_memory_bytes"] if theirs else None, ".2f"), ""])
    lines += _table(["", "doc2vec-dist", "gensim", "ours/gensim", "target"], rows)
    modes = [result[w] for w in ("gensim_iterable", "gensim_corpus_file") if result.get(w)]
    if modes:
        lines.append("gensim's modes: " + "; ".join(
            f"{r['gensim_mode']} {_fmt(r['tokens_per_second'], 'M')} tokens/s, recall@{k} {_fmt(r.get('recall'), '.4f')}"
            for r in modes) + f" (speed against the faster, {theirs['gensim_mode']}; recall against iterable)")

    lines.append("")
    lines.append("peak memory of each process (private = RssAnon; raw = rows it owns × (dim + optimiser) × 4 B; "
                 f"empty PS = {_fmt(result.get('empty_ps_bytes'), 'gb')}, measured)")
    rows = []
    procs = [("", p) for p in ours["processes"]] + [("gensim ", p) for p in (theirs or {}).get("processes", [])]
    for prefix, p in procs:
        label = prefix + p["label"] + (f" ({p['count']} processes)" if p.get("count") else "")
        ratio = p.get("tables_over_raw")
        rows.append([label, _fmt(p["rss"], "gb"), _fmt(p["private"], "gb"), _fmt(p.get("raw_bytes"), "gb"),
                     _fmt(p.get("private_over_raw"), ".2f"), _fmt(ratio, ".2f"),
                     "" if ratio is None else f"≤ {TARGET_PS_MEMORY_RATIO}: " + ("met" if ratio <= TARGET_PS_MEMORY_RATIO
                                                                               else "missed")])
    lines += _table(["process", "peak RSS", "peak private", "raw rows", "private/raw", "(private−empty)/raw",
                     "target"], rows)
    lines += ["", "where the workers' time went (summed over workers): "
              + worker_split(ours["summary"].get("worker_seconds", {}))]

    sweep = result.get("sweep") or []
    if sweep:
        lines += ["", f"sweep, ours only, {result['sweep_epochs']} epoch(s) each:"]
        rows = [[(f"macro-batch {p['macro_batch']:,}" if p["macro_batch"] else "macro-batch default")
                 + (f" ({'cut to' if p['macro_batch'] else 'is'} {p['effective_macro_batch']:,})"
                    if p.get("effective_macro_batch", p["macro_batch"]) != p["macro_batch"] else "")
                 + f", {p['num_workers']} workers", _fmt(p["tokens_per_second"], "M"),
                 _fmt(p["train_seconds"], "s"),
                 " ".join(f"{k} {100 * v / (sum(p['worker_seconds'].values()) or 1):.0f}%"
                          for k, v in in_stage_order(p["worker_seconds"]).items())] for p in sweep]
        lines += _table(["point", "tokens/s", "train", "worker time"], rows)

    plan = result.get("plan_vs_measured")
    if plan:
        lines += ["", "plan (doc2vec-dist plan, before training) against this run:"]
        rows = [[r["what"], _fmt(r["planned"], r["fmt"]), _fmt(r["measured"], r["fmt"]),
                 _fmt(r["error"], "+.0%")] for r in plan]
        lines += _table(["", "planned", "measured", "error"], rows)
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """tokens/s against macro-batch size and against workers, gensim's speed as a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("the plot needs matplotlib: pip install -e '.[bench]' (or pass --out-png '')") from None
    sweep, cfg = result.get("sweep") or [], result["config"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, fixed, fixed_name, label in (
            (axes[0], "macro_batch", "num_workers", "workers", "macro-batch (tokens a worker reads)"),
            (axes[1], "num_workers", "macro_batch", "macro-batch", "workers")):
        xkey = "effective_macro_batch" if key == "macro_batch" else key  # what the workers really used
        points = sorted((p.get(xkey, p[key]), p["tokens_per_second"] / 1e6) for p in sweep if p["varied"] == key)
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], "o-", label="doc2vec-dist")
        if result.get("gensim"):
            ax.axhline(result["gensim"]["tokens_per_second"] / 1e6, color="gray", ls="--",
                       label=f"gensim, {result.get('gensim_workers')} threads")
        if key == "macro_batch":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_title(f"{fixed_name} {cfg[fixed]:,}" if cfg[fixed] else f"{fixed_name}: default")
        if key == "num_workers":
            ax.set_xticks([x for x, _ in points] or [cfg["num_workers"]])
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("M tokens/s")
    fig.suptitle(f"{result['corpus']['docs']:,} users, dim {cfg['dim']}, {cfg['mode']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sweep_points(config: TrainConfig, macro_batches: list[int], workers: list[int]) -> list[dict]:
    points = [{"varied": "macro_batch", "macro_batch": m, "num_workers": config.num_workers} for m in macro_batches]
    points += [{"varied": "num_workers", "macro_batch": config.macro_batch, "num_workers": w} for w in workers]
    return points


def run_sweep(corpus: str, config: TrainConfig, points: list[dict], epochs: int, work: str) -> list[dict]:
    """Ours alone at each point, in this process, on a local Ray with CPUs for the largest point
    (more workers than cores is a point of the curve: contention shows)."""
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.settings import resolve
    from doc2vec_dist.trainer import train

    data = Corpus(corpus)
    out = []
    for i, p in enumerate(points):
        cfg = dataclasses.replace(config, epochs=epochs, macro_batch=p["macro_batch"], num_workers=p["num_workers"],
                                  progress=False, checkpoint_every=0, keep_checkpoints=1)
        print(f"[benchmark] sweep {i + 1}/{len(points)}: macro-batch {p['macro_batch'] or 'default'}, "
              f"{p['num_workers']} workers", file=sys.stderr, flush=True)
        s = train(corpus, os.path.join(work, "sweep-model"), cfg, overwrite=True)
        # a worker makes at least 16 rounds an epoch: on a small corpus a large macro-batch is cut
        p = {**p, "effective_macro_batch": resolve(cfg, data).macro_batch}
        out.append({**p, "tokens_per_second": s["tokens_per_second"], "train_seconds": s["train_seconds"],
                    "worker_seconds": s.get("worker_seconds", {})})
    return out


def plan_vs_measured(planned: dict, ours: dict, epochs: int) -> list[dict]:
    """The plan's memory per server and worker and time per epoch beside what the run measured."""
    mem, t = planned["memory"], planned.get("time") or {}
    servers = [p for p in ours["processes"] if p["role"] == "ps"]
    workers = [p for p in ours["processes"] if p["role"] == "worker"]
    rows = [("parameter server, private (largest)", max(p["total"] for p in mem["ps"]),
             max((p["private"] for p in servers), default=None), "gb"),
            ("worker, private (largest)", mem["worker"]["total"], max((p["private"] for p in workers), default=None),
             "gb"),
            ("time per epoch", t.get("epoch_seconds"), ours["summary"]["train_seconds"] / epochs, "s"),
            ("startup", t.get("startup_seconds"), ours["summary"].get("startup_seconds"), "s"),
            ("checkpoint", t.get("checkpoint_seconds"), ours["summary"].get("checkpoint_seconds"), "s")]
    return [{"what": w, "planned": a, "measured": b, "fmt": f,
             "error": (a - b) / b if a is not None and b else None} for w, a, b, f in rows]


# -- the job -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_argument_group("corpus (generated under --workdir and reused, or given)")
    src.add_argument("--users", type=int, default=200_000)
    src.add_argument("--urls", type=int, default=100_000)
    src.add_argument("--events-per-user", type=float, default=30.0)
    src.add_argument("--data-seed", type=int, default=1)
    src.add_argument("--corpus", help="a prepared corpus instead of the synthetic one")
    src.add_argument("--heldout", help="its held-out pairs (prepare --holdout-out), for recall")
    ap.add_argument("--workdir", default="runs/benchmark", help="corpora, models and outputs (default: runs/benchmark)")
    ap.add_argument("--gensim-workers", type=int, default=os.cpu_count() or 1, help="gensim threads (default: all cores)")
    ap.add_argument("--no-gensim", action="store_true", help="ours only")
    ap.add_argument("--gensim-modes", nargs="+", default=["iterable", "corpus_file"], choices=("iterable", "corpus_file"),
                    help="gensim's modes to run: iterable is its most accurate (recall is compared with it), "
                         "corpus_file its fastest (speed is compared with the faster of those run)")
    ap.add_argument("--sweep-macro-batch", type=int, nargs="*", default=[16384, 65536, 262144],
                    help="macro-batch sizes of the sweep (none: no sweep over it)")
    ap.add_argument("--sweep-workers", type=int, nargs="*", default=[1, 2, 4],
                    help="worker counts of the sweep (none: no sweep over it)")
    ap.add_argument("--sweep-epochs", type=int, default=1)
    ap.add_argument("--plan", action="store_true", help="also run `plan` first and set its estimates beside the run's")
    ap.add_argument("--calibrate-seconds", type=float, default=30.0, help="the plan's calibration (with --plan)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out-json", help="default: WORKDIR/benchmark.json")
    ap.add_argument("--out-png", help="default: WORKDIR/benchmark.png ('' for none)")
    ap.add_argument("--config", help="YAML of training flags")
    add_config_flags(ap, TrainConfig)
    ap.set_defaults(epochs=5)
    args = ap.parse_args(argv)

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    out_json = args.out_json or os.path.join(work, "benchmark.json")
    out_png = os.path.join(work, "benchmark.png") if args.out_png is None else args.out_png
    if out_png:  # fail before the runs, not after them
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("the plot needs matplotlib: pip install -e '.[bench]' (or pass --out-png '')")
    config = build(TrainConfig, load_yaml(args.config) if args.config else {}, vars(args)).validate()
    config.progress = False

    from doc2vec_dist.corpus import Corpus

    prepare_timings = {}
    if args.corpus:
        corpus_path, heldout = args.corpus, args.heldout
    else:
        corpus_path, heldout, _ = synthetic(work, args.users, args.urls, args.data_seed, args.events_per_user)
        with open(os.path.join(os.path.dirname(corpus_path), "timings.json")) as fh:
            prepare_timings = json.load(fh)
    corpus = Corpus(corpus_path)
    result: dict = {"corpus": {"path": corpus.path, "docs": corpus.num_docs, "tokens": corpus.num_tokens,
                               "vocab": corpus.vocab_size},
                    "config": dataclasses.asdict(config), "k": args.k, "prepare": prepare_timings,
                    "gensim_workers": None if args.no_gensim else args.gensim_workers,
                    "sweep_epochs": args.sweep_epochs}

    if args.plan:
        from doc2vec_dist.plan import plan

        print("[benchmark] plan ...", file=sys.stderr, flush=True)
        result["plan"] = plan(corpus.path, config, calibrate_seconds=args.calibrate_seconds,
                              workdir=os.path.join(work, "plan"))

    config_files = {"ours": write_config(config, os.path.join(work, "config.yaml"))}
    trainers = [("ours", "train", [])]
    if not args.no_gensim:
        # gensim trains its own algorithm: the same model settings, without our engine's options
        # (shared negatives, resident rows, Adagrad), which it lacks; the table says which were on
        ours_only = {"shared_negatives": 0, "cache_rows": 0, "optimizer": "sgd"}
        result["ours_only_options"] = {k: getattr(config, k) for k, v in ours_only.items() if getattr(config, k) != v}
        config_files["gensim"] = write_config(dataclasses.replace(config, **ours_only),
                                              os.path.join(work, "config-gensim.yaml"))
        for mode in args.gensim_modes:  # iterable: the quality reference; corpus_file: gensim's fastest
            trainers.append((f"gensim_{mode}", "baseline", ["--workers", str(args.gensim_workers),
                                                             "--gensim-mode", mode]))
    for who, command, extra in trainers:
        print(f"[benchmark] {who} ...", file=sys.stderr, flush=True)
        model = os.path.join(work, f"model-{who}")
        run = run_trainer(command, corpus.path, model, config_files[who.split("_")[0]], extra)
        run["model"] = model
        if who.startswith("gensim_"):
            run["gensim_mode"] = who[len("gensim_"):]
        result[who] = run

    from doc2vec_dist.evaluate import heldout_metrics
    from doc2vec_dist.export import export

    for who in [w for w, _, _ in trainers]:
        run = result[who]
        print(f"[benchmark] {who}: export and recall ...", file=sys.stderr, flush=True)
        exported = export(run["model"], "docs", os.path.join(work, f"export-{who}"), progress=False)
        run["stages"] = stage_seconds(run, exported["seconds"])
        if heldout:
            m = heldout_metrics(run["model"], heldout, k=args.k)
            run["recall"], run["mrr"] = m[f"model_recall@{args.k}"], m["model_mrr"]
            run["popularity_recall"] = m[f"popularity_recall@{args.k}"]

    import ray
    from harness import local_ray

    from doc2vec_dist.plan_calibration import empty_ps_bytes

    points = sweep_points(config, args.sweep_macro_batch, args.sweep_workers)
    cpus = max([os.cpu_count() or 1] + [p["num_workers"] * config.cpus_per_worker for p in points])
    started = local_ray(cpus)
    try:
        result["empty_ps_bytes"] = empty_ps_bytes()
        result["sweep"] = run_sweep(corpus.path, config, points, args.sweep_epochs, work)
    finally:
        if started:
            ray.shutdown()

    raw = ps_raw_bytes(config, corpus.num_docs, corpus.vocab_size)
    result["ps_raw_bytes"] = raw
    for who in [w for w, _, _ in trainers]:
        result[who]["processes"] = process_rows(result[who]["processes"], raw, result["empty_ps_bytes"])
    if args.plan:
        result["plan_vs_measured"] = plan_vs_measured(result["plan"], result["ours"], config.epochs)
    gensim_runs = [result[w] for w, _, _ in trainers if w.startswith("gensim_")]
    if gensim_runs:
        # speed against gensim's fastest mode, quality against its most accurate (iterable) when it ran
        result["gensim"] = max(gensim_runs, key=lambda r: r["tokens_per_second"])
        result["gensim_quality"] = result.get("gensim_iterable") or result["gensim"]
        result["speed_ratio"] = result["ours"]["tokens_per_second"] / result["gensim"]["tokens_per_second"]

    text = report(result)
    print(text)
    if args.plan:
        from doc2vec_dist.plan_report import format_plan

        print("\n" + format_plan(result["plan"]))
    with open(out_json, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
    print(f"\nsaved {out_json}")
    if out_png:
        plot(result, out_png)
        print(f"saved {out_png}")
    return result


if __name__ == "__main__":
    main()
