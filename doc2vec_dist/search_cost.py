"""tune's cost model: ASHA's rungs and expected epochs (grace_epochs, rung_epochs, asha_epochs), the number of
trials a budget buys (trials_for_budget), and a trial's cost against the calibrated settings (trial_cost,
trial_epoch_cost), which tune.estimate_seconds turns into the command's time.

Changes when how a search's cost is counted, or ASHA's schedule, changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .config import TrainConfig
from .sampling import keep_probabilities
from .search_space import _draw

REDUCTION = 3  # ASHA keeps the best third at each rung


def grace_epochs(max_epochs: int) -> int:
    """Epochs every trial trains before ASHA may stop it: a third of the longest schedule.

    Earlier is not a measurement: after one epoch every trained model is at or below the popularity
    ranking, and one that barely moved (a learning rate 100x too small) sits exactly on it, so it
    wins. Measured on the bundled sample's validation split, dim 16, 8 epochs (recall@10 per epoch):
    popularity 0.168; alpha 0.025: 0.167, 0.167, 0.172, 0.178, …, 0.194; alpha 0.05: 0.170, 0.195,
    0.212, …, 0.222."""
    return max(1, math.ceil(max_epochs / REDUCTION))


def trials_for_budget(budget: float, max_epochs: int, grace: int | None = None, reduction: int = REDUCTION) -> int:
    """How many trials ASHA can start within `budget` full trainings of `max_epochs` epochs: each trial
    runs `grace` epochs, and a share 1/reduction^k of them goes on to the k-th rung (grace·reduction^k)."""
    grace = grace or grace_epochs(max_epochs)
    rungs = [grace]
    while rungs[-1] * reduction < max_epochs:
        rungs.append(rungs[-1] * reduction)
    rungs.append(max_epochs)
    expected = sum((b - a) / reduction ** k for k, (a, b) in enumerate(zip([0, *rungs], rungs)) if b > a)
    return max(1, int(budget * max_epochs / expected))


def max_epochs_of(space: dict, base: TrainConfig) -> int:
    spec = space.get("epochs", base.epochs)
    if isinstance(spec, dict):
        (_, args), = spec.items()
        return int(max(args))
    return int(spec)


def rung_epochs(max_epochs: int) -> list[int]:
    """The epochs at which ASHA compares trials (its milestones: grace × 3^k below max_epochs, as
    ray.tune's _Bracket computes them); a trial is measured there and at its last epoch only."""
    grace = grace_epochs(max_epochs)
    count = int(np.log(max_epochs / grace) / np.log(REDUCTION) + 1)
    return [grace * REDUCTION ** k for k in range(count)]


def expected_measurements(trials: int, max_epochs: int) -> float:
    """Measurements of a search of `trials`: every trial at the first rung, a third of them at the next,
    …, and the survivors once more at the end."""
    below = [r for r in rung_epochs(max_epochs) if r < max_epochs]
    return sum(trials / REDUCTION ** k for k in range(len(below))) + trials / REDUCTION ** len(below)


# A trial's cost that plan's calibration does not see: Ray Tune starts its actor (a new Python process
# importing torch and this package), its placement group and its bookkeeping: the middle of what
# search.overhead_seconds_per_trial (the search's wall time less its trials' own clocks) gave over the five
# searches of benchmarks/quality.py --tune 8 (docs/benchmarks.md).
TRIAL_OVERHEAD_SECONDS = 3.5


# Row-wise Adagrad's cost per token against SGD's, on the same corpus, engine and machine
# (docs/benchmarks.md): the accumulator column is read, updated and pushed.
ADAGRAD_COST = 1.9
COST_DRAWS = 256  # draws of the space that average a trial's cost per epoch


def asha_epochs(epochs: int, max_epochs: int) -> float:
    """A trial's expected epochs under ASHA when it asks for `epochs`: it trains up to the first rung,
    goes on to the next with a chance of 1/REDUCTION per rung passed, and ends at its own last epoch."""
    rungs = [*(r for r in rung_epochs(max_epochs) if r < max_epochs), max_epochs]
    return sum((min(epochs, b) - min(epochs, a)) / REDUCTION ** k
               for k, (a, b) in enumerate(zip([0, *rungs], rungs)))


def trial_epoch_cost(space: dict, config: TrainConfig, counts: np.ndarray, max_epochs: int,
                     seed: int = 0) -> tuple[float, float]:
    """(a trial's expected epochs under ASHA, its mean cost per epoch against `config`'s), over draws
    of `space`, the cost weighted by each draw's epochs: a space whose epochs range from a quarter to
    twice the base's trains far fewer epochs than every trial at the longest would (measured on the
    skewed set: 257 s of training where budget × the longest schedule said 746 s)."""
    rng = np.random.default_rng(seed)
    draws = [_draw(space, rng) for _ in range(COST_DRAWS)]
    epochs = np.array([asha_epochs(int(d.get("epochs", max_epochs)), max_epochs) for d in draws])
    work = _work(config, counts)
    costs = np.array([work(d) for d in draws]) / work({})
    return float(epochs.mean()), float((epochs * costs).sum() / max(epochs.sum(), 1e-12))


def trial_cost(space: dict, config: TrainConfig, counts: np.ndarray, seed: int = 0) -> float:
    """A trial's mean cost per epoch against `config`'s (the calibrated run), over draws of `space`.

    A token's work is its training pairs (1, and about `window` more with dbow_words) times the
    output rows each pair updates (1 + negative) times their width (dim), for the tokens that
    subsampling keeps (`sample`, computed on the corpus's counts), times ADAGRAD_COST with Adagrad.
    The calibration times the base settings only; a space that draws negative 20 or Adagrad costs
    twice that per epoch."""
    rng = np.random.default_rng(seed)
    work = _work(config, counts)
    draws = [work(_draw(space, rng)) for _ in range(COST_DRAWS)]
    return float(np.mean(draws)) / work({})


def _work(config: TrainConfig, counts: np.ndarray) -> Callable[[dict], float]:
    """A token's work under `config` with some settings changed (trial_cost's measure)."""
    kept: dict[float, float] = {}

    def work(settings: dict) -> float:
        c = {**{k: getattr(config, k) for k in _COST_FIELDS}, **{k: v for k, v in settings.items() if k in _COST_FIELDS}}
        if c["sample"] not in kept:
            kept[c["sample"]] = float((counts * keep_probabilities(counts, c["sample"])).sum() / max(counts.sum(), 1))
        pairs = 1 + (c["window"] if c["dbow_words"] and c["mode"] == "dbow" else 0)
        return (kept[c["sample"]] * pairs * max(1 + c["negative"], 1) * max(c["dim"], 1)
                * (ADAGRAD_COST if c["optimizer"] == "adagrad" else 1.0))

    return work


_COST_FIELDS = ("sample", "window", "dbow_words", "mode", "negative", "dim", "optimizer")
