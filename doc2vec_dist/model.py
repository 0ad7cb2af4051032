"""A trained model as a Python object: vectors by key and nearest neighbours, loaded once.

Changes when what a loaded model offers a Python user changes (lookups, exact neighbours, infer).

    from doc2vec_dist import Model
    m = Model.load("runs/sample/model")
    m.vector("u54e266157a4c")                        # the user's vector
    m.neighbors("u54e266157a4c", k=10)                # similar users (cosine)
    m.neighbors("u54e266157a4c", against="words_out") # the URLs the model finds likeliest for the user, less
                                                      # those it visited (exclude_seen=False keeps them)
    m.neighbors(vectors=m.infer({"alice": urls}))    # similar users for a user the model never saw
    m.neighbors("https://a.example/", table="words_out")           # similar URLs
    m.url_vectors(["https://a.example/new-page"])    # any URL's vector, composed where the model never saw it
    m.neighbors(urls=["https://a.example/new-page"], table="words_out")  # similar URLs for any URL
    m.neighbors(many_users, k=10, index="runs/sample/users.index")  # a saved (approximate) index

Keys are the strings `prepare` made of the input's ids, so a number finds the user it was (100000 is
"100000"), and a URL is read by the model's URL rule (urls.py), so a page written another way finds
its row (the key column of an answer gives the model's form). Keys, tables and the exact faiss
indexes are loaded on first use and kept, so many queries pay for them once. A vector looked up by key is read from the memory-mapped checkpoint parts, so a lookup in
a 20M-row table does not load the table. Works the same on our models and on `baseline` (gensim) models.
neighbors returns a pyarrow.Table (key, neighbor, score, rank).

A URL the model never saw has no row: vector() and neighbors() by key refuse it, naming url_vectors()
and neighbors(urls=…), which compose a vector for it from its path, host or domain (compose.py) and say
so (`source`: own, path, host or domain).

A user infer could not place (no URL the model knows) has no vector: a row of NaN from `infer`, a
null vector in the Parquet the command writes. neighbors skips such a query and names it in a
ServingWarning (the command line prints it as a `warning:` line); what a message tells a Python
caller to give is an argument (table="words_out"), and the command line's, a flag (--table words_out).
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import modeldir, provenance
from .compose import Composed, UrlComposer, no_vector_line, trained_only, untrained
from .corpus import Corpus
from .errors import UserError
from .ids import id_string
from .index import ServedIndex
from .index_sources import parquet_vectors
from .scoring import (
    ServingWarning,
    check_k,
    counted,
    lookup,
    named,
    neighbor_table,
    prior_queries,
    prior_targets,
    seen_tokens,
    unit_rows,
    url_log_prior,
)
from .urls import UrlRule, normalize, recorded

SEARCH_BATCH = 1024  # queries searched together when each must look past the URLs its user visited


@dataclasses.dataclass
class _MappedPart:
    """One memory-mapped checkpoint part: its ids (sorted), and its record batches as zero-copy
    [rows, dim] views with the position where each starts. The part is verified once when first
    used (its checksum reads it through); a lookup then touches only the ids and the rows it needs."""
    ids: np.ndarray
    order: np.ndarray | None   # position in the part of each sorted id, if the part was not in id order
    starts: np.ndarray
    batches: list[np.ndarray]

    @classmethod
    def of(cls, batches: list[tuple[np.ndarray, np.ndarray]]) -> _MappedPart:
        ids = np.concatenate([b[0] for b in batches]) if batches else np.zeros(0, np.int64)
        order = None
        if np.any(np.diff(ids) < 0):  # parts are written in id order; sort one that is not
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
        lengths = [len(b[0]) for b in batches]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(ids, order, starts, [b[1] for b in batches])


class Model:
    def __init__(self, path: str):
        # fails early, naming the directory, if it is not a model; a remote model (s3://…) is used
        # from a verified local copy
        self.dir = modeldir.ModelDir.served(path)
        self.path = self.dir.path
        self._keys: dict[str, pa.Array] = {}
        self._tables: dict[str, np.ndarray] = {}
        self._parts: dict[str, list[_MappedPart]] = {}
        self._indexes: dict[tuple[str, str], faiss.Index] = {}
        self._served: dict[str, ServedIndex] = {}
        self._checked: set[tuple[str, str]] = set()  # (index or file, table) whose model was checked
        self._corpus: tuple[Corpus | None, str | None] | None = None  # model_corpus, once asked
        self._shown = path  # the model as the user named it, in messages (a remote one's URI, not its copy)
        self.as_flags = False  # messages name the command line's flags (--table words_out), not arguments
        self._url_rule: UrlRule | None = None
        self._composer: UrlComposer | None = None

    @classmethod
    def load(cls, path: str) -> Model:
        return cls(path)

    def source(self, table: str = "docs") -> dict:
        """Where this model's `table` vectors come from (provenance.of_model): what an index or a vectors
        file made from it records."""
        return provenance.of_model(self.dir, table, None if self._shown == self.path else self._shown)

    def keys(self, table: str = "docs") -> pa.Array:
        if table not in self._keys:
            self._keys[table] = self.dir.keys(table).cast(pa.string())
        return self._keys[table]

    def table(self, name: str = "docs") -> np.ndarray:
        """The whole table in memory (what an exact scan needs)."""
        if name not in self._tables:
            self._tables[name] = self.dir.read_table(name)
        return self._tables[name]

    def rows(self, keys: str | int | list, table: str = "docs") -> np.ndarray:
        """Row ids of keys (a key or a list; numbers as prepare made them strings); an unknown key is
        an error with the closest known keys, or, for a URL asked as a user (or a user as a URL), with
        the table it belongs to."""
        return lookup(self.keys(table), self.key_names(keys, table), table,
                      hint=lambda key: self._other_kind(key, table))

    def key_names(self, keys: str | int | list, table: str = "docs") -> list[str]:
        """Keys as the model names them: strings as prepare made them, and URLs (of a URL table) by the
        model's URL rule, so that HTTPS://Shop.Example/a/ finds https://shop.example/a."""
        names = key_strings(keys)
        if table == "docs" or not self.url_rule.normalize:
            return names
        return normalize(pa.array(names, pa.string()), self.url_rule).to_pylist()

    @property
    def url_rule(self) -> UrlRule:
        """The rule the model's URLs were normalised by (urls.py), recorded in its vocab.arrow."""
        if self._url_rule is None:
            self._url_rule = recorded(self.dir.store.path("vocab.arrow"))
        return self._url_rule

    def _other_kind(self, key: str, table: str) -> str | None:
        """What to say of a key unknown to `table` that is a key of the model's other kind of table, or of
        a URL unknown to a URL table (that a vector can be composed for it)."""
        other = "words_out" if table == "docs" else "docs"
        if table != "docs" and self.composer().compose(pa.array([key], pa.string())).has_vector[0]:
            way = "--url" if self.as_flags else "url_vectors()"
            return f": the model never saw this URL; {way} composes a vector for it from its path, host or domain"
        try:
            known = self.keys(other)
        except UserError:  # a model without that key table (one written by hand): nothing to say
            return None
        if pc.index_in(pa.array(self.key_names(key, other), pa.string()), value_set=known)[0].is_valid:
            add, drop = ("add", "drop") if self.as_flags else ("give", "leave out")
            if other == "words_out":
                return (f": it is a URL of the model's vocabulary, not a user; {add} {self._option('table', 'words_out')}"
                        " for similar URLs")
            return (f": it is a user of the model, not a URL; {drop} {self._option('table', table)} for similar users "
                    f"({self._option('against', 'words_out')}: the URLs likeliest for the user)")
        return None

    def _option(self, name: str, value) -> str:
        """How a message names an option: the command line's flag (--table words_out, --no-exclude-seen)
        where `as_flags` is set, else the Python argument (table="words_out", exclude_seen=False)."""
        if not self.as_flags:
            return f'{name}="{value}"' if isinstance(value, str) else f"{name}={value!r}"
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            return f"--{flag}" if value else f"--no-{flag}"
        return f"--{flag} {value}"

    def vector(self, key: str | int, table: str = "docs") -> np.ndarray:
        return self.vectors([key], table)[0]

    def vectors(self, keys: str | int | list, table: str = "docs") -> np.ndarray:
        """[len(keys), dim] float32 rows of these keys."""
        return self.gather(table, self.rows(keys, table))

    def composer(self) -> UrlComposer:
        """The parts of the model's URLs, weighted by their training counts (compose.py), made once."""
        if self._composer is None:
            vocab = self.dir.vocab()  # (a URL no event trained is one it never saw, as infer reads it)
            counts = vocab.column("count").to_numpy()
            tokens = trained_only(vocab.column("token").combine_chunks(),
                                  untrained(counts, lambda ids: self.gather("words_out", ids)))
            self._composer = UrlComposer(tokens, counts)
        return self._composer

    def composed(self, urls: str | list, table: str = "words_out") -> Composed:
        """How each URL's vector is made in `table`: the model's own row, else the row of its most specific
        known part (compose.py); the URLs read by the model's URL rule."""
        if table not in ("words_out", "words"):
            raise UserError(f"{table!r} is not one of the URL tables (words_out, words): vectors of URLs come from "
                            f"them; give {self._option('table', 'words_out')}")
        self.dir.spec(table)  # names the table if the model did not train it
        return self.composer().compose(pa.array(self.key_names(urls, table), pa.string()))

    def url_vectors(self, urls: str | list, table: str = "words_out") -> pa.Table:
        """A vector for every URL, the model's or not, as a pyarrow.Table in the order asked: key (the URL
        by the model's rule), vector (null where there is none: a site the model never saw), source
        (own, path, host, domain: whether and from what it was composed; null without a vector) and part
        (the path prefix, host or domain whose row it is). Rows in `table`'s space (words_out: what users
        are scored against; words where the model trained input vectors)."""
        composed = self.composed(urls, table)
        vectors = composed.vectors(self.table(table))
        found = provenance.key_vector_table(composed.keys, vectors, self.source(table), ~composed.has_vector)
        return found.append_column("source", composed.source).append_column("part", composed.part)

    def gather(self, table: str, rows: np.ndarray) -> np.ndarray:
        """Rows by id: from the loaded table if there is one, else from the memory-mapped parts, so
        only the pages of the wanted rows are read."""
        if table in self._tables:
            return self._tables[table][rows]
        out = np.zeros((len(rows), self.dir.spec(table)["dim"]), np.float32)
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
            # each part checked as every reader checks it (ModelDir), then used in place
            self._parts[table] = [_MappedPart.of(batches) for batches in self.dir.parts(table)]
        return self._parts[table]

    def _index(self, table: str, against: str) -> faiss.Index:
        """Exact inner-product index over `against`, built on first use, of its rows that can be an answer: a
        row never trained (all zero: a URL with no event in the corpus) has no direction, and scored 0 (or, by
        its count prior of -inf, -1e30) it filled answers of arbitrary rows."""
        if (table, against) not in self._indexes:
            targets = self.table(against)
            live = targets.any(axis=1)
            if table == "docs" and against == "words_out":
                prior = url_log_prior(self.dir)
                live &= np.isfinite(prior)
                targets = prior_targets(targets, prior)
            else:
                targets = unit_rows(targets)
            index = faiss.IndexIDMap(faiss.IndexFlatIP(targets.shape[1]))
            index.add_with_ids(np.ascontiguousarray(targets[live]), np.flatnonzero(live).astype(np.int64))
            self._indexes[(table, against)] = index
        return self._indexes[(table, against)]

    def saved_index(self, path: str) -> ServedIndex:
        """An index built by `index` (build_index), loaded once."""
        if path not in self._served:
            self._served[path] = ServedIndex.load(path)
        return self._served[path]

    def neighbors(self, keys: str | int | list | None = None, k: int = 10, table: str = "docs",
                  against: str | None = None, index: str | None = None, *,
                  vectors: np.ndarray | None = None, names: list[str] | None = None,
                  vectors_file: str | None = None, exclude_seen: bool | None = None,
                  urls: str | list | None = None) -> pa.Table:
        """Top-k of `against` (default: the same table) for each key, or for each of `vectors`, as a
        pyarrow.Table of key, neighbor, score, rank (1-based).

        keys: a key of `table` or a list of them; the query's own row is left out of its answer.
        vectors: instead of keys, a [dim] or [n, dim] array of vectors of the kind `table` holds, say
        users from `infer`; the key column then holds each vector's position ("0", "1", …), and
        nothing is left out (a vector equal to a row finds that row first). names: the vectors'
        keys instead of their positions; a row with its query's key is then left out, as a key's own row is.
        A vector all NaN (`infer`'s mark of a user it could not place) is skipped, with a
        ServingWarning naming it (by name, else position), and the others answered; NaN in part of
        a row, or inf, is refused.
        vectors_file: the keys are looked up in this key/vector Parquet (what `infer` or `export`
        wrote) instead of the model, so users the model never saw can be queried; a file made from
        another model (or table) is refused, one made from an older version of it is warned about.
        A key whose vector there is null (a user infer could not place) is skipped, as a NaN row is.
        Same table: cosine similarity. Users against words_out: d·o + ns_exponent·log count(url), the
        model's log P(url | user) up to a constant. With `index` (a saved index directory), that
        index is searched by cosine instead of an exact scan.
        exclude_seen: leave out the URLs each user visited (read from the model's corpus, as
        `evaluate` does), searching deeper so that each user still gets k URLs where the vocabulary
        has them. Default: on for user keys against words_out; where the corpus is gone it says so
        (a ServingWarning) and leaves them in. True where it cannot apply (vectors, similar users) is
        an error, as is True without the corpus.
        urls: instead of keys, URLs of `table` (words_out or words), the model's or not: a URL it never
        saw is asked by a vector composed from its path, host or domain (url_vectors), and the answer
        gains a column `source` (own, path, host, domain) saying how each query's vector was made. A
        URL without one (a site the model never saw) is skipped with a ServingWarning; none left, an error.
        """
        k = check_k(k, "neighbors")
        if urls is not None:
            if keys is not None or vectors is not None or vectors_file is not None:
                raise UserError("give --url or --key, not both" if self.as_flags else
                                "neighbors: give urls or keys (or vectors), one of them")
            self._exclude_seen(exclude_seen, False, table, against or table)  # asked for, it cannot apply
            return self._url_neighbors(urls, k, table, against, index)
        if vectors_file is not None:
            if keys is None or vectors is not None:
                given = "--key or --keys-file" if self.as_flags else "the keys argument"
                raise UserError(f"{vectors_file}: give the keys to look up in it ({given})")
            names = self.key_names(keys, table)
            if table == "docs" and (against or table) == "words_out" and exclude_seen is not False:
                self._file_users_of_the_model(vectors_file, names, asked=exclude_seen is True)
            vectors, source = parquet_vectors(vectors_file, names)
            again = "infer or export them again with the model"
            self._check(source.provenance, table, vectors_file, again, again)
            keys = None
        if (keys is None) == (vectors is None):
            raise UserError("neighbors: give keys or vectors, one of the two")
        if vectors is None:
            names = self.key_names(keys, table)
            rows = self.rows(names, table)
            queries = self.gather(table, rows)
        else:
            queries = self._query_vectors(vectors, table)
            rows = None
            if names is not None and len(names) != len(queries):
                raise UserError(f"neighbors: {len(names)} names for {len(queries)} vectors")
        leave_out = rows is not None or names is not None  # the query's own row, known by its row or its key
        by_position = names is None
        names = [str(i) for i in range(len(queries))] if names is None else list(names)
        exclude_seen = self._exclude_seen(exclude_seen, rows is not None, table, against or table)
        if rows is None:
            queries, names = self._skip_unplaced(queries, names, by_position, vectors_file)
        queries, names, rows = self._skip_untrained(queries, names, rows, table, by_position)
        if not names:
            return neighbor_table([], np.zeros((0, 1), np.int64), np.zeros((0, 1), np.float32),
                                  pa.array([], pa.string()), k, None)
        if index is not None:
            return self._saved_neighbors(names, queries, leave_out, k, table, against, index)
        against = against or table
        leave_out = leave_out and against == table
        queries = prior_queries(queries) if table == "docs" and against == "words_out" else unit_rows(queries)
        searched = self._index(table, against)
        seen = self._seen_urls(rows, asked=exclude_seen is True) if exclude_seen is not False else None
        if seen is not None:
            scores, found = _search_unseen(searched, queries, seen, k)
            return neighbor_table(names, found, scores, self.keys(against), k, None)
        scores, found = searched.search(np.ascontiguousarray(queries), min(k + int(leave_out), searched.ntotal))
        is_self = None
        if leave_out:
            is_self = found == rows[:, None] if rows is not None else _same_key(self.keys(against), found, names)
        return neighbor_table(names, found, scores, self.keys(against), k, is_self)

    def _url_neighbors(self, urls: str | list, k: int, table: str, against: str | None, index: str | None) -> pa.Table:
        """neighbors(urls=…): each URL asked by its own row or a composed one, the answer saying which."""
        composed = self.composed(urls, table)
        names = composed.keys.to_pylist()
        missing = ~composed.has_vector
        if missing.any():
            said = no_vector_line([names[i] for i in np.flatnonzero(missing)], int(missing.sum()))
            if missing.all():
                raise UserError(said)
            warnings.warn(said, ServingWarning, stacklevel=3)
        asked = [name for name, out in zip(names, missing) if not out]
        found = self.neighbors(vectors=composed.vectors(self.table(table))[~missing], names=asked, k=k, table=table,
                               against=against, index=index)
        source = dict(zip(names, composed.source.to_pylist()))
        return found.append_column("source", pa.array([source[key] for key in found.column("key").to_pylist()],
                                                      pa.string()))

    def _exclude_seen(self, asked: bool | None, by_key: bool, table: str, against: str) -> bool | None:
        """Whether to leave out the URLs each user visited: `asked`, else (None: on) where it applies,
        users of the model asked by key against words_out; asked where it does not apply: an error."""
        applies = by_key and table == "docs" and against == "words_out"
        if asked and not applies:
            name = "--exclude-seen" if self.as_flags else "exclude_seen"
            raise UserError(f"neighbors: {name} leaves out the URLs a user visited: it needs users of the model, by "
                            f"key, {self._option('against', 'words_out')}")
        return asked if applies else False

    def _file_users_of_the_model(self, vectors_file: str, names: list[str], asked: bool) -> None:
        """Users asked from a vectors file (--vectors) against words_out whose keys are the model's own: the
        URLs they visited are not left out (the vectors are the file's, not the model's rows): an error
        where exclude_seen was asked for, else a ServingWarning naming them."""
        keys = self.keys("docs").cast(pa.string())  # the few names hashed, the model's keys scanned past them
        found = set(keys.filter(pc.is_in(keys, value_set=pa.array(names, pa.string()))).to_pylist())
        own = [name for name in names if name in found]
        how = "ask them by key without " + ("--vectors" if self.as_flags else "vectors_file")
        if asked:
            name = "--exclude-seen" if self.as_flags else "exclude_seen"
            raise UserError(f"neighbors: {name} leaves out the URLs a user of the model visited, read from its corpus "
                            f"by its row: the users of {vectors_file} are asked by the file's vectors; "
                            + (f"{how} ({named(own)} are the model's)" if own else "a user the model never saw "
                               "visited nothing it knows"))
        if own:
            warnings.warn(f"neighbors: {counted(len(own), 'user')} of {vectors_file} asked against words_out "
                          f"{'is' if len(own) == 1 else 'are'} the model's ({named(own)}): asked by the file's "
                          f"vectors, the URLs they visited are not left out of the answer; {how} to leave them out",
                          ServingWarning, stacklevel=4)

    def _seen_urls(self, rows: np.ndarray, asked: bool) -> list[np.ndarray] | None:
        """The URL ids each user of `rows` visited (its tokens in the model's corpus); None, with a
        warning, where the corpus cannot be read (an error when exclude_seen was asked for)."""
        # checked once a Model, and again where corpus.json changed since (a serving process outlives a prepare):
        # another corpus of the same sizes would answer for other users
        if self._corpus is None or (self._corpus[0] is not None and self._corpus[0].replaced_since()):
            self._corpus = model_corpus(self.dir)
        corpus, problem = self._corpus
        if problem is None:
            seen = seen_tokens(corpus.path, rows)
            return [seen.get(int(row), _NO_URLS) for row in rows]
        if asked:
            raise UserError(f"neighbors: {problem}: the URLs each user visited cannot be left out; give "
                            f"{self._option('exclude_seen', False)}")
        warnings.warn(f"neighbors: {problem}: the URLs each user visited are not left out of the answer",
                      ServingWarning, stacklevel=3)
        return None

    def _skip_unplaced(self, queries: np.ndarray, names: list[str], by_position: bool,
                       vectors_file: str | None) -> tuple[np.ndarray, list[str]]:
        """The queries less those all NaN (users infer could not place: a null vector in `vectors_file`),
        which a ServingWarning names."""
        unplaced = np.isnan(queries).all(axis=1)
        if not unplaced.any():
            return queries, names
        n, who = int(unplaced.sum()), "a user" if unplaced.sum() == 1 else "users"
        skipped = [names[i] for i in np.flatnonzero(unplaced)]
        if vectors_file is not None:
            said = (f"{vectors_file}: {counted(n, 'key')} asked {'has' if n == 1 else 'have'} a null vector ({who} "
                    f"infer could not place), left out of the answer: {named(skipped)}")
        else:
            listed = f"at position{'' if n == 1 else 's'} {named(skipped)}" if by_position else named(skipped)
            said = f"neighbors: {counted(n, 'vector')} all NaN ({who} infer could not place) left out of the answer: {listed}"
        warnings.warn(said, ServingWarning, stacklevel=3)
        return queries[~unplaced], [name for name, out in zip(names, unplaced) if not out]

    def _skip_untrained(self, queries: np.ndarray, names: list[str], rows: np.ndarray | None, table: str,
                        by_position: bool) -> tuple[np.ndarray, list[str], np.ndarray | None]:
        """The queries less those all zero, which a ServingWarning names: a row never trained (a URL with no
        event in the corpus: seen only in held-out pairs, or cut by --max-tokens-per-doc) has no direction,
        and every row scored 0 against it, an arbitrary answer."""
        zero = ~queries.any(axis=1)
        if not zero.any():
            return queries, names, rows
        n = int(zero.sum())
        skipped = [names[i] for i in np.flatnonzero(zero)]
        what = (f"{counted(n, 'key')} asked of {table}" if rows is not None else counted(n, "vector"))
        listed = named(skipped)
        if by_position and rows is None:
            listed = f"at position{'' if n == 1 else 's'} {listed}"
        warnings.warn(f"neighbors: {what} {'is' if n == 1 else 'are'} all zero (a row never trained: no event of it "
                      "in the corpus, as for a URL seen only in held-out pairs; no direction to compare), left out of "
                      f"the answer: {listed}", ServingWarning, stacklevel=3)
        keep = ~zero
        return (queries[keep], [name for name, out in zip(names, zero) if not out],
                rows[keep] if rows is not None else None)

    def _check(self, recorded: dict | None, table: str, what: str, redo: str, remake: str) -> None:
        """provenance.check of vectors made from a model against this one, once per (index or file, table)."""
        if (what, table) not in self._checked:
            provenance.check(recorded, self.source(table), what, redo=redo, remake=remake)
            self._checked.add((what, table))

    def _query_vectors(self, vectors, table: str) -> np.ndarray:
        """[n, dim] float32 from a [dim] or [n, dim] array-like, checked against the table's dim."""
        spec = self.dir.spec(table)
        try:
            queries = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError):
            raise UserError(f"neighbors: vectors must be numbers, a [{spec['dim']}] or [n, {spec['dim']}] "
                            "array") from None
        queries = queries[None, :] if queries.ndim == 1 else queries
        if queries.ndim != 2 or queries.shape[1] != spec["dim"]:
            raise UserError(f"neighbors: vectors of shape {np.shape(vectors)}, table {table} holds "
                            f"{spec['dim']}-dim vectors: give [{spec['dim']}] or [n, {spec['dim']}]")
        bad = ~np.isfinite(queries)
        broken = bad.any(axis=1) & ~np.isnan(queries).all(axis=1)  # a row all NaN is a user without a vector
        if broken.any():
            i = int(np.argmax(broken))
            raise UserError(f"neighbors: the vector at position {i} holds NaN or inf in {int(bad[i].sum())} of its "
                            f"{spec['dim']} elements (only a row all NaN, a user infer could not place, is skipped)")
        return np.ascontiguousarray(queries)

    def _saved_neighbors(self, names, vectors, leave_out, k, table, against, path) -> pa.Table:
        served = self.saved_index(path)
        if against not in (None, table):
            drop = "drop" if self.as_flags else "leave out"
            raise UserError(f"{path}: a saved index answers cosine similarity within its own table; "
                            f"{drop} {self._option('against', against)} or {drop} "
                            f"{'--index' if self.as_flags else 'index='}")
        # an index of another model (or table) is refused
        self._check(served.params.get("provenance"), table, path,
                    f"update it: doc2vec-dist index --update {path} --model {self._shown} --table {table} --out {path}",
                    f"an index of it: doc2vec-dist index --model {self._shown} --table {table} --out NEW_INDEX")
        if vectors.shape[1] != served.index.d:
            raise UserError(f"{path}: index vectors have {served.index.d} dims, table {table} has {vectors.shape[1]}")
        scores, found = served.search(unit_rows(vectors), k + int(leave_out), warn_short=False)
        keys = served.keys
        # faiss ids are the index's own row order, so the query is recognised by its key
        is_self = _same_key(keys, found, names) if leave_out else None
        # what each query gets: its rows found, less its own, up to k (said when short, with the knob)
        served.say_short(np.minimum((found >= 0).sum(axis=1) - (is_self.any(axis=1) if leave_out else 0), k),
                         min(k, served.live_rows - int(leave_out)))
        return neighbor_table(names, found, scores, keys, k, is_self)

    def infer(self, events, *, doc_col: str = "user_id", token_col: str = "url", time_col: str | None = None,
              **options) -> np.ndarray:
        """Vectors for users the model never saw, from their events; the model is unchanged.

            m.infer({"alice": [url1, url2, url3], "bob": [url4]})   # dict user → URLs in order: [2, dim]
            m.infer([("alice", url1), ("bob", url4), ("alice", url2)])  # (user, url) pairs in order
            m.infer(events_table, time_col="ts")    # pyarrow Table (or pandas) with doc_col, token_col

        Returns [n_users, dim] float32, one row per user in the order users were given (dict order,
        else first appearance; no users: [0, dim]). Keys are compared as strings and read as prepare
        reads them, stripped of whitespace (" alice" is read as "alice", in its own row): two keys that
        are one user so read (1 and "1" in a dict, " a" and "a"), or a dict's or pair's key that is None
        or empty, are a UserError; a table's rows with a null or empty key are skipped and counted, as
        prepare skips them. A dict's None is a user with no URL. A URL the model never saw counts by a
        row composed from its path, host or domain (compose.py; compose=False drops it), and so does one
        of its vocabulary that no event trained (held out, or cut). A user none of whose URLs the model
        knows, nor their sites, gets a row of NaN (no vector: neighbors skips it), and a ServingWarning names such
        users (the first few, and how many); the events with unknown URLs are counted in the log. Where no
        event of the call has a URL it knows (another site, another column read as the URL), it is a
        UserError, as for the `infer` command, even for one user. options:
        epochs, alpha, min_alpha (finite), seed (default 1: the same events and seed give the same
        vectors), batch_users, progress, compose, tmp_dir. See
        doc2vec_dist.infer for the method (gensim's infer_vector, batched, frozen output weights).
        """
        from .infer import infer_events

        return infer_events(self.path, events, doc_col=doc_col, token_col=token_col, time_col=time_col,
                            table=self.table, **options)


