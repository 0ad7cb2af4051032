"""What an index is built from: a source (a model's table, or a key/vector Parquet dataset) in units of one
file, and the tasks run on each unit (in a thread of this process or as a Ray task): stage_unit normalises a
unit's rows into INDEX/vectors.npy and its keys into a piece of keys.parquet, encode_unit encodes them into an
ivfpq sub-index; iter_npy_rows streams vectors.npy.

Changes when a kind of source, or what a task does to its unit, changes; the order of the steps of a build
is index.py's, of an update index_update.py's.
"""

from __future__ import annotations

import dataclasses
import glob
import os

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import modeldir, provenance
from .errors import UserError
from .export import npy_data_offset, open_npy
from .ids import repeated_rows
from .modeldir import ModelDir
from .runners import where
from .scoring import NAMED, counted, lookup, unit_rows

CHUNK_ROWS = 1 << 18          # rows streamed at a time: 100 MB at dim 100


KEY_SCHEMA = pa.schema([("key", pa.string())])  # a null key marks a dead id (an update removed its row)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One file of the source, read by one task: a checkpoint part or a Parquet file."""
    path: str
    rows: int
    offset: int              # faiss id of its first row
    part: int | None = None  # its position in the table's manifest entry, for a checkpoint part


@dataclasses.dataclass(frozen=True)
class Source:
    name: str                # shown in messages and params.json
    dim: int
    rows: int
    units: tuple[Unit, ...]
    model: str | None = None
    table: str | None = None
    version: int | None = None  # the model's version every task reads
    provenance: dict | None = None  # the model the vectors came from (provenance.of_model), as far as known


def model_source(model: str, table: str) -> Source:
    found = ModelDir(model)
    spec = found.spec(table)
    if (count := found.key_count(table)) != spec["rows"]:
        raise UserError(f"{model}: {count} keys but table {table} has {spec['rows']} rows")
    vdir = modeldir.version_dir(model, found.version)
    units, offset = [], 0
    for i, part in enumerate(spec["parts"]):
        units.append(Unit(os.path.join(vdir, part["path"]), part["rows"], offset, i))
        offset += part["rows"]
    return Source(f"{model}:{table}", spec["dim"], offset, tuple(units), model, table, found.version,
                  provenance.of_model(found, table))


def parquet_source(path: str) -> Source:
    """The files of a key/vector Parquet file or directory, checked for the two columns, with the model
    they record coming from (export and infer record it; its files must agree)."""
    files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)) if os.path.isdir(path) else [path]
    if not files:
        raise UserError(f"{path}: no .parquet files found")
    units, offset, dim, recorded = [], 0, None, ...
    for file in files:
        try:
            meta = pq.ParquetFile(file)
            schema = meta.schema_arrow
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{file}: cannot read key/vector Parquet ({exc})") from None
        if "key" not in schema.names or "vector" not in schema.names:
            raise UserError(f"{file}: needs columns 'key' and 'vector', found {', '.join(schema.names)}")
        vtype = schema.field("vector").type
        if not (pa.types.is_fixed_size_list(vtype) and pa.types.is_floating(vtype.value_type)):
            raise UserError(f"{file}: column 'vector' must be fixed_size_list<float32>, found {vtype}")
        if dim is not None and vtype.list_size != dim:
            raise UserError(f"{file}: vectors of {vtype.list_size} dims, earlier files have {dim}")
        dim = vtype.list_size
        source = provenance.of_parquet_schema(schema.metadata)
        if recorded is not ... and source != recorded:
            raise UserError(f"{file}: made from {provenance.describe(source)}, earlier files of {path} from "
                            f"{provenance.describe(recorded)}; index the vectors of one model")
        recorded = source
        units.append(Unit(file, meta.metadata.num_rows, offset))
        offset += meta.metadata.num_rows
    return Source(path, dim, offset, tuple(units), provenance={**(recorded or {}), "vectors": os.path.abspath(path)})


