"""A run that starts from an earlier model (train --init-from).

Changes when how a warm start maps or checks the earlier model's rows.

The daily refresh: `prepare NEW --base OLD` keeps every known user's and URL's id and appends the
new ones, so a known key's row r in the new run is row r of the old model; where the refresh dropped
rows of the base (users expired by --expire-days or forgotten, URLs no one visits any more: the
corpus's dropped.arrow, compact.py), the ids after them are closed up, and row r is the old model's
r-th row that stays. `warm_start` checks that
(the first rows of each key table are the old model's keys that stay, in order, and the sizes agree) and says
which rows each table takes from it; each parameter server then fills its own slice from the old
checkpoint with `modeldir.read_shard` (whatever number of servers wrote it) over its fresh
initialisation, so new rows start as in any run (inputs uniform, words_out zero). Optimiser state
(row-wise Adagrad's accumulator) comes along where the old checkpoint has it and the new run keeps
one. The old model is only read.

`taken_settings` is what such a run takes from the earlier model's config.json before any flag: the
settings its tables' shape and meaning depend on. train --init-from, jobs/train.py and jobs/refresh.py
all go through it, so the user repeats none of them and cannot contradict them.

How far the vectors moved is measured after training, by its caller: drift.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import pyarrow as pa

from . import compact
from .config import TableSpec
from .errors import UserError
from .modeldir import KEY_TABLES, ModelDir

log = logging.getLogger(__name__)

# The settings an earlier model's tables are made by: a run from it takes them, and a flag or YAML value
# that contradicts them is refused. dim: the width of every row; mode: what a user's vector and words_out
# are trained to do together (predict a URL from the user alone, or from the user and the URLs around it).
MODEL_SHAPE = ("dim", "mode")
# Taken too, but a run may change them: dbow_words on trains a `words` table the old model may lack, fresh
# (warm_start), and off leaves it out; the tables both runs share keep their shape and meaning. dtype and
# rounding: a daily refresh keeps the tables' type unless told otherwise (the servers widen or narrow the
# old rows to the run's). The other settings (window, negative, alpha, the engine's) are the run's own: its
# defaults, YAML and flags.
TAKEN = (*MODEL_SHAPE, "dbow_words", "dtype", "rounding")


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """What a new run takes from an earlier model: per table, its first `rows[name]` rows, once the rows
    `dropped[name]` (sorted: users a refresh expired or forgot, URLs it dropped) are left out of it."""

    model: str
    version: int
    rows: dict[str, int]
    lineage: tuple[str, ...] = ()  # the earlier model's id and those it descends from: the new model's derived_from
    dropped: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def taken_settings(model: str, given: list[tuple[str, dict]], flag: str = "--init-from") -> dict:
    """The settings a run from `model` takes from its config.json (TAKEN), the lowest-precedence source
    of the run's config.

    `given`: the run's other sources, each with how a line names it: a YAML file's path, or "" for the
    command line's flags (argparse's unset flags are None). A value of MODEL_SHAPE that differs from the
    model's is refused in one line naming the flag or key, its value and the model's; `flag` is how the
    command names the model (jobs/refresh.py's --base-model)."""
    saved = ModelDir(model).config()
    for where, values in given:
        for name in MODEL_SHAPE:
            value, theirs = values.get(name), getattr(saved, name)
            if value is None or value == theirs:
                continue
            given_as = f"{where}: {name}: {value}" if where else f"--{name.replace('_', '-')} {value}"
            leave = f"{name} out of {where}" if where else f"--{name.replace('_', '-')} out"
            raise UserError(f"{given_as} contradicts the {flag} model {model}, trained with {name} {theirs}: a run from "
                            f"an earlier model keeps its {' and '.join(MODEL_SHAPE)}; leave {leave}")
    taken = {name: getattr(saved, name) for name in TAKEN}
    # said where it is not what the run's defaults would be and nothing given sets it (a refresh's --base-model
    # takes every setting, as its docs say)
    defaults = {f.name: f.default for f in dataclasses.fields(type(saved))}
    said = [f"{name} {value}" for name, value in taken.items() if name not in MODEL_SHAPE and value != defaults[name]
            and all(values.get(name) is None for _, values in given)]
    if said and flag == "--init-from":
        log.info(f"from the --init-from model {model}, as its tables were trained: {', '.join(said)} (a flag, or a "
                 "--config key such as dbow_words: false, changes them)")
    return taken


def warm_start(model: str, out: str, corpus_path: str, tables: dict[str, TableSpec]) -> WarmStart:
    """Check that `model` can start a run of `tables` on the corpus, and say which rows it gives.

    Refused in one line: `out` is the model itself; a table's dim differs; a key table of the corpus
    does not begin with the model's keys in their order (the corpus was not prepared with --base)."""
    if os.path.abspath(model) == os.path.abspath(out):
        raise UserError(f"{out}: --out is the --init-from model; a refresh writes a new model and never changes "
                        "the old one")
    old = ModelDir(model)
    by_key_table = compact.read_dropped(corpus_path)  # rows the refresh dropped: keyed by key table (docs, words)
    dropped = {name: by_key_table[KEY_TABLE[name]] for name in tables if KEY_TABLE[name] in by_key_table}
    rows = {}
    for name, spec in tables.items():
        try:
            saved = old.spec(name)
        except UserError:
            continue  # a table the old run did not train (words, with dbow_words now): fresh
        if saved["dim"] != spec.dim:
            raise UserError(f"{model}: table {name} has dim {saved['dim']}, this run {spec.dim}; --init-from needs "
                            "the same --dim")
        kept = int(saved["rows"]) - len(dropped.get(name, ()))
        if kept > spec.rows:
            raise UserError(f"{model}: table {name} has {saved['rows']:,} rows, more than this corpus's "
                            f"{spec.rows:,}; prepare the corpus with --base {model}")
        rows[name] = kept
    for name, count in rows.items():
        _check_keys(old, name, corpus_path, count, model, dropped.get(name))
    lineage = tuple(filter(None, [old.manifest.get("model_id"), *(old.manifest.get("derived_from") or [])]))
    return WarmStart(os.path.abspath(model), old.version, rows, lineage,
                     {name: ids for name, ids in dropped.items() if name in rows})


# each table's key table in a corpus (compact.py's dropped.arrow names rows by it)
KEY_TABLE = {"docs": "docs", "words": "words", "words_out": "words"}


def _check_keys(old: ModelDir, table: str, corpus_path: str, rows: int, model: str,
                dropped: np.ndarray | None = None) -> None:
    """The corpus's first `rows` keys of the table are the model's, in order, less the rows `dropped`."""
    file, column = KEY_TABLES[table]
    theirs = old.keys(table)
    if dropped is not None and len(dropped):
        if int(dropped[-1]) >= len(theirs):
            raise UserError(f"{corpus_path}: its {compact.DROPPED_FILE} drops rows that {model} does not have; it "
                            f"was refreshed from another base: prepare it with --base {model}")
        stays = np.ones(len(theirs), bool)
        stays[dropped] = False
        theirs = theirs.filter(pa.array(stays))
    ours = pa.ipc.open_file(pa.memory_map(os.path.join(corpus_path, file))).read_all().column(column)
    if len(theirs) != rows or not ours.slice(0, rows).equals(pa.chunked_array([theirs])):
        what = "users" if table == "docs" else "URLs"
        raise UserError(f"{corpus_path}: its {what} do not keep the ids they have in {model}; prepare it with "
                        f"`doc2vec-dist prepare NEW_EVENTS --base {model} --out ...`")
