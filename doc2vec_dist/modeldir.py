"""A trained model's directory, for reading: its layout, versions, manifests, key tables and verified parts.

Changes when what a model directory holds, or how a version of it is read, changes; writing, committing
and discarding versions belongs to `checkpoint`, talking to the storage underneath to `storage`.

    MODEL/config.json                 resolved config
    MODEL/docs.arrow, vocab.arrow     the corpus's key tables (row id → user key / URL), so a model
                                      stands alone once trained
    MODEL/LATEST                      "vN", moved only after vN is whole
    MODEL/checkpoints/vN/manifest.json   its parts, and the model's id (model_id: random at the first
                                         version, kept by every later one; derived_from: the ids of an
                                         --init-from model and its own ancestors; see `provenance`)
    MODEL/checkpoints/vN/{docs,words,words_out}/part-SSSSS-of-TTTTT.arrow   columns id, vector[, adagrad]

MODEL is a local path or a URI (see `storage`). LATEST only ever names a version whose manifest exists,
and a manifest lists every part with its row count, byte size and sha256 (`checkpoint.commit` writes
them in that order); a version directory without a manifest is partial and is never read.

Checksums, row counts and dims are checked on load. Loading memory-maps local Arrow files; a remote
part is streamed into a local temporary file (hashed on the way) and memory-mapped from there, so
memory stays bounded by a record batch, not a part. Only Arrow and JSON are ever read back: nothing
here unpickles. A manifest is validated field by field before anything in it is used, and its part
paths are plain relative names inside the version directory.

Readers: a parameter server loads its own rows with read_shard, whatever number of servers wrote the
version (row r lives on shard r % S). The serving side (Model, export, index, evaluate, infer) and a
refresh's `prepare --base` open a model with `ModelDir`: its config, keys and vocab, and one verified
part reader (`ModelDir.parts`) that checks each part's size, sha256, schema, nulls and row count the
same way for every caller. A remote model is used through local_copy(), a verified copy of LATEST in
a cache directory.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from . import precision, storage
from .compact import new_ids
from .corpus import arrow_of, numpy_of
from .errors import UserError
from .storage import HashingSink, Store, copy_stream, is_uri, sha256_file, strip_query, write_local

FORMAT_VERSION = 1
TABLES = ("docs", "words", "words_out")
_VERSION_RE = re.compile(r"^v(\d+)$")
_PART_RE = re.compile(r"^(docs|words|words_out)/part-(\d{5})-of-(\d{5})\.arrow$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_MODEL_ID_RE = re.compile(r"^[0-9a-f]{32}$")

KEY_FILES = ("docs.arrow", "vocab.arrow")


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.arrow"


def version_dir(model: str, version: int) -> str:
    return storage.join(model, "checkpoints", f"v{version}")


def version_rel(version: int, rel: str = "") -> str:
    """A path inside the model directory: version `version`'s directory, or `rel` inside it."""
    return f"checkpoints/v{version}/{rel}" if rel else f"checkpoints/v{version}"


# A part file's vectors by the table's dtype (precision.py): Arrow's float and halffloat, and bfloat16
# as its bits (Arrow has no bfloat16), named in the schema's metadata under DTYPE_KEY
PART_VALUE_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "bfloat16": pa.uint16()}
DTYPE_KEY = b"doc2vec.dtype"


def part_dtype(schema: pa.Schema) -> str | None:
    """The dtype of a part file's vectors by its schema (None: not one a part holds)."""
    vector = schema.field("vector").type if "vector" in schema.names else None
    if vector is None or not pa.types.is_fixed_size_list(vector):
        return None
    named = (schema.metadata or {}).get(DTYPE_KEY, b"").decode(errors="replace") or None
    value = vector.value_type
    if value == pa.float32() and named in (None, "float32"):
        return "float32"
    if value == pa.float16() and named in (None, "float16"):
        return "float16"
    if value == pa.uint16() and named == "bfloat16":
        return "bfloat16"
    return None