def neighbors(model: str, keys: list[str] | None = None, k: int = 10, table: str = "docs", against: str | None = None,
              index: str | None = None, *, vectors: np.ndarray | None = None,
              vectors_file: str | None = None, exclude_seen: bool | None = None, as_flags: bool = False,
              urls: list[str] | None = None) -> pa.Table:
    """Top-k rows of `against` (default: the same table) for each query key, excluding the query itself,
    or for each of `vectors` ([dim] or [n, dim], say users from infer) instead of keys, or for keys
    looked up in `vectors_file` (a key/vector Parquet from infer or export) instead of the model, or
    for each of `urls`, the model's or not (Model.neighbors says how, and the column `source` it adds).

    With `index`, a saved index (from build_index) is searched instead of an exact scan. Returns a
    pyarrow.Table of key, neighbor, score, rank (1-based). exclude_seen as Model.neighbors; as_flags:
    messages name the command line's flags (the CLI's call). Model.neighbors, for repeated queries,
    keeps what it loads.
    """
    found = Model.load(model)
    found.as_flags = as_flags
    return found.neighbors(keys, k=k, table=table, against=against, index=index, vectors=vectors,
                           vectors_file=vectors_file, exclude_seen=exclude_seen, urls=urls)


_NO_URLS = np.zeros(0, np.int32)


