"""Typed configuration: every field carries its default and one line of help.

The command line and the YAML files use the same names (`--min-alpha` on the command line is
`min_alpha` in YAML). The command line builds its flags from these dataclasses, so a field added
here is a flag and a YAML key at once. Precedence: defaults < YAML file < flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import UserError


def _f(default: Any, help: str, choices: tuple | None = None, flag: bool = True):
    """A dataclass field with its help text (and allowed values) kept as metadata."""
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag})


@dataclass
class PrepareConfig:
    """How raw events become a corpus (see corpus.prepare)."""

    format: str = _f("events", "input format: events rows, one list per document, or plain text lines",
                     ("events", "lists", "text"))
    doc_col: str = _f("user_id", "column holding the document key (the user)")
    token_col: str = _f("url", "column holding the token (the URL), or the list of tokens with --format lists")
    time_col: str | None = _f(None, "column to order each user's events by (optional)")
    min_count: int = _f(1, "drop tokens seen fewer times than this")
    max_vocab: int | None = _f(None, "keep at most this many most frequent tokens")
    holdout: float = _f(0.0, "fraction of each user's distinct URLs hidden for evaluation")
    holdout_out: str | None = _f(None, "Parquet file that receives the hidden (key, token) pairs")


@dataclass
class TrainConfig:
    """The model and the engine that trains it."""

    dim: int = _f(100, "vector size")
    epochs: int = _f(10, "passes over the corpus")
    mode: str = _f("dbow", "training mode: PV-DBOW or PV-DM", ("dbow", "dm"))
    dbow_words: bool = _f(False, "also train word vectors with skip-gram (PV-DBOW only)")
    window: int = _f(5, "skip-gram / PV-DM context window")
    negative: int = _f(5, "negative samples per positive pair")
    sample: float = _f(1e-3, "frequent-token subsampling threshold (0 disables), gensim's definition")
    alpha: float = _f(0.025, "initial learning rate")
    min_alpha: float = _f(0.0001, "final learning rate; linear decay over all planned tokens")
    ns_exponent: float = _f(0.75, "exponent of the unigram distribution negatives are drawn from")
    shared_negatives: int = _f(0, "share this many negatives among all examples of a micro-batch, scored as "
                                  "one matrix product (for GPU workers; 0: each example draws its own)")
    optimizer: str = _f("sgd", "sgd (gensim's update) or row-wise adagrad", ("sgd", "adagrad"))
    num_ps: int = _f(2, "parameter-server actors; row r lives on server r %% num_ps")
    num_workers: int = _f(2, "training worker actors")
    cpus_per_worker: int = _f(1, "CPUs each worker reserves (and the torch threads it uses)")
    gpus_per_worker: float = _f(0, "GPUs each worker reserves; > 0 runs the math on CUDA")
    cache_rows: int = _f(0, "hottest words_out rows kept resident in each worker (on its GPU, if any) between "
                            "macro-batches: neither pulled nor pushed every step; synced every few batches")
    macro_batch: int = _f(65536, "tokens read per pull/compute/push cycle of a worker")
    micro_batch: int = _f(1024, "(doc, word) pairs per in-cache update step inside a macro-batch")
    max_inflight_pushes: int = _f(2, "pushes a worker may have outstanding before it waits")
    checkpoint_every: float = _f(600, "seconds between checkpoints, taken mid-epoch, plus one at each epoch end "
                                      "(0: only at the end of training)")
    keep_checkpoints: int = _f(2, "checkpoint versions kept on disk")
    max_restarts: int = _f(3, "times Ray restarts a crashed parameter server or worker before the run stops")
    seed: int = _f(1, "random seed for initialisation, subsampling and negatives")
    resume: bool = _f(False, "continue from the model directory's LATEST checkpoint")
    address: str | None = _f(None, "Ray address (default: RAY_ADDRESS, else a local Ray started here)")
    progress: bool = _f(True, "show a progress bar", flag=False)

    def validate(self) -> TrainConfig:
        checks = [
            (self.dim > 0, "dim must be > 0"),
            (self.epochs > 0, "epochs must be > 0"),
            (self.negative > 0, "negative must be > 0 (negative sampling is the only loss)"),
            (self.window > 0, "window must be > 0"),
            (self.shared_negatives >= 0, "shared_negatives must be >= 0"),
            (not (self.dbow_words and self.mode == "dm"),
             "dbow_words applies to --mode dbow only (PV-DM trains word vectors anyway)"),
            (self.sample >= 0, "sample must be >= 0"),
            (0 < self.alpha, "alpha must be > 0"),
            (0 <= self.min_alpha <= self.alpha, "min_alpha must lie in [0, alpha]"),
            (self.num_ps > 0, "num_ps must be > 0"),
            (self.num_workers > 0, "num_workers must be > 0"),
            (self.cpus_per_worker > 0, "cpus_per_worker must be > 0"),
            (self.gpus_per_worker >= 0, "gpus_per_worker must be >= 0"),
            (self.macro_batch > 0 and self.micro_batch > 0, "macro_batch and micro_batch must be > 0"),
            (self.max_inflight_pushes > 0, "max_inflight_pushes must be > 0"),
            (self.checkpoint_every >= 0, "checkpoint_every must be >= 0"),
            (self.keep_checkpoints > 0, "keep_checkpoints must be > 0"),
            (self.max_restarts >= 0, "max_restarts must be >= 0"),
            (self.cache_rows >= 0, "cache_rows must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(f"bad training config: {message}")
        for name in ("mode", "optimizer"):
            _check_choice(self, name)
        if self.cache_rows and (self.mode == "dm" or self.dbow_words):
            # with `words` trained too, the hot rows' deltas of several workers need the weighting of
            # worker._push_weights, which resident rows do not get yet: refuse rather than diverge
            raise UserError("--cache-rows applies to PV-DBOW without --dbow-words for now")
        return self


@dataclass
class JobConfig:
    """What jobs/train.py does around training: where data comes from and where results go."""

    input: list[str] = field(default_factory=list, metadata={
        "help": "raw inputs for prepare (files, dirs, globs)", "choices": None, "flag": False})
    corpus: str | None = _f(None, "prepared corpus directory (made from input if it does not exist)")
    out: str | None = _f(None, "model directory")
    exports: str | None = _f(None, "directory for Parquet exports and the faiss index (default: OUT/exports)")
    overwrite: bool = _f(False, "retrain into an existing model directory, replacing it")


def _check_choice(obj: Any, name: str) -> None:
    f = {f.name: f for f in dataclasses.fields(obj)}[name]
    choices = f.metadata.get("choices")
    if choices and getattr(obj, name) not in choices:
        raise UserError(f"bad value for {name}: {getattr(obj, name)!r} (choose from {', '.join(choices)})")


SECTIONS = (PrepareConfig, TrainConfig, JobConfig)


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def load_yaml(path: str) -> dict:
    """Read a flat YAML mapping of config keys; unknown keys are an error that names the file."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys at the top level")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    known = set().union(*(field_names(c) for c in SECTIONS))
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{path}: unknown config key(s): {', '.join(unknown)}")
    return data


