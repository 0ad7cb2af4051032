"""From documents to training pairs: subsampling, the negative table, pair building.

Changes when the host-side definitions of subsampling, negatives or pairs change (gensim's).

All vectorised with numpy: one call handles a whole macro-batch, never a Python loop per token.
The definitions follow gensim 4.4 (word2vec.py / doc2vec_inner.pyx) so models are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Probability of keeping each occurrence of word id i (gensim's frequent-word subsampling).

    t = sample * total retained words (or sample * (3 + sqrt 5) / 2 when sample >= 1);
    p(w) = min(1, (sqrt(c / t) + 1) * t / c).
    """
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0:
        return np.ones(len(counts), dtype=np.float32)
    threshold = sample * counts.sum() if sample < 1.0 else sample * (3 + np.sqrt(5)) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.sqrt(counts / threshold) + 1.0) * (threshold / counts)
    p[~np.isfinite(p)] = 1.0  # words with count 0 never occur; keep the table total
    return np.minimum(p, 1.0).astype(np.float32)


class NegativeTable:
    """Draws negatives from the unigram distribution raised to `ns_exponent` (gensim's distribution).

    Sampling uses Walker's alias method: one uniform index and one uniform coin per draw, two gathers,
    no search. gensim bisects a cumulative table instead; the distribution is the same (exactly, up to
    float rounding), and drawing is about 5× faster than a vectorised searchsorted here, which was
    most of the time a worker spent building pairs.
    """

    def __init__(self, counts: np.ndarray, ns_exponent: float = 0.75):
        weights = np.asarray(counts, dtype=np.float64) ** ns_exponent
        weights[np.asarray(counts) <= 0] = 0.0
        if weights.sum() <= 0:
            raise ValueError("negative table: every word has count 0")
        self.p = weights / weights.sum()
        self.accept, self.alias = _alias_table(self.p)

    def draw(self, rng: np.random.Generator, shape) -> np.ndarray:
        n = int(np.prod(shape))
        slot = rng.integers(0, len(self.accept), n)
        coin = rng.random(n, dtype=np.float32)
        return np.where(coin < self.accept[slot], slot, self.alias[slot]).reshape(shape)


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias table: slot i keeps word i with probability accept[i], else gives alias[i]."""
    accept, alias = _vose(np.asarray(p, dtype=np.float64) * len(p))
    return accept.astype(np.float32), alias


@numba.njit(cache=True)
def _vose(scaled: np.ndarray) -> tuple:
    # the under-full slots (scaled < 1) and the rest, each a stack in ascending order: an under-full
    # slot is topped up from the last full one, whose excess shrinks and which becomes under-full in
    # turn. Compiled: the block schedule builds a table for its block every round (tens of ms for a
    # block of 50k URLs in Python), and one worker one for the whole vocabulary at its start.
    n = len(scaled)
    accept = np.ones(n, dtype=np.float64)
    alias = np.arange(n)
    small = np.empty(n, dtype=np.int64)
    large = np.empty(n, dtype=np.int64)
    ns = nl = 0
    for i in range(n):
        if scaled[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s, g = small[ns], large[nl - 1]
        accept[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        if scaled[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    # leftovers are 1 up to rounding: they keep themselves
    return accept, alias


@dataclass
class Examples:
    """One macro-batch of training examples, in training order.

    Input rows live in one index space: a chunk-local document index in [0, n_docs), or n_docs + a
    word id for a row of `words`. ctx[i] holds example i's input rows: one (PV-DBOW, and the
    skip-gram steps of dbow_words) or PV-DM's document and window, ctx_mask marking the real ones.
    target[i] is the word predicted. neg holds the negatives: [n, k] with neg_mask False where a draw
    equals the target (gensim skips such a draw rather than redrawing it), or, shared among each
    micro-batch's examples, [n_micro, N] with no mask (the kernel masks them).
    """

    ctx: np.ndarray                 # int64 [n, c]
    ctx_mask: np.ndarray | None     # bool  [n, c], PV-DM only
    target: np.ndarray              # int64 [n] global word id
    neg: np.ndarray                 # int64 [n, k] or [n_micro, N] global word ids
    neg_mask: np.ndarray | None     # bool  [n, k]; None with shared negatives
    raw_tokens: int                 # tokens read before subsampling (what the learning-rate schedule counts)
    n_docs: int                     # documents in the chunk: input ids below this are documents
    micro_batch: int                # examples per micro-batch for this chunk (see micro_batch_for)

    def __len__(self) -> int:
        return len(self.target)


# A micro-batch sums the updates of its examples. For an input row met many times in one micro-batch
# (a very long document alone at the end of a chunk), that sum is one huge step; its update is scaled
# so it counts for at most this many examples' worth. Ordinary chunks never reach it (see build_examples).
DOC_REPEAT_CAP = 128


def build_examples(offsets: np.ndarray, tokens: np.ndarray, keep_prob: np.ndarray, negatives: NegativeTable,
                   negative: int, rng: np.random.Generator, *, mode: str = "dbow", dbow_words: bool = False,
                   window: int = 5, shared_negatives: int = 0, micro_batch: int = 1024,
                   interleave: bool = True) -> Examples:
    """Training examples of a chunk of documents, for PV-DBOW (optionally with dbow_words) or PV-DM.

    Subsampled tokens are dropped before anything else, windows included (as gensim does). Each
    remaining token gives: PV-DBOW, one (document → token) example; with dbow_words, first a
    skip-gram example (word → token) for every word within its reduced window, then the document's;
    PV-DM, one example whose context is the document and the words of its reduced window. The
    reduced window is gensim's: window − b with b uniform in [0, window), drawn per token.

    Tokens are interleaved: first every document's first kept token, then every document's second,
    and so on, documents in a random order. Micro-batches cut along this order, so each document moves
    through its tokens in sequence, one (or a few) per micro-batch, while many documents advance side
    by side: the batched analogue of gensim's threads each walking one document. (Measured on the Lee
    corpus: a plain shuffle of the pairs loses about 0.015 of Pearson correlation against this.)
    With interleave=False they stay in gensim's order instead, document after document, for a kernel
    that applies each example's update before the next (cpu_kernel).
    """
    n_docs = len(offsets) - 1
    lengths = np.diff(offsets)
    doc_of_token = np.repeat(np.arange(n_docs, dtype=np.int64), lengths)
    keep = rng.random(len(tokens), dtype=np.float32) < keep_prob[tokens]
    doc = doc_of_token[keep]
    word = tokens[keep].astype(np.int64)
    kept = np.bincount(doc, minlength=n_docs)
    position = np.arange(len(word)) - (np.cumsum(kept) - kept)[doc]  # doc is ascending here
    # by position, then by the documents' random rank: one int64 key (unique, so the order is
    # lexsort's) sorts in half lexsort's time
    order = (np.argsort(position * n_docs + rng.permutation(n_docs)[doc]) if interleave and len(word) > 1
             else np.arange(len(word)))
    ctx_mask = None
    if mode == "dbow" and not dbow_words:
        ctx, target = doc[order, None], word[order]
    else:
        near, valid = _windows(position, kept[doc], window, rng)   # [n, 2w] token indices, bool
        near_words = n_docs + word[near]
        if mode == "dm":
            ctx = np.concatenate([doc[:, None], near_words], axis=1)[order]
            ctx_mask = np.concatenate([np.ones((len(word), 1), bool), valid], axis=1)[order]
            target = word[order]
        else:  # dbow_words: each token's skip-gram examples, then its document's
            inputs = np.concatenate([near_words, doc[:, None]], axis=1)[order]
            use = np.concatenate([valid, np.ones((len(word), 1), bool)], axis=1)[order]
            ctx = inputs[use][:, None]
            target = np.repeat(word[order], use.sum(1))
    n = len(target)
    micro_batch = micro_batch_for(n, len(word), int(np.count_nonzero(kept)), micro_batch)
    if shared_negatives:
        neg = negatives.draw(rng, (max(1, -(-n // micro_batch)), shared_negatives))
        neg_mask = None
    else:
        neg = negatives.draw(rng, (n, negative))
        neg_mask = neg != target[:, None]
    return Examples(ctx=ctx, ctx_mask=ctx_mask, target=target, neg=neg, neg_mask=neg_mask,
                    raw_tokens=len(tokens), n_docs=n_docs, micro_batch=micro_batch)


MIN_MICRO_BATCH = 32


def micro_batch_for(n_examples: int, kept_tokens: int, docs: int, micro_batch: int) -> int:
    """Micro-batch size for a chunk: at most `micro_batch`, small enough that a document appears
    about once per micro-batch.

    A micro-batch sums its updates from the same starting values. A chunk of few documents (a small
    corpus cut into many macro-batches) would put many of one document's tokens in one micro-batch:
    one big step instead of gensim's sequence of small ones. Measured on the bundled sample (dim 32,
    10 epochs, 160 documents per chunk): held-out recall@10 0.186 with 1,024 examples per
    micro-batch against 0.198 with 16. Large corpora have thousands of documents per chunk and keep
    the full size.
    """
    if kept_tokens == 0:
        return micro_batch
    per_pass = -(-n_examples * docs // kept_tokens)  # examples per "one token of every document"
    return int(min(micro_batch, max(MIN_MICRO_BATCH, per_pass)))


def _windows(position: np.ndarray, doc_length: np.ndarray, window: int, rng: np.random.Generator):
    """For each kept token, the indices of the tokens in its reduced window and which of them are real.

    Token i sits at `position[i]` in a document of `doc_length[i]` kept tokens, contiguous in the
    kept array; its window reaches window − b on each side, b uniform in [0, window) (gensim's
    reduced windows). Returns ([n, 2·window] int64 indices, [n, 2·window] bool valid).
    """
    n = len(position)
    offsets = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])
    reach = window - rng.integers(0, window, n)
    at = position[:, None] + offsets[None, :]
    valid = (np.abs(offsets)[None, :] <= reach[:, None]) & (at >= 0) & (at < doc_length[:, None])
    near = np.arange(n)[:, None] + offsets[None, :]
    return np.where(valid, near, np.arange(n)[:, None]), valid


def doc_step_scale(inputs: np.ndarray, micro_batch: int, cap: int = DOC_REPEAT_CAP) -> np.ndarray | None:
    """Per-example factor on the input-row update: min(1, cap / times the row occurs in its micro-batch).

    inputs is each example's first input row (its document, or the word of a skip-gram step). None
    when no row exceeds the cap (the usual case), so the kernel skips the multiply.
    """
    if len(inputs) == 0:
        return None
    key = (np.arange(len(inputs)) // micro_batch) * (int(inputs.max()) + 1) + inputs
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    if counts.max() <= cap:
        return None
    return np.minimum(1.0, cap / counts[inverse]).astype(np.float32)


def unique_rows(ids: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ids and, for every input id, its position among them.

    A marker array over the whole table is O(n + num_rows) and much faster than np.unique's sort
    for the sizes of a macro-batch (hundreds of thousands of ids over up to millions of rows).
    """
    present = np.zeros(num_rows, dtype=bool)
    present[ids] = True
    uniq = np.flatnonzero(present)
    position = np.empty(num_rows, dtype=np.int64)
    position[uniq] = np.arange(len(uniq), dtype=np.int64)
    return uniq, position[ids]
