"""Readers, vocabulary, ids, shard files and the held-out split: raw events in, a corpus directory out.

`prepare` turns browsing events (or token lists, or plain text) into the corpus that training reads:

    CORPUS/corpus.json                 sizes, per-shard counts, how it was made, what was skipped
    CORPUS/vocab.arrow                 token string, count int64, id int32        (sorted by id)
    CORPUS/docs.arrow                  key string, id int64, length int64          (sorted by id)
    CORPUS/shards/part-00000.arrow …   doc_id int64, tokens list<int32>            (record batches ≤ ~1M tokens)

It never holds the events in memory, only the vocabulary (one row per distinct token):

    pass 1  stream every input, count tokens and rows, check columns  → vocabulary, ids by frequency
    pass 2  stream every input again, map tokens to ids, spill each event into bucket hash(key) % B
    pass 3  per bucket: group the events into documents, hold out, number them, write shard b

B is chosen so that one bucket fits in `memory_budget_bytes`. Everything is written under a temporary
sibling of the output directory and renamed into place at the very end, so an error or an interrupt
never leaves a half-written corpus behind.

Input formats:

    events  rows of (doc_col, token_col[, time_col]) in Parquet, CSV/TSV or JSON lines; a user's
            events may be spread over many files. With time_col, each user's tokens are ordered by
            time (ties keep input order); otherwise by input order.
    lists   one row per document: doc_col and token_col holding a list of tokens (Parquet, JSON lines).
    text    one document per line, tokens separated by whitespace. The key of a document is its line
            number counted from 0 across the inputs concatenated in the order given (a directory's
            files in sorted order); a file that does not end in a newline still ends its last line.

Within a shard, documents keep the order in which they first appear in the input, so a small text
corpus (one shard) has doc id == line number unless lines were skipped.

Bad input. Each kind either stops `prepare` with a one-line CorpusError naming the file (and the column
and row where known), leaving nothing at the output, or is skipped, counted in corpus.json's "skipped"
(where the first few were in "skipped_where") and reported on stderr one line per reason. Rows and
lines in messages are counted from 0 within their file (a CSV header is not a row), as text keys are.

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

import glob
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq
from tqdm import tqdm

from . import outputs
from .errors import UserError

FORMAT_VERSION = 1
FORMATS = ("events", "lists", "text")

# Tokens per record batch of a shard file. Keeps list<int32> offsets far from 2**31 and lets a reader
# take a batch at a time.
BATCH_TOKENS = 1 << 20

# Sizes of what one read of an input hands us; a batch of events is transient, so these only bound
# the working memory of passes 1 and 2, not correctness.
PARQUET_BATCH_ROWS = 1 << 18
TEXT_BLOCK_BYTES = 16 << 20
CSV_JSON_BLOCK_BYTES = 16 << 20

PARQUET_EXTS = (".parquet", ".pq")
CSV_EXTS = (".csv", ".tsv")
JSON_EXTS = (".jsonl", ".json", ".ndjson")
# Outer compression pyarrow's CSV/JSON readers and input streams undo by themselves.
COMPRESSION_EXTS = (".gz", ".bz2", ".zst", ".lz4", ".br")

VOCAB_SCHEMA = pa.schema([("token", pa.string()), ("count", pa.int64()), ("id", pa.int32())])
DOCS_SCHEMA = pa.schema([("key", pa.string()), ("id", pa.int64()), ("length", pa.int64())])
SHARD_SCHEMA = pa.schema([("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32()))])
HOLDOUT_SCHEMA = pa.schema([("key", pa.string()), ("token", pa.string())], metadata=outputs.parquet_metadata("heldout"))


class CorpusError(UserError):
    """Bad input to `prepare`, or a corpus directory that cannot be opened."""


# ---------------------------------------------------------------------------------------------------
# Hashing: vectorised 64-bit hashes of strings, for bucketing and for the held-out draw. Python's
# hash() is salted per process and a loop per key is slow; this is neither.
# ---------------------------------------------------------------------------------------------------

def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that spreads every input bit over the output."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _hash_strings(arr: pa.Array, salt: int = 0) -> np.ndarray:
    """uint64 hash of each string of a (large_)string array (nulls hash like empty strings).

    h(s) = mix(Σ_j s[j]·w_j  ^  mix(len(s))), with w_j a pseudo-random weight per byte position:
    one pass of numpy over the raw bytes, no Python per string.
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset:arr.offset + n + 1]
    lengths = np.diff(offsets)
    first, last = int(offsets[0]), int(offsets[-1])
    h = np.zeros(n, np.uint64)
    if last > first:
        data = np.frombuffer(data_buf, dtype=np.uint8)[first:last].astype(np.uint64)
        starts = offsets[:-1] - first
        position = np.arange(last - first, dtype=np.int64) - np.repeat(starts, lengths)
        weight = _mix64(position.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15 ^ (salt & 0xFFFFFFFF)))
        nonempty = lengths > 0
        h[nonempty] = np.add.reduceat(data * weight, starts[nonempty])
    if arr.null_count:
        null = arr.is_null().to_numpy(zero_copy_only=False)
        h[null] = 0
        lengths = np.where(null, 0, lengths)
    return _mix64(h ^ _mix64(lengths.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFF)))


