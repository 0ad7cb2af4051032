"""Shared fixtures: one real local Ray per test session, and a small real corpus and model."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")

# Credentials for the loopback S3 server of tests/test_storage_s3.py. Set before the session's Ray
# starts, so its actors (parameter servers writing checkpoints to s3://) inherit them, as actors
# on a cluster inherit their nodes' credentials. The server accepts any value.
for _name, _value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_name, _value)

# A shell starts a background job (`pytest … &` in a script) with SIGINT ignored, and the commands the tests
# start inherit that: every Ctrl-C test would then see its SIGINT do nothing. The tests are about our
# handling of Ctrl-C, so the session and its children get Python's own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def logged(caplog, monkeypatch):
    """caplog holding what the library logged during the test, its information lines included. The
    lines reach caplog (on the root logger) even after a command run in this session attached the
    terminal handler, which stops them at the "doc2vec_dist" logger."""
    monkeypatch.setattr(logging.getLogger("doc2vec_dist"), "propagate", True)
    caplog.set_level(logging.INFO, logger="doc2vec_dist")
    return caplog


def ports_outside_ephemeral() -> tuple[int, int]:
    """The ports free_ports picks from: from 20000 to the kernel's ephemeral range, or above that range
    where more room is there (a machine whose range starts low)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        first, last = map(int, fh.read().split())
    return max(((20000, first - 1), (last + 1, 65535)), key=lambda r: r[1] - r[0])


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing listens on now, for a Ray a test starts with ports of its own.

    They come from outside the kernel's ephemeral range, where no connection's own end is ever placed: a port
    picked there (`bind(0)`) and let go before Ray binds it can be taken in between by any outgoing connection
    on the machine, and the other test process's Ray makes thousands (a CI run's GCS once failed to start so).
    Above the session Ray's worker ports (10002-19999, Ray's default), and each pytest-xdist process has a
    span of its own, so the two never pick the same port. Each socket stays bound until all are picked."""
    low, high = ports_outside_ephemeral()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    span = (high - low + 1) // max(workers, 1)
    low = low + index * span
    assert span >= 8 * count, f"no room for {count} ports in {low}-{high}"
    held: list[socket.socket] = []
    try:
        for port in random.sample(range(low, low + span), span):
            if len(held) == count:
                break
            sock = socket.socket()
            try:
                sock.bind(("", port))  # every address: Ray listens on some ports on all of them
            except OSError:
                sock.close()
                continue
            held.append(sock)
        assert len(held) == count, f"only {len(held)} of {count} ports free in {low}-{low + span - 1}"
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


PREPARE_FAULTS = os.path.join(tempfile.gettempdir(), f"doc2vec-dist-faults-{os.getpid()}")
# Ray's log monitor (ray/_private/log_monitor.py): list the logs folder every 5 s, not every 0.1 s
LOG_MONITOR = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "5"}


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray with 2 CPUs and a small object store, shared by every test that trains. Its workers
    (not this process) carry prepare's fault hook (passes.FAULT_ENV), inert until a test arms it
    (prepare_faults)."""
    import ray

    from doc2vec_dist.passes import FAULT_ENV

    if not ray.is_initialized():
        os.makedirs(PREPARE_FAULTS, exist_ok=True)
        # FAULT_ENV for the raylet to pass on to the workers it starts; LOG_MONITOR for Ray's log monitor, which
        # otherwise lists its logs folder every 0.1 s: a session's ~350 actors leave ~800 files there, and the
        # listing cost 0.05 of a core at the end (0.02 listed every 5 s; nothing here reads the workers' logs)
        extra = {FAULT_ENV: PREPARE_FAULTS, **LOG_MONITOR}
        before = {name: os.environ.get(name) for name in extra}
        os.environ.update(extra)
        try:
            ray.init(address="local", num_cpus=2, object_store_memory=150 * 1024 * 1024, include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False)
        finally:
            for name, value in before.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
    yield ray
    ray.shutdown()
    shutil.rmtree(PREPARE_FAULTS, ignore_errors=True)


@pytest.fixture
def prepare_faults(ray_cluster):
    """The session Ray's fault folder (passes._fault_once), empty; emptied again after the test."""
    def empty() -> None:
        for name in os.listdir(PREPARE_FAULTS):
            os.remove(os.path.join(PREPARE_FAULTS, name))

    empty()
    yield pathlib.Path(PREPARE_FAULTS)
    empty()


