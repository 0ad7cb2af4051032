"""prepare --parallel (issue 30): the passes as Ray tasks give the corpus, the held-out file and the report
of the single process, on the bundled sample, a generated corpus read in many blocks, text, and a refresh;
errors are the ones the single process names; a task whose process dies is run again; an interrupted run
leaves nothing. On the session's Ray (2 CPUs), except where a run needs its own (a subprocess)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_same_corpus, corpus_meta, corpus_tables, free_ports

from doc2vec_dist import passes, read_files, read_formats, readers
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import CorpusError
from doc2vec_dist.errors import UserError
from doc2vec_dist.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")


def _both(inputs, tmp_path, name: str, holdout: bool = False, engine: str = "tasks", **settings) -> tuple[str, str]:
    """The corpus made in this process and by 2 Ray tasks at a time (engine data: passes 1 and 2 through
    Ray Data), compared; their paths."""
    made = []
    for parallel in (1, 2):
        out = str(tmp_path / f"{name}-{parallel}")
        extra = {"holdout": 0.2, "holdout_out": out + ".parquet"} if holdout else {}
        if parallel > 1:
            extra["engine"] = engine
        corpus = prepare(inputs, out, PrepareConfig(parallel=parallel, **settings, **extra), progress=False)
        assert corpus.meta["parallel"] == parallel
        assert corpus.meta["engine"] == ("process" if parallel == 1 else engine)
        made.append(out)
    assert_same_corpus(*made, heldout=tuple(m + ".parquet" for m in made) if holdout else None)
    return made[0], made[1]


def test_the_sample_prepared_by_ray_tasks_is_the_single_process_corpus(ray_cluster, tmp_path, logged):
    one, _ = _both([SAMPLE_EVENTS], tmp_path, "sample", holdout=True, time_col="ts", num_shards=3)
    assert corpus_meta(one)["num_shards"] == 3 and corpus_meta(one)["heldout_pairs"] > 0
    # what the tasks ask of the nodes, said once: each task's reservation, the job's, the largest node's share
    said = [r.getMessage() for r in logged.records if "Ray memory" in r.getMessage()]
    assert len(said) == 1, said
    each, whole, fits = map(float, re.match(r"prepare: each partition and shard task reserves ([\d.]+) GiB of Ray "
                                            r"memory; 2 at once need ([\d.]+) GiB across the cluster; the largest "
                                            r"node \([\d.]+ GiB\) runs up to (\d+) at once", said[0]).groups())
    assert each > 0 and whole == pytest.approx(2 * each, abs=0.011) and fits >= 1


def test_the_memory_line_counts_tasks_and_the_largest_node():
    from doc2vec_dist.prepare_merge import task_memory_line

    assert task_memory_line(1 << 30, 4, 10 << 30) == ("prepare: each partition and shard task reserves 1.00 GiB of "
                                                      "Ray memory; 4 at once need 4.00 GiB across the cluster; the "
                                                      "largest node (10.0 GiB) runs up to 10 at once")
    assert task_memory_line(1 << 30, 1, None).endswith("1 at once need 1.00 GiB across the cluster")


@pytest.mark.parametrize("parallel", [1, 2])
def test_one_progress_bar_for_the_whole_job(ray_cluster, tmp_path, capsys, parallel):
    """One bar from the first pass to the last (not one per pass), in input rows, that ends full."""
    prepare([SAMPLE_EVENTS], str(tmp_path / "c"), PrepareConfig(time_col="ts", num_shards=3, parallel=parallel),
            progress=True, report=False)
    err = capsys.readouterr().err  # (with log lines too, once a command run in this session sent them there)
    bars = [line for line in err.split("\n") if "%|" in line]
    assert len(bars) == 1, err  # a bar ends its line when it closes
    frames = [f for f in bars[0].split("\r") if f.strip()]
    assert all(f.startswith("prepare") for f in frames), frames
    assert {f.split(":")[0] for f in frames} >= {"prepare 1/3 count", "prepare 3/3 shards"}
    assert frames[-1].startswith("prepare 3/3 shards: 100%"), frames[-1]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A generated corpus in 4 Parquet files, one more file of the same kind of events in row groups of
    2,000 rows with its times in epoch milliseconds, and a CSV file with bad rows to skip."""
    from doc2vec_dist.synthetic import generate

    root = tmp_path_factory.mktemp("generated")
    generate(str(root / "gen"), 4_000, 600, users_per_file=1_000, events_per_user=12, seed=3, progress=False)
    events = root / "gen" / "events"
    extra = pq.read_table(events / "part-00001.parquet").slice(0, 9_000)
    extra = extra.set_column(2, "ts", pa.array(extra["ts"].cast(pa.int64()).to_numpy() + 7))  # ms, not the same events
    pq.write_table(extra.set_column(0, "user_id", pa.array([f"x{u}" for u in extra["user_id"].to_pylist()])),
                   events / "part-00009.parquet", row_group_size=2_000)
    rows = ["user_id,url,ts", ",https://a.example/,1700000000", "u9,,1700000001", " u9 ,https://a.example/ ,1700000002",
            "u9,https://a.example/,1700000002", "u10,https://b.example/,"]
    (events / "zz.csv").write_text("\n".join(rows) + "\n")
    return str(events)