class _TokenIds:
    """token string → word id, vectorised: binary search on the vocabulary's sorted hashes, then an
    exact string comparison, so a hash collision with an out-of-vocabulary token cannot map it wrongly.

    (pc.index_in would rebuild a hash table of the whole vocabulary on every batch.)
    """

    def __init__(self, tokens: pa.Array):
        self.tokens = tokens
        for salt in range(16):
            h = _hash_strings(tokens, salt)
            order = np.argsort(h, kind="stable")
            sorted_h = h[order]
            if not np.any(sorted_h[1:] == sorted_h[:-1]):
                break
        else:  # 16 salts with a collision among the vocabulary's own tokens: astronomically unlikely
            raise RuntimeError("cannot find a collision-free hash for the vocabulary")
        self.salt, self.order, self.sorted_h = salt, order, sorted_h

    def lookup(self, values: pa.Array) -> np.ndarray:
        """int32 ids of `values` (strings), -1 for nulls and tokens not in the vocabulary."""
        if len(values) == 0 or len(self.tokens) == 0:
            return np.full(len(values), -1, np.int32)
        # Look each distinct token up once: a batch repeats its popular URLs many times.
        encoded = pc.dictionary_encode(values)
        uniq = encoded.dictionary
        h = _hash_strings(uniq, self.salt)
        pos = np.minimum(np.searchsorted(self.sorted_h, h), len(self.sorted_h) - 1)
        cand = self.order[pos]
        same = self.sorted_h[pos] == h
        same &= pc.equal(uniq, self.tokens.take(pa.array(cand))).to_numpy(zero_copy_only=False)
        uniq_ids = np.where(same, cand, -1).astype(np.int32)
        idx = encoded.indices
        if idx.null_count:
            idx = idx.fill_null(len(uniq_ids))
            uniq_ids = np.append(uniq_ids, np.int32(-1))
        return uniq_ids[idx.to_numpy()]


# ---------------------------------------------------------------------------------------------------
# Inputs: paths → files → normalised chunks of events
# ---------------------------------------------------------------------------------------------------

def _strip_compression(name: str) -> str:
    lower = name.lower()
    for ext in COMPRESSION_EXTS:
        if lower.endswith(ext):
            return lower[: -len(ext)]
    return lower


def _file_kind(path: str) -> str | None:
    """'parquet', 'csv', 'tsv' or 'json' from the file name, None when we do not know it."""
    lower = path.lower()
    if lower.endswith(PARQUET_EXTS):
        return "parquet"
    base = _strip_compression(lower)
    if base.endswith(".tsv"):
        return "tsv"
    if base.endswith(".csv"):
        return "csv"
    if base.endswith(JSON_EXTS):
        return "json"
    return None


def _walk(directory: str) -> list[str]:
    """Files under a directory, recursively, sorted; hidden and _-prefixed files (Spark's _SUCCESS,
    Parquet's _metadata) are bookkeeping, not data."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [os.path.join(root, f) for f in files if not f.startswith((".", "_"))]
    return sorted(found)


def expand_inputs(inputs: list[str], format: str) -> list[str]:
    """The input files, in order: each input is a file, a directory (its data files, recursively,
    sorted) or a glob (its matches, sorted). A file listed twice is read once. The directory that
    `generate` wrote stands for its events/ (not its generate.json and ground truth)."""
    from .synthetic import events_dir

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise CorpusError("no input given")
    files: list[str] = []
    for given in map(os.fspath, inputs):
        if os.path.isdir(given) or os.path.exists(given):
            matches = [given]
        elif any(c in given for c in "*?["):
            matches = sorted(glob.glob(given, recursive=True))
            if not matches:
                raise CorpusError(f"{given}: the pattern matches no file")
        else:
            raise CorpusError(f"{given}: no such file or directory")
        for match in matches:
            if os.path.isdir(match) and (generated := events_dir(match)) is not None:
                print(f"{match}: a `generate` output; reading its events in {generated}", file=sys.stderr)
                match = generated
            if os.path.isdir(match):
                inside = _walk(match)
                if format != "text":
                    inside = [f for f in inside if _file_kind(f)]
                if not inside and match == given:
                    raise CorpusError(f"{given}: the directory holds no input files"
                                      + ("" if format == "text" else " (.parquet, .csv, .jsonl, …)"))
                files += inside
            else:
                if format != "text" and not _file_kind(match):
                    raise CorpusError(f"{match}: unknown file type (expected .parquet/.pq, .csv, .tsv, "
                                      ".jsonl/.json/.ndjson, optionally compressed)")
                files.append(match)
    seen, unique = set(), []
    for f in files:
        real = os.path.realpath(f)
        if real not in seen:
            seen.add(real)
            unique.append(f)
    if not unique:
        raise CorpusError(f"{', '.join(map(str, inputs))}: no input files found")
    return unique


@dataclass
class _Chunk:
    """A batch of events, whatever the input format: event i is (key[i], token[i], time[i])."""

    key: pa.Array            # string, no nulls
    token: pa.Array          # string; null where the input had no usable token
    time: np.ndarray | None  # float64, NaN for a missing time; None without time_col
    rows: int                # input rows (events, or documents for lists/text) this chunk covers
    padding: int = 0         # null tokens we added so that a document with no token is still seen


def _one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one line; pyarrow quotes whole rows in some messages, so cut it at `limit`."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + " …"


# Why prepare drops things, in the order it reports them (see the module docstring).
SKIP_REASONS = ("empty_files", "null_keys", "empty_keys", "invalid_utf8_lines", "null_tokens",
                "empty_tokens", "duplicate_events", "tokens_below_min_count", "tokens_beyond_max_vocab",
                "docs_without_tokens")


class _Skips:
    """What prepare dropped, by reason, and where the first few were, so the report can point at them."""

    EXAMPLES = 3

    def __init__(self):
        self.counts = dict.fromkeys(SKIP_REASONS, 0)
        self.where: dict[str, list[str]] = {}

    def add(self, reason: str, count: int, path: str | None = None, unit: str = "row", base: int = 0,
            at: np.ndarray | None = None) -> None:
        """Count `count` skips; `at` are their positions (from `base`) in `path`, in `unit`s."""
        if not count:
            return
        self.counts[reason] += int(count)
        if path is None:
            return
        where = self.where.setdefault(reason, [])
        room = self.EXAMPLES - len(where)
        if room > 0:
            where += [path] if at is None else [f"{path} {unit} {base + int(i)}" for i in at[:room]]


def _compact(counts: dict) -> str:
    """'null_keys 3, empty_files 1': the non-zero counts, for a message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v)


