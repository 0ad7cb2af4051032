"""How a worker calls the parameter servers: Ray actors, or ParameterServer objects in this process.

A worker calls `server.pull.remote(request)` and `server.push.remote(...)` and waits with `get`. On a
cluster the servers are Ray actor handles (or their names, looked up here). Without Ray, e.g. to
measure one worker on a GPU machine that has no Ray (jobs/feed_rate.py --no-ray), they are
`LocalServer`s: a ParameterServer object whose calls run, one at a time as an actor's would, on a
thread of its own, so that pulls and pushes still overlap the worker's compute. Ray is imported only
where a Ray handle is met.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


class _Method:
    def __init__(self, pool: ThreadPoolExecutor, fn):
        self._pool, self._fn = pool, fn

    def remote(self, *args, **kwargs) -> Future:
        return self._pool.submit(self._fn, *args, **kwargs)


class LocalServer:
    """A ParameterServer in this process, called like its actor handle (pull, push, save, info)."""

    def __init__(self, server):
        self.server = server
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ps{server.shard}")
        for name in ("pull", "push", "save", "info"):
            setattr(self, name, _Method(self._pool, getattr(server, name)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def connect(servers: list) -> list:
    """The servers as handles: a name is looked up among Ray's named actors; handles and LocalServers
    are used as they are."""
    if any(isinstance(s, str) for s in servers):
        import ray

        return [ray.get_actor(s) if isinstance(s, str) else s for s in servers]
    return list(servers)


def get(refs):
    """The value of one call, or of a list of calls, in order (an error a call raised is raised here)."""
    if isinstance(refs, Future):
        return refs.result()
    if isinstance(refs, list) and all(isinstance(r, Future) for r in refs):
        return [r.result() for r in refs]
    import ray

    return ray.get(refs)


def wait_oldest(inflight: list, limit: int) -> list:
    """Wait for the oldest calls until at most `limit` are left in flight; returns those."""
    if len(inflight) <= limit:
        return inflight
    get(inflight[:len(inflight) - limit])
    return inflight[len(inflight) - limit:]


def stage(rows, servers: list):
    """A copy of `rows` that a later call may carry while the worker reuses its buffer: in Ray's
    object store (one copy, which the call then passes by reference), or a plain copy for LocalServers."""
    if servers and isinstance(servers[0], LocalServer):
        return rows.copy()
    import ray

    return ray.put(rows)
