"""Files on any storage pyarrow.fs opens: where a location is, the atomic write, hashing, local copies.

Changes when how we talk to storage changes (a new store, a new way to write a file safely); what
the files of a model directory are and mean belongs to `modeldir` and `checkpoint`.

A location is a local path or a URI that pyarrow.fs opens: s3://bucket/prefix, gs://…, hdfs://…,
file://…. An S3 endpoint other than AWS comes from the URI's query
(s3://b/m?endpoint_override=host:port&scheme=http) or from the standard variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION). Every read, write, listing
and delete under a location goes through one pyarrow FileSystem (`resolve`); tests pass their own
with `fs=`.

How a reader never sees half a file, whatever the storage (`Store.write_file`):
  * Local disks and HDFS have an atomic rename: a file is written under a temporary name and
    renamed into place (on a local disk after an fsync of the file, and the directory is synced
    after the rename, so a machine crash cannot leave a name whose bytes were lost).
  * Object stores (S3, GCS, Azure) have no rename, but a PUT is atomic: the object appears whole or
    not at all (a multipart upload only appears when it is completed), so a file is written under
    its final name.
Checksums are computed on the bytes as they are written (`HashingSink`): no second read from S3.
Local files that are not on a pyarrow store (a JSON file, a cache entry) are written whole with
`write_local`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import posixpath
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .errors import UserError

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_OBJECT_STORES = {"s3", "gcs", "abfs"}  # pyarrow FileSystem.type_name of stores without an atomic rename
MAX_JSON_BYTES = 64 << 20  # our JSON files list parts, not rows: anything this big is not one of ours
_COPY_BLOCK = 8 << 20
_UPLOAD_WINDOW = 64 << 20  # bytes an object-store upload may have in flight (see HashingSink)


class CheckpointWriteError(UserError):
    """Writing a file of a model directory failed (a full disk, a read-only mount, a lost connection).

    Nothing committed before is touched (a file appears whole or not at all); what became of the
    model is for the caller to say, who knows whether it had a committed version. `path`: the file,
    as messages show it; `errno`: the OSError's, when it had one (ENOSPC: the disk is full).
    """

    def __init__(self, message: str, errno: int | None = None, path: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.path = path

    def __reduce__(self):  # raised in a parameter server, it crosses to the driver pickled
        return type(self), (str(self), self.errno, self.path)


def reason(exc: OSError) -> str:
    """An OSError's cause in the words of its errno, lower case ("read-only file system", "permission
    denied", "no space left on device"); its own text when it has no errno (a lost connection)."""
    code = getattr(exc, "errno", None)
    text = os.strerror(code) if code else (str(exc).strip() or type(exc).__name__)
    return text[:1].lower() + text[1:]


# ---------------------------------------------------------------------------------------------------
# locations
# ---------------------------------------------------------------------------------------------------

def is_uri(path: str) -> bool:
    return bool(_URI_RE.match(path))


def location(out: str) -> str:
    """The form of a location to hand to other processes: an absolute local path, or the URI unchanged."""
    return out if is_uri(out) else os.path.abspath(out)


def strip_query(uri: str) -> str:
    """A URI without its query string, which may hold credentials: the form error messages show."""
    return uri.split("?", 1)[0]


def join(base: str, *rel: str) -> str:
    """`base`/rel…, keeping a URI's query string at the end where it belongs."""
    if is_uri(base):
        head, sep, query = base.partition("?")
        return "/".join([head.rstrip("/"), *rel]) + sep + query
    return os.path.join(base, *rel)


@functools.lru_cache(maxsize=16)
def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    # cached: an S3 client is costly to build, and every call resolves the location again
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        detail = str(exc).replace(uri, strip_query(uri))  # the query may hold a secret key
        raise UserError(f"{strip_query(uri)}: cannot open this storage location ({detail})") from None


