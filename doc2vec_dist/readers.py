"""Readers: input paths in, normalised chunks of (key, token, time) events out.

Changes when an input format, a file kind or the handling of its bad rows changes. What `prepare`
does with the events, and which bad input stops it and which is skipped, is in prepare.py.

Input formats:

    events  rows of (doc_col, token_col[, time_col]) in Parquet, CSV/TSV or JSON lines; a user's
            events may be spread over many files. With time_col, each user's tokens are ordered by
            time (ties keep input order); otherwise by input order. Keys and tokens are stripped of
            leading and trailing whitespace; then the token column's absolute http(s) URLs are
            normalised by Options.urls (urls.py: one page, one token). CSV fields are separated by
            ',' (.csv) or a tab (.tsv), or by Options.delimiter.
    lists   one row per document: doc_col and token_col holding a list of tokens (Parquet, JSON lines);
            stripped and normalised as events' tokens are.
    text    one document per line, tokens separated by whitespace. The key of a document is its line
            number counted from 0 across the inputs concatenated in the order given (a directory's
            files in sorted order); a file that does not end in a newline still ends its last line.

Times. Every time column becomes float64 epoch seconds, UTC, as it is read (_time_seconds):
timestamps of any unit and time zone (none: UTC), dates, ISO 8601 strings (with an offset, or UTC),
and numbers. Numbers are epoch times in Options.time_unit, or else in the unit their size says
(EPOCH_SECONDS: seconds 1e8..1e11, milliseconds 1e11..1e14, ...), found from the median of a file's
first block and then held for the whole file: a value of another size is an error naming its row, so
files in different units are each read right, and a file that mixes units is refused. Numbers too
small for any unit (sequence numbers) only order each user's events: accepted as they are unless an
option needs times (Options.epochs_for), never together with epoch times.

Errors are one-line CorpusErrors naming the file (and the column and row where known); rows and
lines in them are counted from 0 within their file (a CSV header is not a row), as text keys are.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.json as pjson
import pyarrow.parquet as pq

from . import storage
from .corpus import CorpusError, one_line
from .ids import id_string
from .urls import UrlRule, normalize

log = logging.getLogger(__name__)

FORMATS = ("events", "lists", "text")

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
    lower = storage.strip_query(path).lower()
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


def _input(path: str, random_access: bool = False):
    """What pyarrow's readers take for an input file: a local path as it is; a URI (s3://…, gs://…,
    opened as storage.resolve opens it) a file of its filesystem: random access (Parquet), else a
    stream decompressed as its name's extension says, as pyarrow does for a local path."""
    if not storage.is_uri(path):
        return path
    fs, inner = storage.resolve(path)
    return fs.open_input_file(inner) if random_access else fs.open_input_stream(inner, compression="detect")


def _stream(path: str):
    """An input file as a stream, decompressed as its name's extension says."""
    return _input(path) if storage.is_uri(path) else pa.input_stream(path, compression="detect")


