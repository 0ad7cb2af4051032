"""The library logs, the command line prints: what each shows of the same lines (issue 16, item 5)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.cli import main
from doc2vec_dist.logs import LOGGER, to_terminal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def untouched(monkeypatch):
    """The "doc2vec_dist" logger as a program that never called to_terminal has it; put back after
    (its level through setLevel, which also clears the children's cached levels)."""
    log = logging.getLogger(LOGGER)
    level = log.level
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "propagate", True)
    log.setLevel(logging.NOTSET)
    yield log
    log.setLevel(level)


def _vectors(path: str) -> str:
    vectors = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(50)],
                             "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 4)}), path)
    return path


def test_to_terminal_twice_prints_each_line_once(untouched, capsys):
    to_terminal()
    to_terminal()
    logging.getLogger(f"{LOGGER}.index").info("replacing the index at somewhere")
    logging.getLogger(f"{LOGGER}.trainer").warning("warning: something")
    assert capsys.readouterr().err == "replacing the index at somewhere\nwarning: something\n"
    assert len(untouched.handlers) == 1 and not untouched.propagate


def test_a_library_call_logs_what_the_command_prints(untouched, tmp_path, capsys, caplog):
    from doc2vec_dist.index import build_index

    vectors, out = _vectors(str(tmp_path / "v.parquet")), str(tmp_path / "users.index")
    build_index(out, kind="flat", vectors_path=vectors, progress=False)
    to_terminal()  # as the command line does, then a program that wants errors only
    caplog.set_level(logging.ERROR, logger=LOGGER)
    build_index(out, kind="flat", vectors_path=vectors, progress=False)
    assert capsys.readouterr().err == ""
    assert main(["index", "--vectors", vectors, "--out", out, "--kind", "flat", "--no-progress"]) == 0
    assert capsys.readouterr().err == f"replacing the index at {out}\n"


def test_a_program_that_configures_no_logging_sees_the_warnings_only(tmp_path):
    """Python's default for a library user: warnings on stderr as the command prints them (logging's
    last resort handler), information lines silent, and the level of the "doc2vec_dist" logger
    silences the rest."""
    vectors, out = _vectors(str(tmp_path / "v.parquet")), str(tmp_path / "users.index")
    script = f"""
import logging
from doc2vec_dist import placement
from doc2vec_dist.config import TableSpec, TrainConfig
from doc2vec_dist.index import build_index

build_index({out!r}, kind="flat", vectors_path={vectors!r}, progress=False)
build_index({out!r}, kind="flat", vectors_path={vectors!r}, progress=False)  # "replacing ...": information
args = TrainConfig(num_ps=64), {{"docs": TableSpec("docs", rows=10**9, dim=100)}}
node = {{"Alive": True, "Resources": {{"memory": 64 << 30, "ps": 8}}}}
placement.ps_options(*args, resources={{"ps": 8}}, nodes=[node])  # a warning
logging.getLogger("doc2vec_dist").setLevel(logging.ERROR)
placement.ps_options(*args, resources={{"ps": 8}}, nodes=[node])
"""
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: 64 parameter servers need"), done.stderr


def test_what_ray_forwards_as_the_process_exits_comes_not_after_the_commands_last_line(ray_cluster):
    """A driver of a cluster's Ray (the session's here, as `ray job submit` joins one) gets the cluster's
    lines until Ray's exit disconnects it, and a raylet says something as a driver leaves ("Failed to send
    wait complete … Socket closed" after a Ctrl-C): it was printed under the job's `interrupted` (CI,
    stop 62). Here a line reaches Ray's printing of forwarded lines at the process's exit, after the
    command's end and before Ray's shutdown, as that one did; a line forwarded during the command still
    shows."""
    script = """
import atexit, sys, time
import ray
from ray._private import ray_logging
from doc2vec_dist import cluster, logs

def forwarded(text):
    ray_logging.global_worker_stdstream_dispatcher.emit(
        {"ip": "127.0.0.1", "pid": "raylet", "job": "", "is_err": True, "lines": [text], "actor_name": "",
         "task_name": "", "localhost": "127.0.0.1"})

atexit.register(forwarded, "[W] worker.cc:239: Failed to send wait complete: Socket closed")  # runs after ours

def work():
    assert not cluster.connect() and ray.is_initialized()  # joined, as under ray job submit
    forwarded("said during the command")
    raise KeyboardInterrupt

sys.exit(logs.command(work))
"""
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 130, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "interrupted" and "Socket closed" not in done.stderr, done.stderr
    assert any("said during the command" in line for line in lines), done.stderr
