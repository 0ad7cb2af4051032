"""forget: erase users from a model and from every corpus, held-out file, export and index named with it.

Changes when what forgetting a user removes, or how, changes; the forget list itself (salted hashes,
and who reads it) is forgotten.py's, closing up a corpus's ids compact.py's.

    doc2vec-dist forget --model M (--keys FILE | --key K …) [--corpus C] [--exports DIR] [--index I]
                        [--retrain-epochs N [--retrain-out DIR]]

What each place loses:
  model    a new version without the users' rows (the docs table's ids closed up in order, as
           compact.py closes up a corpus's; the words tables copied byte for byte), committed, then
           every other version deleted: the older ones hold the users, and keeping them would undo the
           erasure. docs.arrow loses their keys; config.json and eval-*.json any value that is one of
           them; MODEL/forget.arrow gains their salted hashes. MODEL/exports, when there, as --exports.
  corpus   shards, docs.arrow, vocab.arrow (counts of what stays), changed.arrow without them, ids closed
           up the same way (so the model and its corpus still agree, and tomorrow's refresh joins), its
           corpus.json's examples without their keys, and its forget.arrow gains the hashes; the
           held-out file it names (corpus.json's holdout_out) loses their pairs.
  exports  every (key, vector) Parquet file or directory, held-out or neighbours Parquet, npy matrix
           with its keys, word2vec text and JSON report (jobs/train.py's job.json) under DIR loses the
           rows and values that are their keys; an index directory under DIR is treated as --index.
           A rewritten Parquet file's statistics are computed anew over the rows that stay.
  index    flat: the rows removed (ids after them move down, as `index --update` does); ivfpq: removed
           from their lists, their keys null and their re-rank vectors zero; hnsw: their keys null
           (dead ids, kept out of results) and their vectors in the graph zero.

Nothing is changed before everything is checked: the model and each named place is read, and every
file that would change is probed for writing; one that cannot be (a read-only export) is refused in one
line naming it. Then the changes run, each file replaced whole (a temporary name, then a rename), and
each file changed or removed is printed. Every step is keyed by the keys alone, so a forget that stops
midway (a crash, a full disk) is finished by running the same command again: what it did already holds
none of the keys and is left alone; a new model version that committed before its key file moved
(MODEL/docs.arrow.forget-pending, recorded by sha256 in the version's manifest) is finished first.

A key not in the model is reported, not an error (the person may never have been there), and its hash
joins the forget list all the same, so a later refresh never brings them in; keys of which none is in
the model are a warning (the wrong model?). The model's URL rows still carry what the forgotten users
taught them: docs/forget.md says so; --retrain-epochs N dilutes it (retrain: N epochs from the new
version on the corpus without them, into a new model, every other vector left as forget wrote it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import checkpoint, compact, forgotten, modeldir, outputs, provenance, storage
from .corpus import Corpus
from .errors import UserError
from .modeldir import ModelDir

log = logging.getLogger(__name__)

PENDING_KEYS = "docs.arrow.forget-pending"   # a new version's key file, until it replaces docs.arrow
JOURNAL = ".forget-journal.json"             # files replaced together (an npy matrix and its keys)
PENDING = ".forget-pending"                  # suffix of a file waiting in a journal
SHOWN_UNKNOWN = 3                            # positions of unknown keys named in the report


# ---------------------------------------------------------------------------------------------------
# the keys asked for
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Keys:
    """The keys to forget, each once, in the order given, with where each was given (for messages that
    must not repeat a key: "line 3 of FILE")."""

    values: list[str]
    where: list[str]


def read_keys(path: str | None, given: list[str] | None, doc_col: str | None = None) -> Keys:
    """--keys FILE (a text file, a key per line, or Parquet with a 'key' column, or the corpus's user
    column) and --key K…, stripped of surrounding whitespace as prepare strips keys; one line for a file
    that cannot be read or holds none."""
    values, where = [], []
    if path is not None:
        if not os.path.isfile(path):
            raise UserError(f"{path}: {'is a directory' if os.path.isdir(path) else 'no such file'}; --keys takes a "
                            "file of keys (one per line, or Parquet with a 'key' column)")
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":
            try:
                schema = pq.read_schema(path)
                column = next((c for c in ("key", doc_col) if c and c in schema.names), None)
                if column is None:
                    raise UserError(f"{path}: no 'key' column (columns: {', '.join(schema.names)}); --keys takes "
                                    "Parquet with the keys in a column 'key'")
                found = pq.read_table(path, columns=[column]).column(column).cast(pa.string()).to_pylist()
            except (OSError, pa.ArrowException) as exc:
                raise UserError(f"{path}: cannot read it as Parquet ({exc})") from None
            rows = [(k, f"row {i} of {path}") for i, k in enumerate(found)]
        elif head[:4] == b"ARRO":
            raise UserError(f"{path}: an Arrow file (a forget list?), not keys: --keys takes the keys themselves, a "
                            "text file with one per line or Parquet with a 'key' column")
        else:
            with open(path, "rb") as fh:
                lines = fh.read().split(b"\n")
            rows = []
            for i, raw in enumerate(lines):
                try:
                    rows.append((raw.decode("utf-8"), f"line {i + 1} of {path}"))
                except UnicodeDecodeError:
                    raise UserError(f"{path}: line {i + 1} is not valid UTF-8; give the keys as UTF-8 text") from None
        for key, at in rows:
            if key is not None and key.strip():
                values.append(key.strip())
                where.append(at)
        if not values:
            raise UserError(f"{path}: holds no keys; give one key per line")
    for key in given or []:
        if not key.strip():
            raise UserError("--key '': a key is not empty")
        values.append(key.strip())
        where.append(f"--key {key.strip()}")
    if not values:
        raise UserError("give the keys to forget: --keys FILE or --key K")
    first = {}
    for key, at in zip(values, where, strict=True):
        first.setdefault(key, at)
    return Keys(list(first), list(first.values()))


# ---------------------------------------------------------------------------------------------------
# steps: what changes, checked before any runs
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Step:
    """One change: the paths it writes or removes (each probed for writing first), and the work."""

    what: str
    writes: list[str]
    run: Callable[[], list[str]]  # returns the paths it changed


def _probe(step: Step) -> None:
    """Each path a step writes, and the directory it is replaced in, probed for writing (outputs.check_writable)."""
    for path in step.writes:
        try:
            outputs.check_writable(path)
            if os.path.isdir(path):
                outputs.check_writable(path, inside=True)
        except UserError as exc:
            reason = str(exc).split(": ", 1)[-1] if str(exc).startswith("cannot write to ") else str(exc)
            raise UserError(f"{path}: forget cannot change it ({reason}), so it changed nothing; make it writable "
                            f"(or move it out of what forget is given) and run forget again") from None


def _lineage_check(recorded: dict | None, manifest: dict, model: str, what: str) -> None:
    """Refuse vectors or an index made from a model of another lineage (neither this model, an ancestor
    nor a descendant): its keys are another population's."""
    if not recorded or not recorded.get("model_id") or not manifest.get("model_id"):
        return
    ours = forgotten.lineage_of(manifest)
    if recorded["model_id"] in ours or manifest["model_id"] in (recorded.get("derived_from") or []):
        return
    raise UserError(f"{what} was made from {provenance.describe(recorded)}, another model than {model} (id "
                    f"{manifest['model_id'][:8]}): forget each model with its own exports and index")


