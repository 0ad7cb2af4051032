"""Model directories: Arrow slices of each table, versions, the manifest and the atomic commit.

    MODEL/config.json                 resolved config
    MODEL/docs.arrow, vocab.arrow     the corpus's key tables (row id → user key / URL), so a model
                                      stands alone once trained
    MODEL/LATEST                      "vN", moved only after vN is whole
    MODEL/checkpoints/vN/manifest.json
    MODEL/checkpoints/vN/{docs,words,words_out}/part-SSSSS-of-TTTTT.arrow   columns id, vector[, adagrad]

MODEL is a local path or a URI that pyarrow.fs opens: s3://bucket/prefix, gs://…, hdfs://…, file://….
An S3 endpoint other than AWS comes from the URI's query (s3://b/m?endpoint_override=host:port&scheme=http)
or from the standard variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).
Every read, write, listing and delete of a model directory goes through one pyarrow FileSystem (see
`resolve`); tests pass their own with `fs=`.

Why a reader never sees a partial version, whatever the storage:
  * Local disks and HDFS have an atomic rename: every file is written under a temporary name and
    renamed into place (on a local disk, after an fsync of the file, and the directory is synced
    after the rename, so a machine crash cannot leave LATEST naming a version whose bytes were lost).
  * Object stores (S3, GCS, Azure) have no rename, but a PUT is atomic: the object appears whole or
    not at all (a multipart upload only appears when it is completed). Parts are written directly
    under their final names; a part that a failure may have left behind sits in a version that has
    no manifest yet, and is deleted.
  * On both, the order does the rest: all parts, then the manifest (it lists every part with its
    row count, byte size and sha256), then LATEST. LATEST only ever names a version whose manifest
    exists, and a manifest only exists once every part it lists is whole. A version directory
    without a manifest is partial: it is never loaded, its number is never reused, and it is deleted
    by the next commit's pruning.

Checksums are computed on the bytes as they are written (no second read of a part from S3), and
checked on load together with row counts and dims. Loading memory-maps local Arrow files; a remote
part is streamed into a local temporary file (hashed on the way) and memory-mapped from there, so
memory stays bounded by a record batch, not a part. Only Arrow and JSON are ever read back: nothing
here unpickles. A manifest is validated field by field before anything in it is used, and its part
paths are plain relative names inside the version directory.

A parameter server loads its own rows with read_shard, whatever number of servers wrote the version
(row r lives on shard r % S). The serving side (Model, export) is local-file code: for a remote
model it works on local_copy(), a verified copy of LATEST in a cache directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import mmap
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from . import outputs
from .config import lr_at
from .errors import UserError

FORMAT_VERSION = 1
TABLES = ("docs", "words", "words_out")
_VERSION_RE = re.compile(r"^v(\d+)$")
_PART_RE = re.compile(r"^(docs|words|words_out)/part-(\d{5})-of-(\d{5})\.arrow$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_OBJECT_STORES = {"s3", "gcs", "abfs"}  # pyarrow FileSystem.type_name of stores without an atomic rename
_MAX_JSON_BYTES = 64 << 20  # a manifest lists parts, not rows: anything this big is not one of ours
_COPY_BLOCK = 8 << 20
_UPLOAD_WINDOW = 64 << 20  # bytes an object-store upload may have in flight (see _HashingSink)

KEY_FILES = ("docs.arrow", "vocab.arrow")


class CheckpointWriteError(UserError):
    """Writing a checkpoint file failed (a full disk, a lost connection); the last committed version is intact."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


# ---------------------------------------------------------------------------------------------------
# storage: one pyarrow FileSystem and a root path per model directory
# ---------------------------------------------------------------------------------------------------

def is_uri(path: str) -> bool:
    return bool(_URI_RE.match(path))


def model_path(out: str) -> str:
    """The form of a model location to hand to other processes: an absolute local path, or the URI unchanged."""
    return out if is_uri(out) else os.path.abspath(out)


@functools.lru_cache(maxsize=16)
def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    # cached: an S3 client is costly to build, and every call of this module resolves the model again
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        detail = str(exc).replace(uri, _strip_query(uri))  # the query may hold a secret key
        raise UserError(f"{_strip_query(uri)}: cannot open this storage location ({detail})") from None


def _strip_query(uri: str) -> str:
    """A URI without its query string, which may hold credentials: the form error messages show."""
    return uri.split("?", 1)[0]