def _size(path: str) -> int:
    """An input file's size in bytes (FileNotFoundError when there is none)."""
    if not storage.is_uri(path):
        return os.path.getsize(path)
    fs, inner = storage.resolve(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{storage.strip_query(path)}: no such file")
    return info.size


def _uri_files(given: str, format: str, unread: list[str] | None = None) -> list[str]:
    """The input files of a URI: the object itself, or every data object under it (as _walk lists a
    directory's, what is not read but bookkeeping going to `unread`), each as a URI with the given one's
    query (its filesystem's settings)."""
    fs, inner = storage.resolve(given)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise CorpusError(f"{storage.strip_query(given)}: no such file or directory")
    if info.type != pafs.FileType.Directory:
        return [given]
    found, passed = [], []
    for entry in fs.get_file_info(pafs.FileSelector(inner, recursive=True)):
        rel = entry.path[len(inner):].lstrip("/")
        if entry.type != pafs.FileType.File:
            continue
        hidden = [part for part in rel.split("/") if part.startswith((".", "_"))]
        if not hidden:
            found.append(storage.join(given, *rel.split("/")))
        elif not any(bookkeeping(part) for part in hidden):
            passed.append(storage.join(given, *rel.split("/")))
    found = sorted(found)
    if format != "text":
        passed += [f for f in found if not _file_kind(f)]
        found = [f for f in found if _file_kind(f)]
    if unread is not None:
        unread += sorted(passed)
    if not found:
        raise CorpusError(f"{storage.strip_query(given)}: the directory holds no input files"
                          + ("" if format == "text" else " (.parquet, .csv, .jsonl, …)"))
    return found


def bookkeeping(name: str) -> bool:
    """Whether a file or folder in an input directory is what the tools that write data sets leave beside
    the data, passed over without a word: _-prefixed names (Spark's _SUCCESS and _temporary, Parquet's
    _metadata and _common_metadata) and Hadoop's hidden checksums (.part-00000.parquet.crc). Any other
    file that is not read (a README.txt, macOS's .DS_Store, a hidden folder) is counted and named
    (expand_inputs' `unread`)."""
    return name.startswith("_") or (name.startswith(".") and name.endswith(".crc"))


def _walk(directory: str, unread: list[str]) -> list[str]:
    """Files under a directory, recursively, sorted; hidden ones and bookkeeping are not data, and the
    hidden ones go to `unread` (a hidden folder as itself), bookkeeping nowhere."""
    found = []
    for root, dirs, files in os.walk(directory):
        unread += [os.path.join(root, n) + (os.sep if n in dirs else "") for n in sorted(dirs) + sorted(files)
                   if n.startswith(".") and not bookkeeping(n)]
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [os.path.join(root, f) for f in files if not f.startswith((".", "_"))]
    return sorted(found)


def expand_inputs(inputs: list[str], format: str, unread: list[str] | None = None) -> list[str]:
    """The input files, in order: each input is a file, a directory (its data files, recursively,
    sorted) or a glob (its matches, sorted). A file listed twice is read once. The directory that
    `generate` wrote stands for its events/ (not its generate.json and ground truth). What a directory
    holds that is not read, but for bookkeeping, is added to `unread` (prepare reports it)."""
    from .synthetic import events_dir

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise CorpusError("no input given")
    files: list[str] = []
    for given in map(os.fspath, inputs):
        if storage.is_uri(given):
            files += _uri_files(given, format, unread)
            continue
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
                log.info(f"{match}: a `generate` output; reading its events in {generated}")
                match = generated
            if os.path.isdir(match):
                passed: list[str] = []
                inside = _walk(match, passed)
                if format != "text":
                    passed += [f for f in inside if not _file_kind(f)]
                    inside = [f for f in inside if _file_kind(f)]
                if unread is not None:
                    unread += sorted(passed)
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
        real = f if storage.is_uri(f) else os.path.realpath(f)
        if real not in seen:
            seen.add(real)
            unique.append(f)
    if not unique:
        raise CorpusError(f"{', '.join(map(str, inputs))}: no input files found")
    return unique


@dataclass
class Chunk:
    """A batch of events, whatever the input format: event i is (key[i], token[i], time[i])."""

    key: pa.Array            # string, no nulls
    token: pa.Array          # string; null where the input had no usable token
    time: np.ndarray | None  # float64 epoch seconds (UTC), NaN for a missing time; None without time_col
    rows: int                # input rows (events, or documents for lists/text) this chunk covers
    padding: int = 0         # null tokens we added so that a document with no token is still seen



# Why prepare drops things, in the order it reports them (see prepare's docstring).
SKIP_REASONS = ("unread_files", "empty_files", "null_keys", "empty_keys", "invalid_utf8_lines", "null_tokens",
                "empty_tokens", "events_outside_window", "events_of_forgotten_users", "duplicate_events", "events_in_base",
                "tokens_below_min_count", "tokens_beyond_max_vocab", "tokens_beyond_max_per_doc", "docs_without_tokens")


class Skips:
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

    def merge(self, later: Skips) -> None:
        """Add the skips of a later part of the inputs, as if it had been read after this one."""
        for reason, count in later.counts.items():
            self.counts[reason] += count
        _merge_examples(self.where, later.where, self.EXAMPLES)


def _merge_examples(into: dict[str, list[str]], later: dict[str, list[str]], limit: int) -> None:
    """The first `limit` examples of each reason (or column): `into`'s, then `later`'s."""
    for name, found in later.items():
        where = into.setdefault(name, [])
        where += found[:max(0, limit - len(where))]



def _missing_column(path: str, column: str, names: list[str], hint: str = "") -> CorpusError:
    return CorpusError(f"{path}: column '{column}' not found (columns: {', '.join(names)}){hint}")


def _check_columns(path: str, names: list[str], needed: list[str], hint: str = "") -> None:
    for column in needed:
        if column not in names:
            raise _missing_column(path, column, names, hint)


def _parquet_batches(path: str, columns: list[str], row_groups: tuple[int, ...] | None = None) -> Iterator[pa.RecordBatch]:
    """A Parquet file's batches (of its row groups `row_groups`, default all); its columns are checked at
    once, before the first batch is asked for."""
    pf = pq.ParquetFile(_input(path, random_access=True))
    _check_columns(path, pf.schema_arrow.names, columns)
    return pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns,
                           row_groups=None if row_groups is None else list(row_groups))


