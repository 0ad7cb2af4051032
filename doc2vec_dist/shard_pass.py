"""prepare's pass 3: a bucket's events from every spill, grouped into documents, deduplicated (and, with a
base, rid of the events it has: sent_again, counted by input block), capped, held out and written as shard b
(with each token's time, given a time column), with the bucket's new documents and held-out pairs beside it;
and renumber, for a shard written before the id of its first new document was known.

Changes when what pass 3 does to a bucket changes; passes 1 and 2 and the settings every task gets are
passes.py's, how the buckets are chosen and their results merged prepare_merge.py's.

Ids. A bucket's new documents are numbered after every earlier bucket's, so a shard's ids need
the count of new documents of the buckets before it. When that is known (one bucket after another)
`shard` writes the final ids; else (buckets at once) it writes -1 - k for its k-th new document and
`renumber` rewrites them once the counts are in.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import (
    HOLDOUT_SCHEMA,
    CorpusError,
    shard_batches,
    write_shard,
)
from .ids import hash_strings, mix64
from .passes import Settings
from .prepare_base import _base, read_mapped


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


def duplicates(codes: np.ndarray, tokens: np.ndarray, times: np.ndarray) -> np.ndarray:
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


def sent_again(codes: np.ndarray, tokens: np.ndarray, times: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Mask of the input events (`fresh`) whose (doc, token, time) a base's token (not fresh) has exactly:
    the same event sent again, as a cumulative export sends every earlier day's. A time that is NaN (none)
    or -inf (a base's token whose time it was never told) equals nothing.

    Exact, in about the time of one sort of the base's candidates: those at or after the inputs' earliest
    time (in a daily refresh, only the latest of the base's events), by a hash of the triple in the high
    bits of a uint64 and their index in the low bits; each input event is then compared, triple for
    triple, with the few candidates of its hash's prefix."""
    found = np.zeros(len(codes), bool)
    inputs = np.flatnonzero(fresh & np.isfinite(times))
    if not len(inputs):
        return found
    base = np.flatnonzero(~fresh & np.isfinite(times) & (times >= times[inputs].min()))
    if not len(base):
        return found
    triple = mix64(mix64(mix64(codes.astype(np.uint64)) + tokens.astype(np.uint64)) + times.view(np.uint64))
    bits = np.uint64(max(1, len(base).bit_length()))
    keys = np.sort(triple[base] >> bits << bits | np.arange(len(base), dtype=np.uint64))
    prefix, wanted = keys >> bits, triple[inputs] >> bits
    lo, hi, by_prefix = np.empty(len(inputs), np.int64), np.empty(len(inputs), np.int64), np.argsort(wanted)
    # searched in order: each search starts where the last ended (in cache), many times faster than at random
    lo[by_prefix] = np.searchsorted(prefix, wanted[by_prefix], "left")
    hi[by_prefix] = np.searchsorted(prefix, wanted[by_prefix], "right")
    low = (np.uint64(1) << bits) - np.uint64(1)
    hit = np.zeros(len(inputs), bool)
    for k in range(int((hi - lo).max(initial=0))):  # candidates sharing a prefix: rarely more than one
        live = np.flatnonzero((lo + k < hi) & ~hit)
        if not len(live):
            break
        theirs, ours = base[(keys[lo[live] + k] & low).astype(np.int64)], inputs[live]
        hit[live] = ((codes[theirs] == codes[ours]) & (tokens[theirs] == tokens[ours])
                     & (times[theirs] == times[ours]))
    found[inputs[hit]] = True
    return found