def test_a_generated_corpus_read_in_many_blocks_is_the_same(ray_cluster, generated, tmp_path, monkeypatch):
    """Five Parquet files, one of them read as blocks of row groups (its numeric times' unit carried from
    its first block to the others), and a CSV file of skips: the same corpus, the same skips and where."""
    monkeypatch.setattr(readers, "BLOCK_ROWS", 4_000)
    blocks = readers.plan_blocks(read_files.expand_inputs([generated], "events"),
                                 read_files.Options("events", "user_id", "url", "ts"))
    assert [b.row_groups for b in blocks if not b.whole_file] == [(0, 1), (2, 3), (4,)]
    one, _ = _both([generated], tmp_path, "gen", holdout=True, time_col="ts", memory_budget_bytes=200_000)
    meta = corpus_meta(one)
    assert meta["num_shards"] > 3
    skipped = {k: v for k, v in meta["skipped"].items() if v}
    assert skipped == {"null_keys": 1, "null_tokens": 1, "duplicate_events": 1}
    assert meta["skipped_where"] == {"null_keys": [f"{generated}/zz.csv row 0"]}
    assert meta["stripped_where"] == {"user_id": [f"{generated}/zz.csv row 2"], "url": [f"{generated}/zz.csv row 2"]}
    assert list(meta["time_read"]) == ["timestamps (ms, UTC)", "epoch milliseconds (detected)",
                                       "epoch seconds (detected)"]


def test_documents_are_numbered_where_their_user_first_appears_whatever_the_batch_size(tmp_path, monkeypatch):
    """Tokens out of the vocabulary (min_count 5): a user whose first events are rare URLs is numbered
    where it first appears, whether the Parquet file is read in batches of 256k rows or of 1,000 (pass 2
    keeps each key's first row of a batch, passes.keep_mask), so batch sizes never change the ids."""
    made = []
    for rows in (read_formats.PARQUET_BATCH_ROWS, 1_000):
        monkeypatch.setattr(read_formats, "PARQUET_BATCH_ROWS", rows)
        made.append(prepare([SAMPLE_EVENTS], str(tmp_path / f"b{rows}"),
                            PrepareConfig(time_col="ts", num_shards=2, min_count=5), progress=False).path)
    assert corpus_meta(made[0])["skipped"]["tokens_below_min_count"] > 0
    assert_same_corpus(*made)


def test_text_files_keep_their_line_numbers_as_keys(ray_cluster, tmp_path):
    paths = []
    for i, lines in enumerate([["a b c", "b c", "", "c d"], ["d e", "a a a"], ["e f g h", "f"]]):
        paths.append(str(tmp_path / f"t{i}.txt"))
        with open(paths[-1], "w") as fh:
            fh.write("\n".join(lines) + ("\n" if i != 1 else ""))  # the second ends without a newline
    one, _ = _both(paths, tmp_path, "text", format="text", num_shards=2)
    keys = corpus_tables(one)["docs.arrow"]["key"].to_pylist()
    assert sorted(keys, key=int) == ["0", "1", "3", "4", "5", "6", "7"]  # line 2 is empty: no document


