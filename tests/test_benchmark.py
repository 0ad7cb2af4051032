"""benchmarks/benchmark.py: its pieces on known numbers, and one small run end to end (ours through Ray and gensim)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from doc2vec_dist.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "benchmark.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("jobs_benchmark", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_servers_memory_is_set_against_the_rows_they_own(bench):
    cfg = TrainConfig(dim=100, num_ps=2, optimizer="adagrad")
    raw = bench.ps_raw_bytes(cfg, num_docs=1_000_001, vocab_size=10_000)
    assert raw == [(500_001 + 5_000) * 101 * 4, (500_000 + 5_000) * 101 * 4]
    mib = 2**20
    procs = [{"label": "driver", "role": "driver", "rss": 300 * mib, "private": 200 * mib},
             {"label": "ps0", "role": "ps", "rss": 900 * mib, "private": 400 * mib},
             {"label": "ps1", "role": "ps", "rss": 800 * mib, "private": 300 * mib},
             {"label": "worker0", "role": "worker", "rss": 500 * mib, "private": 250 * mib}]
    rows = {r["label"]: r for r in bench.process_rows(procs, [100 * mib, 100 * mib], empty_ps=180 * mib)}
    assert rows["ps0"]["raw_bytes"] == 100 * mib and rows["ps0"]["private_over_raw"] == pytest.approx(4.0)
    assert rows["ps0"]["tables_over_raw"] == pytest.approx(2.2) and rows["ps1"]["tables_over_raw"] == pytest.approx(1.2)
    assert "raw_bytes" not in rows["worker0"] and "tables_over_raw" not in rows["driver"]


def test_worker_time_is_shown_in_the_order_of_a_macro_batch(bench):
    seconds = {"compute": 6.0, "pull": 1.0, "push": 2.0, "read": 0.5, "sample": 0.5, "wait": 0.0}  # as config.json sorts them
    text = bench.worker_split(seconds)
    assert text.split()[::4] == ["read", "sample", "pull", "wait", "compute", "push"]
    assert "compute 6.0 s (60%)" in text


def test_one_small_run_prints_the_table_and_writes_json_and_png(bench, ray_cluster, sample_corpus, tmp_path, capsys):
    """main() in this process: both trainers still run as processes of their own (each with its own
    Ray, watched for memory, as the script runs them); the sweep, which trains in the script's own
    process, runs on the session's Ray, as it does on any Ray the script finds already up."""
    corpus, heldout = sample_corpus
    work = tmp_path / "bench"
    bench.main(["--corpus", corpus, "--heldout", heldout, "--workdir", str(work), "--epochs", "1", "--dim", "16",
                "--num-ps", "2", "--num-workers", "1", "--sweep-macro-batch", "4096", "--sweep-workers"])
    assert ray_cluster.is_initialized()  # the script left the Ray it found up as it was
    text = capsys.readouterr().out
    for needle in ("tokens/s", "recall@10 (held out; gensim iterable)", "wall: train", "wall: checkpoint", "wall: export",
                   "ps0", "ps1", "worker0", "gensim driver", "where the workers' time went", "macro-batch 4,096"):
        assert needle in text, needle
    with open(work / "benchmark.json") as fh:
        result = json.load(fh)
    ours, gensim = result["ours"], result["gensim"]
    modes = {m: result[f"gensim_{m}"] for m in ("iterable", "corpus_file")}  # both of gensim's modes ran
    assert gensim == max(modes.values(), key=lambda r: r["tokens_per_second"])  # speed: against the faster
    assert result["gensim_quality"] == modes["iterable"]  # recall: against the most accurate
    assert "gensim's modes: iterable " in text and "; corpus_file " in text
    assert all(r["summary"]["gensim_mode"] == m for m, r in modes.items())
    assert ours["tokens_per_second"] > 0 and gensim["tokens_per_second"] > 0
    assert result["speed_ratio"] == pytest.approx(ours["tokens_per_second"] / gensim["tokens_per_second"])
    assert 0 < ours["recall"] <= 1 and 0 < gensim["recall"] <= 1
    for run in (ours, gensim):
        assert run["stages"]["train"] > 0 and run["stages"]["export"] > 0 and run["stages"]["process"] > 0
    procs = {p["label"]: p for p in ours["processes"]}
    assert {"driver", "ps0", "ps1", "worker0"} <= set(procs)
    for label in ("ps0", "ps1", "worker0"):
        assert procs[label]["private"] > 50 * 2**20 and procs[label]["rss"] >= procs[label]["private"]
    assert procs["ps0"]["raw_bytes"] == result["ps_raw_bytes"][0] > 0
    assert set(ours["summary"]["worker_seconds"]) == {"read", "sample", "pull", "wait", "compute", "push", "barrier"}
    assert [(p["macro_batch"], p["num_workers"]) for p in result["sweep"]] == [(4096, 1)]
    assert result["sweep"][0]["tokens_per_second"] > 0
    with open(work / "benchmark.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
