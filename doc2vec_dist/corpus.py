"""The corpus on disk: its files, their schemas, and reading them (what training imports).

Changes when the corpus format changes. `prepare` (prepare.py) makes a corpus from raw input;
`plan_calibration.make_slice` cuts one from another; both write shards with `write_shard`.

    CORPUS/corpus.json                 sizes, per-shard counts, how it was made, what was skipped
    CORPUS/vocab.arrow                 token string, count int64, id int32        (sorted by id)
    CORPUS/docs.arrow                  key string, id int64, length int64          (sorted by id)
    CORPUS/shards/part-00000.arrow …   doc_id int64, tokens list<int32>[, times list<float64>]
                                       (record batches ≤ ~1M tokens)
    CORPUS/changed.arrow               doc_id int64 (sorted): a refreshed corpus's (prepare --base) new
                                       users and users with new events; absent otherwise

A refreshed corpus keeps its base's ids: users and URLs it did not know come after (docs.arrow and
vocab.arrow stay sorted by id), so a shard's doc ids need not be consecutive, and a known user with
no event now keeps a row with length 0 (in no shard).

Event times. A corpus prepared with a time column (prepare --time-col) keeps each token's event time
beside it, `times` (epoch seconds, UTC, parallel to `tokens`), so that a later refresh can tell an event
it is sent again (the same user, URL and time) from a new one, and place late events in time order.
A null is an event that had no time (NaN once read: shard_batches); -inf an earlier event whose time
the corpus was never told (a refresh's tokens from a base prepared before times were kept, or without a
time column): both sort as prepare sorts them (-inf first, null last) and equal nothing. Training reads doc_id and tokens alone
(iter_shard): the times cost disk, 8 bytes a token, and no memory. A shard written without a time
column, or by `plan`'s and `tune`'s slices, has no `times` (shard_has_times).

The held-out file that `prepare --holdout` writes beside it is Parquet of (key string, token string).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from . import outputs
from .errors import UserError

FORMAT_VERSION = 1

# Tokens per record batch of a shard file. Keeps list<int32> offsets far from 2**31 and lets a reader
# take a batch at a time.
BATCH_TOKENS = 1 << 20

VOCAB_SCHEMA = pa.schema([("token", pa.string()), ("count", pa.int64()), ("id", pa.int32())])
DOCS_SCHEMA = pa.schema([("key", pa.string()), ("id", pa.int64()), ("length", pa.int64())])
SHARD_SCHEMA = pa.schema([("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32()))])
# the same, with each token's event time (a corpus prepared with a time column)
TIMED_SHARD_SCHEMA = SHARD_SCHEMA.append(pa.field("times", pa.list_(pa.float64())))
CHANGED_SCHEMA = pa.schema([("doc_id", pa.int64())])
HOLDOUT_SCHEMA = pa.schema([("key", pa.string()), ("token", pa.string())], metadata=outputs.parquet_metadata("heldout"))


class CorpusError(UserError):
    """Bad input to `prepare`, or a corpus directory that cannot be opened."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line; pyarrow quotes whole rows in some messages, so cut it at `limit`."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + " …"


