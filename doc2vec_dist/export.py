"""Export a trained table as (key, vector): Parquet, word2vec text, or npy + keys.

Changes when an export format or how its parts are written changes.

Each checkpoint part (one parameter-server slice) is exported by its own task, and the tasks run in
parallel: a thread pool here, Ray tasks under jobs/export.py (`runner=run_on_ray`). A task streams
its part one record batch at a time (modeldir.ModelDir.batches), so a process holds about one batch per
task and never the table: nothing gathers the table in one place.

    parquet, --out DIR             one part-SSSSS.parquet per checkpoint part, written in parallel
    parquet, --out FILE.parquet    one file, one writer, parts in order (a single file cannot be
                                   written in parallel; give a directory for large tables)
    word2vec                       a text piece per part written in parallel, joined behind the header
    npy, --out DIR                 DIR/vectors.npy filled in parallel at each row's id; DIR/keys.parquet
    npy, --out FILE.npy            FILE.npy filled the same way, its keys beside it in FILE.keys.parquet
    projector, --out DIR           TensorBoard's projector: DIR/tensors.tsv, DIR/metadata.tsv (key, host,
                                   count), DIR/projector_config.pbtxt; --sample N: N users at random, or
                                   the N most visited URLs (export_projector)

The Parquet files (and the keys of an npy export) record the model, version and table they came
from (`provenance`), so an index or a neighbour query made from them can be checked against the model.

`--urls LIST` (export_url_vectors) writes instead one Parquet file of the URLs listed, the model's or
not: key, vector, source (own, or path, host, domain where it was composed: compose.py), part.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from . import outputs, provenance
from .errors import UserError
from .memwatch import peak_rss_bytes
from .modeldir import ModelDir, vectors_array
from .runners import Runner, run_local, where
from .scoring import unit_rows

log = logging.getLogger(__name__)

FORMATS = ("parquet", "word2vec", "npy", "projector")
PROJECTOR_POINTS = 100_000  # about what TensorBoard's projector shows smoothly; more is exported, with a warning



def part_chunks(model: str, version: int, table: str, part: int, normalize: bool, dtype: str,
                keys: pa.Array | None = None) -> Iterator[tuple[np.ndarray, pa.Array, np.ndarray]]:
    """(ids, keys, vectors) of one part of the model's `version`, batch by batch, in the exported dtype."""
    found = ModelDir(model, version=version)
    keys = found.keys(table) if keys is None else keys
    for ids, vectors in found.batches(table, part):
        if normalize:
            vectors = unit_rows(vectors)
        yield ids, keys.take(pa.array(ids)).cast(pa.string()), vectors.astype(dtype, copy=False)


# ---------------------------------------------------------------------------------------------------
# one part → one piece of output (runs in a thread or a Ray task)
# ---------------------------------------------------------------------------------------------------

def export_part(model: str, version: int, table: str, part: int, format: str, piece: str, normalize: bool = False,
                dtype: str = "float32", source: dict | None = None, keys: pa.Array | None = None,
                on_rows: Callable[[int], object] | None = None) -> dict:
    """Write part `part` of `table` (of the model's `version`) to `piece` (its Parquet file, its word2vec text, or the shared
    vectors.npy); returns the rows written and where it ran. `source` (provenance.of_model) is recorded in a
    Parquet piece."""
    chunks = part_chunks(model, version, table, part, normalize, dtype, keys)
    if format == "parquet":
        rows = write_parquet(piece, chunks, on_rows, source)
    else:
        rows = {"word2vec": write_word2vec_lines, "npy": write_npy_rows}[format](piece, chunks, on_rows)
    return {"part": part, "rows": rows, **where()}


def write_parquet(path: str, chunks, on_rows=None, source: dict | None = None) -> int:
    """A Parquet file of key, vector; one row group per record batch of the checkpoint (~65k rows)."""
    rows, writer = 0, None
    try:
        for _, keys, vectors in chunks:
            table = provenance.key_vector_table(keys, vectors, source)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, **outputs.PARQUET_OPTIONS)
            writer.write_table(table)
            rows += len(keys)
            if on_rows:
                on_rows(len(keys))
    finally:
        if writer is not None:
            writer.close()
    return rows


