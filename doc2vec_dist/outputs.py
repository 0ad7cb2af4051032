"""What a command may write over: only an output of its own kind, which it recognises by its marker.

Changes when the rule for what a command may write over changes, or how an output is put in place.

Every directory doc2vec-dist writes (a corpus, a model, an export or npy directory, an index) holds
a small JSON marker, `.doc2vec-dist.json`, naming its kind; every Parquet file it writes carries the
kind in its schema metadata (key `doc2vec_dist`), and a JSON report in a top-level `doc2vec_dist`
field. A command that finds something at its `--out`:

  * nothing, or an empty directory: writes there;
  * an output of its own kind: replaces it (`prepare` and `train` only with `--overwrite`), deleting
    only the entries that kind writes; a file or folder someone added inside is refused, by name;
  * anything else (a folder of the user's, a file another tool wrote, another kind of ours): refuses
    with one line naming what it found, and touches nothing.

Outputs written before markers existed are recognised where that is certain: a model directory by
its LATEST file or checkpoints folder, a corpus by its corpus.json, an export or index directory by
holding nothing but the files that kind writes.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import secrets
import shutil
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq

from . import logs, storage
from .errors import UserError

MARKER = ".doc2vec-dist.json"
PARQUET_KEY = b"doc2vec_dist"
JSON_KEY = "doc2vec_dist"

# How a vectors file (key, vector: what export, infer and forget write) is written. Unique keys and float
# vectors gain nothing from dictionary pages or vector statistics, and computing them halves the write
# speed (docs/benchmarks.md, "Figures behind the code's constants"). Trained float vectors do not
# compress (snappy saved 3% at 1M × 100 for a third more CPU), keys do.
PARQUET_OPTIONS = {"compression": {"key": "snappy", "vector": "none"}, "use_dictionary": False,
                   "write_statistics": ["key"]}


@dataclass(frozen=True)
class Kind:
    """A kind of directory output: what it is called in messages, who makes it, the entries it writes."""

    name: str
    what: str            # "a model", for messages
    made_by: str         # "train or baseline"
    own: tuple[str, ...]  # fnmatch patterns of the entries it writes (the marker is always its own)
    legacy: tuple[str, ...] = ()  # an entry that marks this kind in a directory written before markers
    marked_only: bool = False  # a kind newer than markers: only its marker makes a directory one of ours


DIR_KINDS = {k.name: k for k in (
    # forget.arrow: the users it was told to forget (forgotten.py); dropped.arrow: the base's rows a refresh dropped
    Kind("corpus", "a corpus", "prepare", ("corpus.json", "vocab.arrow", "docs.arrow", "shards", "changed.arrow",
                                            "forget.arrow", "dropped.arrow"), legacy=("corpus.json",)),
    # exports/: jobs/train.py's default place for a model's exports (kept when the model is replaced;
    # each export in it is replaced by its own kind); *.tmp-*: a file being written (checkpoint._write_file);
    # gensim-corpus-*: the baseline's corpus text while gensim trains; WRITER.json: the lock of the run
    # writing it (checkpoint.WRITER_FILE), which replacing the model leaves to that run; training.jsonl: what
    # its runs said as they went (runlog), replaced with the model
    Kind("model", "a model", "train or baseline",
         ("config.json", "LATEST", "checkpoints", "docs.arrow", "vocab.arrow", "eval-*.json", "exports", "*.tmp-*",
          "gensim-corpus-*", "WRITER.json", "forget.arrow", "docs.arrow.forget-pending", "training.jsonl"),
         legacy=("LATEST", "checkpoints")),
    Kind("export", "an export", "export", ("part-*.parquet", "vectors.npy", "keys.parquet")),
    Kind("projector", "a projector export", "export --format projector",
         ("tensors.tsv", "metadata.tsv", "projector_config.pbtxt")),
    Kind("index", "a faiss index", "index", ("index.faiss", "keys.parquet", "params.json", "vectors.npy")),
    # its entries have common names (validation/, compare/): a folder of the user's holding only such
    # names is not taken for a search, only one with the marker
    Kind("tune", "a settings search", "tune", ("validation", "trials", "ray_tune", "compare", "trials.csv",
                                              "best.yaml", "settings.png", "tune.json", "*.tmp-*"), marked_only=True),
    # jobs/refresh.py's DAY_DIR: each step's output inside is of its own kind; the marker keeps a second
    # refresh (and other commands) out of it, since a refresh writes only into a new or empty directory
    Kind("refresh", "a daily refresh", "jobs/refresh.py", ("corpus", "model", "exports", "index", "refresh.json",
                                                          "report.html", "*.tmp-*"), marked_only=True),
    # benchmarks/serving_benchmark.py's --work: its synthetic models, export, indexes and results; the marker is
    # what lets its --clean and its steps delete what they find under these names
    Kind("serving-benchmark", "a serving benchmark's work directory", "benchmarks/serving_benchmark.py",
         ("model", "model-refreshed", "users", "index-*", "results.json", "*.tmp-*", "*.old-*"), marked_only=True),
)}
FILE_KINDS = {"vectors": "a (key, vector) Parquet file", "neighbors": "a neighbours Parquet file",
              "heldout": "a held-out Parquet file", "plan": "a plan JSON file", "word2vec": "a word2vec text file",
              "npy": "an npy matrix with its keys file beside it", "npy-keys": "the keys file of an npy matrix",
              "word2vec-marker": "the marker file of a word2vec text export", "report": "a report page"}
# how a report page (report.py) says it is ours: a meta tag in its first lines
REPORT_MARKER = b'<meta name="generator" content="doc2vec-dist report">'


def npy_keys_path(path: str) -> str:
    """The keys file beside an npy matrix that export wrote as one file: users.npy → users.keys.parquet.
    An .npy file cannot carry a marker; this file's marker (kind npy-keys) says the pair is ours."""
    return path.removesuffix(".npy") + ".keys.parquet"