def _with_version(recorded: dict | None, manifest: dict, before: int, after: int) -> dict | None:
    """A recorded source that named this model's version `before` (or the version a forget before replaced
    with it) names `after`, the version forget writes: the same vectors for everyone who stays."""
    replaced = {before, (manifest.get("forget") or {}).get("from_version")}
    if recorded and recorded.get("model_id") == manifest.get("model_id") and recorded.get("version") in replaced:
        return {**recorded, "version": after}
    return recorded


# ---------------------------------------------------------------------------------------------------
# files: Parquet, npy, word2vec, JSON
# ---------------------------------------------------------------------------------------------------

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


def _json_step(path: str, drop: set[str]) -> Step | None:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(storage.MAX_JSON_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    cleaned, changed = scrub(data, drop)
    if not changed:
        return None

    def run() -> list[str]:
        storage.write_local(path, json.dumps(cleaned, indent=2) + "\n")
        return [path]

    return Step(f"{path}: values that are forgotten keys", [path], run)


# ---------------------------------------------------------------------------------------------------
# an index
# ---------------------------------------------------------------------------------------------------

def _index_step(path: str, drop: pa.Array, manifest: dict, model: str, before: int, after: int) -> Step | None:
    from .index import read_index_params
    from .index import read_keys as index_keys

    params = read_index_params(path)
    _lineage_check(params.get("provenance"), manifest, model, f"the index {path}")
    keys = index_keys(os.path.join(path, "keys.parquet"))
    gone = _rows_to_drop(pa.table({"key": keys}), ["key"], drop)
    if not gone.any():
        return None
    outputs.check_dir(path, "index", None)  # replaced whole: only an index of ours, judged now, not midway

    def run() -> list[str]:
        _forget_in_index(path, params, keys, gone, manifest, before, after)
        return [os.path.join(path, name) for name in sorted(os.listdir(path)) if name != outputs.MARKER]

    return Step(f"the index {path}", [path], run)


def _forget_in_index(path: str, params: dict, keys: pa.Array, gone: np.ndarray, manifest: dict, before: int,
                     after: int) -> None:
    import faiss

    from .export import open_npy
    from .index import KEY_SCHEMA

    kind = params["kind"]
    index = faiss.read_index(os.path.join(path, "index.faiss"))
    ids = np.flatnonzero(gone).astype(np.int64)
    with outputs.replacing(path, "index") as staged:
        if kind == "flat":
            index.remove_ids(ids)  # later ids move down; keys.parquet loses the same rows
            keys = keys.filter(pa.array(~gone))
        else:
            keys = pc.if_else(pa.array(gone), pa.scalar(None, pa.string()), keys)
            if kind == "ivfpq":
                index.remove_ids(ids)
                old = open_npy(os.path.join(path, "vectors.npy"))
                fresh = np.lib.format.open_memmap(os.path.join(staged.path, "vectors.npy"), mode="w+",
                                                  dtype=old.dtype, shape=old.shape)
                for start in range(0, len(old), 1 << 18):
                    chunk = np.array(old[start:start + (1 << 18)])
                    chunk[gone[start:start + (1 << 18)]] = 0.0
                    fresh[start:start + len(chunk)] = chunk
                fresh.flush()
                del fresh, old
            else:  # hnsw: a node cannot leave the graph; its stored vector becomes zero, its id dead
                storage_index = faiss.downcast_index(index.storage)
                codes = faiss.vector_to_array(storage_index.codes).view(np.float32).reshape(index.ntotal, -1)
                codes[ids] = 0.0
                faiss.copy_array_to_vector(codes.view(np.uint8).ravel(), storage_index.codes)
        faiss.write_index(index, os.path.join(staged.path, "index.faiss"))
        pq.write_table(pa.Table.from_arrays([keys], schema=KEY_SCHEMA), os.path.join(staged.path, "keys.parquet"))
        updated = {**params, "rows": len(keys) - keys.null_count, "ids": len(keys), "dead": keys.null_count,
                   "provenance": _with_version(params.get("provenance"), manifest, before, after),
                   "forget": {"removed": int(gone.sum()), "from_version": before, "to_version": after}}
        with open(os.path.join(staged.path, "params.json"), "w") as fh:
            json.dump(updated, fh, indent=2)


# ---------------------------------------------------------------------------------------------------
# an exports directory
# ---------------------------------------------------------------------------------------------------

def _is_index(directory: str) -> bool:
    return all(os.path.isfile(os.path.join(directory, n)) for n in ("index.faiss", "keys.parquet", "params.json"))


# the JSON reports our jobs write beside their outputs (jobs/train.py's job.json, jobs/refresh.py's refresh.json)
REPORTS = ("job.json", "refresh.json")


def _in_export(directory: str) -> bool:
    """A directory export wrote (part files, or an npy matrix with its keys): its marker says so."""
    marker = os.path.join(directory, outputs.MARKER)
    if not os.path.isfile(marker):
        return False
    with open(marker, "rb") as fh:
        return outputs.read_marker_kind(fh.read(4096)) == "export"


def _ours_npy(matrix: str) -> bool:
    """An npy matrix export wrote: DIR/vectors.npy of an export directory, or X.npy beside its marked X.keys.parquet."""
    if os.path.basename(matrix) == "vectors.npy" and _in_export(os.path.dirname(matrix)):
        return True
    return outputs.file_kind(matrix) == "npy"


def _exports_steps(root: str, drop: pa.Array, manifest: dict, model: str, before: int, after: int,
                   left: list[str]) -> list[Step]:
    """The steps for everything under an exports directory; files forget cannot read as one of ours go to `left`."""
    steps: list[Step] = []
    drop_set = set(drop.to_pylist())

    def source(recorded):
        return _with_version(recorded, manifest, before, after)

    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        if _is_index(directory):
            step = _index_step(directory, drop, manifest, model, before, after)
            steps += [step] if step else []
            subdirs.clear()
            continue
        _recover(directory)
        names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
        paired = set()
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".npy") and (keys_path := _npy_keys(path)) and _ours_npy(path):
                paired.add(keys_path)
                _lineage_check(provenance.of_parquet(keys_path), manifest, model, keys_path)
                if _parquet_holds(keys_path, drop):
                    steps.append(Step(f"{path} and {keys_path}", [path, keys_path],
                                      lambda p=path, k=keys_path: _rewrite_npy(p, k, drop, source)))
        for name in names:
            path = os.path.join(directory, name)
            if path in paired or name == outputs.MARKER or name.endswith(".npy"):
                if name.endswith(".npy") and not (_npy_keys(path) and _ours_npy(path)):
                    left.append(path)
                continue
            kind = outputs.file_kind(path)
            if name.endswith(".parquet") and (kind or _in_export(directory)):
                _lineage_check(provenance.of_parquet(path), manifest, model, path)
                if _parquet_holds(path, drop):
                    steps.append(Step(path, [path], lambda p=path: (_rewrite_parquet(p, drop, source), [p])[1]))
            elif name.endswith(".json") and (kind or name in REPORTS):
                step = _json_step(path, drop_set)
                steps += [step] if step else []
            elif kind == "word2vec":
                if _word2vec_holds(path, drop_set):
                    steps.append(Step(path, [path], lambda p=path: (_rewrite_word2vec(p, drop_set), [p])[1]))
            else:
                left.append(path)
    return steps