def build(cls, *sources: dict):
    """Instantiate a config section from dicts in increasing precedence, keeping only its own keys.

    Values of None in a later source do not override (argparse leaves unset flags as None).
    """
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    return cls(**{k: coerce(k, v, types[k]) for k, v in explicit_values(cls, *sources).items()})


def explicit_values(cls, *sources: dict) -> dict:
    """The fields of `cls` that a source actually sets (flags left unset are None), later sources first."""
    names = field_names(cls)
    out: dict[str, Any] = {}
    for src in sources:
        out.update({k: v for k, v in src.items() if k in names and v is not None})
    return out


def coerce(name: str, value: Any, type_str: Any) -> Any:
    t = str(type_str)
    try:
        if t.startswith("int"):
            return int(value)
        if t.startswith("float"):
            return float(value)
        if t.startswith("bool"):
            if isinstance(value, str):
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if t.startswith("list") and isinstance(value, str):
            return [value]
    except (TypeError, ValueError):
        raise UserError(f"bad value for {name}: {value!r} ({t} expected)") from None
    return value


def to_dict(*configs) -> dict:
    out: dict[str, Any] = {}
    for c in configs:
        out.update(dataclasses.asdict(c))
    return out


def save_json(path: str, data: dict) -> None:
    """Write JSON atomically (temp file, then rename) so a reader never sees half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
