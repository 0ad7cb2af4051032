"""The driver: connects to Ray, starts the parameter servers and workers, runs the epochs, checkpoints.

The driver moves no training data: workers read their own units of the corpus and talk to the
parameter servers directly. The driver only schedules epochs, shows progress, and asks each
parameter server to write its slice when a checkpoint is due.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import time

import numpy as np
import ray
from tqdm import tqdm

from . import checkpoint
from .config import TrainConfig, save_json
from .corpus import Corpus, iter_shard
from .errors import UserError
from .placement import ps_options, worker_options
from .ps import ParameterServer
from .worker import Unit, Worker


class TrainingStopped(UserError):
    """Training could not go on (a refused update, a failed actor); the last checkpoint is intact."""


def connect(address: str | None = None) -> bool:
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local Ray; True if we started one.

    A local Ray started here binds to loopback only and gets a small object store: pulls and pushes
    are the only objects that pass through it.
    """
    if ray.is_initialized():
        return False
    common = {"logging_level": "WARNING", "configure_logging": True, "log_to_driver": True}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **common)
        return False
    ray.init(include_dashboard=False, object_store_memory=local_object_store_bytes(), **common)
    return True


@contextlib.contextmanager
def ray_connection(address: str | None = None):
    """connect() for the length of a `with` block; shuts down a local Ray only if it started one."""
    started = connect(address)
    try:
        yield started
    finally:
        if started:
            ray.shutdown()


def local_object_store_bytes() -> int:
    """Object store of a local Ray: 15% of RAM, between 1 and 4 GiB.

    Only pulls and pushes pass through it, but with a vocabulary of ~1M URLs one macro-batch moves
    ~60 MB each way, and a few are in flight per worker: 512 MiB spilled 2.2 GB to disk on a
    1M-user corpus and halved throughput. Ray's default (30% of RAM) takes memory the PS tables need.
    """
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(0.15 * ram, 1 << 30), 4 << 30))


