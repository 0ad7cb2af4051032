"""Building a faiss index over a table's vectors, and serving it (ServedIndex).

Changes when how an index is built, tuned or loaded changes, or a kind of index is added. Its sources and
the tasks run on each unit of them are index_sources.py's; updating an index from a refreshed table,
index_update.py's; how vectors are scored is `scoring`'s, and exact queries on a loaded model are `model`'s.

Building an index streams the source (a model's checkpoint parts, or the files of a key/vector
Parquet dataset) in units of one file, each handled by a task (in this process, or a Ray task under
jobs/index.py):

  1. stage   each unit's rows are normalised and written at their place in INDEX/vectors.npy, its
             keys to a piece of keys.parquet, and a random sample of its rows is returned;
  2. train   (ivfpq) the coarse quantizer and the product quantizer are trained on that sample;
  3. add     flat/hnsw: vectors.npy is streamed into the index here. ivfpq: each unit's rows are
             encoded by a task into a sub-index, and the sub-indexes are merged in unit order;
  4. measure the exact top-10 of sampled queries is found by streaming vectors.npy, the search
             setting (nprobe, efSearch) is tuned to reach the target recall on one query sample,
             and recall@10 vs exact is reported on another.

Faiss id i is row i of keys.parquet, in source order (part by part, as export writes them).

A key/vector Parquet may hold a null vector: infer writes one for a user it could not place. Such
rows are left out of a build or an update (named in a warning, counted in params.json's
null_vectors), as if the key were not in the source; so are rows whose vector is all zero (never
trained: cosine has no direction for them). Its other rows must be fit to index: a null or repeated
key (a null key marks a dead id; a key twice would get two ids), or a vector with a NaN or inf
element, is refused in one line naming the first such row and counting them
(index_sources.check_keys, before staging; vector_problems, while staging).

IVF-PQ keeps only the PQ codes in memory (58 bytes a row with its id at dim 100, instead of 400)
and re-ranks its candidates (5 × k) with exact inner products read from vectors.npy, which is
memory-mapped: those pages are the page cache's, kept while memory is spare and dropped under
pressure, and a query touches only its candidate rows. faiss's IndexRefineFlat would give the same
ranking, but it holds every float vector in the process's own memory and in index.faiss (8 GB more
at 20M × 100), which is what IVF-PQ is there to avoid. Measured at 20M × 100: 2.6 GB private
memory at build, 1.1 GB index + 7.6 GB re-rank file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
import warnings

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from . import outputs
from .errors import UserError
from .export import npy_data_offset, open_npy
from .index_sources import (
    KEY_SCHEMA,
    Source,
    check_keys,
    encode_unit,
    iter_npy_rows,
    model_source,
    parquet_source,
    read_keys,
    refuse_vector_problems,
    stage_unit,
)
from .memwatch import PeakPrivateMemory, peak_rss_bytes
from .modeldir import ModelDir
from .runners import Runner, run_local
from .scoring import ServingWarning, check_k, counted, named

log = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivfpq", "auto")
INDEX_FILES = outputs.DIR_KINDS["index"].own  # ("index.faiss", "keys.parquet", "params.json", "vectors.npy")
AUTO_FLAT_LIMIT = 1_000_000   # rows up to which auto builds an exact index (400 MB at dim 100)
TARGET_RECALL = 0.96          # tuned on one query sample, so recall on fresh queries stays above 0.95
RECALL_SLACK = 0.01           # how far below the target fresh queries may land before the build warns
HNSW_EF_SEARCH = (16, 32, 64, 128, 256, 512, 1024)  # efSearch values tried, in order, until the target is met
RECALL_QUERIES = 1000
TUNE_QUERIES = 500
K_FACTOR = 5                  # ivfpq: candidates re-ranked per result wanted (10 found no more at 1M)


# ---------------------------------------------------------------------------------------------------
# sources: a model table or a key/vector Parquet dataset, in units of one file
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# index kinds
# ---------------------------------------------------------------------------------------------------

def resolve_kind(kind: str, rows: int) -> str:
    if kind not in KINDS:
        raise UserError(f"unknown index kind {kind!r} (choose from {', '.join(KINDS)})")
    if kind == "auto":
        return "flat" if rows <= AUTO_FLAT_LIMIT else "ivfpq"
    return kind


def ivfpq_shape(rows: int, dim: int) -> dict:
    """nlist, PQ sub-quantizers and bits, training rows for `rows` vectors of `dim`.

    nlist ≈ 2·√rows, a power of two up to 8192 (training cost grows with it). Measured at 1M × 100:
    2048 lists reached recall 0.968 at 7.0k queries per CPU-second, 4096 lists 0.971 at 5.3k, 1024
    lists 0.966 at 6.2k: fewer, longer lists scan as many codes but compute fewer distance tables.
    Training takes 40 rows per list (faiss asks for 39). PQ uses about 2 dims per sub-quantizer
    (the largest divisor of dim up to dim/2: 50 bytes at dim 100), accurate enough that re-ranking
    5× the candidates recovers the exact top-k. Small tables get fewer bits, so that PQ training
    too has 39 rows per centroid.
    """
    nlist = 2 ** round(math.log2(max(2 * math.sqrt(rows), 1)))
    nlist = int(max(1, min(nlist, 8192, 2 ** math.floor(math.log2(max(rows // 39, 1))))))
    m = max(d for d in range(1, dim // 2 + 1) if dim % d == 0) if dim > 1 else 1
    m = dim if m == 1 else m  # a prime dim: one dim per sub-quantizer rather than one for all
    train_rows = int(min(rows, max(40 * nlist, 256 * 64)))
    nbits = int(min(8, max(4, math.floor(math.log2(max(train_rows // 39, 16))))))
    return {"nlist": nlist, "pq_m": m, "pq_bits": nbits, "train_rows": train_rows}


def empty_index(kind: str, dim: int, shape: dict | None = None) -> faiss.Index:
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        return index
    # L2 on unit vectors ranks exactly as inner product does, and IVF-PQ encodes residuals best
    # under L2; the exact re-ranking then scores by inner product.
    index = faiss.IndexIVFPQ(faiss.IndexFlatL2(dim), dim, shape["nlist"], shape["pq_m"], shape["pq_bits"])
    index.cp.niter = 10                     # k-means: 10 rounds instead of 25; candidates are re-ranked
    index.pq.cp.niter = 10                  # exactly, so what the extra rounds buy is not seen in recall
    index.do_polysemous_training = False    # used only by polysemous search, which we do not run
    return index


@contextlib.contextmanager
def omp_threads(n: int):
    """faiss's OpenMP thread count for a block of work, restored after."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, n))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def train_ivfpq(index: faiss.IndexIVFPQ, sample: np.ndarray) -> None:
    """Coarse k-means on all cores, then the product quantizer on residuals on one thread.

    PQ trains a small k-means per 2-dim sub-vector: too little work per step for OpenMP's fork and
    join: one thread is about as fast as two on an idle machine and several times faster on a loaded
    one (threads spinning; see runners.calm_openmp). A small sample gets one thread for the coarse
    k-means too.
    """
    threads = faiss.omp_get_max_threads() if len(sample) >= 65536 else 1
    with omp_threads(threads):
        kmeans = faiss.Kmeans(index.d, index.nlist, niter=index.cp.niter, seed=1234)
        kmeans.train(sample)
        index.quantizer.add(kmeans.centroids)
    with omp_threads(1):
        index.train(sample)  # the quantizer is trained already, so this trains the PQ only


