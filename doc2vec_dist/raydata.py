"""prepare's passes 1 and 2 through Ray Data (--engine data): the inputs read by ray.data.read_parquet or
read_csv from their filesystem, each block counted (pass 1) or mapped and spilled (pass 2) by
map_batches calling the same functions as the Ray tasks of passes.py (readers.batch_chunk,
passes.count_chunks, passes.mapped, passes.write_spill).

Changes when what Ray Data reads, or how its blocks are traced back to their files' rows, changes.

What a block does not know, and the driver does. A Ray Data block carries its file's path
(include_paths) but not the row of its file it starts at, nor the unit the file's first rows gave its
numeric times. So a block is read as if it were its file's start (rows from 0, its own unit); what it
skipped and stripped is recorded (_Recorded), not written down, and the driver, which receives the
blocks in input order (preserve_order), writes it down at the block's real rows. A block whose time
unit differs from its file's earlier blocks, or that met an error, makes the driver read that file
again with passes.count (one process, in order), so that the error named is exactly the one the Ray
tasks name. The inputs it reads: Parquet, or CSV/TSV without compression (events); others (JSON
lines, text, compressed CSV) are the Ray tasks'.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from . import passes, storage
from .corpus import CorpusError, one_line
from .readers import (
    CSV_JSON_BLOCK_BYTES,
    Block,
    BlockState,
    Options,
    ReadNotes,
    Skips,
    _file_kind,
    _input,
    _size,
    _strip_compression,
    batch_chunk,
    plan_blocks,
)

PATH = "path"  # the column include_paths adds


class Unreadable(Exception):
    """Ray Data could not read the inputs (a missing column, a file that is not what its name says): the
    Ray tasks read them instead, and name what is wrong as they do."""


def unsupported(files: list[str], opt: Options) -> str | None:
    """Why Ray Data cannot read these inputs as the Ray tasks do, None when it can."""
    if opt.format == "text":
        return "text input is read by Ray tasks"
    for f in files:
        kind = _file_kind(f)
        if kind not in ("parquet", "csv", "tsv"):
            return f"{kind} input is read by Ray tasks"
        if kind != "parquet" and (opt.format != "events" or _strip_compression(storage.strip_query(f).lower())
                                  != storage.strip_query(f).lower()):
            return "compressed CSV, and CSV of --format lists, are read by Ray tasks"
    if len({storage.resolve(f)[0].type_name for f in files}) > 1:
        return "the inputs are on several filesystems"
    return None


def _columns(opt: Options) -> list[str]:
    return [opt.doc_col, opt.token_col] + ([opt.time_col] if opt.time_col else [])


def _dataset(files: list[str], opt: Options):
    """The input files as one Ray Data dataset of their columns and the path of each row (a read of each
    run of files of one kind, in input order), and the path Ray Data names each file by → the file
    as prepare names it."""
    import ray.data

    named, parts = {}, []
    columns = _columns(opt)

    def like(f: str) -> tuple:  # a dataset has one schema: a file whose columns' types differ starts a new read
        if _file_kind(f) != "parquet":
            return (_file_kind(f),)
        schema = pq.read_schema(_input(f, random_access=True))
        return ("parquet",) + tuple(str(schema.field(c).type) if c in schema.names else None for c in columns)

    for (kind, *_), run in itertools.groupby(files, key=like):
        inner = []
        for f in run:
            fs, path = storage.resolve(f)
            inner.append(path)
            named[path] = f
        if kind == "parquet":
            parts.append(ray.data.read_parquet(inner, filesystem=fs, include_paths=True).select_columns(
                columns + [PATH]))
        else:
            parse = pcsv.ParseOptions(delimiter=opt.delimiter or ("\t" if kind == "tsv" else ","))
            convert = pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.binary() for c in columns},
                                          strings_can_be_null=True, null_values=[""])
            parts.append(ray.data.read_csv(inner, filesystem=fs, include_paths=True, parse_options=parse,
                                           convert_options=convert,
                                           read_options=pcsv.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)))
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0], named


def _segments(batch: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """A block's rows file by file (a block may hold the end of one file and the start of the next)."""
    paths = pc.dictionary_encode(batch.column(PATH).combine_chunks())
    codes = paths.indices.to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]])
    for a, b in itertools.pairwise(starts):
        yield paths.dictionary[int(codes[a])].as_py(), batch.slice(int(a), int(b - a)).drop_columns([PATH])


class _Recorded:
    """Stands for a Skips and a ReadNotes while a block's rows in its file are not known: keeps each call
    (with at most EXAMPLES positions), for the driver to make on the real ones at the block's first row."""

    def __init__(self):
        self.calls: list[tuple] = []

    def add(self, reason, count, path=None, unit="row", base=0, at=None) -> None:
        if count:
            self.calls.append(("add", reason, count, path, unit, base, None if at is None else at[:Skips.EXAMPLES]))

    def strip(self, column, count, path, at, base) -> None:
        if count:
            self.calls.append(("strip", column, count, path, None if at is None else at[:ReadNotes.EXAMPLES], base))

    def read_time(self, path, reading) -> None:
        self.calls.append(("read_time", path, reading))

    def replay(self, row: int) -> tuple[Skips, ReadNotes]:
        """The skips and notes of the block, its rows counted from `row` of its file."""
        skips, notes = Skips(), ReadNotes()
        for call in self.calls:
            if call[0] == "add":
                _, reason, count, path, unit, base, at = call
                skips.add(reason, count, path, unit, base + row, at)
            elif call[0] == "strip":
                _, column, count, path, at, base = call
                notes.strip(column, count, path, at, base + row)
            else:
                notes.read_time(call[1], call[2])
        return skips, notes


