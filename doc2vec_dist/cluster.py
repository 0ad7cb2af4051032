"""The Ray connection: join the cluster at an address, else start a local Ray of our own, and let it go.

Changes when how this package connects to Ray changes: which address wins, what a local Ray is
started with. Every command and job that uses Ray connects here (train, plan, tune, prepare --parallel,
the export and index jobs); none calls ray.init itself.

The address is `address` (--address), else RAY_ADDRESS. With neither, `address="local"` starts a Ray
of our own even when another one runs on this machine (a leftover `ray start`): we never join a
cluster by accident. A local Ray started here binds to loopback only, has no dashboard and a small
object store, and is shut down by whoever started it (`ray_connection`); a Ray this process was
already connected to (a test's, tune's, a program's) is used as it is and left running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

# How long a local Ray's shutdown may take before its processes are stopped without it (shutdown_local):
# it takes 1.2-1.4 s; after a Ctrl-C during a Ray Data read, Ray's shutdown_driver was seen to never
# return (twice in ~a dozen full test runs), and the command with it.
SHUTDOWN_SECONDS = 30.0
# set once a local Ray was stopped without its shutdown: the process must then end without the interpreter's
# teardown, which crashes in Ray's half-shut core worker (logs.command ends it with os._exit)
abandoned = threading.Event()


def connect(address: str | None = None, *, num_cpus: int | None = None, object_store_bytes: int | None = None,
            worker_niceness: str | None = None) -> bool:
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local Ray; True if we started one.

    What a local Ray is started with: `num_cpus` (default: what Ray detects), an object store of
    `object_store_bytes` (default local_object_store_bytes()), and its workers' niceness
    (RAY_worker_niceness, where the environment does not set it; Ray's own default is 15).
    """
    import ray

    if ray.is_initialized():
        return False
    common = {"logging_level": "WARNING", "configure_logging": True, "log_to_driver": True}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **common)
        return False
    niceness = {} if worker_niceness is None else {"RAY_worker_niceness": os.environ.get("RAY_worker_niceness",
                                                                                        worker_niceness)}
    with environment(**niceness):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 object_store_memory=object_store_bytes or local_object_store_bytes(), **common)
    return True


@contextlib.contextmanager
def ray_connection(address: str | None = None, **local) -> Iterator[bool]:
    """connect() for the length of a `with` block (`local`: connect's settings for a local Ray); shuts
    down a local Ray only if it started one. Yields whether it did."""
    started = connect(address, **local)
    try:
        yield started
    finally:
        if started:
            shutdown_local()


def shutdown_local(seconds: float | None = None) -> None:
    """ray.shutdown() of the local Ray this process started, waited for `seconds` (SHUTDOWN_SECONDS) at most: past them its
    processes (GCS, raylet, workers) are stopped without it, one line says so, Ray's own shutdown at the
    interpreter's exit is skipped (it would wait on the same call), and `abandoned` is set, so that the
    command ends (logs.command) with its own exit status."""
    import ray
    from ray._private import worker

    done = threading.Event()

    def shut() -> None:
        try:
            ray.shutdown()
        finally:
            done.set()

    seconds = SHUTDOWN_SECONDS if seconds is None else seconds
    threading.Thread(target=shut, name="ray-shutdown", daemon=True).start()
    if done.wait(seconds):
        return
    node = worker._global_node
    if node is not None:
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    atexit.unregister(worker.shutdown)
    abandoned.set()
    log.warning(f"Ray's shutdown did not end within {seconds:g} s; the processes of the local Ray this command "
                "started were stopped without it")


def local_object_store_bytes() -> int:
    """Object store of a local Ray: 15% of RAM, between 1 and 4 GiB.

    Only pulls and pushes pass through it, but with a vocabulary of ~1M URLs one macro-batch moves
    ~60 MB each way, and a few are in flight per worker: 512 MiB spilled 2.2 GB to disk on a
    1M-user corpus and halved throughput. Ray's default (30% of RAM) takes memory the PS tables need.
    """
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(0.15 * ram, 1 << 30), 4 << 30))


@contextlib.contextmanager
def environment(**values: str):
    """Environment variables set for the length of a `with` block (what a process started in it inherits)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
