"""The block schedule's rounds without the driver: each worker takes its next block from the worker that
held it, peer to peer, and waits for no one else.

Worker i holds block (i + r) % W in round r (schedule.Blocks.held), so the block it holds in round r + 1
is the one worker i + 1 (its giver) held in round r, and the one it held goes to worker i - 1 (its taker).
At a round's end a worker files its block under the round its taker trains it in (Outbox.give: the rows
in the object store, client.ParameterClient.hand_over, or a note that they went home to the servers);
the taker asks its giver for it (Worker.hand: answered as soon as it is filed) and starts. A worker may
run ahead of its taker by several rounds, and behind its giver; no two ever hold one block, as one
driver-led round after another held them. The driver starts every worker's epoch in one call
(Worker.run_rounds) and sees the epoch's end, checkpoints and failures, not rounds.

Where the rows are at a checkpoint (every worker paused: between two macro-batches, or waiting for its
block): in the worker that took the block (its pause writes them: a taker that has the answer takes
the block before its next pause point), or filed and not yet handed out, which the giver writes
(Worker.flush_handed).
A taker that finds its giver started after the round it asks for (resumed from a checkpoint, or
restarted) pulls the servers' copy: the checkpoint's, which the flush wrote.

The driver restarts a worker that died at the start of the round it was in: the last one it asked its
giver for (Outbox.asked keeps where that round started), from the rows the giver filed for it, which
the giver keeps until its taker asks for the next round (or at its checkpointed position in that round,
from the servers' copy); it tells the giver what the restarted worker holds (Outbox.taker_restarts).
"""

from __future__ import annotations

import threading
import time

from .units import Position

WAITING = "waiting"  # the giver has not filed the block yet: ask again (Worker.hand's answer)
ASK_SECONDS = 0.2  # how long one ask waits at the giver: a checkpoint's pause reaches a waiting taker within it
RETRY_SECONDS = 0.1  # after an ask that failed (the giver restarting)


class Outbox:
    """The blocks a worker handed on, filed by (epoch, round their taker trains them in)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.entries: dict[tuple[int, int], dict] = {}
        self.answered: set[tuple[int, int]] = set()  # entries handed out: their taker holds them now
        self.started: tuple[int, int] = (-1, 0)  # (epoch, first round) of the current run_rounds call
        self.restarted = False  # that call is a restart's: what the process before it filed went with it
        self.asked: dict[int, dict] = {}  # epoch → the position at which the taker asked last (its round's start)

    def begin(self, epoch: int, first_round: int, restarted: bool = False) -> None:
        """A run_rounds call starts: what it did not train, it will not file."""
        with self.cv:
            if epoch != self.started[0]:
                self.entries.clear()
                self.answered.clear()
            self.started, self.restarted = (epoch, first_round), restarted
            self.cv.notify_all()

    def give(self, epoch: int, round_: int, entry: dict) -> None:
        with self.cv:
            self.entries[(epoch, round_)] = entry
            self.cv.notify_all()

    def hand(self, epoch: int, round_: int, at: dict, wait: float) -> dict | str | None:
        """The block for the taker's round `round_` (its position `at`, the round's start): the entry; None
        where this worker will not file it (its call started after the round before: the servers hold it),
        {"gone": True, "rows": None} where that call is a restart's (the entry went with the process that
        died); or WAITING after `wait` seconds. Earlier entries are done with: the taker finished their rounds."""
        deadline = time.monotonic() + wait
        with self.cv:
            known = self.asked.get(epoch)
            if known is None or known["round"] <= round_:
                self.asked[epoch] = at
            for key in [k for k in self.entries if k[0] == epoch and k[1] < round_]:
                del self.entries[key]
                self.answered.discard(key)
            while True:
                entry = self.entries.get((epoch, round_))
                if entry is not None:
                    self.answered.add((epoch, round_))
                    return entry
                if self.started > (epoch, round_ - 1):
                    return {"gone": True, "rows": None} if self.restarted else None
                left = deadline - time.monotonic()
                if left <= 0:
                    return WAITING
                self.cv.wait(left)

    def taker_restarts(self, epoch: int, round_: int) -> None:
        """Its taker died and restarts holding none of what it was handed, but the block of each round
        before `round_` (where it restarts mid-round, the servers' copy of that round's block, which its
        checkpoint wrote: the entry is older and must never be written)."""
        with self.cv:
            self.answered = {key for key in self.entries if key[0] == epoch and key[1] < round_}

    def unclaimed(self, epoch: int) -> list[dict]:
        """The entries of `epoch` with rows, not handed out (their taker has not taken them)."""
        with self.cv:
            return [e for key, e in sorted(self.entries.items()) if key[0] == epoch and key not in self.answered
                    and e.get("rows") is not None]


def giver_of(worker: int, workers: int) -> int:
    """The worker that held, in round r, the block `worker` holds in round r + 1: its giver."""
    return (worker + 1) % workers


def started(at: Position) -> bool:
    """Whether a worker at position `at` has trained some of its round (it holds the round's block)."""
    return at.unit > 0 or at.row is not None or at.step > 0


class Giver:
    """A worker's side of asking its giver (worker index + 1) for its next block."""

    def __init__(self, index: int, workers: list) -> None:
        """workers: every worker's actor name (looked up here, again after a restart), handle, or the
        Worker object itself (in one process)."""
        self.index, self.workers = index, workers
        self.handle = None

    def ask(self, epoch: int, at: Position) -> dict | str | None:
        """Ask once (waiting at most ASK_SECONDS there): the entry, None (pull the servers' copy) or WAITING."""
        peer = self.workers[giver_of(self.index, len(self.workers))]
        if not isinstance(peer, str) and not hasattr(peer.hand, "remote"):  # a Worker in this process
            return peer.hand(epoch, at.round, at.to_json(), ASK_SECONDS)
        import ray

        try:
            if self.handle is None:
                self.handle = ray.get_actor(peer) if isinstance(peer, str) else peer
            return ray.get(self.handle.hand.remote(epoch, at.round, at.to_json(), ASK_SECONDS))
        except (ray.exceptions.RayActorError, ValueError):  # restarting (or not yet named again): ask anew
            self.handle = None
            time.sleep(RETRY_SECONDS)
            return WAITING
