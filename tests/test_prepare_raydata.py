"""prepare --parallel --engine data (issue 30): pass 2 through Ray Data (read_parquet/read_csv and
map_batches) gives the single process's corpus, on the sample, a generated corpus of Parquet and CSV
read in small blocks, tokens out of the vocabulary, and Parquet on the S3 emulator. Pass 1 stays Ray
tasks, so errors and skips are theirs. On the session's Ray (2 CPUs)."""

from __future__ import annotations

import logging
import os

import pytest
from conftest import corpus_meta
from test_prepare_parallel import SAMPLE_EVENTS, _both, assert_files_in_base, days, generated, s3_events  # noqa: F401 (fixtures)

from doc2vec_dist import raydata
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.prepare import prepare


def footer_readers(ray) -> set:
    """The ids of the Ray Data Parquet footer readers this Ray has started (alive or not)."""
    return {a for a, info in ray._private.state.actors().items() if info.get("ActorClassName") == "FooterReader"}


def test_the_sample_through_ray_data_is_the_single_process_corpus(ray_cluster, tmp_path, monkeypatch, capfd):
    """The corpus one process makes; and its one Parquet file's footer is read by one footer reader
    (raydata._footer_readers), where Ray Data's default started 32 processes, ~1 CPU-s each. Ray Data's
    INFO lines (an execution's start, plan and end) stay off the console: its log file keeps them."""
    from doc2vec_dist.raydata import FOOTER_ACTORS_ENV

    monkeypatch.delenv(FOOTER_ACTORS_ENV, raising=False)
    before = footer_readers(ray_cluster)
    import ray.data  # noqa: F401  (its import puts its console on its logger)

    def consoles() -> list:
        return [(h, h.level, list(h.filters)) for h in logging.getLogger("ray.data").handlers
                if isinstance(h, logging.StreamHandler)]

    was = consoles()
    one, _ = _both([SAMPLE_EVENTS], tmp_path, "sample", holdout=True, engine="data", time_col="ts", num_shards=3)
    assert was and consoles() == was  # its level and filters as they were
    err = capfd.readouterr().err
    assert "streaming_executor" not in err and "Progress bars disabled" not in err, err
    assert corpus_meta(one)["heldout_pairs"] > 0
    assert len(footer_readers(ray_cluster) - before) == 1
    assert FOOTER_ACTORS_ENV not in os.environ  # set for the read only
    monkeypatch.setenv(FOOTER_ACTORS_ENV, "3")  # the user's own is kept
    with raydata._footer_readers(1000):
        assert os.environ[FOOTER_ACTORS_ENV] == "3"
    assert os.environ[FOOTER_ACTORS_ENV] == "3"


def test_documents_keep_their_order_wherever_ray_data_blocks_begin(ray_cluster, tmp_path, monkeypatch):
    """Tokens out of the vocabulary (min_count 5) and Ray Data blocks of 256 KiB, which begin elsewhere
    than the batches one process reads: each document is still numbered where its user first appears,
    as one process numbers it (passes.keep_mask keeps each key's first row of every batch)."""
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 256 << 10)
    one, _ = _both([SAMPLE_EVENTS], tmp_path, "rare", engine="data", time_col="ts", num_shards=2, min_count=5)
    assert corpus_meta(one)["skipped"]["tokens_below_min_count"] > 0


def test_a_generated_corpus_through_ray_data_is_the_same(ray_cluster, generated, tmp_path, monkeypatch):  # noqa: F811
    """Five Parquet files (one of them in row groups, its times numbers in milliseconds), their columns'
    types not all alike (one read each), and a CSV file of rows to skip, in Ray Data blocks of 64 KiB
    (each handed its file's unit of times by pass 1): the corpus one process makes."""
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 64 << 10)
    one, _ = _both([generated], tmp_path, "gen", holdout=True, engine="data", time_col="ts",
                   memory_budget_bytes=200_000)
    assert corpus_meta(one)["num_shards"] > 3


@pytest.mark.parametrize("how", ["joined by shard", "re-bucketed"])
def test_a_refresh_through_ray_data_counts_the_events_in_the_base_file_by_file(ray_cluster, days, tmp_path,  # noqa: F811
                                                                               monkeypatch, how):
    """A refresh of a day's events and of the base's sent again, in Ray Data blocks of 64 KiB: the single
    process's corpus and corpus.json, the events the base has counted for the file they came from."""
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 64 << 10)
    settings = {"joined by shard": {}, "re-bucketed": {"num_shards": 4}}[how]
    one, _ = _both([days["new"], days["again"]], tmp_path, "refresh", engine="data", time_col="ts",
                   base=days["base"], **settings)
    assert_files_in_base(one, days)


