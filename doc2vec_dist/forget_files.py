"""How one file loses the forgotten keys: a Parquet file's rows (its statistics computed anew over the rows
that stay), an npy matrix and its keys (replaced together through a journal; _recover finishes one that a
crash left), a word2vec text file's lines, a JSON document's values (scrub). Each file is replaced whole: a
temporary name, then a rename.

Changes when a kind of file that forget rewrites, or how it rewrites one, changes; which files of which place
are rewritten is forget_steps.py's.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import outputs, provenance, storage
from .errors import UserError

JOURNAL = ".forget-journal.json"             # files replaced together (an npy matrix and its keys)
PENDING = ".forget-pending"                  # suffix of a file waiting in a journal


def _string_columns(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def _rows_to_drop(batch: pa.RecordBatch | pa.Table, columns: list[str], drop: pa.Array) -> np.ndarray:
    hit = np.zeros(batch.num_rows, bool)
    for name in columns:
        hit |= pc.fill_null(pc.is_in(batch.column(name), value_set=drop), False).to_numpy(zero_copy_only=False)
    return hit


def _parquet_holds(path: str, drop: pa.Array) -> bool:
    try:
        found = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{path}: cannot read it as Parquet ({exc})") from None
    columns = _string_columns(found.schema_arrow)
    return bool(columns) and any(_rows_to_drop(b, columns, drop).any()
                                 for b in found.iter_batches(columns=columns, batch_size=1 << 16))


def _rewrite_parquet(path: str, drop: pa.Array, source: Callable[[dict | None], dict | None] | None = None) -> int:
    """The Parquet file without the rows any string column of which is a dropped key, written anew (so its
    statistics are those of the rows that stay) under a temporary name and renamed; returns rows dropped."""
    found = pq.ParquetFile(path)
    schema = found.schema_arrow
    columns = _string_columns(schema)
    metadata = dict(schema.metadata or {})
    if source is not None and provenance.PARQUET_KEY in metadata:
        updated = source(provenance.of_parquet_schema(metadata))
        metadata[provenance.PARQUET_KEY] = json.dumps(updated).encode()
    schema = schema.with_metadata(metadata)
    options = outputs.PARQUET_OPTIONS if {"key", "vector"} <= set(schema.names) else {}
    tmp = outputs.temp_path(path)
    dropped = 0
    try:
        with pq.ParquetWriter(tmp, schema, **options) as writer:
            for batch in found.iter_batches(batch_size=1 << 16):
                gone = _rows_to_drop(batch, columns, drop)
                dropped += int(gone.sum())
                writer.write_table(pa.Table.from_batches([batch.filter(pa.array(~gone))], schema=schema))
        os.replace(tmp, path)
    finally:
        outputs.remove_path(tmp)
    return dropped


def _npy_keys(matrix: str) -> str | None:
    """The keys file of an npy matrix export wrote: DIR/keys.parquet beside DIR/vectors.npy, or X.keys.parquet."""
    beside = (os.path.join(os.path.dirname(matrix), "keys.parquet") if os.path.basename(matrix) == "vectors.npy"
              else outputs.npy_keys_path(matrix))
    return beside if os.path.isfile(beside) else None


def _rewrite_npy(matrix: str, keys_path: str, drop: pa.Array, source) -> list[str]:
    """The matrix and its keys without the dropped keys' rows, replaced together through a journal (each new
    file written in full beside its old one first), so a forget stopped between the two renames is finished
    by the next (_recover)."""
    from .export import open_npy

    keys = pq.read_table(keys_path).column("key").combine_chunks()
    gone = _rows_to_drop(pa.table({"key": keys}), ["key"], drop)
    old = open_npy(matrix)
    if old.shape[0] != len(keys):
        raise UserError(f"{matrix}: {old.shape[0]:,} rows, its keys file {keys_path} {len(keys):,}; export it again")
    stays = np.flatnonzero(~gone)
    new_matrix, new_keys = matrix + PENDING, keys_path + PENDING
    fresh = np.lib.format.open_memmap(new_matrix, mode="w+", dtype=old.dtype, shape=(len(stays), *old.shape[1:]))
    for start in range(0, len(stays), 1 << 18):
        fresh[start:start + (1 << 18)] = old[stays[start:start + (1 << 18)]]
    fresh.flush()
    del fresh, old
    _rewrite_parquet_to(keys_path, new_keys, drop, source)
    journal = os.path.join(os.path.dirname(matrix), JOURNAL)
    storage.write_local(journal, json.dumps({"replace": [os.path.basename(new_matrix), os.path.basename(new_keys)]}))
    _recover(os.path.dirname(matrix))
    return [matrix, keys_path]


def _rewrite_parquet_to(path: str, out: str, drop: pa.Array, source) -> None:
    shutil.copyfile(path, out)
    _rewrite_parquet(out, drop, source)


def _recover(directory: str) -> list[str]:
    """Finish what a journal in `directory` lists (each pending file renamed over its own), or, with no
    journal, remove pending files a stopped forget left half written. Returns the files replaced."""
    journal = os.path.join(directory, JOURNAL)
    done = []
    if os.path.exists(journal):
        with open(journal) as fh:
            names = json.load(fh)["replace"]
        for name in names:
            pending = os.path.join(directory, name)
            if os.path.exists(pending):
                os.replace(pending, pending.removesuffix(PENDING))
                done.append(pending.removesuffix(PENDING))
        os.remove(journal)
    else:
        for name in os.listdir(directory):
            if name.endswith(PENDING):
                os.remove(os.path.join(directory, name))
    return done


def _word2vec_holds(path: str, drop: set[str]) -> bool:
    with open(path, "rb") as fh:
        fh.readline()
        return any(line.split(b" ", 1)[0].decode("utf-8", "replace") in drop for line in fh)


def _rewrite_word2vec(path: str, drop: set[str]) -> None:
    tmp = outputs.temp_path(path)
    try:
        with open(path, "rb") as src:
            _, dim = src.readline().split()
            kept = sum(1 for line in src if line.strip() and line.split(b" ", 1)[0].decode("utf-8", "replace")
                       not in drop)
        with open(path, "rb") as src, open(tmp, "wb") as out:
            src.readline()
            out.write(f"{kept} {int(dim)}\n".encode())
            for line in src:
                if line.strip() and line.split(b" ", 1)[0].decode("utf-8", "replace") not in drop:
                    out.write(line)
        os.replace(tmp, path)
    finally:
        outputs.remove_path(tmp)


def _projector_holds(directory: str, drop: set[str]) -> bool:
    """Whether a projector export's metadata.tsv (a header, then key, host, count a point) names a dropped key."""
    with open(os.path.join(directory, "metadata.tsv"), "rb") as fh:
        fh.readline()
        return any(line.split(b"\t", 1)[0].decode("utf-8", "replace") in drop for line in fh)


