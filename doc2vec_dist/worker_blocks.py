"""The worker's side of the block schedule: the block of URL rows it holds each round, its chunks split by
block, and an epoch's rounds run without the driver, each block taken from the worker that held it and
handed to the next (the protocol: peers.py; the blocks: schedule.py).

Changes when how a worker holds, reads or passes on its blocks changes. Worker (worker.py) inherits it:
the macro-batches of a round, pausing and the servers' rows are worker.py's.
"""

from __future__ import annotations

import logging
import time

from .peers import WAITING, started
from .schedule import Blocks
from .units import Position, Unit, segment_units

log = logging.getLogger(__name__)

CHUNK_CACHE_BYTES = 1 << 30  # the block schedule keeps an epoch's chunks split by block within this (_block_chunks)


class BlockRounds:
    """Worker's block schedule (a mixin: its state is the Worker's, made in Worker.__init__)."""

    def _hold(self, epoch: int, round_: int, handed: dict | None = None) -> None:
        """Take the block this worker holds in this round of the epoch (schedule.Blocks.held) as its
        resident URL rows: from `handed` where its last holder handed it over (run_epoch), else the next
        sync pulls them. One worker holds every row, once for the run."""
        cfg = self.config
        if self.num_blocks == 1:
            if self.held is None:
                self._blocks = Blocks(self.counts, self.keep_prob, 1, cfg.seed, 0, cfg.negative, cfg.ns_exponent)
                self.held = self._blocks.block(0, self.keep_prob, self.counts, cfg.ns_exponent, self.negatives)
            return
        if self._blocks is None or self._blocks.epoch != epoch:
            self._blocks = Blocks(self.counts, self.keep_prob, self.num_blocks, cfg.seed, epoch, cfg.negative,
                                  cfg.ns_exponent)
        b = Blocks.held(self.index, round_, self.num_blocks)
        if self.held is not None and self.held.index == b and self.client.held:
            return  # resumed in the round it holds (a checkpoint's pause): its rows are the latest
        self.held = self._blocks.block(b, self.keep_prob, self.counts, cfg.ns_exponent)
        self.cached = len(self.held.ids)
        self._device_tables = None
        self.client.hold(self.held.ids)
        if handed is not None and handed["block"] == b and not self.client.take_over(
                handed, self._write_resident, into=self._resident_array):
            log.warning(f"worker {self.index}: the rows of block {b} handed over in epoch {epoch} round {round_} "
                        "are gone (the worker that held it died); it trains from the servers' copy, the last "
                        "checkpoint's or the epoch's start's")

    def _block_chunks(self, epoch: int, start: Position, chunks):
        """The chunks' tokens of the block held, as its local rows (documents with none left out).

        A round that starts at the beginning of its data reads it once for every round: in the first
        round of a segment each chunk is split for every block at once (schedule.Blocks.split) and the
        other blocks' parts are kept, within CHUNK_CACHE_BYTES, for the segment's later rounds, which
        read nothing.
        """
        held, blocks = self.held.index, self._blocks
        whole = start.unit == 0 and start.row is None
        first = start.round % self.num_blocks == 0  # the first round of its segment
        segment = (epoch, start.round // self.num_blocks)
        if whole and not first and self._parts is not None and self._parts[0] == segment:
            for at, parts in self._parts[1]:
                part = parts.pop(held, None)
                if part is not None:
                    yield at, part
            return
        self._parts = None
        kept: list | None = [] if whole and first else None
        size = 0
        for at, chunk in chunks:
            if kept is None:
                part = blocks.select(held, *chunk)
            else:
                parts = dict(enumerate(blocks.split(*chunk)))
                part = parts.pop(held)
                parts = {b: p for b, p in parts.items() if len(p[0])}
                size += sum(a.nbytes for p in parts.values() for a in p)
                kept.append((at, parts))
                if size > CHUNK_CACHE_BYTES:
                    kept = None
            if len(part[0]):
                yield at, part
        if kept is not None:
            self._parts = (segment, kept)

    def _units_of(self, round_: int) -> list[Unit]:
        """The units round `round_` trains: all of them, or its segment's (TrainConfig.segments)."""
        if self.rounds == self.num_blocks:
            return self.units
        if self._segments is None:
            self._segments = segment_units(self.units, self.rounds // self.num_blocks)
        return self._segments[round_ // self.num_blocks]

    def _release(self) -> None:
        """The end of a round on the block schedule, its block pushed home: the next holder pulls it
        from the servers, and this worker pulls the block of its next round."""
        if self.num_blocks > 1:
            self.client.release()

    def run_rounds(self, epoch: int, start: Position | None = None, restarted: bool = False) -> dict:
        """Train this worker's data for one epoch, every round of it from `start` (the epoch's start, or a
        position pause() reported), on the block schedule each block taken from the worker that held it
        and handed to the next, peer to peer (peers.py); returns the epoch's counters. restarted: Ray
        restarted this worker in the epoch (what it filed before went with its process)."""
        start = self._begin(epoch, start)
        self.outbox.begin(epoch, start.round, restarted)
        try:
            at = start
            for r in range(start.round, self.rounds):
                if r > start.round:
                    at = Position(epoch, round=r, tokens=self.stats["tokens"], pairs=self.stats["pairs"],
                                  loss=self.stats["loss"])
                handed = self._receive(epoch, at) if r > 0 and not started(at) else None
                handover = self._train_round(epoch, at, handed)
                if r < self.rounds - 1:  # (the last round's blocks went home)
                    self.outbox.give(epoch, r + 1, {**(handover or {"block": self.held.index, "rows": None}),
                                                    "round": r + 1})
        finally:
            self._end(epoch)
        return self._done()

    def _receive(self, epoch: int, at: Position) -> dict | None:
        """The block of round at.round as its giver filed it (peers.py), waited for between pause points;
        None where the servers hold it."""
        self._round, t0 = at.round, time.perf_counter()
        while True:
            self._hold_if_paused(epoch, None, at.step, at)
            got = self.giver.ask(epoch, at)
            if got != WAITING:  # (an answer through Ray is an equal string, not the same one)
                break
        self.stats["seconds"]["barrier"] += time.perf_counter() - t0
        if got is not None and got.get("gone"):
            log.warning(f"worker {self.index}: the rows of its block of epoch {epoch} round {at.round} went with the "
                        "process of the worker that held it before; it trains from the servers' copy, the last "
                        "checkpoint's or the epoch's start's")
        return got if got is not None and got["rows"] is not None else None

    def hand(self, epoch: int, round_: int, at: dict, wait: float) -> dict | str | None:
        return self.outbox.hand(epoch, round_, at, wait)

    def taker_at(self, epoch: int) -> dict | None:
        """Where the round its taker last asked for starts (the driver restarts a taker that died there)."""
        return self.outbox.asked.get(epoch)

    def taker_restarts(self, epoch: int, round_: int) -> None:
        self.outbox.taker_restarts(epoch, round_)

    def flush_handed(self, epoch: int) -> int:
        """Write the blocks it handed on that its taker has not taken over the servers' copy: a
        checkpoint's, every worker paused. Returns how many."""
        entries = self.outbox.unclaimed(epoch)
        for entry in entries:
            # named after the round it held the block in (the push journal's tests read the labels)
            self.client.write_block(self._blocks.ids(entry["block"]), entry["rows"],
                                    f"epoch {epoch} round {entry['round'] - 1} checkpoint of worker {self.index} "
                                    f"(block {entry['block']} handed on)")
        return len(entries)