def _csv_batches(path: str, columns: list[str], kind: str, delimiter: str | None = None) -> Iterator[pa.RecordBatch]:
    read = pcsv.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)
    parse = pcsv.ParseOptions(delimiter=delimiter or ("\t" if kind == "tsv" else ","))
    # Everything as bytes: the key and token become strings anyway, the time is parsed by
    # _time_seconds, and a column's type cannot then change from one block to the next. Bytes, not
    # strings, so that invalid UTF-8 reaches _utf8_strings, which can say in which row it is (the CSV
    # reader cannot). Only the empty field is null, so a URL or user called "NA" or "null" stays itself.
    convert = pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.binary() for c in columns},
                                  strings_can_be_null=True, null_values=[""])
    try:
        reader = pcsv.open_csv(_input(path), read_options=read, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, KeyError) as e:
        if "Empty CSV file" in str(e):  # not even a header (a compressed empty file, say)
            return
        if "include_columns" not in str(e):
            raise
        names = pcsv.open_csv(_input(path), read_options=read, parse_options=parse).schema.names
        other = next((d for d in ";|\t," if len(names) == 1 and d in names[0] and d != parse.delimiter), None)
        _check_columns(path, names, columns, f" (a header of one column: are the fields separated by {other!r}? give "
                                             f"--delimiter {other!r})" if other else "")
        raise
    yield from reader


def _json_batches(path: str, columns: list[str], list_col: str | None) -> Iterator[pa.RecordBatch]:
    """JSON lines as record batches of `columns`: (doc_col, token_col[, time_col]), as read_block asks
    for them; the first two are ids, which may be strings in some rows and numbers in others."""
    read = pjson.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)
    # The streaming reader fixes a column's type from the first block and cannot turn a number into a
    # string. We want only our columns: learn their types from the first block, then read with an
    # explicit schema that ignores every other field (an unrelated field changing type must not stop us).
    try:
        inferred = pjson.open_json(_input(path), read_options=read).schema
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
        for batch in pjson.open_json(_input(path), read_options=read, parse_options=parse):
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
            pjson.open_json(_input(path), read_options=read, parse_options=parse)
            return typ
        except pa.ArrowInvalid:
            continue
    return pa.string()  # let the real read report what is wrong


def _text_lines(path: str) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """Lines of a text file as string arrays (newline removed), a block at a time, each with the
    positions in it of the lines that are not valid UTF-8 (null in the array)."""
    stream = _stream(path)
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
            raise CorpusError(f"{path}: column '{column}': {one_line(e)}") from None
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
        raise CorpusError(f"{path}: column '{column}': {one_line(e)}") from None


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
                          f"{one_line(e)}") from None


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---------------------------------------------------------------------------------------------------
# Times: every time column as float64 epoch seconds, UTC, as it is read
# ---------------------------------------------------------------------------------------------------
# One unit whatever the input held, so that files in different units order one user's events together
# and --window-days and a base's latest time mean what they say. float64 seconds keep NaN for a missing
# time (it sorts last and equals nothing, so it is never a duplicate) and -inf for a base's own tokens,
# and resolve about a quarter of a microsecond at present-day times: finer than any log's clock but a
# nanosecond one's.

TIME_UNITS = ("s", "ms", "us", "ns")
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
UNIT_NAMES = {"s": "epoch seconds", "ms": "epoch milliseconds", "us": "epoch microseconds",
              "ns": "epoch nanoseconds"}
ORDER = "order"  # the unit of numbers that are no epoch time in any unit: they only order a user's events
# An epoch time is taken to lie between 1973-03-03 (1e8 s) and the year 5138 (1e11 s). Its size then
# says its unit without overlap: seconds 1e8..1e11, milliseconds 1e11..1e14, microseconds 1e14..1e17,
# nanoseconds 1e17..1e20. Present-day times (about 1.7e9 s) are far from every bound.
EPOCH_SECONDS = (1e8, 1e11)
_SIZE_BOUNDS = np.array([EPOCH_SECONDS[0] * PER_SECOND[u] for u in TIME_UNITS] + [EPOCH_SECONDS[1] * 10**9])
_ZONED = r"\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d(?::?\d\d)?)$"  # an ISO 8601 time with a UTC offset


