"""A trained model as a Python object: vectors by key and nearest neighbours, loaded once.

    from doc2vec_dist import Model
    m = Model.load("runs/sample/model")
    m.vector("u54e266157a4c")                        # the user's vector
    m.neighbors("u54e266157a4c", k=10)                # similar users (cosine)
    m.neighbors("u54e266157a4c", against="words_out") # the URLs the model finds likeliest for the user

Tables, keys and the exact faiss indexes are loaded on first use and kept, so many queries pay for
them once. Works the same on our models and on `baseline` (gensim) models.
"""

from __future__ import annotations

import faiss
import numpy as np
import pyarrow as pa

from . import checkpoint
from .export import keys_of, unit_rows
from .index import lookup, prior_queries, prior_targets, url_log_prior


class Model:
    def __init__(self, path: str):
        checkpoint.load_manifest(path)  # fails early, naming the directory, if it is not a model
        self.path = path
        self._keys: dict[str, pa.Array] = {}
        self._tables: dict[str, np.ndarray] = {}
        self._indexes: dict[tuple[str, str], faiss.Index] = {}

    @classmethod
    def load(cls, path: str) -> Model:
        return cls(path)

    def keys(self, table: str = "docs") -> pa.Array:
        if table not in self._keys:
            self._keys[table] = keys_of(self.path, table).cast(pa.string())
        return self._keys[table]

    def table(self, name: str = "docs") -> np.ndarray:
        if name not in self._tables:
            self._tables[name] = checkpoint.read_table(self.path, name)
        return self._tables[name]

    def rows(self, keys: list[str], table: str = "docs") -> np.ndarray:
        """Row ids of keys; an unknown key is an error with the closest known keys."""
        return lookup(self.keys(table), list(keys), table)

    def vector(self, key: str, table: str = "docs") -> np.ndarray:
        return self.table(table)[self.rows([key], table)[0]].copy()

    def _index(self, table: str, against: str) -> faiss.Index:
        """Exact inner-product index over `against`, built on first use."""
        if (table, against) not in self._indexes:
            targets = self.table(against)
            if table == "docs" and against == "words_out":
                targets = prior_targets(targets, url_log_prior(self.path))
            else:
                targets = unit_rows(targets)
            index = faiss.IndexFlatIP(targets.shape[1])
            index.add(np.ascontiguousarray(targets))
            self._indexes[(table, against)] = index
        return self._indexes[(table, against)]

    def neighbors(self, keys: str | list[str], k: int = 10, table: str = "docs",
                  against: str | None = None) -> pa.Table:
        """Top-k of `against` (default: the same table, the query excluded) for each key.

        Same table: cosine similarity. Users against words_out: d·o + ns_exponent·log count(url), the
        model's log P(url | user) up to a constant. Returns key, neighbor, score, rank (1-based).
        """
        keys = [keys] if isinstance(keys, str) else list(keys)
        against = against or table
        rows = self.rows(keys, table)
        same = against == table
        vectors = self.table(table)[rows]
        queries = prior_queries(vectors) if table == "docs" and against == "words_out" else unit_rows(vectors)
        index = self._index(table, against)
        scores, found = index.search(np.ascontiguousarray(queries), min(k + int(same), index.ntotal))
        names = self.keys(against)
        out: dict[str, list] = {"key": [], "neighbor": [], "score": [], "rank": []}
        for key, row, ids, row_scores in zip(keys, rows, found, scores):
            kept = [(i, s) for i, s in zip(ids, row_scores) if i >= 0 and not (same and i == row)][:k]
            for rank, (i, s) in enumerate(kept, 1):
                out["key"].append(key)
                out["neighbor"].append(names[int(i)].as_py())
                out["score"].append(float(s))
                out["rank"].append(rank)
        return pa.table({"key": pa.array(out["key"], pa.string()), "neighbor": pa.array(out["neighbor"], pa.string()),
                         "score": pa.array(out["score"], pa.float32()), "rank": pa.array(out["rank"], pa.int32())})
