"""A run that starts from an earlier model (train --init-from), and how far its vectors moved.

Changes when how a warm start maps or checks the earlier model's rows, or measures their drift.

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

`drift` compares the two models on the keys they share: cosine(old, new) of a sample of rows per
table, whose median and percentiles say whether downstream users of the vectors (indexes, models
trained on them) can keep them.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa

from . import compact
from .config import TableSpec
from .errors import UserError
from .modeldir import KEY_TABLES, ModelDir

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
DRIFT_SAMPLE = 20_000  # rows per table whose cosine is measured (every row when fewer): medians to 3 decimals, in 0.5 s


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
    return {name: getattr(saved, name) for name in TAKEN}


def warm_start(model: str, out: str, corpus_path: str, tables: dict[str, TableSpec]) -> WarmStart:
    """Check that `model` can start a run of `tables` on the corpus, and say which rows it gives.

    Refused in one line: `out` is the model itself; a table's dim differs; a key table of the corpus
    does not begin with the model's keys in their order (the corpus was not prepared with --base)."""
    if os.path.abspath(model) == os.path.abspath(out):
        raise UserError(f"{out}: --out is the --init-from model; a refresh writes a new model and never changes "
                        "the old one")
    old = ModelDir(model)
    by_key_table = compact.read_dropped(corpus_path)  # rows the refresh dropped: keyed by key table (docs, words)
    dropped = {name: by_key_table[_KEY_TABLE[name]] for name in tables if _KEY_TABLE[name] in by_key_table}
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
_KEY_TABLE = {"docs": "docs", "words": "words", "words_out": "words"}


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


def drift(old: str, new: str, sample: int = DRIFT_SAMPLE, seed: int = 0) -> dict:
    """cosine(old, new) over the keys both models have, per table both have: median, 5th and 95th
    percentile and the share below 0.5, from a seeded sample of at most `sample` rows (ids are kept by
    a refresh, so the shared keys are the old model's rows)."""
    found = {}
    for table, (rows, cosine) in drift_cosines(old, new, sample, seed).items():
        found[table] = {"rows": rows, "measured": len(cosine),
                        "median": float(np.median(cosine)), "p5": float(np.percentile(cosine, 5)),
                        "p95": float(np.percentile(cosine, 95)), "below_0.5": float((cosine < 0.5).mean())}
    return found


def drift_cosines(old: str, new: str, sample: int = DRIFT_SAMPLE, seed: int = 0) -> dict[str, tuple[int, np.ndarray]]:
    """Per table both models have: (the rows they share, cosine(old, new) of a seeded sample of at most
    `sample` of them), rows never trained in either (all zero: words_out's) left out; what `drift`
    summarises and the report draws."""
    from .model import Model
    from .scoring import unit_rows

    before, after = Model(old), Model(new)
    try:  # rows the refresh dropped (compact.py): a kept row's id in the new model is its old id less those before it
        dropped = compact.read_dropped(after.dir.manifest.get("corpus") or after.dir.corpus_path())
    except UserError:
        dropped = {}
    found = {}
    for table in ("docs", "words", "words_out"):
        gone = dropped.get(_KEY_TABLE[table], np.zeros(0, np.int64))
        try:
            rows = min(before.dir.spec(table)["rows"] - len(gone), after.dir.spec(table)["rows"])
        except UserError:
            continue
        ids = np.arange(rows) if rows <= sample else np.sort(np.random.default_rng(seed).choice(rows, sample,
                                                                                               replace=False))
        a, b = unit_rows(before.gather(table, compact.old_ids(ids, gone))), unit_rows(after.gather(table, ids))
        live = (np.abs(a).sum(1) > 0) & (np.abs(b).sum(1) > 0)  # words_out rows never trained stay zero
        cosine = (a[live] * b[live]).sum(1)
        if len(cosine):
            found[table] = (int(rows), cosine)
    return found


def drift_line(found: dict) -> str:
    """How far the known keys' vectors moved, in one line."""
    names = {"docs": "users", "words": "URLs (input)", "words_out": "URLs"}
    return "moved since the --init-from model: " + "; ".join(
        f"{names[t]} cosine(old, new) median {d['median']:.3f}, p5 {d['p5']:.3f}, p95 {d['p95']:.3f} "
        f"({d['measured']:,} of {d['rows']:,} known)" for t, d in found.items())
