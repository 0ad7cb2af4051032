"""cpu_kernel: gensim's per-example update, each applied before the next, checked against plain Python."""

import numpy as np
import pytest
import torch

from doc2vec_dist import cpu_kernel, kernels, settings
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.errors import UserError


def reference(inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, a0, a1, adagrad=False, learn_outputs=True,
              learn_context_words=True):
    """The update of kernels.py's docstring, one example after another, in float64 numpy."""
    inputs, outputs = inputs.astype(np.float64), outputs.astype(np.float64)
    dim = outputs.shape[1] - int(adagrad)
    n = len(target)

    def step(table, row, grad, alpha):
        if not adagrad:
            table[row, :dim] += grad
            return
        table[row, dim] += (grad ** 2).mean()
        table[row, :dim] += alpha * grad / (np.sqrt(table[row, dim]) + 1e-10)

    for e in range(n):
        alpha = a0 + (a1 - a0) * e / n
        rate = 1.0 if adagrad else alpha
        rows = [r for j, r in enumerate(ctx[e]) if ctx_mask is None or ctx_mask[e, j]]
        h = inputs[rows, :dim].mean(0)
        work = np.zeros(dim)
        for j in range(neg.shape[1] + 1):
            if j and not neg_mask[e, j - 1]:
                continue
            row, label = (target[e], 1.0) if j == 0 else (neg[e, j - 1], 0.0)
            o = outputs[row, :dim].copy()
            g = (label - 1.0 / (1.0 + np.exp(-h @ o))) * rate
            work += g * o
            if learn_outputs:
                step(outputs, row, g * h, alpha)
        for r in (rows if learn_context_words else rows[:1]):
            step(inputs, r, work, alpha)
    return inputs, outputs


def problem(seed, n=60, width=1, dim=8, adagrad=False, hot=False):
    rng = np.random.default_rng(seed)
    inputs = ((rng.random((12, dim + int(adagrad))) - 0.5) / 2).astype(np.float32)
    outputs = ((rng.random((9, dim + int(adagrad))) - 0.5) / 2).astype(np.float32)
    if adagrad:
        inputs[:, dim] = outputs[:, dim] = 0
    ctx = rng.integers(0, 12, (n, width))
    mask = rng.random((n, width)) < 0.7 if width > 1 else None
    if mask is not None:
        mask[:, 0] = True
    target = np.zeros(n, np.int64) if hot else rng.integers(0, 9, n)  # hot: one row is every target
    neg = rng.integers(0, 9, (n, 3))
    return inputs, outputs, ctx, mask, target, neg, neg != target[:, None]


@pytest.mark.parametrize("width, adagrad, learn_outputs, learn_context_words", [
    (1, False, True, True), (4, False, True, True), (1, True, True, True), (4, True, True, True),
    (4, False, False, False)])
def test_each_update_is_applied_before_the_next_example(width, adagrad, learn_outputs, learn_context_words):
    inputs, outputs, ctx, mask, target, neg, neg_mask = problem(1, width=width, adagrad=adagrad)
    want_in, want_out = reference(inputs, outputs, ctx, mask, target, neg, neg_mask, 0.5, 0.1, adagrad,
                                  learn_outputs, learn_context_words)
    before_out = outputs.copy()
    loss = cpu_kernel.train(inputs, outputs, ctx, target, neg, neg_mask, 0.5, 0.1, ctx_mask=mask, adagrad=adagrad,
                            learn_outputs=learn_outputs, learn_context_words=learn_context_words, threads=1)
    np.testing.assert_allclose(inputs, want_in, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outputs, want_out, rtol=1e-4, atol=1e-5)
    assert (outputs == before_out).all() == (not learn_outputs)
    assert np.isfinite(loss) and loss > 0