def word2vec_lines(ids: np.ndarray, keys: pa.Array, vectors: np.ndarray) -> pa.Buffer:
    """'key v1 … vd\\n' for every row, as one buffer, built by Arrow's compute kernels (no Python loop).

    Floats are printed with the shortest text that reads back as the same float32, so the text
    format loses nothing.
    """
    bad = pc.or_(pc.match_substring_regex(keys, r"\s"), pc.equal(pc.utf8_length(keys), 0))
    if pc.any(bad).as_py():
        row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        raise UserError(f"word2vec format cannot hold key {keys[row].as_py()!r} (row id {ids[row]}): it is empty "
                        "or contains whitespace; export as parquet instead")
    values = vectors_array(vectors.astype(np.float32, copy=False)).cast(pa.list_(pa.string()))
    lines = pc.binary_join_element_wise(keys, pc.binary_join(values, " "), " ")
    everything = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    return pc.binary_join(everything, "\n")[0].as_buffer()


def write_word2vec_lines(path: str, chunks, on_rows=None) -> int:
    rows = 0
    with open(path, "wb") as fh:
        for ids, keys, vectors in chunks:
            fh.write(word2vec_lines(ids, keys, vectors))
            fh.write(b"\n")
            rows += len(keys)
            if on_rows:
                on_rows(len(keys))
    return rows


# numpy parses an .npy header with ast.literal_eval, which CPython 3.11 does not make safe for threads
# (gh-106905: "SystemError: AST constructor recursion depth mismatch", seen in a CI run): the index and
# export read .npy files from threads of their own
_NPY_HEADERS = threading.Lock()


def open_npy(path: str, mode: str = "r") -> np.memmap:
    """np.load(path, mmap_mode=mode), its header parsed by one thread at a time."""
    with _NPY_HEADERS:
        return np.load(path, mmap_mode=mode)


def npy_data_offset(path: str) -> int:
    """Byte offset of the data of an .npy file (after its header), from its preamble: the magic string,
    the format's version, and the header's length (2 bytes in version 1, 4 after)."""
    with open(path, "rb") as fh:
        major, _ = np.lib.format.read_magic(fh)
        size = 2 if major == 1 else 4
        length = int.from_bytes(fh.read(size), "little")
    return np.lib.format.MAGIC_LEN + size + length


def write_npy_rows(path: str, chunks, on_rows=None) -> int:
    """Put each row at its id in the shared vectors.npy, mapping only the span of ids one batch covers.

    A part holds every S-th id, so a batch's rows are spread over S times their size; mapping just
    that window, then unmapping it, keeps memory at about one window per task. A part's ids are in order
    as training writes them, not after forget closes the rows up (each new part filled from the old ones in
    turn): the window spans the batch's least to greatest id, whatever their order.
    """
    offset, rows = npy_data_offset(path), 0
    for ids, _, vectors in chunks:
        lo, hi = int(ids.min()), int(ids.max()) + 1
        window = np.memmap(path, dtype=vectors.dtype, mode="r+", shape=(hi - lo, vectors.shape[1]),
                           offset=offset + lo * vectors.shape[1] * vectors.itemsize)
        window[ids - lo] = vectors
        window.flush()
        del window
        rows += len(ids)
        if on_rows:
            on_rows(len(ids))
    return rows


# ---------------------------------------------------------------------------------------------------
# the export
# ---------------------------------------------------------------------------------------------------

