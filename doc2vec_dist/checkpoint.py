"""Model directories: their layout, versions, the manifest, the atomic commit, pruning and resharding.

Changes when what a model directory holds, or how its versions are committed and read, changes;
talking to the storage underneath belongs to `storage`.

    MODEL/config.json                 resolved config
    MODEL/docs.arrow, vocab.arrow     the corpus's key tables (row id → user key / URL), so a model
                                      stands alone once trained
    MODEL/LATEST                      "vN", moved only after vN is whole
    MODEL/checkpoints/vN/manifest.json   its parts, and the model's id (model_id: random at the first
                                         version, kept by every later one; derived_from: the ids of an
                                         --init-from model and its own ancestors; see `provenance`)
    MODEL/checkpoints/vN/{docs,words,words_out}/part-SSSSS-of-TTTTT.arrow   columns id, vector[, adagrad]

MODEL is a local path or a URI (see `storage`). Every file is written with `storage.Store.write_file`,
so a file appears whole or not at all. Why a reader never sees a partial version:
  * On an object store, parts are written directly under their final names; a part that a failure
    may have left behind sits in a version that has no manifest yet, and is deleted.
  * On every store, the order does the rest: all parts, then the manifest (it lists every part with
    its row count, byte size and sha256), then LATEST. LATEST only ever names a version whose
    manifest exists, and a manifest only exists once every part it lists is whole. A version
    directory without a manifest is partial: it is never loaded, its number is never reused, and it
    is deleted by the next commit's pruning.

Checksums are computed on the bytes as they are written (no second read of a part from S3), and
checked on load together with row counts and dims. Loading memory-maps local Arrow files; a remote
part is streamed into a local temporary file (hashed on the way) and memory-mapped from there, so
memory stays bounded by a record batch, not a part. Only Arrow and JSON are ever read back: nothing
here unpickles. A manifest is validated field by field before anything in it is used, and its part
paths are plain relative names inside the version directory.

Readers: a parameter server loads its own rows with read_shard, whatever number of servers wrote the
version (row r lives on shard r % S). The serving side (Model, export, index, evaluate, infer) opens
a model with `ModelDir`: its config, keys and vocab, and one verified part reader (`ModelDir.parts`)
that checks each part's size, sha256, schema, nulls and row count the same way for every caller. A
remote model is used through local_copy(), a verified copy of LATEST in a cache directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import mmap
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from . import forgotten, lr, outputs, precision, storage
from .compact import new_ids
from .corpus import numpy_of
from .errors import UserError
from .storage import (
    CheckpointWriteError,
    HashingSink,
    Store,
    copy_stream,
    is_uri,
    sha256_file,
    strip_query,
    write_local,
)

FORMAT_VERSION = 1
TABLES = ("docs", "words", "words_out")
_VERSION_RE = re.compile(r"^v(\d+)$")
_PART_RE = re.compile(r"^(docs|words|words_out)/part-(\d{5})-of-(\d{5})\.arrow$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_MODEL_ID_RE = re.compile(r"^[0-9a-f]{32}$")

KEY_FILES = ("docs.arrow", "vocab.arrow")

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# the model directory
# ---------------------------------------------------------------------------------------------------

def _model_dir_state(store: Store) -> tuple[bool, list[str], str | None]:
    """(exists, entry names, the kind its marker names) of a model location."""
    info = store.info("")
    if info.type == pafs.FileType.NotFound:
        return False, [], None
    if info.type != pafs.FileType.Directory:
        raise UserError(f"{store.name}: exists and is a file; --out takes a directory for a model")
    # the writer lock is the run's, not the model's: a directory holding only it is as empty as it was
    names = [i.base_name for i in store.list("") if i.base_name != WRITER_FILE]
    marker = None
    if outputs.MARKER in names:
        marker = outputs.read_marker_kind(store.read_bytes(outputs.MARKER, limit=4096)) or "unknown"
    return True, names, marker


def refuse_existing_model(out: str, overwrite: bool, *, fs: pafs.FileSystem | None = None) -> bool:
    """Whether `out` holds a model of ours to replace (True) or is new or empty (False); anything
    else is refused with one line naming what is there (outputs.judge_dir). A model is replaced
    only with `overwrite`, since its checkpoints may be days of training; one that never committed
    a checkpoint (a fresh run killed before its first) needs no flag."""
    store = Store.of(out, fs)
    _, names, marker = _model_dir_state(store)
    unfinished = "LATEST" not in names and marker == "model"
    return outputs.judge_dir(store.name, "model", names, marker, None if unfinished else overwrite)


def start_model_dir(out: str, corpus_path: str, overwrite: bool, *, fs: pafs.FileSystem | None = None) -> list[str]:
    """Create (or, with overwrite, replace) a model directory holding its marker and the corpus's key
    tables, so export and neighbors later need only the model directory. The corpus is a local
    directory. Returns the local directories this created (the model directory among them when it
    did not exist), for discard_unfinished."""
    store = Store.of(out, fs)
    if refuse_existing_model(out, overwrite, fs=fs):
        _, names, _ = _model_dir_state(store)
        _delete_own(store, names)
    made = outputs.make_dirs(store.root) if store.local else []
    try:
        if store.atomic_rename and not store.local:
            store.fs.create_dir(store.path(), recursive=True)
        store.write_bytes(outputs.MARKER, outputs.marker_text("model").encode())
        for name in KEY_FILES:
            with open(os.path.join(corpus_path, name), "rb") as src:
                store.write_file(name, lambda sink, src=src: copy_stream(src, sink))
        if store.local:  # the users the corpus was told to forget stay forgotten in what is made of it
            forgotten.copy_for_new_model(corpus_path, store.root)
    except BaseException:
        # a full disk, a read-only mount: what this wrote goes again (it holds no checkpoint yet)
        with contextlib.suppress(Exception):
            _, names, _ = _model_dir_state(store)
            _delete_own(store, names)
            outputs.remove_dirs(made)
        raise
    return made


def _delete_own(store: Store, names: list[str]) -> None:
    """Delete the entries of a model directory that a model writes; the marker last, so that a
    directory half cleared still reads as ours. Anything else in it stays."""
    own = [n for n in names if n not in (outputs.MARKER, "exports", WRITER_FILE) and outputs.owned("model", n)]
    for name in own + ([outputs.MARKER] if outputs.MARKER in names else []):
        if store.info(name).type == pafs.FileType.Directory:
            store.delete_dir(name)
        else:
            store.delete_file(store.path(name))


def discard_unfinished(out: str, made: list[str], *, fs: pafs.FileSystem | None = None) -> bool:
    """After a fresh run that did not finish: remove what it wrote, unless it committed a checkpoint
    (then the model is whole and resumable, and stays). True when something was removed."""
    store = Store.of(out, fs)
    exists_, names, marker = _model_dir_state(store)
    if not exists_ or "LATEST" in names or marker != "model":
        return False
    _delete_own(store, names)
    outputs.remove_dirs(made)
    return True


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.arrow"


def version_dir(model: str, version: int) -> str:
    return storage.join(model, "checkpoints", f"v{version}")


def _vrel(version: int, rel: str = "") -> str:
    return f"checkpoints/v{version}/{rel}" if rel else f"checkpoints/v{version}"


def vectors_array(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """A [n, dim] float32 (or float16, or bfloat16's bits as uint16) matrix as fixed_size_list<float>[dim],
    without copying."""
    kept = np.float16 if matrix.dtype == np.float16 else np.uint16 if matrix.dtype == np.uint16 else np.float32
    matrix = np.ascontiguousarray(matrix, dtype=kept)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


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


def matrix_of(vectors: pa.Array | pa.ChunkedArray, dim: int) -> np.ndarray:
    """fixed_size_list<float32>[dim] back to a [n, dim] float32 matrix (zero-copy for one chunk)."""
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks() if vectors.num_chunks != 1 else vectors.chunk(0)
    flat = numpy_of(vectors.flatten())
    return flat.reshape(-1, dim)


# ---------------------------------------------------------------------------------------------------
# writing a version
# ---------------------------------------------------------------------------------------------------

def write_slice(model: str, version: int, table: str, shard: int, num_shards: int,
                ids: np.ndarray, matrix: np.ndarray, state: np.ndarray | None = None,
                rows_per_batch: int = 65536, *, dtype: str = "float32", fs: pafs.FileSystem | None = None) -> dict:
    """Write one shard's slice of a table as an Arrow file; returns its manifest entry.

    `ids` are the global rows of shard `shard` of `num_shards` (r % num_shards == shard), in any
    order; that rule is what lets a reader with another number of servers skip the parts that hold
    none of its rows. state [n, 1], if given and not empty, is the rows' optimiser state (row-wise
    Adagrad's accumulator), written as the column `adagrad` beside the vectors. The sha256 is
    computed on the bytes as they are written.

    dtype: the table's (precision.py), which `matrix` holds: float32, float16 (written as Arrow's
    halffloat) or bfloat16 (its bits, uint16, written as such with the type named in the schema's
    metadata); the state is float32 whatever the dtype.
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
    fields = [("id", pa.int64()), ("vector", pa.list_(PART_VALUE_TYPES[dtype], matrix.shape[1]))]
    with_state = state is not None and state.shape[1] > 0
    if with_state:
        fields.append(("adagrad", pa.float32()))
    schema = pa.schema(fields, metadata=None if dtype == "float32" else {DTYPE_KEY: dtype.encode()})

    def produce(sink: HashingSink) -> None:
        with pa.PythonFile(sink, mode="w") as out, pa.ipc.new_file(out, schema) as writer:
            for start in range(0, max(len(ids), 1), rows_per_batch):
                end = min(start + rows_per_batch, len(ids))
                columns = [pa.array(ids[start:end], pa.int64()), vectors_array(matrix[start:end])]
                if with_state:
                    columns.append(pa.array(np.ascontiguousarray(state[start:end, 0], dtype=np.float32)))
                writer.write_batch(pa.record_batch(columns, schema=schema))

    size, sha = Store.of(model, fs).write_file(_vrel(version, rel), produce)
    return {"path": rel, "rows": len(ids), "bytes": size, "sha256": sha}


