"""prepare's passes, each a function of one block of the inputs (or one bucket) and the settings.

Changes when what a pass does to its part changes; how the parts are merged, in what order, and by
whom they are run is prepare.py's. Every function here reads its part, writes its files under the
staging directory of the corpus (Settings.tmp) and returns a small result; none depends on another
call of it. So the runner that calls them (runners.SerialRunner: one after another in this process,
today's single-process prepare; runners.RayTasks: as Ray tasks across a cluster) does not change
what they write: the corpus is the same whichever runs it.

    lines    (text inputs of several files) a file's lines: the keys of the next file start after them
    latest   (--window-days) a block's latest event time
    count    pass 1: a block's token counts, rows, skips and what reading it noted
    spill    pass 2: a block's events (or a slice of a base) mapped to word ids, in one spill file per
             block whose record batches each hold one bucket's events, in input order
    shard    pass 3: a bucket's events from every spill, grouped into documents, deduplicated (and, with
             a base, rid of the events it has: sent_again, counted by input block), capped, held out and
             written as shard b
             (with each token's time, given a time column), with the bucket's new documents and
             held-out pairs beside it
    renumber a shard written before the id of its first new document was known (Ray tasks run
             buckets at once): its provisional ids made final

Memory. A task holds one input batch at a time (readers: 256k Parquet rows, 16 MiB of CSV, JSON or
text) plus, in pass 1, the counts of the block's distinct tokens; in pass 2, the vocabulary's lookup
table and at most SPILL_BUFFER_ROWS events waiting to be written; in pass 3, one bucket's events,
which prepare sizes to the memory budget (prepare._choose_buckets), plus arrays of the vocabulary's
size. `task_bytes` says how much that is, and the Ray runner reserves it for each task.

Ids. A bucket's new documents are numbered after every earlier bucket's, so a shard's ids need
the count of new documents of the buckets before it. When that is known (one bucket after another)
`shard` writes the final ids; else (buckets at once) it writes -1 - k for its k-th new document and
`renumber` rewrites them once the counts are in.
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
    HOLDOUT_SCHEMA,
    Corpus,
    CorpusError,
    one_line,
    shard_batches,
    shard_has_times,
    write_shard,
)
from .ids import TokenIds, hash_strings, mix64
from .readers import (
    ORDER,
    PER_SECOND,
    UNIT_NAMES,
    Block,
    BlockState,
    Chunk,
    Options,
    ReadNotes,
    Skips,
    TimeReading,
    count_lines,
    read_block,
    unit_by_size,
)

# Events a spill task keeps before writing them out, one record batch per bucket: fewer, larger
# batches for pass 3 to read, at a bounded cost in memory (about 40 bytes an event).
SPILL_BUFFER_ROWS = 1 << 21
# Rows of a base's docs.arrow that one spill task marks (a row per known user, so that each keeps its id).
BASE_DOCS_ROWS = 1 << 22
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

@dataclass
class Base:
    """What a refresh keeps of an earlier corpus or model: its key tables (ids) and, to join a user's
    new events to the document it had, the shards of the corpus they came from."""

    path: str
    kind: str                  # corpus | model
    docs: pa.Table             # key, id, length; sorted by id (memory-mapped)
    vocab_tokens: pa.Array     # token of each word id
    corpus: Corpus | None      # whose shards hold the documents (a model's corpus, when still there)
    meta: dict                 # that corpus's corpus.json ({} when unknown)

    @property
    def num_docs(self) -> int:
        return self.docs.num_rows

    @property
    def time_range(self) -> list[float] | None:
        """The base's corpus's time range in epoch seconds (stored_time_range), when it had times."""
        return stored_time_range(self.meta)[0]

    @property
    def latest_time(self) -> float | None:
        """The latest event time of the base's corpus, when it was prepared with a time column."""
        found = self.time_range
        return found[1] if found else None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab_tokens)

    def parts(self, join: bool) -> list[BasePart]:
        """The base's rows for pass 2, as parts a spill task each: one marker row (word id -1) per
        document, so every known user keeps its id even with no event now, then, to join, every
        document's tokens in order, a part per shard."""
        found = [BasePart("docs", start, min(start + BASE_DOCS_ROWS, self.num_docs))
                 for start in range(0, self.num_docs, BASE_DOCS_ROWS)]
        if join:
            found += [BasePart("shard", s) for s in range(self.corpus.num_shards)]
        return found

    @functools.cached_property
    def times_kept(self) -> bool:
        """Whether the base's shards keep their tokens' event times (corpus.py), so that a refresh can tell
        an event sent again from a new one: a corpus prepared with a time column since they are kept."""
        return self.corpus is not None and all(shard_has_times(p) for p in self.corpus.shard_paths)

    def token_count(self, join: bool) -> int:
        return self.num_docs + (self.corpus.num_tokens if join else 0)


