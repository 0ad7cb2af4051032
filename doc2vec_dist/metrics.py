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

The driver records them all, from what it asks each worker every tick (its progress, asked for the
progress bar) and each server every RECORD_SECONDS (its info, asked for these): no worker or server
records a metric. What a tick brings is added up here, in plain Python, and Ray is told at most every
RECORD_SECONDS (and at the run's end): a counter is increased by what it gained since, a gauge set
when its value changed. A run of short epochs (the sample's are 40 ms) thus pays no Ray call per
epoch or per tick; what it costs is measured in docs/benchmarks.md ("What training pays").
Rows are the bytes moved over a row's bytes (client.TRAFFIC, TableSpec.row_bytes).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

# Ray is told the figures at most this often, and the servers asked for theirs: ticks are 0.5 s apart, and
# a round's end, which a run of short epochs reaches every few ms, tells Ray nothing by itself. A worker's
# tokens/s is measured over this long. Ray exports what it was told every 10 s (its
# metrics_report_interval_ms), so telling it more often than every few seconds only costs (2 s cost the
# servers and the driver ~0.3 s of CPU in 27 s of training on 200k users: benchmarks/records_overhead.py).
RECORD_SECONDS = 5.0
TRAFFIC_IN = ("pulled", "resident_pulled")
TRAFFIC_OUT = ("pushed", "resident_pushed")


class RunMetrics:
    """The metrics of one run, fed by the driver (run.Run) each tick."""

    def __init__(self, model: str, run: str, row_bytes: int, on: bool = True):
        self.tags = {"model": model, "run": run}
        self.row_bytes = max(int(row_bytes), 1)
        self._seen: dict[tuple[str, int], dict] = {}  # the last figures of each worker / server, to take deltas from
        self._tokens: dict[int, tuple] = {}  # worker → (epoch, its tokens so far in it, tokens seen trained in all)
        self._rate_from: dict[int, tuple[float, int]] = {}  # worker → (when its rate was last set, tokens trained then)
        # what Ray has not been told yet: each counter's gain by (metric, tag) and each gauge's value, the
        # gauges' values as last told (set only when changed), and when it was last told and the servers asked
        self._gained: dict[tuple[str, str], float] = {}
        self._values: dict[tuple[str, str], float] = {}
        self._told: dict[tuple[str, str], float] = {}
        self._recorded = time.monotonic()
        self._asked = float("-inf")
        self.on = on  # off: records nothing, and the driver asks the servers nothing for it (run.RECORDS_ENV)
        if not on:
            return
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
        """Where the run is: the epoch (from 0) and its round under way."""
        self._values["epoch", ""] = epoch
        self._values["round", ""] = round_

    def workers(self, answers: dict[int, dict], now: float | None = None) -> None:
        """Each worker's progress answer (worker.Worker.progress), or what its run_epoch returned."""
        if not self.on:
            return
        now = time.monotonic() if now is None else now
        for i, s in answers.items():
            worker = str(i)
            call = (s.get("epoch"), s.get("round", 0))
            last = self._seen.get(("worker", i))
            same = last is not None and last["call"] == call  # counters run on within one run_epoch call
            moved = s.get("bytes") or {}
            totals = {}
            for name, kinds in (("rows_pulled", TRAFFIC_IN), ("rows_pushed", TRAFFIC_OUT)):
                totals[name] = sum(moved.get(k, 0) for k in kinds)
                delta = totals[name] - (last["bytes"][name] if same else 0)
                if delta > 0:
                    self._gain(name, worker, delta / self.row_bytes)
            self._seen[("worker", i)] = {"call": call, "bytes": totals}
            if s.get("pairs"):
                self._values["loss", worker] = s["loss"] / s["pairs"]
            self._count_tokens(i, call[0], s["tokens"], now)

    def _count_tokens(self, i: int, epoch, tokens: int, now: float) -> None:
        """Add what worker i trained since its last answer. Its tokens count from 0 each epoch (and from a
        checkpointed position after a restart: not counted)."""
        prev = self._tokens.get(i)
        if prev is None:
            self._tokens[i] = (epoch, tokens, 0)
            self._rate_from[i] = (now, 0)
            return
        delta = tokens - prev[1] if prev[0] == epoch else tokens
        self._tokens[i] = (epoch, tokens, prev[2] + max(delta, 0))

    def servers_due(self, now: float | None = None) -> bool:
        """Whether to ask the servers for their info now: at most every RECORD_SECONDS (then it says yes once)."""
        if not self.on:
            return False
        now = time.monotonic() if now is None else now
        if now - self._asked < RECORD_SECONDS:
            return False
        self._asked = now
        return True

    def servers(self, infos: dict[int, dict]) -> None:
        """Each server's info (ps.ParameterServer.info): its apply and pull seconds since it started."""
        if not self.on:
            return
        for shard, info in infos.items():
            last = self._seen.get(("server", shard))
            same = last is not None and last["pid"] == info.get("pid")  # a restarted server counts from 0
            for name, key in (("apply_seconds", "apply_seconds"), ("pull_seconds", "pull_seconds")):
                delta = info.get(key, 0.0) - (last[key] if same else 0.0)
                if delta > 0:
                    self._gain(name, str(shard), delta)
            self._seen[("server", shard)] = {"pid": info.get("pid"), "apply_seconds": info.get("apply_seconds", 0.0),
                                             "pull_seconds": info.get("pull_seconds", 0.0)}

    def _gain(self, name: str, tag: str, amount: float) -> None:
        self._gained[name, tag] = self._gained.get((name, tag), 0.0) + amount

    def record(self, now: float | None = None) -> None:
        """Tell Ray what it has not been told, if RECORD_SECONDS have passed since it last was."""
        now = time.monotonic() if now is None else now
        if self.on and now - self._recorded >= RECORD_SECONDS:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Tell Ray now: each counter's gain, each gauge that changed, each worker's tokens/s since it was last
        set (the run's end calls this, so that a run shorter than RECORD_SECONDS has its figures too)."""
        if not self.on:
            return
        now = time.monotonic() if now is None else now
        self._recorded = now
        for i, (_, _, trained) in self._tokens.items():
            since, at = self._rate_from[i]
            if now > since and (trained > at or now - since >= RECORD_SECONDS):  # a worker idle that long: 0
                self._values["tokens_per_second", str(i)] = (trained - at) / (now - since)
                self._rate_from[i] = (now, trained)
        for (name, tag), amount in self._gained.items():
            getattr(self, name).inc(amount, tags=self._tags(name, tag))
        self._gained.clear()
        for key, value in self._values.items():
            if self._told.get(key) != value:
                getattr(self, key[0]).set(value, tags=self._tags(*key))
                self._told[key] = value

    def _tags(self, name: str, tag: str) -> dict:
        if name in ("epoch", "round"):
            return self.tags
        return {**self.tags, ("server" if name in ("apply_seconds", "pull_seconds") else "worker"): tag}
