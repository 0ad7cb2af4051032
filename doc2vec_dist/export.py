"""Export a trained table as (key, vector): Parquet, word2vec text, or npy + keys.

Each checkpoint part (one parameter-server slice) is exported by its own task, and the tasks run in
parallel: a thread pool here, Ray tasks under jobs/export.py (`runner=run_on_ray`). A task streams
its part one record batch at a time (see iter_part_batches), so a process holds about one batch per
task and never the table: nothing gathers the table in one place.

    parquet, --out DIR             one part-SSSSS.parquet per checkpoint part, written in parallel
    parquet, --out FILE.parquet    one file, one writer, parts in order (a single file cannot be
                                   written in parallel; give a directory for large tables)
    word2vec                       a text piece per part written in parallel, joined behind the header
    npy                            DIR/vectors.npy filled in parallel at each row's id; DIR/keys.parquet
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import checkpoint, outputs
from .errors import UserError
from .memwatch import peak_rss_bytes

log = logging.getLogger(__name__)

KEY_TABLES = {"docs": ("docs.arrow", "key"), "words": ("vocab.arrow", "token"), "words_out": ("vocab.arrow", "token")}
FORMATS = ("parquet", "word2vec", "npy")
# Unique keys and float vectors gain nothing from dictionary pages or vector statistics, and
# computing them halves the write speed (measured: 0.6M vs 1.4M rows/s per writer at dim 100).
# Trained float vectors do not compress (snappy saved 3% at 1M × 100 for a third more CPU), keys do.
PARQUET_OPTIONS = {"compression": {"key": "snappy", "vector": "none"}, "use_dictionary": False,
                   "write_statistics": ["key"]}

# A runner calls fn(*args) for every args tuple and yields (position, result) as each finishes.
Runner = Callable[[Callable, list[tuple]], Iterator[tuple[int, object]]]


def keys_of(model: str, table: str) -> pa.Array:
    """Row id → original key (user id or URL) for a table; the key files are sorted by id."""
    if table not in KEY_TABLES:
        raise UserError(f"unknown table {table!r} (choose from {', '.join(KEY_TABLES)})")
    name, column = KEY_TABLES[table]
    path = os.path.join(model, name)
    if not os.path.exists(path):
        raise UserError(f"{path}: missing; {model} is not a complete model directory")
    with pa.memory_map(path) as source:
        keys = pa.ipc.open_file(source).read_all().column(column)
    return keys.combine_chunks()


# ---------------------------------------------------------------------------------------------------
# runners: where the per-part tasks execute
# ---------------------------------------------------------------------------------------------------

def run_local(fn: Callable, calls: list[tuple], threads: int | None = None) -> Iterator[tuple[int, object]]:
    """Run the calls on a thread pool of one thread per core; Arrow, Parquet and numpy release the GIL."""
    threads = max(1, min(len(calls), threads or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:  # after a failure, start nothing more
                future.cancel()


def run_on_ray(fn: Callable, calls: list[tuple]) -> Iterator[tuple[int, object]]:
    """Run each call as a Ray task (one CPU), so on a cluster the work happens where Ray places it.

    The tasks read and write paths themselves (storage every node sees), and return only small results.
    A UserError raised in a task is raised again here as itself, so the job prints its one line.
    """
    import ray

    remote = ray.remote(num_cpus=1)(fn)
    refs = {remote.remote(*args): i for i, args in enumerate(calls)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, UserError):
                    raise UserError(str(exc.cause)) from None
                raise
            yield refs[done[0]], result
    finally:
        for ref in pending:
            ray.cancel(ref)


def calm_openmp() -> None:
    """Have OpenMP threads sleep rather than spin while they wait, unless the user chose otherwise.

    Call it before faiss is first imported (faiss loads its own OpenMP runtime, which reads this
    once). By default a waiting thread spins for a while; next to other busy processes (Ray workers,
    other jobs) that turns every parallel step into a fight for the cores. Measured on this 2-core
    machine at load ~10: PQ training took 28 s spinning, 4.4 s sleeping. At load ~1.5 the two are
    within noise (PQ 1.42 vs 1.48 s; IVF-PQ search 13.7k vs 13.6k queries/s).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def where() -> dict:
    """Which process ran a task: shown in job summaries, so a user sees the work was spread."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


# ---------------------------------------------------------------------------------------------------
# reading checkpoint parts in bounded memory
# ---------------------------------------------------------------------------------------------------

def iter_part_batches(vdir: str, part: dict, dim: int, verify: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, float32 vectors) of one checkpoint part, a record batch at a time, without copying.

    The part is memory-mapped, so a batch is a view of the file (reading it with plain reads cost
    10× the CPU: allocating and faulting in every batch). Once the consumer is done with a batch,
    its pages are dropped from this process (madvise DONTNEED; they stay in the page cache), so
    the memory held is about one batch, not the part: a 5 GB part does not become 5 GB resident.
    """
    path = os.path.join(vdir, part["path"])
    if not os.path.isfile(path):
        raise UserError(f"{path}: part file missing; the checkpoint is damaged")
    if verify and checkpoint._sha256(path) != part["sha256"]:  # the same check iter_parts makes
        raise UserError(f"{path}: checksum mismatch; the checkpoint is damaged")
    with open(path, "rb") as fh:
        # not closed explicitly: the mapping lives as long as any array viewing it, then unmaps
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    data = pa.py_buffer(mapped)
    reader = pa.ipc.open_file(data)
    rows = 0
    for b in range(reader.num_record_batches):
        batch = reader.get_batch(b)
        rows += batch.num_rows
        if batch.num_rows:
            yield batch.column("id").to_numpy(), checkpoint.matrix_of(batch.column("vector"), dim)
        end = max(buf.address + buf.size for column in batch.columns for buf in column.buffers() if buf) - data.address
        mapped.madvise(mmap.MADV_DONTNEED, 0, min(end, len(mapped)))
    if rows != part["rows"]:
        raise UserError(f"{path}: {rows} rows, manifest says {part['rows']}")


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; all-zero rows (never trained) stay zero."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def part_chunks(model: str, table: str, part: int, normalize: bool, dtype: str,
                keys: pa.Array | None = None) -> Iterator[tuple[np.ndarray, pa.Array, np.ndarray]]:
    """(ids, keys, vectors) of one part, batch by batch, in the exported dtype."""
    vdir, spec = checkpoint.table_spec(model, table)
    keys = keys_of(model, table) if keys is None else keys
    for ids, vectors in iter_part_batches(vdir, spec["parts"][part], spec["dim"]):
        if normalize:
            vectors = unit_rows(vectors)
        yield ids, keys.take(pa.array(ids)).cast(pa.string()), vectors.astype(dtype, copy=False)


