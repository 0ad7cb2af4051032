"""Input formats: one file's rows as Arrow batches (Parquet, CSV/TSV, JSON lines, text lines), their key and
token columns as strings.

Changes when a file format is read differently or the handling of its bad rows changes: a missing column,
invalid UTF-8, JSON rows whose ids change type, lists where strings belong. Errors are one-line CorpusErrors
naming the file (and the column and row: rows counted from 0 within their file, a CSV header not a row).
Which files are read is read_files.py's; time columns, read_times.py's; what becomes of the batches,
readers.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from .corpus import CorpusError, one_line
from .ids import id_string
from .read_files import _file_kind, _input, _stream

# Sizes of what one read of an input hands us; a batch of events is transient, so these only bound
# the working memory of passes 1 and 2, not correctness.
PARQUET_BATCH_ROWS = 1 << 18
TEXT_BLOCK_BYTES = 16 << 20
CSV_JSON_BLOCK_BYTES = 16 << 20


def _missing_column(path: str, column: str, names: list[str], hint: str = "") -> CorpusError:
    return CorpusError(f"{path}: column '{column}' not found (columns: {', '.join(names)}){hint}")


def column_names(path: str, delimiter: str | None = None) -> list[str]:
    """An input file's column names, from its schema or its first block, no row read ([] for an empty file
    or one whose kind its name does not say)."""
    kind = _file_kind(path)
    try:
        if kind == "parquet":
            return pq.ParquetFile(_input(path, random_access=True)).schema_arrow.names
        if kind in ("csv", "tsv"):
            return pcsv.open_csv(_input(path), parse_options=_csv_parse(kind, delimiter)).schema.names
        if kind == "json":
            return pjson.open_json(_input(path)).schema.names
    except pa.ArrowInvalid:  # empty: the reading proper says what it finds
        pass
    return []


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


def _csv_parse(kind: str, delimiter: str | None) -> pcsv.ParseOptions:
    """How a CSV or TSV file's fields are split: --delimiter, else a tab for .tsv and ',' for .csv."""
    return pcsv.ParseOptions(delimiter=delimiter or ("\t" if kind == "tsv" else ","))


def _csv_batches(path: str, columns: list[str], kind: str, delimiter: str | None = None) -> Iterator[pa.RecordBatch]:
    read = pcsv.ReadOptions(block_size=CSV_JSON_BLOCK_BYTES)
    parse = _csv_parse(kind, delimiter)
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


UTF8_BOM = b"\xef\xbb\xbf"


def _text_lines(path: str) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """Lines of a text file as string arrays (newline removed), a block at a time, each with the
    positions in it of the lines that are not valid UTF-8 (null in the array). A byte-order mark that
    starts the file (as Windows editors and Excel write UTF-8) is not part of its first word."""
    stream = _stream(path)
    rest = b""
    first = True
    while True:
        block = stream.read(TEXT_BLOCK_BYTES)
        if not block:
            break
        data = rest + block
        if first:
            first = False
            data = data.removeprefix(UTF8_BOM)
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
    if pa.types.is_floating(arr.type):  # NaN is how Spark and pandas write a missing number: a null, not "nan"
        infinite = pc.is_inf(arr).fill_null(False)
        if pc.any(infinite).as_py():
            i = pc.index(infinite, True).as_py()
            raise CorpusError(f"{path}: column '{column}' row {row_base + i} holds {arr[i].as_py()}, which is no id")
        arr = pc.if_else(pc.is_nan(arr).fill_null(False), pa.scalar(None, arr.type), arr)
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
