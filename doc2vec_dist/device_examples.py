"""PV-DBOW's training examples built where the batched kernel runs (torch: CPU or CUDA).

The host hands the device a chunk as it reads it: each document's row in the worker's compact
`inputs`, the chunk's offsets and its token ids. Everything per token happens here, on the device:
gensim's frequent-word subsampling, the interleaved order, and the negatives, drawn from the alias
table of unigram^ns_exponent (sampling.NegativeTable) held on the device. With every `words_out` row
resident (the token path: one worker, or a GPU holding the URL table) a token's id is its row in
`outputs`, so no compact mapping of the URL rows is needed either.

The definitions are sampling.build_examples' (which builds the host's examples for every mode); this
is its PV-DBOW case, from tensors, with a torch generator.

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

from dataclasses import dataclass

import numpy as np
import torch

from .sampling import MIN_MICRO_BATCH, NegativeTable

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
class DeviceExamples:
    """One chunk's PV-DBOW examples, in training order, as kernels.train takes them."""

    ctx: torch.Tensor                # int64 [n, 1]: the document's row in `inputs`
    target: torch.Tensor             # int64 [n]: the word, its row in `outputs`
    neg: torch.Tensor                # int64 [n, k]
    neg_mask: torch.Tensor           # bool [n, k]: False where a draw equals the target (gensim skips it)
    micro_batch: int

    def __len__(self) -> int:
        return int(self.target.shape[0])


def generator(seed: int, device: torch.device) -> torch.Generator:
    """A torch generator on `device` seeded by a batch's seed (any int, folded to 63 bits)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) & ((1 << 63) - 1))
    return gen


def dbow_examples(doc_rows: torch.Tensor, offsets: torch.Tensor, tokens: torch.Tensor, tables: DeviceTables,
                  negative: int, gen: torch.Generator, micro_batch: int) -> DeviceExamples:
    """PV-DBOW examples of a chunk: doc_rows [D] (each document's row in `inputs`), offsets [D+1] and
    tokens [T] (word ids), all on the tables' device. Subsampled tokens are dropped; each kept token
    gives one (document → token) example with its own `negative` negatives."""
    dev = tables.device
    n_docs = int(doc_rows.shape[0])
    lengths = offsets[1:] - offsets[:-1]
    doc = torch.repeat_interleave(torch.arange(n_docs, device=dev), lengths, output_size=int(tokens.shape[0]))
    keep = torch.rand(tokens.shape, generator=gen, device=dev) < tables.keep[tokens.long()]
    doc, word = doc[keep], tokens[keep].long()
    n = int(word.shape[0])
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return DeviceExamples(empty[:, None], empty, empty.view(0, negative), empty.view(0, negative) > 0,
                              max(1, micro_batch))
    kept = torch.bincount(doc, minlength=n_docs)
    live = int(torch.count_nonzero(kept))
    position = torch.arange(n, device=dev) - (torch.cumsum(kept, 0) - kept)[doc]  # doc ascends here
    group_size = max(1, min(micro_batch, -(-live // INTERLEAVE_GROUPS)))
    # the documents' random ranks, the live ones first, so that groups hold live documents only
    rank = torch.empty(n_docs, dtype=torch.int64, device=dev)
    shuffled = torch.randperm(n_docs, generator=gen, device=dev)
    order_live = torch.argsort((kept[shuffled] == 0).to(torch.int64), stable=True)
    rank[shuffled[order_live]] = torch.arange(n_docs, device=dev)
    r = rank[doc]
    longest = int(kept.max())
    key = ((r // group_size) * longest + position) * n_docs + r  # group, then round, then rank: unique
    order = torch.argsort(key)
    doc, word = doc[order], word[order]
    micro = int(max(MIN_MICRO_BATCH, group_size)) if micro_batch >= MIN_MICRO_BATCH else int(micro_batch)
    neg = tables.draw((n, negative), gen)
    return DeviceExamples(ctx=doc_rows[doc].unsqueeze(1), target=word, neg=neg, neg_mask=neg != word[:, None],
                          micro_batch=micro)