def resolve(model: str, fs: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of a model location.

    With `fs`, `model` is a path inside that filesystem, taken as it is. Otherwise a URI is opened
    with pyarrow's FileSystem.from_uri (its query string configures it), and a plain path is an
    absolute path on the LocalFileSystem.
    """
    if fs is not None:
        return fs, model.rstrip("/") or "/"
    if is_uri(model):
        found, path = _from_uri(model)
        return found, path.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(model)


@dataclass(frozen=True)
class _Store:
    """A model directory: where its files live, how to write them safely, and how to name them in errors."""

    fs: pafs.FileSystem
    root: str
    name: str            # how messages name the directory: the path as given, or the URI without its query
    uri: bool
    atomic_rename: bool  # local disks, HDFS: temp name + rename; object stores: one PUT per file
    local: bool          # files can be memory-mapped in place

    def path(self, rel: str = "") -> str:
        return posixpath.join(self.root, rel) if rel else self.root

    def show(self, rel: str = "") -> str:
        if not rel:
            return self.name
        return f"{self.name.rstrip('/')}/{rel}" if self.uri else os.path.join(self.name, rel)


def _store(model: str, fs: pafs.FileSystem | None = None) -> _Store:
    found, root = resolve(model, fs)
    kind = found.type_name
    if kind == "subtree":
        kind = found.base_fs.type_name
    uri = fs is None and is_uri(model)
    return _Store(found, root, _strip_query(model) if uri else model, uri,
                  atomic_rename=kind not in _OBJECT_STORES, local=isinstance(found, pafs.LocalFileSystem))


def _check_rel(rel: str, what: str = "path") -> str:
    """A relative path that stays inside the model directory: no absolute path, '..', or scheme."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\\" in rel or is_uri(rel) or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts)):
        raise UserError(f"{what} {rel!r} escapes the model directory (a plain relative path is required)")
    return rel


def _info(store: _Store, rel: str) -> pafs.FileInfo:
    try:
        return store.fs.get_file_info(store.path(rel))
    except OSError as exc:  # unreachable endpoint, refused credentials, …
        raise UserError(f"{store.show(rel)}: cannot reach it ({exc})") from None


def _is_file(store: _Store, rel: str) -> bool:
    return _info(store, rel).type == pafs.FileType.File


def _list(store: _Store, rel: str, recursive: bool = False) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(store.path(rel), allow_not_found=True, recursive=recursive)
    try:
        return store.fs.get_file_info(selector)
    except OSError as exc:
        raise UserError(f"{store.show(rel)}: cannot list it ({exc})") from None


def _delete_dir(store: _Store, rel: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        store.fs.delete_dir(store.path(rel))


def _delete_file(store: _Store, path: str) -> None:
    with contextlib.suppress(OSError):
        store.fs.delete_file(path)


class _HashingSink:
    """A write-only file object that hashes and counts what passes through it to `sink`.

    With `flush_every`, the sink is flushed after that many bytes: an S3 output stream uploads its
    parts in the background without a bound on how many wait, so a part written faster than the
    network takes would otherwise pile up in memory; its flush waits for the uploads in flight.
    Measured writing a 400 MB part to a local S3 server (moto): +320 MB of memory without flushes,
    +166 MB with a 64 MB window, +109 MB with 16 MB; 64 MB leaves real S3 several parts in flight.
    """

    def __init__(self, sink, flush_every: int = 0):
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0
        self.flush_every, self.unflushed = flush_every, 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)  # hashlib releases the GIL on large buffers
        self.sink.write(view)
        self.size += view.nbytes
        self.unflushed += view.nbytes
        if self.flush_every and self.unflushed >= self.flush_every:
            self.sink.flush()
            self.unflushed = 0
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def _write_file(store: _Store, rel: str, produce: Callable[[_HashingSink], None]) -> tuple[int, str]:
    """Write one file of the model with produce(sink); returns (bytes, sha256) of what was written.

    Where rename is atomic the file is written under a temporary name and renamed; on an object
    store it is written under its final name (one object PUT or completed multipart upload). On
    failure nothing is left under a temporary name, and a CheckpointWriteError names the file.
    """
    final = store.path(rel)
    target = f"{final}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}" if store.atomic_rename else final
    try:
        if store.atomic_rename:
            store.fs.create_dir(posixpath.dirname(final), recursive=True)
        with store.fs.open_output_stream(target) as raw:
            sink = _HashingSink(raw, flush_every=0 if store.atomic_rename else _UPLOAD_WINDOW)
            produce(sink)
        if store.local:
            _fsync(target)  # the bytes reach the disk before the name does (measured: 0.01-0.2 s per 400 MB)
        if target != final:
            store.fs.move(target, final)
            if store.local:
                _fsync(posixpath.dirname(final))  # and the rename itself survives a crash of the machine
    except BaseException as exc:
        # a temporary file, or on an object store what a failed stream may have left under the
        # final name: in both cases an unreferenced file of this write, never a committed one
        _delete_file(store, target)
        if isinstance(exc, OSError):
            raise CheckpointWriteError(f"{store.show(rel)}: could not write ({exc}); the last committed "
                                       "checkpoint is intact", getattr(exc, "errno", None)) from exc
        raise
    return sink.size, sink.sha.hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(store: _Store, rel: str, data: bytes) -> None:
    # the whole content in one write: on an object store, a single atomic PUT
    _write_file(store, rel, lambda sink: sink.write(data))