@pytest.fixture(scope="module")
def days(generated, tmp_path_factory):
    """The generated events split in time: a base corpus of the first part, and the days after it."""
    root = tmp_path_factory.mktemp("days")
    table = pa.concat_tables(pq.read_table(os.path.join(generated, f"part-0000{i}.parquet")) for i in range(4))
    seconds = table["ts"].cast(pa.int64()).to_numpy() / 1000
    cut = np.quantile(seconds, 0.7)
    found = {"old": str(root / "old.parquet"), "new": str(root / "new.parquet")}
    pq.write_table(table.filter(pa.array(seconds < cut)), found["old"])
    new = table.filter(pa.array(seconds >= cut))
    pq.write_table(new, found["new"], row_group_size=3_000)
    found["base"] = prepare([found["old"]], str(root / "base"), PrepareConfig(time_col="ts", num_shards=3),
                            progress=False).path
    found["again"] = str(root / "again.parquet")  # the base's events sent again, read in several blocks
    pq.write_table(pq.read_table(found["old"]), found["again"], row_group_size=3_000)
    return found


def assert_files_in_base(corpus: str, days: dict, window: bool = False) -> None:
    """corpus.json's refresh.files of a refresh of days["new"] then days["again"] on days["base"]: the events
    sent again counted for their file (read in several blocks) alone, with the report's line naming it
    alone; in a window, those of them inside it, taken to be the base's as events at or before its latest
    time, and not named (a window does not read the base's documents)."""
    from doc2vec_dist.prepare_report import refresh_report

    meta = corpus_meta(corpus)
    events = pq.read_metadata(days["again"]).num_rows
    if window:  # the window holds the last of them
        events = meta["refresh"]["files"][0]["events"]
        assert 0 < events < pq.read_metadata(days["again"]).num_rows
    counts = {"in_base": 0, "not_after_base": events} if window else {"in_base": events, "not_after_base": 0}
    assert meta["refresh"]["files"] == [{"file": days["again"], "events": events, **counts}]
    named = [line for _, line in refresh_report(meta) if "cumulative" in line]
    assert named == ([] if window else [(f"{days['again']} looks like a cumulative export: {events:,} of its "
                                        f"{events:,} events (100%) were in the base already (the same user, URL and "
                                        "time): dropped, so the documents hold each event once; 0 are new")])


@pytest.mark.parametrize("how", ["joined by shard", "re-bucketed", "window"])
def test_a_refresh_by_ray_tasks_is_the_single_process_refresh(ray_cluster, days, tmp_path, monkeypatch, how):
    monkeypatch.setattr(readers, "BLOCK_ROWS", 5_000)
    settings = {"joined by shard": {}, "re-bucketed": {"num_shards": 4}, "window": {"window_days": 12}}[how]
    inputs = [days["new"], days["again"]]  # and the base's events again: counted for their file alone
    one, parallel = _both(inputs, tmp_path, "refresh", time_col="ts", base=days["base"], **settings)
    assert_files_in_base(one, days, window=how == "window")
    base, found = corpus_tables(days["base"]), corpus_tables(parallel)
    for name, column in (("docs.arrow", "key"), ("vocab.arrow", "token")):  # every id kept, new ones after
        known = base[name].num_rows
        assert found[name].slice(0, known)[column].equals(base[name][column]) and found[name].num_rows >= known
        assert found[name]["id"].to_pylist() == list(range(found[name].num_rows))
    refresh = corpus_meta(one)["refresh"]
    assert refresh["new_docs"] > 0 and refresh["grown_docs"] > 0
    assert ("changed.arrow" in corpus_tables(one)) and refresh["mode"] == ("window" if how == "window" else "join")


@pytest.fixture(scope="module")
def s3_events():
    """The sample's events, and a gzipped CSV of a few more, on a loopback S3 server (moto's, as
    tests/test_storage_s3.py runs it): the URI of their folder. Credentials: conftest's, which the
    session's Ray workers inherit."""
    import glob
    import gzip
    import logging

    import pyarrow.fs as pafs
    from moto import server as moto_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port, = free_ports(1)  # not from the ephemeral range: see free_ports
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
        fs.create_dir("logs")
        files = sorted(glob.glob(os.path.join(SAMPLE_EVENTS, "*.parquet")))
        for path in files:
            with open(path, "rb") as src, fs.open_output_stream(f"logs/events/{os.path.basename(path)}") as dst:
                dst.write(src.read())
        csv = b"user_id,url,ts\nu1,https://a.example/,1700000000000\nu2,https://b.example/,1700000001000\n"
        with fs.open_output_stream("logs/events/zz.csv.gz", compression=None) as dst:  # gzipped already
            dst.write(gzip.compress(csv))
        with fs.open_output_stream("logs/events/_SUCCESS") as dst:
            dst.write(b"")
        yield f"s3://logs/events?endpoint_override=127.0.0.1:{port}&scheme=http", files, csv
    finally:
        server.stop()