def _version_dirs(store: Store) -> list[int]:
    """Every vN under checkpoints/, committed or partial."""
    return sorted(int(m.group(1)) for info in store.list("checkpoints")
                  if info.type == pafs.FileType.Directory and (m := _VERSION_RE.match(info.base_name)))


def _committed(store: Store, version: int) -> bool:
    return store.is_file(_vrel(version, "manifest.json"))


def committed_versions(model: str, *, fs: pafs.FileSystem | None = None) -> list[int]:
    """The versions up to LATEST that are whole (have a manifest): the ones a model keeps on disk."""
    store = Store.of(model, fs)
    latest = _latest(store, strict=False)
    if latest is None:
        return []
    return [v for v in _version_dirs(store) if v <= latest and _committed(store, v)]


def next_version(model: str, *, fs: pafs.FileSystem | None = None) -> int:
    """A version number never used in this model: past every version directory, partial ones included
    (a partial one may still hold stale files), and past LATEST."""
    store = Store.of(model, fs)
    latest = _latest(store, strict=False) or 0
    return max([latest, *_version_dirs(store)]) + 1


def latest_version(model: str, *, fs: pafs.FileSystem | None = None) -> int | None:
    """The version LATEST names, or None for a model directory that has no committed version."""
    return _latest(Store.of(model, fs), strict=True)


