"""Subsampling, the negative table, pair building and unique rows, against gensim's definitions."""

import numpy as np
import pytest

from doc2vec_dist.sampling import NegativeTable, build_examples, keep_probabilities, unique_rows


def test_keep_probability_matches_gensim_formula():
    counts = np.array([10_000, 1_000, 100, 10, 1])
    sample = 1e-3
    t = sample * counts.sum()
    expected = np.minimum(1.0, (np.sqrt(counts / t) + 1) * t / counts)
    np.testing.assert_allclose(keep_probabilities(counts, sample), expected, rtol=1e-6)
    assert keep_probabilities(counts, sample)[0] < 0.2  # the most frequent word is cut hard
    assert keep_probabilities(counts, sample)[-1] == 1.0
    assert (keep_probabilities(counts, 0) == 1).all()


def test_keep_probability_matches_gensim_vocab():
    from gensim.models import Word2Vec

    rng = np.random.default_rng(0)
    sentences = [[f"w{int(x)}" for x in rng.zipf(1.3, 50) if x < 200] for _ in range(300)]
    model = Word2Vec(vector_size=8, min_count=1, sample=1e-2, workers=1)
    model.build_vocab(sentences)
    counts = np.array([model.wv.get_vecattr(w, "count") for w in model.wv.index_to_key])
    gensim_keep = np.array([model.wv.get_vecattr(w, "sample_int") for w in model.wv.index_to_key]) / 2**32
    np.testing.assert_allclose(keep_probabilities(counts, 1e-2), np.minimum(gensim_keep, 1.0), atol=1e-6)


def test_negative_table_follows_unigram_power():
    counts = np.array([1000, 500, 100, 10, 0])
    table = NegativeTable(counts, 0.75)
    rng = np.random.default_rng(1)
    draws = table.draw(rng, 400_000)
    freq = np.bincount(draws, minlength=5) / len(draws)
    expected = counts**0.75 / (counts**0.75).sum()
    np.testing.assert_allclose(freq, expected, atol=3e-3)
    assert freq[4] == 0  # a word with count 0 is never a negative