def vectors_array(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """A [n, dim] float32 (or float16, or bfloat16's bits as uint16) matrix as fixed_size_list<float>[dim],
    without copying."""
    kept = np.float16 if matrix.dtype == np.float16 else np.uint16 if matrix.dtype == np.uint16 else np.float32
    matrix = np.ascontiguousarray(matrix, dtype=kept)
    return pa.FixedSizeListArray.from_arrays(arrow_of(matrix.reshape(-1)), matrix.shape[1])


def matrix_of(vectors: pa.Array | pa.ChunkedArray, dim: int) -> np.ndarray:
    """fixed_size_list<float32>[dim] back to a [n, dim] float32 matrix (zero-copy for one chunk)."""
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks() if vectors.num_chunks != 1 else vectors.chunk(0)
    flat = numpy_of(vectors.flatten())
    return flat.reshape(-1, dim)


# ---------------------------------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------------------------------

def version_dirs(store: Store) -> list[int]:
    """Every vN under checkpoints/, committed or partial."""
    return sorted(int(m.group(1)) for info in store.list("checkpoints")
                  if info.type == pafs.FileType.Directory and (m := _VERSION_RE.match(info.base_name)))


def is_committed(store: Store, version: int) -> bool:
    return store.is_file(version_rel(version, "manifest.json"))


def committed_versions(model: str, *, fs: pafs.FileSystem | None = None) -> list[int]:
    """The versions up to LATEST that are whole (have a manifest): the ones a model keeps on disk."""
    store = Store.of(model, fs)
    latest = read_latest(store, strict=False)
    if latest is None:
        return []
    return [v for v in version_dirs(store) if v <= latest and is_committed(store, v)]


def latest_version(model: str, *, fs: pafs.FileSystem | None = None) -> int | None:
    """The version LATEST names, or None for a model directory that has no committed version."""
    return read_latest(Store.of(model, fs), strict=True)


def read_latest(store: Store, strict: bool) -> int | None:
    """The version LATEST names (None: no LATEST; one that names no version is refused with `strict`, else None)."""
    if not store.is_file("LATEST"):
        return None
    name = store.read_bytes("LATEST", limit=64).decode(errors="replace").strip()
    m = _VERSION_RE.match(name)
    if not m:
        if strict:
            raise UserError(f"{store.show('LATEST')}: expected a version like v3, found {name[:40]!r}")
        return None
    return int(m.group(1))


def version_damage(store: Store, version: int, verify: bool = True) -> str | None:
    """What is wrong with a committed version, in a few words (`docs/part-00001-of-00002.arrow: part
    file missing`), or None when its manifest and every part it lists are whole: with `verify`, each part
    opened as every reader opens it, its sha256 checked (open_part: a whole read of the version; on an
    object store, a download); without, each part's presence and size (a listing, nothing read)."""
    within = store.show(version_rel(version)).rstrip("/") + "/"

    def short(exc: UserError) -> str:
        return str(exc).removeprefix(within).removesuffix("; the checkpoint is damaged")

    try:
        manifest = read_manifest(store, version)[1]
        for spec in manifest["tables"].values():
            for part in spec["parts"]:
                if verify:
                    open_part(store, version, part, verify=True)
                else:
                    check_part_file(store, version, part)
    except UserError as exc:
        return short(exc)
    return None


# ---------------------------------------------------------------------------------------------------
# the manifest: read, validated before use
# ---------------------------------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# optional keys the trainers write: name → (check, what it must be). None stands for "absent".
_EXTRA_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epoch": (lambda x: _is_int(x) and x >= 0, "a non-negative integer"),
    "positions": (lambda x: isinstance(x, list), "a list"),
    "config": (lambda x: isinstance(x, dict), "an object"),
    "lr": (lambda x: _is_number(x) and x >= 0, "a non-negative number"),
    "num_ps": (lambda x: _is_int(x) and x > 0, "a positive integer"),
    "num_workers": (lambda x: _is_int(x) and x > 0, "a positive integer"),
    "plan": (lambda x: x in ("runs", "interleaved"), '"runs" or "interleaved"'),
    "corpus": (lambda x: isinstance(x, str), "a string"),
    "corpus_stats": (lambda x: isinstance(x, dict), "an object"),
    "losses": (lambda x: isinstance(x, list) and all(_is_number(v) or v is None for v in x), "a list of numbers"),
    "trainer": (lambda x: isinstance(x, str), "a string"),
    "created": (lambda x: isinstance(x, str), "a string"),
    "model_id": (lambda x: isinstance(x, str) and bool(_MODEL_ID_RE.match(x)), "32 lowercase hex digits"),
    "derived_from": (lambda x: isinstance(x, list) and all(isinstance(v, str) and _MODEL_ID_RE.match(v) for v in x),
                     "a list of model ids"),
}


