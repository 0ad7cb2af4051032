"""The exact update on CPU: gensim's per-example SGD, compiled with numba, Hogwild over threads.

Changes when the CPU update itself changes (its order, its compiled loop, its threads).

kernels.train sums the updates of a micro-batch computed from the same starting values, which is what
a GPU needs; on a CPU core nothing is gained by it. This kernel applies each example's update before
the next example is computed, exactly as gensim's doc2vec_inner.pyx does (with a true sigmoid where
gensim reads its table and skips |dot| >= 6), so a hot row gets its hundreds of updates one after
another, never summed. The threads of a worker each take every threads-th block of the batch and
share the matrices without locks, as gensim's worker threads share syn1neg (Hogwild).

Two entry points:
  train         examples built by the host (sampling.build_examples): every mode, any resident rows;
                same arguments and matrices as kernels.train.
  train_tokens  PV-DBOW straight from a batch's tokens, the subsampling and negatives drawn here: what
                a worker with every words_out row resident uses (no per-example work on the host).
The learning rate decays linearly from alpha_start at the first example (token) to alpha_end after
the last, as gensim's does over its jobs.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from . import lr

ADAGRAD_EPS = 1e-10
LOSS_EVERY = 4  # the loss is only shown: taken on one example in LOSS_EVERY and scaled up
BLOCK = 10_000  # examples a thread trains before it moves on to its next block (gensim's job size)

# each example's rate between the batch's two (lr.batch_ends): lr's formula, compiled with the loops'
# flags and inlined into them, so that the loops compile to what they did when they wrote it out
_between = numba.njit(fastmath=True, nogil=True, inline="always", error_model="numpy")(lr.between)


@numba.njit(fastmath=True, nogil=True, inline="always", error_model="numpy")
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


@numba.njit(fastmath=True, nogil=True, inline="always", error_model="numpy")
def _score_and_update(h, work, out_grad, scores, outputs, rows, m, alpha, adagrad, learn_outputs, with_loss):
    """One example's output side: rows[0] is its target (label 1), rows[1:m] its negatives (label 0).
    For each: f = h·o, g = (label − σ(f))·α, work += g·o, o += g·h (gensim's order; work starts at
    zero). Returns the example's loss if with_loss (else 0).

    The m scores are taken first, in one pass: the rows are different rows, and h does not change
    within an example, so each score is what gensim's one-row-at-a-time loop finds, while the
    independent gathers overlap in memory (measured: 1.8x the throughput of scoring each row just
    before its update). A row drawn twice is scored again after its first update, as gensim sees it.
    """
    dim = h.shape[0]
    step = np.float32(1.0) if adagrad else alpha  # adagrad takes the plain gradient and its own step size
    for j in range(m):
        r = rows[j]
        f = np.float32(0.0)
        for i in range(dim):
            f += h[i] * outputs[r, i]
        scores[j] = f
    for i in range(dim):
        work[i] = 0.0
    loss = 0.0
    for j in range(m):
        r = rows[j]
        f = scores[j]
        for q in range(j):
            if rows[q] == r:  # drawn before, and updated since: score it as it is now
                f = np.float32(0.0)
                for i in range(dim):
                    f += h[i] * outputs[r, i]
                break
        label = np.float32(1.0) if j == 0 else np.float32(0.0)
        s = np.float32(1.0) / (np.float32(1.0) + np.exp(-f))
        if with_loss:  # −log σ(f) for the target, −log σ(−f) for a negative: softplus
            x = -f if j == 0 else f
            loss += max(x, 0.0) + math.log1p(math.exp(-abs(x)))
        g = (label - s) * step
        for i in range(dim):
            work[i] += g * outputs[r, i]
        if learn_outputs:
            for i in range(dim):
                out_grad[i] = g * h[i]
            _step(outputs, r, out_grad, alpha, adagrad, dim)
    return loss


@numba.njit(fastmath=True, nogil=True, inline="always", error_model="numpy")
def _example(e, inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha, scale, adagrad, learn_outputs,
             learn_context_words, h, work, out_grad, rows, scores, with_loss):
    """Example e's update, applied at once; returns its loss if with_loss (else 0)."""
    dim = h.shape[0]
    width = ctx.shape[1]
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
    rows[0] = target[e]
    m = 1
    for j in range(neg.shape[1]):
        if neg_mask[e, j]:  # a draw equal to the target is masked: skipped, as gensim does
            rows[m] = neg[e, j]
            m += 1
    loss = _score_and_update(h, work, out_grad, scores, outputs, rows, m, alpha, adagrad, learn_outputs, with_loss)
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


