"""Updating a faiss index from a refreshed table (update_index, `index --update OLD`), and reading an
index's params.json (read_index_params).

Changes when how an index is updated changes: how keys are matched, what counts as a changed row, how each
kind takes rows out and in. Building an index is index.py's, its sources and tasks index_sources.py's.

Updating an index (update_index, `index --update OLD`) serves a refreshed table without training or
re-encoding what did not move. The new source is staged as a build stages it (normalised rows in a
scratch vectors.npy); its keys are matched to the old keys.parquet, and each old row is compared
with the new row of its key (changed: an element moved by more than CHANGE_TOLERANCE). Keys only in
the new source are added, with ids after the old ones; keys gone from it are removed, so the index
holds what a rebuild from the new source would. In ivfpq and hnsw a removed id stays a dead row:
its key is null in keys.parquet (and its vectors.npy row zero), so every other id keeps its row and
"faiss id i = row i of keys.parquet (= row i of vectors.npy)" still holds.
  ivfpq  nothing is trained again: a changed row is removed from its list (remove_ids: ids are the
         index's own, nothing renumbered) and encoded again under its own id, new rows are encoded
         with theirs; vectors.npy is rewritten with the changed rows' new vectors and the new rows
         after the old ones.
  hnsw   faiss cannot take a node out of an HNSW graph (its remove_ids is not implemented), so a
         changed key gets a new id (a node added at the end) and its old id is dead; dead ids stay
         in the graph as stepping stones and are kept out of results by an IDSelectorBitmap of the
         live ids, passed to every search.
  flat   as hnsw, a changed key's new vector is added at the end; then the dead ids are dropped:
         IndexFlat's remove_ids takes them out and moves every later id down, and keys.parquet
         loses the same rows, so ids stay rows and a flat index has no dead id after an update
         (the price: a key that stays may get a new id).
Recall@10 vs exact is then measured, and the search knob tuned again, as after a build, against the
exact top-10 of the new source's vectors. Dead ids cost memory (hnsw) or disk (ivfpq), and a graph
with many of them is searched less well: past DEAD_SHARE_REBUILD the update says to rebuild.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import outputs, provenance
from .errors import UserError
from .export import npy_data_offset, open_npy
from .index import (
    K_FACTOR,
    RECALL_QUERIES,
    TARGET_RECALL,
    ServedIndex,
    _bar,
    _measure,
    _search_warning,
    _stage,
    summary_line,
)
from .index_sources import CHUNK_ROWS, KEY_SCHEMA, Source, iter_npy_rows, model_source, parquet_source, read_keys
from .memwatch import PeakPrivateMemory, peak_rss_bytes
from .runners import Runner

log = logging.getLogger(__name__)


CHANGE_TOLERANCE = 1e-6       # update: a key's normalised vector changed when an element moved by more
DEAD_SHARE_REBUILD = 0.3      # update: share of dead ids past which it says to rebuild


def update_index(old: str, out: str, model: str | None = None, table: str = "docs", vectors_path: str | None = None,
                 kind: str | None = None, progress: bool = True, runner: Runner | None = None,
                 target_recall: float = TARGET_RECALL, recall_queries: int = RECALL_QUERIES, seed: int = 0,
                 report: bool | None = None) -> dict:
    """Update the index at `old` to a refreshed model table or key/vector Parquet, saved at `out`
    (which may be `old`: the update is written beside it and swapped in at the end, so a failure
    leaves the old index as it was). See the module docstring for what changes in each kind.

    kind, if given, must be the old index's (or auto): an update keeps its kind. Returns the
    parameters as build_index does (also in params.json), with `ids` and `dead` (ids whose row was
    removed) and an `update` block: added, replaced, removed, unchanged, dead_share, seconds (the
    update before measuring recall), from (the old index). progress, report and runner as in
    build_index; only staging the source runs on the runner.
    """
    t0 = time.perf_counter()
    if (model is None) == (vectors_path is None):
        raise UserError("give either --model (with --table) or --vectors")
    outputs.check_writable(out)
    before = read_index_params(old)
    if kind is not None and kind not in ("auto", before["kind"]):
        raise UserError(f"{old}: --update keeps the old index's kind ({before['kind']}); drop --kind {kind}")
    source = parquet_source(vectors_path) if vectors_path else model_source(model, table)
    if source.rows == 0:
        raise UserError(f"{source.name}: no rows to index")
    # an index of another model (or table) is refused: its keys' vectors would be compared across two spaces
    provenance.check(before.get("provenance"), source.provenance, old, update=True)
    if source.dim != before["dim"]:
        raise UserError(f"{old}: indexes {before['dim']}-dim vectors but {source.name} has {source.dim} dims; "
                        "a new dim needs a new index (index without --update)")
    with outputs.replacing(out, "index") as staged:  # `out` may be `old`: it is read before the swap
        if staged.replaces:
            log.info(f"replacing the index at {out}")
        with PeakPrivateMemory() as private:
            params = _update(staged.path, old, before, source, progress, runner, target_recall, recall_queries, seed)
        params.update(requested=kind or before["kind"], seconds=round(time.perf_counter() - t0, 3),
                      peak_private_bytes=private.peak)
        params["peak_rss_bytes"] = max(params["peak_rss_bytes"], peak_rss_bytes())
        with open(os.path.join(staged.path, "params.json"), "w") as fh:
            json.dump(params, fh, indent=2)
    if progress if report is None else report:
        for line in summary_line(params).splitlines():
            (log.warning if line.startswith("warning: ") else log.info)(line)
    return params


def read_index_params(path: str) -> dict:
    """params.json of an index directory that `index` wrote, checked enough to update it; anything
    else is one UserError naming the path."""
    wanted = "--update takes an index directory written by doc2vec-dist index"
    if not os.path.isdir(path):
        raise UserError(f"{path}: {'is not a directory' if os.path.lexists(path) else 'does not exist'}; {wanted}")
    names = sorted(os.listdir(path))
    marker = None
    if outputs.MARKER in names:
        with open(os.path.join(path, outputs.MARKER), "rb") as fh:
            marker = outputs.read_marker_kind(fh.read(4096)) or "unknown"
    if marker not in (None, "index"):
        other = outputs.DIR_KINDS.get(marker)
        raise UserError(f"{path}: holds {other.what if other else 'something else'} (its marker says {marker}), "
                        f"not a faiss index; {wanted}")
    missing = [n for n in ("index.faiss", "keys.parquet", "params.json") if n not in names]
    # an index from before markers holds nothing but an index's files
    if missing or (marker is None and not all(outputs.owned("index", n) for n in names)):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") if names else "nothing"
        raise UserError(f"{path}: not an index made by doc2vec-dist (it holds {shown}); {wanted}")
    params_path = os.path.join(path, "params.json")
    try:
        with open(params_path) as fh:
            params = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{params_path}: cannot read it as JSON ({exc})") from None
    if not isinstance(params, dict) or params.get("kind") not in ("flat", "hnsw", "ivfpq") \
            or not isinstance(params.get("dim"), int):
        raise UserError(f"{params_path}: not the parameters of a flat, hnsw or ivfpq index (no kind and dim)")
    if params["kind"] == "ivfpq" and "vectors.npy" not in names:
        raise UserError(f"{os.path.join(path, 'vectors.npy')}: missing; an IVF-PQ index is updated with its "
                        "re-rank vectors")
    return params


def _update(tmp: str, old: str, before: dict, source: Source, progress: bool, runner: Runner | None,
            target_recall: float, recall_queries: int, seed: int) -> dict:
    kind, dim, timings = before["kind"], source.dim, {}

    t = time.perf_counter()
    scratch = os.path.join(tmp, "source")  # the new source, staged as a build stages it; removed before the swap
    os.makedirs(scratch)
    fresh_path = os.path.join(scratch, "vectors.npy")
    np.lib.format.open_memmap(fresh_path, mode="w+", dtype=np.float32, shape=(source.rows, dim)).flush()
    _, tasks, source, nulls = _stage(scratch, source, fresh_path, 0, seed, runner, progress)
    if source.rows == 0:
        raise UserError(f"{source.name}: no rows to index: every row has a null vector")
    new_keys = read_keys(os.path.join(scratch, "keys.parquet"))
    if new_keys.null_count:  # a null key marks a dead id here, and a row without a key cannot be matched
        raise UserError(f"{source.name}: a null key in {new_keys.null_count:,} of its rows; an update matches rows by key")
    timings["stage"] = time.perf_counter() - t

    t = time.perf_counter()
    old_keys = read_keys(os.path.join(old, "keys.parquet"))
    index = faiss.read_index(os.path.join(old, "index.faiss"))
    n_old = len(old_keys)
    was_live = old_keys.is_valid().to_numpy(zero_copy_only=False)
    # ivfpq removed its dead ids, hnsw keeps them; flat removes them since issue 47 (one from before may hold some)
    held = int(was_live.sum()) if kind == "ivfpq" else n_old
    if index.d != dim or index.ntotal != held:
        raise UserError(f"{old}: index.faiss holds {index.ntotal:,} vectors of {index.d} dims where keys.parquet "
                        f"and params.json say {held:,} of {dim}; rebuild it (index without --update)")
    # each old id's row in the new source; -1 where its key is gone (or it was dead already)
    at = pc.index_in(old_keys, value_set=new_keys, skip_nulls=True).fill_null(-1)
    at = at.to_numpy(zero_copy_only=False).astype(np.int64)
    kept = np.flatnonzero(at >= 0)
    removed = np.flatnonzero(was_live & (at < 0))
    matched = np.zeros(source.rows, bool)
    matched[at[kept]] = True
    added = np.flatnonzero(~matched)  # in source order
    fresh = open_npy(fresh_path)
    vectors_path = os.path.join(tmp, "vectors.npy")
    if kind == "ivfpq":  # the re-rank file is rewritten as the old ids are compared
        np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(n_old + len(added), dim)).flush()
    changed = _compare(kind, old, index, at, fresh, added, vectors_path if kind == "ivfpq" else None, progress)
    timings["compare"] = time.perf_counter() - t

    t = time.perf_counter()
    bar = _bar(progress, len(changed) + len(added), f"add {kind}")
    if kind == "ivfpq":
        gone = np.union1d(changed, removed)
        if len(gone):
            index.remove_ids(gone)  # one pass over the inverted lists
        _add_rows(index, fresh, at[changed], changed, bar)  # encoded again under their own ids
        appended = added
        _add_rows(index, fresh, appended, n_old + np.arange(len(appended)), bar)
        newly_dead = removed
    else:
        # a changed key's new vector becomes a new node; its old node stays in the graph, dead
        appended = np.sort(np.concatenate([at[changed], added]))
        _add_rows(index, fresh, appended, None, bar)
        newly_dead = np.union1d(changed, removed)
    bar.close()
    live = np.concatenate([was_live, np.ones(len(appended), bool)])
    live[newly_dead] = False
    keys = pc.if_else(pa.array(live[:n_old]), old_keys, pa.scalar(None, pa.string()))
    keys = pa.concat_arrays([keys, new_keys.take(pa.array(appended, pa.int64()))])
    id_of_row = np.full(source.rows, -1, np.int64)  # faiss id of each row of the new source
    id_of_row[at[kept]] = kept
    id_of_row[appended] = n_old + np.arange(len(appended))  # hnsw/flat: a changed key's new id replaces its old
    dropped = int((~live).sum()) if kind == "flat" else 0
    if dropped:  # faiss's flat index removes ids, renumbering those after them; keys.parquet loses the same rows
        index.remove_ids(np.flatnonzero(~live))
        id_of_row = (np.cumsum(live) - 1)[id_of_row]
        keys = keys.filter(pa.array(live))
        live = np.ones(len(keys), bool)
    pq.write_table(pa.Table.from_arrays([keys], schema=KEY_SCHEMA), os.path.join(tmp, "keys.parquet"))
    faiss.write_index(index, os.path.join(tmp, "index.faiss"))
    timings["add"] = time.perf_counter() - t
    update_seconds = sum(timings.values())

    t = time.perf_counter()
    served_params = {"kind": kind, "k_factor": before.get("k_factor") or K_FACTOR}
    served = ServedIndex(index, served_params,
                         open_npy(vectors_path) if kind == "ivfpq" else None, live=live)
    search, recall, tune_recall, n_queries = _measure(served, fresh_path, source.rows, target_recall,
                                                      recall_queries, seed, id_of_row)
    timings["recall"] = time.perf_counter() - t
    peak = peak_rss_bytes()
    del served, index, fresh
    outputs.remove_path(scratch)

    ids, dead = len(live), int((~live).sum())
    shape = {name: before[name] for name in ("nlist", "pq_m", "pq_bits", "train_rows") if name in before}
    update = {"from": old, "added": len(added), "replaced": len(changed), "removed": len(removed),
              "unchanged": len(kept) - len(changed), "dead_share": round(dead / ids, 4),
              "seconds": round(update_seconds, 3), "warning": _dead_warning(kind, dead, ids)}
    if kind == "flat":
        update["dropped"] = dropped
    return {"kind": kind, "rows": ids - dead, "dim": dim, "metric": "inner_product_of_normalized",
            "warning": _search_warning(kind, search, shape.get("nlist"), recall, target_recall, tune_recall),
            "source": source.name, "provenance": source.provenance, "null_vectors": nulls,
            "search": search, "k_factor": served_params["k_factor"] if kind == "ivfpq" else None,
            **shape, "recall_at_10_vs_exact": recall, "recall_queries": n_queries, "tuning_recall": tune_recall,
            "target_recall": target_recall,
            "index_bytes": os.path.getsize(os.path.join(tmp, "index.faiss")),
            "vectors_bytes": os.path.getsize(vectors_path) if kind == "ivfpq" else 0,
            "stage_seconds": {k: round(v, 3) for k, v in timings.items()}, "peak_rss_bytes": peak, "tasks": tasks,
            "ids": ids, "dead": dead, "update": update}


def _old_vectors(kind: str, old: str, index: faiss.Index, rows: int):
    """(first id, float32 chunk) of the old index's normalised vectors, every id in order: ivfpq's
    re-rank file (a dead id's row is zero), or what flat and hnsw hold themselves."""
    if kind == "ivfpq":
        path = os.path.join(old, "vectors.npy")
        if open_npy(path).shape != (rows, index.d):
            raise UserError(f"{path}: not {rows:,} rows of {index.d} dims as keys.parquet says; "
                            "rebuild the index (index without --update)")
        yield from iter_npy_rows(path, 0, rows)
        return
    for first in range(0, rows, CHUNK_ROWS):
        yield first, index.reconstruct_n(first, min(CHUNK_ROWS, rows - first))


def _compare(kind: str, old: str, index: faiss.Index, at: np.ndarray, fresh: np.ndarray, added: np.ndarray,
             rewrite: str | None, progress: bool) -> np.ndarray:
    """Old ids whose key's new vector moved by more than CHANGE_TOLERANCE, in order, found a chunk
    of ids at a time. With `rewrite` (ivfpq's new vectors.npy, created at its full size), each chunk
    is written there too: the changed rows' new vectors, zeros for ids whose key is gone, the other
    rows as they were (bit for bit); then the added rows after them."""
    changed = []
    bar = _bar(progress, len(at), "compare")
    with open(rewrite, "r+b") if rewrite else contextlib.nullcontext() as fh:
        if fh is not None:
            fh.seek(npy_data_offset(rewrite))
        for first, chunk in _old_vectors(kind, old, index, len(at)):
            row = at[first:first + len(chunk)]
            has = np.flatnonzero(row >= 0)
            moved = has[np.abs(fresh[row[has]] - chunk[has]).max(axis=1, initial=0.0) > CHANGE_TOLERANCE]
            changed.append(first + moved)
            if fh is not None:
                chunk[row < 0] = 0.0
                chunk[moved] = fresh[row[moved]]
                fh.write(chunk.tobytes())
            bar.update(len(chunk))
        if fh is not None:
            for start in range(0, len(added), CHUNK_ROWS):
                fh.write(np.ascontiguousarray(fresh[added[start:start + CHUNK_ROWS]]).tobytes())
    bar.close()
    return np.concatenate(changed or [np.zeros(0, np.int64)]).astype(np.int64)


def _add_rows(index: faiss.Index, fresh: np.ndarray, rows: np.ndarray, ids: np.ndarray | None, bar) -> None:
    """Add rows of the staged source to the index a chunk at a time: under `ids`, or (None) at its end."""
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = np.ascontiguousarray(fresh[rows[start:start + CHUNK_ROWS]])
        if ids is None:
            index.add(chunk)
        else:
            index.add_with_ids(chunk, ids[start:start + CHUNK_ROWS])
        bar.update(len(chunk))


def _dead_warning(kind: str, dead: int, ids: int) -> str | None:
    """Say to rebuild once dead ids pass DEAD_SHARE_REBUILD of all: their cost grows with every update."""
    if not ids or dead / ids <= DEAD_SHARE_REBUILD:
        return None
    cost = {"ivfpq": "rows of keys.parquet and vectors.npy on disk",
            "hnsw": "memory, and graph nodes every search walks past"}.get(kind, "memory, and time in every search")
    return (f"{dead:,} of {ids:,} ids ({dead / ids:.0%}) are dead (rows that updates removed or replaced), which "
            f"costs {cost}; rebuild the index from the new source (index without --update)")