# ---------------------------------------------------------------------------------------------------
# a corpus
# ---------------------------------------------------------------------------------------------------

def _corpus_steps(path: str, drop: pa.Array, listed: forgotten.ForgetList) -> list[Step]:
    corpus = Corpus(path)
    keys = corpus.docs().column("key").combine_chunks()
    ids = np.flatnonzero(_rows_to_drop(pa.table({"key": keys}), ["key"], drop)).astype(np.int64)
    drop_set = set(drop.to_pylist())
    meta, scrubbed = scrub(corpus.meta, drop_set)
    theirs = forgotten.of_corpus(path)
    merged = theirs.merge(listed)
    steps: list[Step] = []
    if len(ids):
        outputs.check_dir(path, "corpus", None)  # replaced whole: only a corpus of ours, judged now, not midway

        def rewrite() -> list[str]:
            with outputs.replacing(path, "corpus") as staged:
                counts = compact.compact_corpus(path, staged.path, ids)
                for name in (compact.DROPPED_FILE,):
                    if os.path.exists(os.path.join(path, name)):
                        shutil.copyfile(os.path.join(path, name), os.path.join(staged.path, name))
                merged.write(os.path.join(staged.path, forgotten.FILE))
                new_meta = {**meta, **{k: counts[k] for k in ("num_docs", "num_tokens", "vocab_size", "shards")},
                            "num_shards": len(counts["shards"]),
                            "forgotten_users": int(meta.get("forgotten_users") or 0) + len(ids)}
                with open(os.path.join(staged.path, "corpus.json"), "w") as fh:
                    json.dump(new_meta, fh, indent=2)
                    fh.write("\n")
                written = sorted(os.path.join(path, os.path.relpath(os.path.join(d, n), staged.path))
                                 for d, _, files in os.walk(staged.path) for n in files)
            return written

        steps.append(Step(f"the corpus {path} ({len(ids):,} users)", [path], rewrite))
    else:
        if len(merged) != len(theirs):
            def write_list() -> list[str]:
                merged.write(os.path.join(path, forgotten.FILE))
                return [os.path.join(path, forgotten.FILE)]
            steps.append(Step(f"{path}/{forgotten.FILE}", [os.path.join(path, forgotten.FILE)], write_list))
        if scrubbed:
            def write_meta() -> list[str]:
                storage.write_local(os.path.join(path, "corpus.json"), json.dumps(meta, indent=2) + "\n")
                return [os.path.join(path, "corpus.json")]
            steps.append(Step(f"{path}/corpus.json", [os.path.join(path, "corpus.json")], write_meta))
    heldout = corpus.meta.get("holdout_out")
    if heldout and os.path.isfile(heldout) and _parquet_holds(heldout, drop):
        steps.append(Step(heldout, [heldout], lambda: (_rewrite_parquet(heldout, drop), [heldout])[1]))
    elif heldout and not os.path.isfile(heldout):
        log.warning(f"warning: {heldout}: the held-out file {path}/corpus.json names is not there: if it was moved, "
                    "run forget on it too (as part of --exports)")
    return steps