@numba.njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
def _train(t, threads, inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha_start, alpha_end, scale,
           bounds, adagrad, learn_outputs, learn_context_words):
    """Thread t's share: blocks t, t + threads, t + 2·threads, … of the examples, each in order (the
    threads move through the batch side by side, as gensim's take its jobs from one queue). Returns
    (its summed loss, 0)."""
    n = target.shape[0]
    dim = outputs.shape[1] - (1 if adagrad else 0)
    h = np.empty(dim, np.float32)
    work = np.empty(dim, np.float32)
    out_grad = np.empty(dim, np.float32)
    rows = np.empty(neg.shape[1] + 1, np.int64)
    scores = np.empty(neg.shape[1] + 1, np.float32)
    loss = 0.0
    for b in range(t, len(bounds) - 1, threads):
        for e in range(bounds[b], bounds[b + 1]):
            alpha = np.float32(_between(alpha_start, alpha_end, e / n))
            loss += _example(e, inputs, outputs, ctx, ctx_mask, target, neg, neg_mask, alpha, scale, adagrad,
                             learn_outputs, learn_context_words, h, work, out_grad, rows, scores,
                             e % LOSS_EVERY == 0)
    return loss, 0


_pool: ThreadPoolExecutor | None = None


def _on_threads(kernel, threads: int, *args) -> tuple[float, int]:
    """kernel(t, threads, *args) for t in 0..threads-1, each on its own thread, sharing the matrices
    without locks (Hogwild, as gensim's threads do); the summed (loss, examples) of the shares.

    Plain Python threads, kept between calls: the kernels are compiled with nogil, so they run truly
    side by side. numba's own parallel layer was OpenMP here, a second copy of libgomp beside
    torch's, whose pools (one per calling thread of a Ray actor) spun and took the cores that Ray's
    pulls, pushes and the servers needed."""
    global _pool
    if threads == 1:
        return kernel(0, 1, *args)
    if _pool is None or _pool._max_workers < threads - 1:
        _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="cpu-kernel")
    others = [_pool.submit(kernel, t, threads, *args) for t in range(1, threads)]
    results = [kernel(0, threads, *args)] + [f.result() for f in others]
    return sum(r[0] for r in results), sum(r[1] for r in results)


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
    threads = max(1, min(threads or os.cpu_count() or 1, n))
    blocks = max(threads, -(-n // BLOCK))
    bounds = np.linspace(0, n, blocks + 1).astype(np.int64)
    empty_mask = np.ones((0, 0), dtype=np.bool_)
    loss, _ = _on_threads(_train, threads, inputs, outputs, np.ascontiguousarray(ctx, dtype=np.int64),
                  empty_mask if ctx_mask is None else np.ascontiguousarray(ctx_mask),
                  np.ascontiguousarray(target, dtype=np.int64), np.ascontiguousarray(neg, dtype=np.int64),
                  np.ascontiguousarray(neg_mask), float(alpha_start), float(alpha_end),
                  np.zeros(0, np.float32) if scale is None else np.ascontiguousarray(scale, dtype=np.float32),
                  bounds, adagrad, learn_outputs, learn_context_words)
    scored = -(-n // LOSS_EVERY)  # examples e with e % LOSS_EVERY == 0
    return float(loss) * n / scored


# -- PV-DBOW from the tokens themselves --------------------------------------------------------------
# When every words_out row is resident in the worker (one worker, the default), nothing about a
# macro-batch's URL rows has to be known before it trains: the kernel reads the documents' tokens and
# draws the subsampling and the negatives itself, as gensim's does, instead of the host building every
# example first (sampling.build_examples took 17% of the worker's time on the 200k corpus). Each block
# of TOKEN_BLOCK tokens draws from its own random stream, seeded by the batch's seed and the block's
# index, so what is drawn does not depend on the number of threads.
TOKEN_BLOCK = 1024
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(inline="always")
def _next(state):
    """splitmix64: (new state, 64 random bits)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@numba.njit(inline="always")
def _uniform(bits):
    """A float32 in [0, 1) from the top 24 bits."""
    return np.float32(bits >> np.uint64(40)) * np.float32(1.0 / 16777216.0)


@numba.njit(inline="always")
def _negative(bits, accept, alias):
    """A draw from the alias table (sampling.NegativeTable): the slot from the high 32 bits
    (multiply-shift, no modulo), the coin from the low 24."""
    slot = np.int64(((bits >> np.uint64(32)) * np.uint64(len(accept))) >> np.uint64(32))
    coin = np.float32(bits & np.uint64(0xFFFFFF)) * np.float32(1.0 / 16777216.0)
    return slot if coin < accept[slot] else np.int64(alias[slot])


@numba.njit(inline="always")
def _block_state(seed, block):
    state, _ = _next(np.uint64(seed) ^ (np.uint64(block + 1) * np.uint64(0xD1B54A32D192ED03)))
    return state


@numba.njit(inline="always")
def _draws(state, negative, extra):
    """How many negatives an example draws: `negative`, and one more with probability `extra` (the
    block schedule's share of a fractional count; no draw at all when it is 0)."""
    if extra <= 0.0:
        return state, negative
    state, bits = _next(state)
    return state, negative + (1 if _uniform(bits) < extra else 0)


@numba.njit(nogil=True, cache=True)
def _draw_block(doc_of_token, tokens, lo, hi, keep, accept, alias, negative, extra, seed, block, ctx, target, neg,
                neg_mask, at):
    """The examples block `block` (tokens lo..hi) trains, drawn exactly as _train_tokens draws them,
    written from row `at` on (neg has negative + 1 columns; those not drawn stay masked); returns the
    next free row. For the tests (draw_examples)."""
    state = _block_state(seed, block)
    for i in range(lo, hi):
        w = tokens[i]
        state, bits = _next(state)
        if _uniform(bits) >= keep[w]:
            continue
        ctx[at, 0] = doc_of_token[i]
        target[at] = w
        state, draws = _draws(state, negative, extra)
        for j in range(draws):
            state, bits = _next(state)
            nw = _negative(bits, accept, alias)
            neg[at, j] = nw
            neg_mask[at, j] = nw != w
        at += 1
    return at


@numba.njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
def _train_tokens(t, threads, inputs, outputs, doc_of_token, tokens, keep, accept, alias, negative, extra,
                  alpha_start, alpha_end, seed, bounds, adagrad):
    """Thread t's share: token blocks t, t + threads, …; each kept token is one (document → token)
    example with `negative` negatives (and one more with probability `extra`), its update applied at
    once (as _example, PV-DBOW). Returns (its summed loss, estimated from one example in LOSS_EVERY;
    its examples)."""
    n = tokens.shape[0]
    dim = outputs.shape[1] - (1 if adagrad else 0)
    h = np.empty(dim, np.float32)
    work = np.empty(dim, np.float32)
    out_grad = np.empty(dim, np.float32)
    rows = np.empty(negative + 2, np.int64)
    scores = np.empty(negative + 2, np.float32)
    loss = 0.0
    count = 0
    for b in range(t, len(bounds) - 1, threads):
        state = _block_state(seed, b)
        for i in range(bounds[b], bounds[b + 1]):
            w = tokens[i]
            state, bits = _next(state)
            if _uniform(bits) >= keep[w]:
                continue
            rows[0] = w
            m = 1
            state, draws = _draws(state, negative, extra)
            for j in range(draws):
                state, bits = _next(state)
                r = _negative(bits, accept, alias)
                if r != w:  # a draw equal to the target: skipped, as gensim does
                    rows[m] = r
                    m += 1
            alpha = np.float32(_between(alpha_start, alpha_end, i / n))
            d = doc_of_token[i]
            for k in range(dim):
                h[k] = inputs[d, k]
            loss += _score_and_update(h, work, out_grad, scores, outputs, rows, m, alpha, adagrad, True,
                                      count % LOSS_EVERY == 0)
            count += 1
            _step(inputs, d, work, alpha, adagrad, dim)
    return loss * LOSS_EVERY, count


def token_blocks(n_tokens: int) -> np.ndarray:
    """Bounds of the TOKEN_BLOCK-token blocks of a batch: fixed by its size alone, never by threads."""
    return np.append(np.arange(0, n_tokens, TOKEN_BLOCK, dtype=np.int64), np.int64(n_tokens))


def train_tokens(inputs: np.ndarray, outputs: np.ndarray, doc_of_token: np.ndarray, tokens: np.ndarray,
                 keep: np.ndarray, accept: np.ndarray, alias: np.ndarray, negative: float, alpha_start: float,
                 alpha_end: float, seed: int, *, adagrad: bool = False, threads: int | None = None) -> tuple[float, int]:
    """PV-DBOW over a batch of tokens, subsampled (keep[w]: probability of keeping word w) and with
    negatives drawn from the alias table (accept, alias) here, each example's update applied at once.
    A fractional `negative` (the block schedule's) draws its whole part, and one more with the
    probability of the rest.

    doc_of_token[i] is the row of `inputs` of token i's document; tokens are row ids of `outputs`
    (every words_out row resident). The learning rate decays linearly from alpha_start at the first
    token to alpha_end after the last. Returns (summed loss, estimated from one example in LOSS_EVERY;
    examples trained)."""
    n = len(tokens)
    if n == 0:
        return 0.0, 0
    bounds = token_blocks(n)
    threads = max(1, min(threads or os.cpu_count() or 1, len(bounds) - 1))
    loss, count = _on_threads(_train_tokens, threads, inputs, outputs, np.ascontiguousarray(doc_of_token, dtype=np.int64),
                                np.ascontiguousarray(tokens, dtype=np.int32), keep, accept, alias, int(negative),
                                float(negative - int(negative)), float(alpha_start), float(alpha_end), np.uint64(seed),
                                bounds, adagrad)
    return float(loss), int(count)


def draw_examples(doc_of_token: np.ndarray, tokens: np.ndarray, keep: np.ndarray, accept: np.ndarray,
                  alias: np.ndarray, negative: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The (ctx, target, neg, neg_mask) examples train_tokens trains on a batch, in its order (block
    after block): what lets the tests check it against train() and the sampling's distributions. A
    fractional `negative` gives one more column, -1 and masked where that draw was not made."""
    n = len(tokens)
    extra = float(negative - int(negative))
    columns = int(negative) + (extra > 0)
    ctx, target = np.zeros((n, 1), np.int64), np.zeros(n, np.int64)
    neg, neg_mask = np.full((n, columns), -1, np.int64), np.zeros((n, columns), np.bool_)  # undrawn: -1, masked
    bounds, at = token_blocks(n), 0
    doc_of_token = np.ascontiguousarray(doc_of_token, dtype=np.int64)
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    for b in range(len(bounds) - 1):
        at = _draw_block(doc_of_token, tokens, bounds[b], bounds[b + 1], keep, accept, alias, int(negative), extra,
                         np.uint64(seed), b, ctx, target, neg, neg_mask, at)
    return ctx[:at], target[:at], neg[:at], neg_mask[:at]

