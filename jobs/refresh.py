"""The daily refresh as one job: today's events on top of yesterday's model, trained from it, exported,
and yesterday's index updated (issue 17).

    python jobs/refresh.py --events today.parquet --base-model runs/day1/model --index runs/day1/index \\
        --out runs/day2
    ray job submit --working-dir . -- python jobs/refresh.py --events /shared/events/2026-12-02 \\
        --base-model /shared/days/2026-12-01/model --index /shared/days/2026-12-01/index \\
        --out /shared/days/2026-12-02

Steps, each a library call in this process (the per-part work of export and index as Ray tasks when
the job runs on a cluster):

  1. prepare  --events on top of --base-corpus, else the base model's corpus: every known user and URL
              keeps its id, new ones come after, a user's new events join its document
              (--window-days N: the last N days instead)                       → DAY_DIR/corpus
  2. train    from the base model's rows (init_from), with its settings: its config.json, then
              --config, then flags; epochs 1 unless one of those says otherwise  → DAY_DIR/model
  3. export   users (docs) and URLs (words_out), Parquet (key, vector), a file per checkpoint part
                                                          → DAY_DIR/exports/users, DAY_DIR/exports/urls
  4. index    --index OLD_INDEX updated to the new users' vectors, else a new one → DAY_DIR/index
  5. report   one summary block (what is new, how far known users moved, the index's changes and
              recall, the time of each step), also written as DAY_DIR/refresh.json; and the page
              (doc2vec-dist report: the run, the space, the known users' drift)   → DAY_DIR/report.html

DAY_DIR must be new or empty: a refresh never writes over anything, not even an earlier refresh (remove
a failed one to run that day again). Yesterday's DAY_DIR/model and DAY_DIR/index are today's
--base-model and --index; the base model and index are only read.

A refresh whose training stopped after a checkpoint (a node died, Ctrl-C) names the command that resumes
it: the same command with --resume, which trains DAY_DIR/model on from its last checkpoint on the corpus
already prepared there, then exports and indexes.

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so training joins the cluster; every path
must then be on storage every node sees. A relative --out there needs --root (see jobs/train.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout or a Ray working_dir without installing the package
sys.path.insert(0, os.path.join(ROOT, "jobs"))

from doc2vec_dist.environment import require_packages

require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist.runners import calm_openmp

calm_openmp()  # before faiss is imported

from train import _output_resolver, on_cluster, resume_command

from doc2vec_dist import outputs, storage
from doc2vec_dist.cli import _add_config_flags
from doc2vec_dist.config import PrepareConfig, TrainConfig, build, explicit_values, field_names, load_yaml
from doc2vec_dist.errors import UserError
from doc2vec_dist.index import KINDS, RECALL_QUERIES
from doc2vec_dist.logs import command

# What a refresh sets otherwise: the base is --base-model / --base-corpus, and a refresh holds
# nothing out (the base's users were trained on everything they had: hold out before the base).
PREPARE_SET_HERE = ("base", "holdout", "holdout_out")
TRAIN_SET_HERE = ("init_from", "resume")
# Prepare settings that default to the base corpus's own, so today's events are read (and capped) as
# yesterday's were.
PREPARE_FROM_BASE = ("format", "doc_col", "token_col", "time_col", "delimiter", "max_tokens_per_doc")
# Training settings of the base model that are not settings of this run.
NOT_CARRIED = ("init_from", "resume", "resume_from", "address", "progress")
EPOCHS_HELP = ("passes over the refreshed corpus (default: 1 for a refresh, not the base model's: known users and "
               "URLs start from trained vectors, so one pass adapts them to the new events and trains the new "
               "rows; the issue's target is 1 epoch within 0.005 recall@10 of a 5-epoch cold retrain in a third of "
               "its time, measured by benchmarks/refresh_benchmark.py)")
FIRST_EPOCH_HELP = ("changed (the default for a refresh, not the base model's): the first epoch trains only the users "
                    "that are new or have new events, the others keep their vectors bit for bit, so the index update "
                    "replaces only their rows; all: every user. Measured (benchmarks/refresh_benchmark.py, 200k users, 3 "
                    "seeds): changed +0.0003 recall@10 against the cold retrain in 0.31 of its time, the index "
                    "replacing 38%% of its rows; all -0.0031 in 0.40, replacing 97%%")


@dataclasses.dataclass
class RefreshJob:
    """What the job reads and where it writes (the settings of each step are PrepareConfig's and TrainConfig's)."""

    events: list[str]
    base_model: str
    out: str                        # DAY_DIR
    base_corpus: str | None = None
    index: str | None = None        # yesterday's index, to update
    index_kind: str | None = None   # a new index's kind (auto); with --index, the old kind is kept
    recall_queries: int = RECALL_QUERIES
    argv: tuple[str, ...] = ()      # as given: the command that resumes the refresh repeats them

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)


def parse(argv: list[str] | None) -> tuple[RefreshJob, PrepareConfig, TrainConfig]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", nargs="+", required=True, metavar="EVENTS",
                    help="today's events: files, directories, globs (any prepare format)")
    ap.add_argument("--base-model", required=True, metavar="MODEL",
                    help="yesterday's model: every table starts from its rows, and its settings are the defaults")
    ap.add_argument("--base-corpus", metavar="CORPUS",
                    help="the corpus whose documents the new events join (default: the base model's corpus, "
                         "from its config.json; with --window-days none is needed)")
    ap.add_argument("--out", required=True, metavar="DAY_DIR", help="a new or empty directory for today's corpus, "
                    "model, exports, index and refresh.json")
    ap.add_argument("--index", metavar="OLD_INDEX", help="yesterday's index of the users, updated into DAY_DIR/index "
                    "(default: a new index is built there)")
    ap.add_argument("--index-kind", choices=KINDS, default=None,
                    help="kind of a new index (default: auto, flat up to 1M rows, else ivfpq); an update keeps the "
                         "old index's")
    ap.add_argument("--recall-queries", type=int, default=RECALL_QUERIES,
                    help=f"queries for the index's recall@10 vs exact (default: {RECALL_QUERIES})")
    ap.add_argument("--config", help="YAML of prepare and training keys (same names as the flags), over the base "
                                     "model's settings; flags override it")
    ap.add_argument("--root", help="directory that a relative --out, --base-model, --base-corpus and --index are "
                                   "taken from; inside `ray job submit --working-dir` a relative --out needs it "
                                   "(default: the current directory)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--resume", action="store_true",
                    help="go on with a refresh whose training stopped after a checkpoint: DAY_DIR/model from its last "
                         "checkpoint, on the corpus prepared there, then export and index")
    _add_config_flags(ap, PrepareConfig, skip=PREPARE_SET_HERE)
    _add_config_flags(ap, TrainConfig, skip=TRAIN_SET_HERE)
    helps = {f.name: f.metadata["help"].split(" (default:")[0] for cls in (PrepareConfig, TrainConfig)
             for f in dataclasses.fields(cls)}
    for action in ap._actions:  # a training flag's default is the base model's setting, the columns its corpus's
        if action.dest == "epochs":
            action.help = EPOCHS_HELP
        elif action.dest == "first_epoch":
            action.help = FIRST_EPOCH_HELP
        elif action.dest in field_names(TrainConfig) and action.dest not in ("address", "resume"):
            action.help = f"{helps[action.dest]} (default: the base model's)"
        elif action.dest in PREPARE_FROM_BASE:
            action.help = f"{helps[action.dest]} (default: the base corpus's)"
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    flags = vars(args)
    values = load_yaml(args.config) if args.config else {}
    taken = (field_names(PrepareConfig) - set(PREPARE_SET_HERE)) | (field_names(TrainConfig) - set(TRAIN_SET_HERE))
    refused = sorted(set(values) - taken - {"root"})
    if refused:
        raise UserError(f"{args.config}: {', '.join(refused)}: not a setting of a refresh (its inputs and outputs are "
                        "--events, --base-model, --base-corpus, --index and --out, and it holds nothing out)")
    root = flags["root"] or values.get("root")
    place = _output_resolver(args.config or "--out", root, os.getcwd())

    def earlier(path: str | None) -> str | None:  # an earlier day's output: under --root too, where it was written
        if path is None or "://" in path or os.path.isabs(path):
            return path
        return os.path.join(os.path.abspath(root) if root else os.getcwd(), path)

    job = RefreshJob(events=args.events, base_model=earlier(args.base_model), out=place("out", args.out),
                     base_corpus=earlier(args.base_corpus), index=earlier(args.index), index_kind=args.index_kind,
                     recall_queries=args.recall_queries, argv=tuple(argv))
    if "://" in job.out:
        raise UserError(f"{job.out}: --out must be a directory on a file system every node mounts; a refresh on "
                        "object storage is not supported (its corpus and index are local files)")
    prep = build(PrepareConfig, base_corpus_settings(job), values, flags)
    if args.resume:  # the checkpoint's settings, changed only where a flag or the YAML says so, as train --resume
        from doc2vec_dist.trainer import resumed_config

        check_resumable(job.out)
        cfg = resumed_config(job.path("model"), explicit_values(TrainConfig, values, flags))
    else:
        cfg = refresh_config(job.base_model, values, flags, config_path=args.config)
    if args.no_progress:
        cfg.progress = False
    return job, prep, cfg.validate()


def refresh_config(base_model: str, values: dict, flags: dict, config_path: str | None = None) -> TrainConfig:
    """The refresh's training settings: the base model's (its config.json), epochs 1 and a first epoch on
    the changed users (EPOCHS_HELP, FIRST_EPOCH_HELP), then the YAML `values` (read from config_path) and
    the flags, starting from the base model. Its shape (dim, mode) is the base model's: a YAML value or
    flag that contradicts it is refused, as train --init-from refuses it (warmstart.taken_settings)."""
    from doc2vec_dist.checkpoint import ModelDir
    from doc2vec_dist.warmstart import taken_settings

    taken = taken_settings(base_model, [(config_path or "--config", values), ("", flags)], flag="--base-model")
    saved = {k: v for k, v in dataclasses.asdict(ModelDir(base_model).config()).items() if k not in NOT_CARRIED}
    return build(TrainConfig, saved, taken, {"epochs": 1, "first_epoch": "changed"}, values, flags,
                 {"init_from": base_model})


def base_corpus_settings(job: RefreshJob) -> dict:
    """How the base corpus read its events (format, columns), so today's are read the same way; {} when
    the base model's corpus is gone (a --window-days refresh needs none)."""
    from doc2vec_dist.checkpoint import ModelDir
    from doc2vec_dist.corpus import Corpus

    try:
        meta = Corpus(job.base_corpus or ModelDir(job.base_model).corpus_path()).meta
    except UserError:
        if job.base_corpus:
            raise
        return {}
    return {k: meta[k] for k in PREPARE_FROM_BASE if meta.get(k) is not None}


