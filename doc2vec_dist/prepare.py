"""prepare: raw events in, a corpus directory out (the format is corpus.py's).

Changes when the way a corpus is made changes: the passes, the vocabulary, the held-out split, the
skips and their report. `prepare` turns browsing events (or token lists, or plain text; readers.py)
into the corpus that training reads. It never holds the events in memory, only the vocabulary (one
row per distinct token):

    pass 1  read every block of the inputs, count tokens and rows, check columns → vocabulary, ids by
            frequency
    pass 2  read every block again, map tokens to ids, spill each event into bucket hash(key) % B
    pass 3  per bucket: group the events into documents, hold out, number them, write shard b

B is chosen so that one bucket fits in `memory_budget_bytes`. Everything is written under a temporary
sibling of the output directory and renamed into place at the very end, so an error or an interrupt
never leaves a half-written corpus behind.

Each pass is a function of one block of the inputs (readers.plan_blocks: a file, or a run of a big
Parquet file's row groups) or of one bucket, with the settings (passes.py); this module runs them
and merges what they return, in input order. With parallel 1 they run one after another in this
process; with parallel N as Ray tasks, N at a time, on a local Ray or a cluster (runners.RayTasks); with
0 a task per CPU, but in this process where the input is too small for tasks to pay (processes_that_pay).
The corpus is the same either way: the blocks depend on the inputs alone, and every result is
merged in the order of its block or bucket. Through Ray every node must see the output's directory
(the spills and shards are written there) and the inputs.

Within a shard, documents keep the order in which they first appear in the input, so a small text
corpus (one shard) has doc id == line number unless lines were skipped.

Bad input. Each kind either stops `prepare` with a one-line CorpusError naming the file (and the column
and row where known), leaving nothing at the output, or is skipped, counted in corpus.json's "skipped"
(where the first few were in "skipped_where") and reported one line per reason (logged as warnings
of the "doc2vec_dist.prepare" logger). Rows and lines in messages are counted from 0 within their
file (a CSV header is not a row), as text keys are. Of several bad blocks, the first in input order
is the one named, however many processes read them.

    errors   no input file; a missing column (the message lists the columns the file has); a key or
             token column holding lists or structs; a time column that is not a time; a file that is
             not what its name says (a corrupt or truncated Parquet among good ones, malformed JSON
             or CSV rows); invalid UTF-8 in a column of a CSV, JSON or Parquet file (a whole file in
             another encoding is the usual cause, and training on whatever part decodes would be
             wrong silently); all inputs empty, or nothing left once the skips below are made.
    skips    files in an input folder that are not data ("unread_files": a README.txt, a .DS_Store,
             a hidden folder; readers.bookkeeping's _SUCCESS, _metadata, .crc pass quietly);
             an empty file among non-empty ones; rows whose key is null or empty ("null_keys",
             "empty_keys"); null or empty tokens; text lines that are not valid UTF-8 (the line
             keeps its number, so later keys do not shift); duplicate events, i.e. the same
             (key, token, time) more than once when time_col is given ("duplicate_events": without
             a time column a repeated (user, URL) is a repeated visit, which is signal, and is kept;
             rows without a time are never duplicates); with a base, events it has ("events_in_base":
             the same key, token and time); tokens below min_count or beyond max_vocab; a document's
             earliest events beyond max_tokens_per_doc ("tokens_beyond_max_per_doc", opt-in);
             documents left with no token.
    kept     integer, float and boolean keys and tokens become strings ("7" from 7 and from 7.0, so
             ids written as numbers by one exporter and as strings by another still meet, as do
             JSON lines whose ids are strings in some rows and numbers in others); documents
             with a single token train like any other and are counted in "docs_with_one_token";
             with holdout, a document with fewer than 2 distinct tokens keeps them all for training
             ("docs_without_heldout"). Long documents are kept whole unless max_tokens_per_doc says
             otherwise: a user with millions of events is one document (gensim would cut it at 10,000
             tokens); one above HEAVY_SHARE of all tokens is named ("heavy_docs"), a line each.
             Events with a null time are kept, after their user's timed events, counted
             ("events_without_time") and said.

Vocabulary counts for min_count and max_vocab are taken before duplicates are removed (pass 1 sees
events, not users); the counts in vocab.arrow are those of the training tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import compact, forgotten, outputs, passes, raydata, runners, storage
from .config import PrepareConfig
from .corpus import (
    DOCS_SCHEMA,
    FORMAT_VERSION,
    HOLDOUT_SCHEMA,
    VOCAB_SCHEMA,
    Corpus,
    CorpusError,
    one_line,
    write_changed,
)
from .errors import UserError
from .passes import Base, Settings, TokenCounter, hold_out, open_base, stored_time_range  # noqa: F401 (hold_out: tune's)
from .readers import (
    FORMATS,
    ORDER,
    TIME_UNITS,
    Block,
    Options,
    ReadNotes,
    Skips,
    TimeKinds,
    csv_delimiter,
    expand_inputs,
    input_bytes,
    plan_blocks,
)
from .urls import RAW, UrlRule, http_urls, normalize_distinct, recorded, report_line

log = logging.getLogger(__name__)


def _compact(counts: dict) -> str:
    """'null_keys 3, empty_files 1': the non-zero counts, for a message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)


def _name_files(files: list[str]) -> str:
    """The inputs in a message: all of them when few, the first three and a count when many."""
    return ", ".join(files) if len(files) <= 3 else f"{', '.join(files[:3])} and {len(files) - 3} more"


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
    capped: passes.Capped = dataclasses.field(default_factory=passes.Capped)  # --max-tokens-per-doc
    in_base_blocks: np.ndarray | None = None  # with a base: in_base, and early events, of each input block
    early_blocks: np.ndarray | None = None


