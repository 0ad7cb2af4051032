"""A run's figures as Ray metrics (ray.util.metrics): what Ray's dashboard, Prometheus and Grafana show.

Changes when a metric is added, renamed or measured differently.

Ray exports each metric as `ray_<name>` from every node's metrics endpoint (ray.nodes()'s MetricsExportPort),
which Prometheus scrapes (docs/cluster.md says how). Every metric carries the tags `model` (the model
directory the run writes) and `run` (the run's id, as in its actors' names and its training log's lines):

    doc2vec_dist_tokens_per_second{worker}   gauge    the worker's tokens/s over its last few seconds
    doc2vec_dist_loss{worker}                gauge    the worker's mean loss per pair so far this epoch
    doc2vec_dist_rows_pulled{worker}         counter  rows it pulled from the servers (its resident rows too)
    doc2vec_dist_rows_pushed{worker}         counter  rows it pushed back
    doc2vec_dist_server_apply_seconds{server}  counter  time the server spent applying pushes
    doc2vec_dist_server_pull_seconds{server}   counter  ... and gathering pulls
    doc2vec_dist_epoch, doc2vec_dist_round   gauge    where the run is (the epoch counted from 0)

The driver records them all, from what it asks each worker and server every tick (their progress, and
each server's info, asked for these): no worker or server records a metric; the cost to training is
the driver's, one small call per server a tick.
Rows are the bytes moved over a row's bytes (client.TRAFFIC, TableSpec.row_bytes).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

RATE_SECONDS = 2.0  # a worker's tokens/s is measured over at least this long: ticks are 0.5 s apart
TRAFFIC_IN = ("pulled", "resident_pulled")
TRAFFIC_OUT = ("pushed", "resident_pushed")


class RunMetrics:
    """The metrics of one run, fed by the driver (trainer._Run) each tick."""

    def __init__(self, model: str, run: str, row_bytes: int):
        self.tags = {"model": model, "run": run}
        self.row_bytes = max(int(row_bytes), 1)
        self._seen: dict[tuple[str, int], dict] = {}  # the last figures of each worker / server, to take deltas from
        self._tokens: dict[int, tuple] = {}  # worker → (epoch, its tokens so far in it, tokens seen trained in all)
        self._rate_from: dict[int, tuple[float, int]] = {}  # worker → (when its rate was last set, tokens trained then)
        try:
            from ray.util.metrics import Counter, Gauge

            worker, server, run_keys = ("model", "run", "worker"), ("model", "run", "server"), ("model", "run")
            self.tokens_per_second = Gauge("doc2vec_dist_tokens_per_second", "tokens/s of a worker, over its last "
                                           "few seconds", tag_keys=worker)
            self.loss = Gauge("doc2vec_dist_loss", "a worker's mean loss per pair so far this epoch", tag_keys=worker)
            self.rows_pulled = Counter("doc2vec_dist_rows_pulled", "rows a worker pulled from the servers",
                                       tag_keys=worker)
            self.rows_pushed = Counter("doc2vec_dist_rows_pushed", "rows a worker pushed to the servers",
                                       tag_keys=worker)
            self.apply_seconds = Counter("doc2vec_dist_server_apply_seconds", "seconds a parameter server spent "
                                         "applying pushes", tag_keys=server)
            self.pull_seconds = Counter("doc2vec_dist_server_pull_seconds", "seconds a parameter server spent "
                                        "gathering pulls", tag_keys=server)
            self.epoch = Gauge("doc2vec_dist_epoch", "the epoch under way, from 0", tag_keys=run_keys)
            self.round = Gauge("doc2vec_dist_round", "the round of the epoch under way (the block schedule), from 0",
                               tag_keys=run_keys)
            self.on = True
        except (ImportError, ValueError, TypeError, RuntimeError) as exc:  # a Ray without them: training goes on
            log.warning(f"warning: Ray's metrics are not recorded ({exc})")
            self.on = False

    def position(self, epoch: int, round_: int) -> None:
        if self.on:
            self.epoch.set(epoch, tags=self.tags)
            self.round.set(round_, tags=self.tags)

    def workers(self, answers: dict[int, dict], now: float | None = None, final: bool = False) -> None:
        """Each worker's progress answer (worker.Worker.progress), or, `final`, what its run_epoch returned."""
        if not self.on:
            return
        now = time.monotonic() if now is None else now
        for i, s in answers.items():
            tags = {**self.tags, "worker": str(i)}
            call = (s.get("epoch"), s.get("round", 0))
            last = self._seen.get(("worker", i))
            same = last is not None and last["call"] == call  # counters run on within one run_epoch call
            moved = s.get("bytes") or {}
            for counter, kinds in ((self.rows_pulled, TRAFFIC_IN), (self.rows_pushed, TRAFFIC_OUT)):
                total = sum(moved.get(k, 0) for k in kinds)
                delta = total - (last["bytes"][kinds] if same else 0)
                if delta > 0:
                    counter.inc(delta / self.row_bytes, tags=tags)
            self._seen[("worker", i)] = {"call": call, "bytes": {kinds: sum(moved.get(k, 0) for k in kinds)
                                                                for kinds in (TRAFFIC_IN, TRAFFIC_OUT)}}
            if s.get("pairs"):
                self.loss.set(s["loss"] / s["pairs"], tags=tags)
            self._rate(i, call[0], s["tokens"], now, tags, final)

    def _rate(self, i: int, epoch, tokens: int, now: float, tags: dict, final: bool) -> None:
        """The worker's tokens/s since the gauge was last set: at least RATE_SECONDS apart, or at a round's end.
        Its tokens count from 0 each epoch (and from a checkpointed position after a restart: not counted)."""
        prev = self._tokens.get(i)
        if prev is None:
            self._tokens[i] = (epoch, tokens, 0)
            self._rate_from[i] = (now, 0)
            return
        delta = tokens - prev[1] if prev[0] == epoch else tokens
        trained = prev[2] + max(delta, 0)
        self._tokens[i] = (epoch, tokens, trained)
        since, at = self._rate_from[i]
        if now - since >= RATE_SECONDS or (final and now > since and trained > at):
            self.tokens_per_second.set((trained - at) / (now - since), tags=tags)
            self._rate_from[i] = (now, trained)

    def servers(self, infos: dict[int, dict]) -> None:
        """Each server's info (ps.ParameterServer.info): its apply and pull seconds since it started."""
        if not self.on:
            return
        for shard, info in infos.items():
            tags = {**self.tags, "server": str(shard)}
            last = self._seen.get(("server", shard))
            same = last is not None and last["pid"] == info.get("pid")  # a restarted server counts from 0
            for counter, key in ((self.apply_seconds, "apply_seconds"), (self.pull_seconds, "pull_seconds")):
                delta = info.get(key, 0.0) - (last[key] if same else 0.0)
                if delta > 0:
                    counter.inc(delta, tags=tags)
            self._seen[("server", shard)] = {"pid": info.get("pid"), "apply_seconds": info.get("apply_seconds", 0.0),
                                             "pull_seconds": info.get("pull_seconds", 0.0)}
