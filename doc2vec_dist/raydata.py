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

import contextlib
import dataclasses
import gc
import inspect
import itertools
import logging
import os
import socket
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Iterator

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from . import passes, storage
from .cluster import environment
from .errors import UserError
from .read_files import Options, _file_kind, _input, _strip_compression
from .read_formats import CSV_JSON_BLOCK_BYTES, PARQUET_BATCH_ROWS
from .readers import BlockState, batch_chunk

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


def _dataset(files: list[str], opt: Options, memory: int):
    """The input files as one Ray Data dataset of their columns and the path of each row (a read of each
    run of files of one kind, one filesystem and, for Parquet, one type of each column, in input order),
    and the path Ray Data names each file by → the file as prepare names it. Each read task reserves
    `memory` bytes, as the map after it does (so that the two run as one task)."""
    import ray.data

    named, parts = {}, []
    columns = _columns(opt)

    def like(f: str, fs) -> tuple:  # a dataset has one schema: a file whose columns' types differ starts a new read
        if _file_kind(f) != "parquet":
            return (_file_kind(f),)
        schema = pq.read_schema(_input(f, random_access=True))
        return ("parquet",) + tuple(str(schema.field(c).type) if c in schema.names else None for c in columns)

    runs: list[tuple[tuple, object, list[str]]] = []  # (kind and types, filesystem, paths inside it)
    for f in files:
        fs, path = storage.resolve(f)
        named[path] = f
        key = like(f, fs)
        if runs and runs[-1][0] == key and runs[-1][1].equals(fs):
            runs[-1][2].append(path)
        else:
            runs.append((key, fs, [path]))
    for (kind, *_), fs, inner in runs:
        if kind == "parquet":
            with _footer_readers(len(inner)):
                parts.append(ray.data.read_parquet(inner, filesystem=fs, include_paths=True,
                                                   **_reserving(ray.data.read_parquet, memory))
                             .select_columns(columns + [PATH]))
        else:
            parse = pcsv.ParseOptions(delimiter=opt.delimiter or ("\t" if kind == "tsv" else ","))
            convert = pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.binary() for c in columns},
                                          strings_can_be_null=True, null_values=[""])
            parts.append(ray.data.read_csv(inner, filesystem=fs, include_paths=True, parse_options=parse,
                                           convert_options=convert, **_reserving(ray.data.read_csv, memory),
                                           read_options=pcsv.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)))
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0], named


# Ray Data's Parquet reader (its datasource v2) reads the files' footers on a pool of
# RAY_DATA_PARQUET_FOOTER_NUM_ACTORS actors (32 by default) started for every read_parquet, each reading
# FOOTER_FILES files a call, up to 128 at once: 32 processes of ~1 CPU-s each for a read of one file.
# Here one for each FOOTER_FILES files, as many as Ray Data's default at most; a value the user set is kept.
FOOTER_ACTORS_ENV, FOOTER_FILES, FOOTER_ACTORS_MAX = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", 10, 32