def resolve(path: str, fs: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of a location.

    With `fs`, `path` is a path inside that filesystem, taken as it is. Otherwise a URI is opened
    with pyarrow's FileSystem.from_uri (its query string configures it), and a plain path is an
    absolute path on the LocalFileSystem.
    """
    if fs is not None:
        return fs, path.rstrip("/") or "/"
    if is_uri(path):
        found, inside = _from_uri(path)
        return found, inside.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(path)


def check_rel(rel: str, what: str = "path") -> str:
    """A relative path that stays inside the directory: no absolute path, '..', or scheme."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or "\\" in rel or is_uri(rel) or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts)):
        raise UserError(f"{what} {rel!r} escapes the model directory (a plain relative path is required)")
    return rel


# ---------------------------------------------------------------------------------------------------
# a directory on one filesystem
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Store:
    """A directory: where its files live, how to write them safely, and how to name them in errors."""

    fs: pafs.FileSystem
    root: str
    name: str            # how messages name the directory: the path as given, or the URI without its query
    uri: bool
    atomic_rename: bool  # local disks, HDFS: temp name + rename; object stores: one PUT per file
    local: bool          # files can be memory-mapped in place

    @classmethod
    def of(cls, path: str, fs: pafs.FileSystem | None = None) -> Store:
        found, root = resolve(path, fs)
        kind = found.type_name
        if kind == "subtree":
            kind = found.base_fs.type_name
        uri = fs is None and is_uri(path)
        return cls(found, root, strip_query(path) if uri else path, uri,
                   atomic_rename=kind not in _OBJECT_STORES, local=isinstance(found, pafs.LocalFileSystem))

    def path(self, rel: str = "") -> str:
        return posixpath.join(self.root, rel) if rel else self.root

    def show(self, rel: str = "") -> str:
        if not rel:
            return self.name
        return f"{self.name.rstrip('/')}/{rel}" if self.uri else os.path.join(self.name, rel)

    def info(self, rel: str) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(self.path(rel))
        except OSError as exc:  # unreachable endpoint, refused credentials, …
            raise UserError(f"{self.show(rel)}: cannot reach it ({exc})") from None

    def is_file(self, rel: str) -> bool:
        return self.info(rel).type == pafs.FileType.File

    def list(self, rel: str, recursive: bool = False) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=recursive)
        try:
            return self.fs.get_file_info(selector)
        except OSError as exc:
            raise UserError(f"{self.show(rel)}: cannot list it ({exc})") from None

    def delete_dir(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.path(rel))

    def delete_file(self, path: str) -> None:
        """Delete a file by its full path in the filesystem, if it is there."""
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    def write_file(self, rel: str, produce: Callable[[HashingSink], None]) -> tuple[int, str]:
        """Write one file with produce(sink); returns (bytes, sha256) of what was written.

        Where rename is atomic the file is written under a temporary name and renamed; on an object
        store it is written under its final name (one object PUT or completed multipart upload). On
        failure nothing is left under a temporary name, and a CheckpointWriteError names the file.
        """
        final = self.path(rel)
        target = local_temp_name(final) if self.atomic_rename else final
        try:
            if self.atomic_rename:
                self.fs.create_dir(posixpath.dirname(final), recursive=True)
            with self.fs.open_output_stream(target) as raw:
                sink = HashingSink(raw, flush_every=0 if self.atomic_rename else _UPLOAD_WINDOW)
                produce(sink)
            if self.local:
                fsync(target)  # the bytes reach the disk before the name does (measured: 0.01-0.2 s per 400 MB)
            if target != final:
                self.fs.move(target, final)
                if self.local:
                    fsync(posixpath.dirname(final))  # and the rename itself survives a crash of the machine
        except BaseException as exc:
            # a temporary file, or on an object store what a failed stream may have left under the
            # final name: in both cases an unreferenced file of this write, never a committed one
            self.delete_file(target)
            if isinstance(exc, OSError):
                raise CheckpointWriteError(f"cannot write to {self.show(rel)}: {reason(exc)}",
                                           getattr(exc, "errno", None), self.show(rel)) from exc
            raise
        return sink.size, sink.sha.hexdigest()

    def write_bytes(self, rel: str, data: bytes) -> None:
        # the whole content in one write: on an object store, a single atomic PUT
        self.write_file(rel, lambda sink: sink.write(data))

    def read_bytes(self, rel: str, limit: int = MAX_JSON_BYTES) -> bytes:
        info = self.info(rel)
        if info.type != pafs.FileType.File:
            raise UserError(f"{self.show(rel)}: missing")
        if info.size is not None and info.size > limit:
            raise UserError(f"{self.show(rel)}: {info.size} bytes, more than the {limit} this file can have")
        try:
            with self.fs.open_input_stream(self.path(rel)) as fh:
                return fh.read()
        except OSError as exc:
            raise UserError(f"{self.show(rel)}: unreadable ({exc})") from None

    def write_json(self, rel: str, data: Any) -> None:
        """JSON that a reader never sees half of (rename, or one PUT)."""
        self.write_bytes(check_rel(rel), json_bytes(data))

    def read_json(self, rel: str) -> Any:
        """JSON from the directory; a UserError naming the file if it is missing or not JSON."""
        raw = self.read_bytes(check_rel(rel))
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"{self.show(rel)}: not valid JSON ({exc})") from None

    def download(self, rel: str, target: str, sha256: str | None) -> None:
        """Copy one file to the local path `target`, checking its sha256 on the way when given;
        `target` appears whole or not at all."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = local_temp_name(target)
        made = False
        try:
            with self.fs.open_input_stream(self.path(rel)) as src, open(tmp, "xb") as dst:
                made = True
                sink = HashingSink(dst)
                copy_stream(src, sink)
            if sha256 is not None and sink.sha.hexdigest() != sha256:
                raise UserError(f"{self.show(rel)}: checksum mismatch; the checkpoint is damaged")
            os.replace(tmp, target)
            made = False
        except OSError as exc:
            raise UserError(f"{self.show(rel)}: could not download ({exc})") from None
        finally:
            if made:
                os.remove(tmp)


# ---------------------------------------------------------------------------------------------------
# bytes: hashing, copying, whole local writes
# ---------------------------------------------------------------------------------------------------

class HashingSink:
    """A write-only file object that hashes and counts what passes through it to `sink`.

    With `flush_every`, the sink is flushed after that many bytes: an S3 output stream uploads its
    parts in the background without a bound on how many wait, so a part written faster than the
    network takes would otherwise pile up in memory; its flush waits for the uploads in flight.
    Measured writing a 400 MB part to a local S3 server (moto): +320 MB of memory without flushes,
    +166 MB with a 64 MB window, +109 MB with 16 MB; 64 MB leaves real S3 several parts in flight.
    """

    def __init__(self, sink, flush_every: int = 0):
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0
        self.flush_every, self.unflushed = flush_every, 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)  # hashlib releases the GIL on large buffers
        self.sink.write(view)
        self.size += view.nbytes
        self.unflushed += view.nbytes
        if self.flush_every and self.unflushed >= self.flush_every:
            self.sink.flush()
            self.unflushed = 0
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def copy_stream(src, sink) -> None:
    for block in iter(lambda: src.read(_COPY_BLOCK), b""):
        sink.write(block)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def json_bytes(data: Any) -> bytes:
    """Our JSON files' one form: indented, keys sorted, a final newline."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def local_temp_name(path: str) -> str:
    """A name beside `path` for writing it under: `PATH.tmp-PID-RANDOM`, which no other process holds
    (process ids repeat across the machines sharing a storage); open it with mode "x" to be sure."""
    return f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def write_local(path: str, data: bytes | str) -> None:
    """A local file written whole under a temporary name and renamed: a reader never sees half of it."""
    tmp = local_temp_name(path)
    made = False
    try:
        with open(tmp, "xb") as fh:
            made = True
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
        made = False
    finally:
        if made:
            os.remove(tmp)


