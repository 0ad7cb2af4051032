"""A run in progress: the parameter servers and workers started, the epochs and rounds driven, restarts,
checkpoints between and within epochs, and the lines a run prints.

Changes when how a started run is driven changes: its actors, epochs, rounds, restarts and checkpoints.
`trainer.train` checks and resolves a run (RunSettings), then hands it to `Run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
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

from . import checkpoint, modeldir, storage
from .config import TrainConfig
from .corpus import Corpus
from .errors import UserError
from .metrics import RunMetrics
from .peers import giver_of, started
from .placement import (
    actor_names,
    actor_nodes,
    cluster_can_grow,
    node_fit_problem,
    node_label,
    on_node,
    ps_options,
    where_lines,
    worker_options,
)
from .ps import ParameterServer, table_specs
from .runlog import RunLog
from .settings import RunSettings
from .units import Position, plan_of
from .worker import Worker

if TYPE_CHECKING:
    from .trainer import Resume
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


# How the driver watches the nodes its actors run on (Run._watch). Ray marks a node dead when its
# raylet misses heartbeats (about 15 s after its processes die, up to a minute when its link is cut);
# the driver asks which nodes are dead every NODE_CHECK_SECONDS. An actor on a dead node either comes
# back (Ray restarts it where there is room, from the last checkpoint) within RESTART_SECONDS, or the
# run stops with one line and the resume command: at once when no live node has room for it and the
# cluster cannot grow; after --wait-for-resources where an autoscaler may add a node.
NODE_CHECK_SECONDS = 1.0


RESTART_SECONDS = 300.0
# A checkpoint's pause waits for each worker to reach the end of its macro-batch (or its block); one that
# has not after this long is named in one line, with its process, so that a run that seems stuck at a
# checkpoint says where to look (`py-spy dump --pid`), and the wait goes on.
PAUSE_WARN_SECONDS = 120.0


def free_bytes(path: str) -> int:
    """Free bytes on the disk of a local path, or of its nearest existing parent."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def byte_size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def one_line(exc: ray.exceptions.RayError) -> UserError:
    """A failed actor call as one line: the UserError the actor raised, as it raised it (Ray's copy of
    it carries the remote traceback, with colour codes, in its text), else its root cause."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, UserError):
        return cause
    return TrainingStopped(f"training stopped: {root_cause(exc)}")


@functools.cache
def actor_class(cls: type) -> ray.actor.ActorClass:
    """`ray.remote(cls)`, made once a process. Each new actor class is exported to the cluster at its first
    actor, and its export disassembles every method (Ray's check for classes exported again and again:
    ~60 ms for Worker); a process that trains many times (a tune trial's, the tests') did that at every
    run. Ray exports a kept class again by itself when the cluster or job changes."""
    return ray.remote(cls)


class Run:
    """One training run's actors and schedule: epochs, checkpoints, restarts of failed workers."""

    def __init__(self, out: str, settings: RunSettings, corpus: Corpus, resume: Resume,
                 on_epoch: Callable[[int, dict], None] | None = None, report_at: Collection[int] | None = None,
                 warm: WarmStart | None = None):
        config = settings.config
        self.out, self.settings, self.config, self.corpus, self.resume = out, settings, config, corpus, resume
        self.on_epoch, self.report_at, self.warm = on_epoch, report_at, warm
        self.servers: list = []
        self.workers: list = []
        self.last_positions = resume.positions  # the workers' positions in the last committed checkpoint
        self.last_epoch = resume.epoch
        self.starts: list = [None] * config.num_workers  # where each worker's current run_rounds began
        self.epoch_stats: list[dict] = []
        self.worker_restarts = 0  # restarts seen: a worker answering from another process (_note_pid)
        self.failures = 0  # its calls that failed as it died: at most --max-restarts per worker
        self.worker_pids: dict[int, int] = {}  # the process each worker last answered from
        self.trained_by: dict[int, int] = {}  # the process that trained each worker's last round
        self.reported: set[int] = set()  # workers whose failure was said, whose restart is not seen yet
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
        server_cls = actor_class(ParameterServer)
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
        worker_cls = actor_class(Worker)
        step_pause = float(os.environ.get(STEP_PAUSE_ENV) or 0)  # for tests
        self.plan = plan_of(corpus, self.settings)
        # A worker that dies is restarted by Ray; the driver sends it back to its checkpointed position.
        # Five threads: run_rounds; progress / pause / resume / flush_handed from the driver meanwhile; and
        # on the block schedule its taker's asks for a block (hand, peers.py: by name, so a restarted
        # worker finds its giver again), one and one more after a restart.
        peers = [f"doc2vec-dist-{self.run_id}-worker{i}" for i in range(config.num_workers)]
        self.workers = [worker_cls.options(name=peers[i], max_concurrency=5, max_restarts=config.max_restarts,
                                           max_task_retries=0, **on_node(worker_placement, homes["workers"][i])).remote(
            i, self.plan[i], os.path.abspath(corpus.path), self.settings, names, tables, step_pause=step_pause,
            peers=peers)
            for i in range(config.num_workers)]
        for i, answer in enumerate(self._get([w.progress.remote() for w in self.workers])):  # init errors, here
            self._seen(("worker", i), answer)
            self._note_pid(i, answer)
        for line in itertools.chain.from_iterable(self._get([w.lines_to_say.remote() for w in self.workers])):
            log.info(line)
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
        """One epoch: each worker trains its data from its start position (on the block schedule every
        round of the epoch, the blocks passed from worker to worker without the driver: peers.py);
        returns the epoch's counters."""
        config, workers = self.config, self.workers
        base = self.corpus.tokens_before(epoch, config.first_epoch)
        self.starts = list(starts or [Position(epoch)] * len(workers))
        self.metrics.position(epoch, min(p.round for p in self.starts))
        pending = {w.run_rounds.remote(epoch, self.starts[i]): i for i, w in enumerate(workers)}
        finished: dict[int, dict] = {}
        while pending:
            ready, _ = ray.wait(list(pending), timeout=self.tick, num_returns=len(pending))
            for ref in ready:
                i = pending.pop(ref)
                try:
                    finished[i] = ray.get(ref)
                    self._note_pid(i, finished[i])  # the process that trained this epoch
                    self.trained_by[i] = finished[i].get("pid")
                except ray.exceptions.RayActorError as exc:  # the worker's process (or its node) died
                    pending[self._restart_worker(i, epoch, exc)] = i
                except ray.exceptions.RayError as exc:
                    self._same_corpus()  # (a corpus replaced under the workers fails them: said as such)
                    raise TrainingStopped(f"training stopped in epoch {epoch}: {root_cause(exc)}") from None
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
            now = combine(list(finished.values()) + [s for s in live if s["epoch"] == epoch])
            # the postfix first: update() draws the bar, which showed the last tick's epoch and loss
            loss = f"loss {now['loss'] / now['pairs']:.3f}, " if now["pairs"] else ""  # none before a pair is trained
            bar.set_postfix_str(f"epoch {epoch + 1}, {loss}" + time_split(now["seconds"]), refresh=False)
            bar.update(base + now["tokens"] - bar.n)
            due = config.checkpoint_every > 0 and time.perf_counter() - self.last_ckpt >= config.checkpoint_every
            if due and pending:
                self._checkpoint_mid_epoch(epoch)
        done = [finished[i] for i in range(len(workers))]
        self.metrics.workers(dict(enumerate(done)))  # each worker's last figures of the epoch
        # The time each worker waited at the epoch's end for the last one (the barrier; on the block
        # schedule added to its waits for its blocks); 0 for one worker.
        end = max(s["ended"] for s in done)
        for s in done:
            s["seconds"]["barrier"] += max(0.0, end - s["ended"])
        return {"epoch": epoch, **combine(done), "workers": [combine([s]) for s in done]}

    def _restart_worker(self, i: int, epoch: int, exc: Exception):
        """Wait for Ray to restart worker i, then send it back to its last checkpointed position."""
        self.failures += 1
        if self.failures > self.config.max_restarts * len(self.workers):
            raise TrainingStopped(f"training stopped in epoch {epoch}: worker {i} failed too often "
                                  f"({root_cause(exc)})")
        log.warning(f"worker {i} failed ({root_cause(exc)}); restarting it from its last checkpointed position")
        self._write_restart(i, epoch, root_cause(exc))
        self._await_restart(i, root_cause(exc))
        # Its position in the last checkpoint, if that checkpoint is of the round it was in; else that
        # round's start (the epoch's, off the block schedule), where the block its giver filed for it
        # waits (peers.py). Its pushes since then are in the servers: those rows see that stretch of data
        # twice, which costs a little fit, never the model.
        round_start = self._round_start(i, epoch)
        last = self.last_positions[i] if self.last_positions and self.last_epoch == epoch else None
        start = last if last is not None and last.round == round_start.round else round_start
        self.starts[i] = start
        if len(self.workers) > 1 and self.settings.blocks:  # what it holds now, for its giver's next flush
            with contextlib.suppress(ray.exceptions.RayError):  # (a giver that died too kept nothing)
                giver = self.workers[giver_of(i, len(self.workers))]
                self._get([giver.taker_restarts.remote(epoch, start.round + started(start))], within=60)
        return self.workers[i].run_rounds.remote(epoch, start, restarted=True)

    def _round_start(self, i: int, epoch: int) -> Position:
        """Where the round worker i was in started: the one it last asked its giver for (peers.py), else
        where its call began."""
        start = self.starts[i]
        if len(self.workers) > 1 and self.settings.blocks:
            with contextlib.suppress(ray.exceptions.RayError):
                at = self._get([self.workers[giver_of(i, len(self.workers))].taker_at.remote(epoch)], within=60)[0]
                if at is not None and at["round"] > start.round:
                    return Position.from_json(at)
        return start

    def _note_pid(self, i: int, answer: dict) -> None:
        """Worker i answered from answer["pid"]: a process other than the last one it answered from is a
        restart (Ray's), counted here once however the driver learnt of it: a call that failed as it died,
        one refused while it restarted, or none at all where it died between two calls."""
        pid = answer.get("pid")
        if pid is None:
            return
        if self.worker_pids.get(i, pid) != pid:
            self.worker_restarts += 1
            if i in self.reported:
                self.reported.discard(i)
            else:  # it died between two calls of the driver's, and none of them failed
                log.warning(f"worker {i} was restarted by Ray (it answers from another process) between two calls "
                            "of the driver's")
                self.log.write("restart", worker=i, epoch=None, reason="restarted between two calls")
        self.worker_pids[i] = pid

    def _write_restart(self, i: int, epoch: int, cause: str) -> None:
        """The run log's line for worker i's failure, said (the warning) before Ray's restart of it is seen."""
        self.reported.add(i)
        self.log.write("restart", worker=i, epoch=epoch, reason=cause)

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
    def _settle(self, refs: list, within: float | None = None, pausing: bool = False) -> None:
        """Wait until every ref is ready, a tick at a time, watching the actors' nodes between ticks
        (_watch stops the run when one cannot come back), so that neither a dead node nor Ctrl-C
        leaves the driver waiting on a call that will never answer. within: seconds at most. pausing:
        refs are the workers' pause calls, in their order: those not answered after PAUSE_WARN_SECONDS are
        named in one line."""
        start = time.monotonic()
        deadline = None if within is None else start + within
        pending, warned = list(refs), not pausing
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=self.tick)
            if pending:
                self._watch()
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise ray.exceptions.GetTimeoutError(f"{len(pending)} call(s) not answered within {within:g}s")
                if not warned and now - start > PAUSE_WARN_SECONDS:
                    warned = True
                    late = [i for i, ref in enumerate(refs) if ref in pending]
                    log.warning(f"a checkpoint has waited {now - start:.0f}s for "
                                + ", ".join(f"worker {i} (pid {self.worker_pids.get(i, '?')})" for i in late)
                                + " to pause between two macro-batches; it waits on (`py-spy dump --pid PID` "
                                "shows where a worker stands)")

    def _get(self, refs: list, within: float | None = None, pausing: bool = False) -> list:
        """ray.get(refs), waited for as _settle waits."""
        self._settle(refs, within, pausing)
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
                self._note_pid(key[1], answer)
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
                positions = self._get([w.pause.remote() for w in self.workers], pausing=True)
            except ray.exceptions.RayActorError:
                return  # a worker is down: the restart path deals with it; checkpoint next time
            # A worker whose run_rounds has not begun reports where its last one ended: it will start
            # (and at once pause) where the driver sent it
            positions = [p if p.epoch == epoch else self.starts[i] for i, p in enumerate(positions)]
            # the blocks handed on that their takers have not taken go home first (peers.py)
            if len(self.workers) > 1 and self.settings.blocks:
                self._get([w.flush_handed.remote(epoch) for w in self.workers])
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
        it keeps resident across epochs (Worker.pause; RunSettings.writes_back_at_end_of), then resumed.

        A worker that died since its epoch ended took with it its rows' updates since the last checkpoint
        (Ray restarts it) where it kept them across that end. One worker then trains the epoch again from
        that checkpoint's position, where the servers' rows are that checkpoint's; on the block schedule the
        others' rounds met its rows, and its documents lose that stretch, as the warning says."""
        stopping, failed, counted = False, set(), set()
        try:
            while True:
                refs = [w.pause.remote() for w in self.workers]
                self._settle(refs, pausing=True)
                died = []
                for i, ref in enumerate(refs):
                    try:
                        paused = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        died.append((i, root_cause(exc)))
                        continue
                    if paused.pid is not None and self.trained_by.get(i, paused.pid) != paused.pid:
                        # Ray restarted it after its epoch ended, before this pause reached it: a new process
                        # answered, holding nothing of what the one that trained the epoch kept
                        died.append((i, "its process ended after its epoch, and Ray restarted it"))
                        if self.worker_pids.get(i) == paused.pid:  # its restart already counted and said
                            counted.add(i)
                self.failures += len(died)
                failed.update(i for i, _ in died)
                if not died:
                    break
                written_back = self.settings.writes_back_at_end_of(epoch - 1)  # nothing kept: nothing lost
                if written_back or len(self.workers) > 1:
                    lost = ("nothing: its rows were written back at the epoch's end" if written_back else
                            "its documents lose their updates since the last checkpoint")
                    for i, cause in died:
                        log.warning(f"worker {i} failed ({cause}) before the checkpoint at the end of epoch {epoch} "
                                    f"had its rows: {lost}")
                        if i not in counted:
                            self._write_restart(i, epoch - 1, cause)
                        # back before the next epoch's call to it: one refused as the actor restarts would count
                        # this failure again (and stop the run at --max-restarts on a busy machine)
                        self._await_restart(i, cause)
                    break
                (i, cause), = died
                log.warning(f"worker {i} failed ({cause}) before the checkpoint at the end of epoch {epoch} had its "
                            "rows; training that epoch again from the last checkpoint")
                if i not in counted:
                    self._write_restart(i, epoch - 1, cause)
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
                    except ray.exceptions.RayActorError as exc:
                        if i in failed:
                            continue
                        cause = root_cause(exc)
                        self.failures += 1
                        log.warning(f"worker {i} failed ({cause}) after the checkpoint at the end of epoch {epoch} "
                                    "had its rows: nothing lost; restarting it")
                        self._write_restart(i, epoch, cause)
                        self._await_restart(i, cause)  # (as above: its next call is not refused and counted again)
                    except ray.exceptions.RayError:
                        pass

    def _checkpoint(self, epoch: int, positions: list[Position] | None, epoch_stats: list) -> None:
        """Write a version: every server's slice, then the manifest with the epochs done and where
        each worker's data stands (None: at the start of epoch `epoch`). A version that cannot be
        written whole is deleted (commit_training) and stops the run with one line: for a full disk,
        the free space and the space a checkpoint needs."""
        t0 = time.perf_counter()
        self._same_corpus()
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

    def _same_corpus(self) -> None:
        """Stops the run, keeping nothing since the last checkpoint, where the corpus was replaced while the
        workers read it (they read its shards again each epoch): its epochs since then may be another's."""
        changed = self.corpus.replaced_since()
        if changed:
            raise TrainingStopped(f"{changed} while this run trained: what it trained since its last checkpoint may "
                                  "have read the other, and is not kept")

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
            raise one_line(failed)
        return entries

    def _write_failure(self, version: int, exc: storage.CheckpointWriteError) -> str:
        """The line for a checkpoint that could not be written: a full disk gets the free space and the
        space one checkpoint needs; anything else the file and the storage's reason."""
        if exc.errno != errno.ENOSPC or not storage.Store.of(self.out).local:
            return f"checkpoint v{version}: {exc}"
        one = checkpoint.version_bytes(table_specs(self.config, self.corpus).values(), self.config.num_ps)
        kept = len(modeldir.committed_versions(self.out))
        return (f"{self.out}: no space left on device for checkpoint v{version}: it needs about {byte_size(one)}, and "
                f"{byte_size(free_bytes(self.out))} is free"
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


def root_cause(exc: Exception) -> str:
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
    """The run's figures; train() adds startup_seconds and warnings, Run.train the restarts. Its tokens and pairs
    are what this run trained: a run resumed mid-epoch leaves out those its checkpoint had (trained_before)."""
    total = combine(epoch_stats)
    before = trained_before or {"tokens": 0, "pairs": 0}
    tokens, pairs, seconds = total["tokens"] - before["tokens"], total["pairs"] - before["pairs"], total["seconds"]
    return {
        "tokens": tokens, "pairs": pairs, "epochs": config.epochs,
        "train_seconds": round(train_s, 3), "checkpoint_seconds": round(ckpt_s, 3),
        "tokens_per_second": tokens / train_s if train_s else 0.0,
        "pairs_per_second": pairs / train_s if train_s else 0.0,
        "loss_per_epoch": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats],
        "worker_seconds": {k: round(v, 3) for k, v in seconds.items()},
        # what the workers moved to and from the servers (client.TRAFFIC), in all and per token trained
        "bytes": total["bytes"],
        "bytes_per_token": {k: round(v / max(tokens, 1), 2) for k, v in total["bytes"].items()},
    }
