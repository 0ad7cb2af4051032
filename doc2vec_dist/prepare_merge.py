"""prepare's passes run and merged: each pass over the blocks (or buckets) by the runner, its results taken
in input order, one bar for the whole job; pass 1's counts made the vocabulary, the buckets chosen, pass 3's
parts made the corpus's files.

Changes when how a pass's results are merged, in what order, or by whom the passes are run (this process,
Ray tasks, Ray Data) changes. What a pass does to its part is passes.py's and shard_pass.py's; the order of
the passes and the checks around them, prepare.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import passes, raydata, runners, shard_pass
from .config import PrepareConfig
from .corpus import (
    DOCS_SCHEMA,
    HOLDOUT_SCHEMA,
    CorpusError,
    write_changed,
)
from .errors import UserError
from .passes import Settings, TokenCounter
from .prepare_base import Base
from .prepare_report import _compact, _name_files
from .read_times import TimeKinds
from .readers import Block, ReadNotes, Skips
from .urls import RAW, UrlRule, http_urls, normalize_distinct

log = logging.getLogger(__name__)


DAY_SECONDS = 86_400.0


@dataclass
class _Window:
    """Only the events of the last `days` before the latest one (prepare --window-days)."""

    days: float
    cutoff: float   # seconds since the epoch; events before it are left out
    latest: float


# ---------------------------------------------------------------------------------------------------
# Running the passes: in input order, one bar for the whole job
# ---------------------------------------------------------------------------------------------------

class _Progress:
    """One bar for the whole job, in input rows: each pass counts the inputs' rows once (pass 3 a
    bucket's share of them), so the bar fills evenly from the first pass to the last. It times the
    passes too (corpus.json's "seconds")."""

    def __init__(self, enabled: bool, passes: int, rows: int | None):
        self.passes, self.rows = passes, rows
        self.bar = tqdm(desc="prepare", total=rows * passes if rows is not None else None, unit=" rows",
                        unit_scale=True, file=sys.stderr, disable=not enabled, dynamic_ncols=True)
        self.step = 0
        self.seconds: dict[str, float] = {}
        self._started = self._step_started = time.perf_counter()
        self._name = "plan"

    def start(self, name: str) -> None:
        self._lap(name)
        self.step += 1
        self.bar.set_description(f"prepare {self.step}/{self.passes} {name}")

    def _lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[self._name] = round(now - self._step_started, 3)
        self._name, self._step_started = name, now

    def timings(self) -> dict[str, float]:
        """Seconds of each pass so far (what came before pass 1 as "plan"), and in all."""
        self._lap(self._name)
        return {**self.seconds, "total": round(time.perf_counter() - self._started, 3)}

    def know_rows(self, rows: int) -> None:
        if self.rows is None:
            self.rows = rows
            self.bar.total = rows * self.passes
            self.bar.refresh()

    def update(self, n: float) -> None:
        self.bar.update(n)

    def close(self) -> None:
        if self.bar.total is not None:
            self.bar.n = self.bar.total
        self.bar.close()


def _in_order(results, arrive=None):
    """(position, result) of a runner's results in position order, whatever order they came in; the
    first exception in that order is raised, as a single process reading the parts in turn would
    have raised it. arrive(position, result) sees each result as it comes (to merge what can be)."""
    waiting, expected = {}, 0
    for i, result in results:
        if arrive is not None and not isinstance(result, BaseException):
            arrive(i, result)
        waiting[i] = result
        while expected in waiting:
            result = waiting.pop(expected)
            if isinstance(result, BaseException):
                raise result
            yield expected, result
            expected += 1


def _run(runner, fn, calls, progress: _Progress | None = None, memory: int = 0, arrive=None, rows=None):
    """fn over `calls` on the runner, results in order. A pass run in this process updates the bar as it
    reads; through Ray, each result updates it by `rows(result)` as it arrives."""
    tick = progress.update if progress is not None and runner.in_process else None

    def arrived(i, result):
        if progress is not None and not runner.in_process and rows is not None:
            progress.update(rows(result))
        if arrive is not None:
            arrive(i, result)

    calls = (args + (tick,) if tick is not None else args for args in calls)
    with contextlib.closing(runner.map(fn, calls, memory)) as results:
        yield from _in_order(results, arrived)


def _checked(block: Block, read: passes.Read, kinds: TimeKinds, opt) -> None:
    """A block's readings checked against the kind of time of the blocks before it, then its error."""
    for reading in read.readings:
        kinds.check(block.path, opt.time_col, reading)
    if read.error is not None:
        raise read.error


def _next_units(blocks: list[Block], reads: dict[int, passes.Read]) -> list[Block]:
    """The blocks with the unit of their file's numeric times that the blocks before them settled."""
    out = list(blocks)
    for i in range(1, len(out)):
        if out[i].earlier and out[i].unit is None and reads[i - 1].unit is not None:
            out[i] = dataclasses.replace(out[i], unit=reads[i - 1].unit)
    return out


# Input smaller than this is prepared sooner by one process than by Ray tasks, whose start (a local Ray's, or
# the task workers' on a cluster) costs more than they save: --parallel 0 (a task per CPU, the jobs' default on
# a cluster) prepares it in this process. Measured on generated Parquet here: tasks on a Ray already up paid
# from about 74 MiB, a local Ray started for them from about 111 MiB (docs/benchmarks.md, "Fewer workers where
# more would not pay").
PARALLEL_MIN_INPUT_BYTES = 96 << 20


def processes_that_pay(parallel: int | None, size: int) -> tuple[int | None, str | None]:
    """--parallel for `size` bytes of input, and the line that says what was chosen (None: nothing to say).
    0 (a task per CPU) below PARALLEL_MIN_INPUT_BYTES is 1, this process alone; an explicit N > 1 stays N (a
    small input is said to be one)."""
    if parallel in (None, 1) or size >= PARALLEL_MIN_INPUT_BYTES:
        return parallel, None
    below = f"{_bytes(size)} of input, below the {_bytes(PARALLEL_MIN_INPUT_BYTES)} where Ray tasks were measured to pay"
    if parallel == 0:
        return 1, f"prepare: {below} for their start: preparing it in this process (--parallel N runs N tasks whatever the size)"
    return parallel, f"prepare: {below} for their start: running {parallel} tasks as asked (one process would be sooner)"


def _bytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 1 << 30 else f"{n / 2**30:,.1f} GiB"


@contextlib.contextmanager
def _runner(config: PrepareConfig):
    """Where the passes run: this process (parallel 1), else Ray tasks (runners.ray_tasks)."""
    if config.parallel in (None, 1):
        yield runners.SerialRunner()
        return
    with runners.ray_tasks(config.parallel, config.address) as found:
        yield found


def _ray_memory(runner, wanted: int) -> int:
    """The memory a Ray task of prepare reserves; refused in one line when no node has that much."""
    if runner.in_process:
        return 0
    largest = runners.largest_node_memory()
    if largest is not None and wanted > largest:
        raise UserError(f"a task of prepare needs about {wanted / 2**30:.1f} GiB, and the largest node of the Ray "
                        f"cluster offers {largest / 2**30:.1f} GiB: give a smaller --memory-budget-bytes")
    return wanted


def _data_engine(c: PrepareConfig, files: list[str], opt, runner) -> bool:
    """Whether pass 2 runs through Ray Data (--engine data, on inputs it reads as the tasks do)."""
    if c.engine != "data" or runner.in_process:
        return False
    why = raydata.unsupported(files, opt)
    if why:
        log.info(f"prepare: --engine data: {why}; pass 2 runs as Ray tasks")
    return why is None


def task_memory_line(wanted: int, tasks: int, largest: int | None) -> str:
    """What prepare's tasks ask of the nodes: each task's reservation, the whole job's at `tasks` at
    once, and how many fit the largest node's memory (its CPUs permitting)."""
    line = (f"prepare: each partition and shard task reserves {wanted / 2**30:.2f} GiB of Ray memory; {tasks} at "
            f"once need {tasks * wanted / 2**30:.2f} GiB across the cluster")
    if largest:
        line += f"; the largest node ({largest / 2**30:.1f} GiB) runs up to {largest // wanted} at once"
    return line


# ---------------------------------------------------------------------------------------------------
# Before pass 1: text keys, --window-days's latest time
# ---------------------------------------------------------------------------------------------------

def _line_bases(blocks: list[Block], runner) -> list[Block]:
    """Text inputs: each file's first key, after every line of the files before it."""
    if len(blocks) < 2:
        return blocks
    out, lines = list(blocks), 0
    for i, found in _run(runner, passes.lines, [(b,) for b in blocks]):
        out[i] = dataclasses.replace(out[i], line_base=lines)
        lines += found
    return out


def _latest_time(blocks: list[Block], files: list[str], s: Settings, runner, progress) -> tuple[float, list[Block]]:
    """The latest event time of the inputs (a first read of them, for --window-days)."""
    kinds, latest, reads = TimeKinds(), -np.inf, {}
    for i, found in _run(runner, passes.latest, [(b, s) for b in blocks], progress, _ray_memory(runner, 256 << 20),
                         rows=lambda r: r.rows):
        _checked(blocks[i], found, kinds, s.opt)
        latest = max(latest, found.latest)
        reads[i] = found
    if not np.isfinite(latest):
        raise CorpusError(f"{_name_files(files)}: no event has a time in '{s.opt.time_col}'; --window-days needs one")
    return latest, _next_units(blocks, reads)


# ---------------------------------------------------------------------------------------------------
# Pass 1: counts → vocabulary
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Pass1:
    rows: int
    events: int
    key_bytes: int
    skips: Skips
    vocab: pa.Table  # token, count (input counts), id
    notes: ReadNotes
    input_words: int = 0  # distinct tokens of the inputs (normalised by the URL rule)
    known_words: int = 0  # of which the base knows (with a base)
    units: dict = dataclasses.field(default_factory=dict)  # each file's unit of numeric times (for Ray Data)
    read_rows: set = dataclasses.field(default_factory=set)  # the files it read rows from (for Ray Data)
    read_words: int = 0   # distinct tokens of the inputs as read, before the URL rule
    http_words: int = 0   # of which absolute http(s) URLs (what the rule may change)
    block_events: np.ndarray | None = None  # the events of each block (a refresh's report counts them by file)
    forgotten_users: int = 0  # distinct users of the base's forget list whose events the inputs held


def _pass1(blocks: list[Block], files: list[str], s: Settings, min_count: int, max_vocab: int | None, runner,
           progress, base_tokens: pa.Array | None = None) -> tuple[_Pass1, list[Block]]:
    counter, kinds, skips, notes, reads = TokenCounter(), TimeKinds(), Skips(), ReadNotes(), {}
    forgotten_users: set[str] = set()
    rule = s.opt.urls or RAW
    rows = events = key_bytes = null_tokens = empty_tokens = 0
    units: dict[str, str | None] = {}
    read_rows: set[str] = set()
    block_events = np.zeros(len(blocks), np.int64)

    def arrive(i, found):  # the counts merge in any order; what they weigh is freed at once
        if found.counts is not None:
            counter.add_counts(found.counts)
            found.counts = None

    for i, found in _run(runner, passes.count, [(b, _as_read(s)) for b in blocks], progress,
                         _ray_memory(runner, 256 << 20), arrive, rows=lambda r: r.rows):
        _checked(blocks[i], found, kinds, s.opt)
        units[blocks[i].path] = found.unit or units.get(blocks[i].path)
        if found.rows:
            read_rows.add(blocks[i].path)
        rows += found.rows
        events += found.events
        block_events[i] = found.events
        key_bytes += found.key_bytes
        null_tokens += found.null_tokens
        empty_tokens += found.empty_tokens
        skips.merge(found.skips)
        notes.merge(found.notes)
        forgotten_users |= found.forgotten_users
        reads[i] = found
    if rows == 0:
        raise CorpusError(f"{_name_files(files)}: the inputs hold no rows"
                          + (" (every file is empty)" if skips.counts["empty_files"] == len(files) else ""))
    skips.add("null_tokens", null_tokens)
    skips.add("empty_tokens", empty_tokens)
    if events == 0:
        raise CorpusError(f"{_name_files(files)}: nothing to prepare, every row was skipped "
                          f"({_compact(skips.counts)})")
    counts = counter.table()
    read_words, http_words = counts.num_rows, http_urls(counts["token"].combine_chunks()) if rule.normalize else 0
    counts = _normalized_counts(counts, rule).sort_by([("count", "descending"), ("token", "ascending")])
    known = 0
    input_words = known_words = counts.num_rows
    if base_tokens is not None:  # the base's tokens keep their ids, whatever their count now
        known = len(base_tokens)
        counts = counts.filter(pc.invert(pc.is_in(counts["token"], value_set=base_tokens)))
        known_words = input_words - counts.num_rows
    frequent = pc.greater_equal(counts["count"], min_count)
    below = pc.sum(counts["count"].filter(pc.invert(frequent))).as_py() or 0
    vocab = counts.filter(frequent)
    beyond = 0
    if max_vocab is not None and known + vocab.num_rows > max_vocab:
        room = max(0, max_vocab - known)
        beyond = pc.sum(vocab["count"].slice(room)).as_py() or 0
        vocab = vocab.slice(0, room)
    if vocab.num_rows == 0 and base_tokens is None:
        lost = _compact(skips.counts)
        raise CorpusError(f"{_name_files(files)}: no token occurs at least min_count={min_count} times"
                          + (f" (skipped: {lost})" if lost else ""))
    if base_tokens is not None:  # new tokens after the base's, by frequency among themselves
        vocab = pa.concat_tables([pa.table({"token": base_tokens, "count": pa.array(np.zeros(known, np.int64))}),
                                  vocab.select(["token", "count"])])
    vocab = vocab.append_column("id", pa.array(np.arange(vocab.num_rows, dtype=np.int32)))
    skips.add("tokens_below_min_count", below)
    skips.add("tokens_beyond_max_vocab", beyond)
    return (_Pass1(rows, events, key_bytes, skips, vocab.combine_chunks(), notes, input_words, known_words, units,
                   read_rows, read_words=read_words, http_words=http_words, block_events=block_events,
                   forgotten_users=len(forgotten_users)),
            _next_units(blocks, reads))


def _as_read(s: Settings) -> Settings:
    """The settings with the tokens read as they are written: pass 1 counts them so, and normalises the
    counts' distinct tokens once (_normalized_counts), which gives the report its tokens as read too."""
    return dataclasses.replace(s, opt=dataclasses.replace(s.opt, urls=None)) if s.opt.urls is not None else s


def _normalized_counts(counts: pa.Table, rule: UrlRule) -> pa.Table:
    """(token, count) of tokens as read → of tokens by the URL rule, the counts of a page's forms summed."""
    tokens = counts["token"].combine_chunks()
    fixed = normalize_distinct(tokens, rule)
    if fixed is tokens:
        return counts
    summed = pa.table({"token": fixed, "count": counts["count"].combine_chunks()}).group_by("token")
    return summed.aggregate([("count", "sum")]).rename_columns(["token", "count"])


def _choose_buckets(p1: _Pass1, has_time: bool, memory_budget_bytes: int, base_events: int = 0) -> int:
    """Enough buckets that pass 3's working set for one bucket fits the budget.

    Per event a bucket holds its key (bytes + offset), token and time on disk; sorting and grouping
    need about three times that in memory plus a few index arrays. A base adds its documents' rows
    (a marker each, and their tokens when joined), with a time and a base id each.
    """
    per_event = p1.key_bytes / max(p1.events, 1) + 8 + (8 if has_time or base_events else 0) + (8 if base_events else 0)
    working_set = (p1.events + base_events) * (3 * per_event + 32)
    return max(1, math.ceil(working_set / max(memory_budget_bytes, 1)))


# ---------------------------------------------------------------------------------------------------
# Passes 2 and 3: spills → shards, then the files made of every bucket's parts
# ---------------------------------------------------------------------------------------------------

def _pass2(parts: list, s: Settings, runner, progress, memory: int, data_files: list[str] | None = None,
           units: dict | None = None) -> list[passes.Spilled]:
    """The spills of the parts (blocks of the inputs, then a base's parts) in their order; data_files: the
    inputs that hold rows, read through Ray Data (raydata.spill) in place of the parts that are blocks."""
    first = []
    if data_files is not None:
        blocks = {}  # with a base, a file's events carry its first block's index (raydata.spill)
        for part in parts if s.base is not None else ():
            if isinstance(part, Block):
                blocks.setdefault(part.path, part.index)
        first = raydata.spill(data_files, s, units, runner.tasks, progress, memory, blocks)
        parts = [p for p in parts if not isinstance(p, Block)]
    spills: list[passes.Spilled] = [None] * len(parts)
    for i, found in _run(runner, passes.spill, [(part, i, s) for i, part in enumerate(parts)], progress, memory,
                         rows=lambda r: r.rows):
        spills[i] = found
    return first + spills


@dataclass
class _Pass3:
    shards: list[dict]
    num_docs: int
    num_tokens: int
    counts: np.ndarray
    docs_without_tokens: int
    heldout: int
    duplicate_events: int
    docs_with_one_token: int     # before the held-out split
    docs_without_heldout: int    # fewer than 2 distinct tokens: nothing to hide
    first_ids: list[int]         # each bucket's first new document's id
    time_range: list | None = None   # earliest and latest event time kept (seconds), with a time column
    refresh: dict | None = None      # with a base: what is new, what grew, what no longer appears
    in_base: int = 0                 # input events a base had, dropped
    capped: shard_pass.Capped = dataclasses.field(default_factory=shard_pass.Capped)  # --max-tokens-per-doc
    in_base_blocks: np.ndarray | None = None  # with a base: in_base, and early events, of each input block
    early_blocks: np.ndarray | None = None


def _pass3(spills: list[passes.Spilled], s: Settings, vocab_size: int, runner, progress, memory: int,
           rows: int, base: Base | None, blocks: int = 0) -> _Pass3:
    """Every bucket's shard, numbered in bucket order: a bucket's new documents after the earlier
    buckets'. A bucket that ran before its first id was known is renumbered (shard_pass.renumber). With a
    base, the events it had and those at or before its latest time are counted for each of the
    `blocks` input blocks."""
    counts, new_word_counts = np.zeros(vocab_size, np.int64), np.zeros(vocab_size, np.int64)
    next_id = base.num_docs if base is not None else 0
    numbered = 0  # buckets whose results are in, in order: the next one's first id is known
    first_ids, shards, renumber = [], [], []
    total = dict.fromkeys(("empty", "heldout", "duplicates", "single", "nothing_hidden", "early", "late_users",
                           "in_base", "base_untimed", "input_users", "known_input_users"), 0)
    capped = shard_pass.Capped()
    first_time, last_time = np.inf, -np.inf
    base_lengths = base.docs.column("length").to_numpy().copy() if base is not None else None
    grown = np.zeros(base.num_docs if base is not None else 0, bool)
    in_base_blocks, early_blocks = np.zeros(blocks, np.int64), np.zeros(blocks, np.int64)

    def calls():
        for b in range(s.buckets):
            here = [(sp.path, np.flatnonzero(sp.buckets == b)) for sp in spills]
            yield b, [(path, found) for path, found in here if len(found)], s, next_id if numbered == b else None

    for b, found in _run(runner, shard_pass.shard, calls(), memory=memory):
        progress.update(rows / s.buckets)
        first_ids.append(next_id)
        if found.renumber:
            renumber.append((os.path.join(s.tmp, found.shard["path"]), next_id))
        next_id += found.new_docs
        numbered = b + 1
        shards.append(found.shard)
        counts[found.counts[0]] += found.counts[1]
        for key in total:
            total[key] += getattr(found, key)
        if found.time_range is not None:
            first_time, last_time = min(first_time, found.time_range[0]), max(last_time, found.time_range[1])
        if found.capped is not None:
            capped.docs, capped.tokens = capped.docs + found.capped.docs, capped.tokens + found.capped.tokens
            capped.keys += found.capped.keys[:max(0, capped.EXAMPLES - len(capped.keys))]
        if base is not None:
            new_word_counts[found.new_words[0]] += found.new_words[1]
            base_lengths[found.base_ids] = found.base_lengths
            grown[found.grown] = True
            for merged, counted in ((in_base_blocks, found.in_base_blocks), (early_blocks, found.early_blocks)):
                if counted is not None:
                    merged[counted[0]] += counted[1]
    for _ in _run(runner, shard_pass.renumber, renumber):
        pass
    refresh = None
    if base is not None:
        _write_refreshed_docs(s, base, base_lengths, first_ids)
        refresh = _refresh_summary(s.tmp, base, next_id, grown, base_lengths, new_word_counts, counts, total)
    else:
        _write_docs(s, first_ids)
    time_range = [first_time, last_time] if np.isfinite(first_time) else None
    return _Pass3(shards, next_id, int(counts.sum()), counts, total["empty"], total["heldout"], total["duplicates"],
                  total["single"], total["nothing_hidden"], first_ids, time_range, refresh, total["in_base"], capped,
                  in_base_blocks if base is not None else None, early_blocks if base is not None else None)


def _new_docs(s: Settings, first_ids: list[int]):
    """Record batches of docs.arrow's new documents, bucket after bucket, with their ids."""
    for b, first in enumerate(first_ids):
        reader = pa.ipc.open_file(pa.memory_map(shard_pass.docs_part(s, b)))
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pa.array(np.arange(first, first + batch.num_rows, dtype=np.int64)),
                 batch.column(1)], schema=DOCS_SCHEMA)
            first += batch.num_rows