# ---------------------------------------------------------------------------------------------------
# one part → one piece of output (runs in a thread or a Ray task)
# ---------------------------------------------------------------------------------------------------

def export_part(model: str, table: str, part: int, format: str, piece: str, normalize: bool = False,
                dtype: str = "float32", keys: pa.Array | None = None,
                on_rows: Callable[[int], object] | None = None) -> dict:
    """Write part `part` of `table` to `piece` (its Parquet file, its word2vec text, or the shared
    vectors.npy); returns the rows written and where it ran."""
    writers = {"parquet": write_parquet, "word2vec": write_word2vec_lines, "npy": write_npy_rows}
    rows = writers[format](piece, part_chunks(model, table, part, normalize, dtype, keys), on_rows)
    return {"part": part, "rows": rows, **where()}


def key_vector_table(keys: pa.Array, vectors: np.ndarray) -> pa.Table:
    """(key, vector) rows; the schema carries the marker of a vectors file (outputs), so a file written
    from it is one that export and infer may later replace."""
    return pa.table({"key": keys.cast(pa.string()), "vector": checkpoint.vectors_array(vectors)},
                    metadata=outputs.parquet_metadata("vectors"))


def write_parquet(path: str, chunks, on_rows=None) -> int:
    """A Parquet file of key, vector; one row group per record batch of the checkpoint (~65k rows)."""
    rows, writer = 0, None
    try:
        for _, keys, vectors in chunks:
            table = key_vector_table(keys, vectors)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, **PARQUET_OPTIONS)
            writer.write_table(table)
            rows += len(keys)
            if on_rows:
                on_rows(len(keys))
    finally:
        if writer is not None:
            writer.close()
    return rows


