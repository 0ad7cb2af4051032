"""Rows leaving a corpus: users (and URLs) dropped, and the ids of those that stay closed up in order.

Changes when how a corpus loses rows changes. Two things drop rows: `forget` (users who asked to be
forgotten, from a corpus it is given) and `prepare --base --expire-days` (users no longer active, and
URLs no kept user visits, from the refreshed corpus); both go through `compact_corpus`.

Why ids are closed up rather than left as holes. A model's tables are dense, row r = id r (a checkpoint
holds every row of 0..rows-1; readers refuse one that lacks a row), and a hole would keep a row, its
key and its server's memory for someone who is gone: the growth `--expire-days` is there to stop. So a
dropped row's id goes, and every later id moves down by the number dropped before it: the order of the
ids that stay is kept, and so is "a known key's row in the new corpus is its row in the base" up to
that shift. The daily refresh's warm start maps the base model's rows through the same shift
(modeldir.read_shard's `dropped`, which warmstart reads from the corpus's dropped.arrow), and index
updates match rows by key. The price: a row that stays may move to another server (row r lives on
server r % S), which costs nothing, since every run loads its rows from the checkpoint anyway.

    CORPUS/dropped.arrow   table string ("docs" | "words"), id int64: the base's rows a refresh dropped
                           (sorted by table, then id); what the warm start needs to map the base model's
                           rows onto the new ids. Absent when none was dropped.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa

from .corpus import CHANGED_SCHEMA, DOCS_SCHEMA, numpy_of, shard_batches, write_shard

DROPPED_FILE = "dropped.arrow"
DROPPED_SCHEMA = pa.schema([("table", pa.string()), ("id", pa.int64())])


def new_ids(ids: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """The id each of `ids` has once the sorted ids `dropped` are gone (later ids move down by the number
    dropped before them), -1 for a dropped one."""
    ids = np.asarray(ids, np.int64)
    if not len(dropped):
        return ids.copy()
    at = np.searchsorted(dropped, ids)
    gone = dropped[np.minimum(at, len(dropped) - 1)] == ids
    return np.where(gone, -1, ids - at)


def old_ids(ids: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """new_ids's inverse: the id each of the kept ids `ids` had before the sorted ids `dropped` went."""
    ids = np.asarray(ids, np.int64)
    if not len(dropped):
        return ids.copy()
    # the k-th dropped id d_k is passed by every kept id at or above d_k - k in the new numbering
    shifted = dropped - np.arange(len(dropped), dtype=np.int64)
    return ids + np.searchsorted(shifted, ids, side="right")


def read_dropped(corpus: str) -> dict[str, np.ndarray]:
    """CORPUS/dropped.arrow as table → sorted ids ({} when there is none)."""
    path = os.path.join(corpus, DROPPED_FILE)
    if not os.path.exists(path):
        return {}
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    tables = np.asarray(table.column("table").to_pylist(), dtype=object)
    ids = numpy_of(table.column("id"))
    return {name: np.sort(ids[tables == name]) for name in ("docs", "words") if (tables == name).any()}


def write_dropped(corpus: str, dropped: dict[str, np.ndarray]) -> None:
    rows = [(name, np.sort(np.asarray(ids, np.int64))) for name, ids in dropped.items() if len(ids)]
    if not rows:
        return
    table = pa.table({"table": pa.array([name for name, ids in rows for _ in ids], pa.string()),
                      "id": pa.array(np.concatenate([ids for _, ids in rows]), pa.int64())}, schema=DROPPED_SCHEMA)
    with pa.OSFile(os.path.join(corpus, DROPPED_FILE), "wb") as sink, pa.ipc.new_file(sink, DROPPED_SCHEMA) as w:
        w.write_table(table)


def latest_times(shard_paths: list[str], num_docs: int) -> np.ndarray:
    """Each document's latest event time (epoch seconds) from the shards' times: -inf for a document with no
    token (in no shard), NaN for one whose tokens carry no time (the corpus keeps none, or they were unknown)."""
    latest = np.full(num_docs, -np.inf)
    for path in shard_paths:
        for doc_ids, offsets, _, times in shard_batches(path):
            lengths = np.diff(offsets)
            has = lengths > 0
            if not has.any():
                continue
            if times is None:
                latest[doc_ids[has]] = np.nan
                continue
            known = np.where(np.isfinite(times), times, -np.inf)
            top = np.maximum.reduceat(known, offsets[:-1][has])
            latest[doc_ids[has]] = np.where(np.isfinite(top), top, np.nan)
    return latest