def parquet_vectors(path: str, keys: list[str]) -> tuple[np.ndarray, Source]:
    """The float32 vectors of `keys` in a key/vector Parquet file or directory (checked as
    parquet_source checks it; its source says which model it records), in the order asked. Only the
    row groups that can hold the keys are read (export writes the key column's statistics). An
    unknown key is an error naming the file, with its closest keys; a key found twice gives its first row.
    A key whose vector is null (a user infer could not place) gets a row of NaN, which neighbors skips."""
    import pyarrow.dataset as ds

    source = parquet_source(path)
    data = ds.dataset([unit.path for unit in source.units], format="parquet")
    column = pc.field("key") if pa.types.is_string(data.schema.field("key").type) else pc.field("key").cast(pa.string())
    try:
        found = data.to_table(columns=["key", "vector"], filter=column.isin(keys))
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise UserError(f"{path}: cannot read its keys and vectors ({str(exc).splitlines()[0]})") from None
    at = pc.index_in(pa.array(keys, pa.string()), value_set=found.column("key").combine_chunks().cast(pa.string()))
    if at.null_count:  # the error names the file's closest keys
        lookup(data.to_table(columns=["key"]).column("key").combine_chunks(), keys, path)
    column = found.column("vector").take(at)
    vectors = np.full((len(keys), source.dim), np.nan, np.float32)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    vectors[valid] = modeldir.matrix_of(column.filter(valid), source.dim)  # matrix_of of nulls would drop their rows
    return vectors, source


def read_unit(source: Source, unit: Unit, keys: pa.Array | None = None):
    """(keys, float32 vectors, keys without a vector, kept) of one unit, a batch at a time. A row whose
    vector is null (infer writes one for a user it could not place) or all zero (a row never trained: a
    model's words_out keeps one for a URL seen only in held-out pairs, and an export of it writes it) is
    left out of the first two, its key given in the third; kept is then the mask of the batch's rows
    given in the first two (None: all). A model's table likewise, its never-trained rows left out."""
    if source.model is not None:
        found = ModelDir(source.model, version=source.version)
        keys = found.keys(source.table) if keys is None else keys
        for ids, vectors in found.batches(source.table, unit.part):
            batch_keys = keys.take(pa.array(ids))
            yield _without_zero_rows(batch_keys, batch_keys, vectors, _NO_KEYS, None)
        return
    for batch in pq.ParquetFile(unit.path).iter_batches(batch_size=1 << 16, columns=["key", "vector"]):
        batch_keys, column, no_vector, kept = batch.column("key"), batch.column("vector"), _NO_KEYS, None
        if column.null_count:
            valid = column.is_valid()
            no_vector = batch_keys.filter(pc.invert(valid))
            batch_keys, column = batch_keys.filter(valid), column.filter(valid)
            kept = valid.to_numpy(zero_copy_only=False)
        vectors = modeldir.matrix_of(column, source.dim).astype(np.float32, copy=False)
        yield _without_zero_rows(batch.column("key"), batch_keys, vectors, no_vector, kept)


def _without_zero_rows(all_keys, batch_keys, vectors: np.ndarray, no_vector, kept):
    """read_unit's batch less its all-zero rows (no direction: cosine has nothing to go on), left out as a null
    vector is, named in the batch's order (all_keys: every key of the batch, those without a vector too)."""
    zero = np.isfinite(vectors).all(axis=1) & ~vectors.any(axis=1)
    if not zero.any():
        return batch_keys, vectors, no_vector, kept
    rows = np.flatnonzero(kept) if kept is not None else np.arange(len(zero))
    kept = np.zeros(len(all_keys), bool)
    kept[rows[~zero]] = True
    return batch_keys.filter(pa.array(~zero)), vectors[~zero], all_keys.filter(pa.array(~kept)), kept


_NO_KEYS = pa.array([], pa.string())


def read_keys(path: str) -> pa.Array:
    """The key column of an index's keys.parquet as one string array (null: a dead id)."""
    return pq.read_table(path, columns=["key"]).column("key").combine_chunks().cast(pa.string())


