"""Building a faiss index over a table's vectors, updating it from a refreshed table, and serving it
(ServedIndex).

Changes when how an index is built, updated, tuned or loaded changes; how vectors are scored is
`scoring`'s, and exact queries on a loaded model are `model`'s.

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

A key/vector Parquet may hold a null vector: infer writes one for a user it could not place. Such
rows are left out of a build or an update (named in a warning, counted in params.json's
null_vectors), as if the key were not in the source.

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
import glob
import json
import logging
import math
import os
import sys
import time

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import modeldir, outputs, provenance
from .errors import UserError
from .export import npy_data_offset, open_npy
from .memwatch import PeakPrivateMemory, peak_rss_bytes
from .modeldir import ModelDir
from .runners import Runner, run_local, where
from .scoring import NAMED, check_k, counted, lookup, named, unit_rows

log = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivfpq", "auto")
INDEX_FILES = outputs.DIR_KINDS["index"].own  # ("index.faiss", "keys.parquet", "params.json", "vectors.npy")
AUTO_FLAT_LIMIT = 1_000_000   # rows up to which auto builds an exact index (400 MB at dim 100)
CHUNK_ROWS = 1 << 18          # rows streamed at a time: 100 MB at dim 100
TARGET_RECALL = 0.96          # tuned on one query sample, so recall on fresh queries stays above 0.95
RECALL_SLACK = 0.01           # how far below the target fresh queries may land before the build warns
HNSW_EF_SEARCH = (16, 32, 64, 128, 256, 512, 1024)  # efSearch values tried, in order, until the target is met
RECALL_QUERIES = 1000
TUNE_QUERIES = 500
K_FACTOR = 5                  # ivfpq: candidates re-ranked per result wanted (10 found no more at 1M)
KEY_SCHEMA = pa.schema([("key", pa.string())])  # a null key marks a dead id (an update removed its row)
CHANGE_TOLERANCE = 1e-6       # update: a key's normalised vector changed when an element moved by more
DEAD_SHARE_REBUILD = 0.3      # update: share of dead ids past which it says to rebuild


# ---------------------------------------------------------------------------------------------------
# sources: a model table or a key/vector Parquet dataset, in units of one file
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Unit:
    """One file of the source, read by one task: a checkpoint part or a Parquet file."""
    path: str
    rows: int
    offset: int              # faiss id of its first row
    part: int | None = None  # its position in the table's manifest entry, for a checkpoint part


@dataclasses.dataclass(frozen=True)
class Source:
    name: str                # shown in messages and params.json
    dim: int
    rows: int
    units: tuple[Unit, ...]
    model: str | None = None
    table: str | None = None
    version: int | None = None  # the model's version every task reads
    provenance: dict | None = None  # the model the vectors came from (provenance.of_model), as far as known


def model_source(model: str, table: str) -> Source:
    found = ModelDir(model)
    spec = found.spec(table)
    if (count := found.key_count(table)) != spec["rows"]:
        raise UserError(f"{model}: {count} keys but table {table} has {spec['rows']} rows")
    vdir = modeldir.version_dir(model, found.version)
    units, offset = [], 0
    for i, part in enumerate(spec["parts"]):
        units.append(Unit(os.path.join(vdir, part["path"]), part["rows"], offset, i))
        offset += part["rows"]
    return Source(f"{model}:{table}", spec["dim"], offset, tuple(units), model, table, found.version,
                  provenance.of_model(found, table))


def parquet_source(path: str) -> Source:
    """The files of a key/vector Parquet file or directory, checked for the two columns, with the model
    they record coming from (export and infer record it; its files must agree)."""
    files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)) if os.path.isdir(path) else [path]
    if not files:
        raise UserError(f"{path}: no .parquet files found")
    units, offset, dim, recorded = [], 0, None, ...
    for file in files:
        try:
            meta = pq.ParquetFile(file)
            schema = meta.schema_arrow
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{file}: cannot read key/vector Parquet ({exc})") from None
        if "key" not in schema.names or "vector" not in schema.names:
            raise UserError(f"{file}: needs columns 'key' and 'vector', found {', '.join(schema.names)}")
        vtype = schema.field("vector").type
        if not (pa.types.is_fixed_size_list(vtype) and pa.types.is_floating(vtype.value_type)):
            raise UserError(f"{file}: column 'vector' must be fixed_size_list<float32>, found {vtype}")
        if dim is not None and vtype.list_size != dim:
            raise UserError(f"{file}: vectors of {vtype.list_size} dims, earlier files have {dim}")
        dim = vtype.list_size
        source = provenance.of_parquet_schema(schema.metadata)
        if recorded is not ... and source != recorded:
            raise UserError(f"{file}: made from {provenance.describe(source)}, earlier files of {path} from "
                            f"{provenance.describe(recorded)}; index the vectors of one model")
        recorded = source
        units.append(Unit(file, meta.metadata.num_rows, offset))
        offset += meta.metadata.num_rows
    return Source(path, dim, offset, tuple(units), provenance={**(recorded or {}), "vectors": os.path.abspath(path)})


def parquet_vectors(path: str, keys: list[str]) -> tuple[np.ndarray, Source]:
    """The float32 vectors of `keys` in a key/vector Parquet file or directory (checked as
    parquet_source checks it; its source says which model it records), in the order asked. Only the
    row groups that can hold the keys are read (export writes the key column's statistics). An
    unknown key is an error naming the file, with its closest keys; a key found twice gives its first row.
    A key whose vector is null (a user infer could not place) gets a row of NaN, which neighbors skips."""
    import pyarrow.dataset as ds

    source = parquet_source(path)
    data = ds.dataset([unit.path for unit in source.units], format="parquet")
    column = pc.field("key") if pa.types.is_string(data.schema.field("key").type) else pc.field("key").cast(pa.string())
    try:
        found = data.to_table(columns=["key", "vector"], filter=column.isin(keys))
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise UserError(f"{path}: cannot read its keys and vectors ({str(exc).splitlines()[0]})") from None
    at = pc.index_in(pa.array(keys, pa.string()), value_set=found.column("key").combine_chunks().cast(pa.string()))
    if at.null_count:  # the error names the file's closest keys
        lookup(data.to_table(columns=["key"]).column("key").combine_chunks(), keys, path)
    column = found.column("vector").take(at)
    vectors = np.full((len(keys), source.dim), np.nan, np.float32)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    vectors[valid] = modeldir.matrix_of(column.filter(valid), source.dim)  # matrix_of of nulls would drop their rows
    return vectors, source


def read_unit(source: Source, unit: Unit, keys: pa.Array | None = None):
    """(keys, float32 vectors, keys without a vector) of one unit, a batch at a time. A row whose vector
    is null (infer writes one for a user it could not place) is left out of the first two, its key
    given in the third."""
    if source.model is not None:
        found = ModelDir(source.model, version=source.version)
        keys = found.keys(source.table) if keys is None else keys
        for ids, vectors in found.batches(source.table, unit.part):
            yield keys.take(pa.array(ids)), vectors, _NO_KEYS
        return
    for batch in pq.ParquetFile(unit.path).iter_batches(batch_size=1 << 16, columns=["key", "vector"]):
        batch_keys, column, no_vector = batch.column("key"), batch.column("vector"), _NO_KEYS
        if column.null_count:
            valid = column.is_valid()
            no_vector = batch_keys.filter(pc.invert(valid))
            batch_keys, column = batch_keys.filter(valid), column.filter(valid)
        vectors = modeldir.matrix_of(column, source.dim).astype(np.float32, copy=False)
        yield batch_keys, vectors, no_vector


_NO_KEYS = pa.array([], pa.string())


def read_keys(path: str) -> pa.Array:
    """The key column of an index's keys.parquet as one string array (null: a dead id)."""
    return pq.read_table(path, columns=["key"]).column("key").combine_chunks().cast(pa.string())


# ---------------------------------------------------------------------------------------------------
# tasks (each runs in a thread of this process or as a Ray task)
# ---------------------------------------------------------------------------------------------------

def stage_unit(source: Source, unit: Unit, vectors_path: str, keys_piece: str, sample_rows: int, seed: int,
               keys: pa.Array | None = None, on_rows=None) -> dict:
    """Normalise one unit's rows into their place in vectors.npy, its keys into a Parquet piece;
    returns a uniform random sample of its normalised rows (for training) and where it ran. Rows
    without a vector are left out (the unit's rows then end early: _stage closes the gap), counted,
    and the first NAMED of their keys returned."""
    rng = np.random.default_rng([seed, unit.offset])
    picks = np.sort(rng.choice(unit.rows, min(sample_rows, unit.rows), replace=False))
    sample, seen, nulls, null_keys = [], 0, 0, []
    with open(vectors_path, "r+b") as fh, pq.ParquetWriter(keys_piece, KEY_SCHEMA) as key_writer:
        fh.seek(npy_data_offset(vectors_path) + unit.offset * source.dim * 4)
        for chunk_keys, vectors, no_vector in read_unit(source, unit, keys):
            nulls += len(no_vector)
            null_keys += no_vector.slice(0, NAMED - len(null_keys)).cast(pa.string()).to_pylist()
            vectors = unit_rows(vectors)
            if seen + nulls + len(vectors) > unit.rows:
                break  # more rows than the file's metadata said: caught below
            fh.write(vectors.tobytes())
            key_writer.write_table(pa.table({"key": chunk_keys.cast(pa.string())}))
            lo, hi = np.searchsorted(picks, [seen, seen + len(vectors)])
            sample.append(vectors[picks[lo:hi] - seen])
            seen += len(vectors)
            if on_rows:
                on_rows(len(vectors) + len(no_vector))
    if seen + nulls != unit.rows:
        raise UserError(f"{unit.path}: read {seen + nulls} rows, its metadata says {unit.rows}")
    return {"rows": seen, "null_vectors": nulls, "null_keys": null_keys,
            "sample": np.concatenate(sample or [np.zeros((0, source.dim), np.float32)]), **where()}


def encode_unit(trained: np.ndarray, vectors_path: str, offset: int, rows: int, sub_path: str, on_rows=None) -> dict:
    """Add rows [offset, offset + rows) of vectors.npy to a copy of the trained, empty IVF-PQ index
    and write it to sub_path, to be merged in unit order."""
    index = faiss.deserialize_index(trained)
    for _, chunk in iter_npy_rows(vectors_path, offset, rows):
        index.add(chunk)
        if on_rows:
            on_rows(len(chunk))
    faiss.write_index(index, sub_path)
    return {"rows": rows, **where()}


def iter_npy_rows(path: str, start: int, rows: int, chunk_rows: int = CHUNK_ROWS):
    """(first row, float32 chunk) over rows [start, start + rows) of a 2-d .npy, read (not mapped)."""
    header = open_npy(path)
    dim, offset = header.shape[1], header.offset
    del header
    with open(path, "rb") as fh:
        fh.seek(offset + start * dim * 4)
        for first in range(start, start + rows, chunk_rows):
            n = min(chunk_rows, start + rows - first)
            yield first, np.fromfile(fh, dtype=np.float32, count=n * dim).reshape(n, dim)


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
    id is a row of keys.parquet. live (after an update) marks which ids are searched: a dead id of
    hnsw (or of a flat index updated before flat dropped them) is still in faiss and kept out of
    results by a selector (ivfpq and flat remove their own).
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

    def search(self, queries: np.ndarray, k: int, batch: int = 2048) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(check_k(k, "search"), self.live_rows)
        if self.vectors is None:
            return self.index.search(queries, k, params=self._search_params)
        scores = np.empty((len(queries), k), np.float32)
        ids = np.empty((len(queries), k), np.int64)
        for start in range(0, len(queries), batch):
            q = queries[start:start + batch]
            scores[start:start + len(q)], ids[start:start + len(q)] = self._rerank(q, k)
        return scores, ids

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
    _, found = served.search(queries, k + 1)
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
        raise UserError(f"{source.name}: no rows to index: every row has a null vector")
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
    rows staged, whose faiss ids then run on without a gap (_close_gaps)."""
    pieces = [os.path.join(tmp, f"keys-{i:05d}.parquet") for i in range(len(source.units))]
    calls = [(source, unit, vectors_path, piece, round(train_rows * unit.rows / source.rows), seed)
             for unit, piece in zip(source.units, pieces)]
    bar = _bar(progress, source.rows, "stage vectors")
    shared = (ModelDir(source.model).keys(source.table) if source.model is not None else None, bar.update)
    samples, tasks, null_keys = {}, [], {}
    for i, result in _runner_calls(runner, stage_unit, calls, shared):
        samples[i], null_keys[i] = result.pop("sample"), result.pop("null_keys")
        tasks.append({"step": "stage", "unit": i, **result})
        if runner is not None:
            bar.update(result["rows"] + result["null_vectors"])
    bar.close()
    tasks.sort(key=lambda t: t["unit"])
    with pq.ParquetWriter(os.path.join(tmp, "keys.parquet"), KEY_SCHEMA) as writer:
        for piece in pieces:  # in unit order: faiss id i is row i
            for batch in pq.ParquetFile(piece).iter_batches(batch_size=1 << 20):
                writer.write_batch(batch)
            os.remove(piece)
    nulls = sum(task["null_vectors"] for task in tasks)
    if nulls:
        keys = [key for i in range(len(source.units)) for key in null_keys[i]]
        log.warning(f"warning: {source.name}: {counted(nulls, 'row')} with a null vector "
                    f"({'a user' if nulls == 1 else 'users'} infer could not place) left out of the index: "
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
