"""prepare's passes, each a function of one block of the inputs (or one bucket) and the settings.

Changes when what pass 1 or 2 does to its part, or the settings every task gets (Settings), change; pass 3
is shard_pass.py's, a base (prepare --base) prepare_base.py's, and how the parts are merged, in what order,
and by whom they are run prepare_merge.py's. Every function here reads its part, writes its files under the
staging directory of the corpus (Settings.tmp) and returns a small result; none depends on another
call of it. So the runner that calls them (runners.SerialRunner: one after another in this process,
today's single-process prepare; runners.RayTasks: as Ray tasks across a cluster) does not change
what they write: the corpus is the same whichever runs it.

    lines    (text inputs of several files) a file's lines: the keys of the next file start after them
    latest   (--window-days) a block's latest event time
    count    pass 1: a block's token counts, rows, skips and what reading it noted
    spill    pass 2: a block's events (or a slice of a base) mapped to word ids, in one spill file per
             block whose record batches each hold one bucket's events, in input order
    shard    (shard_pass.py) pass 3: a bucket's events from every spill, grouped into documents, deduplicated (and, with
             a base, rid of the events it has: sent_again, counted by input block), capped, held out and
             written as shard b
             (with each token's time, given a time column), with the bucket's new documents and
             held-out pairs beside it
    renumber (shard_pass.py) a shard written before the id of its first new document was known (Ray tasks run
             buckets at once): its provisional ids made final

Memory. A task holds one input batch at a time (readers: 256k Parquet rows, 16 MiB of CSV, JSON or
text) plus, in pass 1, the counts of the block's distinct tokens; in pass 2, the vocabulary's lookup
table and at most SPILL_BUFFER_ROWS events waiting to be written; in pass 3, one bucket's events,
which prepare sizes to the memory budget (prepare_merge._choose_buckets), plus arrays of the vocabulary's
size. `task_bytes` says how much that is, and the Ray runner reserves it for each task.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import (
    CorpusError,
    shard_batches,
)
from .ids import TokenIds, hash_strings
from .prepare_base import BasePart, _base, read_mapped
from .read_files import Options
from .read_times import TimeReading
from .readers import Block, BlockState, Chunk, ReadNotes, Skips, count_lines, read_block

# Events a spill task keeps before writing them out, one record batch per bucket: fewer, larger
# batches for pass 3 to read, at a bounded cost in memory (about 40 bytes an event).
SPILL_BUFFER_ROWS = 1 << 21
# The file whose existence asks the running tasks of a stopping prepare to end (runners.RayTasks).
STOP_NAME = "stop"
# The file in which prepare leaves its run's token (Settings.run) for its tasks to find: a task on a node
# that does not see the staging directory says so in one line instead of failing on a missing path.
RUN_NAME = "prepare-run"
_SEEN: set[str] = set()  # the staging directories a task of this process has found its run's token in
# A test's hook: a directory; a pass-2 task that finds a file "once" in it (and takes it) or "always" kills
# its own process, as a machine lost mid-task would (Ray runs the task again): _fault_once.
FAULT_ENV = "DOC2VEC_DIST_PREPARE_FAULT"


# ---------------------------------------------------------------------------------------------------
# A base (prepare --base): an earlier corpus or model whose users and URLs keep their ids
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# The settings every task gets
# ---------------------------------------------------------------------------------------------------

class Stopped(Exception):
    """A task of a prepare that was asked to stop (Settings.go_on)."""


@dataclass(frozen=True)
class Settings:
    """What every pass needs to know besides its part: small, so that it travels with each task."""

    opt: Options
    tmp: str                              # the corpus's staging directory (spill/ and parts/ inside)
    window_start: float | None = None     # --window-days: events before it are left out
    buckets: int = 1
    holdout: float = 0.0
    seed: int = 1
    base: str | None = None               # the base's path (--base)
    join: bool = True                     # a base's documents are joined (not --window-days)
    by_shard: bool = False                # joined shard by shard: bucket b is base shard b (_joined)
    base_rows: bool = False               # the spills carry a base column (a base re-bucketed with the events)
    max_tokens_per_doc: int | None = None  # a document keeps its last N tokens (--max-tokens-per-doc)
    run: str = ""                         # the token prepare wrote to tmp/RUN_NAME ("": not checked)
    forget: str | None = None             # a forget list (forgotten.py) whose users' events are left out
    empty_keys: bool = False              # keep the keys of documents left with no token (EMPTY_KEYS; infer)

    @property
    def has_time(self) -> bool:
        return self.opt.time_col is not None

    @property
    def spill_dir(self) -> str:
        return os.path.join(self.tmp, "spill")

    @property
    def parts_dir(self) -> str:
        return os.path.join(self.tmp, "parts")

    def spill_schema(self) -> pa.Schema:
        # with a base: a time for every event (a base's own tokens at theirs, or before the new events: -inf),
        # the input block each event came from (-1: a base's token), so that pass 3 counts the events the base
        # has file by file, and the base id of the document each row belongs to (-1: a new event)
        timed = self.has_time or self.base_rows
        return pa.schema([("key", pa.string()), ("token", pa.int32())]
                         + ([("time", pa.float64())] if timed else [])
                         + ([("block", pa.int32())] if self.base is not None else [])
                         + ([("base", pa.int64())] if self.base_rows else []))

    def stop_path(self) -> str:
        return os.path.join(self.tmp, STOP_NAME)

    def go_on(self) -> None:
        """Raise Stopped once prepare has asked its tasks to stop (an error elsewhere, Ctrl-C): checked
        between batches, so that a task ends within a batch of the request and writes nothing after."""
        if os.path.exists(self.stop_path()):
            raise Stopped(f"{self.tmp}: prepare stopped")
        if self.run and self.tmp not in _SEEN:
            self.check_seen()

    def check_seen(self) -> None:
        """Raise a one-line CorpusError when this process does not find the run's token in the staging
        directory: a task on a node of the cluster that does not see the output's storage."""
        try:
            with open(os.path.join(self.tmp, RUN_NAME)) as fh:
                found = fh.read()
        except OSError:
            found = None
        if found != self.run:
            raise CorpusError(f"{self.tmp}: prepare's staging directory is not on node {socket.gethostname()}, "
                              "where one of its tasks ran: through Ray on several nodes, --out (where the passes "
                              "write) and the inputs must be on storage every node sees (NFS or another shared mount)")
        _SEEN.add(self.tmp)

    def vocab_path(self) -> str:
        """The vocabulary's tokens in id order, written after pass 1 for passes 2 and 3 to read."""
        return os.path.join(self.parts_dir, "tokens.arrow")