def test_events_read_from_object_storage_by_ray_tasks_make_the_local_files_corpus(ray_cluster, s3_events, tmp_path):
    """prepare s3://bucket/folder (its Parquet files and a gzipped CSV, not its _SUCCESS), in this
    process and by Ray tasks that read the objects themselves: the corpus of the same files on disk."""
    uri, files, csv = s3_events
    local = tmp_path / "local"
    local.mkdir()
    (local / "zz.csv").write_bytes(csv)
    on_disk = prepare(files + [str(local / "zz.csv")], str(tmp_path / "disk"), PrepareConfig(time_col="ts"),
                      progress=False).path
    single, _ = _both([uri], tmp_path, "s3", time_col="ts")
    assert len(corpus_meta(single)["input_files"]) == len(files) + 1
    assert all(f.startswith("s3://logs/events/") for f in corpus_meta(single)["input_files"])
    one, other = corpus_tables(on_disk), corpus_tables(single)
    assert sorted(one) == sorted(other) and [n for n in one if not one[n].equals(other[n])] == []
    names = ("inputs", "input_files", "time_read")
    assert ({k: v for k, v in corpus_meta(on_disk).items() if k not in names}
            == {k: v for k, v in corpus_meta(single).items() if k not in names})


def _bad_inputs(tmp_path) -> list[str]:
    good = pa.table({"user_id": ["u1", "u2", "u1"], "url": ["a", "b", "c"], "ts": [1_700_000_000] * 3})
    paths = [str(tmp_path / f"{i}.parquet") for i in range(5)]
    pq.write_table(good, paths[0])
    pq.write_table(good.rename_columns(["user_id", "link", "ts"]), paths[1])  # the first bad one
    pq.write_table(good, paths[2])
    with open(paths[3], "wb") as fh:
        fh.write(b"PAR1 not parquet")
    pq.write_table(good, paths[4])
    return paths


def test_of_several_bad_files_the_first_is_named_as_by_one_process(ray_cluster, tmp_path):
    paths = _bad_inputs(tmp_path)
    messages = []
    for parallel in (1, 2):
        with pytest.raises(CorpusError) as e:
            prepare(paths, str(tmp_path / "out"), PrepareConfig(time_col="ts", parallel=parallel), progress=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1] == f"{paths[1]}: column 'url' not found (columns: user_id, link, ts)"
    assert sorted(os.listdir(tmp_path)) == [f"{i}.parquet" for i in range(5)]


def test_a_task_on_a_node_that_does_not_see_the_output_says_so_in_one_line(ray_cluster, tmp_path):
    # prepare leaves its run's token in the staging directory; a task that cannot read it there (a node
    # whose disk is not the driver's) names the directory and its node instead of failing on a missing path
    from doc2vec_dist import runners

    opt = read_files.Options("events", "user_id", "url", None)
    block = readers.plan_blocks([os.path.join(SAMPLE_EVENTS, min(os.listdir(SAMPLE_EVENTS)))], opt)[0]
    elsewhere = tmp_path / "staging"          # what another node finds at that path: a directory of its own
    elsewhere.mkdir()
    (elsewhere / passes.RUN_NAME).write_text("another run")
    settings = passes.Settings(opt, str(elsewhere), run="this run")
    results = list(runners.RayTasks(2).map(passes.count, [(block, settings)]))
    error = results[0][1].error
    assert isinstance(error, CorpusError), results
    assert re.fullmatch(rf"{re.escape(str(elsewhere))}: prepare's staging directory is not on node \S+, where one "
                        r"of its tasks ran: through Ray on several nodes, --out .* storage every node sees .*",
                        str(error)), str(error)
    # the token of the run itself is found, and a prepare leaves no token in the corpus it made
    settings = passes.Settings(opt, str(elsewhere), run="another run")
    (_, counted), = runners.RayTasks(2).map(passes.count, [(block, settings)])
    assert counted.error is None
    out = tmp_path / "made"
    prepare([SAMPLE_EVENTS], str(out), PrepareConfig(parallel=2), progress=False)
    assert passes.RUN_NAME not in os.listdir(out)