# ---------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------

def _finish_pending(model: str) -> list[str]:
    """A version forget committed before its key file moved into place: move it now. A pending key file that
    no committed version names (a forget stopped before its commit) is removed."""
    pending = os.path.join(model, PENDING_KEYS)
    if not os.path.exists(pending):
        return []
    wanted = (ModelDir(model).manifest.get("forget") or {}).get("keys_sha256")
    if wanted and wanted == storage.sha256_file(pending):
        os.replace(pending, os.path.join(model, "docs.arrow"))
        return [os.path.join(model, "docs.arrow")]
    os.remove(pending)
    return []


# manifest fields a version forget writes takes from the one it rewrites (the trainers' record of the run)
_CARRIED = ("epoch", "lr", "num_ps", "num_workers", "plan", "config", "corpus", "corpus_stats", "losses", "trainer")


def _write_version_without(model: str, found: ModelDir, ids: np.ndarray) -> list[str]:
    """A new version of the model without the docs rows `ids` (sorted), and its key file; then
    every other version deleted. Returns the files changed and removed."""
    version = checkpoint.next_version(model)
    vrel = os.path.join(model, "checkpoints", f"v{version}")
    tables, changed = {}, []
    pending = os.path.join(model, PENDING_KEYS)
    try:
        for table, spec in found.manifest["tables"].items():
            os.makedirs(os.path.join(vrel, table), exist_ok=True)
            if table != "docs":  # the URL tables keep every row: the same bytes
                for part in spec["parts"]:
                    shutil.copyfile(os.path.join(modeldir.version_dir(model, found.version), part["path"]),
                                    os.path.join(vrel, part["path"]))
                tables[table] = [dict(part) for part in spec["parts"]]
                continue
            tables[table] = _docs_parts(found, spec, ids, vrel)
        docs = pa.ipc.open_file(pa.memory_map(os.path.join(model, "docs.arrow"))).read_all()
        stays = np.ones(docs.num_rows, bool)
        stays[ids] = False
        kept = docs.filter(pa.array(stays))
        kept = kept.set_column(kept.schema.get_field_index("id"), "id",
                               pa.array(np.arange(kept.num_rows, dtype=np.int64)))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, docs.schema) as writer:
            writer.write_table(kept, max_chunksize=1 << 20)
        storage.write_local(pending, sink.getvalue().to_pybytes())
        stats = dict(found.manifest.get("corpus_stats") or {})
        if "num_docs" in stats:
            stats["num_docs"] = int(stats["num_docs"]) - len(ids)
        extra = {k: found.manifest[k] for k in _CARRIED if found.manifest.get(k) is not None}
        extra.update(corpus_stats=stats, positions=None,
                     forget={"from_version": found.version, "users_removed": len(ids),
                             "keys_sha256": storage.sha256_file(pending)})
        dims = {name: spec["dim"] for name, spec in found.manifest["tables"].items()}
        dtype = found.manifest["tables"]["docs"].get("dtype", "float32")
        checkpoint.commit(model, version, tables, dims, extra, keep=1, dtype=dtype)  # keep=1: the rest are pruned
    except BaseException:
        if modeldir.latest_version(model) != version:  # not committed: nothing of it stays
            checkpoint.discard_version(model, version)
            with contextlib.suppress(OSError):
                os.remove(pending)
        raise  # committed (a failure while pruning): the key file waits for the next run (_finish_pending)
    os.replace(pending, os.path.join(model, "docs.arrow"))
    changed += [os.path.join(vrel, "manifest.json"), *(os.path.join(vrel, p["path"]) for t in tables.values()
                                                         for p in t), os.path.join(model, "LATEST"),
                os.path.join(model, "docs.arrow")]
    return changed