def test_a_hot_row_takes_its_updates_in_sequence_not_summed():
    """Every example has the same target: the batched kernel with one micro-batch sums 60 updates of that
    row computed from one starting value; this kernel applies them one after another, as gensim does."""
    inputs, outputs, ctx, _, target, neg, neg_mask = problem(2, hot=True)
    exact_in, exact_out = inputs.copy(), outputs.copy()
    cpu_kernel.train(exact_in, exact_out, ctx, target, neg, neg_mask, 0.5, 0.5, threads=1)
    _, want_out = reference(inputs, outputs, ctx, None, target, neg, neg_mask, 0.5, 0.5)
    summed_in, summed_out = torch.from_numpy(inputs.copy()), torch.from_numpy(outputs.copy())
    kernels.train(summed_in, summed_out, torch.from_numpy(ctx), torch.from_numpy(target), torch.from_numpy(neg),
                  torch.from_numpy(neg_mask), torch.tensor([0.5]), micro_batch=len(target))
    exact_err = np.abs(exact_out[0] - want_out[0]).max()
    summed_err = np.abs(summed_out[0].numpy() - want_out[0]).max()
    assert exact_err < 1e-5 < summed_err


def test_threads_share_the_matrices_and_train_every_example():
    """Two threads (Hogwild, as gensim's): not bit-exact, but every example is trained: the same
    loss fall as one thread."""
    rng = np.random.default_rng(3)
    docs, vocab, dim, n = 200, 50, 16, 20000
    ctx = rng.integers(0, docs, (n, 1))
    target = (ctx[:, 0] % vocab).astype(np.int64)  # each document predicts its own word: learnable
    neg = rng.integers(0, vocab, (n, 5))
    losses = {}
    for threads in (1, 2):
        inputs = ((rng.random((docs, dim)) - 0.5) / dim).astype(np.float32)
        outputs = np.zeros((vocab, dim), np.float32)
        first = cpu_kernel.train(inputs, outputs, ctx, target, neg, neg != target[:, None], 0.1, 0.1,
                                 threads=threads)
        last = cpu_kernel.train(inputs, outputs, ctx, target, neg, neg != target[:, None], 0.1, 0.1,
                                threads=threads)
        losses[threads] = (first, last)
    for first, last in losses.values():
        assert last < 0.6 * first
    assert losses[2][1] == pytest.approx(losses[1][1], rel=0.1)


def test_empty_batch_trains_nothing():
    inputs, outputs = np.ones((2, 4), np.float32), np.ones((2, 4), np.float32)
    empty = np.zeros((0, 1), np.int64)
    assert cpu_kernel.train(inputs, outputs, empty, empty[:, 0], np.zeros((0, 5), np.int64),
                            np.zeros((0, 5), bool), 0.1, 0.1) == 0.0
    assert (inputs == 1).all() and (outputs == 1).all()


def test_the_kernel_follows_the_device_and_the_negatives():
    assert settings.exact_kernel(TrainConfig())
    assert not settings.exact_kernel(TrainConfig(gpus_per_worker=1))
    assert not settings.exact_kernel(TrainConfig(shared_negatives=16))
    assert not settings.exact_kernel(TrainConfig(kernel="batched"))
    for bad, words in (({"kernel": "exact", "gpus_per_worker": 1}, "runs on CPU workers"),
                       ({"kernel": "exact", "shared_negatives": 16}, "needs the batched kernel"),
                       ({"kernel": "fast"}, "kernel")):
        with pytest.raises(UserError, match=words):
            TrainConfig(**bad).validate()


def test_one_worker_keeps_every_url_row_resident_by_default():
    assert settings.resident_rows(TrainConfig(), 100_000) == 100_000
    assert settings.resident_rows(TrainConfig(num_workers=2, schedule="shared"), 100_000) == 0
    assert settings.resident_rows(TrainConfig(num_workers=2), 100_000) == 50_000  # the block schedule: the block held
    assert settings.resident_rows(TrainConfig(num_workers=3, dbow_words=True), 100_000) == 0  # dbow_words shares the rows
    assert settings.resident_rows(TrainConfig(cache_rows=500), 100_000) == 500
    assert settings.resident_rows(TrainConfig(cache_rows=500), 300) == 300
    assert settings.resident_rows(TrainConfig(dim=100), 10**9) == (2 << 30) // 400  # what fits 2 GiB, hottest first


