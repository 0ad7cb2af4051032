"""PV-DBOW examples drawn on the device (device_examples), run with the CPU as the device: gensim's
distributions, the grouped interleaved order, and determinism by seed."""

from __future__ import annotations

import math

import numpy as np
import torch

from doc2vec_dist.device_examples import INTERLEAVE_GROUPS, DeviceTables, Shape, build, generator
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


def draw(seed=3, micro_batch=1024, shape=None, **kw):
    rows, offsets, tokens, tables, keep, negatives = problem(**kw)
    ex = build(rows, offsets, tokens, tables, 5, generator(seed, CPU), micro_batch, shape)
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


def test_a_fractional_count_of_negatives_uses_one_more_column_that_often():
    """The block schedule's negatives per example (schedule.Blocks): one more column, used by the
    fractional part of the examples."""
    rows, offsets, tokens, tables, _, _ = problem(docs=2000, sample=0)
    ex = build(rows, offsets, tokens, tables, 5.3, generator(3, CPU), 1024)
    whole = build(rows, offsets, tokens, tables, 5, generator(3, CPU), 1024)
    assert ex.neg.shape == (len(ex), 6) and whole.neg.shape == (len(whole), 5)
    # the sixth is used where its coin said so and it is not the target, as the others are not
    differ = (ex.neg[:, :5] != ex.target[:, None]).float().mean().item()
    assert abs(ex.neg_mask[:, 5].float().mean().item() - 0.3 * differ) < 0.02


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
    ex = build(rows, offsets, tokens, tables, 5, generator(1, CPU), 1024)
    assert len(ex) == 0 and ex.ctx.shape == (0, 1) and ex.neg.shape == ex.neg_mask.shape == (0, 5)


# -- dbow_words and PV-DM: reduced windows, built on the device ----------------------------------------------

VOCAB = 50


def by_document(ex, rows, offsets, tokens):
    """For each example whose first context row is a document (rows are offset past the VOCAB word
    rows, as the worker places them), (document, position of its token in the document)."""
    doc_of_row = {int(r) + VOCAB: d for d, r in enumerate(rows)}
    seen = np.zeros(len(rows), dtype=np.int64)
    places = []
    for i, row in enumerate(ex.ctx[:, 0].tolist()):
        if row in doc_of_row:
            d = doc_of_row[row]
            places.append((i, d, int(seen[d])))
            seen[d] += 1
    return places


def windowed(shape, docs=300, window=5, seed=7):
    rows, offsets, tokens, tables, *_ = problem(vocab=VOCAB, docs=docs, lengths=(40, 13, 25), sample=0)
    ex = build(rows + VOCAB, offsets, tokens, tables, 5, generator(seed, CPU), 4096,
               Shape(shape, shape == "dbow_words", window) if shape == "dm" else Shape("dbow", True, window))
    return ex, rows, offsets.numpy(), tokens.numpy()


def test_dbow_words_gives_each_token_its_reduced_window_then_its_document_with_gensims_window_sizes():
    window = 5
    ex, rows, offsets, tokens = windowed("dbow_words", window=window)
    places = by_document(ex, rows, offsets, tokens)
    assert len(places) == len(tokens)  # sample 0: one document example per token
    ctx, target = ex.ctx[:, 0].numpy(), ex.target.numpy()
    reaches = []
    start = 0
    for i, d, p in places:  # the examples before a token's document example are its skip-gram ones
        doc = tokens[offsets[d]:offsets[d + 1]]
        assert target[i] == doc[p] and (target[start:i] == doc[p]).all()
        words = sorted(ctx[start:i].tolist())
        assert all(w < VOCAB for w in words)  # word rows: a word's id
        fits = [r for r in range(1, window + 1)
                if sorted(doc[max(0, p - r):p].tolist() + doc[p + 1:p + 1 + r].tolist()) == words]
        assert fits, (d, p)
        if window <= p < len(doc) - window:  # an inner token: its window is not cut by the document's ends
            reaches.append((i - start) // 2)
        start = i + 1
    assert start == len(ex)
    share = np.bincount(reaches, minlength=window + 1)[1:] / len(reaches)
    np.testing.assert_allclose(share, 1 / window, atol=0.02)  # reach uniform in 1..window, as gensim's
    assert ex.ctx_mask is None


def test_pv_dm_context_is_the_document_and_its_reduced_window_masked_where_missing():
    window = 4
    ex, rows, offsets, tokens = windowed("dm", window=window)
    assert ex.ctx.shape == (len(tokens), 1 + 2 * window) and ex.ctx_mask.shape == ex.ctx.shape
    places = by_document(ex, rows, offsets, tokens)
    assert len(places) == len(tokens)
    offsets_of = [*range(-window, 0), *range(1, window + 1)]
    reaches = []
    for i, d, p in places:
        doc = tokens[offsets[d]:offsets[d + 1]]
        assert ex.target[i] == doc[p] and ex.ctx_mask[i, 0]
        valid = ex.ctx_mask[i, 1:].numpy()
        reach = max(abs(o) for o, v in zip(offsets_of, valid) if v) if valid.any() else 0
        for o, v, w in zip(offsets_of, valid, ex.ctx[i, 1:].tolist()):
            assert v == (abs(o) <= reach and 0 <= p + o < len(doc))
            if v:
                assert w == doc[p + o]
        if window <= p < len(doc) - window:
            reaches.append(reach)
    share = np.bincount(reaches, minlength=window + 1)[1:] / len(reaches)
    np.testing.assert_allclose(share, 1 / window, atol=0.02)


def test_a_window_micro_batch_holds_one_round_of_a_group_and_hot_input_rows_are_scaled():
    ex, rows, offsets, tokens = windowed("dbow_words", docs=300)
    per_token = len(ex) / len(tokens)  # examples per token: its document's and its window's (~1 + 5.5)
    group = 300 // INTERLEAVE_GROUPS
    assert ex.micro_batch == math.ceil(group * per_token)
    first_round = by_document(ex, rows, offsets, tokens)[:group]  # one token of each of a group's documents
    assert all(p == 0 for _, _, p in first_round) and len({d for _, d, _ in first_round}) == group
    assert first_round[-1][0] < ex.micro_batch + 2 * 5  # ... which fill about one micro-batch
    # the device's scale is sampling.doc_step_scale's
    from doc2vec_dist.device_examples import step_scale
    from doc2vec_dist.sampling import doc_step_scale

    shuffle = torch.randperm(600, generator=torch.Generator().manual_seed(0))
    hot = torch.tensor([3] * 400 + list(range(10, 210)), dtype=torch.int64)[shuffle]  # ~170 of row 3 a micro-batch
    want = doc_step_scale(hot.numpy(), 256)
    got = step_scale(hot, 256)
    assert want is not None and got is not None
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert step_scale(torch.arange(600), 256) is None
