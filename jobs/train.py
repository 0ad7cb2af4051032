"""The whole job: prepare (if needed) → train on Ray → export → faiss index → evaluate.

    python jobs/train.py                                   # the bundled sample, a local Ray started here
    python jobs/train.py --config my.yaml --epochs 20      # flags override the YAML, same names
    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/sample.yaml

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the same code joins the cluster; the
paths in the config must then be on storage every node sees.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

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


def parse(argv: list[str] | None) -> tuple[JobConfig, PrepareConfig, TrainConfig, str]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (default: the sample's)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--input", nargs="+", default=None, help="raw inputs for prepare (files, dirs, globs)")
    for cls in (JobConfig, PrepareConfig, TrainConfig):
        _add_config_flags(ap, cls)
    args = ap.parse_args(argv)
    values = load_yaml(args.config)
    flags = vars(args)
    # relative paths in the sample config are relative to the checkout, wherever the job is started from
    base = ROOT if os.path.abspath(args.config) == DEFAULT_CONFIG else os.getcwd()
    if not any(values.get(k) or flags.get(k) for k in ("input", "corpus", "out")):
        values, base = _on_the_sample(args.config, values), ROOT
    job, prep = (build(cls, values, flags) for cls in (JobConfig, PrepareConfig))
    taken: dict = {}
    init_from = flags.get("init_from") or values.get("init_from")
    if init_from and not (flags.get("resume") or values.get("resume")):  # the model's shape, as train --init-from
        from doc2vec_dist.warmstart import taken_settings

        taken = taken_settings(init_from, [(args.config, values), ("", flags)])
    train_cfg = build(TrainConfig, taken, values, flags)
    if args.no_progress:
        train_cfg.progress = False
    if not job.corpus or not job.out:
        raise UserError(f"{args.config}: 'corpus' and 'out' must be set")
    if job.out and "://" in job.out and not job.exports:
        raise UserError(f"{args.config}: 'out' is {job.out}, on object storage; set 'exports' (--exports) to a "
                        "path for the Parquet exports and the faiss index")
    job.input = [_resolve(p, base) for p in job.input]
    place = _output_resolver(args.config, job.root, base)
    job.corpus, job.out = place("corpus", job.corpus), place("out", job.out)
    job.exports = place("exports", job.exports) or os.path.join(job.out, "exports")
    prep.holdout_out = place("holdout_out", prep.holdout_out)
    if train_cfg.resume:  # the checkpoint's config, changed only where a flag or the YAML says so
        from doc2vec_dist.trainer import resumed_config

        progress = train_cfg.progress
        train_cfg = resumed_config(job.out, explicit_values(TrainConfig, values, flags))
        train_cfg.progress = progress
    return job, prep, train_cfg.validate(), args.config


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


def run(job: JobConfig, prep: PrepareConfig, cfg: TrainConfig) -> dict:
    from doc2vec_dist import checkpoint
    from doc2vec_dist.evaluate import heldout_metrics
    from doc2vec_dist.export import export
    from doc2vec_dist.index import build_index
    from doc2vec_dist.model import neighbors
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.trainer import train

    stages: dict[str, float] = {}
    prepared = os.path.exists(os.path.join(job.corpus, "corpus.json"))
    # every place the job writes, before the first step: a read-only one would stop it only after training
    for path, inside in ((None if prepared else job.corpus, False), (job.out, True), (job.exports, True)):
        outputs.check_writable(path, inside=inside)
    t = time.perf_counter()
    if prepared:
        print(f"corpus: using {job.corpus}", file=sys.stderr)
    else:
        if not job.input:
            raise UserError(f"{job.corpus} does not exist and no 'input' is configured to prepare it from")
        prepare(job.input, job.corpus, on_cluster(prep, cfg), progress=cfg.progress)
    stages["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    summary = train(job.corpus, job.out, cfg, overwrite=job.overwrite)
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
    storage.write_local(os.path.join(job.exports, "job.json"), storage.json_bytes(result))
    return result


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


def main(argv: list[str] | None = None) -> int:
    def work() -> None:
        job, prep, cfg, _ = parse(argv)
        report(run(job, prep, cfg), job)

    return command(work)  # Ctrl-C: train() has said what became of the model, and how to resume it


if __name__ == "__main__":
    sys.exit(main())
