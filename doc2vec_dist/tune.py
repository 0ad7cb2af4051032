"""`doc2vec-dist tune`: the settings searched per dataset on Ray Tune, with ASHA stopping poor trials early.

Changes when how settings are searched changes: the space, the validation split, the scheduler, the
trials' table and what is written at the end.

    doc2vec-dist tune --corpus C --out DIR --heldout H [--budget 8] [--space FILE.yaml] [--searcher random|optuna]

1. **The metric never sees the user's test file.** With --heldout, a validation split is carved from
   the training corpus (DIR/validation/) the way prepare --holdout made the test file: a fifth of
   the distinct URLs of 5,000 users (TRIAL_USERS) is hidden, the rest is the corpus the trials
   train on (every other user whole, so a trial trains on nearly what the chosen settings will),
   and a trial's metric is held-out recall@10 on the hidden part (`evaluate.heldout_metrics`). With
   --labels or --pairs the metric is k-NN label accuracy or Pearson correlation on that file, on
   the corpus as it is.
2. **What is tried.** First the base settings (the flags and --config: the search reports when
   nothing beats them, and best.yaml is then the base), and each optimizer of the space at a
   learning rate known to suit it (START_ALPHA), the rest as in the base; then the searcher's
   draws: random, or Optuna's TPE (--searcher optuna), which draws where the trials so far scored.
3. **Each trial is a real training** (`trainer.train`) on the same Ray cluster, with its own
   parameter servers and workers, and reports its metric after every epoch from the committed
   checkpoint. ASHA (`ray.tune.schedulers.ASHAScheduler`) stops the poor ones at its rungs, so the
   search costs a few full trainings: --budget counts full-training equivalents, and the number of
   trials is chosen so that ASHA's expected epochs fit it (`trials_for_budget`).
4. **Bounded resources.** A trial's placement group holds what its run's actors take
   (`placement.run_bundles`: each worker's CPUs, on `ps` clusters each server's memory), and the
   actors are placed inside it, so a trial starts only when all of it fits and trials never
   oversubscribe the cluster. A trial that fails (a bad setting, no memory) is recorded as failed
   and the search goes on.
5. **Written as the search goes** (so Ctrl-C keeps them, and ends the command there): DIR/trials.csv
   (every trial, sorted by its metric: settings, where they came from, metric, epochs, tokens/s,
   seconds, state) and DIR/best.yaml (the configuration of the best trial that has ended: the settings
   searched and every base setting (flags, --config) that is not the default, a config `train --config`
   takes and trains as the comparison's tuned model did). At the end: DIR/settings.png (the metric
   against each setting) and, unless --no-compare, the best, the defaults and gensim (the best's
   epochs) trained on the whole corpus and measured on the user's file (DIR/compare.json).

A space file maps setting names (TrainConfig fields) to a value or to one of
    {choice: [a, b, ...]}  {uniform: [lo, hi]}  {loguniform: [lo, hi]}  {randint: [lo, hi]}
    {grid: [a, b, ...]}    (every value, in every trial sample: the number of trials multiplies;
                            --searcher random only)
and `alpha` may also be {by: optimizer, sgd: {...}, adagrad: {...}}: each optimizer's own range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import outputs, storage
from .config import TrainConfig, build
from .corpus import HOLDOUT_SCHEMA, Corpus, iter_shard, write_shard
from .errors import UserError
from .ids import hash_strings
from .logs import quiet_exit_in_finalizers
from .search_cost import (
    REDUCTION,
    TRIAL_OVERHEAD_SECONDS,
    expected_measurements,
    grace_epochs,
    max_epochs_of,
    rung_epochs,
    trial_epoch_cost,
    trials_for_budget,
)
from .search_report import _Recorder, format_estimate, measured_config, plot_settings
from .search_space import OptunaSpace, _draw, _plain, default_space, seed_points, tune_space
from .shard_pass import hold_out

log = logging.getLogger(__name__)

METRICS = {"heldout": "recall@10", "labels": "knn_accuracy@10", "pairs": "pearson"}


SEARCHERS = ("random", "optuna")
# optuna: random draws after the seeded trials before its TPE sampler models the results
OPTUNA_RANDOM_STARTS = 3
VALIDATION_FRACTION = 0.2  # of each user's distinct URLs, hidden from the trials and measured on
# the test share of a --labels file (evaluate --labels' own split) or of a --pairs file (half: Lee's
# 1,225 pairs leave 600-odd to search on and as many to report)
DEFAULT_TEST_FRACTION = {"labels": 0.2, "pairs": 0.5}


# ---------------------------------------------------------------------------------------------------
# the validation split
# ---------------------------------------------------------------------------------------------------

def split_validation(corpus: Corpus, out: str, fraction: float = VALIDATION_FRACTION, seed: int = 0,
                     users: int | None = None) -> tuple[Corpus, str]:
    """A copy of `corpus` at out/corpus with a share of some users' distinct URLs hidden, and those
    (key, URL) pairs at out/heldout.parquet: the split `prepare --holdout` makes (shard_pass.hold_out:
    max(1, round(fraction × distinct)) of a user's distinct URLs, never all, every event of them), so
    a trial is measured the way the user's own held-out file measures the final model. The
    vocabulary keeps its ids; its counts become those of what stays.

    `users` (None: every user) limits the split to that many users, drawn among those with two
    distinct URLs or more: the ones a trial is measured on. Every other user trains whole, so the
    trials train on nearly the corpus the chosen settings will train on. With short documents
    (a catalogue's ~5 URLs a user) hiding a URL of every user takes a fifth or more of the training
    signal away from every trial and leaves the measured users with 1 to 4 URLs."""
    docs, vocab = corpus.docs(), corpus.vocab()
    keys = docs.column("key").combine_chunks()
    path = os.path.join(out, "corpus")
    os.makedirs(path)

    def split(doc_ids: np.ndarray, offsets: np.ndarray, tokens: np.ndarray):
        codes = np.repeat(np.arange(len(doc_ids)), np.diff(offsets))
        return codes, hold_out(codes, tokens, hash_strings(keys.take(pa.array(doc_ids))), corpus.vocab_size,
                               fraction, seed)

    chosen = None  # per document: hidden from (None: every one with two distinct URLs or more)
    if users is not None:
        eligible = np.concatenate([np.unique(doc_ids[split(doc_ids, offsets, tokens)[1][1]])
                                   for shard in corpus.shard_paths for doc_ids, offsets, tokens in iter_shard(shard)]
                                  or [np.zeros(0, np.int64)])
        chosen = np.zeros(corpus.num_docs, bool)
        if len(eligible) > users:
            eligible = np.random.default_rng(seed).choice(eligible, users, replace=False)
        chosen[eligible] = True
    shards, counts = [], np.zeros(corpus.vocab_size, dtype=np.int64)
    lengths = docs.column("length").to_numpy().copy()
    hidden_docs, hidden_words = [], []
    for s, shard in enumerate(corpus.shard_paths):
        ids, sizes, words = [], [], []
        for doc_ids, offsets, tokens in iter_shard(shard):
            codes, (keep, hid_doc, hid_tok, _) = split(doc_ids, offsets, tokens)
            if chosen is not None:
                mine = chosen[doc_ids]
                keep |= ~mine[codes]
                hid_doc, hid_tok = hid_doc[mine[hid_doc]], hid_tok[mine[hid_doc]]
            ids.append(doc_ids)
            sizes.append(np.bincount(codes[keep], minlength=len(doc_ids)))
            words.append(tokens[keep])
            hidden_docs.append(doc_ids[hid_doc])
            hidden_words.append(hid_tok)
        doc_ids, sizes = np.concatenate(ids), np.concatenate(sizes)
        words = np.concatenate(words).astype(np.int32)
        counts += np.bincount(words, minlength=corpus.vocab_size)
        lengths[doc_ids] = sizes
        shards.append(write_shard(path, s, doc_ids, sizes, words))
    with pa.OSFile(os.path.join(path, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, docs.schema) as writer:
        writer.write_table(docs.set_column(docs.schema.get_field_index("length"), "length", pa.array(lengths)))
    new_vocab = vocab.set_column(vocab.schema.get_field_index("count"), "count", pa.array(counts))
    with pa.OSFile(os.path.join(path, "vocab.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, new_vocab.schema) as writer:
        writer.write_table(new_vocab)
    heldout = os.path.join(out, "heldout.parquet")
    storage.write_local(os.path.join(path, "corpus.json"), json.dumps(
        {**corpus.meta, "num_tokens": int(lengths.sum()), "num_shards": len(shards), "shards": shards,
         "validation_of": corpus.path, "holdout": fraction, "holdout_out": heldout}, indent=2))
    outputs.write_marker(path, "corpus")
    doc_rows, word_rows = np.concatenate(hidden_docs), np.concatenate(hidden_words).astype(np.int64)
    pq.write_table(pa.table({"key": keys.take(pa.array(doc_rows)), "token": vocab.column("token").take(
        pa.array(word_rows))}, schema=HOLDOUT_SCHEMA), heldout)
    return Corpus(path), heldout


# ---------------------------------------------------------------------------------------------------
# a trial
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """What the trials and the final comparison are measured on, and where each trains.

    --heldout: trials train on a validation copy of the corpus (split_validation) and are measured on
    the (key, URL) pairs it hides; the comparison trains on the whole corpus, measured on the user's
    file. --labels / --pairs: everything trains on the whole corpus (the vectors learn no label); the
    trials are measured on the file's validation side, the comparison on its test side: the keys
    (labels) or pairs that evaluate's fixed split (`evaluate.in_test_share`, `test_fraction`) puts in
    its test share, which the search never looks at."""

    kind: str                          # heldout | labels | pairs
    user_file: str
    corpus: str                        # the whole corpus
    validation_corpus: str | None = None
    validation_pairs: str | None = None
    test_fraction: float | None = None
    key_col: str = "key"
    label_col: str = "label"

    @property
    def trial_corpus(self) -> str:
        return self.validation_corpus or self.corpus

    def measure(self, model: str, part: str = "validation") -> dict:
        """evaluate's figures of `model` on the validation side (a trial) or the test side (the comparison)."""
        from .evaluate import heldout_metrics, labels_metrics, pairs_metrics

        if self.kind == "heldout":
            if part == "validation":  # the same users for every trial: their differences are paired
                return heldout_metrics(model, self.validation_pairs, corpus_path=self.validation_corpus,
                                       max_users=TRIAL_USERS, baseline=False)
            return heldout_metrics(model, self.user_file, corpus_path=self.corpus)
        if self.kind == "labels":
            return labels_metrics(model, self.user_file, key_col=self.key_col, label_col=self.label_col,
                                  test_fraction=self.test_fraction, part=part)
        return pairs_metrics(model, self.user_file, test_fraction=self.test_fraction, part=part)

    def value(self, metrics: dict) -> float:
        return float(metrics[{"heldout": "model_recall@10", "labels": "knn_accuracy@10", "pairs": "pearson"}[self.kind]])

    def units(self, metrics: dict) -> int:
        """How many users (heldout, labels) or pairs one measurement scored: its cost scales with them."""
        return int(metrics.get("users") or metrics.get("validation_users") or metrics.get("pairs") or 0)

    def where(self, part: str) -> str:
        if self.kind == "heldout":
            return "the validation split of the training corpus" if part == "validation" else self.user_file
        what = "keys" if self.kind == "labels" else "pairs"
        side = "outside" if part == "validation" else "in"
        return f"{self.user_file}, the {what} {side} its test share ({self.test_fraction:g})"


TRIAL_USERS = 5_000  # held-out users a trial is measured on (evaluate's default is 20,000: 4x the time)


def run_trial(settings: dict, *, base: dict, target: Target, trials: str, rungs: list[int]) -> None:
    """One trial, in a Ray Tune actor: train `base` + `settings` on the target's corpus, reporting the
    metric at ASHA's rungs and at the last epoch (ASHA may stop it there)."""
    from ray import tune

    from .trainer import train

    # the trial's own lines (engine line, a stopped run's note) are not the user's concern: Tune reports
    # its metric and, for a failed trial, its error
    logging.getLogger("doc2vec_dist").setLevel(logging.ERROR)
    quiet_exit_in_finalizers()  # ASHA stopping this trial: Ray's SIGTERM, no traceback on the console
    config = build(TrainConfig, base, settings)
    out = os.path.join(trials, tune.get_context().get_trial_id())
    t0 = time.perf_counter()

    def report(epoch: int, stats: dict) -> None:
        seconds = stats.get("wall_seconds") or 0.0
        m0 = time.perf_counter()
        metric = target.value(target.measure(out))
        tune.report({"metric": metric, "epoch": epoch, "measure_seconds": time.perf_counter() - m0,
                     "tokens_per_second": stats["tokens"] / seconds if seconds else 0.0,
                     "seconds": time.perf_counter() - t0})

    train(target.trial_corpus, out, config, overwrite=True, on_epoch=report, report_at=set(rungs))


# ---------------------------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------------------------

def trial_resources(base: dict, corpus: Corpus) -> Callable[[dict], object]:
    """Each trial's placement group: nothing for the trial's own process (it only drives), one bundle
    per actor of its run (placement.run_bundles), so Ray Tune starts a trial only when all of it fits."""
    import ray
    from ray import tune

    from .placement import run_bundles
    from .ps import table_specs

    resources = ray.cluster_resources()

    def of(settings: dict):
        try:
            config = build(TrainConfig, base, settings)
        except UserError:  # the trial fails at once in run_trial, and is recorded as failed
            return tune.PlacementGroupFactory([{}, {"CPU": 0.001}])
        return tune.PlacementGroupFactory([{}, *run_bundles(config, table_specs(config, corpus), resources)])

    return of


def estimate_seconds(target: Target, config: TrainConfig, trials: int, budget: float, at_once: int,
                     calibrate_seconds: float, space: dict | None = None, base: TrainConfig | None = None,
                     compare: bool = True) -> dict | None:
    """The command's time from here, before the search starts, in parts that add up (`parts`):

    - startup: each trial's servers and workers starting (plan's calibration of the longest trial);
    - overhead: Ray Tune's own per trial (its actor, placement group, bookkeeping: TRIAL_OVERHEAD_SECONDS);
    - training: ASHA's expected epochs (each trial's own epochs, cut at ASHA's rungs: trial_epoch_cost;
      `budget` full trainings without a space) at the calibrated seconds per epoch, times a trial's
      mean cost against the calibrated settings;
    - measuring: every measurement a trial makes (at ASHA's rungs and its last epoch: a checkpoint
      and an evaluation of the validation side, one timed in the calibration);
    - comparing: the best and the base trained on the whole corpus, each measured once on the test
      side (20,000 users of a held-out file, with the popularity baseline).

    The search's parts run `at_once` at a time. gensim's training in the comparison is not
    included. None with no calibration."""
    if calibrate_seconds <= 0:
        return None
    from .plan import plan

    def measure(model: str) -> dict:
        try:
            return target.measure(model)
        except UserError as exc:  # a slice's model lacks the file's keys: no timing, said so
            return {"error": str(exc)}

    base = base or config
    found = plan(target.trial_corpus, config, calibrate_seconds=calibrate_seconds, measure=measure)
    cal, timing = found["calibration"], found["time"]
    epoch_seconds, startup = timing["epoch_seconds"], timing["startup_seconds"]
    checkpoint = timing["checkpoint_seconds"] or 0.0  # each measurement reads a committed checkpoint
    probe = cal.get("measured") or {}
    measure_seconds = test_measure_seconds = None
    if probe and "error" not in probe["result"]:
        per_unit = probe["seconds"] / max(target.units(probe["result"]), 1)
        measure_seconds = probe["seconds"]
        test_measure_seconds = probe["seconds"]
        if target.kind == "heldout":
            users = pq.read_table(target.validation_pairs, columns=["key"]).column("key").unique()
            measure_seconds = per_unit * min(TRIAL_USERS, len(users))
            # evaluate's default sample of the user's file, and the popularity baseline beside the model
            test_users = pq.read_table(target.user_file, columns=["key"]).column("key").unique()
            test_measure_seconds = 2 * per_unit * min(20_000, len(test_users))
    if space:
        per_trial, cost = trial_epoch_cost(space, config, Corpus(target.trial_corpus).counts(), config.epochs)
        epochs = trials * per_trial
    else:
        cost, epochs = 1.0, budget * config.epochs
    measurements = expected_measurements(trials, config.epochs)
    parts = {"startup": trials * startup / at_once,
             "overhead": trials * TRIAL_OVERHEAD_SECONDS / at_once,
             "training": epochs * epoch_seconds * cost / at_once,
             "measuring": measurements * (checkpoint + (measure_seconds or 0.0)) / at_once}
    search_seconds = sum(parts.values())
    if compare:
        whole = Corpus(target.corpus).num_tokens / max(Corpus(target.trial_corpus).num_tokens, 1)
        parts["comparing"] = (2 * startup + (config.epochs * cost + base.epochs) * epoch_seconds * whole
                              + 2 * (test_measure_seconds or 0.0))
    return {"seconds": sum(parts.values()), "parts": parts, "search_seconds": search_seconds,
            "compare_seconds": parts.get("comparing", 0.0), "trials": trials, "startup_seconds": startup,
            "overhead_seconds": TRIAL_OVERHEAD_SECONDS, "epochs": epochs, "epoch_seconds": epoch_seconds,
            "trial_cost": cost, "measurements": measurements, "measure_seconds": measure_seconds,
            "checkpoint_seconds": checkpoint, "test_measure_seconds": test_measure_seconds}


def concurrency(config: TrainConfig) -> int:
    """How many trials of `config`'s workers the cluster's CPUs hold at once (what the log line says)."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 1)
    return max(1, int(cpus // max(config.cpus_per_worker * config.num_workers, 1e-9)))


def search(corpus_path: str, out: str, *, heldout: str | None = None, labels: str | None = None,
           pairs: str | None = None, budget: float = 8.0, space: dict | None = None,
           base: TrainConfig | None = None, compare: bool = True, calibrate_seconds: float = 10.0,
           test_fraction: float | None = None, key_col: str = "key", label_col: str = "label",
           progress: bool = True, searcher: str = "random", space_name: str = "the search space") -> dict:
    """Search the settings of `space` (default_space) on `corpus_path` within `budget` full trainings;
    write the trials' table, the best settings, the plot and the comparison into `out` (module docstring).

    The base settings and each optimizer at its START_ALPHA run first (seed_points), then the
    searcher's draws: `random` (Ray Tune's own) or `optuna` (Optuna's TPE, which draws where the
    results so far are best). `space_name` names the space in errors (the --space file)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from .cluster import ray_connection

    given = [(k, v) for k, v in (("heldout", heldout), ("labels", labels), ("pairs", pairs)) if v]
    if len(given) != 1:
        raise UserError("tune needs one of --heldout, --labels or --pairs to measure trials on")
    (kind, user_file), = given
    if test_fraction is not None and kind == "heldout":
        raise UserError("--test-fraction is the share of a --labels or --pairs file kept for the comparison; with "
                        "--heldout the trials are measured on a validation split of the corpus and the comparison "
                        "on the whole file: leave --test-fraction out")
    if test_fraction is not None and not 0 < test_fraction < 1:
        raise UserError(f"--test-fraction must lie between 0 and 1, not {test_fraction:g}")
    if base is not None and base.resume:
        raise UserError("tune trains each trial and the comparison afresh in directories of its own: a base config "
                        "that resumes (resume, resume_from) has nothing to resume there; leave them out")
    if not os.path.exists(user_file):
        raise UserError(f"{user_file}: no such file")
    if budget <= 0:
        raise UserError(f"--budget must be > 0 full trainings, not {budget}")
    if searcher not in SEARCHERS:
        raise UserError(f"--searcher must be one of {', '.join(SEARCHERS)}, not {searcher!r}")
    corpus = Corpus(corpus_path)
    base = base or TrainConfig()
    space = space if space is not None else default_space(corpus, base)
    tune_space(space, space_name)  # every name a setting, every range well formed
    points = seed_points(space, base)
    search_alg = _searcher(searcher, space, points, base.seed, space_name)  # before anything is written: a refusal leaves nothing
    out = os.path.abspath(out)
    replaces = outputs.check_dir(out, "tune", None)
    outputs.check_writable(out, inside=True)
    if replaces:
        log.info(f"replacing the earlier search at {out}")
        for name in os.listdir(out):
            outputs.remove_path(os.path.join(out, name))
    os.makedirs(out, exist_ok=True)
    outputs.write_marker(out, "tune")
    if kind == "heldout":
        val_corpus, val_pairs = split_validation(corpus, os.path.join(out, "validation"), seed=base.seed,
                                                 users=TRIAL_USERS)
        target = Target(kind, os.path.abspath(user_file), corpus.path, val_corpus.path, val_pairs)
    else:
        target = Target(kind, os.path.abspath(user_file), corpus.path,
                        test_fraction=DEFAULT_TEST_FRACTION[kind] if test_fraction is None else test_fraction,
                        key_col=key_col, label_col=label_col)
    # each trial: the base settings with the trial's own, quiet, checkpointed only where it is measured
    base_fields = {**dataclasses.asdict(base), "progress": False, "checkpoint_every": 0.0, "keep_checkpoints": 1,
                   # a trial runs in a directory of Ray Tune's: a relative path would be looked for there
                   "init_from": base.init_from and os.path.abspath(base.init_from)}
    max_epochs = max_epochs_of(space, base)
    grid = math.prod(len(v["grid"]) for v in space.values() if isinstance(v, dict) and "grid" in v)
    # the seeded points are one trial each, within the budget; the draws run every grid point, at least once
    draws = max(1 if grid > 1 else 0, (trials_for_budget(budget, max_epochs) - len(points)) // grid)
    total = len(points) + draws * grid
    metric = METRICS[kind]
    measured_on = target.where("validation")
    names = list(space)
    with ray_connection(base.address):
        at_once = concurrency(build(TrainConfig, base_fields))
        estimate = estimate_seconds(target, build(TrainConfig, base_fields, {"epochs": max_epochs}),
                                    total, budget, at_once, calibrate_seconds, space=space, base=base,
                                    compare=compare)
        if estimate is not None:
            log.info(format_estimate(estimate, at_once))
        log.info(f"tune: {total} trial(s) of up to {max_epochs} epochs: the base settings"
                 + (f" and {len(points) - 1} optimizer(s) at a known learning rate" if len(points) > 1 else "")
                 + f" first, then {draws * grid} {searcher} draw(s); ASHA (every trial {grace_epochs(max_epochs)} "
                 f"epoch(s), then the best 1/{REDUCTION} at each rung) ≈ {budget:g} full trainings, {at_once} at a "
                 f"time; metric {metric} on {measured_on}")
        # best.yaml: the base (not the trials' quiet, uncheckpointed copy of it) with the best's settings
        recorder = _Recorder(out, names, dataclasses.asdict(base), metric, measured_on, total, progress, points,
                             searcher)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, base=base_fields, target=target, trials=os.path.join(out, "trials"),
                                 rungs=rung_epochs(max_epochs)),
            trial_resources(base_fields, Corpus(target.trial_corpus)))
        tuner = tune.Tuner(
            trainable, param_space={},  # the searcher gives each trial's whole config
            tune_config=tune.TuneConfig(
                metric="metric", mode="max", num_samples=total, max_concurrent_trials=at_once,
                search_alg=search_alg,
                scheduler=ASHAScheduler(time_attr="epoch", max_t=max_epochs, grace_period=grace_epochs(max_epochs),
                                        reduction_factor=REDUCTION)),
            run_config=tune.RunConfig(name="tune", storage_path=os.path.join(out, "ray_tune"), verbose=0,
                                      callbacks=[recorder.callback],
                                      failure_config=tune.FailureConfig(max_failures=0, fail_fast=False)))
        t0 = time.perf_counter()
        with _quiet_tune():
            grid_of_results = tuner.fit()
        recorder.bar.close()
        seconds = time.perf_counter() - t0
        # Ray Tune catches a Ctrl-C, stops the running trials, starts no more and returns
        unfinished = total - grid_of_results.num_terminated - grid_of_results.num_errors
        if unfinished:
            for row in recorder.rows.values():
                if row["state"] == "running":
                    row["state"] = "interrupted"
        recorder.write()
        outputs.remove_path(os.path.join(out, "trials"))  # what a stopped trial wrote after its end
        if unfinished:
            kept = (f", the best settings so far in {os.path.join(out, 'best.yaml')}" if recorder.best() is not None
                    else "; no trial had ended, so there are no best settings")
            log.warning(f"interrupted with {unfinished} trial(s) unfinished: the trials so far are in "
                        f"{os.path.join(out, 'trials.csv')}{kept}")
            raise KeyboardInterrupt
        best = recorder.best()
        if best is None:
            raise UserError(f"{out}: every trial failed; see trials.csv")
        settings = {n: _plain(best[n]) for n in names}
        base_row = recorder.base_row()
        result = {"estimated_seconds": None if estimate is None else round(estimate["seconds"], 1),
                  "estimate": estimate, "searcher": searcher,
                  "trials": len(recorder.rows), "failed": sum(r["state"] == "failed" for r in recorder.rows.values()),
                  "seconds": round(seconds, 1), "metric": metric, "measured_on": measured_on,
                  "best": {**settings, metric: best[metric]},
                  # the base settings' own trial: its figure, and whether any other trial beat it
                  "base": None if base_row is None else {**{n: _plain(base_row[n]) for n in names},
                                                         metric: base_row[metric], "state": base_row["state"]},
                  "base_is_best": best["source"] == "base",
                  # what the trials' own clocks did not see (Ray Tune starting and ending them), per trial
                  "overhead_seconds_per_trial": round((seconds * at_once - sum(r["seconds"] or 0.0 for r in
                                                                              recorder.rows.values()))
                                                      / max(len(recorder.rows), 1), 2)}
        plot_settings(recorder.table(), names, metric, os.path.join(out, "settings.png"), space)
        if compare:
            result["compare"] = compare_on_test(target, out, settings, base, same_as_base=result["base_is_best"])
            result["compared_on"] = target.where("test")
    storage.write_local(os.path.join(out, "tune.json"), storage.json_bytes(result))
    return result