def _write_docs(s: Settings, first_ids: list[int]) -> None:
    with pa.OSFile(os.path.join(s.tmp, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, DOCS_SCHEMA) as writer:
        for batch in _new_docs(s, first_ids):
            writer.write_batch(batch)


def _write_refreshed_docs(s: Settings, base: Base, lengths: np.ndarray, first_ids: list[int]) -> None:
    """docs.arrow of a refreshed corpus, sorted by id: the base's rows (keys and ids as they were,
    the new lengths), then the new users'."""
    with pa.OSFile(os.path.join(s.tmp, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, DOCS_SCHEMA) as writer:
        for batch in base.docs.to_batches(max_chunksize=1 << 20):
            start = batch.column(1)[0].as_py()
            writer.write_batch(pa.RecordBatch.from_arrays(
                [batch.column(0), batch.column(1), pa.array(lengths[start:start + batch.num_rows])], schema=DOCS_SCHEMA))
        for batch in _new_docs(s, first_ids):
            writer.write_batch(batch)


def _write_heldout(s: Settings, path: str) -> None:
    """The held-out file: every bucket's hidden pairs, bucket after bucket."""
    with pq.ParquetWriter(path, HOLDOUT_SCHEMA) as writer:
        for b in range(s.buckets):
            part = shard_pass.heldout_part(s, b)
            if os.path.exists(part):
                writer.write_table(pa.ipc.open_file(pa.memory_map(part)).read_all())


def _refresh_summary(tmp: str, base: Base, num_docs: int, grown: np.ndarray, base_lengths: np.ndarray,
                     new_word_counts: np.ndarray, counts: np.ndarray, total: dict) -> dict:
    """changed.arrow (the new users and those with new events, late ones too), and corpus.json's "refresh"
    counts (of pass 3's totals, `total`)."""
    write_changed(tmp, np.concatenate([np.flatnonzero(grown), np.arange(base.num_docs, num_docs)]))
    known_words = min(base.vocab_size, len(counts))
    return {"base": base.path, "base_kind": base.kind, "base_docs": base.num_docs,
            "base_vocab": base.vocab_size, "new_docs": num_docs - base.num_docs,
            "grown_docs": int(grown.sum()), "docs_without_new_events": int(base.num_docs - grown.sum()),
            "empty_base_docs": int(np.count_nonzero(base_lengths == 0)),
            "new_words": len(counts) - base.vocab_size,
            "words_without_new_events": int(np.count_nonzero(new_word_counts[:known_words] == 0)),
            "words_without_tokens": int(np.count_nonzero(counts == 0)),
            "events_not_after_base": total["early"], "users_with_events_not_after_base": total["late_users"],
            "events_in_base": total["in_base"], "base_keeps_times": base.times_kept,
            "base_tokens_without_time": total["base_untimed"], "input_users": total["input_users"],
            "known_input_users": total["known_input_users"]}