def check_day_dir(day: str) -> None:
    """DAY_DIR is new or an empty directory; anything else is refused in one line naming what is there."""
    if outputs.check_dir(day, "refresh", None):  # raises for a file, a folder of the user's, another output
        raise UserError(f"{day}: holds an earlier refresh (made by jobs/refresh.py); a refresh writes only into a new "
                        "or empty directory: remove it to run that day again, or choose another --out")


def check_resumable(day: str) -> None:
    """DAY_DIR holds a refresh whose training stopped after a checkpoint (its corpus and model, no exports
    yet); anything else is refused in one line."""
    from doc2vec_dist import checkpoint

    if not os.path.isdir(day) or not outputs.check_dir(day, "refresh", None):
        raise UserError(f"{day}: holds no refresh to resume; run the refresh without --resume")
    if checkpoint.latest_version(os.path.join(day, "model")) is None:
        raise UserError(f"{day}: its model has no checkpoint to resume from; remove {day} to run that day again")
    done = [name for name in ("exports", "index", "refresh.json") if os.path.exists(os.path.join(day, name))]
    if done:
        raise UserError(f"{day}: the refresh got past training ({', '.join(done)} there), so there is no training to "
                        f"resume; remove {day} to run that day again")


def run(job: RefreshJob, prep: PrepareConfig, cfg: TrainConfig) -> dict:
    if cfg.resume:  # check_resumable said what DAY_DIR holds: only the steps after training are left to write
        return _steps(job, prep, cfg)
    check_day_dir(job.out)
    outputs.check_writable(job.out, inside=True)  # every step writes inside it
    made = outputs.make_dirs(job.out)
    outputs.write_marker(job.out, "refresh")
    try:
        return _steps(job, prep, cfg)
    except BaseException:
        if os.listdir(job.out) == [outputs.MARKER]:  # nothing was kept: leave no trace, so the day can run again
            os.remove(os.path.join(job.out, outputs.MARKER))
            outputs.remove_dirs(made)
        raise