def _searcher(name: str, space: dict, points: list[dict], seed: int, space_name: str = "the search space"):
    """Ray Tune's search algorithm for `name`, with the seeded points first (`points_to_evaluate`)."""
    fixed = {n: v for n, v in space.items() if not isinstance(v, dict)}
    if name == "random":
        return _random_draws(space, [{**fixed, **p} for p in points], seed)
    try:
        import optuna
        from ray.tune.search.optuna import OptunaSearch
    except ImportError:
        raise UserError("--searcher optuna needs Optuna: pip install optuna (or pip install "
                        "'doc2vec-dist[optuna]')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per trial: trials.csv has them
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=len(points) + OPTUNA_RANDOM_STARTS)
    return OptunaSearch(space=OptunaSpace(space, points, space_name), metric="metric", mode="max", sampler=sampler,
                        points_to_evaluate=[dict(p) for p in points])


def _random_draws(space: dict, points: list[dict], seed: int):
    """Random draws of the space as a Ray Tune Searcher: the points first, then each draw with every
    grid point. Ray Tune's own generator (BasicVariantGenerator) cannot take a seeded value for a
    by-optimizer alpha (a sample_from: it fails resolving the trial's config), so the draws are made
    here, as trial_cost draws them."""
    import itertools

    from ray.tune.search import Searcher

    grids = {n: v["grid"] for n, v in space.items() if isinstance(v, dict) and "grid" in v}
    drawn_space = {n: v for n, v in space.items() if n not in grids}

    class RandomDraws(Searcher):
        def __init__(self):
            super().__init__(metric="metric", mode="max")
            self.queue = [dict(p) for p in points]
            self.rng = np.random.default_rng(seed)

        def suggest(self, trial_id: str) -> dict:
            if not self.queue:  # a draw for each grid point (a by-setting may depend on a grid)
                self.queue = [_draw({**drawn_space, **dict(zip(grids, values))}, self.rng)
                              for values in itertools.product(*grids.values())]
            return self.queue.pop(0)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            pass  # random draws learn nothing from results

        def save(self, checkpoint_path: str) -> None:
            with open(checkpoint_path, "w") as fh:
                json.dump({"queue": self.queue, "rng": self.rng.bit_generator.state}, fh, default=_plain)

        def restore(self, checkpoint_path: str) -> None:
            with open(checkpoint_path) as fh:
                state = json.load(fh)
            self.queue, self.rng.bit_generator.state = state["queue"], state["rng"]

    return RandomDraws()


