"""The block schedule: several workers train the URL tables without two of them ever writing a row at once.

Changes when the rounds change: how the URL rows are cut into blocks, and which worker holds which
block when.

Each worker owns its documents (worker.plan_units): no other worker reads them, so their rows have
one writer. The URL rows (words_out) are what workers would share. Here they are cut into one block
per worker, and an epoch is as many rounds as there are workers. In round r worker i holds block
(i + r) mod W: it is the only writer of that block, keeps its rows resident and trains only the
tokens of its own documents that fall in it, with negatives drawn from the block. Between rounds each
worker pushes its block to the servers and pulls the next, so every row is trained from its latest
value, as in PyTorch-BigGraph's buckets or GraphVite's orthogonal blocks. Over the W rounds of an
epoch every worker meets every block once, so every token of the corpus trains once per epoch.

Blocks are dealt afresh each epoch. Ids are by descending frequency; cut into groups of W consecutive
ids, each group gives one id to each block, in a random order. Every block so holds the same share
of hot and of rare rows, which keeps the rounds' work even (a round lasts as long as its slowest
worker). The groups' boundaries shift by one id each epoch, so two URLs that share no block in one
epoch share one in another: no pair of URLs is kept from being each other's negative for a whole run.

Negatives come from the held block, each row drawn with probability ∝ count^ns_exponent within it.
A block's share of the unigram^ns_exponent mass and of the tokens are both about 1/W (each block has
one id of every group), so over a rotation each URL is drawn about as often as gensim's rule over
the whole vocabulary would draw it.

With one worker there is one block, every row, and one round: the sole writer of every row it trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import NegativeTable


@dataclass
class Block:
    """One block of the URL rows as its holder trains it: its global ids (ascending), and the keep
    probability and negatives' alias table of its rows, indexed by local row (position in `ids`)."""

    index: int
    ids: np.ndarray
    keep: np.ndarray
    negatives: NegativeTable


class Blocks:
    """The blocks of one epoch: which block each URL row is in, and its row within the block."""

    def __init__(self, vocab_size: int, num_blocks: int, seed: int, epoch: int):
        self.vocab_size, self.num_blocks, self.epoch = int(vocab_size), int(num_blocks), int(epoch)
        w = self.num_blocks
        if w == 1:
            self.block_of = np.zeros(vocab_size, np.int32)
            self.local_of = np.arange(vocab_size, dtype=np.int64)
            self.bounds = np.array([0, vocab_size], np.int64)
            self.order = self.local_of
            return
        shift = epoch % w  # the groups' boundaries move by one id each epoch
        ids = np.arange(vocab_size, dtype=np.int64)
        group, place = np.divmod(ids + shift, w)
        groups = int(group[-1]) + 1 if vocab_size else 0
        rng = np.random.default_rng([seed, epoch, 0x51C4ED])
        deal = np.argsort(rng.random((groups, w)), axis=1)  # each group's ids, dealt to the blocks in a random order
        self.block_of = deal[group, place].astype(np.int32)
        # ids grouped by block, ascending within each: block b's rows are order[bounds[b]:bounds[b+1]]
        self.order = np.argsort(self.block_of, kind="stable").astype(np.int64)
        counts = np.bincount(self.block_of, minlength=w)
        self.bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.local_of = np.empty(vocab_size, np.int64)
        self.local_of[self.order] = np.arange(vocab_size) - np.repeat(self.bounds[:-1], counts)

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
        if self.num_blocks == 1 and negatives is not None:
            return Block(b, ids, keep_prob, negatives)
        return Block(b, ids, np.ascontiguousarray(keep_prob[ids]), NegativeTable(counts[ids], ns_exponent))

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
