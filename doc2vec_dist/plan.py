"""Plan a run before training it: memory per parameter server, per worker, driver and object store,
and time per epoch, from the corpus statistics and a short calibration run.

Changes when how a run is sized or timed before it starts changes.

gensim's `Doc2Vec.estimate_memory` adds up its arrays (vectors, syn1neg, doc vectors, ~500 bytes of
vocabulary entry per word) and says nothing of time. Here the processes are separate and the time is
what a deploy is sized by, so:

Memory (private memory of each process: its heap and numpy arrays, what RssAnon counts; the object
store's shared pages are a line of their own, counted once per node)

    parameter server s = Σ over the tables it trains: rows on s × (dim + optimiser columns) × 4 bytes
                         + overhead
      rows on s: row r of a table lives on server r % num_ps (exact, not rounded);
      overhead: when the calibration run's processes are visible from here (a local Ray), the
      largest measured (peak private − the rows that server held): the process, the pull results
      it assembles (the calibration pulls what the full run pulls: same vocabulary, same
      macro-batch) and what a checkpoint writes beside the rows. Otherwise an empty
      ParameterServer process (measured: a probe actor with no rows) + PS_RETAINED_PULLS × the
      bytes of one pull from that server (modelled from measurements here).
    worker             = batch + fixed
      batch: two macro-batches alive at once (the one computing, the next with its pull in flight),
      each with its examples and compact positions, plus the local copy of the pulled rows and the
      push delta: 2 × examples + 2 × unique rows × width × 4 bytes; the unique rows and examples are
      counted on real macro-batches of this corpus, built with the worker's own sampling code.
      fixed: measured in the calibration (peak private − batch) or, remote, a process like the
      empty server plus the vocabulary arrays every worker holds (counts, keep probabilities, the
      negatives' alias table: VOCAB_BYTES_PER_WORD a word).
    driver, Ray's own processes: measured in the calibration (modelled constants when not visible).
    object store: its capacity (shared memory the node must have), beside what is in flight:
      workers × (2 pulls + max_inflight_pushes pushes) × the bytes of one macro-batch's rows.

A corpus not made yet (plan --users --urls --tokens-per-user, or --corpus --users): an EstimatedCorpus,
whose sample on disk stands for its users in every count above and in the calibration, with the
tables of all of them (zipf_corpus: the shape assumed; scaled_corpus: a corpus's own).

Time

    tokens/s: a calibration run through the real engine (trainer.train, Ray actors and all) for
      about --calibrate-seconds on a slice of the corpus: the first documents, with the corpus's
      whole vocabulary and counts (so subsampling, negatives and the unique words_out rows a
      macro-batch pulls are those of the full run) and enough tokens that every worker's macro-batch
      is the full run's. A corpus smaller than that is trained whole, for a few epochs.
    per epoch = corpus tokens / calibrated tokens/s. What does not scale with tokens is scaled apart:
      startup (servers initialise their rows: calibration startup + the extra rows × the init time
      of one row, measured here), checkpoints (table bytes / the calibration's checkpoint rate).

Scaling (scaling_plan: 1, 2, 4, 8 and 16 workers and config.num_workers, each row a run of that many
workers whatever config.num_workers is, bounded by four rates that one model, bound_rates, combines:
the streamed rows' traffic overlaps compute, the held rows' and the rounds' add to it; the expectation is
the least column of its row, and the bound names it)

    compute: W × the calibrated tokens/s of one worker (the calibration's tokens/s over its workers, less
      the time its rounds took: worker_rate);
    servers: the rows that reach the servers per token, at num_ps servers applying rows at the
      calibration's measured rate (rows per second of busy time, each server on one core);
    network: bytes per token over links of --network-gbps, each worker on a link of its own and the
      servers on num_ps links (a node each, the deploy/ layout), the busiest side bounding; the blocks
      handed from worker to worker cross the workers' links only.
    rounds: an epoch's tokens over its rounds' fixed cost (rounds_per_epoch × ROUND_SECONDS: each round's
      Ray calls, whatever its tokens), what a small corpus on several workers is bound by.
    A row whose workers outnumber the servers also says what a server per worker would give.
    GPU workers: rows of 1, 2, 4 and 8 GPUs, compute is the device (one GPU's tokens/s: a calibration's
      on the GPUs, else the kernel's measured on a device of DEVICES, --gpu-model; GPUs times), and a
      fourth limit is PCIe (each GPU's host link: the rows a token moves, float32, and its share of the
      token ids and offsets uploaded once an epoch). The device's memory sizes its documents' room as a
      worker does (worker.device_room), and so the way they are kept (document_ways).
    train takes fewer workers than asked where this model predicts them faster (choose_workers: a
    worker's rate measured here in place of a calibration), saying so in one line; --force-workers not.
    Bytes per token, counted as the workers' counters count them (client.TRAFFIC): on the block
      schedule, each document's row pulled and pushed once per block its tokens fall in (counted on
      the corpus's documents with the blocks' own deal), and at each round's end every worker hands
      the block it holds straight to its next holder ("handed") but at an epoch's last, which pushes
      them home, so only an epoch's first round pulls them from the servers and its last pushes them
      (vocabulary rows once each way an epoch; with DOC2VEC_DIST_HANDOVER=0 every round pushes
      its block home and pulls the next); one worker pulls its URL rows
      once and writes them back at each epoch's end (its checkpoint); on the token path a worker's
      documents' rows are pulled once and written back once an epoch, or, swapped by partition
      (TrainConfig.document_partitions), pulled and written back once an epoch; the shared schedule
      pulls and pushes each macro-batch's unique rows (macro_batch_profile).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc

from . import outputs, storage
from .config import TableSpec, TrainConfig, settle_segments
from .corpus import Corpus, iter_shard, write_shard
from .errors import UserError
from .memwatch import MemoryWatch, proc_status
from .placement import FLOAT_BYTES, PROCESS_BYTES
from .ps import table_specs
from .sampling import NegativeTable, build_examples, keep_probabilities
from .schedule import Blocks
from .sharding import rows_on_shard
from .trainer import HANDOVER_ENV, effective_macro_batch, quality_warnings
from .worker import ROUNDS_PER_EPOCH, device_room

log = logging.getLogger(__name__)

GiB = 1 << 30
# Sizes the calibration slice before anything is measured: tokens/s of one CPU worker, a low guess (a
# slower worker calibrates on a few more tokens than it needs). The measured rate replaces it.
GUESS_TOKENS_PER_SECOND_PER_WORKER = 200_000
MAX_CALIBRATION_EPOCHS = 5
# Where a process cannot be observed (a remote cluster), it counts placement.PROCESS_BYTES.
VOCAB_BYTES_PER_WORD = 40  # counts int64, keep probability, alias table (p, accept, alias), marker arrays
# A server's private memory above an empty one grows with the size of the pulls it serves (the
# allocator keeps freed pull results of its 4 threads): about 14 pulls' worth, in runs at 50k and 200k
# users (docs/benchmarks.md, "Figures behind the code's constants").
PS_RETAINED_PULLS = 14
RAY_SYSTEM_BYTES = 600 << 20  # raylet, GCS, agents (PSS), when not measured
# A round of an epoch costs this much whatever its tokens: its Ray calls (the block handed on through the object
# store, the driver's call and its answer). Measured at 5.6-6.5 ms a round on Lee here, 2 workers at 16 segments
# (12-16 ms at 64 segments before the block went into the object store whole; docs/benchmarks.md, "Fewer
# workers where more would not pay"); a corpus whose rounds hold few tokens pays it many times an epoch.
ROUND_SECONDS = 0.007
# One worker's tokens/s computing (its read, sample and compute stages) where nothing calibrated it (train's
# choice of workers, choose_workers), by where it computes: a CPU worker's of one CPU here on Lee and the
# sample (4.3-4.7M), a GPU worker's on an H200 (10-15M; docs/benchmarks.md).
UNCALIBRATED_TOKENS_PER_SECOND = {"cpu": 4_000_000, "gpu": 10_000_000}
# The links train's choice of workers assumes (plan's default --network-gbps)
CHOICE_NETWORK_GBPS = 10.0
OOM_FRACTION = 0.95  # Ray's OOM killer acts above this share of a node's memory


# -- arithmetic -------------------------------------------------------------------------------------

def shard_table_bytes(tables: dict[str, TableSpec], num_ps: int) -> list[dict[str, int]]:
    """Per server: bytes of its rows of each table, optimiser columns included (exact row counts), in
    the tables' dtype (TableSpec.row_bytes: a 16-bit table's vectors take half).

    tables: the trainer's table specs (ps.table_specs: docs, words when dbow_words or PV-DM trains
    it, words_out)."""
    return [{name: rows_on_shard(s, num_ps, spec.rows) * spec.row_bytes
             for name, spec in tables.items()} for s in range(num_ps)]


def worker_batch_bytes(profile: dict, width: int) -> int:
    """Private bytes a worker holds for macro-batches: two alive (examples and positions each), the
    local copy of one batch's pulled rows and its push delta (float32, whatever the tables' dtype: the
    worker's math is float32)."""
    return int(2 * profile["example_bytes"] + 2 * profile["unique_rows"] * width * FLOAT_BYTES)


def resident_plan(config: TrainConfig, words_out: TableSpec, docs: TableSpec | None = None) -> dict:
    """The URL rows each worker keeps resident between macro-batches, and where: words_out's hottest
    (all of them with one worker, within 2 GiB), and on the token path words' too where they are
    trained; in the worker's host memory, or on its GPU. They are float32 there, but for a GPU's words_out
    rows on the token path, which it keeps in the tables' dtype (TrainConfig.half_on_device)."""
    tables = config.resident_tables(words_out.rows)
    if docs is not None and config.resident_documents(docs.rows, words_out.rows):  # the token path: its share of them
        tables = {**tables, "docs": config.resident_documents(docs.rows, words_out.rows)}
    half = config.half_on_device(words_out.rows)
    url_row = words_out.row_bytes if half else words_out.width * FLOAT_BYTES
    float_rows = sum(tables.values()) - tables["words_out"]
    return {"tables": tables, "bytes": float_rows * words_out.width * FLOAT_BYTES + tables["words_out"] * url_row,
            "all": tables["words_out"] == words_out.rows, "on": "device" if config.gpus_per_worker > 0 else "host",
            "dtype": config.dtype if half else "float32",
            # the documents' rows: across epochs (1), swapped by partition (P > 1), or with each macro-batch (0)
            "document_partitions": config.document_partitions(docs.rows, words_out.rows) if docs is not None else 0}