@dataclass(frozen=True)
class BasePart:
    """A slice of a base that pass 2 spills: docs.arrow rows [start, stop) as markers, or shard `start`."""

    what: str  # docs | shard
    start: int
    stop: int = 0


def open_base(path: str, join: bool) -> Base:
    """The corpus or model at `path` as a base; joining needs the documents (a corpus's shards)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(os.path.join(path, "corpus.json")):
        corpus = Corpus(path)
        return Base(path, "corpus", read_mapped(os.path.join(path, "docs.arrow")),
                    read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks(), corpus,
                    corpus.meta)
    from .errors import UserError
    from .modeldir import ModelDir

    try:
        model = ModelDir(path)
    except UserError:
        raise CorpusError(f"{path}: --base is neither a corpus (no corpus.json) nor a trained model") from None
    docs = read_mapped(os.path.join(path, "docs.arrow"))
    vocab = read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks()
    corpus = None
    try:
        corpus = Corpus(model.corpus_path())
    except UserError:
        pass
    if corpus is not None and (corpus.num_docs, corpus.vocab_size) != (docs.num_rows, len(vocab)):
        corpus = None  # prepared again since: its ids are not the model's
    if join and corpus is None:
        raise CorpusError(f"{path}: joining new events to the users' documents needs the corpus the model was "
                          f"trained on ({model.settings().get('corpus')}), which is gone or was prepared again; "
                          "give --base CORPUS, or --window-days N to build documents from the inputs alone")
    return Base(path, "model", docs, vocab, corpus, corpus.meta if corpus is not None else {})


@functools.lru_cache(maxsize=2)
def _base(path: str, join: bool) -> Base:
    """open_base, once per process: a task process of a Ray worker runs many tasks of one prepare."""
    return open_base(path, join)


def stored_time_range(meta: dict) -> tuple[list[float] | None, str | None, str | None]:
    """A corpus.json's time_range in epoch seconds, the unit its times are in ("s", or ORDER: numbers
    that only ordered events) and, for a corpus.json from before "time_unit", how its range was read.

    Such a corpus.json kept numeric times as they were read (epoch seconds from timestamps and ISO
    strings, but numbers in whatever unit they had, both mixed when files differed), so each end of
    its range is read in the unit its size says (readers.EPOCH_SECONDS); a range that is no epoch
    time in any unit was of numbers that only ordered events.
    """
    found, unit = meta.get("time_range"), meta.get("time_unit")
    if not found:
        return None, unit, None
    if unit is not None:
        return [float(t) for t in found], unit, None
    units = [unit_by_size(float(t)) for t in found]
    if None in units:
        return [float(t) for t in found], ORDER, "numbers that only order events (no epoch time in any unit)"
    how = " to ".join(dict.fromkeys(UNIT_NAMES[u] for u in units))
    return [float(t) / PER_SECOND[u] for t, u in zip(found, units)], "s", f"{how}, by their size"


def read_mapped(path: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read: {one_line(e)}") from e


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

def hold_out(codes: np.ndarray, tokens: np.ndarray, key_hash: np.ndarray, vocab_size: int,
             fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Pick each document's hidden distinct tokens; vectorised over the whole bucket.

    codes/tokens are a bucket's events (doc code, word id), grouped by code. Returns the mask of
    events to keep for training, the hidden (code, word id) pairs, and how many documents have a
    single distinct token, so nothing hidden (a single-event user keeps its event for training).
    The draw for (doc, token) is a hash of (seed, key, token), so it depends neither on the bucket
    count nor on the other documents.
    """
    pair = codes.astype(np.int64) * vocab_size + tokens
    uniq, inverse = np.unique(pair, return_inverse=True)
    pair_doc, pair_tok = uniq // vocab_size, uniq % vocab_size
    ndocs = len(key_hash)
    distinct = np.bincount(pair_doc, minlength=ndocs)
    hide = np.where(distinct >= 2,
                    np.clip(np.floor(fraction * distinct + 0.5), 1, distinct - 1), 0).astype(np.int64)
    draw = mix64(key_hash[pair_doc] ^ mix64(pair_tok.astype(np.uint64)
                                              + mix64(np.array([seed & (2**64 - 1)], np.uint64))[0]))
    order = np.lexsort((pair_tok, draw, pair_doc))  # by doc, then by draw
    group_start = np.concatenate([[0], np.cumsum(distinct)[:-1]])
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(len(uniq)) - group_start[pair_doc[order]]
    hidden = rank < hide[pair_doc]
    return ~hidden[inverse], pair_doc[hidden], pair_tok[hidden], int(np.count_nonzero(distinct == 1))


