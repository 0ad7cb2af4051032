"""The jobs' steps, strung together: prepare → train → export → index → evaluate → the report page, and the
daily refresh; and the one assembly of a run's TrainConfig, shared with the cli.

Changes when a job's steps, their order or what they print change. jobs/*.py, the entry points a user runs
(`ray job submit … -- python jobs/train.py`), each call a function here with their checkout `root` (where the
bundled sample and its config are) and their docstring as their --help.

A run's settings are assembled in one order everywhere (`train_config`): the library's defaults < the
earlier model's (train --init-from: its shape; a refresh: all its settings, one epoch on the changed users)
< the YAML < the flags; a resumed run is its checkpoint's config, changed only where the YAML or a flag says.
How far a run from an earlier model moved its vectors is measured here, after training (drift.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

from . import modeldir, outputs, storage
from .config import JobConfig, PrepareConfig, TrainConfig, build, explicit_values, field_names, load_yaml
from .errors import UserError

# The checkout this package sits in: its jobs/configs/sample.yaml and data/ (a job passes its own root).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_CONFIG = os.path.join("jobs", "configs", "sample.yaml")  # under a checkout's root
# Training settings of a refresh's base model that are not settings of the refresh's run.
NOT_CARRIED = ("init_from", "resume", "resume_from", "address", "progress")
# What a refresh changes of its base model's settings, before the YAML and the flags (EPOCHS_HELP, FIRST_EPOCH_HELP).
REFRESH_DEFAULTS = {"epochs": 1, "first_epoch": "changed"}


def train_config(values: dict, flags: dict, source: str | None = None, model: str | None = None,
                 base_model: str | None = None) -> TrainConfig:
    """A run's TrainConfig: the library's defaults < the earlier model's settings < the YAML `values` (read
    from `source`) < the `flags` (argparse's, unset ones None), validated. The earlier model is --init-from's
    (its shape: warmstart.taken_settings, which refuses a value that contradicts it), or a refresh's
    `base_model` (all its settings but NOT_CARRIED, then REFRESH_DEFAULTS, and init_from it). A run that
    resumes (`resume` set, and its `model` directory given) is that checkpoint's config, changed only where
    the YAML or a flag says so (trainer.resumed_config). --no-progress (flags) turns the bars off."""
    from .warmstart import taken_settings

    named = [(source or "--config", values), ("", flags)]
    if base_model is not None:
        taken = taken_settings(base_model, named, flag="--base-model")
        saved = {k: v for k, v in dataclasses.asdict(modeldir.ModelDir(base_model).config()).items()
                 if k not in NOT_CARRIED}
        config = build(TrainConfig, saved, taken, REFRESH_DEFAULTS, values, flags, {"init_from": base_model})
    else:
        init_from = flags.get("init_from") or values.get("init_from")
        resumed = flags.get("resume") or values.get("resume")  # a resumed run has its checkpoint's shape
        taken = taken_settings(init_from, named) if init_from and not resumed else {}
        config = build(TrainConfig, taken, values, flags)
    progress = bool(values.get("progress", True)) and not flags.get("no_progress")
    config.progress = progress
    config = config.validate()  # a version named (resume_from) is a resume too
    if model is not None and config.resume:
        from .trainer import resumed_config

        config = resumed_config(model, explicit_values(TrainConfig, values, flags))
        config.progress = progress
    return config.validate()


def trained(corpus: str, out: str, config: TrainConfig, **how) -> tuple[dict, TrainConfig]:
    """trainer.train with as many workers as pay on this corpus (plan.train_workers), then how far a run
    from an earlier model moved its vectors (drift.after_training): what `train` and the jobs run. Returns
    the run's summary and the config it ran with."""
    from .drift import after_training
    from .plan import train_workers
    from .trainer import train

    config = train_workers(corpus, config)  # fewer workers where more would not pay (a small corpus)
    summary = train(corpus, out, config, **how)
    after_training(summary, config.init_from, out)
    return summary, config


# -- the whole job (jobs/train.py) --------------------------------------------------------------------------

# The keys that say what the job runs on: with none of them given as a flag, and no --config, it runs the sample.
DATA_KEYS = ("input", "corpus", "out")
# Beside the model directory OUT, with --input: the corpus the job prepares, and the held-out pairs of --holdout.
CORPUS_SUFFIX, HELDOUT_SUFFIX = "-corpus", "-heldout.parquet"
REPORT_PAGE = "report.html"  # the job's page (doc2vec-dist report), in the exports directory
# The prepare settings that make a corpus what it is, as corpus.json records them (and its URL rule, and the seed
# of a holdout): a corpus found at the job's corpus path is used only when it was prepared from the same input files
# with these same settings. The others (parallel, engine, memory_budget_bytes) make the same corpus.
CORPUS_SETTINGS = ("format", "doc_col", "token_col", "time_col", "time_unit", "delimiter", "min_count", "max_vocab",
                   "holdout", "holdout_out", "base", "window_days", "expire_days", "max_tokens_per_doc", "num_shards")


class Origin(NamedTuple):
    """Where a job's settings came from: the config file (None: the library's defaults), whether the job
    chose the corpus path itself (the sample's, or OUT-corpus) rather than a flag or the user's config
    naming it, and the arguments it was given (for the command that resumes it)."""

    config: str | None
    corpus_chosen: bool = False
    argv: tuple[str, ...] = ()
    script: str = os.path.join(CHECKOUT, "jobs", "train.py")  # the job's own, which the resume command runs


def parse_job(argv: list[str] | None, root: str = CHECKOUT,
              description: str | None = None) -> tuple[JobConfig, PrepareConfig, TrainConfig, Origin]:
    """The job's settings from its arguments, and where they came from. `root`: the checkout the job runs
    from (its bundled sample's config and data); `description`: the job's --help."""
    from .cli import add_config_flags

    sample_config = os.path.join(root, SAMPLE_CONFIG)
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (default: the bundled sample's, jobs/configs/sample.yaml, when no "
                                     "--input, --corpus or --out is given; else none: the library's defaults)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--input", nargs="+", default=None,
                    help="raw inputs to prepare the corpus from (files, dirs, globs); needs --out, and the corpus goes "
                         f"to OUT{CORPUS_SUFFIX} unless --corpus says where")
    for cls in (JobConfig, PrepareConfig, TrainConfig):
        add_config_flags(ap, cls)
    for action in ap._actions:
        if action.dest == "corpus":
            action.help = ("prepared corpus directory, made from the input if it does not exist (default with --input: "
                           f"OUT{CORPUS_SUFFIX})")
        elif action.dest == "holdout_out":
            action.help = f"{action.help} (default with --input and --holdout: OUT{HELDOUT_SUFFIX})"
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    flags = vars(args)
    config = args.config or (None if any(flags.get(k) for k in DATA_KEYS) else sample_config)
    values = load_yaml(config) if config else {}
    print("config: " + ("none (the library's defaults, and the flags given)" if config is None else
                        f"{os.path.relpath(config, root)}, the bundled sample's (`--input EVENTS --out DIR` trains on "
                        "yours)" if args.config is None else config), file=sys.stderr)
    # relative paths in the sample config are relative to the checkout, wherever the job is started from
    sample = config is not None and os.path.abspath(config) == sample_config
    base = root if sample else os.getcwd()
    corpus_chosen = sample and not flags.get("corpus")
    if config and not any(values.get(k) or flags.get(k) for k in DATA_KEYS):
        values, base, corpus_chosen = _on_the_sample(config, values, sample_config), root, True
    where = config or "the flags"
    job, prep = (build(cls, values, flags) for cls in (JobConfig, PrepareConfig))
    train_cfg = train_config(values, flags, config, model=None)  # resumed below, once the model's path is known
    if job.input and not job.out:
        raise UserError("--input needs --out MODEL_DIR: the job writes the model there, its exports in "
                        f"MODEL_DIR/exports, and the corpus it prepares from the input in MODEL_DIR{CORPUS_SUFFIX}")
    if not job.out or not (job.corpus or job.input):
        raise UserError((f"{config}: " if config else "") + "give 'out' (--out, the model directory) and 'input' "
                        "(--input, events to prepare a corpus from) or 'corpus' (--corpus, a prepared corpus)")
    if job.out and "://" in job.out and not job.exports:
        raise UserError(f"{where}: 'out' is {job.out}, on object storage; set 'exports' (--exports) to a "
                        "path for the Parquet exports and the faiss index")
    job.input = [_resolve(p, base) for p in job.input]
    place = _output_resolver(where, job.root, base)
    job.corpus, job.out = place("corpus", job.corpus), place("out", job.out)
    if not job.corpus:  # --input: the corpus the job prepares goes beside the model
        if "://" in job.out:
            raise UserError(f"{where}: 'out' is {job.out}, on object storage; set 'corpus' (--corpus) to a path every "
                            "node sees for the corpus prepared from the input")
        job.corpus, corpus_chosen = job.out + CORPUS_SUFFIX, True
    job.exports = place("exports", job.exports) or os.path.join(job.out, "exports")
    prep.holdout_out = place("holdout_out", prep.holdout_out)
    if prep.holdout > 0 and not prep.holdout_out and "://" not in job.out:
        prep.holdout_out = job.out + HELDOUT_SUFFIX
    if train_cfg.resume:  # the checkpoint's config, changed only where a flag or the YAML says so
        train_cfg = train_config(values, flags, config, model=job.out)
    return job, prep, train_cfg, Origin(config, corpus_chosen, tuple(argv), os.path.join(root, "jobs", "train.py"))


def _resolve(path: str | None, base: str) -> str | None:
    return path if path is None or "://" in path or os.path.isabs(path) else os.path.join(base, path)


def _on_the_sample(config: str, values: dict, sample_config: str) -> dict:
    """A config of training keys only (jobs/configs/gpu.yaml) runs on the bundled sample: the sample's
    input, corpus and held-out split, and a model and exports of its own under runs/NAME/."""
    sample = load_yaml(sample_config)
    name = os.path.splitext(os.path.basename(config))[0]
    job_keys = field_names(JobConfig) | field_names(PrepareConfig)
    defaults = {k: v for k, v in sample.items() if k in job_keys}
    defaults.update(out=f"runs/{name}/model", exports=f"runs/{name}/exports")
    print(f"{config} sets no input, corpus or out: running it on the bundled sample ({defaults['corpus']}), "
          f"model in {defaults['out']}", file=sys.stderr)
    return {**defaults, **values}


def submitted_with_working_dir() -> bool:
    """Whether this process is the entrypoint of `ray job submit --working-dir …`: its working
    directory is then Ray's temporary copy of the upload, deleted when the job ends."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return False
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return False
    return bool(runtime_env.get("working_dir"))


def _output_resolver(config: str, root: str | None, base: str):
    """resolve(key, path) for the outputs: a relative path goes under `root` if given, else `base`;
    inside a submitted job with a working dir, a relative output with no absolute root is refused."""
    in_job = submitted_with_working_dir()
    if root is not None and "://" not in root:
        if not os.path.isabs(root) and in_job:
            raise UserError(f"--root {root}: give an absolute path; inside `ray job submit --working-dir` a relative "
                            "one is Ray's temporary copy of the working dir")
        root = os.path.abspath(root)

    def resolve(key: str, path: str | None) -> str | None:
        if path is None or "://" in path or os.path.isabs(path):
            return path
        if root is None and in_job:
            raise UserError(f"{config}: '{key}' is the relative path {path}, which inside `ray job submit "
                            "--working-dir` lands in Ray's temporary copy of the working dir and vanishes when the "
                            "job ends; pass --root DIR (storage every node sees) to put relative outputs under DIR, "
                            "or give absolute paths")
        return os.path.join(root or base, path)

    return resolve


def run_job(job: JobConfig, prep: PrepareConfig, cfg: TrainConfig, origin: Origin | None = None) -> dict:
    from .evaluate import heldout_metrics
    from .export import export
    from .index import build_index
    from .model import neighbors
    from .prepare import prepare
    from .report import report as make_report

    origin = origin or Origin(None)
    stages: dict[str, float] = {}
    prepare_again = corpus_to_prepare(job, prep, cfg, origin)
    # every place the job writes, before the first step: a read-only one would stop it only after training
    for path, inside in ((job.corpus if prepare_again is not None else None, False), (job.out, True),
                         (job.exports, True)):
        outputs.check_writable(path, inside=inside)
    t = time.perf_counter()
    if prepare_again is None:
        print(f"corpus: using {job.corpus}", file=sys.stderr)
    else:
        print(f"corpus: preparing {job.corpus} from {', '.join(job.input)}", file=sys.stderr)
        prepare(job.input, job.corpus, on_cluster(prep, cfg), overwrite=prepare_again or job.overwrite,
                progress=cfg.progress)
    stages["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    summary, cfg = trained(job.corpus, job.out, cfg, overwrite=job.overwrite,
                           resume_command=resume_command(origin.argv, origin.script))
    stages["train"] = time.perf_counter() - t

    t = time.perf_counter()
    model = modeldir.local_copy(job.out)  # a model on object storage is read from a verified local copy
    os.makedirs(job.exports, exist_ok=True)
    users = export(model, "docs", os.path.join(job.exports, "users.parquet"), progress=cfg.progress)
    urls = export(model, "words_out", os.path.join(job.exports, "urls.parquet"), progress=cfg.progress)
    stages["export"] = time.perf_counter() - t

    t = time.perf_counter()
    index = build_index(os.path.join(job.exports, "users.index"), kind="auto", model=model, table="docs",
                        progress=cfg.progress)
    stages["index"] = time.perf_counter() - t

    result = {"train": summary, "export": [users, urls], "index": index, "stages": stages}
    heldout = prep.holdout_out if prep.holdout_out and os.path.exists(prep.holdout_out) else None
    if heldout:
        t = time.perf_counter()
        result["heldout"] = heldout_metrics(model, heldout)
        stages["evaluate"] = time.perf_counter() - t
    first_user = modeldir.ModelDir(model).keys("docs")[0].as_py()
    result["example"] = {"user": first_user,
                         "similar_users": neighbors(model, [first_user], k=5).column("neighbor").to_pylist(),
                         "likely_urls": neighbors(model, [first_user], k=5, against="words_out")
                         .column("neighbor").to_pylist()}
    t = time.perf_counter()  # the page a person reads: how the run went, and the model's quality and space
    result["report"] = make_report(model, os.path.join(job.exports, REPORT_PAGE), heldout=heldout)["path"]
    stages["report"] = time.perf_counter() - t
    storage.write_local(os.path.join(job.exports, "job.json"), storage.json_bytes(result))
    return result


def corpus_to_prepare(job: JobConfig, prep: PrepareConfig, cfg: TrainConfig, origin: Origin) -> bool | None:
    """Whether the job prepares its corpus: None to use the one at job.corpus as it is; False to prepare a
    new one there; True to prepare again over one that was prepared from other inputs or settings (only
    where the job chose that path itself and --overwrite allows; else that is refused in one line, as a
    missing corpus with no input to prepare it from is)."""
    from .corpus import Corpus

    meta_path = os.path.join(job.corpus, "corpus.json")
    if not os.path.exists(meta_path):
        if not job.input:
            raise UserError(f"{job.corpus} does not exist and no 'input' is configured to prepare it from")
        if cfg.resume:
            raise UserError(f"{job.corpus}: no corpus there to resume training on")
        return False
    if not job.input:  # a corpus given alone: nothing to check it against
        return None
    differs = corpus_differs(Corpus(job.corpus).meta, job.input, prep, cfg.seed)
    if differs is None:
        return None
    if origin.corpus_chosen and job.overwrite and not cfg.resume:
        print(f"warning: corpus: {job.corpus} was {differs}; preparing it again (--overwrite)", file=sys.stderr)
        return True
    way_out = ("pass --overwrite to prepare it again" if origin.corpus_chosen and not cfg.resume else
               "the corpus a resumed model was trained on cannot change" if cfg.resume else
               "name another corpus (--corpus), or remove this one to prepare it there again")
    raise UserError(f"{job.corpus}: {differs}; {way_out}")


def corpus_differs(meta: dict, inputs: list[str], prep: PrepareConfig, seed: int) -> str | None:
    """How the corpus that corpus.json `meta` describes differs from one prepared from `inputs` with `prep`
    (CORPUS_SETTINGS; the seed where something is held out), in words; None when it does not."""
    from .prepare import time_unit_asked
    from .read_files import csv_delimiter, expand_inputs
    from .urls import RAW, UrlRule

    files = [_same_path(f) for f in expand_inputs(inputs, prep.format)]
    made = [_same_path(f) for f in meta.get("input_files") or []]
    recorded = ", ".join(map(str, meta.get("inputs") or made))
    if files != made:
        if [_same_path(p) for p in meta.get("inputs") or []] == [_same_path(p) for p in inputs]:
            return (f"prepared from {recorded} when it held other files ({len(set(files) - set(made))} new, "
                    f"{len(set(made) - set(files))} gone since)")
        return f"prepared from other inputs ({recorded}), not {', '.join(inputs)}"
    wanted = {k: getattr(prep, k) for k in CORPUS_SETTINGS}
    found = {k: meta.get(k) for k in CORPUS_SETTINGS}
    # as prepare records them: --time-unit as asked (moot where no time was a number), the base in "refresh", the
    # delimiter as its character; the shards' count, where one was asked for
    unit, numbers = time_unit_asked(meta)
    found.update(time_unit=unit, base=(meta.get("refresh") or {}).get("base"))
    wanted.update(time_col=prep.time_col if prep.format == "events" else None, delimiter=csv_delimiter(prep.delimiter),
                  time_unit=prep.time_unit if numbers else found["time_unit"],
                  num_shards=found["num_shards"] if prep.num_shards is None else prep.num_shards)
    for k in ("holdout_out", "base"):
        wanted[k], found[k] = (_same_path(v) if v else None for v in (wanted[k], found[k]))
    if prep.holdout > 0:
        wanted["seed"], found["seed"] = seed, meta.get("seed")
    say = {None: "none"}  # a setting as a message shows it
    changed = [f"{k} {say.get(found[k], found[k])}, not {say.get(v, v)}" for k, v in wanted.items() if found[k] != v]
    # the URL rule, as prepare records it (none recorded: URLs as written, RAW); with a base, the base's
    rule = RAW if prep.format == "text" else UrlRule.of_settings(prep.no_normalize, prep.drop_query, prep.drop_params,
                                                                prep.merge_www)
    made_by = UrlRule.from_json(meta.get("url_rule"), "corpus.json")
    if made_by != rule and prep.base is None:
        changed.append(f"{made_by.describe()}, not {rule.describe()}")
    return f"prepared with {'; '.join(changed)}" if changed else None


# Where `ray job submit --working-dir` unpacks the upload on a node: a directory named by the upload's hash,
# which changes with any file of it (and the session): a file inside is known by its path in the upload.
RAY_UPLOAD = re.compile(r"^.*/_ray_pkg_[0-9a-f]+(?=/)")


def _same_path(path: str) -> str:
    """A path in the form two spellings of one file share: a local file's real path (inside a Ray upload,
    its path there), a URI as it is."""
    return path if storage.is_uri(path) else RAY_UPLOAD.sub("<working dir>", os.path.realpath(path))


def resume_command(argv: Sequence[str], script: str = os.path.join(CHECKOUT, "jobs", "train.py")) -> str:
    """The command that resumes a job where a stopped run left its model, and then does the job's later
    steps: the job as it was started (this Python, the job's script, the arguments `argv`), with --resume;
    inside `ray job submit`, that entrypoint submitted again."""
    import shlex

    here = os.path.relpath(sys.executable)
    python = "python" if submitted_with_working_dir() else sys.executable if here.startswith("..") else here
    args = [*argv, *([] if "--resume" in argv else ["--resume"])]
    command = shlex.join([python, os.path.relpath(os.path.abspath(script)), *args])
    return f"ray job submit … -- {command}" if submitted_with_working_dir() else command


def on_cluster(prep: PrepareConfig, cfg: TrainConfig) -> PrepareConfig:
    """The prepare settings of a job: on a cluster (an address, RAY_ADDRESS as `ray job submit` sets it,
    or a Ray this process is already connected to) its passes run as Ray tasks on every CPU of it
    unless --parallel says otherwise; else in this process, without starting a Ray for it. The seed
    and the address are training's."""
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    parallel = prep.parallel if prep.parallel is not None else 0 if address or connected else None
    return dataclasses.replace(prep, parallel=parallel, address=address, seed=cfg.seed)


def print_job(result: dict, job: JobConfig) -> None:
    """The job's summary: training, the stages' times, the held-out recall, an example user, the outputs."""
    s = result["train"]
    print(f"\ntrained {s['tokens']:,} tokens in {s['train_seconds']:.1f}s "
          f"({s['tokens_per_second'] / 1e6:.3f}M tokens/s); loss by epoch "
          + " ".join(f"{x:.3f}" for x in s["loss_per_epoch"]))
    print("stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in result["stages"].items()))
    if "heldout" in result:
        h = result["heldout"]
        k = h["k"]
        print(f"held-out recall@{k}: model {h['model_recall@' + str(k)]:.3f} vs most-popular "
              f"{h['popularity_recall@' + str(k)]:.3f} ({h['users']:,} users)")
    ex = result["example"]
    print(f"user {ex['user']}: similar users {', '.join(ex['similar_users'])}")
    print(f"  likeliest URLs: {', '.join(ex['likely_urls'])}")
    print(f"outputs: model {job.out}, exports {job.exports} (users.parquet, urls.parquet, users.index, job.json)")
    print(f"report: {result['report']}")


def train_job(argv: list[str] | None = None, root: str = CHECKOUT, description: str | None = None) -> int:
    """jobs/train.py: the whole job, its exit status (logs.command: an error in one line, Ctrl-C after
    train() has said what became of the model and how to resume it)."""
    from .logs import command

    def work() -> None:
        job, prep, cfg, origin = parse_job(argv, root, description)
        print_job(run_job(job, prep, cfg, origin), job)

    return command(work)


# -- the daily refresh (jobs/refresh.py) ---------------------------------------------------------------------

# What a refresh sets otherwise: the base is --base-model / --base-corpus, and a refresh holds
# nothing out (the base's users were trained on everything they had: hold out before the base).
PREPARE_SET_HERE = ("base", "holdout", "holdout_out")
TRAIN_SET_HERE = ("init_from", "resume")
# Prepare settings that default to the base corpus's own, so today's events are read (and capped) as
# yesterday's were.
PREPARE_FROM_BASE = ("format", "doc_col", "token_col", "time_col", "delimiter", "max_tokens_per_doc")
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
    recall_queries: int | None = None  # None: index.RECALL_QUERIES
    argv: tuple[str, ...] = ()      # as given: the command that resumes the refresh repeats them
    script: str = os.path.join(CHECKOUT, "jobs", "refresh.py")  # the job's own, which that command runs

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)


def parse_refresh(argv: list[str] | None, description: str | None = None) -> tuple[RefreshJob, PrepareConfig,
                                                                                  TrainConfig]:
    """The refresh's inputs and outputs, and its prepare and training settings, from its arguments."""
    from .cli import add_config_flags
    from .runners import calm_openmp

    calm_openmp()  # before faiss is imported
    from .index import KINDS, RECALL_QUERIES

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    add_config_flags(ap, PrepareConfig, skip=PREPARE_SET_HERE)
    add_config_flags(ap, TrainConfig, skip=TRAIN_SET_HERE)
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
        check_resumable(job.out)
        cfg = train_config(values, flags, args.config, model=job.path("model"))
    else:
        cfg = train_config(values, flags, args.config, base_model=job.base_model)
    return job, prep, cfg


def base_corpus_settings(job: RefreshJob) -> dict:
    """How the base corpus read its events (format, columns), so today's are read the same way; {} when
    the base model's corpus is gone (a --window-days refresh needs none)."""
    from .corpus import Corpus

    try:
        meta = Corpus(job.base_corpus or modeldir.ModelDir(job.base_model).corpus_path()).meta
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

    if not os.path.isdir(day) or not outputs.check_dir(day, "refresh", None):
        raise UserError(f"{day}: holds no refresh to resume; run the refresh without --resume")
    if modeldir.latest_version(os.path.join(day, "model")) is None:
        raise UserError(f"{day}: its model has no checkpoint to resume from; remove {day} to run that day again")
    done = [name for name in ("exports", "index", "refresh.json") if os.path.exists(os.path.join(day, name))]
    if done:
        raise UserError(f"{day}: the refresh got past training ({', '.join(done)} there), so there is no training to "
                        f"resume; remove {day} to run that day again")


def run_refresh(job: RefreshJob, prep: PrepareConfig, cfg: TrainConfig) -> dict:
    """The refresh's steps into DAY_DIR, which it marks as a refresh's; a refresh that stopped before it kept
    anything leaves no trace."""
    if cfg.resume:  # check_resumable said what DAY_DIR holds: only the steps after training are left to write
        return _steps(job, prep, cfg)
    check_day_dir(job.out)
    outputs.check_writable(job.out, inside=True)  # every step writes inside it
    made = outputs.make_dirs(job.out)
    try:
        outputs.write_marker(job.out, "refresh")
        return _steps(job, prep, cfg)
    except BaseException:
        left = os.listdir(job.out)
        if left in ([outputs.MARKER], []):  # nothing was kept: leave no trace, so the day can run again
            if left:
                os.remove(os.path.join(job.out, outputs.MARKER))
            outputs.remove_dirs(made)
        raise


def _steps(job: RefreshJob, prep: PrepareConfig, cfg: TrainConfig) -> dict:
    import ray

    from .corpus import Corpus
    from .export import export
    from .index import RECALL_QUERIES, build_index
    from .index_update import update_index
    from .prepare import prepare
    from .report import report as make_report
    from .runners import run_on_ray

    stages: dict[str, float] = {}
    result: dict = {"events": job.events, "base_model": job.base_model, "base_corpus": job.base_corpus,
                    "out": job.out, "old_index": job.index, "stages": stages}

    t = time.perf_counter()
    prep = dataclasses.replace(on_cluster(prep, cfg), base=job.base_corpus or job.base_model)
    if cfg.resume:  # prepared by the run that stopped: from the events and with the settings asked for here
        corpus = Corpus(job.path("corpus"))
        differs = corpus_differs(corpus.meta, job.events, prep, cfg.seed)
        if differs:
            raise UserError(f"{corpus.path}: {differs}; --resume trains on the corpus the refresh's first run "
                            "prepared: give that run's --events and prepare flags, or refresh into another --out")
    else:
        corpus = prepare(job.events, job.path("corpus"), prep, progress=cfg.progress, report=True)
        stages["prepare"] = time.perf_counter() - t
    result["events"] = corpus.meta.get("inputs") or job.events  # what the corpus was made of (resumed: its first run's)
    result["prepare"] = {k: corpus.meta.get(k) for k in ("num_docs", "num_tokens", "vocab_size", "refresh", "skipped",
                                                         "time_range", "window_days", "expire_days")}

    t = time.perf_counter()
    result["train"], cfg = trained(corpus.path, job.path("model"), cfg,
                                   resume_command=resume_command(job.argv, job.script))
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
              "recall_queries": job.recall_queries if job.recall_queries is not None else RECALL_QUERIES}
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