def _name_files(files: list[str]) -> str:
    """The inputs in a message: all of them when few, the first three and a count when many."""
    return ", ".join(files) if len(files) <= 3 else f"{', '.join(files[:3])} and {len(files) - 3} more"


def _missing_column(path: str, column: str, names: list[str]) -> CorpusError:
    return CorpusError(f"{path}: column '{column}' not found (columns: {', '.join(names)})")


def _check_columns(path: str, names: list[str], needed: list[str]) -> None:
    for column in needed:
        if column not in names:
            raise _missing_column(path, column, names)


def _parquet_batches(path: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    pf = pq.ParquetFile(path)
    _check_columns(path, pf.schema_arrow.names, columns)
    yield from pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns)


def _csv_batches(path: str, columns: list[str], kind: str) -> Iterator[pa.RecordBatch]:
    read = pcsv.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)
    parse = pcsv.ParseOptions(delimiter="\t" if kind == "tsv" else ",")
    # Everything as bytes: the key and token become strings anyway, the time is parsed by
    # _time_seconds, and a column's type cannot then change from one block to the next. Bytes, not
    # strings, so that invalid UTF-8 reaches _utf8_strings, which can say in which row it is (the CSV
    # reader cannot). Only the empty field is null, so a URL or user called "NA" or "null" stays itself.
    convert = pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.binary() for c in columns},
                                  strings_can_be_null=True, null_values=[""])
    try:
        reader = pcsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, KeyError) as e:
        if "Empty CSV file" in str(e):  # not even a header (a compressed empty file, say)
            return
        if "include_columns" not in str(e):
            raise
        names = pcsv.open_csv(path, read_options=read, parse_options=parse).schema.names
        _check_columns(path, names, columns)
        raise
    yield from reader


def _json_batches(path: str, columns: list[str], list_col: str | None) -> Iterator[pa.RecordBatch]:
    """JSON lines as record batches of `columns`: (doc_col, token_col[, time_col]), as _iter_chunks asks
    for them; the first two are ids, which may be strings in some rows and numbers in others."""
    read = pjson.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)
    # The streaming reader fixes a column's type from the first block and cannot turn a number into a
    # string. We want only our columns: learn their types from the first block, then read with an
    # explicit schema that ignores every other field (an unrelated field changing type must not stop us).
    try:
        inferred = pjson.open_json(path, read_options=read).schema
    except pa.ArrowInvalid as e:
        if "Empty JSON" in str(e):  # nothing but whitespace
            return
        inferred = None
    if inferred is not None:
        _check_columns(path, inferred.names, columns)
    fields = []
    for column in columns:
        typ = inferred.field(column).type if inferred is not None else _probe_json_type(path, read, column,
                                                                                       column == list_col)
        if pa.types.is_null(typ):  # all null in the first block: say what it should hold
            typ = pa.list_(pa.string()) if column == list_col else pa.string()
        fields.append((column, typ))
    schema = pa.schema(fields)
    parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    done = 0  # rows handed on
    try:
        for batch in pjson.open_json(path, read_options=read, parse_options=parse):
            yield batch
            done += batch.num_rows
    except pa.ArrowInvalid as e:
        if not _id_changed_type(e, schema, columns[:2]):
            raise
        # Ids that are strings in some rows and numbers in others (a common export shape): Arrow's
        # reader cannot read a number as a string, so the rest of the file is parsed here.
        yield from _json_rows(path, columns, list_col, skip=done, check_columns=inferred is None)


def _id_changed_type(e: pa.ArrowInvalid, schema: pa.Schema, ids: list[str]) -> bool:
    """Whether the reader stopped because an id column (or the tokens of a list column) changed JSON
    type: "Column(/user_id) changed from string to number", or a number that does not fit the numeric
    type of the rows before it (1.5 or 2**70 after integers)."""
    text = str(e)
    changed = re.search(r"Column\(/(.*?)(/\[\])?\) changed from", text)
    if changed:
        return changed.group(1) in ids
    return text.startswith("Failed to convert JSON to") and any(not _is_text(schema.field(c).type) for c in ids)