def _rewrite_projector(directory: str, drop: set[str]) -> list[str]:
    """A projector export without the dropped keys' points: their lines of metadata.tsv and, line for line,
    of tensors.tsv (its line i is metadata's point i), each file replaced whole."""
    meta, tensors = os.path.join(directory, "metadata.tsv"), os.path.join(directory, "tensors.tsv")
    tmp_meta, tmp_tensors = outputs.temp_path(meta), outputs.temp_path(tensors)
    try:
        with open(meta, "rb") as src_meta, open(tensors, "rb") as src_tensors, open(tmp_meta, "wb") as out_meta, \
                open(tmp_tensors, "wb") as out_tensors:
            out_meta.write(src_meta.readline())
            for line, row in zip(src_meta, src_tensors):
                if line.split(b"\t", 1)[0].decode("utf-8", "replace") not in drop:
                    out_meta.write(line)
                    out_tensors.write(row)
        os.replace(tmp_tensors, tensors)
        os.replace(tmp_meta, meta)
    finally:
        outputs.remove_path(tmp_meta)
        outputs.remove_path(tmp_tensors)
    return [meta, tensors]


def _report_holds(path: str, drop: set[str]) -> bool:
    """Whether a report page names a dropped key (as written, or escaped for HTML)."""
    import html

    with open(path, "rb") as fh:
        page = fh.read()
    return any(key.encode() in page or html.escape(key).encode() in page for key in drop)


def scrub(value, drop: set[str]):
    """A JSON value without the dropped keys: a string that is one becomes null, a list loses the items that
    are one (or objects with a field that is one), an object loses the fields named by one. Returns (value,
    whether anything changed)."""
    if isinstance(value, str):
        return (None, True) if value in drop else (value, False)
    if isinstance(value, list):
        out, changed = [], False
        for item in value:
            if (isinstance(item, str) and item in drop) or (
                    isinstance(item, dict) and any(isinstance(v, str) and v in drop for v in item.values())):
                changed = True
                continue
            item, moved = scrub(item, drop)
            out.append(item)
            changed |= moved
        return out, changed
    if isinstance(value, dict):
        out, changed = {}, False
        for k, v in value.items():
            if k in drop:
                changed = True
                continue
            out[k], moved = scrub(v, drop)
            changed |= moved
        return out, changed
    return value, False