def made_once(tmp_path_factory, name: str, make: Callable[[pathlib.Path], object]):
    """make(folder)'s result (JSON-able: paths), made once for the whole test run. The two pytest-xdist
    processes share it: the first makes it in a folder of the run's (under a lock), the other takes what it
    made; each had made its own before (the sample's model trained twice a run, 4 actor processes each).
    Without xdist, a folder of this session's. What it makes is for reading only: copy it to change it."""
    def kept(made) -> object:  # the same value in every process: as JSON gives it back (a list as a tuple)
        found = json.loads(json.dumps(made))
        return tuple(found) if isinstance(found, list) else found

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return kept(make(tmp_path_factory.mktemp(name)))
    root = tmp_path_factory.getbasetemp().parent / f"once-{name}"  # (the run's folder, above each process's)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (let go when the file closes, and by a process that died)
        done = root / "made.json"
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-made one of a process that died making it
            root.mkdir()
            done.write_text(json.dumps(make(root)))
        return kept(json.loads(done.read_text()))


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory):
    """The bundled sample prepared with 20% of each user's URLs held out: (corpus dir, held-out file)."""
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    def make(root: pathlib.Path) -> tuple[str, str]:
        heldout = str(root / "heldout.parquet")
        corpus = prepare([SAMPLE_EVENTS], str(root / "corpus"),
                         PrepareConfig(time_col="ts", holdout=0.2, holdout_out=heldout, seed=1), progress=False)
        return corpus.path, heldout

    return made_once(tmp_path_factory, "sample", make)


SMALL_USERS = 1500  # of the sample's 5000


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> str:
    """The bundled sample's first SMALL_USERS users (by id), prepared: 38,576 tokens, 4,495 URLs. For
    tests whose assertions hold on any corpus (two paths training the same bits, rows resharded
    exactly, a resumed run going on) and need no quality: a third of the sample's training time, still
    several macro-batches an epoch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    def make(root: pathlib.Path) -> str:
        events = pq.read_table(SAMPLE_EVENTS)
        users = sorted(set(events.column("user_id").to_pylist()))[:SMALL_USERS]
        os.makedirs(root / "events")
        pq.write_table(events.filter(pc.is_in(events.column("user_id"), value_set=pa.array(users))),
                       str(root / "events" / "part-00000.parquet"))
        return prepare([str(root / "events")], str(root / "corpus"), PrepareConfig(time_col="ts"), progress=False).path

    return made_once(tmp_path_factory, "small", make)


@pytest.fixture(scope="session")
def lee_corpus(tmp_path_factory) -> str:
    """gensim's Lee background documents as a text corpus (min_count 2), as benchmarks/quality.py has them:
    300 documents, 53,953 tokens: each of 2 workers' 32 rounds an epoch holds some 1,700 of them."""
    from gensim.test.utils import datapath

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    def make(root: pathlib.Path) -> str:
        return prepare([datapath("lee_background.cor")], str(root / "corpus"), PrepareConfig(format="text", min_count=2),
                       progress=False).path

    return made_once(tmp_path_factory, "lee", make)


