"""benchmarks/compare.py: ours and gensim side by side in one run, and the memory watch it relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from doc2vec_dist.memwatch import MemoryWatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_memory_watch_sees_a_child_process_allocate():
    code = "import numpy, time; a = numpy.ones(300 * 2**20 // 8); time.sleep(1.5)"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"])
    with MemoryWatch(parent.pid, interval=0.1) as watch:
        parent.wait()
    assert watch.peak_total > 300 * 2**20  # the grandchild's 300 MiB counts
    assert watch.peaks["driver"] < 100 * 2**20 and len(watch.peaks) >= 2


def test_compare_runs_both_trainers_and_prints_one_table(sample_corpus, tmp_path):
    corpus, heldout = sample_corpus
    work = tmp_path / "cmp"
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"), "--corpus", corpus, "--heldout", heldout,
         "--labels", os.path.join(ROOT, "data", "sample", "truth", "users.parquet"), "--modes", "dbow", "dbow_adagrad",
         "--dim", "16", "--epochs", "3", "--num-workers", "1", "--num-ps", "1", "--work", str(work)],
        check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any("doc2vec-dist" in line for line in lines) and any("gensim" in line for line in lines)
    with open(work / "compare.json") as fh:
        result = json.load(fh)
    runs = {r["trainer"]: r for r in result["runs"] if r["mode"] == "dbow"}
    assert set(runs) == {"doc2vec-dist", "gensim"}
    # our Adagrad variant is measured against the same gensim PV-DBOW run, trained once
    variant = {r["trainer"]: r for r in result["runs"] if r["mode"] == "dbow_adagrad"}
    assert variant["gensim"]["ran_as"] == "dbow" and variant["gensim"]["wall_seconds"] == runs["gensim"]["wall_seconds"]
    assert variant["doc2vec-dist"]["ran_as"] == "dbow_adagrad"
    for r in runs.values():
        assert r["tokens_per_second"] > 0 and r["peak_memory_bytes"] > 50 * 2**20
        assert 0 < r["recall@10"] <= 1 and 0 < r["label_accuracy"] <= 1
    # our run's tree holds the Ray actors; gensim's is one process
    assert "ps" in runs["doc2vec-dist"]["peak_rss_by_role"] and "worker" in runs["doc2vec-dist"]["peak_rss_by_role"]
    assert [d["mode"] for d in result["differences"]] == ["dbow", "dbow_adagrad"]
    assert all(d["speed_ratio"] > 0 for d in result["differences"])