def plan_units(corpus: Corpus, num_workers: int) -> list[list[Unit]]:
    """Divide the corpus among workers with balanced token counts.

    With at least as many shard files as workers, whole files are dealt out, largest first to the
    least loaded worker. With fewer, each file is cut into row ranges of about equal tokens.
    """
    shards = [(path, info["docs"], info["tokens"]) for path, info in zip(corpus.shard_paths, corpus.meta["shards"])]
    if len(shards) >= num_workers:
        loads = [0] * num_workers
        plan: list[list[Unit]] = [[] for _ in range(num_workers)]
        for path, docs, tokens in sorted(shards, key=lambda s: -s[2]):
            w = int(np.argmin(loads))
            plan[w].append(Unit(path, 0, docs, tokens))
            loads[w] += tokens
        return plan
    pieces = -(-num_workers // len(shards))
    units: list[Unit] = []
    for path, docs, tokens in shards:
        lengths = np.concatenate([np.diff(offsets) for _, offsets, _ in iter_shard(path)] or [np.zeros(0)])
        cum = np.concatenate([[0], np.cumsum(lengths)])
        cuts = np.searchsorted(cum, np.linspace(0, cum[-1], pieces + 1), side="left")
        cuts[0], cuts[-1] = 0, len(lengths)
        for a, b in itertools.pairwise(cuts):
            units.append(Unit(path, int(a), int(b), int(cum[b] - cum[a])))
    plan = [[] for _ in range(num_workers)]
    for i, unit in enumerate(units):
        plan[i % num_workers].append(unit)
    return plan


def table_specs(config: TrainConfig, corpus: Corpus) -> dict[str, dict]:
    """The tables a run trains: `words` only when something trains it (dbow_words or PV-DM).

    Inputs start uniform in [-1, 1)/dim, outputs at zero (gensim's initialisation); with adagrad each
    row carries one accumulator column.
    """
    state = int(config.optimizer == "adagrad")
    tables = {"docs": {"rows": corpus.num_docs, "dim": config.dim, "init": "uniform", "state": state}}
    if config.mode == "dm" or config.dbow_words:
        tables["words"] = {"rows": corpus.vocab_size, "dim": config.dim, "init": "uniform", "state": state}
    tables["words_out"] = {"rows": corpus.vocab_size, "dim": config.dim, "init": "zeros", "state": state}
    return tables


def _check_resources(config: TrainConfig, started_here: bool) -> None:
    have = ray.cluster_resources()
    need = {"CPU": config.num_workers * config.cpus_per_worker, "GPU": config.num_workers * config.gpus_per_worker}
    for name, amount in need.items():
        if amount > have.get(name, 0):
            message = (f"{config.num_workers} workers need {amount:g} {name} but the Ray cluster has "
                       f"{have.get(name, 0):g}; lower --num-workers or --{name.lower()}s-per-worker")
            if started_here or name == "GPU":
                raise UserError(message)
            print(f"warning: {message} (waiting for the autoscaler)", file=sys.stderr)


def train(corpus_path: str, out: str, config: TrainConfig, overwrite: bool = False) -> dict:
    """Train doc2vec (PV-DBOW or PV-DM) on a prepared corpus into the model directory `out`; returns the run's figures."""
    config.validate()
    corpus = Corpus(corpus_path)
    out = os.path.abspath(out)
    checkpoint.refuse_existing_model(out, overwrite)  # before starting Ray
    started_here = connect(config.address)
    t_start = time.perf_counter()
    servers, workers = [], []
    try:
        _check_resources(config, started_here)  # before anything is written
        checkpoint.start_model_dir(out, corpus.path, overwrite)
        tables = table_specs(config, corpus)
        server_cls = ray.remote(ParameterServer)
        # `ps` / `trainer` nodes where the cluster has them, plain CPU placement elsewhere
        server_placement, worker_placement = ps_options(config, tables), worker_options(config)  # asked once
        servers = [server_cls.options(max_concurrency=4, **server_placement).remote(
            s, config.num_ps, tables, config.seed) for s in range(config.num_ps)]
        worker_cls = ray.remote(Worker)
        cfg = dataclasses.asdict(config)
        rows = {name: spec["rows"] for name, spec in tables.items()}
        plan = plan_units(corpus, config.num_workers)
        workers = [worker_cls.options(max_concurrency=2, **worker_placement).remote(
            i, plan[i], os.path.abspath(corpus.path), cfg, servers, rows) for i in range(config.num_workers)]
        ray.get([w.progress.remote() for w in workers])  # surfaces init errors before the clock starts
        t_ready = time.perf_counter()

        train_seconds, ckpt_seconds, epoch_stats = 0.0, 0.0, []
        last_ckpt = time.perf_counter()
        total = corpus.num_tokens * config.epochs
        bar = tqdm(total=total, unit="tok", unit_scale=True, disable=not config.progress,
                   desc="train", dynamic_ncols=True, file=sys.stderr)
        for epoch in range(config.epochs):
            t0 = time.perf_counter()
            stats = _run_epoch(workers, epoch, bar, corpus.num_tokens)
            train_seconds += time.perf_counter() - t0
            epoch_stats.append(stats)
            due = config.checkpoint_every > 0 and time.perf_counter() - last_ckpt >= config.checkpoint_every
            if due and epoch < config.epochs - 1:
                ckpt_seconds += _checkpoint(out, servers, config, corpus, epoch + 1, epoch_stats)
                last_ckpt = time.perf_counter()
        bar.close()
        ckpt_seconds += _checkpoint(out, servers, config, corpus, config.epochs, epoch_stats)
        summary = _summary(config, corpus, epoch_stats, train_seconds, ckpt_seconds, t_ready - t_start)
        save_json(os.path.join(out, "config.json"), {**dataclasses.asdict(config), "corpus": corpus.path,
                                                      "summary": summary})
        return summary
    finally:
        for actor in workers + servers:
            ray.kill(actor)
        if started_here:
            ray.shutdown()


def _run_epoch(workers: list, epoch: int, bar: tqdm, epoch_tokens: int) -> dict:
    base = epoch * epoch_tokens
    pending = {w.run_epoch.remote(epoch): i for i, w in enumerate(workers)}
    finished: dict[int, dict] = {}
    while pending:
        ready, _ = ray.wait(list(pending), timeout=0.5, num_returns=len(pending))
        for ref in ready:
            try:
                finished[pending.pop(ref)] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise TrainingStopped(f"training stopped in epoch {epoch}: {_root_cause(exc)}") from None
        live = ray.get([workers[i].progress.remote() for i in range(len(workers)) if i not in finished])
        now = combine(list(finished.values()) + [s for s in live if s["epoch"] == epoch])
        bar.update(base + now["tokens"] - bar.n)
        bar.set_postfix_str(f"epoch {epoch + 1}, loss {now['loss'] / max(now['pairs'], 1):.3f}, "
                            + time_split(now["seconds"]), refresh=False)
    return {"epoch": epoch, **combine(list(finished.values()))}


def combine(stats: list[dict]) -> dict:
    """Sum the counters (tokens, pairs, loss, seconds per stage) of several workers or epochs."""
    seconds: dict[str, float] = {}
    for s in stats:
        for k, v in s["seconds"].items():
            seconds[k] = seconds.get(k, 0.0) + v
    return {"tokens": sum(s["tokens"] for s in stats), "pairs": sum(s["pairs"] for s in stats),
            "loss": sum(s["loss"] for s in stats), "seconds": seconds}


def time_split(seconds: dict[str, float]) -> str:
    """Where worker time went, as shares: 'read 1% sample 20% ...'."""
    busy = sum(seconds.values()) or 1.0
    return " ".join(f"{k} {100 * v / busy:.0f}%" for k, v in seconds.items())


def _root_cause(exc: Exception) -> str:
    """The innermost error message of a failed actor call, on one line."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return text[-1] if text else type(cause).__name__


def _checkpoint(out: str, servers: list, config: TrainConfig, corpus: Corpus, epoch: int,
                epoch_stats: list) -> float:
    t0 = time.perf_counter()
    version = checkpoint.next_version(out)
    entries = ray.get([server.save.remote(out, version) for server in servers])
    tables = {name: [e[name] for e in entries] for name in entries[0]}
    checkpoint.commit(out, version, tables, {name: config.dim for name in tables},
                      {"epoch": epoch, "num_ps": config.num_ps, "config": dataclasses.asdict(config),
                       "corpus": corpus.path, "losses": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats]},
                      keep=config.keep_checkpoints)
    return time.perf_counter() - t0


def _summary(config: TrainConfig, corpus: Corpus, epoch_stats: list, train_s: float, ckpt_s: float,
             startup_s: float) -> dict:
    total = combine(epoch_stats)
    tokens, pairs, seconds = total["tokens"], total["pairs"], total["seconds"]
    return {
        "tokens": tokens, "pairs": pairs, "epochs": config.epochs,
        "train_seconds": round(train_s, 3), "checkpoint_seconds": round(ckpt_s, 3),
        "startup_seconds": round(startup_s, 3),
        "tokens_per_second": tokens / train_s if train_s else 0.0,
        "pairs_per_second": pairs / train_s if train_s else 0.0,
        "loss_per_epoch": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats],
        "worker_seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