def windowed(chunk: Chunk, s: Settings, path: str, skips: Skips | None = None) -> Chunk:
    """The chunk with the events before the window's start (or without a time) left out."""
    if s.window_start is None:
        return chunk
    inside = chunk.time >= s.window_start  # NaN (no time) is outside
    if inside.all():
        return chunk
    if skips is not None:
        skips.add("events_outside_window", int(np.count_nonzero(~inside)), path)
    mask = pa.array(inside)
    return Chunk(chunk.key.filter(mask), chunk.token.filter(mask), chunk.time[inside], chunk.rows, chunk.padding)


@functools.lru_cache(maxsize=1)
def _forget_list(path: str):
    """The forget list prepare staged for its tasks, read once per process."""
    from .forgotten import ForgetList

    return ForgetList.read(path)


def unforgotten(chunk: Chunk, s: Settings, path: str, skips: Skips | None = None, users: set | None = None) -> Chunk:
    """The chunk without the events of users on the base's forget list (prepare --base), counted in `skips`
    and their keys gathered in `users` (for their number; never written)."""
    if s.forget is None or not len(chunk.key):
        return chunk
    listed = _forget_list(s.forget).matches(chunk.key)
    if not listed.any():
        return chunk
    if skips is not None:
        skips.add("events_of_forgotten_users", int(listed.sum()), path)
    if users is not None:
        users.update(chunk.key.filter(pa.array(listed)).to_pylist())
    mask = pa.array(~listed)
    return Chunk(chunk.key.filter(mask), chunk.token.filter(mask), chunk.time[~listed] if chunk.time is not None
                 else None, chunk.rows, chunk.padding)