def _latest(store: Store, strict: bool) -> int | None:
    if not store.is_file("LATEST"):
        return None
    name = store.read_bytes("LATEST", limit=64).decode(errors="replace").strip()
    m = _VERSION_RE.match(name)
    if not m:
        if strict:
            raise UserError(f"{store.show('LATEST')}: expected a version like v3, found {name[:40]!r}")
        return None
    return int(m.group(1))


def commit(model: str, version: int, tables: dict[str, list[dict]], dims: dict[str, int],
           extra: dict, keep: int, *, dtype: str = "float32", damaged: Collection[int] = (),
           fs: pafs.FileSystem | None = None) -> str:
    """Write the manifest of a version whose parts are all written, then point LATEST at it, then prune.
    dtype: the type the parts hold the vectors in (write_slice), recorded per table. damaged: versions
    found damaged (a resumed run passed them over: resume_point), pruned first.

    The manifest is validated as a reader would, and every part it lists must be there with its
    size, before anything is written: LATEST moves only to a whole version.
    """
    store = Store.of(model, fs)
    latest = _latest(store, strict=False)
    if latest is not None and version < latest:
        raise ValueError(f"{store.name}: cannot commit v{version}, LATEST is already v{latest}")
    for parts in tables.values():
        parts.sort(key=lambda p: p["path"])
    manifest = {
        "format_version": FORMAT_VERSION,
        "version": version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": {name: {"rows": sum(p["rows"] for p in parts), "dim": dims[name], "dtype": dtype,
                          "parts": parts} for name, parts in tables.items()},
    }
    clash = set(extra) & set(manifest)
    if clash:
        raise ValueError(f"extra manifest keys {sorted(clash)} would replace the manifest's own")
    manifest.update(extra)
    for key, value in _identity(store, latest).items():  # a resumed run's versions keep the model's identity
        manifest.setdefault(key, value)
    rel = _vrel(version, "manifest.json")
    validate_manifest(manifest, store.show(rel), version)
    _check_parts_written(store, version, manifest)
    store.write_bytes(rel, storage.json_bytes(manifest))
    store.write_bytes("LATEST", f"v{version}\n".encode())
    _prune_store(store, keep, damaged)
    return version_dir(model, version)