@dataclasses.dataclass
class _Part:
    """What a block did with the rows of one file."""

    path: str               # the file, as prepare names it
    result: object          # passes.Counted (pass 1), passes.Spilled (pass 2)
    recorded: _Recorded | None = None


def _count_block(batch: pa.Table, s: passes.Settings, named: dict) -> dict:
    """map_batches' pass 1: each file's rows of the block counted by passes.count_chunks."""
    found = []
    for path, rows in _segments(batch):
        recorded, state = _Recorded(), BlockState()

        def chunks(rows=rows, path=path, state=state, recorded=recorded):
            try:
                yield batch_chunk(rows, named[path], 0, s.opt, state, recorded, recorded)
            except (pa.ArrowException, ValueError, KeyError) as e:
                raise CorpusError(f"{named[path]}: cannot read: {e}") from e

        found.append(_Part(named[path], passes.count_chunks(chunks(), named[path], s, state, recorded, recorded),
                           recorded))
    return {"part": _objects(found)}


def _spill_block(batch: pa.Table, s: passes.Settings, named: dict, units: dict) -> dict:
    """map_batches' pass 2: each file's rows of the block mapped by passes.mapped into a spill file."""
    found = []
    schema = s.spill_schema()
    for path, rows in _segments(batch):
        s.go_on()
        chunk = batch_chunk(rows, named[path], 0, s.opt, BlockState(units.get(named[path])))
        spilled = passes.write_spill(os.path.join(s.spill_dir, f"data-{uuid.uuid4().hex}.arrow"),
                                     [(passes.mapped(chunk, named[path], s, schema), chunk.rows)], s)
        found.append(_Part(named[path], spilled))
    return {"part": _objects(found)}


def _objects(found: list) -> np.ndarray:
    """A column of Python objects, as map_batches hands them on."""
    column = np.empty(len(found), dtype=object)
    column[:] = found
    return column


def _parts(files: list[str], opt: Options, fn, fn_kwargs: dict, tasks: int) -> Iterator[_Part]:
    """fn(block, named=..., **fn_kwargs) over every block of the files' dataset (_dataset), `tasks` at a
    time, each block's parts in input order."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    options = ctx.execution_options
    before = (options.preserve_order, options.resource_limits, ctx.enable_progress_bars)
    options.preserve_order = True
    # `tasks` CPUs at a time, set for the whole job: a concurrency of map_batches' own would keep it from
    # running in the read's task (operator fusion), and each block would pass through the object store
    options.resource_limits = ray.data.ExecutionResources(cpu=tasks)
    ctx.enable_progress_bars = False
    try:  # (a dataset takes the context as it is when it is made)
        ds, named = _dataset(files, opt)
        mapped = ds.map_batches(fn, fn_kwargs={**fn_kwargs, "named": named}, batch_size=None, batch_format="pyarrow")
        for batch in mapped.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield from batch.column("part").to_pylist()
    finally:
        options.preserve_order, options.resource_limits, ctx.enable_progress_bars = before


def count(files: list[str], s: passes.Settings, tasks: int, progress=None,
          arrive=None) -> list[tuple[Block, passes.Counted]]:
    """Pass 1 through Ray Data: (block, what passes.count would say of it) in input order, a block being a
    Ray Data block's rows of one file, its skips and notes at their rows of the file. An empty file
    is its own block (Ray Data reads no rows of it); a file where a block met an error, or found its
    numeric times in another unit than the file's other blocks, is read again by passes.count, one
    block of readers.plan_blocks after another, so that the error is the one a single process names.
    arrive(result) sees each result first, in any order (to merge its counts and free them). Raises
    Unreadable when Ray Data cannot read the inputs at all."""
    results: dict[str, list[_Part]] = {f: [] for f in files}
    sized = [f for f in files if _size(f)]
    if sized:
        try:
            for part in _parts(sized, s.opt, _count_block, {"s": s}, tasks):
                if progress is not None:
                    progress.update(part.result.rows)
                if arrive is not None:
                    arrive(part.result)
                results[part.path].append(part)
        except Exception as e:
            raise Unreadable(one_line(e)) from e
    found, index = [], 0
    for f in files:
        parts = results[f]
        units = {p.result.unit for p in parts} - {None}
        if not parts or any(p.result.error is not None for p in parts) or len(units) > 1:
            unit = None
            for block in plan_blocks([f], s.opt):
                counted = passes.count(dataclasses.replace(block, index=index, unit=block.unit or unit), s)
                if arrive is not None:
                    arrive(counted)
                unit = counted.unit or unit
                found.append((dataclasses.replace(block, index=index), counted))
                index += 1
                if counted.error is not None:
                    return found
            continue
        row, unit = 0, units.pop() if units else None
        for part in parts:
            part.result.skips, part.result.notes = part.recorded.replay(row)
            part.result.unit = unit
            row += part.result.rows
            found.append((Block(index, f), part.result))
            index += 1
    return found


def spill(files: list[str], s: passes.Settings, units: dict, tasks: int, progress=None) -> list[passes.Spilled]:
    """Pass 2 through Ray Data: each block's events of each file mapped and spilled (passes.write_spill),
    the spills in input order; `units`: each file's unit of numeric times, as pass 1 found it."""
    sized = [f for f in files if _size(f)]
    if not sized:
        return []
    order = {path: i for i, path in enumerate(sized)}
    found = []
    for part in _parts(sized, s.opt, _spill_block, {"s": s, "units": units}, tasks):
        if progress is not None:
            progress.update(part.result.rows)
        found.append(part)
    # Ray Data hands the blocks in input order; sorted (stably) by file all the same, as pass 3 needs them so
    return [p.result for p in sorted(found, key=lambda p: order[p.path])]
