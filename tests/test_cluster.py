"""The local Ray a command starts is let go even when Ray's own shutdown never returns (cluster.shutdown_local).

After a Ctrl-C during `prepare --parallel`'s Ray Data read, Ray's `shutdown_driver` was seen to wait for
ever (twice in about a dozen full test runs: test_prepare_parallel's Ctrl-C test, "still running 120 s
after Ctrl-C", its stack in ray.shutdown). Here a shutdown that never returns stands in for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HANGS = """
import sys, time
import ray
from doc2vec_dist import cluster, logs

cluster.SHUTDOWN_SECONDS = 2.0
ray.shutdown = lambda: time.sleep(3600)  # Ray's shutdown, stuck


def work():
    with cluster.ray_connection(num_cpus=1) as started:
        assert started
        node = ray._private.worker._global_node
        print("PIDS", *[p.process.pid for procs in node.all_processes.values() for p in procs], flush=True)
        raise KeyboardInterrupt  # a Ctrl-C, as in the prepare that hung


sys.exit(logs.command(work))
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_shutdown_that_never_returns_stops_the_local_ray_and_the_command_ends_as_interrupted():
    """The command ends with its own status (130, `interrupted`: not a crash in Ray's half-shut core worker
    at the interpreter's exit), one line says what was done, and none of the local Ray's processes is left."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HANGS], cwd=ROOT, env={**env, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 130, done.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    pids = [int(p) for line in done.stdout.splitlines() if line.startswith("PIDS") for p in line.split()[1:]]
    assert pids and done.stderr.rstrip().endswith("interrupted")
    assert "Ray's shutdown did not end within 2 s; the processes of the local Ray this command started were " \
           "stopped without it" in done.stderr
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
