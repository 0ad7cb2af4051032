"""The block schedule (schedule.py): how the URL rows are cut into blocks, who holds which when, and
what a worker trains of a chunk in a round."""

from __future__ import annotations

import numpy as np
import pytest

from doc2vec_dist.sampling import NegativeTable, keep_probabilities
from doc2vec_dist.schedule import Blocks


def zipf(vocab: int, top: float = 1e6) -> np.ndarray:
    return np.maximum(1, (top / np.arange(1, vocab + 1))).astype(np.int64)  # ids by descending count


def blocks_of(vocab: int, workers: int, epoch: int = 0, seed: int = 1, counts=None) -> Blocks:
    counts = zipf(vocab) if counts is None else counts
    return Blocks(counts, np.ones(vocab), workers, seed, epoch)


@pytest.mark.parametrize("vocab, workers", [(1, 2), (7, 3), (1000, 4), (10_001, 8)])
def test_every_row_is_in_exactly_one_block_at_its_local_row(vocab, workers):
    for epoch in range(3):
        blocks = blocks_of(vocab, workers, epoch)
        every = np.concatenate([blocks.ids(b) for b in range(workers)])
        np.testing.assert_array_equal(np.sort(every), np.arange(vocab))
        sizes = [len(blocks.ids(b)) for b in range(workers)]
        assert sum(sizes) == vocab
        for b in range(workers):  # a row's local index is its place in its block
            ids = blocks.ids(b)
            assert np.all(np.diff(ids) > 0)
            np.testing.assert_array_equal(blocks.local_of[ids], np.arange(len(ids)))
            assert np.all(blocks.block_of[ids] == b)


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_no_block_is_held_by_two_workers_in_a_round_and_each_worker_meets_every_block_once(workers):
    seen = np.zeros((workers, workers), int)
    for r in range(workers):
        held = [Blocks.held(w, r, workers) for w in range(workers)]
        assert sorted(held) == list(range(workers))  # a different block for every worker
        for w, b in enumerate(held):
            seen[w, b] += 1
    assert (seen == 1).all()


def test_blocks_share_the_work_evenly_so_rounds_end_together():
    vocab, workers, negative = 50_000, 8, 5
    counts = zipf(vocab)  # the top URL alone holds 9% of the tokens
    keep = keep_probabilities(counts, 1e-3)
    p = counts * keep / (counts * keep).sum()
    q = counts ** 0.75 / (counts ** 0.75).sum()
    for epoch in range(3):
        blocks = Blocks(counts, keep, workers, seed=3, epoch=epoch, negative=negative)
        work = np.array([(blocks.negatives_per_example[b] + 1) * p[blocks.ids(b)].sum() for b in range(workers)])
        assert work.max() / work.min() < 1.1, work  # examples a block trains: its tokens, and their negatives
    # ranks dealt out in turn instead (each block one of every W consecutive ids) leave a Zipf head uneven
    raw = counts / counts.sum()
    dealt = np.bincount(np.arange(vocab) % workers, weights=raw + negative * q, minlength=workers)
    assert dealt.max() / dealt.min() > 1.2, dealt


def test_over_a_rotation_each_url_is_drawn_as_a_negative_as_often_as_gensim_draws_it():
    """A block's negatives per example, negative × Q / P, make each URL's draws over the W rounds
    tokens × negative × q(u): gensim's count, though each draws from its own block only."""
    vocab, workers, negative = 20_000, 4, 5
    counts = zipf(vocab, 1e5)
    keep = keep_probabilities(counts, 1e-3)
    blocks = Blocks(counts, keep, workers, seed=1, epoch=0, negative=negative)
    kept = counts * keep
    expected = np.zeros(vocab)
    for b in range(workers):
        block = blocks.block(b, keep, counts, 0.75)
        tokens_in_block = kept[block.ids].sum()
        expected[block.ids] = tokens_in_block * block.negative * block.negatives.p
    gensim = kept.sum() * negative * counts ** 0.75 / (counts ** 0.75).sum()
    np.testing.assert_allclose(expected, gensim, rtol=1e-9)
    assert len(set(np.round(blocks.negatives_per_example, 6))) > 1  # the blocks do differ


def test_blocks_are_dealt_afresh_each_epoch_so_pairs_of_rows_share_a_block_sometimes():
    vocab, workers = 64, 4
    together = np.zeros((vocab, vocab), bool)
    for epoch in range(200):  # rows of equal counts: every pair
        blocks = blocks_of(vocab, workers, epoch, counts=np.full(vocab, 10))
        together |= blocks.block_of[:, None] == blocks.block_of[None, :]
    assert together.all()
    # a Zipf head, subsampled as by default: all but the few hottest rows meet nearly every other row
    vocab = 2000
    counts = zipf(vocab)
    keep = keep_probabilities(counts, 1e-3)
    together = np.zeros((vocab, vocab), bool)
    for epoch in range(60):
        block_of = Blocks(counts, keep, workers, seed=1, epoch=epoch).block_of
        together |= block_of[:, None] == block_of[None, :]
    met = together.mean(axis=1)
    assert met[20:].min() > 0.99 and met.mean() > 0.99, met[:20]
    a, b = Blocks(counts, keep, workers, 1, 0).block_of, Blocks(counts, keep, workers, 1, 1).block_of
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(Blocks(counts, keep, workers, 1, 5).block_of, Blocks(counts, keep, workers, 1, 5).block_of)