def duplicates(codes: np.ndarray, tokens: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Mask of the events that repeat an earlier one's (doc, token, time) exactly; the first stays.

    A missing time (NaN) equals nothing, so events without a time are never duplicates.
    """
    n = len(codes)
    if n < 2:
        return np.zeros(n, bool)
    order = np.lexsort((np.arange(n), tokens, times, codes))  # equal triples adjacent, earliest first
    same = ((codes[order[1:]] == codes[order[:-1]]) & (tokens[order[1:]] == tokens[order[:-1]])
            & (times[order[1:]] == times[order[:-1]]))
    duplicate = np.zeros(n, bool)
    duplicate[order[1:][same]] = True
    return duplicate


def sent_again(codes: np.ndarray, tokens: np.ndarray, times: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Mask of the input events (`fresh`) whose (doc, token, time) a base's token (not fresh) has exactly:
    the same event sent again, as a cumulative export sends every earlier day's. A time that is NaN (none)
    or -inf (a base's token whose time it was never told) equals nothing.

    Exact, in about the time of one sort of the base's candidates: those at or after the inputs' earliest
    time (in a daily refresh, only the latest of the base's events), by a hash of the triple in the high
    bits of a uint64 and their index in the low bits; each input event is then compared, triple for
    triple, with the few candidates of its hash's prefix."""
    found = np.zeros(len(codes), bool)
    inputs = np.flatnonzero(fresh & np.isfinite(times))
    if not len(inputs):
        return found
    base = np.flatnonzero(~fresh & np.isfinite(times) & (times >= times[inputs].min()))
    if not len(base):
        return found
    triple = mix64(mix64(mix64(codes.astype(np.uint64)) + tokens.astype(np.uint64)) + times.view(np.uint64))
    bits = np.uint64(max(1, len(base).bit_length()))
    keys = np.sort(triple[base] >> bits << bits | np.arange(len(base), dtype=np.uint64))
    prefix, wanted = keys >> bits, triple[inputs] >> bits
    lo, hi, by_prefix = np.empty(len(inputs), np.int64), np.empty(len(inputs), np.int64), np.argsort(wanted)
    # searched in order: each search starts where the last ended (in cache), many times faster than at random
    lo[by_prefix] = np.searchsorted(prefix, wanted[by_prefix], "left")
    hi[by_prefix] = np.searchsorted(prefix, wanted[by_prefix], "right")
    low = (np.uint64(1) << bits) - np.uint64(1)
    hit = np.zeros(len(inputs), bool)
    for k in range(int((hi - lo).max(initial=0))):  # candidates sharing a prefix: rarely more than one
        live = np.flatnonzero((lo + k < hi) & ~hit)
        if not len(live):
            break
        theirs, ours = base[(keys[lo[live] + k] & low).astype(np.int64)], inputs[live]
        hit[live] = ((codes[theirs] == codes[ours]) & (tokens[theirs] == tokens[ours])
                     & (times[theirs] == times[ours]))
    found[inputs[hit]] = True
    return found


@dataclass
class Events:
    """A bucket's events, grouped by key (in order of first appearance) and, with times, in time order;
    out-of-vocabulary rows and duplicates removed."""

    keys: pa.Array             # large_string: each key of the bucket once (a key's code is its position)
    codes: np.ndarray          # of each event
    tokens: np.ndarray         # word id of each event
    fresh: np.ndarray          # the events a base did not have
    times: np.ndarray | None = None          # of each event, with a time column (a base's untimed tokens -inf)
    base_of_code: np.ndarray | None = None   # a re-bucketed base: each key's base id, -1 for a new key
    rows: int = 0              # spilled rows read
    duplicates: int = 0
    in_base: int = 0           # input events the base had (the same key, token and time), dropped
    base_untimed: int = 0      # the base's tokens of the bucket whose time it was never told (-inf)
    early: int = 0             # input events at or before a base's latest time (and not in it: late data)
    late_users: int = 0        # keys with such events
    time_range: tuple[float, float] | None = None
    input_users: int = 0       # with a base: keys that the inputs hold, and of those the base knows
    known_input_users: int = 0
    blocks: np.ndarray | None = None         # with a base: the input block of each event (-1: a base's token)
    in_base_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (block, count) of the in_base events
    early_blocks: tuple[np.ndarray, np.ndarray] | None = None    # (block, count) of the early events

    def drop(self, dropped: np.ndarray) -> None:
        keep = ~dropped
        self.codes, self.tokens, self.fresh = self.codes[keep], self.tokens[keep], self.fresh[keep]
        if self.times is not None:
            self.times = self.times[keep]
        if self.blocks is not None:
            self.blocks = self.blocks[keep]

    def by_block(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(block, count) of the events of mask `events`: what a file's line in a refresh's report counts."""
        return _sparse(self.blocks[events]) if self.blocks is not None else None


def _events(spills: list[tuple[str, np.ndarray]], s: Settings) -> Events:
    """Bucket b's rows from every spill (input order), grouped, ordered and deduplicated.

    With a time column, an identical (user, URL, time) is the same event logged twice and only the
    first stays; without one, a repeated (user, URL) is a repeated visit, and stays. A base's own
    tokens are never duplicates; an input event that one of them has is dropped (sent_again: here for a
    base re-bucketed with the events, in _joined for one joined shard by shard).
    """
    schema = s.spill_schema()
    batches = []
    for path, indices in spills:
        reader = pa.ipc.open_file(pa.memory_map(path))
        batches += [reader.get_batch(int(i)) for i in indices]
    table = pa.Table.from_batches(batches, schema)
    # large_string: a bucket's keys may pass 2 GiB of text when the budget is big.
    encoded = pc.dictionary_encode(table["key"].cast(pa.large_string()).combine_chunks())
    # Codes follow first appearance (the spills are in input order), and so do new doc ids.
    keys, codes, tokens = encoded.dictionary, encoded.indices.to_numpy(), table["token"].to_numpy()
    timed = "time" in table.column_names
    times = table["time"].to_numpy() if timed else None
    base_rows = table["base"].to_numpy() if s.base_rows else None
    blocks = table["block"].to_numpy() if "block" in table.column_names else None
    if timed:  # by key, then time; a base's token before an input event of the same time; ties keep input order
        order = np.lexsort((times, codes) if base_rows is None else (base_rows < 0, times, codes))
    else:
        order = np.argsort(codes, kind="stable")
    ev = Events(keys, codes[order], tokens[order], np.ones(0, bool), rows=table.num_rows)
    del table, encoded, batches
    if base_rows is not None:
        base_rows = base_rows[order]
        ev.base_of_code = np.full(len(keys), -1, np.int64)
        known = base_rows >= 0
        ev.base_of_code[ev.codes[known]] = base_rows[known]
        in_inputs = np.zeros(len(keys), bool)
        in_inputs[ev.codes[~known]] = True
        ev.input_users = int(np.count_nonzero(in_inputs))
        ev.known_input_users = int(np.count_nonzero(in_inputs & (ev.base_of_code >= 0)))
    in_vocab = ev.tokens >= 0  # out of the vocabulary, or a base document's marker row
    ev.codes, ev.tokens = ev.codes[in_vocab], ev.tokens[in_vocab]
    ev.fresh = base_rows[in_vocab] < 0 if base_rows is not None else np.ones(len(ev.codes), bool)
    if blocks is not None:
        ev.blocks = blocks[order][in_vocab]
    if s.has_time:
        ev.times = times[order][in_vocab]
        dropped = duplicates(ev.codes, ev.tokens, np.where(ev.fresh, ev.times, np.nan))
        ev.duplicates = int(np.count_nonzero(dropped))
        ev.drop(dropped)
        if base_rows is not None and s.join:  # the base's documents are here: its tokens and their times
            ev.base_untimed = int(np.count_nonzero(~ev.fresh & np.isneginf(ev.times)))
            dropped = sent_again(ev.codes, ev.tokens, ev.times, ev.fresh)
            ev.in_base, ev.in_base_blocks = int(np.count_nonzero(dropped)), ev.by_block(dropped)
            ev.drop(dropped)
        seen = ev.times[np.isfinite(ev.times)]
        if len(seen):
            ev.time_range = (float(seen.min()), float(seen.max()))
        if not s.by_shard:
            _late(ev, s)
    return ev


def _late(ev: Events, s: Settings) -> None:
    """Count the input events at or before the base's latest time that it did not have (late data) and
    their users: they are new, and join their documents in time order. In a window the base's documents
    are not read, so such an event is taken to be one the base had, and is not new."""
    latest = _base(s.base, s.join).latest_time if s.base else None
    if latest is None:
        return
    early = ev.fresh & (ev.times <= latest)
    ev.early, ev.early_blocks = int(np.count_nonzero(early)), ev.by_block(early)
    ev.late_users = len(np.unique(ev.codes[early]))
    if not s.join:
        ev.fresh &= ~early


@dataclass
class Documents:
    """A bucket's documents as its shard holds them, and what else pass 3 writes and reports of it."""

    doc_ids: np.ndarray          # a base's ids where known; new documents: -1 - k until numbered
    lengths: np.ndarray          # tokens of each, as written
    words: np.ndarray            # their word ids, document after document
    new_keys: pa.Array           # keys of the new documents, in id order
    new_lengths: np.ndarray
    times: np.ndarray | None = None          # the words' event times (with a time column)
    single: int = 0              # documents of one token, before the held-out split
    empty: int = 0               # keys of the bucket, not the base's, left with no token
    held: tuple[pa.Array, np.ndarray] | None = None  # hidden (key, word id) pairs
    nothing_hidden: int = 0
    new_words: np.ndarray | None = None      # word ids of the events a base did not have
    base_ids: np.ndarray | None = None       # base documents of the bucket, and their lengths now
    base_lengths: np.ndarray | None = None
    grown: np.ndarray | None = None          # base documents with new events
    capped: Capped | None = None


@dataclass
class Capped:
    """Documents cut to their last --max-tokens-per-doc tokens: how many, the tokens dropped, the first keys."""

    docs: int = 0
    tokens: int = 0
    keys: list[str] = field(default_factory=list)

    EXAMPLES = 3


def _last_tokens(lengths: np.ndarray, cap: int) -> np.ndarray:
    """Mask of the tokens each document keeps of `lengths` (documents one after another) under a cap of
    `cap` tokens: its last ones, its most recent events where the documents are in time order."""
    ends = np.cumsum(lengths)
    return np.repeat(ends, lengths) - np.arange(int(ends[-1]) if len(ends) else 0) <= cap


def _cap(lengths: np.ndarray, cap: int | None, key_of) -> tuple[np.ndarray | None, Capped | None]:
    """(mask of the tokens kept, what was cut) of documents of `lengths` under --max-tokens-per-doc
    (None: no cap, or none over it); key_of(indices) gives documents' keys, for the report."""
    if not cap or not len(lengths) or lengths.max() <= cap:
        return None, None
    over = np.flatnonzero(lengths > cap)
    return _last_tokens(lengths, cap), Capped(len(over), int((lengths[over] - cap).sum()),
                                              [str(k) for k in key_of(over[:Capped.EXAMPLES])])


def _new_ids(n: int, first_id: int | None) -> np.ndarray:
    """Ids of a bucket's n new documents: first_id on, or -1 - k while the first is not known."""
    return np.arange(n, dtype=np.int64) + first_id if first_id is not None else -1 - np.arange(n, dtype=np.int64)


def _grouped(ev: Events, s: Settings, vocab_size: int, first_id: int | None) -> Documents:
    """Documents from the bucket's events alone: without a base, or with its rows re-bucketed with
    the events (its tokens sorting first, a marker row for each known user)."""
    nkeys = len(ev.keys)
    codes, tokens, times, fresh = ev.codes, ev.tokens, ev.times, ev.fresh
    before = np.bincount(codes, minlength=nkeys)
    # the cap before the held-out split: what is hidden is then of the events a document keeps
    keep, capped = _cap(before, s.max_tokens_per_doc, lambda at: ev.keys.take(pa.array(at)).to_pylist())
    if keep is not None:
        codes, tokens, fresh = codes[keep], tokens[keep], fresh[keep]
        times = times[keep] if times is not None else None
    held, nothing_hidden = None, 0
    if s.holdout > 0 and len(codes):
        keep, hid_doc, hid_tok, nothing_hidden = hold_out(codes, tokens, hash_strings(ev.keys), vocab_size,
                                                          s.holdout, s.seed)
        codes, tokens, fresh = codes[keep], tokens[keep], fresh[keep]
        times = times[keep] if times is not None else None
        held = (ev.keys.take(pa.array(hid_doc)), hid_tok)
    lengths = np.bincount(codes, minlength=nkeys)
    present = np.flatnonzero(lengths)
    docs = Documents(np.zeros(0, np.int64), lengths[present], tokens, ev.keys, np.zeros(0, np.int64), times=times,
                     single=int(np.count_nonzero(before == 1)), held=held, nothing_hidden=nothing_hidden,
                     capped=capped)
    if ev.base_of_code is None:
        new = present
        docs.doc_ids = _new_ids(len(new), first_id)
        docs.empty = nkeys - len(present)
    else:
        ours = ev.base_of_code >= 0
        docs.base_ids, docs.base_lengths = ev.base_of_code[ours], lengths[ours]
        docs.grown = ev.base_of_code[ours & (np.bincount(ev.codes[ev.fresh], minlength=nkeys) > 0)]
        docs.new_words = tokens[fresh]
        new = np.flatnonzero(~ours & (lengths > 0))
        docs.doc_ids = ev.base_of_code[present].copy()  # a base's empty documents keep their row, in no shard
        docs.doc_ids[~ours[present]] = _new_ids(len(new), first_id)
        docs.empty = int(np.count_nonzero(~ours & (lengths == 0)))
    docs.new_keys, docs.new_lengths = ev.keys.take(pa.array(new)), lengths[new]
    return docs


@functools.lru_cache(maxsize=2)
def _empty_base_docs(path: str, join: bool, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """A base's documents with no token (a window's known users with no event then), which are in no
    shard, and the bucket of each."""
    base = _base(path, join)
    empty = np.flatnonzero(base.docs.column("length").to_numpy() == 0)
    keys = base.docs.column("key").take(pa.array(empty)).combine_chunks()
    return empty, (hash_strings(keys) % np.uint64(buckets)).astype(np.int64)


def _joined(ev: Events, b: int, s: Settings, first_id: int | None) -> Documents:
    """Documents of a refresh that joins new events to the base's documents shard by shard (its shards
    are by key hash, corpus.json's "shards_by"): bucket b's new events can only be those of base shard
    b's users (or of its users with an empty document, or of new users), so base shard b is read once
    and written again with each user's new events after its tokens (in time order with the late ones,
    _in_time_order), then the new users. An input event the base's document has (the same URL and
    time) is dropped (sent_again). The base's tokens are never spilled, sorted or grouped again: the
    cost is the new events' plus one copy of the corpus (_grouped, with the base re-bucketed, handles
    everything else)."""
    base = _base(s.base, s.join)
    nkeys = len(ev.keys)
    base_keys = base.docs.column("key")
    shard_ids, shard_offsets, shard_tokens, shard_times = _whole_shard(base.corpus.shard_paths[b])
    shard_keys = base_keys.take(pa.array(shard_ids)).combine_chunks()
    if s.buckets > 1 and (hash_strings(shard_keys) % np.uint64(s.buckets) != b).any():
        raise CorpusError(f"{base.corpus.shard_paths[b]}: holds users whose keys hash to another shard, "
                          f"though {base.corpus.path}/corpus.json says its shards are by key hash")
    empty, empty_bucket = _empty_base_docs(s.base, s.join, s.buckets)
    empties = empty[empty_bucket == b]
    known_ids = np.concatenate([shard_ids, empties])
    position = pc.index_in(ev.keys, value_set=pa.concat_arrays(
        [shard_keys.cast(pa.large_string()), base_keys.take(pa.array(empties)).combine_chunks().cast(
            pa.large_string())])).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    known = position >= 0
    ev.input_users, ev.known_input_users = nkeys, int(np.count_nonzero(known))
    n_shard = len(shard_ids)
    old_lengths = np.diff(shard_offsets)
    timed = ev.times is not None
    if timed:
        if shard_times is None:  # a base prepared before corpora kept times: its tokens' times are unknown
            shard_times = np.full(len(shard_tokens), -np.inf)
        ev.base_untimed = int(np.count_nonzero(np.isneginf(shard_times)))
        dropped = _sent_again_to(ev, position, old_lengths, shard_tokens, shard_times)
        ev.in_base, ev.in_base_blocks = int(np.count_nonzero(dropped)), ev.by_block(dropped)
        ev.drop(dropped)
        _late(ev, s)
    codes, tokens = ev.codes, ev.tokens
    added = np.bincount(codes, minlength=nkeys)  # new tokens of each key
    grown = known_ids[position[known & (np.bincount(codes[ev.fresh], minlength=nkeys) > 0)]]
    # each base document of the shard, then its new events: written to their places in one array
    adds = np.zeros(len(known_ids), np.int64)
    adds[position[known]] = added[known]
    lengths = old_lengths + adds[:n_shard]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    token_position = position[codes]
    known_tokens = token_position >= 0
    by_position = np.argsort(token_position[known_tokens], kind="stable")
    additions = tokens[known_tokens][by_position]
    into = adds[:n_shard]
    in_place = int(into.sum())
    base_slots = np.arange(len(shard_tokens)) + np.repeat(offsets[:-1] - shard_offsets[:-1], old_lengths)
    added_slots = (np.repeat(offsets[:-1] + old_lengths, into) + np.arange(in_place)
                   - np.repeat(np.cumsum(into) - into, into))
    merged = np.empty(int(offsets[-1]), np.int32)
    merged[base_slots], merged[added_slots] = shard_tokens, additions[:in_place]
    words = [merged, additions[in_place:], tokens[~known_tokens]]
    times = None
    if timed:
        added_times = ev.times[known_tokens][by_position]
        merged_times = np.empty(len(merged), np.float64)
        merged_times[base_slots], merged_times[added_slots] = shard_times, added_times[:in_place]
        _in_time_order(lengths, merged, merged_times)
        times = np.concatenate([merged_times, added_times[in_place:], ev.times[~known_tokens]])
    # then users whose document was empty and is not now, then new users
    refilled = np.flatnonzero(adds[n_shard:] > 0)
    new = np.flatnonzero(~known & (added > 0))
    doc_ids = np.concatenate([shard_ids, empties[refilled], _new_ids(len(new), first_id)])
    doc_lengths = np.concatenate([lengths, adds[n_shard:][refilled], added[new]])
    words = np.concatenate(words)
    single = int(np.count_nonzero(doc_lengths == 1))
    n_base = n_shard + len(refilled)
    keep, capped = _cap(doc_lengths, s.max_tokens_per_doc, lambda at: np.concatenate([
        base_keys.take(pa.array(doc_ids[at[at < n_base]])).to_pylist(),
        ev.keys.take(pa.array(new[at[at >= n_base] - n_base])).to_pylist()]))
    if keep is not None:
        words, times = words[keep], times[keep] if timed else None
        doc_lengths = np.minimum(doc_lengths, s.max_tokens_per_doc)
    return Documents(doc_ids, doc_lengths, words, ev.keys.take(pa.array(new)), doc_lengths[n_base:], times=times,
                     single=single, empty=int(np.count_nonzero(~known & (added == 0))), new_words=tokens[ev.fresh],
                     base_ids=doc_ids[:n_base], base_lengths=doc_lengths[:n_base], grown=grown, capped=capped)


def _sent_again_to(ev: Events, position: np.ndarray, lengths: np.ndarray, tokens: np.ndarray,
                   times: np.ndarray) -> np.ndarray:
    """sent_again for a shard joined in place: the input events of known users (ev's, position: each key's
    document in the shard, -1 for a key it does not hold) that the shard's documents (of `lengths`,
    `tokens` and `times`) have. Only the tokens of users with input events, at or after the earliest of
    those events, take part."""
    event_doc = position[ev.codes]
    ours = (event_doc >= 0) & (event_doc < len(lengths)) & np.isfinite(ev.times)
    found = np.zeros(len(ev.codes), bool)
    if not ours.any():
        return found
    token_doc = np.repeat(np.arange(len(lengths)), lengths)
    touched = np.zeros(len(lengths), bool)
    touched[event_doc[ours]] = True
    theirs = touched[token_doc] & (times >= ev.times[ours].min())
    n_base = int(np.count_nonzero(theirs))
    found[ours] = sent_again(np.concatenate([token_doc[theirs], event_doc[ours]]),
                             np.concatenate([tokens[theirs], ev.tokens[ours]]),
                             np.concatenate([times[theirs], ev.times[ours]]),
                             np.concatenate([np.zeros(n_base, bool), np.ones(int(np.count_nonzero(ours)), bool)]))[n_base:]
    return found


def _in_time_order(lengths: np.ndarray, words: np.ndarray, times: np.ndarray) -> None:
    """Each document of `lengths` (its words and their times, one document after another) in time order,
    in place, where a late event was placed after a later one: a stable sort of those documents alone,
    so that a base's token stays before an input event of the same time, -inf first and NaN last, as
    prepare orders a user's events."""
    if len(times) < 2:
        return
    doc = np.repeat(np.arange(len(lengths)), lengths)
    a, b = times[:-1], times[1:]
    later_first = ((b < a) | (np.isnan(a) & ~np.isnan(b))) & (doc[1:] == doc[:-1])
    if not later_first.any():
        return
    affected = np.zeros(len(lengths), bool)
    affected[doc[1:][later_first]] = True
    at = np.flatnonzero(affected[doc])
    order = at[np.lexsort((times[at], doc[at]))]
    words[at], times[at] = words[order], times[order]


def _whole_shard(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A shard file's (doc_ids, offsets, tokens, times), every document of it; times None when it keeps none."""
    parts = list(shard_batches(path))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), None
    ids = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([np.diff(p[1]) for p in parts])
    times = np.concatenate([p[3] for p in parts]) if parts[0][3] is not None else None
    return (ids, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.concatenate([p[2] for p in parts]),
            times)


def _sparse(word_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(word ids, counts) of the words that occur: what a bucket sends back of a vocabulary-long count."""
    found, counts = np.unique(word_ids, return_counts=True)
    return found.astype(np.int32), counts.astype(np.int64)


@dataclass
class Sharded:
    """Pass 3 of one bucket: what corpus.json, vocab.arrow, docs.arrow and a refresh's report need."""

    shard: dict                  # corpus.json's entry
    new_docs: int
    counts: tuple[np.ndarray, np.ndarray]
    rows: int = 0
    renumber: bool = False       # written with provisional ids for its new documents
    empty: int = 0
    heldout: int = 0
    duplicates: int = 0
    single: int = 0
    nothing_hidden: int = 0
    time_range: tuple[float, float] | None = None
    early: int = 0
    late_users: int = 0
    in_base: int = 0
    base_untimed: int = 0
    input_users: int = 0
    known_input_users: int = 0
    capped: Capped | None = None
    new_words: tuple[np.ndarray, np.ndarray] | None = None
    base_ids: np.ndarray | None = None
    base_lengths: np.ndarray | None = None
    grown: np.ndarray | None = None
    in_base_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (input block, count) of in_base and of early
    early_blocks: tuple[np.ndarray, np.ndarray] | None = None


def docs_part(s: Settings, b: int) -> str:
    return os.path.join(s.parts_dir, f"docs-{b:05d}.arrow")


def heldout_part(s: Settings, b: int) -> str:
    return os.path.join(s.parts_dir, f"heldout-{b:05d}.arrow")


NEW_DOCS_SCHEMA = pa.schema([("key", pa.string()), ("length", pa.int64())])


def shard(b: int, spills: list[tuple[str, np.ndarray]], s: Settings, first_id: int | None, tick=None) -> Sharded:
    """Pass 3 of bucket b: its events from every spill file (`spills`: each file's record batches of
    bucket b), grouped into documents, held out, and written as shard b (corpus.write_shard, with the
    tokens' times when there is a time column), with its new documents' keys and lengths
    (parts/docs-b.arrow, in id order) and its hidden pairs (parts/heldout-b.arrow). first_id: the id
    of its first new document, None while not known."""
    s.go_on()
    vocab = read_mapped(s.vocab_path()).column("token").combine_chunks()
    ev = _events(spills, s)
    docs = _joined(ev, b, s, first_id) if s.by_shard else _grouped(ev, s, len(vocab), first_id)
    s.go_on()
    entry = write_shard(s.tmp, b, docs.doc_ids, docs.lengths, docs.words, docs.times)
    _write_ipc(docs_part(s, b), NEW_DOCS_SCHEMA, [docs.new_keys.cast(pa.string()), pa.array(docs.new_lengths, pa.int64())])
    heldout = 0
    if docs.held is not None:
        heldout = len(docs.held[1])
        _write_ipc(heldout_part(s, b), HOLDOUT_SCHEMA, [docs.held[0].cast(pa.string()),
                                                        vocab.take(pa.array(docs.held[1]))])
    if tick:
        tick(ev.rows)
    return Sharded(entry, len(docs.new_keys), _sparse(docs.words), ev.rows,
                   first_id is None and len(docs.new_keys) > 0, docs.empty, heldout, ev.duplicates, docs.single,
                   docs.nothing_hidden, ev.time_range, ev.early, ev.late_users, ev.in_base, ev.base_untimed,
                   ev.input_users, ev.known_input_users, docs.capped,
                   None if docs.new_words is None else _sparse(docs.new_words), docs.base_ids, docs.base_lengths,
                   docs.grown, ev.in_base_blocks, ev.early_blocks)


def _write_ipc(path: str, schema: pa.Schema, columns: list[pa.Array]) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        table = pa.Table.from_arrays(columns, schema=schema)
        writer.write_table(table, max_chunksize=1 << 20)


def renumber(path: str, first_id: int) -> None:
    """Shard file `path` with its provisional ids (-1 - k) made final (first_id + k), in place; its
    other columns (tokens, times) as they are."""
    staged = path + ".renumber"
    reader = pa.ipc.open_file(pa.memory_map(path))
    with pa.OSFile(staged, "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            ids = batch.column(0).to_numpy()
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.array(np.where(ids < 0, first_id - 1 - ids, ids))] + batch.columns[1:], schema=reader.schema))
    os.replace(staged, path)


def task_bytes(budget: int, vocab_size: int, key_bytes_per_event: float = 16.0) -> int:
    """About the most memory one task of prepare uses: pass 3's bucket (prepare sizes it to `budget`) or
    pass 2's spill buffer, and arrays of the vocabulary's size (its lookup table and strings in pass 2,
    counts in pass 3: about 64 bytes a word), plus a batch being read (about 64 MiB with its copies)."""
    spill_buffer = int(SPILL_BUFFER_ROWS * (key_bytes_per_event + 28))
    return max(budget, spill_buffer) + 64 * vocab_size + (64 << 20)
