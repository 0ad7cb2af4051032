"""The driver: connects to Ray, starts the parameter servers and workers, runs the epochs, checkpoints.

Changes when how a run is driven changes: starting actors, epochs, checkpoints, resume, restarts.

The driver moves no training data: workers read their own units of the corpus and talk to the
parameter servers directly. The driver only schedules epochs, shows progress, and asks each
parameter server to write its slice when a checkpoint is due.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import ray
from tqdm import tqdm

from . import checkpoint, modeldir, outputs, storage, warmup
from .cluster import connect, local_object_store_bytes
from .config import TableSpec, TrainConfig, build
from .corpus import Corpus
from .errors import UserError
from .metrics import RunMetrics
from .placement import (
    actor_names,
    actor_nodes,
    cluster_can_grow,
    fit_problems,
    local_resources,
    node_fit_problem,
    node_label,
    on_node,
    ps_options,
    resident_documents_line,
    run_bundles,
    where_lines,
    without_resident_documents,
    worker_options,
)
from .ps import ParameterServer, table_specs
from .runlog import RunLog
from .schedule import Blocks
from .settings import RunSettings, resolve
from .units import Position, plan_of
from .worker import Worker

if TYPE_CHECKING:
    from .warmstart import WarmStart

log = logging.getLogger(__name__)


# A directory: each parameter server writes down every push it applies there (ps.ParameterServer's
# journal), for the tests that check who wrote which rows when
PUSH_JOURNAL_ENV = "DOC2VEC_DIST_PUSH_JOURNAL"
# Seconds each worker sleeps after every macro-batch: for the tests that need a round to outlast the
# driver's tick, so that a checkpoint falls inside it whatever the machine's speed
STEP_PAUSE_ENV = "DOC2VEC_DIST_STEP_PAUSE"
# "0": the run writes no training log and records no Ray metrics (nor asks the servers for theirs): the
# baseline of the measurement of what they cost (docs/benchmarks.md)
RECORDS_ENV = "DOC2VEC_DIST_RUN_RECORDS"


class TrainingStopped(UserError):
    """Training could not go on (a refused update, a failed actor); the last checkpoint is intact."""


# How the driver watches the nodes its actors run on (_Run._watch). Ray marks a node dead when its
# raylet misses heartbeats (about 15 s after its processes die, up to a minute when its link is cut);
# the driver asks which nodes are dead every NODE_CHECK_SECONDS. An actor on a dead node either comes
# back (Ray restarts it where there is room, from the last checkpoint) within RESTART_SECONDS, or the
# run stops with one line and the resume command: at once when no live node has room for it and the
# cluster cannot grow; after --wait-for-resources where an autoscaler may add a node.
NODE_CHECK_SECONDS = 1.0
RESTART_SECONDS = 300.0


def check_fit(settings: RunSettings, tables: dict[str, TableSpec], started_here: bool) -> RunSettings:
    """Refuse a run whose servers and workers cannot fit the cluster this process is connected to, before
    any actor starts; returns the settings to run (a local Ray's resources are known before starting it:
    settings.resolve fits the run to them). started_here True: a local Ray we started. False: a cluster
    we joined: each actor must fit one live node (placement.node_fit_problem) and all of them the
    cluster's totals (placement.fit_problems). A run that fits only without the workers' resident
    documents runs without them, saying so (placement.without_resident_documents). What does not fit is
    refused at once where the cluster cannot grow, and where GPUs are missing (GPU nodes are up before a
    job, deploy/README.md); elsewhere the run waits up to --wait-for-resources seconds for the
    autoscaler (wait_for_nodes).
    """
    config = settings.config
    problems = _cluster_problems(config, tables)
    if not problems:
        return settings
    resources = ray.cluster_resources()
    lighter = without_resident_documents(config, tables, resources)
    if lighter is not None and not _cluster_problems(lighter, tables):
        log.info(resident_documents_line(config, tables, resources))
        return settings.placed(lighter)
    if started_here or " GPU" in problems[0]:
        raise UserError(problems[0])
    wait_for_nodes(config, tables, problems[0])
    return settings


def _cluster_problems(config: TrainConfig, tables: dict[str, TableSpec]) -> list[str]:
    """Why the run does not fit the cluster this process is connected to, as it is now; [] when it fits."""
    nodes = ray.nodes()
    found = node_fit_problem(config, tables, nodes)
    return ([found] if found else []) + fit_problems(config, tables, ray.cluster_resources())


RESOURCE_POLL_SECONDS = 5.0  # how often a waiting run looks at the cluster again


def wait_for_nodes(config: TrainConfig, tables: dict[str, TableSpec], problem: str) -> None:
    """Wait for the autoscaler to add what the run lacks (`problem`), at most config.wait_for_resources
    seconds, asking it for the run's actors (ray.autoscaler.sdk.request_resources: an autoscaler adds
    nodes for requests it sees, and no actor has asked yet). Refused at once where the cluster cannot
    grow (placement.cluster_can_grow), and when the time is up, naming what is still missing."""
    grows = cluster_can_grow()
    if grows is False:
        raise UserError(f"{problem}; the Ray cluster cannot grow (it runs no autoscaler), so the run would wait "
                        "forever")
    seconds = config.wait_for_resources
    if seconds <= 0:
        raise UserError(f"{problem} (--wait-for-resources 0: not waiting for the autoscaler)")
    from ray.autoscaler.sdk import request_resources

    log.warning(f"waiting up to {seconds:g}s (--wait-for-resources) for the autoscaler"
                + (" (if the cluster has one)" if grows is None else "") + f": {problem}")
    request_resources(bundles=run_bundles(config, tables, ray.cluster_resources()))
    deadline = time.monotonic() + seconds
    try:
        while True:
            time.sleep(max(0.0, min(RESOURCE_POLL_SECONDS, deadline - time.monotonic())))
            problems = _cluster_problems(config, tables)
            if not problems:
                log.info("the cluster has what the run needs: starting")
                return
            if problems[0] != problem:
                problem = problems[0]
                log.warning(f"still waiting: {problem}")
            if time.monotonic() >= deadline:
                raise UserError(f"{problem}; still missing after waiting {seconds:g}s for the autoscaler "
                                "(--wait-for-resources)")
    finally:
        request_resources(bundles=[])  # the run's actors hold what they need from here; ask for nothing more


# Fields a resumed run may change: how it runs, and how far and fast it goes on. Everything else
# (the model's shape, its data and its sampling) must match the checkpoint's, or resuming would
# continue a different model.
RESUMABLE_CHANGES = frozenset({
    "epochs", "alpha", "min_alpha", "num_ps", "num_workers", "cpus_per_worker", "gpus_per_worker",
    "schedule", "segments", "cache_rows", "macro_batch", "micro_batch", "kernel", "max_inflight_pushes", "max_restarts",
    "checkpoint_every", "keep_checkpoints", "resume", "address", "progress", "wait_for_resources",
    "dtype", "rounding",  # the servers narrow or widen the checkpoint's rows to the run's dtype (precision.py)
    "device_memory",  # where a worker keeps its documents' rows, not what it trains (Worker: partitions)
    "force_workers",  # how many workers train it, not what (plan.choose_workers)
})


def resumed_config(model: str, given: dict) -> TrainConfig:
    """The config of a resumed run: the checkpoint's (the version it resumes from: given["resume_from"], else
    LATEST, else the newest whole version), with the fields in `given` (flags, YAML) applied.

    A field outside RESUMABLE_CHANGES that differs from the checkpoint's is refused, naming it.
    """
    checkpoint.refuse_other_writer(model)  # a run writing it now is named before its versions are read
    asked = build(TrainConfig, {"resume_from": given.get("resume_from")}).resume_version()
    # parts present at their sizes: train() checks their checksums, and says which version it resumes from
    point = checkpoint.resume_point(model, asked, verify=False, quiet=True)
    return _merge_resumed(model, point.manifest.get("config") or {}, given)


def _merge_resumed(model: str, saved: dict, given: dict) -> TrainConfig:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    # the version a run resumed from is that run's: the next resume goes on from LATEST unless told otherwise
    merged = {k: v for k, v in saved.items() if k in names and k != "resume_from"}
    for name, value in given.items():
        if name not in names or value is None:
            continue
        if name not in RESUMABLE_CHANGES and name in merged and merged[name] != value:
            raise UserError(f"{model}: cannot resume with {name}={value!r}; the checkpoint was trained with "
                            f"{name}={merged[name]!r} (only {', '.join(sorted(RESUMABLE_CHANGES - {'resume'}))} "
                            "may change on resume)")
        merged[name] = value
    merged["resume"] = True
    return build(TrainConfig, merged)


@dataclasses.dataclass
class _Resume:
    """Where a run starts: epoch, and each worker's data position in it (None: the epoch's start)."""

    epoch: int = 0
    positions: list[Position] | None = None
    version: int | None = None  # the checkpoint resumed from
    tokens: int = 0  # tokens trained before it
    latest: int | None = None  # the version LATEST named (newer than `version` where that was damaged, or asked for)
    damaged: dict[int, str] = dataclasses.field(default_factory=dict)  # the versions passed over, and why

    @classmethod
    def of(cls, out: str, settings: RunSettings, corpus: Corpus) -> _Resume:
        config = settings.config
        point = checkpoint.resume_point(out, config.resume_version())  # verified before any actor starts
        manifest = point.manifest
        for key in ("num_docs", "num_tokens", "vocab_size"):
            saved = (manifest.get("corpus_stats") or {}).get(key)
            if saved is not None and saved != getattr(corpus, key):
                raise UserError(f"{out}: the checkpoint was trained on a corpus with {key}={saved}, "
                                f"{corpus.path} has {getattr(corpus, key)}; resume on the same corpus")
        _merge_resumed(out, manifest.get("config") or {}, dataclasses.asdict(config))  # the checks, for library callers
        epoch, saved = int(manifest.get("epoch", 0)), manifest.get("positions")
        positions = None if saved is None else [Position.from_json(p) for p in saved]
        if positions is not None and len(positions) != config.num_workers:
            raise UserError(f"{out}: the checkpoint stopped mid-epoch with {len(positions)} workers; resume with "
                            f"--num-workers {len(positions)} (their data positions cannot be redistributed)")
        if positions and positions[0].round > 0 and not settings.blocks:
            raise UserError(f"{out}: the checkpoint stopped in round {positions[0].round + 1} of an epoch of the block "
                            "schedule; resume with --schedule blocks (or auto), then change it at an epoch's end")
        # the settings the checkpoint ran with (a manifest without them: its config's segments, and its plan)
        ran = manifest.get("settings") or {"segments": (manifest.get("config") or {}).get("segments") or 1,
                                           "plan": manifest.get("plan", "runs")}  # without a plan: runs, the only one once
        segments = int(ran["segments"])
        if positions and segments != settings.segments:  # the rounds of the epoch under way are numbered by them
            raise UserError(f"{out}: the checkpoint stopped mid-epoch with --segments {segments}; resume with "
                            f"--segments {segments}, then change it at an epoch's end")
        if positions and ran["plan"] != settings.plan:
            raise UserError(f"{out}: the checkpoint stopped mid-epoch with the corpus divided among the workers as "
                            f"{ran['plan']} and this run divides it as {settings.plan} (another "
                            "--schedule, or a checkpoint of an earlier version of doc2vec-dist): its data positions "
                            "cannot be followed; finish the epoch with the settings and version that wrote it")
        if epoch > config.epochs:
            raise UserError(f"{out}: the checkpoint has {epoch} epochs done; --epochs {config.epochs} is fewer")
        tokens = corpus.tokens_before(epoch, config.first_epoch) + sum(p.tokens for p in positions or [])
        return cls(epoch=epoch, positions=positions, version=point.version, tokens=tokens, latest=point.latest,
                   damaged=point.damaged)


def train(corpus_path: str, out: str, config: TrainConfig, overwrite: bool = False,
          on_epoch: Callable[[int, dict], None] | None = None, report_at: Collection[int] | None = None,
          resume_command: str | None = None) -> dict:
    """Train doc2vec (PV-DBOW or PV-DM) on a prepared corpus into the model directory `out`; returns the run's figures.

    With config.resume, continue the model in `out` from its LATEST checkpoint (config.resume_from: from
    that version), verified before any actor starts (a damaged LATEST: from the newest intact version,
    saying so; checkpoint.resume_point): tables and optimiser state (each server loads its rows,
    whatever number of servers wrote them), epoch and each worker's data position; the learning rate
    follows from the tokens already trained.

    One run writes a model directory at a time: another live run's is refused in one line naming it
    (checkpoint.writing), before anything in it is deleted or written.

    Everything that can be checked is checked before the first actor starts: the config, the corpus,
    `out` (a fresh run writes only into a new or empty directory, or over a model of ours with
    `overwrite`), and whether the servers and workers fit the cluster. A fresh run that stops before
    its first checkpoint removes what it wrote; once a checkpoint is committed the model stays,
    resumable, and the message says how.

    on_epoch(epochs_done, stats), if given, is called after every epoch once that epoch's checkpoint
    is committed (so the model directory can be evaluated there); stats: the epoch's tokens, pairs,
    loss and wall seconds. `tune` reports each trial's metric this way. With `report_at`, only after
    those epochs and the last (the others commit no checkpoint for it).

    resume_command: the command that a run stopped after a checkpoint names to resume it (default:
    `doc2vec-dist train --corpus … --out … --resume`); a job that does more after training names its own.
    """
    config.validate()
    corpus = Corpus(corpus_path)
    out = storage.location(out)  # absolute local path, or a URI (s3://, gs://, hdfs://) as it is
    checkpoint.refuse_other_writer(out)  # another run writing it is named first, whatever else is wrong
    replaces, saved = False, None
    if config.resume:
        if modeldir.latest_version(out) is None:  # before the lock: nothing is written into what is no model
            raise UserError(f"{storage.strip_query(out)}: not a trained model (no LATEST file)")
        # the settings the checkpoint ran with: a resume walks the corpus as it did (_Resume.of checks them)
        saved = checkpoint.resume_point(out, config.resume_version(), verify=False, quiet=True).manifest.get("settings")
    else:
        replaces = checkpoint.refuse_existing_model(out, overwrite)  # before starting Ray
    # the run's settings, decided once; a local Ray's resources are known before starting it
    local = not ray.is_initialized() and not (config.address or os.environ.get("RAY_ADDRESS"))
    settings = resolve(config, corpus, local_resources(local_object_store_bytes()) if local else None, saved=saved)
    config = settings.config
    tables = table_specs(config, corpus)
    warm = None
    if config.init_from and not config.resume:  # a resumed run loads its own checkpoint instead
        from .warmstart import warm_start

        # first: it refuses --out being that model before anything (the probe below) touches it
        warm = warm_start(config.init_from, out, corpus.path, tables)
    outputs.check_writable(out, inside=True)  # a read-only or forbidden place, before Ray starts
    with checkpoint.writing(out):  # before anything in `out` is deleted or written
        return _train_writing(corpus, out, settings, overwrite, replaces, tables, warm, on_epoch, report_at,
                              resume_command, local)


def _train_writing(corpus: Corpus, out: str, settings: RunSettings, overwrite: bool, replaces: bool,
                   tables: dict[str, TableSpec], warm: WarmStart | None, on_epoch: Callable[[int, dict], None] | None,
                   report_at: Collection[int] | None, resume_command: str | None = None, local: bool = False) -> dict:
    """train() once it holds the lock of `out`: the resumed version chosen and verified, the room and the
    cluster checked, the actors started and the epochs run. local: a local Ray is started for it."""
    config, resume = settings.config, _Resume()
    if config.resume:
        resume = _Resume.of(out, settings, corpus)
        log.info(f"resumed from v{resume.version} (epoch {resume.epoch}, {resume.tokens:,} tokens)")
        # versions a stopped run left half-written take room the next checkpoint needs
        for version in checkpoint.discard_partial_versions(out):
            log.info(f"removed checkpoint v{version}, which a run that stopped left unfinished")
    check_room(out, config, corpus, tables, resume, replaces)
    if config.first_epoch == "changed":  # refused here, before Ray starts, when changed.arrow is missing
        first = corpus.epoch_tokens(0, config.first_epoch)
        log.info(f"first epoch: only the {len(corpus.changed()):,} users a refresh changed, "
                 f"{first:,} of {corpus.num_tokens:,} tokens")
    if warm is not None:
        log.info(f"starting from {warm.model} (checkpoint v{warm.version}): "
                 + ", ".join(f"{name} {rows:,} of {tables[name].rows:,} rows" for name, rows in warm.rows.items()))
    warned = list(settings.warnings)
    for message in warned:
        log.warning(f"warning: {message}")
    log.info(settings.engine_line())
    made: list[str] | None = None  # what a fresh run created, to remove if it stops before a checkpoint
    run = None
    # a fresh install's first local run: its kernels compiled beside Ray's start, not in the first epoch
    compiling = warmup.start(settings) if local else None
    try:
        started_here = connect(config.address)
    except BaseException:
        warmup.stop(compiling)
        raise
    try:
        t_start = time.perf_counter()
        settings = check_fit(settings, tables, started_here)  # before anything is written
        config = settings.config
        if not config.resume:
            made = checkpoint.start_model_dir(out, corpus.path, overwrite)
        run = _Run(out, settings, corpus, resume, on_epoch, report_at, warm)
        run.start()
        warmup.wait(compiling)
        t_ready = time.perf_counter()
        summary = run.train()
        summary["startup_seconds"] = round(t_ready - t_start, 3)
        summary["warnings"] = warned
        summary["model"] = out
        summary["version"] = modeldir.latest_version(out)
        checkpoint.write_config(out, config, corpus.path, summary=summary)
        made = None  # finished: nothing to undo
        return summary
    except BaseException as exc:
        if run is not None and run.log is not None:  # the training log says where and why the run stopped
            run.log.write("stop", reason="interrupted" if isinstance(exc, KeyboardInterrupt) else _root_cause(exc))
        _stop(run, started_here)
        run = started_here = None
        if made is not None or config.resume:  # this run wrote to `out`: say what became of it
            log.warning(_unfinished(out, corpus.path, made, isinstance(exc, KeyboardInterrupt), resume_command))
        if isinstance(exc, ray.exceptions.RayError):  # Ray's text holds the remote traceback, in colour
            raise _one_line(exc) from None
        raise
    finally:
        warmup.stop(compiling)
        _stop(run, started_here)


def check_room(out: str, config: TrainConfig, corpus: Corpus, tables: dict[str, TableSpec], resume: _Resume,
               replaces: bool) -> None:
    """Refuse, before Ray starts, a run whose disk cannot hold its next checkpoint (one line with the
    free space and the space needed), and warn when it cannot hold every checkpoint the run keeps.

    A checkpoint is about the tables' bytes (checkpoint.version_bytes); a fresh run's first also
    copies the corpus's key tables. A commit writes the new version before it prunes the oldest, so
    a run that keeps k versions holds k + 1 while it writes. A model that --overwrite replaces counts
    as free. Only local disks: an object store has no free-space figure.
    """
    if not storage.Store.of(out).local:
        return
    one = checkpoint.version_bytes(tables.values(), config.num_ps)
    free = _free_bytes(out) + (_replaced_bytes(out) if replaces else 0)
    keys = 0 if config.resume else sum(os.path.getsize(os.path.join(corpus.path, name))
                                       for name in modeldir.KEY_FILES)
    if free < one + keys:
        if config.resume:
            raise UserError(f"{out}: {_size(free)} free on its disk, and the next checkpoint needs about {_size(one)}; "
                            f"the model stays at checkpoint v{resume.version}: free some space, then resume")
        raise UserError(f"{out}: {_size(free)} free on its disk, and the first checkpoint needs about "
                        f"{_size(one + keys)}: free some space or choose another --out")
    kept = len(modeldir.committed_versions(out)) if config.resume else 0
    count = max(config.epochs - resume.epoch, 1) if config.checkpoint_every > 0 else 1
    written = min(kept + count, config.keep_checkpoints + 1) - kept  # versions added before pruning starts
    if free < keys + written * one:
        log.warning(f"warning: {out}: {_size(free)} free on its disk, and this run may need about "
                    f"{_size(keys + written * one)} ({written} checkpoints of {_size(one)}: it keeps "
                    f"{config.keep_checkpoints}, one more while writing the next); it stops when the disk is full, "
                    "keeping its last whole checkpoint")


def _free_bytes(path: str) -> int:
    """Free bytes on the disk of a local path, or of its nearest existing parent."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def _replaced_bytes(model: str) -> int:
    """Bytes that replacing the local model directory `model` frees: its own entries but the exports
    (checkpoint.start_model_dir keeps those)."""
    total = 0
    for entry in os.listdir(model):
        if entry == "exports" or not outputs.owned("model", entry):
            continue
        path = os.path.join(model, entry)
        files = [path] if not os.path.isdir(path) else [os.path.join(root, name) for root, _, names in os.walk(path)
                                                        for name in names]
        total += sum(os.path.getsize(f) for f in files if not os.path.islink(f))
    return total


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _one_line(exc: ray.exceptions.RayError) -> UserError:
    """A failed actor call as one line: the UserError the actor raised, as it raised it (Ray's copy of
    it carries the remote traceback, with colour codes, in its text), else its root cause."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, UserError):
        return cause
    return TrainingStopped(f"training stopped: {_root_cause(exc)}")


def _stop(run: _Run | None, started_here: bool | None) -> None:
    """Kill the run's actors, then the local Ray if this process started it (each at most once)."""
    if run is not None:
        run.stop()
    if started_here:
        ray.shutdown()