def new_model_id() -> str:
    """A model's id: random, so that two models never share one, whoever trained them and where."""
    return uuid.uuid4().hex


def _identity(store: Store, latest: int | None) -> dict:
    """model_id and derived_from for the next version: LATEST's, else (a model's first version) a new id.

    A model written before ids were recorded gets one at its next commit (a resume); its older
    versions have none, so what was made from them cannot be checked (provenance.check says so)."""
    previous = {}
    if latest is not None:
        # LATEST's; where it does not read (a damaged LATEST a resumed run passed over), the newest that does
        for version in [latest, *sorted((v for v in _version_dirs(store) if v < latest), reverse=True)]:
            with contextlib.suppress(UserError):
                previous = _read_manifest(store, version)[1]
                break
    identity = {"model_id": previous.get("model_id") or new_model_id()}
    if previous.get("derived_from"):
        identity["derived_from"] = previous["derived_from"]
    return identity


def commit_training(out: str, config, corpus, save: Callable[[int], list[dict]], epoch: int, positions: list | None,
                    epoch_stats: list[dict], derived_from: list[str] | None = None, version: int | None = None,
                    damaged: Collection[int] = (), settings: dict | None = None) -> int:
    """Write a checkpoint version (`version`, default next_version) and return its number: `save(version)`
    writes every server's slice (returning each server's entries), then the manifest says the epochs
    done, where each worker's data stands (None: at the start of epoch `epoch`) and the learning
    rate there. config: the run's TrainConfig; corpus: its corpus.Corpus; positions: units.Position
    each; derived_from: the ids of the model a fresh --init-from run started from and of its own
    ancestors (a resumed run keeps its manifest's); damaged: as commit takes it; settings: the run's
    resolved settings (settings.RunSettings.to_json), which a resume resolves from. If anything fails before LATEST names the version,
    what was written of it is deleted (discard_version): a full disk gets its room back, and keeps no
    partial version."""
    version = next_version(out) if version is None else version
    try:
        entries = save(version)
        tables = {name: [e[name] for e in entries] for name in entries[0]}
        done = corpus.tokens_before(epoch, config.first_epoch) + sum(p.tokens for p in positions or [])
        planned = corpus.tokens_before(config.epochs, config.first_epoch)
        rate = lr.rate_at(config.alpha, config.min_alpha, done, planned)
        commit(out, version, tables, {name: config.dim for name in tables}, dtype=config.dtype, extra=
               {"epoch": epoch, "positions": None if positions is None else [p.to_json() for p in positions],
                "lr": rate, "num_ps": config.num_ps, "plan": (settings or {}).get("plan") or config.plan(),
                "num_workers": config.num_workers, "config": dataclasses.asdict(config), "corpus": corpus.path,
                "corpus_stats": {k: getattr(corpus, k) for k in ("num_docs", "num_tokens", "vocab_size")},
                "losses": [s["loss"] / max(s["pairs"], 1) for s in epoch_stats],
                **({"derived_from": derived_from} if derived_from else {}),
                **({"settings": settings} if settings else {})},
               keep=config.keep_checkpoints, damaged=damaged)
    except BaseException:
        discard_version(out, version)
        raise
    return version


def discard_version(model: str, version: int, *, fs: pafs.FileSystem | None = None) -> bool:
    """Delete version `version` unless LATEST names it: a version being written that failed (its
    number is not reused: next_version looks past LATEST). True when something was deleted; a
    storage that refuses the delete (a read-only remount) leaves it for the next commit's pruning."""
    store = Store.of(model, fs)
    try:
        if _latest(store, strict=False) == version or store.info(_vrel(version)).type == pafs.FileType.NotFound:
            return False
        store.delete_dir(_vrel(version))
    except (OSError, UserError):
        return False
    return True


def discard_partial_versions(model: str, *, fs: pafs.FileSystem | None = None) -> list[int]:
    """Delete the versions after LATEST, which LATEST never named: left by a run that stopped (killed,
    or its disk full) while writing them. For a run that resumes, and so is the model's only writer;
    returns the numbers deleted. (A commit's pruning leaves versions after LATEST alone, since
    another writer might be writing one.)"""
    store = Store.of(model, fs)
    latest = _latest(store, strict=False)
    if latest is None:
        return []
    newer = [v for v in _version_dirs(store) if v > latest]
    return [v for v in newer if discard_version(model, v, fs=fs)]