# ---------------------------------------------------------------------------------------------------
# Before pass 1: text files' lines, --window-days's latest time
# ---------------------------------------------------------------------------------------------------

def lines(block: Block) -> int:
    """A text file's lines (readers.count_lines)."""
    return count_lines(block)


@dataclass
class Read:
    """What reading a block found besides its events: prepare checks the readings of every block in
    input order, then raises the first block's error (readings before an error were made first)."""

    rows: int = 0
    readings: list[TimeReading] = field(default_factory=list)
    unit: str | None = None          # of the file's numeric times after the block
    error: CorpusError | None = None


def _reading(state: BlockState, error: CorpusError | None = None) -> dict:
    return {"rows": state.rows, "readings": state.readings, "unit": state.unit, "error": error}


@dataclass
class Latest(Read):
    latest: float = -np.inf


def latest(block: Block, s: Settings, tick=None) -> Latest:
    """The latest event time of a block (for --window-days), -inf when none has one."""
    state, found = BlockState(block.unit), -np.inf
    try:
        for chunk in read_block(block, s.opt, state):
            s.go_on()
            chunk = unforgotten(chunk, s, block.path)
            if chunk.time is not None and len(chunk.time) and np.isfinite(chunk.time).any():
                found = max(found, float(np.nanmax(chunk.time)))
            if tick:
                tick(chunk.rows)
    except CorpusError as e:
        return Latest(**_reading(state, e))
    return Latest(**_reading(state), latest=found)


# ---------------------------------------------------------------------------------------------------
# Pass 1: counts
# ---------------------------------------------------------------------------------------------------

class TokenCounter:
    """Merges value_counts (of batches, or of blocks' counts). The vocabulary fits in memory; the
    events need not."""

    def __init__(self):
        self.parts: list[pa.Table] = []
        self.pending_rows = 0
        self.merged_rows = 0

    def add(self, tokens: pa.Array) -> None:
        if len(tokens) == 0:
            return
        vc = pc.value_counts(tokens)
        self.add_counts(pa.table({"token": vc.field("values"), "count": vc.field("counts")}))

    def add_counts(self, table: pa.Table) -> None:
        """Add a table of (token, count)."""
        if table.num_rows == 0:
            return
        self.parts.append(table)
        self.pending_rows += table.num_rows
        # Merge once the pending parts outgrow the merged table: amortised linear time.
        if self.pending_rows > max(1 << 20, self.merged_rows):
            self._merge()

    def _merge(self) -> None:
        table = pa.concat_tables(self.parts)
        if len(self.parts) > 1:
            table = table.group_by("token").aggregate([("count", "sum")]).rename_columns(["token", "count"])
        self.parts = [table]
        self.merged_rows = table.num_rows
        self.pending_rows = 0

    def table(self) -> pa.Table:
        if not self.parts:
            return pa.table({"token": pa.array([], pa.string()), "count": pa.array([], pa.int64())})
        self._merge()
        return self.parts[0].select(["token", "count"]).cast(pa.schema([("token", pa.string()),
                                                                        ("count", pa.int64())]))


@dataclass
class Counted(Read):
    """Pass 1 of one block."""

    events: int = 0
    key_bytes: int = 0
    null_tokens: int = 0
    empty_tokens: int = 0
    skips: Skips = field(default_factory=Skips)
    notes: ReadNotes = field(default_factory=ReadNotes)
    counts: pa.Table | None = None  # token, count of the block's non-empty tokens
    forgotten_users: set = field(default_factory=set)  # keys of the forget list's users met (counted, not kept)