@dataclass
class Events:
    """A bucket's events, grouped by key (in order of first appearance) and, with times, in time order;
    out-of-vocabulary rows and duplicates removed."""

    keys: pa.Array             # large_string: each key of the bucket once (a key's code is its position)
    codes: np.ndarray          # of each event
    tokens: np.ndarray         # word id of each event
    fresh: np.ndarray          # the events a base did not have
    times: np.ndarray | None = None          # of each event, with a time column (a base's untimed tokens -inf)
    base_of_code: np.ndarray | None = None   # a re-bucketed base: each key's base id, -1 for a new key
    rows: int = 0              # spilled rows read
    duplicates: int = 0
    in_base: int = 0           # input events the base had (the same key, token and time), dropped
    base_untimed: int = 0      # the base's tokens of the bucket whose time it was never told (-inf)
    early: int = 0             # input events at or before a base's latest time (and not in it: late data)
    late_users: int = 0        # keys with such events
    time_range: tuple[float, float] | None = None
    input_users: int = 0       # with a base: keys that the inputs hold, and of those the base knows
    known_input_users: int = 0
    blocks: np.ndarray | None = None         # with a base: the input block of each event (-1: a base's token)
    in_base_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (block, count) of the in_base events
    early_blocks: tuple[np.ndarray, np.ndarray] | None = None    # (block, count) of the early events

    def drop(self, dropped: np.ndarray) -> None:
        keep = ~dropped
        self.codes, self.tokens, self.fresh = self.codes[keep], self.tokens[keep], self.fresh[keep]
        if self.times is not None:
            self.times = self.times[keep]
        if self.blocks is not None:
            self.blocks = self.blocks[keep]

    def by_block(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(block, count) of the events of mask `events`: what a file's line in a refresh's report counts."""
        return _sparse(self.blocks[events]) if self.blocks is not None else None


def _events(spills: list[tuple[str, np.ndarray]], s: Settings) -> Events:
    """Bucket b's rows from every spill (input order), grouped, ordered and deduplicated.

    With a time column, an identical (user, URL, time) is the same event logged twice and only the
    first stays; without one, a repeated (user, URL) is a repeated visit, and stays. A base's own
    tokens are never duplicates; an input event that one of them has is dropped (sent_again: here for a
    base re-bucketed with the events, in _joined for one joined shard by shard).
    """
    schema = s.spill_schema()
    batches = []
    for path, indices in spills:
        reader = pa.ipc.open_file(pa.memory_map(path))
        batches += [reader.get_batch(int(i)) for i in indices]
    table = pa.Table.from_batches(batches, schema)
    # large_string: a bucket's keys may pass 2 GiB of text when the budget is big.
    encoded = pc.dictionary_encode(table["key"].cast(pa.large_string()).combine_chunks())
    # Codes follow first appearance (the spills are in input order), and so do new doc ids.
    keys, codes, tokens = encoded.dictionary, encoded.indices.to_numpy(), table["token"].to_numpy()
    timed = "time" in table.column_names
    times = table["time"].to_numpy() if timed else None
    base_rows = table["base"].to_numpy() if s.base_rows else None
    blocks = table["block"].to_numpy() if "block" in table.column_names else None
    if timed:  # by key, then time; a base's token before an input event of the same time; ties keep input order
        order = np.lexsort((times, codes) if base_rows is None else (base_rows < 0, times, codes))
    else:
        order = np.argsort(codes, kind="stable")
    ev = Events(keys, codes[order], tokens[order], np.ones(0, bool), rows=table.num_rows)
    del table, encoded, batches
    if base_rows is not None:
        base_rows = base_rows[order]
        ev.base_of_code = np.full(len(keys), -1, np.int64)
        known = base_rows >= 0
        ev.base_of_code[ev.codes[known]] = base_rows[known]
        in_inputs = np.zeros(len(keys), bool)
        in_inputs[ev.codes[~known]] = True
        ev.input_users = int(np.count_nonzero(in_inputs))
        ev.known_input_users = int(np.count_nonzero(in_inputs & (ev.base_of_code >= 0)))
    in_vocab = ev.tokens >= 0  # out of the vocabulary, or a base document's marker row
    ev.codes, ev.tokens = ev.codes[in_vocab], ev.tokens[in_vocab]
    ev.fresh = base_rows[in_vocab] < 0 if base_rows is not None else np.ones(len(ev.codes), bool)
    if blocks is not None:
        ev.blocks = blocks[order][in_vocab]
    if s.has_time:
        ev.times = times[order][in_vocab]
        dropped = duplicates(ev.codes, ev.tokens, np.where(ev.fresh, ev.times, np.nan))
        ev.duplicates = int(np.count_nonzero(dropped))
        ev.drop(dropped)
        if base_rows is not None and s.join:  # the base's documents are here: its tokens and their times
            ev.base_untimed = int(np.count_nonzero(~ev.fresh & np.isneginf(ev.times)))
            dropped = sent_again(ev.codes, ev.tokens, ev.times, ev.fresh)
            ev.in_base, ev.in_base_blocks = int(np.count_nonzero(dropped)), ev.by_block(dropped)
            ev.drop(dropped)
        seen = ev.times[np.isfinite(ev.times)]
        if len(seen):
            ev.time_range = (float(seen.min()), float(seen.max()))
        if not s.by_shard:
            _late(ev, s)
    return ev


def _late(ev: Events, s: Settings) -> None:
    """Count the input events at or before the base's latest time that it did not have (late data) and
    their users: they are new, and join their documents in time order. In a window the base's documents
    are not read, so such an event is taken to be one the base had, and is not new."""
    latest = _base(s.base, s.join).latest_time if s.base else None
    if latest is None:
        return
    early = ev.fresh & (ev.times <= latest)
    ev.early, ev.early_blocks = int(np.count_nonzero(early)), ev.by_block(early)
    ev.late_users = len(np.unique(ev.codes[early]))
    if not s.join:
        ev.fresh &= ~early


@dataclass
class Documents:
    """A bucket's documents as its shard holds them, and what else pass 3 writes and reports of it."""

    doc_ids: np.ndarray          # a base's ids where known; new documents: -1 - k until numbered
    lengths: np.ndarray          # tokens of each, as written
    words: np.ndarray            # their word ids, document after document
    new_keys: pa.Array           # keys of the new documents, in id order
    new_lengths: np.ndarray
    times: np.ndarray | None = None          # the words' event times (with a time column)
    single: int = 0              # documents of one token, before the held-out split
    empty: int = 0               # keys of the bucket, not the base's, left with no token
    held: tuple[pa.Array, np.ndarray] | None = None  # hidden (key, word id) pairs
    nothing_hidden: int = 0
    new_words: np.ndarray | None = None      # word ids of the events a base did not have
    base_ids: np.ndarray | None = None       # base documents of the bucket, and their lengths now
    base_lengths: np.ndarray | None = None
    grown: np.ndarray | None = None          # base documents with new events
    capped: Capped | None = None
    empty_keys: pa.Array | None = None       # keys of the bucket left with no token (Settings.empty_keys)


@dataclass
class Capped:
    """Documents cut to their last --max-tokens-per-doc tokens: how many, the tokens dropped, the first keys."""

    docs: int = 0
    tokens: int = 0
    keys: list[str] = field(default_factory=list)

    EXAMPLES = 3


def _last_tokens(lengths: np.ndarray, cap: int, timed: np.ndarray | None = None) -> np.ndarray:
    """Mask of the tokens each document keeps of `lengths` (documents one after another) under a cap of
    `cap` tokens: its last ones, its most recent events where the documents are in time order. timed
    (a mask of the tokens with a time; each document's untimed ones after its timed ones, as _events
    sorts them): its most recent timed events, and only where it has fewer than `cap` of them the last
    untimed ones read, which have no time that could make them more recent than a timed one."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    if timed is None:
        return np.repeat(ends, lengths) - np.arange(total) <= cap
    at = np.arange(total) - np.repeat(ends - lengths, lengths)  # each token's place in its document
    with_time = np.repeat(np.add.reduceat(timed.astype(np.int64), (ends - lengths)[lengths > 0])
                          if total else np.zeros(0, np.int64), lengths[lengths > 0])
    room = np.maximum(cap - with_time, 0)  # places left for untimed events
    return np.where(at < with_time, at >= with_time - cap, at >= np.repeat(lengths, lengths) - room)


def _cap(lengths: np.ndarray, cap: int | None, key_of, timed: np.ndarray | None = None
         ) -> tuple[np.ndarray | None, Capped | None]:
    """(mask of the tokens kept, what was cut) of documents of `lengths` under --max-tokens-per-doc
    (None: no cap, or none over it); key_of(indices) gives documents' keys, for the report; timed:
    _last_tokens's."""
    if not cap or not len(lengths) or lengths.max() <= cap:
        return None, None
    over = np.flatnonzero(lengths > cap)
    return _last_tokens(lengths, cap, timed), Capped(len(over), int((lengths[over] - cap).sum()),
                                                     [str(k) for k in key_of(over[:Capped.EXAMPLES])])


def _new_ids(n: int, first_id: int | None) -> np.ndarray:
    """Ids of a bucket's n new documents: first_id on, or -1 - k while the first is not known."""
    return np.arange(n, dtype=np.int64) + first_id if first_id is not None else -1 - np.arange(n, dtype=np.int64)


def _grouped(ev: Events, s: Settings, vocab_size: int, first_id: int | None) -> Documents:
    """Documents from the bucket's events alone: without a base, or with its rows re-bucketed with
    the events (its tokens sorting first, a marker row for each known user)."""
    nkeys = len(ev.keys)
    codes, tokens, times, fresh = ev.codes, ev.tokens, ev.times, ev.fresh
    before = np.bincount(codes, minlength=nkeys)
    # the cap before the held-out split: what is hidden is then of the events a document keeps
    keep, capped = _cap(before, s.max_tokens_per_doc, lambda at: ev.keys.take(pa.array(at)).to_pylist(),
                        None if times is None else ~np.isnan(times))
    if keep is not None:
        codes, tokens, fresh = codes[keep], tokens[keep], fresh[keep]
        times = times[keep] if times is not None else None
    held, nothing_hidden = None, 0
    if s.holdout > 0 and len(codes):
        keep, hid_doc, hid_tok, nothing_hidden = hold_out(codes, tokens, hash_strings(ev.keys), vocab_size,
                                                          s.holdout, s.seed)
        codes, tokens, fresh = codes[keep], tokens[keep], fresh[keep]
        times = times[keep] if times is not None else None
        held = (ev.keys.take(pa.array(hid_doc)), hid_tok)
    lengths = np.bincount(codes, minlength=nkeys)
    present = np.flatnonzero(lengths)
    docs = Documents(np.zeros(0, np.int64), lengths[present], tokens, ev.keys, np.zeros(0, np.int64), times=times,
                     single=int(np.count_nonzero(before == 1)), held=held, nothing_hidden=nothing_hidden,
                     capped=capped)
    if ev.base_of_code is None:
        new = present
        docs.doc_ids = _new_ids(len(new), first_id)
        docs.empty = nkeys - len(present)
        if s.empty_keys:
            docs.empty_keys = ev.keys.take(pa.array(np.flatnonzero(lengths == 0)))
    else:
        ours = ev.base_of_code >= 0
        docs.base_ids, docs.base_lengths = ev.base_of_code[ours], lengths[ours]
        docs.grown = ev.base_of_code[ours & (np.bincount(ev.codes[ev.fresh], minlength=nkeys) > 0)]
        docs.new_words = tokens[fresh]
        new = np.flatnonzero(~ours & (lengths > 0))
        docs.doc_ids = ev.base_of_code[present].copy()  # a base's empty documents keep their row, in no shard
        docs.doc_ids[~ours[present]] = _new_ids(len(new), first_id)
        docs.empty = int(np.count_nonzero(~ours & (lengths == 0)))
    docs.new_keys, docs.new_lengths = ev.keys.take(pa.array(new)), lengths[new]
    return docs


@functools.lru_cache(maxsize=2)
def _empty_base_docs(path: str, join: bool, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """A base's documents with no token (a window's known users with no event then), which are in no
    shard, and the bucket of each."""
    base = _base(path, join)
    empty = np.flatnonzero(base.docs.column("length").to_numpy() == 0)
    keys = base.docs.column("key").take(pa.array(empty)).combine_chunks()
    return empty, (hash_strings(keys) % np.uint64(buckets)).astype(np.int64)


def _joined(ev: Events, b: int, s: Settings, first_id: int | None) -> Documents:
    """Documents of a refresh that joins new events to the base's documents shard by shard (its shards
    are by key hash, corpus.json's "shards_by"): bucket b's new events can only be those of base shard
    b's users (or of its users with an empty document, or of new users), so base shard b is read once
    and written again with each user's new events after its tokens (in time order with the late ones,
    _in_time_order), then the new users. An input event the base's document has (the same URL and
    time) is dropped (sent_again). The base's tokens are never spilled, sorted or grouped again: the
    cost is the new events' plus one copy of the corpus (_grouped, with the base re-bucketed, handles
    everything else)."""
    base = _base(s.base, s.join)
    nkeys = len(ev.keys)
    base_keys = base.docs.column("key")
    shard_ids, shard_offsets, shard_tokens, shard_times = _whole_shard(base.corpus.shard_paths[b])
    shard_keys = base_keys.take(pa.array(shard_ids)).combine_chunks()
    if s.buckets > 1 and (hash_strings(shard_keys) % np.uint64(s.buckets) != b).any():
        raise CorpusError(f"{base.corpus.shard_paths[b]}: holds users whose keys hash to another shard, "
                          f"though {base.corpus.path}/corpus.json says its shards are by key hash")
    empty, empty_bucket = _empty_base_docs(s.base, s.join, s.buckets)
    empties = empty[empty_bucket == b]
    known_ids = np.concatenate([shard_ids, empties])
    position = pc.index_in(ev.keys, value_set=pa.concat_arrays(
        [shard_keys.cast(pa.large_string()), base_keys.take(pa.array(empties)).combine_chunks().cast(
            pa.large_string())])).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    known = position >= 0
    ev.input_users, ev.known_input_users = nkeys, int(np.count_nonzero(known))
    n_shard = len(shard_ids)
    old_lengths = np.diff(shard_offsets)
    timed = ev.times is not None
    if timed:
        if shard_times is None:  # a base prepared before corpora kept times: its tokens' times are unknown
            shard_times = np.full(len(shard_tokens), -np.inf)
        ev.base_untimed = int(np.count_nonzero(np.isneginf(shard_times)))
        dropped = _sent_again_to(ev, position, old_lengths, shard_tokens, shard_times)
        ev.in_base, ev.in_base_blocks = int(np.count_nonzero(dropped)), ev.by_block(dropped)
        ev.drop(dropped)
        _late(ev, s)
    codes, tokens = ev.codes, ev.tokens
    added = np.bincount(codes, minlength=nkeys)  # new tokens of each key
    grown = known_ids[position[known & (np.bincount(codes[ev.fresh], minlength=nkeys) > 0)]]
    # each base document of the shard, then its new events: written to their places in one array
    adds = np.zeros(len(known_ids), np.int64)
    adds[position[known]] = added[known]
    lengths = old_lengths + adds[:n_shard]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    token_position = position[codes]
    known_tokens = token_position >= 0
    by_position = np.argsort(token_position[known_tokens], kind="stable")
    additions = tokens[known_tokens][by_position]
    into = adds[:n_shard]
    in_place = int(into.sum())
    base_slots = np.arange(len(shard_tokens)) + np.repeat(offsets[:-1] - shard_offsets[:-1], old_lengths)
    added_slots = (np.repeat(offsets[:-1] + old_lengths, into) + np.arange(in_place)
                   - np.repeat(np.cumsum(into) - into, into))
    merged = np.empty(int(offsets[-1]), np.int32)
    merged[base_slots], merged[added_slots] = shard_tokens, additions[:in_place]
    words = [merged, additions[in_place:], tokens[~known_tokens]]
    times = None
    if timed:
        added_times = ev.times[known_tokens][by_position]
        merged_times = np.empty(len(merged), np.float64)
        merged_times[base_slots], merged_times[added_slots] = shard_times, added_times[:in_place]
        _in_time_order(lengths, merged, merged_times)
        times = np.concatenate([merged_times, added_times[in_place:], ev.times[~known_tokens]])
    # then users whose document was empty and is not now, then new users
    refilled = np.flatnonzero(adds[n_shard:] > 0)
    new = np.flatnonzero(~known & (added > 0))
    doc_ids = np.concatenate([shard_ids, empties[refilled], _new_ids(len(new), first_id)])
    doc_lengths = np.concatenate([lengths, adds[n_shard:][refilled], added[new]])
    words = np.concatenate(words)
    single = int(np.count_nonzero(doc_lengths == 1))
    n_base = n_shard + len(refilled)
    keep, capped = _cap(doc_lengths, s.max_tokens_per_doc, lambda at: np.concatenate([
        base_keys.take(pa.array(doc_ids[at[at < n_base]])).to_pylist(),
        ev.keys.take(pa.array(new[at[at >= n_base] - n_base])).to_pylist()]), None if not timed else ~np.isnan(times))
    if keep is not None:
        words, times = words[keep], times[keep] if timed else None
        doc_lengths = np.minimum(doc_lengths, s.max_tokens_per_doc)
    return Documents(doc_ids, doc_lengths, words, ev.keys.take(pa.array(new)), doc_lengths[n_base:], times=times,
                     single=single, empty=int(np.count_nonzero(~known & (added == 0))), new_words=tokens[ev.fresh],
                     base_ids=doc_ids[:n_base], base_lengths=doc_lengths[:n_base], grown=grown, capped=capped)


def _sent_again_to(ev: Events, position: np.ndarray, lengths: np.ndarray, tokens: np.ndarray,
                   times: np.ndarray) -> np.ndarray:
    """sent_again for a shard joined in place: the input events of known users (ev's, position: each key's
    document in the shard, -1 for a key it does not hold) that the shard's documents (of `lengths`,
    `tokens` and `times`) have. Only the tokens of users with input events, at or after the earliest of
    those events, take part."""
    event_doc = position[ev.codes]
    ours = (event_doc >= 0) & (event_doc < len(lengths)) & np.isfinite(ev.times)
    found = np.zeros(len(ev.codes), bool)
    if not ours.any():
        return found
    token_doc = np.repeat(np.arange(len(lengths)), lengths)
    touched = np.zeros(len(lengths), bool)
    touched[event_doc[ours]] = True
    theirs = touched[token_doc] & (times >= ev.times[ours].min())
    n_base = int(np.count_nonzero(theirs))
    found[ours] = sent_again(np.concatenate([token_doc[theirs], event_doc[ours]]),
                             np.concatenate([tokens[theirs], ev.tokens[ours]]),
                             np.concatenate([times[theirs], ev.times[ours]]),
                             np.concatenate([np.zeros(n_base, bool), np.ones(int(np.count_nonzero(ours)), bool)]))[n_base:]
    return found


def _in_time_order(lengths: np.ndarray, words: np.ndarray, times: np.ndarray) -> None:
    """Each document of `lengths` (its words and their times, one document after another) in time order,
    in place, where a late event was placed after a later one: a stable sort of those documents alone,
    so that a base's token stays before an input event of the same time, -inf first and NaN last, as
    prepare orders a user's events."""
    if len(times) < 2:
        return
    doc = np.repeat(np.arange(len(lengths)), lengths)
    a, b = times[:-1], times[1:]
    later_first = ((b < a) | (np.isnan(a) & ~np.isnan(b))) & (doc[1:] == doc[:-1])
    if not later_first.any():
        return
    affected = np.zeros(len(lengths), bool)
    affected[doc[1:][later_first]] = True
    at = np.flatnonzero(affected[doc])
    order = at[np.lexsort((times[at], doc[at]))]
    words[at], times[at] = words[order], times[order]


def _whole_shard(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A shard file's (doc_ids, offsets, tokens, times), every document of it; times None when it keeps none."""
    parts = list(shard_batches(path))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), None
    ids = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([np.diff(p[1]) for p in parts])
    times = np.concatenate([p[3] for p in parts]) if parts[0][3] is not None else None
    return (ids, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.concatenate([p[2] for p in parts]),
            times)


def _sparse(word_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(word ids, counts) of the words that occur: what a bucket sends back of a vocabulary-long count."""
    found, counts = np.unique(word_ids, return_counts=True)
    return found.astype(np.int32), counts.astype(np.int64)


@dataclass
class Sharded:
    """Pass 3 of one bucket: what corpus.json, vocab.arrow, docs.arrow and a refresh's report need."""

    shard: dict                  # corpus.json's entry
    new_docs: int
    counts: tuple[np.ndarray, np.ndarray]
    rows: int = 0
    renumber: bool = False       # written with provisional ids for its new documents
    empty: int = 0
    heldout: int = 0
    duplicates: int = 0
    single: int = 0
    nothing_hidden: int = 0
    time_range: tuple[float, float] | None = None
    early: int = 0
    late_users: int = 0
    in_base: int = 0
    base_untimed: int = 0
    input_users: int = 0
    known_input_users: int = 0
    capped: Capped | None = None
    new_words: tuple[np.ndarray, np.ndarray] | None = None
    base_ids: np.ndarray | None = None
    base_lengths: np.ndarray | None = None
    grown: np.ndarray | None = None
    in_base_blocks: tuple[np.ndarray, np.ndarray] | None = None  # (input block, count) of in_base and of early
    early_blocks: tuple[np.ndarray, np.ndarray] | None = None


def docs_part(s: Settings, b: int) -> str:
    return os.path.join(s.parts_dir, f"docs-{b:05d}.arrow")


def empty_part(s: Settings, b: int) -> str:
    return os.path.join(s.parts_dir, f"empty-{b:05d}.arrow")


def heldout_part(s: Settings, b: int) -> str:
    return os.path.join(s.parts_dir, f"heldout-{b:05d}.arrow")


NEW_DOCS_SCHEMA = pa.schema([("key", pa.string()), ("length", pa.int64())])
EMPTY_KEYS_SCHEMA = pa.schema([("key", pa.string())])
EMPTY_KEYS_FILE = "docs_without_tokens.arrow"  # in a corpus prepared with empty_keys (prepare; infer reads it)


def shard(b: int, spills: list[tuple[str, np.ndarray]], s: Settings, first_id: int | None, tick=None) -> Sharded:
    """Pass 3 of bucket b: its events from every spill file (`spills`: each file's record batches of
    bucket b), grouped into documents, held out, and written as shard b (corpus.write_shard, with the
    tokens' times when there is a time column), with its new documents' keys and lengths
    (parts/docs-b.arrow, in id order) and its hidden pairs (parts/heldout-b.arrow). first_id: the id
    of its first new document, None while not known."""
    s.go_on()
    vocab = read_mapped(s.vocab_path()).column("token").combine_chunks()
    ev = _events(spills, s)
    docs = _joined(ev, b, s, first_id) if s.by_shard else _grouped(ev, s, len(vocab), first_id)
    s.go_on()
    entry = write_shard(s.tmp, b, docs.doc_ids, docs.lengths, docs.words, docs.times)
    _write_ipc(docs_part(s, b), NEW_DOCS_SCHEMA, [docs.new_keys.cast(pa.string()), pa.array(docs.new_lengths, pa.int64())])
    if docs.empty_keys is not None and len(docs.empty_keys):
        _write_ipc(empty_part(s, b), EMPTY_KEYS_SCHEMA, [docs.empty_keys.cast(pa.string())])
    heldout = 0
    if docs.held is not None:
        heldout = len(docs.held[1])
        _write_ipc(heldout_part(s, b), HOLDOUT_SCHEMA, [docs.held[0].cast(pa.string()),
                                                        vocab.take(pa.array(docs.held[1]))])
    if tick:
        tick(ev.rows)
    return Sharded(entry, len(docs.new_keys), _sparse(docs.words), ev.rows,
                   first_id is None and len(docs.new_keys) > 0, docs.empty, heldout, ev.duplicates, docs.single,
                   docs.nothing_hidden, ev.time_range, ev.early, ev.late_users, ev.in_base, ev.base_untimed,
                   ev.input_users, ev.known_input_users, docs.capped,
                   None if docs.new_words is None else _sparse(docs.new_words), docs.base_ids, docs.base_lengths,
                   docs.grown, ev.in_base_blocks, ev.early_blocks)


def _write_ipc(path: str, schema: pa.Schema, columns: list[pa.Array]) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        table = pa.Table.from_arrays(columns, schema=schema)
        writer.write_table(table, max_chunksize=1 << 20)


def renumber(path: str, first_id: int) -> None:
    """Shard file `path` with its provisional ids (-1 - k) made final (first_id + k), in place; its
    other columns (tokens, times) as they are."""
    staged = path + ".renumber"
    reader = pa.ipc.open_file(pa.memory_map(path))
    with pa.OSFile(staged, "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            ids = batch.column(0).to_numpy()
            writer.write_batch(pa.RecordBatch.from_arrays(
                [pa.array(np.where(ids < 0, first_id - 1 - ids, ids))] + batch.columns[1:], schema=reader.schema))
    os.replace(staged, path)
