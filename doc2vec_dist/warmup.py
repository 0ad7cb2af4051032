"""Compile the workers' and servers' numba kernels once per install, beside a local run's start-up.

numba compiles a kernel at its first call and caches the machine code on disk (cache=True), keyed by
the source. A fresh install has no cache, so the first `train` compiled its kernels inside its first
epoch, in the worker, and reported a fraction of its speed. A local run whose cache is cold now starts
a process that trains a tiny corpus of its own through the same code path, in-process (no Ray), while
the driver starts Ray and the actors; the driver waits for it before the first epoch, and the actors'
first calls load what it cached. A warm cache starts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from .config import TrainConfig
from .corpus import DOCS_SCHEMA, FORMAT_VERSION, VOCAB_SCHEMA, Corpus, write_shard
from .settings import RunSettings, resolve

log = logging.getLogger(__name__)

WAIT_SECONDS = 300  # at most, before the first epoch; past it the workers compile what is left themselves


def kernels(settings: RunSettings) -> list:
    """The compiled functions a run of `settings` calls first in its workers and servers."""
    from . import cpu_kernel, row_kernels

    found = [row_kernels.set_rows if settings.token_path else row_kernels.add_rows]
    if settings.exact:
        found.append(cpu_kernel._train_tokens if settings.token_path else cpu_kernel._train)
    return found


def cold(settings: RunSettings) -> bool:
    """Whether numba's cache on this machine lacks a kernel the run calls (its index file missing, or
    written for another version of the source)."""
    try:
        return any(not function._cache._cache_file._load_index() for function in kernels(settings))
    except Exception:  # noqa: BLE001 - numba's cache internals moved: compile where it always did
        return False


def start(settings: RunSettings) -> tuple[subprocess.Popen, float] | None:
    """Where the cache is cold, the compiling process, started (and when); else None."""
    if not cold(settings):
        return None
    given = {**dataclasses.asdict(settings.config), "token_path": settings.token_path, "exact": settings.exact}
    process = subprocess.Popen([sys.executable, "-m", "doc2vec_dist.warmup", json.dumps(given)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return process, time.perf_counter()


def wait(started: tuple[subprocess.Popen, float] | None) -> None:
    """Wait for the compiling process (at most WAIT_SECONDS in all), and say what it cost."""
    if started is None:
        return
    process, t0 = started
    try:
        _, err = process.communicate(timeout=max(0.0, WAIT_SECONDS - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        stop(started)
        log.info("numba: compiling the kernels took over %ds; the workers compile what is left", WAIT_SECONDS)
        return
    if process.returncode:
        last = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        log.info("numba: compiling the kernels ahead failed (%s); the workers compile them", last[0])
        return
    log.info("numba: compiled the kernels for this install in %.1fs, beside the start-up (once: they are cached)",
             time.perf_counter() - t0)


def stop(started: tuple[subprocess.Popen, float] | None) -> None:
    if started is not None and started[0].poll() is None:
        started[0].kill()
        started[0].wait()


def compile_kernels(settings: dict) -> None:
    """Train a tiny corpus made in memory with `settings` (a TrainConfig's fields, and whether the real run
    takes the token path and the exact kernel: its RunSettings') for one epoch, in this process: the kernels
    it calls are compiled and cached."""
    from .client import LocalServer
    from .ps import ParameterServer, table_specs
    from .units import Position, plan_of
    from .worker import Worker

    token_path, exact = settings.pop("token_path"), settings.pop("exact")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    config = TrainConfig(**{k: v for k, v in settings.items() if k in fields})
    # the same path on a tiny corpus: its whole vocabulary is resident unless the real run's is not
    # (a GPU run's device kernel is torch's: only the servers' and the host's compiled code is warmed, on the CPU)
    config = dataclasses.replace(config, epochs=1, dim=8, num_ps=1, progress=False, checkpoint_every=0.0, resume=False,
                                 init_from=None, first_epoch="all", address=None, gpus_per_worker=0,
                                 kernel="exact" if exact else "batched",
                                 cache_rows=config.cache_rows if token_path else 0).validate()
    with tempfile.TemporaryDirectory(prefix="doc2vec-dist-warmup-") as work:
        corpus = tiny_corpus(os.path.join(work, "corpus"))
        tables = table_specs(config, corpus)
        servers = [LocalServer(ParameterServer(0, 1, tables, config.seed, rounding=config.rounding))]
        settings = resolve(config, corpus)
        try:
            worker = Worker(0, plan_of(corpus, settings)[0], corpus.path, settings, servers, tables)
            for round_ in range(settings.rounds):
                worker.run_epoch(0, Position(0, round=round_))
        finally:
            servers[0].close()
    _read_only_pushes()


def tiny_corpus(directory: str, docs: int = 200, words: int = 50, seed: int = 0) -> Corpus:
    """A corpus of `docs` documents over `words` word ids, drawn in memory (a word's frequency falling as
    1/rank, as URLs' do) and written as prepare writes one: ids by frequency, a word's count its
    occurrences. The kernels see the arrays a real run's shards give them, and nothing is read or parsed."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 40, docs).astype(np.int64)
    weights = 1.0 / np.arange(1, words + 1)
    drawn = rng.choice(words, size=int(lengths.sum()) - words, p=weights / weights.sum())
    tokens = rng.permutation(np.concatenate([np.arange(words), drawn]))  # every word occurs
    counts = np.bincount(tokens, minlength=words)
    by_count = np.argsort(-counts, kind="stable")
    tokens = np.argsort(by_count)[tokens].astype(np.int32)  # id = rank by count
    os.makedirs(directory)
    tables = {"vocab.arrow": pa.table({"token": [f"w{i}" for i in range(words)], "count": counts[by_count],
                                       "id": np.arange(words, dtype=np.int32)}, schema=VOCAB_SCHEMA),
              "docs.arrow": pa.table({"key": [f"d{i}" for i in range(docs)], "id": np.arange(docs, dtype=np.int64),
                                      "length": lengths}, schema=DOCS_SCHEMA)}
    for name, table in tables.items():
        with pa.OSFile(os.path.join(directory, name), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    shard = write_shard(directory, 0, np.arange(docs, dtype=np.int64), lengths, tokens)
    with open(os.path.join(directory, "corpus.json"), "w") as fh:
        json.dump({"format_version": FORMAT_VERSION, "num_docs": docs, "num_tokens": int(lengths.sum()),
                   "vocab_size": words, "num_shards": 1, "shards": [shard]}, fh)
    return Corpus(directory)


def _read_only_pushes() -> None:
    """The servers' row kernels as a push through Ray calls them: its ids and rows read-only, from the
    object store (numba compiles read-only arrays apart)."""
    import numpy as np

    from .row_kernels import add_rows, set_rows

    table = np.zeros((4, 8), dtype=np.float32)
    ids, rows = np.arange(2, dtype=np.int64), np.ones((2, 8), dtype=np.float32)
    ids.flags.writeable = rows.flags.writeable = False
    set_rows(table, ids, rows)
    add_rows(table, ids, rows)


if __name__ == "__main__":
    compile_kernels(json.loads(sys.argv[1]))