def _steps(job: RefreshJob, prep: PrepareConfig, cfg: TrainConfig) -> dict:
    import ray

    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.export import export
    from doc2vec_dist.index import build_index
    from doc2vec_dist.index_update import update_index
    from doc2vec_dist.plan import train_workers
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.report import report as make_report
    from doc2vec_dist.runners import run_on_ray
    from doc2vec_dist.trainer import train

    stages: dict[str, float] = {}
    result: dict = {"events": job.events, "base_model": job.base_model, "base_corpus": job.base_corpus,
                    "out": job.out, "old_index": job.index, "stages": stages}

    t = time.perf_counter()
    if cfg.resume:  # prepared by the run that stopped
        corpus = Corpus(job.path("corpus"))
    else:
        corpus = prepare(job.events, job.path("corpus"),
                         dataclasses.replace(on_cluster(prep, cfg), base=job.base_corpus or job.base_model),
                         progress=cfg.progress, report=True)
        stages["prepare"] = time.perf_counter() - t
    result["prepare"] = {k: corpus.meta.get(k) for k in ("num_docs", "num_tokens", "vocab_size", "refresh", "skipped",
                                                         "time_range", "window_days", "expire_days")}

    t = time.perf_counter()
    cfg = train_workers(corpus.path, cfg)  # fewer workers where more would not pay (a small corpus)
    result["train"] = train(corpus.path, job.path("model"), cfg,
                            resume_command=resume_command(job.argv, __file__))
    result["config"] = dataclasses.asdict(cfg)
    stages["train"] = time.perf_counter() - t

    # On a cluster, train() left this process connected: each part is exported (and staged for the
    # index) by a Ray task where Ray places it. A local Ray was shut down with training; here, on one
    # machine, threads do the same work without starting another.
    runner = run_on_ray if ray.is_initialized() else None
    model = job.path("model")
    t = time.perf_counter()
    os.makedirs(job.path("exports"))
    result["export"] = [export(model, table, job.path(os.path.join("exports", name)), progress=cfg.progress,
                               runner=runner) for table, name in (("docs", "users"), ("words_out", "urls"))]
    stages["export"] = time.perf_counter() - t

    t = time.perf_counter()
    common = {"model": model, "table": "docs", "progress": cfg.progress, "report": False, "runner": runner,
              "recall_queries": job.recall_queries}
    if job.index:
        result["index"] = update_index(job.index, job.path("index"), kind=job.index_kind, **common)
    else:
        result["index"] = build_index(job.path("index"), kind=job.index_kind or "auto", **common)
    stages["index"] = time.perf_counter() - t

    t = time.perf_counter()  # the page: the run, the space, and how far the known users moved
    result["report"] = make_report(model, job.path("report.html"))["path"]
    stages["report"] = time.perf_counter() - t
    storage.write_local(job.path("refresh.json"), storage.json_bytes(result))
    return result