def _pass3(spills: list[passes.Spilled], s: Settings, vocab_size: int, runner, progress, memory: int,
           rows: int, base: Base | None, blocks: int = 0) -> _Pass3:
    """Every bucket's shard, numbered in bucket order: a bucket's new documents after the earlier
    buckets'. A bucket that ran before its first id was known is renumbered (passes.renumber). With a
    base, the events it had and those at or before its latest time are counted for each of the
    `blocks` input blocks."""
    counts, new_word_counts = np.zeros(vocab_size, np.int64), np.zeros(vocab_size, np.int64)
    next_id = base.num_docs if base is not None else 0
    numbered = 0  # buckets whose results are in, in order: the next one's first id is known
    first_ids, shards, renumber = [], [], []
    total = dict.fromkeys(("empty", "heldout", "duplicates", "single", "nothing_hidden", "early", "late_users",
                           "in_base", "base_untimed", "input_users", "known_input_users"), 0)
    capped = passes.Capped()
    first_time, last_time = np.inf, -np.inf
    base_lengths = base.docs.column("length").to_numpy().copy() if base is not None else None
    grown = np.zeros(base.num_docs if base is not None else 0, bool)
    in_base_blocks, early_blocks = np.zeros(blocks, np.int64), np.zeros(blocks, np.int64)

    def calls():
        for b in range(s.buckets):
            here = [(sp.path, np.flatnonzero(sp.buckets == b)) for sp in spills]
            yield b, [(path, found) for path, found in here if len(found)], s, next_id if numbered == b else None

    for b, found in _run(runner, passes.shard, calls(), memory=memory):
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
    for _ in _run(runner, passes.renumber, renumber):
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
        reader = pa.ipc.open_file(pa.memory_map(passes.docs_part(s, b)))
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
            part = passes.heldout_part(s, b)
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


# ---------------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------------

def _check(c: PrepareConfig, out: str) -> Base | None:
    """The settings checked against each other, and the base opened: before anything is read."""
    if c.format not in FORMATS:
        raise CorpusError(f"format '{c.format}' is not one of {', '.join(FORMATS)}")
    if c.time_col and c.format != "events":
        raise CorpusError(f"time_col '{c.time_col}' applies to --format events only, not {c.format}")
    if c.min_count < 1:
        raise CorpusError(f"min_count must be >= 1, not {c.min_count}")
    if c.max_vocab is not None and c.max_vocab < 1:
        raise CorpusError(f"max_vocab must be >= 1, not {c.max_vocab}")
    if c.num_shards is not None and c.num_shards < 1:
        raise CorpusError(f"num_shards must be >= 1, not {c.num_shards}")
    if c.max_tokens_per_doc is not None and c.max_tokens_per_doc < 1:
        raise CorpusError(f"--max-tokens-per-doc must be >= 1, not {c.max_tokens_per_doc}")
    if c.memory_budget_bytes < 1:
        raise CorpusError(f"memory_budget_bytes must be >= 1, not {c.memory_budget_bytes}")
    if c.parallel is not None and c.parallel < 0:
        raise CorpusError(f"--parallel must be >= 0 (0: a task per CPU of the Ray cluster), not {c.parallel}")
    if c.engine == "data" and c.parallel in (None, 1):
        raise CorpusError("--engine data runs pass 2 on Ray: give --parallel N (N > 1, or 0: a task per CPU)")
    if not 0 <= c.holdout < 1:
        raise CorpusError(f"holdout must lie in [0, 1), not {c.holdout}")
    if c.holdout > 0 and not c.holdout_out:
        raise CorpusError("holdout > 0 needs holdout_out, the Parquet file for the hidden tokens")
    if c.holdout == 0 and c.holdout_out:
        raise CorpusError(f"{c.holdout_out}: holdout_out is given but holdout is 0")
    if c.expire_days is not None and not c.expire_days > 0:
        raise CorpusError(f"--expire-days must be > 0, not {c.expire_days:g}")
    if c.expire_days is not None and (c.base is None or not c.time_col):
        raise CorpusError("--expire-days applies to a refresh (--base) with event times (--time-col): it drops the "
                          "base's users with no event in the last N days")
    if c.expire_days is not None and c.window_days is not None and c.expire_days > c.window_days:
        raise CorpusError(f"--expire-days {c.expire_days:g} is longer than --window-days {c.window_days:g}: a window's "
                          "documents hold its last days only, so a user last seen before it cannot be told from one "
                          "long gone; give --expire-days at most the window")
    if c.window_days is not None and not (c.window_days > 0 and c.time_col):
        raise CorpusError("--window-days needs a time column (--time-col) and a number of days > 0"
                          if not c.time_col else f"--window-days must be > 0, not {c.window_days}")
    if c.time_unit is not None and (c.time_unit not in TIME_UNITS or not c.time_col):
        raise CorpusError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {c.time_unit!r}"
                          if c.time_unit not in TIME_UNITS else "--time-unit needs a time column (--time-col)")
    if c.base is None:
        return None
    if c.format == "text":
        raise CorpusError("--base with --format text: a text document's key is its line number, so new lines "
                          "cannot join the documents of earlier ones; use --format lists or events")
    if c.holdout > 0:
        raise CorpusError("--base with --holdout: the base's users were trained on everything they had; hold "
                          "events out of the inputs before preparing the base instead")
    if os.path.abspath(os.fspath(c.base)).rstrip(os.sep) == out:
        raise CorpusError(f"{out}: --out is the --base; a refresh writes a new corpus and never changes its base")
    found = open_base(c.base, join=c.window_days is None)
    if c.expire_days is not None and c.window_days is None and not found.times_kept:
        raise CorpusError(f"{found.path}: keeps no event times (prepared before corpora kept them, or without "
                          "--time-col), so --expire-days cannot tell when its users were last seen; prepare the base "
                          "anew with --time-col")
    base_range, base_unit, read_as = stored_time_range(found.meta)
    if c.time_col and base_unit == ORDER:
        raise CorpusError(f"{found.path}: its times {base_range} are numbers that only order events, no "
                          "epoch time, so new events cannot be told from those it has: prepare the base again "
                          "with --time-unit, or refresh without --time-col")
    if read_as and c.time_col:
        log.info(f"{found.path}: its corpus.json predates time units; its time range read as {read_as}")
    return found