def _unfinished(out: str, corpus: str, made: list[str] | None, interrupted: bool,
                resume_command: str | None = None) -> str:
    """What became of `out` after a run that wrote to it and stopped, on one line: removed (a fresh
    run with no checkpoint yet) or kept, with the command that resumes it (train's, unless given)."""
    what = "interrupted" if interrupted else "training stopped"
    version = modeldir.latest_version(out)
    if version is None:
        try:
            removed = made is not None and checkpoint.discard_unfinished(out, made)
        except (OSError, UserError):  # the storage refuses even deletes (a read-only remount)
            removed = False
        return f"{what} before the first checkpoint: " + (f"removed what this run wrote to {out}" if removed
                                                          else f"{out} holds no checkpoint yet")
    command = resume_command or f"doc2vec-dist train --corpus {corpus} --out {out} --resume"
    return f"{what}: the model at {out} is kept up to checkpoint v{version}; resume with `{command}`"


class _Run:
    """One training run's actors and schedule: epochs, checkpoints, restarts of failed workers."""

    def __init__(self, out: str, settings: RunSettings, corpus: Corpus, resume: _Resume,
                 on_epoch: Callable[[int, dict], None] | None = None, report_at: Collection[int] | None = None,
                 warm: WarmStart | None = None):
        config = settings.config
        self.out, self.settings, self.config, self.corpus, self.resume = out, settings, config, corpus, resume
        self.on_epoch, self.report_at, self.warm = on_epoch, report_at, warm
        self.servers: list = []
        self.workers: list = []
        self.last_positions = resume.positions  # the workers' positions in the last committed checkpoint
        self.last_epoch = resume.epoch
        self.starts: list = [None] * config.num_workers  # where each worker's current run_epoch began
        self.handed: list = [None] * config.num_workers  # the block each was handed for it (Worker.run_epoch)
        self.epoch_stats: list[dict] = []
        self.worker_restarts = 0
        self.ckpt_seconds = 0.0
        self.last_ckpt = time.perf_counter()
        # the driver's tick: progress, and whether a checkpoint is due (so at least twice per period)
        self.tick = min(0.5, max(0.02, config.checkpoint_every / 2)) if config.checkpoint_every > 0 else 0.5
        # Watching the actors' nodes (_watch): the node each actor last answered from, by ("worker", i)
        # or ("server", s); those whose node Ray marked dead, since when (monotonic); the calls asking
        # them (progress, info) that have not answered yet, and their last answers
        self.node_of: dict[tuple[str, int], str] = {}
        self.down: dict[tuple[str, int], float] = {}
        self.asking: dict[tuple[str, int], ray.ObjectRef] = {}
        self.answers: dict[int, dict] = {}
        self.checked_nodes = 0.0
        self.dead_nodes: set[str] = set()  # as the last check found them
        self.grows: bool | None | str = "unknown"  # placement.cluster_can_grow(), asked once when needed
        self.resources: dict[str, float] = {}
        # what the run says as it goes: MODEL/training.jsonl (runlog) and Ray's metrics (metrics), both
        # from what the driver already has; made in start(), with the run's id
        self.run_id = uuid.uuid4().hex[:12]
        self.log: RunLog | None = None
        self.metrics: RunMetrics | None = None
        self.server_answers: dict[int, dict] = {}  # each server's last info (its apply time), for the metrics
        self.where: list[str] = []

    def start(self) -> None:
        config, corpus = self.config, self.corpus
        tables = table_specs(config, corpus)
        server_cls = ray.remote(ParameterServer)
        # `ps` / `trainer` nodes where the cluster has them, plain CPU placement elsewhere
        server_placement, worker_placement = ps_options(config, tables), worker_options(config)  # asked once
        # on a plain cluster of several nodes, the servers on nodes the workers do not need (placement.actor_nodes)
        homes = actor_nodes(config, tables) or {"servers": [None] * config.num_ps, "workers": [None] * config.num_workers,
                                                "server_memory": None}
        self.resources = ray.cluster_resources()  # as the actors' requests were made: _watch's fit check
        # A server that dies is restarted by Ray and reloads its rows from LATEST in __init__; calls to
        # it are retried (a retried push lands on the restored rows, which never held it).
        names = [f"doc2vec-dist-{self.run_id}-ps{s}" for s in range(config.num_ps)]
        journal = os.environ.get(PUSH_JOURNAL_ENV)  # every push written down: for tests
        resume = self.resume  # from a version older than LATEST: the servers load it until this run commits
        restore = (resume.version, resume.latest) if resume.version is not None and resume.version != resume.latest else None
        self.servers = [server_cls.options(name=names[s], max_concurrency=4, max_restarts=config.max_restarts,
                                           max_task_retries=-1,
                                           **on_node(server_placement, homes["servers"][s], homes["server_memory"])).remote(
            s, config.num_ps, tables, config.seed, self.out, self.warm, journal, config.rounding, restore=restore)
            for s in range(config.num_ps)]
        worker_cls = ray.remote(Worker)
        step_pause = float(os.environ.get(STEP_PAUSE_ENV) or 0)  # for tests
        self.plan = plan_of(corpus, self.settings)
        # A worker that dies is restarted by Ray; the driver sends it back to its checkpointed position.
        # Three threads: run_epoch, and progress / pause / resume from the driver meanwhile.
        self.workers = [worker_cls.options(max_concurrency=3, max_restarts=config.max_restarts,
                                           max_task_retries=0, **on_node(worker_placement, homes["workers"][i])).remote(
            i, self.plan[i], os.path.abspath(corpus.path), self.settings, names, tables, step_pause=step_pause)
            for i in range(config.num_workers)]
        for i, answer in enumerate(self._get([w.progress.remote() for w in self.workers])):  # init errors, here
            self._seen(("worker", i), answer)
        self.server_info = self._get([s.info.remote() for s in self.servers])
        for shard, answer in enumerate(self.server_info):
            self._seen(("server", shard), answer)
        self.where = where_lines(self.node_of, ray.nodes())
        for line in self.where:  # one line per node: which actors run there
            log.info(line)
        records = os.environ.get(RECORDS_ENV) != "0"
        self.log = RunLog(self.out, self.run_id, on=records)
        self.metrics = RunMetrics(self.out, self.run_id, tables["words_out"].row_bytes, on=records)
        self.last_ckpt = time.perf_counter()

    def stop(self) -> None:
        for actor in self.workers + self.servers:
            ray.kill(actor, no_restart=True)

    def train(self) -> dict:
        config, corpus = self.config, self.corpus
        train_seconds, epoch_stats = 0.0, self.epoch_stats
        total = corpus.tokens_before(config.epochs, config.first_epoch)
        bar = tqdm(total=total, unit="tok", unit_scale=True, disable=not config.progress,
                   desc="train", dynamic_ncols=True, file=sys.stderr)
        bar.update(corpus.tokens_before(self.resume.epoch, config.first_epoch))
        self.log.write("start", resumed_from=self.resume.version if config.resume else None, epoch=self.resume.epoch,
                       config=dataclasses.asdict(config), corpus=corpus.path, where=self.where)
        for epoch in range(self.resume.epoch, config.epochs):
            starts = self.resume.positions if epoch == self.resume.epoch else None
            t0 = time.perf_counter()
            ckpt_before = self.ckpt_seconds
            stats = self._run_epoch(epoch, starts, bar)
            wall = time.perf_counter() - t0 - (self.ckpt_seconds - ckpt_before)
            train_seconds += wall
            epoch_stats.append(stats)
            self.log.write("epoch", **epoch_line(epoch + 1, stats, wall, starts))
            report = self.on_epoch and (self.report_at is None or epoch + 1 in self.report_at
                                        or epoch == config.epochs - 1)
            if epoch == config.epochs - 1 or config.checkpoint_every > 0 or report:
                # the last epoch's end; every one, when checkpointing
                self._checkpoint_between_epochs(epoch + 1, epoch_stats, bar)
            if report:
                self.on_epoch(epoch + 1, {**stats, "wall_seconds": wall})
        bar.close()
        if not epoch_stats:  # resumed with every epoch done: the final version still says so
            self._checkpoint(config.epochs, None, epoch_stats)
        now = self._get([s.info.remote() for s in self.servers])
        restarted = sum(a["pid"] != b["pid"] for a, b in zip(self.server_info, now))
        # tokens/s and pairs/s count what this run trained: a resumed epoch's first part was trained before
        before = combine([{"seconds": {}, **p.to_json()} for p in self.resume.positions or []])
        summary = _summary(config, corpus, epoch_stats, train_seconds, self.ckpt_seconds, trained_before=before)
        summary.update(resumed_from_epoch=self.resume.epoch if config.resume else None,
                       worker_restarts=self.worker_restarts, server_restarts=restarted,
                       servers_loaded_from=[info["restored_version"] for info in now],
                       server_apply_seconds=round(sum(info["apply_seconds"] for info in now), 3),
                       server_busy_seconds=round(sum(info["apply_seconds"] + info["pull_seconds"] for info in now), 3))
        self.metrics.servers(dict(enumerate(now)))
        self.metrics.flush()  # the run's last figures: Ray is told them now, however short the run
        self.log.write("end", **{k: summary[k] for k in ("train_seconds", "checkpoint_seconds", "tokens_per_second",
                                                        "worker_restarts", "server_restarts", "server_apply_seconds")})
        return summary

    def _run_epoch(self, epoch: int, starts: list[Position] | None, bar: tqdm) -> dict:
        """One epoch: on the block schedule its rounds, one after another (every worker ends a round, its
        block pushed home, before any starts the next), else one round; returns the epoch's counters."""
        rounds, workers = self.settings.rounds, self.config.num_workers
        starts = starts or [Position(epoch)] * workers
        every: list[dict] = []
        last: list[dict] = []
        handed: list = [None] * workers  # a round's first holders pull: at an epoch's start, and resumed
        for r in range(starts[0].round, rounds):
            if every:  # each worker's counters run on from where its last round left them
                starts = [Position(epoch, round=r, tokens=s["tokens"], pairs=s["pairs"], loss=s["loss"]) for s in last]
                # the blocks the last round's holders handed over, each to the worker that holds it now
                by_block = {h["block"]: h for h in (s.pop("handover", None) for s in last) if h is not None}
                handed = [by_block.get(Blocks.held(i, r, workers)) for i in range(workers)]
            last = self._run_round(epoch, starts, bar, handed)
            every.extend(last)
        for s in last:
            s.pop("handover", None)
        # tokens, pairs and loss of the epoch are the last round's; seconds and bytes add up over the rounds
        # (`every` holds each round's workers in order: worker i's rounds are every[i::workers])
        own = [{**combine(every[i::workers]), **{k: last[i][k] for k in ("tokens", "pairs", "loss")}}
               for i in range(workers)]
        return {"epoch": epoch, **combine(every), **{k: v for k, v in combine(last).items() if k in ("tokens", "pairs", "loss")},
                "workers": own}

    def _run_round(self, epoch: int, starts: list[Position], bar: tqdm, handed: list) -> list[dict]:
        """Every worker trains its data (on the block schedule: the tokens of the block it holds this
        round, as `handed` to it or pulled) from its start position; returns each worker's counters."""
        config, workers = self.config, self.workers
        base = self.corpus.tokens_before(epoch, config.first_epoch)
        self.starts, self.handed = list(starts), list(handed)
        self.metrics.position(epoch, starts[0].round)
        pending = {w.run_epoch.remote(epoch, self.starts[i], self.handed[i]): i for i, w in enumerate(workers)}
        finished: dict[int, dict] = {}
        while pending:
            ready, _ = ray.wait(list(pending), timeout=self.tick, num_returns=len(pending))
            for ref in ready:
                i = pending.pop(ref)
                try:
                    finished[i] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the worker's process (or its node) died
                    pending[self._restart_worker(i, epoch, exc)] = i
                except ray.exceptions.RayError as exc:
                    raise TrainingStopped(f"training stopped in epoch {epoch}: {_root_cause(exc)}") from None
            # progress: what each worker still training last answered (a call that has not answered,
            # a worker restarting or out of reach, is never waited for: the tick goes on)
            # and, every few seconds, each server's info for the metrics (an answer still on its way is
            # collected at the next tick)
            ask_servers = self.metrics.servers_due()
            self._ask([("worker", i) for i in range(len(workers)) if i not in finished]
                      + [("server", s) for s in range(len(self.servers)) if ask_servers or ("server", s) in self.asking])
            self._watch()
            self.metrics.workers({i: self.answers[i] for i in range(len(workers)) if i not in finished and i in self.answers})
            self.metrics.servers(self.server_answers)
            self.metrics.record()
            live = [self.answers[i] for i in range(len(workers)) if i not in finished and i in self.answers]
            now = combine(list(finished.values())
                          + [s for s in live if (s["epoch"], s.get("round", 0)) == (epoch, starts[0].round)])
            bar.update(base + now["tokens"] - bar.n)
            bar.set_postfix_str(f"epoch {epoch + 1}, loss {now['loss'] / max(now['pairs'], 1):.3f}, "
                                + time_split(now["seconds"]), refresh=False)
            due = config.checkpoint_every > 0 and time.perf_counter() - self.last_ckpt >= config.checkpoint_every
            if due and pending:
                self._checkpoint_mid_epoch(epoch)
        done = [finished[i] for i in range(len(workers))]
        self.metrics.workers(dict(enumerate(done)))  # each worker's last figures of the round
        # The time each worker waited at the round's end for the last one (the barrier); 0 for one worker.
        end = max(s["ended"] for s in done)
        for s in done:
            s["seconds"]["barrier"] = max(0.0, end - s["ended"])
        return done

    def _restart_worker(self, i: int, epoch: int, exc: Exception):
        """Wait for Ray to restart worker i, then send it back to its last checkpointed position."""
        self.worker_restarts += 1
        if self.worker_restarts > self.config.max_restarts * len(self.workers):
            raise TrainingStopped(f"training stopped in epoch {epoch}: worker {i} failed too often "
                                  f"({_root_cause(exc)})")
        log.warning(f"worker {i} failed ({_root_cause(exc)}); restarting it from its last checkpointed position")
        self.log.write("restart", worker=i, epoch=epoch, reason=_root_cause(exc))
        self._await_restart(i, _root_cause(exc))
        # Its position in the last checkpoint, if that checkpoint is of this epoch; else the epoch's
        # start (checkpoints off, or none yet this epoch). Its pushes since then are in the servers:
        # those rows see that stretch of data twice, which costs a little fit, never the model.
        round_start = self.starts[i]
        last = self.last_positions[i] if self.last_positions and self.last_epoch == epoch else None
        start = last if last is not None and last.round == round_start.round else round_start
        self.starts[i] = start
        # from the round's start, the block as it was handed over; from a checkpoint, the servers' copy
        return self.workers[i].run_epoch.remote(epoch, start, self.handed[i] if start is round_start else None)

    def _await_restart(self, i: int, cause: str) -> None:
        """Wait until worker i, which died, answers again (Ray restarting it), so that the next call to it
        is not refused as one to an actor still restarting (and counted as another failure on a busy
        machine). A node Ray marks dead meanwhile is dealt with by _watch (it stops the run where the
        worker cannot come back), and Ctrl-C is never kept waiting beyond a tick."""
        deadline = time.monotonic() + RESTART_SECONDS
        self.answers.pop(i, None)
        self.asking.pop(("worker", i), None)  # a call to the process that died
        while i not in self.answers:
            t0 = time.monotonic()
            self._ask([("worker", i)], wait=self.tick)
            self._watch()
            if time.monotonic() > deadline:
                raise TrainingStopped(f"worker {i} did not come back within {RESTART_SECONDS:g}s of failing "
                                      f"({cause})")
            if i not in self.answers:  # a call refused at once (the actor restarting) is asked again next tick
                time.sleep(max(0.0, self.tick - (time.monotonic() - t0)))

    # -- watching the actors and their nodes ------------------------------------------------------
    def _settle(self, refs: list, within: float | None = None) -> None:
        """Wait until every ref is ready, a tick at a time, watching the actors' nodes between ticks
        (_watch stops the run when one cannot come back), so that neither a dead node nor Ctrl-C
        leaves the driver waiting on a call that will never answer. within: seconds at most."""
        deadline = None if within is None else time.monotonic() + within
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=self.tick)
            if pending:
                self._watch()
                if deadline is not None and time.monotonic() > deadline:
                    raise ray.exceptions.GetTimeoutError(f"{len(pending)} call(s) not answered within {within:g}s")

    def _get(self, refs: list, within: float | None = None) -> list:
        """ray.get(refs), waited for as _settle waits."""
        self._settle(refs, within)
        return ray.get(refs)

    def _ask(self, keys: list[tuple[str, int]], wait: float = 0.0) -> None:
        """Ask each actor where it is and how far (a worker's progress, a server's info), one call in
        flight per actor, and note the answers that came (within `wait` seconds): its node and, for a
        worker, its counters (self.answers). A call that failed (the actor restarting) is asked again."""
        if not keys:
            return
        for key in keys:
            if key not in self.asking:
                role, i = key
                self.asking[key] = (self.workers[i].progress if role == "worker" else self.servers[i].info).remote()
        refs = {self.asking[key]: key for key in keys}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait)
        for ref in ready:
            key = refs[ref]
            del self.asking[key]
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            self._seen(key, answer)
            if key[0] == "worker":
                self.answers[key[1]] = answer
            else:
                self.server_answers[key[1]] = answer

    def _seen(self, key: tuple[str, int], answer: dict) -> None:
        """An actor answered from answer["node"]: it runs there, and is back if that node is alive and the
        one it was on had died."""
        node = answer.get("node")
        if node is None:
            return
        self.node_of[key] = node
        if node not in self.dead_nodes and self.down.pop(key, None) is not None:
            log.info(f"{_actor_name(key)} is back, on node {node[:8]}")

    def _watch(self) -> None:
        """Stop the run (TrainingStopped, one line) when an actor's node is dead and it cannot come back.

        Every NODE_CHECK_SECONDS: which nodes Ray has marked dead (ray.nodes()). An actor last seen on
        one is down from then on, until it answers from a live node (Ray restarts it there, from the
        last checkpoint; a server reloads its rows in __init__; down servers are asked for their info
        here, workers by the caller). Whether it can come back is whether all of the run's actors
        still fit the live nodes (placement.node_fit_problem, by the nodes' totals and what the actors
        asked for at the start: free resources would count a restart already placed as missing
        room). If they do, Ray has RESTART_SECONDS to bring it back; if not, the run stops at once
        where the cluster cannot grow, else after --wait-for-resources. The first time a node is
        found dead, one line says what it ran and what the run does (unless it stops at once: then
        the error says it)."""
        now = time.monotonic()
        if now - self.checked_nodes < NODE_CHECK_SECONDS:
            return
        self.checked_nodes = now
        nodes = ray.nodes()
        dead = {n["NodeID"]: n for n in nodes if not n.get("Alive")}
        self.dead_nodes = set(dead)
        newly = [key for key, node in self.node_of.items() if node in dead and key not in self.down]
        for key in newly:
            self.down[key] = now
        self._ask([key for key in self.down if key[0] == "server"])  # a restarted server answers: back
        if not self.down:
            return
        missing = node_fit_problem(self.config, table_specs(self.config, self.corpus), nodes, self.resources)
        if missing and self.grows == "unknown":
            self.grows = cluster_can_grow()
        wait = self.config.wait_for_resources
        for node in dict.fromkeys(self.node_of[key] for key in newly if key in self.down):
            keys = [key for key in newly if self.node_of[key] == node and key in self.down]
            if not missing:
                log.warning(f"{_node_death(dead[node])}: it ran {actor_names(keys)}; Ray restarts "
                            f"{'it' if len(keys) == 1 else 'them'} on a live node from the last checkpoint "
                            f"(waiting up to {RESTART_SECONDS:g}s)")
            elif self.grows is not False:
                log.warning(f"{_node_death(dead[node])}: it ran {actor_names(keys)}, which cannot be restarted "
                            f"yet: {missing}; waiting up to {wait:g}s (--wait-for-resources) for the autoscaler to "
                            "add a node")
        for key, since in self.down.items():
            node = dead.get(self.node_of[key])
            # every actor of that node still down: a node that held both servers lost both
            gone = [k for k in self.down if self.node_of[k] == self.node_of[key]]
            what = f"{_node_death(node) if node else 'its node is dead'}: it ran {actor_names(gone)}"
            if not missing:
                if now - since > RESTART_SECONDS:
                    raise TrainingStopped(f"{what}, and Ray did not restart {'it' if len(gone) == 1 else 'them'} "
                                          f"within {RESTART_SECONDS:g}s")
            elif self.grows is False:
                raise TrainingStopped(f"{what}, which cannot be restarted: {missing}; the Ray cluster cannot grow "
                                      "(it runs no autoscaler)")
            elif now - since > wait:
                raise TrainingStopped(f"{what}, which cannot be restarted: {missing}, still after {wait:g}s "
                                      "(--wait-for-resources)")

    def _checkpoint_mid_epoch(self, epoch: int) -> None:
        """Pause every worker between two macro-batches, write the servers' rows and the workers'
        positions as one version, resume the workers."""
        stopping = False
        try:
            try:
                positions = self._get([w.pause.remote() for w in self.workers])
            except ray.exceptions.RayActorError:
                return  # a worker is down: the restart path deals with it; checkpoint next time
            # A worker whose run_epoch has not begun reports where its last one ended: it will start
            # (and at once pause) where the driver sent it
            now = (epoch, self.starts[0].round)
            positions = [p if (p.epoch, p.round) == now else self.starts[i] for i, p in enumerate(positions)]
            self._checkpoint(epoch, positions, self.epoch_stats)
        except BaseException:
            stopping = True  # a dead node, Ctrl-C: the actors are about to be killed
            raise
        finally:
            refs = [w.resume.remote() for w in self.workers]
            if not stopping:  # one out of reach is waited for a minute in all (a restarted one starts unpaused)
                with contextlib.suppress(ray.exceptions.RayError):
                    self._get(refs, within=60)

    def _checkpoint_between_epochs(self, epoch: int, epoch_stats: list, bar: tqdm) -> None:
        """The checkpoint at the start of epoch `epoch`: every worker paused first, which writes back the rows
        it keeps resident across epochs (Worker.pause; TrainConfig.writes_back_at_end_of), then resumed.

        A worker that died since its epoch ended took with it its rows' updates since the last checkpoint
        (Ray restarts it) where it kept them across that end. One worker then trains the epoch again from
        that checkpoint's position, where the servers' rows are that checkpoint's; on the block schedule the
        others' rounds met its rows, and its documents lose that stretch, as the warning says."""
        stopping, failed = False, set()
        try:
            while True:
                refs = [w.pause.remote() for w in self.workers]
                self._settle(refs)
                died = []
                for i, ref in enumerate(refs):
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        died.append((i, _root_cause(exc)))
                self.worker_restarts += len(died)
                failed.update(i for i, _ in died)
                if not died or self.config.writes_back_at_end_of(epoch - 1):  # nothing kept: nothing lost
                    break
                if len(self.workers) > 1:
                    for i, cause in died:
                        log.warning(f"worker {i} failed ({cause}) before the checkpoint at the end of epoch {epoch} "
                                    "had its rows: its documents lose their updates since the last checkpoint")
                    break
                (i, cause), = died
                log.warning(f"worker {i} failed ({cause}) before the checkpoint at the end of epoch {epoch} had its "
                            "rows; training that epoch again from the last checkpoint")
                self.log.write("restart", worker=i, epoch=epoch - 1, reason=cause)
                self._await_restart(i, cause)
                with contextlib.suppress(ray.exceptions.RayError):  # (the restarted one is not paused)
                    self._get([w.resume.remote() for w in self.workers], within=60)
                last = self.last_positions if self.last_epoch == epoch - 1 else None
                epoch_stats[-1] = self._run_epoch(epoch - 1, last, bar)
            self._checkpoint(epoch, None, epoch_stats)
        except BaseException:
            stopping = True  # a dead node, Ctrl-C: the actors are about to be killed
            raise
        finally:
            refs = [w.resume.remote() for w in self.workers]
            if not stopping:
                with contextlib.suppress(ray.exceptions.GetTimeoutError):
                    self._settle(refs, within=60)
                for i, ref in enumerate(refs):  # one that died once the checkpoint had its rows lost nothing
                    try:
                        ray.get(ref, timeout=0)
                    except ray.exceptions.RayActorError:
                        self.worker_restarts += i not in failed
                    except ray.exceptions.RayError:
                        pass

    def _checkpoint(self, epoch: int, positions: list[Position] | None, epoch_stats: list) -> None:
        """Write a version: every server's slice, then the manifest with the epochs done and where
        each worker's data stands (None: at the start of epoch `epoch`). A version that cannot be
        written whole is deleted (commit_training) and stops the run with one line: for a full disk,
        the free space and the space a checkpoint needs."""
        t0 = time.perf_counter()
        version = checkpoint.next_version(self.out)
        try:
            checkpoint.commit_training(self.out, self.config, self.corpus, self._save, epoch, positions, epoch_stats,
                                       derived_from=list(self.warm.lineage) if self.warm else None, version=version,
                                       damaged=self.resume.damaged, settings=self.settings.to_json())
        except storage.CheckpointWriteError as exc:
            raise TrainingStopped(self._write_failure(version, exc)) from None
        self.last_positions, self.last_epoch = positions, epoch
        self.ckpt_seconds += time.perf_counter() - t0
        self.last_ckpt = time.perf_counter()
        self.log.write("checkpoint", version=version, epoch=epoch, mid_epoch=positions is not None,
                       seconds=round(time.perf_counter() - t0, 3))

    def _save(self, version: int) -> list[dict]:
        """Every server writes its slice of `version`; each server's entries. When one fails, the
        others are waited for, so none is still writing when the version is deleted or the actors
        are killed, and the error raised is the one the server raised (a CheckpointWriteError)."""
        refs = [server.save.remote(self.out, version) for server in self.servers]
        self._settle(refs)
        entries, failed = [], None
        for ref in refs:
            try:
                entries.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                failed = failed or exc
        if failed is not None:
            raise _one_line(failed)
        return entries

    def _write_failure(self, version: int, exc: storage.CheckpointWriteError) -> str:
        """The line for a checkpoint that could not be written: a full disk gets the free space and the
        space one checkpoint needs; anything else the file and the storage's reason."""
        if exc.errno != errno.ENOSPC or not storage.Store.of(self.out).local:
            return f"checkpoint v{version}: {exc}"
        one = checkpoint.version_bytes(table_specs(self.config, self.corpus).values(), self.config.num_ps)
        kept = len(modeldir.committed_versions(self.out))
        return (f"{self.out}: no space left on device for checkpoint v{version}: it needs about {_size(one)}, and "
                f"{_size(_free_bytes(self.out))} is free"
                + (f" beside the {kept} kept (--keep-checkpoints {self.config.keep_checkpoints})" if kept else ""))


