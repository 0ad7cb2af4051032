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
    one_line,
    write_shard,
)
from .ids import TokenIds, hash_strings, mix64
from .readers import FORMATS, Options, Skips, expand_inputs, iter_chunks

log = logging.getLogger(__name__)


def _compact(counts: dict) -> str:
    """'null_keys 3, empty_files 1': the non-zero counts, for a message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)


def _name_files(files: list[str]) -> str:
    """The inputs in a message: all of them when few, the first three and a count when many."""
    return ", ".join(files) if len(files) <= 3 else f"{', '.join(files[:3])} and {len(files) - 3} more"



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


def _pass1(files: list[str], opt: Options, min_count: int, max_vocab: int | None, bar) -> _Pass1:
    counter = _TokenCounter()
    skips = Skips()
    rows = events = key_bytes = null_tokens = empty_tokens = 0
    for _, chunk in iter_chunks(files, opt, skips):
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
    frequent = pc.greater_equal(counts["count"], min_count)
    below = pc.sum(counts["count"].filter(pc.invert(frequent))).as_py() or 0
    vocab = counts.filter(frequent)
    beyond = 0
    if max_vocab is not None and vocab.num_rows > max_vocab:
        beyond = pc.sum(vocab["count"].slice(max_vocab)).as_py() or 0
        vocab = vocab.slice(0, max_vocab)
    if vocab.num_rows == 0:
        lost = _compact(skips.counts)
        raise CorpusError(f"{_name_files(files)}: no token occurs at least min_count={min_count} times"
                          + (f" (skipped: {lost})" if lost else ""))
    vocab = vocab.append_column("id", pa.array(np.arange(vocab.num_rows, dtype=np.int32)))
    skips.add("tokens_below_min_count", below)
    skips.add("tokens_beyond_max_vocab", beyond)
    return _Pass1(rows, events, key_bytes, skips, vocab.combine_chunks())


def _choose_buckets(p1: _Pass1, has_time: bool, memory_budget_bytes: int) -> int:
    """Enough buckets that pass 3's working set for one bucket fits the budget.

    Per event a bucket holds its key (bytes + offset), token and time on disk; sorting and grouping
    need about three times that in memory plus a few index arrays.
    """
    per_event = p1.key_bytes / max(p1.events, 1) + 8 + (8 if has_time else 0)
    working_set = p1.events * (3 * per_event + 32)
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
           bar) -> list[str]:
    fields = [("key", pa.string()), ("token", pa.int32())] + ([("time", pa.float64())] if opt.time_col else [])
    schema = pa.schema(fields)
    paths = [os.path.join(spill_dir, f"bucket-{b:05d}.arrows") for b in range(buckets)]
    sinks = [pa.OSFile(p, "wb") for p in paths]
    writers = [pa.ipc.new_stream(s, schema) for s in sinks]
    try:
        for _, chunk in iter_chunks(files, opt):
            ids = token_ids.lookup(chunk.token)
            keep = _keep_mask(chunk.key, ids)
            columns = [chunk.key, pa.array(ids)] + ([pa.array(chunk.time)] if opt.time_col else [])
            batch = pa.RecordBatch.from_arrays(columns, schema=schema)
            if not keep.all():
                batch = batch.filter(pa.array(keep))
            if buckets == 1:
                writers[0].write_batch(batch)
            else:
                # Hash each distinct key once; a stable sort by bucket keeps input order inside one.
                encoded = pc.dictionary_encode(batch.column(0))
                bucket = (hash_strings(encoded.dictionary) % np.uint64(buckets)).astype(np.int64)
                bucket = bucket[encoded.indices.to_numpy()]
                order = np.argsort(bucket, kind="stable")
                bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
                batch = batch.take(pa.array(order))
                for b in np.flatnonzero(np.diff(bounds)):
                    writers[b].write_batch(batch.slice(bounds[b], bounds[b + 1] - bounds[b]))
            bar.update(chunk.rows)
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


def _pass3(spills: list[str], tmp: str, vocab_tokens: pa.Array, has_time: bool, holdout: float,
           holdout_path: str | None, seed: int, bar) -> _Pass3:
    vocab_size = len(vocab_tokens)
    counts = np.zeros(vocab_size, np.int64)
    shards, next_id, empty_docs, heldout = [], 0, 0, 0
    duplicates = single = nothing_hidden = 0
    hold_writer = pq.ParquetWriter(holdout_path, HOLDOUT_SCHEMA) if holdout_path else None
    try:
        with pa.OSFile(os.path.join(tmp, "docs.arrow"), "wb") as docs_sink, \
                pa.ipc.new_file(docs_sink, DOCS_SCHEMA) as docs_writer:
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
                if has_time:
                    times = table["time"].to_numpy()
                    order = np.lexsort((times, codes))  # stable: ties keep input order
                else:
                    order = np.argsort(codes, kind="stable")
                del table, keys, encoded
                codes, tokens = codes[order], tokens[order]
                in_vocab = tokens >= 0
                codes, tokens = codes[in_vocab], tokens[in_vocab]
                if has_time:
                    # Without a time, a repeated (user, URL) is a repeated visit and stays; with
                    # one, an identical (user, URL, time) is the same event logged twice.
                    times = times[order][in_vocab]
                    duplicate = _duplicates(codes, tokens, times)
                    if duplicate.any():
                        duplicates += int(np.count_nonzero(duplicate))
                        codes, tokens = codes[~duplicate], tokens[~duplicate]
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
                present = np.flatnonzero(lengths)
                empty_docs += len(uniq_keys) - len(present)
                lengths = lengths[present]
                doc_ids = np.arange(next_id, next_id + len(present), dtype=np.int64)
                next_id += len(present)
                counts += np.bincount(tokens, minlength=vocab_size)
                shards.append(write_shard(tmp, b, doc_ids, lengths, tokens))
                for s in range(0, len(present), 1 << 20):
                    sl = slice(s, s + (1 << 20))
                    docs_writer.write_batch(pa.RecordBatch.from_arrays(
                        [uniq_keys.take(pa.array(present[sl])).cast(pa.string()),
                         pa.array(doc_ids[sl]), pa.array(lengths[sl].astype(np.int64))], schema=DOCS_SCHEMA))
                bar.update(1)
    finally:
        if hold_writer is not None:
            hold_writer.close()
    return _Pass3(shards, next_id, int(counts.sum()), counts, empty_docs, heldout, duplicates, single,
                  nothing_hidden)


# ---------------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------------

def prepare(inputs: list[str], out: str, *, format: str = "events", doc_col: str = "user_id",
            token_col: str = "url", time_col: str | None = None, min_count: int = 1,
            max_vocab: int | None = None, holdout: float = 0.0, holdout_out: str | None = None,
            seed: int = 1, num_shards: int | None = None, overwrite: bool = False,
            progress: bool = True, memory_budget_bytes: int = 1 << 30, report: bool | None = None) -> Corpus:
    """Build a corpus directory at `out` from the inputs (see the module docstring) and open it.

    With holdout=F > 0, each document with at least 2 distinct tokens has max(1, round(F × distinct))
    of them (never all: at least one stays) removed from its training tokens and written as
    (key, token) rows to the Parquet file `holdout_out`; a document with one distinct token keeps it.
    Raises CorpusError (naming the file, column or row) on bad input, and on an output that cannot be
    written; on any error nothing is left at `out` or `holdout_out`, nor directories made for them.
    What was skipped, and why, is in corpus.json ("skipped", "skipped_where"); with `report` (by
    default: with `progress`) a summary and one line per reason are logged (`skip_report`; the
    dropped as warnings, the rest as information, on the "doc2vec_dist.prepare" logger).
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
    out = os.path.abspath(os.fspath(out)).rstrip(os.sep)
    outputs.check_dir(out, "corpus", overwrite)  # only a corpus of ours is replaced, and only when asked
    if holdout_out:
        outputs.check_file(os.path.abspath(holdout_out), "heldout", overwrite)
    files = expand_inputs(inputs, format)
    opt = Options(format, doc_col, token_col, time_col if format == "events" else None)

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
            with tqdm(desc="prepare 1/3 count", unit=" rows", unit_scale=True, **bars) as bar:
                p1 = _pass1(files, opt, min_count, max_vocab, bar)
            buckets = num_shards or _choose_buckets(p1, time_col is not None, memory_budget_bytes)
            vocab_tokens = p1.vocab["token"].combine_chunks()
            spill_dir = os.path.join(tmp, "spill")
            os.makedirs(spill_dir)
            with tqdm(desc="prepare 2/3 partition", total=p1.rows, unit=" rows", unit_scale=True, **bars) as bar:
                spills = _pass2(files, opt, TokenIds(vocab_tokens), buckets, spill_dir, bar)
            with tqdm(desc="prepare 3/3 shards", total=buckets, unit=" shards", **bars) as bar:
                p3 = _pass3(spills, tmp, vocab_tokens, time_col is not None, holdout, hold_tmp, seed, bar)
            os.rmdir(spill_dir)

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
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
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
        for line in lines:  # what was dropped is a warning; what was kept, information
            (log.warning if line.startswith("skipped") else log.info)(line)
    return Corpus(out)


def skip_report(meta: dict) -> list[str]:
    """One line per reason prepare dropped something, with the count and where the first ones were,
    then what it kept that is worth knowing (documents of a single token), from a corpus.json."""
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
    if meta.get("docs_with_one_token"):
        lines.append(f"kept {meta['docs_with_one_token']:,} document(s) with a single {token}: they train "
                     "like any other")
    if meta.get("docs_without_heldout"):
        lines.append(f"held out nothing of {meta['docs_without_heldout']:,} document(s) with one distinct "
                     "token: it stays for training, so they are not in the held-out file")
    return lines
