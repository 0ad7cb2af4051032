"""A base (prepare --base): an earlier corpus or model whose users and URLs keep their ids in a refresh. It is
opened once a process (open_base), its time range read from its metadata (stored_time_range), its Arrow
files read memory-mapped (read_mapped).

Changes when what a base is made of, or how it is read, changes. What a refresh does with it is passes.py's
(its rows spilled), shard_pass.py's (joined to the new events) and prepare.py's (checked, reported).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import pyarrow as pa

from .corpus import (
    Corpus,
    CorpusError,
    one_line,
    shard_has_times,
)
from .read_times import ORDER, PER_SECOND, UNIT_NAMES, unit_by_size

# Rows of a base's docs.arrow that one spill task marks (a row per known user, so that each keeps its id).
BASE_DOCS_ROWS = 1 << 22


@dataclass
class Base:
    """What a refresh keeps of an earlier corpus or model: its key tables (ids) and, to join a user's
    new events to the document it had, the shards of the corpus they came from."""

    path: str
    kind: str                  # corpus | model
    docs: pa.Table             # key, id, length; sorted by id (memory-mapped)
    vocab_tokens: pa.Array     # token of each word id
    corpus: Corpus | None      # whose shards hold the documents (a model's corpus, when still there)
    meta: dict                 # that corpus's corpus.json ({} when unknown)

    @property
    def num_docs(self) -> int:
        return self.docs.num_rows

    @property
    def time_range(self) -> list[float] | None:
        """The base's corpus's time range in epoch seconds (stored_time_range), when it had times."""
        return stored_time_range(self.meta)[0]

    @property
    def latest_time(self) -> float | None:
        """The latest event time of the base's corpus, when it was prepared with a time column."""
        found = self.time_range
        return found[1] if found else None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab_tokens)

    def parts(self, join: bool) -> list[BasePart]:
        """The base's rows for pass 2, as parts a spill task each: one marker row (word id -1) per
        document, so every known user keeps its id even with no event now, then, to join, every
        document's tokens in order, a part per shard."""
        found = [BasePart("docs", start, min(start + BASE_DOCS_ROWS, self.num_docs))
                 for start in range(0, self.num_docs, BASE_DOCS_ROWS)]
        if join:
            found += [BasePart("shard", s) for s in range(self.corpus.num_shards)]
        return found

    @functools.cached_property
    def times_kept(self) -> bool:
        """Whether the base's shards keep their tokens' event times (corpus.py), so that a refresh can tell
        an event sent again from a new one: a corpus prepared with a time column since they are kept."""
        return self.corpus is not None and all(shard_has_times(p) for p in self.corpus.shard_paths)

    def token_count(self, join: bool) -> int:
        return self.num_docs + (self.corpus.num_tokens if join else 0)


@dataclass(frozen=True)
class BasePart:
    """A slice of a base that pass 2 spills: docs.arrow rows [start, stop) as markers, or shard `start`."""

    what: str  # docs | shard
    start: int
    stop: int = 0


def open_base(path: str, join: bool) -> Base:
    """The corpus or model at `path` as a base; joining needs the documents (a corpus's shards)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(os.path.join(path, "corpus.json")):
        corpus = Corpus(path)
        return Base(path, "corpus", read_mapped(os.path.join(path, "docs.arrow")),
                    read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks(), corpus,
                    corpus.meta)
    from .errors import UserError
    from .modeldir import ModelDir

    try:
        model = ModelDir(path)
    except UserError:
        raise CorpusError(f"{path}: --base is neither a corpus (no corpus.json) nor a trained model") from None
    docs = read_mapped(os.path.join(path, "docs.arrow"))
    vocab = read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks()
    corpus = None
    try:
        corpus = Corpus(model.corpus_path())
    except UserError:
        pass
    if corpus is not None and (corpus.num_docs, corpus.vocab_size) != (docs.num_rows, len(vocab)):
        corpus = None  # prepared again since: its ids are not the model's
    if join and corpus is None:
        raise CorpusError(f"{path}: joining new events to the users' documents needs the corpus the model was "
                          f"trained on ({model.settings().get('corpus')}), which is gone or was prepared again; "
                          "give --base CORPUS, or --window-days N to build documents from the inputs alone")
    return Base(path, "model", docs, vocab, corpus, corpus.meta if corpus is not None else {})


@functools.lru_cache(maxsize=2)
def _base(path: str, join: bool) -> Base:
    """open_base, once per process: a task process of a Ray worker runs many tasks of one prepare."""
    return open_base(path, join)


def stored_time_range(meta: dict) -> tuple[list[float] | None, str | None, str | None]:
    """A corpus.json's time_range in epoch seconds, the unit its times are in ("s", or ORDER: numbers
    that only ordered events) and, for a corpus.json from before "time_unit", how its range was read.

    Such a corpus.json kept numeric times as they were read (epoch seconds from timestamps and ISO
    strings, but numbers in whatever unit they had, both mixed when files differed), so each end of
    its range is read in the unit its size says (read_times.EPOCH_SECONDS); a range that is no epoch
    time in any unit was of numbers that only ordered events.
    """
    found, unit = meta.get("time_range"), meta.get("time_unit")
    if not found:
        return None, unit, None
    if unit is not None:
        return [float(t) for t in found], unit, None
    units = [unit_by_size(float(t)) for t in found]
    if None in units:
        return [float(t) for t in found], ORDER, "numbers that only order events (no epoch time in any unit)"
    how = " to ".join(dict.fromkeys(UNIT_NAMES[u] for u in units))
    return [float(t) / PER_SECOND[u] for t, u in zip(found, units)], "s", f"{how}, by their size"


def read_mapped(path: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read: {one_line(e)}") from e