@dataclass
class ResumePoint:
    """The committed version a resumed run starts from, verified: `version` and its `manifest`; `latest`,
    the version LATEST named then; `damaged`, the newer versions passed over, each with what is wrong."""

    version: int
    manifest: dict
    latest: int
    damaged: dict[int, str]


def resume_point(model: str, asked: int | None = None, *, verify: bool = True, quiet: bool = False,
                 fs: pafs.FileSystem | None = None) -> ResumePoint:
    """The version a resumed run starts from, checked as a reader checks it (the manifest, and every
    part's presence, size and, with `verify`, sha256: the same opener as ModelDir's), before any actor
    starts: `asked` (--resume-from), else LATEST, else the newest intact version before it, with one
    warning line naming the damaged version(s) and the one resumed from. Refused in one line when
    `asked` is not a committed version of the model, or is damaged (naming the newest intact one and
    its flag), or when no version is intact; a line never names a version the model does not have.
    quiet: no warning line (a caller that only needs the version's config; the run says it).

    Falling back costs only the training since the intact version, which the run does again; the
    damaged versions stay on disk until the run's first checkpoint, whose pruning removes them first.
    """
    store = Store.of(model, fs)
    latest = _latest(store, strict=True)
    if latest is None:
        raise UserError(f"{store.name}: not a trained model (no LATEST file)")
    kept = [v for v in _version_dirs(store) if v <= latest and _committed(store, v)]
    candidates = sorted(set(kept) | {latest}, reverse=True)  # LATEST naming a version without manifest: damaged
    if asked is not None:
        if asked not in kept:
            have = ", ".join(f"v{v}" for v in kept) or "none"
            raise UserError(f"{store.name}: --resume-from v{asked}: no such checkpoint (it keeps {have})")
        why = version_damage(store, asked, verify)
        if why is None:
            return ResumePoint(asked, _read_manifest(store, asked)[1], latest, {})
        other = next((v for v in candidates if v != asked and version_damage(store, v, verify) is None), None)
        raise UserError(f"{store.name}: checkpoint v{asked} is damaged ({why}); "
                        + (f"resume from v{other}, the newest intact version, with --resume-from v{other}" if other
                           else "no other version is intact: train it afresh with --overwrite"))
    damaged: dict[int, str] = {}
    for version in candidates:
        why = version_damage(store, version, verify)
        if why is None:
            if damaged and not quiet:
                what = (f"checkpoint v{latest} is damaged ({damaged[latest]})" if len(damaged) == 1 else
                        "checkpoints " + " and ".join(f"v{v} ({w})" for v, w in damaged.items()) + " are damaged")
                log.warning(f"warning: {store.name}: {what}; resuming from v{version}, the newest intact version")
            return ResumePoint(version, _read_manifest(store, version)[1], latest, damaged)
        damaged[version] = why
    raise UserError(f"{store.name}: no intact checkpoint to resume from: "
                    + ", ".join(f"v{v} is damaged ({w})" for v, w in damaged.items())
                    + "; train it afresh with --overwrite")


def version_damage(store: Store, version: int, verify: bool = True) -> str | None:
    """What is wrong with a committed version, in a few words (`docs/part-00001-of-00002.arrow: part
    file missing`), or None when its manifest and every part it lists are whole: with `verify`, each part
    opened as every reader opens it, its sha256 checked (_open_part: a whole read of the version; on an
    object store, a download); without, each part's presence and size (a listing, nothing read)."""
    within = store.show(_vrel(version)).rstrip("/") + "/"

    def short(exc: UserError) -> str:
        return str(exc).removeprefix(within).removesuffix("; the checkpoint is damaged")

    try:
        manifest = _read_manifest(store, version)[1]
        for spec in manifest["tables"].values():
            for part in spec["parts"]:
                if verify:
                    _open_part(store, version, part, verify=True)
                else:
                    _check_part_file(store, version, part)
    except UserError as exc:
        return short(exc)
    return None


def version_bytes(tables, parts: int = 1) -> int:
    """About the bytes of one checkpoint version of `tables` (TableSpecs) written by `parts` servers:
    each row's id (int64), vector (in the table's dtype) and optimiser state (float32), as write_slice
    lays them out, and the Arrow framing of each part file and record batch. What a disk needs free
    for a checkpoint."""
    size = 0
    for t in tables:
        batches = t.rows // 65536 + parts  # each part's batches of up to 65,536 rows
        size += t.rows * (8 + t.row_bytes) + 1024 * parts + 256 * batches
    return size


