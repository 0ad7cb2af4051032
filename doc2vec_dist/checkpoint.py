"""Writing a model directory: starting it, writing and committing versions, discarding and pruning
them, the version a resumed run starts from, and one writer at a time.

Changes when how a model's versions are written and committed changes; the directory's layout and
reading a version back belong to `modeldir`, talking to the storage underneath to `storage`.

Every file is written with `storage.Store.write_file`, so a file appears whole or not at all. Why a
reader never sees a partial version:
  * On an object store, parts are written directly under their final names; a part that a failure
    may have left behind sits in a version that has no manifest yet, and is deleted.
  * On every store, the order does the rest: all parts, then the manifest (it lists every part with
    its row count, byte size and sha256), then LATEST. LATEST only ever names a version whose
    manifest exists, and a manifest only exists once every part it lists is whole. A version
    directory without a manifest is partial: it is never loaded, its number is never reused, and it
    is deleted by the next commit's pruning.

Checksums are computed on the bytes as they are written (no second read of a part from S3), and
checked on load (`modeldir`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import socket
import sys
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

from . import forgotten, lr, outputs, storage
from . import settings as run_settings
from .corpus import arrow_of
from .errors import UserError
from .modeldir import (
    DTYPE_KEY,
    FORMAT_VERSION,
    KEY_FILES,
    PART_VALUE_TYPES,
    TABLES,
    is_committed,
    part_name,
    read_latest,
    read_manifest,
    validate_manifest,
    vectors_array,
    version_damage,
    version_dir,
    version_dirs,
    version_rel,
)
from .storage import CheckpointWriteError, HashingSink, Store, copy_stream

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
                columns = [arrow_of(ids[start:end]), vectors_array(matrix[start:end])]
                if with_state:
                    columns.append(arrow_of(np.asarray(state[start:end, 0], dtype=np.float32)))
                writer.write_batch(pa.record_batch(columns, schema=schema))

    size, sha = Store.of(model, fs).write_file(version_rel(version, rel), produce)
    return {"path": rel, "rows": len(ids), "bytes": size, "sha256": sha}


def next_version(model: str, *, fs: pafs.FileSystem | None = None) -> int:
    """A version number never used in this model: past every version directory, partial ones included
    (a partial one may still hold stale files), and past LATEST."""
    store = Store.of(model, fs)
    latest = read_latest(store, strict=False) or 0
    return max([latest, *version_dirs(store)]) + 1


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
    latest = read_latest(store, strict=False)
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
    rel = version_rel(version, "manifest.json")
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
        for version in [latest, *sorted((v for v in version_dirs(store) if v < latest), reverse=True)]:
            with contextlib.suppress(UserError):
                previous = read_manifest(store, version)[1]
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
                "lr": rate, "num_ps": config.num_ps, "plan": (settings or {}).get("plan") or run_settings.plan(config),
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
        gone = store.info(version_rel(version)).type == pafs.FileType.NotFound
        if read_latest(store, strict=False) == version or gone:
            return False
        store.delete_dir(version_rel(version))
    except (OSError, UserError):
        return False
    return True


def discard_partial_versions(model: str, *, fs: pafs.FileSystem | None = None) -> list[int]:
    """Delete the versions after LATEST, which LATEST never named: left by a run that stopped (killed,
    or its disk full) while writing them. For a run that resumes, and so is the model's only writer;
    returns the numbers deleted. (A commit's pruning leaves versions after LATEST alone, since
    another writer might be writing one.)"""
    store = Store.of(model, fs)
    latest = read_latest(store, strict=False)
    if latest is None:
        return []
    newer = [v for v in version_dirs(store) if v > latest]
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
    latest = read_latest(store, strict=True)
    if latest is None:
        raise UserError(f"{store.name}: not a trained model (no LATEST file)")
    kept = [v for v in version_dirs(store) if v <= latest and is_committed(store, v)]
    candidates = sorted(set(kept) | {latest}, reverse=True)  # LATEST naming a version without manifest: damaged
    if asked is not None:
        if asked not in kept:
            have = ", ".join(f"v{v}" for v in kept) or "none"
            raise UserError(f"{store.name}: --resume-from v{asked}: no such checkpoint (it keeps {have})")
        why = version_damage(store, asked, verify)
        if why is None:
            return ResumePoint(asked, read_manifest(store, asked)[1], latest, {})
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
            return ResumePoint(version, read_manifest(store, version)[1], latest, damaged)
        damaged[version] = why
    raise UserError(f"{store.name}: no intact checkpoint to resume from: "
                    + ", ".join(f"v{v} is damaged ({w})" for v, w in damaged.items())
                    + "; train it afresh with --overwrite")


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
    found = {info.path: info.size for info in store.list(version_rel(version), recursive=True)
             if info.type == pafs.FileType.File}
    for spec in manifest["tables"].values():
        for part in spec["parts"]:
            path = store.path(version_rel(version, part["path"]))
            if path not in found:
                raise CheckpointWriteError(f"{store.show(version_rel(version, part['path']))}: missing; "
                                           f"v{version} is not committed")
            if "bytes" in part and found[path] != part["bytes"]:
                raise CheckpointWriteError(f"{store.show(version_rel(version, part['path']))}: {found[path]} bytes, "
                                           f"{part['bytes']} were written; v{version} is not committed")


def _prune_store(store: Store, keep: int, damaged: Collection[int] = ()) -> None:
    """Keep the `keep` newest committed versions up to LATEST; delete older committed versions and
    partial versions (no manifest) older than LATEST, and the `damaged` ones first (they would take the
    place of an intact version). LATEST and anything newer are never touched: a newer directory may be
    a version being written right now."""
    latest = read_latest(store, strict=False)
    if latest is None:
        return
    older = [v for v in version_dirs(store) if v < latest]
    committed = [v for v in older if is_committed(store, v) and v not in damaged]
    kept = set(committed[-(keep - 1):]) if keep > 1 else set()  # LATEST is the keep-th
    for v in older:
        if v not in kept:
            store.delete_dir(version_rel(v))


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