def check_keys(source: Source) -> None:
    """Refuse a key/vector Parquet dataset whose key column has a null (an index's keys.parquet marks a
    dead id with one, and a neighbour would be answered as null) or a key given twice (two ids for one
    key: it would be answered twice, and an update matches rows by key), before anything is staged:
    one UserError naming the first such row (its file, row and key) and counting them. Reads the key
    column alone, file by file; holds the keys for the duplicate check. A model's keys are unique and
    never null by construction: nothing is read for it."""
    if source.model is not None:
        return
    columns = []
    for unit in source.units:
        try:
            columns.append(pq.ParquetFile(unit.path).read(columns=["key"]).column("key"))
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{unit.path}: cannot read its column 'key' ({str(exc).splitlines()[0]})") from None
    nulls = sum(column.null_count for column in columns)
    if nulls:
        at = next(i for i, column in enumerate(columns) if column.null_count)
        row = pc.index(pc.is_null(columns[at]), True).as_py()
        raise UserError(f"{source.units[at].path}: row {row} has no 'key' ({_rows_of(source, nulls)} "
                        f"{'has' if nulls == 1 else 'have'} a null key); an index answers with keys: give every "
                        "row one")
    keys = pa.chunked_array([chunk for column in columns for chunk in column.cast(pa.large_string()).chunks],
                            pa.large_string()).combine_chunks()
    del columns
    repeats = len(keys) - pc.count_distinct(keys).as_py()
    if not repeats:
        return
    again, first = repeated_rows(keys)
    row = int(again[0])
    (path, at), (path0, at0) = _file_row(source, row), _file_row(source, int(first[row]))
    earlier = f"row {at0}" + ("" if path0 == path else f" of {path0}")
    raise UserError(f"{path}: row {at} repeats key {keys[row].as_py()!r} of {earlier} (column 'key'; "
                    f"{_rows_of(source, repeats)} {'repeats' if repeats == 1 else 'repeat'} an earlier key); an "
                    "index holds one vector per key: give each key once")


def vector_problems(unit: Unit, found: dict, vectors: np.ndarray, keys: pa.Array, first_row: int,
                    kept: np.ndarray | None) -> bool:
    """Count into `found` the rows of a batch of a key/vector Parquet whose vector cosine cannot take: a
    NaN or inf element (an all-zero one read_unit leaves out); the first is kept as [file, row in it,
    key, element, value]. first_row: the file row of the batch's first row; kept: which of the batch's
    rows `vectors` holds (None: all). True when the batch has one."""
    bad = ~np.isfinite(vectors).all(axis=1)
    n = int(bad.sum())
    if n:
        found["nonfinite"] = found.get("nonfinite", 0) + n
        if "first_nonfinite" not in found:
            i = int(np.argmax(bad))
            element = int(np.argmax(~np.isfinite(vectors[i])))
            found["first_nonfinite"] = [unit.path, first_row + (int(np.flatnonzero(kept)[i]) if kept is not None
                                                                  else i), keys[i].as_py(), element,
                                        str(vectors[i, element])]
    return bool(found)


def refuse_vector_problems(source: Source, found: list[dict]) -> None:
    """One UserError for the first unit's first row that vector_problems found (NaN or inf), counting such
    rows over every unit; nothing when there is none."""
    n = sum(f.get("nonfinite", 0) for f in found)
    if n:
        path, row, key, element, value = next(f["first_nonfinite"] for f in found if f.get("nonfinite"))
        raise UserError(f"{path}: row {row} (key {key!r}) has {value} at element {element} of its 'vector' "
                        f"({_rows_of(source, n)} {'holds' if n == 1 else 'hold'} NaN or inf); cosine needs finite "
                        "vectors: drop those rows, or give them a null vector (the index leaves such rows out)")


def _rows_of(source: Source, n: int) -> str:
    """'1 row', or '3 rows of DIR' for a dataset of several files."""
    return counted(n, "row") + (f" of {source.name}" if len(source.units) > 1 else "")