def memory_plan(tables: dict[str, TableSpec], config: TrainConfig, profile: dict, *, ps_overhead: int,
                worker_fixed: int, driver: int, ray_system: int, object_store: int) -> dict:
    """Memory per process and for the node, from table sizes, macro-batch sizes and fixed costs (bytes)."""
    width = tables["words_out"].width
    per_ps = shard_table_bytes(tables, config.num_ps)
    ps = [{"shard": s, "tables": t, "table_bytes": sum(t.values()), "overhead": ps_overhead,
           "total": sum(t.values()) + ps_overhead} for s, t in enumerate(per_ps)]
    batch = worker_batch_bytes(profile, width)
    resident = resident_plan(config, tables["words_out"], tables["docs"])
    on_host = resident["bytes"] if resident["on"] == "host" else 0  # on a GPU, its memory holds them
    worker = {"batch": batch, "fixed": worker_fixed, "resident": on_host, "total": batch + worker_fixed + on_host}
    row_bytes = profile["unique_rows"] * tables["words_out"].row_bytes  # in the object store: the tables' dtype
    in_flight = config.num_workers * (2 + config.max_inflight_pushes) * row_bytes
    processes = sum(p["total"] for p in ps) + config.num_workers * worker["total"] + driver + ray_system
    return {"ps": ps, "worker": worker, "resident": resident, "driver": driver, "ray_system": ray_system,
            "object_store": {"capacity": object_store, "in_flight": in_flight, "macro_batch_rows_bytes": row_bytes},
            "processes_total": processes, "node_total": processes + object_store}


# -- the corpus's macro-batches -------------------------------------------------------------------------

def macro_batch_profile(corpus: Corpus, config: TrainConfig, batches: int = 3) -> dict:
    """Unique rows pulled and example bytes of a real macro-batch, built with the worker's sampling code
    (subsampling, negatives, windows) on the first chunks of the corpus; means over `batches`. The
    resident words_out rows (--cache-rows; every row with one worker, the token path; the block a worker
    holds on the block schedule) are not pulled, nor the token path's words rows, nor the documents a
    worker keeps resident (bytes_per_token counts what those move, at rounds' and epochs' ends)."""
    counts = corpus.counts()
    keep = keep_probabilities(counts, config.sample)
    negatives = NegativeTable(counts, config.ns_exponent)
    macro = effective_macro_batch(config, corpus.num_tokens, corpus.vocab_size)
    rng = np.random.default_rng(config.seed)
    # words rows are pulled where trained, unless resident (the token path holds every one)
    trains_words = config.trains_words() and "words" not in config.resident_tables(corpus.vocab_size)
    # words_out rows 0..resident-1 stay in the worker; on the block schedule, the block it holds
    resident = corpus.vocab_size if config.blocks() else config.resident_rows(corpus.vocab_size)
    # ... and on the token path its documents' rows (document_partitions): no macro-batch pulls them
    docs_resident = config.document_partitions(corpus.num_docs, corpus.vocab_size) > 0
    seen = []
    for path in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(path, max_tokens=macro):
            ex = build_examples(offsets, tokens, keep, negatives, config.negative, rng, mode=config.mode,
                                dbow_words=config.dbow_words, window=config.window,
                                shared_negatives=config.shared_negatives, micro_batch=config.micro_batch)
            ctx = ex.ctx.reshape(-1)
            words = len(np.unique(ctx[ctx >= ex.n_docs])) if trains_words else 0
            words_out = int(np.count_nonzero(np.unique(np.concatenate([ex.target, ex.neg.reshape(-1)])) >= resident))
            arrays = [ex.ctx, ex.ctx_mask, ex.target, ex.neg, ex.neg_mask]
            example_bytes = sum(a.nbytes for a in arrays if a is not None)
            example_bytes += (ex.ctx.size + ex.target.size + ex.neg.size) * 8  # compact positions (int64)
            seen.append({"tokens": len(tokens), "examples": len(ex), "docs": 0 if docs_resident else len(doc_ids),
                         "words": words,
                         "words_out": words_out, "example_bytes": example_bytes})
            if len(seen) >= batches:
                break
        if len(seen) >= batches:
            break
    if not seen:
        raise UserError(f"{corpus.path}: the corpus has no tokens to plan for")
    mean = {k: float(np.mean([s[k] for s in seen])) for k in seen[0]}
    unique = mean["docs"] + mean["words"] + mean["words_out"]
    return {"macro_batch": macro, "batches_measured": len(seen), **{k: round(v) for k, v in mean.items()},
            "unique_rows": round(unique)}


# -- scaling over workers ---------------------------------------------------------------------------------

SCALING_WORKERS = (1, 2, 4, 8, 16)
SCALING_GPUS = (1, 2, 4, 8)  # GPU workers' rows: GPUs, each with its share of the workers
SCALING_SAMPLE_DOCS = 50_000  # documents counted for the blocks their tokens touch


@dataclasses.dataclass(frozen=True)
class Device:
    """A GPU the scaling table of GPU workers knows (DEVICES, plan --gpu-model): its memory, its memory's
    bandwidth, its host link, and the tokens/s one GPU worker's kernel trained on it, where measured."""
    name: str
    memory_gb: float
    hbm_gb_per_second: float
    link: str  # its host link, as sold
    pcie_gb_per_second: float  # ... and what pinned copies carry over it a way, about 0.8 of its rate
    kernel_tokens_per_second: float | None = None
    measured: str = ""  # where kernel_tokens_per_second comes from


# The vendors' figures for the SXM parts (H100 and H200 on PCIe 5.0 x16, 63 GB/s a way; A100 on 4.0, 31.5;
# V100 on 3.0, 15.75). The kernel's rates: one GPU worker's last epoch with its servers in its own process
# (benchmarks/gpu_bench.py, jobs/configs/gpu.yaml, float32): docs/benchmarks.md, "Figures behind the code's
# constants".
DEVICES = {d.name: d for d in (
    Device("H200", 141, 4800, "PCIe 5.0 x16", 50, 15.78e6, "one H200, 500k users × 250k URLs"),
    Device("H100", 80, 3350, "PCIe 5.0 x16", 50, 15.95e6, "one H100, 1M users"),
    Device("A100", 80, 2039, "PCIe 4.0 x16", 25),
    Device("A100-40GB", 40, 1555, "PCIe 4.0 x16", 25),
    Device("L40S", 48, 864, "PCIe 4.0 x16", 25),
    Device("L4", 24, 300, "PCIe 4.0 x16", 25),
    Device("V100", 32, 900, "PCIe 3.0 x16", 12.5),
)}
DEFAULT_DEVICE = "H200"  # the GPU the kernel's rates were measured on last
REFERENCE_DEVICE = "H200"  # an unmeasured device's kernel: this one's, scaled by their memories' bandwidth
# What the token path uploads each epoch besides rows: a token's id (int32), and a document's row in `inputs`
# and its offset (int64 each)
TOKEN_UPLOAD_BYTES = 4
DOCUMENT_UPLOAD_BYTES = 16


def bytes_per_token(corpus: Corpus, config: TrainConfig, workers: int, profile: dict | None = None) -> dict:
    """The bytes a run of `workers` workers (else as `config`) moves to and from the servers per token
    trained, by the workers' counters' kinds (client.TRAFFIC), over an epoch of the corpus; rows
    in the tables' dtype (TableSpec.row_bytes)."""
    cfg = settle_segments(dataclasses.replace(config, num_workers=workers), corpus)
    tables = table_specs(cfg, corpus)
    row = tables["words_out"].row_bytes
    vocab, tokens = corpus.vocab_size, max(corpus.num_tokens, 1)
    if not cfg.token_path(vocab):  # the shared schedule: each macro-batch's unique rows, there and back
        prof = profile if profile is not None and profile["macro_batch"] == effective_macro_batch(
            cfg, corpus.num_tokens, vocab) else macro_batch_profile(corpus, cfg)
        per = prof["unique_rows"] * row / max(prof["tokens"], 1)
        return {"pulled": per, "pushed": per, "resident_pulled": 0.0, "resident_pushed": 0.0, "handed": 0.0}
    counts, keep = corpus.counts(), keep_probabilities(corpus.counts(), cfg.sample)
    blocks = Blocks(counts, keep, workers if cfg.blocks() else 1, cfg.seed, 0, cfg.negative, cfg.ns_exponent)
    epochs = max(cfg.epochs, 1)
    partitions = cfg.document_partitions(corpus.num_docs, vocab)
    resident_docs = bool(partitions)
    if resident_docs:
        # a worker's documents resident for the run: pulled once, written back once an epoch (the checkpoint
        # at its end); swapped by partition, each partition pulled and written back once an epoch
        pulled_docs, pushed_docs = corpus.num_docs / (epochs if partitions == 1 else 1), corpus.num_docs
    else:  # each macro-batch's documents, in every block their tokens fall in
        touched, docs = 0, 0
        for doc_ids, offsets, chunk in itertools.chain.from_iterable(map(iter_shard, corpus.shard_paths)):
            doc = np.repeat(np.arange(len(doc_ids)), np.diff(offsets))
            touched += len(np.unique(doc * blocks.num_blocks + blocks.block_of[chunk]))  # (document, block) met
            docs += len(doc_ids)
            if docs >= SCALING_SAMPLE_DOCS:
                break
        pulled_docs = pushed_docs = touched * corpus.num_docs / max(docs, 1)
    # one worker holds the URL rows it keeps (cfg: a run of `workers`, not of config.num_workers)
    resident = cfg.resident_tables(vocab) if workers == 1 else {"words_out": vocab}
    url_rows = sum(resident.values())
    if blocks.num_blocks > 1:  # every block moves at each round's end; a rotation a segment
        rounds = blocks.num_blocks * cfg.segments
        # pulled from the servers in an epoch's first round, pushed home at its last, handed to the next
        # holder at the others' ends (HANDOVER_ENV=0: pushed and pulled in every round)
        handed = (rounds - 1) * url_rows if os.environ.get(HANDOVER_ENV) != "0" else 0
        pulled_urls = pushed_urls = url_rows * rounds - handed
        return {"pulled": 0.0 if resident_docs else pulled_docs * row / tokens,
                "pushed": 0.0 if resident_docs else pushed_docs * row / tokens,
                "resident_pulled": (pulled_urls + resident_docs * pulled_docs) * row / tokens,
                "resident_pushed": (pushed_urls + resident_docs * pushed_docs) * row / tokens,
                "handed": handed * row / tokens}
    # one worker: its URL rows pulled once, written back once an epoch (the checkpoint at its end), its
    # documents' as above where it holds them
    return {"pulled": 0.0 if resident_docs else pulled_docs * row / tokens,
            "pushed": 0.0 if resident_docs else pushed_docs * row / tokens,
            "resident_pulled": (url_rows / epochs + resident_docs * pulled_docs) * row / tokens,
            "resident_pushed": (url_rows + resident_docs * pushed_docs) * row / tokens,
            "handed": 0.0}


def gpus_of(config: TrainConfig, workers: int) -> float:
    """The GPUs `workers` GPU workers train on: a worker computes on one, and workers of a fractional
    --gpus-per-worker share one (0.5: two a GPU)."""
    return workers * min(config.gpus_per_worker, 1.0)


