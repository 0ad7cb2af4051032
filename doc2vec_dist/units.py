"""A worker's units of the corpus and what a macro-batch is made of: the data the worker loop walks.

Changes when how the corpus is divided among workers changes (plan_units, segments, data positions),
or what a macro-batch carries (Batch, Arrival) and what computes it (Compute).

A unit is a row range of one shard file; a worker's plan is its list of units (plan_of), cut into
segments on the block schedule; a Position is where a worker's data stands in an epoch, which a
checkpoint keeps. worker.Worker walks them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import client, cpu_kernel
from .config import TrainConfig
from .corpus import Corpus, iter_shard
from .sampling import Examples
from .settings import RunSettings, resident_tables

# of a GPU's free memory at a worker's start, what its documents' rows may take (the rest: its URL rows, counted
# apart, and each macro-batch's examples and micro-batches)
DEVICE_SHARE = 0.75


def device_room(config: TrainConfig, free_bytes: int, words_out_rows: int) -> int:
    """Bytes of a GPU with `free_bytes` free that a worker's documents' rows may take
    (settings.document_partitions): DEVICE_SHARE of them, of the worker's share of the device where workers
    share one (a fractional --gpus-per-worker), less the URL rows it holds there (float32). The worker's
    rule at its start (Worker._device_room), and plan's for a device of its table (plan_model.DEVICES)."""
    urls = sum(resident_tables(config, words_out_rows).values()) * config.table("words_out", words_out_rows).width * 4
    return max(0, int(free_bytes * DEVICE_SHARE * min(1.0, config.gpus_per_worker)) - urls)


@dataclass(frozen=True)
class Position:
    """Where a worker's data stands in an epoch: the next macro-batch it trains, and what it trained
    before it. Workers report it when a checkpoint pauses them (Worker.pause), the checkpoint's manifest
    keeps one per worker (to_json, from_json), and a resumed or restarted worker starts from it
    (Worker.run_epoch). Position(epoch) is the epoch's start. On the block schedule an epoch is several
    rounds, each a pass over the worker's units (over one segment of them: TrainConfig.segments); the counters (tokens, pairs, loss) run on over the
    rounds of an epoch, the step starts again at 0 each round."""

    epoch: int
    unit: int = 0             # index of its unit among the round's units (len(units): the round is done)
    row: int | None = None    # shard-file row of that unit to start at (None: the unit's start)
    step: int = 0             # macro-batches trained before it this epoch (each one's draws are seeded by it)
    tokens: int = 0           # this epoch's counters up to it
    pairs: int = 0
    loss: float = 0.0
    round: int = 0            # the block schedule's round in the epoch (schedule.py; always 0 for one worker)
    # the process that answered (Worker.pause): the driver sees there a worker Ray restarted since its last
    # answer, and the rows it held lost with the old process. Not part of the position: not compared, not saved
    pid: int | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict:
        """The manifest's entry: every field but pid, by name (round only where the block schedule has one)."""
        entry = dataclasses.asdict(self)
        del entry["pid"]
        if not self.round:
            del entry["round"]
        return entry

    @classmethod
    def from_json(cls, data: dict) -> Position:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass
class Unit:
    """Rows [start, end) of one shard file: the grain at which the corpus is divided among workers."""

    path: str
    start: int
    end: int
    tokens: int
    segment: int | None = None  # an interleaved plan's: the worker's segment this run belongs to (plan_units)


def plan_of(corpus: Corpus, settings: RunSettings) -> list[list[Unit]]:
    """The run's plan (RunSettings.plan): plan_units with the segments of the block schedule."""
    return plan_units(corpus, settings.config.num_workers, settings.segments if settings.plan == "interleaved" else 1)