def _docs_parts(found: ModelDir, spec: dict, ids: np.ndarray, vrel: str) -> list[dict]:
    """The docs table without rows `ids`, the others closed up, in as many parts as before (row r in part
    r % T), each row's bytes as they were."""
    total = len(spec["parts"])
    paths = [os.path.join(vrel, "docs", modeldir.part_name(t, total)) for t in range(total)]
    writers, sinks, pending, rows = [None] * total, [None] * total, [[] for _ in range(total)], [0] * total
    schema = None

    def flush(t: int, force: bool = False) -> None:
        held = sum(b.num_rows for b in pending[t])
        if pending[t] and (force or held >= 65536):
            writers[t].write_table(pa.Table.from_batches(pending[t], schema).combine_chunks(), max_chunksize=65536)
            pending[t] = []

    try:
        for part in range(total):
            for batch in found.record_batches("docs", part):
                if schema is None:
                    schema = batch.schema
                    for t in range(total):
                        sinks[t] = pa.OSFile(paths[t], "wb")
                        writers[t] = pa.ipc.new_file(sinks[t], schema)
                column = batch.schema.get_field_index("id")
                new = compact.new_ids(batch.column(column).to_numpy(), ids)
                stays = new >= 0
                batch = batch.filter(pa.array(stays)).set_column(column, "id", pa.array(new[stays], pa.int64()))
                new = new[stays]
                for t in range(total):
                    mine = np.flatnonzero(new % total == t)
                    if len(mine):
                        pending[t].append(batch.take(pa.array(mine)))
                        rows[t] += len(mine)
                        flush(t)
        for t in range(total):
            if writers[t] is not None:
                flush(t, force=True)
                writers[t].close()
                sinks[t].close()
    except BaseException:
        for sink in sinks:
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink.close()
        raise
    return [{"path": f"docs/{modeldir.part_name(t, total)}", "rows": rows[t], "bytes": os.path.getsize(paths[t]),
             "sha256": storage.sha256_file(paths[t])} for t in range(total)]


