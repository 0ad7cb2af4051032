"""Worker: read → examples → pull → micro-batches → push, one macro-batch after another, pipelined.

Each worker reads its own units of the corpus (row ranges of shard files) straight from shared
storage; nothing goes through the driver. For each macro-batch it builds the examples of its mode
(sampling.build_examples), takes the unique rows of `docs`, `words` (when trained) and `words_out`
they touch, pulls them with one call per parameter server into compact local matrices, trains
micro-batches over them (kernels.py), and pushes back new − pulled with one call per server. The pull
of the next macro-batch is in flight while the current one computes, and up to
`max_inflight_pushes` pushes are outstanding.

torch (and kernels.py, which needs it) is imported where a worker first uses it, not here: the driver
imports this module to start the actors, and torch's import is 0.8 s of train's start-up.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import client, cpu_kernel
from .config import TrainConfig
from .corpus import Corpus, iter_shard
from .sampling import Examples, NegativeTable, build_examples, doc_step_scale, keep_probabilities, unique_rows
from .sharding import Routing

if TYPE_CHECKING:
    import torch

MIN_MACRO_BATCH = 4096
ROUNDS_PER_EPOCH = 16  # pull/push rounds a worker makes at least per epoch where rows are shared (macro_batch_for)
SHARED_MACRO_BATCH = 65536  # the default macro-batch where workers share rows (macro_batch_for)
SOLE_WRITER_MACRO_BATCH = 262144  # ... and where one worker writes every row it trains
DEVICE_MACRO_BATCH = 1048576  # ... and where it does with the examples drawn on its device
# With several workers, each trains its own copy of the resident (--cache-rows) rows; they meet at the
# servers this often (in macro-batches), as well as at checkpoints and epoch ends
CACHE_SYNC_BATCHES = 8
# ... where the deltas of a resident row add up to at most this many workers' worth (_sync_cache)
RESIDENT_OVERSHOOT = 2.0
STAGES = ("read", "sample", "pull", "wait", "compute", "push")  # where a worker's time goes


def macro_batch_for(macro_batch: int | None, tokens_per_epoch: int, sole_writer: bool = False,
                    on_device: bool = False) -> int:
    """A worker's macro-batch: `macro_batch` tokens (None: SOLE_WRITER_MACRO_BATCH for a sole writer,
    DEVICE_MACRO_BATCH if its examples are drawn on its device, else SHARED_MACRO_BATCH), and, where
    workers share rows, at least ROUNDS_PER_EPOCH pull/push rounds.

    Where rows are shared, on a small corpus one huge macro-batch would leave every worker training on
    a copy of words_out that is an epoch old (Lee corpus: -0.02 Pearson). A sole writer (one worker
    holding every words_out row resident, and its documents' rows its own) trains nothing another
    writes, so its rounds only cost calls: on the 200k corpus 262,144-token macro-batches trained at
    2.07-2.84M tokens/s against 1.68-1.97M at 65,536 (the push of a batch's document rows is a fixed
    cost per round); Lee trains an epoch in one round. With the examples drawn on the device the host
    only moves the documents' rows, and the rounds' fixed costs are most of its work: 1,048,576-token
    macro-batches fed 21.6-27.4M tokens/s on the 200k corpus against 13.6-21.6M at 262,144
    (jobs/feed_rate.py, no kernel).
    """
    if sole_writer:
        return int(macro_batch or (DEVICE_MACRO_BATCH if on_device else SOLE_WRITER_MACRO_BATCH))
    macro_batch = macro_batch or SHARED_MACRO_BATCH
    return int(min(macro_batch, max(MIN_MACRO_BATCH, tokens_per_epoch // ROUNDS_PER_EPOCH)))


def overlap_weights(uses: np.ndarray, workers: int) -> np.ndarray:
    """Weight of the delta of each row a worker used `uses` times, when `workers` workers train the
    same rows from the same start: 1 / (1 + (W − 1)(1 − e^(−uses))).

    A row used c times by this worker is, with the others drawing from the same distribution, also
    in each of their deltas with probability ≈ 1 − e^(−c). Hot rows are in all W, whose deltas point
    the same way: summed, they overshoot W-fold, so each counts 1/W. Rare rows (c ≈ 0, one worker)
    count whole. See Worker._push_weights and Worker._sync_cache for where this was measured.
    """
    return 1.0 / (1.0 + (workers - 1) * -np.expm1(-np.asarray(uses, dtype=np.float32)))


@dataclass
class Unit:
    """Rows [start, end) of one shard file: the grain at which the corpus is divided among workers."""

    path: str
    start: int
    end: int
    tokens: int


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


@dataclass(frozen=True)
class Compute:
    """What a worker runs on each macro-batch's examples, as arguments rather than module globals:
    jobs/feed_rate.py swaps them for nothing to time the host side alone."""

    batched: Callable          # kernels.train: micro-batches of summed updates, torch (CPU or CUDA)
    exact: Callable            # cpu_kernel.train: each update applied at once, on examples the host built
    tokens: Callable           # cpu_kernel.train_tokens: the exact kernel drawing its own examples
    device_examples: Callable  # device_examples.dbow_examples: the token path's examples, on the device

    @staticmethod
    def default() -> Compute:
        from . import device_examples, kernels  # torch: imported in the worker, never in the driver

        return Compute(batched=kernels.train, exact=cpu_kernel.train, tokens=cpu_kernel.train_tokens,
                       device_examples=device_examples.dbow_examples)


@dataclass
class Batch:
    """One macro-batch: its examples, the rows of each table it touches, and where they sit locally.

    The compact local matrices are `inputs` (the batch's `docs` rows, then its `words` rows) and
    `outputs` (its `words_out` rows); within each table's block, rows are grouped by server so a
    pull fills, and a push reads, one contiguous slice per server.
    """

    examples: Examples | None    # None on the token path (the examples are drawn where the kernel runs)
    routes: dict[str, Routing]   # table → its unique rows' routing, in pull order
    ctx_pos: np.ndarray          # [n, c] compact positions in `inputs`
    target_pos: np.ndarray       # [n] compact positions in `outputs`
    neg_pos: np.ndarray          # negatives' compact positions in `outputs`
    scale: np.ndarray | None
    push_weights: dict           # table → weight of each compact row's delta (see Worker._push_weights)
    pulls: list                  # one ObjectRef per shard
    start: tuple[int, int]       # (unit index, shard-file row) of its first document: a data position
    cached: int = 0              # `outputs` begins with the worker's resident rows 0..cached-1 of words_out
    raw_tokens: int = 0          # tokens read before subsampling (what the learning-rate schedule counts)
    # the token path: the chunk's tokens and offsets; ctx_pos then holds each token's document row (exact
    # kernel) or each document's (the device expands the offsets itself)
    tokens: np.ndarray | None = None
    offsets: np.ndarray | None = None
    seed: int = 0                # the token path: the seed of its draws

    def request(self, shard: int) -> dict[str, np.ndarray]:
        """Local rows of every table on one server: what is pulled from it and pushed back to it."""
        return {name: route.local[shard] for name, route in self.routes.items()}

    def blocks(self, shard: int):
        """(table, compact matrix name, slice of it, slice of the table's own compact rows) for each
        table's rows on one server, in request order."""
        base = 0
        for name, route in self.routes.items():
            own = slice(int(route.bounds[shard]), int(route.bounds[shard + 1]))
            if name == "words_out":  # after the resident rows, which are neither pulled nor pushed
                yield name, "outputs", slice(self.cached + own.start, self.cached + own.stop), own
            else:  # docs then words share `inputs`
                yield name, "inputs", slice(base + own.start, base + own.stop), own
                base += int(route.bounds[-1])

    def sizes(self) -> dict[str, int]:
        outputs = self.cached + int(self.routes["words_out"].bounds[-1])
        return {"inputs": sum(int(r.bounds[-1]) for n, r in self.routes.items() if n != "words_out"),
                "outputs": outputs}


def send_pushes(pushes: list[tuple], inflight: list, limit: int) -> list:
    """Send (server, request, rows, label, assign) pushes, then wait until at most `limit` are in
    flight, the oldest first; returns those still in flight. A push a server refused (non-finite
    values) raises here, naming its step."""
    inflight = inflight + [server.push.remote(request, rows, label, assign)
                           for server, request, rows, label, assign in pushes]
    return client.wait_oldest(inflight, limit)


class Pusher:
    """A worker's pushes, sent from a thread of their own while the next macro-batch computes.

    Used where a worker writes every row it trains alone (the token path: one worker, every words_out
    row resident, and each macro-batch's document rows its own): no later pull of this epoch reads
    the rows a push carries, so sending it late changes nothing but the time. At most `limit` pushes
    are in flight, the oldest awaited first; a push a server refused (non-finite values) is raised on
    the worker's own thread at its next submit or drain. On the 200k corpus the pushes' Ray calls
    and waits were 11% of the worker's time, with both kernel threads idle meanwhile.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.queue: queue.Queue = queue.Queue(maxsize=2)  # macro-batches' pushes not yet sent
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self.thread.start()

    def submit(self, calls: list[tuple]) -> None:
        """Send (server, request, rows, label, assign) pushes; blocks while two batches' wait to be sent."""
        self._raise()
        self.queue.put(calls)

    def drain(self) -> None:
        """Return once every push submitted so far is applied by its server."""
        done = threading.Event()
        self.queue.put(done)
        done.wait()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _run(self) -> None:
        inflight: list = []
        while True:
            item = self.queue.get()
            try:
                if isinstance(item, threading.Event):
                    client.get(inflight)
                    inflight = []
                    continue
                inflight = send_pushes(item, inflight, self.limit)
            except Exception as exc:  # noqa: BLE001 (kept for the worker's thread, which raises it)
                self.error, inflight = exc, []
            finally:
                if isinstance(item, threading.Event):
                    item.set()


class Worker:
    def __init__(self, index: int, units: list[Unit], corpus_path: str, config: dict,
                 servers: list, table_rows: dict[str, int], compute: Compute | None = None):
        """servers: the parameter servers' actor handles, or their names (what the trainer passes: a
        restarted worker looks them up again, and Ray keeps no object-store argument alive for it), or
        client.LocalServers (no Ray at all). compute: what trains the examples (Compute.default())."""
        import torch

        servers = client.connect(servers)
        self.index, self.units, self.config, self.servers = index, units, config, servers
        self.compute = compute or Compute.default()
        self.num_shards = len(servers)
        self.table_rows = table_rows
        torch.set_num_threads(int(config["cpus_per_worker"]))
        # the exact kernel (cpu_kernel) on CPU workers, the batched one (kernels) on GPUs: see TrainConfig.kernel
        typed = TrainConfig(**config)
        self.exact = typed.exact_kernel()
        use_cuda = config["gpus_per_worker"] > 0
        if use_cuda and not torch.cuda.is_available():
            raise RuntimeError(f"worker {index}: gpus_per_worker > 0 but torch sees no CUDA device")
        self.device = torch.device("cuda" if use_cuda else "cpu")
        # Staged: a macro-batch's rows are assembled in persistent host matrices (pinned on CUDA), copied
        # to matrices on the device, trained there and copied back for the push; unstaged (CPU), the host
        # matrices are trained in place. It is its own flag so that tests run the device path on CPU.
        self.staged = use_cuda
        counts = Corpus(corpus_path).counts()
        self.keep_prob = keep_probabilities(counts, config["sample"])
        self.negatives = NegativeTable(counts, config["ns_exponent"])
        self.tokens_per_epoch = sum(u.tokens for u in units)
        self.planned_tokens = self.tokens_per_epoch * config["epochs"]
        self.width = config["dim"] + int(config["optimizer"] == "adagrad")  # adagrad's accumulator rides along
        self.stats = self._zero_stats()
        # --cache-rows: rows 0..C-1 of words_out (ids are by frequency, so the hottest) stay resident
        # here, at the head of the `outputs` matrix, between macro-batches; see _sync_cache
        self.cached = typed.resident_rows(table_rows["words_out"])
        # The token path: plain PV-DBOW with every words_out row resident here and no other worker: the
        # host only reads the tokens and routes the documents' rows. The exact kernel draws the
        # subsampling and negatives itself (cpu_kernel.train_tokens); for the batched one they are drawn
        # on its device (device_examples), where the URL table already is.
        self.token_path = typed.token_path(table_rows["words_out"])
        self._device_tables = None  # device_examples.DeviceTables, made at the first device token batch
        self.macro_batch = macro_batch_for(config["macro_batch"], self.tokens_per_epoch, sole_writer=self.token_path,
                                           on_device=not self.exact)
        self.pusher = Pusher(config["max_inflight_pushes"] * self.num_shards) if self.token_path else None
        self._accept = self.negatives.accept.astype(np.float32)
        self._outputs = torch.empty((0, self.width), dtype=torch.float32, device=self.device)
        self._inputs = torch.empty((0, self.width), dtype=torch.float32, device=self.device)  # staged only
        self._host: dict[str, torch.Tensor] = {}  # host matrices by name, grown as needed (see _assemble)
        self._cache_base: np.ndarray | None = None  # the resident rows as last pulled
        self._cache_held = False  # the token path: whether the resident rows were pulled (see _sync_sole_writer)
        self._cache_uses = np.zeros(self.cached, dtype=np.int64)  # times each was used since then
        self._cache_route = Routing.of(np.arange(self.cached, dtype=np.int64), max(self.num_shards, 1))
        self._cache_order = np.empty(self.cached, dtype=np.int64)  # resident row at each place, by server
        self._cache_order[self._cache_route.position] = np.arange(self.cached)
        self._batches_since_sync = 0
        # Checkpoints pause every worker between two macro-batches (pause/resume, served from a second
        # thread while run_epoch works): its pushes drained, it reports the position of the next batch.
        self._cv = threading.Condition()
        self._pause_requested = False
        self._paused_at: dict | None = None
        self._running = False
        self._position = self.start_of(0)

    @staticmethod
    def _zero_stats() -> dict:
        # every stage present from the start: progress() copies this dict from another thread, and a
        # key appearing mid-copy would break it
        return {"tokens": 0, "pairs": 0, "loss": 0.0, "epoch": -1,
                "seconds": dict.fromkeys(STAGES, 0.0)}

    def progress(self) -> dict:
        """Counters of the current epoch; served from a second thread while run_epoch works."""
        s = dict(self.stats)
        s["seconds"] = dict(s["seconds"])
        return s

    # -- data positions and pausing for checkpoints --------------------------------------------
    @staticmethod
    def start_of(epoch: int) -> dict:
        """The start of an epoch: unit 0, row of its start, nothing trained yet."""
        return {"epoch": epoch, "unit": 0, "row": None, "step": 0, "tokens": 0, "pairs": 0, "loss": 0.0}

    def _position_at(self, epoch: int, batch: Batch | None, step: int) -> dict:
        """Where this worker's data stands: the next macro-batch to train (None: the epoch is done)."""
        unit, row = batch.start if batch is not None else (len(self.units), None)
        return {"epoch": epoch, "unit": unit, "row": row, "step": step, "tokens": self.stats["tokens"],
                "pairs": self.stats["pairs"], "loss": self.stats["loss"]}

    def pause(self) -> dict:
        """Stop between two macro-batches with every push applied; returns the data position.

        Idle (between epochs) it returns at once, and the request stays set, so an epoch started
        meanwhile pauses before its first batch: nothing trains while a checkpoint is written.
        """
        with self._cv:
            self._pause_requested = True
            while self._running and self._paused_at is None:
                self._cv.wait()
            return dict(self._paused_at or self._position)

    def resume(self) -> None:
        with self._cv:
            self._pause_requested, self._paused_at = False, None
            self._cv.notify_all()

    def _hold_if_paused(self, epoch: int, batch: Batch, step: int, inflight: list) -> bool:
        """At a batch boundary: if a checkpoint asked, drain pushes, publish the position, wait.
        True if it paused (the caller re-pulls the batch: the rows changed meanwhile)."""
        if not self._pause_requested:
            return False
        self._drain(inflight)
        self._sync_cache(f"epoch {epoch} step {step} of worker {self.index}", pull=False)  # into the checkpoint
        with self._cv:
            self._paused_at = self._position_at(epoch, batch, step)
            self._cv.notify_all()
            while self._pause_requested:
                self._cv.wait()
        return True

    # -- reading -------------------------------------------------------------------------------
    def _chunks(self, from_unit: int = 0, from_row: int | None = None):
        """((unit index, first row), (doc_ids, offsets, tokens)) chunks of at most ~macro_batch tokens
        from this worker's units, starting at a data position (a unit, and a row of its shard file)."""
        for u in range(from_unit, len(self.units)):
            unit = self.units[u]
            first = unit.start if u != from_unit or from_row is None else max(unit.start, from_row)
            row = 0
            for doc_ids, offsets, tokens in iter_shard(unit.path, max_tokens=self.macro_batch):
                n = len(doc_ids)
                lo, hi = max(first - row, 0), min(unit.end - row, n)
                at = row + lo
                row += n
                if lo >= hi:
                    if row >= unit.end:
                        break
                    continue
                if lo > 0 or hi < n:
                    doc_ids = doc_ids[lo:hi]
                    tokens = tokens[offsets[lo]:offsets[hi]]
                    offsets = offsets[lo:hi + 1] - offsets[lo]
                yield (u, at), (doc_ids, offsets, tokens)

    def _prepare(self, start: tuple[int, int], chunk, rng) -> Batch:
        """Examples, unique rows and their routing for one chunk (pulls not yet issued)."""
        cfg = self.config
        doc_ids, offsets, tokens = chunk
        if self.token_path:
            routes = {"docs": Routing.of(doc_ids.astype(np.int64), self.num_shards),  # sorted, unique
                      "words_out": Routing.of(np.zeros(0, np.int64), self.num_shards)}  # all resident
            ctx_pos = (np.repeat(routes["docs"].position, np.diff(offsets)) if self.exact
                       else routes["docs"].position)  # each token's document row, or each document's
            return Batch(examples=None, routes=routes, ctx_pos=ctx_pos, target_pos=tokens,
                         neg_pos=np.zeros(0, np.int64), scale=None, push_weights={}, pulls=[], start=start,
                         cached=self.cached, raw_tokens=len(tokens), tokens=tokens, offsets=offsets,
                         seed=int(rng.integers(1 << 63)))
        ex = build_examples(offsets, tokens, self.keep_prob, self.negatives, cfg["negative"], rng,
                            mode=cfg["mode"], dbow_words=cfg["dbow_words"], window=cfg["window"],
                            shared_negatives=cfg["shared_negatives"], micro_batch=cfg["micro_batch"],
                            interleave=not self.exact)
        routes = {"docs": Routing.of(doc_ids.astype(np.int64), self.num_shards)}  # sorted, unique
        push_weights: dict[str, np.ndarray | None] = {}
        flat = ex.ctx.reshape(-1)
        ctx_pos = routes["docs"].position[np.minimum(flat, ex.n_docs - 1)]
        if "words" in self.table_rows:  # words used as inputs: ids past n_docs in the examples
            is_word = flat >= ex.n_docs
            uniq, inverse = unique_rows(flat[is_word] - ex.n_docs, self.table_rows["words"])
            routes["words"] = Routing.of(uniq, self.num_shards)
            ctx_pos[is_word] = len(doc_ids) + routes["words"].position[inverse]
            push_weights["words"] = self._push_weights(routes["words"], inverse, len(uniq))
        uniq, inverse = unique_rows(np.concatenate([ex.target, ex.neg.reshape(-1)]), self.table_rows["words_out"])
        hot = int(np.searchsorted(uniq, self.cached))  # uniq is sorted: its resident rows come first
        routes["words_out"] = Routing.of(uniq[hot:], self.num_shards)
        push_weights["words_out"] = self._push_weights(routes["words_out"], inverse, len(uniq))
        # compact place of each unique row: resident row r at r, the others after the C resident rows
        place = np.concatenate([uniq[:hot], self.cached + routes["words_out"].position])
        compact = place[inverse]
        n = len(ex)
        return Batch(examples=ex, routes=routes, ctx_pos=ctx_pos.reshape(ex.ctx.shape), target_pos=compact[:n],
                     neg_pos=compact[n:].reshape(ex.neg.shape),
                     scale=None if self.exact else doc_step_scale(ex.ctx[:, 0], ex.micro_batch),
                     push_weights=push_weights, pulls=[], start=start, cached=self.cached,
                     raw_tokens=ex.raw_tokens)

    def _push_weights(self, route: Routing, inverse: np.ndarray, n_unique: int) -> np.ndarray | None:
        """Weight of each shared row's pushed delta, in compact order: 1 / the workers expected to
        push the same row from the same stale start.

        A row of `words`/`words_out` that this macro-batch uses c times is, with W workers drawing
        from the same distribution, also in each other worker's concurrent macro-batch with
        probability ≈ 1 − e^(−c). Hot rows are in all of them: each worker trains its copy from the
        same pulled value close to where the batch's data pulls it, and W such deltas summed overshoot
        W-fold. Measured on 200k users with dbow_words and 2 workers: plain sums diverged (loss 10⁴
        → 10¹³ in 5 epochs) while one worker trained stably; weighting 1/(1 + (W−1)(1 − e^(−c)))
        keeps the sum near one full step for hot rows and leaves rare rows (c ≈ 0, one worker) whole.
        `docs` rows belong to one worker's data and are never weighted.

        Only when `words` is trained (dbow_words, PV-DM), i.e. when both sides of an example's dot
        product are shared rows. In plain PV-DBOW only `words_out` is shared, summed deltas were
        stable, and weighting them cost fit for nothing (200k users, 5 epochs: last-epoch loss 2.54
        summed vs 2.88 weighted; recall@10 0.163 vs 0.162; gensim 0.164). Weighting `words` alone
        was not enough either (dbow_words epoch-1 loss 5.1 against 3.2 with both).
        """
        workers = self.config["num_workers"]
        if workers <= 1 or "words" not in self.table_rows:
            return None
        weights = np.empty(n_unique, dtype=np.float32)
        weights[route.position] = overlap_weights(np.bincount(inverse, minlength=n_unique), workers)
        return weights

    def _pull(self, batch: Batch) -> None:
        """One pull per server for the batch's rows of every table; the results arrive later."""
        batch.pulls = [server.pull.remote(batch.request(s)) for s, server in enumerate(self.servers)]

    # -- one epoch ---------------------------------------------------------------------------------
    def run_epoch(self, epoch: int, start: dict | None = None) -> dict:
        """Train this worker's data for one epoch, from the beginning or from a checkpointed position
        (`start`, as pause() reported it); returns the epoch's counters."""
        from .kernels import micro_batch_alphas

        cfg = self.config
        start = start or self.start_of(epoch)
        self.stats = self._zero_stats()
        self.stats.update(epoch=epoch, tokens=start["tokens"], pairs=start["pairs"], loss=start["loss"])
        seconds = self.stats["seconds"]
        done_before = epoch * self.tokens_per_epoch + start["tokens"]  # drives the learning rate
        chunks = self._chunks(start["unit"], start["row"])
        step_of_next = start["step"]
        inflight: list = []
        with self._cv:
            self._running = True

        def next_batch():
            nonlocal step_of_next
            t0 = time.perf_counter()
            item = next(chunks, None)
            t1 = time.perf_counter()
            seconds["read"] += t1 - t0
            if item is None:
                return None
            # one generator per macro-batch, seeded by its place in the epoch: a run resumed from a
            # position draws the same subsampling and negatives as one that never stopped
            rng = np.random.default_rng([cfg["seed"], self.index, epoch, step_of_next])
            step_of_next += 1
            batch = self._prepare(*item, rng)
            t2 = time.perf_counter()
            seconds["sample"] += t2 - t1
            self._pull(batch)
            seconds["pull"] += time.perf_counter() - t2
            return batch

        try:
            batch = next_batch()
            step = start["step"]
            self._sync_cache(f"epoch {epoch} start of worker {self.index}")
            while batch is not None:
                if self._hold_if_paused(epoch, batch, step, inflight):
                    self._pull(batch)
                    self._sync_cache(f"epoch {epoch} step {step} of worker {self.index}")
                elif self.cached and cfg["num_workers"] > 1 and self._batches_since_sync >= CACHE_SYNC_BATCHES:
                    self._sync_cache(f"epoch {epoch} step {step} of worker {self.index}")
                upcoming = next_batch()  # its pull flies while this batch computes

                t0 = time.perf_counter()
                pulled = client.get(batch.pulls)
                t1 = time.perf_counter()
                seconds["wait"] += t1 - t0

                ex = batch.examples
                # the exact kernel decays alpha from the batch's start to its end; the batched one takes
                # one rate per micro-batch (≥ 1: subsampling may keep nothing), which on the token path
                # it interpolates between the two ends once its examples are drawn
                ends = self.exact or ex is None
                n_micro = 1 if ends else max(1, -(-len(ex) // ex.micro_batch))
                alphas = micro_batch_alphas(cfg["alpha"], cfg["min_alpha"], done_before, batch.raw_tokens,
                                            self.planned_tokens, n_micro, ends=ends)
                local = self._assemble(batch, pulled)
                loss, pairs = self._compute(batch, local, alphas)
                t2 = time.perf_counter()
                seconds["compute"] += t2 - t1

                label = f"epoch {epoch} step {step} of worker {self.index} (alpha {float(alphas[0]):.6g})"
                pushes = self._pushes(batch, pulled, local, label)
                if self.pusher is not None:  # sent from its own thread while the next batch computes
                    self.pusher.submit(pushes)
                else:
                    inflight = send_pushes(pushes, inflight, cfg["max_inflight_pushes"] * self.num_shards)
                seconds["push"] += time.perf_counter() - t2

                done_before += batch.raw_tokens
                self.stats["tokens"] += batch.raw_tokens
                self.stats["pairs"] += pairs
                self.stats["loss"] += loss
                batch, step = upcoming, step + 1

            t0 = time.perf_counter()
            self._drain(inflight)
            self._sync_cache(f"epoch {epoch} end of worker {self.index}", pull=False)
            seconds["push"] += time.perf_counter() - t0
        finally:
            with self._cv:
                self._running = False
                self._position = self._position_at(epoch, None, step_of_next)
                self._cv.notify_all()
        return self.progress()

    def _assemble(self, batch: Batch, pulled: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Copy the pulled rows (read-only, zero-copy from the object store) into writable compact matrices.

        Both are persistent (a macro-batch's are done with once its push is sent). Unstaged (CPU),
        `outputs` is the buffer trained in place, whose head holds the resident rows. Staged, both are
        host matrices, pinned on CUDA, and the resident head of `outputs` is unused: those rows live on
        the device.
        """
        sizes = batch.sizes()
        local = {"inputs": self._host_buffer("inputs", sizes["inputs"]),
                 "outputs": (self._host_buffer("outputs", sizes["outputs"]) if self.staged
                             else self._outputs_buffer(sizes["outputs"]).numpy())}
        for s, rows in enumerate(pulled):
            at = 0
            for _, name, where, _ in batch.blocks(s):
                n = where.stop - where.start
                local[name][where] = rows[at:at + n]
                at += n
        return local

    @staticmethod
    def _grown(buffer: torch.Tensor, rows: int, keep: int = 0, pin: bool = False) -> torch.Tensor:
        """`buffer` if it has `rows` rows, else a bigger one (by 1/4 at least, so growth is rare) with
        its first `keep` rows carried over."""
        import torch

        if len(buffer) >= rows:
            return buffer
        grown = torch.empty((max(rows, len(buffer) * 5 // 4), buffer.shape[1]), dtype=buffer.dtype,
                            device=buffer.device, pin_memory=pin)
        keep = min(keep, len(buffer))
        grown[:keep] = buffer[:keep]
        return grown

    def _outputs_buffer(self, rows: int) -> torch.Tensor:
        """The persistent `outputs` matrix on the worker's device, at least `rows` long; its first
        `cached` rows are the resident rows of words_out and survive growing."""
        self._outputs = self._grown(self._outputs, rows, keep=self.cached)
        return self._outputs[:rows]

    def _host_buffer(self, name: str, rows: int) -> np.ndarray:
        """The persistent host matrix `name` as a numpy view of `rows` rows; pinned on CUDA, so that
        copies to and from the device run asynchronously."""
        import torch

        empty = torch.empty((0, self.width), dtype=torch.float32)
        self._host[name] = self._grown(self._host.get(name, empty), rows, pin=self.device.type == "cuda")
        return self._host[name][:rows].numpy()

    def _compute(self, batch: Batch, local: dict[str, np.ndarray], alphas: torch.Tensor) -> tuple[float, int]:
        """Train the batch on its compact matrices; returns (summed loss, examples trained)."""
        import torch

        cfg, ex = self.config, batch.examples
        dev = self.device
        cuda = dev.type == "cuda"
        head = batch.cached

        def to_dev(a):
            if a is None:
                return None
            with warnings.catch_warnings():  # read-only arrays (zero-copy from Arrow) are read here, never written
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(a)
            return t.pin_memory().to(dev, non_blocking=True) if cuda else t.to(dev)

        if batch.tokens is not None and self.exact:  # the token path: the kernel draws the examples itself
            self._batches_since_sync += 1
            return self.compute.tokens(local["inputs"], local["outputs"], batch.ctx_pos, batch.tokens,
                                       self.keep_prob, self._accept, self.negatives.alias, cfg["negative"],
                                       float(alphas[0]), float(alphas[1]), batch.seed,
                                       adagrad=cfg["optimizer"] == "adagrad", threads=int(cfg["cpus_per_worker"]))
        if self.exact:  # the host matrices, trained in place on this worker's threads
            loss = self.compute.exact(local["inputs"], local["outputs"], batch.ctx_pos, batch.target_pos,
                                      batch.neg_pos, ex.neg_mask, float(alphas[0]), float(alphas[1]),
                                      ctx_mask=ex.ctx_mask, adagrad=cfg["optimizer"] == "adagrad",
                                      threads=int(cfg["cpus_per_worker"]))
            self._count_resident_uses(batch)
            return loss, len(ex)
        if self.staged:  # only the pulled rows travel: the resident ones are already on the device
            host = {name: self._host[name][:len(local[name])] for name in ("inputs", "outputs")}  # `local`, pinned
            self._inputs = self._grown(self._inputs, len(host["inputs"]))
            inputs = self._inputs[:len(host["inputs"])]
            inputs.copy_(host["inputs"], non_blocking=True)
            outputs = self._outputs_buffer(len(host["outputs"]))
            outputs[head:].copy_(host["outputs"][head:], non_blocking=True)
        else:  # the host matrices themselves, trained in place
            inputs, outputs = torch.from_numpy(local["inputs"]), torch.from_numpy(local["outputs"])
        shared = cfg["shared_negatives"]
        if batch.tokens is not None:  # the token path: the examples are drawn here, on the device
            ex = self._draw_on_device(batch, to_dev)
            pairs = len(ex)
            n_micro = max(1, -(-pairs // ex.micro_batch))
            mid = (torch.arange(n_micro, dtype=torch.float32) + 0.5) / n_micro
            alphas = alphas[0] + (alphas[1] - alphas[0]) * mid  # the rate at each micro-batch's midpoint
            loss = self.compute.batched(inputs, outputs, ex.ctx, ex.target, ex.neg, ex.neg_mask, alphas.to(dev),
                                        ex.micro_batch, adagrad=cfg["optimizer"] == "adagrad")
        else:
            pairs = len(ex)
            loss = self.compute.batched(inputs, outputs, to_dev(batch.ctx_pos), to_dev(batch.target_pos),
                                        to_dev(batch.neg_pos), to_dev(ex.neg_mask), alphas.to(dev), ex.micro_batch,
                                        ctx_mask=to_dev(ex.ctx_mask), scale=to_dev(batch.scale),
                                        adagrad=cfg["optimizer"] == "adagrad",
                                        shared_negatives=cfg["negative"] if shared else 0)
        if self.staged:  # bring the rows to push home, into the (pinned) host matrices
            host["inputs"].copy_(inputs, non_blocking=True)
            host["outputs"][head:].copy_(outputs[head:], non_blocking=True)
            if cuda:
                torch.cuda.current_stream(dev).synchronize()
        self._count_resident_uses(batch)
        return loss, pairs

    def _draw_on_device(self, batch: Batch, to_dev):
        """The token path's PV-DBOW examples, drawn on the worker's device (device_examples)."""
        from . import device_examples

        cfg = self.config
        if self._device_tables is None:
            self._device_tables = device_examples.DeviceTables(self.keep_prob, self.negatives, self.device)
        return self.compute.device_examples(
            to_dev(batch.ctx_pos), to_dev(batch.offsets), to_dev(batch.tokens), self._device_tables, cfg["negative"],
            device_examples.generator(batch.seed, self.device), cfg["micro_batch"])

    def _count_resident_uses(self, batch: Batch) -> None:
        head = batch.cached
        # for the weights of their next push (the token path has one worker: no weights)
        if head and self.config["num_workers"] > RESIDENT_OVERSHOOT and batch.tokens is None:
            used = np.concatenate([batch.target_pos, batch.neg_pos.reshape(-1)])
            self._cache_uses += np.bincount(used[used < head], minlength=head)
        self._batches_since_sync += 1

    def _sync_cache(self, label: str, push: bool = True, pull: bool = True) -> None:
        """Exchange the resident rows with the servers: push what they learned since the last pull
        (new − pulled, like any push), then pull them afresh (other workers' updates included).

        Called at the start of an epoch (pull), every CACHE_SYNC_BATCHES macro-batches when several
        workers share the rows, before a checkpoint and at the end of an epoch (push only: the
        servers then hold every update, and the next use pulls first).

        With several workers each trains its own copy of these rows from the same pull, and their
        deltas point the same way. Each is weighted by overlap_weights of its uses since the pull,
        times RESIDENT_OVERSHOOT, at most 1: a hot row's deltas add up to two workers' worth. 4
        workers at 75k-token macro-batches (200k users, own negatives, 8,192-example micro-batches):
        summed whole, recall@10 0.101, under the popularity baseline (0.127); weighted 1/4 (one
        worker's worth) 0.1607; two workers' worth 0.1661. With 2 workers the sum was as good (200k:
        0.1655 summed, 0.1671 at 1/2) or better (the bundled sample: 0.22 against 0.20 at 1/2), and
        two workers' worth is the sum.
        """
        if not self.cached:
            return
        if self.token_path:  # the only writer of these rows: they go as they are, and need no pull again
            self._sync_sole_writer(label, push, pull)
            return
        if push and self._cache_base is not None:
            delta = self._outputs[:self.cached].cpu().numpy() - self._cache_base
            if self.config["num_workers"] > RESIDENT_OVERSHOOT:  # else every weight is 1: the plain sum
                delta *= np.minimum(1.0, RESIDENT_OVERSHOOT * overlap_weights(self._cache_uses,
                                                                              self.config["num_workers"]))[:, None]
            self._push_resident(delta[self._cache_order], label, assign=False)
        self._cache_base = None
        self._cache_uses[:] = 0
        if pull:
            self._cache_base = self._pull_resident()
        self._batches_since_sync = 0

    def _push_resident(self, rows: np.ndarray, label: str, assign: bool) -> None:
        """Send the resident rows' push (deltas, or with assign the rows themselves), ordered by server
        as _cache_order places them, and wait until every server has applied its part."""
        route = self._cache_route
        client.get([server.push.remote({"words_out": route.local[s]}, rows[route.bounds[s]:route.bounds[s + 1]],
                                       f"{label} (resident rows)", assign)
                    for s, server in enumerate(self.servers) if route.bounds[s + 1] > route.bounds[s]])

    def _pull_resident(self) -> np.ndarray:
        """Pull the resident rows from the servers into the head of `outputs`; returns them as pulled."""
        import torch

        route = self._cache_route
        pulled = client.get([server.pull.remote({"words_out": route.local[s]})
                             for s, server in enumerate(self.servers)])
        fresh = np.empty((self.cached, self.width), dtype=np.float32)
        fresh[self._cache_order] = np.concatenate(pulled)
        self._outputs_buffer(self.cached)[:] = torch.from_numpy(fresh).to(self.device)
        return fresh

    def _sync_sole_writer(self, label: str, push: bool, pull: bool) -> None:
        """_sync_cache for the token path, whose worker alone writes every words_out row: the push
        writes the rows over the servers' (no delta, no copy of the rows as pulled), and once pulled
        they are never pulled again: nothing else changes them. A restarted worker starts without them
        and pulls. (On the 200k corpus the epoch's pull of the 100k rows was ~15% of a device worker's
        host time.)"""
        if push and self._cache_held and self._batches_since_sync:  # trained since the last push
            self._push_resident(self._outputs[:self.cached].cpu().numpy()[self._cache_order], label, assign=True)
            self._batches_since_sync = 0
        if pull and not self._cache_held:
            self._pull_resident()
            self._cache_held = True

    def _drain(self, inflight: list) -> None:
        """Wait until every push of this worker is applied (a refused one raises here)."""
        if self.pusher is not None:
            self.pusher.drain()
        client.get(inflight)
        inflight.clear()

    def _pushes(self, batch: Batch, pulled: list[np.ndarray], local: dict[str, np.ndarray], label: str) -> list:
        """(server, request, rows, label, assign) for each server the batch pulled rows from: new −
        pulled, weighted where several workers' deltas of a row overlap; on the token path, whose
        worker alone writes the rows it pulls, the new rows themselves, written over the servers'."""
        pushes = []
        for s, (server, rows) in enumerate(zip(self.servers, pulled)):
            if len(rows) == 0:
                continue
            if self.token_path:  # its document rows, one block per server, copied once where the call takes them
                (_, name, where, _), = (b for b in batch.blocks(s) if b[2].stop > b[2].start)
                pushes.append((server, batch.request(s), client.stage(local[name][where], self.servers), label, True))
                continue
            delta = np.empty_like(rows)
            at = 0
            for table, name, where, own in batch.blocks(s):
                n = where.stop - where.start
                np.subtract(local[name][where], rows[at:at + n], out=delta[at:at + n])
                weights = batch.push_weights.get(table)
                if weights is not None:
                    delta[at:at + n] *= weights[own, None]
                at += n
            pushes.append((server, batch.request(s), delta, label, False))
        return pushes
