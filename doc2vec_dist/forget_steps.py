"""What forgetting users changes in each place named with the model, as Steps that are all checked (every file
probed for writing) before any runs: an index (its rows removed, or their ids made dead, by kind), an exports
directory (each kind of file in it), a corpus (shards, docs, vocab, changed, its held-out file, its forget
list).

Changes when what a place loses, or which of its files forget finds, changes; how one file is rewritten is
forget_files.py's, the model's new version and the order of it all forget.py's.
"""

from __future__ import annotations

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

from . import compact, forgotten, outputs, provenance, storage
from .corpus import Corpus
from .errors import UserError
from .forget_files import (
    _npy_keys,
    _parquet_holds,
    _projector_holds,
    _recover,
    _report_holds,
    _rewrite_npy,
    _rewrite_parquet,
    _rewrite_projector,
    _rewrite_word2vec,
    _rows_to_drop,
    _word2vec_holds,
    scrub,
)

log = logging.getLogger(__name__)


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
    from .index_sources import read_keys as index_keys
    from .index_update import read_index_params

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
    from .index_sources import KEY_SCHEMA

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


def _marker_kind(directory: str) -> str | None:
    """The kind a directory's marker names ("export": part files, or an npy matrix with its keys;
    "projector": a projector export); None without one."""
    marker = os.path.join(directory, outputs.MARKER)
    if not os.path.isfile(marker):
        return None
    with open(marker, "rb") as fh:
        return outputs.read_marker_kind(fh.read(4096))


def _ours_npy(matrix: str) -> bool:
    """An npy matrix export wrote: DIR/vectors.npy of an export directory, or X.npy beside its marked X.keys.parquet."""
    if os.path.basename(matrix) == "vectors.npy" and _marker_kind(os.path.dirname(matrix)) == "export":
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
        marked = _marker_kind(directory)  # read once for the directory, not once a file
        if marked == "projector":  # its points' lines dropped from metadata.tsv and tensors.tsv
            if _projector_holds(directory, drop_set):
                steps.append(Step(directory, [os.path.join(directory, n) for n in ("metadata.tsv", "tensors.tsv")],
                                  lambda d=directory: _rewrite_projector(d, drop_set)))
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
            if name.endswith(".parquet") and (kind or marked == "export"):
                _lineage_check(provenance.of_parquet(path), manifest, model, path)
                if _parquet_holds(path, drop):
                    steps.append(Step(path, [path], lambda p=path: (_rewrite_parquet(p, drop, source), [p])[1]))
            elif name.endswith(".json") and (kind or name in REPORTS):
                step = _json_step(path, drop_set)
                steps += [step] if step else []
            elif kind == "word2vec":
                if _word2vec_holds(path, drop_set):
                    steps.append(Step(path, [path], lambda p=path: (_rewrite_word2vec(p, drop_set), [p])[1]))
            elif kind == "report":  # a page of figures and tables: removed where it names one (report makes it again)
                if _report_holds(path, drop_set):
                    steps.append(Step(path, [path], lambda p=path: (os.remove(p), [p])[1]))
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
