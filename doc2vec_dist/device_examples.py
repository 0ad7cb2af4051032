"""Training examples built where the batched kernel runs (torch: CPU or CUDA).

Changes when the examples a batched kernel trains on change (subsampling, windows, negatives) on the
device side.

The host hands the device a chunk as it reads it: each document's row in the worker's compact
`inputs`, the chunk's offsets and its token ids. Everything per token happens here, on the device:
gensim's frequent-word subsampling, the interleaved order, the reduced windows (dbow_words, PV-DM),
and the negatives, drawn from the alias table of unigram^ns_exponent (sampling.NegativeTable) held on
the device. With every URL row resident (the token path: one worker holding the URL tables) a
token's id is its row in `outputs`, and in `inputs` where `words` is trained, so no compact mapping
of the URL rows is needed either.

The definitions are sampling.build_examples' (which builds the host's examples for every mode), from
tensors, with a torch generator.

Order. Tokens are interleaved, documents advancing side by side one kept token per round, in groups:
the chunk's documents, in a random order, are cut into at least INTERLEAVE_GROUPS groups of at most
`micro_batch` documents, and the groups train one after another, each in rounds. A micro-batch holds
about one round of one group: each of its documents once. Measured on Lee (64 seeds, 40 epochs, each
update applied at once so that only the order differs; gensim's order, document after document:
0.4915): every document of the corpus interleaved at once 0.4863; in groups of 8, 32, 100 and 175 of
its 350 documents 0.4896, 0.4893, 0.4895 and 0.4889. The batched kernel on those orders gave the same
(0.4859 all at once over 24 seeds, 0.4894 in groups of 100 over 32), so summing a round's updates
costs nothing: the order does. Large corpora, whose chunks hold thousands of short documents, measured
the same at micro-batches of 1,024 to 65,536 (skewed set, 200k set).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .sampling import DOC_REPEAT_CAP, MIN_MICRO_BATCH, NegativeTable

INTERLEAVE_GROUPS = 4  # a chunk's documents interleave in at least this many groups, one after another


class DeviceTables:
    """The keep probability of every word and the negatives' alias table, on one device."""

    def __init__(self, keep_prob: np.ndarray, negatives: NegativeTable, device: torch.device):
        self.device = device
        self.keep = torch.as_tensor(np.asarray(keep_prob, dtype=np.float32), device=device)
        self.accept = torch.as_tensor(np.asarray(negatives.accept, dtype=np.float32), device=device)
        self.alias = torch.as_tensor(np.asarray(negatives.alias, dtype=np.int64), device=device)

    def draw(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """Negatives of `shape`, each word with probability ∝ count^ns_exponent (one slot, one coin)."""
        slot = torch.randint(0, len(self.accept), shape, generator=gen, device=self.device)
        coin = torch.rand(shape, generator=gen, device=self.device)
        return torch.where(coin < self.accept[slot], slot, self.alias[slot])


@dataclass
class Shape:
    """What examples a mode builds (TrainConfig's mode, dbow_words and window)."""

    mode: str = "dbow"
    dbow_words: bool = False
    window: int = 5

    @property
    def windows(self) -> bool:
        return self.mode == "dm" or self.dbow_words


@dataclass
class DeviceExamples:
    """One chunk's examples, in training order, as kernels.train takes them."""

    ctx: torch.Tensor                # int64 [n, c]: rows of `inputs` (the document's; PV-DM: then its window's words)
    target: torch.Tensor             # int64 [n]: the word, its row in `outputs`
    neg: torch.Tensor                # int64 [n, k]
    neg_mask: torch.Tensor           # bool [n, k]: False where a draw equals the target (gensim skips it)
    micro_batch: int
    ctx_mask: torch.Tensor | None = None  # bool [n, c], PV-DM: the real context rows
    scale: torch.Tensor | None = None     # [n]: sampling.doc_step_scale of each example's first input row

    def __len__(self) -> int:
        return int(self.target.shape[0])


def generator(seed: int, device: torch.device) -> torch.Generator:
    """A torch generator on `device` seeded by a batch's seed (any int, folded to 63 bits)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) & ((1 << 63) - 1))
    return gen


def build(doc_rows: torch.Tensor, offsets: torch.Tensor, tokens: torch.Tensor, tables: DeviceTables,
          negative: float, gen: torch.Generator, micro_batch: int, shape: Shape | None = None) -> DeviceExamples:
    """The examples of a chunk: doc_rows [D] (each document's row in `inputs`), offsets [D+1] and
    tokens [T] (word ids), all on the tables' device. Subsampled tokens are dropped first, windows
    included (as gensim does). Each kept token gives, as sampling.build_examples defines them:
    PV-DBOW, one (document → token) example; with dbow_words, first a skip-gram example (word → token)
    for each word of its reduced window, then its document's; PV-DM, one example whose context is the
    document and the words of its reduced window. A word's input row is its id: the `words` rows sit
    resident at the head of `inputs`, the documents' after them. Every example has its own `negative`
    negatives; a fractional count (the block schedule's) draws one column more, masked but for the
    fractional part of the examples."""
    shape = shape or Shape()
    dev = tables.device
    extra = float(negative) - int(negative)
    negative = int(negative) + (extra > 0)
    n_docs = int(doc_rows.shape[0])
    lengths = offsets[1:] - offsets[:-1]
    doc = torch.repeat_interleave(torch.arange(n_docs, device=dev), lengths, output_size=int(tokens.shape[0]))
    keep = torch.rand(tokens.shape, generator=gen, device=dev) < tables.keep[tokens.long()]
    doc, word = doc[keep], tokens[keep].long()
    kept_tokens = int(word.shape[0])
    columns = 1 + (2 * shape.window if shape.mode == "dm" else 0)
    if kept_tokens == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return DeviceExamples(empty.view(0, columns), empty, empty.view(0, negative), empty.view(0, negative) > 0,
                              max(1, micro_batch), ctx_mask=empty.view(0, columns) > 0 if columns > 1 else None)
    kept = torch.bincount(doc, minlength=n_docs)
    live = int(torch.count_nonzero(kept))
    position = torch.arange(kept_tokens, device=dev) - (torch.cumsum(kept, 0) - kept)[doc]  # doc ascends here
    near = valid = None
    per_token = 1.0  # examples per kept token
    if shape.windows:
        near, valid = _windows(position, kept[doc], shape.window, gen)
        if shape.dbow_words:
            per_token = 1.0 + float(valid.sum()) / kept_tokens
    group_size = max(1, min(int(micro_batch // per_token), -(-live // INTERLEAVE_GROUPS)))
    # the documents' random ranks, the live ones first, so that groups hold live documents only
    rank = torch.empty(n_docs, dtype=torch.int64, device=dev)
    shuffled = torch.randperm(n_docs, generator=gen, device=dev)
    order_live = torch.argsort((kept[shuffled] == 0).to(torch.int64), stable=True)
    rank[shuffled[order_live]] = torch.arange(n_docs, device=dev)
    r = rank[doc]
    longest = int(kept.max())
    key = ((r // group_size) * longest + position) * n_docs + r  # group, then round, then rank: unique
    order = torch.argsort(key)
    micro = max(MIN_MICRO_BATCH, math.ceil(group_size * per_token)) if micro_batch >= MIN_MICRO_BATCH \
        else int(micro_batch)
    ctx_mask = None
    doc_input = doc_rows[doc]
    if shape.mode == "dm":
        ctx = torch.cat([doc_input[:, None], word[near]], dim=1)[order]
        ctx_mask = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)[order]
        target = word[order]
    elif shape.dbow_words:  # each token's skip-gram examples, then its document's
        inputs = torch.cat([word[near], doc_input[:, None]], dim=1)[order]
        use = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)[order]
        ctx = inputs[use][:, None]
        target = torch.repeat_interleave(word[order], use.sum(1))
    else:
        ctx, target = doc_input[order, None], word[order]
    n = int(target.shape[0])
    neg = tables.draw((n, negative), gen)
    neg_mask = neg != target[:, None]
    if extra > 0:
        neg_mask[:, -1] &= torch.rand(n, generator=gen, device=dev) < extra
    return DeviceExamples(ctx=ctx, target=target, neg=neg, neg_mask=neg_mask, micro_batch=micro,
                          ctx_mask=ctx_mask, scale=step_scale(ctx[:, 0], micro) if shape.windows else None)


def _windows(position: torch.Tensor, doc_length: torch.Tensor, window: int, gen: torch.Generator):
    """sampling._windows on the device: for each kept token, the indices (into the kept tokens) of its
    reduced window, window − b on each side with b uniform in [0, window), and which are real."""
    dev = position.device
    n = int(position.shape[0])
    offsets = torch.cat([torch.arange(-window, 0, device=dev), torch.arange(1, window + 1, device=dev)])
    reach = window - torch.randint(0, window, (n,), generator=gen, device=dev)
    at = position[:, None] + offsets[None, :]
    valid = (offsets.abs()[None, :] <= reach[:, None]) & (at >= 0) & (at < doc_length[:, None])
    own = torch.arange(n, device=dev)[:, None]
    return torch.where(valid, own + offsets[None, :], own), valid


def step_scale(inputs: torch.Tensor, micro_batch: int, cap: int = DOC_REPEAT_CAP) -> torch.Tensor | None:
    """sampling.doc_step_scale on the device: min(1, cap / times an example's input row occurs in its
    micro-batch), or None when no row exceeds the cap."""
    n = int(inputs.shape[0])
    if n == 0:
        return None
    key = torch.arange(n, device=inputs.device) // micro_batch * (int(inputs.max()) + 1) + inputs
    _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
    if int(counts.max()) <= cap:
        return None
    return torch.clamp(cap / counts[inverse].to(torch.float32), max=1.0)