def _sizes(values: np.ndarray) -> np.ndarray:
    """For each value, the index in TIME_UNITS of the unit its size says it is an epoch time in: -1 when
    too small for any (before 1973 in seconds: a sequence number, a negative), len(TIME_UNITS) when too
    large for any (NaN too)."""
    return np.searchsorted(_SIZE_BOUNDS, values, side="right") - 1


def unit_by_size(value: float) -> str | None:
    """The unit in which `value` is an epoch time (see EPOCH_SECONDS), None when it is one in none."""
    size = int(_sizes(np.array([value], np.float64))[0])
    return TIME_UNITS[size] if 0 <= size < len(TIME_UNITS) else None


@dataclass(frozen=True)
class TimeReading:
    """How a file's time column was read: `what` says so in the report; `unit` is that of its numbers
    (s, ms, us, ns, or ORDER for numbers that are no epoch time), None for timestamps, dates and ISO
    strings, which carry their own."""

    what: str
    unit: str | None = None

    @property
    def epoch(self) -> bool:
        return self.unit != ORDER


def _number(value) -> str:
    """A time value as a message shows it: 1700000000000, not 1.7e+12."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def _epoch_numbers(values: np.ndarray, shown: pa.Array, path: str, column: str, row_base: int, opt: Options,
                   file_unit: str | None) -> tuple[np.ndarray, TimeReading | None]:
    """Numbers as epoch seconds: in --time-unit, else in the unit their size says (that of the median of
    the file's first block with a time, then the same for the whole file). A value of another size is
    refused naming its row; numbers too small for any unit only order each user's events, and are
    refused where a time is needed (opt.epochs_for)."""
    finite = np.isfinite(values)
    where = f"{path}: column '{column}' row"

    def value_at(i: int) -> str:
        return _number(shown[int(i)].as_py())

    if opt.time_unit is not None:
        seconds = values / PER_SECOND[opt.time_unit]
        beyond = np.flatnonzero(finite & (np.abs(seconds) >= EPOCH_SECONDS[1]))
        if beyond.size:
            i = beyond[0]
            size = unit_by_size(abs(values[i]))
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}, which in {UNIT_NAMES[opt.time_unit]} "
                              f"(--time-unit {opt.time_unit}) lies after the year 5000"
                              + (f"; its size says {UNIT_NAMES[size]} (--time-unit {size})" if size else ""))
        return seconds, TimeReading(f"{UNIT_NAMES[opt.time_unit]} (--time-unit {opt.time_unit})", opt.time_unit)
    if not finite.any():
        return values, None  # no time in this block: nothing says a unit yet
    sizes = _sizes(values)
    unit = file_unit
    if unit is None:
        size = int(_sizes(np.array([np.median(values[finite])]))[0])
        unit = ORDER if size < 0 else TIME_UNITS[size] if size < len(TIME_UNITS) else None
        if unit is None:
            i = int(np.flatnonzero(finite)[np.argmax(values[finite])])
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}: numbers of this size are no epoch time "
                              "in any unit (seconds are about 1.7e9 today, milliseconds 1.7e12, up to nanoseconds "
                              "1.7e18); give --time-unit s|ms|us|ns if they are")
    if unit == ORDER:
        if opt.epochs_for:
            i = int(np.flatnonzero(finite)[0])
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}: these numbers are no epoch time (seconds "
                              "are about 1.7e9 today, milliseconds 1.7e12), and " + opt.epochs_for + " needs times; "
                              "give --time-unit s|ms|us|ns if they are epoch times")
        odd = np.flatnonzero(finite & (sizes >= 0))
    else:
        odd = np.flatnonzero(finite & (sizes != TIME_UNITS.index(unit)))
    if odd.size:
        i = odd[0]
        size = int(sizes[i])
        this = ("no epoch time in any unit" if size < 0 else "too large for an epoch time in any unit"
                if size >= len(TIME_UNITS) else f"{UNIT_NAMES[TIME_UNITS[size]]} by its size")
        rest = ("numbers that are no epoch time (they only order each user's events)" if unit == ORDER
                else f"{UNIT_NAMES[unit]} by their size")
        raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}, {this}, but the file's times are {rest}: "
                          "a file's times must be in one unit (give --time-unit s|ms|us|ns to say which)")
    if unit == ORDER:
        return values, TimeReading("numbers that only order each user's events (no epoch time in any unit: "
                                   "below 1e8)", ORDER)
    return values / PER_SECOND[unit], TimeReading(f"{UNIT_NAMES[unit]} (detected)", unit)


def _iso_seconds(strings: pa.Array) -> np.ndarray:
    """ISO 8601 strings as epoch seconds: those with a UTC offset (Z, +02:00) at that offset, the others
    as UTC; nanosecond fractions kept. Raises pa.ArrowInvalid when a value is no ISO 8601 time."""
    out = np.full(len(strings), np.nan)
    zoned = pc.match_substring_regex(strings, _ZONED)
    for mask, tz in ((zoned, "UTC"), (pc.invert(zoned), None)):
        part = strings.filter(mask)  # a null is in neither part: it stays NaN
        if not len(part):
            continue
        for unit in ("us", "ns"):
            try:
                raw = part.cast(pa.timestamp(unit, tz=tz)).cast(pa.int64()).to_numpy(zero_copy_only=False)
                break
            except pa.ArrowInvalid:
                if unit == "ns":
                    raise
        out[mask.fill_null(False).to_numpy(zero_copy_only=False)] = raw / PER_SECOND[unit]
    return out


def _time_seconds(arr: pa.Array, path: str, column: str, row_base: int, opt: Options,
                  file_unit: str | None = None) -> tuple[np.ndarray, TimeReading | None]:
    """A time column as float64 epoch seconds, UTC (NaN for a missing time), and how it was read.

    Timestamps of any unit and time zone (one without a zone is taken as UTC) and dates carry their
    unit; numbers, and strings that are numbers, are epoch times in --time-unit or the unit their size
    says (_epoch_numbers); other strings are ISO 8601 (_iso_seconds). file_unit: the unit the file's
    numbers were found in so far.
    """
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):  # CSV hands us bytes
        arr = _utf8_strings(arr, path, column, row_base)
        typ = arr.type
    if pa.types.is_timestamp(typ):
        raw = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
        zone = f"{typ.tz}" if typ.tz else "no time zone: taken as UTC"
        return raw.astype(np.float64) / PER_SECOND[typ.unit], TimeReading(f"timestamps ({typ.unit}, {zone})")
    if pa.types.is_date32(typ):
        return (arr.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.float64) * 86400.0,
                TimeReading("dates (UTC midnight)"))
    if pa.types.is_date64(typ):
        return (arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 1000.0,
                TimeReading("dates (UTC midnight)"))
    if pa.types.is_null(typ):
        return np.full(len(arr), np.nan), None
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        # unsafe: an int64 of nanoseconds is past float64's exact integers, and rounds (by well under a µs)
        values = arr.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        return _epoch_numbers(values, arr, path, column, row_base, opt, file_unit)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        arr = pc.utf8_trim_whitespace(arr)
        try:
            values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            pass
        else:
            return _epoch_numbers(values, arr, path, column, row_base, opt, file_unit)
        try:
            return _iso_seconds(arr), TimeReading("ISO 8601 strings (UTC where they give no offset)")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        # Only the error path looks at values one by one, to name the first that is no time at all.
        for i, value in enumerate(arr.to_pylist()):
            if value is not None and not (_parses(value, float) or _parses(value, _iso_seconds)):
                raise CorpusError(f"{path}: column '{column}' is not a time: cannot read {value!r} (row "
                                  f"{row_base + i}) as a number or an ISO 8601 timestamp")
        raise CorpusError(f"{path}: column '{column}' mixes numbers and ISO 8601 timestamps; use one "
                          "kind of time in a file")
    raise CorpusError(f"{path}: column '{column}' holds {typ}, expected timestamps, numbers or "
                      "ISO 8601 strings")


def _parses(value: str, parse) -> bool:
    try:
        parse(pa.array([value], pa.string()) if parse is _iso_seconds else value)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
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
class Options:
    format: str
    doc_col: str
    token_col: str
    time_col: str | None
    time_unit: str | None = None   # of numeric times (TIME_UNITS); None: each file's by the size of its numbers
    delimiter: str | None = None   # of CSV/TSV fields; None: ',' for .csv, tab for .tsv
    epochs_for: str | None = None  # the option that needs epoch times ("--window-days"): numbers that only
    #                                order events are refused
    urls: UrlRule | None = None    # the rule the token column's URLs are normalised by (events, lists); None:
    #                                as read (text, --no-normalize, and prepare's pass 1, which counts them so)


def csv_delimiter(value: str | None) -> str | None:
    """--delimiter as the one character it stands for ('\\t' and 'tab' for a tab)."""
    if value is None:
        return None
    value = {"\\t": "\t", "tab": "\t"}.get(value, value)
    if len(value) != 1 or value in "\"\r\n":
        raise CorpusError(f"--delimiter must be one character other than a quote or a newline (';', '|', "
                          f"'\\t' for a tab), not {value!r}")
    return value


class ReadNotes:
    """What reading the inputs decided or changed that prepare reports, though it drops nothing (that
    is Skips): how each file's time column was read, the events whose time is null (kept: prepare says
    where they go), and the keys and tokens stripped of leading or trailing whitespace
    (" https://a.com/ " and "https://a.com/" are one URL)."""

    EXAMPLES = 3

    def __init__(self):
        self.time_read: dict[str, list[str]] = {}   # how a time column was read → the files read so
        self.time_units: set[str | None] = set()    # TimeReading.unit of each
        self.stripped: dict[str, int] = {}          # column → values stripped
        self.stripped_where: dict[str, list[str]] = {}
        self.untimed = 0                            # events (of a usable key) with a null time
        self.untimed_where: list[str] = []

    def read_time(self, path: str, reading: TimeReading) -> None:
        files = self.time_read.setdefault(reading.what, [])
        if path not in files:
            files.append(path)
        self.time_units.add(reading.unit)

    def merge(self, later: ReadNotes) -> None:
        """Add what reading a later part of the inputs noted, as if it had been read after this one."""
        for what, files in later.time_read.items():
            mine = self.time_read.setdefault(what, [])
            mine += [f for f in files if f not in mine]
        self.time_units |= later.time_units
        for column, count in later.stripped.items():
            self.stripped[column] = self.stripped.get(column, 0) + count
        _merge_examples(self.stripped_where, later.stripped_where, self.EXAMPLES)
        self.untimed += later.untimed
        self.untimed_where += later.untimed_where[:max(0, self.EXAMPLES - len(self.untimed_where))]

    def no_time(self, path: str, missing: np.ndarray, base: int) -> None:
        """Count the events of `missing` (a mask of a batch's rows, from row `base` of `path`) with no time."""
        at = np.flatnonzero(missing)
        self.untimed += len(at)
        self.untimed_where += [f"{path} row {base + int(i)}" for i in at[:max(0, self.EXAMPLES - len(self.untimed_where))]]

    def strip(self, column: str, count: int, path: str, at: np.ndarray | None, base: int) -> None:
        if not count:
            return
        self.stripped[column] = self.stripped.get(column, 0) + count
        where = self.stripped_where.setdefault(column, [])
        room = self.EXAMPLES - len(where)
        if room > 0:
            where += [path] if at is None else [f"{path} row {base + int(i)}" for i in at[:room]]


def _stripped(arr: pa.Array, column: str, path: str, row_base: int, notes: ReadNotes | None,
              rows: bool = True) -> pa.Array:
    """Strings with leading and trailing whitespace removed, the values changed counted in `notes`
    (by row when `rows`, else by file)."""
    trimmed = pc.utf8_trim_whitespace(arr)
    if notes is not None:
        changed = pc.not_equal(pc.binary_length(arr), pc.binary_length(trimmed)).fill_null(False)
        count = pc.sum(changed).as_py() or 0
        if count:
            notes.strip(column, count, path, np.flatnonzero(changed.to_numpy(zero_copy_only=False)) if rows else None,
                        row_base)
    return trimmed


class TimeKinds:
    """One kind of time across the inputs: epoch times (of whatever unit or type, all made seconds),
    or numbers that only order each user's events; never both, as they cannot order one user's events
    together. prepare checks each block's readings (BlockState.readings) here in input order."""

    def __init__(self):
        self.first: dict[bool, tuple[str, TimeReading]] = {}  # epoch? → the first file read so, and how

    def check(self, path: str, column: str, reading: TimeReading) -> None:
        other = self.first.get(not reading.epoch)
        if other is not None:
            raise CorpusError(f"{path}: column '{column}' read as {reading.what}, but {other[0]}'s as "
                              f"{other[1].what}: one user's events cannot be ordered by both; give --time-unit "
                              "s|ms|us|ns if all are epoch times")
        self.first.setdefault(reading.epoch, (path, reading))


# ---------------------------------------------------------------------------------------------------
# Blocks: the parts of the inputs that prepare's tasks read, each on its own
# ---------------------------------------------------------------------------------------------------

def input_bytes(files: list[str]) -> int:
    """The input files' size in bytes, as stored (compressed, where they are)."""
    return sum(_size(path) for path in files)


# A Parquet file of more rows than this is read as several blocks of whole row groups, so that one big
# file keeps several processes busy; any other file is one block.
BLOCK_ROWS = 1 << 22


@dataclass(frozen=True)
class Block:
    """A part of the inputs that one task reads: a whole file, or a run of a Parquet file's row groups.

    The blocks are a property of the inputs alone (plan_blocks), never of how many processes read them,
    so the corpus is the same however many do. What reading one block needs of the blocks before it is
    given here: first_row, the file's rows before it (rows in messages count from the file's start);
    line_base, for text, the key of its first line (the lines of the files before it); unit, the unit
    of the file's numeric times that the blocks before it settled (None: not known, read_block finds
    it from the `earlier` row groups).
    """

    index: int
    path: str
    row_groups: tuple[int, ...] | None = None  # None: the whole file
    first_row: int = 0
    rows: int | None = None                    # known before reading (Parquet's metadata), for progress
    earlier: tuple[tuple[int, ...], ...] = ()  # the row groups of the file's blocks before this one
    line_base: int = 0
    unit: str | None = None

    @property
    def whole_file(self) -> bool:
        return self.row_groups is None


def plan_blocks(files: list[str], opt: Options) -> list[Block]:
    """The blocks of the inputs, in input order: a Parquet file of more than BLOCK_ROWS rows in runs of
    whole row groups of about equal rows, every other file whole. A file whose footer cannot be read is
    one block: reading it says what is wrong, in its turn."""
    blocks: list[Block] = []
    for path in files:
        groups = None
        if opt.format != "text" and _file_kind(path) == "parquet":
            try:
                meta = pq.ParquetFile(_input(path, random_access=True)).metadata if _size(path) else None
            except (pa.ArrowException, OSError, ValueError):
                meta = None
            if meta is not None and meta.num_rows > BLOCK_ROWS and meta.num_row_groups > 1:
                groups = _row_group_runs([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
            elif meta is not None:
                blocks.append(Block(len(blocks), path, rows=meta.num_rows))
                continue
        if groups is None:
            blocks.append(Block(len(blocks), path))
            continue
        first, earlier = 0, ()
        for run, rows in groups:
            blocks.append(Block(len(blocks), path, run, first, rows, earlier))
            first += rows
            earlier += (run,)
    return blocks


def _row_group_runs(sizes: list[int]) -> list[tuple[tuple[int, ...], int]]:
    """Consecutive row groups in runs of about total / ceil(total / BLOCK_ROWS) rows: (groups, rows)."""
    total = sum(sizes)
    target = total / math.ceil(total / BLOCK_ROWS)
    runs, run, rows = [], [], 0
    for g, n in enumerate(sizes):
        run.append(g)
        rows += n
        if rows >= target and g < len(sizes) - 1:
            runs.append((tuple(run), rows))
            run, rows = [], 0
    if run:
        runs.append((tuple(run), rows))
    return runs


class BlockState:
    """What reading a block learnt beyond its chunks: its rows (text: lines), how each batch's times
    were read, in order (prepare checks them across the inputs, TimeKinds), and the unit of the file's
    numeric times after it (the next block of the file starts from it)."""

    def __init__(self, unit: str | None = None):
        self.rows = 0
        self.readings: list[TimeReading] = []
        self.unit = unit


def count_lines(block: Block) -> int:
    """The lines of a text file, as read_block counts them (the last one need not end in a newline):
    the keys of the next file's lines start after them."""
    try:
        if _size(block.path) == 0:
            return 0
        stream = _stream(block.path)
        lines, last = 0, b"\n"
        while data := stream.read(TEXT_BLOCK_BYTES):
            lines += data.count(b"\n")
            last = data[-1:]
        return lines + (last != b"\n")
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorpusError(f"{block.path}: cannot read: {_read_error(e, block.path, 0)}") from e


def read_block(block: Block, opt: Options, state: BlockState, skips: Skips | None = None,
               notes: ReadNotes | None = None) -> Iterator[Chunk]:
    """A block of the inputs as normalised chunks of events. Errors name the file (and row).

    Rows with a null or empty key, text lines that are not UTF-8 and empty files are left out here
    and, when `skips` is given (pass 1; pass 2 reads the same rows again), counted in it; keys and
    tokens are stripped of leading and trailing whitespace, and times made epoch seconds (_time_seconds),
    which `notes` (pass 1 too) records; `state` gathers the rest (BlockState).
    """
    path = block.path
    row = block.first_row  # rows (text: lines) of this file read so far
    try:
        if block.whole_file and _size(path) == 0:  # an empty Parquet file is not even Parquet
            if skips is not None:
                skips.add("empty_files", 1, path)
            return
        if opt.format == "text":
            line_base = block.line_base
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
                state.rows += n
                yield Chunk(key, token, None, n, pad)
        else:
            columns = [opt.doc_col, opt.token_col] + ([opt.time_col] if opt.time_col else [])
            kind = _file_kind(path)
            if opt.format == "lists" and kind not in ("parquet", "json"):
                raise CorpusError(f"{path}: --format lists reads Parquet or JSON lines, not {kind}")
            if kind == "parquet":
                batches = _parquet_batches(path, columns, block.row_groups)
                if state.unit is None and block.earlier and opt.time_col and opt.time_unit is None:
                    state.unit = _earlier_unit(path, block.earlier, opt)
            elif kind in ("csv", "tsv"):
                batches = _csv_batches(path, columns, kind, opt.delimiter)
            else:
                batches = _json_batches(path, columns, opt.token_col if opt.format == "lists" else None)
            for batch in batches:
                chunk = batch_chunk(batch, path, row, opt, state, skips, notes)
                row += chunk.rows
                yield chunk
    except CorpusError:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        raise CorpusError(f"{path}: cannot read: {_read_error(e, path, row)}") from e
    if block.whole_file and row == 0 and skips is not None:  # a header, a schema, blank space: no rows
        skips.add("empty_files", 1, path)


def batch_chunk(batch: pa.RecordBatch | pa.Table, path: str, row: int, opt: Options, state: BlockState,
                skips: Skips | None = None, notes: ReadNotes | None = None) -> Chunk:
    """One batch of an events or lists file's columns (doc_col, token_col[, time_col]) as a normalised
    chunk (read_block's, for each batch it reads): `row` is the file's row of its first row, which the
    errors, skips and notes name; `state` has the unit of the file's numeric times so far, and gets
    this batch's rows and time reading."""
    # Every column is converted whole, before rows are dropped, so that the row numbers in its errors
    # are those of the file.
    n = batch.num_rows
    key = _stripped(_as_strings(_column(batch, opt.doc_col), path, opt.doc_col, row), opt.doc_col, path, row, notes)
    time = None
    if opt.format == "lists":
        token = _as_string_lists(_column(batch, opt.token_col), path, opt.token_col, row)
    else:
        token = normalize(_stripped(_as_strings(_column(batch, opt.token_col), path, opt.token_col, row), opt.token_col,
                                    path, row, notes), opt.urls)
        if opt.time_col:
            time, reading = _time_seconds(_column(batch, opt.time_col), path, opt.time_col, row, opt, state.unit)
            if reading is not None:
                state.readings.append(reading)
                state.unit = reading.unit or state.unit
                if notes is not None:
                    notes.read_time(path, reading)
    usable = _usable_keys(key, path, row, skips)
    if time is not None and notes is not None:
        missing = np.isnan(time)
        if missing.any():
            notes.no_time(path, missing if usable is None else missing & usable.to_numpy(zero_copy_only=False), row)
    if usable is not None:
        key, token = key.filter(usable), token.filter(usable)
        if time is not None:
            time = time[usable.to_numpy(zero_copy_only=False)]
    pad = 0
    if opt.format == "lists":
        key, token, pad = _flatten_lists(key, token, drop_empty=False)
        token = normalize(_stripped(token, opt.token_col, path, row, notes, rows=False), opt.urls)
    state.rows += n
    return Chunk(key, token, time, n, pad)


def _column(batch: pa.RecordBatch | pa.Table, name: str) -> pa.Array:
    """A column of a record batch, or of a table (one array either way)."""
    found = batch.column(name)
    return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found


def _earlier_unit(path: str, earlier: tuple[tuple[int, ...], ...], opt: Options) -> str | None:
    """The unit of a Parquet file's numeric times as the blocks before a block settled it (the first
    batch with a time decides it for the whole file, _epoch_numbers): their time column read in the
    same batches, up to that batch. An error on the way is theirs to report, first."""
    pf, row, unit = pq.ParquetFile(_input(path, random_access=True)), 0, None
    for groups in earlier:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[opt.time_col], row_groups=list(groups)):
            _, reading = _time_seconds(batch.column(0), path, opt.time_col, row, opt, unit)
            if reading is not None and reading.unit is not None:
                return reading.unit
            row += batch.num_rows
    return None


def _usable_keys(key: pa.Array, path: str, row: int, skips: Skips | None) -> pa.Array | None:
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
    text = one_line(e)
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
