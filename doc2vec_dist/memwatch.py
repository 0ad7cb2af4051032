"""Peak memory: of a run's whole process tree (MemoryWatch), or of this process (PeakPrivateMemory,
peak_rss_bytes).

For a run, a background thread samples the process and everything it starts (a local Ray's raylet,
PS and worker actors). Each process is labelled by its role: the root is
the driver, Ray names its actor processes after the class (`ray::ParameterServer`, `ray::Worker`),
the rest is Ray's own machinery. The total counts PSS (each shared page split among the processes
that map it), so the object store's shared memory is not counted once per process that maps it.
"""

from __future__ import annotations

import resource
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


class _Sampler:
    """A thread calling sample() every `interval` seconds while the `with` block runs, and once at its end."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                break
        self.sample()


class MemoryWatch(_Sampler):
    """`with MemoryWatch(pid) as w: ...` then w.peak_total (bytes, PSS summed over the tree at one
    instant) and w.peaks ({"driver": …, "ps 1234": …}: the highest RSS each process reached)."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(interval)
        self.pid = pid
        self.peak_total = 0
        self.peaks: dict[str, int] = {}

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

    def by_role(self) -> dict[str, int]:
        """The largest single-process peak of each role (the figure to size a node by)."""
        out: dict[str, int] = {}
        for key, value in self.peaks.items():
            role = key.split(" ")[0]
            out[role] = max(out.get(role, 0), value)
        return out


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/PID/status (VmHWM, RssAnon, …) in bytes; None where there is none."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakPrivateMemory(_Sampler):
    """`with PeakPrivateMemory() as m: …` then m.peak: the highest private (anonymous) resident
    memory of this process in the block, sampled every `interval` seconds.

    The resident peak (VmHWM) also counts pages of files mapped into the process: IVF-PQ's re-rank
    vectors are read through a memory map, and each row touched maps ~64 KB around it. Those pages
    are the page cache's, shared and dropped under pressure; private memory is what the process takes.
    """

    def __init__(self, interval: float = 0.2):
        super().__init__(interval)
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, proc_status_bytes("RssAnon") or 0)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far.

    Linux's VmHWM, not getrusage's ru_maxrss: a process started by subprocess (vfork, then exec)
    inherits its parent's peak in ru_maxrss, which made a 0.6 GB index build report the 2.7 GB of
    the benchmark that started it.
    """
    return proc_status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
