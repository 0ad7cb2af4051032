"""Ctrl-C stops every command at any moment: exit status 130, `interrupted`, nothing left at --out (issue 26,
item 6). Early in `prepare` it was ignored: pyarrow imports pandas the first time it converts an array to
numpy, from C++ that takes any error of that import, a KeyboardInterrupt included, for "pandas is not
installed"; and Python drops a KeyboardInterrupt raised where it cannot propagate (a generator closed by the
garbage collector, a __del__). logs.command covers both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")

# pandas as it is when Ctrl-C comes while it loads: the import raises KeyboardInterrupt, once (a later
# import then finds it missing, which pyarrow copes with)
FAKE_PANDAS = """
import builtins
if not getattr(builtins, "_interrupted_once", False):
    builtins._interrupted_once = True
    raise KeyboardInterrupt
raise ImportError("pandas is not installed")
"""


def test_ctrl_c_while_pyarrow_loads_pandas_stops_prepare(tmp_path):
    (tmp_path / "fake" / "pandas").mkdir(parents=True)
    (tmp_path / "fake" / "pandas" / "__init__.py").write_text(FAKE_PANDAS)
    out = tmp_path / "corpus"
    done = subprocess.run([sys.executable, "-m", "doc2vec_dist", "prepare", SAMPLE_EVENTS, "--time-col", "ts",
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), ROOT])},
                          check=False)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted" and not out.exists()


LOST_INTERRUPT = """
import sys, time
from doc2vec_dist.logs import command

def reading():
    try:
        yield 1
        yield 2
    finally:
        raise KeyboardInterrupt  # Ctrl-C's handler running while the garbage collector closes this generator

def work():
    rows = reading()
    next(rows)
    del rows  # closed here: Python prints "Exception ignored" and goes on
    for _ in range(STEPS):
        time.sleep(0.01)
    print("finished")

sys.exit(command(work))
"""


@pytest.mark.parametrize("steps", [300, 0], ids=["work goes on", "work ends at once"])
def test_a_ctrl_c_that_python_drops_still_stops_the_command(steps):
    # with no work left the Ctrl-C raised again comes after the command's end: it still ends as interrupted,
    # and no KeyboardInterrupt traceback follows it
    done = subprocess.run([sys.executable, "-c", LOST_INTERRUPT.replace("STEPS", str(steps))], capture_output=True,
                          text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, check=False)
    assert done.returncode == 130, done.stderr
    assert done.stdout == ("finished\n" if steps == 0 else "") and done.stderr.strip() == "interrupted", done.stderr


SLOW_HOOK = """
import time
from doc2vec_dist import logs

raised_again = logs._interrupt_again

def _interrupt_again(hook, unraisable):  # a main thread still in the hook when the timer's Ctrl-C comes
    raised_again(hook, unraisable)
    time.sleep(0.2)

logs._interrupt_again = _interrupt_again
"""


def test_a_ctrl_c_raised_again_while_the_hook_still_runs_is_put_off_not_dropped():
    """A full run failed the test above once: the Ctrl-C raised again (0.01 s later) came while the main thread
    still waited in the hook for the timer's thread to start, was raised there, was dropped in its turn, and the
    work ran to its end. Here the hook outlasts the timer on purpose: the handler puts the Ctrl-C off until the
    hook has returned, and the work stops."""
    done = subprocess.run([sys.executable, "-c", SLOW_HOOK + LOST_INTERRUPT.replace("STEPS", "300")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          check=False)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "" and done.stderr.strip() == "interrupted", done.stderr


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    """Events that take prepare several seconds: 150k users, 3M events."""
    from doc2vec_dist.synthetic import generate

    out = str(tmp_path_factory.mktemp("ctrl-c") / "events")
    generate(out, 150_000, 20_000, events_per_user=20, progress=False)
    return out


@pytest.mark.parametrize("delay", [0.4, 0.6, 0.8, 1.0, 1.4, 2.0])
def test_ctrl_c_early_in_prepare_stops_it_and_leaves_nothing(events, tmp_path, interrupt_when, delay):
    out = tmp_path / "corpus"
    proc = subprocess.Popen([sys.executable, "-m", "doc2vec_dist", "prepare", events, "--out", str(out),
                             "--time-col", "ts", "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    start = time.monotonic()
    err = interrupt_when(proc, lambda: time.monotonic() - start >= delay, within=30)
    # 130, or ended by SIGINT itself (what a shell also shows as 130): under `python -m`, CPython does
    # that at exit when the interrupt landed in code it ran from a string (exec in a dataclass's
    # generated methods, say), even though the command caught it (pythonrun.c, run_eval_code_obj)
    assert proc.returncode in (130, -signal.SIGINT), err
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err
    assert os.listdir(tmp_path) == []  # no corpus, no staging folder beside it


SLOW_LOAD = """
import importlib.abc, runpy, sys, time

class Slow(importlib.abc.MetaPathFinder):  # the command line's modules take their time to load
    def find_spec(self, name, path, target=None):
        if name == "doc2vec_dist.cli":
            print("loading", flush=True)
            time.sleep(60)
        return None

sys.meta_path.insert(0, Slow())
sys.argv = ["doc2vec-dist", "--help"]
runpy.run_module("doc2vec_dist", run_name="__main__")  # python -m doc2vec_dist
"""


def test_ctrl_c_while_the_command_line_loads_is_exit_130_not_a_traceback(interrupt_when):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOAD], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT})
    err = interrupt_when(proc, lambda: proc.stdout.readline().strip() == "loading", within=60)
    assert proc.returncode == 130 and err.strip() == "interrupted", err


SWALLOWED = """
import sys, os, signal
from doc2vec_dist.logs import command
from doc2vec_dist.outputs import replacing

def work():
    with replacing(sys.argv[1], "plan") as staged:
        with open(staged.path, "w") as fh:
            fh.write("{}")
        try:  # a library that catches the interrupt and goes on (pyarrow's pandas import did)
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0.05) if hasattr(signal, "sigtimedwait") else None
            for _ in range(10**6):
                pass
        except KeyboardInterrupt:
            pass
    print("finished")

sys.exit(command(work))
"""


def test_a_ctrl_c_a_library_swallows_still_stops_the_command_and_commits_nothing(tmp_path):
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-c", SWALLOWED, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, check=False)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "" and done.stderr.strip() == "interrupted", done.stderr
    assert os.listdir(tmp_path) == []  # the output was never moved into place, its staging name removed