def _vose_in_python(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The alias table as it was built before it was compiled (runs must keep their draws)."""
    n = len(p)
    scaled = p * n
    accept, alias = np.ones(n, dtype=np.float64), np.arange(n, dtype=np.int64)
    small, large = list(np.flatnonzero(scaled < 1.0)), list(np.flatnonzero(scaled >= 1.0))
    while small and large:
        s, g = small.pop(), large[-1]
        accept[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        if scaled[g] < 1.0:
            large.pop()
            small.append(g)
    return accept.astype(np.float32), alias


@pytest.mark.parametrize("n, zeros", [(1, 0), (7, 2), (5000, 0), (50_000, 1000)])
def test_the_alias_table_gives_each_word_its_probability_and_the_tables_of_before(n, zeros):
    rng = np.random.default_rng(n)
    counts = np.sort(rng.zipf(1.3, n))[::-1].astype(np.int64)  # by descending count, as ids are
    counts[n - zeros:] = 0
    table = NegativeTable(counts, 0.75)
    accept, alias = _vose_in_python(table.p)
    np.testing.assert_array_equal(table.accept, accept)
    np.testing.assert_array_equal(table.alias, alias)
    # slot i gives word i with accept[i], else alias[i]: each word's share of the n slots is its p
    share = table.accept.astype(np.float64) + 0.0
    implied = np.bincount(np.arange(n), weights=share, minlength=n) + np.bincount(table.alias, weights=1.0 - share,
                                                                                  minlength=n)
    np.testing.assert_allclose(implied / n, table.p, atol=1e-6 / n + 1e-7 * table.p.max())


def test_dbow_examples_mask_negatives_equal_to_positive_and_drops_subsampled():
    rng = np.random.default_rng(2)
    counts = np.array([100, 1, 1])
    offsets = np.array([0, 3, 6])
    tokens = np.array([0, 1, 2, 2, 1, 0], dtype=np.int32)
    keep = np.array([0.0, 1.0, 1.0], dtype=np.float32)  # word 0 always dropped
    ex = build_examples(offsets, tokens, keep, NegativeTable(counts), 4, rng)
    assert len(ex) == 4 and ex.raw_tokens == 6 and ex.ctx.shape == (4, 1)
    assert 0 not in ex.target
    assert sorted(zip(ex.ctx[:, 0].tolist(), ex.target.tolist())) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    np.testing.assert_array_equal(ex.neg_mask, ex.neg != ex.target[:, None])


def test_unique_rows_inverse():
    ids = np.array([5, 3, 5, 9, 3, 0])
    uniq, inv = unique_rows(ids, 10)
    np.testing.assert_array_equal(uniq, [0, 3, 5, 9])
    np.testing.assert_array_equal(uniq[inv], ids)


@pytest.mark.parametrize("bad", [np.array([0, 0, 0])])
def test_negative_table_refuses_empty_vocabulary(bad):
    with pytest.raises(ValueError):
        NegativeTable(bad)


def one_doc(tokens, **kw):
    counts = np.ones(10)
    return build_examples(np.array([0, len(tokens)]), np.array(tokens, dtype=np.int32), np.ones(10, np.float32),
                          NegativeTable(counts), 2, np.random.default_rng(0), **kw)


def test_dbow_words_gives_skip_gram_examples_then_the_document_for_each_token():
    ex = one_doc([3, 4, 5], dbow_words=True, window=1)  # window 1: the reduced window is always 1
    n_docs = ex.n_docs
    got = [(int(c) - n_docs if c >= n_docs else "doc", int(t)) for c, t in zip(ex.ctx[:, 0], ex.target)]
    assert got == [(4, 3), ("doc", 3), (3, 4), (5, 4), ("doc", 4), (4, 5), ("doc", 5)]


def test_dm_context_is_the_document_and_the_window():
    ex = one_doc([3, 4, 5], mode="dm", window=1)
    rows = [sorted(int(c) - ex.n_docs for c, m in zip(ctx[1:], mask[1:]) if m) for ctx, mask in zip(ex.ctx, ex.ctx_mask)]
    assert (ex.ctx[:, 0] == 0).all() and ex.ctx_mask[:, 0].all()
    assert ex.target.tolist() == [3, 4, 5]
    assert rows == [[4], [3, 5], [4]]


def test_reduced_windows_match_gensim_on_average():
    # window 5, b ~ U[0, 5): a token far from the edges sees 2·(5 − b) words, 6 on average
    ex = one_doc(list(np.arange(2000) % 10), dbow_words=True, window=5)
    closes = np.flatnonzero(ex.ctx[:, 0] == 0)  # the document's example closes each token's group
    sizes = np.diff(np.concatenate([[-1], closes])) - 1
    assert len(sizes) == 2000 and abs(sizes[10:-10].mean() - 6.0) < 0.3
    assert sizes.max() == 10 and sizes[10:-10].min() == 2


def test_micro_batches_shrink_when_a_chunk_has_few_documents():
    rng = np.random.default_rng(3)
    counts = np.ones(50)
    few = build_examples(np.array([0, 400, 800]), rng.integers(0, 50, 800).astype(np.int32), np.ones(50, np.float32),
                         NegativeTable(counts), 2, rng, micro_batch=1024)
    assert few.micro_batch == 32  # 2 documents: the floor
    offsets = np.arange(0, 20_001, 10)  # 2,000 documents of 10 tokens
    many = build_examples(offsets, rng.integers(0, 50, 20_000).astype(np.int32), np.ones(50, np.float32),
                          NegativeTable(counts), 2, rng, micro_batch=1024)
    assert many.micro_batch == 1024


def test_shared_negatives_are_drawn_per_micro_batch():
    ex = one_doc(list(range(10)) * 10, shared_negatives=7, micro_batch=32)
    assert ex.neg_mask is None
    assert ex.neg.shape == (-(-len(ex) // ex.micro_batch), 7)
