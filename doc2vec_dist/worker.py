"""Worker: read → pairs → pull → micro-batches → push, one macro-batch after another, pipelined.

Each worker reads its own units of the corpus (row ranges of shard files) straight from shared
storage; nothing goes through the driver. For each macro-batch it takes the unique rows of `docs` and
`words_out`, pulls them with one call per parameter server into compact local matrices, trains
micro-batches over them (kernels.py), and pushes back new − pulled with one call per server. The pull
of the next macro-batch is in flight while the current one computes, and up to
`max_inflight_pushes` pushes are outstanding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import ray
import torch

from .corpus import Corpus, iter_shard
from .kernels import dbow_train, micro_batch_alphas
from .sampling import NegativeTable, Pairs, dbow_pairs, doc_step_scale, keep_probabilities, unique_rows
from .sharding import Routing

MIN_MACRO_BATCH = 4096
STAGES = ("read", "sample", "pull", "wait", "compute", "push")  # where a worker's time goes


@dataclass
class Unit:
    """Rows [start, end) of one shard file: the grain at which the corpus is divided among workers."""

    path: str
    start: int
    end: int
    tokens: int


@dataclass
class Batch:
    pairs: Pairs
    docs: Routing
    words: Routing
    doc_pos: np.ndarray      # compact position of each pair's doc
    word_pos: np.ndarray     # compact position of each pair's positive word
    neg_pos: np.ndarray      # compact positions of its negatives
    doc_scale: np.ndarray | None
    pulls: list              # one ObjectRef per shard

    def request(self, shard: int) -> dict[str, np.ndarray]:
        """Local rows of both tables on one server: what is pulled from it and pushed back to it."""
        return {"docs": self.docs.local[shard], "words_out": self.words.local[shard]}

    def slices(self, shard: int) -> tuple[slice, slice]:
        """Where one server's rows sit in the compact docs and words_out matrices."""
        d, w = self.docs.bounds, self.words.bounds
        return slice(d[shard], d[shard + 1]), slice(w[shard], w[shard + 1])