def _read_bytes(store: _Store, rel: str, limit: int = _MAX_JSON_BYTES) -> bytes:
    info = _info(store, rel)
    if info.type != pafs.FileType.File:
        raise UserError(f"{store.show(rel)}: missing")
    if info.size is not None and info.size > limit:
        raise UserError(f"{store.show(rel)}: {info.size} bytes, more than the {limit} this file can have")
    try:
        with store.fs.open_input_stream(store.path(rel)) as fh:
            return fh.read()
    except OSError as exc:
        raise UserError(f"{store.show(rel)}: unreadable ({exc})") from None


def exists(model: str, relpath: str, *, fs: pafs.FileSystem | None = None) -> bool:
    """Whether the model directory holds the file `relpath` (e.g. "LATEST", "config.json")."""
    return _is_file(_store(model, fs), _check_rel(relpath))


def write_json(model: str, relpath: str, data: Any, *, fs: pafs.FileSystem | None = None) -> None:
    """Write JSON into the model directory so a reader never sees half of it (rename, or one PUT)."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    _write_bytes(_store(model, fs), _check_rel(relpath), text.encode())


def read_json(model: str, relpath: str, *, fs: pafs.FileSystem | None = None) -> Any:
    """JSON from the model directory; a UserError naming the file if it is missing or not JSON."""
    store = _store(model, fs)
    raw = _read_bytes(store, _check_rel(relpath))
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{store.show(relpath)}: not valid JSON ({exc})") from None


# ---------------------------------------------------------------------------------------------------
# the model directory
# ---------------------------------------------------------------------------------------------------

def _model_dir_state(store: _Store) -> tuple[bool, list[str], str | None]:
    """(exists, entry names, the kind its marker names) of a model location."""
    info = _info(store, "")
    if info.type == pafs.FileType.NotFound:
        return False, [], None
    if info.type != pafs.FileType.Directory:
        raise UserError(f"{store.name}: exists and is a file; --out takes a directory for a model")
    names = [i.base_name for i in _list(store, "")]
    marker = None
    if outputs.MARKER in names:
        marker = outputs.read_marker_kind(_read_bytes(store, outputs.MARKER, limit=4096)) or "unknown"
    return True, names, marker


def refuse_existing_model(out: str, overwrite: bool, *, fs: pafs.FileSystem | None = None) -> bool:
    """Whether `out` holds a model of ours to replace (True) or is new or empty (False); anything
    else is refused with one line naming what is there (outputs.judge_dir). A model is replaced
    only with `overwrite`, since its checkpoints may be days of training; one that never committed
    a checkpoint (a fresh run killed before its first) needs no flag."""
    store = _store(out, fs)
    _, names, marker = _model_dir_state(store)
    unfinished = "LATEST" not in names and marker == "model"
    return outputs.judge_dir(store.name, "model", names, marker, None if unfinished else overwrite)


def start_model_dir(out: str, corpus_path: str, overwrite: bool, *, fs: pafs.FileSystem | None = None) -> list[str]:
    """Create (or, with overwrite, replace) a model directory holding its marker and the corpus's key
    tables, so export and neighbors later need only the model directory. The corpus is a local
    directory. Returns the local directories this created (the model directory among them when it
    did not exist), for discard_unfinished."""
    store = _store(out, fs)
    if refuse_existing_model(out, overwrite, fs=fs):
        _, names, _ = _model_dir_state(store)
        _delete_own(store, names)
    made = outputs.make_dirs(store.root) if store.local else []
    if store.atomic_rename and not store.local:
        store.fs.create_dir(store.path(), recursive=True)
    _write_bytes(store, outputs.MARKER, outputs.marker_text("model").encode())
    for name in KEY_FILES:
        with open(os.path.join(corpus_path, name), "rb") as src:
            _write_file(store, name, lambda sink, src=src: _copy_stream(src, sink))
    return made


def _delete_own(store: _Store, names: list[str]) -> None:
    """Delete the entries of a model directory that a model writes; the marker last, so that a
    directory half cleared still reads as ours. Anything else in it stays."""
    own = [n for n in names if n not in (outputs.MARKER, "exports") and outputs.owned("model", n)]
    for name in own + ([outputs.MARKER] if outputs.MARKER in names else []):
        if _info(store, name).type == pafs.FileType.Directory:
            _delete_dir(store, name)
        else:
            _delete_file(store, store.path(name))


def discard_unfinished(out: str, made: list[str], *, fs: pafs.FileSystem | None = None) -> bool:
    """After a fresh run that did not finish: remove what it wrote, unless it committed a checkpoint
    (then the model is whole and resumable, and stays). True when something was removed."""
    store = _store(out, fs)
    exists_, names, marker = _model_dir_state(store)
    if not exists_ or "LATEST" in names or marker != "model":
        return False
    _delete_own(store, names)
    outputs.remove_dirs(made)
    return True


def _copy_stream(src, sink) -> None:
    for block in iter(lambda: src.read(_COPY_BLOCK), b""):
        sink.write(block)


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.arrow"


def _join(model: str, *rel: str) -> str:
    """`model`/rel…, keeping a URI's query string at the end where it belongs."""
    if is_uri(model):
        base, sep, query = model.partition("?")
        return "/".join([base.rstrip("/"), *rel]) + sep + query
    return os.path.join(model, *rel)