JSON_ROWS_PER_BATCH = 1 << 16


def _json_rows(path: str, columns: list[str], list_col: str | None, skip: int,
               check_columns: bool) -> Iterator[pa.RecordBatch]:
    """Rows `skip` on of a JSON lines file, parsed with Python's json, as record batches whose ids are
    strings whatever their JSON type (see _json_ids). Row numbers in errors count the file's objects,
    as Arrow's do. check_columns: the first batch's fields were never checked (Arrow could not infer them)."""
    row, values, seen = 0, {c: [] for c in columns}, {}
    for lines, _ in _text_lines(path):
        for line in lines.to_pylist():
            if line is not None and not line.strip():
                continue  # blank lines are no rows (nor are they to Arrow)
            if row >= skip:
                if line is None:  # _text_lines could not decode it
                    raise CorpusError(f"{path}: row {row} is not valid UTF-8 (convert the file to UTF-8)")
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise CorpusError(f"{path}: cannot read: JSON parse error in row {row}: {e} (JSON input must "
                                      "hold one object per line)") from None
                if not isinstance(obj, dict):
                    raise CorpusError(f"{path}: cannot read: row {row} is a JSON {_json_kind(obj)}, not an object "
                                      "(JSON input must hold one object per line)")
                if check_columns:
                    seen.update(dict.fromkeys(obj))
                for c in columns:
                    values[c].append(obj.get(c))
                if len(values[columns[0]]) == JSON_ROWS_PER_BATCH:
                    yield _json_batch(path, columns, list_col, values, row + 1 - JSON_ROWS_PER_BATCH, check_columns,
                                      seen)
                    values, check_columns = {c: [] for c in columns}, False
            row += 1
    if values[columns[0]]:
        yield _json_batch(path, columns, list_col, values, row - len(values[columns[0]]), check_columns, seen)


def _json_batch(path: str, columns: list[str], list_col: str | None, values: dict[str, list], row_base: int,
                check_columns: bool, seen: dict) -> pa.RecordBatch:
    if check_columns:
        _check_columns(path, list(seen), columns)
    arrays = []
    for i, c in enumerate(columns):
        if c == list_col:
            arrays.append(_json_token_lists(values[c], path, c, row_base))
        elif i < 2:
            arrays.append(_json_ids(values[c], path, c, row_base))
        else:
            arrays.append(_json_scalars(values[c], path, c, row_base))
    return pa.RecordBatch.from_arrays(arrays, names=columns)


def _json_kind(value) -> str:
    """JSON's name for the type of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def id_string(value):
    """One id (a key or a token) as the string prepare makes of it, as _as_strings casts a column:
    100000 → "100000", 7.0 → "7", true → "true"; None for None. A value that is no string, number or
    boolean (a list, a dict) is returned as it is, for the caller to refuse. Model looks keys up by it."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return pa.scalar(value, pa.float64()).cast(pa.string()).as_py()  # Arrow's formatting, as _as_strings
    return value


def _json_ids(values: list, path: str, column: str, row_base: int) -> pa.Array:
    """An id column as strings, whatever JSON type each row holds; an array or object is an error."""
    out = [id_string(v) for v in values]
    bad = next((i for i, v in enumerate(out) if v is not None and not isinstance(v, str)), None)
    if bad is not None:
        hint = " (a list of tokens per row is --format lists)" if isinstance(out[bad], list) else ""
        raise CorpusError(f"{path}: column '{column}' row {row_base + bad} holds a JSON {_json_kind(out[bad])}, "
                          f"expected strings or numbers{hint}")
    return _checked_strings(out, path, column, row_base)


def _json_token_lists(values: list, path: str, column: str, row_base: int) -> pa.Array:
    """A list column (--format lists) as list<string>, its tokens strings whatever their JSON type."""
    out = []
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, list):
            raise CorpusError(f"{path}: column '{column}' row {row_base + i} holds a JSON {_json_kind(v)}, expected "
                              "a list of tokens per row (use --format events for one token per row)")
        tokens = None if v is None else [id_string(t) for t in v]
        if tokens and any(t is not None and not isinstance(t, str) for t in tokens):
            raise CorpusError(f"{path}: column '{column}' row {row_base + i} holds a list with a JSON array or "
                              "object in it, expected a list of strings or numbers")
        out.append(tokens)
    try:
        return pa.array(out, pa.list_(pa.string()))
    except UnicodeError:  # a lone surrogate written as a \u escape
        bad = next(i for i, v in enumerate(out) if v and not all(_encodes(t) for t in v))
        raise CorpusError(f"{path}: column '{column}' row {row_base + bad} is not valid UTF-8") from None


def _checked_strings(values: list, path: str, column: str, row_base: int) -> pa.Array:
    try:
        return pa.array(values, pa.string())
    except UnicodeError:  # a lone surrogate written as a \u escape
        bad = next(i for i, v in enumerate(values) if not _encodes(v))
        raise CorpusError(f"{path}: column '{column}' row {row_base + bad} is not valid UTF-8") from None


def _encodes(value: str | None) -> bool:
    try:
        if value is not None:
            value.encode("utf-8")
    except UnicodeError:
        return False
    return True