def token_problem(seed=0, vocab=50, docs=400, per_doc=50, sample=1e-2, dim=16, adagrad=False):
    """A Zipf-like corpus over a small vocabulary (the top words drawn often, as negatives too) and
    the tables, subsampling and alias table a worker would hold for it."""
    from doc2vec_dist.sampling import NegativeTable, keep_probabilities

    rng = np.random.default_rng(seed)
    counts = (1e5 / np.arange(1, vocab + 1) ** 2).astype(np.int64) + 1
    negatives = NegativeTable(counts)
    tokens = rng.choice(vocab, docs * per_doc, p=counts / counts.sum()).astype(np.int32)
    doc_of_token = np.repeat(np.arange(docs), per_doc)
    width = dim + int(adagrad)
    inputs = ((rng.random((docs, width), dtype=np.float32) - 0.5) / dim).astype(np.float32)
    if adagrad:
        inputs[:, dim] = 0
    outputs = np.zeros((vocab, width), np.float32)
    return (inputs, outputs, doc_of_token, tokens, keep_probabilities(counts, sample),
            negatives.accept.astype(np.float32), negatives.alias, negatives)


@pytest.mark.parametrize("adagrad", [False, True])
def test_the_token_path_trains_exactly_the_examples_it_draws(adagrad):
    """train_tokens draws subsampling and negatives itself; on one thread it must train exactly what
    train() (checked above against the reference) trains on the same draws, hot rows drawn twice in
    one example included."""
    inputs, outputs, doc_of_token, tokens, keep, accept, alias, _ = token_problem(adagrad=adagrad)
    ref_in, ref_out = inputs.copy(), outputs.copy()
    loss, trained = cpu_kernel.train_tokens(inputs, outputs, doc_of_token, tokens, keep, accept, alias, 5, 0.05,
                                            0.05, seed=7, adagrad=adagrad, threads=1)
    ctx, target, neg, neg_mask = cpu_kernel.draw_examples(doc_of_token, tokens, keep, accept, alias, 5, seed=7)
    assert trained == len(target) and (~neg_mask).any()  # some draws hit the target, and were skipped
    assert (np.sort(neg, axis=1)[:, 1:] == np.sort(neg, axis=1)[:, :-1]).any()  # a row twice in one example
    ref_loss = cpu_kernel.train(ref_in, ref_out, ctx, target, neg, neg_mask, 0.05, 0.05, adagrad=adagrad, threads=1)
    np.testing.assert_array_equal(inputs, ref_in)
    np.testing.assert_array_equal(outputs, ref_out)
    assert loss == pytest.approx(ref_loss, rel=0.05)


@pytest.mark.parametrize("negative", [5.5, 2.25])
def test_a_fractional_count_of_negatives_draws_one_more_that_often_and_trains_what_it_draws(negative):
    """The block schedule's negatives per example (schedule.Blocks): the whole part, and one more with
    the chance of the rest; train_tokens trains exactly those draws."""
    inputs, outputs, doc_of_token, tokens, keep, accept, alias, _ = token_problem(per_doc=200)
    ctx, target, neg, neg_mask = cpu_kernel.draw_examples(doc_of_token, tokens, keep, accept, alias, negative, seed=5)
    whole = int(negative)
    assert neg.shape[1] == whole + 1
    drawn = neg[:, whole] >= 0  # an undrawn column is -1 (and masked)
    assert not neg_mask[~drawn, whole].any()
    assert drawn.mean() == pytest.approx(negative - whole, abs=0.02)
    ref_in, ref_out = inputs.copy(), outputs.copy()
    _, trained = cpu_kernel.train_tokens(inputs, outputs, doc_of_token, tokens, keep, accept, alias, negative, 0.05,
                                         0.05, seed=5, threads=1)
    cpu_kernel.train(ref_in, ref_out, ctx, target, neg, neg_mask, 0.05, 0.05, threads=1)
    assert trained == len(target)
    np.testing.assert_array_equal(inputs, ref_in)
    np.testing.assert_array_equal(outputs, ref_out)