def scaling_workers(config: TrainConfig) -> tuple[int, ...]:
    """The scaling table's rows, as numbers of workers: SCALING_WORKERS CPU workers, or GPU workers on
    SCALING_GPUS GPUs; and config.num_workers."""
    if config.gpus_per_worker <= 0:
        return tuple(sorted({*SCALING_WORKERS, config.num_workers}))
    per_gpu = max(1, round(1 / min(config.gpus_per_worker, 1.0)))
    return tuple(sorted({*(g * per_gpu for g in SCALING_GPUS), config.num_workers}))


def device_bytes_per_token(config: TrainConfig) -> float:
    """The bytes of device memory one PV-DBOW pair reads and writes: its document's row and 1 + negative
    URL rows, each read and written once, float32 (the issue's "about 5 KB of rows" at dim 100 and 5
    negatives). Its memory's bandwidth over these is the device's ceiling, whatever the kernel."""
    return 2 * (2 + config.negative) * config.dim * FLOAT_BYTES


def device_rates(config: TrainConfig, cal: dict | None, gpu: dict | None = None) -> dict | None:
    """GPU workers' device and its host link, for the scaling table; None for CPU workers.

    gpu: plan's flags, each optional: "model" (a name of DEVICES; DEFAULT_DEVICE), "tokens_per_second",
    "hbm_bytes_per_second", "pcie_bytes_per_second". The tokens/s one GPU trains: the flag's; else a
    calibration's on the GPUs (its tokens/s over the GPUs it ran on); else the kernel's measured on that
    model (DEVICES); else REFERENCE_DEVICE's scaled by the two memories' bandwidth. Its memory's
    bandwidth over device_bytes_per_token is the ceiling a faster kernel would meet ("hbm_tokens_per_second")."""
    if config.gpus_per_worker <= 0:
        return None
    gpu = gpu or {}
    model = DEVICES[gpu.get("model") or DEFAULT_DEVICE]
    hbm = gpu.get("hbm_bytes_per_second") or model.hbm_gb_per_second * 1e9
    measured = (cal or {}).get("summary", {}).get("tokens_per_second")
    reference = DEVICES[REFERENCE_DEVICE]
    if gpu.get("tokens_per_second"):
        rate, source = gpu["tokens_per_second"], "--device-tokens-per-second"
    elif measured:
        rate, source = measured / gpus_of(config, cal.get("workers", config.num_workers)), "calibrated on the GPUs"
    elif model.kernel_tokens_per_second:
        rate, source = model.kernel_tokens_per_second, f"the kernel measured: {model.measured}"
    else:
        rate = reference.kernel_tokens_per_second * hbm / (reference.hbm_gb_per_second * 1e9)
        source = (f"no kernel measured on an {model.name}: the {reference.name}'s "
                  f"{reference.kernel_tokens_per_second / 1e6:.2f}M × their memories' bandwidth")
    return {"model": model.name, "memory_bytes": model.memory_gb * 1e9,
            "tokens_per_second": rate, "source": source,
            "hbm_bytes_per_second": hbm, "hbm_source": "--hbm-gb-per-second" if gpu.get("hbm_bytes_per_second")
            else f"{model.name}'s",
            "device_bytes_per_token": device_bytes_per_token(config),
            "hbm_tokens_per_second": hbm / device_bytes_per_token(config),
            "pcie_bytes_per_second": gpu.get("pcie_bytes_per_second") or model.pcie_gb_per_second * 1e9,
            "pcie_source": "--pcie-gb-per-second" if gpu.get("pcie_bytes_per_second")
            else f"{model.name}'s {model.link}"}


def sized_for_device(config: TrainConfig, corpus: Corpus, device: dict | None) -> TrainConfig:
    """`config` with the room its GPU workers' documents' rows have on their device where --device-memory
    does not give it: what a worker measures at its start (worker.device_room), of the device's whole
    memory (DEVICES; its free memory there is less). It decides whether they are kept across epochs or
    swapped by partition (TrainConfig.document_partitions); device["document_room"] says it, in bytes."""
    if device is None or config.device_memory is not None or not config.token_path(corpus.vocab_size):
        return config
    room = device_room(config, int(device["memory_bytes"]), corpus.vocab_size)
    device["document_room"] = room
    return dataclasses.replace(config, device_memory=max(room, 1) / GiB)


