"""The micro-batch math against a one-pair-at-a-time reference of gensim's PV-DBOW update."""

import numpy as np
import pytest
import torch

from doc2vec_dist.kernels import train


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


def dm_reference(inputs, out, examples, alpha):
    """gensim's train_document_dm with dm_mean=1 and negative sampling, one example at a time:
    h = mean of the context rows; work = Σ g·o; every context row += work (undivided)."""
    inputs, out = inputs.copy(), out.copy()
    for ctx, w, negs, mask in examples:
        h = inputs[ctx].mean(0)
        work = np.zeros_like(h)
        for target, label, use in [(w, 1.0, True)] + [(n, 0.0, m) for n, m in zip(negs, mask)]:
            if not use:
                continue
            g = (label - 1 / (1 + np.exp(-h @ out[target]))) * alpha
            work += g * out[target]
            out[target] += g * h
        for r in ctx:
            inputs[r] += work
    return inputs, out


def test_pv_dm_mean_context_equals_gensim_sequential_update():
    inputs, out, _, w, neg, mask = random_problem(4, n_docs=40, n=120)
    rng = np.random.default_rng(4)
    width = 5
    ctx = rng.integers(0, 40, (len(w), width))
    ctx_mask = rng.random((len(w), width)) < 0.7
    ctx_mask[:, 0] = True
    examples = [(c[m], t, n, k) for c, m, t, n, k in zip(ctx, ctx_mask, w, neg, mask)]
    ref_in, ref_out = dm_reference(inputs, out, examples, 0.05)
    I, O = torch.from_numpy(inputs.copy()), torch.from_numpy(out.copy())
    train(I, O, torch.from_numpy(ctx), torch.from_numpy(w), torch.from_numpy(neg), torch.from_numpy(mask),
          torch.full((len(w),), 0.05), 1, ctx_mask=torch.from_numpy(ctx_mask))
    np.testing.assert_allclose(I.numpy(), ref_in, atol=1e-6)
    np.testing.assert_allclose(O.numpy(), ref_out, atol=1e-6)


def test_row_adagrad_keeps_one_accumulator_per_row_in_the_last_column():
    docs, out, d, w, neg, mask = random_problem(5, n=1, k=2)
    mask[:] = True
    dim = docs.shape[1]
    D = torch.from_numpy(np.concatenate([docs, np.zeros((len(docs), 1), np.float32)], 1))
    O = torch.from_numpy(np.concatenate([out, np.zeros((len(out), 1), np.float32)], 1))
    train(D, O, torch.from_numpy(d)[:, None], torch.from_numpy(w), torch.from_numpy(neg), torch.from_numpy(mask),
          torch.full((1,), 0.1), 1, adagrad=True)
    # reference: the plain gradient of the doc row, then state += mean(g²), row += lr·g/√state
    h = docs[d[0]]
    grad = sum((label - 1 / (1 + np.exp(-h @ out[t]))) * out[t]
               for t, label in [(w[0], 1.0)] + [(n, 0.0) for n in neg[0]])
    state = (grad ** 2).mean()
    np.testing.assert_allclose(D[d[0], dim].item(), state, rtol=1e-5)
    np.testing.assert_allclose(D[d[0], :dim].numpy(), h + 0.1 * grad / np.sqrt(state), atol=1e-6)
    untouched = np.setdiff1d(np.arange(len(docs)), d)
    assert (D[untouched, dim] == 0).all() and (D[untouched, :dim].numpy() == docs[untouched]).all()


def test_row_adagrad_loss_falls():
    docs, out, d, w, neg, mask = random_problem(6)
    D = torch.from_numpy(np.concatenate([docs, np.zeros((len(docs), 1), np.float32)], 1))
    O = torch.from_numpy(np.concatenate([out, np.zeros((len(out), 1), np.float32)], 1))
    args = (torch.from_numpy(d)[:, None], torch.from_numpy(w), torch.from_numpy(neg), torch.from_numpy(mask))
    losses = [train(D, O, *args, torch.full((13,), 0.05), 16, adagrad=True) for _ in range(20)]
    assert losses[-1] < 0.7 * losses[0]


def test_shared_negatives_with_one_example_per_micro_batch_equal_own_negatives():
    docs, out, d, w, neg, mask = random_problem(7, n=50, k=4)
    mask = neg != w[:, None]
    own = run_ours(docs, out, d, w, neg, mask, 0.05, micro_batch=1)
    D, O = torch.from_numpy(docs.copy()), torch.from_numpy(out.copy())
    # the same draws, shared by a micro-batch of one example: weight k/N = 1
    train(D, O, torch.from_numpy(d)[:, None], torch.from_numpy(w), torch.from_numpy(neg), None,
          torch.full((50,), 0.05), 1, shared_negatives=4)
    np.testing.assert_allclose(D.numpy(), own[0], atol=1e-6)
    np.testing.assert_allclose(O.numpy(), own[1], atol=1e-6)


def test_frozen_outputs_and_context_words_do_not_move():
    inputs, out, _, w, neg, mask = random_problem(8, n_docs=40, n=60)
    ctx = np.stack([np.arange(60) % 10, 10 + np.arange(60) % 30], axis=1)  # doc rows 0-9, word rows 10-39
    I, O = torch.from_numpy(inputs.copy()), torch.from_numpy(out.copy())
    train(I, O, torch.from_numpy(ctx), torch.from_numpy(w), torch.from_numpy(neg), torch.from_numpy(mask),
          torch.full((60,), 0.1), 8, learn_outputs=False, learn_context_words=False)
    assert (O.numpy() == out).all()
    assert (I.numpy()[10:] == inputs[10:]).all()
    assert not np.allclose(I.numpy()[:10], inputs[:10])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_outputs_matrix_is_rounded_stochastically_to_a_neighbour_without_bias(dtype):
    """kernels.narrow_stochastic (a device worker's 16-bit URL rows): each value becomes one of its two
    neighbours in the type, the upper one with the odds of its distance from the lower, at every
    scale float16 has (its subnormals and below them too); NaN and ±inf stay; a seed gives the same bits."""
    from doc2vec_dist.kernels import narrow_stochastic

    gen = torch.Generator().manual_seed(3)
    for value in (0.0123456, -0.0123456, 1.2345, -7770.0, 3e-6, 1e-8, 2.0 ** -24 * 0.3):
        x = torch.full((200_000,), value, dtype=torch.float32)
        y = narrow_stochastic(x, dtype, gen).to(torch.float64)
        low, high = torch.unique(y).tolist() if len(torch.unique(y)) == 2 else (y[0].item(), y[0].item())
        assert low <= value <= high, (value, low, high)
        share = (value - low) / (high - low) if high > low else 0.0  # the chance of the upper neighbour
        spread = 5 * (share * (1 - share) / len(y)) ** 0.5 + 1e-9
        assert abs((y == high).double().mean().item() - share) < spread, (value, share)
        assert x.to(dtype).to(torch.float64).unique().tolist()[0] in (low, high)  # the cast's is a neighbour
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    out = narrow_stochastic(special, dtype, gen)
    assert out[0].isnan() and out[1] == float("inf") and out[2] == -float("inf") and (out[3:] == 0).all()
    same = [narrow_stochastic(torch.linspace(-1, 1, 999), dtype, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(same[0].view(torch.int16), same[1].view(torch.int16))
