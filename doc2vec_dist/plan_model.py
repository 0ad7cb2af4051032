"""The plan's model of a cluster: the bytes each process holds (memory_plan), the devices a GPU worker may
run on (DEVICES), the bytes a token moves (bytes_per_token) and the rates a run of W workers is bound by
(scaling_plan, bound_rates). plan.py's docstring gives the formulas.

Changes when how a run's memory, traffic or speed is modelled from its figures changes, or a device is measured.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from .config import TableSpec, TrainConfig
from .corpus import Corpus, iter_shard
from .errors import UserError
from .placement import FLOAT_BYTES
from .ps import table_specs
from .sampling import NegativeTable, build_examples, keep_probabilities
from .schedule import Blocks
from .settings import document_partitions, half_on_device, resident_documents, resident_tables, resolve
from .sharding import rows_on_shard
from .units import device_room

GiB = 1 << 30
# A round of an epoch costs this much whatever its tokens: its Ray calls (the block handed on through the object
# store, the driver's call and its answer). Measured at 5.6-6.5 ms a round on Lee here, 2 workers at 16 segments
# (12-16 ms at 64 segments before the block went into the object store whole; docs/benchmarks.md, "Fewer
# workers where more would not pay"); a corpus whose rounds hold few tokens pays it many times an epoch.
ROUND_SECONDS = 0.007
# An exchange of held rows costs this much whatever its bytes: a worker's Ray call to a server for one table's rows
# it holds (its block pulled at an epoch's first round and pushed home at its last; its resident documents; one
# worker's resident tables), which a server answers one after another, so an epoch's end costs each server a call
# a worker and table. Fitted to the sample, pypi15k and a 200k-user corpus on 1 and 2 workers, with the bytes
# over plan.CHOICE_NETWORK_GBPS besides (docs/benchmarks.md, "Fewer workers where more would not pay"): there 2
# workers spent twice one worker's time pulling and pushing the same bytes.
EXCHANGE_SECONDS = 0.005


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
    rows on the token path, which it keeps in the tables' dtype (settings.half_on_device)."""
    tables = resident_tables(config, words_out.rows)
    if docs is not None and resident_documents(config, docs.rows, words_out.rows):  # the token path: its share of them
        tables = {**tables, "docs": resident_documents(config, docs.rows, words_out.rows)}
    half = half_on_device(config, words_out.rows)
    url_row = words_out.row_bytes if half else words_out.width * FLOAT_BYTES
    float_rows = sum(tables.values()) - tables["words_out"]
    return {"tables": tables, "bytes": float_rows * words_out.width * FLOAT_BYTES + tables["words_out"] * url_row,
            "all": tables["words_out"] == words_out.rows, "on": "device" if config.gpus_per_worker > 0 else "host",
            "dtype": config.dtype if half else "float32",
            # the documents' rows: across epochs (1), swapped by partition (P > 1), or with each macro-batch (0)
            "document_partitions": document_partitions(config, docs.rows, words_out.rows) if docs is not None else 0}


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
    run = resolve(config, corpus)
    macro = run.macro_batch
    rng = np.random.default_rng(config.seed)
    # words rows are pulled where trained, unless resident (the token path holds every one)
    trains_words = config.trains_words() and "words" not in run.resident_tables
    # words_out rows 0..resident-1 stay in the worker; on the block schedule, the block it holds
    resident = corpus.vocab_size if run.blocks else run.resident_rows
    # ... and on the token path its documents' rows (document_partitions): no macro-batch pulls them
    docs_resident = document_partitions(config, corpus.num_docs, corpus.vocab_size) > 0
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
    # an estimate's sample on disk can be smaller than one of its macro-batches: the examples, their bytes
    # and the documents grow with the tokens a real one holds (the distinct URLs, which saturate, as counted)
    holds = min(macro, corpus.num_tokens)  # (as many as a real corpus's first chunks give the loop above)
    grown = holds / mean["tokens"] if 0 < mean["tokens"] < holds else 1.0
    for key in ("tokens", "examples", "example_bytes", "docs"):
        mean[key] *= grown
    unique = mean["docs"] + mean["words"] + mean["words_out"]
    return {"macro_batch": macro, "batches_measured": len(seen), **{k: round(v) for k, v in mean.items()},
            "unique_rows": round(unique), **({"grown_from_sample": round(grown, 3)} if grown != 1.0 else {})}


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
    run = resolve(dataclasses.replace(config, num_workers=workers), corpus)
    cfg = run.config
    tables = table_specs(cfg, corpus)
    row = tables["words_out"].row_bytes
    vocab, tokens = corpus.vocab_size, max(corpus.num_tokens, 1)
    if not run.token_path:  # the shared schedule: each macro-batch's unique rows, there and back
        prof = profile if profile is not None and profile["macro_batch"] == run.macro_batch else macro_batch_profile(corpus, cfg)
        per = prof["unique_rows"] * row / max(prof["tokens"], 1)
        return {"pulled": per, "pushed": per, "resident_pulled": 0.0, "resident_pushed": 0.0, "handed": 0.0}
    counts, keep = corpus.counts(), keep_probabilities(corpus.counts(), cfg.sample)
    blocks = Blocks(counts, keep, workers if run.blocks else 1, cfg.seed, 0, cfg.negative, cfg.ns_exponent)
    epochs = max(cfg.epochs, 1)
    partitions = document_partitions(cfg, corpus.num_docs, vocab)
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
    resident = dict(run.resident_tables) if workers == 1 else {"words_out": vocab}
    url_rows = sum(resident.values())
    if blocks.num_blocks > 1:  # every block moves at each round's end; a rotation a segment
        rounds = blocks.num_blocks * cfg.segments
        # pulled from the servers in an epoch's first round, pushed home at its last, handed to the next
        # holder at the others' ends (settings.HANDOVER_ENV=0: pushed and pulled in every round)
        handed = (rounds - 1) * url_rows if run.handover else 0
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