def word2vec_lines(ids: np.ndarray, keys: pa.Array, vectors: np.ndarray) -> pa.Buffer:
    """'key v1 … vd\\n' for every row, as one buffer, built by Arrow's compute kernels (no Python loop).

    Floats are printed with the shortest text that reads back as the same float32, so the text
    format loses nothing.
    """
    bad = pc.or_(pc.match_substring_regex(keys, r"\s"), pc.equal(pc.utf8_length(keys), 0))
    if pc.any(bad).as_py():
        row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        raise UserError(f"word2vec format cannot hold key {keys[row].as_py()!r} (row id {ids[row]}): it is empty "
                        "or contains whitespace; export as parquet instead")
    values = checkpoint.vectors_array(vectors.astype(np.float32, copy=False)).cast(pa.list_(pa.string()))
    lines = pc.binary_join_element_wise(keys, pc.binary_join(values, " "), " ")
    everything = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    return pc.binary_join(everything, "\n")[0].as_buffer()


def write_word2vec_lines(path: str, chunks, on_rows=None) -> int:
    rows = 0
    with open(path, "wb") as fh:
        for ids, keys, vectors in chunks:
            fh.write(word2vec_lines(ids, keys, vectors))
            fh.write(b"\n")
            rows += len(keys)
            if on_rows:
                on_rows(len(keys))
    return rows


def npy_data_offset(path: str) -> int:
    """Byte offset of the data of an .npy file (after its header)."""
    header = np.load(path, mmap_mode="r")
    offset = header.offset
    del header
    return offset


def write_npy_rows(path: str, chunks, on_rows=None) -> int:
    """Put each row at its id in the shared vectors.npy, mapping only the span of ids one batch covers.

    A part holds every S-th id, so a batch's rows are spread over S times their size; mapping just
    that window, then unmapping it, keeps memory at about one window per task.
    """
    offset, rows = npy_data_offset(path), 0
    for ids, _, vectors in chunks:
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        window = np.memmap(path, dtype=vectors.dtype, mode="r+", shape=(hi - lo, vectors.shape[1]),
                           offset=offset + lo * vectors.shape[1] * vectors.itemsize)
        window[ids - lo] = vectors
        window.flush()
        del window
        rows += len(ids)
        if on_rows:
            on_rows(len(ids))
    return rows


# ---------------------------------------------------------------------------------------------------
# the export
# ---------------------------------------------------------------------------------------------------

def export(model: str, table: str, out: str, format: str = "parquet", progress: bool = True,
           normalize: bool = False, dtype: str = "float32", runner: Runner | None = None) -> dict:
    """Write `table` of the model's LATEST checkpoint to `out`; returns rows, seconds, rows/s, peak memory.

    parquet: `out` ending in .parquet is one file (a row group per batch); otherwise a directory with
    one part file per checkpoint part. word2vec: gensim's text format. npy: `out`/vectors.npy (row i ↔
    keys.parquet row i, i = row id). normalize scales every vector to unit length (cosine = dot
    product downstream); dtype float16 halves the size. `runner` runs the per-part tasks (default:
    threads in this process; jobs/export.py passes run_on_ray).
    """
    if dtype not in ("float32", "float16"):
        raise UserError(f"unknown export dtype {dtype!r} (choose from float32, float16)")
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r} (choose from {', '.join(FORMATS)})")
    t0 = time.perf_counter()
    model = checkpoint.local_copy(model)  # a remote model (s3://…) is exported from a verified local copy
    _, spec = checkpoint.table_spec(model, table)
    keys = keys_of(model, table)
    if len(keys) != spec["rows"]:
        raise UserError(f"{model}: {len(keys)} keys but table {table} has {spec['rows']} rows")
    kind = output_kind(out, format)
    if check_replaceable(out, kind):  # an earlier export of ours; anything else is refused
        log.info(f"replacing the earlier export at {out}")
    tmp = f"{out.rstrip('/')}.tmp-{os.getpid()}"
    pieces = f"{tmp}.pieces"
    bar = tqdm(total=spec["rows"], unit="row", unit_scale=True, desc=f"export {table}", disable=not progress,
               file=sys.stderr)
    try:
        if format == "parquet" and out.endswith(".parquet"):
            chunks = itertools.chain.from_iterable(part_chunks(model, table, p, normalize, dtype, keys)
                                                   for p in range(len(spec["parts"])))
            write_parquet(tmp, chunks, bar.update)
            tasks = [{"part": p, "rows": part["rows"], **where()} for p, part in enumerate(spec["parts"])]
        else:
            targets = _start_output(format, tmp, pieces, keys, spec, dtype)
            tasks = _run_parts(model, table, format, targets, normalize, dtype, keys, runner, bar)
            if format == "word2vec":
                _join_text(tmp, f"{spec['rows']} {spec['dim']}\n", targets)
        remove_path(pieces)
        replace_output(tmp, out, kind)
    except BaseException:
        remove_path(tmp)
        remove_path(pieces)
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    return {"table": table, "rows": spec["rows"], "dim": spec["dim"], "path": out, "format": format, "dtype": dtype,
            "normalized": normalize, "parts": len(spec["parts"]), "tasks": tasks,
            "seconds": round(seconds, 3), "rows_per_second": spec["rows"] / seconds if seconds else 0.0,
            "peak_rss_bytes": peak_rss_bytes()}