def count(block: Block, s: Settings, tick=None) -> Counted:
    """Pass 1 of a block: its rows, events, key bytes and token counts, what it skipped and noted."""
    state, skips, notes, counter = BlockState(block.unit), Skips(), ReadNotes(), TokenCounter()
    events = key_bytes = null_tokens = empty_tokens = 0
    forgotten_users: set[str] = set()
    try:
        for chunk in read_block(block, s.opt, state, skips, notes):
            s.go_on()
            chunk = windowed(chunk, s, block.path, skips)
            chunk = unforgotten(chunk, s, block.path, skips, forgotten_users)
            events += len(chunk.token)
            key_bytes += pc.sum(pc.binary_length(chunk.key)).as_py() or 0
            tokens = chunk.token.drop_null()
            null_tokens += chunk.token.null_count - chunk.padding
            nonempty = pc.greater(pc.binary_length(tokens), 0)
            empty_tokens += len(tokens) - (pc.sum(nonempty).as_py() or 0)
            counter.add(tokens.filter(nonempty))
            if tick:
                tick(chunk.rows)
    except CorpusError as e:
        return Counted(**_reading(state, e), skips=skips, notes=notes)
    return Counted(**_reading(state), events=events, key_bytes=key_bytes, null_tokens=null_tokens,
                   empty_tokens=empty_tokens, skips=skips, notes=notes, counts=counter.table(),
                   forgotten_users=forgotten_users)


# ---------------------------------------------------------------------------------------------------
# Pass 2: events → a spill file per block, a record batch per bucket
# ---------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _token_ids(path: str) -> TokenIds:
    """The vocabulary's lookup table, built once per process (a Ray worker runs many spill tasks)."""
    return TokenIds(read_mapped(path).column("token").combine_chunks())


@dataclass
class Spilled:
    """Pass 2 of one block: its spill file, and the bucket of each of its record batches."""

    path: str
    buckets: np.ndarray
    rows: int = 0


def keep_mask(key: pa.Array, ids: np.ndarray) -> np.ndarray:
    """Rows worth spilling: every in-vocabulary event, plus the first row of each key in this batch, so
    that pass 3 knows every document (and can report one left empty) and where it first appears in the
    input (its place among the bucket's documents), wherever the batches begin: the Ray Data runner's
    blocks begin elsewhere than the files' batches that the Ray tasks read."""
    keep = ids >= 0
    if keep.all():
        return keep
    _, first = np.unique(pc.dictionary_encode(key).indices.to_numpy(), return_index=True)
    keep[first] = True
    return keep


def spill_path(s: Settings, index: int) -> str:
    return os.path.join(s.spill_dir, f"block-{index:06d}.arrow")


def spill(part: Block | BasePart, index: int, s: Settings, tick=None) -> Spilled:
    """Pass 2 of a block of the inputs, or of a part of a base: its events with word ids, hashed by key
    into s.buckets buckets, written to spill file `index` (input order kept within each bucket)."""
    _fault_once(s)
    return write_spill(spill_path(s, index), _spill_batches(part, s, s.spill_schema(), tick), s)


def write_spill(path: str, events, s: Settings) -> Spilled:
    """(record batch, input rows it covers) of pass 2, in input order, hashed by key into s.buckets buckets
    and written to the spill file `path`, a record batch per bucket (input order kept within each)."""
    schema = s.spill_schema()
    pending: list[list[pa.RecordBatch]] = [[] for _ in range(s.buckets)]
    held = 0
    written: list[int] = []
    rows = 0
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        def flush() -> None:
            for b, batches in enumerate(pending):
                if batches:
                    writer.write_batch(pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0])
                    written.append(b)
                    batches.clear()

        for batch, n in events:
            s.go_on()
            rows += n
            if batch.num_rows == 0:
                continue
            if s.buckets == 1:
                pending[0].append(batch)
            else:
                # Hash each distinct key once; a stable sort by bucket keeps input order inside one.
                encoded = pc.dictionary_encode(batch.column(0))
                bucket = (hash_strings(encoded.dictionary) % np.uint64(s.buckets)).astype(np.int64)
                bucket = bucket[encoded.indices.to_numpy()]
                order = np.argsort(bucket, kind="stable")
                bounds = np.searchsorted(bucket[order], np.arange(s.buckets + 1))
                batch = batch.take(pa.array(order))
                for b in np.flatnonzero(np.diff(bounds)):
                    pending[b].append(batch.slice(bounds[b], bounds[b + 1] - bounds[b]))
            held += batch.num_rows
            if held >= SPILL_BUFFER_ROWS:
                flush()
                held = 0
        flush()
    return Spilled(path, np.array(written, np.int32), rows)