def _url_rule(c: PrepareConfig, base: Base | None) -> UrlRule:
    """The rule by which the token column's URLs are normalised (urls.py): the settings' (on unless
    --no-normalize), never for text; with a base, the base's rule, recorded in its vocab.arrow (none
    recorded: as written), so that today's events name a page as the base does; a flag that asks for
    another rule is refused in one line naming both."""
    given = {"--no-normalize": c.no_normalize, "--drop-query": c.drop_query, "--merge-www": c.merge_www,
             f"--drop-params {c.drop_params!r}": c.drop_params is not None}
    if c.format == "text":
        asked = next((flag for flag, on in given.items() if on and flag != "--no-normalize"), None)
        if asked:
            raise CorpusError(f"{asked} applies to the URLs of --format events and lists; text tokens are taken as "
                              "written")
        return RAW
    rule = UrlRule.of_settings(c.no_normalize, c.drop_query, c.drop_params, c.merge_www)
    if base is None:
        return rule
    theirs = recorded(os.path.join(base.path, "vocab.arrow"))
    differs = {"--no-normalize": theirs.normalize, "--drop-query": not theirs.drop_query,
               "--merge-www": not theirs.merge_www}
    for flag, on in given.items():
        if on and differs.get(flag, rule.drop_params != theirs.drop_params or not theirs.normalize):
            raise CorpusError(f"{flag}: the base {base.path} was prepared with {theirs.describe()}, and a refresh "
                              "reads its events by the base's URL rule so that a page stays the word it was; leave "
                              "the flag out, or prepare a new corpus without --base")
    return theirs


def prepare(inputs: list[str], out: str, config: PrepareConfig | None = None, *, overwrite: bool = False,
            progress: bool = True, report: bool | None = None) -> Corpus:
    """Build a corpus directory at `out` from the inputs (see the module docstring) as `config` says,
    and open it.

    With holdout=F > 0, each document with at least 2 distinct tokens has max(1, round(F × distinct))
    of them (never all: at least one stays) removed from its training tokens and written as
    (key, token) rows to the Parquet file `holdout_out`; a document with one distinct token keeps it.
    Raises CorpusError (naming the file, column or row) on bad input, and on an output that cannot be
    written; on any error nothing is left at `out` or `holdout_out`, nor directories made for them.
    What was skipped, and why, is in corpus.json ("skipped", "skipped_where"); with `report` (by
    default: with `progress`) a summary and one line per reason are logged (`skip_report`; the
    dropped as warnings, the rest as information, on the "doc2vec_dist.prepare" logger).

    base (a corpus, or a model whose corpus is still there) is a daily refresh: every user and URL of
    the base keeps its id, new ones come after (URLs by their frequency among the new); a user's new
    events join the document it had, after its earlier tokens (in time order, late ones among them,
    with a time column), and every earlier document stays (its user kept, with no new event). An
    input event the base has (the same user, URL and time: a corpus prepared with a time column keeps
    its tokens' times) is dropped and counted, so a cumulative export is harmless; every other is
    new, whatever its time. With window_days (and time_col) a document is instead the
    events of the last N days before the latest one; a known user with none keeps its id and an empty
    row. Counts, and so subsampling and negatives, are the new corpus's. changed.arrow lists the new
    users and those with new events (train --first-epoch changed). corpus.json's "refresh" counts
    what is new, what grew and what no longer appears, and ("files") the events of each input file the
    base had, so that the report names a cumulative export among files of new events. A base that knows none of the inputs' users is
    an error (it is not an earlier corpus of these events), one that knows fewer than
    LOW_OVERLAP of them a warning.

    Times (readers.py) become epoch seconds, UTC, as they are read; numeric ones are in time_unit
    (s, ms, us, ns) or, by default, in the unit their size says, file by file. corpus.json's
    "time_range" and "window_start" are in the unit "time_unit" names: "s" (epoch seconds), or
    "order" when the times were numbers that only order events (refused with window_days or base);
    "time_read" says how each file's times were read. delimiter: of CSV/TSV fields (default ',' for
    .csv, a tab for .tsv).

    parallel: 1 (or None) runs the passes in this process; N > 1 as Ray tasks, N at a time, on the Ray
    this process is connected to, else the cluster at `address` (or RAY_ADDRESS), else a local Ray of N
    CPUs started here; 0 as many at a time as the cluster has CPUs, or in this process where the input is
    too small for tasks to pay (processes_that_pay). The corpus is the same.
    """
    c = dataclasses.replace(config) if config is not None else PrepareConfig()
    delimiter = csv_delimiter(c.delimiter)
    out = os.path.abspath(os.fspath(out)).rstrip(os.sep)
    found_base = _check(c, out)
    rule = _url_rule(c, found_base)
    outputs.check_dir(out, "corpus", overwrite)  # only a corpus of ours is replaced, and only when asked
    if c.holdout_out:
        outputs.check_file(os.path.abspath(c.holdout_out), "heldout", overwrite)
    for path in (out, c.holdout_out):  # a read-only or forbidden place is named before any reading
        outputs.check_writable(path)
    unread: list[str] = []
    files = expand_inputs(inputs, c.format, unread)
    opt = Options(c.format, c.doc_col, c.token_col, c.time_col if c.format == "events" else None, c.time_unit,
                  delimiter, "--window-days" if c.window_days is not None else "--base" if c.base is not None else None,
                  rule if rule.normalize else None)
    blocks = plan_blocks(files, opt)
    c.parallel, line = processes_that_pay(c.parallel, input_bytes(files))
    if line:
        log.info(line)
    hold_final = os.path.abspath(c.holdout_out) if c.holdout_out else None
    made: list[str] = []  # directories we create for the outputs, removed again on failure
    try:
        made += outputs.make_dirs(os.path.dirname(out))
        if hold_final:
            made += outputs.make_dirs(os.path.dirname(hold_final))
        # Both outputs appear whole or not at all, and replace only what was checked at the start (a
        # corpus or held-out file of ours, or nothing): the corpus is committed first, then the file.
        with (outputs.replacing(hold_final, "heldout", overwrite) if hold_final
              else contextlib.nullcontext()) as held, outputs.replacing(out, "corpus", overwrite) as staged, \
                _runner(c) as runner:
            meta, p3 = _passes(c, inputs, files, blocks, opt, staged.path, held.path if held else None, hold_final,
                               found_base, runner, progress, unread)
    except BaseException as e:
        outputs.remove_dirs(made)
        if isinstance(e, OSError):  # reading errors are CorpusErrors already: this is the output
            raise CorpusError(f"{out}: cannot write the corpus: {one_line(e)}") from e
        raise

    if report is None:
        report = progress
    if report:
        lines = skip_report(meta)
        log.info(f"prepared {out}: {p3.num_docs:,} docs, {p3.num_tokens:,} tokens, vocabulary "
                 f"{meta['vocab_size']:,}, {meta['num_shards']} shard(s)"
                 + ("" if any(line.startswith("skipped") for line in lines) else "; skipped: nothing")
                 + (f"; held out {p3.heldout:,} (key, token) pairs to {hold_final}" if hold_final else ""))
        for line in lines:  # what was dropped or changed is a warning; what was kept, information
            (log.warning if line.startswith(("skipped", "stripped")) else log.info)(line)
        if c.format != "text":
            found = meta["distinct_tokens"]
            log.info(report_line(found["read"], found["normalised"], found["http_urls"], rule))
        for line in attention_lines(meta):
            log.warning(line)
        if meta.get("refresh"):
            for level, line in refresh_report(meta):
                log.log(level, line)
    return Corpus(out)