def export(model: str, table: str, out: str, format: str = "parquet", progress: bool = True,
           normalize: bool = False, dtype: str = "float32", runner: Runner | None = None, sample: int | None = None,
           seed: int | None = None) -> dict:
    """Write `table` of the model's LATEST checkpoint to `out`; returns rows, seconds, rows/s, peak memory.

    parquet: `out` ending in .parquet is one file (a row group per batch); otherwise a directory with
    one part file per checkpoint part. word2vec: gensim's text format. npy: `out`/vectors.npy (row i ↔
    keys.parquet row i, i = row id), or, for `out` ending in .npy, that one file with its keys beside
    it (users.npy: users.keys.parquet, outputs.npy_keys_path). normalize scales every vector to unit length (cosine = dot
    product downstream); dtype float16 halves the size. `runner` runs the per-part tasks (default:
    threads in this process; jobs/export.py passes run_on_ray). projector: export_projector, of `sample` rows
    (None: every row); `sample` is refused for the other formats, and `seed` (it draws a user table's sample)
    without a sample of users.
    """
    if seed is not None and (sample is None or table != "docs"):
        draws = ("a URL table's sample is its most visited URLs, drawn by no seed" if sample is not None
                 else "without --sample every row is exported")
        raise UserError(f"--seed {seed}: it draws the users of --sample; {draws}; drop --seed")
    if format == "projector":
        if dtype != "float32":
            raise UserError(f"--dtype {dtype}: --format projector writes its vectors as text (tensors.tsv), at "
                            "float32; drop --dtype")
        return export_projector(model, table, out, sample=sample, seed=seed or 0, normalize=normalize, progress=progress)
    if sample is not None:
        raise UserError(f"--sample {sample}: only --format projector exports a sample; the other formats export "
                        "every row")
    if dtype not in ("float32", "float16"):
        raise UserError(f"unknown export dtype {dtype!r} (choose from float32, float16)")
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r} (choose from {', '.join(FORMATS)})")
    outputs.check_writable(out)
    t0 = time.perf_counter()
    shown = model
    found = ModelDir.served(model)  # a remote model (s3://…) is exported from a verified local copy
    model, version, spec = found.path, found.version, found.spec(table)
    keys = found.keys(table)
    if len(keys) != spec["rows"]:
        raise UserError(f"{model}: {len(keys)} keys but table {table} has {spec['rows']} rows")
    kind = output_kind(out, format)
    source = provenance.of_model(found, table, None if found.path == shown else shown)
    keys_path = outputs.npy_keys_path(out) if kind == "npy" else None
    marker_path = outputs.word2vec_marker_path(out) if kind == "word2vec" else None
    with contextlib.ExitStack() as stack:
        # an earlier export of ours is replaced; anything else refused. An npy file and its keys are
        # judged together, and moved into place the matrix first (its keys file says it is ours).
        keys_staged = stack.enter_context(outputs.replacing(keys_path, "npy-keys")) if keys_path else None
        # a word2vec text file likewise, with the marker that says it is ours beside it
        marker_staged = stack.enter_context(outputs.replacing(marker_path, "word2vec-marker")) if marker_path else None
        staged = stack.enter_context(outputs.replacing(out, kind))
        if staged.replaces:
            log.info(f"replacing the earlier export at {out}")
        tmp, pieces = staged.path, f"{staged.path}.pieces"
        bar = tqdm(total=spec["rows"], unit="row", unit_scale=True, desc=f"export {table}", disable=not progress,
                   file=sys.stderr)
        try:
            if format == "parquet" and out.endswith(".parquet"):
                chunks = itertools.chain.from_iterable(part_chunks(model, version, table, p, normalize, dtype, keys)
                                                       for p in range(len(spec["parts"])))
                write_parquet(tmp, chunks, bar.update, source)
                tasks = [{"part": p, "rows": part["rows"], **where()} for p, part in enumerate(spec["parts"])]
                ran = "process"  # a single .parquet file has one writer: this process
            else:
                targets = _start_output(format, tmp, pieces, keys, spec, dtype, source,
                                        keys_staged.path if keys_staged else None)
                tasks = _run_parts(model, version, table, format, targets, normalize, dtype, source, keys, runner, bar)
                ran = "process" if runner is None else "tasks"  # threads of this process, or Ray tasks
                if format == "word2vec":
                    _join_text(tmp, f"{spec['rows']} {spec['dim']}\n", targets)
                    with open(marker_staged.path, "w") as fh:
                        json.dump({outputs.JSON_KEY: "word2vec-marker", "file": os.path.basename(out),
                                   "source": source}, fh)
        finally:
            outputs.remove_path(pieces)
            bar.close()
    seconds = time.perf_counter() - t0
    return {"table": table, "rows": spec["rows"], "dim": spec["dim"], "path": out, "keys_path": keys_path,
            "format": format, "dtype": dtype,
            "normalized": normalize, "parts": len(spec["parts"]), "tasks": tasks,
            "ran": ran,  # where the parts were written
            "seconds": round(seconds, 3), "rows_per_second": spec["rows"] / seconds if seconds else 0.0,
            "peak_rss_bytes": peak_rss_bytes()}