def test_a_chunk_trains_exactly_its_tokens_of_the_held_block_once_over_the_rounds():
    rng = np.random.default_rng(2)
    vocab, workers, docs = 300, 3, 40
    lengths = rng.integers(0, 12, docs)  # empty documents too
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(0, vocab, offsets[-1]).astype(np.int32)
    doc_ids = np.arange(100, 100 + docs)
    blocks = blocks_of(vocab, workers, epoch=2)
    met = []
    for b in range(workers):
        ids, offs, local = blocks.select(b, doc_ids, offsets, tokens)
        assert np.all(np.diff(offs) > 0)  # documents with no token in the block are left out
        for d, lo, hi in zip(ids, offs[:-1], offs[1:]):
            i = d - 100
            original = tokens[offsets[i]:offsets[i + 1]]
            # the document's tokens in this block, in their order, as the block's local rows
            np.testing.assert_array_equal(blocks.ids(b)[local[lo:hi]], original[blocks.block_of[original] == b])
            met.extend((d, t) for t in blocks.ids(b)[local[lo:hi]])
    everything = [(d, t) for d, lo, hi in zip(doc_ids, offsets[:-1], offsets[1:]) for t in tokens[lo:hi]]
    assert sorted(met) == sorted(everything)
    # split() gives every block's select() at once
    for b, part in enumerate(blocks.split(doc_ids, offsets, tokens)):
        for mine, theirs in zip(part, blocks.select(b, doc_ids, offsets, tokens)):
            np.testing.assert_array_equal(mine, theirs)
            assert mine.dtype == theirs.dtype


def test_a_block_draws_its_negatives_from_its_own_rows_by_count_to_the_075():
    vocab, workers = 1000, 4
    counts = np.arange(vocab, 0, -1).astype(np.int64)
    keep = np.linspace(0.2, 1.0, vocab)
    blocks = Blocks(counts, keep, workers, seed=1, epoch=0)
    block = blocks.block(2, keep, counts, 0.75)
    np.testing.assert_array_equal(block.keep, keep[block.ids])
    expected = counts[block.ids] ** 0.75
    np.testing.assert_allclose(block.negatives.p, expected / expected.sum())
    one = Blocks(counts, keep, 1, seed=1, epoch=7)  # one worker: every row, and the tables as they are
    whole = NegativeTable(counts)
    held = one.block(0, keep, counts, 0.75, whole)
    assert held.negatives is whole and held.keep is keep and held.negative == 5
    np.testing.assert_array_equal(held.ids, np.arange(vocab))
    _, _, toks = one.select(0, np.arange(3), np.array([0, 2, 2, 5]), np.array([5, 6, 7, 8, 9], np.int32))
    np.testing.assert_array_equal(toks, [5, 6, 7, 8, 9])


def test_the_in_process_copy_of_the_schedules_on_lee_trains_what_one_worker_trains_with_one_worker(tmp_path, capsys):
    """benchmarks/schedule_lee.py: with one worker the block schedule, local SGD and delayed are the sole writer
    (the same vectors as `one`); with two, each schedule trains something of its own; the table and the
    JSON hold every (order, schedule, workers, segments)."""
    import json

    from conftest import load_benchmark

    bench = load_benchmark("schedule_lee")
    docs, counts, test_rows = bench.lee_corpus(str(tmp_path / "work"), background_first=True)
    assert len(docs) == 350 and list(test_rows) == list(range(300, 350)) and all(len(d) for d in docs[300:])
    lengths = np.array([len(d) for d in docs])
    for how in bench.SPLITS:  # every split trains every document once
        cut = bench.split(lengths, 2, 8, how)
        assert sorted(np.concatenate([np.concatenate(own) for own in cut])) == list(range(350))
    interleaved = bench.split(lengths, 2, 8)  # round s: worker 0's segment s, then worker 1's: the corpus in order
    assert list(np.concatenate([part for s in range(8) for part in (interleaved[0][s], interleaved[1][s])])) == \
        list(range(350))
    first_half = np.concatenate(bench.split(lengths, 2, 8, "halves")[0])  # the engine's plan before: a run
    assert list(first_half) == list(range(len(first_half))) and 0 < len(first_half) < 350
    one = bench.train(docs, counts, 1, "one", seed=1, epochs=2)
    np.testing.assert_array_equal(bench.train(docs, counts, 1, "blocks", seed=1, epochs=2), one)
    np.testing.assert_allclose(bench.train(docs, counts, 1, "local-sgd", seed=1, epochs=2), one, atol=1e-6)
    np.testing.assert_array_equal(bench.train(docs, counts, 1, "delayed", seed=1, epochs=2), one)
    assert not np.allclose(bench.train(docs, counts, 1, "one", seed=1, epochs=2, hashed_seeds=True), one)
    two = {s: bench.train(docs, counts, 2, s, seed=1, epochs=2) for s in bench.SCHEDULES if s != "one"}
    for s, vectors in two.items():
        assert not np.allclose(vectors, one), s
    assert not np.allclose(two["blocks"], two["sequential"]) and not np.allclose(two["blocks"], two["doc-negatives"])
    assert not np.allclose(two["delayed"], two["sequential"]) and not np.allclose(two["delayed"], two["blocks"])

    out = tmp_path / "lee.json"
    result = bench.main(["--workers", "2", "--segments", "1", "2", "--seeds", "1", "--epochs", "2",
                         "--work", str(tmp_path / "work"), "--json", str(out)])
    assert json.loads(out.read_text()) == result
    runs = [(r["order"], r["schedule"], r["workers"], r["segments"]) for r in result["runs"]]
    expected = [("one", 1, 1)] + [(s, 2, g) for s in bench.SCHEDULES[1:] for g in (1, 2)]
    assert runs == [(o, *e) for o in ("test first", "background first") for e in expected]
    assert all(-1 < r["mean"] < 1 for r in result["runs"])
    table = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith(("| test first", "| background first"))]
    assert len(table) == len(runs) and table[0].endswith("| - |")