def _footer_readers(files: int) -> contextlib.AbstractContextManager:
    """Ray Data's footer readers for a read_parquet of `files` files made in this block (its file
    indexer reads the environment when the read is made, in this process)."""
    if FOOTER_ACTORS_ENV in os.environ:
        return contextlib.nullcontext()
    return environment(**{FOOTER_ACTORS_ENV: str(min(FOOTER_ACTORS_MAX, -(-files // FOOTER_FILES)))})


def _segments(batch: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """A block's rows file by file (a block may hold the end of one file and the start of the next)."""
    if batch.num_rows == 0:
        return
    paths = pc.dictionary_encode(batch.column(PATH).combine_chunks())
    codes = paths.indices.to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]])
    for a, b in itertools.pairwise(starts):
        yield paths.dictionary[int(codes[a])].as_py(), batch.slice(int(a), int(b - a)).drop_columns([PATH])


@dataclasses.dataclass
class _Part:
    """What map_batches made of one block: its spill, and the first and last file of its rows (prepare's
    names), by which the driver checks that the blocks came in input order."""

    first: str
    last: str
    result: passes.Spilled


RUNNING = "running"  # the staging directory's folder of markers of the map calls under way (_running)


@contextlib.contextmanager
def _running(s: passes.Settings) -> Iterator[None]:
    """A marker file for the length of one map call, named by its host and process, so that a stopping
    driver can wait until no call still writes (_wait_running). The stop file is checked after the
    marker is made: a call that the driver's wait did not see stops before writing anything."""
    marker = os.path.join(s.tmp, RUNNING, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")
    open(marker, "x").close()
    try:
        s.go_on()
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)


def _spill_block(batch: pa.Table, s: passes.Settings, named: dict, units: dict, blocks: dict) -> dict:
    """map_batches' pass 2: a block's events, file by file, in slices of the rows a task's read hands
    (read_formats.PARQUET_BATCH_ROWS), mapped by passes.mapped into one spill file (passes.write_spill), each
    file's events marked (with a base) by the index of its first readers.Block (`blocks`: file → index)."""
    passes._fault_once(s)
    with _running(s):
        segments = list(_segments(batch))
        if not segments:
            return _table([])
        schema = s.spill_schema()

        def events():
            for path, rows in segments:
                state = BlockState(units.get(named[path]))
                for start in range(0, rows.num_rows, PARQUET_BATCH_ROWS):
                    chunk = batch_chunk(rows.slice(start, PARQUET_BATCH_ROWS), named[path], 0, s.opt, state)
                    yield passes.mapped(chunk, named[path], s, schema, blocks.get(named[path], -1)), chunk.rows

        spilled = passes.write_spill(os.path.join(s.spill_dir, f"data-{uuid.uuid4().hex}.arrow"), events(), s)
        return _table([_Part(named[segments[0][0]], named[segments[-1][0]], spilled)])


PART_SCHEMA = pa.schema([("first", pa.string()), ("last", pa.string()), ("spill", pa.string()),
                         ("buckets", pa.list_(pa.int32())), ("rows", pa.int64())])


def _table(parts: list[_Part]) -> pa.Table:
    """Parts as map_batches hands them on: a table (a column of Python objects would be pickled, and
    Ray Data says so in a warning for every block)."""
    return pa.table({"first": [p.first for p in parts], "last": [p.last for p in parts],
                     "spill": [p.result.path for p in parts], "buckets": [p.result.buckets for p in parts],
                     "rows": [p.result.rows for p in parts]}, schema=PART_SCHEMA)


def _from_table(table: pa.Table) -> Iterator[_Part]:
    for row in table.to_pylist():
        yield _Part(row["first"], row["last"], passes.Spilled(row["spill"], np.array(row["buckets"], np.int32),
                                                              row["rows"]))


def _retries() -> dict:
    """map_batches' remote arguments beside its named ones: a task whose process dies is run again at most
    TASK_RETRIES times (Ray Data's default retries it without end). Ray 2.60 has no named parameter for it and
    calls both ways to pass it deprecated, to be removed in 2.64; DataContext.max_map_retries counts only the
    exceptions a task raises, not a process that dies."""
    from .runners import RayTasks

    return {"max_retries": RayTasks.TASK_RETRIES}


def _reserving(fn, memory: int) -> dict:
    """fn's arguments that have each of its tasks reserve `memory` bytes (a named parameter of Ray Data's
    reads since ray_remote_args was deprecated, that dict before)."""
    if not memory:
        return {}
    if "memory" in inspect.signature(fn).parameters:
        return {"memory": int(memory)}
    return {"ray_remote_args": {"memory": int(memory)}}


def _cause(exc: BaseException) -> BaseException | None:
    """What a map call raised (a UserError, an OSError, Stopped), found inside Ray's wrappers."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (UserError, OSError, passes.Stopped)):
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None


def _executions() -> set:
    """Ray Data's executions running in this process: each is a thread of its own (its StreamingExecutor;
    none found where a Ray version keeps it elsewhere: only _parts' clean-up after a Ctrl-C relies on it)."""
    try:
        from ray.data._internal.execution.streaming_executor import StreamingExecutor
    except ImportError:
        return set()

    return {t for t in threading.enumerate() if isinstance(t, StreamingExecutor)}


# Ray Data's threads that read an execution's blocks for its iterator (ray.data's block_batching: the one that
# reads the last block also ends the execution, then goes on calling Ray); named so in Ray 2.60
ITERATION_THREADS = ("iter_threaded",)


def _ending(before: set, deadline: float) -> None:
    """Wait, until `deadline` (time.monotonic()) at most, for the threads of Ray Data started since `before`
    (threading.Thread objects: an ident is reused by the next thread as soon as one ends, so a thread of the
    pass's could pass for one that had ended) that may still call Ray: a Ctrl-C landing as an execution ends
    reached the command while the thread that read its last block still ended it, and Ray's shutdown under
    that thread ended the process with status 1 ("The core worker has already been shutdown"), not the
    command's 130."""
    executions = _executions()
    for t in threading.enumerate():
        if t in before or t is threading.current_thread():
            continue
        if t.name in ITERATION_THREADS or t in executions:
            t.join(max(0.0, deadline - time.monotonic()))


def _release(exc: BaseException | None) -> None:
    """Clear the frames no longer running that an exception and those it carries (its __context__ and
    __cause__: an exception raised while handling a Ctrl-C holds the Ctrl-C's traceback there) still hold,
    and collect what a cycle kept: a generator of Ray Data's that only such a frame held is then closed, and
    the iteration thread it feeds is told to stop (_ending would otherwise wait on it until its deadline)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
    gc.collect()


def _parts(files: list[str], s: passes.Settings, fn, fn_kwargs: dict, tasks: int, memory: int = 0) -> Iterator[_Part]:
    """fn(block, named=..., **fn_kwargs) over every block of the files' dataset (_dataset), `tasks` at a
    time, each block's parts in input order.

    Stopped early (an error, Ctrl-C: the caller closes this generator), it does what RayTasks does: it
    asks the calls under way to end (the stop file, which fn checks between batches), ends the
    execution (Ray Data stops starting tasks and interrupts those running) and waits until no call is
    still writing (_wait_running), so that the staging
    directory can then be removed whole. An execution a Ctrl-C caught starting (inside Ray Data, before
    its iterator's own clean-up is set) is shut down here too: else Ray Data's finalizer ends it at the
    interpreter's exit, after Ray, and prints a traceback under the command's last line. Stopped or not,
    it returns once Ray Data's threads that read the blocks have ended (_ending): the whole clean-up within
    RayTasks.STOP_SECONDS."""
    import ray.data

    from .runners import RayTasks, died

    os.makedirs(os.path.join(s.tmp, RUNNING), exist_ok=True)
    ctx = ray.data.DataContext.get_current()
    options = ctx.execution_options
    before = (options.preserve_order, options.resource_limits, ctx.enable_progress_bars)
    options.preserve_order = True
    # `tasks` CPUs at a time, set for the whole job: a concurrency of map_batches' own would keep it from
    # running in the read's task (operator fusion), and each block would pass through the object store
    options.resource_limits = ray.data.ExecutionResources(cpu=tasks)
    ctx.enable_progress_bars = False
    finished = False
    batches = None
    running = _executions()  # others' (a library caller's), left alone
    threads = set(threading.enumerate())  # (_ending: those started from here on)
    try:  # (a dataset takes the context as it is when it is made)
        ds, named = _dataset(files, s.opt, memory)
        # a task whose process dies is run again as the Ray tasks are, at most TASK_RETRIES times (Ray Data's
        # own default retries it without end: a task killed for memory every time would never stop the run)
        with warnings.catch_warnings():  # (the cap has no other spelling in Ray 2.60; see _retries)
            warnings.filterwarnings("ignore", message=".*ray_remote_args_fn.*deprecated")
            mapped = ds.map_batches(fn, fn_kwargs={**fn_kwargs, "named": named}, batch_size=None,
                                    batch_format="pyarrow", ray_remote_args_fn=_retries,
                                    **({"memory": int(memory)} if memory else {}))
        # each block as soon as it is in (prefetching one would hold the one before it back)
        batches = iter(mapped.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0))
        try:
            for batch in batches:
                yield from _from_table(batch)
        except Exception as e:  # a reading or writing error as itself, in one line (as RayTasks hands it)
            found = died(e, RayTasks.TASK_RETRIES) or _cause(e)
            if found is None:
                raise
            raise found from None
        finished = True
    finally:
        options.preserve_order, options.resource_limits, ctx.enable_progress_bars = before
        deadline = time.monotonic() + RayTasks.STOP_SECONDS  # (one for the whole clean-up)
        if not finished:
            with contextlib.suppress(OSError):  # the staging directory gone: nothing is left to stop
                open(s.stop_path(), "a").close()
            if batches is not None and hasattr(batches, "close"):
                batches.close()  # Ray Data ends the execution
            # A Ctrl-C raised inside Ray Data's generators ended them, and its traceback holds their frames: the
            # one that feeds the iteration's thread stays open there, never telling that thread to stop, and
            # _ending waited on it until its deadline. Frames no longer running, cleared, let it go.
            _release(sys.exc_info()[1])
            for execution in _executions() - running:  # one the close did not reach
                with contextlib.suppress(Exception):
                    execution.shutdown(force=True)
            _wait_running(os.path.join(s.tmp, RUNNING), deadline - time.monotonic())
        _ending(threads, deadline)


def _not_the_bars_note(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Progress bars disabled")


@contextlib.contextmanager
def _console_quiet() -> Iterator[None]:
    """Ray Data's console, for a pass: its warnings, not its INFO lines (an execution's start, its plan, its end:
    the file ray-data.log in the Ray session's logs keeps them, as the line it no longer prints said) nor its
    note that its progress bars are off (prepare has its own). The console is the stream handler Ray Data
    puts on its logger; none found (another Ray version, a user's own logging), nothing changes."""
    import ray.data  # noqa: F401  (its import puts its handlers on its logger)

    consoles = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)]
    levels = [h.level for h in consoles]
    for h in consoles:
        h.setLevel(max(h.level, logging.WARNING))
        h.addFilter(_not_the_bars_note)
    try:
        yield
    finally:
        for h, level in zip(consoles, levels, strict=True):
            h.setLevel(level)
            h.removeFilter(_not_the_bars_note)


def _wait_running(folder: str, seconds: float) -> None:
    """Wait until the markers in `folder` (_running) are gone, or are of processes of this host that
    have died (a killed process writes nothing more), at most `seconds`."""
    host, deadline = socket.gethostname(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            names = os.listdir(folder)
        except OSError:
            return
        alive = []
        for name in names:
            where, pid, _ = name.rsplit("-", 2)
            if where != host or psutil.pid_exists(int(pid)):
                alive.append(name)
        if not alive:
            return
        time.sleep(0.05)


def spill(files: list[str], s: passes.Settings, units: dict, tasks: int, progress=None,
          memory: int = 0, blocks: dict | None = None) -> list[passes.Spilled]:
    """Pass 2 through Ray Data: each block's events mapped and spilled (passes.write_spill), one spill file
    a block, the spills in input order; `files`: the inputs that pass 1 read rows from (a file of no rows,
    whose CSV header or Parquet schema is all it holds, if even that, Ray Data reads otherwise or not at
    all); `units`: each file's unit of numeric times, as pass 1 found it; each task reserves `memory`;
    `blocks`: each file's first readers.Block index, which its events carry where a base is given (a Ray
    Data block is no readers.Block: a refresh's report counts file by file, so a file's first serves)."""
    if not files:
        return []
    order = {f: i for i, f in enumerate(files)}
    found = []
    with _console_quiet(), contextlib.closing(_parts(files, s, _spill_block, {"s": s, "units": units,
                                                                              "blocks": blocks or {}}, tasks, memory)) as parts:
        for part in parts:
            if progress is not None:
                progress.update(part.result.rows)
            found.append(part)
    # Each read hands its blocks in order, but a union of reads (files whose columns' types differ) may
    # interleave them: sorted (stably) by their first file, the order pass 3 numbers documents in, and
    # checked, so that a read that reordered its files could never give another corpus silently
    found.sort(key=lambda p: order[p.first])
    for before, after in itertools.pairwise(found):
        if order[after.first] < order[before.last]:
            raise RuntimeError(f"Ray Data handed rows of {after.first} and of {before.last} out of input order")
    return [p.result for p in found]
