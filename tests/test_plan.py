"""plan.py: memory arithmetic for known sizes, the calibration slice, and a real plan against a real run."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SAMPLE_EVENTS, SMALL_USERS

from doc2vec_dist import placement, plan, plan_calibration, plan_model, plan_report, runlog, settings, units
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus, iter_shard
from doc2vec_dist.errors import UserError
from doc2vec_dist.ps import table_specs
from doc2vec_dist.settings import document_partitions, resolve


def _tables(config, docs, vocab):
    return table_specs(config, SimpleNamespace(num_docs=docs, vocab_size=vocab))


def test_rows_of_each_server_are_counted_exactly():
    # 5 docs, 3 words; 2 servers: docs rows 0,2,4 | 1,3; words_out 0,2 | 1; Adagrad adds a column
    cfg = TrainConfig(dim=4, optimizer="adagrad", num_ps=2)
    per_ps = plan_model.shard_table_bytes(_tables(cfg, 5, 3), 2)
    assert per_ps == [{"docs": 3 * 5 * 4, "words_out": 2 * 5 * 4}, {"docs": 2 * 5 * 4, "words_out": 1 * 5 * 4}]
    # dbow_words trains `words` too; plain sgd has no state column
    cfg = TrainConfig(dim=100, dbow_words=True, num_ps=3)
    per_ps = plan_model.shard_table_bytes(_tables(cfg, 20_000_000, 1_000_000), 3)
    assert per_ps[0] == {"docs": 6_666_667 * 400, "words": 333_334 * 400, "words_out": 333_334 * 400}
    assert per_ps[2] == {"docs": 6_666_666 * 400, "words": 333_333 * 400, "words_out": 333_333 * 400}


def test_the_plan_counts_each_workers_resident_url_rows_where_they_live():
    profile = {"unique_rows": 1000, "example_bytes": 8000}
    sizes = {"ps_overhead": 0, "worker_fixed": 0, "driver": 0, "ray_system": 0, "object_store": 0}
    # one worker: every words_out row, in its host memory, and (issue 48) every document's, across epochs
    cpu = TrainConfig(dim=100, num_workers=1)
    mem = plan_model.memory_plan(_tables(cpu, 50_000, 10_000), cpu, profile, **sizes)
    assert mem["resident"] == {"tables": {"words_out": 10_000, "docs": 50_000}, "bytes": 60_000 * 400, "all": True,
                               "on": "host", "dtype": "float32", "document_partitions": 1}
    assert mem["worker"]["total"] == mem["worker"]["batch"] + 60_000 * 400
    gpu = TrainConfig(dim=100, num_workers=1, gpus_per_worker=1, mode="dm")  # the token path: words too, on the GPU
    mem = plan_model.memory_plan(_tables(gpu, 50_000, 10_000), gpu, profile, **sizes)
    assert mem["resident"]["tables"] == {"words_out": 10_000, "words": 10_000, "docs": 50_000}
    assert mem["resident"]["on"] == "device"
    assert mem["resident"]["bytes"] == (2 * 10_000 + 50_000) * 400 and mem["worker"]["resident"] == 0
    # a 16-bit --dtype: with --device-rows dtype a GPU keeps its URL rows in it (words stay float32); by
    # default (--device-rows float32) they are float32 there
    for dtype, state in (("bfloat16", {}), ("float16", {"optimizer": "adagrad"})):
        half = TrainConfig(dim=100, num_workers=1, gpus_per_worker=1, mode="dm", dtype=dtype, device_rows="dtype",
                           **state)
        mem = plan_model.memory_plan(_tables(half, 50_000, 10_000), half, profile, **sizes)
        width = 100 + len(state)
        assert mem["resident"]["dtype"] == dtype
        assert mem["resident"]["bytes"] == 10_000 * (100 * 2 + 4 * len(state)) + (10_000 + 50_000) * width * 4
        wide = TrainConfig(dim=100, num_workers=1, gpus_per_worker=1, mode="dm", dtype=dtype, **state)
        assert plan_model.memory_plan(_tables(wide, 50_000, 10_000), wide, profile, **sizes)["resident"]["bytes"] == \
            (2 * 10_000 + 50_000) * width * 4
    # ... a CPU worker trains them in place, float32
    cpu16 = TrainConfig(dim=100, num_workers=1, dtype="bfloat16")
    assert plan_model.memory_plan(_tables(cpu16, 50_000, 10_000), cpu16, profile, **sizes)["resident"]["bytes"] == \
        60_000 * 400


def test_memory_plan_adds_up_for_known_sizes():
    cfg = TrainConfig(dim=100, num_ps=2, num_workers=3, max_inflight_pushes=2, schedule="shared")
    profile = {"unique_rows": 1000, "example_bytes": 8000}
    mem = plan_model.memory_plan(_tables(cfg, 20_000_000, 1_000_000), cfg, profile, ps_overhead=200 << 20,
                              worker_fixed=250 << 20, driver=300 << 20, ray_system=600 << 20, object_store=4 << 30)
    rows = 10_000_000 + 500_000  # each server: half the docs, half the words_out
    assert [p["table_bytes"] for p in mem["ps"]] == [rows * 400, rows * 400]
    assert mem["ps"][0]["total"] == rows * 400 + (200 << 20)
    assert mem["worker"] == {"batch": 2 * 8000 + 2 * 1000 * 100 * 4, "fixed": 250 << 20, "resident": 0,
                             "total": 2 * 8000 + 2 * 1000 * 100 * 4 + (250 << 20)}  # 3 workers: none resident
    assert mem["object_store"]["in_flight"] == 3 * (2 + 2) * 1000 * 100 * 4
    processes = 2 * (rows * 400 + (200 << 20)) + 3 * mem["worker"]["total"] + (300 << 20) + (600 << 20)
    assert mem["processes_total"] == processes and mem["node_total"] == processes + (4 << 30)
    # a 20M × 1M dbow model at dim 100 on 2 servers: 4.2 GB of rows each
    assert mem["ps"][0]["table_bytes"] == 4_200_000_000
    # on the block schedule each worker holds a block of the URL rows; its 6.7M documents' rows (2.7 GB)
    # are more than it keeps resident, but 200k users' would be
    blocks = dataclasses.replace(cfg, schedule="auto")
    mem = plan_model.memory_plan(_tables(blocks, 20_000_000, 1_000_000), blocks, profile, ps_overhead=200 << 20,
                              worker_fixed=250 << 20, driver=300 << 20, ray_system=600 << 20, object_store=4 << 30)
    assert mem["worker"]["resident"] == 333_334 * 100 * 4 and mem["resident"]["tables"] == {"words_out": 333_334}
    mem = plan_model.memory_plan(_tables(blocks, 200_000, 1_000_000), blocks, profile, ps_overhead=200 << 20,
                              worker_fixed=250 << 20, driver=300 << 20, ray_system=600 << 20, object_store=4 << 30)
    assert mem["resident"]["tables"] == {"words_out": 333_334, "docs": 66_667}


def _tokens(num_tokens: int) -> SimpleNamespace:
    """A corpus of `num_tokens` tokens over 1,000 URLs, as settings.resolve reads one."""
    return SimpleNamespace(num_tokens=num_tokens, vocab_size=1000)


def test_macro_batch_is_the_workers():
    cfg = TrainConfig(macro_batch=65536, num_workers=2, schedule="shared")
    assert resolve(cfg, _tokens(600_000_000)).macro_batch == 65536
    assert resolve(cfg, _tokens(16 * 2 * 10_000)).macro_batch == 10_000  # ≥ 16 rounds per epoch
    assert resolve(cfg, _tokens(1000)).macro_batch == 4096  # never below the floor
    # rows shared by several workers: 65,536 by default; one worker writing every row it trains
    # (every words_out row resident) takes 262,144, and a small corpus's epoch in one round
    assert resolve(TrainConfig(num_workers=2, schedule="shared"), _tokens(600_000_000)).macro_batch == 65536
    # the block schedule: each worker writes every row it trains alone, as one worker does
    assert resolve(TrainConfig(num_workers=2), _tokens(600_000_000)).macro_batch == 262144
    alone = TrainConfig(num_workers=1)
    assert resolve(alone, _tokens(600_000_000)).macro_batch == 262144
    assert resolve(alone, _tokens(60_000)).macro_batch == 262144
    assert resolve(TrainConfig(num_workers=1, macro_batch=8192), _tokens(60_000)).macro_batch == 8192
    # ... and 1,048,576 when its examples are drawn on its device (the batched kernel's token path)
    assert resolve(TrainConfig(num_workers=1, kernel="batched"), _tokens(60_000)).macro_batch == 1_048_576


def test_warnings_name_what_does_not_fit():
    cfg = TrainConfig(dim=100, num_ps=2, num_workers=2)
    mem = plan_model.memory_plan(_tables(cfg, 20_000_000, 1_000_000), cfg, {"unique_rows": 150_000, "example_bytes": 0},
                              ps_overhead=0, worker_fixed=0, driver=0, ray_system=0, object_store=1 << 20)
    result = {"memory": mem, "config": {"num_ps": 2}}
    warnings = plan.plan_warnings(result, ram=4 << 30, local=True)
    assert any("OOM" in w for w in warnings) and any("spill" in w for w in warnings)
    assert plan.plan_warnings({"memory": {**mem, "object_store": {**mem["object_store"], "capacity": 8 << 30}},
                                  "config": {"num_ps": 2}}, ram=64 << 30, local=True) == []


def test_slice_keeps_the_vocabulary_and_the_first_documents(sample_corpus, tmp_path):
    corpus = Corpus(sample_corpus[0])
    part = plan_calibration.make_slice(corpus, str(tmp_path / "slice"), tokens=20_000, files=2)
    assert part.vocab_size == corpus.vocab_size and np.array_equal(part.counts(), corpus.counts())
    assert 20_000 <= part.num_tokens < 20_000 + 200 and part.num_shards == 2
    assert sum(part.shard_num_tokens()) == part.num_tokens
    ids, tokens = [], []
    for path in part.shard_paths:
        for doc_ids, offsets, toks in iter_shard(path):
            ids.append(doc_ids)
            tokens.append(toks)
    ids, tokens = np.concatenate(ids), np.concatenate(tokens)
    assert np.array_equal(ids, np.arange(part.num_docs))
    first = next(iter_shard(corpus.shard_paths[0], max_tokens=len(tokens)))
    assert np.array_equal(first[2][:len(tokens)], tokens)  # the same documents, whole, in order
    assert part.docs()["key"].to_pylist() == corpus.docs()["key"].to_pylist()[:part.num_docs]


def test_macro_batch_profile_counts_real_rows(sample_corpus):
    corpus = Corpus(sample_corpus[0])
    prof = plan_model.macro_batch_profile(corpus, TrainConfig(dim=32, num_workers=2, negative=5, schedule="shared"))
    assert prof["macro_batch"] == 4096  # the sample is small: the floor
    assert 3000 < prof["tokens"] <= 4096 + 500 and prof["docs"] > 50
    # targets and 5 negatives each, drawn from ~5k URLs: most of the vocabulary, never more
    assert 0.5 * corpus.vocab_size < prof["words_out"] <= corpus.vocab_size
    assert prof["unique_rows"] == prof["docs"] + prof["words_out"] and prof["words"] == 0
    assert prof["example_bytes"] > prof["examples"] * (8 + 8 + 5 * 8)
    # resident words_out rows are not pulled: none with one worker holding them all, the rest past 1,000
    assert plan_model.macro_batch_profile(corpus, TrainConfig(dim=32, num_workers=1))["words_out"] == 0
    some = plan_model.macro_batch_profile(corpus, TrainConfig(dim=32, num_workers=2, cache_rows=1000))
    assert 0 < some["words_out"] <= corpus.vocab_size - 1000
    # the block schedule: a worker holds its block of words_out and its documents for the round, pulling
    # neither with a macro-batch (bytes_per_token counts their moves); without resident documents, it pulls those
    blocks = plan_model.macro_batch_profile(corpus, TrainConfig(dim=32, num_workers=2))
    assert blocks["words_out"] == 0 and blocks["docs"] == 0 and blocks["unique_rows"] == 0
    streamed = plan_model.macro_batch_profile(corpus, TrainConfig(dim=32, num_workers=2, resident_docs=False))
    assert streamed["words_out"] == 0 and streamed["docs"] == streamed["unique_rows"] > 0


@pytest.mark.slow
def test_plan_on_the_sample_against_a_real_run(ray_cluster, sample_corpus, trained_model, tmp_path):
    """The trained_model fixture's run (dim 32, 10 epochs, 2 PS, 2 workers) is what the plan predicts."""
    with open(os.path.join(trained_model, "config.json")) as fh:
        run = json.load(fh)
    cfg = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False)
    result = plan.plan(sample_corpus[0], cfg, calibrate_seconds=0.5, workdir=str(tmp_path))
    mem, t = result["memory"], result["time"]

    # processes of the session's local Ray are this process's children: measured, not modelled
    assert mem["sources"]["ps_overhead"].startswith("measured")
    assert mem["sources"]["worker_fixed"].startswith("measured")
    assert 50 << 20 < mem["empty_ps"] < 1 << 30  # Python, numpy, torch, Ray: a real process
    for p in mem["ps"]:
        assert p["total"] == p["table_bytes"] + p["overhead"] and p["overhead"] >= mem["empty_ps"]
    assert sum(p["table_bytes"] for p in mem["ps"]) == (5000 + 4989) * 32 * 4
    assert 50 << 20 < mem["worker"]["total"] < 2 << 30
    assert not os.listdir(tmp_path)  # the calibration cleans up after itself

    # The time: the calibration is a real run of this config (the sample whole: every token trained,
    # counted), its tokens/s what that run measured, and the epoch and the run are that rate's arithmetic
    # (test_the_time_plan_is_the_arithmetic_of_the_calibration_it_is_given holds it for given inputs). How
    # close the plan comes to a run measured at another moment depends on how busy the machine is then
    # (0.71 s planned against 0.096 s run under load): benchmarks/benchmark.py --plan measures it
    # (docs/benchmarks.md: time per epoch −19% at 20M users), not a test.
    cal, s = result["calibration"], result["calibration"]["summary"]
    assert not cal["sliced"] and s["tokens"] == cal["epochs"] * result["corpus"]["tokens"]
    assert t["tokens_per_second"] == s["tokens_per_second"] == pytest.approx(s["tokens"] / s["train_seconds"],
                                                                            rel=0.01)
    assert t["epoch_seconds"] == pytest.approx(result["corpus"]["tokens"] / t["tokens_per_second"])
    assert t["total_seconds"] == pytest.approx(t["startup_seconds"] + 10 * t["epoch_seconds"]
                                               + t["checkpoints"] * t["checkpoint_seconds"])
    # the checkpoints that run wrote, one at each epoch's end (the plan counted 1)
    assert t["checkpoints"] == sum(line["event"] == "checkpoint" for line in runlog.read(trained_model)[0]) == 10
    text = plan_report.format_plan(result)
    assert "parameter server" in text and "per epoch" in text and "worker time: read" in text
    # the scaling table: the bytes per token it predicts for 2 workers are what that run's counters counted
    two = next(r for r in result["scaling"] if r["workers"] == 2)
    counted = run["summary"]["bytes_per_token"]
    for kind, value in counted.items():
        assert two["bytes_per_token"][kind] == pytest.approx(value, rel=0.1, abs=0.5), kind
    assert {r["workers"] for r in result["scaling"]} == {1, 2, 4, 8, 16}
    assert all(r["bound"] in ("compute", "servers", "network", "calls") for r in result["scaling"])
    assert "scaling" in text and "bound" in text