def _file_row(source: Source, row: int) -> tuple[str, int]:
    """(file, row in it) of row `row` of the source, counting every row of its files."""
    at = int(np.searchsorted([unit.offset for unit in source.units], row, side="right")) - 1
    return source.units[at].path, row - source.units[at].offset


# ---------------------------------------------------------------------------------------------------
# tasks (each runs in a thread of this process or as a Ray task)
# ---------------------------------------------------------------------------------------------------

def stage_unit(source: Source, unit: Unit, vectors_path: str, keys_piece: str, sample_rows: int, seed: int,
               keys: pa.Array | None = None, on_rows=None) -> dict:
    """Normalise one unit's rows into their place in vectors.npy, its keys into a Parquet piece;
    returns a uniform random sample of its normalised rows (for training) and where it ran. Rows
    without a vector are left out (the unit's rows then end early: _stage closes the gap), counted,
    and the first NAMED of their keys returned. A key/vector Parquet's vectors are checked
    (vector_problems): rows that cosine cannot take are counted in `bad_rows`, the first named, and
    once one is found nothing more is written (_stage then refuses the source)."""
    rng = np.random.default_rng([seed, unit.offset])
    picks = np.sort(rng.choice(unit.rows, min(sample_rows, unit.rows), replace=False))
    sample, seen, nulls, null_keys, bad = [], 0, 0, [], {}
    check = source.model is None  # a model's rows: training refuses non-finite values; never-trained rows stay zero
    with open(vectors_path, "r+b") as fh, pq.ParquetWriter(keys_piece, KEY_SCHEMA) as key_writer:
        fh.seek(npy_data_offset(vectors_path) + unit.offset * source.dim * 4)
        for chunk_keys, vectors, no_vector, kept in read_unit(source, unit, keys):
            first_row = seen + nulls
            nulls += len(no_vector)
            null_keys += no_vector.slice(0, NAMED - len(null_keys)).cast(pa.string()).to_pylist()
            if seen + nulls + len(vectors) > unit.rows:
                break  # more rows than the file's metadata said: caught below
            if not (check and vector_problems(unit, bad, vectors, chunk_keys, first_row, kept)):
                vectors = unit_rows(vectors)
                fh.write(vectors.tobytes())
                key_writer.write_table(pa.table({"key": chunk_keys.cast(pa.string())}))
                lo, hi = np.searchsorted(picks, [seen, seen + len(vectors)])
                sample.append(vectors[picks[lo:hi] - seen])
            seen += len(vectors)
            if on_rows:
                on_rows(len(vectors) + len(no_vector))
    if seen + nulls != unit.rows:
        raise UserError(f"{unit.path}: read {seen + nulls} rows, its metadata says {unit.rows}")
    return {"rows": seen, "null_vectors": nulls, "null_keys": null_keys, "bad_rows": bad,
            "sample": np.concatenate(sample or [np.zeros((0, source.dim), np.float32)]), **where()}


def encode_unit(trained: np.ndarray, vectors_path: str, offset: int, rows: int, sub_path: str, on_rows=None) -> dict:
    """Add rows [offset, offset + rows) of vectors.npy to a copy of the trained, empty IVF-PQ index
    and write it to sub_path, to be merged in unit order."""
    index = faiss.deserialize_index(trained)
    for _, chunk in iter_npy_rows(vectors_path, offset, rows):
        index.add(chunk)
        if on_rows:
            on_rows(len(chunk))
    faiss.write_index(index, sub_path)
    return {"rows": rows, **where()}


def iter_npy_rows(path: str, start: int, rows: int, chunk_rows: int = CHUNK_ROWS):
    """(first row, float32 chunk) over rows [start, start + rows) of a 2-d .npy, read (not mapped)."""
    header = open_npy(path)
    dim, offset = header.shape[1], header.offset
    del header
    with open(path, "rb") as fh:
        fh.seek(offset + start * dim * 4)
        for first in range(start, start + rows, chunk_rows):
            n = min(chunk_rows, start + rows - first)
            yield first, np.fromfile(fh, dtype=np.float32, count=n * dim).reshape(n, dim)
