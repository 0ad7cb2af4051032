"""Worker: read → examples → pull → micro-batches → push, one macro-batch after another, pipelined.

Each worker reads its own units of the corpus (row ranges of shard files) straight from shared
storage; nothing goes through the driver. For each macro-batch it builds the examples of its mode
(sampling.build_examples), takes the unique rows of `docs`, `words` (when trained) and `words_out`
they touch, pulls them with one call per parameter server into compact local matrices, trains
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

from . import kernels
from .corpus import Corpus, iter_shard
from .sampling import Examples, NegativeTable, build_examples, doc_step_scale, keep_probabilities, unique_rows
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
    """One macro-batch: its examples, the rows of each table it touches, and where they sit locally.

    The compact local matrices are `inputs` (the batch's `docs` rows, then its `words` rows) and
    `outputs` (its `words_out` rows); within each table's block, rows are grouped by server so a
    pull fills, and a push reads, one contiguous slice per server.
    """

    examples: Examples
    routes: dict[str, Routing]   # table → its unique rows' routing, in pull order
    ctx_pos: np.ndarray          # [n, c] compact positions in `inputs`
    target_pos: np.ndarray       # [n] compact positions in `outputs`
    neg_pos: np.ndarray          # negatives' compact positions in `outputs`
    scale: np.ndarray | None
    push_weights: dict           # table → weight of each compact row's delta (see Worker._push_weights)
    pulls: list                  # one ObjectRef per shard

    def request(self, shard: int) -> dict[str, np.ndarray]:
        """Local rows of every table on one server: what is pulled from it and pushed back to it."""
        return {name: route.local[shard] for name, route in self.routes.items()}

    def blocks(self, shard: int):
        """(table, compact matrix name, slice of it, slice of the table's own compact rows) for each
        table's rows on one server, in request order."""
        base = 0
        for name, route in self.routes.items():
            own = slice(int(route.bounds[shard]), int(route.bounds[shard + 1]))
            if name == "words_out":
                yield name, "outputs", own, own
            else:  # docs then words share `inputs`
                yield name, "inputs", slice(base + own.start, base + own.stop), own
                base += int(route.bounds[-1])

    def sizes(self) -> dict[str, int]:
        outputs = int(self.routes["words_out"].bounds[-1])
        return {"inputs": sum(int(r.bounds[-1]) for n, r in self.routes.items() if n != "words_out"),
                "outputs": outputs}


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
        self.width = config["dim"] + int(config["optimizer"] == "adagrad")  # adagrad's accumulator rides along
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
        """Examples, unique rows and their routing for one chunk (pulls not yet issued)."""
        cfg = self.config
        doc_ids, offsets, tokens = chunk
        ex = build_examples(offsets, tokens, self.keep_prob, self.negatives, cfg["negative"], rng,
                            mode=cfg["mode"], dbow_words=cfg["dbow_words"], window=cfg["window"],
                            shared_negatives=cfg["shared_negatives"], micro_batch=cfg["micro_batch"])
        routes = {"docs": Routing.of(doc_ids.astype(np.int64), self.num_shards)}  # sorted, unique
        push_weights: dict[str, np.ndarray | None] = {}
        flat = ex.ctx.reshape(-1)
        ctx_pos = routes["docs"].position[np.minimum(flat, ex.n_docs - 1)]
        if "words" in self.table_rows:  # words used as inputs: ids past n_docs in the examples
            is_word = flat >= ex.n_docs
            uniq, inverse = unique_rows(flat[is_word] - ex.n_docs, self.table_rows["words"])
            routes["words"] = Routing.of(uniq, self.num_shards)
            ctx_pos[is_word] = len(doc_ids) + routes["words"].position[inverse]
            push_weights["words"] = self._push_weights(routes["words"], inverse, len(uniq))
        uniq, inverse = unique_rows(np.concatenate([ex.target, ex.neg.reshape(-1)]), self.table_rows["words_out"])
        routes["words_out"] = Routing.of(uniq, self.num_shards)
        push_weights["words_out"] = self._push_weights(routes["words_out"], inverse, len(uniq))
        compact = routes["words_out"].position[inverse]
        n = len(ex)
        return Batch(examples=ex, routes=routes, ctx_pos=ctx_pos.reshape(ex.ctx.shape), target_pos=compact[:n],
                     neg_pos=compact[n:].reshape(ex.neg.shape), scale=doc_step_scale(ex.ctx[:, 0], ex.micro_batch),
                     push_weights=push_weights, pulls=[])

    def _push_weights(self, route: Routing, inverse: np.ndarray, n_unique: int) -> np.ndarray | None:
        """Weight of each shared row's pushed delta, in compact order: 1 / the workers expected to
        push the same row from the same stale start.

        A row of `words`/`words_out` that this macro-batch uses c times is, with W workers drawing
        from the same distribution, also in each other worker's concurrent macro-batch with
        probability ≈ 1 − e^(−c). Hot rows are in all of them: each worker trains its copy from the
        same pulled value close to where the batch's data pulls it, and W such deltas summed overshoot
        W-fold. Measured on 200k users with dbow_words and 2 workers: plain sums diverged (loss 10⁴
        → 10¹³ in 5 epochs) while one worker trained stably; weighting 1/(1 + (W−1)(1 − e^(−c)))
        keeps the sum near one full step for hot rows and leaves rare rows (c ≈ 0, one worker) whole.
        `docs` rows belong to one worker's data and are never weighted.

        Only when `words` is trained (dbow_words, PV-DM), i.e. when both sides of an example's dot
        product are shared rows. In plain PV-DBOW only `words_out` is shared, summed deltas were
        stable, and weighting them cost fit for nothing (200k users, 5 epochs: last-epoch loss 2.54
        summed vs 2.88 weighted; recall@10 0.163 vs 0.162; gensim 0.164). Weighting `words` alone
        was not enough either (dbow_words epoch-1 loss 5.1 against 3.2 with both).
        """
        workers = self.config["num_workers"]
        if workers <= 1 or "words" not in self.table_rows:
            return None
        counts = np.bincount(inverse, minlength=n_unique)
        weights = np.empty(n_unique, dtype=np.float32)
        weights[route.position] = 1.0 / (1.0 + (workers - 1) * -np.expm1(-counts.astype(np.float32)))
        return weights

    def _pull(self, batch: Batch) -> None:
        """One pull per server for the batch's rows of every table; the results arrive later."""
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

            ex = batch.examples
            n_micro = max(1, -(-len(ex) // ex.micro_batch))  # ≥ 1: subsampling may keep nothing
            alphas = kernels.micro_batch_alphas(cfg["alpha"], cfg["min_alpha"], done_before, ex.raw_tokens,
                                                self.planned_tokens, n_micro)
            local = self._assemble(batch, pulled)
            loss = self._compute(batch, local, alphas)
            t2 = time.perf_counter()
            seconds["compute"] += t2 - t1

            label = f"epoch {epoch} step {step} of worker {self.index} (alpha {float(alphas[0]):.6g})"
            inflight += self._push(batch, pulled, local, label)
            while len(inflight) > cfg["max_inflight_pushes"] * self.num_shards:
                ready, inflight = ray.wait(inflight, num_returns=len(inflight) - cfg["max_inflight_pushes"]
                                           * self.num_shards)
                ray.get(ready)  # raises a refused (non-finite) push here, naming the step
            seconds["push"] += time.perf_counter() - t2

            done_before += ex.raw_tokens
            self.stats["tokens"] += ex.raw_tokens
            self.stats["pairs"] += len(ex)
            self.stats["loss"] += loss
            batch, step = upcoming, step + 1

        t0 = time.perf_counter()
        ray.get(inflight)
        seconds["push"] += time.perf_counter() - t0
        return self.progress()

    def _assemble(self, batch: Batch, pulled: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Copy the pulled rows (read-only, zero-copy from the object store) into writable compact matrices."""
        local = {name: np.empty((n, self.width), dtype=np.float32) for name, n in batch.sizes().items()}
        for s, rows in enumerate(pulled):
            at = 0
            for _, name, where, _ in batch.blocks(s):
                n = where.stop - where.start
                local[name][where] = rows[at:at + n]
                at += n
        return local

    def _compute(self, batch: Batch, local: dict[str, np.ndarray], alphas: torch.Tensor) -> float:
        cfg, ex = self.config, batch.examples
        dev = self.device
        non_blocking = dev.type == "cuda"

        def to_dev(a):
            if a is None:
                return None
            t = torch.from_numpy(a)
            return t.pin_memory().to(dev, non_blocking=True) if non_blocking else t

        inputs, outputs = to_dev(local["inputs"]), to_dev(local["outputs"])
        loss = kernels.train(inputs, outputs, to_dev(batch.ctx_pos), to_dev(batch.target_pos), to_dev(batch.neg_pos),
                             to_dev(ex.neg_mask), alphas.to(dev), ex.micro_batch, ctx_mask=to_dev(ex.ctx_mask),
                             scale=to_dev(batch.scale), adagrad=cfg["optimizer"] == "adagrad",
                             shared_negatives=cfg["negative"] if cfg["shared_negatives"] else 0)
        if non_blocking:  # bring the trained rows home; the CPU path updated the arrays in place
            local["inputs"][:] = inputs.cpu().numpy()
            local["outputs"][:] = outputs.cpu().numpy()
        return loss

    def _push(self, batch: Batch, pulled: list[np.ndarray], local: dict[str, np.ndarray], label: str) -> list:
        refs = []
        for s, (server, rows) in enumerate(zip(self.servers, pulled)):
            if len(rows) == 0:
                continue
            delta = np.empty_like(rows)
            at = 0
            for table, name, where, own in batch.blocks(s):
                n = where.stop - where.start
                np.subtract(local[name][where], rows[at:at + n], out=delta[at:at + n])
                weights = batch.push_weights.get(table)
                if weights is not None:
                    delta[at:at + n] *= weights[own, None]
                at += n
            refs.append(server.push.remote(batch.request(s), delta, label))
        return refs