def test_a_file_whose_later_block_holds_times_of_another_unit_is_refused_alike(ray_cluster, tmp_path, monkeypatch):
    """The unit of a file's numeric times is its first batch's: a later block of the file, read by a task
    of its own, finds that unit and refuses its sequence numbers as one process does (read alone, they
    would be numbers that only order events, refused for another reason: two kinds of time)."""
    monkeypatch.setattr(readers, "BLOCK_ROWS", 4)
    path = str(tmp_path / "mixed.parquet")
    times = [1_700_000_000_000 + i for i in range(6)] + [100 + i for i in range(6)]
    pq.write_table(pa.table({"user_id": [f"u{i % 3}" for i in range(12)], "url": [f"a{i % 4}" for i in range(12)],
                             "ts": times}), path, row_group_size=3)
    assert len(readers.plan_blocks([path], read_files.Options("events", "user_id", "url", "ts"))) == 2
    messages = []
    for parallel in (1, 2):
        with pytest.raises(CorpusError) as e:
            prepare([path], str(tmp_path / "out"), PrepareConfig(time_col="ts", parallel=parallel), progress=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and messages[0].startswith(
        f"{path}: column 'ts' row 6 holds 100, no epoch time in any unit, but the file's times are epoch "
        "milliseconds by their size")


def test_times_of_two_kinds_in_two_files_are_refused_alike(ray_cluster, tmp_path):
    paths = [str(tmp_path / "ms.parquet"), str(tmp_path / "order.parquet")]
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "url": ["a", "b"], "ts": [1_700_000_000_000, 1_700_000_000_001]}),
                   paths[0])
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "url": ["a", "b"], "ts": [1, 2]}), paths[1])
    messages = []
    for parallel in (1, 2):
        with pytest.raises(CorpusError) as e:
            prepare(paths, str(tmp_path / "out"), PrepareConfig(time_col="ts", parallel=parallel), progress=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and messages[0].startswith(f"{paths[1]}: column 'ts' read as numbers that only")


def test_a_failure_in_a_task_of_the_last_pass_is_the_one_processs_and_leaves_nothing(ray_cluster, days, tmp_path):
    """A base whose shards 0 and 1 were swapped: joining, the tasks of buckets 0 and 1 find users that hash
    to another shard. The error is bucket 0's, as one process reports it, and nothing is left."""
    import shutil

    base = str(tmp_path / "base")
    shutil.copytree(days["base"], base)
    shards = os.path.join(base, "shards")
    os.rename(os.path.join(shards, "part-00000.arrow"), os.path.join(shards, "swap"))
    os.rename(os.path.join(shards, "part-00001.arrow"), os.path.join(shards, "part-00000.arrow"))
    os.rename(os.path.join(shards, "swap"), os.path.join(shards, "part-00001.arrow"))
    messages = []
    for parallel in (1, 2):
        with pytest.raises(CorpusError) as e:
            prepare([days["new"]], str(tmp_path / "out"), PrepareConfig(time_col="ts", base=base, parallel=parallel),
                    progress=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1] == (f"{shards}/part-00000.arrow: holds users whose keys hash to another shard, "
                                          f"though {base}/corpus.json says its shards are by key hash")
    assert os.listdir(tmp_path) == ["base"]


def test_tasks_still_running_when_a_run_stops_end_when_asked_not_cancelled(ray_cluster, tmp_path, monkeypatch):
    """When prepare stops early (an error, Ctrl-C), its running tasks are asked to end through the stop
    file in the staging directory, and are waited for; none is cancelled through Ray, whose cancel
    races a finishing task and can crash the driver (ray-project/ray#54738)."""
    import ray

    from doc2vec_dist.runners import RayTasks

    s = passes.Settings(read_files.Options("events", "user_id", "url", None), str(tmp_path))
    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda *args, **kwargs: cancelled.append(args))

    def task(i: int, s: passes.Settings) -> int:
        deadline = time.monotonic() + 60
        while i and time.monotonic() < deadline:  # the second task runs until asked to stop
            try:
                s.go_on()
            except passes.Stopped:
                open(os.path.join(s.tmp, "asked"), "w").close()
                raise
            time.sleep(0.05)
        return i

    results = RayTasks(2).stopping_with(s.stop_path()).map(task, [(0, s), (1, s)])
    assert next(results) == (0, 0)
    started = time.monotonic()
    results.close()  # the caller stops early
    assert time.monotonic() - started < 30 and os.path.exists(os.path.join(tmp_path, "asked"))
    assert cancelled == []


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "doc2vec_dist", "prepare", *args, "--no-progress"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