def combine(stats: list[dict]) -> dict:
    """Sum the counters (tokens, pairs, loss, seconds per stage, bytes moved) of several workers or epochs."""
    seconds: dict[str, float] = {}
    moved: dict[str, int] = {}
    for s in stats:
        for k, v in s["seconds"].items():
            seconds[k] = seconds.get(k, 0.0) + v
        for k, v in s.get("bytes", {}).items():
            moved[k] = moved.get(k, 0) + v
    return {"tokens": sum(s["tokens"] for s in stats), "pairs": sum(s["pairs"] for s in stats),
            "loss": sum(s["loss"] for s in stats), "seconds": seconds, "bytes": moved}


def epoch_line(done: int, stats: dict, wall: float, starts: list[Position] | None) -> dict:
    """An epoch's line of the training log (runlog): the epoch's figures and each worker's; tokens/s count
    what this run trained (a resumed epoch's first part was trained before it)."""
    before = [p.tokens for p in starts] if starts else [0] * len(stats["workers"])

    def figures(s: dict, trained: int) -> dict:
        return {"tokens": s["tokens"], "pairs": s["pairs"], "loss": s["loss"] / max(s["pairs"], 1),
                "tokens_per_second": trained / wall if wall else 0.0,
                "seconds": {k: round(v, 4) for k, v in s["seconds"].items()}, "bytes": s["bytes"]}

    return {"epoch": done, "wall_seconds": round(wall, 4), **figures(stats, stats["tokens"] - sum(before)),
            "workers": [{"worker": i, **figures(w, w["tokens"] - before[i])} for i, w in enumerate(stats["workers"])]}


