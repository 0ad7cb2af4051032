"""What tune writes and prints: DIR/trials.csv and DIR/best.yaml as the search goes (_Recorder, a Ray Tune
callback), DIR/settings.png (plot_settings), and the lines of the estimate and the result (format_estimate,
format_result).

Changes when what a search records, plots or prints changes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import math
import os
import sys

import yaml

from . import outputs, storage
from .config import TrainConfig, build
from .search_space import _plain, is_point

log = logging.getLogger(__name__)

# settings best.yaml leaves out though the measured runs had them: tune's own choice (no progress bars), and
# where they ran (the Ray address), which is not a setting of the model
NOT_WRITTEN = ("progress", "address")


def measured_config(base: dict, settings: dict) -> TrainConfig:
    """The configuration a search measured for `settings`: the base settings (tune's flags and --config,
    `base` as dataclasses.asdict gives them) with the searched ones over them, as the comparison trains
    its tuned model. Several workers train as many as asked (tune's trials take no plan's advice), which
    force_workers says to `train`."""
    config = build(TrainConfig, base, settings, {"progress": False})
    if config.num_workers > 1:
        config.force_workers = True
    return config


def best_config(base: dict, settings: dict) -> dict:
    """best.yaml's keys: every searched setting, and every other setting of measured_config that differs
    from TrainConfig's defaults (but NOT_WRITTEN), so that `train --config best.yaml` trains what was
    measured, not the searched settings over the defaults."""
    config = measured_config(base, settings)
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(TrainConfig)
            if f.name not in NOT_WRITTEN and (f.name in settings or getattr(config, f.name) != f.default)}


def format_estimate(estimate: dict, at_once: int) -> str:
    """The estimate in one line, each part with what it counts."""
    p = estimate["parts"]
    measure = (f"{estimate['measure_seconds']:.1f} s" if estimate["measure_seconds"] is not None
               else "an unknown time")
    line = (f"tune: estimated {estimate['seconds'] / 60:,.1f} min: {estimate['trials']} trials' startup "
            f"{p['startup']:.0f} s + Ray Tune's overhead {p['overhead']:.0f} s ({estimate['overhead_seconds']:.1f} s a "
            f"trial) + training {p['training']:.0f} s ({estimate['epochs']:,.0f} epochs of "
            f"{estimate['epoch_seconds']:.2f} s x {estimate['trial_cost']:.2f}, a trial's mean cost against the base) "
            f"+ measuring {p['measuring']:.0f} s ({estimate['measurements']:,.0f} evaluations at ASHA's rungs and "
            f"last epochs, {measure} each), {at_once} trial(s) at a time")
    if "comparing" in p:
        line += f"; then the comparison {p['comparing']:.0f} s and gensim's training (not estimated)"
    return line


ENDED = ("finished", "stopped early")


class _Recorder:
    """A Ray Tune callback that keeps trials.csv and best.yaml current as trials report and end.

    "best so far" (the progress line, best.yaml) is the best metric among the trials that have
    ended (finished, or stopped by ASHA at a rung), each at its last measurement: it never goes
    down, as a running trial's figure at a rung may before its last epoch. The base settings win
    ties: a search that finds nothing better says so and hands the base back.

    `base` is the base settings (dataclasses.asdict of tune's TrainConfig): best.yaml writes them
    beside the searched `names` wherever they differ from the defaults (best_config)."""

    def __init__(self, out: str, names: list[str], base: dict, metric: str, measured_on: str, total: int,
                 progress: bool, points: list[dict] | None = None, searcher: str = "random"):
        from ray.tune import Callback
        from tqdm import tqdm

        recorder = self

        class _Callback(Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                recorder.seen(trial, result)

            def on_trial_complete(self, iteration, trials, trial, **info):
                recorder.ended(trial, "finished")

            def on_trial_error(self, iteration, trials, trial, **info):
                recorder.ended(trial, "failed")

        self.callback = _Callback()
        self.out, self.names, self.base, self.metric, self.measured_on = out, names, base, metric, measured_on
        self.points, self.searcher = points or [], searcher
        self.rows: dict[str, dict] = {}
        # one line for the whole search, in place of Ray Tune's tables
        self.bar = tqdm(total=total, unit=" trials", desc="tune", disable=not progress, file=sys.stderr,
                        dynamic_ncols=True)

    def __getstate__(self) -> dict:
        # Ray Tune pickles its callbacks with the experiment's state; the bar writes to a terminal
        return {k: v for k, v in self.__dict__.items() if k not in ("bar", "callback")}

    def __setstate__(self, state: dict) -> None:
        from tqdm import tqdm

        self.__dict__.update(state, bar=tqdm(disable=True))

    def source(self, settings: dict) -> str:
        """base: the base settings; start: an optimizer at its START_ALPHA; else the searcher's draw."""
        for i, point in enumerate(self.points):
            if is_point(settings, point):
                return "base" if i == 0 else "start"
        return self.searcher

    def _row(self, trial) -> dict:
        if trial.trial_id not in self.rows:
            settings = {n: _plain(trial.config.get(n)) for n in self.names}
            self.rows[trial.trial_id] = {"trial": trial.trial_id, **settings, "source": self.source(trial.config),
                                         self.metric: None, "epochs_run": 0, "tokens_per_second": None,
                                         "seconds": None, "state": "running"}
        return self.rows[trial.trial_id]

    def seen(self, trial, result: dict) -> None:
        row = self._row(trial)
        row.update({self.metric: result["metric"], "epochs_run": result["epoch"],
                    "tokens_per_second": result["tokens_per_second"], "seconds": result["seconds"]})
        self.write()

    def ended(self, trial, how: str) -> None:
        # its model is not needed again (compare trains the best on the whole corpus): at 20M users a
        # trial's model is gigabytes, and a search runs dozens
        outputs.remove_path(os.path.join(self.out, "trials", trial.trial_id))
        row = self._row(trial)
        error = getattr(trial, "error_file", None)
        if how == "failed":
            row["state"] = "failed"
            row["error"] = _error_line(error)
        else:
            target = trial.config.get("epochs", self.base.get("epochs"))
            row["state"] = "finished" if target is None or row["epochs_run"] >= target else "stopped early"
        self.write()
        best = self.best()
        if best is not None:
            self.bar.set_postfix_str(f"best {self.metric} {best[self.metric]:.4f} (of the trials ended)",
                                     refresh=False)
        self.bar.update(1)

    def table(self) -> list[dict]:
        """Every trial: the ended ones best first (the base before an equal), then the others."""
        ended = [r for r in self.rows.values() if r["state"] in ENDED and r[self.metric] is not None]
        return (sorted(ended, key=lambda r: (-r[self.metric], r["source"] != "base"))
                + [r for r in self.rows.values() if r not in ended])

    def best(self) -> dict | None:
        rows = self.table()
        return rows[0] if rows and rows[0]["state"] in ENDED and rows[0][self.metric] is not None else None

    def base_row(self) -> dict | None:
        return next((r for r in self.table() if r["source"] == "base"), None)

    def write(self) -> None:
        rows = self.table()
        columns = ["trial", *self.names, "source", self.metric, "epochs_run", "tokens_per_second", "seconds", "state",
                   "error"]
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        storage.write_local(os.path.join(self.out, "trials.csv"), table.getvalue())
        best = self.best()
        if best is not None:
            settings = {n: _plain(best[n]) for n in self.names}
            config = best_config(self.base, settings)
            ended = sum(r["state"] in ENDED for r in rows)
            what = ("nothing beat the base settings (these): " if best["source"] == "base" and ended > 1
                    else "the base settings: " if best["source"] == "base" else "")
            forced = config.get("force_workers") and not self.base.get("force_workers") and "force_workers" not in settings
            given = [k for k in config if k not in settings and not (forced and k == "force_workers")]
            text = (f"# doc2vec-dist tune: {what}the best of {ended} ended trial(s) so far, {self.metric} "
                    f"{best[self.metric]:.4f} after {best['epochs_run']} epoch(s) on {self.measured_on}\n"
                    f"# the configuration measured, for train --config: searched {', '.join(sorted(settings))}"
                    + (f"; as tune was given them (its flags and --config): {', '.join(sorted(given))}" if given
                       else "; every other setting at its default")
                    + ("; force_workers: the trials trained --num-workers as given" if forced else "")
                    + "\n" + yaml.safe_dump(config, sort_keys=True))
            storage.write_local(os.path.join(self.out, "best.yaml"), text)


def _error_line(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path) as fh:
            lines = [line.strip() for line in fh if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _log_scale(spec) -> bool:
    """Whether a setting's range is searched on a log scale: loguniform, by-optimizer ranges of it, or
    choices spanning more than 20× (sample's 1e-5 … 1e-3)."""
    if not isinstance(spec, dict):
        return False
    if "by" in spec:
        return any(_log_scale(v) for k, v in spec.items() if k != "by")
    (kind, args), = spec.items()
    positive = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0]
    return kind == "loguniform" or (kind in ("choice", "grid") and len(positive) > 1
                                    and max(positive) > 20 * min(positive))


def plot_settings(rows: list[dict], names: list[str], metric: str, path: str, space: dict | None = None) -> None:
    """The metric of every trial against each setting, one panel per setting."""
    space = space or {}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("warning: matplotlib is not installed: no settings.png (pip install matplotlib)")
        return
    done = [r for r in rows if r[metric] is not None]
    cols = min(4, len(names))
    fig, axes = plt.subplots(math.ceil(len(names) / cols), cols, figsize=(4 * cols, 3 * math.ceil(len(names) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, names):
        values = [r[name] for r in done]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        labels = sorted({str(v) for v in values})
        xs = values if numeric else [labels.index(str(v)) for v in values]
        ax.scatter(xs, [r[metric] for r in done], c=[r["epochs_run"] for r in done], cmap="viridis", s=18)
        if not numeric:
            ax.set_xticks(range(len(labels)), labels)
        elif _log_scale(space.get(name)) and min(values) >= 0 and any(v > 0 for v in values):
            if min(values) == 0:  # sample's 0 beside 1e-5 … 1e-3
                ax.set_xscale("symlog", linthresh=min(v for v in values if v > 0))
            else:
                ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"{len(done)} trials (colour: epochs reached)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def format_result(result: dict, out: str) -> str:
    """The search in a few lines: trials, the best settings against the base's, and the comparison on
    the user's file."""
    metric = result["metric"]
    best, base = result["best"], result.get("base")
    lines = [f"tune: {result['trials']} trial(s) ({result.get('searcher', 'random')}), {result['failed']} failed, "
             f"{result['seconds']:.0f} s; best {metric} {best[metric]:.4f} on {result['measured_on']} with "
             + ", ".join(f"{k} {v}" for k, v in best.items() if k != metric)]
    if result.get("base_is_best"):
        lines.append(f"nothing beat the base settings (your flags and --config) on {result['measured_on']}: "
                     f"best.yaml is the base")
    elif base is not None and base[metric] is not None:
        lines.append(f"the base settings scored {base[metric]:.4f} there ({base['state']}): the best is "
                     f"{best[metric] - base[metric]:+.4f}")
    compare = result.get("compare") or {}
    if compare:
        lines.append(f"on {result['compared_on']}, trained on the whole corpus:")
    for name, found in compare.items():
        lines.append(f"  {name:9s} {metric} {found['metric']:.4f} ({found['epochs']} epochs)")
    if compare and not result.get("base_is_best") and compare["tuned"]["metric"] < compare["defaults"]["metric"]:
        lines.append(f"the base settings beat the tuned ones on {result['compared_on']}: keep the base "
                     f"({compare['defaults']['metric']:.4f} against {compare['tuned']['metric']:.4f})")
    lines.append(f"trials: {os.path.join(out, 'trials.csv')}; best settings: {os.path.join(out, 'best.yaml')} "
                 f"(train --config); plot: {os.path.join(out, 'settings.png')}")
    return "\n".join(lines)
