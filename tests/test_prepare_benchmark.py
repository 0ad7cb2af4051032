"""benchmarks/prepare_benchmark.py's --engines and --repeat (issue 30): which runs it makes, in which order,
under which names, and what it compares, with each prepare replaced by a stand-in that writes a tiny corpus
(the real runs are test_prepare_parallel's benchmark test)."""

from __future__ import annotations

import importlib.util
import json
import os

import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("prepare_benchmark",
                                                  os.path.join(ROOT, "benchmarks", "prepare_benchmark.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _stand_in(made: list, differ: str | None = None):
    """A run that writes a corpus of one Arrow table (another table for the run named `differ`) and
    returns what benchmark.run returns, noting (inputs, out's name, parallel, extra, engine)."""
    def run(inputs, out, parallel, extra, engine="tasks"):
        made.append((inputs, os.path.basename(out), parallel, extra, engine))
        os.makedirs(out)
        table = pa.table({"x": [1, 2, 3 if os.path.basename(out) != differ else 4]})
        with pa.OSFile(os.path.join(out, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        return {"parallel": parallel, "engine": engine, "wall_seconds": 2.0 * parallel,
                "pass_seconds": {"total": 1.0 * parallel}, "peak_task_rss_bytes": 1, "bytes_written": 1}
    return run


def test_engines_and_repeat_interleave_the_runs_and_compare_each_to_the_first(tmp_path, monkeypatch):
    bench, made = _bench(), []
    monkeypatch.setattr(bench, "run", _stand_in(made))
    out = tmp_path / "bench"
    assert bench.main(["in.parquet", "--out", str(out), "--parallel", "1", "2", "--engines", "tasks", "data",
                       "--repeat", "2", "--", "--time-col", "ts"]) == 0
    # 1 process once per round (no engine of its own), 2 processes by each engine, round after round
    assert [(name, parallel, engine) for _, name, parallel, _, engine in made] == [
        ("p1-0", 1, "tasks"), ("p2-0", 2, "tasks"), ("p2-data-0", 2, "data"),
        ("p1-1", 1, "tasks"), ("p2-1", 2, "tasks"), ("p2-data-1", 2, "data")]
    assert all(inputs == ["in.parquet"] and extra == ["--time-col", "ts"] for inputs, _, _, extra, _ in made)
    result = json.loads((out / "result.json").read_text())
    runs = result["runs"]
    assert [r["run"] for r in runs] == [m[1] for m in made] and "same_corpus_as_first" not in runs[0]
    assert all(r["same_corpus_as_first"] is True for r in runs[1:])
    assert [r["speedup"] for r in runs[1:]] == [0.5, 0.5, 1.0, 0.5, 0.5]
    assert os.listdir(out) == ["result.json"]  # the corpora removed once compared


def test_a_run_whose_corpus_differs_fails_the_benchmark_and_keeps_the_corpora(tmp_path, monkeypatch, capsys):
    bench, made = _bench(), []
    monkeypatch.setattr(bench, "run", _stand_in(made, differ="p2-data"))
    out = tmp_path / "bench"
    assert bench.main(["in.parquet", "--out", str(out), "--parallel", "2", "--engines", "tasks", "data"]) == 1
    assert [m[1:3] + (m[4],) for m in made] == [("p2", 2, "tasks"), ("p2-data", 2, "data")]
    runs = json.loads((out / "result.json").read_text())["runs"]
    assert runs[1]["same_corpus_as_first"] is False
    assert "error: the corpora differ" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["p2", "p2-data", "result.json"]
