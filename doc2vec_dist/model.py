"""A trained model as a Python object: vectors by key and nearest neighbours, loaded once.

    from doc2vec_dist import Model
    m = Model.load("runs/sample/model")
    m.vector("u54e266157a4c")                        # the user's vector
    m.neighbors("u54e266157a4c", k=10)                # similar users (cosine)
    m.neighbors("u54e266157a4c", against="words_out") # the URLs the model finds likeliest for the user
    m.neighbors("https://a.example/", table="words_out")           # similar URLs
    m.neighbors(many_users, k=10, index="runs/sample/users.index")  # a saved (approximate) index

Keys, tables and the exact faiss indexes are loaded on first use and kept, so many queries pay for
them once. A vector looked up by key is read from the memory-mapped checkpoint parts, so a lookup in
a 20M-row table does not load the table. Works the same on our models and on `baseline` (gensim) models.
"""

from __future__ import annotations

import dataclasses
import os

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import checkpoint
from .errors import UserError
from .export import keys_of, unit_rows
from .index import ServedIndex, lookup, neighbor_table, prior_queries, prior_targets, url_log_prior


@dataclasses.dataclass
class _MappedPart:
    """One memory-mapped checkpoint part: its ids (sorted), and its record batches as zero-copy
    [rows, dim] views with the position where each starts. Only the ids (8 bytes a row) are read."""
    ids: np.ndarray
    order: np.ndarray | None   # position in the part of each sorted id, if the part was not in id order
    starts: np.ndarray
    batches: list[np.ndarray]

    @classmethod
    def of(cls, data: pa.Table, dim: int) -> _MappedPart:
        ids, order = data.column("id").to_numpy(), None
        if np.any(np.diff(ids) < 0):  # parts are written in id order; sort one that is not
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
        vectors = data.column("vector")
        lengths = [len(chunk) for chunk in vectors.chunks]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(ids, order, starts, [checkpoint.matrix_of(chunk, dim) for chunk in vectors.chunks])


