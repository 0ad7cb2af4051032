"""The driver: connects to Ray, starts the parameter servers and workers, runs the epochs, checkpoints.

Changes when how a run is driven changes: starting actors, epochs, checkpoints, resume, restarts.

The driver moves no training data: workers read their own units of the corpus and talk to the
parameter servers directly. The driver only schedules epochs, shows progress, and asks each
parameter server to write its slice when a checkpoint is due.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import ray

from . import checkpoint, lr, modeldir, outputs, storage, warmup
from .cluster import connect, local_object_store_bytes, shutdown_local
from .config import TableSpec, TrainConfig, build
from .corpus import Corpus
from .errors import UserError
from .placement import (
    cluster_can_grow,
    fit_problems,
    local_resources,
    node_fit_problem,
    resident_documents_line,
    run_bundles,
    without_resident_documents,
)
from .ps import table_specs
from .run import Run, byte_size, free_bytes, one_line, root_cause
from .settings import RunSettings, resolve
from .units import Position

if TYPE_CHECKING:
    from .warmstart import WarmStart

log = logging.getLogger(__name__)


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


# The changes a resume says it made (the others say how it runs, not what it trains).
SAID_ON_RESUME = ("epochs", "alpha", "min_alpha", "dtype", "rounding")
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
class Resume:
    """Where a run starts: epoch, and each worker's data position in it (None: the epoch's start)."""

    epoch: int = 0
    positions: list[Position] | None = None
    version: int | None = None  # the checkpoint resumed from
    tokens: int = 0  # tokens trained before it
    latest: int | None = None  # the version LATEST named (newer than `version` where that was damaged, or asked for)
    damaged: dict[int, str] = dataclasses.field(default_factory=dict)  # the versions passed over, and why
    saved: dict = dataclasses.field(default_factory=dict)  # the checkpoint's config (its manifest's)
    saved_lr: float | None = None  # the learning rate it stopped at

    def line(self, config: TrainConfig, corpus: Corpus) -> str:
        """'resumed from vN (epoch E, T tokens)', with the learning rate it goes on at and what changed since
        (epochs, alpha, dtype): a run stopped at epoch 11 of 40 and resumed with --epochs 12 goes on at the end
        of its decay, not where it stopped, and says so."""
        line = f"resumed from v{self.version} (epoch {self.epoch}, {self.tokens:,} tokens)"
        now = lr.rate_at(config.alpha, config.min_alpha, self.tokens,
                         corpus.tokens_before(config.epochs, config.first_epoch))
        changed = [f"{name} {self.saved[name]} -> {getattr(config, name)}" for name in SAID_ON_RESUME
                   if name in self.saved and self.saved[name] != getattr(config, name)]
        if not changed:
            return line
        was = f" (it stopped at {self.saved_lr:.6g})" if self.saved_lr is not None and \
            abs(self.saved_lr - now) > 1e-9 else ""
        return f"{line}; changed since: {', '.join(changed)}; learning rate {now:.6g}{was}"

    @classmethod
    def of(cls, out: str, settings: RunSettings, corpus: Corpus) -> Resume:
        config = settings.config
        point = checkpoint.resume_point(out, config.resume_version())  # verified before any actor starts
        manifest = point.manifest
        for key in ("num_docs", "num_tokens", "vocab_size"):
            saved = (manifest.get("corpus_stats") or {}).get(key)
            if saved is not None and saved != getattr(corpus, key):
                raise UserError(f"{out}: the checkpoint was trained on a corpus with {key}={saved}, "
                                f"{corpus.path} has {getattr(corpus, key)}; resume on the same corpus")
        _same_rows(out, corpus)
        _merge_resumed(out, manifest.get("config") or {}, dataclasses.asdict(config))  # the checks, for library callers
        epoch, saved = int(manifest.get("epoch", 0)), manifest.get("positions")
        positions = None if saved is None else [Position.from_json(p) for p in saved]
        if positions is not None and len(positions) != config.num_workers:
            raise UserError(f"{out}: the checkpoint stopped mid-epoch with {len(positions)} workers; resume with "
                            f"--num-workers {len(positions)} (their data positions cannot be redistributed)")
        if positions and max(p.round for p in positions) > 0 and not settings.blocks:
            raise UserError(f"{out}: the checkpoint stopped in round {max(p.round for p in positions) + 1} of an epoch of the block "
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
                   damaged=point.damaged, saved=manifest.get("config") or {}, saved_lr=manifest.get("lr"))


def _same_rows(out: str, corpus: Corpus) -> None:
    """The model's users and URLs are the corpus's, row for row (modeldir.other_rows): a resume on another
    corpus of the same counts would train each row on another user's events, under the first user's key."""
    other = modeldir.other_rows(modeldir.ModelDir(out), corpus)
    if other:
        what, row, theirs, ours = other
        raise UserError(f"{out}: the checkpoint was trained on other {what} than {corpus.path} holds (row {row:,}: "
                        f"{theirs!r} in the model, {ours!r} in the corpus); resume on the corpus it was trained on, "
                        "or refresh it: prepare with --base and train with --init-from")


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
        # the settings the checkpoint ran with: a resume walks the corpus as it did (Resume.of checks them)
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
    config, resume = settings.config, Resume()
    if config.resume:
        resume = Resume.of(out, settings, corpus)
        log.info(resume.line(config, corpus))
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
        run = Run(out, settings, corpus, resume, on_epoch, report_at, warm)
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
            run.log.write("stop", reason="interrupted" if isinstance(exc, KeyboardInterrupt) else root_cause(exc))
        _stop(run, started_here)
        run = started_here = None
        if made is not None or config.resume:  # this run wrote to `out`: say what became of it
            log.warning(_unfinished(out, corpus.path, made, isinstance(exc, KeyboardInterrupt), resume_command))
        if isinstance(exc, ray.exceptions.RayError):  # Ray's text holds the remote traceback, in colour
            raise one_line(exc) from None
        raise
    finally:
        warmup.stop(compiling)
        _stop(run, started_here)


def check_room(out: str, config: TrainConfig, corpus: Corpus, tables: dict[str, TableSpec], resume: Resume,
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
    free = free_bytes(out) + (_replaced_bytes(out) if replaces else 0)
    keys = 0 if config.resume else sum(os.path.getsize(os.path.join(corpus.path, name))
                                       for name in modeldir.KEY_FILES)
    if free < one + keys:
        if config.resume:
            raise UserError(f"{out}: {byte_size(free)} free on its disk, and the next checkpoint needs about {byte_size(one)}; "
                            f"the model stays at checkpoint v{resume.version}: free some space, then resume")
        raise UserError(f"{out}: {byte_size(free)} free on its disk, and the first checkpoint needs about "
                        f"{byte_size(one + keys)}: free some space or choose another --out")
    kept = len(modeldir.committed_versions(out)) if config.resume else 0
    count = max(config.epochs - resume.epoch, 1) if config.checkpoint_every > 0 else 1
    written = min(kept + count, config.keep_checkpoints + 1) - kept  # versions added before pruning starts
    if free < keys + written * one:
        log.warning(f"warning: {out}: {byte_size(free)} free on its disk, and this run may need about "
                    f"{byte_size(keys + written * one)} ({written} checkpoints of {byte_size(one)}: it keeps "
                    f"{config.keep_checkpoints}, one more while writing the next); it stops when the disk is full, "
                    "keeping its last whole checkpoint")


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


def _stop(run: Run | None, started_here: bool | None) -> None:
    """Kill the run's actors, then the local Ray if this process started it (each at most once)."""
    if run is not None:
        run.stop()
    if started_here:
        shutdown_local()


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