def _json_scalars(values: list, path: str, column: str, row_base: int) -> pa.Array:
    """Any other column (the time) as Arrow infers it from the values; one JSON type throughout, as
    Arrow's reader asks."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError):
        kinds = [(i, _json_kind(v)) for i, v in enumerate(values) if v is not None]
        first = kinds[0][1] if kinds else "null"
        at, kind = next(((i, k) for i, k in kinds if k != first), (0, first))
        raise CorpusError(f"{path}: cannot read: column '{column}' changed from {first} to {kind} in row "
                          f"{row_base + at} (a column must hold one JSON type throughout a file: all strings or "
                          "all numbers)") from None


def _probe_json_type(path: str, read: pjson.ReadOptions, column: str, is_list: bool) -> pa.DataType:
    """The type of one column in the first block, found by trying the likely ones in turn (used when
    inferring the whole first block fails because of some other field)."""
    scalars = [pa.string(), pa.int64(), pa.float64(), pa.bool_()]
    for typ in [pa.list_(t) for t in scalars] if is_list else scalars:
        parse = pjson.ParseOptions(explicit_schema=pa.schema([(column, typ)]), unexpected_field_behavior="ignore")
        try:
            pjson.open_json(path, read_options=read, parse_options=parse)
            return typ
        except pa.ArrowInvalid:
            continue
    return pa.string()  # let the real read report what is wrong


def _text_lines(path: str) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """Lines of a text file as string arrays (newline removed), a block at a time, each with the
    positions in it of the lines that are not valid UTF-8 (null in the array)."""
    stream = pa.input_stream(path, compression="detect")
    rest = b""
    while True:
        block = stream.read(TEXT_BLOCK_BYTES)
        if not block:
            break
        data = rest + block
        cut = data.rfind(b"\n")
        if cut < 0:  # a line longer than a block: keep reading
            rest = data
            continue
        rest = data[cut + 1:]
        yield _split_lines(data[:cut])
    if rest:
        yield _split_lines(rest)


def _split_lines(data: bytes) -> tuple[pa.Array, np.ndarray]:
    """The lines of a block, and the positions of those that are not valid UTF-8 (null in the array).

    One cast checks the whole block; only a block that fails it is decoded line by line. A newline
    byte is never part of a multi-byte UTF-8 character, so splitting on it first is safe.
    """
    try:
        text = pa.array([data], pa.large_binary()).cast(pa.large_string())
    except pa.ArrowInvalid:
        lines, bad = [], []
        for i, raw in enumerate(data.split(b"\n")):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                lines.append(None)
                bad.append(i)
        return pa.array(lines, pa.string()), np.array(bad, np.int64)
    return pc.list_flatten(pc.split_pattern(text, "\n")).cast(pa.string()), np.zeros(0, np.int64)


def _is_text(typ: pa.DataType) -> bool:
    return (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ))


def _utf8_strings(arr: pa.Array, path: str, column: str, row_base: int) -> pa.Array:
    """A string or binary column as string, checked to be UTF-8: an invalid value is an error that
    names its row (the JSON and Parquet readers pass bytes through unchecked, and a corpus key that
    is not UTF-8 would break every later step)."""
    try:
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            arr.validate(full=True)
        return arr.cast(pa.string())  # from binary this checks the UTF-8 itself
    except pa.ArrowInvalid as e:
        values = arr.cast(pa.large_binary()).to_pylist()
        bad = next((i for i, v in enumerate(values) if v is not None and not _decodes(v)), None)
        if bad is None:  # not an encoding problem after all
            raise CorpusError(f"{path}: column '{column}': {_one_line(e)}") from None
        raise CorpusError(f"{path}: column '{column}' row {row_base + bad} is not valid UTF-8 (convert the "
                          "file to UTF-8)") from None


def _as_strings(arr: pa.Array, path: str, column: str, row_base: int = 0) -> pa.Array:
    """Keys and tokens are strings in the corpus whatever the input held: integers (common for user
    ids, and ints in one file with strings in another is common too), floats (7.0 → "7", so an id
    column that a null turned into floats still matches the ints) and booleans are cast; lists,
    structs, times and the like are an error naming the column."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if _is_text(arr.type):
        return _utf8_strings(arr, path, column, row_base)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type)
            or pa.types.is_null(arr.type) or pa.types.is_boolean(arr.type)):
        hint = (" (a list of tokens per row is --format lists)"
                if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) else "")
        raise CorpusError(f"{path}: column '{column}' holds {arr.type}, expected strings or numbers{hint}")
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid as e:
        raise CorpusError(f"{path}: column '{column}': {_one_line(e)}") from None


