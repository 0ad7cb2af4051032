"""Peak memory of a run: a process and everything it starts (a local Ray's raylet, PS and worker actors).

A background thread samples the process tree. Each process is labelled by its role: the root is
the driver, Ray names its actor processes after the class (`ray::ParameterServer`, `ray::Worker`),
the rest is Ray's own machinery. The total counts PSS (each shared page split among the processes
that map it), so the object store's shared memory is not counted once per process that maps it.
"""

from __future__ import annotations

import threading

import psutil

ROLES = (("ParameterServer", "ps"), ("Worker", "worker"))


def role_of(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "driver"
    try:
        title = " ".join(proc.cmdline()[:1])
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    for needle, role in ROLES:
        if needle in title:
            return role
    return "ray" if "ray" in title else "other"


class MemoryWatch:
    """`with MemoryWatch(pid) as w: ...` then w.peak_total (bytes, PSS summed over the tree at one
    instant) and w.peaks ({"driver": …, "ps 1234": …}: the highest RSS each process reached)."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.peak_total = 0
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            total += getattr(info, "pss", info.rss)
            role = role_of(proc, self.pid)
            key = role if role == "driver" else f"{role} {proc.pid}"
            self.peaks[key] = max(self.peaks.get(key, 0), info.rss)
        self.peak_total = max(self.peak_total, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)
        self.sample()

    def by_role(self) -> dict[str, int]:
        """The largest single-process peak of each role (the figure to size a node by)."""
        out: dict[str, int] = {}
        for key, value in self.peaks.items():
            role = key.split(" ")[0]
            out[role] = max(out.get(role, 0), value)
        return out
