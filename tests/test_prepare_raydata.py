"""prepare --parallel --engine data (issue 30): passes 1 and 2 through Ray Data (read_parquet/read_csv and
map_batches) give the corpus, the skips and the errors of the single process, on the sample, a generated
corpus, a file whose skips lie in a later Ray Data block, and Parquet on the S3 emulator. On the
session's Ray (2 CPUs)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import corpus_meta
from test_prepare_parallel import SAMPLE_EVENTS, _bad_inputs, _both, generated, s3_events  # noqa: F401 (fixtures)

from doc2vec_dist import passes, raydata, readers
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import CorpusError
from doc2vec_dist.prepare import prepare


def test_the_sample_through_ray_data_is_the_single_process_corpus(ray_cluster, tmp_path):
    one, _ = _both([SAMPLE_EVENTS], tmp_path, "sample", holdout=True, engine="data", time_col="ts", num_shards=3)
    assert corpus_meta(one)["heldout_pairs"] > 0


def test_documents_keep_their_order_wherever_ray_data_blocks_begin(ray_cluster, tmp_path, monkeypatch):
    """Tokens out of the vocabulary (min_count 5) and Ray Data blocks of 256 KiB, which begin elsewhere
    than the batches one process reads: each document is still numbered where its user first appears,
    as one process numbers it (passes.keep_mask keeps each key's first row of every batch)."""
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 256 << 10)
    one, _ = _both([SAMPLE_EVENTS], tmp_path, "rare", engine="data", time_col="ts", num_shards=2, min_count=5)
    assert corpus_meta(one)["skipped"]["tokens_below_min_count"] > 0


def test_a_generated_corpus_through_ray_data_is_the_same_with_the_same_skips(ray_cluster, generated, tmp_path):  # noqa: F811
    """Five Parquet files (one of them in row groups, its times numbers in milliseconds) and a CSV file
    of rows to skip, read as one dataset: the corpus, the skips and where they are, as one process."""
    one, _ = _both([generated], tmp_path, "gen", holdout=True, engine="data", time_col="ts",
                   memory_budget_bytes=200_000)
    meta = corpus_meta(one)
    assert meta["num_shards"] > 3
    assert meta["skipped_where"] == {"null_keys": [f"{generated}/zz.csv row 0"]}
    assert meta["stripped_where"] == {"user_id": [f"{generated}/zz.csv row 2"], "url": [f"{generated}/zz.csv row 2"]}


def test_skips_in_a_later_ray_data_block_are_named_at_their_rows_of_the_file(ray_cluster, tmp_path, monkeypatch):
    """A file that Ray Data reads as several blocks (of 64 KiB here), with null keys and stripped tokens past
    its first block: each block is read as if it began the file, and the driver moves what it found to
    its real rows."""
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 64 << 10)
    path = str(tmp_path / "e.parquet")
    n = 40_000
    users = [f"u{i % 997}" for i in range(n)]
    urls = [f"https://{i % 301}.example/" for i in range(n)]
    for i in (25_001, 33_333, 39_999):
        users[i] = None
    urls[30_000] = " https://1.example/ "
    pq.write_table(pa.table({"user_id": users, "url": urls, "ts": list(range(1_700_000_000, 1_700_000_000 + n))}),
                   path, row_group_size=5_000)
    s = passes.Settings(readers.Options("events", "user_id", "url", "ts"), str(tmp_path))
    assert len(raydata.count([path], s, 2)) > 1  # the file is several Ray Data blocks
    one, _ = _both([path], tmp_path, "later", engine="data", time_col="ts")
    meta = corpus_meta(one)
    assert meta["skipped_where"] == {"null_keys": [f"{path} row {i}" for i in (25_001, 33_333, 39_999)]}
    assert meta["stripped_where"] == {"url": [f"{path} row 30000"]}


def test_parquet_on_object_storage_through_ray_data_is_the_single_process_corpus(ray_cluster, s3_events, tmp_path):  # noqa: F811
    uri, files, _ = s3_events
    folder, query = uri.split("?")
    objects = [f"{folder}/part-{i:05d}.parquet?{query}" for i in range(len(files))]
    _both(objects, tmp_path, "s3", engine="data", time_col="ts")


def _corrupt_late_times(tmp_path) -> list[str]:
    """A file whose times are milliseconds for 6 rows, then sequence numbers."""
    path = str(tmp_path / "mixed.parquet")
    times = [1_700_000_000_000 + i for i in range(6)] + [100 + i for i in range(6)]
    pq.write_table(pa.table({"user_id": [f"u{i % 3}" for i in range(12)], "url": [f"a{i % 4}" for i in range(12)],
                             "ts": times}), path, row_group_size=3)
    return [path]


def _two_kinds_of_time(tmp_path) -> list[str]:
    paths = [str(tmp_path / "ms.parquet"), str(tmp_path / "order.parquet")]
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "url": ["a", "b"], "ts": [1_700_000_000_000, 1_700_000_000_001]}),
                   paths[0])
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "url": ["a", "b"], "ts": [1, 2]}), paths[1])
    return paths


def _bad_utf8_in_a_later_file(tmp_path) -> list[str]:
    paths = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    with open(paths[0], "wb") as fh:
        fh.write(b"user_id,url,ts\nu1,a,1700000000\nu2,b,1700000001\n")
    with open(paths[1], "wb") as fh:
        fh.write(b"user_id,url,ts\nu1,a,1700000000\nu2,b\xff,1700000001\n")
    return paths


@pytest.mark.parametrize("inputs", [_bad_inputs, _corrupt_late_times, _two_kinds_of_time, _bad_utf8_in_a_later_file])
def test_errors_through_ray_data_are_the_single_processs(ray_cluster, tmp_path, inputs):
    """A missing column and a file that is not Parquet (Ray Data cannot read them: the tasks read them
    again), times of another unit later in a file, two kinds of time, invalid UTF-8: the message one
    process gives, and nothing left at --out."""
    paths = inputs(tmp_path)
    messages = []
    for parallel, engine in ((1, "tasks"), (2, "data")):
        with pytest.raises(CorpusError) as e:
            prepare(paths, str(tmp_path / "out"), PrepareConfig(time_col="ts", parallel=parallel, engine=engine),
                    progress=False)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and messages[0].startswith(paths[-1] if inputs is not _bad_inputs else paths[1])
    assert not (tmp_path / "out").exists()


def test_inputs_ray_data_does_not_read_run_as_ray_tasks(ray_cluster, tmp_path, logged):
    path = tmp_path / "e.jsonl"
    path.write_text('{"user_id": "u1", "url": "a"}\n{"user_id": "u2", "url": "b"}\n')
    corpus = prepare([str(path)], str(tmp_path / "c"), PrepareConfig(parallel=2, engine="data"), progress=False)
    assert corpus.meta["engine"] == "tasks"
    said = [r.getMessage() for r in logged.records if r.levelno == logging.INFO and "--engine data" in r.getMessage()]
    assert said == ["prepare: --engine data: json input is read by Ray tasks; passes 1 and 2 run as Ray tasks"]