def _as_string_lists(arr: pa.Array, path: str, column: str, row_base: int = 0) -> pa.Array:
    """A list column as list<string>, its values checked to be UTF-8 like _utf8_strings's."""
    typ = arr.type
    if pa.types.is_null(typ):
        return pa.nulls(len(arr), pa.list_(pa.string()))
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
        raise CorpusError(f"{path}: column '{column}' holds {typ}, expected a list of tokens per row "
                          "(use --format events for one token per row)")
    if _is_text(typ.value_type):
        lists = arr.cast(pa.list_(pa.large_binary()))
        try:
            _utf8_strings(lists.values, path, column, 0)
        except CorpusError:
            bad = next(i for i, v in enumerate(lists.to_pylist())
                       if any(t is not None and not _decodes(t) for t in v or []))
            raise CorpusError(f"{path}: column '{column}' row {row_base + bad} is not valid UTF-8 (convert "
                              "the file to UTF-8)") from None
    try:
        return arr.cast(pa.list_(pa.string()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise CorpusError(f"{path}: column '{column}': cannot read {typ} as a list of strings: "
                          f"{_one_line(e)}") from None


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _time_seconds(arr: pa.Array, path: str, column: str, row_base: int = 0) -> np.ndarray:
    """A time column as float64 seconds (NaN for nulls), only ever compared within one document.

    Timestamps and dates become seconds since the epoch; numbers are taken as they are (epoch
    seconds, milliseconds, a sequence number: anything that orders); strings are parsed as numbers or
    ISO 8601. float64 keeps sub-microsecond resolution for present-day epoch seconds.
    """
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):  # CSV hands us bytes
        arr = _utf8_strings(arr, path, column, row_base)
        typ = arr.type
    if pa.types.is_timestamp(typ):
        per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[typ.unit]
        raw = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return raw.astype(np.float64) / per_second
    if pa.types.is_date32(typ):
        return arr.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.float64) * 86400.0
    if pa.types.is_date64(typ):
        return arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 1000.0
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ) or pa.types.is_null(typ):
        return arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        targets = (pa.float64(), pa.timestamp("us"), pa.timestamp("us", tz="UTC"))
        for target in targets:
            try:
                return _time_seconds(arr.cast(target), path, column)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        # Only the error path looks at values one by one, to name the first that is no time at all.
        for i, value in enumerate(arr.to_pylist()):
            if value is not None and not any(_casts(value, target) for target in targets):
                raise CorpusError(f"{path}: column '{column}' is not a time: cannot read {value!r} (row "
                                  f"{row_base + i}) as a number or an ISO 8601 timestamp")
        raise CorpusError(f"{path}: column '{column}' mixes numbers and ISO 8601 timestamps; use one "
                          "kind of time in a file")
    raise CorpusError(f"{path}: column '{column}' holds {typ}, expected timestamps, numbers or "
                      "ISO 8601 strings")


def _casts(value: str, target: pa.DataType) -> bool:
    try:
        pa.array([value]).cast(target)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def _flatten_lists(keys: pa.Array, lists: pa.Array, drop_empty: bool) -> tuple[pa.Array, pa.Array, int]:
    """One event per list element. A document with no element gets one null token, so that pass 3
    sees it and counts it as a document without tokens."""
    tokens = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    if drop_empty:  # whitespace splitting leaves empty strings at the edges; they are not tokens
        nonempty = pc.greater(pc.binary_length(tokens), 0).fill_null(True)
        tokens = tokens.filter(nonempty)
        parents = parents[nonempty.to_numpy(zero_copy_only=False)]
    have = np.zeros(len(keys), bool)
    have[parents] = True
    missing = np.flatnonzero(~have)
    if missing.size:
        parents = np.concatenate([parents, missing])
        order = np.argsort(parents, kind="stable")
        parents = parents[order]
        tokens = pa.concat_arrays([tokens, pa.nulls(missing.size, pa.string())]).take(pa.array(order))
    return keys.take(pa.array(parents)), tokens, int(missing.size)


@dataclass
class _Options:
    format: str
    doc_col: str
    token_col: str
    time_col: str | None


def _iter_chunks(files: list[str], opt: _Options, skips: _Skips | None = None) -> Iterator[tuple[str, _Chunk]]:
    """Every input file, in order, as normalised chunks of events. Errors name the file.

    Rows with a null or empty key, text lines that are not UTF-8 and empty files are left out here
    and, when `skips` is given (pass 1; pass 2 reads the same rows again), counted in it.
    """
    line_base = 0  # text: keys are line numbers across all inputs
    for path in files:
        row = 0  # rows (text: lines) of this file read so far
        try:
            if os.path.getsize(path) == 0:  # an empty Parquet file is not even Parquet: do not open it
                if skips is not None:
                    skips.add("empty_files", 1, path)
                continue
            if opt.format == "text":
                for lines, bad in _text_lines(path):
                    n = len(lines)
                    keys = pa.array(np.arange(line_base, line_base + n, dtype=np.int64)).cast(pa.string())
                    if bad.size:
                        # The line keeps its number: the keys of the lines after it do not move.
                        if skips is not None:
                            skips.add("invalid_utf8_lines", bad.size, path, "line", row, bad)
                        valid = lines.is_valid()
                        keys, lines = keys.filter(valid), lines.filter(valid)
                    words = pc.utf8_split_whitespace(lines)
                    key, token, pad = _flatten_lists(keys, words, drop_empty=True)
                    line_base += n
                    row += n
                    yield path, _Chunk(key, token, None, n, pad)
            else:
                columns = [opt.doc_col, opt.token_col] + ([opt.time_col] if opt.time_col else [])
                kind = _file_kind(path)
                if opt.format == "lists" and kind not in ("parquet", "json"):
                    raise CorpusError(f"{path}: --format lists reads Parquet or JSON lines, not {kind}")
                if kind == "parquet":
                    batches = _parquet_batches(path, columns)
                elif kind in ("csv", "tsv"):
                    batches = _csv_batches(path, columns, kind)
                else:
                    batches = _json_batches(path, columns, opt.token_col if opt.format == "lists" else None)
                for batch in batches:
                    # Every column is converted whole, before rows are dropped, so that the row
                    # numbers in its errors are those of the file.
                    n = batch.num_rows
                    key = _as_strings(batch.column(opt.doc_col), path, opt.doc_col, row)
                    time = None
                    if opt.format == "lists":
                        token = _as_string_lists(batch.column(opt.token_col), path, opt.token_col, row)
                    else:
                        token = _as_strings(batch.column(opt.token_col), path, opt.token_col, row)
                        if opt.time_col:
                            time = _time_seconds(batch.column(opt.time_col), path, opt.time_col, row)
                    usable = _usable_keys(key, path, row, skips)
                    if usable is not None:
                        key, token = key.filter(usable), token.filter(usable)
                        if time is not None:
                            time = time[usable.to_numpy(zero_copy_only=False)]
                    pad = 0
                    if opt.format == "lists":
                        key, token, pad = _flatten_lists(key, token, drop_empty=False)
                    row += n
                    yield path, _Chunk(key, token, time, n, pad)
        except CorpusError:
            raise
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            raise CorpusError(f"{path}: cannot read: {_read_error(e, path, row)}") from e
        if row == 0 and skips is not None:  # a header, a schema, blank space: no rows
            skips.add("empty_files", 1, path)