def test_the_token_path_subsamples_and_draws_negatives_as_gensim_does():
    _, _, doc_of_token, tokens, keep, accept, alias, negatives = token_problem(per_doc=500)
    ctx, target, neg, neg_mask = cpu_kernel.draw_examples(doc_of_token, tokens, keep, accept, alias, 5, seed=3)
    # each word kept with its subsampling probability
    kept = np.bincount(target, minlength=len(keep)) / np.maximum(np.bincount(tokens, minlength=len(keep)), 1)
    seen = np.bincount(tokens, minlength=len(keep)) > 2000
    np.testing.assert_allclose(kept[seen], keep[seen], atol=0.02)
    # negatives follow unigram^0.75, and a draw equal to the target is masked
    drawn = np.bincount(neg.ravel(), minlength=len(keep)) / neg.size
    np.testing.assert_allclose(drawn, negatives.p, atol=0.003)
    assert (neg_mask == (neg != target[:, None])).all()
    # documents keep their tokens' order
    assert (np.diff(ctx[:, 0]) >= 0).all()
    # another seed, other draws; the same seed, the same draws whatever the threads
    assert not np.array_equal(cpu_kernel.draw_examples(doc_of_token, tokens, keep, accept, alias, 5, seed=4)[2][:100],
                              neg[:100])


def test_the_token_path_learns_on_two_threads():
    inputs, outputs, doc_of_token, tokens, keep, accept, alias, _ = token_problem(sample=0)
    # each document uses 5 words of its own group of 50 / 10: learnable, unlike the Zipf draws
    tokens = ((doc_of_token % 10) * 5 + np.random.default_rng(1).integers(0, 5, len(tokens))).astype(np.int32)
    first = cpu_kernel.train_tokens(inputs, outputs, doc_of_token, tokens, keep, accept, alias, 5, 0.05, 0.05, 1,
                                    threads=2)
    for seed in range(2, 6):
        last = cpu_kernel.train_tokens(inputs, outputs, doc_of_token, tokens, keep, accept, alias, 5, 0.05, 0.05,
                                       seed, threads=2)
    assert first[1] == last[1] == len(tokens)  # sample 0: every token trained
    assert last[0] < 0.8 * first[0] and np.isfinite(inputs).all()
    assert cpu_kernel.train_tokens(inputs, outputs, doc_of_token[:0], tokens[:0], keep, accept, alias, 5, 0.05,
                                   0.05, 1) == (0.0, 0)


def test_the_token_path_is_taken_where_every_url_row_is_the_workers_alone():
    from types import SimpleNamespace

    from doc2vec_dist.settings import resolve

    def engine_line(config, rows):
        return resolve(config, SimpleNamespace(num_tokens=10 * rows, vocab_size=rows, meta={})).engine_line()

    assert settings.token_path(TrainConfig(), 100_000)
    assert settings.token_path(TrainConfig(optimizer="adagrad"), 100_000)
    for batched in ({"kernel": "batched"}, {"gpus_per_worker": 1}):  # drawn on the device
        assert settings.token_path(TrainConfig(**batched), 100_000), batched
        assert "examples drawn on its device" in engine_line(TrainConfig(**batched), 100_000)
    # the windows of dbow_words and PV-DM are drawn on the device only: the exact kernel takes the host's examples
    for windows in ({"dbow_words": True}, {"mode": "dm"}):
        assert settings.token_path(TrainConfig(kernel="batched", **windows), 100_000), windows
        assert engine_line(TrainConfig(kernel="batched", **windows), 100_000).endswith("; words too")
    for other in ({"cache_rows": 0}, {"cache_rows": 500}, {"num_workers": 2, "cache_rows": 10**6},
                  {"dbow_words": True}, {"mode": "dm"}, {"kernel": "batched", "cache_rows": 0},
                  {"shared_negatives": 16}, {"kernel": "batched", "dbow_words": True, "num_workers": 2}):
        assert not settings.token_path(TrainConfig(**other), 100_000), other
        assert "words too" not in engine_line(TrainConfig(**other), 100_000)
    assert "examples drawn in the kernel" in engine_line(TrainConfig(), 100_000)
    assert "examples drawn" not in engine_line(TrainConfig(cache_rows=0), 100_000)