class Worker:
    def __init__(self, index: int, units: list[Unit], corpus_path: str, config: dict,
                 servers: list, table_rows: dict[str, int]):
        self.index, self.units, self.config, self.servers = index, units, config, servers
        self.num_shards = len(servers)
        self.table_rows = table_rows
        torch.set_num_threads(int(config["cpus_per_worker"]))
        use_cuda = config["gpus_per_worker"] > 0
        if use_cuda and not torch.cuda.is_available():
            raise RuntimeError(f"worker {index}: gpus_per_worker > 0 but torch sees no CUDA device")
        self.device = torch.device("cuda" if use_cuda else "cpu")
        counts = Corpus(corpus_path).counts()
        self.keep_prob = keep_probabilities(counts, config["sample"])
        self.negatives = NegativeTable(counts, config["ns_exponent"])
        self.tokens_per_epoch = sum(u.tokens for u in units)
        # At least ~16 pull/push rounds per epoch: on a small corpus one huge macro-batch would leave
        # every worker training on a copy of words_out that is an epoch old (Lee corpus: -0.02 Pearson).
        self.macro_batch = min(config["macro_batch"], max(MIN_MACRO_BATCH, self.tokens_per_epoch // 16))
        self.planned_tokens = self.tokens_per_epoch * config["epochs"]
        self.stats = self._zero_stats()

    @staticmethod
    def _zero_stats() -> dict:
        # every stage present from the start: progress() copies this dict from another thread, and a
        # key appearing mid-copy would break it
        return {"tokens": 0, "pairs": 0, "loss": 0.0, "epoch": -1,
                "seconds": dict.fromkeys(STAGES, 0.0)}

    def progress(self) -> dict:
        """Counters of the current epoch; served from a second thread while run_epoch works."""
        s = dict(self.stats)
        s["seconds"] = dict(s["seconds"])
        return s

    # -- reading -------------------------------------------------------------------------------
    def _chunks(self):
        """(doc_ids, offsets, tokens) chunks of at most ~macro_batch tokens from this worker's units."""
        for unit in self.units:
            row = 0
            for doc_ids, offsets, tokens in iter_shard(unit.path, max_tokens=self.macro_batch):
                n = len(doc_ids)
                lo, hi = max(unit.start - row, 0), min(unit.end - row, n)
                row += n
                if lo >= hi:
                    if row >= unit.end:
                        break
                    continue
                if lo > 0 or hi < n:
                    doc_ids = doc_ids[lo:hi]
                    tokens = tokens[offsets[lo]:offsets[hi]]
                    offsets = offsets[lo:hi + 1] - offsets[lo]
                yield doc_ids, offsets, tokens

    def _prepare(self, chunk, rng) -> Batch:
        """Pairs, unique rows and their routing for one chunk (pulls not yet issued)."""
        doc_ids, offsets, tokens = chunk
        pairs = dbow_pairs(offsets, tokens, self.keep_prob, self.negatives, self.config["negative"], rng)
        doc_scale = doc_step_scale(pairs.doc, self.config["micro_batch"])
        docs = Routing.of(doc_ids.astype(np.int64), self.num_shards)  # doc ids of a chunk: sorted, unique
        k = pairs.neg.shape[1]
        uniq_words, inverse = unique_rows(np.concatenate([pairs.word, pairs.neg.reshape(-1)]),
                                          self.table_rows["words_out"])
        words = Routing.of(uniq_words, self.num_shards)
        compact = words.position[inverse]
        n = len(pairs)
        return Batch(pairs=pairs, docs=docs, words=words, doc_pos=docs.position[pairs.doc],
                     word_pos=compact[:n], neg_pos=compact[n:].reshape(n, k), doc_scale=doc_scale, pulls=[])

    def _pull(self, batch: Batch) -> None:
        """One pull per server for the batch's rows of both tables; the results arrive later."""
        batch.pulls = [server.pull.remote(batch.request(s)) for s, server in enumerate(self.servers)]

    # -- one epoch ---------------------------------------------------------------------------------
    def run_epoch(self, epoch: int) -> dict:
        cfg = self.config
        self.stats = self._zero_stats()
        self.stats["epoch"] = epoch
        seconds = self.stats["seconds"]
        rng = np.random.default_rng([cfg["seed"], self.index, epoch])
        done_before = epoch * self.tokens_per_epoch
        chunks = self._chunks()
        inflight: list = []

        def next_batch():
            t0 = time.perf_counter()
            chunk = next(chunks, None)
            t1 = time.perf_counter()
            seconds["read"] += t1 - t0
            if chunk is None:
                return None
            batch = self._prepare(chunk, rng)
            t2 = time.perf_counter()
            seconds["sample"] += t2 - t1
            self._pull(batch)
            seconds["pull"] += time.perf_counter() - t2
            return batch

        batch = next_batch()
        step = 0
        while batch is not None:
            upcoming = next_batch()  # its pull flies while this batch computes

            t0 = time.perf_counter()
            pulled = ray.get(batch.pulls)
            t1 = time.perf_counter()
            seconds["wait"] += t1 - t0

            n_micro = max(1, -(-len(batch.pairs) // cfg["micro_batch"]))  # ≥ 1: subsampling may keep nothing
            alphas = micro_batch_alphas(cfg["alpha"], cfg["min_alpha"], done_before, batch.pairs.raw_tokens,
                                        self.planned_tokens, n_micro)
            docs, words_out = self._assemble(batch, pulled)
            loss = self._compute(batch, docs, words_out, alphas)
            t2 = time.perf_counter()
            seconds["compute"] += t2 - t1

            label = f"epoch {epoch} step {step} of worker {self.index} (alpha {float(alphas[0]):.6g})"
            inflight += self._push(batch, pulled, docs, words_out, label)
            while len(inflight) > cfg["max_inflight_pushes"] * self.num_shards:
                ready, inflight = ray.wait(inflight, num_returns=len(inflight) - cfg["max_inflight_pushes"]
                                           * self.num_shards)
                ray.get(ready)  # raises a refused (non-finite) push here, naming the step
            seconds["push"] += time.perf_counter() - t2

            done_before += batch.pairs.raw_tokens
            self.stats["tokens"] += batch.pairs.raw_tokens
            self.stats["pairs"] += len(batch.pairs)
            self.stats["loss"] += loss
            batch, step = upcoming, step + 1

        t0 = time.perf_counter()
        ray.get(inflight)
        seconds["push"] += time.perf_counter() - t0
        return self.progress()

    def _assemble(self, batch: Batch, pulled: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Copy the pulled rows (read-only, zero-copy from the object store) into writable compact matrices."""
        dim = self.config["dim"]
        docs = np.empty((int(batch.docs.bounds[-1]), dim), dtype=np.float32)
        words_out = np.empty((int(batch.words.bounds[-1]), dim), dtype=np.float32)
        for s, rows in enumerate(pulled):
            d, w = batch.slices(s)
            n_docs = d.stop - d.start
            docs[d] = rows[:n_docs]
            words_out[w] = rows[n_docs:]
        return docs, words_out

    def _compute(self, batch: Batch, docs: np.ndarray, words_out: np.ndarray, alphas: torch.Tensor) -> float:
        dev = self.device
        non_blocking = dev.type == "cuda"

        def to_dev(a):
            t = torch.from_numpy(a)
            return t.pin_memory().to(dev, non_blocking=True) if non_blocking else t

        d_t, o_t = to_dev(docs), to_dev(words_out)
        loss = dbow_train(d_t, o_t, to_dev(batch.doc_pos), to_dev(batch.word_pos), to_dev(batch.neg_pos),
                          to_dev(batch.pairs.neg_mask), alphas.to(dev), self.config["micro_batch"],
                          None if batch.doc_scale is None else to_dev(batch.doc_scale))
        if non_blocking:  # bring the trained rows home; the CPU path updated the arrays in place
            docs[:] = d_t.cpu().numpy()
            words_out[:] = o_t.cpu().numpy()
        return loss

    def _push(self, batch: Batch, pulled: list[np.ndarray], docs: np.ndarray, words_out: np.ndarray,
              label: str) -> list:
        refs = []
        for s, (server, rows) in enumerate(zip(self.servers, pulled)):
            if len(rows) == 0:
                continue
            d, w = batch.slices(s)
            n_docs = d.stop - d.start
            delta = np.empty_like(rows)
            np.subtract(docs[d], rows[:n_docs], out=delta[:n_docs])
            np.subtract(words_out[w], rows[n_docs:], out=delta[n_docs:])
            refs.append(server.push.remote(batch.request(s), delta, label))
        return refs
