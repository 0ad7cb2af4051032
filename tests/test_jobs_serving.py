"""jobs/export.py and jobs/index.py on the session's Ray: the per-part work runs as Ray tasks."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pyarrow.parquet as pq
from conftest import load_benchmark

from doc2vec_dist import modeldir, pipeline
from doc2vec_dist.modeldir import ModelDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_export_job_writes_a_part_file_per_shard_from_ray_tasks(ray_cluster, trained_model, tmp_path, capsys):
    out = tmp_path / "users"
    assert pipeline.export_job(["--model", trained_model, "--out", str(out), "--normalize", "--no-progress"]) == 0

    printed = capsys.readouterr().out
    assert re.search(r"exported 5,000 rows of docs to .* rows/s\) by 2 Ray tasks on ", printed), printed
    # a single .parquet file, or the projector's, is written by this process: said so (it said "by 2 tasks on vm",
    # and "by 0 tasks on " for the projector)
    for name, fmt in (("one.parquet", "parquet"), ("proj", "projector")):
        assert pipeline.export_job(["--model", trained_model, "--out", str(tmp_path / name), "--format", fmt,
                                    "--no-progress"]) == 0
        assert "rows/s) in this process (one writer: " in capsys.readouterr().out
    assert sorted(os.listdir(out)) == [".doc2vec-dist.json", "part-00000.parquet", "part-00001.parquet"]
    table = pq.read_table(out)
    assert table.num_rows == 5000 and sorted(table.column("key").to_pylist()) == sorted(
        ModelDir(trained_model).keys("docs").to_pylist())
    vectors = modeldir.matrix_of(table.column("vector"), 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_export_job_tasks_run_in_ray_worker_processes(ray_cluster, trained_model, tmp_path):
    from doc2vec_dist.export import export
    from doc2vec_dist.runners import run_on_ray

    result = export(trained_model, "docs", str(tmp_path / "w2v.txt"), format="word2vec", progress=False,
                    runner=run_on_ray)
    assert [t["part"] for t in result["tasks"]] == [0, 1]
    assert all(t["pid"] != os.getpid() for t in result["tasks"])  # not threads of this process
    with open(tmp_path / "w2v.txt") as fh:
        assert fh.readline() == "5000 32\n"
        assert sum(1 for _ in fh) == 5000


def test_an_error_inside_a_ray_task_is_one_clear_line(ray_cluster, trained_model, tmp_path, capsys):
    model = shutil.copytree(trained_model, str(tmp_path / "model"))
    vdir, manifest = modeldir.load_manifest(model)
    part = os.path.join(vdir, manifest["tables"]["docs"]["parts"][1]["path"])
    with open(part, "r+b") as fh:
        fh.seek(os.path.getsize(part) // 2)
        fh.write(b"\x00\xff\x00\xff")
    assert pipeline.export_job(["--model", model, "--out", str(tmp_path / "users"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "checksum mismatch" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["model"]  # nothing half-written


def test_index_job_builds_ivfpq_with_ray_tasks_and_reports_recall(ray_cluster, trained_model, tmp_path, capsys):
    out = tmp_path / "users.index"
    assert pipeline.index_job(["--model", trained_model, "--kind", "ivfpq", "--out", str(out),
                                   "--no-progress"]) == 0

    printed = capsys.readouterr().out
    recall = float(re.search(r"recall@10 vs exact: (\d\.\d+)", printed).group(1))
    assert recall >= 0.93 and "peak memory" in printed and "4 Ray tasks on " in printed
    params = json.loads((out / "params.json").read_text())
    assert [(t["step"], t["unit"]) for t in params["tasks"]] == [("stage", 0), ("stage", 1), ("encode", 0),
                                                                 ("encode", 1)]
    assert all(t["pid"] != os.getpid() for t in params["tasks"])
    assert sorted(os.listdir(out)) == [".doc2vec-dist.json", "index.faiss", "keys.parquet", "params.json", "vectors.npy"]


def test_index_job_from_a_parquet_of_vectors(ray_cluster, trained_model, tmp_path, capsys):
    from doc2vec_dist.export import export

    vectors = str(tmp_path / "users")
    export(trained_model, "docs", vectors, progress=False)
    assert pipeline.index_job(["--vectors", vectors, "--kind", "flat", "--out", str(tmp_path / "idx"),
                                   "--no-progress"]) == 0
    assert "recall@10 vs exact: 1.000" in capsys.readouterr().out


def test_index_job_without_a_source_is_a_clear_error(ray_cluster, tmp_path, capsys):
    assert pipeline.index_job(["--out", str(tmp_path / "idx")]) == 2
    assert "either --model" in capsys.readouterr().err


def test_index_job_updates_an_index_staging_the_new_source_in_ray_tasks(ray_cluster, tmp_path, capsys):
    import pyarrow as pa

    rng = np.random.default_rng(0)
    keys, vectors = [f"u{i}" for i in range(600)], rng.standard_normal((600, 8)).astype(np.float32)

    def write(name: str, keys: list[str], vectors: np.ndarray) -> str:
        os.makedirs(tmp_path / name)
        for part, rows in enumerate((slice(0, 300), slice(300, None))):  # two files: two stage tasks
            pq.write_table(pa.table({"key": keys[rows], "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors[rows].ravel()), 8)}), str(tmp_path / name / f"part-{part}.parquet"))
        return str(tmp_path / name)

    day0 = write("day0", keys, vectors)
    changed = vectors.copy()
    changed[::20] = rng.standard_normal((30, 8))
    day1 = write("day1", keys + [f"n{i}" for i in range(20)],
                 np.concatenate([changed, rng.standard_normal((20, 8)).astype(np.float32)]))
    out = str(tmp_path / "users.index")
    assert pipeline.index_job(["--vectors", day0, "--kind", "hnsw", "--out", out, "--no-progress"]) == 0
    capsys.readouterr()

    assert pipeline.index_job(["--update", out, "--vectors", day1, "--out", out, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"updated from {out}: 20 added, 30 replaced, 0 removed, 570 unchanged" in printed, printed
    assert "2 Ray tasks on " in printed
    with open(os.path.join(out, "params.json")) as fh:
        params = json.load(fh)
    assert [(t["step"], t["unit"]) for t in params["tasks"]] == [("stage", 0), ("stage", 1)]
    assert all(t["pid"] != os.getpid() for t in params["tasks"])
    assert (params["kind"], params["rows"], params["dead"]) == ("hnsw", 620, 30)


def test_serving_benchmark_updates_the_base_index_to_a_refreshed_model(tmp_path, capsys):
    """benchmarks/serving_benchmark.py --steps ivfpq,update: the refreshed model keeps every row but the moved
    share bit for bit and appends the new ones, so the update replaces about that share, adds exactly
    the new rows, and is timed against a rebuild of the same model."""
    work = str(tmp_path / "work")
    assert load_benchmark("serving_benchmark").main(["--rows", "5000", "--dim", "16", "--parts", "2", "--clusters", "50",
                                               "--steps", "ivfpq,update", "--changed", "0.3", "--new", "0.02",
                                               "--work", work]) == 0
    with open(os.path.join(work, "results.json")) as fh:
        update = json.load(fh)["update"]
    counts = update["update"]["update"]
    assert counts["added"] == 100 and counts["removed"] == 0
    assert 1200 < counts["replaced"] < 1800 and counts["replaced"] + counts["unchanged"] == 5000
    assert update["ratio"] == round(update["update"]["seconds"] / update["rebuild"]["seconds"], 3)
    assert min(update["update"]["recall_at_10_vs_exact"], update["rebuild"]["recall_at_10_vs_exact"]) > 0.8
    assert "index update (ivfpq, 30% of rows moved, 100 new)" in capsys.readouterr().out


# -- issue 26, item 15: a benchmark deletes only what it made ---------------------------------------------

SMALL = ["--rows", "2000", "--dim", "8", "--parts", "2", "--clusters", "20", "--steps", "flat"]


def test_serving_benchmark_refuses_a_work_folder_it_did_not_make(tmp_path, capsys, snapshot):
    work = tmp_path / "mine"
    (work / "model").mkdir(parents=True)  # the user's own, under a name the benchmark writes
    (work / "model" / "LATEST").write_text("v3\n")
    (work / "notes.txt").write_text("the user's notes\n")
    before = snapshot(str(work))
    assert load_benchmark("serving_benchmark").main([*SMALL, "--work", str(work), "--clean"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"error: --work {work}: holds model, notes.txt, and this benchmark did not make it; give a new or "
                   "empty directory (the benchmark replaces what it finds under its own names there, and --clean "
                   "deletes them)")], err
    assert snapshot(str(work)) == before


def test_serving_benchmark_clean_deletes_only_what_it_wrote(tmp_path, capsys):
    work = tmp_path / "work"
    assert load_benchmark("serving_benchmark").main([*SMALL, "--work", str(work)]) == 0
    assert sorted(os.listdir(work)) == [".doc2vec-dist.json", "index-flat", "model", "results.json"]
    (work / "mine.txt").write_text("dropped in by someone\n")
    assert load_benchmark("serving_benchmark").main([*SMALL, "--work", str(work), "--clean"]) == 0  # reuses its model
    assert os.listdir(work) == ["mine.txt"]
    assert f"--clean: left mine.txt in {work}, which the benchmark did not write" in capsys.readouterr().err
    os.remove(work / "mine.txt")
    assert load_benchmark("serving_benchmark").main([*SMALL, "--work", str(work), "--clean"]) == 0
    assert os.listdir(tmp_path) == []  # WORK goes too, once empty