def test_the_time_plan_is_the_arithmetic_of_the_calibration_it_is_given(sample_corpus):
    """plan's time from a calibration given to it (no run, no clock): the epoch is the corpus's tokens at the
    calibration's rate (or the scaling table's rate where fewer workers were calibrated), the start-up the
    calibration's plus the rows the slice lacked, each checkpoint the calibration's rate of writing over the
    whole model's bytes, and the run their sum."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False,
                      checkpoint_every=1.0)
    tables = table_specs(cfg, corpus)
    full = [sum(t.values()) for t in plan_model.shard_table_bytes(tables, cfg.num_ps)]
    rate = corpus.num_tokens / 0.25  # an epoch of 0.25 s: 2.5 s of training, a checkpoint each second
    cal = {"summary": {"tokens_per_second": rate, "startup_seconds": 3.0, "checkpoint_seconds": 0.5,
                       "train_seconds": 1.0, "tokens": 4 * corpus.num_tokens},
           "table_bytes": [b // 4 for b in full], "corpus_docs": corpus.num_docs, "workers": 2}
    t = plan.time_plan(corpus, cfg, tables, cal)
    assert t["tokens_per_second"] == rate and t["scaled_from_workers"] is None
    assert t["epoch_seconds"] == pytest.approx(0.25)
    assert t["startup_seconds"] == 3.0  # the calibration held every document's row already
    assert t["checkpoint_bytes_per_second"] == pytest.approx(sum(b // 4 for b in full) / 0.5)
    assert t["checkpoint_seconds"] == pytest.approx(0.5 * sum(full) / sum(b // 4 for b in full))
    assert t["checkpoints"] == 10  # one at each epoch's end (an epoch of 0.25 s has no second for another)
    assert t["total_seconds"] == pytest.approx(3.0 + 2.5 + 10 * t["checkpoint_seconds"])
    assert (t["calibration_train_seconds"], t["calibration_tokens"]) == (1.0, 4 * corpus.num_tokens)

    # a calibration of a slice (a tenth of the documents) and of one worker, scaled to the planned two
    sliced = {**cal, "corpus_docs": corpus.num_docs // 10, "workers": 1}
    t = plan.time_plan(corpus, cfg, tables, sliced, scaled=2 * rate)
    extra = math.ceil(corpus.num_docs / 2) - math.ceil(corpus.num_docs // 10 / 2)
    assert t["tokens_per_second"] == 2 * rate and t["scaled_from_workers"] == 1
    assert t["epoch_seconds"] == pytest.approx(0.125)
    assert t["startup_seconds"] == pytest.approx(3.0 + extra * t["ps_init_seconds_per_row"])
    assert t["checkpoints"] == 10
    assert t["total_seconds"] == pytest.approx(t["startup_seconds"] + 1.25 + 10 * t["checkpoint_seconds"])

    with pytest.raises(UserError, match="the calibration run trained no tokens"):
        plan.time_plan(corpus, cfg, tables, {**cal, "summary": {**cal["summary"], "tokens_per_second": 0}})


def _calibration_of(corpus: Corpus, cfg: TrainConfig, epoch_seconds: float) -> dict:
    """A calibration given to time_plan (no run): the whole corpus at a rate of an epoch each `epoch_seconds`."""
    tables = table_specs(cfg, corpus)
    full = [sum(t.values()) for t in plan_model.shard_table_bytes(tables, cfg.num_ps)]
    rate = corpus.num_tokens / epoch_seconds
    return {"summary": {"tokens_per_second": rate, "startup_seconds": 1.0, "checkpoint_seconds": 0.5,
                        "train_seconds": 2 * epoch_seconds, "tokens": 2 * corpus.num_tokens, "worker_seconds": {}},
            "table_bytes": full, "corpus_docs": corpus.num_docs, "workers": cfg.num_workers, "sliced": False,
            "corpus_tokens": corpus.num_tokens, "epochs": 2}


@pytest.mark.parametrize("every, expect", [
    (600.0, 3),        # one at each epoch's end: the plan said 1 (a checkpoint each 600 s of 30 s)
    (4.0, 3 * (1 + 2)),  # and each 4 s of an epoch of 10 s since the last (at 4 and 8): the plan said 1 + 2
    (0.0, 1),          # 0: the last alone
])
def test_the_plan_counts_the_checkpoints_train_writes(sample_corpus, every, expect):
    """train writes a checkpoint at each epoch's end (--checkpoint-every > 0) and one whenever that many seconds of
    training passed since the last, the clock starting again at each (run.py); with 0, one at the end alone.
    The plan counted 1 + the run's seconds / --checkpoint-every, at most one an epoch: 'startup + 3 epochs + 1
    checkpoints' for a run that writes 3."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=16, epochs=3, sample=0, num_ps=2, num_workers=1, progress=False, checkpoint_every=every)
    cal = _calibration_of(corpus, cfg, 10.0)
    t = plan.time_plan(corpus, cfg, table_specs(cfg, corpus), cal)
    assert t["checkpoints"] == expect
    assert t["total_seconds"] == pytest.approx(t["startup_seconds"] + 30.0 + expect * t["checkpoint_seconds"])
    result = {**plan.plan(sample_corpus[0], cfg, run_calibration=False), "calibration": cal, "time": t}
    line = next(x for x in plan_report.format_plan(result).splitlines() if "whole run" in x)
    assert f"startup + 3 epochs + {expect} checkpoint{'' if expect == 1 else 's'} (" in line, line