def version_dir(model: str, version: int) -> str:
    return _join(model, "checkpoints", f"v{version}")


def _vrel(version: int, rel: str = "") -> str:
    return f"checkpoints/v{version}/{rel}" if rel else f"checkpoints/v{version}"


def vectors_array(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """A [n, dim] float32 (or float16) matrix as fixed_size_list<float>[dim], without copying."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float16 if matrix.dtype == np.float16 else np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def matrix_of(vectors: pa.Array | pa.ChunkedArray, dim: int) -> np.ndarray:
    """fixed_size_list<float32>[dim] back to a [n, dim] float32 matrix (zero-copy for one chunk)."""
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks() if vectors.num_chunks != 1 else vectors.chunk(0)
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, dim)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# writing a version
# ---------------------------------------------------------------------------------------------------

def write_slice(model: str, version: int, table: str, shard: int, num_shards: int,
                ids: np.ndarray, matrix: np.ndarray, state: np.ndarray | None = None,
                rows_per_batch: int = 65536, *, fs: pafs.FileSystem | None = None) -> dict:
    """Write one shard's slice of a table as an Arrow file; returns its manifest entry.

    `ids` are the global rows of shard `shard` of `num_shards` (r % num_shards == shard), in any
    order; that rule is what lets a reader with another number of servers skip the parts that hold
    none of its rows. state [n, 1], if given and not empty, is the rows' optimiser state (row-wise
    Adagrad's accumulator), written as the column `adagrad` beside the vectors. The sha256 is
    computed on the bytes as they are written.
    """
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r} (choose from {', '.join(TABLES)})")
    if not 0 <= shard < num_shards or num_shards > 99999:
        raise ValueError(f"shard {shard} of {num_shards} is out of range")
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) != len(matrix) or (state is not None and len(state) != len(ids)):
        raise ValueError(f"{len(ids)} ids for {len(matrix)} rows")
    if len(ids) and (ids.min() < 0 or np.any(ids % num_shards != shard)):
        raise ValueError(f"ids of shard {shard} of {num_shards} must all be ≡ {shard} (mod {num_shards})")
    rel = f"{table}/{part_name(shard, num_shards)}"
    fields = [("id", pa.int64()), ("vector", pa.list_(pa.float32(), matrix.shape[1]))]
    with_state = state is not None and state.shape[1] > 0
    if with_state:
        fields.append(("adagrad", pa.float32()))
    schema = pa.schema(fields)

    def produce(sink: _HashingSink) -> None:
        with pa.PythonFile(sink, mode="w") as out, pa.ipc.new_file(out, schema) as writer:
            for start in range(0, max(len(ids), 1), rows_per_batch):
                end = min(start + rows_per_batch, len(ids))
                columns = [pa.array(ids[start:end], pa.int64()), vectors_array(matrix[start:end])]
                if with_state:
                    columns.append(pa.array(np.ascontiguousarray(state[start:end, 0], dtype=np.float32)))
                writer.write_batch(pa.record_batch(columns, schema=schema))

    size, sha = _write_file(_store(model, fs), _vrel(version, rel), produce)
    return {"path": rel, "rows": len(ids), "bytes": size, "sha256": sha}


def _version_dirs(store: _Store) -> list[int]:
    """Every vN under checkpoints/, committed or partial."""
    return sorted(int(m.group(1)) for info in _list(store, "checkpoints")
                  if info.type == pafs.FileType.Directory and (m := _VERSION_RE.match(info.base_name)))


def _committed(store: _Store, version: int) -> bool:
    return _is_file(store, _vrel(version, "manifest.json"))


def next_version(model: str, *, fs: pafs.FileSystem | None = None) -> int:
    """A version number never used in this model: past every version directory, partial ones included
    (a partial one may still hold stale files), and past LATEST."""
    store = _store(model, fs)
    latest = _latest(store, strict=False) or 0
    return max([latest, *_version_dirs(store)]) + 1


def latest_version(model: str, *, fs: pafs.FileSystem | None = None) -> int | None:
    """The version LATEST names, or None for a model directory that has no committed version."""
    return _latest(_store(model, fs), strict=True)


def _latest(store: _Store, strict: bool) -> int | None:
    if not _is_file(store, "LATEST"):
        return None
    name = _read_bytes(store, "LATEST", limit=64).decode(errors="replace").strip()
    m = _VERSION_RE.match(name)
    if not m:
        if strict:
            raise UserError(f"{store.show('LATEST')}: expected a version like v3, found {name[:40]!r}")
        return None
    return int(m.group(1))


def commit(model: str, version: int, tables: dict[str, list[dict]], dims: dict[str, int],
           extra: dict, keep: int, *, fs: pafs.FileSystem | None = None) -> str:
    """Write the manifest of a version whose parts are all written, then point LATEST at it, then prune.

    The manifest is validated as a reader would, and every part it lists must be there with its
    size, before anything is written: LATEST moves only to a whole version.
    """
    store = _store(model, fs)
    latest = _latest(store, strict=False)
    if latest is not None and version < latest:
        raise ValueError(f"{store.name}: cannot commit v{version}, LATEST is already v{latest}")
    for parts in tables.values():
        parts.sort(key=lambda p: p["path"])
    manifest = {
        "format_version": FORMAT_VERSION,
        "version": version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": {name: {"rows": sum(p["rows"] for p in parts), "dim": dims[name], "dtype": "float32",
                          "parts": parts} for name, parts in tables.items()},
    }
    clash = set(extra) & set(manifest)
    if clash:
        raise ValueError(f"extra manifest keys {sorted(clash)} would replace the manifest's own")
    manifest.update(extra)
    rel = _vrel(version, "manifest.json")
    validate_manifest(manifest, store.show(rel), version)
    _check_parts_written(store, version, manifest)
    _write_bytes(store, rel, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    _write_bytes(store, "LATEST", f"v{version}\n".encode())
    _prune_store(store, keep)
    return version_dir(model, version)


def commit_training(out: str, config, corpus, save: Callable[[int], list[dict]], epoch: int, positions: list | None,
                    epoch_stats: list[dict]) -> None:
    """Write a checkpoint version: `save(version)` writes every server's slice (returning each
    server's entries), then the manifest says the epochs done, where each worker's data stands (None:
    at the start of epoch `epoch`) and the learning rate there. config: the run's TrainConfig; corpus:
    its corpus.Corpus; positions: worker.Position each."""
    version = next_version(out)
    entries = save(version)
    tables = {name: [e[name] for e in entries] for name in entries[0]}
    done = epoch * corpus.num_tokens + sum(p.tokens for p in positions or [])
    planned = config.epochs * corpus.num_tokens
    lr = lr_at(config.alpha, config.min_alpha, done, planned)
    commit(out, version, tables, {name: config.dim for name in tables},
           {"epoch": epoch, "positions": None if positions is None else [p.to_json() for p in positions],
            "lr": lr, "num_ps": config.num_ps,
            "num_workers": config.num_workers, "config": dataclasses.asdict(config), "corpus": corpus.path,
            "corpus_stats": {k: getattr(corpus, k) for k in ("num_docs", "num_tokens", "vocab_size")},
            "losses": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats]},
           keep=config.keep_checkpoints)


def _check_parts_written(store: _Store, version: int, manifest: dict) -> None:
    found = {info.path: info.size for info in _list(store, _vrel(version), recursive=True)
             if info.type == pafs.FileType.File}
    for spec in manifest["tables"].values():
        for part in spec["parts"]:
            path = store.path(_vrel(version, part["path"]))
            if path not in found:
                raise CheckpointWriteError(f"{store.show(_vrel(version, part['path']))}: missing; "
                                           f"v{version} is not committed")
            if "bytes" in part and found[path] != part["bytes"]:
                raise CheckpointWriteError(f"{store.show(_vrel(version, part['path']))}: {found[path]} bytes, "
                                           f"{part['bytes']} were written; v{version} is not committed")


def _prune_store(store: _Store, keep: int) -> None:
    """Keep the `keep` newest committed versions up to LATEST; delete older committed versions and
    partial versions (no manifest) older than LATEST. LATEST and anything newer are never touched:
    a newer directory may be a version being written right now."""
    latest = _latest(store, strict=False)
    if latest is None:
        return
    older = [v for v in _version_dirs(store) if v < latest]
    committed = [v for v in older if _committed(store, v)]
    kept = set(committed[-(keep - 1):]) if keep > 1 else set()  # LATEST is the keep-th
    for v in older:
        if v not in kept:
            _delete_dir(store, _vrel(v))


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
    "corpus": (lambda x: isinstance(x, str), "a string"),
    "corpus_stats": (lambda x: isinstance(x, dict), "an object"),
    "losses": (lambda x: isinstance(x, list) and all(_is_number(v) or v is None for v in x), "a list of numbers"),
    "trainer": (lambda x: isinstance(x, str), "a string"),
    "created": (lambda x: isinstance(x, str), "a string"),
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
        if spec.get("dtype", "float32") != "float32":
            raise bad(f"{f}.dtype", "'float32'", spec.get("dtype"))
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


def _read_manifest(store: _Store, version: int | None) -> tuple[int, dict]:
    if version is None:
        version = _latest(store, strict=True)
        if version is None:
            raise UserError(f"{store.name}: not a trained model (no LATEST file)")
    rel = _vrel(version, "manifest.json")
    if not _is_file(store, rel):
        raise UserError(f"{store.show(rel)}: missing; v{version} is not a committed checkpoint")
    try:
        manifest = json.loads(_read_bytes(store, rel))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{store.show(rel)}: unreadable manifest ({exc})") from None
    return version, validate_manifest(manifest, store.show(rel), version)


def load_manifest(model: str, *, version: int | None = None,
                  fs: pafs.FileSystem | None = None) -> tuple[str, dict]:
    """The directory and validated manifest of the version LATEST points at (or of `version`)."""
    version, manifest = _read_manifest(_store(model, fs), version)
    return version_dir(model, version), manifest


def table_spec(model: str, table: str, *, version: int | None = None,
               fs: pafs.FileSystem | None = None) -> tuple[str, dict]:
    vdir, manifest = load_manifest(model, version=version, fs=fs)
    return vdir, _table_of(manifest, table, model)


def _table_of(manifest: dict, table: str, model: str) -> dict:
    if table not in manifest["tables"]:
        have = ", ".join(sorted(manifest["tables"]))
        raise UserError(f"{_strip_query(model)}: table {table!r} was not trained in this model (it has: {have})")
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
        """(ids, vectors [n, dim], adagrad [n, 1] or None) per record batch, zero-copy views of the map."""
        schema = self.reader.schema
        vector = schema.field("vector").type if "vector" in schema.names else None
        if ("id" not in schema.names or schema.field("id").type != pa.int64()
                or vector is None or not pa.types.is_fixed_size_list(vector) or vector.value_type != pa.float32()
                or (self.has_state and schema.field("adagrad").type != pa.float32())):
            raise UserError(f"{self.shown}: not a checkpoint part (expected columns id, vector float32[{dim}])")
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
                state = batch.column("adagrad").to_numpy(zero_copy_only=False)[:, None] if with_state else None
                yield batch.column("id").to_numpy(), matrix_of(batch.column("vector"), dim), state
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


def _open_part(store: _Store, version: int, part: dict, verify: bool) -> _Part:
    """Open one part for reading: checked against its manifest entry (size, sha256), memory-mapped.

    A local file is mapped in place; a remote one is streamed into a local temporary file, hashed on
    the way, and mapped from there (the file is unlinked at once; the mapping keeps it alive).
    """
    rel = _vrel(version, part["path"])
    shown = store.show(rel)
    info = _info(store, rel)
    if info.type != pafs.FileType.File:
        raise UserError(f"{shown}: part file missing; the checkpoint is damaged")
    if "bytes" in part and info.size is not None and info.size != part["bytes"]:
        raise UserError(f"{shown}: {info.size} bytes, the manifest says {part['bytes']}; the checkpoint is damaged")
    if store.local:
        path = store.path(rel)
        if verify and _sha256(path) != part["sha256"]:
            raise UserError(f"{shown}: checksum mismatch; the checkpoint is damaged")
        with open(path, "rb") as fh:
            mapped = _map(fh, shown)
    else:
        with tempfile.TemporaryFile(prefix="doc2vec-part-") as fh:
            sink = _HashingSink(fh)
            try:
                with store.fs.open_input_stream(store.path(rel)) as src:
                    _copy_stream(src, sink)
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


def _map(fh, shown: str) -> mmap.mmap:
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        raise UserError(f"{shown}: empty file; the checkpoint is damaged") from None


def _parts_of(model: str, table: str, version: int | None, fs) -> tuple[_Store, int, dict]:
    store = _store(model, fs)
    version, manifest = _read_manifest(store, version)
    return store, version, _table_of(manifest, table, model)


def iter_parts(model: str, table: str, verify: bool = True, *, version: int | None = None,
               fs: pafs.FileSystem | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (ids int64[n], vectors float32[n, dim]) for each part file of a table, memory-mapped."""
    store, version, spec = _parts_of(model, table, version, fs)
    for part in spec["parts"]:
        batches = list(_open_part(store, version, part, verify).batches(spec["dim"], part["rows"]))
        if len(batches) == 1:
            yield batches[0][0], batches[0][1]
        elif not batches:
            yield np.zeros(0, np.int64), np.zeros((0, spec["dim"]), np.float32)
        else:
            yield np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def part_batches(model: str, table: str, verify: bool = True, *, version: int | None = None,
                 fs: pafs.FileSystem | None = None) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
    """For each part file of a table, its record batches as (ids, vectors) zero-copy views of the
    memory map, checked as every read is (size, sha256, schema, nulls, row count)."""
    store, version, spec = _parts_of(model, table, version, fs)
    for part in spec["parts"]:
        opened = _open_part(store, version, part, verify)
        yield [(ids, vectors) for ids, vectors, _ in opened.batches(spec["dim"], part["rows"])]


def read_table(model: str, table: str, verify: bool = True, *, version: int | None = None,
               fs: pafs.FileSystem | None = None) -> np.ndarray:
    """The whole table as one [rows, dim] float32 matrix, row i = id i; every row must be in exactly one part."""
    store, version, spec = _parts_of(model, table, version, fs)
    matrix = np.empty((spec["rows"], spec["dim"]), dtype=np.float32)
    seen = np.zeros(spec["rows"], dtype=bool)
    for part in spec["parts"]:
        opened = _open_part(store, version, part, verify)
        for ids, vectors, _ in opened.batches(spec["dim"], part["rows"]):
            _scatter(matrix, seen, ids, vectors, opened.shown, spec["rows"])
    if not seen.all():
        raise UserError(f"{store.show(_vrel(version))}: table {table} lacks {int((~seen).sum())} of its rows; "
                        "the checkpoint is damaged")
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
               verify: bool = True, out: np.ndarray | None = None,
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
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards} is out of range")
    store, version, spec = _parts_of(model, table, version, fs)
    dim = spec["dim"]
    n = len(range(shard, spec["rows"], num_shards))
    if out is None:
        out = np.empty((n, dim), dtype=np.float32)
    elif out.shape[0] != n or out.shape[1] < dim or out.dtype != np.float32:
        raise ValueError(f"out must be float32 [{n}, >= {dim}], got {out.dtype} {list(out.shape)}")
    vectors, state, has_state = out[:, :dim], None, None
    seen = np.zeros(n, dtype=bool)
    for part in spec["parts"]:
        m = _PART_RE.match(part["path"])
        t, total = int(m.group(2)), int(m.group(3))
        if (t - shard) % math.gcd(total, num_shards):
            continue  # rows ≡ t (mod T) and rows ≡ shard (mod S) never meet
        opened = _open_part(store, version, part, verify)
        if has_state is None:
            has_state = opened.has_state
            if has_state:
                state = out[:, dim:dim + 1] if out.shape[1] > dim else np.empty((n, 1), np.float32)
        elif opened.has_state != has_state:
            raise UserError(f"{opened.shown}: optimiser state in some parts only; the checkpoint is damaged")
        for ids, rows, rows_state in opened.batches(dim, part["rows"]):
            if num_shards > 1:
                mine = ids % num_shards == shard
                if not mine.all():
                    ids, rows = ids[mine], rows[mine]
                    rows_state = rows_state[mine] if rows_state is not None else None
                ids = ids // num_shards
            where = _scatter(vectors, seen, ids, rows, opened.shown, n)
            if state is not None and where is not None:
                state[where] = rows_state
    if not seen.all():
        raise UserError(f"{store.show(_vrel(version))}: table {table} lacks {int((~seen).sum())} rows of shard "
                        f"{shard} of {num_shards}; the checkpoint is damaged")
    return vectors, state


