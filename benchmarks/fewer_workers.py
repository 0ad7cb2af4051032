"""Fewer workers where more would not pay (issue 50): measured tokens/s beside the model train asks.

    python benchmarks/fewer_workers.py --work runs/fewer                       # Lee and the sample, 1 and 2 workers
    python benchmarks/fewer_workers.py --work runs/fewer --prepare-users 200000 400000   # and prepare's choice
    python benchmarks/fewer_workers.py --work runs/fewer --sets pypi15k --corpus big=runs/c200k   # more corpora

For each corpus (Lee, test and background documents, as benchmarks/quality.py prepares it; the bundled
sample; with --sets, benchmarks/quality.py's sets as it prepares them; with --corpus NAME=PATH, a corpus
already prepared), trains 1 and 2 workers of one CPU each through the engine (trainer.train, a local Ray of 4 logical
CPUs), each twice (the first of a process compiles the kernel), and prints their tokens/s beside plan's model
uncalibrated (plan.choose_workers's figures: what `train --num-workers 2` asks before it starts) and the
count train would take. With --prepare-users, generates that many users (`generate --urls 100000 --seed 1`)
and times `prepare --time-col ts` in one process, with --parallel 2 starting a local Ray, and with
--parallel 0 on a Ray already up (as jobs/train.py on a cluster), before and after prepare's own choice
(prepare_merge.processes_that_pay). One JSON line per measurement on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def corpora(work: str) -> dict[str, str]:
    import harness

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = os.path.join(work, "lee.txt")
    harness.write_lee_text(text)
    lee = prepare([text], os.path.join(work, "lee"), PrepareConfig(format="text", min_count=2), overwrite=True,
                  progress=False)
    sample = prepare([os.path.join(root, "data", "sample", "events")], os.path.join(work, "sample"),
                     PrepareConfig(time_col="ts"), overwrite=True, progress=False)
    return {"lee": lee.path, "sample": sample.path}


def named_corpora(values: list[str]) -> dict[str, str]:
    """--corpus NAME=PATH values as {name: path}; a value without its name, or a path with no prepared corpus, is
    refused in one line naming it."""
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"error: --corpus {value!r}: give it as NAME=PATH")
        if not os.path.exists(os.path.join(path, "corpus.json")):
            raise SystemExit(f"error: --corpus {value!r}: {path} holds no prepared corpus (corpus.json)")
        out[name] = path
    return out


def train_rates(work: str, paths: dict[str, str], epochs: dict[str, int]) -> None:
    from doc2vec_dist import plan, plan_model
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.trainer import train

    for name, path in paths.items():
        cfg = TrainConfig(dim=100, epochs=epochs[name], num_workers=2, cpus_per_worker=1, checkpoint_every=0,
                          progress=False)
        corpus = Corpus(path)
        chosen, line = plan.choose_workers(corpus, cfg)
        cal = {"summary": {"tokens_per_second": plan.UNCALIBRATED_TOKENS_PER_SECOND["cpu"]}, "workers": 1}
        rows = plan_model.scaling_plan(corpus, cfg, cal, plan.CHOICE_NETWORK_GBPS, workers=(1, 2))
        _say(what="model", corpus=name, tokens=corpus.num_tokens, train_takes=chosen.num_workers, line=line,
             predicted={r["workers"]: r["tokens_per_second"] for r in rows})
        for workers in (1, 2, 1, 2):
            s = train(path, os.path.join(work, f"model-{name}-{workers}"), TrainConfig(
                **{**cfg.__dict__, "num_workers": workers}), overwrite=True)
            _say(what="train", corpus=name, workers=workers, tokens_per_second=s["tokens_per_second"],
                 train_seconds=s["train_seconds"], worker_seconds=s["worker_seconds"])


def prepare_times(work: str, users: list[int]) -> None:
    import ray

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.read_files import expand_inputs, input_bytes
    from doc2vec_dist.synthetic import generate

    made = {}
    for n in users:
        made[n] = os.path.join(work, f"g{n}")
        if not os.path.exists(os.path.join(made[n], "generate.json")):
            generate(made[n], n, 100_000, seed=1, progress=False)
    ways = [("one process", None), ("--parallel 2, a local Ray started", 2)]
    for n, path in made.items():
        size = input_bytes(expand_inputs([path], "events"))
        for how, parallel in ways:
            t = time.perf_counter()
            c = prepare([path], os.path.join(work, f"c{n}"), PrepareConfig(time_col="ts", parallel=parallel),
                        overwrite=True, progress=False)
            _say(what="prepare", users=n, input_bytes=size, how=how, seconds=time.perf_counter() - t,
                 processes=c.meta["parallel"])
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    for n, path in made.items():
        for how, parallel in (("parallel 0, a Ray already up (the job on a cluster)", 0), ("one process", None)):
            t = time.perf_counter()
            c = prepare([path], os.path.join(work, f"c{n}"), PrepareConfig(time_col="ts", parallel=parallel),
                        overwrite=True, progress=False)
            _say(what="prepare", users=n, how=how, seconds=time.perf_counter() - t, processes=c.meta["parallel"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="directory for the corpora and models (made if missing)")
    ap.add_argument("--lee-epochs", type=int, default=10)
    ap.add_argument("--sample-epochs", type=int, default=5)
    ap.add_argument("--sets", nargs="*", default=[], help="benchmarks/quality.py's sets to measure too (e.g. pypi15k)")
    ap.add_argument("--corpus", nargs="*", default=[], metavar="NAME=PATH", help="prepared corpora to measure too")
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the --sets and --corpus runs")
    ap.add_argument("--only", action="store_true", help="measure the --sets and --corpus corpora only (not Lee, the sample)")
    ap.add_argument("--prepare-users", type=int, nargs="*", default=[],
                    help="generated inputs of these many users to time prepare on")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    if args.prepare_users:
        prepare_times(args.work, args.prepare_users)
    else:
        import ray

        ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    paths = {} if args.only else corpora(args.work)
    epochs = {"lee": args.lee_epochs, "sample": args.sample_epochs}
    if args.sets:
        import quality

        paths.update({name: quality.make_set(name, args.work).corpus for name in args.sets})
    paths.update(named_corpora(args.corpus))
    train_rates(args.work, paths, {name: epochs.get(name, args.epochs) for name in paths})
    return 0


if __name__ == "__main__":
    sys.exit(main())
