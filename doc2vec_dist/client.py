"""How a worker calls the parameter servers: Ray actors, or ParameterServer objects in this process;
and ParameterClient, a worker's whole side of them (routing, compact layout, pulls, pushes, resident rows).

Changes when how a worker talks to the servers changes (routing, layout, pulls, pushes, resident rows).

A worker calls `server.pull.remote(request)` and `server.push.remote(...)` and waits with `get`. On a
cluster the servers are Ray actor handles (or their names, looked up here). Without Ray, e.g. to
measure one worker on a GPU machine that has no Ray (benchmarks/feed_rate.py --no-ray), they are
`LocalServer`s: a ParameterServer object whose calls run, one at a time as an actor's would, on a
thread of its own, so that pulls and pushes still overlap the worker's compute. Ray is imported only
where a Ray handle is met.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import precision
from .sampling import unique_rows
from .sharding import Routing


class _Method:
    def __init__(self, pool: ThreadPoolExecutor, fn):
        self._pool, self._fn = pool, fn

    def remote(self, *args, **kwargs) -> Future:
        return self._pool.submit(self._fn, *args, **kwargs)


class LocalServer:
    """A ParameterServer in this process, called like its actor handle (pull, push, save, info)."""

    def __init__(self, server):
        self.server = server
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ps{server.shard}")
        for name in ("pull", "push", "save", "info"):
            setattr(self, name, _Method(self._pool, getattr(server, name)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def connect(servers: list) -> list:
    """The servers as handles: a name is looked up among Ray's named actors; handles and LocalServer objects
    are used as they are."""
    if any(isinstance(s, str) for s in servers):
        import ray

        return [ray.get_actor(s) if isinstance(s, str) else s for s in servers]
    return list(servers)


def get(refs):
    """The value of one call, or of a list of calls, in order (an error a call raised is raised here)."""
    if isinstance(refs, Future):
        return refs.result()
    if isinstance(refs, list) and all(isinstance(r, Future) for r in refs):
        return [r.result() for r in refs]
    import ray

    return ray.get(refs)


def wait_oldest(inflight: list, limit: int) -> list:
    """Wait for the oldest calls until at most `limit` are left in flight; returns those."""
    if len(inflight) <= limit:
        return inflight
    get(inflight[:len(inflight) - limit])
    return inflight[len(inflight) - limit:]


def stage(rows, servers: list):
    """A copy of `rows` that a later call may carry while the worker reuses its buffer: in Ray's
    object store (one copy, which the call then passes by reference), or a plain copy for a LocalServer."""
    if servers and isinstance(servers[0], LocalServer):
        return rows.copy()
    import ray

    return ray.put(rows)


# -- a worker's side of the servers: routing, the compact layout, pulls, pushes, resident rows ----------------

# What a worker's counters split its traffic with the servers into (bytes, as the arrays carry them: a
# 16-bit --dtype's rows count 2 bytes a value):
# the rows of its macro-batches (documents', and URLs' where they are shared), the resident rows
# (the block it holds, or --cache-rows) pulled and pushed whole, and on the block schedule the block
# handed straight to its next holder at a round's end (ParameterClient.hand_over; the servers' copy is
# written only at the epoch's end, or at a checkpoint taken while it is handed: resident_pushed).
TRAFFIC = ("pulled", "pushed", "resident_pulled", "resident_pushed", "handed")

# With several workers, each trains its own copy of the resident (--cache-rows) rows; they meet at the
# servers this often (in macro-batches), as well as at checkpoints and epoch ends
CACHE_SYNC_BATCHES = 8
# ... where the deltas of a resident row add up to at most this many workers' worth (ParameterClient.sync)
RESIDENT_OVERSHOOT = 2.0


def overlap_weights(uses: np.ndarray, workers: int) -> np.ndarray:
    """Weight of the delta of each row a worker used `uses` times, when `workers` workers train the
    same rows from the same start: 1 / (1 + (W − 1)(1 − e^(−uses))).

    A row used c times by this worker is, with the others drawing from the same distribution, also
    in each of their deltas with probability ≈ 1 − e^(−c). Hot rows are in all W, whose deltas point
    the same way: summed, they overshoot W-fold, so each counts 1/W. Rare rows (c ≈ 0, one worker)
    count whole. Measured in docs/shared-rows.md.
    """
    return 1.0 / (1.0 + (workers - 1) * -np.expm1(-np.asarray(uses, dtype=np.float32)))


RESIDENT_CALL_BYTES = 64 << 20  # resident rows move in calls of at most this much (the object store is small)


@dataclass
class Held:
    """Rows a worker keeps resident (ascending global ids), and how they split over the servers:
    `order[k]` is the row at place k of the by-server layout. With `grouped` the worker keeps them in
    that layout (the row of ids[j] at route.position[j]), so a push reads and a pull fills one slice
    per server with no reordering; else in id order."""

    ids: np.ndarray
    route: Routing
    order: np.ndarray
    grouped: bool = False

    @classmethod
    def of(cls, ids: np.ndarray, num_shards: int, grouped: bool = False) -> Held:
        ids = np.asarray(ids, dtype=np.int64)
        route = Routing.of(ids, max(num_shards, 1))
        order = np.empty(len(ids), dtype=np.int64)
        order[route.position] = np.arange(len(ids))
        return cls(ids, route, order, grouped)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Where the worker keeps the rows of `ids` (each one of self.ids)."""
        at = np.searchsorted(self.ids, ids)
        return self.route.position[at] if self.grouped else at

    def pieces(self, shard: int, row_bytes: int):
        """(lo, hi) places of server `shard`'s rows, in pieces of at most RESIDENT_CALL_BYTES."""
        lo, hi = int(self.route.bounds[shard]), int(self.route.bounds[shard + 1])
        step = max(1, RESIDENT_CALL_BYTES // max(row_bytes, 1))
        for a in range(lo, hi, step):
            yield a, min(hi, a + step)


@dataclass
class Layout:
    """Where one macro-batch's rows sit in the worker's compact matrices, and which server holds each.

    The compact local matrices are `inputs` (the resident `words` rows, if any, then the batch's `docs`
    rows, then its `words` rows) and `outputs` (the resident `words_out` rows, then the batch's);
    within each table's block, rows are grouped by server so a pull fills, and a push reads, one
    contiguous slice per server.
    """

    routes: dict[str, Routing]   # table → its unique pulled rows' routing, in pull order
    cached: int = 0              # `outputs` begins with the worker's resident rows 0..cached-1 of words_out
    inputs_head: int = 0         # `inputs` begins with its resident `words` rows (the token path, words trained)
    push_weights: dict = field(default_factory=dict)  # table → weight of each compact row's delta, or None

    def request(self, shard: int) -> dict[str, np.ndarray]:
        """Local rows of every table on one server: what is pulled from it and pushed back to it."""
        return {name: route.local[shard] for name, route in self.routes.items()}

    def blocks(self, shard: int):
        """(table, compact matrix name, slice of it, slice of the table's own compact rows) for each
        table's rows on one server, in request order."""
        base = self.inputs_head
        for name, route in self.routes.items():
            own = slice(int(route.bounds[shard]), int(route.bounds[shard + 1]))
            if name == "words_out":  # after the resident rows, which are neither pulled nor pushed
                yield name, "outputs", slice(self.cached + own.start, self.cached + own.stop), own
            else:  # docs then words share `inputs`
                yield name, "inputs", slice(base + own.start, base + own.stop), own
                base += int(route.bounds[-1])

    def sizes(self) -> dict[str, int]:
        return {"inputs": self.inputs_head + sum(int(r.bounds[-1]) for n, r in self.routes.items()
                                                 if n != "words_out"),
                "outputs": self.cached + int(self.routes["words_out"].bounds[-1])}


def send_pushes(pushes: list[tuple], inflight: list, limit: int) -> list:
    """Send (server, request, rows, label, assign) pushes, then wait until at most `limit` are in
    flight, the oldest first; returns those still in flight. A push a server refused (non-finite
    values) raises here, naming its step."""
    inflight = inflight + [server.push.remote(request, rows, label, assign)
                           for server, request, rows, label, assign in pushes]
    return wait_oldest(inflight, limit)


class Pusher:
    """A worker's pushes, sent from a thread of their own while the next macro-batch computes.

    Used where a worker writes every row it trains alone (the token path: one worker, every URL row
    resident, and each macro-batch's document rows its own): no later pull of this epoch reads the
    rows a push carries, so sending it late changes nothing but the time. At most `limit` pushes are
    in flight, the oldest awaited first; a push a server refused (non-finite values) is raised on the
    worker's own thread at its next submit or drain. On the 200k corpus the pushes' Ray calls and
    waits were 11% of the worker's time, with both kernel threads idle meanwhile.
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
                    get(inflight)
                    inflight = []
                    continue
                inflight = send_pushes(item, inflight, self.limit)
            except Exception as exc:  # noqa: BLE001 (kept for the worker's thread, which raises it)
                self.error, inflight = exc, []
            finally:
                if isinstance(item, threading.Event):
                    item.set()


class ParameterClient:
    """One worker's side of the parameter servers: it routes a macro-batch's rows to the servers and
    lays them out compactly, pulls and pushes them, weights the pushed deltas, and keeps the resident
    rows in step with the servers. The worker owns the matrices (on its device) and the math; this
    owns every call to a server.

    Resident rows are rows 0..resident-1 of words_out (ids are by frequency, so the hottest; --cache-rows)
    and, on the token path where words are trained, of words too. They live in the worker's matrices
    between macro-batches, which `read(table)` and `write(table, rows)` give in id order.
    """

    def __init__(self, servers: list, table_rows: dict[str, int], *, workers: int, resident: int,
                 resident_tables: tuple[str, ...] = ("words_out",), sole_writer: bool = False,
                 max_inflight_pushes: int = 2, row_bytes: int = 0, dtype: str = "float32", dim: int = 0,
                 key: tuple[int, ...] = (0,), rounding: str = "stochastic"):
        """row_bytes: the bytes of one row as pulled and pushed (its dim in `dtype`, its optimiser state
        float32), for the traffic counters. dtype, dim: the servers' tables hold rows of `dim` values
        of `dtype` (precision.py), which this widens to float32 as they arrive and narrows as they
        leave; with a 16-bit dtype and stochastic `rounding`, push k draws from precision.rng_of(*key, k)
        (key: the run's seed and the worker), so a run narrows the same way each time."""
        self.servers = connect(servers)
        self.row_bytes = row_bytes
        self.dtype, self.dim, self.key, self.rounding = dtype, dim, tuple(key), rounding
        self.narrowed = 0  # pushes narrowed so far: the key of the next one's rounding
        self.num_shards = len(self.servers)
        self.table_rows, self.workers = table_rows, workers
        # a sole writer (the token path) pushes each batch's rows as they are, from a thread of its own
        self.sole_writer = sole_writer
        self.limit = max_inflight_pushes * self.num_shards
        self.pusher = Pusher(self.limit) if sole_writer else None
        self.inflight: list = []
        self.resident, self.resident_tables = resident, resident_tables
        self.urls = Held.of(np.arange(resident, dtype=np.int64), self.num_shards)  # the resident URL rows
        self.docs: Held | None = None  # the block schedule's resident document rows (hold_documents)
        self.docs_held = False  # whether they were pulled
        self.docs_dirty = False  # whether they were trained since their last push
        self.base: np.ndarray | None = None  # the resident words_out rows as last pulled (shared rows)
        self.held = False  # the sole writer: whether the resident rows were pulled (see sync)
        self.uses = np.zeros(resident, dtype=np.int64)  # times each was used since then
        self.batches_since_sync = 0
        self.traffic = dict.fromkeys(TRAFFIC, 0)  # bytes moved, by kind (the worker resets it)
        # the block schedule's handover (hand_over): the block this worker last handed on, {table: rows as
        # the servers store them}, until its next round holds another; the servers' copy is older
        self.handed: dict[str, np.ndarray] | None = None
        # ... and whether the block it holds is newer than the servers' copy without its having trained
        # (taken over): its next push writes it, trained or not
        self.taken = False

    def hold(self, ids: np.ndarray) -> None:
        """Make the rows `ids` (ascending) of words_out the resident rows: the block a sole writer holds
        on the block schedule (schedule.py). The next sync pulls them."""
        self.resident = len(ids)
        self.urls = Held.of(ids, self.num_shards)
        self.held = self.taken = False
        self.handed = None  # its next holder has it by now (every round starts after the last one ended)
        self.batches_since_sync = 0

    def hold_documents(self, ids: np.ndarray) -> None:
        """Keep the document rows `ids` (ascending: every document this worker reads, or a partition of
        them) resident too, the head of `inputs` after any words rows: pulled at the next sync, written
        back by syncs with docs=True (checkpoints, the run's end) or write_documents, never pulled or
        pushed by a macro-batch. Kept grouped by server: the push of a worker's documents is then
        slices, not a reordering of all of them (on the 200k corpus most of the time the other worker
        waited for at the epoch's end)."""
        self.docs = Held.of(ids, self.num_shards, grouped=True)
        self.docs_held = self.docs_dirty = False

    def release(self) -> None:
        """The resident rows, pushed home, are no longer this worker's: the next sync pulls afresh."""
        self.held = False

    # -- the block handed from worker to worker (the block schedule) -------------------------------------
    def hand_over(self, read, label: str) -> dict:
        """The end of a round: the held block's rows, as a push would carry them (in the servers' order,
        narrowed to their dtype), put in the object store once, whole (one put: no server's call carries
        them), for the next holder, who starts from them. The servers' copy is not written: a round's
        end costs the put and the next holder's get, no server's apply (docs/benchmarks.md, "Blocks
        handed from worker to worker"). The epoch's last round sends every block home, and a checkpoint
        taken before the next round starts writes it (write_handed). Where this worker dies before its
        next holder has the rows, that holder trains from the servers' copy: the last checkpoint's, or
        the epoch's start's. Non-finite rows stop the run here, as a server refuses them in a push
        (ps.NonFiniteUpdate). Returns what the driver passes on: {"rows": {table: rows or their ref}}."""
        from .ps import refuse_non_finite  # (ps imports numba; a worker has it loaded by now)

        rows_of, self.handed = {}, {}
        for table in self.resident_tables:
            rows = read(table)
            refuse_non_finite(rows, f"{label} (the block handed over)")
            rows = self.handed[table] = self._outgoing(table, rows, "handed")
            rows_of[table] = stage(rows, self.servers)
        self.batches_since_sync = 0
        return {"rows": rows_of}

    def write_handed(self, label: str) -> None:
        """Write the block this worker handed over to the servers, and wait until they applied it: a
        checkpoint taken between its rounds by a driver that runs them one after another (its next
        holder has not started). Nothing once its next round holds another block."""
        handed, self.handed = self.handed, None
        if handed:
            self.write_block(self.urls.ids, handed, label)

    def write_block(self, ids: np.ndarray, rows_of: dict, label: str) -> None:
        """Write a block handed on (hand_over's rows, or their refs) that its next holder has not taken,
        over the servers' copy, and wait until they applied it: a checkpoint taken while it waits
        (peers.Outbox). ids: the block's global ids, ascending."""
        held = Held.of(ids, self.num_shards)
        for table, rows in rows_of.items():
            rows = rows if isinstance(rows, np.ndarray) else get(rows)
            self.traffic["resident_pushed"] += rows.nbytes
            get(self._push_pieces(table, self._pieces(table, rows, held), f"{label} (resident rows)", assign=True,
                                  held=held))

    def take_over(self, handed: dict, write, into=None) -> bool:
        """Hold the block another worker handed over (hand_over): its rows, widened and put in this
        worker's layout (`write`, or straight into `into(table)`) as a pull would. False where the rows
        are gone (the worker that put them died): the next sync pulls the servers' copy."""
        try:
            arrived = {table: rows if isinstance(rows, np.ndarray) else get(rows) for table, rows in handed["rows"].items()}
        except Exception:  # noqa: BLE001 (Ray's ObjectLostError and kin: the servers' copy is the one left)
            return False
        self.taken = True
        for table, whole in arrived.items():
            out = into(table) if into is not None else None
            rows = self._placed(self._held(table), [(None, 0, len(whole), whole)], out)
            if out is None:
                write(table, rows)
        self.held = True
        return True

    # -- the compact layout -----------------------------------------------------------------------------
    def token_layout(self, doc_ids: np.ndarray) -> tuple[Layout, np.ndarray]:
        """The token path's layout: the chunk's documents' rows, every URL row it trains resident; and
        each document's row in `inputs`. Resident documents (hold_documents) are pulled with none."""
        words_head = self.resident if "words" in self.resident_tables else 0
        none = Routing.of(np.zeros(0, np.int64), self.num_shards)
        if self.docs is not None:  # rows words_head.. of `inputs`, grouped by server
            return (Layout(routes={"docs": none, "words_out": none}, cached=self.resident,
                           inputs_head=words_head + len(self.docs.ids)),
                    words_head + self.docs.rows_of(doc_ids))
        route = Routing.of(doc_ids.astype(np.int64), self.num_shards)  # sorted, unique
        return (Layout(routes={"docs": route, "words_out": none}, cached=self.resident, inputs_head=words_head),
                words_head + route.position)

    def example_layout(self, doc_ids: np.ndarray, ex) -> tuple[Layout, np.ndarray, np.ndarray, np.ndarray]:
        """The layout of a host-built macro-batch (sampling.Examples) and its examples' compact positions:
        (layout, ctx_pos [n, c] in `inputs`, target_pos [n] and neg_pos in `outputs`)."""
        routes = {"docs": Routing.of(doc_ids.astype(np.int64), self.num_shards)}  # sorted, unique
        weights: dict[str, np.ndarray | None] = {}
        flat = ex.ctx.reshape(-1)
        ctx_pos = routes["docs"].position[np.minimum(flat, ex.n_docs - 1)]
        if "words" in self.table_rows:  # words used as inputs: ids past n_docs in the examples
            is_word = flat >= ex.n_docs
            uniq, inverse = unique_rows(flat[is_word] - ex.n_docs, self.table_rows["words"])
            routes["words"] = Routing.of(uniq, self.num_shards)
            ctx_pos[is_word] = len(doc_ids) + routes["words"].position[inverse]
            weights["words"] = self.push_weights(routes["words"], inverse, len(uniq))
        uniq, inverse = unique_rows(np.concatenate([ex.target, ex.neg.reshape(-1)]), self.table_rows["words_out"])
        hot = int(np.searchsorted(uniq, self.resident))  # uniq is sorted: its resident rows come first
        routes["words_out"] = Routing.of(uniq[hot:], self.num_shards)
        weights["words_out"] = self.push_weights(routes["words_out"], inverse, len(uniq))
        # compact place of each unique row: resident row r at r, the others after the resident rows
        place = np.concatenate([uniq[:hot], self.resident + routes["words_out"].position])
        compact = place[inverse]
        n = len(ex)
        layout = Layout(routes=routes, cached=self.resident, push_weights=weights)
        return layout, ctx_pos.reshape(ex.ctx.shape), compact[:n], compact[n:].reshape(ex.neg.shape)

    def push_weights(self, route: Routing, inverse: np.ndarray, n_unique: int) -> np.ndarray | None:
        """Weight of each shared row's pushed delta, in compact order: overlap_weights of its uses, so
        W workers' deltas of a hot row sum to about one step, not W (docs/shared-rows.md#push-weights);
        only when `words` is trained, since plain PV-DBOW's summed deltas were stable."""
        if self.workers <= 1 or "words" not in self.table_rows:
            return None
        weights = np.empty(n_unique, dtype=np.float32)
        weights[route.position] = overlap_weights(np.bincount(inverse, minlength=n_unique), self.workers)
        return weights

    # -- pull and push ----------------------------------------------------------------------------------
    def pull(self, layout: Layout) -> list:
        """One pull per server for the batch's rows of every table; the results arrive later (get)."""
        rows = sum(int(r.bounds[-1]) for r in layout.routes.values())
        if not rows:  # every row it trains is resident
            return []
        self.traffic["pulled"] += rows * self.row_bytes
        return [server.pull.remote(layout.request(s)) for s, server in enumerate(self.servers)]

    def fill(self, layout: Layout, pulled: list[np.ndarray], local: dict[str, np.ndarray]) -> None:
        """Copy the pulled rows (read-only, zero-copy from the object store) into the compact matrices,
        widened to float32 from a 16-bit dtype."""
        for s, rows in enumerate(pulled):
            at = 0
            for _, name, where, _ in layout.blocks(s):
                n = where.stop - where.start
                precision.widen_rows(rows[at:at + n], self.dtype, self.dim, out=local[name][where])
                at += n

    def _narrow(self, rows: np.ndarray) -> np.ndarray:
        """float32 rows (new rows, or deltas) as the servers' dtype carries them: `rows` itself for
        float32; else narrowed, stochastically from this worker's next Generator unless --rounding nearest."""
        if self.dtype == "float32":
            return rows
        rng = precision.rng_of(*self.key, self.narrowed) if self.rounding == "stochastic" else None
        self.narrowed += 1
        return precision.narrow_rows(rows, self.dtype, self.dim, rng)

    def push(self, layout: Layout, pulled: list[np.ndarray], local: dict[str, np.ndarray], label: str) -> None:
        """Push what the batch trained, one call per server it pulled from: new − pulled, weighted
        where several workers' deltas of a row overlap; a sole writer, whose rows no one else writes,
        the new rows themselves, written over the servers', from its pushing thread."""
        pushes = []
        for s, (server, rows) in enumerate(zip(self.servers, pulled)):
            if len(rows) == 0:
                continue
            self.traffic["pushed"] += rows.nbytes
            if self.sole_writer:  # its document rows, one block per server, copied once where the call takes them
                (_, name, where, _), = (b for b in layout.blocks(s) if b[2].stop > b[2].start)
                rows = self._narrow(local[name][where])
                # float32 rows are the buffer the next batch reuses: copied here, before it does; 16-bit
                # rows are already a copy of their own, which the pusher's thread puts in the object store
                # while this one goes on (the narrowing is then all the 16 bits cost this thread)
                pushes.append((server, layout.request(s), stage(rows, self.servers) if self.dtype == "float32" or
                               self.pusher is None else rows, label, True))
                continue
            rows = precision.widen_rows(rows, self.dtype, self.dim)
            delta = np.empty_like(rows)
            at = 0
            for table, name, where, own in layout.blocks(s):
                n = where.stop - where.start
                np.subtract(local[name][where], rows[at:at + n], out=delta[at:at + n])
                weights = layout.push_weights.get(table)
                if weights is not None:
                    delta[at:at + n] *= weights[own, None]
                at += n
            pushes.append((server, layout.request(s), self._narrow(delta), label, False))
        if self.pusher is not None:  # sent from its own thread while the next batch computes
            self.pusher.submit(pushes)
        else:
            self.inflight = send_pushes(pushes, self.inflight, self.limit)

    def drain(self) -> None:
        """Wait until every push is applied (a refused one raises here)."""
        if self.pusher is not None:
            self.pusher.drain()
        inflight, self.inflight = self.inflight, []
        get(inflight)

    # -- resident rows ----------------------------------------------------------------------------------
    def count_uses(self, target_pos: np.ndarray, neg_pos: np.ndarray) -> None:
        """Count a batch's uses of the resident rows (for the weights of their next push; none is
        needed while their deltas sum to at most RESIDENT_OVERSHOOT workers' worth)."""
        if self.resident and self.workers > RESIDENT_OVERSHOOT:
            used = np.concatenate([target_pos, neg_pos.reshape(-1)])
            self.uses += np.bincount(used[used < self.resident], minlength=self.resident)

    def trained(self) -> None:
        """One more macro-batch trained the resident rows (its documents' among them, where held)."""
        self.batches_since_sync += 1
        self.docs_dirty = self.docs_dirty or self.docs_held

    def sync_due(self) -> bool:
        """Whether several workers' resident rows are due to meet at the servers (CACHE_SYNC_BATCHES)."""
        return (bool(self.resident) and self.workers > 1 and not self.sole_writer
                and self.batches_since_sync >= CACHE_SYNC_BATCHES)

    def sync(self, read, write, label: str, push: bool = True, pull: bool = True, docs: bool = False,
             into=None, hand: bool = False) -> dict | None:
        """Exchange the resident rows with the servers: push what they learned since the last pull
        (new − pulled, like any push), then pull them afresh (other workers' updates included).
        `read(table)` gives the worker's resident rows in its layout of them (id order, or by server:
        Held.grouped), `write(table, rows)` replaces them; `into(table)`, where given, is those rows as a
        float32 array to pull straight into (None where they are not in host memory), so a sole writer's
        pulled rows are not copied twice more.

        Called at the start of an epoch (pull), every CACHE_SYNC_BATCHES macro-batches when several
        workers share the rows, before a checkpoint and at the end of an epoch (push only). Each
        worker's delta is weighted so a hot row's deltas add up to RESIDENT_OVERSHOOT workers' worth
        (docs/shared-rows.md#resident-rows).

        A sole writer's resident documents are pulled once and pushed only when `docs` asks (the
        epoch's end, checkpoints): no other worker reads them meanwhile. With `hand` (the block
        schedule's round ends) its held block is handed over (hand_over), not pushed: returns that.
        """
        if self.sole_writer:
            return self._sync_sole_writer(read, write, label, push, pull, docs, into, hand)
        if not self.resident:
            return None
        if push and self.base is not None:
            delta = read("words_out") - self.base
            if self.workers > RESIDENT_OVERSHOOT:  # else every weight is 1: the plain sum
                delta *= np.minimum(1.0, RESIDENT_OVERSHOOT * overlap_weights(self.uses, self.workers))[:, None]
            self.push_resident(delta, label, assign=False)
        self.base = None
        self.uses[:] = 0
        if pull:
            self.base = self.pull_resident("words_out")
            write("words_out", self.base)
        self.batches_since_sync = 0
        return None

    def _sync_sole_writer(self, read, write, label: str, push: bool, pull: bool, docs: bool, into=None,
                          hand: bool = False) -> dict | None:
        """sync for the token path, whose worker alone writes every URL row it holds: the push writes
        the rows over the servers' (no delta, no copy of the rows as pulled), and once pulled they are
        never pulled again while it holds them: nothing else changes them. A restarted worker starts
        without them and pulls. (On the 200k corpus the epoch's pull of the 100k rows was ~15% of a
        device worker's host time.)"""
        handed = None
        if push and self.batches_since_sync:  # trained since the last push
            self.docs_dirty = self.docs_dirty or self.docs is not None
        if push and hand and self.held and self.resident:  # the round's end: to the next holder, whatever it trained
            handed = self.hand_over(read, label)
            self.taken = False
        # a block taken over goes home at the next push that must leave the servers whole (a checkpoint's,
        # a round's end: they pull nothing), trained or not; a round's first sync leaves it in the worker
        elif push and (self.batches_since_sync or (self.taken and not pull)):
            if self.held and self.resident:
                for table in self.resident_tables:
                    self.push_resident(read(table), label, assign=True, table=table)
            self.batches_since_sync = 0
            self.taken = False
        if push and docs:
            self.write_documents(read, label)

        def pull_table(table: str) -> None:
            out = into(table) if into is not None else None
            if out is None:
                write(table, self.pull_resident(table))
            else:
                self.pull_resident(table, out=out)

        if pull and not self.held and self.resident:
            for table in self.resident_tables:
                pull_table(table)
            self.held = True
        if pull and self.docs is not None and not self.docs_held:
            pull_table("docs")
            self.docs_held = True
        return handed

    def write_documents(self, read, label: str) -> None:
        """Write the resident documents' rows back over the servers' (`read("docs")`: in the worker's
        layout of them), where trained since they were pulled or last written: a partition of them
        (hold_documents) that the worker is done with for now."""
        if self.docs_held and self.docs_dirty:
            self.push_resident(read("docs"), label, assign=True, table="docs")
            self.docs_dirty = False

    def _held(self, table: str) -> Held:
        return self.docs if table == "docs" else self.urls

    def push_resident(self, rows: np.ndarray, label: str, assign: bool, table: str = "words_out") -> None:
        """Push a table's resident rows (deltas, or with assign the rows themselves; in the worker's
        layout of them: Held.grouped) and wait until every server has applied its part, in calls of at
        most RESIDENT_CALL_BYTES."""
        rows = self._outgoing(table, rows)
        get(self._push_pieces(table, self._pieces(table, rows), f"{label} (resident rows)", assign))

    def _outgoing(self, table: str, rows: np.ndarray, kind: str = "resident_pushed") -> np.ndarray:
        """A table's resident rows (in the worker's layout) as a push carries them: in the servers'
        order, narrowed to their dtype; counted as `kind` (client.TRAFFIC)."""
        held = self._held(table)
        rows = self._narrow(rows if held.grouped else rows[held.order])
        self.traffic[kind] += rows.nbytes
        return rows

    def _pieces(self, table: str, rows: np.ndarray, held: Held | None = None) -> list[tuple]:
        """Outgoing rows (_outgoing) cut into each server's calls of at most RESIDENT_CALL_BYTES:
        [(server, lo, hi, rows[lo:hi])]. held: their rows (the table's resident ones)."""
        held = held or self._held(table)
        return [(s, lo, hi, rows[lo:hi]) for s in range(self.num_shards)
                for lo, hi in held.pieces(s, rows.shape[1] * rows.itemsize)]

    def _push_pieces(self, table: str, pieces: list[tuple], label: str, assign: bool, held: Held | None = None) -> list:
        """Send each piece (_pieces) to its server, at most `limit` calls in flight; returns the calls
        still in flight."""
        held = held or self._held(table)
        calls: list = []
        for s, lo, hi, rows in pieces:
            calls.append(self.servers[s].push.remote(
                {table: held.route.local[s][lo - held.route.bounds[s]:hi - held.route.bounds[s]]}, rows, label, assign))
            calls = wait_oldest(calls, self.limit)
        return calls

    def pull_resident(self, table: str = "words_out", out: np.ndarray | None = None) -> np.ndarray:
        """A table's resident rows as the servers hold them, in the worker's layout of them (id order,
        or by server: Held.grouped), in calls of at most RESIDENT_CALL_BYTES, widened to float32: into
        `out` where given, each call's rows put in their places as they are (float32) or once widened."""
        held = self._held(table)
        parts, at = [], []
        for s, server in enumerate(self.servers):
            for lo, hi in held.pieces(s, self.row_bytes or 1):
                parts.append(server.pull.remote({table: held.route.local[s][lo - held.route.bounds[s]:
                                                                             hi - held.route.bounds[s]]}))
                at.append((s, lo, hi))
        pulled = get(parts)
        self.traffic["resident_pulled"] += sum(rows.nbytes for rows in pulled)
        return self._placed(held, [(*where, rows) for where, rows in zip(at, pulled)], out)

    def _placed(self, held: Held, pieces: list[tuple], out: np.ndarray | None) -> np.ndarray:
        """Rows as the servers store them, in pieces [(server, lo, hi, rows)] of the by-server layout (a
        pull's, or a block's handed over), widened to float32 and put in their places in the worker's
        layout of them: into `out` where given."""
        if out is None:
            stored = pieces[0][3].shape[1] if pieces else self.row_bytes // precision.stored(self.dtype).itemsize
            out = np.empty((len(held.ids), precision.float_width(self.dtype, self.dim, stored)), dtype=np.float32)
        for _, lo, hi, rows in pieces:
            out[slice(lo, hi) if held.grouped else held.order[lo:hi]] = precision.widen_rows(rows, self.dtype, self.dim)
        return out