def _start_output(format: str, tmp: str, pieces: str, keys: pa.Array, spec: dict, dtype: str) -> list[str]:
    """Create the output's skeleton; returns the path each part task writes to."""
    parts = range(len(spec["parts"]))
    if format == "parquet":
        os.makedirs(tmp)
        return [os.path.join(tmp, f"part-{p:05d}.parquet") for p in parts]
    if format == "word2vec":
        os.makedirs(pieces)
        return [os.path.join(pieces, f"part-{p:05d}.txt") for p in parts]
    os.makedirs(tmp)
    vectors = os.path.join(tmp, "vectors.npy")
    # the header and a file of the full size; part tasks fill their rows in place
    np.lib.format.open_memmap(vectors, mode="w+", dtype=dtype, shape=(spec["rows"], spec["dim"])).flush()
    # the key file is in row-id order already, which is the order of vectors.npy
    pq.write_table(pa.table({"key": keys.cast(pa.string())}), os.path.join(tmp, "keys.parquet"))
    return [vectors for _ in parts]


def _run_parts(model, table, format, targets, normalize, dtype, keys, runner, bar) -> list[dict]:
    """One task per part. Threads share this process's key array and update the bar batch by batch;
    Ray tasks load the keys themselves and the bar moves as each part finishes."""
    if runner is None:
        calls = [(model, table, p, format, target, normalize, dtype, keys, bar.update)
                 for p, target in enumerate(targets)]
        return sorted((r for _, r in run_local(export_part, calls)), key=lambda r: r["part"])
    calls = [(model, table, p, format, target, normalize, dtype) for p, target in enumerate(targets)]
    done = []
    for _, result in runner(export_part, calls):
        bar.update(result["rows"])
        done.append(result)
    return sorted(done, key=lambda r: r["part"])


def _join_text(path: str, header: str, pieces: list[str]) -> None:
    with open(path, "wb") as out:
        out.write(header.encode())
        for piece in pieces:
            with open(piece, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)


def check_replaceable(out: str, kind: str) -> bool:
    """Whether `out` may receive an output of `kind`: False when nothing is there (or an empty
    directory), True when it replaces an earlier output of the same kind; anything else (a file or
    folder doc2vec-dist did not write) is refused with one line naming it (see outputs)."""
    if kind in outputs.DIR_KINDS:
        return outputs.check_dir(out, kind, None)
    return outputs.check_file(out, kind)


def replace_output(tmp: str, out: str, kind: str) -> None:
    """Move a finished output into place, replacing an earlier output of the same kind, after
    checking again that this is what is there."""
    if kind in outputs.DIR_KINDS:
        outputs.commit_dir(tmp, out, kind, None)
        return
    check_replaceable(out, kind)
    os.replace(tmp, out)


def output_kind(out: str, format: str) -> str:
    """The kind of output `export` writes at `out` in `format` (outputs.DIR_KINDS or FILE_KINDS)."""
    if format == "word2vec":
        return "word2vec"
    return "vectors" if format == "parquet" and out.endswith(".parquet") else "export"


def remove_path(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)