def test_the_first_epoch_of_first_epoch_changed_is_priced_on_the_changed_users(sample_corpus, tmp_path, capsys):
    """--first-epoch changed (a refresh: train --init-from) trains only the changed users' tokens in the first epoch
    (Corpus.epoch_tokens): the plan prices that epoch on them, and says so; it priced every epoch whole, its output
    the same with the flag and without. A corpus that lists no changed users is refused, as train refuses it."""
    import shutil

    from doc2vec_dist.baseline import train_gensim
    from doc2vec_dist.cli import main
    from doc2vec_dist.corpus import write_changed

    refreshed = str(tmp_path / "refreshed")
    shutil.copytree(sample_corpus[0], refreshed)
    corpus = Corpus(refreshed)
    lengths = corpus.docs().column("length").to_numpy()
    changed = np.arange(0, corpus.num_docs, 5)  # a fifth of the users
    write_changed(refreshed, changed)
    first = int(lengths[changed].sum())
    whole = TrainConfig(dim=16, epochs=3, sample=0, num_ps=2, num_workers=1, progress=False, checkpoint_every=4.0)
    cfg = dataclasses.replace(whole, first_epoch="changed")
    cal = _calibration_of(corpus, cfg, 10.0)
    t = plan.time_plan(corpus, cfg, table_specs(cfg, corpus), cal)
    assert t["first_epoch_seconds"] == pytest.approx(10.0 * first / corpus.num_tokens)
    # its checkpoints: the first epoch's end and each 4 s of it, then the two whole epochs' (at 4 and 8 s, and the end)
    assert t["checkpoints"] == math.ceil(t["first_epoch_seconds"] / 4) + 2 * 3
    assert t["total_seconds"] == pytest.approx(t["startup_seconds"] + t["first_epoch_seconds"] + 20.0
                                               + t["checkpoints"] * t["checkpoint_seconds"])
    assert plan.time_plan(corpus, whole, table_specs(whole, corpus), cal)["total_seconds"] > t["total_seconds"] + 5

    argv = ["plan", "--corpus", refreshed, "--no-calibrate", "--dim", "16", "--num-workers", "1"]
    base = str(tmp_path / "base")  # the model a refresh starts from (gensim's: one epoch in a second)
    train_gensim(sample_corpus[0], base, TrainConfig(dim=16, epochs=1, sample=0, progress=False), workers=1)
    assert main([*argv, "--first-epoch", "changed", "--init-from", base]) == 0
    text = capsys.readouterr().out
    assert (f"first epoch (--first-epoch changed): only the users a refresh changed, {first:,} of the "
            f"{corpus.num_tokens:,} tokens") in text
    assert main(argv) == 0
    assert "first epoch" not in capsys.readouterr().out
    # a corpus without changed.arrow: train's refusal
    assert main(["plan", "--corpus", sample_corpus[0], "--no-calibrate", "--first-epoch", "changed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--first-epoch changed needs a corpus from prepare --base" in err[0], err


@pytest.mark.parametrize("argv, expect", [
    (["--resume"], "--resume: plan prices a run from its corpus before it starts, with no model to resume"),
    (["--resume-from", "v2"], "--resume-from: plan prices a run from its corpus before it starts"),
    (["--calibrate-seconds", "-3"], "--calibrate-seconds must be > 0 (given -3)"),
])
def test_plan_refuses_what_it_cannot_honour_in_one_line(sample_corpus, capsys, argv, expect):
    from doc2vec_dist.cli import main

    assert main(["plan", "--corpus", sample_corpus[0], "--no-calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err


def test_a_calibration_of_no_seconds_and_first_epoch_changed_without_a_corpus_are_refused_before_ray_starts():
    """plan's library refuses them before anything runs (a calibration of 0 s; an estimate has no changed users)."""
    cfg = TrainConfig(dim=16, epochs=1, num_workers=1, progress=False)
    with pytest.raises(UserError, match=r"--calibrate-seconds must be > 0 \(given 0\).*--no-calibrate"):
        plan.plan(None, cfg, calibrate_seconds=0, users=100, urls=10, tokens_per_user=5)
    with pytest.raises(UserError, match="an estimate without --corpus has none"):
        plan.plan(None, dataclasses.replace(cfg, first_epoch="changed"), run_calibration=False, users=100, urls=10,
                  tokens_per_user=5)


# --- issue 29: a 16-bit --dtype, counted -----------------------------------------------------------------

def test_a_16_bit_dtype_halves_each_servers_rows_but_not_the_workers_float32_matrices():
    profile = {"unique_rows": 1000, "example_bytes": 8000}
    sizes = {"ps_overhead": 0, "worker_fixed": 0, "driver": 0, "ray_system": 0, "object_store": 0}
    for optimizer, row, half in (("sgd", 100 * 4, 100 * 2), ("adagrad", 101 * 4, 100 * 2 + 4)):
        wide = TrainConfig(dim=100, num_ps=2, num_workers=3, schedule="shared", optimizer=optimizer)
        narrow = dataclasses.replace(wide, dtype="bfloat16")
        planned = {c.dtype: plan_model.memory_plan(_tables(c, 20_000_000, 1_000_000), c, profile, **sizes)
                   for c in (wide, narrow)}
        assert [p["table_bytes"] for p in planned["bfloat16"]["ps"]] == [10_500_000 * half] * 2
        assert [p["table_bytes"] for p in planned["float32"]["ps"]] == [10_500_000 * row] * 2
        assert planned["bfloat16"]["object_store"]["in_flight"] == 3 * (2 + 2) * 1000 * half  # pulls, pushes
        assert planned["bfloat16"]["worker"] == planned["float32"]["worker"]  # the math is float32
        assert placement.table_bytes_per_ps(_tables(narrow, 20_000_000, 1_000_000), 2) == 10_500_000 * half


@pytest.mark.slow
def test_a_bfloat16_run_moves_about_half_the_bytes_as_the_plan_counts(ray_cluster, sample_corpus, trained_model,
                                                                        tmp_path):
    """trained_model's run (float32) again in bfloat16: plan says ≤ 0.55 of float32's bytes a token,
    and the run's own counters agree with plan, as they do for float32
    (test_plan_on_the_sample_against_a_real_run)."""
    from doc2vec_dist.trainer import train

    cfg = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False,
                      dtype="bfloat16")
    corpus = Corpus(sample_corpus[0])
    planned = plan_model.bytes_per_token(corpus, cfg, 2)
    assert sum(planned.values()) <= 0.55 * sum(plan_model.bytes_per_token(corpus, TrainConfig(
        **{**dataclasses.asdict(cfg), "dtype": "float32"}), 2).values())
    model = str(tmp_path / "m")
    train(sample_corpus[0], model, cfg)
    counted = {}
    for path in (model, trained_model):
        with open(os.path.join(path, "config.json")) as fh:
            counted[path] = json.load(fh)["summary"]["bytes_per_token"]
    for kind, value in counted[model].items():
        assert planned[kind] == pytest.approx(value, rel=0.1, abs=0.25), kind
    assert sum(counted[model].values()) <= 0.55 * sum(counted[trained_model].values())


def test_one_device_worker_moves_the_bytes_plan_counts_its_documents_resident_or_swapped(ray_cluster, small_corpus,
                                                                                         tmp_path, monkeypatch):
    """Issue 48: one worker on the GPU workers' path (the CPU as the device) keeps its documents' rows across
    epochs (pulled once, written back by each epoch's checkpoint), or under --device-memory swaps them by
    partition (each pulled and written back once an epoch); the run's own counters are the bytes plan
    predicts for each, to the byte, and plan says which way the run takes."""
    from doc2vec_dist.settings import STAGED_ENV
    from doc2vec_dist.trainer import train

    monkeypatch.setenv(STAGED_ENV, "1")
    corpus = Corpus(small_corpus)
    one = {"dim": 16, "epochs": 3, "sample": 0, "num_ps": 2, "num_workers": 1, "cpus_per_worker": 1,
           "kernel": "batched", "macro_batch": 4096, "progress": False}
    for ways, extra in ((1, {}), (5, {"device_memory": 300 * 16 * 4 / 2**30})):  # all 1,500 documents, or 300
        config = TrainConfig(**one, **extra)
        assert settings.document_partitions(config, corpus.num_docs, corpus.vocab_size) == ways
        counted = train(small_corpus, str(tmp_path / f"m{ways}"), config)["bytes_per_token"]
        planned = plan_model.bytes_per_token(corpus, config, 1)
        assert planned["pulled"] == planned["pushed"] == 0
        for kind, value in counted.items():
            assert planned[kind] == pytest.approx(value, abs=0.01), (ways, kind, planned, counted)
        res = plan_model.resident_plan(config, *(table_specs(config, corpus)[t] for t in ("words_out", "docs")))
        assert res["document_partitions"] == ways and res["tables"]["docs"] == -(-corpus.num_docs // ways)


def test_the_scaling_table_is_bound_by_the_least_of_its_rates(sample_corpus):
    """More workers move more bytes per token (each round's blocks); a slow link makes the network the bound."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, cpus_per_worker=1, progress=False)
    cal = {"summary": {"tokens_per_second": 1e6, "server_busy_seconds": 1.0,
                       "bytes": {"pulled": 1e9, "pushed": 1e9, "resident_pulled": 0, "resident_pushed": 0}}}
    fast = plan_model.scaling_plan(corpus, cfg, cal, network_gbps=100, round_seconds=0, exchange_seconds=0)  # (rounds: issue 50's tests)
    per_token = [r["total_bytes_per_token"] for r in fast]
    assert per_token == sorted(per_token) and per_token[-1] > 2 * per_token[0]
    # compute: W × one worker's rate; the bound, so the expectation: less the waits for the held rows (at
    # 100 Gbit/s, well under 1%)
    assert fast[0]["bound"] == fast[2]["bound"] == "compute"
    assert fast[0]["alone"]["compute"] == pytest.approx(1e6) and fast[2]["alone"]["compute"] == pytest.approx(4e6)
    assert fast[0]["rates"]["compute"] == pytest.approx(1e6, rel=0.01) and fast[0]["rates"]["compute"] < 1e6
    slow = plan_model.scaling_plan(corpus, cfg, cal, network_gbps=0.001, round_seconds=0, exchange_seconds=0)
    assert all(r["bound"] == "network" for r in slow)
    link = 0.001e9 / 8
    for r in slow:  # a link per worker, num_ps of them on the servers' side, the busier side bounding
        moved, total = r["bytes_per_token"], r["total_bytes_per_token"]
        # the blocks handed from worker to worker cross the workers' links only
        seconds = max(total / (r["workers"] * link), (total - moved["handed"]) / (2 * link))
        if r["workers"] <= 2:
            assert seconds == pytest.approx(total / (r["workers"] * link))
        assert r["tokens_per_second"] == pytest.approx(1 / seconds, rel=0.02)


def test_held_rows_move_while_the_worker_waits_and_streamed_rows_while_it_computes(sample_corpus):
    """Over 100 Mbit/s links the block schedule's 2 workers trained at 0.67 of the links' rate alone:
    their blocks move at each round's end while they wait, so that time adds to the compute time;
    the rows streamed with each macro-batch move while the worker computes."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, cpus_per_worker=1, progress=False)
    cal = {"summary": {"tokens_per_second": 1e6, "bytes": {}}}
    gbps = 0.01
    link = gbps * 1e9 / 8
    for r in plan_model.scaling_plan(corpus, cfg, cal, network_gbps=gbps, workers=(1, 2, 4), round_seconds=0, exchange_seconds=0):
        moved, w = r["bytes_per_token"], r["workers"]
        # seconds a token on the links, the busier side's: a link per worker, 2 on the servers' side, which the
        # blocks handed from worker to worker do not cross
        streamed = (moved["pulled"] + moved["pushed"]) / (min(w, 2) * link)
        held_bytes = moved["resident_pulled"] + moved["resident_pushed"] + moved["handed"]
        held = max(held_bytes / (w * link), (held_bytes - moved["handed"]) / (2 * link))
        assert (moved["handed"] > 0) == (w > 1)
        compute = 1 / (1e6 * w)
        assert r["tokens_per_second"] == pytest.approx(1 / (max(compute, streamed) + held))
        # each column what its limit allows alone (network: every byte's time), but the bound's: the expectation
        assert r["alone"]["compute"] == pytest.approx(1 / compute)
        assert r["alone"]["network"] == pytest.approx(1 / (streamed + held))
        assert r["bound"] == ("network" if streamed + held > compute else "compute")
        assert r["rates"] == {**r["alone"], r["bound"]: r["tokens_per_second"]}
        if w > 1:  # the blocks are held rows: their time adds to the compute time
            assert held > 0 and r["tokens_per_second"] < 0.99 / max(compute, streamed)


def test_plan_command_without_calibration_prints_and_saves_memory(sample_corpus, tmp_path, capsys):
    from doc2vec_dist.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--corpus", sample_corpus[0], "--no-calibrate", "--dim", "16", "--num-ps", "3",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "parameter server (largest of 3)" in text and "worker (each)" in text and "per epoch" not in text
    # one worker: the whole URL table resident in it, said with its size, and its documents' rows across epochs
    assert "resident in each worker (its host memory): words_out all 4,989 rows + docs all 5,000 rows = " in text
    assert "documents' rows: kept in each worker across epochs: pulled once, written back at each checkpoint" in text
    with open(out) as fh:
        result = json.load(fh)
    mem = result["memory"]
    assert result["time"] is None and mem["sources"]["worker_fixed"].startswith("modelled")
    assert sum(p["table_bytes"] for p in mem["ps"]) == (5000 + 4989) * 16 * 4
    pull = result["macro_batch"]["unique_rows"] * 16 * 4 / 3  # one pull's bytes from one of 3 servers
    assert mem["ps"][0]["overhead"] == placement.PROCESS_BYTES + int(plan.PS_RETAINED_PULLS * pull)


def test_plan_warns_of_settings_measured_to_lose_quality(sample_corpus, capsys):
    from doc2vec_dist.cli import main

    assert main(["plan", "--corpus", sample_corpus[0], "--no-calibrate", "--shared-negatives", "16",
                 "--micro-batch", "8192"]) == 0
    assert "warning: --shared-negatives 16 with --micro-batch 8,192" in capsys.readouterr().out
    assert main(["plan", "--corpus", sample_corpus[0], "--no-calibrate", "--shared-negatives", "16"]) == 0
    assert "--shared-negatives" not in capsys.readouterr().out


# --- issue 47: the scaling table agrees with itself --------------------------------------------------------

CAL = {"summary": {"tokens_per_second": 1e6, "server_busy_seconds": 1.0,
                   "bytes": {"pulled": 1e9, "pushed": 1e9, "resident_pulled": 0, "resident_pushed": 0}}}


def test_the_one_worker_row_is_the_same_whatever_the_planned_number_of_workers(sample_corpus):
    """One corpus gave a 1-worker row of 82.3 B/token in a plan of one worker and 128.9 in a plan of several:
    the row counted the URL rows resident in each of the planned workers, not in one."""
    corpus = Corpus(sample_corpus[0])
    base = TrainConfig(dim=32, epochs=10, num_ps=2, cpus_per_worker=1, progress=False)
    rows = {}
    for planned in (1, 2, 4):
        for gbps in (10.0, 1.0):
            cal = {"summary": {**CAL["summary"], "tokens_per_second": 1e6 * planned}}  # the same rate per worker
            table = plan_model.scaling_plan(corpus, dataclasses.replace(base, num_workers=planned), cal, gbps)
            rows[planned, gbps] = {r["workers"]: r for r in table}
    for gbps in (10.0, 1.0):
        one = [rows[planned, gbps][1] for planned in (1, 2, 4)]
        assert one[0]["bytes_per_token"] == one[1]["bytes_per_token"] == one[2]["bytes_per_token"]
        assert one[0]["tokens_per_second"] == one[1]["tokens_per_second"] == one[2]["tokens_per_second"]
        # and every other row, too: each row is its own number of workers, whoever asks
        for w in (2, 4, 8, 16):
            assert rows[1, gbps][w]["bytes_per_token"] == rows[4, gbps][w]["bytes_per_token"]
    assert rows[1, 10.0][1]["bytes_per_token"] == rows[1, 1.0][1]["bytes_per_token"]


@pytest.mark.parametrize("gbps", [100.0, 1.0, 0.05, 0.001])
def test_each_rows_expected_rate_is_the_least_of_its_columns_and_the_bound_names_that_column(sample_corpus, gbps):
    """A 2-worker row named "network" as its bound while every column allowed more than it expected: the
    columns now carry the same model as the expectation (compute waits for the held rows' moves too)."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, epochs=10, num_ps=2, cpus_per_worker=1, progress=False)
    for r in plan_model.scaling_plan(corpus, cfg, CAL, network_gbps=gbps):
        columns = {k: v for k, v in r["rates"].items() if v}
        assert set(columns) == {"compute", "servers", "network", "calls"}
        assert r["tokens_per_second"] == min(columns.values()), r
        assert r["bound"] == min(columns, key=columns.get), r
    text = plan_report.format_plan({**_plan_shell(corpus, cfg), "scaling": plan_model.scaling_plan(corpus, cfg, CAL, gbps),
                                "network_gbps": gbps})
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 8 and cells[0].isdigit():  # workers, bytes/token, compute, servers, network, calls, expected, bound
            rates = dict(zip(("compute", "servers", "network", "calls"), cells[2:6]))
            assert cells[6] == rates[cells[7]], line


def _plan_shell(corpus, cfg) -> dict:
    """What format_plan reads of a plan besides its scaling table: a --no-calibrate plan's parts."""
    tables = table_specs(cfg, corpus)
    profile = plan_model.macro_batch_profile(corpus, cfg)
    mem = plan_model.memory_plan(tables, cfg, profile, ps_overhead=0, worker_fixed=0, driver=0, ray_system=0,
                              object_store=1 << 30)
    mem["sources"] = {k: "test" for k in ("ps_overhead", "worker_fixed", "driver", "ray_system")}
    return {"corpus": {"path": corpus.path, "docs": corpus.num_docs, "tokens": corpus.num_tokens,
                       "vocab": corpus.vocab_size, "shards": 1, "tokens_per_doc": 30.0},
            "config": dataclasses.asdict(cfg), "tables": {n: s.to_json() for n, s in tables.items()},
            "macro_batch": profile, "memory": mem, "time": None, "node_ram": 64 << 30, "warnings": []}


def test_where_more_workers_are_no_faster_the_table_says_how_much_more_servers_help(sample_corpus):
    """Over 1 Gbit/s links with 2 servers, 8 workers move more bytes a token than 4 through the same two
    server links: no faster. The same model with a server per worker says by how much more servers help."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, epochs=10, num_ps=2, cpus_per_worker=1, progress=False)
    cal = {"summary": {**CAL["summary"], "tokens_per_second": 20e6}}  # fast workers: the links bound
    table = plan_model.scaling_plan(corpus, cfg, cal, network_gbps=1.0, round_seconds=0, exchange_seconds=0)  # the links alone
    stuck = [r for prev, r in itertools.pairwise(table) if r["tokens_per_second"] < 1.1 * prev["tokens_per_second"]]
    assert stuck, [r["tokens_per_second"] for r in table]
    for r in stuck:
        more = r["more_servers"]
        assert more["num_ps"] == r["workers"] and more["tokens_per_second"] > 1.1 * r["tokens_per_second"]
        alone = plan_model.scaling_plan(corpus, dataclasses.replace(cfg, num_ps=r["workers"]), cal, network_gbps=1.0,
                                     workers=(r["workers"],), round_seconds=0, exchange_seconds=0)[0]
        assert more["tokens_per_second"] == pytest.approx(alone["tokens_per_second"])  # the same model
    text = plan_report.format_plan({**_plan_shell(corpus, cfg), "scaling": table, "network_gbps": 1.0})
    for r in stuck:
        gain = r["more_servers"]["tokens_per_second"] / r["tokens_per_second"]
        assert (f"  {r['workers']} workers are no faster than {r['workers'] // 2} here: with --num-ps {r['workers']} "
                f"(a server per worker, each on a node of its own) they would train "
                f"{r['more_servers']['tokens_per_second'] / 1e6:.2f}M tokens/s, {gain:.1f}× ") in text
    # where more workers do go faster, no such line
    assert "workers are no faster than 1 here" not in text and "2 workers are" not in text


# --- issue 47: plan on a machine smaller than the cluster ---------------------------------------------------

def test_calibrating_more_workers_than_this_machine_holds_is_refused_before_ray_starts_naming_the_ways_out(
        sample_corpus):
    """`plan --num-workers 4` on a 2-CPU machine started a Ray, then stopped with train's "8 CPU in all, and
    the nodes hold 1 … lower --num-workers": no way to plan the cluster from here."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "doc2vec_dist", "plan", "--corpus", sample_corpus[0],
                           "--num-workers", "100"], capture_output=True, text=True, timeout=300, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr  # one line: no Ray started, nothing else said
    assert lines[0].startswith("error: plan's calibration run cannot start here: 100 workers need 200 CPU but "
                               "this machine has "), lines
    assert lines[0].endswith("; plan without it (--no-calibrate: memory and bytes per token, no time), or calibrate "
                             "one worker and scale its rate to 100 (--calibrate-workers 1)"), lines


@pytest.mark.slow
def test_one_calibrated_worker_scaled_to_the_planned_workers_of_a_corpus_not_made_yet(ray_cluster, tmp_path):
    """An estimate (--users --urls --tokens-per-user) for 4 workers with --calibrate-workers 1: the calibration
    trains one worker on the estimate's sample; memory is planned for 4 and the whole corpus, and the time
    per epoch is the scaling table's row for 4 (that one worker's rate, 4 times, within the links' and
    servers' limits), said so."""
    cfg = TrainConfig(dim=16, epochs=2, num_ps=2, num_workers=4, cpus_per_worker=1, progress=False)
    result = plan.plan(None, cfg, calibrate_seconds=0.3, workdir=str(tmp_path), calibrate_workers=1,
                          users=200_000, urls=5000, tokens_per_user=20)
    assert not os.listdir(tmp_path)  # the sample and the calibration's model are gone
    cal, t = result["calibration"], result["time"]
    assert cal["workers"] == 1 and cal["summary"]["worker_seconds"]
    assert cal["corpus_tokens"] <= result["estimate"]["sample_tokens"] < result["corpus"]["tokens"] == 4_000_000
    four = next(r for r in result["scaling"] if r["workers"] == 4)
    one = next(r for r in result["scaling"] if r["workers"] == 1)
    # the calibrated worker's rate, less the time of its Ray calls (plan_model.worker_rate: one round an epoch,
    # and its exchanges, at most 4 an epoch: its URL rows and documents, each pulled once and pushed), 4 times
    rate, seconds = cal["summary"]["tokens_per_second"], cal["summary"]["train_seconds"]
    calls = (cal["epochs"] * (plan_model.ROUND_SECONDS + 4 * plan_model.EXCHANGE_SECONDS)
             if not cal.get("two_point") else 0.0)
    assert rate <= one["alone"]["compute"] <= rate * seconds / max(seconds - calls, 1e-9) * (1 + 1e-9)
    assert four["alone"]["compute"] == pytest.approx(4 * one["alone"]["compute"])
    assert t["tokens_per_second"] == four["tokens_per_second"] and t["scaled_from_workers"] == 1
    assert t["epoch_seconds"] == pytest.approx(4_000_000 / four["tokens_per_second"])
    assert result["memory"]["object_store"]["in_flight"] == 4 * (2 + cfg.max_inflight_pushes) * \
        result["memory"]["object_store"]["macro_batch_rows_bytes"]  # 4 workers' memory, not the calibration's
    assert result["memory"]["ps"][0]["table_bytes"] == (100_000 + 2500) * 16 * 4  # the whole corpus's rows
    text = plan_report.format_plan(result)
    assert "1 worker calibrated, its rate scaled to 4 workers by the scaling table" in text


# --- issue 47: a plan for a corpus you do not have yet -------------------------------------------------------

ESTIMATE_FACTOR = 1.25  # docs/cluster.md: an estimate's bytes per token and worker memory, against the corpus's own


@pytest.mark.parametrize("settings", [{"num_workers": 2}, {"num_workers": 2, "schedule": "shared"},
                                      {"num_workers": 2, "schedule": "shared", "sample": 0},
                                      {"num_workers": 2, "resident_docs": False}, {"mode": "dm"}])
def test_an_estimate_from_sizes_alone_is_within_its_stated_factor_of_the_corpus_plan(sample_corpus, tmp_path,
                                                                                      settings):
    """--users N --urls M --tokens-per-user T for the sample's own sizes (5,000 users, 4,989 URLs, 30.9 tokens a
    user) against the plan of the sample itself: the same tables, and bytes per token and a worker's
    memory within ESTIMATE_FACTOR. The sample was generated as the estimate assumes its corpus (Zipf URLs,
    lognormal users), with communities besides."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=32, progress=False, **settings)
    real = plan.plan(sample_corpus[0], cfg, run_calibration=False)
    est = plan.plan(None, cfg, run_calibration=False, users=corpus.num_docs, urls=corpus.vocab_size,
                       tokens_per_user=corpus.num_tokens / corpus.num_docs, workdir=str(tmp_path))
    assert not os.listdir(tmp_path)  # the sample it wrote is gone
    assert est["estimate"]["from"] == "zipf" and est["estimate"]["users"] == 5000 and real["estimate"] is None
    assert "Zipf" in est["estimate"]["assumption"] and est["corpus"]["path"] is None
    assert est["corpus"]["tokens"] == corpus.num_tokens and est["tables"] == real["tables"]
    assert [p["table_bytes"] for p in est["memory"]["ps"]] == [p["table_bytes"] for p in real["memory"]["ps"]]
    for e, r in zip(est["scaling"], real["scaling"], strict=True):
        ratio = e["total_bytes_per_token"] / r["total_bytes_per_token"]
        assert 1 / ESTIMATE_FACTOR < ratio < ESTIMATE_FACTOR, (e["workers"], ratio)
    ratio = est["memory"]["worker"]["total"] / real["memory"]["worker"]["total"]
    assert 1 / ESTIMATE_FACTOR < ratio < ESTIMATE_FACTOR
    ratio = est["memory"]["worker"]["batch"] / real["memory"]["worker"]["batch"]
    assert 1 / ESTIMATE_FACTOR < ratio < ESTIMATE_FACTOR
    text = plan_report.format_plan(est)
    assert text.startswith(f"plan: an estimate for 5,000 users × {corpus.num_tokens / 5000:.1f} tokens over 4,989 URLs")
    assert "\n  estimate: URL visits Zipf with exponent 1" in text
    if cfg.mode == "dm":  # PV-DM trains on one worker: the table says so rather than failing
        assert [r["workers"] for r in est["scaling"]] == [1] and "not listed: 2, 4, 8, 16 workers" in text


def test_a_corpus_scaled_to_more_users_is_an_estimate_of_the_corpus_they_make(small_corpus, tmp_path):
    """small_corpus is the sample's first 1,500 users: scaled to 5,000 it stands for the whole sample (its
    URLs as they are: fewer than the sample's 4,989); scaled to its own users it is itself."""
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare


    whole = prepare([SAMPLE_EVENTS], str(tmp_path / "sample"), PrepareConfig(time_col="ts"), progress=False)
    cfg = TrainConfig(dim=32, num_workers=2, progress=False)
    real = plan.plan(whole.path, cfg, run_calibration=False)
    est = plan.plan(small_corpus, cfg, run_calibration=False, users=5000)
    assert est["estimate"]["from"] == Corpus(small_corpus).path and est["corpus"]["docs"] == 5000
    assert est["corpus"]["tokens"] == pytest.approx(real["corpus"]["tokens"], rel=0.1)
    same = plan.plan(small_corpus, cfg, run_calibration=False, users=SMALL_USERS)
    alone = plan.plan(small_corpus, cfg, run_calibration=False)
    assert same["scaling"] == alone["scaling"] and same["memory"] == alone["memory"]
    # a macro-batch of the estimate holds what one of the whole would (the sample on disk holds half of one):
    # its examples were the sample's own, and the worker's batch memory with them
    assert est["macro_batch"]["grown_from_sample"] > 1.5
    assert est["macro_batch"]["examples"] == pytest.approx(real["macro_batch"]["examples"], rel=0.2)
    for e, r in zip(est["scaling"], real["scaling"], strict=True):
        ratio = e["total_bytes_per_token"] / r["total_bytes_per_token"]
        assert 1 / ESTIMATE_FACTOR < ratio < ESTIMATE_FACTOR, (e["workers"], ratio)


def test_the_estimate_command_says_estimate_and_saves_it(tmp_path, capsys):
    from doc2vec_dist.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--users", "20000000", "--urls", "1000000", "--tokens-per-user", "30", "--no-calibrate",
                 "--num-ps", "4", "--num-workers", "8", "--network-gbps", "1", "--workdir", str(tmp_path / "w"),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan: an estimate for 20,000,000 users × 30.0 tokens over 1,000,000 URLs")
    with open(out) as fh:
        saved = json.load(fh)
    assert saved["estimate"]["users"] == 20_000_000 and saved["corpus"]["tokens"] == 600_000_000
    # the tables of the whole: 5M docs and 250k URLs a server at dim 100
    assert saved["memory"]["ps"][0]["table_bytes"] == (5_000_000 + 250_000) * 400
    assert os.listdir(tmp_path / "w") == []


@pytest.mark.parametrize("argv, expect", [
    ([], ("plan needs --corpus CORPUS, or --users N --urls M --tokens-per-user T to estimate a corpus you do not "
         "have yet (missing: --users --urls --tokens-per-user)")),
    (["--users", "10", "--urls", "5"], "(missing: --tokens-per-user)"),
    (["--users", "10", "--urls", "5", "--tokens-per-user", "0.5"], "--tokens-per-user must be at least 1 (given 0.5)"),
    (["--corpus", "{corpus}", "--users", "10", "--urls", "5"], "--urls estimates a corpus you do not have"),
    # without --users they were taken and ignored: the corpus's plan, exit 0
    (["--corpus", "{corpus}", "--urls", "5"], "--urls estimates a corpus you do not have"),
    (["--corpus", "{corpus}", "--tokens-per-user", "99"], "--tokens-per-user estimates a corpus you do not have"),
])
def test_an_estimate_without_its_sizes_is_refused_naming_them(sample_corpus, capsys, argv, expect):
    from doc2vec_dist.cli import main

    argv = [a.replace("{corpus}", sample_corpus[0]) for a in argv]
    assert main(["plan", "--no-calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err


# --- issue 48: the scaling table of GPU workers -------------------------------------------------------------

GPU_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", "configs", "gpu.yaml")
# a calibration's servers only (a plan without a GPU: the device's rate is plan's table's or its flag)
SERVERS = {"summary": {"server_busy_seconds": 1.0,
                       "bytes": {"pulled": 0, "pushed": 0, "resident_pulled": 1e9, "resident_pushed": 1e9}}}
H200 = plan_model.DEVICES["H200"]


def _gpu_config(**extra) -> TrainConfig:
    from doc2vec_dist.config import build, load_yaml

    return build(TrainConfig, load_yaml(GPU_YAML), {"progress": False, **extra})


def _gpu_table_lines(text: str) -> list[dict]:
    """The GPU scaling table's rows as printed: GPUs, workers, bytes/token, PCIe bytes/token, device, PCIe,
    servers, network, calls, expected, bound."""
    names = ("gpus", "workers", "bytes", "pcie_bytes", "device", "pcie", "servers", "network", "calls", "expected", "bound")
    rows = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == len(names) and cells[0].replace(".", "").isdigit() and cells[1].isdigit():
            rows.append(dict(zip(names, cells)))
    return rows


@pytest.mark.parametrize("gbps", [100.0, 10.0, 0.01])
def test_a_gpu_plan_lists_1_2_4_8_gpus_each_rows_rate_the_least_of_device_pcie_servers_network(sample_corpus, gbps):
    """Issue 48: plan prints the expected rate for 1, 2, 4 and 8 GPUs and its bound (device, PCIe, servers,
    network), from the one model of the CPU workers' table (bound_rates): each column what its limit allows
    alone, the expectation the least of them, and the bound names it. The device's rate, where no GPU
    calibrated it, is the kernel's measured on the H200 (plan's default device), one for each GPU."""
    corpus = Corpus(sample_corpus[0])
    cfg = _gpu_config()
    table = plan_model.scaling_plan(corpus, cfg, SERVERS, network_gbps=gbps)
    assert [r["gpus"] for r in table] == [1, 2, 4, 8] and [r["workers"] for r in table] == [1, 2, 4, 8]
    for r in table:
        columns = {k: v for k, v in r["rates"].items() if v}
        # (calls: an epoch's Ray calls, its rounds and its exchanges of held rows, issue 50; one worker has one
        # round an epoch and its resident rows' exchanges)
        assert set(columns) == {"device", "pcie", "servers", "network", "calls"}, r
        assert r["tokens_per_second"] == min(columns.values()), r
        assert r["bound"] == min(columns, key=columns.get), r
        assert r["alone"]["device"] == pytest.approx(r["gpus"] * H200.kernel_tokens_per_second)
        assert r["alone"]["pcie"] == pytest.approx(r["gpus"] * H200.pcie_gb_per_second * 1e9
                                                   / r["total_pcie_bytes_per_token"])
        # every row moved to and from the servers crosses a device's link too, and each chunk's token ids
        assert r["total_pcie_bytes_per_token"] > r["total_bytes_per_token"]
    text = plan_report.format_plan({**_plan_shell(corpus, cfg), "scaling": table, "network_gbps": gbps,
                                "device": plan_model.device_rates(cfg, None)})
    printed = _gpu_table_lines(text)
    assert [row["gpus"] for row in printed] == ["1", "2", "4", "8"]
    for row, r in zip(printed, table):
        assert row["expected"] == row[row["bound"]] == f"{r['tokens_per_second'] / 1e6:.2f}M", row
    if gbps == 0.01:
        assert {r["bound"] for r in table} == {"network"}


def test_two_gpu_workers_share_one_gpu_and_its_rate(sample_corpus):
    """Two workers on one GPU (--gpus-per-worker 0.5, the block schedule) share its kernel's rate and its link:
    the 1-GPU row is 2 workers, its device column one GPU's."""
    corpus = Corpus(sample_corpus[0])
    cfg = _gpu_config(num_workers=2, gpus_per_worker=0.5)
    table = plan_model.scaling_plan(corpus, cfg, SERVERS, network_gbps=10.0)
    assert [(r["gpus"], r["workers"]) for r in table] == [(1, 2), (2, 4), (4, 8), (8, 16)]
    one = table[0]
    assert one["alone"]["device"] == pytest.approx(H200.kernel_tokens_per_second)
    alone = plan_model.scaling_plan(corpus, _gpu_config(), SERVERS, network_gbps=10.0, workers=(2,))[0]
    assert one["bytes_per_token"] == alone["bytes_per_token"]  # the same 2 workers' bytes, on one link
    assert one["alone"]["pcie"] == pytest.approx(alone["alone"]["pcie"] / 2)


def test_documents_swapped_by_partition_make_a_gpu_run_bound_by_pcie(sample_corpus):
    """Under a --device-memory that holds a fifth of its documents a GPU worker swaps them by partition: each
    row crosses its link twice an epoch, against once (and its first pull) when kept. At a link that fed the
    kept documents faster than the device trains, the swapped ones are bound by PCIe; the network, at
    400 Gbit/s, is never the bound."""
    corpus = Corpus(sample_corpus[0])
    kept, swapped = _gpu_config(), _gpu_config(device_memory=corpus.num_docs / 5 * 100 * 4 / 2**30)
    assert settings.document_partitions(kept, corpus.num_docs, corpus.vocab_size) == 1
    assert settings.document_partitions(swapped, corpus.num_docs, corpus.vocab_size) == 5

    def one_gpu(cfg, pcie=None):
        return plan_model.scaling_plan(corpus, cfg, SERVERS, network_gbps=400.0, workers=(1,),  # the links alone
                                    gpu={"pcie_bytes_per_second": pcie}, round_seconds=0, exchange_seconds=0)[0]

    moved = {name: one_gpu(cfg)["total_pcie_bytes_per_token"] for name, cfg in (("kept", kept), ("swapped", swapped))}
    docs = corpus.num_docs * 100 * 4 / corpus.num_tokens  # one crossing of every document's row, a token
    epochs = kept.epochs
    assert moved["swapped"] - moved["kept"] == pytest.approx((1 - 1 / epochs) * docs, rel=1e-6)
    link = H200.kernel_tokens_per_second * math.sqrt(moved["kept"] * moved["swapped"])  # between the two
    rows = {name: one_gpu(cfg, link) for name, cfg in (("kept", kept), ("swapped", swapped))}
    assert rows["kept"]["bound"] == "device" and rows["swapped"]["bound"] == "pcie", rows
    assert rows["swapped"]["alone"]["pcie"] == pytest.approx(link / moved["swapped"])
    # at the H200's link both are the device's
    assert one_gpu(swapped)["bound"] == "device"


def test_a_gpu_plans_device_is_its_flags_else_a_gpu_calibrations_else_its_models_from_the_table(sample_corpus):
    """The device column: --device-tokens-per-second where given, else what a calibration on the GPUs measured
    (its tokens/s over the GPUs it ran on), else the kernel's measured on --gpu-model (DEVICES), else, on a
    device with none measured, the H200's scaled by their memories' bandwidth. PCIe and the memory's bandwidth:
    the flags', else the model's. The memory's ceiling is its bandwidth over the bytes a pair touches."""
    cfg = _gpu_config(num_workers=2, gpus_per_worker=0.5)
    cal = {**SERVERS, "workers": 2, "summary": {**SERVERS["summary"], "tokens_per_second": 30e6}}
    assert plan_model.device_rates(cfg, None)["tokens_per_second"] == H200.kernel_tokens_per_second
    assert plan_model.device_rates(cfg, cal)["tokens_per_second"] == 30e6  # 2 workers on 1 GPU
    assert plan_model.device_rates(cfg, cal, {"tokens_per_second": 50e6})["tokens_per_second"] == 50e6
    h100 = plan_model.device_rates(cfg, None, {"model": "H100"})
    assert h100["tokens_per_second"] == plan_model.DEVICES["H100"].kernel_tokens_per_second
    assert h100["pcie_bytes_per_second"] == plan_model.DEVICES["H100"].pcie_gb_per_second * 1e9
    for name in ("A100", "V100", "L4"):
        model = plan_model.DEVICES[name]
        assert model.kernel_tokens_per_second is None
        found = plan_model.device_rates(cfg, None, {"model": name})
        assert found["tokens_per_second"] == pytest.approx(H200.kernel_tokens_per_second * model.hbm_gb_per_second
                                                           / H200.hbm_gb_per_second)
        assert found["source"].startswith(f"no kernel measured on an {name}")
        pair = 2 * (2 + cfg.negative) * cfg.dim * 4
        assert found["hbm_tokens_per_second"] == pytest.approx(model.hbm_gb_per_second * 1e9 / pair)
    flagged = plan_model.device_rates(cfg, None, {"model": "A100", "hbm_bytes_per_second": 1e12,
                                               "pcie_bytes_per_second": 7e9})
    assert flagged["hbm_tokens_per_second"] == pytest.approx(1e12 / (2 * (2 + cfg.negative) * cfg.dim * 4))
    assert flagged["pcie_bytes_per_second"] == 7e9 and flagged["pcie_source"] == "--pcie-gb-per-second"


def test_a_gpu_plan_says_its_device_and_the_documents_way_with_each_ways_bytes(sample_corpus, tmp_path, capsys):
    """Through the command: the device, its source and its link; the room a worker gives its documents on that
    device's memory (units.device_room), and so whether they are kept across epochs or swapped by partition;
    and each way's bytes a token, the scaling table's for this run's way."""
    from doc2vec_dist.cli import main

    corpus = Corpus(sample_corpus[0])
    assert main(["plan", "--corpus", sample_corpus[0], "--config", GPU_YAML, "--no-calibrate", "--gpu-model", "V100",
                 "--device-tokens-per-second", "20e6", "--pcie-gb-per-second", "12", "--json",
                 str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    assert [row["gpus"] for row in _gpu_table_lines(text)] == ["1", "2", "4", "8"]
    assert "device: V100 (--gpu-model), 20.00M tokens/s a GPU (--device-tokens-per-second)" in text
    assert "PCIe: 12 GB/s a GPU (--pcie-gb-per-second)" in text
    with open(tmp_path / "p.json") as fh:
        saved = json.load(fh)
    assert saved["device"]["tokens_per_second"] == 20e6 and saved["scaling"][0]["alone"]["device"] == 20e6
    cfg = _gpu_config()
    room = units.device_room(cfg, int(32e9), corpus.vocab_size)
    assert saved["device"]["document_room"] == room
    ways = saved["documents"]
    assert ways["way"] == 1 and "this run: kept" in text and "documents' rows: kept in each worker" in text
    assert ways["kept"]["bytes_per_token"] == pytest.approx(saved["scaling"][0]["total_bytes_per_token"])
    assert ways["kept"]["pcie_bytes_per_token"] == pytest.approx(saved["scaling"][0]["total_pcie_bytes_per_token"])
    assert ways["partitions"]["bytes_per_token"] > ways["kept"]["bytes_per_token"]
    assert (f"kept across epochs {ways['kept']['bytes_per_token']:.1f} ({ways['kept']['pcie_bytes_per_token']:.1f} "
            "over PCIe)") in text
    # a device-memory that holds a third of them: partitions, and the table's bytes are that way's
    share = ways["share_bytes"]
    assert main(["plan", "--corpus", sample_corpus[0], "--config", GPU_YAML, "--no-calibrate",
                 "--device-memory", str(share / 2.9 / 2**30), "--json", str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    with open(tmp_path / "p.json") as fh:
        saved = json.load(fh)
    assert saved["documents"]["way"] == 3 and "this run: partitions" in text
    assert "swapped by partition: up to 3 partitions" in text
    assert saved["documents"]["partitions"]["bytes_per_token"] == pytest.approx(
        saved["scaling"][0]["total_bytes_per_token"])
    assert f"device: H200 (--gpu-model), {H200.kernel_tokens_per_second / 1e6:.2f}M tokens/s a GPU (the kernel " \
           "measured:" in text
# --- issue 50: fewer workers where more would not pay ---------------------------------------------------------

def test_each_row_pays_its_rounds_fixed_cost(lee_corpus):
    """Lee at 2 workers trained at 0.12× one worker: each of its 32 rounds an epoch costs 12–16 ms of Ray calls
    against about 0.3 ms of compute. The table said 2 workers would train it near twice as fast."""
    corpus = Corpus(lee_corpus)
    cfg = TrainConfig(dim=100, epochs=10, num_ps=2, progress=False)
    cal = {"summary": {"tokens_per_second": 2e6}, "workers": 1}
    rows = {r["workers"]: r for r in plan_model.scaling_plan(corpus, cfg, cal, network_gbps=10, workers=(1, 2, 4))}
    for w, r in rows.items():
        rounds = resolve(dataclasses.replace(cfg, num_workers=w), corpus).rounds
        assert r["rounds_per_epoch"] == rounds == (1 if w == 1 else w * 16)
        calls = plan_model.exchange_calls(corpus, cfg, w)
        assert r["exchange_calls_per_epoch"] == calls
        assert r["alone"]["calls"] == pytest.approx(corpus.num_tokens / (rounds * plan_model.ROUND_SECONDS
                                                                         + calls * plan_model.EXCHANGE_SECONDS))
    assert rows[2]["bound"] == rows[4]["bound"] == "calls"
    assert rows[2]["tokens_per_second"] < 0.5 * rows[1]["tokens_per_second"]
    assert rows[1]["bound"] == "compute"


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("handover", ["1", "0"])
def test_the_exchanges_a_server_answers_are_a_call_a_worker_table_and_direction(sample_corpus, workers, handover,
                                                                              monkeypatch):
    """The sample at 2 workers trained at 0.80–0.86× one worker, and the model said 1.34×: each worker pulled
    and pushed its rows in calls of 15–20 ms an epoch, which the model counted as bytes over 10 Gbit/s (2 ms).
    Each server answers a call for each worker and table it holds rows of, both ways: one worker's resident
    URL rows pulled once a run and written back once an epoch, a block schedule's blocks pulled at an epoch's
    first round and pushed at its last (every round without the handover), the documents each worker holds
    pulled once a run and written back once an epoch."""
    from doc2vec_dist.settings import HANDOVER_ENV

    monkeypatch.setenv(HANDOVER_ENV, handover)
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=100, epochs=5, num_ps=2, progress=False)
    run = resolve(dataclasses.replace(cfg, num_workers=workers), corpus)
    assert run.token_path and document_partitions(run.config, corpus.num_docs, corpus.vocab_size) == 1
    docs = 1 / 5 + 1
    urls = 1 / 5 + 1 if workers == 1 else 2 * (1 if handover == "1" else run.rounds)
    assert plan_model.exchange_calls(corpus, cfg, workers) == pytest.approx(workers * (urls + docs))
    # the shared schedule streams every row with its macro-batch, beside the compute: no exchange
    if workers > 1:
        shared = dataclasses.replace(cfg, schedule="shared")
        assert not resolve(dataclasses.replace(shared, num_workers=workers), corpus).token_path
        assert plan_model.exchange_calls(corpus, shared, workers) == 0.0
    # documents swapped in 5 partitions (a GPU worker's device too small for them all): each partition
    # pulled and written back once an epoch
    swapped = _gpu_config(num_workers=workers, device_memory=corpus.num_docs / 5 * 100 * 4 / 2**30 / workers)
    run = resolve(swapped, corpus)
    assert document_partitions(run.config, corpus.num_docs, corpus.vocab_size) == 5
    urls = (len(run.resident_tables) * (1 / swapped.epochs + 1) if workers == 1
            else 2 * (1 if handover == "1" else run.rounds))
    assert plan_model.exchange_calls(corpus, swapped, workers) == pytest.approx(workers * (urls + 5 + 5))


def test_a_calibrations_rate_per_worker_leaves_its_rounds_out(lee_corpus):
    """A calibration of 2 workers on Lee trained at a rate its rounds set: the table took that rate, halved, for
    each worker's compute, and so said one worker would be slower still."""
    corpus = Corpus(lee_corpus)
    cfg = TrainConfig(dim=100, epochs=10, num_ps=2, num_workers=2, progress=False)
    rounds = 2 * 2 * 16  # 2 epochs of 32 rounds
    compute = corpus.num_tokens * 2 / (2 * 1.5e6)  # 2 workers at 1.5M tokens/s each, 2 epochs
    train_seconds = compute + rounds * plan_model.ROUND_SECONDS
    cal = {"summary": {"tokens_per_second": 2 * corpus.num_tokens / train_seconds, "train_seconds": train_seconds,
                       "worker_seconds": {"compute": compute * 2}},
           "workers": 2, "epochs": 2, "corpus_tokens": corpus.num_tokens}
    assert plan_model.worker_rate(cal, cfg, corpus) == pytest.approx(1.5e6)
    one = plan_model.scaling_plan(corpus, cfg, cal, network_gbps=10, workers=(1,))[0]
    assert one["alone"]["compute"] == pytest.approx(1.5e6)
    # a two-point calibration's rate is a difference of two slices' times, in which the rounds cancel
    two_point = {**cal, "two_point": {"tokens": [1, 2], "seconds": [1, 2]}}
    assert plan_model.worker_rate(two_point, cfg, corpus) == pytest.approx(cal["summary"]["tokens_per_second"] / 2)


@pytest.mark.parametrize("rate", [0.5e6, 2e6, 15e6])
def test_train_takes_fewer_workers_where_the_model_says_more_are_slower(lee_corpus, rate):
    corpus = Corpus(lee_corpus)
    cfg = TrainConfig(dim=100, epochs=40, num_ps=2, num_workers=2, progress=False)
    chosen, line = plan.choose_workers(corpus, cfg, worker_rate=rate)
    assert chosen.num_workers == 1 and dataclasses.replace(chosen, num_workers=2) == cfg
    rows = {r["workers"]: r["tokens_per_second"]
            for r in plan_model.scaling_plan(corpus, cfg, {"summary": {"tokens_per_second": rate}, "workers": 1},
                                          network_gbps=plan.CHOICE_NETWORK_GBPS, workers=(1, 2))}
    assert line.startswith(f"train: 2 workers are predicted to train this corpus at {rows[2] / 1e6:.2f}M tokens/s "
                           f"and 1 worker at {rows[1] / 1e6:.2f}M"), line
    assert "--force-workers" in line and "\n" not in line
    # told to, it trains with what it was asked for
    forced = dataclasses.replace(cfg, force_workers=True)
    assert plan.choose_workers(corpus, forced, worker_rate=rate) == (forced, None)
    # 8 asked for: the fastest of fewer
    chosen, line = plan.choose_workers(corpus, dataclasses.replace(cfg, num_workers=8), worker_rate=rate)
    assert chosen.num_workers == 1 and line.startswith("train: 8 workers are predicted")


def test_the_sample_asked_on_2_workers_trains_on_one_and_the_line_names_the_epochs_calls(sample_corpus):
    """The sample trained on 2 workers at 0.73–0.86× one worker's tokens/s here (docs/benchmarks.md, "Fewer
    workers where more would not pay"), and train kept 2: the model counted the rows each worker pulls and
    pushes at an epoch's ends as bytes over 10 Gbit/s (about 2 ms), where they took 15–20 ms of Ray calls."""
    corpus = Corpus(sample_corpus[0])
    cfg = TrainConfig(dim=100, epochs=5, num_ps=2, num_workers=2, cpus_per_worker=1, progress=False)
    chosen, line = plan.choose_workers(corpus, cfg)
    assert chosen.num_workers == 1
    cal = {"summary": {"tokens_per_second": plan.UNCALIBRATED_TOKENS_PER_SECOND["cpu"]}, "workers": 1}
    rows = {r["workers"]: r for r in plan_model.scaling_plan(corpus, cfg, cal, plan.CHOICE_NETWORK_GBPS,
                                                             workers=(1, 2))}
    two = rows[2]
    assert two["bound"] == "calls" and two["exchange_calls_per_epoch"] == pytest.approx(2 * (2 + 1 / 5 + 1))
    assert two["calls_seconds_per_epoch"] == pytest.approx(2 * plan_model.ROUND_SECONDS
                                                            + two["exchange_calls_per_epoch"] * plan_model.EXCHANGE_SECONDS)
    compute_ms = corpus.num_tokens / 2 / plan.UNCALIBRATED_TOKENS_PER_SECOND["cpu"] * 1e3
    assert (f"(an epoch's Ray calls take about {two['calls_seconds_per_epoch'] * 1e3:.0f} ms: 2 rounds at 7 ms and "
            f"6.4 exchanges of held rows a server at 5 ms, against {compute_ms:.0f} ms of a worker's computing;") in line
    assert line.startswith(f"train: 2 workers are predicted to train this corpus at "
                           f"{two['tokens_per_second'] / 1e6:.2f}M tokens/s and 1 worker at "
                           f"{rows[1]['tokens_per_second'] / 1e6:.2f}M")


@pytest.mark.parametrize("users", [200_000, 20_000_000])
@pytest.mark.parametrize("rate", [0.5e6, 2e6, 15e6])
def test_a_big_corpus_keeps_the_workers_asked_for(sample_corpus, users, rate):
    """The 200k-user corpus trained 1.8× faster on 2 workers than on one: no rate a CPU or GPU worker has makes
    the model send it back to one (the sample's shape scaled up, as plan --users does)."""
    corpus = plan_calibration.scaled_corpus(Corpus(sample_corpus[0]), users)
    for workers in (2, 4):
        cfg = TrainConfig(dim=100, epochs=10, num_ps=2, num_workers=workers, progress=False)
        assert plan.choose_workers(corpus, cfg, worker_rate=rate) == (cfg, None)


def test_one_worker_asked_for_is_one_worker(lee_corpus):
    one = TrainConfig(num_workers=1, progress=False)
    assert plan.choose_workers(Corpus(lee_corpus), one) == (one, None)


def test_the_train_command_trains_with_the_faster_count_and_says_so(ray_cluster, lee_corpus, tmp_path, capsys):
    from doc2vec_dist.cli import main

    argv = ["train", "--corpus", lee_corpus, "--dim", "8", "--epochs", "1", "--num-workers", "2", "--cpus-per-worker", "1",
            "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "m1")]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("train: 2 workers are predicted")]
    assert len(said) == 1 and "training with 1 worker" in said[0], err
    with open(tmp_path / "m1" / "config.json") as fh:
        assert json.load(fh)["num_workers"] == 1
    assert main([*argv, "--force-workers", "--out", str(tmp_path / "m2")]) == 0
    assert "workers are predicted" not in capsys.readouterr().err
    with open(tmp_path / "m2" / "config.json") as fh:
        assert json.load(fh)["num_workers"] == 2


def test_the_fewer_workers_benchmark_takes_named_corpora_and_refuses_a_value_without_its_name(sample_corpus, tmp_path):
    from conftest import load_benchmark

    bench = load_benchmark("fewer_workers")
    assert bench.named_corpora([f"s={sample_corpus[0]}"]) == {"s": sample_corpus[0]}
    with pytest.raises(SystemExit, match=r"--corpus '/x': give it as NAME=PATH"):
        bench.named_corpora(["/x"])
    with pytest.raises(SystemExit, match=r"holds no prepared corpus"):
        bench.named_corpora([f"e={tmp_path}"])


def test_each_row_of_an_estimate_takes_its_own_counts_default_segments():
    """--segments' default on events depends on the workers (settings.default_segments: 4 where each worker's
    round holds ROUND_TOKENS tokens): a plan of 20M tokens counts 2 and 4 workers' rounds at 4 segments and 8
    workers' at one, as their runs would walk it, not every row at the planned count's segments."""
    cfg = TrainConfig(dim=16, epochs=1, num_ps=2, progress=False)
    result = plan.plan(None, cfg, run_calibration=False, users=1_000_000, urls=5000, tokens_per_user=20)
    assert result["corpus"]["tokens"] == 20_000_000
    rounds = {r["workers"]: r["rounds_per_epoch"] for r in result["scaling"]}
    assert {w: rounds[w] for w in (1, 2, 4, 8)} == {1: 1, 2: 2 * 4, 4: 4 * 4, 8: 8}
    given = plan.plan(None, dataclasses.replace(cfg, segments=2), run_calibration=False, users=1_000_000, urls=5000,
                      tokens_per_user=20)
    assert {r["workers"]: r["rounds_per_epoch"] for r in given["scaling"]}[8] == 16  # given: every row's
