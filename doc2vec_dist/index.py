"""faiss indexes over a table's vectors, and nearest-neighbour queries.

Similarity within one table (users like this user, URLs like this URL) is cosine: inner product of
normalised vectors. Scoring URLs for a user uses the model's own estimate of P(url | user). Negative
sampling's optimum is d·o = log[P(w|d) / (k·Pn(w))] with Pn(w) ∝ count(w)^ns_exponent, so
    log P(w|d) = d·o + ns_exponent · log count(w) + const.
d·o alone divides popularity out and ranks rare URLs first; adding the prior back ranks the URLs a
user is most likely to visit. As one inner product: [d, 1] · [o, ns_exponent · log count].
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import time

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import checkpoint
from .errors import UserError
from .export import check_replaceable, keys_of, replace_output, unit_rows

KINDS = ("flat", "hnsw", "auto")
INDEX_FILES = ("index.faiss", "keys.parquet", "params.json")
AUTO_FLAT_LIMIT = 1_000_000


def url_log_prior(model: str) -> np.ndarray:
    """ns_exponent · log count(w) per word id; -inf for words never seen in training."""
    with open(os.path.join(model, "config.json")) as fh:
        ns_exponent = json.load(fh)["ns_exponent"]
    with pa.memory_map(os.path.join(model, "vocab.arrow")) as source:
        counts = pa.ipc.open_file(source).read_all().column("count").to_numpy().astype(np.float64)
    with np.errstate(divide="ignore"):
        return (ns_exponent * np.log(counts)).astype(np.float32)


def prior_queries(doc_vectors: np.ndarray) -> np.ndarray:
    """[d, 1]: the user side of the model's log P(url | user) as one inner product."""
    return np.ascontiguousarray(np.hstack([doc_vectors, np.ones((len(doc_vectors), 1), np.float32)]))


def prior_targets(words_out: np.ndarray, log_prior: np.ndarray) -> np.ndarray:
    """[o, ns_exponent · log count]: the URL side (never-seen URLs get a huge negative score)."""
    return np.ascontiguousarray(np.hstack([words_out, np.maximum(log_prior, np.float32(-1e30))[:, None]]))


def with_prior(doc_vectors: np.ndarray, words_out: np.ndarray, log_prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Augmented (queries, targets) whose inner product is d·o + log prior: the model's log P(w|d) + const."""
    return prior_queries(doc_vectors), prior_targets(words_out, log_prior)


def load_vectors_parquet(path: str) -> tuple[pa.Array, np.ndarray]:
    """(key, vector) from an exported Parquet file or directory."""
    try:
        data = pq.read_table(path, columns=["key", "vector"])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise UserError(f"{path}: cannot read key/vector Parquet ({exc})") from None
    vectors = data.column("vector").combine_chunks()
    dim = vectors.type.list_size if pa.types.is_fixed_size_list(vectors.type) else None
    if dim is None:
        raise UserError(f"{path}: column 'vector' must be fixed_size_list<float32>, found {vectors.type}")
    return data.column("key").combine_chunks(), checkpoint.matrix_of(vectors, dim).astype(np.float32, copy=False)


def make_index(vectors: np.ndarray, kind: str) -> faiss.Index:
    if kind == "auto":
        kind = "flat" if len(vectors) <= AUTO_FLAT_LIMIT else "hnsw"
    dim = vectors.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 128
    else:
        raise UserError(f"unknown index kind {kind!r} (choose from {', '.join(KINDS)})")
    index.add(vectors)
    return index


def recall_vs_exact(index: faiss.Index, vectors: np.ndarray, k: int = 10, queries: int = 1000, seed: int = 0) -> float:
    """Share of the exact top-k found by `index` for a sample of the indexed vectors as queries."""
    rng = np.random.default_rng(seed)
    q = vectors[rng.choice(len(vectors), min(queries, len(vectors)), replace=False)]
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    k = min(k, len(vectors))
    _, truth = exact.search(q, k)
    _, found = index.search(q, k)
    return float(np.mean([len(set(t) & set(f)) / k for t, f in zip(truth, found)]))


def build_index(out: str, kind: str = "auto", model: str | None = None, table: str = "docs",
                vectors_path: str | None = None, progress: bool = True) -> dict:
    """Build a cosine index (inner product of normalised vectors) and save it with its keys and parameters."""
    t0 = time.perf_counter()
    if (model is None) == (vectors_path is None):
        raise UserError("give either --model (with --table) or --vectors")
    check_replaceable(out, INDEX_FILES)
    if vectors_path:
        keys, matrix = load_vectors_parquet(vectors_path)
    else:
        keys, matrix = keys_of(model, table), checkpoint.read_table(model, table)
    vectors = unit_rows(matrix)
    index = make_index(vectors, kind)
    resolved = "flat" if isinstance(index, faiss.IndexFlat) else "hnsw"
    recall = 1.0 if resolved == "flat" else recall_vs_exact(index, vectors)
    tmp = f"{out.rstrip('/')}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    faiss.write_index(index, os.path.join(tmp, "index.faiss"))
    pq.write_table(pa.table({"key": keys.cast(pa.string())}), os.path.join(tmp, "keys.parquet"))
    params = {"kind": resolved, "requested": kind, "rows": len(vectors), "dim": vectors.shape[1],
              "metric": "inner_product_of_normalized", "source": vectors_path or f"{model}:{table}",
              "recall_at_10_vs_exact": recall, "seconds": round(time.perf_counter() - t0, 3),
              "bytes": os.path.getsize(os.path.join(tmp, "index.faiss"))}
    with open(os.path.join(tmp, "params.json"), "w") as fh:
        json.dump(params, fh, indent=2)
    replace_output(tmp, out, INDEX_FILES)
    if progress:
        print(f"index {resolved}: {len(vectors):,} rows, recall@10 vs exact: {recall:.3f}, "
              f"{params['bytes'] / 2**20:.1f} MiB, {params['seconds']:.1f}s", file=sys.stderr)
    return params


def lookup(keys: pa.Array, wanted: list[str], what: str) -> np.ndarray:
    """Row ids of `wanted` keys; an unknown key is an error with the closest known keys."""
    found = pc.index_in(pa.array(wanted, pa.string()), value_set=keys.cast(pa.string()))
    if found.null_count:
        key = wanted[found.is_null().to_numpy(zero_copy_only=False).argmax()]
        raise UserError(f"unknown {what} key {key!r}{_suggest(keys, key)}")
    rows = found.to_numpy()
    return rows.astype(np.int64)


def _suggest(keys: pa.Array, key: str) -> str:
    prefix = key[:3]
    candidates = keys.filter(pc.starts_with(keys.cast(pa.string()), prefix)) if prefix else keys
    pool = candidates.slice(0, 200_000).to_pylist()
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def neighbors(model: str, keys: list[str], k: int = 10, table: str = "docs", against: str | None = None) -> pa.Table:
    """Top-k rows of `against` (default: the same table) for each query key, excluding the query itself.

    Returns a table of key, neighbor, score, rank (1-based). See model.Model for repeated queries.
    """
    from .model import Model

    return Model.load(model).neighbors(keys, k=k, table=table, against=against)
