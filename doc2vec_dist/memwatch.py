"""Peak memory: of a run's whole process tree (MemoryWatch), or of this process (PeakPrivateMemory,
peak_rss_bytes).

Changes when how memory is measured changes.

For a run, a background thread samples the process and everything it starts (a local Ray's raylet,
PS and worker actors). Each process is labelled by its role: the root is
the driver, Ray names its actor processes after the class (`ray::ParameterServer`, `ray::Worker`),
the rest is Ray's own machinery. The total counts PSS (each shared page split among the processes
that map it), so the object store's shared memory is not counted once per process that maps it.

Per process it keeps two peaks: resident (RSS, the larger of the sampled value and the kernel's own
high-water mark VmHWM) and private (RssAnon: the process's anonymous memory, its heap and numpy
arrays). RSS also counts the object-store pages a process has mapped — shared memory, bounded by the
store's size and counted once per node — so a parameter server's RSS is not the size of its tables;
its private memory is. `processes()` labels them driver, ps0, ps1, …, worker0, … in order of start.
"""

from __future__ import annotations

import resource
import threading
import time

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


def process_tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and every process under it (psutil's recursive children), or [] once it has ended."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


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
    instant), w.peaks ({"driver": …, "ps 1234": …}: the highest RSS each process reached) and
    w.processes() (each process's peak RSS and peak private memory, labelled)."""

    def __init__(self, pid: int, interval: float = 0.5, pss_budget: float = 0.05):
        super().__init__(interval)
        self.pid = pid
        self.pss_budget = pss_budget
        self._next_pss = 0.0
        self.peak_total = 0
        self.peaks: dict[str, int] = {}
        self.procs: dict[int, dict] = {}  # pid → role, start time, peak rss / private / pss

    def sample(self) -> None:
        """Every sample reads each process's /proc/PID/status (RSS, RssAnon, VmHWM: ~0.03 ms). PSS walks
        the page tables (~5 ms for a Ray process, which maps the whole object store), and doing that
        for a dozen processes 4 times a second took ~20% of the training speed on 2 cores; so the
        tree's PSS is read only as often as keeps it under `pss_budget` of one core (every sample for
        a small tree such as gensim's one process, about every second for a local Ray's)."""
        procs = process_tree(self.pid)
        if not procs:
            return
        t0 = time.perf_counter()
        with_pss = t0 >= self._next_pss
        total = 0
        for proc in procs:
            status = proc_status(proc.pid, ("VmRSS", "RssAnon", "VmHWM"))
            rec = self.procs.get(proc.pid)
            try:
                if rec is None or rec["role"] not in ("driver", "ps", "worker"):
                    role = role_of(proc, self.pid)
                    if rec is None:
                        rec = self.procs[proc.pid] = {"pid": proc.pid, "role": role, "started": proc.create_time(),
                                                      "rss": 0, "private": 0, "pss": 0}
                    rec["role"] = role  # an idle Ray process that became an actor takes its role
                pss = 0
                if with_pss:
                    info = proc.memory_full_info()
                    pss = getattr(info, "pss", info.rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if "VmRSS" not in status:  # gone meanwhile
                continue
            rss = status["VmRSS"]
            total += pss
            key = rec["role"] if rec["role"] == "driver" else f"{rec['role']} {proc.pid}"
            self.peaks[key] = max(self.peaks.get(key, 0), rss)
            rec["rss"] = max(rec["rss"], rss, status.get("VmHWM") or 0)
            rec["private"] = max(rec["private"], status.get("RssAnon") or 0)
            rec["pss"] = max(rec["pss"], pss)
        self.peak_total = max(self.peak_total, total)
        if with_pss:
            self._next_pss = t0 + (time.perf_counter() - t0) / self.pss_budget

    def by_role(self) -> dict[str, int]:
        """The largest single-process peak of each role (the figure to size a node by)."""
        out: dict[str, int] = {}
        for key, value in self.peaks.items():
            role = key.split(" ")[0]
            out[role] = max(out.get(role, 0), value)
        return out

    def processes(self) -> list[dict]:
        """The driver, then each parameter server and worker as its own entry (ps0, ps1, …, worker0, …,
        numbered in order of process start, which need not be the shard or worker index), then Ray's
        own processes as one entry "ray" (`count` processes; rss their largest, private and pss the
        sums of each one's peak).

        Each entry: label, role, pid, rss (peak resident bytes), private (peak RssAnon bytes), pss.
        """
        out = []
        for role in ("driver", "ps", "worker"):
            mine = sorted((r for r in self.procs.values() if r["role"] == role), key=lambda r: (r["started"], r["pid"]))
            for i, rec in enumerate(mine):
                label = role if role == "driver" else f"{role}{i}"
                out.append({"label": label, **{k: rec[k] for k in ("role", "pid", "rss", "private", "pss")}})
        rest = [r for r in self.procs.values() if r["role"] not in ("driver", "ps", "worker")]
        if rest:
            out.append({"label": "ray", "role": "ray", "pid": None, "count": len(rest),
                        "rss": max(r["rss"] for r in rest), "private": sum(r["private"] for r in rest),
                        "pss": sum(r["pss"] for r in rest)})
        return out


def proc_status(pid: int | str = "self", fields: tuple[str, ...] = ("RssAnon", "VmHWM")) -> dict[str, int]:
    """Memory fields of /proc/PID/status (VmHWM, RssAnon, …) in bytes, read at once; missing ones absent."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in fields:
                    out[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/PID/status (VmHWM, RssAnon, …) in bytes; None where there is none."""
    return proc_status(pid, (field,)).get(field)


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
