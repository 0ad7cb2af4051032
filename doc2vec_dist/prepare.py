"""prepare: raw events in, a corpus directory out (the format is corpus.py's).

Changes when the way a corpus is made changes: the passes, the vocabulary, the held-out split, the
skips and their report. `prepare` turns browsing events (or token lists, or plain text; readers.py)
into the corpus that training reads. It never holds the events in memory, only the vocabulary (one
row per distinct token):

    pass 1  stream every input, count tokens and rows, check columns  → vocabulary, ids by frequency
    pass 2  stream every input again, map tokens to ids, spill each event into bucket hash(key) % B
    pass 3  per bucket: group the events into documents, hold out, number them, write shard b

B is chosen so that one bucket fits in `memory_budget_bytes`. Everything is written under a temporary
sibling of the output directory and renamed into place at the very end, so an error or an interrupt
never leaves a half-written corpus behind.

Within a shard, documents keep the order in which they first appear in the input, so a small text
corpus (one shard) has doc id == line number unless lines were skipped.

Bad input. Each kind either stops `prepare` with a one-line CorpusError naming the file (and the column
and row where known), leaving nothing at the output, or is skipped, counted in corpus.json's "skipped"
(where the first few were in "skipped_where") and reported one line per reason (logged as warnings
of the "doc2vec_dist.prepare" logger). Rows and lines in messages are counted from 0 within their
file (a CSV header is not a row), as text keys are.

    errors   no input file; a missing column (the message lists the columns the file has); a key or
             token column holding lists or structs; a time column that is not a time; a file that is
             not what its name says (a corrupt or truncated Parquet among good ones, malformed JSON
             or CSV rows); invalid UTF-8 in a column of a CSV, JSON or Parquet file (a whole file in
             another encoding is the usual cause, and training on whatever part decodes would be
             wrong silently); all inputs empty, or nothing left once the skips below are made.
    skips    an empty file among non-empty ones; rows whose key is null or empty ("null_keys",
             "empty_keys"); null or empty tokens; text lines that are not valid UTF-8 (the line
             keeps its number, so later keys do not shift); duplicate events, i.e. the same
             (key, token, time) more than once when time_col is given ("duplicate_events": without
             a time column a repeated (user, URL) is a repeated visit, which is signal, and is kept;
             rows without a time are never duplicates); tokens below min_count or beyond max_vocab;
             documents left with no token.
    kept     integer, float and boolean keys and tokens become strings ("7" from 7 and from 7.0, so
             ids written as numbers by one exporter and as strings by another still meet, as do
             JSON lines whose ids are strings in some rows and numbers in others); documents
             with a single token train like any other and are counted in "docs_with_one_token";
             with holdout, a document with fewer than 2 distinct tokens keeps them all for training
             ("docs_without_heldout"). Long documents are kept whole, never truncated: a user with
             millions of events is one document (gensim would cut it at 10,000 tokens).

Vocabulary counts for min_count and max_vocab are taken before duplicates are removed (pass 1 sees
events, not users); the counts in vocab.arrow are those of the training tokens.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import outputs
from .corpus import (
    DOCS_SCHEMA,
    FORMAT_VERSION,
    HOLDOUT_SCHEMA,
    VOCAB_SCHEMA,
    Corpus,
    CorpusError,
    iter_shard,
    one_line,
    write_changed,
    write_shard,
)
from .ids import TokenIds, hash_strings, mix64
from .readers import (
    FORMATS,
    ORDER,
    PER_SECOND,
    TIME_UNITS,
    UNIT_NAMES,
    Chunk,
    Options,
    ReadNotes,
    Skips,
    csv_delimiter,
    expand_inputs,
    iter_chunks,
    unit_by_size,
)

log = logging.getLogger(__name__)


def _compact(counts: dict) -> str:
    """'null_keys 3, empty_files 1': the non-zero counts, for a message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)


def _name_files(files: list[str]) -> str:
    """The inputs in a message: all of them when few, the first three and a count when many."""
    return ", ".join(files) if len(files) <= 3 else f"{', '.join(files[:3])} and {len(files) - 3} more"



# ---------------------------------------------------------------------------------------------------
# A base (prepare --base): an earlier corpus or model whose users and URLs keep their ids
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Base:
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

    def rows(self, join: bool):
        """(keys, word ids, base doc ids) batches for pass 2: one marker row (word id -1) per document,
        so every known user keeps its id even with no event now, then, to join, every document's
        tokens in order."""
        for batch in self.docs.to_batches(max_chunksize=1 << 20):
            yield batch.column(0), np.full(batch.num_rows, -1, np.int32), batch.column(1).to_numpy()
        if not join:
            return
        keys = self.docs.column("key")
        for shard in self.corpus.shard_paths:
            for doc_ids, offsets, tokens in iter_shard(shard):
                docs = np.repeat(doc_ids, np.diff(offsets))
                yield keys.take(pa.array(docs)).combine_chunks(), tokens, docs

    def token_count(self, join: bool) -> int:
        return self.num_docs + (self.corpus.num_tokens if join else 0)


def open_base(path: str, join: bool) -> _Base:
    """The corpus or model at `path` as a base; joining needs the documents (a corpus's shards)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(os.path.join(path, "corpus.json")):
        corpus = Corpus(path)
        return _Base(path, "corpus", _read_mapped(os.path.join(path, "docs.arrow")),
                     _read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks(), corpus,
                     corpus.meta)
    from .checkpoint import ModelDir
    from .errors import UserError

    try:
        model = ModelDir(path)
    except UserError:
        raise CorpusError(f"{path}: --base is neither a corpus (no corpus.json) nor a trained model") from None
    docs = _read_mapped(os.path.join(path, "docs.arrow"))
    vocab = _read_mapped(os.path.join(path, "vocab.arrow")).column("token").combine_chunks()
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
    return _Base(path, "model", docs, vocab, corpus, corpus.meta if corpus is not None else {})


def stored_time_range(meta: dict) -> tuple[list[float] | None, str | None, str | None]:
    """A corpus.json's time_range in epoch seconds, the unit its times are in ("s", or ORDER: numbers
    that only ordered events) and, for a corpus.json from before "time_unit", how its range was read.

    Such a corpus.json kept numeric times as they were read (epoch seconds from timestamps and ISO
    strings, but numbers in whatever unit they had, both mixed when files differed), so each end of
    its range is read in the unit its size says (readers.EPOCH_SECONDS); a range that is no epoch
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