def read_url_list(path: str) -> list[str]:
    """The URLs of a list: a Parquet or CSV file's `url` column (else its `key` column), or any other
    file's lines (blank ones skipped). A list without any is refused: an empty output would hide it."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    urls = _url_list(path)
    if not urls:
        raise UserError(f"{path}: no URLs in it; give one URL a line, or a Parquet or CSV file with a url column")
    return urls


def _url_list(path: str) -> list[str]:
    import pyarrow.csv as pacsv

    try:
        if path.endswith((".parquet", ".csv")):
            names = pq.read_schema(path).names if path.endswith(".parquet") else \
                pacsv.open_csv(path).schema.names
            column = next((c for c in ("url", "key") if c in names), None)
            if column is None:
                raise UserError(f"{path}: no 'url' or 'key' column (it has: {', '.join(names)})")
            table = pq.read_table(path, columns=[column]) if path.endswith(".parquet") else \
                pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=[column]))
            values = table.column(column).combine_chunks().cast(pa.string())
            return [v for v in values.to_pylist() if v]
        with open(path, encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip()]
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read its URLs ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                        ) from None


def export_url_vectors(model: str, urls: list[str], out: str, table: str = "words_out") -> dict:
    """Write a vector for every URL of `urls`, the model's or not, to the Parquet file `out`: the columns
    of Model.url_vectors (key, vector, source, part), one row per distinct URL by the model's rule, in
    the order given. A URL the model never saw gets a vector composed from its path, host or domain
    (compose.py); one of a site it never saw, a null vector, and a warning names such URLs. The file
    records the model (provenance), so `index --vectors` builds an index of it. Returns rows, by source."""
    from .compose import no_vector_line
    from .model import Model

    outputs.check_writable(out)
    t0 = time.perf_counter()
    found = Model(model)
    vectors = found.url_vectors(urls, table)
    keys = vectors.column("key").combine_chunks()
    first = pc.index_in(pc.unique(keys), value_set=keys)  # each distinct URL where it first comes
    vectors = vectors.take(first)
    with outputs.replacing(out, "vectors") as staged:
        pq.write_table(vectors, staged.path, **outputs.PARQUET_OPTIONS)
    source = vectors.column("source").to_pylist()
    missing = [key for key, came in zip(vectors.column("key").to_pylist(), source) if came is None]
    if missing:
        log.warning("warning: " + no_vector_line(missing, len(missing)))
    return {"path": out, "table": table, "rows": len(source), "own": source.count("own"),
            "composed": {name: source.count(name) for name in ("path", "host", "domain") if name in source},
            "without": len(missing), "seconds": round(time.perf_counter() - t0, 3)}


def _start_output(format: str, tmp: str, pieces: str, keys: pa.Array, spec: dict, dtype: str, source: dict,
                  keys_file: str | None = None) -> list[str]:
    """Create the output's skeleton; returns the path each part task writes to. npy: `tmp` is the
    matrix file itself when `keys_file` (its keys' file) is given, else the directory of both."""
    parts = range(len(spec["parts"]))
    if format == "parquet":  # `tmp` is a directory, made by outputs.replacing
        return [os.path.join(tmp, f"part-{p:05d}.parquet") for p in parts]
    if format == "word2vec":
        os.makedirs(pieces)
        return [os.path.join(pieces, f"part-{p:05d}.txt") for p in parts]
    vectors = tmp if keys_file else os.path.join(tmp, "vectors.npy")
    # the header and a file of the full size; part tasks fill their rows in place
    np.lib.format.open_memmap(vectors, mode="w+", dtype=dtype, shape=(spec["rows"], spec["dim"])).flush()
    # the key file is in row-id order already, which is the order of vectors.npy; beside a lone
    # matrix file it carries the marker that makes the pair recognisable as ours
    marker = outputs.parquet_metadata("npy-keys") if keys_file else {}
    pq.write_table(pa.table({"key": keys.cast(pa.string())}, metadata={**marker, **provenance.parquet_metadata(source)}),
                   keys_file or os.path.join(tmp, "keys.parquet"))
    return [vectors for _ in parts]


def _run_parts(model, version, table, format, targets, normalize, dtype, source, keys, runner, bar) -> list[dict]:
    """One task per part. Threads share this process's key array and update the bar batch by batch;
    Ray tasks load the keys themselves and the bar moves as each part finishes."""
    if runner is None:
        calls = [(model, version, table, p, format, target, normalize, dtype, source, keys, bar.update)
                 for p, target in enumerate(targets)]
        return sorted((r for _, r in run_local(export_part, calls)), key=lambda r: r["part"])
    calls = [(model, version, table, p, format, target, normalize, dtype, source)
             for p, target in enumerate(targets)]
    done = []
    for _, result in runner(export_part, calls):
        bar.update(result["rows"])
        done.append(result)
    return sorted(done, key=lambda r: r["part"])


def _join_text(path: str, header: str, pieces: list[str]) -> None:
    with open(path, "wb") as out:
        out.write(header.encode())
        for piece in pieces:
            with open(piece, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)


def output_kind(out: str, format: str) -> str:
    """The kind of output `export` writes at `out` in `format` (outputs.DIR_KINDS or FILE_KINDS): a
    file where the path's ending names the format (.parquet, .npy), else a directory."""
    if format == "word2vec":
        return "word2vec"
    ending = os.path.splitext(out.rstrip("/"))[1]
    if ending in (".npy", ".parquet") and ending != f".{format}":
        raise UserError(f"{out}: ends in {ending}, but --format is {format}; give --format {ending[1:]}, or a "
                        f"path ending in .{format} (one file) or a directory")
    if format == "npy" and out.endswith(".npy"):
        return "npy"
    return "vectors" if format == "parquet" and out.endswith(".parquet") else "export"


# ---------------------------------------------------------------------------------------------------
# TensorBoard's projector
# ---------------------------------------------------------------------------------------------------

def export_projector(model: str, table: str, out: str, sample: int | None = None, seed: int = 0,
                     normalize: bool = False, progress: bool = True) -> dict:
    """The directory `out` for TensorBoard's projector (`tensorboard --logdir OUT`, or the standalone projector's
    Load): tensors.tsv (a row of tab-separated floats per point, written as the shortest text that reads back
    as the same float32), metadata.tsv (a header, then key, host, count per point: for a user its most
    visited host and its events in training; for a URL its host and count) and projector_config.pbtxt naming
    them. `sample`: users drawn at random (seed), or the most visited URLs, rather than every row; a user
    table's sample reads a few record batches of the corpus (corpus.sample_documents), never the table."""
    from .corpus import Corpus, sample_documents
    from .model import Model
    from .urls import hosts

    if sample is not None and sample < 1:
        raise UserError(f"--sample {sample}: give at least 1 row")
    t0 = time.perf_counter()
    found = ModelDir.served(model)
    spec = found.spec(table)
    rows = spec["rows"] if sample is None else min(sample, spec["rows"])
    if rows > PROJECTOR_POINTS:
        log.warning(f"warning: {rows:,} points: TensorBoard's projector is smooth up to about {PROJECTOR_POINTS:,}; "
                    "--sample N exports N of them")
    tokens = found.vocab().column("token").combine_chunks()
    corpus = None
    if table == "docs":
        with contextlib.suppress(UserError):
            corpus = Corpus(found.corpus_path())
    with outputs.replacing(out, "projector") as staged:
        lines = 0
        with open(os.path.join(staged.path, "tensors.tsv"), "wb") as tensors, \
                open(os.path.join(staged.path, "metadata.tsv"), "wb") as metadata:
            metadata.write(b"key\thost\tcount\n")
            for ids, vectors, visited in _projector_rows(found, table, sample, seed, corpus, Model, sample_documents):
                keys = found.keys(table).take(pa.array(ids)).cast(pa.string()) if table == "docs" else tokens.take(
                    pa.array(ids)).cast(pa.string())
                bad = pc.match_substring_regex(keys, r"[\t\n\r]")
                if pc.any(bad).as_py():
                    row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
                    raise UserError(f"projector format cannot hold key {keys[row].as_py()!r} (row id {ids[row]}): it "
                                    "holds a tab or a line break; export as parquet instead")
                if table == "docs":
                    counts = _doc_lengths(found, ids)
                    host = pa.array(most_visited_hosts(visited, tokens), pa.string())
                else:
                    counts = found.vocab().column("count").combine_chunks().take(pa.array(ids)).to_numpy()
                    host = hosts(keys)
                if normalize:
                    vectors = unit_rows(vectors)
                tensors.write(_tsv_floats(vectors))
                meta = pc.binary_join_element_wise(keys, pc.fill_null(host, ""), pa.array(counts).cast(pa.string()),
                                                   "\t")
                metadata.write(pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(meta)], pa.int32()), meta),
                                              "\n")[0].as_buffer())
                metadata.write(b"\n")
                lines += len(ids)
        with open(os.path.join(staged.path, "projector_config.pbtxt"), "w") as fh:
            fh.write(f'embeddings {{\n  tensor_name: "{table}"\n  tensor_path: "tensors.tsv"\n'
                     f'  metadata_path: "metadata.tsv"\n}}\n')
    seconds = time.perf_counter() - t0
    return {"table": table, "rows": lines, "dim": spec["dim"], "path": out, "keys_path": None, "format": "projector",
            "dtype": "float32", "normalized": normalize, "parts": len(spec["parts"]), "tasks": [], "ran": "process",
            "sampled": sample is not None, "seconds": round(seconds, 3),
            "rows_per_second": lines / seconds if seconds else 0.0, "peak_rss_bytes": peak_rss_bytes()}