# ---------------------------------------------------------------------------------------------------
# local copies of remote files
# ---------------------------------------------------------------------------------------------------

def cache_root() -> str:
    """Where local copies of remote models go: $DOC2VEC_DIST_CACHE, else $XDG_CACHE_HOME or ~/.cache."""
    if os.environ.get("DOC2VEC_DIST_CACHE"):
        return os.environ["DOC2VEC_DIST_CACHE"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "doc2vec-dist")


def mirror(store: Store, key: str, files: dict[str, str | None], cache: str | None = None) -> str:
    """A local directory (under `cache`, named by a hash of `key`: the location as given) holding
    `files` of `store` (relative path → sha256 to check, or None). A file already there from an
    earlier call (same size and modification time remotely) is not fetched again; returns the directory."""
    local = os.path.join(cache or cache_root(), hashlib.sha256(key.encode()).hexdigest()[:20])
    os.makedirs(local, exist_ok=True)
    sources_path = os.path.join(local, ".sources.json")
    try:
        with open(sources_path) as fh:
            sources = json.load(fh)
    except (OSError, json.JSONDecodeError):
        sources = {}
    for rel, sha in files.items():
        info = store.info(rel)
        stamp = [info.size, info.mtime_ns]
        target = os.path.join(local, *rel.split("/"))
        if sources.get(rel) == stamp and os.path.isfile(target) and os.path.getsize(target) == info.size:
            continue
        store.download(rel, target, sha)
        sources[rel] = stamp
        write_local(sources_path, json.dumps(sources))
    return local