class Model:
    def __init__(self, path: str):
        path = checkpoint.local_copy(path)  # a remote model (s3://…) is used from a verified local copy
        checkpoint.load_manifest(path)  # fails early, naming the directory, if it is not a model
        self.path = path
        self._keys: dict[str, pa.Array] = {}
        self._tables: dict[str, np.ndarray] = {}
        self._parts: dict[str, list[_MappedPart]] = {}
        self._indexes: dict[tuple[str, str], faiss.Index] = {}
        self._served: dict[str, ServedIndex] = {}

    @classmethod
    def load(cls, path: str) -> Model:
        return cls(path)

    def keys(self, table: str = "docs") -> pa.Array:
        if table not in self._keys:
            self._keys[table] = keys_of(self.path, table).cast(pa.string())
        return self._keys[table]

    def table(self, name: str = "docs") -> np.ndarray:
        """The whole table in memory (what an exact scan needs)."""
        if name not in self._tables:
            self._tables[name] = checkpoint.read_table(self.path, name)
        return self._tables[name]

    def rows(self, keys: list[str], table: str = "docs") -> np.ndarray:
        """Row ids of keys; an unknown key is an error with the closest known keys."""
        return lookup(self.keys(table), list(keys), table)

    def vector(self, key: str, table: str = "docs") -> np.ndarray:
        return self.vectors([key], table)[0]

    def vectors(self, keys: list[str], table: str = "docs") -> np.ndarray:
        """[len(keys), dim] float32 rows of these keys."""
        return self._gather(table, self.rows(keys, table))

    def _gather(self, table: str, rows: np.ndarray) -> np.ndarray:
        """Rows by id: from the loaded table if there is one, else from the memory-mapped parts, so
        only the pages of the wanted rows are read."""
        if table in self._tables:
            return self._tables[table][rows]
        _, spec = checkpoint.table_spec(self.path, table)
        out = np.zeros((len(rows), spec["dim"]), np.float32)
        for part in self._mapped_parts(table):
            if not len(part.ids):
                continue
            at = np.minimum(np.searchsorted(part.ids, rows), len(part.ids) - 1)
            hit = np.flatnonzero(part.ids[at] == rows)
            position = at[hit] if part.order is None else part.order[at[hit]]
            batch = np.searchsorted(part.starts, position, side="right") - 1
            for b in np.unique(batch):
                mine = batch == b
                # indexing one batch's zero-copy view copies just these rows; Arrow's take on the
                # whole column would first concatenate the part (GBs) into one array
                out[hit[mine]] = part.batches[b][position[mine] - part.starts[b]]
        return out

    def _mapped_parts(self, table: str) -> list[_MappedPart]:
        if table not in self._parts:
            vdir, spec = checkpoint.table_spec(self.path, table)
            parts = []
            for part in spec["parts"]:
                path = os.path.join(vdir, part["path"])
                if not os.path.isfile(path):
                    raise UserError(f"{path}: part file missing; the checkpoint is damaged")
                with pa.memory_map(path) as source:
                    data = pa.ipc.open_file(source).read_all()
                parts.append(_MappedPart.of(data, spec["dim"]))
            self._parts[table] = parts
        return self._parts[table]

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

    def saved_index(self, path: str) -> ServedIndex:
        """An index built by `index` (build_index), loaded once."""
        if path not in self._served:
            self._served[path] = ServedIndex.load(path)
        return self._served[path]

    def neighbors(self, keys: str | list[str], k: int = 10, table: str = "docs",
                  against: str | None = None, index: str | None = None) -> pa.Table:
        """Top-k of `against` (default: the same table, the query excluded) for each key.

        Same table: cosine similarity. Users against words_out: d·o + ns_exponent·log count(url), the
        model's log P(url | user) up to a constant. With `index` (a saved index directory), that
        index is searched by cosine instead of an exact scan; the query's own key is excluded.
        Returns key, neighbor, score, rank (1-based).
        """
        keys = [keys] if isinstance(keys, str) else list(keys)
        rows = self.rows(keys, table)
        if index is not None:
            return self._saved_neighbors(keys, rows, k, table, against, index)
        against = against or table
        same = against == table
        vectors = self._gather(table, rows)
        queries = prior_queries(vectors) if table == "docs" and against == "words_out" else unit_rows(vectors)
        searched = self._index(table, against)
        scores, found = searched.search(np.ascontiguousarray(queries), min(k + int(same), searched.ntotal))
        is_self = found == rows[:, None] if same else None
        return neighbor_table(keys, found, scores, self.keys(against), k, is_self)

    def _saved_neighbors(self, keys, rows, k, table, against, path) -> pa.Table:
        served = self.saved_index(path)
        if against not in (None, table):
            raise UserError(f"{path}: a saved index answers cosine similarity within its own table; "
                            f"drop --against {against} or drop --index")
        vectors = self._gather(table, rows)
        if vectors.shape[1] != served.index.d:
            raise UserError(f"{path}: index vectors have {served.index.d} dims, table {table} has {vectors.shape[1]}")
        scores, found = served.search(unit_rows(vectors), k + 1)
        names = served.keys
        # faiss ids are the index's own row order, so the query is recognised by its key
        is_self = pc.equal(names.take(pa.array(np.maximum(found, 0).ravel())),
                                   pa.array(np.repeat(keys, found.shape[1]), pa.string()))
        return neighbor_table(keys, found, scores, names, k, is_self.to_numpy(zero_copy_only=False).reshape(found.shape))

    def infer(self, events, *, doc_col: str = "user_id", token_col: str = "url", time_col: str | None = None,
              **options) -> np.ndarray:
        """Vectors for users the model never saw, from their events; the model is unchanged.

            m.infer({"alice": [url1, url2, url3], "bob": [url4]})   # dict user → URLs in order: [2, dim]
            m.infer([("alice", url1), ("bob", url4), ("alice", url2)])  # (user, url) pairs in order
            m.infer(events_table, time_col="ts")    # pyarrow Table (or pandas) with doc_col, token_col

        Returns [n_users, dim] float32, one row per user in the order users were given (dict order,
        else first appearance). A user none of whose URLs the model knows gets a row of zeros; the
        unknown URLs and such users are counted on stderr. options: epochs, alpha, min_alpha, seed
        (default 1: the same events and seed give the same vectors), batch_users, progress. See
        doc2vec_dist.infer for the method (gensim's infer_vector, batched, frozen output weights).
        """
        from .infer import infer_events

        return infer_events(self.path, events, doc_col=doc_col, token_col=token_col, time_col=time_col,
                            table=self.table, **options)