def time_split(seconds: dict[str, float]) -> str:
    """Where worker time went, as shares: 'read 1% sample 20% ...'."""
    busy = sum(seconds.values()) or 1.0
    return " ".join(f"{k} {100 * v / busy:.0f}%" for k, v in seconds.items())


def _root_cause(exc: Exception) -> str:
    """The innermost error message of a failed actor call, on one line."""
    cause = getattr(exc, "cause", None) or exc
    text = _ANSI.sub("", str(cause)).strip().splitlines()
    if not text:
        return type(cause).__name__
    # an actor that died in its __init__ (a worker reading an unreadable shard) carries no cause, only
    # the remote traceback's text: its last line, without the class name of our own one-line errors
    return _OUR_ERROR.sub("", text[-1])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colour codes of Ray's remote tracebacks
_OUR_ERROR = re.compile(r"^doc2vec_dist\.[\w.]*(Error|Stopped): ")  # "doc2vec_dist.corpus.CorpusError: "


def _actor_name(key: tuple[str, int]) -> str:
    role, i = key
    return f"{'worker' if role == 'worker' else 'parameter server'} {i}"


def _node_death(node: dict) -> str:
    """A dead node (an entry of ray.nodes()) as a line names it, with Ray's reason on one line."""
    reason = " ".join(str(node.get("DeathReasonMessage") or "").split())
    return f"node {node_label(node)} is dead" + (f" (Ray: {reason})" if reason else "")


def _summary(config: TrainConfig, corpus: Corpus, epoch_stats: list, train_s: float, ckpt_s: float,
             trained_before: dict | None = None) -> dict:
    """The run's figures; train() adds startup_seconds and warnings, _Run.train the restarts."""
    total = combine(epoch_stats)
    tokens, pairs, seconds = total["tokens"], total["pairs"], total["seconds"]
    before = trained_before or {"tokens": 0, "pairs": 0}
    return {
        "tokens": tokens, "pairs": pairs, "epochs": config.epochs,
        "train_seconds": round(train_s, 3), "checkpoint_seconds": round(ckpt_s, 3),
        "tokens_per_second": (tokens - before["tokens"]) / train_s if train_s else 0.0,
        "pairs_per_second": (pairs - before["pairs"]) / train_s if train_s else 0.0,
        "loss_per_epoch": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats],
        "worker_seconds": {k: round(v, 3) for k, v in seconds.items()},
        # what the workers moved to and from the servers (client.TRAFFIC), in all and per token trained
        "bytes": total["bytes"],
        "bytes_per_token": {k: round(v / max(tokens - before["tokens"], 1), 2) for k, v in total["bytes"].items()},
    }
