"""Where many independent tasks run: threads of this process, or Ray tasks across a cluster.

Changes when how per-file work is spread changes (a new executor, a new way to report where a task
ran). export and index hand each checkpoint part or Parquet file to a runner; a runner calls
fn(*args) for every args tuple and yields (position, result) as each finishes. prepare hands each
block of its inputs and each bucket to SerialRunner (one after another in this process) or RayTasks
(Ray tasks, a bounded number at a time, each reserving its memory, retried when their process dies).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from .cluster import ray_connection
from .errors import UserError

Runner = Callable[[Callable, list[tuple]], Iterator[tuple[int, object]]]


def run_local(fn: Callable, calls: list[tuple], threads: int | None = None) -> Iterator[tuple[int, object]]:
    """Run the calls on a thread pool of one thread per core; Arrow, Parquet and numpy release the GIL."""
    threads = max(1, min(len(calls), threads or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:  # after a failure, start nothing more
                future.cancel()


def run_on_ray(fn: Callable, calls: list[tuple]) -> Iterator[tuple[int, object]]:
    """Run each call as a Ray task (one CPU), so on a cluster the work happens where Ray places it.

    The tasks read and write paths themselves (storage every node sees), and return only small results.
    A UserError raised in a task is raised again here as itself, so the job prints its one line.
    """
    import ray

    remote = ray.remote(num_cpus=1)(fn)
    refs = {remote.remote(*args): i for i, args in enumerate(calls)}
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, UserError):
                    raise UserError(str(exc.cause)) from None
                raise
            yield refs[done[0]], result
    finally:
        for ref in pending:
            ray.cancel(ref)


class SerialRunner:
    """Runs each call in this process, one after another, as they are asked for: prepare with
    --parallel 1. Like RayTasks it hands back an exception a call raised as its result."""

    tasks = 1
    in_process = True

    def stopping_with(self, stop_file: str) -> SerialRunner:
        """This runner: a call in this process stops with it (KeyboardInterrupt), no file needed."""
        return self

    def map(self, fn: Callable, calls: Iterable[tuple], memory: int = 0) -> Iterator[tuple[int, object]]:
        for i, args in enumerate(calls):
            try:
                result = fn(*args)
            except Exception as exc:  # noqa: BLE001 - the caller raises it, in its turn
                result = exc
            yield i, result


class RayTasks:
    """Runs each call as a Ray task of one CPU, at most `tasks` at a time, and yields (position, result)
    as each finishes. A task whose process dies (a lost node, the out-of-memory killer) is run again,
    up to TASK_RETRIES times; an exception it raises is its result (a UserError or OSError as itself,
    anything else as Ray's error, which carries the remote traceback), for the caller to raise in its
    turn. When the caller stops early (an error, Ctrl-C), the tasks still running are stopped, and
    waited for, so that none writes anything after it: what they wrote can then be removed. With a
    `stop_file` they are asked to stop by creating it (each task checks for it between batches and
    ends); only a task still running STOP_SECONDS later is cancelled through Ray (see _kill).
    """

    in_process = False
    TASK_RETRIES = 3
    STOP_SECONDS = 120

    def __init__(self, tasks: int, stop_file: str | None = None):
        self.tasks = max(1, tasks)
        self.stop_file = stop_file

    def stopping_with(self, stop_file: str) -> RayTasks:
        """This runner, its tasks asked to stop early by creating `stop_file` (a path every node sees)."""
        return RayTasks(self.tasks, stop_file)

    def map(self, fn: Callable, calls: Iterable[tuple], memory: int = 0) -> Iterator[tuple[int, object]]:
        """fn(*args) for each args of `calls` (taken as slots free up), each task reserving `memory` bytes."""
        import ray

        options = {"num_cpus": 1, "max_retries": self.TASK_RETRIES, "retry_exceptions": False}
        if memory:
            options["memory"] = int(memory)
        remote = ray.remote(fn).options(**options)
        pending = iter(enumerate(calls))
        running: dict = {}
        try:
            while True:
                while len(running) < self.tasks:
                    nxt = next(pending, None)
                    if nxt is None:
                        break
                    running[remote.remote(*nxt[1])] = nxt[0]
                if not running:
                    return
                done, _ = ray.wait(list(running), num_returns=1)
                i = running.pop(done[0])
                try:
                    result = ray.get(done[0])
                except ray.exceptions.RayTaskError as exc:  # a reading or writing error as itself, in one line
                    result = exc.cause if isinstance(exc.cause, (UserError, OSError)) else exc
                except ray.exceptions.RayError as exc:  # its process died on every try: one line, not Ray's traceback
                    line = died(exc, self.TASK_RETRIES)
                    if line is None:
                        raise
                    raise line from None
                yield i, result
        finally:
            self._stop(list(running))

    def _stop(self, refs: list) -> None:
        """Ask the tasks of `refs` to stop (the stop file) and wait for them; cancel those that do not."""
        if not refs:
            return
        import ray

        if self.stop_file is not None:
            try:
                with open(self.stop_file, "a"):
                    pass
            except OSError:  # the staging directory is gone or unwritable: only Ray can stop them
                pass
            else:
                _, refs = ray.wait(refs, num_returns=len(refs), timeout=self.STOP_SECONDS)
        _kill(refs)


def died(exc: BaseException, retries: int) -> UserError | None:
    """One line for a task whose process died on every one of its tries (Ray's out-of-memory killer, a node
    lost each time), which Ray reports with a traceback of the driver's; None for any other error."""
    import ray

    if not isinstance(exc, (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError)):
        return None
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"a task's process died {retries + 1} times, so prepare stopped and wrote nothing to --out "
                     f"({type(exc).__name__}: {why}); if Ray's memory monitor killed it, give the nodes more memory "
                     f"or lower --memory-budget-bytes")