def _passes(c: PrepareConfig, inputs, files: list[str], blocks: list[Block], opt, tmp: str, hold_tmp: str | None,
            hold_final: str | None, found_base: Base | None, runner, progress: bool,
            unread: list[str] = ()) -> tuple[dict, _Pass3]:
    """The passes, into the staging directory `tmp` (and the held-out file's `hold_tmp`): corpus.json's
    contents, and pass 3's totals. unread: what the input folders hold that is not read (counted)."""
    if not runner.in_process:
        log.info(f"prepare: {len(blocks):,} block(s) of input, {runner.tasks} Ray task(s) at a time")
    known = [b.rows for b in blocks]
    bar = _Progress(progress, 3 + (c.window_days is not None), sum(known) if None not in known else None)
    try:
        s = Settings(opt, tmp, holdout=c.holdout, seed=c.seed, base=found_base.path if found_base else None)
        os.makedirs(s.spill_dir)
        os.makedirs(s.parts_dir)
        listed = _base_forget_list(found_base)
        if len(listed):  # the base's forgotten users: their events are left out of every pass, counted
            listed.write(os.path.join(s.parts_dir, forgotten.FILE))
            listed.write(os.path.join(tmp, forgotten.FILE))  # and the new corpus keeps the list
            s = dataclasses.replace(s, forget=os.path.join(s.parts_dir, forgotten.FILE))
        s = dataclasses.replace(s, run=uuid.uuid4().hex)
        with open(os.path.join(tmp, passes.RUN_NAME), "w") as fh:  # for the tasks to find (Settings.check_seen)
            fh.write(s.run)
        runner = runner.stopping_with(s.stop_path())  # Ray tasks still running when the run stops end at once
        if c.format == "text":
            blocks = _line_bases(blocks, runner)
        window = None
        if c.window_days is not None:
            bar.start("latest time")
            latest, blocks = _latest_time(blocks, files, s, runner, bar)
            window = _Window(c.window_days, latest - c.window_days * DAY_SECONDS, latest)
            s = dataclasses.replace(s, window_start=window.cutoff)
        join = window is None
        bar.start("count")
        p1, blocks = _pass1(blocks, files, s, c.min_count, c.max_vocab, runner, bar,
                            found_base.vocab_tokens if found_base else None)
        data = _data_engine(c, files, opt, runner)
        bar.know_rows(p1.rows)
        # a join keeps the base's shards by key hash, adding each user's new events to its own shard
        by_shard = (found_base is not None and join and c.num_shards is None
                    and found_base.corpus.meta.get("shards_by") == "key_hash")
        buckets = found_base.corpus.num_shards if by_shard else c.num_shards or _choose_buckets(
            p1, c.time_col is not None, c.memory_budget_bytes, found_base.token_count(join) if found_base else 0)
        s = dataclasses.replace(s, buckets=buckets, join=join, by_shard=by_shard,
                                base_rows=found_base is not None and not by_shard,
                                max_tokens_per_doc=c.max_tokens_per_doc)
        vocab_tokens = p1.vocab["token"].combine_chunks()
        with pa.OSFile(s.vocab_path(), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("token", pa.string())])) as w:
            w.write_table(pa.table({"token": vocab_tokens}), max_chunksize=1 << 20)
        memory = _ray_memory(runner, passes.task_bytes(c.memory_budget_bytes, len(vocab_tokens)))
        # what the tasks ask of the nodes, said once the bar has closed (a line under a live bar breaks it)
        memory_line = task_memory_line(memory, runner.tasks, runners.largest_node_memory()) if memory else None
        parts = blocks + (found_base.parts(join) if s.base_rows else [])
        bar.start("partition")
        spills = _pass2(parts, s, runner, bar, memory, [f for f in files if f in p1.read_rows] if data else None,
                        p1.units)
        bar.start("shards")
        p3 = _pass3(spills, s, len(vocab_tokens), runner, bar, memory, p1.rows, found_base if found_base else None,
                    len(blocks))
        if hold_tmp:
            _write_heldout(s, hold_tmp)
        shutil.rmtree(s.spill_dir)
        shutil.rmtree(s.parts_dir)
        os.remove(os.path.join(tmp, passes.RUN_NAME))
        seconds = bar.timings()
    finally:
        bar.close()
    if memory_line:
        log.info(memory_line)
    if p3.refresh is not None:
        _check_overlap(found_base, p3.refresh, p1, c.doc_col, window is not None)

    rule = s.opt.urls or RAW
    schema = VOCAB_SCHEMA.with_metadata(rule.schema_metadata())  # the URL rule travels with the vocabulary
    vocab = pa.table({"token": vocab_tokens, "count": pa.array(p3.counts), "id": p1.vocab["id"]}, schema=schema)
    with pa.OSFile(os.path.join(tmp, "vocab.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(vocab, max_chunksize=1 << 20)
    dropped = _drop_rows(c, tmp, found_base, listed, p3, window)
    p1.skips.add("duplicate_events", p3.duplicate_events)
    p1.skips.add("events_in_base", p3.in_base)
    p1.skips.add("tokens_beyond_max_per_doc", p3.capped.tokens)
    p1.skips.where.update({"tokens_beyond_max_per_doc": p3.capped.keys} if p3.capped.keys else {})
    p1.skips.add("docs_without_tokens", p3.docs_without_tokens)
    if unread:  # files in the input folders that are not data (readers.expand_inputs), bookkeeping apart
        p1.skips.add("unread_files", len(unread))
        p1.skips.where["unread_files"] = unread[:p1.skips.EXAMPLES]
    meta = {
        "format_version": FORMAT_VERSION,
        "num_docs": p3.num_docs, "num_tokens": p3.num_tokens,
        "vocab_size": dropped["vocab_size"] if dropped else len(vocab_tokens),
        "num_shards": buckets, "shards": p3.shards,
        "inputs": [os.fspath(i) for i in ([inputs] if isinstance(inputs, str) else inputs)],
        "input_files": [storage.location(f) for f in files], "input_rows": p1.rows,
        "format": c.format, "doc_col": c.doc_col, "token_col": c.token_col, "time_col": opt.time_col,
        "min_count": c.min_count, "max_vocab": c.max_vocab, "holdout": c.holdout,
        "url_rule": rule.to_json(),  # how the token column's URLs were normalised (urls.py)
        "distinct_tokens": {"read": p1.read_words, "normalised": p1.input_words, "http_urls": p1.http_words},
        "holdout_out": hold_final, "heldout_pairs": p3.heldout, "seed": c.seed,
        "skipped": p1.skips.counts, "skipped_where": p1.skips.where,
        "docs_with_one_token": p3.docs_with_one_token,
        "events_without_time": p1.notes.untimed if opt.time_col else None,
        "events_without_time_where": p1.notes.untimed_where,
        "max_tokens_per_doc": c.max_tokens_per_doc, "docs_capped": p3.capped.docs,
        "heavy_docs": _heavy_docs(tmp, p3.num_tokens),
        "docs_without_heldout": p3.docs_without_heldout if c.holdout > 0 else None,
        "time_range": _union(p3.time_range, found_base.time_range if found_base and join else None),
        "time_unit": (ORDER if ORDER in p1.notes.time_units else "s") if opt.time_col else None,
        "time_read": p1.notes.time_read, "delimiter": opt.delimiter,
        "stripped_whitespace": p1.notes.stripped, "stripped_where": p1.notes.stripped_where,
        "window_days": c.window_days, "shards_by": "key_hash",  # shard b holds the keys hashing to b
        "window_start": window.cutoff if window else None,
        "parallel": runner.tasks, "seconds": seconds,
        # what ran pass 2: this process, Ray tasks, or Ray Data (--engine data)
        "engine": "data" if data else "process" if runner.in_process else "tasks",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if p3.refresh is not None:
        meta["refresh"] = {**p3.refresh, "mode": "join" if join else "window", "input_events": p1.events,
                           "files": _files_in_base(files, blocks, p1.block_events, p3.in_base_blocks,
                                                   p3.early_blocks),
                           "forgotten_input_users": p1.forgotten_users,
                           "forgotten_input_events": p1.skips.counts["events_of_forgotten_users"],
                           **({k: v for k, v in dropped.items() if k != "vocab_size"} if dropped else {})}
        if c.expire_days is not None:
            meta["expire_days"] = c.expire_days
    with open(os.path.join(tmp, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta, p3


def _base_forget_list(base: Base | None) -> forgotten.ForgetList:
    """The users the base was told to forget (forgotten.py): a corpus's list, or a model's together with its
    corpus's; a model's own list is checked to be that model's."""
    if base is None:
        return forgotten.ForgetList()
    if base.kind == "corpus":
        return forgotten.of_corpus(base.path)
    from .modeldir import ModelDir

    listed = forgotten.of_model(base.path, ModelDir(base.path).manifest)
    return listed.merge(forgotten.of_corpus(base.corpus.path)) if base.corpus is not None else listed


def _drop_rows(c: PrepareConfig, tmp: str, base: Base | None, listed: forgotten.ForgetList, p3: _Pass3,
               window: _Window | None) -> dict | None:
    """The rows a refresh drops from the corpus staged at `tmp` (compact.py), counted for corpus.json's refresh:
    the base's users on its forget list; with --expire-days, the users with no event in the last N days
    before the latest event of the inputs and base (a user whose tokens carry no time cannot be judged and
    stays, counted), and then the URLs no user that stays visits. None when nothing is dropped. Updates
    p3's counts and shards; dropped.arrow names the base's rows that went, for the warm start."""
    if base is None:
        return None
    docs = passes.read_mapped(os.path.join(tmp, "docs.arrow"))
    forgotten_ids = np.flatnonzero(listed.matches(docs.column("key").slice(0, base.num_docs))) if len(listed) \
        else np.zeros(0, np.int64)
    expired = np.zeros(0, np.int64)
    found: dict = {}
    if c.expire_days is not None:
        shards = sorted(os.path.join(tmp, sh["path"]) for sh in p3.shards)
        latest = compact.latest_times(shards, p3.num_docs)
        newest = max([t for t in (p3.time_range[1] if p3.time_range else None, base.latest_time) if t is not None],
                     default=None)
        if newest is None:
            raise CorpusError(f"{base.path}: no event of the inputs or base has a time; --expire-days needs them")
        cutoff = newest - c.expire_days * DAY_SECONDS
        untimed = np.isnan(latest)
        expired = np.flatnonzero(~untimed & (latest < cutoff))  # -inf: a user with no event left at all
        found.update(expire_cutoff=cutoff, expire_latest=newest, users_kept_without_time=int(untimed.sum()))
    drop_docs = np.union1d(forgotten_ids, expired).astype(np.int64)
    if not len(drop_docs):
        return {**found, "expired_users": 0, "expired_urls": 0, "forgotten_base_users": 0} if found else None
    drop_words = None
    if c.expire_days is not None:  # URLs that only the users leaving visit: their count drops to 0
        left, leaving = p3.counts.copy(), np.zeros(p3.num_docs, bool)
        leaving[drop_docs] = True
        shards = [os.path.join(tmp, sh["path"]) for sh in p3.shards]
        for doc_ids, offsets, tokens, _ in (b for path in shards for b in passes.shard_batches(path)):
            np.subtract.at(left, tokens[np.repeat(leaving[doc_ids], np.diff(offsets))], 1)
        drop_words = np.flatnonzero(left == 0)
    counts = compact.compact_corpus(tmp, tmp, drop_docs, drop_words)
    compact.write_dropped(tmp, {"docs": drop_docs[drop_docs < base.num_docs],
                                "words": (drop_words[drop_words < base.vocab_size] if drop_words is not None
                                          else np.zeros(0, np.int64))})
    p3.num_docs, p3.num_tokens, p3.shards = counts["num_docs"], counts["num_tokens"], counts["shards"]
    return {**found, "expired_users": len(np.setdiff1d(expired, forgotten_ids)),
            "expired_base_users": int(np.count_nonzero(np.setdiff1d(expired, forgotten_ids) < base.num_docs)),
            "expired_urls": len(drop_words) if drop_words is not None else 0,
            "forgotten_base_users": len(forgotten_ids), "vocab_size": counts["vocab_size"]}


LOW_OVERLAP = 0.10


def _check_overlap(base: Base, refresh: dict, p1: _Pass1, doc_col: str, window: bool) -> None:
    """A base that knows none of the inputs' users is refused; one that knows few is a warning.

    In a daily refresh most of a day's users came before (a site's returning users), and new users
    are a minority; a base that knows under LOW_OVERLAP of them is more likely another site's or
    another id scheme's (hashed against raw ids, another doc_col) than the one these events follow.
    """
    users, known = refresh["input_users"], refresh["known_input_users"]
    inputs = "the inputs' window" if window else "the inputs"
    counts = (f"{known:,} of the {users:,} users in {inputs} and {p1.known_words:,} of their {p1.input_words:,} "
              f"URLs are known to it ({base.num_docs:,} users, {base.vocab_size:,} URLs)")
    if users and not known:
        raise CorpusError(f"{base.path}: --base shares no user with {inputs}: {counts}; is it an earlier corpus or "
                          f"model of these events (the same '{doc_col}')?")
    if users and known < LOW_OVERLAP * users:
        log.warning(f"{base.path}: --base knows only {known / users:.1%} of the users in {inputs}: {counts}; is "
                    "it an earlier corpus or model of these events?")


def _files_in_base(files: list[str], blocks: list[Block], events: np.ndarray, in_base: np.ndarray,
                   early: np.ndarray) -> list[dict]:
    """corpus.json's refresh.files: each input file with an event the base had, or one at or before its
    latest time (not_after_base: late data, or with a base without times perhaps the base's own), with
    its events (pass 1's) and those counts, in input order: the counts of its blocks summed."""
    position = {f: i for i, f in enumerate(files)}
    of_file = np.array([position[b.path] for b in blocks], np.int64)
    per_file = []
    for counts in (events, in_base, early):
        summed = np.zeros(len(files), np.int64)
        np.add.at(summed, of_file, counts)
        per_file.append(summed)
    return [{"file": storage.location(files[i]), "events": int(per_file[0][i]), "in_base": int(per_file[1][i]),
             "not_after_base": int(per_file[2][i])} for i in np.flatnonzero(per_file[1] + per_file[2])]


def _union(a: list | None, b: list | None) -> list | None:
    """The time range covering both (either may be None)."""
    if a is None or b is None:
        return a or b
    return [min(a[0], b[0]), max(a[1], b[1])]


# A cumulative export given as a day's events: most of a file's events are ones the base has.
MOSTLY_OLD = 0.5
# Files mostly of the base's events named a line each; the rest are counted on one line (corpus.json names each).
NAMED_FILES = 3


def refresh_report(meta: dict) -> list[tuple[int, str]]:
    """What a refresh (prepare --base) changed, as (logging level, line): one line of counts, then a line
    of its own for each thing to look at (a base without times, each input file that is mostly its events,
    late events)."""
    r = meta["refresh"]
    lines: list[tuple[int, str]] = []

    def say(level: int, text: str) -> None:
        lines.append((level, text))

    join = r["mode"] == "join"
    how = "new events joined to each user's document" if join else f"documents of the last {meta['window_days']:g} day(s)"
    inputs = ""
    if r.get("input_users"):
        inputs = (f" (of the inputs' {r['input_users']:,} users, {r['known_input_users']:,} known: "
                  f"{r['known_input_users'] / r['input_users']:.1%})")
    say(logging.INFO, f"refresh of {r['base']} ({how}): users {r['base_docs']:,} known, {r['new_docs']:,} new, "
        f"{r['grown_docs']:,} with new events, {r['docs_without_new_events']:,} without"
        + (f" ({r['empty_base_docs']:,} now empty)" if r["empty_base_docs"] else "") + inputs
        + f"; URLs {r['base_vocab']:,} known, {r['new_words']:,} new, {r['words_without_new_events']:,} known "
        "ones without new events" + (f", {r['words_without_tokens']:,} without any token now"
                                     if r["words_without_tokens"] else "")
        + "; ids kept, new ones after (row r lives on server r % S, so new rows spread evenly)")
    early = r.get("events_not_after_base", 0)
    untimed = join and r.get("base_tokens_without_time", 0)
    if untimed:
        told = ("keeps no event times (prepared before corpora kept them, or without --time-col)"
                if not r.get("base_keeps_times") else f"has {untimed:,} token(s) whose time it was never told "
                "(from a refresh of a base that kept none)")
        say(logging.WARNING, f"{r['base']}: {told}: an input event it already has cannot be told from a new one, "
            "and is joined again; prepare the base anew with --time-col to keep them")
    for line in _mostly_old_files(r.get("files") or [], bool(untimed)):
        say(logging.WARNING, line)
    gone = r.get("forgotten_input_users") or r.get("forgotten_base_users")
    if gone:
        say(logging.INFO, f"forgotten users left out: {r.get('forgotten_input_users', 0):,} with "
            f"{r.get('forgotten_input_events', 0):,} event(s) in the inputs, {r.get('forgotten_base_users', 0):,} "
            "still in the base (the base's forget list)")
    if meta.get("expire_days") is not None:
        when = datetime.fromtimestamp(r["expire_cutoff"], timezone.utc).isoformat(timespec="seconds")
        say(logging.INFO, f"expired: {r.get('expired_users', 0):,} user(s) with no event in the last "
            f"{meta['expire_days']:g} day(s) (none since {when}; {r.get('expired_base_users', 0):,} of them "
            f"known to the base) and {r.get('expired_urls', 0):,} URL(s) no user left visits; "
            f"{meta['num_docs']:,} users and {meta['vocab_size']:,} URLs stay (ids closed up in order)"
            + (f"; {r['users_kept_without_time']:,} user(s) whose events carry no time stay, unjudged"
               if r.get("users_kept_without_time") else ""))
    if early and join:
        say(logging.INFO, f"{early:,} input event(s) of {r.get('users_with_events_not_after_base', 0):,} user(s) "
            "are at or before the base's latest time "
            + ("(late data, or the base's own: see above)" if untimed else "and not in it (late data)")
            + ": joined to their documents in time order, their users counted as changed")
    elif early:
        say(logging.INFO, f"{early:,} input event(s) at or before the base's latest time are taken to be the base's "
            "(a window does not read its documents): not counted as new")
    return lines


def _mostly_old_files(files: list[dict], untimed: bool) -> list[str]:
    """A line for each input file (of corpus.json's refresh.files) whose events are mostly ones the base
    has: a cumulative export given as a day's events among files of new ones. With a base without times
    (untimed), which cannot say which it has, a file mostly at or before its latest time is named instead,
    as one that may be such an export. NAMED_FILES are named in all, the rest counted on one line."""
    sent = [f for f in files if f["events"] and f["in_base"] > MOSTLY_OLD * f["events"]]
    early = [f for f in files if untimed and f not in sent and f["events"]
             and f["not_after_base"] > MOSTLY_OLD * f["events"]]
    lines = []
    named = _named(sent, NAMED_FILES)
    for f in named:
        lines.append(f"{f['file']} looks like a cumulative export: {_share(f['in_base'], f['events'], 'its')} were "
                     "in the base already (the same user, URL and time): dropped, so the documents hold each event "
                     f"once; {f['events'] - f['in_base']:,} are new")
    if sent[len(named):]:
        lines.append(_rest_line(sent[len(named):], "in_base", "look like cumulative exports",
                                "were in the base already: dropped as well"))
    room = max(0, NAMED_FILES - len(named))
    named = _named(early, room)
    for f in named:
        lines.append(f"{f['file']} may be a cumulative export: {_share(f['not_after_base'], f['events'], 'its')} "
                     "are at or before the base's latest time, and the base cannot say which it has: if so, the "
                     "documents now hold those events twice; give the events since the base alone")
    if early[len(named):]:
        lines.append(_rest_line(early[len(named):], "not_after_base", "may be cumulative exports",
                                "are at or before the base's latest time"))
    return lines


def _named(files: list[dict], room: int) -> list[dict]:
    """The files named a line each, `room` at most: all of them when a single one would be left to count."""
    return files if len(files) <= room + 1 else files[:room]


def _share(found: int, events: int, whose: str) -> str:
    return f"{found:,} of {whose} {events:,} events ({found / events:.0%})"


def _rest_line(files: list[dict], count: str, what: str, how: str) -> str:
    found, events = sum(f[count] for f in files), sum(f["events"] for f in files)
    return (f"{len(files):,} more input files {what}: {_share(found, events, 'their')} {how} (corpus.json's "
            "refresh.files names each)")


# A document holding more than this share of all tokens, in a corpus of at least HEAVY_MIN_DOCS documents,
# is named: with 1,000 documents the mean holds 0.1%, so one over 5% holds 50 times it, which browsing
# histories (activity roughly log-normal) give a person about once in a million; a bot, a crawler or a
# shared id ("0", "unknown") gives it every day, and weighs on every URL it visits.
HEAVY_SHARE = 0.05
HEAVY_MIN_DOCS = 1000
HEAVY_NAMED = 5


def _heavy_docs(tmp: str, num_tokens: int) -> list[dict]:
    """The documents of the corpus at `tmp` above HEAVY_SHARE of its tokens (HEAVY_MIN_DOCS or more
    documents), largest first: key, tokens and share of each, at most HEAVY_NAMED."""
    docs = passes.read_mapped(os.path.join(tmp, "docs.arrow"))
    if docs.num_rows < HEAVY_MIN_DOCS or not num_tokens:
        return []
    lengths = docs.column("length").to_numpy()
    heavy = np.flatnonzero(lengths > HEAVY_SHARE * num_tokens)
    heavy = heavy[np.argsort(-lengths[heavy], kind="stable")][:HEAVY_NAMED]
    keys = docs.column("key").take(pa.array(heavy)).to_pylist()
    return [{"key": k, "tokens": int(lengths[i]), "share": round(float(lengths[i]) / num_tokens, 4)}
            for k, i in zip(keys, heavy)]


def attention_lines(meta: dict) -> list[str]:
    """Warnings of what prepare kept but a user should look at, a line each, from a corpus.json: events
    with no time, and documents that hold much of the corpus (HEAVY_SHARE)."""
    lines = []
    untimed, time = meta.get("events_without_time"), meta.get("time_col")
    if untimed:
        first = meta.get("events_without_time_where")
        where = f" (first: {', '.join(first)})" if first else ""
        lines.append(f"{untimed:,} event(s) with a null '{time}'{where}: " + (
            "outside any window, so left out (counted above)" if meta.get("window_days") else
            "kept, after their user's timed events (in input order); never a duplicate of another event, nor "
            "matched to one a base has"))
    doc = meta.get("doc_col") or "key"
    for heavy in meta.get("heavy_docs") or []:
        lines.append(f"document {heavy['key']!r} ('{doc}') holds {heavy['share']:.1%} of all tokens "
                     f"({heavy['tokens']:,} of {meta['num_tokens']:,}), over {HEAVY_SHARE:.0%}: a bot, a crawler "
                     "or a shared id more often than a person; --max-tokens-per-doc N keeps each document's latest "
                     "N events")
    return lines


def skip_report(meta: dict) -> list[str]:
    """One line per reason prepare dropped something, with the count and where the first ones were,
    then the keys and tokens it stripped of whitespace, how it read each file's times, and what it kept
    that is worth knowing (documents of a single token), from a corpus.json."""
    doc, tok, time = meta.get("doc_col"), meta.get("token_col"), meta.get("time_col")
    fmt = meta.get("format", "events")
    token = "event" if fmt == "events" else "token"
    what = {
        "empty_files": "empty input file(s)",
        "null_keys": f"row(s) with a null '{doc}'",
        "empty_keys": f"row(s) with an empty '{doc}'",
        "invalid_utf8_lines": "line(s) that are not valid UTF-8 (their keys are not reused)",
        "null_tokens": f"{token}(s) with a null '{tok}'" if fmt == "events" else "null token(s)",
        "empty_tokens": f"{token}(s) with an empty '{tok}'" if fmt == "events" else "empty token(s)",
        "events_outside_window": f"event(s) before the window of the last {meta.get('window_days')} day(s) "
                                 "(or without a time)",
        "duplicate_events": f"duplicate event(s): the same '{doc}', '{tok}' and '{time}' as an earlier one",
        "events_in_base": f"event(s) the base has already: the same '{doc}', '{tok}' and '{time}' as one of its own",
        "events_of_forgotten_users": "event(s) of users on the base's forget list (doc2vec-dist forget)",
        "tokens_beyond_max_per_doc": f"{token}(s) beyond max_tokens_per_doc={meta.get('max_tokens_per_doc')}: the "
                                     f"earliest of {meta.get('docs_capped', 0):,} document(s) longer than that",
        "unread_files": "file(s) in the input folders that are not data (hidden, or not .parquet, .csv, .jsonl …)",
        "tokens_below_min_count": f"{token}(s) of a token seen fewer than min_count={meta.get('min_count')} "
                                  "times",
        "tokens_beyond_max_vocab": f"{token}(s) of a token beyond the max_vocab={meta.get('max_vocab')} "
                                   "most frequent",
        "docs_without_tokens": "document(s) left with no token (each null, empty or out of the vocabulary)",
    }
    lines = []
    where = meta.get("skipped_where", {})
    for reason, count in meta.get("skipped", {}).items():
        if count:
            first = where.get(reason)
            lines.append(f"skipped {count:,} {what.get(reason, reason)}"
                         + (f" (first: {', '.join(first)})" if first else ""))
    for column, count in (meta.get("stripped_whitespace") or {}).items():
        first = (meta.get("stripped_where") or {}).get(column)
        lines.append(f"stripped leading or trailing whitespace from {count:,} '{column}' value(s), so that they "
                     "match the same values without it" + (f" (first: {', '.join(first)})" if first else ""))
    for what, files in (meta.get("time_read") or {}).items():
        lines.append(f"{_name_files(files)}: '{time}' read as {what}")
    if meta.get("docs_with_one_token"):
        lines.append(f"kept {meta['docs_with_one_token']:,} document(s) with a single {token}: they train "
                     "like any other")
    if meta.get("docs_without_heldout"):
        lines.append(f"held out nothing of {meta['docs_without_heldout']:,} document(s) with one distinct "
                     "token: it stays for training, so they are not in the held-out file")
    return lines