def _usable_keys(key: pa.Array, path: str, row: int, skips: _Skips | None) -> pa.Array | None:
    """Mask of the rows whose key is neither null nor empty, None when all are; counts the others."""
    empty = pc.equal(pc.binary_length(key), 0).fill_null(False)
    n_null, n_empty = key.null_count, pc.sum(empty).as_py() or 0
    if not n_null and not n_empty:
        return None
    if skips is not None:
        skips.add("null_keys", n_null, path, "row", row,
                  np.flatnonzero(key.is_null().to_numpy(zero_copy_only=False)) if n_null else None)
        skips.add("empty_keys", n_empty, path, "row", row,
                  np.flatnonzero(empty.to_numpy(zero_copy_only=False)) if n_empty else None)
    return pc.invert(pc.or_(key.is_null(), empty))


def _read_error(e: BaseException, path: str, row: int) -> str:
    """A reader's exception as one line, with row numbers made file-wide and a hint where one helps."""
    text = _one_line(e)
    if "JSON parse error" in text:
        # pyarrow counts rows from the start of the block it was parsing; we know where that began.
        text = re.sub(r"in row (\d+)", lambda m: f"in row {row + int(m.group(1))}", text)
        if "changed from" in text:
            text += " (a column must hold one JSON type throughout a file: all strings or all numbers)"
        elif _file_kind(path) == "json":
            text += " (JSON input must hold one object per line)"
    elif "CSV parse error" in text and "columns, got" in text:
        text += " (a field that holds the delimiter must be quoted)"
    return text


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
    skips: _Skips
    vocab: pa.Table  # token, count (input counts), id


def _pass1(files: list[str], opt: _Options, min_count: int, max_vocab: int | None, bar) -> _Pass1:
    counter = _TokenCounter()
    skips = _Skips()
    rows = events = key_bytes = null_tokens = empty_tokens = 0
    for _, chunk in _iter_chunks(files, opt, skips):
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


def _pass2(files: list[str], opt: _Options, token_ids: _TokenIds, buckets: int, spill_dir: str,
           bar) -> list[str]:
    fields = [("key", pa.string()), ("token", pa.int32())] + ([("time", pa.float64())] if opt.time_col else [])
    schema = pa.schema(fields)
    paths = [os.path.join(spill_dir, f"bucket-{b:05d}.arrows") for b in range(buckets)]
    sinks = [pa.OSFile(p, "wb") for p in paths]
    writers = [pa.ipc.new_stream(s, schema) for s in sinks]
    try:
        for _, chunk in _iter_chunks(files, opt):
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
                bucket = (_hash_strings(encoded.dictionary) % np.uint64(buckets)).astype(np.int64)
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

