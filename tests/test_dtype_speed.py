"""benchmarks/dtype_speed.py: one small interleaved round end to end, and its table. (Its feed is
benchmarks/feed_rate.feed, run by tests/test_jobs.py; left out here to keep the test run short.)"""

from __future__ import annotations

import json

from conftest import load_benchmark


def test_one_round_trains_each_dtype_and_sets_them_against_float32(small_corpus, tmp_path, capsys):
    job = load_benchmark("dtype_speed")
    out = tmp_path / "speed.json"
    result = job.main(["--corpus", small_corpus, "--rounds", "1", "--dtypes", "float32", "bfloat16", "--epochs", "1",
                       "--no-gensim", "--no-feed", "--work", str(tmp_path / "work"), "--json", str(out)])
    assert json.loads(out.read_text())["train"] == result["train"]
    for dtype in ("float32", "bfloat16"):
        assert len(result["train"][dtype]) == 1 and result["train"][dtype][0] > 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| float32 |") and rows[1].endswith("| 1.00× | - | - | - |")
    ratio = result["train"]["bfloat16"][0] / result["train"]["float32"][0]
    assert rows[2].startswith("| bfloat16 |") and f"| {ratio:.2f}× |" in rows[2]