def plan_units(corpus: Corpus, num_workers: int, segments: int = 1) -> list[list[Unit]]:
    """Divide the corpus among workers with balanced token counts.

    With several segments (TrainConfig.segments on the block schedule) the corpus, its files in
    order, is cut into num_workers × segments pieces of about equal tokens, and piece W·s + i is
    worker i's segment s: the workers' rounds walk the corpus together, in its order, as one worker
    would walk it alone. (Each worker its own run of the corpus, cut into segments, put documents
    half a corpus apart in the same round: with 2 workers and 64 segments Lee lost 0.010 / 0.009
    Pearson against one worker, test / background first, and 0.000 / 0.003 interleaved, in
    benchmarks/schedule_lee.py --split over 24 seeds; docs/benchmarks.md.)

    Otherwise, with at least as many shard files as workers, whole files are dealt out, largest first
    to the least loaded worker. With fewer, each file is cut into row ranges of about equal tokens.
    """
    shards = [(path, info["docs"], info["tokens"]) for path, info in zip(corpus.shard_paths, corpus.meta["shards"])]
    if segments > 1 and num_workers > 1:  # piece W·s + i of the whole files, in order, is worker i's segment s
        pieces = _cut([Unit(path, 0, docs, tokens) for path, docs, tokens in shards], num_workers * segments,
                      lambda piece: piece // num_workers)
        return [[u for s in range(segments) for u in pieces[s * num_workers + i]] for i in range(num_workers)]
    if len(shards) >= num_workers:
        loads = [0] * num_workers
        plan: list[list[Unit]] = [[] for _ in range(num_workers)]
        for path, docs, tokens in sorted(shards, key=lambda s: -s[2]):
            w = int(np.argmin(loads))
            plan[w].append(Unit(path, 0, docs, tokens))
            loads[w] += tokens
        return plan
    pieces = -(-num_workers // len(shards))
    units: list[Unit] = []
    for path, docs, tokens in shards:
        lengths = _document_tokens(path)
        cum = np.concatenate([[0], np.cumsum(lengths)])
        for a, b in itertools.pairwise(_even_cuts(cum, pieces)):
            units.append(Unit(path, int(a), int(b), int(cum[b] - cum[a])))
    plan = [[] for _ in range(num_workers)]
    for i, unit in enumerate(units):
        plan[i % num_workers].append(unit)
    return plan


def _document_tokens(path: str) -> np.ndarray:
    """Each document's token count in one shard file, by row."""
    return np.concatenate([np.diff(offsets) for _, offsets, _ in iter_shard(path)] or [np.zeros(0)])


def _even_cuts(cum: np.ndarray, pieces: int) -> np.ndarray:
    """Document boundaries that cut documents with cumulative tokens `cum` (from 0) into `pieces` runs of
    about equal tokens."""
    cuts = np.searchsorted(cum, np.linspace(0, cum[-1], pieces + 1), side="left")
    cuts[0], cuts[-1] = 0, len(cum) - 1
    return cuts


def _cut(units: list[Unit], pieces: int, segment_of=lambda piece: None) -> list[list[Unit]]:
    """The documents of `units`, in their order, cut into `pieces` runs of about equal tokens (a run may
    be empty where there are fewer documents), each as the Units of its runs within one unit; each
    Unit's segment is segment_of(its run's index)."""
    lengths = {path: _document_tokens(path) for path in {u.path for u in units}}
    unit_of = np.concatenate([np.full(u.end - u.start, i) for i, u in enumerate(units)] or [np.zeros(0, int)])
    row_of = np.concatenate([np.arange(u.start, u.end) for u in units] or [np.zeros(0, int)])
    cum = np.concatenate([[0], np.cumsum(np.concatenate([lengths[u.path][u.start:u.end] for u in units]
                                                         or [np.zeros(0)]))])
    out: list[list[Unit]] = []
    for piece, (a, b) in enumerate(itertools.pairwise(_even_cuts(cum, pieces))):
        runs = []
        while a < b:  # the documents [a, b), one unit's run at a time
            u = int(unit_of[a])
            end = min(b, int(np.searchsorted(unit_of, u, side="right")))
            runs.append(Unit(units[u].path, int(row_of[a]), int(row_of[end - 1]) + 1, int(cum[end] - cum[a]),
                             segment_of(piece)))
            a = end
        out.append(runs)
    return out


def segment_units(units: list[Unit], segments: int) -> list[list[Unit]]:
    """A worker's units cut into `segments` runs of consecutive documents of about equal tokens, in
    their order (TrainConfig.segments; a segment may be empty where there are fewer documents); an
    interleaved plan's units (plan_units) are grouped by the segment it gave them."""
    if segments == 1:
        return [list(units)]
    if units and units[0].segment is not None:
        return [[u for u in units if u.segment == s] for s in range(segments)]
    return _cut(units, segments)


def read_chunks(units: list[Unit], macro_batch: int, from_unit: int = 0, from_row: int | None = None):
    """((unit index, first row), (doc_ids, offsets, tokens)) chunks of at most ~macro_batch tokens
    from a worker's units, starting at a data position (a unit, and a row of its shard file): what
    a worker reads, and where a restarted one resumes."""
    for u in range(from_unit, len(units)):
        unit = units[u]
        first = unit.start if u != from_unit or from_row is None else max(unit.start, from_row)
        row = 0
        for doc_ids, offsets, tokens in iter_shard(unit.path, max_tokens=macro_batch):
            n = len(doc_ids)
            lo, hi = max(first - row, 0), min(unit.end - row, n)
            at = row + lo
            row += n
            if lo >= hi:
                if row >= unit.end:
                    break
                continue
            if lo > 0 or hi < n:
                doc_ids = doc_ids[lo:hi]
                tokens = tokens[offsets[lo]:offsets[hi]]
                offsets = offsets[lo:hi + 1] - offsets[lo]
            yield (u, at), (doc_ids, offsets, tokens)


def only_documents(chunks, wanted: np.ndarray):
    """read_chunks' chunks with only the documents in `wanted` (sorted doc ids); a chunk left with none
    is skipped. Each keeps its data position, so a run resumed mid-epoch filters the same way."""
    for start, (doc_ids, offsets, tokens) in chunks:
        keep = np.isin(doc_ids, wanted)
        if keep.all():
            yield start, (doc_ids, offsets, tokens)
        elif keep.any():
            sizes = np.diff(offsets)
            token_keep = np.repeat(keep, sizes)
            yield start, (doc_ids[keep], np.concatenate([[0], np.cumsum(sizes[keep])]).astype(np.int64),
                          tokens[token_keep])


def document_partitions(walk: list[np.ndarray], count: int) -> list[np.ndarray]:
    """A worker's documents cut into at most `count` partitions of about equal size, each the ids
    (ascending) of a run of whole chunks of its walk (`walk`: each chunk's document ids, in the order it
    reads them, read_chunks of its units at its read size), so that no chunk it trains straddles two
    (a chunk read from a checkpoint's position, or split by block, is part of one of them), and so that
    where they fit, cutting them changes no macro-batch, and no bit of what it trains. A partition holds
    at least one chunk's documents."""
    walk = [ids for ids in walk if len(ids)]
    if not walk:
        return [np.zeros(0, np.int64)]
    cum = np.concatenate([[0], np.cumsum([len(ids) for ids in walk])])
    cuts = np.unique(_even_cuts(cum, max(1, min(count, len(walk)))))
    return [np.sort(np.concatenate(walk[a:b])).astype(np.int64) for a, b in itertools.pairwise(cuts)]


@dataclass(frozen=True)
class Compute:
    """What a worker runs on each macro-batch's examples, as arguments rather than module globals:
    benchmarks/feed_rate.py swaps them for nothing to time the host side alone."""

    batched: Callable          # kernels.train (or --kernel fused: triton_kernel.train, the same arguments)
    exact: Callable            # cpu_kernel.train: each update applied at once, on examples the host built
    tokens: Callable           # cpu_kernel.train_tokens: the exact kernel drawing its own examples
    device_examples: Callable  # device_examples.build: the token path's examples, on the device

    @staticmethod
    def default(fused: bool = False) -> Compute:
        """fused: --kernel fused, the batched kernel's micro-batches as Triton launches."""
        # kernels and device_examples need torch (and the fused kernel triton): imported at their first
        # call, so that a worker on the exact kernel never imports it, nor one on the batched kernel triton
        return Compute(batched=_fused if fused else _batched, exact=cpu_kernel.train, tokens=cpu_kernel.train_tokens,
                       device_examples=_device_examples)


def _batched(*args, **kwargs):
    from .kernels import train

    return train(*args, **kwargs)


def _fused(*args, **kwargs):
    from .triton_kernel import train

    return train(*args, **kwargs)


def _device_examples(*args, **kwargs):
    from .device_examples import build

    return build(*args, **kwargs)


def as_numpy(matrix) -> np.ndarray:
    """A CPU matrix as numpy: itself, or a torch tensor's view of the same memory."""
    return matrix if isinstance(matrix, np.ndarray) else matrix.numpy()


class HostDevice:
    """The device of a worker that never imports torch (the exact kernel on CPU): what the code and the
    benchmarks read of a torch.device."""

    type = "cpu"

    def __str__(self) -> str:
        return "cpu"


@dataclass
class Batch:
    """One macro-batch: its examples, where its rows sit locally (client.Layout), and its pulls."""

    examples: Examples | None    # None on the token path (the examples are drawn where the kernel runs)
    layout: client.Layout        # its rows: which servers hold them, where they sit in the compact matrices
    ctx_pos: np.ndarray          # [n, c] compact positions in `inputs`
    target_pos: np.ndarray       # [n] compact positions in `outputs`
    neg_pos: np.ndarray          # negatives' compact positions in `outputs`
    scale: np.ndarray | None
    pulls: list                  # one ObjectRef per shard
    start: tuple[int, int]       # (unit index, shard-file row) of its first document: a data position
    raw_tokens: int = 0          # tokens read before subsampling (what the learning-rate schedule counts)
    # the token path: the chunk's tokens and offsets; ctx_pos then holds each token's document row (exact
    # kernel) or each document's (the device expands the offsets itself)
    tokens: np.ndarray | None = None
    offsets: np.ndarray | None = None
    seed: int = 0                # the token path: the seed of its draws


@dataclass
class Arrival:
    """A macro-batch's pulled rows once they have arrived: as pulled (read-only), in the writable
    compact host matrices `local`, and, staged, already copied (or being copied, until `event`) into
    the device matrices of its slot."""

    pulled: list
    layout: client.Layout        # where its rows sit in `local` (staged: without the resident heads)
    local: dict                  # name → numpy view of the compact host matrix
    device: dict | None = None   # staged: name → the device copy of its pulled rows (the resident heads excluded)
    event: object = None         # CUDA: the copy stream's event after those copies
    slot: int = 0


def partition_index(partitions: list[np.ndarray]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Where there are several partitions of a worker's documents: their ids ascending, and the partition
    each is in (Worker._partition_in searches them); else (None, None)."""
    if len(partitions) <= 1:
        return None, None
    ids = np.concatenate(partitions)
    of = np.repeat(np.arange(len(partitions)), [len(p) for p in partitions])
    order = np.argsort(ids)
    return ids[order], of[order]


def grown(buffer, rows: int, keep: int = 0, pin: bool = False):
    """A worker's matrix: `buffer` (a torch tensor or a numpy array) if it has `rows` rows, else a bigger
    one (by 1/4 at least, so growth is rare) with its first `keep` rows carried over."""
    if len(buffer) >= rows:
        return buffer
    shape = (max(rows, len(buffer) * 5 // 4), buffer.shape[1])
    if isinstance(buffer, np.ndarray):
        bigger = np.empty(shape, dtype=buffer.dtype)
    else:
        import torch

        bigger = torch.empty(shape, dtype=buffer.dtype, device=buffer.device, pin_memory=pin)
    keep = min(keep, len(buffer))
    bigger[:keep] = buffer[:keep]
    return bigger
