"""Export a trained table as (key, vector): Parquet, word2vec text, or npy + keys.

Streams one checkpoint part (one parameter-server slice) at a time, so memory is bounded by the
largest part, not the table.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import checkpoint
from .errors import UserError

KEY_TABLES = {"docs": ("docs.arrow", "key"), "words": ("vocab.arrow", "token"), "words_out": ("vocab.arrow", "token")}


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


def export(model: str, table: str, out: str, format: str = "parquet", progress: bool = True,
           normalize: bool = False, dtype: str = "float32") -> dict:
    """Write `table` of the model's LATEST checkpoint to `out`; returns rows, seconds and rows/s.

    parquet: `out` ending in .parquet is one file (a row group per part); otherwise a directory of
    part files. word2vec: gensim's text format. npy: `out`/vectors.npy (row i ↔ keys.parquet row i).
    normalize scales every vector to unit length (cosine = dot product downstream); dtype float16
    halves the size.
    """
    if dtype not in ("float32", "float16"):
        raise UserError(f"unknown export dtype {dtype!r} (choose from float32, float16)")
    t0 = time.perf_counter()
    _, spec = checkpoint.table_spec(model, table)
    keys = keys_of(model, table)
    if len(keys) != spec["rows"]:
        raise UserError(f"{model}: {len(keys)} keys but table {table} has {spec['rows']} rows")
    writers = {"parquet": _ParquetOut, "word2vec": _Word2VecOut, "npy": _NpyOut}
    if format not in writers:
        raise UserError(f"unknown export format {format!r} (choose from {', '.join(writers)})")
    check_replaceable(out, EXPORT_FILES)
    tmp = f"{out.rstrip('/')}.tmp-{os.getpid()}"
    sink = writers[format](tmp, keys, spec["dim"], np.dtype(dtype))
    bar = tqdm(total=spec["rows"], unit="row", unit_scale=True, desc=f"export {table}", disable=not progress,
               file=sys.stderr)
    try:
        for i, (ids, vectors) in enumerate(checkpoint.iter_parts(model, table)):
            if normalize:
                vectors = unit_rows(vectors)
            sink.write(i, ids, keys.take(pa.array(ids)), vectors.astype(dtype, copy=False))
            bar.update(len(ids))
        sink.close()
        replace_output(tmp, out, EXPORT_FILES)
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    return {"table": table, "rows": spec["rows"], "dim": spec["dim"], "path": out, "format": format, "dtype": dtype,
            "normalized": normalize,
            "seconds": round(seconds, 3), "rows_per_second": spec["rows"] / seconds if seconds else 0.0}


EXPORT_FILES = ("part-*.parquet", "vectors.npy", "keys.parquet")


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; all-zero rows (never trained) stay zero."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def check_replaceable(out: str, own_files: tuple[str, ...]) -> None:
    """Refuse to replace a directory unless it holds only files this tool writes there.

    An existing *file* at `out` is replaced, as cp would; an existing directory is replaced only when
    it is a previous output of the same kind, so `--out` pointing at a model or a home directory
    cannot delete it.
    """
    if not os.path.isdir(out):
        return
    foreign = [name for name in os.listdir(out) if not any(fnmatch.fnmatch(name, p) for p in own_files)]
    if foreign:
        raise UserError(f"{out}: directory exists and holds other files ({', '.join(sorted(foreign)[:3])}); "
                        "remove it or choose another --out")


def replace_output(tmp: str, out: str, own_files: tuple[str, ...]) -> None:
    """Move a finished output into place, replacing a previous output of the same kind."""
    check_replaceable(out, own_files)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.replace(tmp, out)


def key_vector_table(keys: pa.Array, vectors: np.ndarray) -> pa.Table:
    return pa.table({"key": keys.cast(pa.string()), "vector": checkpoint.vectors_array(vectors)})


class _ParquetOut:
    def __init__(self, path: str, keys: pa.Array, dim: int, dtype: np.dtype):
        self.path, self.single = path, path.rsplit(".tmp-", 1)[0].endswith(".parquet")
        self.writer = None
        if not self.single:
            os.makedirs(path)

    def write(self, part: int, ids, keys, vectors) -> None:
        table = key_vector_table(keys, vectors)
        if not self.single:
            pq.write_table(table, os.path.join(self.path, f"part-{part:05d}.parquet"))
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
        _remove(self.path)


class _Word2VecOut:
    """gensim's word2vec text format: a 'rows dim' header, then 'key v1 v2 …' per row."""

    def __init__(self, path: str, keys: pa.Array, dim: int, dtype: np.dtype):
        self.path = path
        self.fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()/abort()
        self.fh.write(f"{len(keys)} {dim}\n")

    def write(self, part: int, ids, keys, vectors) -> None:
        for row, (key, vector) in enumerate(zip(keys.to_pylist(), vectors)):
            if not key or any(c.isspace() for c in key):
                raise UserError(f"word2vec format cannot hold key {key!r} (row id {ids[row]}): it contains "
                                "whitespace; export as parquet instead")
            self.fh.write(key + " " + " ".join(f"{x:.6g}" for x in vector) + "\n")

    def close(self) -> None:
        self.fh.close()

    def abort(self) -> None:
        self.fh.close()
        _remove(self.path)


class _NpyOut:
    """vectors.npy (memory-mapped, filled part by part) and keys.parquet in row-id order."""

    def __init__(self, path: str, keys: pa.Array, dim: int, dtype: np.dtype):
        os.makedirs(path)
        self.path = path
        self.vectors = np.lib.format.open_memmap(os.path.join(path, "vectors.npy"), mode="w+",
                                                 dtype=dtype, shape=(len(keys), dim))
        # the key file is in row-id order already, which is the order of vectors.npy
        pq.write_table(pa.table({"key": keys.cast(pa.string())}), os.path.join(path, "keys.parquet"))

    def write(self, part: int, ids, keys, vectors) -> None:
        self.vectors[ids] = vectors

    def close(self) -> None:
        self.vectors.flush()
        del self.vectors

    def abort(self) -> None:
        _remove(self.path)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)