def model_corpus(found: modeldir.ModelDir, path=None) -> tuple[Corpus | None, str | None]:
    """The corpus the model was trained on, at `path` (default: config.json's), or None and why not: none named,
    gone, unreadable, or another corpus now at that path: other sizes (corpus_problem: the model's key tables',
    and the tokens its manifest records) or other users or URLs row for row (modeldir.other_rows, as train
    --resume checks). Another corpus would give each user another user's events and visited URLs."""
    if path is None:
        try:
            path = found.corpus_path()
        except UserError as exc:
            return None, str(exc)
    if not isinstance(path, str):
        return None, "config.json names no corpus"
    try:
        corpus, problem = corpus_problem(path, found.key_count("docs"), found.key_count("words_out"),
                                         (found.manifest.get("corpus_stats") or {}).get("num_tokens"))
        other = modeldir.other_rows(found, corpus) if corpus is not None else None
        if other:
            what, row, theirs, ours = other
            return None, (f"the model's corpus {path} is not the one it was trained on: {found.path} was trained on "
                          f"other {what} (row {row:,}: {theirs!r} in the model, {ours!r} in the corpus)")
    except UserError as exc:
        return None, f"the model's corpus cannot be read ({exc})"
    return corpus, problem


def corpus_problem(path: str, users: int, urls: int, tokens: int | None = None) -> tuple[Corpus | None, str | None]:
    """The corpus at `path` (a model's, config.json names it), or None and why it is not the one a model of
    `users` users and `urls` URLs (and `tokens` tokens, where its manifest says) was trained on: gone, or of
    other sizes. A corpus that cannot be read raises its UserError. (Of the same sizes, its rows may still be
    other users': trainer._same_rows compares the key tables.)"""
    if not os.path.exists(path):
        return None, f"the model's corpus {path} is gone"
    corpus = Corpus(path)
    if (corpus.num_docs, corpus.vocab_size) != (users, urls):
        return None, (f"the model's corpus {path} is not the one it was trained on ({corpus.num_docs:,} users and "
                      f"{corpus.vocab_size:,} URLs, the model {users:,} and {urls:,})")
    if tokens is not None and corpus.num_tokens != tokens:
        return None, (f"the model's corpus {path} is not the one it was trained on ({corpus.num_tokens:,} tokens, the "
                      f"model's {tokens:,})")
    return corpus, None