def _projector_rows(found: ModelDir, table: str, sample: int | None, seed: int, corpus, Model, sample_documents):
    """(ids, vectors, each row's visited URL ids or None) in batches: every row, part by part; or the sample."""
    if sample is None:
        for part in range(len(found.spec(table)["parts"])):
            for ids, vectors in found.batches(table, part):
                yield ids, vectors, (_visited(corpus, ids) if table == "docs" else None)
        return
    if table == "docs":
        if corpus is not None:
            ids, visited = sample_documents(corpus, sample, seed)
        else:
            total = found.spec(table)["rows"]
            ids = np.sort(np.random.default_rng(seed).choice(total, min(sample, total), replace=False))
            visited = [np.zeros(0, np.int32)] * len(ids)
    else:  # ids are by frequency, but a refresh appends new URLs: take the counts
        counts = found.vocab().column("count").to_numpy()
        ids, visited = np.sort(np.argsort(-counts, kind="stable")[:sample]), None
    ids = np.asarray(ids, np.int64)
    yield ids, Model(found.path).gather(table, ids), visited


def _visited(corpus, ids: np.ndarray) -> list[np.ndarray]:
    """The URL ids each of these users visited, from the corpus (none where there is no corpus)."""
    if corpus is None:
        return [np.zeros(0, np.int32)] * len(ids)
    from .scoring import seen_tokens

    seen = seen_tokens(corpus.path, ids)
    return [seen.get(int(i), np.zeros(0, np.int32)) for i in ids]


