"""Model directories: Arrow slices of each table, versions, the manifest and the atomic commit.

    MODEL/config.json                 resolved config
    MODEL/docs.arrow, vocab.arrow     the corpus's key tables (row id → user key / URL), so a model
                                      stands alone once trained
    MODEL/LATEST                      "vN", moved only after vN is whole
    MODEL/checkpoints/vN/manifest.json
    MODEL/checkpoints/vN/{docs,words,words_out}/part-SSSSS-of-TTTTT.arrow   columns id, vector

Every file is written under a temporary name and renamed; the manifest is written after all parts
and LATEST after the manifest, so LATEST never points at a partial version. Only Arrow and JSON are
ever read back: nothing here unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time

import numpy as np
import pyarrow as pa

from .config import save_json
from .errors import UserError

FORMAT_VERSION = 1
TABLES = ("docs", "words", "words_out")
_VERSION_RE = re.compile(r"^v(\d+)$")


KEY_FILES = ("docs.arrow", "vocab.arrow")


def refuse_existing_model(out: str, overwrite: bool) -> None:
    """A model directory is only replaced when asked: its checkpoints may be days of training."""
    if not overwrite and (os.path.exists(os.path.join(out, "LATEST"))
                          or os.path.exists(os.path.join(out, "checkpoints"))):
        raise UserError(f"{out}: a model already exists there; choose another --out or pass --overwrite")


def start_model_dir(out: str, corpus_path: str, overwrite: bool) -> None:
    """Create (or, with overwrite, replace) a model directory holding the corpus's key tables,
    so export and neighbors later need only the model directory."""
    refuse_existing_model(out, overwrite)
    if os.path.exists(os.path.join(out, "LATEST")) or os.path.exists(os.path.join(out, "checkpoints")):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    for name in KEY_FILES:
        shutil.copyfile(os.path.join(corpus_path, name), os.path.join(out, name))


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.arrow"


def version_dir(model: str, version: int) -> str:
    return os.path.join(model, "checkpoints", f"v{version}")


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


def write_slice(model: str, version: int, table: str, shard: int, num_shards: int,
                ids: np.ndarray, matrix: np.ndarray, state: np.ndarray | None = None,
                rows_per_batch: int = 65536) -> dict:
    """Write one shard's slice of a table as an Arrow file; returns its manifest entry.

    state [n, 1], if given and not empty, is the rows' optimiser state (row-wise Adagrad's
    accumulator), written as the column `adagrad` beside the vectors.
    """
    rel = os.path.join(table, part_name(shard, num_shards))
    path = os.path.join(version_dir(model, version), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    fields = [("id", pa.int64()), ("vector", pa.list_(pa.float32(), matrix.shape[1]))]
    with_state = state is not None and state.shape[1] > 0
    if with_state:
        fields.append(("adagrad", pa.float32()))
    schema = pa.schema(fields)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for start in range(0, max(len(ids), 1), rows_per_batch):
                end = min(start + rows_per_batch, len(ids))
                columns = [pa.array(ids[start:end], pa.int64()), vectors_array(matrix[start:end])]
                if with_state:
                    columns.append(pa.array(np.ascontiguousarray(state[start:end, 0], dtype=np.float32)))
                writer.write_batch(pa.record_batch(columns, schema=schema))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return {"path": rel, "rows": len(ids), "sha256": _sha256(path)}


def next_version(model: str) -> int:
    root = os.path.join(model, "checkpoints")
    found = [int(m.group(1)) for d in (os.listdir(root) if os.path.isdir(root) else [])
             if (m := _VERSION_RE.match(d))]
    return max(found, default=0) + 1


def commit(model: str, version: int, tables: dict[str, list[dict]], dims: dict[str, int],
           extra: dict, keep: int) -> str:
    """Write the manifest of a version whose parts are all written, then point LATEST at it."""
    for parts in tables.values():
        parts.sort(key=lambda p: p["path"])
    manifest = {
        "format_version": FORMAT_VERSION,
        "version": version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": {name: {"rows": sum(p["rows"] for p in parts), "dim": dims[name], "dtype": "float32",
                          "parts": parts} for name, parts in tables.items()},
        **extra,
    }
    save_json(os.path.join(version_dir(model, version), "manifest.json"), manifest)
    tmp = os.path.join(model, f"LATEST.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(f"v{version}\n")
    os.replace(tmp, os.path.join(model, "LATEST"))
    _prune(model, keep)
    return version_dir(model, version)


def _prune(model: str, keep: int) -> None:
    """Delete the oldest versions beyond `keep`; called only after a newer version is committed."""
    root = os.path.join(model, "checkpoints")
    versions = sorted(int(m.group(1)) for d in os.listdir(root) if (m := _VERSION_RE.match(d)))
    for v in versions[:-keep]:
        shutil.rmtree(version_dir(model, v), ignore_errors=True)


def load_manifest(model: str) -> tuple[str, dict]:
    """The directory and validated manifest of the version LATEST points at."""
    latest = os.path.join(model, "LATEST")
    if not os.path.exists(latest):
        raise UserError(f"{model}: not a trained model (no LATEST file)")
    with open(latest) as fh:
        name = fh.read().strip()
    m = _VERSION_RE.match(name)
    if not m:
        raise UserError(f"{latest}: expected a version like v3, found {name[:40]!r}")
    vdir = version_dir(model, int(m.group(1)))
    path = os.path.join(vdir, "manifest.json")
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: unreadable manifest ({exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION or not isinstance(manifest.get("tables"), dict):
        raise UserError(f"{path}: unsupported or malformed manifest")
    for table, spec in manifest["tables"].items():
        if table not in TABLES:
            raise UserError(f"{path}: unknown table {table!r}")
        for part in spec["parts"]:
            # parts must stay inside the version directory
            if os.path.isabs(part["path"]) or ".." in part["path"].split(os.sep):
                raise UserError(f"{path}: part path {part['path']!r} escapes the model directory")
    return vdir, manifest


def table_spec(model: str, table: str) -> tuple[str, dict]:
    vdir, manifest = load_manifest(model)
    if table not in manifest["tables"]:
        have = ", ".join(sorted(manifest["tables"]))
        raise UserError(f"{model}: table {table!r} was not trained in this model (it has: {have})")
    return vdir, manifest["tables"][table]


def iter_parts(model: str, table: str, verify: bool = True):
    """Yield (ids int64[n], vectors float32[n, dim]) for each part file of a table, memory-mapped."""
    vdir, spec = table_spec(model, table)
    for part in spec["parts"]:
        path = os.path.join(vdir, part["path"])
        if not os.path.isfile(path):
            raise UserError(f"{path}: part file missing; the checkpoint is damaged")
        if verify and _sha256(path) != part["sha256"]:
            raise UserError(f"{path}: checksum mismatch; the checkpoint is damaged")
        with pa.memory_map(path) as source:
            data = pa.ipc.open_file(source).read_all()
        if data.num_rows != part["rows"]:
            raise UserError(f"{path}: {data.num_rows} rows, manifest says {part['rows']}")
        yield data.column("id").to_numpy(), matrix_of(data.column("vector"), spec["dim"])


def read_table(model: str, table: str, verify: bool = True) -> np.ndarray:
    """The whole table as one [rows, dim] float32 matrix, row i = id i."""
    _, spec = table_spec(model, table)
    matrix = np.empty((spec["rows"], spec["dim"]), dtype=np.float32)
    for ids, vectors in iter_parts(model, table, verify=verify):
        matrix[ids] = vectors
    return matrix