def _search_unseen(searched: faiss.Index, queries: np.ndarray, seen: list[np.ndarray],
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) [n, k] of each query's best rows less its `seen` ids (-1 past what is left): each
    batch of queries searched k + (most seen in the batch) deep, so every query keeps k where it can."""
    scores = np.full((len(queries), k), -np.inf, np.float32)
    found = np.full((len(queries), k), -1, np.int64)
    for start in range(0, len(queries), SEARCH_BATCH):
        mine = seen[start:start + SEARCH_BATCH]
        width = min(k + max(len(s) for s in mine), searched.ntotal)
        got_scores, got = searched.search(np.ascontiguousarray(queries[start:start + len(mine)]), width)
        for j, visited in enumerate(mine):
            keep = np.flatnonzero((got[j] >= 0) & ~np.isin(got[j], visited))[:k]
            found[start + j, :len(keep)], scores[start + j, :len(keep)] = got[j, keep], got_scores[j, keep]
    return scores, found


def _same_key(keys: pa.Array, found: np.ndarray, names: list[str]) -> np.ndarray:
    """[n, k] bool: whether each found id's key (a row of `keys`) is its query's name."""
    same = pc.equal(keys.take(pa.array(np.maximum(found, 0).ravel())),
                    pa.array(np.repeat(names, found.shape[1]), pa.string()))
    return same.fill_null(False).to_numpy(zero_copy_only=False).reshape(found.shape)


def key_strings(keys) -> list[str]:
    """A key or a list of keys as the strings prepare made of the input's ids (100000 → "100000")."""
    if isinstance(keys, (str, bytes, int, float, np.generic)):
        keys = [keys]
    names = [id_string(key) for key in keys]
    bad = next((key for key, name in zip(keys, names) if not isinstance(name, str)), None)
    if bad is not None or any(name is None for name in names):
        raise UserError(f"key {bad!r}: a key is a string or a number")
    return names
