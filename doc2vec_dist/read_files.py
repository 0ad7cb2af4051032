"""Input paths in, the files to read out: their kinds, their sizes, and the options they are read with.

Changes when what an input may name changes (a file, a directory, a glob, a URI, compressed files), which
files of a folder are passed over as bookkeeping or unread, or an option of reading (Options) changes. How a
file's rows are parsed is read_formats.py's; how its times are read, read_times.py's; the blocks prepare's
tasks read, readers.py's.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from . import storage
from .corpus import CorpusError
from .urls import UrlRule

log = logging.getLogger(__name__)


FORMATS = ("events", "lists", "text")


PARQUET_EXTS = (".parquet", ".pq")
CSV_EXTS = (".csv", ".tsv")
JSON_EXTS = (".jsonl", ".json", ".ndjson")
# Outer compression pyarrow's CSV/JSON readers and input streams undo by themselves.
COMPRESSION_EXTS = (".gz", ".bz2", ".zst", ".lz4", ".br")


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


def input_bytes(files: list[str]) -> int:
    """The input files' size in bytes, as stored (compressed, where they are)."""
    return sum(_size(path) for path in files)