def _read(path: str) -> pa.Table:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def compact_corpus(src: str, dst: str, drop_docs: np.ndarray, drop_words: np.ndarray | None = None) -> dict:
    """Write the corpus files at `src` into the directory `dst` (which may be `src`: each file is written
    whole and replaces its old self) without the documents `drop_docs` and the words `drop_words` (their
    tokens leave every document), ids closed up in order (new_ids). Rewrites shards/part-*.arrow,
    docs.arrow, vocab.arrow (counts of the tokens that stay) and changed.arrow; corpus.json is the
    caller's (it may not be written yet: prepare compacts its staging directory). Returns the new
    num_docs, num_tokens, vocab_size and shards (corpus.json's entries), and dropped_tokens."""
    shard_paths = sorted(glob.glob(os.path.join(src, "shards", "part-*.arrow")))
    docs, vocab = _read(os.path.join(src, "docs.arrow")), _read(os.path.join(src, "vocab.arrow"))
    changed_path = os.path.join(src, "changed.arrow")
    changed = numpy_of(_read(changed_path).column("doc_id")) if os.path.exists(changed_path) else None
    drop_docs = np.unique(np.asarray(drop_docs, np.int64))
    drop_words = np.unique(np.asarray(drop_words if drop_words is not None else [], np.int64))
    word_map = new_ids(np.arange(vocab.num_rows), drop_words)
    counts = np.zeros(vocab.num_rows - len(drop_words), np.int64)
    lengths = numpy_of(docs.column("length")).astype(np.int64).copy()
    shards, dropped_tokens = [], 0
    os.makedirs(os.path.join(dst, "shards"), exist_ok=True)
    for path in shard_paths:
        ids, sizes, tokens, times = [], [], [], []
        timed = False
        for doc_ids, offsets, toks, tms in shard_batches(path):
            per_doc = np.diff(offsets)
            kept_docs = new_ids(doc_ids, drop_docs)
            keep = (np.repeat(kept_docs, per_doc) >= 0) & (word_map[toks] >= 0)
            dropped_tokens += int(np.count_nonzero(np.repeat(kept_docs, per_doc) >= 0) - np.count_nonzero(keep))
            size = np.bincount(np.repeat(np.arange(len(doc_ids)), per_doc)[keep], minlength=len(doc_ids))
            stays = kept_docs >= 0
            lengths[doc_ids[stays]] = size[stays]
            listed = stays & (size > 0)  # a document left without tokens keeps its row (length 0), in no shard
            ids.append(kept_docs[listed])
            sizes.append(size[listed])
            tokens.append(word_map[toks[keep]].astype(np.int32))
            if tms is not None:
                timed = True
                times.append(tms[keep])
        doc_ids = np.concatenate(ids or [np.zeros(0, np.int64)])
        doc_sizes = np.concatenate(sizes or [np.zeros(0, np.int64)])
        all_tokens = np.concatenate(tokens or [np.zeros(0, np.int32)])
        counts += np.bincount(all_tokens, minlength=len(counts))
        name = os.path.basename(path)
        staging = os.path.join(dst, "shards", f".{name}.compacting")  # write_shard writes STAGING/shards/part-00000.arrow
        entry = write_shard(staging, 0, doc_ids, doc_sizes, all_tokens, np.concatenate(times) if timed else None)
        os.replace(os.path.join(staging, entry["path"]), os.path.join(dst, "shards", name))
        os.rmdir(os.path.join(staging, "shards"))
        os.rmdir(staging)
        shards.append({**entry, "path": os.path.join("shards", name)})
    keep = new_ids(numpy_of(docs.column("id")), drop_docs) >= 0
    kept = docs.filter(pa.array(keep))
    num_docs = kept.num_rows
    _write_ipc(os.path.join(dst, "docs.arrow"), DOCS_SCHEMA, pa.table(
        {"key": kept.column("key"), "id": pa.array(np.arange(num_docs, dtype=np.int64)),
         "length": pa.array(lengths[keep])}, schema=DOCS_SCHEMA))
    stays = word_map >= 0
    vocab_schema = vocab.schema
    _write_ipc(os.path.join(dst, "vocab.arrow"), vocab_schema, pa.table(
        {"token": vocab.column("token").filter(pa.array(stays)), "count": pa.array(counts),
         "id": pa.array(np.arange(len(counts), dtype=np.int32))}, schema=vocab_schema))
    if changed is not None:
        mapped = new_ids(changed, drop_docs)
        _write_ipc(os.path.join(dst, "changed.arrow"), CHANGED_SCHEMA,
                   pa.table({"doc_id": pa.array(mapped[mapped >= 0])}, schema=CHANGED_SCHEMA))
    return {"num_docs": num_docs, "num_tokens": int(counts.sum()), "vocab_size": len(counts),
            "shards": sorted(shards, key=lambda s: s["path"]), "dropped_tokens": dropped_tokens}


def _write_ipc(path: str, schema: pa.Schema, table: pa.Table) -> None:
    """An Arrow file written under a temporary name and renamed over `path`: whole or not at all."""
    tmp = f"{path}.compacting"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    os.replace(tmp, path)
