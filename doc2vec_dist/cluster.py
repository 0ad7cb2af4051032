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

import contextlib
import os
from collections.abc import Iterator


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
    with _environment(**niceness):
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 object_store_memory=object_store_bytes or local_object_store_bytes(), **common)
    return True


@contextlib.contextmanager
def ray_connection(address: str | None = None, **local) -> Iterator[bool]:
    """connect() for the length of a `with` block (`local`: connect's settings for a local Ray); shuts
    down a local Ray only if it started one. Yields whether it did."""
    import ray

    started = connect(address, **local)
    try:
        yield started
    finally:
        if started:
            ray.shutdown()


def local_object_store_bytes() -> int:
    """Object store of a local Ray: 15% of RAM, between 1 and 4 GiB.

    Only pulls and pushes pass through it, but with a vocabulary of ~1M URLs one macro-batch moves
    ~60 MB each way, and a few are in flight per worker: 512 MiB spilled 2.2 GB to disk on a
    1M-user corpus and halved throughput. Ray's default (30% of RAM) takes memory the PS tables need.
    """
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(0.15 * ram, 1 << 30), 4 << 30))


@contextlib.contextmanager
def _environment(**values: str):
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
