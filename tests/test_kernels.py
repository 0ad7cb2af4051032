"""The micro-batch math against a one-pair-at-a-time reference of gensim's PV-DBOW update."""

import numpy as np
import torch

from doc2vec_dist.kernels import micro_batch_alphas, train


def gensim_reference(docs, out, pairs, alpha):
    """gensim's train_document_dbow with negative sampling, true sigmoid, one pair at a time."""
    docs, out = docs.copy(), out.copy()
    for d, w, negs, mask in pairs:
        work = np.zeros_like(docs[d])
        for target, label, use in [(w, 1.0, True)] + [(n, 0.0, m) for n, m in zip(negs, mask)]:
            if not use:
                continue
            f = 1 / (1 + np.exp(-docs[d] @ out[target]))
            g = (label - f) * alpha
            work += g * out[target]
            out[target] += g * docs[d]
        docs[d] += work
    return docs, out


def random_problem(seed, n_docs=20, n_words=30, n=200, k=3, dim=8):
    rng = np.random.default_rng(seed)
    docs = ((rng.random((n_docs, dim)) - 0.5) / dim).astype(np.float32)
    out = (rng.normal(size=(n_words, dim)) * 0.1).astype(np.float32)
    d = rng.integers(0, n_docs, n)
    w = rng.integers(0, n_words, n)
    neg = np.stack([rng.choice(n_words, k, replace=False) for _ in range(n)])
    mask = neg != w[:, None]
    return docs, out, d, w, neg, mask


def run_ours(docs, out, d, w, neg, mask, alpha, micro_batch):
    D, O = torch.from_numpy(docs.copy()), torch.from_numpy(out.copy())
    n_micro = -(-len(w) // micro_batch)
    loss = train(D, O, torch.from_numpy(d)[:, None], torch.from_numpy(w), torch.from_numpy(neg),
                 torch.from_numpy(mask), torch.full((n_micro,), alpha), micro_batch)
    return D.numpy(), O.numpy(), loss


def test_micro_batch_of_one_equals_gensim_sequential_update():
    docs, out, d, w, neg, mask = random_problem(0)
    ref_docs, ref_out = gensim_reference(docs, out, list(zip(d, w, neg, mask)), 0.05)
    our_docs, our_out, _ = run_ours(docs, out, d, w, neg, mask, 0.05, micro_batch=1)
    np.testing.assert_allclose(our_docs, ref_docs, atol=1e-6)
    np.testing.assert_allclose(our_out, ref_out, atol=1e-6)


def test_larger_micro_batches_stay_close_to_sequential_sgd():
    docs, out, d, w, neg, mask = random_problem(1, n_docs=200, n_words=300, n=400)
    _ref_docs, ref_out = gensim_reference(docs, out, list(zip(d, w, neg, mask)), 0.025)
    _our_docs, our_out, _ = run_ours(docs, out, d, w, neg, mask, 0.025, micro_batch=64)
    moved = np.abs(ref_out - out).max()
    assert moved > 1e-3
    assert np.abs(our_out - ref_out).max() < 0.1 * moved


def test_loss_falls_when_training_repeats():
    docs, out, d, w, neg, mask = random_problem(2)
    losses = []
    for _ in range(30):
        docs, out, loss = run_ours(docs, out, d, w, neg, mask, 0.1, micro_batch=16)
        losses.append(loss)
    assert losses[-1] < 0.7 * losses[0]


def test_masked_negatives_do_not_move_anything():
    docs, out, d, w, neg, mask = random_problem(3, n=1)
    mask[:] = False
    before = out.copy()
    _, new_out, _ = run_ours(docs, out, d, w, neg, mask, 0.1, micro_batch=1)
    changed = np.flatnonzero(np.abs(new_out - before).sum(1) > 0)
    assert changed.tolist() == [w[0]]


def test_alpha_decays_linearly_to_min_alpha():
    a = micro_batch_alphas(0.025, 0.0001, done_before=0, batch_tokens=1000, planned_tokens=1000, n_micro=4)
    assert a[0] < 0.025 and a[-1] > 0.0001
    assert torch.all(a[1:] < a[:-1])
    end = micro_batch_alphas(0.025, 0.0001, done_before=2000, batch_tokens=10, planned_tokens=1000, n_micro=2)
    assert torch.allclose(end, torch.full((2,), 0.0001))