def _holdout(codes: np.ndarray, tokens: np.ndarray, key_hash: np.ndarray, vocab_size: int,
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
    draw = _mix64(key_hash[pair_doc] ^ _mix64(pair_tok.astype(np.uint64)
                                              + _mix64(np.array([seed & (2**64 - 1)], np.uint64))[0]))
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


def _write_shard(path: str, doc_ids: np.ndarray, lengths: np.ndarray, tokens: np.ndarray) -> None:
    """One shard file, in record batches of about BATCH_TOKENS tokens (a longer document alone)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = len(doc_ids)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, SHARD_SCHEMA) as writer:
        start = 0
        while start < n:
            end = int(np.searchsorted(offsets, offsets[start] + BATCH_TOKENS, side="right")) - 1
            end = min(max(end, start + 1), n)
            lo, hi = int(offsets[start]), int(offsets[end])
            if hi - lo > np.iinfo(np.int32).max:
                raise CorpusError(f"document {int(doc_ids[start])} has {hi - lo} tokens, more than a "
                                  "list<int32> record batch can hold")
            lists = pa.ListArray.from_arrays(pa.array((offsets[start:end + 1] - lo).astype(np.int32)),
                                             pa.array(tokens[lo:hi], pa.int32()))
            writer.write_batch(pa.RecordBatch.from_arrays([pa.array(doc_ids[start:end]), lists],
                                                          schema=SHARD_SCHEMA))
            start = end


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
    os.makedirs(os.path.join(tmp, "shards"))
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
                    keep, hid_doc, hid_tok, kept_whole = _holdout(codes, tokens, _hash_strings(uniq_keys),
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
                rel = os.path.join("shards", f"part-{b:05d}.arrow")
                _write_shard(os.path.join(tmp, rel), doc_ids, lengths, tokens)
                shards.append({"path": rel, "docs": len(present), "tokens": len(tokens)})
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

def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


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
    default: with `progress`) a summary and one line per reason go to stderr (`skip_report`).
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
    opt = _Options(format, doc_col, token_col, time_col if format == "events" else None)

    tmp = f"{out}.tmp-{os.getpid()}"
    hold_final = os.path.abspath(holdout_out) if holdout_out else None
    hold_tmp = f"{hold_final}.tmp-{os.getpid()}" if hold_final else None
    _remove(tmp)  # a leftover of a crashed run with our pid
    bars = {"file": sys.stderr, "disable": not progress, "dynamic_ncols": True}
    made: list[str] = []  # directories we create for the outputs, removed again on failure
    try:
        made += outputs.make_dirs(os.path.dirname(out))
        os.makedirs(tmp)
        if hold_tmp:
            made += outputs.make_dirs(os.path.dirname(hold_tmp))
        with tqdm(desc="prepare 1/3 count", unit=" rows", unit_scale=True, **bars) as bar:
            p1 = _pass1(files, opt, min_count, max_vocab, bar)
        buckets = num_shards or _choose_buckets(p1, time_col is not None, memory_budget_bytes)
        vocab_tokens = p1.vocab["token"].combine_chunks()
        spill_dir = os.path.join(tmp, "spill")
        os.makedirs(spill_dir)
        with tqdm(desc="prepare 2/3 partition", total=p1.rows, unit=" rows", unit_scale=True, **bars) as bar:
            spills = _pass2(files, opt, _TokenIds(vocab_tokens), buckets, spill_dir, bar)
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
        # Commit: the new corpus replaces the old one only now that it is complete, and only if what
        # is there now is still what was checked at the start (a corpus of ours, or nothing).
        outputs.commit_dir(tmp, out, "corpus", overwrite)
        if hold_tmp:
            outputs.check_file(hold_final, "heldout", overwrite)
            os.replace(hold_tmp, hold_final)
    except BaseException as e:
        _remove(tmp)
        if hold_tmp:
            _remove(hold_tmp)
        outputs.remove_dirs(made)
        if isinstance(e, OSError):  # reading errors are CorpusErrors already: this is the output
            raise CorpusError(f"{out}: cannot write the corpus: {_one_line(e)}") from e
        raise

    if report is None:
        report = progress
    if report:
        lines = skip_report(meta)
        print(f"prepared {out}: {p3.num_docs:,} docs, {p3.num_tokens:,} tokens, vocabulary "
              f"{len(vocab_tokens):,}, {buckets} shard(s)"
              + ("" if any(line.startswith("skipped") for line in lines) else "; skipped: nothing")
              + (f"; held out {p3.heldout:,} (key, token) pairs to {hold_final}" if hold_final else ""),
              file=sys.stderr)
        for line in lines:
            print(line, file=sys.stderr)
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


# ---------------------------------------------------------------------------------------------------
# Reading a corpus
# ---------------------------------------------------------------------------------------------------

def _read_ipc_file(path: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: cannot read: {_one_line(e)}") from e


class Corpus:
    """An existing corpus directory, as written by `prepare`."""

    REQUIRED = ("format_version", "num_docs", "num_tokens", "vocab_size", "num_shards", "shards")

    def __init__(self, path: str):
        self.path = os.path.abspath(os.fspath(path))
        meta_path = os.path.join(self.path, "corpus.json")
        if not os.path.isfile(meta_path):
            raise CorpusError(f"{self.path}: not a corpus (no corpus.json; make one with `prepare`)")
        try:
            with open(meta_path) as f:
                self.meta = json.load(f)
        except (OSError, ValueError) as e:
            raise CorpusError(f"{meta_path}: cannot read: {_one_line(e)}") from e
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

    def vocab(self) -> pa.Table:
        """token string, count int64 (training count), id int32; sorted by id."""
        return _read_ipc_file(os.path.join(self.path, "vocab.arrow"))

    def counts(self) -> np.ndarray:
        """int64 training count of each word id."""
        return self.vocab()["count"].to_numpy().astype(np.int64, copy=False)

    def docs(self) -> pa.Table:
        """key string, id int64, length int64; sorted by id."""
        return _read_ipc_file(os.path.join(self.path, "docs.arrow"))

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
        raise CorpusError(f"{path}: cannot read shard: {_one_line(e)}") from e
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pending_tokens = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        if batch.num_rows == 0:
            continue
        doc_ids = batch.column(0).to_numpy()
        lists = batch.column(1)
        raw = lists.offsets.to_numpy()
        values = lists.values.to_numpy()[raw[0]:raw[-1]]
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
