"""The whole job: prepare (if needed) → train on Ray → export → faiss index → evaluate → the report page.

    python jobs/train.py                                   # the bundled sample, a local Ray started here
    python jobs/train.py --input events/ --out runs/mine/model   # your events, the library's defaults
    python jobs/train.py --config my.yaml --epochs 20      # flags override the YAML, same names
    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/sample.yaml

Which config: --config FILE; with none, the bundled sample's (jobs/configs/sample.yaml) when no --input,
--corpus or --out is given, else none: the library's defaults and the flags. The first line says which.

With --input and no corpus configured, the corpus is prepared beside the model, in OUT-corpus (and the
held-out pairs of --holdout in OUT-heldout.parquet); --input without --out is refused. A corpus found at
the corpus path is used only if corpus.json says it was prepared from the same input files with the same
settings; else the job refuses in one line, or, where it chose that path itself (OUT-corpus, the
sample's) and --overwrite is given, prepares it again.

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the same code joins the cluster; the
paths in the config must then be on storage every node sees.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout or a Ray working_dir without installing the package

from doc2vec_dist.environment import require_packages

require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist import outputs, storage
from doc2vec_dist.cli import _add_config_flags
from doc2vec_dist.config import (
    JobConfig,
    PrepareConfig,
    TrainConfig,
    build,
    explicit_values,
    field_names,
    load_yaml,
)
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import command

DEFAULT_CONFIG = os.path.join(ROOT, "jobs", "configs", "sample.yaml")
# The keys that say what the job runs on: with none of them given as a flag, and no --config, it runs the sample.
DATA_KEYS = ("input", "corpus", "out")
# Beside the model directory OUT, with --input: the corpus the job prepares, and the held-out pairs of --holdout.
CORPUS_SUFFIX, HELDOUT_SUFFIX = "-corpus", "-heldout.parquet"
REPORT_PAGE = "report.html"  # the job's page (doc2vec-dist report), in the exports directory
# The prepare settings that make a corpus what it is, as corpus.json records them: a corpus found at the
# job's corpus path is used only when it was prepared from the same input files with these same settings.
CORPUS_SETTINGS = ("format", "doc_col", "token_col", "time_col", "min_count", "max_vocab", "holdout", "holdout_out",
                   "window_days")


class Origin(NamedTuple):
    """Where a job's settings came from: the config file (None: the library's defaults), whether the job
    chose the corpus path itself (the sample's, or OUT-corpus) rather than a flag or the user's config
    naming it, and the arguments it was given (for the command that resumes it)."""

    config: str | None
    corpus_chosen: bool = False
    argv: tuple[str, ...] = ()


def parse(argv: list[str] | None) -> tuple[JobConfig, PrepareConfig, TrainConfig, str | None]:
    """The job's settings from its arguments, and the config file they were read from (None: none)."""
    job, prep, cfg, origin = parse_job(argv)
    return job, prep, cfg, origin.config


def parse_job(argv: list[str] | None) -> tuple[JobConfig, PrepareConfig, TrainConfig, Origin]:
    """parse(), with all of the settings' Origin."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (default: the bundled sample's, jobs/configs/sample.yaml, when no "
                                     "--input, --corpus or --out is given; else none: the library's defaults)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--input", nargs="+", default=None,
                    help="raw inputs to prepare the corpus from (files, dirs, globs); needs --out, and the corpus goes "
                         f"to OUT{CORPUS_SUFFIX} unless --corpus says where")
    for cls in (JobConfig, PrepareConfig, TrainConfig):
        _add_config_flags(ap, cls)
    for action in ap._actions:
        if action.dest == "corpus":
            action.help = ("prepared corpus directory, made from the input if it does not exist (default with --input: "
                           f"OUT{CORPUS_SUFFIX})")
        elif action.dest == "holdout_out":
            action.help = f"{action.help} (default with --input and --holdout: OUT{HELDOUT_SUFFIX})"
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    flags = vars(args)
    config = args.config or (None if any(flags.get(k) for k in DATA_KEYS) else DEFAULT_CONFIG)
    values = load_yaml(config) if config else {}
    print("config: " + ("none (the library's defaults, and the flags given)" if config is None else
                        f"{os.path.relpath(config, ROOT)}, the bundled sample's (`--input EVENTS --out DIR` trains on "
                        "yours)" if args.config is None else config), file=sys.stderr)
    # relative paths in the sample config are relative to the checkout, wherever the job is started from
    sample = config is not None and os.path.abspath(config) == DEFAULT_CONFIG
    base = ROOT if sample else os.getcwd()
    corpus_chosen = sample and not flags.get("corpus")
    if config and not any(values.get(k) or flags.get(k) for k in DATA_KEYS):
        values, base, corpus_chosen = _on_the_sample(config, values), ROOT, True
    where = config or "the flags"
    job, prep = (build(cls, values, flags) for cls in (JobConfig, PrepareConfig))
    taken: dict = {}
    init_from = flags.get("init_from") or values.get("init_from")
    if init_from and not (flags.get("resume") or values.get("resume")):  # the model's shape, as train --init-from
        from doc2vec_dist.warmstart import taken_settings

        taken = taken_settings(init_from, [(config or "--config", values), ("", flags)])
    train_cfg = build(TrainConfig, taken, values, flags)
    if args.no_progress:
        train_cfg.progress = False
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
        from doc2vec_dist.trainer import resumed_config

        progress = train_cfg.progress
        train_cfg = resumed_config(job.out, explicit_values(TrainConfig, values, flags))
        train_cfg.progress = progress
    return job, prep, train_cfg.validate(), Origin(config, corpus_chosen, tuple(argv))


def _resolve(path: str | None, base: str) -> str | None:
    return path if path is None or "://" in path or os.path.isabs(path) else os.path.join(base, path)


def _on_the_sample(config: str, values: dict) -> dict:
    """A config of training keys only (jobs/configs/gpu.yaml) runs on the bundled sample: the sample's
    input, corpus and held-out split, and a model and exports of its own under runs/NAME/."""
    sample = load_yaml(DEFAULT_CONFIG)
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


def run(job: JobConfig, prep: PrepareConfig, cfg: TrainConfig, origin: Origin | None = None) -> dict:
    from doc2vec_dist import checkpoint
    from doc2vec_dist.evaluate import heldout_metrics
    from doc2vec_dist.export import export
    from doc2vec_dist.index import build_index
    from doc2vec_dist.model import neighbors
    from doc2vec_dist.plan import train_workers
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.report import report as make_report
    from doc2vec_dist.trainer import train

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
    cfg = train_workers(job.corpus, cfg)  # fewer workers where more would not pay (a small corpus)
    summary = train(job.corpus, job.out, cfg, overwrite=job.overwrite, resume_command=resume_command(origin.argv))
    stages["train"] = time.perf_counter() - t

    t = time.perf_counter()
    model = checkpoint.local_copy(job.out)  # a model on object storage is read from a verified local copy
    os.makedirs(job.exports, exist_ok=True)
    users = export(model, "docs", os.path.join(job.exports, "users.parquet"), progress=cfg.progress)
    urls = export(model, "words_out", os.path.join(job.exports, "urls.parquet"), progress=cfg.progress)
    stages["export"] = time.perf_counter() - t

    t = time.perf_counter()
    index = build_index(os.path.join(job.exports, "users.index"), kind="auto", model=model, table="docs",
                        progress=cfg.progress)
    stages["index"] = time.perf_counter() - t

    result = {"train": summary, "export": [users, urls], "index": index, "stages": stages}
    heldout = prep.holdout_out
    if heldout and os.path.exists(heldout):
        t = time.perf_counter()
        result["heldout"] = heldout_metrics(model, heldout)
        stages["evaluate"] = time.perf_counter() - t
    first_user = _first_key(model)
    result["example"] = {"user": first_user,
                         "similar_users": neighbors(model, [first_user], k=5).column("neighbor").to_pylist(),
                         "likely_urls": neighbors(model, [first_user], k=5, against="words_out")
                         .column("neighbor").to_pylist()}
    t = time.perf_counter()  # the page a person reads: how the run went, and the model's quality and space
    result["report"] = make_report(model, os.path.join(job.exports, REPORT_PAGE),
                                   heldout=heldout if heldout and os.path.exists(heldout) else None)["path"]
    stages["report"] = time.perf_counter() - t
    storage.write_local(os.path.join(job.exports, "job.json"), storage.json_bytes(result))
    return result


def corpus_to_prepare(job: JobConfig, prep: PrepareConfig, cfg: TrainConfig, origin: Origin) -> bool | None:
    """Whether the job prepares its corpus: None to use the one at job.corpus as it is; False to prepare a
    new one there; True to prepare again over one that was prepared from other inputs or settings (only
    where the job chose that path itself and --overwrite allows; else that is refused in one line, as a
    missing corpus with no input to prepare it from is)."""
    from doc2vec_dist.corpus import Corpus

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
    from doc2vec_dist.read_files import expand_inputs
    from doc2vec_dist.urls import RAW, UrlRule

    files = [_same_path(f) for f in expand_inputs(inputs, prep.format)]
    made = [_same_path(f) for f in meta.get("input_files") or []]
    recorded = ", ".join(map(str, meta.get("inputs") or made))
    if files != made:
        if [_same_path(p) for p in meta.get("inputs") or []] == [_same_path(p) for p in inputs]:
            return (f"prepared from {recorded} when it held other files ({len(set(files) - set(made))} new, "
                    f"{len(set(made) - set(files))} gone since)")
        return f"prepared from other inputs ({recorded}), not {', '.join(inputs)}"
    wanted = {k: getattr(prep, k) for k in CORPUS_SETTINGS}
    wanted["time_col"] = prep.time_col if prep.format == "events" else None  # as prepare records it
    wanted["holdout_out"] = _same_path(prep.holdout_out) if prep.holdout_out else None
    found = {k: meta.get(k) for k in CORPUS_SETTINGS}
    found["holdout_out"] = _same_path(found["holdout_out"]) if found["holdout_out"] else None
    if prep.holdout > 0:
        wanted["seed"], found["seed"] = seed, meta.get("seed")
    changed = [f"{k} {_shown(found[k])}, not {_shown(v)}" for k, v in wanted.items() if found[k] != v]
    # the URL rule, as prepare records it (none recorded: URLs as written, RAW)
    rule = RAW if prep.format == "text" else UrlRule.of_settings(prep.no_normalize, prep.drop_query, prep.drop_params,
                                                                prep.merge_www)
    made_by = UrlRule.from_json(meta.get("url_rule"), "corpus.json")
    if made_by != rule:
        changed.append(f"{made_by.describe()}, not {rule.describe()}")
    return f"prepared with {'; '.join(changed)}" if changed else None


# Where `ray job submit --working-dir` unpacks the upload on a node: a directory named by the upload's hash,
# which changes with any file of it (and the session): a file inside is known by its path in the upload.
RAY_UPLOAD = re.compile(r"^.*/_ray_pkg_[0-9a-f]+(?=/)")


def _same_path(path: str) -> str:
    """A path in the form two spellings of one file share: a local file's real path (inside a Ray upload,
    its path there), a URI as it is."""
    return path if storage.is_uri(path) else RAY_UPLOAD.sub("<working dir>", os.path.realpath(path))


def _shown(value) -> str:
    return "none" if value is None else str(value)


def resume_command(argv: Sequence[str], script: str = __file__) -> str:
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


def _first_key(model: str) -> str:
    from doc2vec_dist.checkpoint import ModelDir

    return ModelDir(model).keys("docs")[0].as_py()


def report(result: dict, job: JobConfig) -> None:
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


def main(argv: list[str] | None = None) -> int:
    def work() -> None:
        job, prep, cfg, origin = parse_job(argv)
        report(run(job, prep, cfg, origin), job)

    return command(work)  # Ctrl-C: train() has said what became of the model, and how to resume it


if __name__ == "__main__":
    sys.exit(main())