def write_shard(directory: str, index: int, doc_ids: np.ndarray, lengths: np.ndarray,
                tokens: np.ndarray, times: np.ndarray | None = None) -> dict:
    """Shard file `index` of the corpus at `directory` (shards/part-00000.arrow, …), in record batches
    of about BATCH_TOKENS tokens (a longer document alone): document doc_ids[i] holds the next
    lengths[i] word ids of `tokens` (and, when given, their event times of `times`: TIMED_SHARD_SCHEMA).
    Returns the shard's entry in corpus.json's "shards"."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = len(doc_ids)
    schema = SHARD_SCHEMA if times is None else TIMED_SHARD_SCHEMA
    rel = os.path.join("shards", f"part-{index:05d}.arrow")
    os.makedirs(os.path.join(directory, "shards"), exist_ok=True)
    with pa.OSFile(os.path.join(directory, rel), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        start = 0
        while start < n:
            end = int(np.searchsorted(offsets, offsets[start] + BATCH_TOKENS, side="right")) - 1
            end = min(max(end, start + 1), n)
            lo, hi = int(offsets[start]), int(offsets[end])
            if hi - lo > np.iinfo(np.int32).max:
                raise CorpusError(f"document {int(doc_ids[start])} has {hi - lo} tokens, more than a "
                                  "list<int32> record batch can hold")
            within = pa.array((offsets[start:end + 1] - lo).astype(np.int32))
            columns = [pa.array(doc_ids[start:end]), pa.ListArray.from_arrays(within, pa.array(tokens[lo:hi], pa.int32()))]
            if times is not None:
                # NaN (an event without a time) is stored as null, which Arrow's own comparisons hold equal
                columns.append(pa.ListArray.from_arrays(within, pa.array(times[lo:hi], pa.float64(), from_pandas=True)))
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
            start = end
    return {"path": rel, "docs": n, "tokens": int(offsets[-1])}


def write_changed(directory: str, doc_ids: np.ndarray) -> None:
    """CORPUS/changed.arrow: the documents a refresh made new or grew (sorted)."""
    with pa.OSFile(os.path.join(directory, "changed.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, CHANGED_SCHEMA) as writer:
        writer.write_table(pa.table({"doc_id": pa.array(np.sort(doc_ids).astype(np.int64))}, schema=CHANGED_SCHEMA))


# ---------------------------------------------------------------------------------------------------
# Reading a corpus
# ---------------------------------------------------------------------------------------------------

def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column of numbers as numpy, read-only and zero-copy where it is one chunk without nulls
    (what Array.to_numpy() gives), but without pyarrow's pandas conversion, which imports pandas the
    first time in a process (0.2-0.5 s): every worker and server reads Arrow as it starts, and a run
    starts one process per actor. Anything else (nulls, several chunks, not numbers) goes to to_numpy."""
    if isinstance(values, pa.ChunkedArray) and values.num_chunks == 1:
        values = values.chunk(0)
    kind = values.type
    if (isinstance(values, pa.ChunkedArray) or values.null_count
            or not (pa.types.is_integer(kind) or pa.types.is_floating(kind))):
        return values.to_numpy(zero_copy_only=False)
    dtype = np.dtype(kind.to_pandas_dtype())
    out = np.frombuffer(values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize)
    out.flags.writeable = False  # Arrow's memory (a memory-mapped file, often): as to_numpy gives it
    return out