def _doc_lengths(found: ModelDir, ids: np.ndarray) -> np.ndarray:
    with pa.memory_map(found.store.path("docs.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
    if "length" not in table.column_names:
        return np.zeros(len(ids), np.int64)
    return table.column("length").take(pa.array(ids)).to_numpy()


def most_visited_hosts(visited: list[np.ndarray], tokens: pa.Array) -> list[str | None]:
    """Each user's most visited host (its URL ids `visited`, ids into `tokens`; ties: the host first in sort
    order), None for a user with no URL that has a host (urls.hosts)."""
    from .urls import hosts

    every = np.concatenate(visited).astype(np.int64) if visited else np.zeros(0, np.int64)
    found: list[str | None] = [None] * len(visited)
    if not len(every):
        return found
    unique, back = np.unique(every, return_inverse=True)
    names, codes = np.unique(np.array(hosts(tokens.take(pa.array(unique))).fill_null("").to_pylist(), dtype=object),
                             return_inverse=True)
    owner = np.repeat(np.arange(len(visited)), [len(v) for v in visited])
    host = codes.reshape(-1)[back.reshape(-1)]
    named = names[host] != ""
    pairs, counts = np.unique(np.stack([owner[named], host[named]]), axis=1, return_counts=True)
    order = np.lexsort((pairs[1], -counts, pairs[0]))  # per user: most visits first, then the host's name
    users, first = np.unique(pairs[0][order], return_index=True)
    for user, at in zip(users.tolist(), first.tolist()):
        found[user] = str(names[pairs[1][order][at]])
    return found


def _tsv_floats(vectors: np.ndarray) -> bytes:
    """One line of tab-separated floats per row, each the shortest text that reads back as the same float32."""
    values = vectors_array(np.ascontiguousarray(vectors, dtype=np.float32)).cast(pa.list_(pa.string()))
    lines = pc.binary_join(values, "\t")
    return pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), "\n")[0].as_buffer() \
        .to_pybytes() + b"\n"