class ServedIndex:
    """A built index, its parameters and (for ivfpq) the vectors its candidates are re-ranked with.

    search() takes unit-norm float32 queries and returns (cosine scores, faiss ids), best first; an
    id is a row of keys.parquet. An approximate index may find fewer than k rows for a query (ivfpq:
    the nprobe lists searched hold fewer candidates; hnsw: the graph walk ends early); the missing
    places hold id -1, which the answer drops (scoring.neighbor_table), and a ServingWarning says so.
    live (after an update) marks which ids are searched: a dead id of hnsw (or of a flat index updated
    before flat dropped them) is still in faiss and kept out of results by a selector (ivfpq and flat
    remove their own).
    """

    def __init__(self, index: faiss.Index, params: dict, vectors: np.ndarray | None = None, path: str | None = None,
                 live: np.ndarray | None = None):
        self.index, self.params, self.vectors, self.path = index, params, vectors, path
        self._keys: pa.Array | None = None
        self.live_rows = index.ntotal
        self._search_params = None
        if live is not None and params["kind"] != "ivfpq" and not live.all():
            self.live_rows = int(live.sum())
            # faiss reads the bitmap through a pointer: the array and the selector must outlive the searches
            self._live_bits = np.packbits(live, bitorder="little")  # bit i % 8 of byte i // 8 is id i, as faiss reads it
            self._selector = faiss.IDSelectorBitmap(len(self._live_bits), faiss.swig_ptr(self._live_bits))
            params_type = faiss.SearchParametersHNSW if params["kind"] == "hnsw" else faiss.SearchParameters
            self._search_params = params_type(sel=self._selector)
            if params["kind"] == "hnsw":  # search parameters replace the index's efSearch, so they carry it too
                self._search_params.efSearch = index.hnsw.efSearch
        self.set_search(params.get("search"))

    @classmethod
    def load(cls, path: str) -> ServedIndex:
        files = {name: os.path.join(path, name) for name in INDEX_FILES}
        if not all(os.path.isfile(files[name]) for name in ("index.faiss", "keys.parquet", "params.json")):
            raise UserError(f"{path}: not an index directory (needs index.faiss, keys.parquet, params.json)")
        with open(files["params.json"]) as fh:
            params = json.load(fh)
        vectors = None
        if params["kind"] == "ivfpq":
            if not os.path.isfile(files["vectors.npy"]):
                raise UserError(f"{files['vectors.npy']}: missing; IVF-PQ re-ranks its candidates with it")
            vectors = open_npy(files["vectors.npy"])
        keys = live = None
        if params.get("dead"):  # an updated index: its dead ids are the rows whose key is null
            keys = read_keys(files["keys.parquet"])
            live = keys.is_valid().to_numpy(zero_copy_only=False)
        served = cls(faiss.read_index(files["index.faiss"]), params, vectors, path, live)
        served._keys = keys
        return served

    @property
    def keys(self) -> pa.Array:
        if self._keys is None:
            self._keys = read_keys(os.path.join(self.path, "keys.parquet"))
        return self._keys

    def set_search(self, value: int | None) -> None:
        """The speed/recall knob: nprobe (ivfpq) or efSearch (hnsw); flat has none."""
        if value is None:
            return
        if self.params["kind"] == "ivfpq":
            self.index.nprobe = int(value)
        elif self.params["kind"] == "hnsw":
            self.index.hnsw.efSearch = int(value)
            if self._search_params is not None:
                self._search_params.efSearch = int(value)

    def search(self, queries: np.ndarray, k: int, batch: int = 2048, warn_short: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the k best rows of each query; with warn_short, a ServingWarning says how
        many queries got fewer (their places hold id -1). Measuring recall turns it off."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(check_k(k, "search"), self.live_rows)
        if self.vectors is None:
            scores, ids = self.index.search(queries, k, params=self._search_params)
        else:
            scores = np.empty((len(queries), k), np.float32)
            ids = np.empty((len(queries), k), np.int64)
            for start in range(0, len(queries), batch):
                q = queries[start:start + batch]
                scores[start:start + len(q)], ids[start:start + len(q)] = self._rerank(q, k)
        if warn_short:
            self.say_short((ids >= 0).sum(axis=1), k)
        return scores, ids

    def say_short(self, found: np.ndarray, k: int) -> None:
        """A ServingWarning when some queries got fewer than k rows (`found`: each query's count): how many,
        the fewest, and the knob that reaches more (the index's search setting, which params.json's
        `search` gives a load)."""
        n = int((found < k).sum())
        if not n:
            return
        kind = self.params["kind"]
        why = None
        if kind == "ivfpq":
            why = (f"it searches nprobe {self.index.nprobe} of its {self.index.nlist} lists, which hold too few rows "
                   "near those queries")
        elif kind == "hnsw":
            why = f"its graph search at efSearch {self.index.hnsw.efSearch} ended before reaching them"
        fix = "index with --kind flat, which always finds k"
        if why and self.path:
            fix = (f"raise \"search\" in {os.path.join(self.path, 'params.json')} (the "
                   f"{'nprobe' if kind == 'ivfpq' else 'efSearch'} a load uses), or {fix}")
        said = (f"{self.path or 'the index'}: {n:,} of {counted(len(found), 'query', 'queries')} got fewer than the "
                f"{k:,} neighbours asked of this {kind} index (the fewest: {int(found.min()):,}), so "
                f"{'its answer is' if n == 1 else 'their answers are'} short")
        warnings.warn(f"{said}: {why}; {fix}" if why else f"{said}; {fix}", ServingWarning, stacklevel=3)

    def _rerank(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """IVF-PQ candidates (k_factor · k), scored again with exact inner products."""
        want = min(k * self.params.get("k_factor", K_FACTOR), self.index.ntotal)
        _, cand = self.index.search(q, want)
        rows = self.vectors[np.where(cand >= 0, cand, 0).ravel()].reshape(len(q), want, -1)
        exact = np.matmul(rows, q[:, :, None])[:, :, 0]
        exact[cand < 0] = -np.inf
        top = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(exact, top, 1), np.take_along_axis(cand, top, 1)


# ---------------------------------------------------------------------------------------------------
# recall against exact search
# ---------------------------------------------------------------------------------------------------

def exact_top_k(vectors_path: str, rows: int, queries: np.ndarray, k: int) -> np.ndarray:
    """Ids of the exact top-k by inner product, streaming vectors.npy a chunk at a time."""
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.full((len(queries), k), -1, np.int64)
    for first, chunk in iter_npy_rows(vectors_path, 0, rows):
        s, i = faiss.knn(queries, chunk, min(k, len(chunk)), metric=faiss.METRIC_INNER_PRODUCT)
        s, i = np.hstack([best_s, s]), np.hstack([best_i, i + first])
        order = np.argsort(-s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)
    return best_i


def without_self(found: np.ndarray, own: np.ndarray, k: int) -> list[np.ndarray]:
    """The first k ids of each row other than the query's own id (neighbours exclude the query)."""
    keep = (found != own[:, None]) & (found >= 0)
    keep &= np.cumsum(keep, axis=1) <= k
    return [row[mask] for row, mask in zip(found, keep)]


def recall_at(served: ServedIndex, queries: np.ndarray, own: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Share of the exact k nearest other rows that the index finds among its k nearest other rows."""
    _, found = served.search(queries, k + 1, warn_short=False)
    got, want = without_self(found, own, k), without_self(truth, own, k)
    return float(np.mean([len(set(g.tolist()) & set(w.tolist())) / max(len(w), 1) for g, w in zip(got, want)]))


def tune_search(served: ServedIndex, queries, own, truth, target: float) -> tuple[int | None, float]:
    """The smallest nprobe / efSearch whose recall@10 reaches `target` on these queries."""
    kind = served.params["kind"]
    if kind == "flat":
        return None, 1.0
    if kind == "ivfpq":
        # powers of two and the steps between (…, 4, 6, 8, 12, 16, …): doubling nprobe halves the speed
        values = sorted({v for i in range(int(math.log2(served.index.nlist)) + 1)
                         for v in (2 ** i, 3 * 2 ** i // 2) if v <= served.index.nlist})
    else:
        values = HNSW_EF_SEARCH
    recall = 0.0
    for value in values:
        served.set_search(value)
        recall = recall_at(served, queries, own, truth)
        if recall >= target:
            break
    return value, recall


# ---------------------------------------------------------------------------------------------------
# the build
# ---------------------------------------------------------------------------------------------------

def build_index(out: str, kind: str = "auto", model: str | None = None, table: str = "docs",
                vectors_path: str | None = None, progress: bool = True, runner: Runner | None = None,
                target_recall: float = TARGET_RECALL, recall_queries: int = RECALL_QUERIES, seed: int = 0,
                report: bool | None = None) -> dict:
    """Build a cosine index of a model table or a key/vector Parquet and save it with its keys and
    parameters (see the module docstring for the steps). Returns the parameters, also in params.json.

    progress shows bars; report (default: progress) prints the summary line (recall@10 vs exact,
    sizes, memory) to stderr. runner runs the per-unit tasks (default: this process; jobs/index.py
    passes run_on_ray).
    """
    t0 = time.perf_counter()
    if (model is None) == (vectors_path is None):
        raise UserError("give either --model (with --table) or --vectors")
    outputs.check_writable(out)
    source = parquet_source(vectors_path) if vectors_path else model_source(model, table)
    if source.rows == 0:
        raise UserError(f"{source.name}: no rows to index")
    requested, kind = kind, resolve_kind(kind, source.rows)
    with outputs.replacing(out, "index") as staged:  # an earlier index of ours is replaced; anything else refused
        if staged.replaces:
            log.info(f"replacing the index at {out}")
        with PeakPrivateMemory() as private:
            params = _build(staged.path, source, kind, progress, runner, target_recall, recall_queries, seed)
        params.update(requested=requested, seconds=round(time.perf_counter() - t0, 3),
                      peak_private_bytes=private.peak)
        params["peak_rss_bytes"] = max(params["peak_rss_bytes"], peak_rss_bytes())
        with open(os.path.join(staged.path, "params.json"), "w") as fh:
            json.dump(params, fh, indent=2)
    if progress if report is None else report:
        for line in summary_line(params).splitlines():  # its last line may be the build's warning
            (log.warning if line.startswith("warning: ") else log.info)(line)
    return params


def summary_line(p: dict) -> str:
    knob = {"ivfpq": f", nprobe {p.get('search')}", "hnsw": f", efSearch {p.get('search')}"}.get(p["kind"], "")
    disk = f"index {p['index_bytes'] / 2**20:,.1f} MiB"
    if p["vectors_bytes"]:
        disk += f" + re-rank vectors {p['vectors_bytes'] / 2**20:,.1f} MiB"
    built = (f"index {p['kind']}: {p['rows']:,} rows × {p['dim']}, recall@10 vs exact: {p['recall_at_10_vs_exact']:.3f} "
             f"({p['recall_queries']} queries{knob}); {disk} on disk; peak memory "
             f"{p['peak_private_bytes'] / 2**30:.2f} GiB private, {p['peak_rss_bytes'] / 2**30:.2f} GiB resident "
             f"with mapped files; {p['seconds']:.1f}s")
    lines = [built]
    u = p.get("update") or {}
    if u:
        dead = (f"{u['dropped']:,} dead ids dropped (flat removes them): none left" if "dropped" in u
                else f"{p['dead']:,} dead ids of {p['ids']:,} ({u['dead_share']:.0%})")
        lines.append(f"updated from {u['from']}: {u['added']:,} added, {u['replaced']:,} replaced, "
                     f"{u['removed']:,} removed, {u['unchanged']:,} unchanged in {u['seconds']:.1f}s (then recall "
                     f"measured); {dead}")
    lines += [f"warning: {w}" for w in (p.get("warning"), u.get("warning")) if w]
    return "\n".join(lines)


def _build(tmp: str, source: Source, kind: str, progress: bool, runner: Runner | None, target_recall: float,
           recall_queries: int, seed: int) -> dict:
    shape = ivfpq_shape(source.rows, source.dim) if kind == "ivfpq" else {}
    vectors_path = os.path.join(tmp, "vectors.npy")
    # the header and a file of the full size (sparse until written); stage tasks fill their rows
    np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(source.rows, source.dim)).flush()
    timings = {}

    t = time.perf_counter()
    sample, tasks, source, nulls = _stage(tmp, source, vectors_path, shape.get("train_rows", 0), seed, runner,
                                          progress)
    if source.rows == 0:
        raise UserError(f"{source.name}: no rows to index: every row has a null or all-zero vector")
    timings["stage"] = time.perf_counter() - t

    t = time.perf_counter()
    index = empty_index(kind, source.dim, shape)
    if kind == "ivfpq":
        train_ivfpq(index, sample)
        del sample
        timings["train"] = time.perf_counter() - t
        t = time.perf_counter()
        index, encoded = _encode_and_merge(tmp, source, index, vectors_path, runner, progress)
        tasks += encoded
    else:
        bar = _bar(progress, source.rows, f"add {kind}")
        for _, chunk in iter_npy_rows(vectors_path, 0, source.rows):
            index.add(chunk)
            bar.update(len(chunk))
        bar.close()
    timings["add"] = time.perf_counter() - t
    faiss.write_index(index, os.path.join(tmp, "index.faiss"))

    t = time.perf_counter()
    served = ServedIndex(index, {"kind": kind, "k_factor": K_FACTOR},
                         open_npy(vectors_path) if kind == "ivfpq" else None)
    search, recall, tune_recall, n_queries = _measure(served, vectors_path, source.rows, target_recall,
                                                      recall_queries, seed)
    timings["recall"] = time.perf_counter() - t
    peak = peak_rss_bytes()
    del served, index
    if kind != "ivfpq":
        os.remove(vectors_path)  # flat and hnsw hold the vectors themselves
    return {"kind": kind, "rows": source.rows, "dim": source.dim, "metric": "inner_product_of_normalized",
            "warning": _search_warning(kind, search, shape.get("nlist"), recall, target_recall, tune_recall),
            "source": source.name, "provenance": source.provenance, "null_vectors": nulls,
            "search": search, "k_factor": K_FACTOR if kind == "ivfpq" else None, **shape,
            "recall_at_10_vs_exact": recall, "recall_queries": n_queries, "tuning_recall": tune_recall,
            "target_recall": target_recall,
            "index_bytes": os.path.getsize(os.path.join(tmp, "index.faiss")),
            "vectors_bytes": os.path.getsize(vectors_path) if kind == "ivfpq" else 0,
            "stage_seconds": {k: round(v, 3) for k, v in timings.items()}, "peak_rss_bytes": peak, "tasks": tasks}


def _search_warning(kind: str, search: int | None, nlist: int | None, recall: float, target: float,
                    tune_recall: float | None = None) -> str | None:
    """Say so when the index had to search much of itself to reach the target, or ended below it.

    Below it: the widest search tried fell short on the tuning queries (tune_recall < target), or the
    recall on fresh queries lies more than RECALL_SLACK under the target (0.942 against 0.96 was seen
    and went unsaid). Seen on a 1M-user model trained for one epoch: vectors still close to their
    random start have no cluster structure: IVF-PQ needed half of its lists and HNSW fell short of the
    target at efSearch 1024, both slower than an exact scan.
    """
    if kind == "ivfpq" and search and nlist and search > nlist // 8:
        return (f"reaching recall {target} took nprobe {search} of {nlist} lists: these vectors have little cluster "
                "structure (an under-trained model?); an exact --kind flat index may serve as fast")
    if kind not in ("ivfpq", "hnsw"):
        return None
    short = tune_recall is not None and tune_recall < target
    if not short and recall >= target - RECALL_SLACK:
        return None
    knob = f"{'nprobe' if kind == 'ivfpq' else 'efSearch'} {search}"
    if short:
        return (f"recall stayed at {tune_recall:.3f} on the tuning queries at the widest search tried ({knob}), "
                f"below the target {target}; --kind flat is exact")
    if search == (nlist if kind == "ivfpq" else HNSW_EF_SEARCH[-1]):
        return (f"recall stayed at {recall:.3f} at the widest search tried ({knob}), below the target {target}; "
                "--kind flat is exact")
    return f"recall@10 is {recall:.3f} at {knob}, below the target {target}; --kind flat is exact"


def _bar(progress: bool, total: int, desc: str):
    return tqdm(total=total, unit="row", unit_scale=True, desc=desc, disable=not progress, file=sys.stderr)


def _runner_calls(runner: Runner | None, fn, calls: list[tuple], local_extra: tuple = ()):
    """Local: threads, with `local_extra` arguments that only this process can share (the key array,
    the progress bar's update); Ray: the calls as given."""
    if runner is None:
        return run_local(fn, [args + local_extra for args in calls])
    return runner(fn, calls)


def _stage(tmp: str, source: Source, vectors_path: str, train_rows: int, seed: int, runner, progress):
    """Step 1 over all units; writes keys.parquet; returns the training sample (empty if none wanted),
    where each task ran, the source as staged and the rows left out for a null vector. Those rows
    (users infer could not place) are named in a warning, and the source returned counts only the
    rows staged, whose faiss ids then run on without a gap (_close_gaps). A key/vector Parquet with a
    null or repeated key is refused before anything is staged (check_keys), one with a vector that
    cosine cannot take (NaN, inf, all zero) once every unit is staged (refuse_vector_problems)."""
    check_keys(source)
    pieces = [os.path.join(tmp, f"keys-{i:05d}.parquet") for i in range(len(source.units))]
    calls = [(source, unit, vectors_path, piece, round(train_rows * unit.rows / source.rows), seed)
             for unit, piece in zip(source.units, pieces)]
    bar = _bar(progress, source.rows, "stage vectors")
    shared = (ModelDir(source.model).keys(source.table) if source.model is not None else None, bar.update)
    samples, tasks, null_keys, bad = {}, [], {}, {}
    for i, result in _runner_calls(runner, stage_unit, calls, shared):
        samples[i], null_keys[i], bad[i] = result.pop("sample"), result.pop("null_keys"), result.pop("bad_rows")
        tasks.append({"step": "stage", "unit": i, **result})
        if runner is not None:
            bar.update(result["rows"] + result["null_vectors"])
    bar.close()
    refuse_vector_problems(source, [bad[i] for i in range(len(source.units))])
    tasks.sort(key=lambda t: t["unit"])
    with pq.ParquetWriter(os.path.join(tmp, "keys.parquet"), KEY_SCHEMA) as writer:
        for piece in pieces:  # in unit order: faiss id i is row i
            for batch in pq.ParquetFile(piece).iter_batches(batch_size=1 << 20):
                writer.write_batch(batch)
            os.remove(piece)
    nulls = sum(task["null_vectors"] for task in tasks)
    if nulls:
        keys = [key for i in range(len(source.units)) for key in null_keys[i]]
        log.warning(f"warning: {source.name}: {counted(nulls, 'row')} with a null or all-zero vector (users infer "
                    "could not place, rows never trained) left out of the index: "
                    f"{named(keys, nulls)}")
        source = _close_gaps(vectors_path, source, [task["rows"] for task in tasks])
    return np.concatenate([samples[i] for i in range(len(source.units))]), tasks, source, nulls


def _close_gaps(vectors_path: str, source: Source, staged: list[int]) -> Source:
    """vectors.npy rewritten with each unit's `staged` rows (at the start of its place) one after
    another, and the source with each unit's rows and offset as they now are: the place a unit's null
    rows left at its end is closed, so that faiss id i stays row i of keys.parquet."""
    packed = os.path.join(os.path.dirname(vectors_path), "vectors-packed.npy")
    np.lib.format.open_memmap(packed, mode="w+", dtype=np.float32, shape=(sum(staged), source.dim)).flush()
    units, offset = [], 0
    with open(packed, "r+b") as fh:
        fh.seek(npy_data_offset(packed))
        for unit, rows in zip(source.units, staged):
            fh.writelines(chunk.tobytes() for _, chunk in iter_npy_rows(vectors_path, unit.offset, rows))
            units.append(dataclasses.replace(unit, rows=rows, offset=offset))
            offset += rows
    os.replace(packed, vectors_path)
    return dataclasses.replace(source, rows=offset, units=tuple(units))


def _encode_and_merge(tmp: str, source: Source, trained: faiss.Index, vectors_path: str, runner, progress):
    """Step 3 for ivfpq: a sub-index per unit (in parallel), merged in unit order so ids run on."""
    blob = faiss.serialize_index(trained)
    subs = [os.path.join(tmp, f"sub-{i:05d}.faiss") for i in range(len(source.units))]
    calls = [(blob, vectors_path, unit.offset, unit.rows, sub) for unit, sub in zip(source.units, subs)]
    bar = _bar(progress, source.rows, "encode ivfpq")
    # faiss already uses every core inside one add, so locally the units go one after another
    if runner is None:
        results = ((i, encode_unit(*args, bar.update)) for i, args in enumerate(calls))
    else:
        results = runner(encode_unit, calls)
    tasks = []
    for i, result in results:
        tasks.append({"step": "encode", "unit": i, **result})
        if runner is not None:
            bar.update(result["rows"])
    bar.close()
    for sub in subs:
        part = faiss.read_index(sub)
        trained.merge_from(part, trained.ntotal)
        del part
        os.remove(sub)
    return trained, sorted(tasks, key=lambda t: t["unit"])


def _measure(served: ServedIndex, vectors_path: str, rows: int, target: float, n_eval: int, seed: int,
             ids: np.ndarray | None = None):
    """Tune the search knob on one sample of rows as queries and report recall@10 on another.

    vectors_path holds the rows measured against; ids[r] is row r's faiss id (an update measures
    against the new source's rows, whose ids are not their positions); default: row r is id r.
    Returns (search setting, recall@10, recall@10 on the tuning queries, number of queries).
    """
    n_eval = min(n_eval, rows)
    if served.params["kind"] == "flat":
        return None, 1.0, 1.0, n_eval  # exact by construction
    rng = np.random.default_rng(seed + 1)
    n_tune = min(TUNE_QUERIES, rows)
    chosen = rng.choice(rows, min(rows, n_tune + n_eval), replace=False)
    # disjoint samples while the table allows it (a tiny table shares some)
    own = {"tune": np.sort(chosen[:n_tune]), "eval": np.sort(chosen[len(chosen) - n_eval:])}
    stored = open_npy(vectors_path)
    queries = {name: np.ascontiguousarray(stored[picked]) for name, picked in own.items()}
    del stored
    truth = exact_top_k(vectors_path, rows, np.concatenate([queries["tune"], queries["eval"]]), 11)
    if ids is not None:
        own = {name: ids[picked] for name, picked in own.items()}
        truth = np.where(truth >= 0, ids[np.maximum(truth, 0)], -1)
    search, tune_recall = tune_search(served, queries["tune"], own["tune"], truth[:n_tune], target)
    recall = recall_at(served, queries["eval"], own["eval"], truth[n_tune:])
    return search, recall, tune_recall, n_eval


# ---------------------------------------------------------------------------------------------------
# the update
# ---------------------------------------------------------------------------------------------------

