"""Readers: input paths in, normalised chunks of (key, token, time) events out.

This module owns the blocks of the inputs that prepare's tasks read (plan_blocks, read_block) and what
reading one hands back (Chunk, Skips, ReadNotes). Changes when how the inputs are cut into blocks, or how a
block's batches become events (keys, stripping, URLs, lists and text split into tokens), changes. Its parts:
the files an input names and the options they are read with (read_files.py), each format's rows
(read_formats.py), the time columns (read_times.py). What `prepare` does with the events, and which bad input
stops it and which is skipped, is in prepare.py.

Input formats:

    events  rows of (doc_col, token_col[, time_col]) in Parquet, CSV/TSV or JSON lines; a user's
            events may be spread over many files. With time_col, each user's tokens are ordered by
            time (ties keep input order); otherwise by input order. Keys and tokens are stripped of
            leading and trailing whitespace; then the token column's absolute http(s) URLs are
            normalised by Options.urls (urls.py: one page, one token). CSV fields are separated by
            ',' (.csv) or a tab (.tsv), or by Options.delimiter.
    lists   one row per document: doc_col and token_col holding a list of tokens (Parquet, JSON lines);
            stripped and normalised as events' tokens are.
    text    one document per line, tokens separated by whitespace. The key of a document is its line
            number counted from 0 across the inputs concatenated in the order given (a directory's
            files in sorted order); a file that does not end in a newline still ends its last line.

Times. Every time column becomes float64 epoch seconds, UTC, as it is read (read_times.py):
timestamps of any unit and time zone (none: UTC), dates, ISO 8601 strings (with an offset, or UTC),
and numbers. Numbers are epoch times in Options.time_unit, or else in the unit their size says
(EPOCH_SECONDS: seconds 1e8..1e11, milliseconds 1e11..1e14, ...), found from the median of a file's
first block and then held for the whole file: a value of another size is an error naming its row, so
files in different units are each read right, and a file that mixes units is refused. Numbers too
small for any unit (sequence numbers) only order each user's events: accepted as they are unless an
option needs times (Options.epochs_for), never together with epoch times.

Errors are one-line CorpusErrors naming the file (and the column and row where known); rows and
lines in them are counted from 0 within their file (a CSV header is not a row), as text keys are.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import read_formats
from .corpus import CorpusError, one_line
from .read_files import Options, _file_kind, _input, _size, _stream
from .read_formats import (
    _as_string_lists,
    _as_strings,
    _csv_batches,
    _flatten_lists,
    _json_batches,
    _parquet_batches,
    _text_lines,
)
from .read_times import TimeReading, _time_seconds
from .urls import normalize

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# What reading hands back: the events (Chunk), what it dropped (Skips) and what it noted (ReadNotes)
# ---------------------------------------------------------------------------------------------------

@dataclass
class Chunk:
    """A batch of events, whatever the input format: event i is (key[i], token[i], time[i])."""

    key: pa.Array            # string, no nulls
    token: pa.Array          # string; null where the input had no usable token
    time: np.ndarray | None  # float64 epoch seconds (UTC), NaN for a missing time; None without time_col
    rows: int                # input rows (events, or documents for lists/text) this chunk covers
    padding: int = 0         # null tokens we added so that a document with no token is still seen


# Why prepare drops things, in the order it reports them (see prepare's docstring).
SKIP_REASONS = ("unread_files", "empty_files", "null_keys", "empty_keys", "invalid_utf8_lines", "null_tokens",
                "empty_tokens", "events_outside_window", "events_of_forgotten_users", "duplicate_events", "events_in_base",
                "tokens_below_min_count", "tokens_beyond_max_vocab", "tokens_beyond_max_per_doc", "docs_without_tokens")


class Skips:
    """What prepare dropped, by reason, and where the first few were, so the report can point at them."""

    EXAMPLES = 3

    def __init__(self):
        self.counts = dict.fromkeys(SKIP_REASONS, 0)
        self.where: dict[str, list[str]] = {}

    def add(self, reason: str, count: int, path: str | None = None, unit: str = "row", base: int = 0,
            at: np.ndarray | None = None) -> None:
        """Count `count` skips; `at` are their positions (from `base`) in `path`, in `unit`s."""
        if not count:
            return
        self.counts[reason] += int(count)
        if path is None:
            return
        where = self.where.setdefault(reason, [])
        room = self.EXAMPLES - len(where)
        if room > 0:
            where += [path] if at is None else [f"{path} {unit} {base + int(i)}" for i in at[:room]]

    def merge(self, later: Skips) -> None:
        """Add the skips of a later part of the inputs, as if it had been read after this one."""
        for reason, count in later.counts.items():
            self.counts[reason] += count
        _merge_examples(self.where, later.where, self.EXAMPLES)


def _merge_examples(into: dict[str, list[str]], later: dict[str, list[str]], limit: int) -> None:
    """The first `limit` examples of each reason (or column): `into`'s, then `later`'s."""
    for name, found in later.items():
        where = into.setdefault(name, [])
        where += found[:max(0, limit - len(where))]


class ReadNotes:
    """What reading the inputs decided or changed that prepare reports, though it drops nothing (that
    is Skips): how each file's time column was read, the events whose time is null (kept: prepare says
    where they go), and the keys and tokens stripped of leading or trailing whitespace
    (" https://a.com/ " and "https://a.com/" are one URL)."""

    EXAMPLES = 3

    def __init__(self):
        self.time_read: dict[str, list[str]] = {}   # how a time column was read → the files read so
        self.time_units: set[str | None] = set()    # TimeReading.unit of each
        self.stripped: dict[str, int] = {}          # column → values stripped
        self.stripped_where: dict[str, list[str]] = {}
        self.untimed = 0                            # events (of a usable key) with a null time
        self.untimed_where: list[str] = []

    def read_time(self, path: str, reading: TimeReading) -> None:
        files = self.time_read.setdefault(reading.what, [])
        if path not in files:
            files.append(path)
        self.time_units.add(reading.unit)

    def merge(self, later: ReadNotes) -> None:
        """Add what reading a later part of the inputs noted, as if it had been read after this one."""
        for what, files in later.time_read.items():
            mine = self.time_read.setdefault(what, [])
            mine += [f for f in files if f not in mine]
        self.time_units |= later.time_units
        for column, count in later.stripped.items():
            self.stripped[column] = self.stripped.get(column, 0) + count
        _merge_examples(self.stripped_where, later.stripped_where, self.EXAMPLES)
        self.untimed += later.untimed
        self.untimed_where += later.untimed_where[:max(0, self.EXAMPLES - len(self.untimed_where))]

    def no_time(self, path: str, missing: np.ndarray, base: int) -> None:
        """Count the events of `missing` (a mask of a batch's rows, from row `base` of `path`) with no time."""
        at = np.flatnonzero(missing)
        self.untimed += len(at)
        self.untimed_where += [f"{path} row {base + int(i)}" for i in at[:max(0, self.EXAMPLES - len(self.untimed_where))]]

    def strip(self, column: str, count: int, path: str, at: np.ndarray | None, base: int) -> None:
        if not count:
            return
        self.stripped[column] = self.stripped.get(column, 0) + count
        where = self.stripped_where.setdefault(column, [])
        room = self.EXAMPLES - len(where)
        if room > 0:
            where += [path] if at is None else [f"{path} row {base + int(i)}" for i in at[:room]]


def _stripped(arr: pa.Array, column: str, path: str, row_base: int, notes: ReadNotes | None,
              rows: bool = True) -> pa.Array:
    """Strings with leading and trailing whitespace removed, the values changed counted in `notes`
    (by row when `rows`, else by file)."""
    trimmed = pc.utf8_trim_whitespace(arr)
    if notes is not None:
        changed = pc.not_equal(pc.binary_length(arr), pc.binary_length(trimmed)).fill_null(False)
        count = pc.sum(changed).as_py() or 0
        if count:
            notes.strip(column, count, path, np.flatnonzero(changed.to_numpy(zero_copy_only=False)) if rows else None,
                        row_base)
    return trimmed


# ---------------------------------------------------------------------------------------------------
# Blocks: the parts of the inputs that prepare's tasks read, each on its own
# ---------------------------------------------------------------------------------------------------

# A Parquet file of more rows than this is read as several blocks of whole row groups, so that one big
# file keeps several processes busy; any other file is one block.
BLOCK_ROWS = 1 << 22


@dataclass(frozen=True)
class Block:
    """A part of the inputs that one task reads: a whole file, or a run of a Parquet file's row groups.

    The blocks are a property of the inputs alone (plan_blocks), never of how many processes read them,
    so the corpus is the same however many do. What reading one block needs of the blocks before it is
    given here: first_row, the file's rows before it (rows in messages count from the file's start);
    line_base, for text, the key of its first line (the lines of the files before it); unit, the unit
    of the file's numeric times that the blocks before it settled (None: not known, read_block finds
    it from the `earlier` row groups).
    """

    index: int
    path: str
    row_groups: tuple[int, ...] | None = None  # None: the whole file
    first_row: int = 0
    rows: int | None = None                    # known before reading (Parquet's metadata), for progress
    earlier: tuple[tuple[int, ...], ...] = ()  # the row groups of the file's blocks before this one
    line_base: int = 0
    unit: str | None = None

    @property
    def whole_file(self) -> bool:
        return self.row_groups is None


def plan_blocks(files: list[str], opt: Options) -> list[Block]:
    """The blocks of the inputs, in input order: a Parquet file of more than BLOCK_ROWS rows in runs of
    whole row groups of about equal rows, every other file whole. A file whose footer cannot be read is
    one block: reading it says what is wrong, in its turn."""
    blocks: list[Block] = []
    for path in files:
        groups = None
        if opt.format != "text" and _file_kind(path) == "parquet":
            try:
                meta = pq.ParquetFile(_input(path, random_access=True)).metadata if _size(path) else None
            except (pa.ArrowException, OSError, ValueError):
                meta = None
            if meta is not None and meta.num_rows > BLOCK_ROWS and meta.num_row_groups > 1:
                groups = _row_group_runs([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
            elif meta is not None:
                blocks.append(Block(len(blocks), path, rows=meta.num_rows))
                continue
        if groups is None:
            blocks.append(Block(len(blocks), path))
            continue
        first, earlier = 0, ()
        for run, rows in groups:
            blocks.append(Block(len(blocks), path, run, first, rows, earlier))
            first += rows
            earlier += (run,)
    return blocks


def _row_group_runs(sizes: list[int]) -> list[tuple[tuple[int, ...], int]]:
    """Consecutive row groups in runs of about total / ceil(total / BLOCK_ROWS) rows: (groups, rows)."""
    total = sum(sizes)
    target = total / math.ceil(total / BLOCK_ROWS)
    runs, run, rows = [], [], 0
    for g, n in enumerate(sizes):
        run.append(g)
        rows += n
        if rows >= target and g < len(sizes) - 1:
            runs.append((tuple(run), rows))
            run, rows = [], 0
    if run:
        runs.append((tuple(run), rows))
    return runs


class BlockState:
    """What reading a block learnt beyond its chunks: its rows (text: lines), how each batch's times
    were read, in order (prepare checks them across the inputs, TimeKinds), and the unit of the file's
    numeric times after it (the next block of the file starts from it)."""

    def __init__(self, unit: str | None = None):
        self.rows = 0
        self.readings: list[TimeReading] = []
        self.unit = unit


def count_lines(block: Block) -> int:
    """The lines of a text file, as read_block counts them (the last one need not end in a newline):
    the keys of the next file's lines start after them."""
    try:
        if _size(block.path) == 0:
            return 0
        stream = _stream(block.path)
        lines, last = 0, b"\n"
        while data := stream.read(read_formats.TEXT_BLOCK_BYTES):  # the blocks _text_lines reads
            lines += data.count(b"\n")
            last = data[-1:]
        return lines + (last != b"\n")
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorpusError(f"{block.path}: cannot read: {_read_error(e, block.path, 0)}") from e


def read_block(block: Block, opt: Options, state: BlockState, skips: Skips | None = None,
               notes: ReadNotes | None = None) -> Iterator[Chunk]:
    """A block of the inputs as normalised chunks of events. Errors name the file (and row).

    Rows with a null or empty key, text lines that are not UTF-8 and empty files are left out here
    and, when `skips` is given (pass 1; pass 2 reads the same rows again), counted in it; keys and
    tokens are stripped of leading and trailing whitespace, and times made epoch seconds (_time_seconds),
    which `notes` (pass 1 too) records; `state` gathers the rest (BlockState).
    """
    path = block.path
    row = block.first_row  # rows (text: lines) of this file read so far
    try:
        if block.whole_file and _size(path) == 0:  # an empty Parquet file is not even Parquet
            if skips is not None:
                skips.add("empty_files", 1, path)
            return
        if opt.format == "text":
            line_base = block.line_base
            for lines, bad in _text_lines(path):
                n = len(lines)
                keys = pa.array(np.arange(line_base, line_base + n, dtype=np.int64)).cast(pa.string())
                if bad.size:
                    # The line keeps its number: the keys of the lines after it do not move.
                    if skips is not None:
                        skips.add("invalid_utf8_lines", bad.size, path, "line", row, bad)
                    valid = lines.is_valid()
                    keys, lines = keys.filter(valid), lines.filter(valid)
                words = pc.utf8_split_whitespace(lines)
                key, token, pad = _flatten_lists(keys, words, drop_empty=True)
                line_base += n
                row += n
                state.rows += n
                yield Chunk(key, token, None, n, pad)
        else:
            columns = [opt.doc_col, opt.token_col] + ([opt.time_col] if opt.time_col else [])
            kind = _file_kind(path)
            if opt.format == "lists" and kind not in ("parquet", "json"):
                raise CorpusError(f"{path}: --format lists reads Parquet or JSON lines, not {kind}")
            if kind == "parquet":
                batches = _parquet_batches(path, columns, block.row_groups)
                if state.unit is None and block.earlier and opt.time_col and opt.time_unit is None:
                    state.unit = _earlier_unit(path, block.earlier, opt)
            elif kind in ("csv", "tsv"):
                batches = _csv_batches(path, columns, kind, opt.delimiter)
            else:
                batches = _json_batches(path, columns, opt.token_col if opt.format == "lists" else None)
            for batch in batches:
                chunk = batch_chunk(batch, path, row, opt, state, skips, notes)
                row += chunk.rows
                yield chunk
    except CorpusError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        raise CorpusError(f"{path}: cannot read: {_read_error(e, path, row)}") from e
    if block.whole_file and row == 0 and skips is not None:  # a header, a schema, blank space: no rows
        skips.add("empty_files", 1, path)


def batch_chunk(batch: pa.RecordBatch | pa.Table, path: str, row: int, opt: Options, state: BlockState,
                skips: Skips | None = None, notes: ReadNotes | None = None) -> Chunk:
    """One batch of an events or lists file's columns (doc_col, token_col[, time_col]) as a normalised
    chunk (read_block's, for each batch it reads): `row` is the file's row of its first row, which the
    errors, skips and notes name; `state` has the unit of the file's numeric times so far, and gets
    this batch's rows and time reading."""
    # Every column is converted whole, before rows are dropped, so that the row numbers in its errors
    # are those of the file.
    n = batch.num_rows
    key = _stripped(_as_strings(_column(batch, opt.doc_col), path, opt.doc_col, row), opt.doc_col, path, row, notes)
    time = None
    if opt.format == "lists":
        token = _as_string_lists(_column(batch, opt.token_col), path, opt.token_col, row)
    else:
        token = normalize(_stripped(_as_strings(_column(batch, opt.token_col), path, opt.token_col, row), opt.token_col,
                                    path, row, notes), opt.urls)
        if opt.time_col:
            time, reading = _time_seconds(_column(batch, opt.time_col), path, opt.time_col, row, opt, state.unit)
            if reading is not None:
                state.readings.append(reading)
                state.unit = reading.unit or state.unit
                if notes is not None:
                    notes.read_time(path, reading)
    usable = _usable_keys(key, path, row, skips)
    if time is not None and notes is not None:
        missing = np.isnan(time)
        if missing.any():
            notes.no_time(path, missing if usable is None else missing & usable.to_numpy(zero_copy_only=False), row)
    if usable is not None:
        key, token = key.filter(usable), token.filter(usable)
        if time is not None:
            time = time[usable.to_numpy(zero_copy_only=False)]
    pad = 0
    if opt.format == "lists":
        key, token, pad = _flatten_lists(key, token, drop_empty=False)
        token = normalize(_stripped(token, opt.token_col, path, row, notes, rows=False), opt.urls)
    state.rows += n
    return Chunk(key, token, time, n, pad)


def _column(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    """A column of a record batch, or of a table (one array either way)."""
    found = batch.column(name)
    return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found


def _earlier_unit(path: str, earlier: tuple[tuple[int, ...], ...], opt: Options) -> str | None:
    """The unit of a Parquet file's numeric times as the blocks before a block settled it (the first
    batch with a time decides it for the whole file, _epoch_numbers): their time column read in the
    same batches, up to that batch. An error on the way is theirs to report, first."""
    pf, row, unit = pq.ParquetFile(_input(path, random_access=True)), 0, None
    for groups in earlier:
        for batch in pf.iter_batches(batch_size=read_formats.PARQUET_BATCH_ROWS, columns=[opt.time_col],
                                     row_groups=list(groups)):
            _, reading = _time_seconds(batch.column(0), path, opt.time_col, row, opt, unit)
            if reading is not None and reading.unit is not None:
                return reading.unit
            row += batch.num_rows
    return None


def _usable_keys(key: pa.Array, path: str, row: int, skips: Skips | None) -> pa.Array | None:
    """Mask of the rows whose key is neither null nor empty, None when all are; counts the others."""
    empty = pc.equal(pc.binary_length(key), 0).fill_null(False)
    n_null, n_empty = key.null_count, pc.sum(empty).as_py() or 0
    if not n_null and not n_empty:
        return None
    if skips is not None:
        skips.add("null_keys", n_null, path, "row", row,
                  np.flatnonzero(key.is_null().to_numpy(zero_copy_only=False)) if n_null else None)
        skips.add("empty_keys", n_empty, path, "row", row,
                  np.flatnonzero(empty.to_numpy(zero_copy_only=False)) if n_empty else None)
    return pc.invert(pc.or_(key.is_null(), empty))


def _read_error(e: BaseException, path: str, row: int) -> str:
    """A reader's exception as one line, with row numbers made file-wide and a hint where one helps."""
    text = one_line(e)
    if "JSON parse error" in text:
        # pyarrow counts rows from the start of the block it was parsing; we know where that began.
        text = re.sub(r"in row (\d+)", lambda m: f"in row {row + int(m.group(1))}", text)
        if "changed from" in text:
            text += " (a column must hold one JSON type throughout a file: all strings or all numbers)"
        elif _file_kind(path) == "json":
            text += " (JSON input must hold one object per line)"
    elif "CSV parse error" in text and "columns, got" in text:
        text += " (a field that holds the delimiter must be quoted)"
    return text