def _other_versions(model: str, latest: int) -> list[str]:
    """Every version directory but LATEST's: what a model forget rewrote holds in its older versions."""
    root = os.path.join(model, "checkpoints")
    return sorted(os.path.join(root, n) for n in os.listdir(root) if n != f"v{latest}" and n.startswith("v")
                  and n[1:].isdigit())


# ---------------------------------------------------------------------------------------------------
# forget
# ---------------------------------------------------------------------------------------------------

def forget(model: str, keys: Keys, corpus: str | None = None, exports: str | None = None, index: str | None = None,
           say: Callable[[str], None] = print) -> dict:
    """Erase the users `keys` from the model and the corpus, exports and index given (see the module
    docstring); `say` gets a line for each file changed or removed. Returns what was done, counted."""
    if storage.is_uri(model):
        raise UserError(f"{model}: forget works on a local model directory (its versions are rewritten in place); "
                        "run it where the model's storage is mounted")
    model = os.path.abspath(model)
    found = ModelDir(model)  # not a model: one line naming it
    checkpoint.refuse_other_writer(model)
    for given, flag in ((corpus, "--corpus"), (exports, "--exports"), (index, "--index")):
        if given is not None and not os.path.isdir(given):
            raise UserError(f"{given}: {'no such directory' if not os.path.exists(given) else 'not a directory'}; "
                            f"{flag} takes a directory")
    drop = pa.array(keys.values, pa.string())
    with checkpoint.writing(model):
        for path in _finish_pending(model):
            say(f"changed {path}")
        found = ModelDir(model)
        if found.key_count("docs") != found.spec("docs")["rows"]:
            raise UserError(f"{model}: docs.arrow holds {found.key_count('docs'):,} keys and its v{found.version} "
                            f"{found.spec('docs')['rows']:,} user rows; the model is damaged (a key file replaced by "
                            "hand?), so forget cannot tell whose row is whose")
        before = found.version
        listed = forgotten.of_model(model, found.manifest)
        model_keys = found.keys("docs")
        at = pc.index_in(drop, value_set=model_keys)
        in_model = at.is_valid().to_numpy(zero_copy_only=False)
        ids = np.sort(at.filter(pa.array(in_model)).to_numpy().astype(np.int64))
        absent = np.flatnonzero(~in_model)
        already = listed.matches(drop.take(pa.array(absent))) if len(absent) else np.zeros(0, bool)
        after = checkpoint.next_version(model) if len(ids) else before
        new_list = forgotten.ForgetList(listed.hashes, listed.salt, list(listed.model_ids), listed.path)
        added = new_list.add(keys.values)
        if found.manifest.get("model_id") and found.manifest["model_id"] not in new_list.model_ids:
            new_list.model_ids.append(found.manifest["model_id"])
        steps: list[Step] = []
        if added or not os.path.exists(os.path.join(model, forgotten.FILE)):
            def write_list() -> list[str]:
                new_list.write(os.path.join(model, forgotten.FILE))
                return [os.path.join(model, forgotten.FILE)]
            steps.append(Step("the model's forget list", [os.path.join(model, forgotten.FILE)], write_list))
        if corpus is not None:
            steps += _corpus_steps(os.path.abspath(corpus), drop, new_list)
        left: list[str] = []
        for root in dict.fromkeys(os.path.abspath(r) for r in (exports, os.path.join(model, "exports")) if r):
            if os.path.isdir(root):
                steps += _exports_steps(os.path.abspath(root), drop, found.manifest, model, before, after, left)
        if index is not None:
            if not _is_index(index):
                from .index import read_index_params

                read_index_params(index)  # names what is there
            step = _index_step(os.path.abspath(index), drop, found.manifest, model, before, after)
            steps += [step] if step else []
        for name in sorted(os.listdir(model)):
            if name == "config.json" or (name.startswith("eval-") and name.endswith(".json")):
                step = _json_step(os.path.join(model, name), set(keys.values))
                steps += [step] if step else []
        older = _other_versions(model, before)
        if len(ids):
            steps.append(Step(f"the model {model} ({len(ids):,} users)", [os.path.join(model, "checkpoints"),
                                                                          os.path.join(model, "docs.arrow")],
                              lambda: _write_version_without(model, found, ids) + older))
        elif older and found.manifest.get("forget"):  # a forget stopped before pruning the versions it replaced
            def prune() -> list[str]:
                for path in older:
                    shutil.rmtree(path)
                return older
            steps.append(Step(f"older versions of {model}", [os.path.join(model, "checkpoints")], prune))
        steps = list({step.what: step for step in steps}.values())  # an index both under --exports and --index once
        for step in steps:  # every file that would change, probed before any changes
            _probe(step)
        changed = []
        for step in steps:
            for path in step.run():
                changed.append(path)
                say(f"{'removed' if not os.path.exists(path) else 'changed'} {path}")
    if left:
        log.warning(f"warning: {len(left)} file(s) under the exports are not files doc2vec-dist writes and were not "
                    f"looked at: {', '.join(left[:3])}" + (f" and {len(left) - 3} more" if len(left) > 3 else ""))
    unknown = absent[~already] if len(absent) else absent
    return {"model": model, "keys": len(keys.values), "removed": len(ids), "from_version": before,
            "to_version": after, "already_forgotten": int(already.sum()), "not_in_model": len(unknown),
            "not_in_model_where": [keys.where[i] for i in unknown[:SHOWN_UNKNOWN]], "changed": changed,
            "corpus": corpus}