@pytest.mark.parametrize("engine", ["tasks", "data"])
def test_a_task_whose_process_dies_is_run_again_by_ray(generated, prepare_faults, tmp_path, engine):
    """The first spill task (engine data: the first Ray Data task of pass 2) kills its own process
    (passes._fault_once), as a lost machine would: Ray runs it again, and the corpus is the single
    process's. On the session's Ray, whose workers carry the hook."""
    single = prepare([generated], str(tmp_path / "single"), PrepareConfig(time_col="ts"), progress=False).path
    (prepare_faults / "once").touch()
    made = prepare([generated], str(tmp_path / "parallel"), PrepareConfig(time_col="ts", parallel=2, engine=engine),
                   progress=False)
    assert (prepare_faults / "died").exists() and not (prepare_faults / "once").exists()  # a task did die, once
    assert made.meta["engine"] == engine
    assert_same_corpus(single, str(tmp_path / "parallel"))


@pytest.mark.parametrize("engine", ["tasks", "data"])
def test_a_task_that_dies_every_time_stops_prepare_after_its_retries(generated, prepare_faults, tmp_path, engine):
    """A spill task whose process always dies (killed for memory on every node, say) is retried a bounded
    number of times, then prepare ends with one error (the command prints it as its one line) and leaves
    nothing: it never retries forever."""
    (prepare_faults / "always").touch()
    out = tmp_path / "parallel"
    with pytest.raises(UserError) as e:
        prepare([generated], str(out), PrepareConfig(time_col="ts", parallel=2, engine=engine), progress=False)
    assert str(e.value).startswith("a task's process died 4 times, so prepare stopped and wrote nothing"), str(e.value)
    assert "\n" not in str(e.value)
    assert not out.exists()


@pytest.mark.parametrize("engine", ["tasks", "data"])
def test_ctrl_c_during_a_parallel_prepare_leaves_nothing(generated, tmp_path, interrupt_when, engine):
    out = tmp_path / "corpus"
    proc = _cli(generated, "--out", str(out), "--time-col", "ts", "--parallel", "2", "--memory-budget-bytes", "100000",
                "--engine", engine)

    def spilling() -> bool:  # pass 2 under way: a spill file in the staging folder
        return any(os.path.isdir(os.path.join(tmp_path, d, "spill")) and os.listdir(os.path.join(tmp_path, d, "spill"))
                   for d in os.listdir(tmp_path))

    err = interrupt_when(proc, spilling, within=180)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
    time.sleep(1)  # a task killed now would have had its last chance to write
    assert os.listdir(tmp_path) == []


LATE_THREAD = """
import os, runpy, sys, threading, time
import ray
from ray.data._internal.execution import streaming_executor

original, seen = streaming_executor.StreamingExecutor.shutdown, sys.argv.pop(1)

def shutdown(self, *args, **kwargs):  # the execution's end, in a thread of Ray Data's, then 2 s more of that thread
    done = original(self, *args, **kwargs)
    if threading.current_thread() is not threading.main_thread() and not os.path.exists(seen):
        print("ended", flush=True)
        deadline = time.monotonic() + 2
        while ray.is_initialized() and time.monotonic() < deadline:  # (as Ray Data's own calls go on)
            time.sleep(0.01)
        with open(seen, "w") as fh:
            fh.write(str(ray.is_initialized()))
    return done

streaming_executor.StreamingExecutor.shutdown = shutdown
sys.argv = ["doc2vec-dist", *sys.argv[1:]]
runpy.run_module("doc2vec_dist", run_name="__main__")
"""