def exchange_calls(corpus: Corpus, config: TrainConfig, workers: int) -> float:
    """The calls each server answers in an epoch of a run of `workers` workers (else as `config`) for the rows
    the workers hold (EXCHANGE_SECONDS each), both ways, as bytes_per_token moves them: a worker's block of each URL
    table pulled at the epoch's first round and pushed at its last (every round with settings.HANDOVER_ENV=0), one
    worker's resident tables pulled once a run and written back once an epoch, and resident documents pulled once
    a run (each partition once an epoch) and written back once an epoch. The shared schedule's rows stream with
    each macro-batch, beside the compute: none."""
    run = resolve(dataclasses.replace(config, num_workers=workers), corpus)
    if not run.token_path:
        return 0.0
    cfg = run.config
    epochs = max(cfg.epochs, 1)
    partitions = document_partitions(cfg, corpus.num_docs, corpus.vocab_size)
    if workers > 1 and run.blocks:
        each = 1 if run.handover else run.rounds
        url = 2 * each  # words_out's block, there and back
    else:
        url = len(run.resident_tables) * (1 / epochs + 1)
    # pulled once a run (each partition once an epoch), written back once an epoch (each partition)
    docs = ((partitions if partitions > 1 else 1 / epochs) + partitions) if partitions else 0.0
    return workers * (url + docs)


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
    does not give it: what a worker measures at its start (units.device_room), of the device's whole
    memory (DEVICES; its free memory there is less). It decides whether they are kept across epochs or
    swapped by partition (settings.document_partitions); device["document_room"] says it, in bytes."""
    if device is None or config.device_memory is not None or not resolve(config, corpus).token_path:
        return config
    room = device_room(config, int(device["memory_bytes"]), corpus.vocab_size)
    device["document_room"] = room
    return dataclasses.replace(config, device_memory=max(room, 1) / GiB)


def document_ways(corpus: Corpus, config: TrainConfig, device: dict | None) -> dict | None:
    """On the token path, the two ways a worker keeps its documents' rows (settings.document_partitions)
    and the bytes a token moves in each, for config.num_workers (bytes_per_token; GPU workers, over their
    host links too: pcie_bytes_per_token): "kept" on the worker across epochs, pulled once and written
    back at checkpoints; "partitions", swapped by partition where they do not fit, each pulled and
    written back once an epoch, whatever their number. "way": the one this run takes (0: neither, each
    macro-batch pulls and pushes them). None off the token path."""
    vocab = corpus.vocab_size
    way = document_partitions(config, corpus.num_docs, vocab)
    if not resolve(config, corpus).token_path or not config.resident_docs:
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
                 gpu: dict | None = None, round_seconds: float = ROUND_SECONDS,
                 exchange_seconds: float = EXCHANGE_SECONDS) -> list[dict]:
    """Expected tokens/s for each number of workers (scaling_workers where not given), and what bounds
    it (row_rates): compute (the calibrated rate of one worker, W times), servers (the rows they pull
    and push per second of their busy time, measured in the calibration, num_ps at once) or network
    (bytes per token over --network-gbps links: a link per worker, num_ps links on the servers' side).
    Without a calibration, the bytes alone. Every row is its number of workers as a run of it would be
    (bytes_per_token), whatever config.num_workers is; a row whose workers have more links than the
    servers also says what a server per worker would give ("more_servers": the same model). Each round of
    an epoch costs `round_seconds` besides, and each exchange of held rows a server answers `exchange_seconds`
    (exchange_calls): the epoch's Ray calls, the "calls" column.

    GPU workers (--gpus-per-worker > 0): each row is also its GPUs ("gpus"), compute is the device (one
    GPU's tokens/s, device_rates of plan's flags `gpu`, times the GPUs) and a fourth limit is the GPUs'
    host↔device links ("pcie", a link a GPU: pcie_bytes_per_token at device_rates' bandwidth)."""
    s = (cal or {}).get("summary", {})
    device = device_rates(config, cal, gpu)
    per_worker = worker_rate(cal, config, corpus, round_seconds, exchange_seconds)
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
        calls = exchange_calls(corpus, config, w)
        fixed = rounds * round_seconds + calls * exchange_seconds  # an epoch's Ray calls, whatever its tokens
        found = {"workers": w, "rounds_per_epoch": rounds, "exchange_calls_per_epoch": calls,
                 "calls_seconds_per_epoch": fixed}
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
               w: int = w, fixed: float = fixed) -> dict:
            return row_rates(moved, w, num_ps, link, compute, rows_per_busy_second, row, pcie=pcie,
                             calls=fixed / max(corpus.num_tokens, 1))

        found.update(bytes_per_token=moved, total_bytes_per_token=sum(moved.values()), **at(config.num_ps))
        if w > config.num_ps:
            more = at(w)
            found["more_servers"] = {"num_ps": w, "tokens_per_second": more["tokens_per_second"],
                                     "bound": more["bound"]}
        out.append(found)
    return out


def rounds_per_epoch(config: TrainConfig, corpus: Corpus, workers: int) -> int:
    """Rounds in an epoch of a run of `workers` workers, else as `config` (RunSettings.rounds)."""
    return resolve(dataclasses.replace(config, num_workers=workers), corpus).rounds


def worker_rate(cal: dict | None, config: TrainConfig, corpus: Corpus,
                round_seconds: float = ROUND_SECONDS, exchange_seconds: float = EXCHANGE_SECONDS) -> float | None:
    """One worker's tokens/s computing, from a calibration: its rate over its workers, less the time its Ray calls
    took (round_seconds a round, exchange_seconds an exchange), which the scaling table counts apart (a calibration of 2 workers on Lee, its
    rounds 0.9 of its time, made one worker 17 times too slow). Not less than its workers' own sample and compute
    stages allow (their reads are a round's too: a segment's files opened each round); a two-point calibration's
    rate is a difference of two slices' times, in which the rounds cancel: as it is."""
    s = (cal or {}).get("summary", {})
    workers = max((cal or {}).get("workers", config.num_workers), 1)
    rate = s.get("tokens_per_second", 0.0)
    seconds = s.get("train_seconds")
    if not rate or not seconds or cal.get("two_point"):
        return rate / workers or None
    fixed = (rounds_per_epoch(config, corpus, workers) * round_seconds
             + exchange_calls(corpus, config, workers) * exchange_seconds) * cal.get("epochs", 1)
    busy = sum(v for k, v in s.get("worker_seconds", {}).items() if k in ("sample", "compute")) / workers
    computing = max(seconds - fixed, busy)
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
              calls: float = 0.0) -> dict:
    """One row of the scaling table: the tokens/s each limit allows ("rates"), the expectation (the
    least of them) and the limit that sets it ("bound"), all from one model (bound_rates). The links:
    `workers` on the workers' side and `num_ps` on the servers', each of `link` bytes/s, the busier side
    bounding; the blocks a worker hands straight to its next holder ("handed") cross the workers'
    links only, and only the rows that reach the servers count against their apply rate
    (server_rows_per_second, one server's). GPU workers: `compute` is their devices' rate, and `pcie`
    the seconds a token takes on their host↔device links, (streamed, held) as the network's. calls: the
    seconds a token of the epoch's Ray calls (its rounds' and exchanges' fixed cost)."""
    def seconds(moved_bytes: float, handed: float = 0.0) -> float:  # per token, over the busier side's links
        return max(moved_bytes / (workers * link), (moved_bytes - handed) / (num_ps * link))

    streamed = seconds(moved["pulled"] + moved["pushed"])
    held = seconds(moved["resident_pulled"] + moved["resident_pushed"] + moved["handed"], moved["handed"])
    served = (sum(moved.values()) - moved["handed"]) / row_bytes
    servers = num_ps * server_rows_per_second / served if server_rows_per_second and served else None
    links = {"network": (streamed, held)} if pcie is None else {"pcie": pcie, "network": (streamed, held)}
    return bound_rates(compute, servers, links, compute_name="compute" if pcie is None else "device", calls=calls)


