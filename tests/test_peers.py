"""The block schedule's rounds without the driver (peers.py): each worker takes its next block from the
worker that held it and waits for no one else. The protocol alone, then two workers in this process, each
on a thread of its own as the workers' processes run: the same servers' rows, bit for bit, as the rounds
run one after another; and a checkpoint taken while one waits for its block leaves the servers whole."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from doc2vec_dist import client
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.peers import WAITING, Outbox, started
from doc2vec_dist.ps import ParameterServer, table_specs
from doc2vec_dist.schedule import Blocks
from doc2vec_dist.settings import resolve
from doc2vec_dist.units import Position, plan_units
from doc2vec_dist.worker import Worker

NUM_PS = 2
CONFIG = TrainConfig(dim=8, epochs=2, sample=0, num_ps=NUM_PS, num_workers=2, cpus_per_worker=1, macro_batch=2048,
                     segments=2, progress=False)


def test_a_giver_answers_with_the_block_once_filed_and_the_servers_where_it_started_after_that_round():
    box = Outbox()
    box.begin(0, 0)
    t0 = time.monotonic()
    assert box.hand(0, 1, {"round": 1}, wait=0.05) == WAITING and time.monotonic() - t0 >= 0.05
    entry = {"block": 1, "rows": {"words_out": np.ones(2)}, "round": 1}
    threading.Timer(0.05, box.give, (0, 1, entry)).start()
    t0 = time.monotonic()
    assert box.hand(0, 1, {"round": 1, "tokens": 7}, wait=5) is entry
    assert time.monotonic() - t0 < 2  # woken by the filing, not by the wait's end
    assert box.asked[0] == {"round": 1, "tokens": 7}  # where its taker's round started: a restart starts there
    box.give(0, 2, {**entry, "round": 2})
    box.give(0, 3, {**entry, "round": 3, "rows": None})  # gone home through the servers
    assert [e["round"] for e in box.unclaimed(0)] == [2]  # round 1's block was handed out: its taker has it
    box.taker_restarts(0, 1)  # ... until it died: restarted at round 1's start, it holds none of them
    assert [e["round"] for e in box.unclaimed(0)] == [1, 2]
    box.taker_restarts(0, 2)  # at its checkpointed position in round 1: the servers' copy, newer than the entry
    assert [e["round"] for e in box.unclaimed(0)] == [2]
    box.hand(0, 2, {"round": 2}, wait=0)  # its taker finished round 1: that entry is done with
    assert sorted(box.entries) == [(0, 2), (0, 3)] and box.unclaimed(0) == []
    box.begin(0, 3)  # resumed (or restarted) at round 3: what it did not train it will not file
    assert box.hand(0, 3, {"round": 3}, wait=0)["round"] == 3  # (filed before: still there)
    box.begin(1, 2)
    assert box.entries == {} and box.hand(1, 2, {"round": 2}, wait=0) is None  # the servers hold it
    box.begin(1, 2, restarted=True)
    assert box.hand(1, 2, {"round": 2}, wait=0) == {"gone": True, "rows": None}  # went with the process
    assert box.hand(1, 3, {"round": 3}, wait=0) == WAITING


def test_a_position_has_started_its_round_once_a_batch_of_it_was_trained():
    assert not started(Position(0, round=3, tokens=100))
    assert started(Position(0, unit=1, round=3)) and started(Position(0, row=5, round=3))
    assert started(Position(0, step=2, round=3))


def _servers(corpus: Corpus) -> tuple[list, dict]:
    tables = table_specs(CONFIG, corpus)
    return [client.LocalServer(ParameterServer(s, NUM_PS, tables, CONFIG.seed)) for s in range(NUM_PS)], tables


def _tables(servers) -> dict:
    return {name: [s.server.tables[name].copy() for s in servers] for name in ("docs", "words_out")}


def _pool(corpus: Corpus, servers, tables, peers: bool) -> list[Worker]:
    plan, settings = plan_units(corpus, 2), resolve(CONFIG, corpus)
    pool: list[Worker] = []
    for i in range(2):
        pool.append(Worker(i, plan[i], corpus.path, settings, servers, tables, peers=pool if peers else None))
    return pool


def _one_after_another(pool: list[Worker], epoch: int) -> None:
    """The rounds as a driver running them one after another hands the blocks on (Worker.run_epoch)."""
    starts, handed = [Position(epoch)] * 2, [None] * 2
    for r in range(pool[0].rounds):
        last = [w.run_epoch(epoch, starts[i], handed[i]) for i, w in enumerate(pool)]
        by_block = {h["block"]: h for h in (s.pop("handover") for s in last) if h is not None}
        handed = [by_block.get(Blocks.held(i, r + 1, 2)) for i in range(2)]
        starts = [Position(epoch, round=r + 1, tokens=s["tokens"], pairs=s["pairs"], loss=s["loss"]) for s in last]


def _threads(calls) -> list:
    out, errors = [None] * len(calls), []

    def run(i, call):
        try:
            out[i] = call()
        except BaseException as exc:  # noqa: BLE001 (raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return out


def _compare(a: dict, b: dict) -> None:
    for name, rows in a.items():
        for x, y in zip(rows, b[name]):
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture(scope="module")
def one_after_another(small_corpus) -> dict:
    corpus = Corpus(small_corpus)
    servers, tables = _servers(corpus)
    try:
        pool = _pool(corpus, servers, tables, peers=False)
        assert pool[0].rounds == 4  # 2 segments of 2 rounds
        for epoch in range(CONFIG.epochs):
            _one_after_another(pool, epoch)
        return _tables(servers)
    finally:
        for server in servers:
            server.close()


def test_workers_passing_blocks_to_each_other_train_what_rounds_one_after_another_train(small_corpus,
                                                                                      one_after_another):
    corpus = Corpus(small_corpus)
    servers, tables = _servers(corpus)
    try:
        pool = _pool(corpus, servers, tables, peers=True)
        for epoch in range(CONFIG.epochs):
            done = _threads([lambda w=w, e=epoch: w.run_rounds(e) for w in pool])
            assert all(s["epoch"] == epoch and s["round"] == pool[0].rounds - 1 for s in done)
        _compare(_tables(servers), one_after_another)
    finally:
        for server in servers:
            server.close()


def test_a_checkpoint_while_a_worker_waits_for_its_block_writes_the_block_it_handed_on(small_corpus,
                                                                                      one_after_another):
    """Worker 0 trains its first round and waits for worker 1 (not started) to hand it the next block:
    paused there, its position is that round's start, and the block it handed on, which worker 1 has
    not taken, is written by the flush the driver asks of it (Run._checkpoint_mid_epoch). Resumed, both
    finish the run with the same rows as ever."""
    corpus = Corpus(small_corpus)
    servers, tables = _servers(corpus)
    try:
        w0, w1 = pool = _pool(corpus, servers, tables, peers=True)
        first = threading.Thread(target=lambda: w0.run_rounds(0))
        first.start()
        deadline = time.monotonic() + 60
        while (0, 1) not in w0.outbox.entries:  # round 0 done, its block filed for worker 1's round 1
            assert time.monotonic() < deadline
            time.sleep(0.01)
        at = w0.pause()
        assert (at.epoch, at.round, at.unit, at.step) == (0, 1, 0, 0) and at.tokens > 0
        block = w0.outbox.entries[(0, 1)]["block"]
        ids = w0._blocks.ids(block)
        handed = w0.client.handed["words_out"]  # (as the servers store them)

        def server_rows():
            return np.concatenate([s.server.tables["words_out"][ids[ids % NUM_PS == k] // NUM_PS]
                                   for k, s in enumerate(servers)])

        assert not np.array_equal(server_rows(), handed)  # still the epoch's start's
        assert w1.pause() == Position(0)  # (idle: its epoch not begun)
        assert w1.flush_handed(0) == 0  # worker 1 filed nothing
        assert w0.flush_handed(0) == 1
        np.testing.assert_array_equal(server_rows(), handed)  # the servers' copy is the block as handed on
        w0.resume()
        w1.resume()
        second = threading.Thread(target=lambda: w1.run_rounds(0))
        second.start()
        first.join(timeout=120)
        second.join(timeout=120)
        assert not first.is_alive() and not second.is_alive()
        _threads([lambda w=w: w.run_rounds(1) for w in pool])
        _compare(_tables(servers), one_after_another)
    finally:
        for server in servers:
            server.close()


def test_a_run_resumed_from_workers_in_different_rounds_trains_the_same_rows(small_corpus, one_after_another):
    """The checkpoint of the test above, its workers in different rounds (worker 0 at round 1's start,
    worker 1 at the epoch's start), resumed by workers that start afresh from the servers' rows it holds:
    worker 0 waits for worker 1 to hand it the block of round 1 (its giver starts before that round), and
    the run ends with the same rows, bit for bit, as one that never stopped."""
    corpus = Corpus(small_corpus)
    servers, tables = _servers(corpus)
    try:
        w0, w1 = _pool(corpus, servers, tables, peers=True)
        first = threading.Thread(target=lambda: w0.run_rounds(0))
        first.start()
        deadline = time.monotonic() + 60
        while (0, 1) not in w0.outbox.entries:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        positions = [w0.pause(), w1.pause()]
        assert [p.round for p in positions] == [1, 0]
        for w in (w0, w1):
            w.flush_handed(0)
        saved = _tables(servers)  # the checkpoint's rows
        w0.resume()
        w1.resume()
        w1.run_rounds(0)  # (the first run goes on to its end, to leave no thread behind)
        first.join(timeout=120)
    finally:
        for server in servers:
            server.close()
    servers, tables = _servers(corpus)
    try:
        for name, parts in saved.items():
            for server, rows in zip(servers, parts):
                server.server.tables[name][:] = rows
        pool = _pool(corpus, servers, tables, peers=True)
        _threads([lambda w=w, p=p: w.run_rounds(0, p) for w, p in zip(pool, positions)])
        _threads([lambda w=w: w.run_rounds(1) for w in pool])
        _compare(_tables(servers), one_after_another)
    finally:
        for server in servers:
            server.close()
