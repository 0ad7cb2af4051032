"""memwatch.MemoryWatch.processes(): every process of a tree on its own, labelled, with RSS and private peaks."""

from __future__ import annotations

import subprocess
import sys
import time

from doc2vec_dist.memwatch import MemoryWatch, proc_status

# A child that names itself like a Ray actor process (argv[0] is what Ray's process title sets) and
# holds `mb` MiB of private memory for a while.
CHILD = "import numpy, sys, time; a = numpy.ones({mb} * 2**20 // 8); time.sleep({hold})"


def _spawn(title: str, mb: int, hold: float = 2.0) -> subprocess.Popen:
    return subprocess.Popen([title, "-c", CHILD.format(mb=mb, hold=hold)], executable=sys.executable)


def test_processes_are_labelled_in_start_order_with_their_private_peaks():
    parent_code = (
        "import subprocess, sys, time\n"
        f"child = {CHILD!r}\n"
        "procs = []\n"
        "for title, mb in (('ray::ParameterServer', 160), ('ray::ParameterServer', 60), ('ray::Worker', 100)):\n"
        "    procs.append(subprocess.Popen([title, '-c', child.format(mb=mb, hold=2.0)], executable=sys.executable))\n"
        "    time.sleep(0.3)\n"
        "[p.wait() for p in procs]\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    with MemoryWatch(parent.pid, interval=0.1) as watch:
        parent.wait()
    procs = {p["label"]: p for p in watch.processes()}
    assert set(procs) == {"driver", "ps0", "ps1", "worker0"}, procs
    mib = 2**20
    # numbered by start: the 160 MiB server started first
    assert procs["ps0"]["private"] >= 160 * mib > procs["ps1"]["private"] >= 60 * mib
    assert procs["worker0"]["private"] >= 100 * mib
    assert procs["driver"]["private"] < 60 * mib
    for p in procs.values():
        assert p["rss"] >= p["private"] > 0 and p["pid"] > 0
    # the old per-role view is still there
    assert watch.by_role()["ps"] >= 160 * mib and watch.peak_total >= 300 * mib


def test_proc_status_reads_several_fields_at_once():
    child = _spawn("plain", 50, hold=1.5)
    try:
        deadline = time.monotonic() + 10
        while True:  # until numpy is imported and the array made
            status = proc_status(child.pid, ("RssAnon", "VmHWM", "VmRSS"))
            if status.get("RssAnon", 0) >= 50 * 2**20 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status["RssAnon"] >= 50 * 2**20 and status["VmHWM"] >= status["RssAnon"]
        assert proc_status(child.pid, ("NoSuchField",)) == {}
    finally:
        child.wait()
    assert proc_status(child.pid) == {}  # gone: nothing, no error