def bound_rates(compute: float | None, servers: float | None, links: dict[str, tuple[float, float]],
                compute_name: str = "compute", calls: float = 0.0) -> dict:
    """The scaling table's model of one row: the tokens/s it expects, what bounds it, and each column.

    links: for each kind of link (the network; a GPU's host↔device link, "pcie"), the seconds a token
    takes on it, (streamed, held). The rows streamed with each macro-batch (pulled, pushed) move while
    the worker computes, so compute and that traffic overlap; the rows a worker holds (its block each
    round, its resident tables) move at a round's or an epoch's end while it waits, so their time adds
    to the rest (the blocks handed straight to their next holder too), as do the epoch's Ray calls (each
    round's, ROUND_SECONDS, and each exchange of held rows, EXCHANGE_SECONDS; `calls`, seconds a token): the
    workers train at 1 / (max(1/compute, each link's streamed) + the links' held + calls). The servers apply pushes on their
    own, at their rate; the lower of the two is the expectation. Each column is what its limit allows
    alone (compute, named compute_name: compute; a link: every byte's time on it, 1 / (streamed +
    held); calls: 1 / calls; servers: servers), but the bound's, which shows the expectation: that limit with the time
    the others add. The bound is the servers where they are the lower, else the least of compute and
    the links alone. So the expectation is always the least column, and the bound names it.
    Measured over tbf-capped links (benchmarks/network_benchmark.py, 1 and 2 workers, 10 Gbit/s to 100
    Mbit/s): 0.83 to 1.05 of this; the block schedule's 2 workers at 100 Mbit/s trained at 0.67 of
    the links' rate alone."""
    alone = {compute_name: compute or None, "servers": servers or None,
             **{name: 1.0 / (streamed + held) if streamed + held > 0 else None
                for name, (streamed, held) in links.items()},
             "calls": 1.0 / calls if calls > 0 else None}
    if not any(alone.values()):
        return {"rates": alone, "alone": alone, "tokens_per_second": None, "bound": None}
    streamed = max(s for s, _ in links.values())
    held = sum(h for _, h in links.values())
    waits = streamed + held + calls
    workers = (1.0 / (max(1.0 / compute, streamed) + held + calls) if compute
               else 1.0 / waits if waits > 0 else None)
    if workers is None or (servers and servers <= workers):
        bound, rate = "servers", servers
    else:
        bound, rate = min((k for k in (compute_name, *links, "calls") if alone[k]), key=alone.get), workers
    return {"rates": {**alone, bound: rate}, "alone": alone, "tokens_per_second": rate, "bound": bound}


def expected_rate(rates: dict, moved: dict, links: float) -> tuple[float | None, str | None]:
    """The expected tokens/s and what bounds it, bound_rates's model with `links` bytes/s in all for
    every kind of row: rates holds the compute rate alone (W × one worker's) and the servers'."""
    streamed = (moved["pulled"] + moved["pushed"]) / links
    held = (moved["resident_pulled"] + moved["resident_pushed"] + moved["handed"]) / links
    found = bound_rates(rates.get("compute"), rates.get("servers"), {"network": (streamed, held)})
    return found["tokens_per_second"], found["bound"]