def report(result: dict) -> None:
    """The summary block: one line per step, then the times."""
    from doc2vec_dist.index import summary_line

    p, s = result["prepare"], result["train"]
    r = p["refresh"]
    print(f"\nrefresh of {result['base_model']} into {result['out']}")
    print(f"  prepare  users: {r['base_docs']:,} known, {r['new_docs']:,} new, {r['grown_docs']:,} grown"
          + (f", {r['empty_base_docs']:,} now empty" if r["empty_base_docs"] else "")
          + f"; URLs: {r['base_vocab']:,} known, {r['new_words']:,} new"
          + (f", {r['words_without_tokens']:,} with no token now" if r["words_without_tokens"] else "")
          + f"; {p['num_docs']:,} users, {p['num_tokens']:,} tokens")
    left = []
    if p.get("expire_days") is not None:
        left.append(f"{r['expired_users']:,} users and {r['expired_urls']:,} URLs expired (no event in "
                    f"{p['expire_days']:g} days)")
    if r.get("forgotten_input_users") or r.get("forgotten_base_users"):
        left.append(f"{r.get('forgotten_input_users', 0) + r.get('forgotten_base_users', 0):,} forgotten users left "
                    f"out ({r.get('forgotten_input_events', 0):,} of today's events)")
    if left:
        print("  left     " + "; ".join(left))
    first = " (the first on the changed users only)" if result["config"].get("first_epoch") == "changed" else ""
    print(f"  train    {s['epochs']} epoch(s){first}, {s['tokens']:,} tokens in {s['train_seconds']:.1f}s "
          f"({s['tokens_per_second'] / 1e6:.3f}M tokens/s), loss " + " ".join(f"{x:.3f}" for x in s["loss_per_epoch"]))
    names = {"docs": "users", "words": "URLs (input)", "words_out": "URLs"}
    drift = s.get("drift") or {}
    print("  drift    " + ("; ".join(f"{names[t]} cosine(old, new) median {d['median']:.3f}, p5 {d['p5']:.3f}, "
                                     f"p95 {d['p95']:.3f}" for t, d in drift.items()) or "not measured"))
    print("  export   " + "; ".join(f"{e['rows']:,} {names[e['table']]} → {e['path']}" for e in result["export"]))
    for i, line in enumerate(summary_line(result["index"]).splitlines()):
        print(("  index    " + line.removeprefix("index ")) if i == 0 else "           " + line)
    stages = result["stages"]
    print("  times    " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items()) + f"; total {sum(stages.values()):.1f}s")
    print(f"outputs: {result['out']} (corpus, model, exports/users, exports/urls, index, refresh.json, report.html)")
    print(f"report: {result['report']}")


def main(argv: list[str] | None = None) -> int:
    def work() -> None:
        job, prep, cfg = parse(argv)
        report(run(job, prep, cfg))

    return command(work)  # Ctrl-C: train() has said what became of the model, and how to resume it


if __name__ == "__main__":
    sys.exit(main())