def test_ctrl_c_as_a_ray_data_pass_ends_waits_for_its_threads_before_ray_shuts_down(ray_cluster, generated, tmp_path,
                                                                                   interrupt_when):
    """A Ctrl-C landing as pass 2's Ray Data execution ends: the thread of Ray Data's that read its last block
    still ends it, calling Ray. Once, in a full test run, Ray was shut down under it and the process ended with
    status 1 ("The core worker has already been shutdown"), not 130. The command waits for that thread: here
    the thread lingers 2 s after the execution's end and looks whether Ray is still up. (On the session's Ray:
    the command's own connection is what it shuts down under the thread, as with a Ray of its own.)"""
    out, seen = tmp_path / "corpus", tmp_path / "seen"
    proc = subprocess.Popen([sys.executable, "-c", LATE_THREAD, str(seen), "prepare", generated, "--out", str(out),
                             "--time-col", "ts", "--parallel", "2", "--engine", "data", "--no-progress",
                             "--address", ray_cluster.get_runtime_context().gcs_address], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    err = interrupt_when(proc, lambda: proc.stdout.readline().strip() == "ended", within=180)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
    assert seen.read_text() == "True"  # Ray was still up when Ray Data's thread was done with it
    assert os.listdir(tmp_path) == ["seen"]  # no corpus, no staging folder


def test_the_prepare_benchmark_times_1_and_2_processes_and_finds_the_same_corpus(tmp_path, capsys):
    """benchmarks/prepare_benchmark.py on the sample: each run's pass times, its processes (the driver, and
    with 2 the Ray task workers that ran the passes) with their peak memory, the bytes written, and the
    corpora compared."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_benchmark", os.path.join(ROOT, "benchmarks", "prepare_benchmark.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench"
    assert bench.main([SAMPLE_EVENTS, "--out", str(out), "--parallel", "1", "2", "--", "--time-col", "ts"]) == 0
    result = json.loads((out / "result.json").read_text())
    one, two = result["runs"]
    assert two["same_corpus_as_first"] is True and os.listdir(out) == ["result.json"]
    for run in (one, two):
        assert set(run["pass_seconds"]) == {"plan", "count", "partition", "shards", "total"}
        assert run["bytes_written"] > 100_000 and run["docs"] == 5_000
        assert run["processes"][0]["peak_rss_bytes"] == max(p["peak_rss_bytes"] for p in run["processes"])
    assert [p["what"] for p in one["processes"]] == ["driver"]
    workers = [p for p in two["processes"] if p["what"] == "task worker"]
    assert workers and all(p["peak_rss_bytes"] > 0 for p in workers)  # (which tasks each ran: as sampled)
    assert "raylet" in {p["what"] for p in two["processes"]}


# --- issue 50: one process where Ray tasks would not pay -------------------------------------------------------

def test_a_task_per_cpu_on_a_small_input_is_this_process_and_says_so(ray_cluster, tmp_path, logged):
    """A 200k-user prepare took 13 s in one process and 17 s as 2 Ray tasks here: on a small input --parallel 0
    (every CPU, the jobs' default on a cluster) is one process, said in one line; --parallel 2 is as asked."""
    corpus = prepare([SAMPLE_EVENTS], str(tmp_path / "c"), PrepareConfig(time_col="ts", parallel=0), progress=False)
    assert corpus.meta["parallel"] == 1 and corpus.meta["engine"] == "process"
    said = [r.getMessage() for r in logged.records if "where Ray tasks were measured to pay" in r.getMessage()]
    size = read_files.input_bytes(read_files.expand_inputs([SAMPLE_EVENTS], "events")) / 2**20
    assert said == [(f"prepare: {size:,.1f} MiB of input, below the 96.0 MiB where Ray tasks were measured to pay "
                     "for their start: preparing it in this process (--parallel N runs N tasks whatever the size)")]
    logged.clear()
    corpus = prepare([SAMPLE_EVENTS], str(tmp_path / "c2"), PrepareConfig(time_col="ts", parallel=2), progress=False)
    assert corpus.meta["parallel"] == 2 and corpus.meta["engine"] == "tasks"
    assert next(r.getMessage() for r in logged.records if "measured to pay" in r.getMessage()).endswith(
        "running 2 tasks as asked (one process would be sooner)")


def test_a_task_per_cpu_is_kept_where_the_input_is_big_enough_to_pay():
    from doc2vec_dist.prepare_merge import PARALLEL_MIN_INPUT_BYTES, processes_that_pay

    assert processes_that_pay(0, PARALLEL_MIN_INPUT_BYTES) == (0, None)
    assert processes_that_pay(0, PARALLEL_MIN_INPUT_BYTES - 1)[0] == 1
    assert processes_that_pay(4, 10 * PARALLEL_MIN_INPUT_BYTES) == (4, None)
    assert processes_that_pay(4, 1000)[0] == 4
    for one in (None, 1):
        assert processes_that_pay(one, 1000) == (one, None)
