"""PV-DBOW examples drawn on the device (device_examples), run with the CPU as the device: gensim's
distributions, the grouped interleaved order, and determinism by seed."""

from __future__ import annotations

import numpy as np
import torch

from doc2vec_dist.device_examples import INTERLEAVE_GROUPS, DeviceTables, dbow_examples, generator
from doc2vec_dist.sampling import MIN_MICRO_BATCH, NegativeTable, keep_probabilities

CPU = torch.device("cpu")


def problem(vocab=50, docs=400, lengths=(50,), sample=1e-2, seed=0):
    """A Zipf-like corpus: documents of the given lengths (cycled), the tables a worker holds for it,
    and a shuffled compact row per document (what the worker's routing gives)."""
    rng = np.random.default_rng(seed)
    counts = (1e5 / np.arange(1, vocab + 1) ** 2).astype(np.int64) + 1
    negatives = NegativeTable(counts)
    per_doc = np.resize(np.asarray(lengths), docs)
    offsets = np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64)
    tokens = rng.choice(vocab, int(offsets[-1]), p=counts / counts.sum()).astype(np.int32)
    keep = keep_probabilities(counts, sample)
    rows = rng.permutation(docs).astype(np.int64)
    return (torch.from_numpy(rows), torch.from_numpy(offsets), torch.from_numpy(tokens),
            DeviceTables(keep, negatives, CPU), keep, negatives)


def draw(seed=3, micro_batch=1024, **kw):
    rows, offsets, tokens, tables, keep, negatives = problem(**kw)
    ex = dbow_examples(rows, offsets, tokens, tables, 5, generator(seed, CPU), micro_batch)
    return ex, rows, offsets, tokens, keep, negatives


def test_words_are_kept_with_gensims_subsampling_probability():
    ex, _, _, tokens, keep, _ = draw(docs=2000)
    seen = np.bincount(tokens.numpy(), minlength=len(keep))
    kept = np.bincount(ex.target.numpy(), minlength=len(keep)) / np.maximum(seen, 1)
    frequent = seen > 2000
    assert frequent.sum() >= 5 and keep[frequent].min() < 0.5  # subsampling really bites on these
    np.testing.assert_allclose(kept[frequent], keep[frequent], atol=0.02)


def test_negatives_follow_unigram_to_the_three_quarters_and_a_draw_equal_to_the_target_is_masked():
    ex, *_, negatives = draw(docs=2000, sample=0)
    drawn = np.bincount(ex.neg.numpy().ravel(), minlength=len(negatives.p)) / ex.neg.numel()
    np.testing.assert_allclose(drawn, negatives.p, atol=0.003)
    assert ex.neg.shape == (len(ex), 5)
    assert torch.equal(ex.neg_mask, ex.neg != ex.target[:, None]) and (~ex.neg_mask).any()


def test_each_document_walks_its_tokens_in_order_and_its_rows_are_the_routed_ones():
    ex, rows, offsets, tokens, *_ = draw(sample=0, lengths=(3, 50, 7, 120))
    assert len(ex) == len(tokens)  # sample 0: every token is an example
    ctx = ex.ctx[:, 0].numpy()
    for d in range(len(rows)):
        mine = ex.target.numpy()[ctx == rows[d].item()]
        np.testing.assert_array_equal(mine, tokens[offsets[d]:offsets[d + 1]].numpy())


def test_documents_interleave_in_groups_one_round_per_micro_batch():
    docs = 400
    ex, *_ = draw(sample=0, docs=docs, lengths=(50,), micro_batch=4096)
    group = docs // INTERLEAVE_GROUPS  # at least that many groups, here of 100 documents each
    assert ex.micro_batch == group
    ctx = ex.ctx[:, 0].numpy()
    # micro-batch after micro-batch: one token of each of one group's documents, the same group
    # for 50 rounds, then the next group's
    batches = ctx.reshape(-1, group)
    assert all(len(set(b)) == group for b in batches)
    groups = [frozenset(b) for b in batches]
    assert len(set(groups)) == INTERLEAVE_GROUPS
    assert all(groups[i] == groups[i // 50 * 50] for i in range(len(groups)))
    # a smaller micro_batch makes smaller groups; a tiny chunk still gets MIN_MICRO_BATCH examples
    assert draw(sample=0, micro_batch=64)[0].micro_batch == 64
    assert draw(sample=0, docs=8, micro_batch=1024)[0].micro_batch == MIN_MICRO_BATCH


def test_the_same_seed_draws_the_same_examples_and_another_seed_others():
    a, b, c = draw(seed=5)[0], draw(seed=5)[0], draw(seed=6)[0]
    for name in ("ctx", "target", "neg", "neg_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.neg[:100], c.neg[:100]) and not torch.equal(a.ctx, c.ctx)


def test_a_chunk_whose_tokens_are_all_subsampled_away_gives_no_examples():
    rows, offsets, tokens, tables, *_ = problem()
    tables.keep.zero_()
    ex = dbow_examples(rows, offsets, tokens, tables, 5, generator(1, CPU), 1024)
    assert len(ex) == 0 and ex.ctx.shape == (0, 1) and ex.neg.shape == ex.neg_mask.shape == (0, 5)