def word2vec_marker_path(path: str) -> str:
    """The marker beside a word2vec text file that export wrote: users.txt → users.txt.doc2vec-dist.json. Its
    format has no room for one, and its 'rows dim' header is every such file's (gensim's, fastText's .vec)."""
    return path + MARKER


def owned(kind: str, name: str) -> bool:
    """Whether an entry called `name` is one that an output of `kind` writes in its directory."""
    return name == MARKER or any(fnmatch.fnmatch(name, p) for p in DIR_KINDS[kind].own)


def _describe_entries(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def marker_text(kind: str) -> str:
    return json.dumps({"kind": kind, "tool": "doc2vec-dist",
                       "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}) + "\n"


def read_marker_kind(text: bytes | str | None) -> str | None:
    """The kind a marker's text names, or None when it is missing or not one of ours."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data.get("kind") if isinstance(data, dict) and data.get("tool") == "doc2vec-dist" else None


def judge_dir(shown: str, kind: str, names: list[str], marker: str | None, overwrite: bool | None,
              flag: str = "--overwrite") -> bool:
    """Whether a directory holding `names` (its entries) may become an output of `kind`.

    False: it is empty, write into it. True: it is an output of `kind`, to be replaced (its own
    entries only). Otherwise a UserError naming what was found. overwrite None: replacing one's own
    kind needs no flag (export, index); False: it needs `flag`.
    """
    k = DIR_KINDS[kind]
    if not names:
        return False
    if marker is not None and marker != kind:
        other = DIR_KINDS.get(marker)
        found = f"{other.what} (made by doc2vec-dist {other.made_by})" if other else f"a doc2vec-dist {marker}"
        raise UserError(f"{shown}: holds {found}, not {k.what}; choose another --out")
    entries = [n for n in names if n != MARKER]
    foreign = [n for n in entries if not owned(kind, n)]
    ours = marker == kind or (not k.marked_only and (any(n in k.legacy for n in entries) if k.legacy
                                                     else not foreign))
    if not ours:
        raise UserError(f"{shown}: exists and is not {k.what} made by doc2vec-dist (it holds "
                        f"{_describe_entries(entries)}); {k.made_by} writes only into a new or empty directory "
                        "or over its own output: choose another --out")
    if foreign:
        raise UserError(f"{shown}: holds {k.what}, and also {_describe_entries(foreign)}, which doc2vec-dist did "
                        "not write; move them out or choose another --out")
    if overwrite is False:
        raise UserError(f"{shown}: already holds {k.what}; pass {flag} to replace it, or choose another --out")
    return True


def check_dir(path: str, kind: str, overwrite: bool | None, flag: str = "--overwrite") -> bool:
    """judge_dir for a local path: False when `path` is absent or an empty directory, True when it
    holds an output of `kind` that may be replaced; a UserError otherwise (a file, someone's folder)."""
    if not os.path.lexists(path):
        return False
    if not os.path.isdir(path) or os.path.islink(path):
        raise UserError(f"{path}: exists and is a file; --out takes a directory for {DIR_KINDS[kind].what}")
    names = os.listdir(path)
    marker = None
    if MARKER in names:
        with open(os.path.join(path, MARKER), "rb") as fh:
            marker = read_marker_kind(fh.read(4096)) or "unknown"
    return judge_dir(path, kind, names, marker, overwrite, flag)


def commit_dir(tmp: str, path: str, kind: str, overwrite: bool | None) -> None:
    """Move a finished output directory `tmp` (beside `path`, same file system) into place with its
    marker, after checking again what is at `path` (check_dir): nothing or an empty folder, or an
    earlier output of `kind`, which is swapped out and only then deleted, so a failure at any point
    leaves either the old output or the new one."""
    write_marker(tmp, kind)
    if not check_dir(path, kind, overwrite):
        if os.path.isdir(path):
            os.rmdir(path)  # empty (checked); rename cannot replace it portably
        os.replace(tmp, path)
        return
    old = _unused_name(path, "old")  # a name nobody holds: the rename must not land on someone's folder
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    shutil.rmtree(old)  # our own output's entries only: check_dir refused anything else


def write_marker(directory: str, kind: str) -> None:
    with open(os.path.join(directory, MARKER), "w") as fh:
        fh.write(marker_text(kind))


# -- single files ------------------------------------------------------------------------------------

def parquet_metadata(kind: str) -> dict[bytes, bytes]:
    """Schema metadata that marks a Parquet file as `kind` (readers that do not know it ignore it)."""
    return {PARQUET_KEY: kind.encode()}


def file_kind(path: str) -> str | None:
    """The kind of a file doc2vec-dist wrote, from its marker; None for anything else."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if head[:4] == b"PAR1":
        try:
            value = (pq.read_schema(path).metadata or {}).get(PARQUET_KEY)
        except (OSError, ValueError):
            return None
        return value.decode(errors="replace") if value else None
    if head.lstrip()[:1] == b"{":
        try:
            with open(path, "rb") as fh:
                data = json.loads(fh.read(64 << 20))  # a report, not data: anything bigger is not ours
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        return data.get(JSON_KEY) if isinstance(data, dict) else None
    if head.lstrip()[:15].lower() == b"<!doctype html>":
        return "report" if REPORT_MARKER in head[:4096] else None
    if head[:6] == b"\x93NUMPY":  # ours only beside the keys file export writes with it
        keys = npy_keys_path(path)
        return "npy" if path.endswith(".npy") and os.path.isfile(keys) and file_kind(keys) == "npy-keys" else None
    first = head.split(b"\n", 1)[0].split()
    if len(first) == 2 and all(x.isdigit() for x in first):  # gensim's 'rows dim': ours only beside its marker
        marker = word2vec_marker_path(path)
        return "word2vec" if os.path.isfile(marker) and file_kind(marker) == "word2vec-marker" else None
    return None


def check_file(path: str, kind: str, overwrite: bool | None = None, flag: str = "--overwrite") -> bool:
    """Whether a file output of `kind` may be written at `path`: False when nothing is there, True
    when it replaces a file of the same kind; a UserError naming what is there otherwise."""
    if not os.path.lexists(path):
        return False
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; this output is a file: give a file path")
    found = file_kind(path)
    if found != kind:
        what = FILE_KINDS.get(found, f"a doc2vec-dist {found}") if found else "not a file doc2vec-dist wrote"
        raise UserError(f"{path}: exists and is {what} (no doc2vec-dist marker for {FILE_KINDS[kind]}); "
                        "it is not replaced: remove it or choose another --out")
    if overwrite is False:
        raise UserError(f"{path}: already exists; pass {flag} to replace it, or choose another path")
    return True


def write_parquet_file(table: pa.Table, path: str, kind: str) -> None:
    """Write a table as one Parquet file marked as `kind`, replacing only an earlier file of that kind;
    a reader never sees half of it (`replacing`)."""
    with replacing(path, kind) as staged:
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **parquet_metadata(kind)}),
                       staged.path)


# -- writing an output whole or not at all -----------------------------------------------------------

def check_replaceable(out: str, kind: str, overwrite: bool | None = None) -> bool:
    """Whether `out` may receive an output of `kind` (a DIR_KINDS or FILE_KINDS name): False when
    nothing is there (or an empty directory), True when it replaces an earlier output of the same
    kind; anything else is refused with one line naming it. overwrite None: replacing one's own kind
    needs no flag (export, index); False: it is refused without --overwrite (prepare, train)."""
    if kind in DIR_KINDS:
        return check_dir(out, kind, overwrite)
    return check_file(out, kind, overwrite)


def replace_output(tmp: str, out: str, kind: str, overwrite: bool | None = None) -> None:
    """Move a finished output into place, replacing an earlier output of the same kind, after
    checking again that this is what is there."""
    if kind in DIR_KINDS:
        commit_dir(tmp, out, kind, overwrite)
        return
    check_replaceable(out, kind, overwrite)
    os.replace(tmp, out)


def remove_path(path: str) -> None:
    """Remove a file or a directory tree that this process wrote (a link is removed, not followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@dataclass(frozen=True)
class Staged:
    path: str        # where to write the output: a file path, or a directory to fill (directory kinds)
    replaces: bool   # whether it replaces an earlier output of the same kind at `out`


@contextlib.contextmanager
def replacing(out: str, kind: str, overwrite: bool | None = None) -> Iterator[Staged]:
    """Write an output of `kind` at `out` whole or not at all.

    What is at `out` is judged first (nothing, or an earlier output of `kind`; anything else is
    refused by name and left as it was). The body writes to `Staged.path`, a new name beside `out`
    that this process created (a directory for directory kinds, an empty file otherwise: temp_path),
    in `out`'s directory, made if missing; when it ends, the output is moved into place after
    judging `out` again. If the body fails, what it wrote is removed, with the directories made for
    it, and `out` is untouched. `overwrite` as in check_replaceable.
    """
    replaces = check_replaceable(out, kind, overwrite)
    made: list[str] = []
    done = False
    try:
        try:
            made = make_dirs(os.path.dirname(os.path.abspath(out)))
            tmp = temp_path(out, directory=kind in DIR_KINDS)
        except OSError as exc:
            raise cannot_write(out, exc) from None
        try:
            yield Staged(tmp, replaces)
            logs.raise_if_interrupted()  # a Ctrl-C came, even if something swallowed it: nothing is committed
            replace_output(tmp, out, kind, overwrite)
            done = True
        finally:
            remove_path(tmp)  # what this process made under its own new name, never a name found there
    finally:
        if not done:
            remove_dirs(made)  # the parents it created for `out`, if still empty


def temp_path(path: str, directory: bool = False, what: str = "tmp") -> str:
    """Create, beside `path` (so a rename moves it into place), a new empty file or directory named
    `PATH.tmp-PID-RANDOM`, and return its name.

    It is created exclusively (O_EXCL, mkdir), so the name is this process's alone even where
    process ids repeat (the nodes and pods of a cluster sharing one storage): nothing found under
    such a name is ever deleted or written over, as it may be another process's output in the
    making. Permissions follow the umask, as the final output's would.
    """
    base = path.rstrip("/") or path
    while True:
        name = f"{base}.{what}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            if directory:
                os.mkdir(name)
            else:
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return name
        except FileExistsError:
            continue  # held by someone else: draw another
        except KeyboardInterrupt:
            # a Ctrl-C is raised as the call that made it returns, before the caller knows its name: what
            # is found under this name now is this process's (drawn just now, made exclusively, no other
            # error raised), and goes with the interrupt
            with contextlib.suppress(OSError):
                os.rmdir(name) if directory else os.remove(name)
            raise


def _unused_name(path: str, what: str) -> str:
    """A name beside `path` that nothing holds now, to rename `path` to (`PATH.WHAT-PID-RANDOM`)."""
    base = path.rstrip("/") or path
    while True:
        name = f"{base}.{what}-{os.getpid()}-{secrets.token_hex(4)}"
        if not os.path.lexists(name):
            return name


# -- can we write there at all ------------------------------------------------------------------------

def cannot_write(path: str, exc: OSError) -> UserError:
    """The one line for a write that the storage refused: `cannot write to PATH: read-only file system`."""
    return UserError(f"cannot write to {path}: {storage.reason(exc)}")


def check_writable(path: str | None, *, inside: bool = False) -> None:
    """Refuse, before any work, an output location this process cannot write to: one line naming it.

    `path` is an output a command will write (None: none). What is probed is the directory where
    its first new entry will be made: the nearest one that exists on the way to `path` (where it, or
    its missing parents, will be created beside whatever is there: `replacing`), or, with `inside`,
    `path` itself when it is an existing directory that the command writes into (a model, a
    search, a scratch directory). A probe creates a new empty file under a name of its own and
    removes it: that meets exactly what the real writes will meet, a read-only mount, missing
    permissions, ACLs, or a root user who ignores permission bits alike. A location on an object
    store (s3://, gs://) is not probed (a write there is an upload, billed and perhaps versioned);
    its first write names the same error.
    """
    if path is None:
        return
    shown = local = os.fspath(path)
    if storage.is_uri(local):
        if not local.lower().startswith("file://"):
            return  # not even opened: that may resolve a bucket's region over the network
        local = urllib.parse.urlparse(local).path
    local = os.path.abspath(local)
    if inside and os.path.isdir(local):
        directory = local
    else:
        directory = os.path.dirname(local)
        while not os.path.exists(directory) and os.path.dirname(directory) != directory:
            directory = os.path.dirname(directory)
    _probe(directory, shown)


def _probe(directory: str, shown: str) -> None:
    probe = None
    try:
        probe = temp_path(os.path.join(directory, ".doc2vec-dist-probe"))
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:  # a file on the way: the command's own check names it better
            return
        raise cannot_write(shown, exc) from None
    finally:  # a Ctrl-C as it returns too: the probe is never left behind
        if probe is not None:
            try:
                os.remove(probe)
            except OSError:
                pass


def make_dirs(directory: str) -> list[str]:
    """os.makedirs, returning the directories it created, outermost first (to remove on failure)."""
    missing = []
    directory = os.path.abspath(directory or ".")
    while not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    missing.reverse()
    try:
        for d in missing:
            os.makedirs(d, exist_ok=True)
    except KeyboardInterrupt:  # before the caller has the list: those made so far go, if still empty
        remove_dirs(missing)
        raise
    return missing


def remove_dirs(made: list[str]) -> None:
    """Remove directories make_dirs created, innermost first, each only if still empty."""
    for directory in reversed(made):
        try:
            os.rmdir(directory)  # only if still empty: never what someone else put there
        except OSError:
            pass
