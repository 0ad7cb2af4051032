"""prepare's pass 2 through Ray Data (--engine data): the inputs read by ray.data.read_parquet or read_csv
from their filesystem, each block mapped to word ids and spilled by map_batches calling the functions
the Ray tasks call (readers.batch_chunk, passes.mapped, passes.write_spill).

Changes when what Ray Data reads, or how its blocks are traced back to their files, changes.

Pass 1 stays Ray tasks (it measured faster as tasks), and has read every row by the time pass 2 runs:
its errors and skips name the file, column and row as always, and it found each file's unit of
numeric times, which a Ray Data block, not knowing where in its file it begins, is handed. A block
carries its file's path (include_paths) and arrives in input order (preserve_order), so the spills
are in input order, as pass 3 needs them. The inputs it reads: Parquet, and CSV/TSV without
compression (events); JSON lines, text and compressed CSV stay Ray tasks.
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
from .readers import (
    CSV_JSON_BLOCK_BYTES,
    BlockState,
    Options,
    _file_kind,
    _input,
    _size,
    _strip_compression,
    batch_chunk,
)

PATH = "path"  # the column include_paths adds


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


@dataclasses.dataclass
class _Part:
    """What a block did with the rows of one file."""

    path: str               # the file, as prepare names it
    result: passes.Spilled


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


def spill(files: list[str], s: passes.Settings, units: dict, tasks: int, progress=None) -> list[passes.Spilled]:
    """Pass 2 through Ray Data: each block's events of each file mapped and spilled (passes.write_spill),
    the spills in input order; `units`: each file's unit of numeric times, as pass 1 found it. Empty
    files are left out (Ray Data cannot read an empty Parquet file; pass 1 counted them)."""
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
