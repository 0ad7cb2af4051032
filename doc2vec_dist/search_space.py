"""tune's search space: the default space, the space file (load_space, tune_space: its ranges as Ray Tune's
domains), the trials seeded before any draw (seed_points), a draw of the space (_draw) and Optuna's view of it
(OptunaSpace). tune.py's docstring gives the space file's format.

Changes when what is searched, or how a space is written, checked or drawn from, changes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import yaml

from .config import TrainConfig, did_you_mean, is_text
from .corpus import Corpus
from .errors import UserError

# optimizer and its alpha; the negative-sampling exponent; negatives; subsampling; size and epochs
DEFAULT_SPACE = {
    "optimizer": {"choice": ["sgd", "adagrad"]},
    "alpha": {"by": "optimizer", "sgd": {"loguniform": [0.01, 0.05]}, "adagrad": {"loguniform": [0.02, 0.2]}},
    "ns_exponent": {"uniform": [0.0, 1.0]},
    "negative": {"choice": [5, 10, 20]},
    "sample": {"choice": [0, 1e-5, 1e-4, 1e-3]},
    "dim": {"choice": [64, 100, 128]},
    # epochs: a quarter, half, all and twice the base's (default_space): 3, 5, 10, 20 at the default 10
}
TEXT_SPACE = {"window": {"choice": [5, 8, 10]}, "dbow_words": {"choice": [False, True]}}  # for text corpora


# Each optimizer's first trial, before any draw: a learning rate known to train (gensim's 0.025 for SGD;
# row-wise Adagrad's step is per element about alpha, and 0.05 is where it beat SGD on catalogue data)
START_ALPHA = {"sgd": 0.025, "adagrad": 0.05}


# ---------------------------------------------------------------------------------------------------
# the space
# ---------------------------------------------------------------------------------------------------

def default_space(corpus: Corpus, base: TrainConfig | None = None) -> dict:
    """The default search space, with epochs around the base's (a small corpus, Lee's 300 documents, wants
    40; a skewed catalogue of short documents is over-trained at 20 and best near 5); a text corpus
    (prepare --format text) also searches window and dbow_words."""
    epochs = (base or TrainConfig()).epochs
    space = {**DEFAULT_SPACE, "epochs": {"choice": sorted({math.ceil(epochs / 4), max(1, epochs // 2), epochs,
                                                           2 * epochs})}}
    if is_text(corpus):
        space.update(TEXT_SPACE)
    return space


def seed_points(space: dict, base: TrainConfig) -> list[dict]:
    """The trials that run before any draw: the base settings (the user's flags and --config) first,
    then each optimizer of the space at its START_ALPHA, the rest as in the base. A random search of a
    few trials may otherwise never try an optimizer at a learning rate that suits it (row-wise
    Adagrad wants about twice SGD's). Each point sets every setting the space varies, so it is one
    trial (a grid too: the draws still run every grid point)."""
    varied = [n for n, spec in space.items() if isinstance(spec, dict)]
    base_point = {n: _plain(getattr(base, n)) for n in varied}
    points = [base_point]
    optimizers = space.get("optimizer")
    if isinstance(optimizers, dict):
        (_, choices), = ((k, v) for k, v in optimizers.items())
        for optimizer in choices if isinstance(choices, list) else []:
            point = {**base_point, "optimizer": optimizer}
            if "alpha" in base_point and optimizer in START_ALPHA:
                point["alpha"] = START_ALPHA[optimizer]
            if point not in points:
                points.append(point)
    return points


def is_point(settings: dict, point: dict) -> bool:
    return all(_same(settings.get(name), value) for name, value in point.items())


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def load_space(path: str) -> dict:
    try:
        with open(path) as fh:
            space = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read the search space ({exc})") from None
    if not isinstance(space, dict) or not space:
        raise UserError(f"{path}: a search space maps setting names to values or ranges")
    return space


def tune_space(space: dict, where: str = "the search space") -> dict:
    """The space as Ray Tune's param_space, checked: every name a TrainConfig field, every range well formed."""
    from ray import tune

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out = {}
    for name, spec in space.items():
        if name not in fields:
            raise UserError(f"{where}: {name!r} is not a training setting (TrainConfig field){did_you_mean(name, fields)}")
        if isinstance(spec, dict) and "by" in spec:
            by = spec["by"]
            if by not in space:
                raise UserError(f"{where}: {name} depends on {by!r}, which the space does not set")
            ranges = {key: _domain(name, value, where) for key, value in spec.items() if key != "by"}
            out[name] = tune.sample_from(lambda config, ranges=ranges, by=by, name=name:
                                         _by(ranges, config[by], by, name))
        else:
            out[name] = _domain(name, spec, where)
    return out


def _domain(name: str, spec, where: str):
    from ray import tune

    if not isinstance(spec, dict):
        return spec  # a fixed value
    if len(spec) != 1:
        raise UserError(f"{where}: {name} must be a value or one of choice, grid, uniform, loguniform, randint")
    (kind, args), = spec.items()
    if kind == "choice" and isinstance(args, list) and args:
        return tune.choice(args)
    if kind == "grid" and isinstance(args, list) and args:
        return tune.grid_search(args)
    if kind in ("uniform", "loguniform", "randint") and isinstance(args, list) and len(args) == 2:
        return getattr(tune, kind)(*args)
    raise UserError(f"{where}: {name}: {kind} needs "
                    f"{'a list of values' if kind in ('choice', 'grid') else '[low, high]'}")


def _by(ranges: dict, key, by: str, name: str):
    if key not in ranges:
        raise UserError(f"the search space gives {name} no range for {by}={key}")
    domain = ranges[key]
    return domain.sample() if hasattr(domain, "sample") else domain


class OptunaSpace:
    """The space as an Optuna define-by-run function (`OptunaSearch(space=...)`): a by-optimizer alpha
    draws from the range of the optimizer drawn first. The seeded points' values join each choice
    (Optuna runs an enqueued trial only with values its distributions hold). A class, not a closure:
    Ray Tune pickles the searcher with the experiment's state."""

    def __init__(self, space: dict, points: list[dict], where: str = "the search space"):
        tune_space(space, where)  # every name a setting, every range well formed
        for name, spec in space.items():
            specs = [v for k, v in spec.items() if k != "by"] if isinstance(spec, dict) and "by" in spec else [spec]
            if any(isinstance(v, dict) and "grid" in v for v in specs):
                raise UserError(f"{where}: {name}: grid is not searched by --searcher optuna (it draws every "
                                "setting); use choice, or --searcher random")
        self.space, self.extra = space, {}
        for point in points:
            for name, value in point.items():
                spec = space.get(name)
                if isinstance(spec, dict) and "choice" in spec and value not in spec["choice"]:
                    self.extra.setdefault(name, []).append(value)

    def __call__(self, trial) -> dict:
        values, fixed = {}, {}
        # the settings a by-setting depends on first, whatever the order of the space file
        for name, spec in sorted(self.space.items(), key=lambda item: isinstance(item[1], dict) and "by" in item[1]):
            if isinstance(spec, dict) and "by" in spec:
                spec = spec.get(values[spec["by"]])
                if spec is None:
                    raise UserError(f"the search space gives {name} no range for "
                                    f"{self.space[name]['by']}={values[self.space[name]['by']]}")
            if isinstance(spec, dict):
                values[name] = self._suggest(trial, name, spec)
            else:
                values[name] = fixed[name] = spec
        return fixed

    def _suggest(self, trial, name: str, spec: dict):
        (kind, args), = spec.items()
        if kind == "choice":
            return trial.suggest_categorical(name, [*args, *self.extra.get(name, [])])
        if kind == "randint":  # Ray Tune's randint excludes its upper bound
            return trial.suggest_int(name, args[0], args[1] - 1)
        return trial.suggest_float(name, args[0], args[1], log=kind == "loguniform")


def _draw(space: dict, rng: np.random.Generator) -> dict:
    """One draw of the space's settings (a grid: one of its values), a by-setting after its key."""
    drawn: dict = {}
    for name, spec in sorted(space.items(), key=lambda item: isinstance(item[1], dict) and "by" in item[1]):
        if isinstance(spec, dict) and "by" in spec:
            spec = spec.get(drawn.get(spec["by"]), {})
        if not isinstance(spec, dict):
            drawn[name] = spec
        elif spec:
            (kind, args), = spec.items()
            if kind in ("choice", "grid"):
                drawn[name] = args[int(rng.integers(len(args)))]
            elif kind == "uniform":
                drawn[name] = float(rng.uniform(*args))
            elif kind == "loguniform":
                drawn[name] = float(np.exp(rng.uniform(np.log(args[0]), np.log(args[1]))))
            else:
                drawn[name] = int(rng.integers(args[0], args[1]))
    return drawn


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
