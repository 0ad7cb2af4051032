"""The training log of a model directory: one JSON line per event of a run, written as the run goes.

Changes when what training records as it goes, or how it is read back, changes.

    MODEL/training.jsonl    {"event": E, "run": RUN, "t": unix seconds, "time": ISO 8601, ...} a line

    start       a run began: resumed_from (the version it resumed from, or null), epoch (epochs done before
                it), config (the run's resolved TrainConfig), where (a line per node: which actors run there)
    epoch       an epoch ended: epoch (epochs done), loss (per pair), tokens, pairs, wall_seconds,
                tokens_per_second (this run's tokens), seconds (every worker's time by stage, summed), bytes
                (moved to and from the servers), workers (each worker's own tokens, tokens_per_second, loss,
                seconds and bytes)
    checkpoint  a version was committed: version, epoch, mid_epoch, seconds
    restart     a worker failed and was sent back to its last checkpointed position: worker, epoch, reason
    stop        the run stopped before its end: reason
    end         the run finished: train_seconds, tokens_per_second, checkpoint_seconds, restarts

The driver writes it, and only the driver that holds the model's lock (checkpoint.writing): a run refused
by the lock never reaches the code that writes. A resumed run appends its lines after the earlier runs'
(its start line says which version it resumed from); `train --overwrite` replaces the model and with it
the log (outputs.DIR_KINDS: the model owns the file). What it costs: one short line an epoch and a
checkpoint, written by the driver, which moves no training data.

On a local disk each line is appended with one write; a line cut short by a crash is skipped by `read`
(and counted). An object store has no appends: the file is written again whole with each line (a
run's lines are few: one an epoch and a checkpoint). A log that cannot be written warns once and
training goes on: the model is what matters, the log only describes it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime

from . import storage
from .errors import UserError

log = logging.getLogger(__name__)

LOG_FILE = "training.jsonl"
MAX_LOG_BYTES = 64 << 20  # read back at most this much: a run's lines are a few kB


class RunLog:
    """The lines one run adds to a model's training log."""

    def __init__(self, model: str, run: str, on: bool = True):
        self.store = storage.Store.of(model)
        self.run = run
        self.on = on  # off: writes nothing (run.RECORDS_ENV)
        self._failed = False

    def write(self, event: str, **fields) -> None:
        if not self.on:
            return
        now = time.time()
        line = json.dumps({"event": event, "run": self.run, "t": round(now, 3),
                           "time": datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"), **fields},
                          separators=(",", ":"), default=_plain) + "\n"
        try:
            if self.store.local:
                fd = os.open(self.store.path(LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            else:
                before = self.store.read_bytes(LOG_FILE, limit=MAX_LOG_BYTES) if self.store.is_file(LOG_FILE) else b""
                self.store.write_bytes(LOG_FILE, before + line.encode())
        except (OSError, UserError) as exc:
            if not self._failed:
                self._failed = True
                log.warning(f"warning: {self.store.show(LOG_FILE)}: cannot write the training log ({exc}); training "
                            "goes on, and the report lacks this run's figures")


def _plain(value):
    """numpy numbers and the like, as JSON takes them."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "to_json"):
        return value.to_json()
    return str(value)


def read(model: str) -> tuple[list[dict], int]:
    """The log's lines, in order, and how many lines were skipped (cut short, or not a JSON object);
    ([], 0) for a model without one (trained by gensim, or before the log existed)."""
    store = storage.Store.of(model)
    if not store.is_file(LOG_FILE):
        return [], 0
    lines, skipped = [], 0
    for raw in store.read_bytes(LOG_FILE, limit=MAX_LOG_BYTES).decode("utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        try:
            found = json.loads(raw)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(found, dict) and "event" in found:
            lines.append(found)
        else:
            skipped += 1
    return lines, skipped