def _spill_batches(part: Block | BasePart, s: Settings, schema: pa.Schema, tick):
    """(record batch, input rows it covers) of the events a part spills."""
    if isinstance(part, BasePart):
        base = _base(s.base, s.join)
        if part.what == "docs":
            docs = base.docs.slice(part.start, part.stop - part.start)
            for batch in docs.to_batches():
                yield pa.RecordBatch.from_arrays(
                    [batch.column(0), pa.array(np.full(batch.num_rows, -1, np.int32)),
                     pa.array(np.full(batch.num_rows, -np.inf)), _no_block(batch.num_rows), batch.column(1)],
                    schema=schema), 0
        else:
            keys = base.docs.column("key")
            for doc_ids, offsets, tokens, times in shard_batches(base.corpus.shard_paths[part.start]):
                docs = np.repeat(doc_ids, np.diff(offsets))
                # with a time column, the base's tokens at their times (those it was never told: -inf, first);
                # without one, all first, before the inputs' events
                if times is None or not s.has_time:
                    times = np.full(len(tokens), -np.inf)
                yield pa.RecordBatch.from_arrays(
                    [keys.take(pa.array(docs)).combine_chunks(), pa.array(tokens, pa.int32()),
                     pa.array(times, pa.float64()), _no_block(len(tokens)), pa.array(docs)], schema=schema), 0
        return
    for chunk in read_block(part, s.opt, BlockState(part.unit)):
        if tick:
            tick(chunk.rows)
        yield mapped(chunk, part.path, s, schema, part.index), chunk.rows


def _no_block(n: int) -> pa.Array:
    """The block column of a base's rows: from no input block."""
    return pa.array(np.full(n, -1, np.int32))


def mapped(chunk: Chunk, path: str, s: Settings, schema: pa.Schema, block: int = -1) -> pa.RecordBatch:
    """A chunk of a file's events as pass 2 spills them: in the window, tokens as word ids (-1 out of the
    vocabulary), out-of-vocabulary rows dropped but for one of each key that has no other (keep_mask), and
    the events of the base's forgotten users (unforgotten); with a base, each marked with `block`, the index
    of the input block (readers.Block.index) it is of."""
    chunk = unforgotten(windowed(chunk, s, path), s, path)
    ids = _token_ids(s.vocab_path()).lookup(chunk.token)
    keep = keep_mask(chunk.key, ids)
    columns = [chunk.key, pa.array(ids)]
    if "time" in schema.names:
        columns.append(pa.array(chunk.time if chunk.time is not None else np.zeros(len(ids))))
    if "block" in schema.names:
        columns.append(pa.array(np.full(len(ids), block, np.int32)))
    if s.base_rows:
        columns.append(pa.array(np.full(len(ids), -1, np.int64)))
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    return batch if keep.all() else batch.filter(pa.array(keep))


def _fault_once(s: Settings) -> None:
    """FAULT_ENV's test hook, a folder: while it holds a file `once`, the first spill task to take it (the
    file removed) kills its own process; while it holds `always`, every one does (a task that can never
    finish). Each leaves a file `died`. Inert while neither is there, so the tests' shared Ray carries it."""
    where = os.environ.get(FAULT_ENV)
    if not where:
        return
    if not os.path.exists(os.path.join(where, "always")):
        try:
            os.remove(os.path.join(where, "once"))  # one process only takes it
        except FileNotFoundError:
            return
    with open(os.path.join(where, "died"), "a"):
        pass
    os._exit(17)


# ---------------------------------------------------------------------------------------------------
# Pass 3: a bucket → documents → shard b
# ---------------------------------------------------------------------------------------------------


def task_bytes(budget: int, vocab_size: int, key_bytes_per_event: float = 16.0) -> int:
    """About the most memory one task of prepare uses: pass 3's bucket (prepare sizes it to `budget`) or
    pass 2's spill buffer, and arrays of the vocabulary's size (its lookup table and strings in pass 2,
    counts in pass 3: about 64 bytes a word), plus a batch being read (about 64 MiB with its copies)."""
    spill_buffer = int(SPILL_BUFFER_ROWS * (key_bytes_per_event + 28))
    return max(budget, spill_buffer) + 64 * vocab_size + (64 << 20)
