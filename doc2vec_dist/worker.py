"""Worker: read → examples → pull → kernel → push, one macro-batch after another, pipelined.

Changes when a worker's loop changes: what it reads, how a macro-batch flows, where it computes. The
units it walks, its data positions and a macro-batch's parts are units.py's; the settings it runs with
are the driver's (settings.RunSettings).

Each worker reads its own units of the corpus (row ranges of shard files) straight from shared
storage; nothing goes through the driver. For each macro-batch it builds the examples of its mode
(sampling.build_examples on the host; on the token path, where it holds every URL row, the kernel
draws them from the tokens: cpu_kernel.train_tokens, or device_examples on its device), then its
client.ParameterClient routes the rows they touch, pulls them with one call per parameter server into
compact local matrices, and after the kernel has trained micro-batches over them pushes back what
changed with one call per server. The pull of the next macro-batch is in flight while the current one
computes (staged on a device, the next batch's rows are also assembled and copied there meanwhile, on
a thread and a CUDA stream of their own: _arrive), and up to `max_inflight_pushes` pushes are
outstanding. The client owns every call to a server (routing, layout, resident rows, push weights);
the worker owns the matrices and the math.

torch (and kernels.py, which needs it) is imported where a worker first uses it, not here: the driver
imports this module to start the actors, and torch's import is 0.8 s of train's start-up. A CPU worker
on the exact kernel (the CPU default) never imports it: its matrices are numpy arrays, trained by
cpu_kernel's compiled loops, and each run's workers start that much sooner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from . import client, lr, precision
from . import settings as run_settings
from .config import TableSpec
from .corpus import Corpus
from .logs import quiet_exit_in_finalizers
from .peers import Giver, Outbox
from .ps import NonFiniteUpdate, load_compiled, ray_node_id
from .sampling import NegativeTable, build_examples, doc_step_scale, keep_probabilities
from .schedule import Block, Blocks
from .settings import RunSettings
from .units import (
    Arrival,
    Batch,
    Compute,
    HostDevice,
    Position,
    Unit,
    as_numpy,
    device_room,
    document_partitions,
    grown,
    only_documents,
    partition_index,
    read_chunks,
)
from .worker_blocks import BlockRounds

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# folded into a batch's seed for the draws of a 16-bit `outputs` matrix's stochastic rounding (kernels.py)
ROUNDING_SEED = 0x2545F4914F6CDD1D
STAGES = ("read", "sample", "pull", "wait", "compute", "push", "barrier")  # where a worker's time goes
SWAP = object()  # run_epoch's next batch is of a partition of its documents other than the one held


class Worker(BlockRounds):
    def __init__(self, index: int, units: list[Unit], corpus_path: str, settings: RunSettings,
                 servers: list, tables: dict[str, TableSpec], compute: Compute | None = None,
                 step_pause: float = 0.0, peers: list | None = None):
        """settings: the run's, as the driver resolved them (settings.resolve): the worker decides none
        of them again. servers: the parameter servers' actor handles, or their names (what the trainer passes: a
        restarted worker looks them up again, and Ray keeps no object-store argument alive for it), or
        client.LocalServer objects (no Ray at all). tables: the servers' table specs (ps.table_specs).
        compute: what trains the examples (Compute.default()). step_pause: seconds slept after each
        macro-batch (tests: a round that outlasts the driver's tick; trainer.STEP_PAUSE_ENV). peers: every
        worker's actor name, on the block schedule (run_rounds: peers.Giver)."""
        quiet_exit_in_finalizers()  # Ray's SIGTERM when this worker is removed: no traceback on the console
        load_compiled()
        corpus = Corpus(corpus_path)
        config = settings.config
        self.index, self.units, self.config, self.settings = index, units, config, settings
        self.step_pause = step_pause
        # on the block schedule, hand the held block to its next holder at a round's end
        # (client.ParameterClient.hand_over) rather than through the servers (settings.HANDOVER_ENV)
        self.handover = settings.handover
        self.giver, self.outbox = Giver(index, [] if peers is None else peers), Outbox()  # rounds without the driver (peers.py)
        self.node = ray_node_id()
        self.compute = compute or Compute.default(fused=settings.kernel == "fused")
        # the exact kernel (cpu_kernel) on CPU workers, the batched one (kernels) on GPUs: see TrainConfig.kernel
        self.exact = settings.exact
        self.adagrad = config.optimizer == "adagrad"
        use_cuda = config.gpus_per_worker > 0
        # torch only where the batched kernel or a GPU needs it; else numpy matrices (the module's docstring)
        self.torch = use_cuda or not self.exact
        if self.torch:
            import torch

            torch.set_num_threads(int(config.cpus_per_worker))
            if use_cuda and not torch.cuda.is_available():
                raise RuntimeError(f"worker {index}: gpus_per_worker > 0 but torch sees no CUDA device")
            self.device = torch.device("cuda" if use_cuda else "cpu")
        else:
            self.device = HostDevice()
        # Staged: a macro-batch's rows are assembled in persistent host matrices (pinned on CUDA), copied
        # to matrices on the device, trained there and copied back for the push; unstaged (CPU), the host
        # matrices are trained in place. It is its own flag so that tests run the device path on CPU.
        # (settings.STAGED_ENV: on the CPU too, for tests)
        self.staged = use_cuda if settings.staged is None else bool(settings.staged) and not self.exact  # the exact kernel: host only
        counts = corpus.counts()
        self.counts = counts
        self.keep_prob = keep_probabilities(counts, config.sample)
        self.negatives = NegativeTable(counts, config.ns_exponent)
        self.tokens_per_epoch = sum(u.tokens for u in units)
        # --first-epoch changed: epoch 0 reads only the documents a refresh changed (the learning rate
        # decays over the tokens actually planned, so it still ends at min_alpha)
        self.changed = corpus.changed() if config.first_epoch == "changed" else None
        self.first_epoch_tokens = self.tokens_per_epoch if self.changed is None else sum(
            int(np.diff(offsets)[np.isin(doc_ids, self.changed)].sum())
            for _, (doc_ids, offsets, _) in read_chunks(units, 1 << 22))
        self.planned_tokens = self.first_epoch_tokens + self.tokens_per_epoch * (config.epochs - 1)
        words_out = tables["words_out"]
        self.width = words_out.width  # adagrad's accumulator rides along
        self.dtype, self.dim, self.url_rows = words_out.dtype, words_out.dim, words_out.rows
        self.stats = self._zero_stats()
        # --cache-rows: rows 0..C-1 of words_out (ids are by frequency, so the hottest) stay resident
        # here, at the head of the `outputs` matrix, between macro-batches; see client.ParameterClient.sync
        resident = dict(settings.resident_tables)
        self.cached = resident["words_out"]
        # The token path: every URL row resident here and no other worker: the host only reads the
        # tokens and routes the documents' rows. The exact kernel draws the subsampling and negatives
        # itself (cpu_kernel.train_tokens, plain PV-DBOW); for the batched one they are drawn on its
        # device (device_examples, every mode), where the URL tables already are.
        self.token_path = settings.token_path
        # ... where `words` is trained too (dbow_words, PV-DM), every words row is resident as well, at
        # the head of `inputs`: a word's input row is its id, the documents' follow
        self.words_head = resident.get("words", 0)
        # The block schedule (schedule.py): several workers on the token path, each holding one block of
        # the URL rows per round, its sole writer. One worker holds one block: every row.
        self.num_blocks = config.num_workers if settings.blocks else 1
        # --segments: round r trains segment r // num_blocks of the units, with block held(index, r)
        self.rounds = settings.rounds
        self._segments: list[list[Unit]] | None = None  # segment_units, at the first round that needs them
        self._blocks: Blocks | None = None  # this epoch's blocks
        self.held: Block | None = None      # the block this worker holds (the token path)
        self._device_tables = None  # device_examples.DeviceTables of the held block, made at its first device batch
        self.macro_batch = settings.worker_macro_batch(self.tokens_per_epoch)
        # on the block schedule most of a chunk's tokens are in other blocks: it reads num_blocks times as
        # many, so that a macro-batch trains about as many tokens as one worker's
        self.read_tokens = self.macro_batch * self.num_blocks
        # ... and on the token path it keeps its documents' rows (no one else writes them) for the whole
        # run: pulled once, written back at checkpoints and at the run's end
        # (RunSettings.writes_back_at_end_of), instead of pulled and pushed with every macro-batch; where
        # they do not fit, in partitions held one at a time (settings.document_partitions,
        # document_partitions), swapped as its walk passes from one to the next
        self.partitions: list[np.ndarray] = []
        self.to_say: list[str] = []
        if run_settings.document_partitions(config, tables["docs"].rows, words_out.rows):
            walk = [doc_ids for _, (doc_ids, _, _) in read_chunks(units, self.read_tokens)]
            share = sum(len(ids) for ids in walk)
            free = self._device_room(words_out) if use_cuda and config.device_memory is None else None
            count = run_settings.document_partitions(config, tables["docs"].rows, words_out.rows, share=share,
                                                     free_bytes=free)
            self.partitions = document_partitions(walk, count)
            if len(self.partitions) > 1:  # said by the driver (lines_to_say): an actor's log reaches no terminal
                self.to_say.append(f"worker {index}: its {share:,} documents' rows do not fit its "
                                   f"{'--device-memory' if config.device_memory else 'device'}: held in "
                                   f"{len(self.partitions)} partitions, one at a time")
        # which partition each of its documents is in (ids ascending), where there are several; the one held
        self._partition_ids, self._partition_of = partition_index(self.partitions)
        self.partition = 0
        self.docs_head = len(self.partitions[0]) if self.partitions else 0
        self.client = client.ParameterClient(
            servers, {name: spec.rows for name, spec in tables.items()}, workers=config.num_workers,
            resident=self.cached, resident_tables=tuple(resident), sole_writer=self.token_path,
            max_inflight_pushes=config.max_inflight_pushes, row_bytes=words_out.row_bytes, dtype=words_out.dtype,
            dim=words_out.dim, key=(config.seed, 1, index), rounding=config.rounding)
        if self.partitions:
            self.client.hold_documents(self.partitions[0])
        self._outputs = self._empty()
        self._inputs = self._empty()
        self._host: dict[str, torch.Tensor] = {}  # host matrices by name, grown as needed (see _assemble)
        # Staged workers double-buffer the users' rows: while batch t trains, a thread of their own waits
        # for batch t+1's pull, assembles it in the other slot's pinned host matrices and copies them to
        # the other slot's device matrices, on a CUDA stream of its own (_arrive)
        self._arrivals: ThreadPoolExecutor | None = None  # made at the first staged batch
        self._copy_stream = None
        if use_cuda:
            import torch

            self._copy_stream = torch.cuda.Stream(self.device)
        self._incoming: list[dict[str, torch.Tensor]] = [{}, {}]  # per slot: device matrices of pulled rows
        # Checkpoints pause every worker between two macro-batches (pause/resume, served from a second
        # thread while run_epoch works): its pushes drained, it reports the position of the next batch.
        self._cv = threading.Condition()
        self._pause_requested = False
        self._paused_at: Position | None = None
        self._resumes = 0  # resume() calls: a paused worker goes on at the next one, whatever is asked since
        self._running = False
        self._position = Position(0)
        self._round = 0  # the round run_epoch trains (the block schedule)
        self._parts: tuple | None = None  # (epoch, [(data position, {block: its part of the chunk})]): _block_chunks

    def _device_room(self, words_out: TableSpec) -> int:
        """Bytes of its GPU a worker's documents' rows may take (settings.document_partitions): DEVICE_SHARE of
        what the device has free as the worker starts, of its share of the device where workers share one
        (a fractional --gpus-per-worker: the others measure the same free memory), less the URL rows it
        will hold there."""
        import torch

        free, _ = torch.cuda.mem_get_info(self.device)
        return device_room(self.config, free, words_out.rows)

    @staticmethod
    def _zero_stats() -> dict:
        # every stage present from the start: progress() copies this dict from another thread, and a
        # key appearing mid-copy would break it
        return {"tokens": 0, "pairs": 0, "loss": 0.0, "epoch": -1, "round": 0,
                "seconds": dict.fromkeys(STAGES, 0.0), "bytes": dict.fromkeys(client.TRAFFIC, 0)}

    def lines_to_say(self) -> list[str]:
        """What the worker found at its start that the user should read (the driver logs it)."""
        return self.to_say

    def progress(self) -> dict:
        """Counters of the current run_epoch call (tokens, pairs and loss: of the epoch so far; seconds
        and bytes: of this call) and the node this worker runs on; served from a second thread while
        run_epoch works."""
        s = dict(self.stats)
        s["node"] = self.node
        s["pid"] = os.getpid()  # which process answers: the driver counts a restart by it (Run._note_pid)
        s["seconds"] = dict(s["seconds"])
        s["bytes"] = dict(self.client.traffic)
        return s

    def _partition_in(self, item) -> int:
        """The partition of its documents a chunk (read_chunks' item) is in: one, all its documents'
        (document_partitions)."""
        first = item[1][0][0]
        return int(self._partition_of[np.searchsorted(self._partition_ids, first)])

    def _swap_documents(self, item, label: str) -> None:
        """Hold the partition of its documents that `item`'s chunk is in: the one held written back to the
        servers (where trained since it was pulled), the next pulled by the sync that follows. Only between
        batches, with none in flight: the next batch's layout is of the partition it holds."""
        self.client.drain()
        self.client.write_documents(self._read_resident, f"{label}, documents swapped")
        self.partition = self._partition_in(item)
        self.docs_head = len(self.partitions[self.partition])
        self.client.hold_documents(self.partitions[self.partition])

    def _when(self, epoch: int) -> str:
        """The epoch, and on the block schedule the round, as the labels of its pushes name them."""
        return f"epoch {epoch}" + (f" round {self._round}" if self.num_blocks > 1 else "")

    # -- data positions and pausing for checkpoints --------------------------------------------
    def _position_at(self, epoch: int, batch: Batch | None, step: int) -> Position:
        """Where this worker's data stands: the next macro-batch to train (None: the epoch is done)."""
        unit, row = batch.start if batch is not None else (len(self._units_of(self._round)), None)
        return Position(epoch, unit, row, step, tokens=self.stats["tokens"], pairs=self.stats["pairs"],
                        loss=self.stats["loss"], round=self._round)

    def pause(self) -> Position:
        """Stop between two macro-batches with every push applied; returns the data position and its pid (Run).

        Idle (between epochs) it returns at once, and the request stays set, so an epoch started
        meanwhile pauses before its first batch: nothing trains while a checkpoint is written.
        """
        with self._cv:
            self._pause_requested = True
            while self._running and self._paused_at is None:
                self._cv.wait()
            if self._paused_at is None:
                # idle: between epochs, or on the block schedule between two rounds of one, waiting for
                # the others. The rows it keeps resident (its documents', one worker's URL rows) go home
                # after an epoch's last round at most, and mostly not even then
                # (RunSettings.writes_back_at_end_of), so what it trained since goes into the checkpoint
                # now (a run resumed from it lost them, and trained other vectors than one that never
                # stopped). Under the lock: a round that starts meanwhile waits. The pushes are named
                # after the round it trained last.
                last = self._position
                label = (f"epoch {last.epoch}" + (f" round {last.round}" if self.num_blocks > 1 else "")
                         + f" checkpoint of worker {self.index}")
                self._sync(label, pull=False, docs=True)
                # the block it handed over at its round's end: no round starts while a checkpoint is
                # written, so its next holder has not taken it on, and the servers' copy is older
                self.client.write_handed(label)
            return dataclasses.replace(self._paused_at or self._position, pid=os.getpid())

    def resume(self) -> None:
        with self._cv:
            self._pause_requested, self._paused_at = False, None
            self._resumes += 1
            self._cv.notify_all()

    def _hold_if_paused(self, epoch: int, batch: Batch | None, step: int, at: Position | None = None) -> bool:
        """At a batch boundary (or waiting for its next block, `at` its round's start): if a checkpoint
        asked, drain pushes, publish the position, wait until resumed. True if it paused (the caller
        re-pulls the batch: the rows changed meanwhile).

        It waits for resume() to have been called, not for the request to be off: a checkpoint every few
        ms resumes and asks again before this thread wakes, and the request is then on again with no
        position published: it pauses again here, at once, as that checkpoint asks (waiting for the flag,
        it slept on, and that checkpoint's pause waited forever)."""
        held = False
        while self._pause_requested:
            self.client.drain()
            self._sync(f"{self._when(epoch)} step {step} of worker {self.index}", pull=False, docs=True)  # into the checkpoint
            held = True
            with self._cv:
                if not self._pause_requested:  # resumed while it pushed (a checkpoint that gave up)
                    break
                resumes = self._resumes
                self._paused_at = at or self._position_at(epoch, batch, step)
                self._cv.notify_all()
                while self._resumes == resumes:
                    self._cv.wait()
        return held

    # -- reading -------------------------------------------------------------------------------
    def _prepare(self, start: tuple[int, int], chunk, rng) -> Batch:
        """A chunk's examples (on the token path: its tokens, for the kernel to draw them from) and where
        its rows sit (client.Layout); pulls not yet issued."""
        cfg = self.config
        doc_ids, offsets, tokens = chunk
        if self.token_path:
            layout, docs = self.client.token_layout(doc_ids)  # each document's row in `inputs`
            ctx_pos = np.repeat(docs, np.diff(offsets)) if self.exact else docs  # the exact kernel: each token's
            return Batch(examples=None, layout=layout, ctx_pos=ctx_pos, target_pos=tokens,
                         neg_pos=np.zeros(0, np.int64), scale=None, pulls=[], start=start, raw_tokens=len(tokens),
                         tokens=tokens, offsets=offsets, seed=int(rng.integers(1 << 63)))
        ex = build_examples(offsets, tokens, self.keep_prob, self.negatives, cfg.negative, rng,
                            mode=cfg.mode, dbow_words=cfg.dbow_words, window=cfg.window,
                            shared_negatives=cfg.shared_negatives, micro_batch=cfg.micro_batch,
                            interleave=not self.exact)
        layout, ctx_pos, target_pos, neg_pos = self.client.example_layout(doc_ids, ex)
        return Batch(examples=ex, layout=layout, ctx_pos=ctx_pos, target_pos=target_pos, neg_pos=neg_pos,
                     scale=None if self.exact else doc_step_scale(ex.ctx[:, 0], ex.micro_batch), pulls=[],
                     start=start, raw_tokens=ex.raw_tokens)

    # -- one epoch ---------------------------------------------------------------------------------
    def run_epoch(self, epoch: int, start: Position | None = None, handed: dict | None = None) -> dict:
        """One round of an epoch (all of it off the block schedule), for a driver in this process that runs
        the rounds one after another (tests, warm-up): `handed` is the block this round holds as its last
        holder handed it over ({"block", "rows"}; None: pulled from the servers), and the counters
        returned carry this round's handover for the next holder ("handover")."""
        start = self._begin(epoch, start)
        try:
            handover = self._train_round(epoch, start, handed)
        finally:
            self._end(epoch)
        return self._done(handover=handover)

    def _begin(self, epoch: int, start: Position | None) -> Position:
        start = start or Position(epoch)
        self.stats = self._zero_stats()
        self.stats.update(epoch=epoch, round=start.round, tokens=start.tokens, pairs=start.pairs, loss=start.loss)
        # (the traffic counters were reset as the last call returned: a checkpoint's write-back since counts here)
        self._round, self._step = start.round, start.step
        with self._cv:
            self._running = True
        return start

    def _end(self, epoch: int) -> None:
        self.stats["ended"] = time.time()  # the driver's barrier time: wall clock, shared by the nodes
        with self._cv:
            self._running = False
            self._position = self._position_at(epoch, None, self._step)
            self._cv.notify_all()

    def _done(self, **extra) -> dict:
        done = {**self.progress(), **extra}
        self.client.traffic = dict.fromkeys(client.TRAFFIC, 0)  # what moves from now on is the next call's
        return done

    def _train_round(self, epoch: int, start: Position, handed: dict | None) -> dict | None:
        """Train the round start.round from `start`; returns its handover (client.hand_over) or None."""
        cfg = self.config
        self._round = start.round
        self.stats["round"] = start.round
        seconds = self.stats["seconds"]
        # drives the learning rate: the tokens of the epochs before this one, and of this one so far
        done_before = (self.first_epoch_tokens + (epoch - 1) * self.tokens_per_epoch if epoch else 0) + start.tokens
        if self.token_path:
            t0 = time.perf_counter()
            self._hold(epoch, start.round, handed)
            seconds["pull"] += time.perf_counter() - t0  # the block held: handed over, or pulled at the sync below
        chunks = read_chunks(self._units_of(start.round), self.read_tokens, start.unit, start.row)
        if epoch == 0 and self.changed is not None:
            chunks = only_documents(chunks, self.changed)
        if self.num_blocks > 1:  # only the tokens of the block held, as its local rows
            chunks = self._block_chunks(epoch, start, chunks)
        step_of_next = start.step
        # each macro-batch's draws are seeded by its place: (epoch, step), and the round where there are several
        where = [cfg.seed, self.index, epoch] + ([start.round] if self.num_blocks > 1 else [])

        ahead: list = []  # a chunk read, of a partition of the documents other than the one held

        def next_batch():
            nonlocal step_of_next
            t0 = time.perf_counter()
            item = ahead.pop() if ahead else next(chunks, None)
            t1 = time.perf_counter()
            seconds["read"] += t1 - t0
            if item is None:
                return None
            if self._partition_ids is not None and self._partition_in(item) != self.partition:
                ahead.append(item)  # trained once the batches in flight are done and its partition is held
                return SWAP
            # one generator per macro-batch, seeded by its place in the epoch: a run resumed from a
            # position draws the same subsampling and negatives as one that never stopped
            rng = np.random.default_rng(where + [step_of_next])
            step_of_next += 1
            batch = self._prepare(*item, rng)
            t2 = time.perf_counter()
            seconds["sample"] += t2 - t1
            batch.pulls = self.client.pull(batch.layout)
            seconds["pull"] += time.perf_counter() - t2
            return batch

        arriving = None  # staged: the current batch's Arrival, coming on the arrivals thread
        trained = False  # whether a batch was trained (the last one's `label`)
        slot = 0
        try:
            batch = next_batch()
            step = start.step
            t0 = time.perf_counter()
            if batch is SWAP:  # (the sync below pulls the partition it starts in)
                self._swap_documents(ahead[0], f"{self._when(epoch)} start of worker {self.index}")
                batch = next_batch()
            # (nothing to push: the last epoch's end or checkpoint pushed what it had to; rows kept resident
            # across epochs wait for the next one)
            self._sync(f"{self._when(epoch)} start of worker {self.index}", push=False)
            seconds["pull"] += time.perf_counter() - t0
            while batch is not None:
                if batch is SWAP:  # its walk passes to the next partition of its documents: swap them
                    t0 = time.perf_counter()
                    label = f"{self._when(epoch)} step {step} of worker {self.index}"
                    self._swap_documents(ahead[0], label)
                    self._sync(label, push=False)
                    seconds["pull"] += time.perf_counter() - t0
                    batch = next_batch()
                    continue
                if self._hold_if_paused(epoch, batch, step):
                    if arriving is not None:  # rows pulled before the pause are stale
                        arriving.result()
                        arriving = None
                    batch.pulls = self.client.pull(batch.layout)
                    self._sync(f"{self._when(epoch)} step {step} of worker {self.index}")
                elif self.client.sync_due():
                    self._sync(f"{self._when(epoch)} step {step} of worker {self.index}")
                upcoming = next_batch()  # read → examples → pull of the next batch, in flight while this one computes

                t0 = time.perf_counter()
                if self.staged:
                    if self._arrivals is None:
                        self._arrivals = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrival")
                    arrival = (arriving or self._arrivals.submit(self._arrive, batch, slot)).result()
                    slot = 1 - slot
                    arriving = (self._arrivals.submit(self._arrive, upcoming, slot) if isinstance(upcoming, Batch)
                                else None)
                else:
                    arrival = self._arrive(batch, 0)
                pulled, local = arrival.pulled, arrival.local
                t1 = time.perf_counter()
                seconds["wait"] += t1 - t0

                ex = batch.examples
                # the exact kernel decays alpha from the batch's start to its end; the batched one takes
                # one rate per micro-batch (≥ 1: subsampling may keep nothing), which on the token path
                # it interpolates between the two ends once its examples are drawn
                ends = self.exact or ex is None
                n_micro = 1 if ends else max(1, -(-len(ex) // ex.micro_batch))
                alphas = lr.micro_batch_rates(cfg.alpha, cfg.min_alpha, done_before, batch.raw_tokens,
                                              self.planned_tokens, n_micro, ends=ends)
                loss, pairs = self._compute(batch, arrival, alphas)
                t2 = time.perf_counter()
                seconds["compute"] += t2 - t1

                label = f"{self._when(epoch)} step {step} of worker {self.index} (alpha {float(alphas[0]):.6g})"
                if self.partitions and not math.isfinite(loss):
                    # its documents' rows reach the servers, which refuse non-finite rows, only at checkpoints:
                    # the batch's loss says at once that they diverged
                    raise NonFiniteUpdate(f"non-finite loss in {label}; the learning rate is probably too high")
                trained = True
                self.client.push(arrival.layout, pulled, local, label)
                seconds["push"] += time.perf_counter() - t2
                if self.step_pause:
                    time.sleep(self.step_pause)

                done_before += batch.raw_tokens
                self.stats["tokens"] += batch.raw_tokens
                self.stats["pairs"] += pairs
                self.stats["loss"] += loss
                batch, step = upcoming, step + 1

            t0 = time.perf_counter()
            self.client.drain()
            # the resident documents go home once their last round of the epoch is done, where the epoch's
            # end writes back (RunSettings.writes_back_at_end_of; else the checkpoint that follows fetches
            # them, and they stay here for the next epoch, as one worker's URL rows do); the push is named
            # after the last step trained (its learning rate shows in an error of the push)
            last = start.round == self.rounds - 1
            keep = last and not self.settings.writes_back_at_end_of(epoch)
            handover = None
            if not (keep and self.num_blocks == 1):  # (the block schedule's blocks go home whatever its documents do)
                handover = self._sync(f"{self._when(epoch)} end of worker {self.index}"
                                      + (f", after {label}" if trained else ""), pull=False, docs=last and not keep,
                                      hand=self.handover and self.num_blocks > 1 and not last)
            if handover is not None:
                handover["block"] = self.held.index
            self._release()
            seconds["push"] += time.perf_counter() - t0
        finally:
            self._step = step_of_next
        return handover

    def _arrive(self, batch: Batch, slot: int) -> Arrival:
        """Wait for the batch's pulled rows and put them where it trains: the compact host matrices
        (_assemble), and, staged, the device matrices of `slot` (on CUDA on the copy stream, whose
        event the compute waits for). Staged workers run this on their arrivals thread."""
        pulled = client.get(batch.pulls)
        # staged, the host matrices hold only the pulled rows: the resident heads live on the device
        layout = dataclasses.replace(batch.layout, cached=0, inputs_head=0) if self.staged else batch.layout
        local = self._assemble(layout, pulled, slot)
        if not self.staged:
            return Arrival(pulled, layout, local)
        import torch

        empty = self._empty()
        device = {}
        with torch.cuda.stream(self._copy_stream) if self._copy_stream is not None else contextlib.nullcontext():
            for name in ("inputs", "outputs"):
                rows = len(local[name])
                incoming = self._incoming[slot]
                incoming[name] = grown(incoming.get(name, empty), rows)
                device[name] = incoming[name][:rows]
                device[name].copy_(self._host[f"{name}{slot}"][:rows], non_blocking=True)
            event = None
            if self._copy_stream is not None:
                event = torch.cuda.Event()
                event.record(self._copy_stream)
        return Arrival(pulled, layout, local, device, event, slot)

    def _assemble(self, layout: client.Layout, pulled: list[np.ndarray], slot: int = 0) -> dict[str, np.ndarray]:
        """Copy the pulled rows (read-only, zero-copy from the object store) into writable compact matrices.

        Both are persistent (a macro-batch's are done with once its push is sent). Unstaged (CPU), they
        are the buffers trained in place, whose heads hold the resident rows. Staged, both are host
        matrices, pinned on CUDA, of the pulled rows only (`layout` has no resident heads there): the
        resident rows live on the device and take no host memory.
        """
        sizes = layout.sizes()
        if self.staged:  # one pair per slot: the next batch's arrive while this one's are trained and pushed
            local = {name: self._host_buffer(f"{name}{slot}", sizes[name]) for name in ("inputs", "outputs")}
        else:
            local = {"inputs": as_numpy(self._inputs_buffer(sizes["inputs"])),
                     "outputs": as_numpy(self._outputs_buffer(sizes["outputs"]))}
        self.client.fill(layout, pulled, local)
        return local

    def _empty(self):
        """An empty matrix of this worker's rows: a torch tensor on its device, or (no torch) numpy."""
        if not self.torch:
            return np.empty((0, self.width), dtype=np.float32)
        import torch

        return torch.empty((0, self.width), dtype=torch.float32, device=self.device)

    def _half_outputs(self):
        """The torch type of a staged worker's `outputs` matrix where it keeps the URL rows resident in
        the tables' 16-bit dtype (kernels.py: widened as read, narrowed stochastically as updated):
        on the token path, where that matrix holds the resident rows only. None: float32."""
        if not self.settings.half_on_device(self.staged):
            return None
        import torch

        return {"bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    def _outputs_buffer(self, rows: int) -> torch.Tensor:
        """The persistent `outputs` matrix on the worker's device, at least `rows` long; its first
        `cached` rows are the resident rows of words_out and survive growing."""
        half = self._half_outputs()
        if half is not None and self._outputs.dtype != half:  # made before the staged flag was known
            import torch

            width = precision.stored_width(self.dtype, self.dim, self.width - self.dim)
            self._outputs = torch.empty((0, width), dtype=half, device=self.device)
        self._outputs = grown(self._outputs, rows, keep=self.cached)
        return self._outputs[:rows]

    def _inputs_buffer(self, rows: int) -> torch.Tensor:
        """The persistent `inputs` matrix on the worker's device, at least `rows` long; its first
        `words_head` rows are the resident rows of words, the next `docs_head` its resident documents'
        (the block schedule), and they survive growing."""
        self._inputs = grown(self._inputs, rows, keep=self.words_head + self.docs_head)
        return self._inputs[:rows]

    def _host_buffer(self, name: str, rows: int) -> np.ndarray:
        """The persistent host matrix `name` as a numpy view of `rows` rows; pinned on CUDA, so that
        copies to and from the device run asynchronously."""
        import torch

        empty = torch.empty((0, self.width), dtype=torch.float32)
        self._host[name] = grown(self._host.get(name, empty), rows, pin=self.device.type == "cuda")
        return self._host[name][:rows].numpy()

    def _compute(self, batch: Batch, arrival: Arrival, alphas: np.ndarray) -> tuple[float, int]:
        """Train the batch on its compact matrices; returns (summed loss, examples trained)."""
        cfg, ex, local = self.config, batch.examples, arrival.local
        dev = self.device
        cuda = dev.type == "cuda"
        head, in_head = batch.layout.cached, batch.layout.inputs_head

        def to_dev(a):
            if a is None:
                return None
            with warnings.catch_warnings():  # read-only arrays (zero-copy from Arrow) are read here, never written
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(a)
            return t.pin_memory().to(dev, non_blocking=True) if cuda else t.to(dev)

        if batch.tokens is not None and self.exact:  # the token path: the kernel draws the examples itself
            self.client.trained()
            held = self.held
            return self.compute.tokens(local["inputs"], local["outputs"], batch.ctx_pos, batch.tokens,
                                       held.keep, held.negatives.accept, held.negatives.alias, held.negative,
                                       float(alphas[0]), float(alphas[1]), batch.seed,
                                       adagrad=self.adagrad, threads=int(cfg.cpus_per_worker))
        if self.exact:  # the host matrices, trained in place on this worker's threads
            loss = self.compute.exact(local["inputs"], local["outputs"], batch.ctx_pos, batch.target_pos,
                                      batch.neg_pos, ex.neg_mask, float(alphas[0]), float(alphas[1]),
                                      ctx_mask=ex.ctx_mask, adagrad=self.adagrad,
                                      threads=int(cfg.cpus_per_worker))
            self._count_resident_uses(batch)
            return loss, len(ex)
        import torch

        if self.staged:  # only the pulled rows travel: the resident ones are already on the device
            # `local`, pinned
            host = {name: self._host[f"{name}{arrival.slot}"][:len(local[name])] for name in ("inputs", "outputs")}
            if arrival.event is not None:  # the copy stream has brought them to the slot's device matrices
                torch.cuda.current_stream(dev).wait_event(arrival.event)
            inputs = self._inputs_buffer(in_head + len(host["inputs"]))
            inputs[in_head:].copy_(arrival.device["inputs"])
            outputs = self._outputs_buffer(head + len(host["outputs"]))
            if len(host["outputs"]):  # none on the token path: every URL row is resident
                outputs[head:].copy_(arrival.device["outputs"])
        else:  # the host matrices themselves, trained in place
            inputs, outputs = torch.from_numpy(local["inputs"]), torch.from_numpy(local["outputs"])
        shared = cfg.shared_negatives
        if batch.tokens is not None:  # the token path: the examples are drawn here, on the device
            ex = self._draw_on_device(batch, to_dev)
            pairs = len(ex)
            n_micro = max(1, -(-pairs // ex.micro_batch))
            alphas = torch.from_numpy(lr.between_ends(alphas, n_micro))  # at each micro-batch's midpoint
            rounding = None
            if outputs.dtype != torch.float32 and cfg.rounding == "stochastic":  # its own draws, seeded as the examples
                from .device_examples import generator

                rounding = generator(batch.seed ^ ROUNDING_SEED, dev)
            loss = self.compute.batched(inputs, outputs, ex.ctx, ex.target, ex.neg, ex.neg_mask, alphas.to(dev),
                                        ex.micro_batch, ctx_mask=ex.ctx_mask, scale=ex.scale,
                                        adagrad=self.adagrad, rounding=rounding)
        else:
            pairs = len(ex)
            alphas = torch.from_numpy(alphas)
            loss = self.compute.batched(inputs, outputs, to_dev(batch.ctx_pos), to_dev(batch.target_pos),
                                        to_dev(batch.neg_pos), to_dev(ex.neg_mask), alphas.to(dev), ex.micro_batch,
                                        ctx_mask=to_dev(ex.ctx_mask), scale=to_dev(batch.scale),
                                        adagrad=self.adagrad,
                                        shared_negatives=cfg.negative if shared else 0)
        if self.staged:  # bring the rows to push home, into the (pinned) host matrices
            host["inputs"].copy_(inputs[in_head:], non_blocking=True)
            if len(host["outputs"]):
                host["outputs"].copy_(outputs[head:], non_blocking=True)
            if cuda:
                torch.cuda.current_stream(dev).synchronize()
        self._count_resident_uses(batch)
        return loss, pairs

    def _draw_on_device(self, batch: Batch, to_dev):
        """The token path's examples, drawn on the worker's device (device_examples)."""
        from . import device_examples

        cfg = self.config
        if self._device_tables is None:
            self._device_tables = device_examples.DeviceTables(self.held.keep, self.held.negatives, self.device)
        return self.compute.device_examples(
            to_dev(batch.ctx_pos), to_dev(batch.offsets), to_dev(batch.tokens), self._device_tables, self.held.negative,
            device_examples.generator(batch.seed, self.device), cfg.micro_batch,
            device_examples.Shape(cfg.mode, cfg.dbow_words, cfg.window))

    def _count_resident_uses(self, batch: Batch) -> None:
        if batch.tokens is None:  # the token path has one worker: its resident rows need no weights
            self.client.count_uses(batch.target_pos, batch.neg_pos)
        self.client.trained()

    def _resident(self, table: str) -> torch.Tensor:
        """The resident rows of words_out (the head of `outputs`), of words (the head of `inputs`) or
        of docs (after words in `inputs`)."""
        if table == "words_out":
            return self._outputs_buffer(self.cached)
        if table == "docs":
            return self._inputs_buffer(self.words_head + self.docs_head)[self.words_head:]
        return self._inputs_buffer(self.words_head)

    def _read_resident(self, table: str) -> np.ndarray:
        """The resident rows of `table` as float32 numpy rows (16-bit ones widened, their accumulator's
        bytes as they are)."""
        rows = self._resident(table)
        if isinstance(rows, np.ndarray):
            return rows
        import torch

        if rows.dtype == torch.float32:
            return rows.cpu().numpy()
        stored = rows.view(torch.int16).cpu().numpy().view(precision.stored(self.dtype))  # the servers' layout
        return precision.widen_rows(stored, self.dtype, self.dim)

    def _resident_array(self, table: str) -> np.ndarray | None:
        """The resident rows as a numpy array sharing their memory (what _read_resident gives on the
        CPU); None on CUDA, and for 16-bit rows, where _read_resident's rows are a copy."""
        if self.device.type != "cpu" or (table == "words_out" and self._half_outputs() is not None):
            return None
        return self._read_resident(table)

    def _write_resident(self, table: str, rows: np.ndarray) -> None:
        """Replace the resident rows of `table` with float32 rows (pulled from the servers: in a 16-bit
        table already of its values, so narrowing them to nearest keeps them exactly)."""
        if not self.torch:
            self._resident(table)[:] = rows
            return
        import torch

        resident = self._resident(table)
        if resident.dtype != torch.float32:
            stored = precision.narrow_rows(rows, self.dtype, self.dim)  # to nearest: exact
            resident[:] = torch.from_numpy(stored.view(np.int16)).view(resident.dtype).to(self.device)
            return
        resident[:] = torch.from_numpy(rows).to(self.device)

    def _sync(self, label: str, push: bool = True, pull: bool = True, docs: bool = False,
              hand: bool = False) -> dict | None:
        """Exchange the resident rows with the servers (client.ParameterClient.sync); with docs, the
        resident documents' too; with hand, the held block handed over (returned), not pushed."""
        return self.client.sync(self._read_resident, self._write_resident, label, push=push, pull=pull, docs=docs,
                                into=self._resident_array, hand=hand)
