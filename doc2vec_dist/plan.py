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
the streamed rows' traffic overlaps compute, the held rows' and the Ray calls' add to it; the expectation is
the least column of its row, and the bound names it)

    compute: W × the calibrated tokens/s of one worker (the calibration's tokens/s over its workers, less
      the time its rounds took: worker_rate);
    servers: the rows that reach the servers per token, at num_ps servers applying rows at the
      calibration's measured rate (rows per second of busy time, each server on one core);
    network: bytes per token over links of --network-gbps, each worker on a link of its own and the
      servers on num_ps links (a node each, the deploy/ layout), the busiest side bounding; the blocks
      handed from worker to worker cross the workers' links only.
    calls: an epoch's tokens over its Ray calls' fixed cost, whatever its tokens (rounds_per_epoch ×
      ROUND_SECONDS: each round's calls; exchange_calls × EXCHANGE_SECONDS: each server answers a call a worker
      and table for the rows the workers hold, at an epoch's ends), what a small corpus on several workers is
      bound by.
    A row whose workers outnumber the servers also says what a server per worker would give.
    GPU workers: rows of 1, 2, 4 and 8 GPUs, compute is the device (one GPU's tokens/s: a calibration's
      on the GPUs, else the kernel's measured on a device of DEVICES, --gpu-model; GPUs times), and a
      fourth limit is PCIe (each GPU's host link: the rows a token moves, float32, and its share of the
      token ids and offsets uploaded once an epoch). The device's memory sizes its documents' room as a
      worker does (units.device_room), and so the way they are kept (document_ways).
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
      (settings.document_partitions), pulled and written back once an epoch; the shared schedule
      pulls and pushes each macro-batch's unique rows (macro_batch_profile).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable

import psutil

from . import outputs, storage
from .config import TableSpec, TrainConfig
from .corpus import Corpus
from .errors import UserError
from .placement import PROCESS_BYTES
from .plan_calibration import (
    _object_store_bytes,
    _Sizes,
    calibrate,
    calibration_tokens,
    check_estimate,
    empty_ps_bytes,
    estimate_sample_tokens,
    ps_init_seconds_per_row,
    scaled_corpus,
    zipf_corpus,
)
from .plan_model import (
    DEVICES,
    EXCHANGE_SECONDS,
    ROUND_SECONDS,
    SCALING_WORKERS,
    device_rates,
    document_ways,
    macro_batch_profile,
    memory_plan,
    refused_workers,
    resident_plan,
    scaling_plan,
    scaling_workers,
    shard_table_bytes,
    sized_for_device,
    worker_batch_bytes,
)
from .plan_report import _gb, _m, _n, faster_fewer
from .ps import table_specs
from .settings import quality_warnings, resolve

log = logging.getLogger(__name__)

# Where a process cannot be observed (a remote cluster), it counts placement.PROCESS_BYTES.
VOCAB_BYTES_PER_WORD = 40  # counts int64, keep probability, alias table (p, accept, alias), marker arrays
# A server's private memory above an empty one grows with the size of the pulls it serves (the
# allocator keeps freed pull results of its 4 threads): about 14 pulls' worth, in runs at 50k and 200k
# users (docs/benchmarks.md, "Figures behind the code's constants").
PS_RETAINED_PULLS = 14
RAY_SYSTEM_BYTES = 600 << 20  # raylet, GCS, agents (PSS), when not measured
# One worker's tokens/s computing (its read, sample and compute stages) where nothing calibrated it (train's
# choice of workers, choose_workers), by where it computes: a CPU worker's of one CPU here on Lee and the
# sample (4.3-4.7M), a GPU worker's on an H200 (10-15M; docs/benchmarks.md).
UNCALIBRATED_TOKENS_PER_SECOND = {"cpu": 4_000_000, "gpu": 10_000_000}
# The links train's choice of workers assumes (plan's default --network-gbps)
CHOICE_NETWORK_GBPS = 10.0
OOM_FRACTION = 0.95  # Ray's OOM killer acts above this share of a node's memory


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
    refuse_unplanned(config, corpus_path, calibrate_seconds, run_calibration)
    if not network_gbps > 0:
        raise UserError(f"--network-gbps must be > 0 (given {network_gbps:g}): the links' bandwidth in Gbit/s")
    gpu = check_gpu_flags(config, gpu_model, device_tokens_per_second, hbm_gb_per_second, pcie_gb_per_second)
    cal_config = calibration_config(config, calibrate_workers)
    how = {"calibrate_seconds": calibrate_seconds, "workdir": workdir, "run_calibration": run_calibration,
           "measure": measure, "network_gbps": network_gbps, "calibrate_workers": cal_config.num_workers,
           "gpu": gpu}
    check_estimate(users, urls, tokens_per_user, corpus_given=corpus_path is not None)  # (with --corpus alone too)
    if corpus_path is not None and users is None:
        return _plan(Corpus(corpus_path), config, **how)
    if corpus_path is not None:
        return _plan(scaled_corpus(Corpus(corpus_path), users), config, **how)
    events = _Sizes(round(users * tokens_per_user), urls)  # (no text: the default --segments of events)
    settled = resolve(config, events).config  # (_plan resolves config itself, on the estimated corpus)
    sample_tokens = estimate_sample_tokens(settled, calibration_config(settled, calibrate_workers) if run_calibration
                                           else None, events.num_tokens, urls, tokens_per_user, calibrate_seconds)
    os.makedirs(workdir or tempfile.gettempdir(), exist_ok=True)
    work = tempfile.mkdtemp(prefix="estimate-", dir=workdir or tempfile.gettempdir())
    try:
        corpus = zipf_corpus(os.path.join(work, "corpus"), users, urls, tokens_per_user, sample_tokens, config.seed)
        return _plan(corpus, config, **how)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def refuse_unplanned(config: TrainConfig, corpus_path: str | None, calibrate_seconds: float,
                     run_calibration: bool) -> None:
    """Refuse, in one line, what plan would take and not honour: a run that resumes (plan prices a run from
    its corpus, with no model), --first-epoch changed without the corpus that lists the changed users, and a
    calibration of no time."""
    if config.resume:  # (validate: resume_from implies resume)
        flag = "--resume-from" if config.resume_from is not None else "--resume"
        raise UserError(f"{flag}: plan prices a run from its corpus before it starts, with no model to resume; leave "
                        f"{flag} out (a model goes on with train --resume)")
    if config.first_epoch == "changed" and corpus_path is None:
        raise UserError("--first-epoch changed trains first only the users a refresh changed, which its corpus lists "
                        "(prepare --base): an estimate without --corpus has none; plan the refreshed corpus "
                        "(--corpus), or leave --first-epoch out")
    if not calibrate_seconds > 0 and (run_calibration or not calibrate_seconds >= 0):
        raise UserError(f"--calibrate-seconds must be > 0 (given {calibrate_seconds:g}): how long the calibration "
                        "run trains; --no-calibrate plans without one (memory and bytes per token, no time)")


def first_epoch_tokens(corpus: Corpus, config: TrainConfig) -> int:
    """The tokens the run's first epoch trains: every one, or with --first-epoch changed only the changed users'
    (Corpus.epoch_tokens, as train counts them; refused as train refuses a corpus without its list). An
    estimate scaled from a corpus: the same share of its tokens."""
    if config.first_epoch != "changed":
        return corpus.num_tokens
    sample = getattr(corpus, "sample", corpus)  # an EstimatedCorpus: the corpus it scales
    changed = sample.epoch_tokens(0, config.first_epoch)
    return changed if sample is corpus else round(corpus.num_tokens * changed / max(sample.num_tokens, 1))


def _plan(corpus: Corpus, config: TrainConfig, calibrate_seconds: float, workdir: str | None,
          run_calibration: bool, measure: Callable[[str], dict] | None, network_gbps: float,
          calibrate_workers: int, gpu: dict | None = None) -> dict:
    asked = config.segments  # None: each row of the scaling table takes its own count's default (default_segments)
    settings = resolve(config, corpus)
    config = settings.config
    tables = table_specs(config, corpus)
    cal_config = calibration_config(config, calibrate_workers)
    profile = macro_batch_profile(corpus, config)
    width = tables["words_out"].width
    sources = {}
    estimate = getattr(corpus, "estimate", None)  # an EstimatedCorpus: its sample, and what it assumes
    trained = getattr(corpus, "sample", corpus)  # what a calibration trains: the corpus, or the estimate's sample
    result: dict = {"corpus": {"path": None if estimate and estimate["from"] == "zipf" else corpus.path,
                               "docs": corpus.num_docs, "tokens": corpus.num_tokens,
                               "first_epoch_tokens": first_epoch_tokens(corpus, config),  # (before calibrating)
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
    result["scaling"] = scaling_plan(corpus, dataclasses.replace(sized, segments=asked), cal, network_gbps, profile,
                                     workers=listed, gpu=gpu)
    unlisted = [w for w in listed if refused_workers(config, w)]
    result["scaling_unlisted"] = {"workers": unlisted, "why": refused_workers(config, unlisted[0])} if unlisted else None
    scaled = None
    if cal and cal["workers"] != config.num_workers:  # the planned workers' row, from the calibrated ones' rate
        scaled = next(r for r in result["scaling"] if r["workers"] == config.num_workers)["tokens_per_second"]
    result["time"] = time_plan(corpus, config, tables, cal, scaled) if cal else None
    ram = psutil.virtual_memory().total
    result["node_ram"] = ram
    result["warnings"] = plan_warnings(result, ram, local) + quality_warnings(settings, corpus)
    return result


def time_plan(corpus: Corpus, config: TrainConfig, tables: dict[str, TableSpec], cal: dict,
              scaled: float | None = None) -> dict:
    """Time per epoch, startup, checkpoints and the whole run, scaled from the calibration. scaled: the
    tokens/s of config.num_workers where the calibration trained fewer (the scaling table's row). The first
    epoch of --first-epoch changed trains the changed users' tokens alone; the checkpoints are those train
    writes (one at each epoch's end and one each --checkpoint-every seconds between, or the last alone)."""
    s = cal["summary"]
    tps = scaled or s["tokens_per_second"]
    if tps <= 0:
        raise UserError("the calibration run trained no tokens; cannot estimate time")
    epoch = corpus.num_tokens / tps
    first = first_epoch_tokens(corpus, config) / tps  # (--first-epoch changed: the changed users' tokens)
    epochs = [first] + [epoch] * (config.epochs - 1)
    full_bytes = sum(sum(t.values()) for t in shard_table_bytes(tables, config.num_ps))
    cal_bytes = sum(cal["table_bytes"])
    ckpt_rate = cal_bytes / s["checkpoint_seconds"] if s.get("checkpoint_seconds") else None
    checkpoint_s = full_bytes / ckpt_rate if ckpt_rate else None
    # servers initialise their uniform rows in parallel; the calibration's startup held the slice's
    # (words and words_out have the whole vocabulary in the slice already; only docs grow)
    extra_rows = max(0, math.ceil(corpus.num_docs / config.num_ps) - math.ceil(cal["corpus_docs"] / config.num_ps))
    per_row = ps_init_seconds_per_row(config.dim)
    startup = s.get("startup_seconds", 0.0) + extra_rows * per_row
    train_s = sum(epochs)
    # train's checkpoints (run.py): with --checkpoint-every S > 0, one at each epoch's end and one whenever S
    # seconds of training have passed since the last (the clock starts again at each); with 0, the last one alone
    every = config.checkpoint_every
    n_ckpt = sum(1 + max(0, math.ceil(e / every) - 1) for e in epochs) if every > 0 else 1
    total = startup + train_s + n_ckpt * (checkpoint_s or 0.0)
    return {"tokens_per_second": tps, "epoch_seconds": epoch, "first_epoch_seconds": first, "startup_seconds": startup,
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
    why = (f"an epoch's Ray calls take about {got['calls_seconds_per_epoch'] * 1e3:.0f} ms: "
           f"{_n(got['rounds_per_epoch'], 'round')} at {ROUND_SECONDS * 1e3:.0f} ms and "
           f"{got['exchange_calls_per_epoch']:.3g} exchanges of held rows a server at {EXCHANGE_SECONDS * 1e3:.0f} ms, "
           f"against {corpus.num_tokens / asked / rate * 1e3:.0f} ms of a worker's computing"
           if got["bound"] == "calls" else f"bound: {got['bound']}")
    line = (f"train: {_n(asked, 'worker')} are predicted to train this corpus at {_m(got['tokens_per_second'])} tokens/s "
            f"and {_n(best, 'worker')} at {_m(then['tokens_per_second'])} ({why}; plan's model, a worker computing "
            f"{_m(rate)} tokens/s): training with {_n(best, 'worker')}; --force-workers trains with {asked}")
    return dataclasses.replace(config, num_workers=best), line



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
    """Whether train would refuse `config` on the local Ray it starts, before starting it (settings.resolve on its resources)."""
    import ray

    from .cluster import local_object_store_bytes
    from .placement import fit_problems, local_resources, without_resident_documents

    if ray.is_initialized() or config.address or os.environ.get("RAY_ADDRESS"):
        return False  # a cluster: train checks it once connected
    tables = table_specs(resolve(config, corpus).config, corpus)
    resources = local_resources(local_object_store_bytes())
    return bool(fit_problems(config, tables, resources)) and without_resident_documents(config, tables, resources) is None

def save_json(path: str, p: dict) -> None:
    """Write the plan as JSON, marked as ours, replacing only an earlier plan (outputs.replacing)."""
    with outputs.replacing(path, "plan") as staged, open(staged.path, "wb") as fh:
        fh.write(storage.json_bytes({outputs.JSON_KEY: "plan", **p}))