def validate_manifest(manifest: Any, where: str, version: int | None = None) -> dict:
    """Check every field a reader relies on; a UserError naming `where` (the manifest file) and the field."""
    def bad(field: str, must: str, found: Any = None) -> UserError:
        shown = "" if found is None else f", found {json.dumps(found)[:60] if _jsonable(found) else repr(found)[:60]}"
        return UserError(f"{where}: field {field!r} must be {must}{shown}; the checkpoint is damaged")

    if not isinstance(manifest, dict):
        raise bad("(top level)", "an object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise bad("format_version", f"{FORMAT_VERSION} (this program's checkpoint format)",
                  manifest.get("format_version"))
    if not _is_int(manifest.get("version")) or manifest["version"] < 1:
        raise bad("version", "a positive integer", manifest.get("version"))
    if version is not None and manifest["version"] != version:
        raise bad("version", f"{version}, the version of its directory", manifest["version"])
    tables = manifest.get("tables")
    if not isinstance(tables, dict) or not tables:
        raise bad("tables", "a non-empty object", tables)
    for table, spec in tables.items():
        if table not in TABLES:
            raise UserError(f"{where}: field 'tables' has unknown table {table!r} (known: {', '.join(TABLES)})")
        f = f"tables.{table}"
        if not isinstance(spec, dict):
            raise bad(f, "an object")
        if not _is_int(spec.get("dim")) or spec["dim"] <= 0:
            raise bad(f"{f}.dim", "a positive integer", spec.get("dim"))
        if not _is_int(spec.get("rows")) or spec["rows"] < 0:
            raise bad(f"{f}.rows", "a non-negative integer", spec.get("rows"))
        if spec.get("dtype", "float32") not in PART_VALUE_TYPES:
            raise bad(f"{f}.dtype", " or ".join(repr(d) for d in PART_VALUE_TYPES), spec.get("dtype"))
        parts = spec.get("parts")
        if not isinstance(parts, list) or not parts:
            raise bad(f"{f}.parts", "a non-empty list")
        _validate_parts(parts, table, f, where, bad)
        if sum(p["rows"] for p in parts) != spec["rows"]:
            raise bad(f"{f}.rows", f"the sum of its parts' rows ({sum(p['rows'] for p in parts)})", spec["rows"])
    for key, (check, must) in _EXTRA_KEYS.items():
        if manifest.get(key) is not None and not check(manifest[key]):
            raise bad(key, must, manifest[key])
    return manifest


def _jsonable(x) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


def _validate_parts(parts: list, table: str, f: str, where: str, bad) -> None:
    totals, shards = set(), set()
    for i, part in enumerate(parts):
        pf = f"{f}.parts[{i}]"
        if not isinstance(part, dict):
            raise bad(pf, "an object")
        path = part.get("path")
        if not isinstance(path, str):
            raise bad(f"{pf}.path", "a string", path)
        pieces = path.replace("\\", "/").split("/")
        if path.startswith(("/", "\\")) or is_uri(path) or ".." in pieces or ":" in pieces[0]:
            raise UserError(f"{where}: field '{pf}.path': part path {path!r} escapes the model directory")
        m = _PART_RE.match(path)
        if not m or m.group(1) != table:
            raise bad(f"{pf}.path", f"'{table}/part-SSSSS-of-TTTTT.arrow'", path)
        shard, total = int(m.group(2)), int(m.group(3))
        if shard >= total or shard in shards:
            raise bad(f"{pf}.path", f"a distinct shard below {total}", path)
        totals.add(total)
        shards.add(shard)
        if not _is_int(part.get("rows")) or part["rows"] < 0:
            raise bad(f"{pf}.rows", "a non-negative integer", part.get("rows"))
        if not isinstance(part.get("sha256"), str) or not _SHA_RE.match(part["sha256"]):
            raise bad(f"{pf}.sha256", "64 lowercase hex digits", part.get("sha256"))
        if "bytes" in part and (not _is_int(part["bytes"]) or part["bytes"] < 0):
            raise bad(f"{pf}.bytes", "a non-negative integer", part["bytes"])
    if len(totals) != 1 or shards != set(range(next(iter(totals)))):
        raise bad(f"{f}.parts", "every part-SSSSS-of-TTTTT of one T, each once",
                  sorted(p["path"] for p in parts)[:3])


def read_manifest(store: Store, version: int | None) -> tuple[int, dict]:
    if version is None:
        version = read_latest(store, strict=True)
        if version is None:
            raise UserError(f"{store.name}: not a trained model (no LATEST file)")
    rel = version_rel(version, "manifest.json")
    if not store.is_file(rel):
        raise UserError(f"{store.show(rel)}: missing; v{version} is not a committed checkpoint")
    try:
        manifest = json.loads(store.read_bytes(rel))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{store.show(rel)}: unreadable manifest ({exc})") from None
    return version, validate_manifest(manifest, store.show(rel), version)


def load_manifest(model: str, *, version: int | None = None,
                  fs: pafs.FileSystem | None = None) -> tuple[str, dict]:
    """The directory and validated manifest of the version LATEST points at (or of `version`)."""
    version, manifest = read_manifest(Store.of(model, fs), version)
    return version_dir(model, version), manifest


def _table_of(manifest: dict, table: str, model: str) -> dict:
    if table not in manifest["tables"]:
        have = ", ".join(sorted(manifest["tables"]))
        raise UserError(f"{strip_query(model)}: table {table!r} was not trained in this model (it has: {have})")
    return manifest["tables"][table]


# ---------------------------------------------------------------------------------------------------
# reading parts: verified, memory-mapped, a record batch at a time
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Part:
    """One opened checkpoint part: its record batches over a memory map."""

    shown: str
    reader: pa.ipc.RecordBatchFileReader
    mapped: mmap.mmap
    base: int  # address of the mapping, to release pages batch by batch

    @property
    def has_state(self) -> bool:
        return "adagrad" in self.reader.schema.names

    def batches(self, dim: int, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """(ids, vectors [n, dim] float32, adagrad [n, 1] or None) per record batch, zero-copy views of
        the map; a 16-bit part's vectors (float16, bfloat16: precision.py) widened to float32 a batch
        at a time, so every reader gets float32 whatever the run's --dtype."""
        schema = self.reader.schema
        vector = schema.field("vector").type if "vector" in schema.names else None
        dtype = part_dtype(schema)
        if ("id" not in schema.names or schema.field("id").type != pa.int64() or dtype is None
                or (self.has_state and schema.field("adagrad").type != pa.float32())):
            raise UserError(f"{self.shown}: not a checkpoint part (expected columns id, vector float32[{dim}], "
                            "or halffloat, or bfloat16's bits as uint16 named in the schema's metadata)")
        if vector.list_size != dim:
            raise UserError(f"{self.shown}: vectors have {vector.list_size} dims, the manifest says {dim}")
        with_state = self.has_state
        seen = 0
        for b in range(self.reader.num_record_batches):
            try:
                batch = self.reader.get_batch(b)
            except pa.ArrowException as exc:
                raise UserError(f"{self.shown}: unreadable record batch {b} ({exc}); the checkpoint is damaged") from None
            if any(column.null_count for column in batch.columns):
                raise UserError(f"{self.shown}: null values; the checkpoint is damaged")
            seen += batch.num_rows
            if seen > rows:
                break
            if batch.num_rows:
                state = numpy_of(batch.column("adagrad"))[:, None] if with_state else None
                vectors = precision.widen(matrix_of(batch.column("vector"), dim), dtype)
                yield numpy_of(batch.column("id")), vectors, state
            self._release(batch)
        if seen != rows:
            raise UserError(f"{self.shown}: {seen} rows, the manifest says {rows}; the checkpoint is damaged")

    def _release(self, batch: pa.RecordBatch) -> None:
        # drop the batch's pages from this process once it is used (they stay in the page cache),
        # so reading a 5 GB part does not make 5 GB resident
        ends = [buf.address + buf.size for column in batch.columns for buf in column.buffers() if buf]
        if ends and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):
                self.mapped.madvise(mmap.MADV_DONTNEED, 0, min(max(ends) - self.base, len(self.mapped)))


def open_part(store: Store, version: int, part: dict, verify: bool) -> _Part:
    """Open one part for reading: checked against its manifest entry (size, sha256), memory-mapped.

    A local file is mapped in place; a remote one is streamed into a local temporary file, hashed on
    the way, and mapped from there (the file is unlinked at once; the mapping keeps it alive).
    """
    rel = version_rel(version, part["path"])
    shown = check_part_file(store, version, part)
    if store.local:
        path = store.path(rel)
        if verify and sha256_file(path) != part["sha256"]:
            raise UserError(f"{shown}: checksum mismatch; the checkpoint is damaged")
        with open(path, "rb") as fh:
            mapped = _map(fh, shown)
    else:
        with tempfile.TemporaryFile(prefix="doc2vec-part-") as fh:
            sink = HashingSink(fh)
            try:
                with store.fs.open_input_stream(store.path(rel)) as src:
                    copy_stream(src, sink)
            except OSError as exc:
                raise UserError(f"{shown}: could not read ({exc})") from None
            if verify and sink.sha.hexdigest() != part["sha256"]:
                raise UserError(f"{shown}: checksum mismatch; the checkpoint is damaged")
            fh.flush()
            mapped = _map(fh, shown)
    # not closed explicitly: the mapping lives as long as any array viewing it, then unmaps
    data = pa.py_buffer(mapped)
    try:
        reader = pa.ipc.open_file(data)
    except pa.ArrowException as exc:
        raise UserError(f"{shown}: not an Arrow file ({exc}); the checkpoint is damaged") from None
    return _Part(shown, reader, mapped, data.address)


def check_part_file(store: Store, version: int, part: dict) -> str:
    """A part's file is there, of the size its manifest entry says (else a UserError naming it); its name
    as messages show it."""
    rel = version_rel(version, part["path"])
    shown = store.show(rel)
    info = store.info(rel)
    if info.type != pafs.FileType.File:
        raise UserError(f"{shown}: part file missing; the checkpoint is damaged")
    if "bytes" in part and info.size is not None and info.size != part["bytes"]:
        raise UserError(f"{shown}: {info.size} bytes, the manifest says {part['bytes']}; the checkpoint is damaged")
    return shown


def _map(fh, shown: str) -> mmap.mmap:
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        raise UserError(f"{shown}: empty file; the checkpoint is damaged") from None


# ---------------------------------------------------------------------------------------------------
# a trained model, for reading: config, keys, vocab and the one verified part reader
# ---------------------------------------------------------------------------------------------------

KEY_TABLES = {"docs": ("docs.arrow", "key"), "words": ("vocab.arrow", "token"), "words_out": ("vocab.arrow", "token")}


class ModelDir:
    """A trained model directory at one committed version (LATEST unless `version` is given).

    Everything that reads a model goes through it: the resolved config (`config`, from config.json
    or else the manifest's copy), the key tables (`keys`, `vocab`), each table's manifest entry
    (`spec`), and the parts, read by one reader (`batches`, `parts`, `read_table`) that checks a
    part's size, sha256, Arrow schema, nulls and row count, so a truncated or altered part is
    refused the same way by export, Model, index, evaluate and infer. Opening one reads and
    validates the manifest, so a directory that is not a trained model fails at once, named.
    """

    def __init__(self, path: str, *, version: int | None = None, fs: pafs.FileSystem | None = None):
        self.path = path
        self.store = Store.of(path, fs)
        self.version, self.manifest = read_manifest(self.store, version)
        self._settings: dict | None = None

    @classmethod
    def served(cls, path: str) -> ModelDir:
        """A model for the serving side, which works on local files: a remote model (s3://…) is used
        from a verified local copy of its LATEST version (local_copy)."""
        return cls(local_copy(path))

    # -- what it was trained with --------------------------------------------------------------------

    def settings(self) -> dict:
        """config.json as saved (the TrainConfig, the corpus path, the run's summary), else the
        manifest's copy of the config; a UserError naming config.json when neither is there."""
        if self._settings is None:
            if self.store.is_file("config.json"):
                found = self.store.read_json("config.json")
            else:
                found = self.manifest.get("config")
            if not isinstance(found, dict):
                raise UserError(f"{self.store.show('config.json')}: missing; the model's training settings are "
                                "needed here")
            self._settings = found
        return self._settings

    def config(self):
        """The TrainConfig the model was trained with (fields a model predates take their defaults)."""
        from .config import TrainConfig, build

        try:
            return build(TrainConfig, self.settings())
        except UserError as exc:
            raise UserError(f"{self.store.show('config.json')}: {exc}") from None

    def corpus_path(self) -> str:
        corpus = self.settings().get("corpus")
        if not isinstance(corpus, str):
            raise UserError(f"{self.store.show('config.json')}: no corpus path; pass the corpus explicitly")
        return corpus

    def spec(self, table: str) -> dict:
        """The table's manifest entry (rows, dim, parts)."""
        return _table_of(self.manifest, table, self.path)

    # -- keys ----------------------------------------------------------------------------------------

    def _key_file(self, table: str) -> tuple[str, str]:
        if table not in KEY_TABLES:
            raise UserError(f"unknown table {table!r} (choose from {', '.join(KEY_TABLES)})")
        name, column = KEY_TABLES[table]
        if not self.store.local:
            raise UserError(f"{self.store.show(name)}: keys are read from a local model; use ModelDir.served")
        if not self.store.is_file(name):
            raise UserError(f"{self.store.show(name)}: missing; {self.store.name} is not a complete model directory")
        return self.store.path(name), column

    def keys(self, table: str) -> pa.Array:
        """Row id → original key (user id or URL) of a table; the key files are sorted by id."""
        return self.key_column(table).combine_chunks()

    def key_column(self, table: str) -> pa.ChunkedArray:
        """keys(), as the key file's batches hold them: memory-mapped, not copied (20M keys compared in place)."""
        path, column = self._key_file(table)
        return pa.ipc.open_file(pa.memory_map(path)).read_all().column(column)

    def key_count(self, table: str) -> int:
        """Rows of a table's key file, without reading the keys (the file is memory-mapped)."""
        path, _ = self._key_file(table)
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all().num_rows

    def vocab(self) -> pa.Table:
        """The training vocabulary: token, count, id (sorted by id)."""
        path, _ = self._key_file("words")
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()

    # -- the parts, verified -------------------------------------------------------------------------

    def _open(self, table: str, part: int, verify: bool) -> tuple[_Part, dict, int]:
        spec = self.spec(table)
        entry = spec["parts"][part]
        return open_part(self.store, self.version, entry, verify), entry, spec["dim"]

    def batches(self, table: str, part: int, verify: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, float32 vectors) of part `part` of a table, a record batch at a time, as zero-copy
        views of the memory map whose pages are dropped once the next batch is asked for (a 5 GB part
        does not become 5 GB resident)."""
        opened, entry, dim = self._open(table, part, verify)
        for ids, vectors, _ in opened.batches(dim, entry["rows"]):
            yield ids, vectors

    def parts(self, table: str, verify: bool = True) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        """For each part of a table, its record batches as (ids, vectors) views of the memory map, kept."""
        for part in range(len(self.spec(table)["parts"])):
            opened, entry, dim = self._open(table, part, verify)
            yield [(ids, vectors) for ids, vectors, _ in opened.batches(dim, entry["rows"])]

    def record_batches(self, table: str, part: int, verify: bool = True) -> Iterator[pa.RecordBatch]:
        """Part `part` of a table as it is stored (columns id, vector in the table's dtype[, adagrad]), a
        verified record batch at a time: what rewrites a version row for row, bit for bit (forget)."""
        opened, entry, _ = self._open(table, part, verify)
        seen = 0
        for b in range(opened.reader.num_record_batches):
            batch = opened.reader.get_batch(b)
            seen += batch.num_rows
            yield batch
        if seen != entry["rows"]:
            raise UserError(f"{opened.shown}: {seen} rows, the manifest says {entry['rows']}; the checkpoint is damaged")

    def read_table(self, table: str, verify: bool = True) -> np.ndarray:
        """The whole table as one [rows, dim] float32 matrix, row i = id i; every row must be in exactly one part."""
        spec = self.spec(table)
        matrix = np.empty((spec["rows"], spec["dim"]), dtype=np.float32)
        seen = np.zeros(spec["rows"], dtype=bool)
        for part in range(len(spec["parts"])):
            opened, entry, dim = self._open(table, part, verify)
            for ids, vectors, _ in opened.batches(dim, entry["rows"]):
                _scatter(matrix, seen, ids, vectors, opened.shown, spec["rows"])
        if not seen.all():
            raise UserError(f"{self.store.show(version_rel(self.version))}: table {table} lacks "
                            f"{int((~seen).sum())} of its rows; the checkpoint is damaged")
        return matrix


def _scatter(out: np.ndarray, seen: np.ndarray, local: np.ndarray, rows: np.ndarray, shown: str,
             limit: int) -> slice | np.ndarray | None:
    """out[local] = rows, refusing rows out of range or already filled; a contiguous run is one copy.
    Returns the index used (None for no rows), for a companion array laid out the same way."""
    if not len(local):
        return None
    lo, hi = int(local.min()), int(local.max())
    if lo < 0 or hi >= limit:
        raise UserError(f"{shown}: row id out of range; the checkpoint is damaged")
    if hi - lo + 1 == len(local) and local[0] == lo and local[-1] == hi and np.all(np.diff(local) == 1):
        where: slice | np.ndarray = slice(lo, hi + 1)
    else:
        where = local
    if seen[where].any():
        raise UserError(f"{shown}: a row appears twice; the checkpoint is damaged")
    seen[where] = True
    out[where] = rows
    return where


def read_shard(model: str, table: str, shard: int, num_shards: int, *, version: int | None = None,
               verify: bool = True, out: np.ndarray | None = None, dtype: str = "float32",
               dropped: np.ndarray | None = None,
               fs: pafs.FileSystem | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """This shard's rows of a table: global row r (r % num_shards == shard) at local row r // num_shards.

    Reads LATEST (or `version`), whatever number of servers wrote it: part t of T is read only if it
    can hold rows of this shard (t ≡ shard mod gcd(T, num_shards)), a record batch at a time, and its
    rows are scattered into place, so memory is this shard's slice plus one batch. Checksums, row
    counts and dims are checked; every row of the shard must be found exactly once.

    Returns (vectors float32 [n, dim], state float32 [n, 1] or None when the checkpoint has no
    optimiser state). With `out` (float32 [n, ≥ dim]), vectors go to out[:, :dim] and the state, if
    the checkpoint has one and `out` has room, to out[:, dim:dim + 1]; the returned arrays are views
    of it (columns of `out` the checkpoint has nothing for are left as they are).

    dtype: the type `out` holds (precision.py; a 16-bit server's table, its float32 state in the
    columns after the vectors): the checkpoint's rows, whatever their own type, are narrowed to it
    (to nearest: exact for rows written in that type) a record batch at a time.

    dropped: sorted global rows of the checkpoint that are left out, the rows after them closed up
    (compact.new_ids: a refresh that expired or forgot users, a version that forget writes): the shard
    is then one of the table without them, and every part is read, since closing up moves rows across
    shards.
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards} is out of range")
    found = ModelDir(model, version=version, fs=fs)
    store, version, spec = found.store, found.version, found.spec(table)
    dim = spec["dim"]
    dropped = None if dropped is None or not len(dropped) else np.asarray(dropped, np.int64)
    n = len(range(shard, spec["rows"] - (len(dropped) if dropped is not None else 0), num_shards))
    kept = precision.stored(dtype)
    if out is None:
        out = np.empty((n, dim), dtype=kept)
    elif out.shape[0] != n or out.shape[1] < dim or out.dtype != kept:
        raise ValueError(f"out must be {kept} [{n}, >= {dim}], got {out.dtype} {list(out.shape)}")
    vectors, state, has_state = out[:, :dim], None, None
    seen = np.zeros(n, dtype=bool)
    for part in spec["parts"]:
        m = _PART_RE.match(part["path"])
        t, total = int(m.group(2)), int(m.group(3))
        if dropped is None and (t - shard) % math.gcd(total, num_shards):
            continue  # rows ≡ t (mod T) and rows ≡ shard (mod S) never meet
        opened = open_part(store, version, part, verify)
        if has_state is None:
            has_state = opened.has_state
            if has_state:
                state = (precision.state_view(out, dtype, dim)[:, :1] if out.shape[1] > dim
                         else np.empty((n, 1), np.float32))
        elif opened.has_state != has_state:
            raise UserError(f"{opened.shown}: optimiser state in some parts only; the checkpoint is damaged")
        for ids, rows, rows_state in opened.batches(dim, part["rows"]):
            if dropped is not None:
                ids = new_ids(ids, dropped)
                if (ids < 0).any():
                    stays = ids >= 0
                    ids, rows = ids[stays], rows[stays]
                    rows_state = rows_state[stays] if rows_state is not None else None
            if num_shards > 1:
                mine = ids % num_shards == shard
                if not mine.all():
                    ids, rows = ids[mine], rows[mine]
                    rows_state = rows_state[mine] if rows_state is not None else None
                ids = ids // num_shards
            where = _scatter(vectors, seen, ids, precision.narrow(rows, dtype), opened.shown, n)
            if state is not None and where is not None:
                state[where] = rows_state
    if not seen.all():
        raise UserError(f"{store.show(version_rel(version))}: table {table} lacks {int((~seen).sum())} rows of shard "
                        f"{shard} of {num_shards}; the checkpoint is damaged")
    return vectors, state


# ---------------------------------------------------------------------------------------------------
# remote models, used locally
# ---------------------------------------------------------------------------------------------------

def local_copy(model: str, cache: str | None = None) -> str:
    """A local directory holding the LATEST version of a remote model (a local path is returned as is).

    Downloads config.json, the key tables, the manifest and the parts of LATEST into a cache
    directory (storage.mirror), verifying every part's sha256 on the way. LATEST is written last, so
    an interrupted copy is never taken for a whole one; other versions are removed.
    """
    if not is_uri(model):
        return model
    store = Store.of(model)
    version, manifest = read_manifest(store, None)
    files: dict[str, str | None] = {name: None for name in ("config.json", *KEY_FILES) if store.is_file(name)}
    files[version_rel(version, "manifest.json")] = None
    files.update({version_rel(version, p["path"]): p["sha256"]
                  for spec in manifest["tables"].values() for p in spec["parts"]})
    local = storage.mirror(store, model, files, cache)
    write_local(os.path.join(local, "LATEST"), f"v{version}\n")
    for name in os.listdir(os.path.join(local, "checkpoints")):
        if name != f"v{version}":
            shutil.rmtree(os.path.join(local, "checkpoints", name), ignore_errors=True)
    return local


def other_rows(found: ModelDir, corpus) -> tuple[str, int, str, str] | None:
    """None where the model's users and URLs are the corpus's (a corpus.Corpus of the same counts), row for row
    (its key tables are the corpus's, copied when it was made); else the first row that differs: (users or URLs,
    the row, the model's key there, the corpus's). Another corpus of the same counts (the same events read in
    another order, a shuffled export) would give each row another user's events. Both key columns are compared
    as memory-mapped (no copy of 20M keys); a remote model is not read (None)."""
    if not found.store.local:
        return None
    for table, ours, what in (("docs", corpus.docs().column("key"), "users"),
                              ("words", corpus.vocab().column("token"), "URLs")):
        theirs = found.key_column(table)
        if theirs.equals(ours):
            continue
        row = pc.index(pc.not_equal(theirs, ours), True).as_py()
        return what, row, theirs[row].as_py(), ours[row].as_py()
    return None