def arrow_of(values: np.ndarray) -> pa.Array:
    """numpy_of's way back: a 1-D numpy array of numbers as an Arrow array of the same type, over the
    same memory (copied once where it is not contiguous or not in this machine's byte order: Arrow's
    buffers are read in it), without pa.array's test for pandas objects, which imports pandas the first
    time in a process (0.2-0.3 s of CPU): every server writes its checkpoints with it, and a run starts
    one process per server."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise ValueError(f"arrow_of takes a 1-D array of numbers, not {values.dtype} of shape {values.shape}")
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def _read_ipc_file(path: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read: {one_line(e)}") from e


class Corpus:
    """An existing corpus directory, as written by `prepare`."""

    REQUIRED = ("format_version", "num_docs", "num_tokens", "vocab_size", "num_shards", "shards")

    def __init__(self, path: str):
        self.path = os.path.abspath(os.fspath(path))
        meta_path = os.path.join(self.path, "corpus.json")
        if not os.path.isfile(meta_path):
            raise CorpusError(f"{self.path}: not a corpus (no corpus.json; make one with `prepare`)")
        try:
            with open(meta_path, "rb") as f:
                raw = f.read()
            self.meta = json.loads(raw)
        except (OSError, ValueError) as e:
            raise CorpusError(f"{meta_path}: cannot read: {one_line(e)}") from e
        self._digest = hashlib.blake2b(raw, digest_size=16).digest()  # which corpus this is (replaced_since)
        missing = [k for k in self.REQUIRED if k not in self.meta] if isinstance(self.meta, dict) else ["all"]
        if missing:
            raise CorpusError(f"{meta_path}: missing fields: {', '.join(missing)}")
        if self.meta["format_version"] != FORMAT_VERSION:
            raise CorpusError(f"{meta_path}: format_version {self.meta['format_version']} is not "
                              f"{FORMAT_VERSION}; prepare the corpus again with this version")
        shards = self.meta["shards"]
        if len(shards) != self.meta["num_shards"]:
            raise CorpusError(f"{meta_path}: num_shards is {self.meta['num_shards']} but {len(shards)} "
                              "shards are listed")
        self.num_docs = int(self.meta["num_docs"])
        self.num_tokens = int(self.meta["num_tokens"])
        self.vocab_size = int(self.meta["vocab_size"])
        ordered = sorted(shards, key=lambda s: s["path"])
        self.shard_paths = [os.path.join(self.path, s["path"]) for s in ordered]
        self._shard_tokens = [int(s["tokens"]) for s in ordered]
        self._shard_docs = [int(s["docs"]) for s in ordered]
        for p in [os.path.join(self.path, "vocab.arrow"), os.path.join(self.path, "docs.arrow")] + self.shard_paths:
            if not os.path.isfile(p):
                raise CorpusError(f"{self.path}: corpus is incomplete, {os.path.relpath(p, self.path)} "
                                  "is missing")

    @property
    def num_shards(self) -> int:
        return len(self.shard_paths)

    def replaced_since(self) -> str | None:
        """None while the corpus at this path is the one read here; else how it changed (`prepare --overwrite`
        into it, or removed), in words: a run that reads its shards again each epoch would read the other."""
        try:
            with open(os.path.join(self.path, "corpus.json"), "rb") as f:
                raw = f.read()
        except OSError:
            return f"{self.path}: the corpus this run was reading is gone"
        if hashlib.blake2b(raw, digest_size=16).digest() == self._digest:
            return None
        try:
            now = json.loads(raw).get("created")
        except (ValueError, AttributeError):
            now = None
        then = self.meta.get("created")
        if now is not None and now == then:  # (forget --corpus rewrites a corpus where it is)
            return f"{self.path}: the corpus this run was reading (prepared {then}) was changed where it is"
        return (f"{self.path}: the corpus this run was reading (prepared {then or 'earlier'}) was replaced by another "
                f"(prepared {now or 'later'})")

    def vocab(self) -> pa.Table:
        """token string, count int64 (training count), id int32; sorted by id."""
        return _read_ipc_file(os.path.join(self.path, "vocab.arrow"))

    def counts(self) -> np.ndarray:
        """int64 training count of each word id."""
        return numpy_of(self.vocab()["count"]).astype(np.int64, copy=False)

    def docs(self) -> pa.Table:
        """key string, id int64, length int64; sorted by id."""
        return _read_ipc_file(os.path.join(self.path, "docs.arrow"))

    def changed(self) -> np.ndarray | None:
        """The doc ids a refresh made new or grew (prepare --base), sorted; None for a corpus made whole."""
        path = os.path.join(self.path, "changed.arrow")
        if not os.path.isfile(path):
            return None
        return numpy_of(_read_ipc_file(path).column("doc_id"))

    def epoch_tokens(self, epoch: int, first_epoch: str = "all") -> int:
        """Tokens epoch `epoch` trains: every one, except that with first_epoch "changed" (train
        --first-epoch changed) epoch 0 trains only the changed documents' (changed.arrow)."""
        if epoch != 0 or first_epoch != "changed":
            return self.num_tokens
        changed = self.changed()
        if changed is None:
            raise CorpusError(f"{self.path}: --first-epoch changed needs a corpus from prepare --base, which lists the "
                              "users it made new or gave new events (changed.arrow)")
        return int(numpy_of(self.docs().column("length"))[changed].sum())

    def tokens_before(self, epoch: int, first_epoch: str = "all") -> int:
        """Tokens the epochs before `epoch` trained (what the learning rate's decay has covered)."""
        return self.epoch_tokens(0, first_epoch) + (epoch - 1) * self.num_tokens if epoch > 0 else 0

    def shard_num_tokens(self) -> list[int]:
        """Tokens per shard file, in the order of shard_paths."""
        return list(self._shard_tokens)

    def shard_num_docs(self) -> list[int]:
        """Documents per shard file, in the order of shard_paths."""
        return list(self._shard_docs)

    def __repr__(self) -> str:
        return (f"Corpus({self.path!r}: {self.num_docs} docs, {self.num_tokens} tokens, "
                f"vocabulary {self.vocab_size}, {self.num_shards} shards)")