def check_retrain(model: str, corpus: str | None, epochs: int | None, out: str | None) -> str | None:
    """Where `--retrain-epochs` writes (None: no retrain), refused in one line before anything is forgotten:
    it needs the model's --corpus (forgotten in the same run, so the two agree), N ≥ 1, and a new or empty
    --retrain-out (default MODEL-retrained, beside the model; a model there is never replaced)."""
    if epochs is None:
        if out is not None:
            raise UserError("--retrain-out is where --retrain-epochs N writes; give --retrain-epochs too")
        return None
    if epochs < 1:
        raise UserError(f"--retrain-epochs must be ≥ 1, not {epochs}")
    if corpus is None:
        raise UserError("--retrain-epochs trains on the model's corpus without the users: give it with --corpus, "
                        "which forget erases them from first")
    out = os.path.abspath(out if out is not None else os.path.abspath(model).rstrip(os.sep) + "-retrained")
    if out == os.path.abspath(model):
        raise UserError(f"{out}: --retrain-out is the model itself; the retrained model is a new one beside it")
    checkpoint.refuse_existing_model(out, overwrite=False)  # a model there: one line, before anything changes
    return out


def retrain(model: str, corpus: str, out: str, epochs: int, progress: bool = True) -> dict:
    """Train `epochs` epochs from the model's latest version (without the forgotten users) on the corpus
    without them, into the new model `out`: train --init-from the model, with its own settings. Every URL
    row then moves by what the remaining users alone teach, diluting what the forgotten ones taught
    (docs/forget.md); the new model takes the corpus's forget list."""
    from .trainer import train

    config = dataclasses.replace(ModelDir(model).config(), epochs=epochs, init_from=model, resume=False,
                                 resume_from=None, first_epoch="all", progress=progress)
    return train(corpus, out, config.validate())