def _read_mapped(path: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read: {one_line(e)}") from e


@dataclass
class _Window:
    """Only the events of the last `days` before the latest one (prepare --window-days)."""

    days: float
    cutoff: float   # seconds since the epoch; events before it are left out
    latest: float


DAY_SECONDS = 86_400.0


def _latest_time(files: list[str], opt: Options, bar) -> float:
    """The latest event time of the inputs (a first read of them, for --window-days)."""
    latest = -np.inf
    for _, chunk in iter_chunks(files, opt):
        if chunk.time is not None and len(chunk.time) and np.isfinite(chunk.time).any():
            latest = max(latest, float(np.nanmax(chunk.time)))
        bar.update(chunk.rows)
    if not np.isfinite(latest):
        raise CorpusError(f"{_name_files(files)}: no event has a time in '{opt.time_col}'; --window-days needs one")
    return latest


def _windowed(chunks, window: _Window | None, skips: Skips | None = None):
    """The chunks with the events before the window's start (or without a time) left out."""
    for path, chunk in chunks:
        if window is not None:
            inside = chunk.time >= window.cutoff  # NaN (no time) is outside
            if not inside.all():
                if skips is not None:
                    skips.add("events_outside_window", int(np.count_nonzero(~inside)), path)
                mask = pa.array(inside)
                chunk = Chunk(chunk.key.filter(mask), chunk.token.filter(mask), chunk.time[inside], chunk.rows,
                              chunk.padding)
        yield path, chunk


# ---------------------------------------------------------------------------------------------------
# Pass 1: counts → vocabulary
# ---------------------------------------------------------------------------------------------------

class _TokenCounter:
    """Merges per-batch value_counts. The vocabulary fits in memory; the events need not."""

    def __init__(self):
        self.parts: list[pa.Table] = []
        self.pending_rows = 0
        self.merged_rows = 0

    def add(self, tokens: pa.Array) -> None:
        if len(tokens) == 0:
            return
        vc = pc.value_counts(tokens)
        self.parts.append(pa.table({"token": vc.field("values"), "count": vc.field("counts")}))
        self.pending_rows += len(vc)
        # Merge once the pending parts outgrow the merged table: amortised linear time.
        if self.pending_rows > max(1 << 20, self.merged_rows):
            self._merge()

    def _merge(self) -> None:
        table = pa.concat_tables(self.parts)
        if len(self.parts) > 1:
            table = table.group_by("token").aggregate([("count", "sum")]).rename_columns(["token", "count"])
        self.parts = [table]
        self.merged_rows = table.num_rows
        self.pending_rows = 0

    def table(self) -> pa.Table:
        if not self.parts:
            return pa.table({"token": pa.array([], pa.string()), "count": pa.array([], pa.int64())})
        self._merge()
        return self.parts[0].select(["token", "count"]).cast(pa.schema([("token", pa.string()),
                                                                        ("count", pa.int64())]))


@dataclass
class _Pass1:
    rows: int
    events: int
    key_bytes: int
    skips: Skips
    vocab: pa.Table  # token, count (input counts), id
    notes: ReadNotes
    input_words: int = 0  # distinct tokens of the inputs
    known_words: int = 0  # of which the base knows (with a base)


def _pass1(files: list[str], opt: Options, min_count: int, max_vocab: int | None, bar,
           base_tokens: pa.Array | None = None, window: _Window | None = None) -> _Pass1:
    counter = _TokenCounter()
    skips, notes = Skips(), ReadNotes()
    rows = events = key_bytes = null_tokens = empty_tokens = 0
    for _, chunk in _windowed(iter_chunks(files, opt, skips, notes), window, skips):
        rows += chunk.rows
        events += len(chunk.token)
        key_bytes += pc.sum(pc.binary_length(chunk.key)).as_py() or 0
        tokens = chunk.token.drop_null()
        null_tokens += chunk.token.null_count - chunk.padding
        nonempty = pc.greater(pc.binary_length(tokens), 0)
        empty_tokens += len(tokens) - (pc.sum(nonempty).as_py() or 0)
        counter.add(tokens.filter(nonempty))
        bar.update(chunk.rows)
    if rows == 0:
        raise CorpusError(f"{_name_files(files)}: the inputs hold no rows"
                          + (" (every file is empty)" if skips.counts["empty_files"] == len(files) else ""))
    skips.add("null_tokens", null_tokens)
    skips.add("empty_tokens", empty_tokens)
    if events == 0:
        raise CorpusError(f"{_name_files(files)}: nothing to prepare, every row was skipped "
                          f"({_compact(skips.counts)})")
    counts = counter.table().sort_by([("count", "descending"), ("token", "ascending")])
    known = 0
    input_words = known_words = counts.num_rows
    if base_tokens is not None:  # the base's tokens keep their ids, whatever their count now
        known = len(base_tokens)
        counts = counts.filter(pc.invert(pc.is_in(counts["token"], value_set=base_tokens)))
        known_words = input_words - counts.num_rows
    frequent = pc.greater_equal(counts["count"], min_count)
    below = pc.sum(counts["count"].filter(pc.invert(frequent))).as_py() or 0
    vocab = counts.filter(frequent)
    beyond = 0
    if max_vocab is not None and known + vocab.num_rows > max_vocab:
        room = max(0, max_vocab - known)
        beyond = pc.sum(vocab["count"].slice(room)).as_py() or 0
        vocab = vocab.slice(0, room)
    if vocab.num_rows == 0 and base_tokens is None:
        lost = _compact(skips.counts)
        raise CorpusError(f"{_name_files(files)}: no token occurs at least min_count={min_count} times"
                          + (f" (skipped: {lost})" if lost else ""))
    if base_tokens is not None:  # new tokens after the base's, by frequency among themselves
        vocab = pa.concat_tables([pa.table({"token": base_tokens, "count": pa.array(np.zeros(known, np.int64))}),
                                  vocab.select(["token", "count"])])
    vocab = vocab.append_column("id", pa.array(np.arange(vocab.num_rows, dtype=np.int32)))
    skips.add("tokens_below_min_count", below)
    skips.add("tokens_beyond_max_vocab", beyond)
    return _Pass1(rows, events, key_bytes, skips, vocab.combine_chunks(), notes, input_words, known_words)


def _choose_buckets(p1: _Pass1, has_time: bool, memory_budget_bytes: int, base_events: int = 0) -> int:
    """Enough buckets that pass 3's working set for one bucket fits the budget.

    Per event a bucket holds its key (bytes + offset), token and time on disk; sorting and grouping
    need about three times that in memory plus a few index arrays. A base adds its documents' rows
    (a marker each, and their tokens when joined), with a time and a base id each.
    """
    per_event = p1.key_bytes / max(p1.events, 1) + 8 + (8 if has_time or base_events else 0) + (8 if base_events else 0)
    working_set = (p1.events + base_events) * (3 * per_event + 32)
    return max(1, math.ceil(working_set / max(memory_budget_bytes, 1)))


# ---------------------------------------------------------------------------------------------------
# Pass 2: events → bucket spill files
# ---------------------------------------------------------------------------------------------------

def _keep_mask(key: pa.Array, ids: np.ndarray) -> np.ndarray:
    """Rows worth spilling: every in-vocabulary event, plus the first row of each key that has none
    in this batch, so pass 3 still knows the document exists (and can report it as empty)."""
    keep = ids >= 0
    if keep.all():
        return keep
    lost = ~keep
    lost_keys = key.filter(pa.array(lost))
    orphan = ~pc.is_in(lost_keys, value_set=key.filter(pa.array(keep))).to_numpy(zero_copy_only=False)
    if orphan.any():
        rows = np.flatnonzero(lost)[orphan]
        codes = pc.dictionary_encode(key.take(pa.array(rows))).indices.to_numpy()
        _, first = np.unique(codes, return_index=True)
        keep[rows[first]] = True
    return keep


def _pass2(files: list[str], opt: Options, token_ids: TokenIds, buckets: int, spill_dir: str,
           bar, base: _Base | None = None, join: bool = True, window: _Window | None = None) -> list[str]:
    # with a base: a time for every event (a base's own tokens sort before the new events: -inf) and
    # the base id of the document each row belongs to (-1: a new event)
    timed = opt.time_col is not None or base is not None
    fields = [("key", pa.string()), ("token", pa.int32())] + ([("time", pa.float64())] if timed else []) \
        + ([("base", pa.int64())] if base is not None else [])
    schema = pa.schema(fields)
    paths = [os.path.join(spill_dir, f"bucket-{b:05d}.arrows") for b in range(buckets)]
    sinks = [pa.OSFile(p, "wb") for p in paths]
    writers = [pa.ipc.new_stream(s, schema) for s in sinks]

    def spill(batch: pa.RecordBatch) -> None:
        if buckets == 1:
            writers[0].write_batch(batch)
            return
        # Hash each distinct key once; a stable sort by bucket keeps input order inside one.
        encoded = pc.dictionary_encode(batch.column(0))
        bucket = (hash_strings(encoded.dictionary) % np.uint64(buckets)).astype(np.int64)
        bucket = bucket[encoded.indices.to_numpy()]
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
        batch = batch.take(pa.array(order))
        for b in np.flatnonzero(np.diff(bounds)):
            writers[b].write_batch(batch.slice(bounds[b], bounds[b + 1] - bounds[b]))

    try:
        for _, chunk in _windowed(iter_chunks(files, opt), window):
            ids = token_ids.lookup(chunk.token)
            keep = _keep_mask(chunk.key, ids)
            columns = [chunk.key, pa.array(ids)]
            if timed:
                columns.append(pa.array(chunk.time if chunk.time is not None else np.zeros(len(ids))))
            if base is not None:
                columns.append(pa.array(np.full(len(ids), -1, np.int64)))
            batch = pa.RecordBatch.from_arrays(columns, schema=schema)
            spill(batch if keep.all() else batch.filter(pa.array(keep)))
            bar.update(chunk.rows)
        if base is not None:
            for key, token, doc in base.rows(join):
                spill(pa.RecordBatch.from_arrays([key, pa.array(token, pa.int32()), pa.array(np.full(len(token), -np.inf)),
                                                  pa.array(doc)], schema=schema))
    finally:
        for w, s in zip(writers, sinks):
            w.close()
            s.close()
    return paths


# ---------------------------------------------------------------------------------------------------
# Pass 3: bucket → documents → shard
# ---------------------------------------------------------------------------------------------------

def hold_out(codes: np.ndarray, tokens: np.ndarray, key_hash: np.ndarray, vocab_size: int,
             fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Pick each document's hidden distinct tokens; vectorised over the whole bucket.

    codes/tokens are a bucket's events (doc code, word id), grouped by code. Returns the mask of
    events to keep for training, the hidden (code, word id) pairs, and how many documents have a
    single distinct token, so nothing hidden (a single-event user keeps its event for training).
    The draw for (doc, token) is a hash of (seed, key, token), so it depends neither on the bucket
    count nor on the other documents.
    """
    pair = codes.astype(np.int64) * vocab_size + tokens
    uniq, inverse = np.unique(pair, return_inverse=True)
    pair_doc, pair_tok = uniq // vocab_size, uniq % vocab_size
    ndocs = len(key_hash)
    distinct = np.bincount(pair_doc, minlength=ndocs)
    hide = np.where(distinct >= 2,
                    np.clip(np.floor(fraction * distinct + 0.5), 1, distinct - 1), 0).astype(np.int64)
    draw = mix64(key_hash[pair_doc] ^ mix64(pair_tok.astype(np.uint64)
                                              + mix64(np.array([seed & (2**64 - 1)], np.uint64))[0]))
    order = np.lexsort((pair_tok, draw, pair_doc))  # by doc, then by draw
    group_start = np.concatenate([[0], np.cumsum(distinct)[:-1]])
    rank = np.empty(len(uniq), np.int64)
    rank[order] = np.arange(len(uniq)) - group_start[pair_doc[order]]
    hidden = rank < hide[pair_doc]
    return ~hidden[inverse], pair_doc[hidden], pair_tok[hidden], int(np.count_nonzero(distinct == 1))


def _duplicates(codes: np.ndarray, tokens: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Mask of the events that repeat an earlier one's (doc, token, time) exactly; the first stays.

    A missing time (NaN) equals nothing, so events without a time are never duplicates.
    """
    n = len(codes)
    if n < 2:
        return np.zeros(n, bool)
    order = np.lexsort((np.arange(n), tokens, times, codes))  # equal triples adjacent, earliest first
    same = ((codes[order[1:]] == codes[order[:-1]]) & (tokens[order[1:]] == tokens[order[:-1]])
            & (times[order[1:]] == times[order[:-1]]))
    duplicate = np.zeros(n, bool)
    duplicate[order[1:][same]] = True
    return duplicate



@dataclass
class _Pass3:
    shards: list[dict]
    num_docs: int
    num_tokens: int
    counts: np.ndarray
    docs_without_tokens: int
    heldout: int
    duplicate_events: int
    docs_with_one_token: int     # before the held-out split
    docs_without_heldout: int    # fewer than 2 distinct tokens: nothing to hide
    time_range: list | None = None   # earliest and latest event time kept (seconds), with a time column
    refresh: dict | None = None      # with a base: what is new, what grew, what no longer appears


def _pass3(spills: list[str], tmp: str, vocab_tokens: pa.Array, has_time: bool, holdout: float,
           holdout_path: str | None, seed: int, bar, base: _Base | None = None) -> _Pass3:
    vocab_size = len(vocab_tokens)
    counts = np.zeros(vocab_size, np.int64)
    shards, empty_docs, heldout = [], 0, 0
    duplicates = single = nothing_hidden = 0
    first_time, last_time = np.inf, -np.inf
    early = 0  # input events at or before the base's latest time
    input_users = known_input_users = 0  # with a base: users in the inputs, and those it knows
    hold_writer = pq.ParquetWriter(holdout_path, HOLDOUT_SCHEMA) if holdout_path else None
    # with a base, its documents keep their ids (docs.arrow: its rows with new lengths, then the new
    # users in id order); new events are counted apart for the report
    next_id = base.num_docs if base is not None else 0
    base_lengths = np.zeros(base.num_docs if base is not None else 0, np.int64)
    grown = np.zeros(len(base_lengths), bool)
    new_word_counts = np.zeros(vocab_size, np.int64)
    docs_file = os.path.join(tmp, "docs.arrow" if base is None else "new-docs.arrow")
    try:
        with pa.OSFile(docs_file, "wb") as docs_sink, pa.ipc.new_file(docs_sink, DOCS_SCHEMA) as docs_writer:
            for b, spill in enumerate(spills):
                with pa.OSFile(spill, "rb") as source:
                    table = pa.ipc.open_stream(source).read_all()
                os.remove(spill)  # frees disk as we go: the shard takes its place
                # large_string: a bucket's keys may pass 2 GiB of text when the budget is big.
                keys = table["key"].cast(pa.large_string()).combine_chunks()
                encoded = pc.dictionary_encode(keys)
                # Codes follow first appearance (the spill is in input order), and so do doc ids.
                uniq_keys = encoded.dictionary
                codes = encoded.indices.to_numpy()
                tokens = table["token"].to_numpy()
                timed = "time" in table.column_names
                if timed:
                    times = table["time"].to_numpy()
                    order = np.lexsort((times, codes))  # stable: ties keep input order; a base's tokens first
                else:
                    order = np.argsort(codes, kind="stable")
                base_of_code = None
                if base is not None:
                    rows_base = table["base"].to_numpy()[order]
                    base_of_code = np.full(len(uniq_keys), -1, np.int64)
                    known = rows_base >= 0
                    base_of_code[codes[order][known]] = rows_base[known]
                    in_inputs = np.zeros(len(uniq_keys), bool)
                    in_inputs[codes[order][~known]] = True
                    input_users += int(np.count_nonzero(in_inputs))
                    known_input_users += int(np.count_nonzero(in_inputs & (base_of_code >= 0)))
                del table, keys, encoded
                codes, tokens = codes[order], tokens[order]
                in_vocab = tokens >= 0  # out of the vocabulary, or a base document's marker row
                codes, tokens = codes[in_vocab], tokens[in_vocab]
                if timed:
                    times = times[order][in_vocab]
                fresh = None  # the events the base did not have: after its latest time, when it had times
                if base is not None:
                    fresh = rows_base[in_vocab] < 0
                    if base.latest_time is not None and has_time:
                        early += int(np.count_nonzero(fresh & (times <= base.latest_time)))
                        fresh &= ~(times <= base.latest_time)
                if has_time:
                    # Without a time, a repeated (user, URL) is a repeated visit and stays; with
                    # one, an identical (user, URL, time) is the same event logged twice. (A base's
                    # tokens have no time: they are never duplicates.)
                    duplicate = _duplicates(codes, tokens, np.where(fresh, times, np.nan) if base is not None else times)
                    if duplicate.any():
                        duplicates += int(np.count_nonzero(duplicate))
                        codes, tokens, times = codes[~duplicate], tokens[~duplicate], times[~duplicate]
                        if fresh is not None:
                            fresh = fresh[~duplicate]
                    seen = times[np.isfinite(times)]
                    if len(seen):
                        first_time, last_time = min(first_time, float(seen.min())), max(last_time, float(seen.max()))
                if timed:
                    del times
                single += int(np.count_nonzero(np.bincount(codes, minlength=len(uniq_keys)) == 1))
                if holdout > 0 and len(codes):
                    keep, hid_doc, hid_tok, kept_whole = hold_out(codes, tokens, hash_strings(uniq_keys),
                                                                  vocab_size, holdout, seed)
                    nothing_hidden += kept_whole
                    codes, tokens = codes[keep], tokens[keep]
                    heldout += len(hid_doc)
                    hold_writer.write_table(pa.table(
                        {"key": uniq_keys.take(pa.array(hid_doc)).cast(pa.string()),
                         "token": vocab_tokens.take(pa.array(hid_tok))}, schema=HOLDOUT_SCHEMA))
                lengths = np.bincount(codes, minlength=len(uniq_keys))
                counts += np.bincount(tokens, minlength=vocab_size)
                if base is None:
                    present = np.flatnonzero(lengths)
                    doc_ids = np.arange(next_id, next_id + len(present), dtype=np.int64)
                    new = present
                else:
                    new_word_counts += np.bincount(tokens[fresh], minlength=vocab_size)
                    ours = base_of_code >= 0
                    base_lengths[base_of_code[ours]] = lengths[ours]
                    grown[base_of_code[ours & (np.bincount(codes[fresh], minlength=len(uniq_keys)) > 0)]] = True
                    new = np.flatnonzero(~ours & (lengths > 0))
                    present = np.flatnonzero(lengths)  # the shard's documents; a base's empty ones keep their row
                    doc_ids = base_of_code[present].copy()
                    doc_ids[~ours[present]] = np.arange(next_id, next_id + len(new), dtype=np.int64)
                empty_docs += len(uniq_keys) - len(present) - (int(np.count_nonzero(base_of_code[lengths == 0] >= 0))
                                                               if base is not None else 0)
                next_id += len(new)
                shards.append(write_shard(tmp, b, doc_ids, lengths[present], tokens))
                new_ids = doc_ids if base is None else doc_ids[~ours[present]]
                for s in range(0, len(new), 1 << 20):
                    sl = slice(s, s + (1 << 20))
                    docs_writer.write_batch(pa.RecordBatch.from_arrays(
                        [uniq_keys.take(pa.array(new[sl])).cast(pa.string()),
                         pa.array(new_ids[sl]), pa.array(lengths[new[sl]].astype(np.int64))], schema=DOCS_SCHEMA))
                bar.update(1)
    finally:
        if hold_writer is not None:
            hold_writer.close()
    refresh = None
    if base is not None:
        _write_refreshed_docs(tmp, base, base_lengths, docs_file)
        refresh = _refresh_summary(tmp, base, next_id, grown, base_lengths, new_word_counts, counts, early,
                                   input_users, known_input_users)
    time_range = [first_time, last_time] if np.isfinite(first_time) else None
    return _Pass3(shards, next_id, int(counts.sum()), counts, empty_docs, heldout, duplicates, single,
                  nothing_hidden, time_range, refresh)


def _refresh_summary(tmp: str, base: _Base, num_docs: int, grown: np.ndarray, base_lengths: np.ndarray,
                     new_word_counts: np.ndarray, counts: np.ndarray, early: int, input_users: int,
                     known_input_users: int) -> dict:
    """changed.arrow (the new users and those with new events), and corpus.json's "refresh" counts."""
    write_changed(tmp, np.concatenate([np.flatnonzero(grown), np.arange(base.num_docs, num_docs)]))
    known_words = min(base.vocab_size, len(counts))
    return {"base": base.path, "base_kind": base.kind, "base_docs": base.num_docs,
            "base_vocab": base.vocab_size, "new_docs": num_docs - base.num_docs,
            "grown_docs": int(grown.sum()), "docs_without_new_events": int(base.num_docs - grown.sum()),
            "empty_base_docs": int(np.count_nonzero(base_lengths == 0)),
            "new_words": len(counts) - base.vocab_size,
            "words_without_new_events": int(np.count_nonzero(new_word_counts[:known_words] == 0)),
            "words_without_tokens": int(np.count_nonzero(counts == 0)),
            "events_not_after_base": early, "input_users": input_users, "known_input_users": known_input_users}


def _whole_shard(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A shard file's (doc_ids, offsets, tokens), every document of it."""
    parts = list(iter_shard(path, max_tokens=1 << 62))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32)
    ids = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([np.diff(p[1]) for p in parts])
    return ids, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.concatenate([p[2] for p in parts])


def _pass3_join(spills: list[str], tmp: str, vocab_tokens: pa.Array, has_time: bool, bar, base: _Base) -> _Pass3:
    """Pass 3 of a refresh that joins new events to the documents (prepare --base without a window),
    when the base's shards are by key hash ("shards_by" in its corpus.json): bucket b's new events can
    only be those of base shard b's users (or of its users with an empty document, or of new users),
    so each base shard is read once and written again with each user's new events after its tokens,
    then the new users. The base's tokens are never spilled, sorted or grouped again: the cost is
    the new events' plus one copy of the corpus (the general path, _pass3, re-buckets everything)."""
    vocab_size, buckets = len(vocab_tokens), len(spills)
    counts, new_word_counts = np.zeros(vocab_size, np.int64), np.zeros(vocab_size, np.int64)
    base_keys = base.docs.column("key")
    base_lengths = base.docs.column("length").to_numpy().copy()
    grown = np.zeros(base.num_docs, bool)
    empty = np.flatnonzero(base_lengths == 0)  # known users with no token (a window's): in no shard
    empty_bucket = (hash_strings(base_keys.take(pa.array(empty)).combine_chunks()) % np.uint64(buckets)).astype(np.int64)
    shards, next_id, empty_docs, duplicates, single, early = [], base.num_docs, 0, 0, 0, 0
    input_users = known_input_users = 0  # users in the inputs (every key of a bucket), and those the base knows
    first_time, last_time = np.inf, -np.inf
    docs_file = os.path.join(tmp, "new-docs.arrow")
    with pa.OSFile(docs_file, "wb") as docs_sink, pa.ipc.new_file(docs_sink, DOCS_SCHEMA) as docs_writer:
        for b, spill in enumerate(spills):
            with pa.OSFile(spill, "rb") as source:
                table = pa.ipc.open_stream(source).read_all()
            os.remove(spill)
            encoded = pc.dictionary_encode(table["key"].cast(pa.large_string()).combine_chunks())
            uniq_keys, codes, tokens = encoded.dictionary, encoded.indices.to_numpy(), table["token"].to_numpy()
            times = table["time"].to_numpy() if has_time else None
            order = np.lexsort((times, codes)) if has_time else np.argsort(codes, kind="stable")
            codes, tokens = codes[order], tokens[order]
            in_vocab = tokens >= 0
            codes, tokens = codes[in_vocab], tokens[in_vocab]
            fresh = np.ones(len(codes), bool)  # events the base did not have: after its latest time
            if has_time:
                times = times[order][in_vocab]
                duplicate = _duplicates(codes, tokens, times)
                if duplicate.any():
                    duplicates += int(np.count_nonzero(duplicate))
                    codes, tokens, times = codes[~duplicate], tokens[~duplicate], times[~duplicate]
                    fresh = fresh[~duplicate]
                seen = times[np.isfinite(times)]
                if len(seen):
                    first_time, last_time = min(first_time, float(seen.min())), max(last_time, float(seen.max()))
                if base.latest_time is not None:
                    fresh = ~(times <= base.latest_time)
                    early += int(np.count_nonzero(~fresh))
            del table, encoded, order
            # the base's users this bucket can hold: shard b's, and its users with an empty document
            shard_ids, shard_offsets, shard_tokens = _whole_shard(base.corpus.shard_paths[b])
            shard_keys = base_keys.take(pa.array(shard_ids)).combine_chunks()
            if buckets > 1 and (hash_strings(shard_keys) % np.uint64(buckets) != b).any():
                raise CorpusError(f"{base.corpus.shard_paths[b]}: holds users whose keys hash to another shard, "
                                  f"though {base.corpus.path}/corpus.json says its shards are by key hash")
            empties = empty[empty_bucket == b]
            known_ids = np.concatenate([shard_ids, empties])
            position = pc.index_in(uniq_keys, value_set=pa.concat_arrays(
                [shard_keys.cast(pa.large_string()), base_keys.take(pa.array(empties)).combine_chunks().cast(
                    pa.large_string())])).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            added = np.bincount(codes, minlength=len(uniq_keys))  # new tokens of each key
            known = position >= 0
            input_users += len(uniq_keys)
            known_input_users += int(np.count_nonzero(known))
            grown[known_ids[position[known & (np.bincount(codes[fresh], minlength=len(uniq_keys)) > 0)]]] = True
            # each base document of the shard, then its new events: written to their places in one array
            n_shard = len(shard_ids)
            adds = np.zeros(len(known_ids), np.int64)
            adds[position[known]] = added[known]
            old_lengths = np.diff(shard_offsets)
            lengths = old_lengths + adds[:n_shard]
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            token_position = position[codes]
            known_tokens = token_position >= 0
            additions = tokens[known_tokens][np.argsort(token_position[known_tokens], kind="stable")]
            merged = np.empty(int(offsets[-1]), np.int32)
            merged[np.arange(len(shard_tokens)) + np.repeat(offsets[:-1] - shard_offsets[:-1], old_lengths)] = shard_tokens
            into = adds[:n_shard]
            in_place = int(into.sum())
            merged[np.repeat(offsets[:-1] + old_lengths, into)
                   + np.arange(in_place) - np.repeat(np.cumsum(into) - into, into)] = additions[:in_place]
            # then users whose document was empty and is not now, then new users
            refilled = np.flatnonzero(adds[n_shard:] > 0)
            new_codes = np.flatnonzero(~known & (added > 0))
            empty_docs += int(np.count_nonzero(~known & (added == 0)))
            new_ids = np.arange(next_id, next_id + len(new_codes), dtype=np.int64)
            next_id += len(new_codes)
            doc_ids = np.concatenate([shard_ids, empties[refilled], new_ids])
            doc_lengths = np.concatenate([lengths, adds[n_shard:][refilled], added[new_codes]])
            words = np.concatenate([merged, additions[in_place:], tokens[~known_tokens]])
            shards.append(write_shard(tmp, b, doc_ids, doc_lengths, words))
            counts += np.bincount(words, minlength=vocab_size)
            new_word_counts += np.bincount(tokens[fresh], minlength=vocab_size)
            base_lengths[shard_ids] = lengths
            base_lengths[empties[refilled]] = adds[n_shard:][refilled]
            single += int(np.count_nonzero(doc_lengths == 1))
            for s in range(0, len(new_codes), 1 << 20):
                sl = slice(s, s + (1 << 20))
                docs_writer.write_batch(pa.RecordBatch.from_arrays(
                    [uniq_keys.take(pa.array(new_codes[sl])).cast(pa.string()), pa.array(new_ids[sl]),
                     pa.array(added[new_codes[sl]].astype(np.int64))], schema=DOCS_SCHEMA))
            bar.update(1)
    _write_refreshed_docs(tmp, base, base_lengths, docs_file)
    refresh = _refresh_summary(tmp, base, next_id, grown, base_lengths, new_word_counts, counts, early,
                               input_users, known_input_users)
    time_range = [first_time, last_time] if np.isfinite(first_time) else None
    return _Pass3(shards, next_id, int(counts.sum()), counts, empty_docs, 0, duplicates, single, 0, time_range,
                  refresh)


def _write_refreshed_docs(tmp: str, base: _Base, lengths: np.ndarray, new_docs: str) -> None:
    """docs.arrow of a refreshed corpus, sorted by id: the base's rows (keys and ids as they were,
    the new lengths), then the new users', streamed from the file pass 3 wrote them to."""
    with pa.OSFile(os.path.join(tmp, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, DOCS_SCHEMA) as writer:
        for batch in base.docs.to_batches(max_chunksize=1 << 20):
            start = batch.column(1)[0].as_py()
            writer.write_batch(pa.RecordBatch.from_arrays(
                [batch.column(0), batch.column(1), pa.array(lengths[start:start + batch.num_rows])], schema=DOCS_SCHEMA))
        reader = pa.ipc.open_file(pa.memory_map(new_docs))
        for i in range(reader.num_record_batches):
            writer.write_batch(reader.get_batch(i))
    os.remove(new_docs)


# ---------------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------------

def prepare(inputs: list[str], out: str, *, format: str = "events", doc_col: str = "user_id",
            token_col: str = "url", time_col: str | None = None, min_count: int = 1,
            max_vocab: int | None = None, holdout: float = 0.0, holdout_out: str | None = None,
            seed: int = 1, num_shards: int | None = None, overwrite: bool = False,
            progress: bool = True, memory_budget_bytes: int = 1 << 30, report: bool | None = None,
            base: str | None = None, window_days: float | None = None, time_unit: str | None = None,
            delimiter: str | None = None) -> Corpus:
    """Build a corpus directory at `out` from the inputs (see the module docstring) and open it.

    With holdout=F > 0, each document with at least 2 distinct tokens has max(1, round(F × distinct))
    of them (never all: at least one stays) removed from its training tokens and written as
    (key, token) rows to the Parquet file `holdout_out`; a document with one distinct token keeps it.
    Raises CorpusError (naming the file, column or row) on bad input, and on an output that cannot be
    written; on any error nothing is left at `out` or `holdout_out`, nor directories made for them.
    What was skipped, and why, is in corpus.json ("skipped", "skipped_where"); with `report` (by
    default: with `progress`) a summary and one line per reason are logged (`skip_report`; the
    dropped as warnings, the rest as information, on the "doc2vec_dist.prepare" logger).

    base (a corpus, or a model whose corpus is still there) is a daily refresh: every user and URL of
    the base keeps its id, new ones come after (URLs by their frequency among the new); a user's new
    events join the document it had, after its earlier tokens, and every earlier document stays
    (its user kept, with no new event). With window_days (and time_col) a document is instead the
    events of the last N days before the latest one; a known user with none keeps its id and an empty
    row. Counts, and so subsampling and negatives, are the new corpus's. changed.arrow lists the new
    users and those with new events (train --first-epoch changed). corpus.json's "refresh" counts
    what is new, what grew and what no longer appears. A base that knows none of the inputs' users is
    an error (it is not an earlier corpus of these events), one that knows fewer than
    LOW_OVERLAP of them a warning.

    Times (readers.py) become epoch seconds, UTC, as they are read; numeric ones are in time_unit
    (s, ms, us, ns) or, by default, in the unit their size says, file by file. corpus.json's
    "time_range" and "window_start" are in the unit "time_unit" names: "s" (epoch seconds), or
    "order" when the times were numbers that only order events (refused with window_days or base);
    "time_read" says how each file's times were read. delimiter: of CSV/TSV fields (default ',' for
    .csv, a tab for .tsv).
    """
    if format not in FORMATS:
        raise CorpusError(f"format '{format}' is not one of {', '.join(FORMATS)}")
    if time_col and format != "events":
        raise CorpusError(f"time_col '{time_col}' applies to --format events only, not {format}")
    if min_count < 1:
        raise CorpusError(f"min_count must be >= 1, not {min_count}")
    if max_vocab is not None and max_vocab < 1:
        raise CorpusError(f"max_vocab must be >= 1, not {max_vocab}")
    if num_shards is not None and num_shards < 1:
        raise CorpusError(f"num_shards must be >= 1, not {num_shards}")
    if not 0 <= holdout < 1:
        raise CorpusError(f"holdout must lie in [0, 1), not {holdout}")
    if holdout > 0 and not holdout_out:
        raise CorpusError("holdout > 0 needs holdout_out, the Parquet file for the hidden tokens")
    if holdout == 0 and holdout_out:
        raise CorpusError(f"{holdout_out}: holdout_out is given but holdout is 0")
    if window_days is not None and not (window_days > 0 and time_col):
        raise CorpusError("--window-days needs a time column (--time-col) and a number of days > 0"
                          if not time_col else f"--window-days must be > 0, not {window_days}")
    if time_unit is not None and (time_unit not in TIME_UNITS or not time_col):
        raise CorpusError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {time_unit!r}"
                          if time_unit not in TIME_UNITS else "--time-unit needs a time column (--time-col)")
    delimiter = csv_delimiter(delimiter)
    out = os.path.abspath(os.fspath(out)).rstrip(os.sep)
    found_base = None
    if base is not None:
        if format == "text":
            raise CorpusError("--base with --format text: a text document's key is its line number, so new lines "
                              "cannot join the documents of earlier ones; use --format lists or events")
        if holdout > 0:
            raise CorpusError("--base with --holdout: the base's users were trained on everything they had; hold "
                              "events out of the inputs before preparing the base instead")
        if os.path.abspath(os.fspath(base)).rstrip(os.sep) == out:
            raise CorpusError(f"{out}: --out is the --base; a refresh writes a new corpus and never changes its base")
        found_base = open_base(base, join=window_days is None)
        base_range, base_unit, read_as = stored_time_range(found_base.meta)
        if time_col and base_unit == ORDER:
            raise CorpusError(f"{found_base.path}: its times {base_range} are numbers that only order events, no "
                              "epoch time, so new events cannot be told from those it has: prepare the base again "
                              "with --time-unit, or refresh without --time-col")
        if read_as and time_col:
            log.info(f"{found_base.path}: its corpus.json predates time units; its time range read as {read_as}")
    outputs.check_dir(out, "corpus", overwrite)  # only a corpus of ours is replaced, and only when asked
    if holdout_out:
        outputs.check_file(os.path.abspath(holdout_out), "heldout", overwrite)
    for path in (out, holdout_out):  # a read-only or forbidden place is named before any reading
        outputs.check_writable(path)
    files = expand_inputs(inputs, format)
    opt = Options(format, doc_col, token_col, time_col if format == "events" else None, time_unit, delimiter,
                  "--window-days" if window_days is not None else "--base" if base is not None else None)

    hold_final = os.path.abspath(holdout_out) if holdout_out else None
    bars = {"file": sys.stderr, "disable": not progress, "dynamic_ncols": True}
    made: list[str] = []  # directories we create for the outputs, removed again on failure
    try:
        made += outputs.make_dirs(os.path.dirname(out))
        if hold_final:
            made += outputs.make_dirs(os.path.dirname(hold_final))
        # Both outputs appear whole or not at all, and replace only what was checked at the start (a
        # corpus or held-out file of ours, or nothing): the corpus is committed first, then the file.
        with (outputs.replacing(hold_final, "heldout", overwrite) if hold_final
              else contextlib.nullcontext()) as held, outputs.replacing(out, "corpus", overwrite) as staged:
            tmp, hold_tmp = staged.path, held.path if held else None
            window = None
            if window_days is not None:
                with tqdm(desc="prepare 0/3 latest time", unit=" rows", unit_scale=True, **bars) as bar:
                    latest = _latest_time(files, opt, bar)
                window = _Window(window_days, latest - window_days * DAY_SECONDS, latest)
            join = window is None
            with tqdm(desc="prepare 1/3 count", unit=" rows", unit_scale=True, **bars) as bar:
                p1 = _pass1(files, opt, min_count, max_vocab, bar,
                            found_base.vocab_tokens if found_base else None, window)
            # a join keeps the base's shards by key hash, adding each user's new events to its own shard
            by_shard = (found_base is not None and join and num_shards is None
                        and found_base.corpus.meta.get("shards_by") == "key_hash")
            buckets = found_base.corpus.num_shards if by_shard else num_shards or _choose_buckets(
                p1, time_col is not None, memory_budget_bytes, found_base.token_count(join) if found_base else 0)
            vocab_tokens = p1.vocab["token"].combine_chunks()
            spill_dir = os.path.join(tmp, "spill")
            os.makedirs(spill_dir)
            with tqdm(desc="prepare 2/3 partition", total=p1.rows, unit=" rows", unit_scale=True, **bars) as bar:
                spills = _pass2(files, opt, TokenIds(vocab_tokens), buckets, spill_dir, bar,
                                None if by_shard else found_base, join, window)
            with tqdm(desc="prepare 3/3 shards", total=buckets, unit=" shards", **bars) as bar:
                if by_shard:
                    p3 = _pass3_join(spills, tmp, vocab_tokens, time_col is not None, bar, found_base)
                else:
                    p3 = _pass3(spills, tmp, vocab_tokens, time_col is not None, holdout, hold_tmp, seed, bar,
                                found_base)
            os.rmdir(spill_dir)
            if p3.refresh is not None:
                _check_overlap(found_base, p3.refresh, p1, doc_col, window is not None)

            vocab = pa.table({"token": vocab_tokens, "count": pa.array(p3.counts),
                              "id": p1.vocab["id"]}, schema=VOCAB_SCHEMA)
            with pa.OSFile(os.path.join(tmp, "vocab.arrow"), "wb") as sink, \
                    pa.ipc.new_file(sink, VOCAB_SCHEMA) as writer:
                writer.write_table(vocab, max_chunksize=1 << 20)
            p1.skips.add("duplicate_events", p3.duplicate_events)
            p1.skips.add("docs_without_tokens", p3.docs_without_tokens)
            meta = {
                "format_version": FORMAT_VERSION,
                "num_docs": p3.num_docs, "num_tokens": p3.num_tokens, "vocab_size": len(vocab_tokens),
                "num_shards": buckets, "shards": p3.shards,
                "inputs": [os.fspath(i) for i in ([inputs] if isinstance(inputs, str) else inputs)],
                "input_files": [os.path.abspath(f) for f in files], "input_rows": p1.rows,
                "format": format, "doc_col": doc_col, "token_col": token_col, "time_col": opt.time_col,
                "min_count": min_count, "max_vocab": max_vocab, "holdout": holdout,
                "holdout_out": hold_final, "heldout_pairs": p3.heldout, "seed": seed,
                "skipped": p1.skips.counts, "skipped_where": p1.skips.where,
                "docs_with_one_token": p3.docs_with_one_token,
                "docs_without_heldout": p3.docs_without_heldout if holdout > 0 else None,
                "time_range": _union(p3.time_range, found_base.time_range if found_base and join else None),
                "time_unit": (ORDER if ORDER in p1.notes.time_units else "s") if opt.time_col else None,
                "time_read": p1.notes.time_read, "delimiter": delimiter,
                "stripped_whitespace": p1.notes.stripped, "stripped_where": p1.notes.stripped_where,
                "window_days": window_days, "shards_by": "key_hash",  # shard b holds the keys hashing to b
                "window_start": window.cutoff if window else None,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            if p3.refresh is not None:
                meta["refresh"] = {**p3.refresh, "mode": "join" if join else "window"}
            with open(os.path.join(tmp, "corpus.json"), "w") as f:
                json.dump(meta, f, indent=2)
                f.write("\n")
    except BaseException as e:
        outputs.remove_dirs(made)
        if isinstance(e, OSError):  # reading errors are CorpusErrors already: this is the output
            raise CorpusError(f"{out}: cannot write the corpus: {one_line(e)}") from e
        raise

    if report is None:
        report = progress
    if report:
        lines = skip_report(meta)
        log.info(f"prepared {out}: {p3.num_docs:,} docs, {p3.num_tokens:,} tokens, vocabulary "
                 f"{len(vocab_tokens):,}, {buckets} shard(s)"
                 + ("" if any(line.startswith("skipped") for line in lines) else "; skipped: nothing")
                 + (f"; held out {p3.heldout:,} (key, token) pairs to {hold_final}" if hold_final else ""))
        for line in lines:  # what was dropped or changed is a warning; what was kept, information
            (log.warning if line.startswith(("skipped", "stripped")) else log.info)(line)
        if meta.get("refresh"):
            log.info(refresh_report(meta))
    return Corpus(out)


LOW_OVERLAP = 0.10


def _check_overlap(base: _Base, refresh: dict, p1: _Pass1, doc_col: str, window: bool) -> None:
    """A base that knows none of the inputs' users is refused; one that knows few is a warning.

    In a daily refresh most of a day's users came before (a site's returning users), and new users
    are a minority; a base that knows under LOW_OVERLAP of them is more likely another site's or
    another id scheme's (hashed against raw ids, another doc_col) than the one these events follow.
    """
    users, known = refresh["input_users"], refresh["known_input_users"]
    inputs = "the inputs' window" if window else "the inputs"
    counts = (f"{known:,} of the {users:,} users in {inputs} and {p1.known_words:,} of their {p1.input_words:,} "
              f"URLs are known to it ({base.num_docs:,} users, {base.vocab_size:,} URLs)")
    if users and not known:
        raise CorpusError(f"{base.path}: --base shares no user with {inputs}: {counts}; is it an earlier corpus or "
                          f"model of these events (the same '{doc_col}')?")
    if users and known < LOW_OVERLAP * users:
        log.warning(f"{base.path}: --base knows only {known / users:.1%} of the users in {inputs}: {counts}; is "
                    "it an earlier corpus or model of these events?")


def _union(a: list | None, b: list | None) -> list | None:
    """The time range covering both (either may be None)."""
    if a is None or b is None:
        return a or b
    return [min(a[0], b[0]), max(a[1], b[1])]


def refresh_report(meta: dict) -> str:
    """What a refresh (prepare --base) changed, in one line."""
    r = meta["refresh"]
    how = ("new events joined to each user's document" if r["mode"] == "join"
           else f"documents of the last {meta['window_days']:g} day(s)")
    early = ""
    if r.get("events_not_after_base"):
        early = (f"; {r['events_not_after_base']:,} input event(s) at or before the base's latest time "
                 + ("are not counted as new" if r["mode"] == "window" else
                    "joined as new: if the base had them already, they are in the documents twice"))
    inputs = ""
    if r.get("input_users"):
        inputs = (f" (of the inputs' {r['input_users']:,} users, {r['known_input_users']:,} known: "
                  f"{r['known_input_users'] / r['input_users']:.1%})")
    return (f"refresh of {r['base']} ({how}): users {r['base_docs']:,} known, {r['new_docs']:,} new, "
            f"{r['grown_docs']:,} with new events, {r['docs_without_new_events']:,} without"
            + (f" ({r['empty_base_docs']:,} now empty)" if r["empty_base_docs"] else "") + inputs
            + f"; URLs {r['base_vocab']:,} known, {r['new_words']:,} new, {r['words_without_new_events']:,} known ones "
            f"without new events" + (f", {r['words_without_tokens']:,} without any token now"
                                     if r["words_without_tokens"] else "")
            + "; ids kept, new ones after (row r lives on server r % S, so new rows spread evenly)" + early)


def skip_report(meta: dict) -> list[str]:
    """One line per reason prepare dropped something, with the count and where the first ones were,
    then the keys and tokens it stripped of whitespace, how it read each file's times, and what it kept
    that is worth knowing (documents of a single token), from a corpus.json."""
    doc, tok, time = meta.get("doc_col"), meta.get("token_col"), meta.get("time_col")
    fmt = meta.get("format", "events")
    token = "event" if fmt == "events" else "token"
    what = {
        "empty_files": "empty input file(s)",
        "null_keys": f"row(s) with a null '{doc}'",
        "empty_keys": f"row(s) with an empty '{doc}'",
        "invalid_utf8_lines": "line(s) that are not valid UTF-8 (their keys are not reused)",
        "null_tokens": f"{token}(s) with a null '{tok}'" if fmt == "events" else "null token(s)",
        "empty_tokens": f"{token}(s) with an empty '{tok}'" if fmt == "events" else "empty token(s)",
        "events_outside_window": f"event(s) before the window of the last {meta.get('window_days')} day(s) "
                                 "(or without a time)",
        "duplicate_events": f"duplicate event(s): the same '{doc}', '{tok}' and '{time}' as an earlier one",
        "tokens_below_min_count": f"{token}(s) of a token seen fewer than min_count={meta.get('min_count')} "
                                  "times",
        "tokens_beyond_max_vocab": f"{token}(s) of a token beyond the max_vocab={meta.get('max_vocab')} "
                                   "most frequent",
        "docs_without_tokens": "document(s) left with no token (each null, empty or out of the vocabulary)",
    }
    lines = []
    where = meta.get("skipped_where", {})
    for reason, count in meta.get("skipped", {}).items():
        if count:
            first = where.get(reason)
            lines.append(f"skipped {count:,} {what.get(reason, reason)}"
                         + (f" (first: {', '.join(first)})" if first else ""))
    for column, count in (meta.get("stripped_whitespace") or {}).items():
        first = (meta.get("stripped_where") or {}).get(column)
        lines.append(f"stripped leading or trailing whitespace from {count:,} '{column}' value(s), so that they "
                     "match the same values without it" + (f" (first: {', '.join(first)})" if first else ""))
    for what, files in (meta.get("time_read") or {}).items():
        lines.append(f"{_name_files(files)}: '{time}' read as {what}")
    if meta.get("docs_with_one_token"):
        lines.append(f"kept {meta['docs_with_one_token']:,} document(s) with a single {token}: they train "
                     "like any other")
    if meta.get("docs_without_heldout"):
        lines.append(f"held out nothing of {meta['docs_without_heldout']:,} document(s) with one distinct "
                     "token: it stays for training, so they are not in the held-out file")
    return lines