@pytest.fixture(scope="session")
def trained_model(ray_cluster, sample_corpus, tmp_path_factory):
    """Our model trained on the sample through Ray (2 parameter servers, 2 workers): its directory."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    def make(root: pathlib.Path) -> str:
        config = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False)
        train(sample_corpus[0], str(root / "model"), config)
        return str(root / "model")

    return made_once(tmp_path_factory, "model", make)


def _snapshot(path: str):
    """Every byte under `path` (a file's bytes, or a folder's files by relative name), None if absent:
    what a command that refuses must leave exactly as it was."""
    if not os.path.lexists(path):
        return None
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            return fh.read()
    found = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as fh:
                found[os.path.relpath(full, path)] = fh.read()
    return found


@pytest.fixture
def snapshot():
    """_snapshot, for tests that check a refused command touched nothing."""
    return _snapshot


def _interrupt_when(proc: subprocess.Popen, ready: Callable[[], bool], within: float = 120.0) -> str:
    """Send SIGINT (what Ctrl-C sends) to `proc` once ready() holds, and return its stderr. Fails if the
    process ends, or `within` seconds pass, before that; a process left running is killed."""
    deadline = time.monotonic() + within
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"not ready within {within:.0f} s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # still running: its threads' stacks (the CLI's faulthandler) in the failure
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"still running 120 s after Ctrl-C; its stacks then:\n{err[-8000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


@pytest.fixture
def interrupt_when():
    """_interrupt_when, for the tests of what Ctrl-C leaves behind."""
    return _interrupt_when


class Tmpfs:
    """Real file systems for the tests of full and read-only disks: tmpfs mounts, each unmounted when
    the test ends, pass or fail. Tests run as root here and in CI, and root ignores permission bits,
    so only a real mount is read-only for it, or full."""

    def __init__(self, root):
        self.root, self.mounted = root, []

    def mount(self, name: str, size: str = "20m", read_only: bool = False, fill=None) -> str:
        """A new tmpfs of `size` at ROOT/name. fill(path), if given, writes into it first; with
        read_only the mount is then made read-only."""
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the full and read-only disk tests "
                        "need root, as in CI")
        self.mounted.append(path)
        if fill is not None:
            fill(path)
        if read_only:
            self.remount(path, "ro")
        return path

    def remount(self, path: str, options: str) -> None:
        """Change a mount's options: "ro", "rw", "size=30m"."""
        subprocess.run(["mount", "-o", f"remount,{options}", path], check=True, capture_output=True)

    @staticmethod
    def fill_up(path: str) -> None:
        """Write a file of zeros into `path` until its disk is full (a file of the user's, to be left alone)."""
        block = b"\0" * 65536
        with open(os.path.join(path, "filler.bin"), "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(block)
            except OSError:
                pass
        with open(os.path.join(path, "filler.bin"), "ab", buffering=0) as fh:  # the last partial block
            try:
                while True:
                    fh.write(b"\0" * 512)
            except OSError:
                pass

    def unmount_all(self) -> None:
        for path in reversed(self.mounted):
            if subprocess.run(["umount", path], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", path], capture_output=True, check=False)  # busy: detach it
        self.mounted = []


@pytest.fixture
def tmpfs(tmp_path):
    """Tmpfs: tmpfs mounts under this test's temporary directory, unmounted at its end."""
    mounts = Tmpfs(str(tmp_path))
    try:
        yield mounts
    finally:
        mounts.unmount_all()


class SmallModels:
    """Model directories written directly with the checkpoint functions (no training): a docs table of
    random rows for users u0…, each model with an id of its own, for tests of which model an index, an
    export or a query was made from. Two of them with the same keys and dims are still two models."""

    DIM = 8

    @staticmethod
    def make(path, seed: int, extra: dict | None = None, rows: int = 300) -> str:
        """A model at `path` whose v1 holds `rows` random rows (extra: manifest fields, say derived_from)."""
        import numpy as np
        import pyarrow as pa

        model = str(path)
        os.makedirs(model)
        schema = pa.schema([("key", pa.string()), ("id", pa.int64()), ("length", pa.int64())])
        ids = np.arange(rows, dtype=np.int64)
        with pa.OSFile(os.path.join(model, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(pa.table({"key": [f"u{i}" for i in ids], "id": ids,
                                         "length": np.ones(rows, np.int64)}, schema=schema))
        SmallModels.train_on(model, seed, extra)
        return model

    @staticmethod
    def train_on(model: str, seed: int, extra: dict | None = None) -> int:
        """Commit the model's next version, of fresh random rows (what a resumed run's checkpoint is)."""
        import numpy as np
        import pyarrow as pa

        from doc2vec_dist import checkpoint

        with pa.memory_map(os.path.join(model, "docs.arrow")) as source:
            rows = pa.ipc.open_file(source).read_all().num_rows
        matrix = np.random.default_rng(seed).standard_normal((rows, SmallModels.DIM)).astype(np.float32)
        version = checkpoint.next_version(model)
        part = checkpoint.write_slice(model, version, "docs", 0, 1, np.arange(rows), matrix)
        checkpoint.commit(model, version, {"docs": [part]}, {"docs": SmallModels.DIM}, extra or {}, keep=3)
        return version


@pytest.fixture
def small_models() -> type[SmallModels]:
    """SmallModels: small model directories written without training."""
    return SmallModels


# -- corpora compared, record batches apart (prepare in one process and as Ray tasks, issue 30) ---------

# corpus.json's fields that say how and when a corpus was made, not what it is
HOW = ("created", "parallel", "engine", "seconds", "holdout_out")


def corpus_tables(path: str) -> dict:
    """Every Arrow file of a corpus directory (or a held-out Parquet file) as one table each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return {"heldout": pq.read_table(path)}
    found = {}
    for root, _, names in os.walk(path):
        for name in names:
            if name.endswith(".arrow"):
                full = os.path.join(root, name)
                found[os.path.relpath(full, path)] = pa.ipc.open_file(pa.memory_map(full)).read_all()
    return found


def corpus_meta(path: str) -> dict:
    """corpus.json but for when and how the corpus was made."""
    with open(os.path.join(path, "corpus.json")) as fh:
        return {k: v for k, v in json.load(fh).items() if k not in HOW}


def assert_same_corpus(single: str, parallel: str, heldout: tuple[str, str] | None = None) -> None:
    """The same tables (record batches apart) and the same corpus.json but for when and how it was made."""
    one, other = corpus_tables(single), corpus_tables(parallel)
    assert sorted(one) == sorted(other)
    for name in one:
        assert one[name].equals(other[name]), name
    assert corpus_meta(single) == corpus_meta(parallel)
    if heldout:
        assert corpus_tables(heldout[0])["heldout"].equals(corpus_tables(heldout[1])["heldout"])


def _load_script(folder: str, name: str, module: str) -> types.ModuleType:
    """FOLDER/NAME.py as a module (the scripts are not a package), registered in sys.modules as `module`,
    where its dataclasses look their annotations up."""
    spec = importlib.util.spec_from_file_location(module, os.path.join(ROOT, folder, f"{name}.py"))
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def load_benchmark(name: str, module: str | None = None):
    """benchmarks/NAME.py, a measuring script, as a module named `module` (default NAME_job)."""
    return _load_script("benchmarks", name, module or f"{name}_job")
