"""benchmarks/refresh_benchmark.py: its time split (new users and URLs only after the cut, the held-out pairs in
no file), and a --quick run of the whole measurement on the session's Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench():
    spec = importlib.util.spec_from_file_location("refresh_benchmark_job",
                                                  os.path.join(ROOT, "benchmarks", "refresh_benchmark.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their annotations up
    spec.loader.exec_module(module)
    return module


def test_the_benchmarks_split_makes_one_consistent_world_without_the_held_out_pairs(tmp_path):
    """New users and new URLs have no event before the cut in any file; H's pairs are in no file; base
    and day are all, cut at the last day."""
    from doc2vec_dist.synthetic import generate

    bench = load_bench()
    generate(str(tmp_path / "gen"), 2000, 600, seed=3, events_per_user=20, progress=False)
    split = bench.time_split(str(tmp_path / "gen" / "events"), str(tmp_path / "split"), seed=3)
    paths = split["paths"]
    files = {name: pq.read_table(paths[name]) for name in ("base", "day", "all")}
    heldout = pq.read_table(paths["heldout"])
    everything = pq.read_table(str(tmp_path / "gen" / "events"))
    new_users = set(pc.unique(everything["user_id"]).filter(
        pa.array(bench.chosen(pc.unique(everything["user_id"]), bench.NEW_USERS, 7))).to_pylist())
    new_urls = set(pc.unique(everything["url"]).filter(
        pa.array(bench.chosen(pc.unique(everything["url"]), bench.NEW_URLS, 8))).to_pylist())
    assert 0.03 < len(new_users) / 2000 < 0.07 and 0.005 < len(new_urls) / 600 < 0.04
    assert split["new_users"] == len(new_users) and split["new_urls"] == len(new_urls)

    cut = split["cut_ms"]
    for name, table in files.items():
        ms = pc.cast(table["ts"], pa.int64()).to_numpy()
        early = ms < cut
        assert early.all() if name == "base" else (~early).all() if name == "day" else early.any() and (~early).any()
        users, urls = table["user_id"].to_pylist(), table["url"].to_pylist()
        assert not any(early[i] and (users[i] in new_users or urls[i] in new_urls) for i in range(len(users))), name
        pairs = set(zip(users, urls))
        assert not pairs & set(zip(heldout["key"].to_pylist(), heldout["token"].to_pylist())), name
    assert files["base"].num_rows + files["day"].num_rows == files["all"].num_rows
    assert split["heldout_pairs"] == heldout.num_rows > 0 and split["dropped_before_cut"] > 0
    # the new ones exist after the cut; H was drawn from that world: a new user's or URL's held-out
    # pair is one of its events after the cut
    assert new_users & set(files["day"]["user_id"].to_pylist())
    late = everything.filter(pc.greater_equal(pc.cast(everything["ts"], pa.int64()), cut))
    late_pairs = set(zip(late["user_id"].to_pylist(), late["url"].to_pylist()))
    new_pairs = [(u, t) for u, t in zip(heldout["key"].to_pylist(), heldout["token"].to_pylist())
                 if u in new_users or t in new_urls]
    assert new_pairs and set(new_pairs) <= late_pairs


def test_benchmark_quick_measures_the_refresh_against_a_cold_retrain(ray_cluster, tmp_path, capsys):
    """--quick end to end; with --first-epoch changed only the new and grown users move, so the index
    update replaces only their rows (every user moving is tests/test_jobs_refresh.py's day 2)."""
    first_epoch = "changed"
    bench = load_bench()
    out_json = tmp_path / "bench.json"
    assert bench.main(["--quick", "--work", str(tmp_path / "work"), "--json", str(out_json),
                       "--cpus-per-worker", "1", "--first-epoch", first_epoch]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out_json.read_text())
    (r,) = result["results"]
    assert 0 < r["refresh"]["recall"] < 1 and 0 < r["cold"]["recall"] < 1
    assert r["refresh"]["eval_users"] == r["cold"]["eval_users"]  # the same users measured for both
    # warm-started vectors stay where they were; a cold retrain's do not
    assert r["refresh"]["cosine_users"]["median"] > 0.8 > r["cold"]["cosine_users"]["median"]
    assert r["refresh"]["cosine_users"]["shared"] == r["cold"]["cosine_users"]["shared"] > 0
    update, prepared = r["index"]["update"], r["refresh"]["prepare"]
    assert update["added"] == prepared["new_docs"] > 0 and update["removed"] == 0
    assert 0 < update["replaced"] <= prepared["grown_docs"]
    assert update["unchanged"] >= prepared["base_docs"] - prepared["grown_docs"]
    assert r["index"]["update_recall"] > 0.9
    figures = {row["figure"] for row in result["table"]}
    assert {"refresh − cold", "refresh / cold wall", "update / rebuild"} <= figures
    assert "| refresh − cold |" in printed and "≥ −0.005" in printed
    # the generated events are kept for the next run; the run's corpora and models are not
    assert os.listdir(tmp_path / "work") == ["synthetic-3000x1500-e25-s1"]
    assert np.isfinite(r["refresh"]["wall_seconds"]) and r["refresh"]["wall_seconds"] > 0