def _kill(refs: list) -> None:
    """Stop the tasks of `refs` and wait until each has ended: interrupted (KeyboardInterrupt in the task),
    then, any still running a minute later, killed with their process. Both race a task that is just
    finishing, which Ray 2.x's driver may not survive (task_manager.cc "Tried to complete task that
    was not pending", ray-project/ray#54738): a runner with a stop file comes here only for tasks
    that did not stop when asked."""
    if not refs:
        return
    import ray

    for ref in refs:
        ray.cancel(ref)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=60)
    for ref in running:
        ray.cancel(ref, force=True)
    if running:
        ray.wait(running, num_returns=len(running), timeout=30)


@contextlib.contextmanager
def ray_tasks(parallel: int, address: str | None = None, object_store_bytes: int = 1 << 30):
    """A RayTasks runner for `parallel` tasks at a time (0: one per CPU of the cluster) on the Ray this
    process is connected to, else the cluster at `address` (or RAY_ADDRESS), else a local Ray of
    `parallel` CPUs started here (and shut down at the end): cluster.ray_connection."""
    import ray

    # The tasks are the whole work (the driver waits), so a local Ray's run at this process's priority,
    # as one process would: Ray starts workers at nice 15, which on a busy machine made 2 tasks
    # slower than the single process (130.9 s against 105.1 s at load 10 on 2 cores).
    with ray_connection(address, num_cpus=parallel or os.cpu_count() or 1, object_store_bytes=object_store_bytes,
                        worker_niceness="0"):
        yield RayTasks(parallel or int(ray.cluster_resources().get("CPU", 1)))


def largest_node_memory() -> int | None:
    """The most memory (Ray's `memory` resource) one node of the connected cluster offers, None when
    no node says."""
    import ray

    found = [node["Resources"].get("memory", 0) for node in ray.nodes() if node.get("Alive")]
    return int(max(found)) if found and max(found) else None


CALMED_ENV = "DOC2VEC_DIST_CALMED_OPENMP"  # set where calm_openmp chose OMP_WAIT_POLICY


def calm_openmp() -> None:
    """Have OpenMP threads sleep rather than spin while they wait, unless the user chose otherwise.

    Call it before faiss is first imported (faiss loads its own OpenMP runtime, which reads this
    once). By default a waiting thread spins for a while; next to other busy processes (Ray workers,
    other jobs) that turns every parallel step into a fight for the cores: on a loaded machine PQ
    training was several times faster sleeping, and on a quiet one the two are within noise. Marked as
    the package's own (CALMED_ENV): a local Ray started after it passes it on to its workers, whose
    policy calm_openmp_in_ray_workers sets.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[CALMED_ENV] = "1"


def calm_openmp_in_ray_workers(environ=os.environ) -> bool:
    """In a Ray worker process (its environment has RAY_RAYLET_PID), OpenMP threads that spin 1,000 times, not
    libgomp's 300,000, before they sleep while they wait, unless the user chose (OMP_WAIT_POLICY,
    GOMP_SPINCOUNT; an OMP_WAIT_POLICY that calm_openmp set in the driver is not a choice). Called as the
    package is imported: a run's actors import it before torch, which loads libgomp and reads this once. With
    the default spin, a worker's torch threads (the token path with the CPU as the device, --kernel batched)
    fight any other busy process for the cores at every parallel step, and train many times slower on a
    shared node (docs/benchmarks.md, "GOMP_SPINCOUNT"). Set in the process, not as the actors' runtime_env:
    that would start each actor in a new process instead of one Ray keeps ready. Returns whether it set it."""
    if not environ.get("RAY_RAYLET_PID"):
        return False
    if environ.pop(CALMED_ENV, None):
        environ.pop("OMP_WAIT_POLICY", None)
    if environ.get("OMP_WAIT_POLICY") or environ.get("GOMP_SPINCOUNT"):
        return False
    environ["GOMP_SPINCOUNT"] = "1000"
    return True


def where() -> dict:
    """Which process ran a task: shown in job summaries, so a user sees the work was spread."""
    return {"host": socket.gethostname(), "pid": os.getpid()}