def print_refresh(result: dict) -> None:
    """The refresh's summary block: one line per step, then the times."""
    from .index import summary_line

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


def refresh_job(argv: list[str] | None = None, root: str = CHECKOUT, description: str | None = None) -> int:
    """jobs/refresh.py: the refresh, its exit status (as train_job)."""
    from .logs import command

    def work() -> None:
        job, prep, cfg = parse_refresh(argv, description)
        job.script = os.path.join(root, "jobs", "refresh.py")
        print_refresh(run_refresh(job, prep, cfg))

    return command(work)


# -- the serving jobs (jobs/export.py, jobs/index.py): their per-part work as Ray tasks ------------------------

def _serving_parser(description: str | None, model_required: bool = True) -> argparse.ArgumentParser:
    """The flags jobs/export.py and jobs/index.py share (an index may be built from --vectors instead)."""
    from .modeldir import KEY_TABLES

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=model_required, help="model directory")
    ap.add_argument("--table", default="docs", choices=tuple(KEY_TABLES))
    return ap


def _parse_on_ray(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The serving job's flags and the two of Ray that close its --help, parsed."""
    ap.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap.parse_args(argv)


def parse_export(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    from .export import FORMATS

    ap = _serving_parser(description)
    ap.add_argument("--out", required=True, help="output directory (or FILE.parquet, FILE.txt for word2vec)")
    ap.add_argument("--format", default="parquet", choices=FORMATS)
    ap.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    return _parse_on_ray(ap, argv)


def parse_index(argv: list[str] | None, description: str | None = None) -> argparse.Namespace:
    from .runners import calm_openmp

    calm_openmp()  # before faiss is imported
    from .index import KINDS

    ap = _serving_parser(description, model_required=False)
    ap.add_argument("--vectors", help="Parquet file or directory of key, vector (instead of --model)")
    ap.add_argument("--out", required=True, help="index directory")
    ap.add_argument("--kind", default=None, choices=KINDS,
                    help="auto: flat up to 1M rows, else ivfpq (default: auto; with --update, the old index's kind)")
    ap.add_argument("--update", metavar="OLD_INDEX", help="update this index to the new source (see `index --update`)")
    ap.add_argument("--recall-queries", type=int, default=1000, help="queries for recall@10 vs exact")
    return _parse_on_ray(ap, argv)


def on_ray(address: str | None, work) -> int:
    """A job's `work` inside a connection to Ray at `address` (else RAY_ADDRESS, as `ray job submit` sets it,
    else a local Ray started here); its exit status, as logs.command gives it (an error in one line)."""
    from .cluster import ray_connection
    from .logs import command

    def connected() -> None:
        with ray_connection(address):
            work()

    return command(connected)


def export_job(argv: list[str] | None = None, description: str | None = None) -> int:
    """jobs/export.py: a table exported by one Ray task per checkpoint part; its exit status."""
    from .export import export
    from .runners import run_on_ray

    args = parse_export(argv, description)

    def work() -> None:
        r = export(args.model, args.table, args.out, format=args.format, normalize=args.normalize, dtype=args.dtype,
                   progress=not args.no_progress, runner=run_on_ray)
        by = (f"by {len(r['tasks'])} Ray tasks on {', '.join(sorted({t['host'] for t in r['tasks']}))}" if r["ran"]
              == "tasks" else f"in this process (one writer: {'a .parquet file' if r['format'] == 'parquet' else r['format']})")
        print(f"exported {r['rows']:,} rows of {r['table']} to {r['path']} in {r['seconds']:.2f}s "
              f"({r['rows_per_second']:,.0f} rows/s) {by}")

    return on_ray(args.address, work)


def index_job(argv: list[str] | None = None, description: str | None = None) -> int:
    """jobs/index.py: a faiss index built (or --update'd) with its per-file work as Ray tasks; its exit status."""
    args = parse_index(argv, description)
    from .index import build_index, summary_line
    from .index_update import update_index
    from .runners import run_on_ray

    def work() -> None:
        common = {"model": args.model, "table": args.table, "vectors_path": args.vectors, "runner": run_on_ray,
                  "progress": not args.no_progress, "report": False, "recall_queries": args.recall_queries}
        if args.update:
            params = update_index(args.update, args.out, kind=args.kind, **common)
        else:
            params = build_index(args.out, kind=args.kind or "auto", **common)
        print(summary_line(params))
        hosts = sorted({t["host"] for t in params["tasks"]})
        print(f"{len(params['tasks'])} Ray tasks on {', '.join(hosts)}")

    return on_ray(args.address, work)