@contextlib.contextmanager
def _quiet_tune():
    """Ray Tune's legacy output engine, which at verbose=0 prints nothing: its new engine prints an
    experiment table and TensorBoard hints at every verbosity (ray/tune/experimental/output.py). The
    recorder's progress bar and trials.csv say what matters."""
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def compare_on_test(target: Target, out: str, settings: dict, base: TrainConfig, same_as_base: bool = False) -> dict:
    """The best settings, the defaults and gensim (with the best's epochs), each trained on the whole
    corpus and measured on the test side of the user's file (Target.where("test")). When the best
    are the base settings (`same_as_base`), one model stands for both."""
    from .baseline import train_gensim
    from .trainer import train

    corpus = target.corpus
    found: dict[str, dict] = {}
    runs: list[tuple[str, Callable[[str], dict]]] = [
        # what best.yaml holds (search_report.best_config): `train --config best.yaml` trains this model
        ("tuned", lambda m: train(corpus, m, measured_config(dataclasses.asdict(base), settings), overwrite=True)),
        ("defaults", lambda m: train(corpus, m, dataclasses.replace(base, progress=False), overwrite=True)),
        # gensim with the base settings (its own SGD and negatives) at the tuned run's epochs
        ("gensim", lambda m: train_gensim(corpus, m, dataclasses.replace(
            base, epochs=int(settings.get("epochs", base.epochs)), optimizer="sgd", shared_negatives=0,
            progress=False), overwrite=True)),
    ]
    if same_as_base:
        runs = runs[1:]
    for name, run in runs:
        model = os.path.join(out, "compare", name)
        summary = run(model)
        found[name] = {"metric": target.value(target.measure(model, "test")),
                       "tokens_per_second": summary.get("tokens_per_second"), "epochs": summary.get("epochs")}
        log.info(f"{name}: {METRICS[target.kind]} {found[name]['metric']:.4f} on {target.where('test')}")
    if same_as_base:
        found = {"tuned": found["defaults"], **found}
    return found
