"""The block schedule: several workers train the URL tables without two of them ever writing a row at once.

Changes when the rounds change: how the URL rows are cut into blocks, and which worker holds which
block when.

Each worker owns its documents (units.plan_units): no other worker reads them, so their rows have
one writer. The URL rows (words_out) are what workers would share. Here they are cut into one block
per worker, and an epoch is as many rounds as there are workers. In round r worker i holds block
(i + r) mod W: it is the only writer of that block, keeps its rows resident and trains only the
tokens of its own documents that fall in it, with negatives drawn from the block. Between rounds each
worker hands its block to the block's next holder (client.ParameterClient.hand_over; the servers'
copy written at the epoch's end and at checkpoints), so every row is trained from its latest value, as in PyTorch-BigGraph's
buckets or GraphVite's orthogonal blocks. Over the W rounds of an
epoch every worker meets every block once, so every token of the corpus trains once per epoch.

Negatives come from the held block, each row drawn with probability ∝ count^ns_exponent within it.
So that over a rotation each URL is drawn as often as gensim's rule over the whole vocabulary would
draw it, a block whose rows hold a share P of the trained tokens and a share Q of the
count^ns_exponent mass draws negative × Q / P negatives per example (its fractional part as the
chance of one more): a URL u of it is then drawn tokens × P × (negative × Q / P) × q(u) / Q =
tokens × negative × q(u) times, gensim's count.

Blocks are dealt afresh each epoch, so that their work is even (a round lasts as long as its slowest
worker), and so that no two URLs are kept from being each other's negatives for a whole run. Each id
in turn, most frequent first, goes to the block with the least work so far, work being the
examples its rows will train (its kept tokens, and the negatives drawn from it: P + negative × Q),
and loads closer than the id's own work plus DEAL_SLACK of a block's fair share ordered at random. A
Zipf head is so spread over the blocks (dealing W consecutive ranks to the W blocks left one with 1.6
times the tokens of another: 50k URLs, 8 blocks, no subsampling), and the rest is dealt at random, at
the cost of rounds about DEAL_SLACK uneven at most. Only URLs each heavier than that slack (a few of
the very hottest, where subsampling is off) always land in different blocks.

With one worker there is one block, every row, and one round: the sole writer of every row it trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from .sampling import NegativeTable

MAX_NEGATIVE_RATIO = 4.0  # a block's negatives per example stay within this factor of --negative
DEAL_SLACK = 0.1  # loads within this share of a block's fair work are ordered at random when rows are dealt


@numba.njit(cache=True)
def _deal(weight: np.ndarray, blocks: int, noise: np.ndarray, slack: float) -> np.ndarray:
    """Each id's block: ids one after another (heaviest first), each to the block with the least
    weight so far, a load counted as load + noise × (the id's own weight + slack), so that loads
    closer than that are ordered at random (noise: a uniform per id and block)."""
    n = len(weight)
    out = np.empty(n, np.int32)
    load = np.zeros(blocks)
    for i in range(n):
        best, least = 0, np.inf
        for b in range(blocks):
            key = load[b] + noise[i * blocks + b] * (weight[i] + slack)
            if key < least:
                best, least = b, key
        out[i] = best
        load[best] += weight[i]
    return out


@numba.njit(cache=True)
def _split(block_of: np.ndarray, local_of: np.ndarray, offsets: np.ndarray, tokens: np.ndarray, local: np.ndarray,
           blocks: int) -> tuple:
    """A chunk's tokens grouped by block, each document's in their order, as their blocks' local rows
    (into `local`): the bounds of each block's run, and each block's tokens per document [blocks, docs].
    A counting sort in two passes (Blocks.split: the first round of a segment splits every chunk)."""
    docs = len(offsets) - 1
    sizes = np.zeros((blocks, docs), dtype=np.int64)
    for d in range(docs):
        for i in range(offsets[d], offsets[d + 1]):
            sizes[block_of[tokens[i]], d] += 1
    bounds = np.zeros(blocks + 1, dtype=np.int64)
    for b in range(blocks):
        bounds[b + 1] = bounds[b] + sizes[b].sum()
    at = bounds[:-1].copy()
    for i in range(len(tokens)):
        b = block_of[tokens[i]]
        local[at[b]] = local_of[tokens[i]]
        at[b] += 1
    return bounds, sizes


@dataclass
class Block:
    """One block of the URL rows as its holder trains it: its global ids (ascending), and the keep
    probability and negatives' alias table of its rows, indexed by local row (position in `ids`)."""

    index: int
    ids: np.ndarray
    keep: np.ndarray
    negatives: NegativeTable
    negative: float  # negatives per example: negative × Q / P (see the module's docstring)


class Blocks:
    """The blocks of one epoch: which block each URL row is in, and its row within the block."""

    def __init__(self, counts: np.ndarray, keep: np.ndarray, num_blocks: int, seed: int, epoch: int,
                 negative: int = 5, ns_exponent: float = 0.75):
        """counts: each URL row's token count (the vocabulary's, ids by descending count); keep: the
        chance its token is kept by subsampling."""
        counts = np.asarray(counts, dtype=np.float64)
        vocab_size = len(counts)
        self.vocab_size, self.num_blocks, self.epoch = vocab_size, int(num_blocks), int(epoch)
        self.negative = negative
        w = self.num_blocks
        if w == 1:
            self.block_of = np.zeros(vocab_size, np.int32)
            self.local_of = np.arange(vocab_size, dtype=np.int64)
            self.bounds = np.array([0, vocab_size], np.int64)
            self.order = self.local_of
            self.negatives_per_example = np.array([float(negative)])
            return
        # each row's share of the trained tokens (p) and of the negatives' mass (q)
        p = counts * np.asarray(keep, dtype=np.float64)
        p /= max(p.sum(), 1e-300)
        q = np.where(counts > 0, counts, 0.0) ** ns_exponent
        q /= max(q.sum(), 1e-300)
        rng = np.random.default_rng([seed, epoch, 0x51C4ED])
        work = p + negative * q
        self.block_of = _deal(work, w, rng.random(vocab_size * w), DEAL_SLACK * work.sum() / w)
        # ids grouped by block, ascending within each: block b's rows are order[bounds[b]:bounds[b+1]]
        self.order = np.argsort(self.block_of, kind="stable").astype(np.int64)
        sizes = np.bincount(self.block_of, minlength=w)
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.local_of = np.empty(vocab_size, np.int64)
        self.local_of[self.order] = np.arange(vocab_size) - np.repeat(self.bounds[:-1], sizes)
        share_p = np.bincount(self.block_of, weights=p, minlength=w)
        share_q = np.bincount(self.block_of, weights=q, minlength=w)
        # negative × Q / P, kept within a factor MAX_NEGATIVE_RATIO of `negative` for a block (all but)
        # without trained tokens
        ratio = np.clip(share_q / np.maximum(share_p, 1e-300), 1 / MAX_NEGATIVE_RATIO, MAX_NEGATIVE_RATIO)
        self.negatives_per_example = negative * ratio

    @staticmethod
    def held(worker: int, round_: int, num_blocks: int) -> int:
        """The block worker `worker` holds in round `round_`: no two workers hold the same one."""
        return (worker + round_) % num_blocks

    def ids(self, b: int) -> np.ndarray:
        """Global ids of block b's rows, ascending (its local row i is ids[i])."""
        return self.order[self.bounds[b]:self.bounds[b + 1]]

    def block(self, b: int, keep_prob: np.ndarray, counts: np.ndarray, ns_exponent: float,
              negatives: NegativeTable | None = None) -> Block:
        """Block b with its rows' keep probabilities and negatives' table (one block: the whole
        vocabulary's, given as `negatives`, are used as they are)."""
        ids = self.ids(b)
        per_example = float(self.negatives_per_example[b])
        if self.num_blocks == 1 and negatives is not None:
            return Block(b, ids, keep_prob, negatives, per_example)
        return Block(b, ids, np.ascontiguousarray(keep_prob[ids]), NegativeTable(counts[ids], ns_exponent), per_example)

    def split(self, doc_ids: np.ndarray, offsets: np.ndarray, tokens: np.ndarray) -> list:
        """select() for every block at once, in one pass over the chunk: [block b's (doc_ids, offsets,
        tokens)] (what a worker stores to train in its later rounds without reading the chunk again)."""
        if self.num_blocks == 1:
            return [(doc_ids, offsets, tokens)]
        local = np.empty(len(tokens), dtype=tokens.dtype)
        bounds, sizes = _split(self.block_of, self.local_of, np.asarray(offsets, dtype=np.int64), tokens, local,
                               self.num_blocks)
        parts = []
        for b in range(self.num_blocks):
            live = sizes[b] > 0
            parts.append((doc_ids[live], np.concatenate([[0], np.cumsum(sizes[b][live])]).astype(offsets.dtype),
                          local[bounds[b]:bounds[b + 1]]))
        return parts

    def select(self, b: int, doc_ids: np.ndarray, offsets: np.ndarray, tokens: np.ndarray):
        """A chunk's tokens that fall in block b, as local rows of the block, with their documents
        (those left with no token are dropped): (doc_ids, offsets, tokens)."""
        if self.num_blocks == 1:
            return doc_ids, offsets, tokens
        inside = self.block_of[tokens] == b
        doc = np.repeat(np.arange(len(doc_ids)), np.diff(offsets))
        sizes = np.bincount(doc[inside], minlength=len(doc_ids))
        live = sizes > 0
        new_offsets = np.concatenate([[0], np.cumsum(sizes[live])]).astype(offsets.dtype)
        local = self.local_of[tokens[inside]].astype(tokens.dtype)
        return doc_ids[live], new_offsets, local
