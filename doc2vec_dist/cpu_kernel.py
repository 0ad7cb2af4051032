"""The exact update on CPU: gensim's per-example SGD, compiled with numba, hogwild over threads.

kernels.train sums the updates of a micro-batch computed from the same starting values, which is what
a GPU needs; on a CPU core nothing is gained by it. This kernel applies each example's update before
the next example is computed, exactly as gensim's doc2vec_inner.pyx does (with a true sigmoid where
gensim reads its table and skips |dot| >= 6), so a hot row gets its hundreds of updates one after
another, never summed. The threads of a worker each take a contiguous range of the examples and share
the matrices without locks, as gensim's worker threads share syn1neg (Hogwild).

Same arguments and matrices as kernels.train, except the learning rate, which decays linearly from
alpha_start at the first example to alpha_end after the last, as gensim's does over its jobs.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

ADAGRAD_EPS = 1e-10
LOSS_EVERY = 4  # the loss is only shown: taken on one example in LOSS_EVERY and scaled up
BLOCK = 10_000  # examples a thread trains before it moves on to its next block (gensim's job size)


@numba.njit(fastmath=True, nogil=True, inline="always")
def _step(table, row, grad, alpha, adagrad, dim):
    """row += alpha · grad (SGD: alpha is already in grad), or its row-wise Adagrad step."""
    if not adagrad:
        for i in range(dim):
            table[row, i] += grad[i]
        return
    sq = 0.0
    for i in range(dim):
        sq += grad[i] * grad[i]
    table[row, dim] += sq / dim
    rate = alpha / (math.sqrt(table[row, dim]) + ADAGRAD_EPS)
    for i in range(dim):
        table[row, i] += rate * grad[i]


@numba.njit(fastmath=True, nogil=True, inline="always")
def _example(e, inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha, scale, adagrad, learn_outputs,
             learn_context_words, h, work, out_grad, with_loss):
    """Example e's update, applied at once; returns its loss if with_loss (else 0)."""
    dim = h.shape[0]
    width = ctx.shape[1]
    step = np.float32(1.0) if adagrad else alpha  # adagrad takes the plain gradient and its own step size
    if width == 1:
        r = ctx[e, 0]
        for i in range(dim):
            h[i] = inputs[r, i]
    else:  # PV-DM: the mean of the document and its context words
        count = 0
        for i in range(dim):
            h[i] = 0.0
        for j in range(width):
            if ctx_mask[e, j]:
                count += 1
                r = ctx[e, j]
                for i in range(dim):
                    h[i] += inputs[r, i]
        inv = np.float32(1.0 / max(count, 1))
        for i in range(dim):
            h[i] *= inv
    for i in range(dim):
        work[i] = 0.0
    loss = 0.0
    for j in range(neg.shape[1] + 1):
        if j == 0:
            row = target[e]
            label = np.float32(1.0)
        else:
            if not neg_mask[e, j - 1]:  # a draw equal to the target: skipped, as gensim does
                continue
            row = neg[e, j - 1]
            label = np.float32(0.0)
        f = np.float32(0.0)
        for i in range(dim):
            f += h[i] * outputs[row, i]
        s = np.float32(1.0) / (np.float32(1.0) + np.exp(-f))
        if with_loss:  # −log σ(f) for the target, −log σ(−f) for a negative: softplus
            x = -f if j == 0 else f
            loss += max(x, 0.0) + math.log1p(math.exp(-abs(x)))
        g = (label - s) * step
        for i in range(dim):
            work[i] += g * outputs[row, i]
        if learn_outputs:
            for i in range(dim):
                out_grad[i] = g * h[i]
            _step(outputs, row, out_grad, alpha, adagrad, dim)
    if scale.shape[0]:
        c = scale[e]
        for i in range(dim):
            work[i] *= c
    if width == 1 or not learn_context_words:
        _step(inputs, ctx[e, 0], work, alpha, adagrad, dim)
    else:
        for j in range(width):
            if ctx_mask[e, j]:
                _step(inputs, ctx[e, j], work, alpha, adagrad, dim)
    return loss


@numba.njit(parallel=True, fastmath=True, nogil=True, cache=True)
def _train(inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha_start, alpha_end, scale, bounds,
           threads, adagrad, learn_outputs, learn_context_words):
    """Thread t trains blocks t, t + threads, t + 2·threads, … of the examples, each in order: the
    threads move through the batch side by side, as gensim's take its jobs from one queue."""
    n = target.shape[0]
    dim = outputs.shape[1] - (1 if adagrad else 0)
    blocks = len(bounds) - 1
    losses = np.zeros(threads, np.float64)
    for t in prange(threads):
        h = np.empty(dim, np.float32)
        work = np.empty(dim, np.float32)
        out_grad = np.empty(dim, np.float32)
        loss = 0.0
        for b in range(t, blocks, threads):
            for e in range(bounds[b], bounds[b + 1]):
                alpha = np.float32(alpha_start + (alpha_end - alpha_start) * (e / n))
                loss += _example(e, inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha, scale, adagrad,
                                 learn_outputs, learn_context_words, h, work, out_grad, e % LOSS_EVERY == 0)
        losses[t] = loss
    return losses.sum()


def train(inputs: np.ndarray, outputs: np.ndarray, ctx: np.ndarray, target: np.ndarray, neg: np.ndarray,
          neg_mask: np.ndarray, alpha_start: float, alpha_end: float, *, ctx_mask: np.ndarray | None = None,
          scale: np.ndarray | None = None, adagrad: bool = False, learn_outputs: bool = True,
          learn_context_words: bool = True, threads: int | None = None) -> float:
    """Train every example in order, each update applied at once; returns the summed loss (estimated
    from one example in LOSS_EVERY). Matrices are float32 numpy arrays, changed in place; the examples'
    indices are as in kernels.train (own negatives only: shared ones are the GPU kernel's)."""
    n = len(target)
    if n == 0:
        return 0.0
    threads = max(1, min(threads or numba.get_num_threads(), n))
    blocks = max(threads, -(-n // BLOCK))
    bounds = np.linspace(0, n, blocks + 1).astype(np.int64)
    empty_mask = np.ones((0, 0), dtype=np.bool_)
    loss = _train(inputs, outputs, np.ascontiguousarray(ctx, dtype=np.int64),
                  empty_mask if ctx_mask is None else np.ascontiguousarray(ctx_mask),
                  np.ascontiguousarray(target, dtype=np.int64), np.ascontiguousarray(neg, dtype=np.int64),
                  np.ascontiguousarray(neg_mask), float(alpha_start), float(alpha_end),
                  np.zeros(0, np.float32) if scale is None else np.ascontiguousarray(scale, dtype=np.float32),
                  bounds, threads, adagrad, learn_outputs, learn_context_words)
    scored = -(-n // LOSS_EVERY)  # examples e with e % LOSS_EVERY == 0
    return float(loss) * n / scored