def iter_shard(path: str, max_tokens: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield (doc_ids int64[n], offsets int64[n+1], tokens int32[total]) numpy chunks of consecutive documents
    from one shard file, each chunk holding at most ~max_tokens tokens (a single longer document is yielded
    whole, never cut). tokens[offsets[i]:offsets[i+1]] are document doc_ids[i]'s word ids in order.

    Zero-copy from the memory-mapped file where a chunk lies within one record batch (doc_ids and
    tokens are views; only the n+1 offsets are copied to rebase them to 0). Chunks smaller than a
    record batch are slices of it; when max_tokens exceeds the batch size, consecutive batches are
    concatenated (a copy) so that callers get chunks of the size they asked for.
    """
    try:
        reader = pa.ipc.open_file(pa.memory_map(os.fspath(path)))
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read shard: {one_line(e)}") from e
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pending_tokens = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        if batch.num_rows == 0:
            continue
        doc_ids = numpy_of(batch.column(0))
        lists = batch.column(1)
        raw = numpy_of(lists.offsets)
        values = numpy_of(lists.values)[raw[0]:raw[-1]]
        offsets = raw.astype(np.int64) - raw[0]
        n = len(doc_ids)
        start = 0
        while start < n:
            end = int(np.searchsorted(offsets, offsets[start] + max_tokens, side="right")) - 1
            end = min(max(end, start + 1), n)
            lo, hi = offsets[start], offsets[end]
            piece = (doc_ids[start:end], offsets[start:end + 1] - lo, values[lo:hi])
            if pending and pending_tokens + (hi - lo) > max_tokens:
                yield _concat_chunks(pending)
                pending, pending_tokens = [], 0
            pending.append(piece)
            pending_tokens += int(hi - lo)
            start = end
    if pending:
        yield _concat_chunks(pending)


def shard_has_times(path: str) -> bool:
    """Whether a shard file keeps its tokens' event times (TIMED_SHARD_SCHEMA): its schema says."""
    try:
        return "times" in pa.ipc.open_file(pa.memory_map(os.fspath(path))).schema.names
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read shard: {one_line(e)}") from e


def shard_batches(path: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
    """(doc_ids, offsets, tokens, times) of each record batch of a shard file, times None when the shard
    keeps none, NaN where an event had no time (what a refresh reads of its base; training reads iter_shard)."""
    try:
        reader = pa.ipc.open_file(pa.memory_map(os.fspath(path)))
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read shard: {one_line(e)}") from e
    timed = "times" in reader.schema.names
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        if batch.num_rows == 0:
            continue
        lists = batch.column(1)
        raw = numpy_of(lists.offsets)
        times = None
        if timed:
            listed = batch.column(batch.schema.get_field_index("times"))
            times = numpy_of(listed.values)[numpy_of(listed.offsets)[0]:numpy_of(listed.offsets)[-1]]
        yield (numpy_of(batch.column(0)), raw.astype(np.int64) - raw[0], numpy_of(lists.values)[raw[0]:raw[-1]],
               times)


def _concat_chunks(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk from consecutive pieces; a lone piece is passed through without a copy."""
    if len(pieces) == 1:
        return pieces[0]
    doc_ids = np.concatenate([p[0] for p in pieces])
    tokens = np.concatenate([p[2] for p in pieces])
    sizes = np.concatenate([np.diff(p[1]) for p in pieces])
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return doc_ids, offsets, tokens


def sample_documents(corpus: Corpus, n: int, seed: int = 0, spread: int = 8) -> tuple[np.ndarray, list[np.ndarray]]:
    """About `n` documents (doc ids, and each one's tokens), drawn with `seed` from `spread` record batches
    picked at random over every shard, not from the whole corpus: a sample of a corpus of 20M users is a few
    batches' read (shards hold the users by key hash, so a batch's users are as good as any)."""
    rng = np.random.default_rng(seed)
    batches = []
    for path in corpus.shard_paths:
        try:
            count = pa.ipc.open_file(pa.memory_map(path)).num_record_batches
        except (pa.ArrowException, OSError) as e:
            raise CorpusError(f"{path}: cannot read shard: {one_line(e)}") from e
        batches += [(path, b) for b in range(count)]
    each = max(1, -(-n // max(1, min(spread, len(batches)))))
    ids: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    for i in rng.permutation(len(batches)):
        if len(ids) >= n:
            break
        path, b = batches[i]
        batch = pa.ipc.open_file(pa.memory_map(path)).get_batch(b)
        if batch.num_rows == 0:
            continue
        doc_ids, lists = numpy_of(batch.column(0)), batch.column(1)
        offsets, values = numpy_of(lists.offsets), numpy_of(lists.values)
        for row in np.sort(rng.choice(len(doc_ids), min(each, len(doc_ids), n - len(ids)), replace=False)):
            ids.append(int(doc_ids[row]))
            tokens.append(np.array(values[offsets[row]:offsets[row + 1]], np.int32))
    order = np.argsort(ids, kind="stable")
    return np.asarray(ids, np.int64)[order], [tokens[i] for i in order]