def report(result: dict, say: Callable[[str], None] = print) -> None:
    """The summary after the changed files: what was forgotten, what was not found, and the URL rows' note."""
    model, n = result["model"], result["keys"]
    if result["removed"]:
        say(f"forgot {result['removed']:,} of {n:,} key(s) in {model}: v{result['from_version']} → "
            f"v{result['to_version']}, the only version kept")
    if result["already_forgotten"]:
        say(f"{result['already_forgotten']:,} key(s) were forgotten before (on the model's forget list); what still "
            "held them is above")
    missing = result["not_in_model"]
    if missing:
        where = ", ".join(result["not_in_model_where"]) + (" …" if missing > SHOWN_UNKNOWN else "")
        say(f"{missing:,} key(s) are not in the model ({where}): never there, perhaps; their hashes join the forget "
            "list all the same, so no refresh brings them in")
        if missing == n:
            log.warning(f"warning: none of the {n:,} key(s) is in {model}: is it the model of these users (the same "
                        "user column and id scheme)?")
    if not result["corpus"]:
        log.warning(f"warning: no --corpus: the corpus {model} was trained on may still hold these users, and a refresh "
                    "joining through it is refused until it agrees with the model: run forget with --corpus too")
    if result.get("retrained"):
        r = result["retrained"]
        say(f"retrained {r['epochs']} epoch(s) from v{result['to_version']} without them into {r['model']}: its URL "
            "rows diluted of what they taught; export and index that model to serve it")
    else:
        say("the model's URL rows still carry what these users taught them; to dilute that, train on from this "
            "version without them: run forget with --retrain-epochs N (or doc2vec-dist train --corpus CORPUS "
            f"--init-from {model} --out NEW_MODEL --epochs N) (docs/forget.md)")