def document_ways(corpus: Corpus, config: TrainConfig, device: dict | None) -> dict | None:
    """On the token path, the two ways a worker keeps its documents' rows (TrainConfig.document_partitions)
    and the bytes a token moves in each, for config.num_workers (bytes_per_token; GPU workers, over their
    host links too: pcie_bytes_per_token): "kept" on the worker across epochs, pulled once and written
    back at checkpoints; "partitions", swapped by partition where they do not fit, each pulled and
    written back once an epoch, whatever their number. "way": the one this run takes (0: neither, each
    macro-batch pulls and pushes them). None off the token path."""
    vocab = corpus.vocab_size
    way = config.document_partitions(corpus.num_docs, vocab)
    if not config.token_path(vocab) or not config.resident_docs:
        return None
    share_bytes = -(-corpus.num_docs // config.num_workers) * config.table("docs", corpus.num_docs).width * FLOAT_BYTES
    out = {"way": way, "share_bytes": share_bytes}
    for name, room in (("kept", 2 * share_bytes + GiB), ("partitions", share_bytes / 2)):  # one partition; two
        cfg = dataclasses.replace(config, device_memory=room / GiB)
        moved = bytes_per_token(corpus, cfg, config.num_workers)
        out[name] = {"bytes_per_token": sum(moved.values()),
                     "pcie_bytes_per_token": sum(pcie_bytes_per_token(corpus, cfg, moved).values()) if device
                     else None}
    return out


def pcie_bytes_per_token(corpus: Corpus, config: TrainConfig, moved: dict) -> dict:
    """The bytes a token carries across the GPUs' host↔device links, from what it moves to and from the
    servers (bytes_per_token's `moved`): every such row crosses a link too, float32 on the device whatever
    the tables' dtype, and a block handed from worker to worker leaves one device and enters another
    (twice); besides rows, the token path uploads each chunk's token ids and its documents' rows and
    offsets once an epoch ("tokens"). "streamed": with each macro-batch, while the device computes;
    "held": at rounds', partitions' and epochs' ends (resident rows pulled, written back at checkpoints,
    swapped; blocks handed over), while it waits."""
    tables = table_specs(config, corpus)
    widen = tables["words_out"].width * FLOAT_BYTES / tables["words_out"].row_bytes
    tokens = max(corpus.num_tokens, 1)
    return {"tokens": TOKEN_UPLOAD_BYTES + DOCUMENT_UPLOAD_BYTES * corpus.num_docs / tokens,
            "streamed": (moved["pulled"] + moved["pushed"]) * widen,
            "held": (moved["resident_pulled"] + moved["resident_pushed"] + 2 * moved["handed"]) * widen}


def scaling_plan(corpus: Corpus, config: TrainConfig, cal: dict | None, network_gbps: float,
                 profile: dict | None = None, workers: tuple[int, ...] | None = None,
                 gpu: dict | None = None, round_seconds: float = ROUND_SECONDS) -> list[dict]:
    """Expected tokens/s for each number of workers (scaling_workers where not given), and what bounds
    it (row_rates): compute (the calibrated rate of one worker, W times), servers (the rows they pull
    and push per second of their busy time, measured in the calibration, num_ps at once) or network
    (bytes per token over --network-gbps links: a link per worker, num_ps links on the servers' side).
    Without a calibration, the bytes alone. Every row is its number of workers as a run of it would be
    (bytes_per_token), whatever config.num_workers is; a row whose workers have more links than the
    servers also says what a server per worker would give ("more_servers": the same model). Each round of
    an epoch costs `round_seconds` besides (its Ray calls: rounds_per_epoch of them).

    GPU workers (--gpus-per-worker > 0): each row is also its GPUs ("gpus"), compute is the device (one
    GPU's tokens/s, device_rates of plan's flags `gpu`, times the GPUs) and a fourth limit is the GPUs'
    host↔device links ("pcie", a link a GPU: pcie_bytes_per_token at device_rates' bandwidth)."""
    s = (cal or {}).get("summary", {})
    device = device_rates(config, cal, gpu)
    per_worker = worker_rate(cal, config, corpus, round_seconds)
    row = table_specs(config, corpus)["words_out"].row_bytes
    served = sum(v for k, v in s.get("bytes", {}).items() if k != "handed") / row  # rows the servers saw
    busy = s.get("server_busy_seconds")
    rows_per_busy_second = served / busy if busy and served else None  # one server's rate
    link = network_gbps * 1e9 / 8  # bytes/s
    out = []
    for w in workers or scaling_workers(config):
        if refused_workers(config, w):
            continue
        moved = bytes_per_token(corpus, config, w, profile)
        rounds = rounds_per_epoch(config, corpus, w)
        found = {"workers": w, "rounds_per_epoch": rounds}
        if device is None:
            compute, pcie = per_worker * w if per_worker else None, None
        else:
            gpus = gpus_of(config, w)
            crossing = pcie_bytes_per_token(corpus, config, moved)
            seconds = device["pcie_bytes_per_second"] * gpus  # every GPU's link at once
            compute = device["tokens_per_second"] * gpus
            pcie = ((crossing["tokens"] + crossing["streamed"]) / seconds, crossing["held"] / seconds)
            found.update(gpus=gpus, pcie_bytes_per_token=crossing, total_pcie_bytes_per_token=sum(crossing.values()))

        def at(num_ps: int, moved: dict = moved, compute: float | None = compute, pcie: tuple | None = pcie,
               w: int = w, rounds: int = rounds) -> dict:
            return row_rates(moved, w, num_ps, link, compute, rows_per_busy_second, row, pcie=pcie,
                             rounds=rounds * round_seconds / max(corpus.num_tokens, 1))

        found.update(bytes_per_token=moved, total_bytes_per_token=sum(moved.values()), **at(config.num_ps))
        if w > config.num_ps:
            more = at(w)
            found["more_servers"] = {"num_ps": w, "tokens_per_second": more["tokens_per_second"],
                                     "bound": more["bound"]}
        out.append(found)
    return out


def rounds_per_epoch(config: TrainConfig, corpus: Corpus, workers: int) -> int:
    """Rounds in an epoch of a run of `workers` workers, else as `config` (TrainConfig.rounds)."""
    return settle_segments(dataclasses.replace(config, num_workers=workers), corpus).rounds()


def worker_rate(cal: dict | None, config: TrainConfig, corpus: Corpus,
                round_seconds: float = ROUND_SECONDS) -> float | None:
    """One worker's tokens/s computing, from a calibration: its rate over its workers, less the time its rounds
    took (round_seconds each), which the scaling table counts apart (a calibration of 2 workers on Lee, its
    rounds 0.9 of its time, made one worker 17 times too slow). Not less than its workers' own sample and compute
    stages allow (their reads are a round's too: a segment's files opened each round); a two-point calibration's
    rate is a difference of two slices' times, in which the rounds cancel: as it is."""
    s = (cal or {}).get("summary", {})
    workers = max((cal or {}).get("workers", config.num_workers), 1)
    rate = s.get("tokens_per_second", 0.0)
    seconds = s.get("train_seconds")
    if not rate or not seconds or cal.get("two_point"):
        return rate / workers or None
    rounds = rounds_per_epoch(config, corpus, workers) * cal.get("epochs", 1)
    busy = sum(v for k, v in s.get("worker_seconds", {}).items() if k in ("sample", "compute")) / workers
    computing = max(seconds - rounds * round_seconds, busy)
    return rate * seconds / (computing if computing > 0 else seconds) / workers


def refused_workers(config: TrainConfig, workers: int) -> str | None:
    """Why `config` cannot train with `workers` workers (a setting that refuses several: PV-DM), or None."""
    try:
        dataclasses.replace(config, num_workers=workers)
    except UserError as e:
        return str(e)
    return None


def row_rates(moved: dict, workers: int, num_ps: int, link: float, compute: float | None,
              server_rows_per_second: float | None, row_bytes: int, pcie: tuple[float, float] | None = None,
              rounds: float = 0.0) -> dict:
    """One row of the scaling table: the tokens/s each limit allows ("rates"), the expectation (the
    least of them) and the limit that sets it ("bound"), all from one model (bound_rates). The links:
    `workers` on the workers' side and `num_ps` on the servers', each of `link` bytes/s, the busier side
    bounding; the blocks a worker hands straight to its next holder ("handed") cross the workers'
    links only, and only the rows that reach the servers count against their apply rate
    (server_rows_per_second, one server's). GPU workers: `compute` is their devices' rate, and `pcie`
    the seconds a token takes on their host↔device links, (streamed, held) as the network's. rounds: the
    seconds a token of the rounds' fixed cost."""
    def seconds(moved_bytes: float, handed: float = 0.0) -> float:  # per token, over the busier side's links
        return max(moved_bytes / (workers * link), (moved_bytes - handed) / (num_ps * link))

    streamed = seconds(moved["pulled"] + moved["pushed"])
    held = seconds(moved["resident_pulled"] + moved["resident_pushed"] + moved["handed"], moved["handed"])
    served = (sum(moved.values()) - moved["handed"]) / row_bytes
    servers = num_ps * server_rows_per_second / served if server_rows_per_second and served else None
    links = {"network": (streamed, held)} if pcie is None else {"pcie": pcie, "network": (streamed, held)}
    return bound_rates(compute, servers, links, compute_name="compute" if pcie is None else "device", rounds=rounds)


def bound_rates(compute: float | None, servers: float | None, links: dict[str, tuple[float, float]],
                compute_name: str = "compute", rounds: float = 0.0) -> dict:
    """The scaling table's model of one row: the tokens/s it expects, what bounds it, and each column.

    links: for each kind of link (the network; a GPU's host↔device link, "pcie"), the seconds a token
    takes on it, (streamed, held). The rows streamed with each macro-batch (pulled, pushed) move while
    the worker computes, so compute and that traffic overlap; the rows a worker holds (its block each
    round, its resident tables) move at a round's or an epoch's end while it waits, so their time adds
    to the rest (the blocks handed straight to their next holder too), as does each round's fixed cost (its
    Ray calls, ROUND_SECONDS; `rounds`, seconds a token): the workers train at
    1 / (max(1/compute, each link's streamed) + the links' held + rounds). The servers apply pushes on their
    own, at their rate; the lower of the two is the expectation. Each column is what its limit allows
    alone (compute, named compute_name: compute; a link: every byte's time on it, 1 / (streamed +
    held); rounds: 1 / rounds; servers: servers), but the bound's, which shows the expectation: that limit with the time
    the others add. The bound is the servers where they are the lower, else the least of compute and
    the links alone. So the expectation is always the least column, and the bound names it.
    Measured over tbf-capped links (benchmarks/network_benchmark.py, 1 and 2 workers, 10 Gbit/s to 100
    Mbit/s): 0.83 to 1.05 of this; the block schedule's 2 workers at 100 Mbit/s trained at 0.67 of
    the links' rate alone."""
    alone = {compute_name: compute or None, "servers": servers or None,
             **{name: 1.0 / (streamed + held) if streamed + held > 0 else None
                for name, (streamed, held) in links.items()},
             "rounds": 1.0 / rounds if rounds > 0 else None}
    if not any(alone.values()):
        return {"rates": alone, "alone": alone, "tokens_per_second": None, "bound": None}
    streamed = max(s for s, _ in links.values())
    held = sum(h for _, h in links.values())
    waits = streamed + held + rounds
    workers = (1.0 / (max(1.0 / compute, streamed) + held + rounds) if compute
               else 1.0 / waits if waits > 0 else None)
    if workers is None or (servers and servers <= workers):
        bound, rate = "servers", servers
    else:
        bound, rate = min((k for k in (compute_name, *links, "rounds") if alone[k]), key=alone.get), workers
    return {"rates": {**alone, bound: rate}, "alone": alone, "tokens_per_second": rate, "bound": bound}


def expected_rate(rates: dict, moved: dict, links: float) -> tuple[float | None, str | None]:
    """The expected tokens/s and what bounds it, bound_rates's model with `links` bytes/s in all for
    every kind of row: rates holds the compute rate alone (W × one worker's) and the servers'."""
    streamed = (moved["pulled"] + moved["pushed"]) / links
    held = (moved["resident_pulled"] + moved["resident_pushed"] + moved["handed"]) / links
    found = bound_rates(rates.get("compute"), rates.get("servers"), {"network": (streamed, held)})
    return found["tokens_per_second"], found["bound"]


# -- a slice of the corpus for calibration ------------------------------------------------------------------

def make_slice(corpus: Corpus, out: str, tokens: int, files: int) -> Corpus:
    """A corpus of the first documents of `corpus` (about `tokens` tokens, in `files` shard files)
    with its whole vocabulary and counts, so that subsampling, negatives and the rows a macro-batch
    touches are those of the full corpus. The slice's documents are numbered 0..n-1 in shard order
    (a refreshed corpus, prepare --base, holds its new users' ids after every earlier one's)."""
    ids, sizes, words, taken = [], [], [], 0
    for doc_ids, offsets, chunk in itertools.chain.from_iterable(map(iter_shard, corpus.shard_paths)):
        n = min(int(np.searchsorted(offsets[1:], tokens - taken, side="left")) + 1, len(doc_ids))
        ids.append(doc_ids[:n])
        sizes.append(np.diff(offsets[:n + 1]))
        words.append(chunk[:offsets[n]])
        taken += int(offsets[n])
        if taken >= tokens:
            break
    original, lengths, words = np.concatenate(ids), np.concatenate(sizes), np.concatenate(words)
    n_docs = len(original)
    doc_ids = np.arange(n_docs, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    cuts = np.unique(np.searchsorted(cum, np.linspace(0, cum[-1], max(1, files) + 1), side="left"))
    cuts[0], cuts[-1] = 0, n_docs
    shards = [write_shard(out, i, doc_ids[a:b], lengths[a:b], words[cum[a]:cum[b]])
              for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    docs = corpus.docs().take(pa.array(original))
    docs = docs.set_column(docs.schema.get_field_index("id"), "id", pa.array(doc_ids))
    with pa.OSFile(os.path.join(out, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, docs.schema) as writer:
        writer.write_table(docs)
    shutil.copyfile(os.path.join(corpus.path, "vocab.arrow"), os.path.join(out, "vocab.arrow"))
    meta = {**corpus.meta, "num_docs": n_docs, "num_tokens": int(cum[-1]), "num_shards": len(shards),
            "shards": shards, "sliced_from": corpus.path, "shards_by": None}  # cut by tokens, not by key
    with open(os.path.join(out, "corpus.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
    return Corpus(out)


# -- measurements on Ray ---------------------------------------------------------------------------------

def empty_ps_bytes() -> int | None:
    """Private memory of a parameter-server process holding no rows, measured in a probe actor."""
    import ray

    from .ps import ParameterServer

    class PsProbe(ParameterServer):  # named apart so memory watches do not take it for a server
        def private_bytes(self) -> int | None:
            return proc_status(os.getpid(), ("RssAnon",)).get("RssAnon")

    probe = ray.remote(PsProbe).options(num_cpus=0).remote(0, 1, {}, 0)
    try:
        return ray.get(probe.private_bytes.remote(), timeout=120)
    finally:
        ray.kill(probe)


def ps_init_seconds_per_row(dim: int, rows: int = 100_000) -> float:
    """Seconds a parameter server takes to initialise one uniform row, timed here on its own code."""
    from .ps import ParameterServer

    t0 = time.perf_counter()
    ParameterServer(0, 1, {"docs": TableSpec("docs", rows, dim, init="uniform")}, 0)
    return (time.perf_counter() - t0) / rows


def calibration_tokens(corpus: Corpus, config: TrainConfig, seconds: float) -> tuple[int, int]:
    """(tokens of the slice, epochs) for a calibration of about `seconds`: the full run's macro-batch
    needs ROUNDS_PER_EPOCH × macro-batch tokens per worker; a smaller corpus is trained whole."""
    want = int(seconds * GUESS_TOKENS_PER_SECOND_PER_WORKER * config.num_workers)
    floor = ROUNDS_PER_EPOCH * effective_macro_batch(config, corpus.num_tokens, corpus.vocab_size) * config.num_workers
    want = max(want, floor)
    if want >= corpus.num_tokens:
        return corpus.num_tokens, int(min(MAX_CALIBRATION_EPOCHS, max(1, want // max(corpus.num_tokens, 1))))
    return want, 1


def calibrate(corpus: Corpus, config: TrainConfig, seconds: float, workdir: str,
              measure: Callable[[str], dict] | None = None) -> dict:
    """Train on slices of the corpus through the real engine; tokens/s, stage times and each
    process's peak private memory (when its processes are children of this one: a local Ray).

    An epoch has fixed costs besides its tokens (the first pulls, resident rows synced at its start
    and end, the last pushes drained) that a full epoch of hundreds of seconds hides and a short
    calibration does not (on 20M users a single short slice overestimated the epoch by about a third).
    So when the first slice trains in under half of `seconds`, a second
    slice sized from its rate to fill `seconds` is trained too, and tokens/s is taken from the
    difference of the two, (tokens₂ − tokens₁) / (time₂ − time₁), in which the fixed costs cancel.
    """
    first = _calibrate_once(corpus, config, *calibration_tokens(corpus, config, seconds), workdir, measure)
    s1 = first["summary"]
    if not first["sliced"] or s1["train_seconds"] <= 0 or s1["train_seconds"] >= seconds / 2:
        return first
    tokens = int(min(corpus.num_tokens, first["corpus_tokens"] * seconds / s1["train_seconds"]))
    if tokens < 1.5 * first["corpus_tokens"]:
        return first
    second = _calibrate_once(corpus, config, tokens, 1, workdir, measure)
    s2 = second["summary"]
    dt = s2["train_seconds"] - s1["train_seconds"]
    if dt > 0:
        marginal = (s2["tokens"] - s1["tokens"]) / dt
        second["summary"] = {**s2, "tokens_per_second": marginal, "slice_tokens_per_second": s2["tokens_per_second"]}
        second["two_point"] = {"tokens": [s1["tokens"], s2["tokens"]],
                               "seconds": [s1["train_seconds"], s2["train_seconds"]]}
    return second


def _calibrate_once(corpus: Corpus, config: TrainConfig, tokens: int, epochs: int, workdir: str,
                    measure: Callable[[str], dict] | None = None) -> dict:
    from .trainer import train

    os.makedirs(workdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="calibration-", dir=workdir)
    try:
        target = corpus if tokens >= corpus.num_tokens else make_slice(
            corpus, os.path.join(work, "corpus"), tokens, config.num_workers)
        # a slice's ids are not an --init-from model's, nor does it list changed users: time a fresh start
        cfg = dataclasses.replace(config, epochs=epochs, progress=False, resume=False, checkpoint_every=0,
                                  keep_checkpoints=1, init_from=None, first_epoch="all")
        with MemoryWatch(os.getpid(), interval=0.25) as watch:
            summary = train(target.path, os.path.join(work, "model"), cfg, overwrite=True)
        procs = watch.processes()
        measured = None
        if measure is not None:  # what the caller does with a trained model (tune: a trial's evaluation), timed
            t0 = time.perf_counter()
            measured = {"result": measure(os.path.join(work, "model")), "seconds": time.perf_counter() - t0}
        cal_tables = shard_table_bytes(table_specs(config, target), config.num_ps)
        return {"corpus_tokens": target.num_tokens, "corpus_docs": target.num_docs, "epochs": epochs,
                "sliced": target is not corpus, "summary": summary, "processes": procs, "measured": measured,
                "table_bytes": [sum(t.values()) for t in cal_tables],
                "macro_batch": effective_macro_batch(config, target.num_tokens, target.vocab_size)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _object_store_bytes(started_here: bool) -> int:
    import ray

    from .cluster import local_object_store_bytes

    if started_here:
        return local_object_store_bytes()
    return int(ray.cluster_resources().get("object_store_memory", 0)) or local_object_store_bytes()


# -- a corpus you do not have yet ------------------------------------------------------------------------

# The shape an estimate assumes where no corpus is given (plan --users N --urls M --tokens-per-user T):
# URL visits Zipf-distributed over the URLs ranked by count, exponent ESTIMATE_ZIPF_S, and a user's number
# of events 1 + Poisson(λ), λ lognormal of σ ESTIMATE_LENGTH_SIGMA with mean T − 1, each event a URL drawn
# from that Zipf law: the shape of the browsing logs `generate` makes, the bundled sample's (less its
# communities, which make a user's URLs more alike: the estimate counts a few more distinct rows).
ESTIMATE_ZIPF_S = 1.0
ESTIMATE_LENGTH_SIGMA = 1.0
# The users written down to stand for all of them: enough for the counts a plan makes on real ones
# (macro_batch_profile's macro-batches, bytes_per_token's SCALING_SAMPLE_DOCS, the calibration's slices),
# at most this many tokens (more would take longer to write than they change the figures).
ESTIMATE_SAMPLE_MAX_TOKENS = 16 << 20


class EstimatedCorpus(Corpus):
    """A corpus of `num_docs` users and `num_tokens` tokens of which a sample lies on disk (`sample`, a
    Corpus of its own, what a calibration trains): its users stand for all of them, and its vocabulary is
    the whole one, its counts times `count_scale` (1 where the sample was written with the whole's)."""

    def __init__(self, sample_path: str, num_docs: int, num_tokens: int, count_scale: float, estimate: dict):
        super().__init__(sample_path)
        self.sample = Corpus(sample_path)
        self.num_docs, self.num_tokens, self.count_scale = int(num_docs), int(num_tokens), count_scale
        self.estimate = estimate

    def counts(self) -> np.ndarray:
        counts = super().counts()
        return counts if self.count_scale == 1 else np.maximum(1, np.rint(counts * self.count_scale)).astype(np.int64)


def check_estimate(users: int | None, urls: int | None, tokens_per_user: float | None, corpus_given: bool) -> None:
    """Refuse an estimate's sizes that do not make one, naming the flag."""
    if corpus_given:
        for flag, value in (("--urls", urls), ("--tokens-per-user", tokens_per_user)):
            if value is not None:
                raise UserError(f"{flag} estimates a corpus you do not have (with --users and no --corpus); "
                                "--corpus CORPUS --users N scales that corpus to N users, its URLs and its users' "
                                "lengths as they are")
    else:
        missing = [flag for flag, value in (("--users", users), ("--urls", urls), ("--tokens-per-user", tokens_per_user))
                   if value is None]
        if missing:
            raise UserError("plan needs --corpus CORPUS, or --users N --urls M --tokens-per-user T to estimate a corpus "
                            f"you do not have yet (missing: {' '.join(missing)})")
    for flag, value, least in (("--users", users, 1), ("--urls", urls, 1), ("--tokens-per-user", tokens_per_user, 1)):
        if value is not None and not value >= least:
            raise UserError(f"{flag} must be at least {least} (given {value:g})")


def estimate_sample_tokens(config: TrainConfig, cal_config: TrainConfig | None, num_tokens: int, vocab: int,
                           tokens_per_user: float, calibrate_seconds: float) -> int:
    """Tokens of the sample an estimate writes: three of the full run's macro-batches
    (macro_batch_profile), SCALING_SAMPLE_DOCS users (bytes_per_token), and where it calibrates
    (cal_config) twice the calibration's first slice (the second slice of a two-point calibration is
    larger), within the corpus and ESTIMATE_SAMPLE_MAX_TOKENS."""
    want = max(3 * effective_macro_batch(config, num_tokens, vocab), int(SCALING_SAMPLE_DOCS * tokens_per_user))
    if cal_config is not None:
        want = max(want, 2 * calibration_tokens(_Sizes(num_tokens, vocab), cal_config, calibrate_seconds)[0])
    return int(min(num_tokens, want, ESTIMATE_SAMPLE_MAX_TOKENS))


@dataclasses.dataclass
class _Sizes:  # a corpus's sizes, all that calibration_tokens, table_specs and settle_segments read of one
    num_tokens: int
    vocab_size: int
    num_docs: int = 0
    meta: dict = dataclasses.field(default_factory=dict)


def zipf_corpus(out: str, users: int, urls: int, tokens_per_user: float, sample_tokens: int, seed: int) -> EstimatedCorpus:
    """An EstimatedCorpus of `users` × `tokens_per_user` tokens over `urls` URLs in the shape the estimate
    assumes (ESTIMATE_ZIPF_S, ESTIMATE_LENGTH_SIGMA), its sample of about `sample_tokens` tokens written
    at `out` as prepare writes a corpus; the vocabulary's counts are the whole corpus's expected ones."""
    from .corpus import DOCS_SCHEMA, FORMAT_VERSION, VOCAB_SCHEMA

    rng = np.random.default_rng([seed, 0xE57])
    total = round(users * tokens_per_user)
    share = 1.0 / np.power(np.arange(1, urls + 1, dtype=np.float64), ESTIMATE_ZIPF_S)
    share /= share.sum()
    counts = np.maximum(1, np.rint(share * total)).astype(np.int64)
    n = int(min(users, max(1, math.ceil(sample_tokens / tokens_per_user))))
    sigma = ESTIMATE_LENGTH_SIGMA
    lengths = 1 + rng.poisson((tokens_per_user - 1) * rng.lognormal(-sigma**2 / 2, sigma, size=n)).astype(np.int64)
    tokens = np.searchsorted(np.cumsum(share), rng.random(int(lengths.sum())), side="right")
    tokens = np.minimum(tokens, urls - 1).astype(np.int32)  # (the cumulative sum's last may round below 1)
    os.makedirs(out)
    doc_ids = np.arange(n, dtype=np.int64)
    shard = write_shard(out, 0, doc_ids, lengths, tokens)

    def named(prefix: str, count: int) -> pa.Array:  # prefix0, prefix1, … (millions of them: in Arrow)
        return pc.binary_join_element_wise(prefix, pa.array(np.arange(count)).cast(pa.string()), "")

    for name, schema, columns in (
            ("vocab.arrow", VOCAB_SCHEMA, [named("url", urls), pa.array(counts), pa.array(np.arange(urls, dtype=np.int32))]),
            ("docs.arrow", DOCS_SCHEMA, [named("user", n), pa.array(doc_ids), pa.array(lengths)])):
        with pa.OSFile(os.path.join(out, name), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(pa.table(dict(zip(schema.names, columns)), schema=schema))
    estimate = {"users": users, "urls": urls, "tokens_per_user": tokens_per_user, "from": "zipf",
                "assumption": f"URL visits Zipf with exponent {ESTIMATE_ZIPF_S:g} over the URLs by rank; a user's "
                              f"events 1 + Poisson(lognormal, σ {ESTIMATE_LENGTH_SIGMA:g}) with mean {tokens_per_user:g}",
                "sample_docs": n, "sample_tokens": int(lengths.sum())}
    with open(os.path.join(out, "corpus.json"), "w") as fh:
        json.dump({"format_version": FORMAT_VERSION, "num_docs": n, "num_tokens": int(lengths.sum()),
                   "vocab_size": urls, "num_shards": 1, "shards": [shard], "format": "events",
                   "estimate": estimate}, fh, indent=2)
    return EstimatedCorpus(out, users, total, 1.0, estimate)


def scaled_corpus(corpus: Corpus, users: int) -> EstimatedCorpus:
    """`corpus` as if it had `users` users of the same shape: its users stand for all of them, its
    vocabulary (URLs) as it is, the counts and tokens times users / its users."""
    scale = users / max(corpus.num_docs, 1)
    estimate = {"users": users, "urls": corpus.vocab_size, "tokens_per_user": corpus.num_tokens / max(corpus.num_docs, 1),
                "from": corpus.path,
                "assumption": f"{corpus.path}'s {corpus.num_docs:,} users, their lengths and its {corpus.vocab_size:,} "
                              f"URLs' shares, for {users:,} users",
                "sample_docs": corpus.num_docs, "sample_tokens": corpus.num_tokens}
    return EstimatedCorpus(corpus.path, users, round(corpus.num_tokens * scale), scale, estimate)


# -- the plan ------------------------------------------------------------------------------------------

def calibration_config(config: TrainConfig, workers: int | None) -> TrainConfig:
    """The config the calibration trains: config's, with `workers` workers (1 … config.num_workers)."""
    if workers is None or workers == config.num_workers:
        return config
    if not 1 <= workers <= config.num_workers:
        raise UserError(f"--calibrate-workers {workers}: give 1 to --num-workers ({config.num_workers}); the "
                        "calibrated workers' rate is scaled to --num-workers")
    return dataclasses.replace(config, num_workers=workers)


def refuse_calibration(config: TrainConfig, cal_config: TrainConfig, corpus: Corpus, seconds: float,
                       resources: dict[str, float] | None) -> None:
    """Refuse, in one line naming the ways out, a calibration whose workers and servers the Ray it runs on
    cannot hold: `resources`, a joined cluster's (refused where it cannot grow: elsewhere the run waits
    for its autoscaler, as train's does), or None: this machine's, before a local Ray starts. The servers
    hold the calibration's slice of the corpus (calibration_tokens), not the whole."""
    from .cluster import local_object_store_bytes
    from .placement import cluster_can_grow, fit_problems, local_resources

    where = "this machine" if resources is None else "the Ray cluster"
    resources = local_resources(local_object_store_bytes()) if resources is None else resources
    tokens = calibration_tokens(corpus, cal_config, seconds)[0]
    part = _Sizes(tokens, corpus.vocab_size, math.ceil(corpus.num_docs * tokens / max(corpus.num_tokens, 1)))

    def problems(cfg: TrainConfig) -> list[str]:
        return fit_problems(cfg, table_specs(cfg, part), resources, where=where, way_out=False)

    found = problems(cal_config)
    if not found or (where != "this machine" and cluster_can_grow() is not False):
        return
    one = dataclasses.replace(cal_config, num_workers=1)
    scale = (f", or calibrate one worker and scale its rate to {config.num_workers} (--calibrate-workers 1)"
             if cal_config.num_workers > 1 and not problems(one) else "")
    raise UserError(f"plan's calibration run cannot start here: {found[0]}; plan without it (--no-calibrate: "
                    f"memory and bytes per token, no time){scale}")


def check_gpu_flags(config: TrainConfig, model: str | None, tokens_per_second: float | None,
                    hbm_gb_per_second: float | None, pcie_gb_per_second: float | None) -> dict:
    """plan's GPU flags, refused with one line where wrong, as device_rates takes them (bytes/s)."""
    given = {"--gpu-model": model, "--device-tokens-per-second": tokens_per_second,
             "--hbm-gb-per-second": hbm_gb_per_second, "--pcie-gb-per-second": pcie_gb_per_second}
    what = {"--device-tokens-per-second": "the tokens/s one GPU trains",
            "--hbm-gb-per-second": "one GPU's memory bandwidth in GB/s",
            "--pcie-gb-per-second": "one GPU's host-device link in GB/s"}
    for flag, value in given.items():
        if value is None:
            continue
        if config.gpus_per_worker <= 0:
            raise UserError(f"{flag} is a GPU worker's device: plan GPU workers (--gpus-per-worker 1, or --config "
                            "jobs/configs/gpu.yaml), or leave it out")
        if flag == "--gpu-model" and value not in DEVICES:
            raise UserError(f"--gpu-model {value} is not a device plan knows: one of {', '.join(DEVICES)}; for "
                            "another, give its figures (--hbm-gb-per-second, --pcie-gb-per-second, "
                            "--device-tokens-per-second)")
        if flag != "--gpu-model" and not value > 0:
            raise UserError(f"{flag} must be > 0 (given {value:g}): {what[flag]}")
    return {"model": model, "tokens_per_second": tokens_per_second,
            "hbm_bytes_per_second": hbm_gb_per_second * 1e9 if hbm_gb_per_second else None,
            "pcie_bytes_per_second": pcie_gb_per_second * 1e9 if pcie_gb_per_second else None}


def plan(corpus_path: str | None, config: TrainConfig, calibrate_seconds: float = 30.0, workdir: str | None = None,
         run_calibration: bool = True, measure: Callable[[str], dict] | None = None,
         network_gbps: float = 10.0, calibrate_workers: int | None = None, users: int | None = None,
         urls: int | None = None, tokens_per_user: float | None = None,
         gpu_model: str | None = None, device_tokens_per_second: float | None = None,
         hbm_gb_per_second: float | None = None, pcie_gb_per_second: float | None = None) -> dict:
    """Memory per process and time per epoch of training `config` on the corpus, before training it.

    calibrate_workers: the workers the calibration trains (default: config.num_workers); fewer, and the
    time is the scaling table's row for config.num_workers, from their rate (a cluster larger than the
    Ray the calibration runs on). users: an estimate, for a corpus not made yet: with corpus_path, that
    corpus scaled to `users` users (scaled_corpus); without, `users` × `tokens_per_user` tokens over
    `urls` URLs in the shape zipf_corpus assumes, its sample written under workdir and removed after.
    gpu_model, device_tokens_per_second, hbm_gb_per_second, pcie_gb_per_second: GPU workers' device
    (a name of DEVICES), its rate, its memory's bandwidth and its host link in the scaling table
    (device_rates; None: a calibration's on the GPUs, or the device's figures)."""
    config.validate()
    if not network_gbps > 0:
        raise UserError(f"--network-gbps must be > 0 (given {network_gbps:g}): the links' bandwidth in Gbit/s")
    gpu = check_gpu_flags(config, gpu_model, device_tokens_per_second, hbm_gb_per_second, pcie_gb_per_second)
    cal_config = calibration_config(config, calibrate_workers)
    how = {"calibrate_seconds": calibrate_seconds, "workdir": workdir, "run_calibration": run_calibration,
           "measure": measure, "network_gbps": network_gbps, "calibrate_workers": cal_config.num_workers,
           "gpu": gpu}
    if corpus_path is not None and users is None:
        return _plan(Corpus(corpus_path), config, **how)
    check_estimate(users, urls, tokens_per_user, corpus_given=corpus_path is not None)
    if corpus_path is not None:
        return _plan(scaled_corpus(Corpus(corpus_path), users), config, **how)
    events = _Sizes(round(users * tokens_per_user), urls)  # (no text: the default --segments of events)
    config = settle_segments(config, events)
    sample_tokens = estimate_sample_tokens(config, calibration_config(config, calibrate_workers) if run_calibration
                                           else None, events.num_tokens, urls, tokens_per_user, calibrate_seconds)
    os.makedirs(workdir or tempfile.gettempdir(), exist_ok=True)
    work = tempfile.mkdtemp(prefix="estimate-", dir=workdir or tempfile.gettempdir())
    try:
        corpus = zipf_corpus(os.path.join(work, "corpus"), users, urls, tokens_per_user, sample_tokens, config.seed)
        return _plan(corpus, config, **how)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plan(corpus: Corpus, config: TrainConfig, calibrate_seconds: float, workdir: str | None,
          run_calibration: bool, measure: Callable[[str], dict] | None, network_gbps: float,
          calibrate_workers: int, gpu: dict | None = None) -> dict:
    config = settle_segments(config, corpus)
    tables = table_specs(config, corpus)
    cal_config = calibration_config(config, calibrate_workers)
    profile = macro_batch_profile(corpus, config)
    width = tables["words_out"].width
    sources = {}
    estimate = getattr(corpus, "estimate", None)  # an EstimatedCorpus: its sample, and what it assumes
    trained = getattr(corpus, "sample", corpus)  # what a calibration trains: the corpus, or the estimate's sample
    result: dict = {"corpus": {"path": None if estimate and estimate["from"] == "zipf" else corpus.path,
                               "docs": corpus.num_docs, "tokens": corpus.num_tokens,
                               "vocab": corpus.vocab_size, "shards": corpus.num_shards,
                               "tokens_per_doc": corpus.num_tokens / max(corpus.num_docs, 1)},
                    "config": dataclasses.asdict(config),
                    "tables": {name: spec.to_json() for name, spec in tables.items()}, "macro_batch": profile,
                    "estimate": estimate}
    ps_fixed, cal, store = None, None, None
    if run_calibration:
        import ray

        from .cluster import ray_connection

        # plan's own refusal where plan connects to Ray (the command); a caller already on Ray (tune) has
        # train's, which names the training flags
        connects = not ray.is_initialized()
        if connects and not (config.address or os.environ.get("RAY_ADDRESS")):
            # a local Ray's resources, before starting it
            refuse_calibration(config, cal_config, trained, calibrate_seconds, None)
        with ray_connection(config.address) as started_here:
            if connects and not started_here:
                refuse_calibration(config, cal_config, trained, calibrate_seconds, ray.cluster_resources())
            ps_fixed = empty_ps_bytes()
            store = _object_store_bytes(started_here)
            local = started_here or len([n for n in ray.nodes() if n.get("Alive")]) == 1
            cal = calibrate(trained, cal_config, calibrate_seconds, workdir or tempfile.gettempdir(), measure)
        cal["workers"] = cal_config.num_workers
        result["calibration"] = cal
    else:
        from .cluster import local_object_store_bytes

        store, local = local_object_store_bytes(), True

    # fixed costs: measured where the processes were seen, else modelled
    measured = {p["label"]: p for p in (cal or {}).get("processes", [])}
    servers = [p for p in measured.values() if p["role"] == "ps"]
    workers = [p for p in measured.values() if p["role"] == "worker"]
    pull_per_ps = profile["unique_rows"] * tables["words_out"].row_bytes / config.num_ps
    ps_overhead = (ps_fixed or PROCESS_BYTES) + int(PS_RETAINED_PULLS * pull_per_ps)
    sources["ps_overhead"] = (("empty PS measured in a probe actor" if ps_fixed else "a process, modelled")
                              + f" + {PS_RETAINED_PULLS} × one pull's bytes (modelled)")
    # (servers of an earlier run on the same Ray may still be exiting when the watch starts: at least
    # num_ps seen, not exactly)
    if len(servers) >= config.num_ps and cal:
        seen = max(p["private"] - max(cal["table_bytes"]) for p in servers)
        ps_overhead = max(seen, ps_fixed or 0)
        sources["ps_overhead"] = "measured in calibration (peak private − its rows)"
        result["ps_overhead_measured"] = seen
    batch = worker_batch_bytes(profile, width)
    # (a calibration of fewer workers ran another schedule, its worker holding other rows: not this one's)
    if cal and cal["workers"] == config.num_workers and len(workers) >= config.num_workers:
        resident = resident_plan(config, tables["words_out"], tables["docs"])
        on_host = resident["bytes"] if resident["on"] == "host" else 0
        worker_fixed = max(0, max(p["private"] for p in workers) - batch - on_host)
        sources["worker_fixed"] = "measured in calibration (peak private − batch − resident rows)"
    else:
        worker_fixed = PROCESS_BYTES + VOCAB_BYTES_PER_WORD * corpus.vocab_size
        sources["worker_fixed"] = "modelled (process + vocabulary arrays)"
    if "driver" in measured and "ps0" in measured:
        driver, sources["driver"] = measured["driver"]["private"], "measured in calibration (this process)"
    else:
        driver, sources["driver"] = PROCESS_BYTES, "modelled (constant)"
    if "ray" in measured and "ps0" in measured:
        ray_system, sources["ray_system"] = measured["ray"]["pss"], "measured in calibration (PSS)"
    else:
        ray_system, sources["ray_system"] = RAY_SYSTEM_BYTES, "modelled (constant)"
    device = device_rates(config, cal, gpu)
    sized = sized_for_device(config, corpus, device)  # its documents' room on the device, as a worker sizes it
    memory = memory_plan(tables, sized, profile, ps_overhead=ps_overhead, worker_fixed=worker_fixed,
                         driver=driver, ray_system=ray_system, object_store=store)
    memory["sources"] = sources
    memory["empty_ps"] = ps_fixed
    result["memory"] = memory
    result["network_gbps"] = network_gbps
    listed = scaling_workers(config)
    result["device"] = device
    result["documents"] = document_ways(corpus, sized, device)
    result["scaling"] = scaling_plan(corpus, sized, cal, network_gbps, profile, workers=listed, gpu=gpu)
    unlisted = [w for w in listed if refused_workers(config, w)]
    result["scaling_unlisted"] = {"workers": unlisted, "why": refused_workers(config, unlisted[0])} if unlisted else None
    scaled = None
    if cal and cal["workers"] != config.num_workers:  # the planned workers' row, from the calibrated ones' rate
        scaled = next(r for r in result["scaling"] if r["workers"] == config.num_workers)["tokens_per_second"]
    result["time"] = time_plan(corpus, config, tables, cal, scaled) if cal else None
    ram = psutil.virtual_memory().total
    result["node_ram"] = ram
    result["warnings"] = plan_warnings(result, ram, local) + quality_warnings(config, corpus)
    return result


def time_plan(corpus: Corpus, config: TrainConfig, tables: dict[str, TableSpec], cal: dict,
              scaled: float | None = None) -> dict:
    """Time per epoch, startup, checkpoints and the whole run, scaled from the calibration. scaled: the
    tokens/s of config.num_workers where the calibration trained fewer (the scaling table's row)."""
    s = cal["summary"]
    tps = scaled or s["tokens_per_second"]
    if tps <= 0:
        raise UserError("the calibration run trained no tokens; cannot estimate time")
    epoch = corpus.num_tokens / tps
    full_bytes = sum(sum(t.values()) for t in shard_table_bytes(tables, config.num_ps))
    cal_bytes = sum(cal["table_bytes"])
    ckpt_rate = cal_bytes / s["checkpoint_seconds"] if s.get("checkpoint_seconds") else None
    checkpoint_s = full_bytes / ckpt_rate if ckpt_rate else None
    # servers initialise their uniform rows in parallel; the calibration's startup held the slice's
    # (words and words_out have the whole vocabulary in the slice already; only docs grow)
    extra_rows = max(0, math.ceil(corpus.num_docs / config.num_ps) - math.ceil(cal["corpus_docs"] / config.num_ps))
    per_row = ps_init_seconds_per_row(config.dim)
    startup = s.get("startup_seconds", 0.0) + extra_rows * per_row
    train_s = epoch * config.epochs
    n_ckpt = 1 + (min(config.epochs - 1, int(train_s // config.checkpoint_every)) if config.checkpoint_every else 0)
    total = startup + train_s + n_ckpt * (checkpoint_s or 0.0)
    return {"tokens_per_second": tps, "epoch_seconds": epoch, "startup_seconds": startup,
            "ps_init_seconds_per_row": per_row, "checkpoint_seconds": checkpoint_s,
            "checkpoint_bytes_per_second": ckpt_rate, "checkpoints": n_ckpt, "total_seconds": total,
            "worker_seconds": s.get("worker_seconds", {}), "scaled_from_workers": cal["workers"] if scaled else None,
            "calibration_train_seconds": s.get("train_seconds"), "calibration_tokens": s.get("tokens")}


def plan_warnings(result: dict, ram: int, local: bool) -> list[str]:
    mem, cfg = result["memory"], result["config"]
    out = []
    if local and mem["node_total"] > OOM_FRACTION * ram:
        out.append(f"the run needs {_gb(mem['node_total'])} on this node (processes {_gb(mem['processes_total'])} "
                   f"+ object store {_gb(mem['object_store']['capacity'])}) but it has {_gb(ram)}; Ray's OOM "
                   f"killer acts above {OOM_FRACTION:.0%}: add parameter servers on other nodes or lower the "
                   "object store")
    elif not local:
        biggest = max(p["total"] for p in mem["ps"])
        if biggest > OOM_FRACTION * ram:
            out.append(f"one parameter server needs {_gb(biggest)}, more than this node's {_gb(ram)}: "
                       f"use more than {cfg['num_ps']} servers")
    store = mem["object_store"]
    if store["in_flight"] > store["capacity"]:
        out.append(f"pulls and pushes in flight ({_gb(store['in_flight'])}) exceed the object store "
                   f"({_gb(store['capacity'])}): it will spill to disk; lower --macro-batch or --max-inflight-pushes")
    return out


# -- output ---------------------------------------------------------------------------------------------

def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f} GiB" if n >= 0.1 * GiB else f"{n / 2**20:.0f} MiB"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f} s" if x < 600 else f"{x:,.0f} s ({x / 3600:.2f} h)"


def format_plan(p: dict) -> str:
    c, cfg, mem, prof = p["corpus"], p["config"], p["memory"], p["macro_batch"]
    src = mem["sources"]
    words_out = TableSpec.from_json("words_out", p["tables"]["words_out"])
    width, row_bytes = words_out.width, words_out.row_bytes
    mode = cfg["mode"] + (" + dbow_words" if cfg["dbow_words"] else "")
    est = p.get("estimate")
    if est:  # no corpus read whole: its figures come from a sample standing for it
        lines = [(f"plan: an estimate for {est['users']:,} users × {est['tokens_per_user']:,.1f} tokens over "
                 f"{est['urls']:,} URLs, from {est['sample_docs']:,} users standing for them")]
        lines.append(f"  estimate: {est['assumption']}")
    else:
        lines = [f"plan: {c['path']}"]
    lines.append(f"  corpus {c['docs']:,} docs, {c['tokens']:,} tokens ({c['tokens_per_doc']:.1f} a doc), "
                 f"vocabulary {c['vocab']:,}")
    lines.append(f"  {mode}, dim {cfg['dim']}, negative {cfg['negative']}, optimizer {cfg['optimizer']}, "
                 f"{_n(cfg['num_ps'], 'parameter server')}, {_n(cfg['num_workers'], 'worker')}, {_n(cfg['epochs'], 'epoch')}")
    lines.append(f"  macro-batch {prof['macro_batch']:,} tokens: {prof['examples']:,} examples, unique rows "
                 f"{prof['docs']:,} docs + {prof['words']:,} words + {prof['words_out']:,} words_out "
                 f"= {_gb(prof['unique_rows'] * row_bytes)} pulled and pushed"
                 + (f" ({words_out.dtype})" if words_out.dtype != "float32" else ""))
    res = mem["resident"]
    held = " + ".join(f"{n} {'all ' if res['all'] else ''}{r:,} rows" for n, r in res["tables"].items() if r)
    lines.append(f"  resident in each worker (its {res['on']} memory): "
                 + (f"{held} = {_gb(res['bytes'])}" if held else "none")
                 + (f" (words_out in {res['dtype']})" if res["dtype"] != "float32" else ""))
    parts = res.get("document_partitions", 0)
    lines.append("  documents' rows: " + (
        "pulled and pushed with each macro-batch" if not parts else
        "kept in each worker across epochs: pulled once, written back at each checkpoint and the run's end"
        if parts == 1 else
        f"swapped by partition: up to {parts} partitions, each pulled and written back once an epoch"))
    device = p.get("device")
    if device and device.get("document_room") is not None:
        lines.append(f"    (room for them: {_gb(device['document_room'])} of the {device['model']}'s "
                     f"{device['memory_bytes'] / 1e9:g} GB, as a worker sizes it at its start; --device-memory sets it)")
    elif cfg.get("device_memory") is not None and parts:
        lines.append(f"    (room for them: --device-memory {cfg['device_memory']:g} GiB)")
    ways = p.get("documents")
    if ways:
        def way(name: str) -> str:
            w = ways[name]
            return f"{w['bytes_per_token']:.1f}" + (f" ({w['pcie_bytes_per_token']:.1f} over PCIe)"
                                                    if w["pcie_bytes_per_token"] is not None else "")
        taken = {0: "neither: they stream", 1: "kept"}.get(ways["way"], "partitions")
        lines.append(f"    bytes a token to and from the servers: kept across epochs {way('kept')}, in partitions "
                     f"{way('partitions')}; this run: {taken}")

    def row(label: str, value: str, how: str) -> None:
        lines.append(f"  {label:<34}{value:>14}   {how}")

    lines.append("")
    row("memory (private, per process)", "planned", "how")
    big = max(mem["ps"], key=lambda x: x["total"])
    parts = ", ".join(f"{n} {b / row_bytes:,.0f} rows" for n, b in big["tables"].items())
    row(f"parameter server (largest of {len(mem['ps'])})", _gb(big["total"]),
        f"rows {_gb(big['table_bytes'])} ({parts} × {row_bytes} B) + overhead {_gb(big['overhead'])} "
        f"[{src['ps_overhead']}]")
    w = mem["worker"]
    row("worker (each)", _gb(w["total"]), f"batches {_gb(w['batch'])} (2 × examples + 2 × {prof['unique_rows']:,} "
        f"rows × {width} × 4 B) + resident {_gb(w['resident'])} + fixed {_gb(w['fixed'])} [{src['worker_fixed']}]")
    row("driver", _gb(mem["driver"]), f"[{src['driver']}]")
    row("Ray processes (raylet, GCS, …)", _gb(mem["ray_system"]), f"[{src['ray_system']}]")
    st = mem["object_store"]
    row("object store (shared, capacity)", _gb(st["capacity"]),
        f"in flight ≈ {_gb(st['in_flight'])} ({_n(cfg['num_workers'], 'worker')} × (2 pulls + "
        f"{cfg['max_inflight_pushes']} pushes) × {_gb(st['macro_batch_rows_bytes'])})")
    row("node total (all on one node)", _gb(mem["node_total"]), f"of {_gb(p['node_ram'])} on this machine")
    t = p.get("time")
    if t:
        cal = p["calibration"]
        split = t["worker_seconds"]
        busy = sum(split.values()) or 1.0
        what = "a slice" if cal["sliced"] else "the whole corpus"
        lines.append("")
        row("time", "planned", "how")
        two = cal.get("two_point")
        how = (f"calibration: two slices, {two['tokens'][0]:,} and {two['tokens'][1]:,} tokens in "
               f"{two['seconds'][0]:.1f} and {two['seconds'][1]:.1f} s: the difference's rate"
               if two else f"calibration: {what}, {cal['corpus_tokens']:,} tokens ({cal['corpus_docs']:,} docs) × "
               f"{cal['epochs']} epochs in {t['calibration_train_seconds']:.1f} s")
        scaled = t.get("scaled_from_workers")
        if scaled:
            row("tokens/s", f"{t['tokens_per_second'] / 1e6:.3f}M",
                f"{_n(scaled, 'worker')} calibrated, its rate scaled to {_n(cfg['num_workers'], 'worker')} by the "
                "scaling table (below)")
            row("", f"{cal['summary']['tokens_per_second'] / 1e6:.3f}M", f"the {_n(scaled, 'worker')}'s {how}")
        else:
            row("tokens/s", f"{t['tokens_per_second'] / 1e6:.3f}M", how)
        row("", "", "worker time: " + " ".join(f"{k} {100 * v / busy:.0f}%" for k, v in split.items()))
        row("per epoch", _s(t["epoch_seconds"]), f"{c['tokens']:,} tokens / tokens/s")
        row("startup", _s(t["startup_seconds"]),
            f"calibration's + each server's extra rows × {t['ps_init_seconds_per_row'] * 1e6:.2f} µs")
        row("checkpoint (each)", _s(t["checkpoint_seconds"]),
            f"table bytes at {_gb(t['checkpoint_bytes_per_second'])}/s (calibration's rate)")
        row("whole run", _s(t["total_seconds"]), f"startup + {cfg['epochs']} epochs + {t['checkpoints']} checkpoints")
    if p.get("scaling"):
        lines.append("")
        lines.append(f"  scaling ({'the block schedule' if cfg.get('schedule') != 'shared' else 'shared rows'} where "
                     f"it applies; links of {p['network_gbps']:g} Gbit/s, one per worker and {cfg['num_ps']} on the "
                     f"servers' side; rounds at {ROUND_SECONDS * 1e3:.0f} ms each of Ray calls; tokens/s each limit "
                     "allows alone, but the bound's: what it allows with the time the others add, the expectation)")
        if device:  # GPU workers: the device and its host-device link beside the servers and the network
            lines.append(f"  device: {device['model']} (--gpu-model), {device['tokens_per_second'] / 1e6:.2f}M "
                         f"tokens/s a GPU ({device['source']}); PCIe: {device['pcie_bytes_per_second'] / 1e9:g} GB/s "
                         f"a GPU ({device['pcie_source']})")
            lines.append(f"  its memory's ceiling: {device['hbm_tokens_per_second'] / 1e6:.0f}M tokens/s a GPU "
                         f"({device['hbm_bytes_per_second'] / 1e12:.2f} TB/s, {device['hbm_source']}, over the "
                         f"{device['device_bytes_per_token']:,} B a token's pair reads and writes); the kernel at "
                         f"{device['tokens_per_second'] / device['hbm_tokens_per_second']:.1%} of it")
            lines.append(f"  {'GPUs':>6} {'workers':>8} {'bytes/token':>12} {'PCIe B/token':>13} {'device':>10} "
                         f"{'pcie':>10} {'servers':>10} {'network':>10} {'rounds':>10} {'expected':>10}  bound")
        else:
            lines.append(f"  {'workers':>8} {'bytes/token':>12} {'compute':>10} {'servers':>10} {'network':>10} "
                         f"{'rounds':>10} {'expected':>10}  bound")
        for r in p["scaling"]:
            rate = r["rates"]
            if device:
                lines.append(f"  {r['gpus']:>6g} {r['workers']:>8} {r['total_bytes_per_token']:>12.1f} "
                             f"{r['total_pcie_bytes_per_token']:>13.1f} "
                             + " ".join(f"{_m(rate.get(k)):>10}" for k in ("device", "pcie", "servers", "network", "rounds"))
                             + f" {_m(r['tokens_per_second']):>10}  {r['bound'] or '-'}")
                continue
            lines.append(f"  {r['workers']:>8} {r['total_bytes_per_token']:>12.1f} "
                         + " ".join(f"{_m(rate.get(k)):>10}" for k in ("compute", "servers", "network", "rounds"))
                         + f" {_m(r['tokens_per_second']):>10}  {r['bound'] or '-'}")
        lines.extend(more_servers_lines(p["scaling"]))
        if p.get("scaling_unlisted"):
            gone = p["scaling_unlisted"]
            lines.append(f"  not listed: {', '.join(map(str, gone['workers']))} workers ({gone['why']})")
        asked = cfg["num_workers"]
        then = None if cfg.get("force_workers") else faster_fewer(p["scaling"], asked)
        if then:
            got = next(r for r in p["scaling"] if r["workers"] == asked)
            lines.append(f"  train takes {_n(then['workers'], 'worker')} here, not {asked}: "
                         f"{_m(then['tokens_per_second'])} tokens/s against {_m(got['tokens_per_second'])} "
                         f"(bound: {got['bound']}); --force-workers trains with {asked}")
    for warning in p["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


# A row whose workers gain less than this over the row before (twice as many, or what the table lists) is
# "no faster": the links on the servers' side, or the servers, are full; more servers is then the way on.
NO_FASTER = 1.1


def more_servers_lines(scaling: list[dict]) -> list[str]:
    """For each row whose workers train no faster than the row before's (NO_FASTER), or slower, what a
    server per worker would give where that helps, from the same model (scaling_plan's "more_servers")."""
    out = []
    for before, r in itertools.pairwise(scaling):
        more, rate, was = r.get("more_servers"), r["tokens_per_second"], before["tokens_per_second"]
        if not (more and rate and was and rate < NO_FASTER * was and more["tokens_per_second"] >= 1.05 * rate):
            continue
        how = "slower than" if rate < 0.99 * was else "no faster than"
        out.append(f"  {r['workers']} workers are {how} {before['workers']} here: with --num-ps {more['num_ps']} "
                   f"(a server per worker, each on a node of its own) they would train "
                   f"{more['tokens_per_second'] / 1e6:.2f}M tokens/s, {more['tokens_per_second'] / rate:.1f}× "
                   f"(bound: {more['bound']})")
    return out


def choose_workers(corpus: Corpus, config: TrainConfig, worker_rate: float | None = None) -> tuple[TrainConfig, str | None]:
    """train's number of workers: config's, unless the scaling table's model (scaling_plan) predicts fewer to
    train faster by NO_FASTER (a small corpus, whose rounds' fixed cost outweighs what a worker more computes):
    then the fastest of the table's fewer, and the line that says so with both figures. Nothing is
    calibrated: one worker computes at `worker_rate` (default UNCALIBRATED_TOKENS_PER_SECOND, by where it
    computes), over CHOICE_NETWORK_GBPS links. As asked with --force-workers, or with one worker. (A resumed
    run may change its workers: the same choice holds for it.)"""
    asked = config.num_workers
    if asked == 1 or config.force_workers:
        return config, None
    fewer = tuple(w for w in SCALING_WORKERS if w < asked and not refused_workers(config, w))
    if not fewer:
        return config, None
    rate = worker_rate or UNCALIBRATED_TOKENS_PER_SECOND["gpu" if config.gpus_per_worker > 0 else "cpu"]
    cal = {"summary": {"tokens_per_second": rate}, "workers": 1}
    rows = scaling_plan(corpus, config, cal, CHOICE_NETWORK_GBPS, workers=(*fewer, asked))
    then = faster_fewer(rows, asked)
    if then is None:
        return config, None
    got, best = rows[-1], then["workers"]
    why = (f"each of {_n(got['rounds_per_epoch'], 'round')} an epoch costs about {ROUND_SECONDS * 1e3:.0f} ms of Ray "
           f"calls, against {corpus.num_tokens / got['rounds_per_epoch']:,.0f} tokens a round"
           if got["bound"] == "rounds" else f"bound: {got['bound']}")
    line = (f"train: {_n(asked, 'worker')} are predicted to train this corpus at {_m(got['tokens_per_second'])} tokens/s "
            f"and {_n(best, 'worker')} at {_m(then['tokens_per_second'])} ({why}; plan's model, a worker computing "
            f"{_m(rate)} tokens/s): training with {_n(best, 'worker')}; --force-workers trains with {asked}")
    return dataclasses.replace(config, num_workers=best), line


def faster_fewer(rows: list[dict], asked: int) -> dict | None:
    """Of the scaling table's rows of fewer workers than `asked`, the fastest where it trains at least NO_FASTER
    times the asked-for row's rate (else None): what train takes instead (choose_workers)."""
    got = next((r for r in rows if r["workers"] == asked), None)
    fewer = [r for r in rows if r["workers"] < asked and r["tokens_per_second"]]
    if not got or not got["tokens_per_second"] or not fewer:
        return None
    best = max(fewer, key=lambda r: r["tokens_per_second"])
    return best if best["tokens_per_second"] >= NO_FASTER * got["tokens_per_second"] else None


def train_workers(corpus_path: str, config: TrainConfig) -> TrainConfig:
    """The config train and the jobs train with: choose_workers's, its line (if any) logged. A request this
    machine cannot hold (a local Ray, its resources known before it starts) is left to train, which refuses
    it naming the flag: no choice hides a mistake."""
    if config.num_workers == 1 or config.force_workers:  # nothing to choose: the corpus is not read
        return config
    corpus = Corpus(corpus_path)
    if _unfit_here(config, corpus):
        return config
    chosen, line = choose_workers(corpus, config)
    if line:
        log.info(line)
    return chosen


def _unfit_here(config: TrainConfig, corpus: Corpus) -> bool:
    """Whether train would refuse `config` on the local Ray it starts, before starting it (trainer.check_fit)."""
    import ray

    from .cluster import local_object_store_bytes
    from .placement import fit_problems, local_resources, without_resident_documents

    if ray.is_initialized() or config.address or os.environ.get("RAY_ADDRESS"):
        return False  # a cluster: train checks it once connected
    tables = table_specs(settle_segments(config, corpus), corpus)
    resources = local_resources(local_object_store_bytes())
    return bool(fit_problems(config, tables, resources)) and without_resident_documents(config, tables, resources) is None


def _m(rate: float | None) -> str:
    return "-" if not rate else f"{rate / 1e6:.2f}M"


def save_json(path: str, p: dict) -> None:
    """Write the plan as JSON, marked as ours, replacing only an earlier plan (outputs.replacing)."""
    with outputs.replacing(path, "plan") as staged, open(staged.path, "wb") as fh:
        fh.write(storage.json_bytes({outputs.JSON_KEY: "plan", **p}))