def test_parquet_on_object_storage_through_ray_data_is_the_single_process_corpus(ray_cluster, s3_events, tmp_path):  # noqa: F811
    uri, files, _ = s3_events
    folder, query = uri.split("?")
    objects = [f"{folder}/part-{i:05d}.parquet?{query}" for i in range(len(files))]
    _both(objects, tmp_path, "s3", engine="data", time_col="ts")


def test_inputs_ray_data_does_not_read_run_as_ray_tasks(ray_cluster, tmp_path, logged):
    path = tmp_path / "e.jsonl"
    path.write_text('{"user_id": "u1", "url": "a"}\n{"user_id": "u2", "url": "b"}\n')
    corpus = prepare([str(path)], str(tmp_path / "c"), PrepareConfig(parallel=2, engine="data"), progress=False)
    assert corpus.meta["engine"] == "tasks"
    said = [r.getMessage() for r in logged.records if r.levelno == logging.INFO and "--engine data" in r.getMessage()]
    assert said == ["prepare: --engine data: json input is read by Ray tasks; pass 2 runs as Ray tasks"]


def test_files_of_no_rows_and_of_skipped_rows_through_ray_data(ray_cluster, tmp_path):
    """Beside the sample: a CSV of a header alone, a CSV of a blank line, a Parquet file of no rows (none
    of them empty, all of them skipped as empty files by pass 1, which Ray Data reads otherwise or not at
    all), a CSV whose every row is skipped, and twelve small Parquet files given in reverse order of
    their names, which Ray Data may read several to a task: the single process's corpus and skips."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    inputs = [SAMPLE_EVENTS]
    for name, text in (("header.csv", "user_id,url,ts\n"), ("blank.csv", "\n"),
                       ("skipped.csv", "user_id,url,ts\n,https://a.example/,1700000000\n,x,1700000001\n")):
        (tmp_path / "in" / name).write_text(text)
        inputs.append(str(tmp_path / "in" / name))
    sample = pq.read_table(SAMPLE_EVENTS)
    pq.write_table(sample.slice(0, 0), tmp_path / "in" / "none.parquet")
    inputs.append(str(tmp_path / "in" / "none.parquet"))
    for i in reversed(range(12)):  # given in reverse order of their names
        path = str(tmp_path / "in" / f"small-{i:02d}.parquet")
        pq.write_table(sample.slice(i * 50, 50).set_column(0, "user_id", pa.array([f"s{i % 5}-{j % 7}" for j in range(50)])),
                       path)
        inputs.append(path)
    one, _ = _both(inputs, tmp_path, "edges", engine="data", time_col="ts", num_shards=2)
    skipped = corpus_meta(one)["skipped"]
    assert skipped["empty_files"] == 3 and skipped["null_keys"] == 2


def test_ray_data_calls_still_running_when_pass_2_stops_end_when_asked(ray_cluster, tmp_path):
    """When pass 2 through Ray Data stops early (an error, Ctrl-C: its generator is closed), the calls
    under way are asked to end through the stop file, as the Ray tasks are, and waited for: none is
    left running (its marker, raydata._running, gone or of a process that is gone) when the close returns.
    Ray Data's close may also kill a task's process before the call reads the stop file (a busy machine:
    it failed once so; with the call reading it once a second, every time), so either ending is taken."""
    import os
    import time

    import numpy as np
    import psutil

    from doc2vec_dist import passes, raydata, read_files

    s = passes.Settings(read_files.Options("events", "user_id", "url", "ts"), str(tmp_path / "staging"))
    os.makedirs(s.tmp)
    files = [str(tmp_path / f"{name}.csv") for name in ("a", "b")]
    for path in files:
        with open(path, "w") as fh:
            fh.write("user_id,url,ts\nu1,x,1700000000\n")

    def call(batch, s, named):
        with raydata._running(s):
            paths = set(batch.column(raydata.PATH).to_pylist())
            deadline = time.monotonic() + 60
            if any(p.endswith("b.csv") for p in paths):
                open(os.path.join(s.tmp, "started"), "w").close()
            while any(p.endswith("b.csv") for p in paths) and time.monotonic() < deadline:  # b's runs until asked
                try:
                    s.go_on()
                except passes.Stopped:
                    open(os.path.join(s.tmp, "asked"), "w").close()
                    raise
                time.sleep(0.05)
            return raydata._table([raydata._Part(named[paths.pop()], "", passes.Spilled("", np.zeros(0, np.int32)))])

    parts = raydata._parts(files, s, call, {"s": s}, tasks=2)
    assert next(parts).first == files[0]
    while not os.path.exists(os.path.join(s.tmp, "started")):  # b's call under way
        time.sleep(0.05)
    started = time.monotonic()
    parts.close()  # the caller stops early
    assert time.monotonic() - started < 30
    assert os.path.exists(s.stop_path())
    left = os.listdir(os.path.join(s.tmp, raydata.RUNNING))
    if os.path.exists(os.path.join(s.tmp, "asked")):  # b's call read the stop file and ended itself
        assert left == []
    else:  # its process was killed by Ray Data's close: gone, with its marker
        assert len(left) == 1 and not psutil.pid_exists(int(left[0].rsplit("-", 2)[1])), left


def test_an_execution_a_ctrl_c_catches_starting_is_shut_down_with_pass_2(ray_cluster, tmp_path, monkeypatch):
    """A Ctrl-C that lands while Ray Data starts an execution (inside iter_batches, before the iterator's
    own clean-up is set) leaves it running: pass 2 shuts it down as it stops, so that Ray Data's finalizer
    does not end it at the interpreter's exit, after Ray, with a traceback under the command's last line
    (a CI run's `test_ctrl_c_during_a_parallel_prepare_leaves_nothing[data]`)."""
    import os
    import time

    import pytest
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    from doc2vec_dist import passes, raydata, read_files

    s = passes.Settings(read_files.Options("events", "user_id", "url", "ts"), str(tmp_path / "staging"))
    os.makedirs(s.tmp)
    path = str(tmp_path / "a.csv")
    with open(path, "w") as fh:
        fh.write("user_id,url,ts\nu1,x,1700000000\n")

    def call(batch, s, named):  # runs until asked to stop, so that the execution is still under way
        with raydata._running(s):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                s.go_on()
                time.sleep(0.05)

    started, execute = [], StreamingExecutor.execute

    def interrupted(self, *args, **kwargs):  # the execution starts; the Ctrl-C lands before anything else
        execute(self, *args, **kwargs)
        started.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(StreamingExecutor, "execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        next(raydata._parts([path], s, call, {"s": s}, tasks=1))
    assert len(started) == 1 and started[0]._shutdown
    started[0].join(10)
    assert not started[0].is_alive() and not raydata._executions()
    assert os.listdir(os.path.join(s.tmp, raydata.RUNNING)) == []


def test_the_clean_up_waits_for_a_ray_data_thread_that_took_the_ident_of_a_thread_since_ended():
    """_ending tells the threads started during the pass from those before it by the threads themselves: a
    thread's ident is taken by the next one to start as soon as it ends (glibc reuses its stack), so a Ray
    Data thread of the pass could pass for one that was already there and be left running while Ray shuts
    down (a busy-core test run: a Ctrl-C of `prepare --engine data` still running 120 s later)."""
    import threading
    import time

    go = threading.Event()
    old = threading.Thread(target=go.wait, name="before the pass")
    old.start()
    before = set(threading.enumerate())
    go.set()
    old.join()
    for _ in range(50):  # (an ident is reused at once here; a few tries where it is not)
        done = threading.Event()
        new = threading.Thread(target=lambda d=done: (time.sleep(0.5), d.set()), name=raydata.ITERATION_THREADS[0])
        new.start()
        if new.ident == old.ident:
            break
        new.join()
    assert new.ident == old.ident
    raydata._ending(before, time.monotonic() + 10)
    assert done.is_set() and not new.is_alive()


def test_a_ray_data_generator_held_by_the_ctrl_c_under_another_exception_is_closed():
    """A Ctrl-C raised in a frame of Ray Data's, then another exception raised while handling it: the
    Ctrl-C's traceback, reached only through __context__, holds the finished frame that holds the
    generator feeding an iteration thread. _release clears it, and the generator's own clean-up runs
    (Ray Data's iter_threaded sets its stop event there, which is what lets its thread go)."""
    import sys

    closed = []

    def feeding():
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    def ray_datas_frame():
        feed = feeding()
        next(feed)
        raise KeyboardInterrupt

    def _with_a_handler():
        try:
            ray_datas_frame()
        except KeyboardInterrupt:
            raise RuntimeError("raised while handling the Ctrl-C") from None

    try:
        _with_a_handler()
    except RuntimeError:
        caught = sys.exc_info()[1]
    assert closed == [] and isinstance(caught.__context__, KeyboardInterrupt)
    raydata._release(caught)
    assert closed == [True]