def write_config(out: str, config, corpus_path: str, **extra) -> None:
    """MODEL/config.json: the resolved TrainConfig, the corpus it was trained on, and `extra` (the
    run's summary, the trainer); what ModelDir.config and ModelDir.corpus_path read back."""
    Store.of(out).write_json("config.json", {**dataclasses.asdict(config), "corpus": corpus_path, **extra})


def _check_parts_written(store: Store, version: int, manifest: dict) -> None:
    found = {info.path: info.size for info in store.list(_vrel(version), recursive=True)
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


def _prune_store(store: Store, keep: int, damaged: Collection[int] = ()) -> None:
    """Keep the `keep` newest committed versions up to LATEST; delete older committed versions and
    partial versions (no manifest) older than LATEST, and the `damaged` ones first (they would take the
    place of an intact version). LATEST and anything newer are never touched: a newer directory may be
    a version being written right now."""
    latest = _latest(store, strict=False)
    if latest is None:
        return
    older = [v for v in _version_dirs(store) if v < latest]
    committed = [v for v in older if _committed(store, v) and v not in damaged]
    kept = set(committed[-(keep - 1):]) if keep > 1 else set()  # LATEST is the keep-th
    for v in older:
        if v not in kept:
            store.delete_dir(_vrel(v))


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


def _read_manifest(store: Store, version: int | None) -> tuple[int, dict]:
    if version is None:
        version = _latest(store, strict=True)
        if version is None:
            raise UserError(f"{store.name}: not a trained model (no LATEST file)")
    rel = _vrel(version, "manifest.json")
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
    version, manifest = _read_manifest(Store.of(model, fs), version)
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


def _open_part(store: Store, version: int, part: dict, verify: bool) -> _Part:
    """Open one part for reading: checked against its manifest entry (size, sha256), memory-mapped.

    A local file is mapped in place; a remote one is streamed into a local temporary file, hashed on
    the way, and mapped from there (the file is unlinked at once; the mapping keeps it alive).
    """
    rel = _vrel(version, part["path"])
    shown = _check_part_file(store, version, part)
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


def _check_part_file(store: Store, version: int, part: dict) -> str:
    """A part's file is there, of the size its manifest entry says (else a UserError naming it); its name
    as messages show it."""
    rel = _vrel(version, part["path"])
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
        self.version, self.manifest = _read_manifest(self.store, version)
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
        path, column = self._key_file(table)
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all().column(column).combine_chunks()

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
        return _open_part(self.store, self.version, entry, verify), entry, spec["dim"]

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
            raise UserError(f"{self.store.show(_vrel(self.version))}: table {table} lacks {int((~seen).sum())} of "
                            "its rows; the checkpoint is damaged")
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
        opened = _open_part(store, version, part, verify)
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
        raise UserError(f"{store.show(_vrel(version))}: table {table} lacks {int((~seen).sum())} rows of shard "
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
    version, manifest = _read_manifest(store, None)
    files: dict[str, str | None] = {name: None for name in ("config.json", *KEY_FILES) if store.is_file(name)}
    files[_vrel(version, "manifest.json")] = None
    files.update({_vrel(version, p["path"]): p["sha256"] for spec in manifest["tables"].values() for p in spec["parts"]})
    local = storage.mirror(store, model, files, cache)
    write_local(os.path.join(local, "LATEST"), f"v{version}\n")
    for name in os.listdir(os.path.join(local, "checkpoints")):
        if name != f"v{version}":
            shutil.rmtree(os.path.join(local, "checkpoints", name), ignore_errors=True)
    return local


# ---------------------------------------------------------------------------------------------------
# one writer at a time
# ---------------------------------------------------------------------------------------------------

# MODEL/WRITER.json: the run that writes the model directory now (train, baseline, and the jobs through
# them), as JSON: host, pid, when it started, its command line, and what tells its process apart from a
# later one with the same pid (the machine's boot id, the pid namespace, the process's start time). It is
# created exclusively (O_CREAT | O_EXCL) before anything in the directory is deleted or written, and
# removed on every way out. The driver holds it for the whole run: the parameter servers that write the
# checkpoints' parts, in other processes or on other nodes, are the driver's.
#
# A lock a dead run left behind does not hold forever. On the same host (same boot, same pid namespace)
# it is stale as soon as its pid no longer runs, or runs another process (a different start time). A
# lock of another host (a model on storage several machines mount) is refreshed by its holder every
# HEARTBEAT_SECONDS (the file's mtime, from a thread of the driver) and is stale once its heartbeat is
# STALE_SECONDS old. A stale lock is taken over with one line naming whose it was.
#
# On an object store (s3://, gs://) there is no exclusive create: the lock is an object written after
# finding none, and read back to see that it is ours. That keeps out a second run started while the
# first one runs; two runs started within the same second against the same model may both proceed.
WRITER_FILE = "WRITER.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0


def _read_small(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process, from /proc/PID/stat; None where
    there is no /proc or no such process."""
    text = _read_small(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after the command's name, which may hold spaces
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _command_line() -> str:
    argv = list(sys.argv) or ["python"]
    if os.path.basename(argv[0]) == "__main__.py" and os.path.basename(os.path.dirname(argv[0])) == "doc2vec_dist":
        argv[0] = "doc2vec-dist"  # python -m doc2vec_dist
    line = " ".join(shlex.quote(a) for a in argv)
    return line if len(line) <= 300 else line[:297] + "..."


def _this_run() -> dict:
    start = _process_start(os.getpid())
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.now().astimezone().isoformat(timespec="seconds"), "command": _command_line(),
            "boot_id": _read_small("/proc/sys/kernel/random/boot_id"), "pid_namespace": _pid_namespace(),
            "pid_start": start[1] if start else None, "token": uuid.uuid4().hex}


def _holder(held: dict) -> str:
    if not held.get("pid"):
        return "a run whose lock file is empty or unreadable"
    return (f"host {held.get('host')}, pid {held.get('pid')}, started {held.get('started')}, "
            f"`{held.get('command')}`")


def _same_machine(held: dict) -> bool:
    here = _this_run()
    return bool(held.get("pid")) and all(held.get(k) == here[k] for k in ("host", "boot_id", "pid_namespace"))


def _gone(held: dict, age: float) -> str | None:
    """Why the run that holds a lock is gone (the reason a takeover line gives), or None while it may run."""
    if _same_machine(held):
        pid = int(held["pid"])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "its process no longer runs"
        except (PermissionError, OverflowError):
            pass  # it runs, as another user
        now = _process_start(pid)
        if now is not None and (now[0] == "Z" or (held.get("pid_start") is not None and now[1] != held["pid_start"])):
            return "its process no longer runs"  # a zombie, or the pid given to another process since
        return None
    if age > STALE_SECONDS:
        return f"no heartbeat for {age:.0f} s"
    return None


class Writer:
    """This process's hold on a model directory's WRITER_FILE: taken by `writing`, kept alive by a heartbeat."""

    def __init__(self, store: Store, held: dict, ident: Any, made: list[str]):
        self.store, self.held, self.ident, self.made = store, held, ident, made
        self._stop = threading.Event()
        self._lost = False
        self._beating = threading.Thread(target=self._beat_every, name="doc2vec-dist-writer-heartbeat", daemon=True)
        self._beating.start()

    @classmethod
    def take(cls, model: str, fs: pafs.FileSystem | None = None) -> Writer:
        """Take the lock of `model` (a local directory is made, with its parents, if missing), or refuse in
        one line naming the run that holds it; a stale lock is taken over, saying whose it was."""
        store = Store.of(model, fs)
        made: list[str] = []
        mine = _this_run()
        try:
            if store.local:
                made = outputs.make_dirs(store.root)
            for _ in range(5):  # each turn: ours, or someone's that is alive (refused), or a stale one removed
                ident = _create(store, mine)
                if ident is not None:
                    return cls(store, mine, ident, made)
                found = _read_lock(store)
                if found is None:
                    continue  # released meanwhile
                held, age, ident = found
                why = _gone(held, age)
                if why is None:
                    raise UserError(_refusal(store, held, age))
                log.warning(f"warning: {store.name}: taking over the lock of a run that is gone ({_holder(held)}): {why}")
                _remove_if_same(store, ident)
            raise UserError(f"{store.name}: other runs keep taking its lock ({store.show(WRITER_FILE)}); try again")
        except OSError as exc:
            outputs.remove_dirs(made)
            raise outputs.cannot_write(store.name, exc) from None
        except BaseException:
            outputs.remove_dirs(made)
            raise

    def beat(self) -> None:
        """Refresh the heartbeat (the file's mtime) that keeps the lock from looking stale on another host;
        say once if the lock is no longer ours (taken over after a stall longer than STALE_SECONDS)."""
        found = _read_lock(self.store)
        if found is None or found[2] != self.ident:
            if not self._lost:
                self._lost = True
                log.warning(f"warning: {self.store.name}: this run's lock ({self.store.show(WRITER_FILE)}) was taken "
                            f"over by {_holder(found[0]) if found else 'no one (it is gone)'}")
            return
        if self.store.local:
            os.utime(self.store.path(WRITER_FILE))
        else:
            self.store.write_bytes(WRITER_FILE, storage.json_bytes(self.held))

    def _beat_every(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError, UserError):
                self.beat()

    def release(self) -> None:
        """Remove the lock if it is still ours, then the directories taking it made, if empty. Never raises:
        it runs on every way out."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(OSError, UserError):
            _remove_if_same(self.store, self.ident)
        outputs.remove_dirs(self.made)


@contextlib.contextmanager
def writing(model: str, *, fs: pafs.FileSystem | None = None) -> Iterator[Writer]:
    """Hold the model directory's writer lock for the body (Writer.take), released on every way out."""
    writer = Writer.take(model, fs)
    try:
        yield writer
    finally:
        writer.release()


def refuse_other_writer(model: str, *, fs: pafs.FileSystem | None = None) -> None:
    """Refuse at once, touching nothing, a model directory another live run is writing: the line
    `writing` would give, before a command's other checks (a stale lock is left for `writing`)."""
    store = Store.of(model, fs)
    found = _read_lock(store)
    if found is not None and _gone(found[0], found[1]) is None:
        raise UserError(_refusal(store, found[0], found[1]))


def _refusal(store: Store, held: dict, age: float) -> str:
    line = f"{store.name} is being written by another run ({_holder(held)}); wait for it to end, or give another --out"
    if not _same_machine(held):  # its process cannot be looked at from here: only its heartbeat tells
        until = (datetime.now().astimezone() + timedelta(seconds=STALE_SECONDS - age)).isoformat(timespec="seconds")
        line += (f" (a run that died on another host holds it until {STALE_SECONDS:g} s after its last heartbeat, "
                 f"until {until})" if held.get("pid") else
                 f" (if that run is gone, its lock lapses {STALE_SECONDS:g} s after it was last written, at {until})")
    return line


def _create(store: Store, mine: dict) -> Any:
    """Create the lock file holding `mine` if there is none; what identifies it (as _read_lock gives it)
    when it is ours, else None."""
    data = storage.json_bytes(mine)
    if store.local:
        try:
            fd = os.open(store.path(WRITER_FILE), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        try:
            stat = os.fstat(fd)
            # a full disk leaves it empty: still held, and judged by its age (the command's own check names the disk)
            with contextlib.suppress(OSError):
                os.write(fd, data)
        finally:
            os.close(fd)
        return stat.st_dev, stat.st_ino
    if store.info(WRITER_FILE).type != pafs.FileType.NotFound:
        return None
    store.write_bytes(WRITER_FILE, data)  # no exclusive create on an object store: written, then read back
    found = _read_lock(store)
    return mine["token"] if found is not None and found[2] == mine["token"] else None


def _read_lock(store: Store) -> tuple[dict, float, Any] | None:
    """(what the lock file holds, its age in seconds by its mtime, what identifies this file) or None if
    there is none. A file that is empty or not JSON (a run killed as it created it) holds {}."""
    if store.local:
        path = store.path(WRITER_FILE)
        try:
            with open(path, "rb") as fh:
                stat = os.fstat(fh.fileno())
                raw = fh.read(65536)
        except FileNotFoundError:
            return None
        age, ident = time.time() - stat.st_mtime, (stat.st_dev, stat.st_ino)
    else:
        info = store.info(WRITER_FILE)
        if info.type == pafs.FileType.NotFound:
            return None
        raw = store.read_bytes(WRITER_FILE, limit=65536)
        age = time.time() - info.mtime.timestamp() if info.mtime else 0.0
    try:
        held = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        held = {}
    held = held if isinstance(held, dict) else {}
    return held, age, (ident if store.local else held.get("token"))


def _remove_if_same(store: Store, ident: Any) -> None:
    """Remove the lock file if it is still the one identified by `ident` (its inode; an object's token)."""
    if store.local:
        path = store.path(WRITER_FILE)
        with contextlib.suppress(FileNotFoundError):
            stat = os.stat(path)
            if (stat.st_dev, stat.st_ino) == ident:
                os.remove(path)
        return
    found = _read_lock(store)
    if found is not None and found[0].get("token") == ident:
        store.delete_file(store.path(WRITER_FILE))