# ---------------------------------------------------------------------------------------------------
# remote models, used locally
# ---------------------------------------------------------------------------------------------------

def cache_root() -> str:
    """Where local copies of remote models go: $DOC2VEC_DIST_CACHE, else $XDG_CACHE_HOME or ~/.cache."""
    if os.environ.get("DOC2VEC_DIST_CACHE"):
        return os.environ["DOC2VEC_DIST_CACHE"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "doc2vec-dist")


def local_copy(model: str, cache: str | None = None) -> str:
    """A local directory holding the LATEST version of a remote model (a local path is returned as is).

    Downloads config.json, the key tables, the manifest and the parts of LATEST into
    cache/<hash of the URI>/, verifying every part's sha256 on the way; files already there from an
    earlier call (same size and modification time remotely) are not fetched again. LATEST is
    written last, so an interrupted copy is never taken for a whole one; other versions are removed.
    """
    if not is_uri(model):
        return model
    store = _store(model)
    version, manifest = _read_manifest(store, None)
    local = os.path.join(cache or cache_root(), hashlib.sha256(model.encode()).hexdigest()[:20])
    os.makedirs(local, exist_ok=True)
    sources_path = os.path.join(local, ".sources.json")
    try:
        with open(sources_path) as fh:
            sources = json.load(fh)
    except (OSError, json.JSONDecodeError):
        sources = {}
    wanted = [name for name in ("config.json", *KEY_FILES) if _is_file(store, name)]
    wanted.append(_vrel(version, "manifest.json"))
    sha = {_vrel(version, p["path"]): p["sha256"] for spec in manifest["tables"].values() for p in spec["parts"]}
    for rel in [*wanted, *sha]:
        info = _info(store, rel)
        stamp = [info.size, info.mtime_ns]
        target = os.path.join(local, *rel.split("/"))
        if sources.get(rel) == stamp and os.path.isfile(target) and os.path.getsize(target) == info.size:
            continue
        _download(store, rel, target, sha.get(rel))
        sources[rel] = stamp
        with open(f"{sources_path}.tmp-{os.getpid()}", "w") as fh:
            json.dump(sources, fh)
        os.replace(f"{sources_path}.tmp-{os.getpid()}", sources_path)
    tmp = os.path.join(local, f"LATEST.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(f"v{version}\n")
    os.replace(tmp, os.path.join(local, "LATEST"))
    for name in os.listdir(os.path.join(local, "checkpoints")):
        if name != f"v{version}":
            shutil.rmtree(os.path.join(local, "checkpoints", name), ignore_errors=True)
    return local


def _download(store: _Store, rel: str, target: str, sha256: str | None) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        with store.fs.open_input_stream(store.path(rel)) as src, open(tmp, "wb") as dst:
            sink = _HashingSink(dst)
            _copy_stream(src, sink)
        if sha256 is not None and sink.sha.hexdigest() != sha256:
            raise UserError(f"{store.show(rel)}: checksum mismatch; the checkpoint is damaged")
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"{store.show(rel)}: could not download ({exc})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
