"""How far a run from an earlier model (train --init-from, the daily refresh) moved the vectors it took.

Changes when how drift is measured or said.

The caller measures it once training has returned (the cli's `train`, the pipeline's jobs), not the trainer:
it reads both models through model.Model, which the engine does not import. `drift` compares the two
models on the keys they share: cosine(old, new) of a sample of rows per table, whose median and
percentiles say whether downstream users of the vectors (indexes, models trained on them) can keep them.
`after_training` adds it to the run's summary, in the model's config.json too, and logs its line.
"""

from __future__ import annotations

import logging

import numpy as np

from . import compact, storage
from .errors import UserError
from .model import Model
from .scoring import unit_rows
from .warmstart import KEY_TABLE

log = logging.getLogger(__name__)

DRIFT_SAMPLE = 20_000  # rows per table whose cosine is measured (every row when fewer): medians to 3 decimals, in 0.5 s


def after_training(summary: dict, init_from: str | None, out: str) -> dict | None:
    """The drift of the model `out` from `init_from`, the model it started from: added to `summary` (the
    trainer's) and to the summary in out/config.json, and logged in one line. None where there is no
    earlier model, or either model is on object storage (reading both would download them)."""
    if not init_from or storage.is_uri(out) or storage.is_uri(init_from):
        return None
    summary["drift"] = drift(init_from, out)
    log.info(drift_line(summary["drift"]))
    store = storage.Store.of(out)
    written = store.read_json("config.json")
    written["summary"] = {**(written.get("summary") or {}), "drift": summary["drift"]}
    store.write_json("config.json", written)
    return summary["drift"]


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
    before, after = Model(old), Model(new)
    try:  # rows the refresh dropped (compact.py): a kept row's id in the new model is its old id less those before it
        dropped = compact.read_dropped(after.dir.manifest.get("corpus") or after.dir.corpus_path())
    except UserError:
        dropped = {}
    found = {}
    for table in ("docs", "words", "words_out"):
        gone = dropped.get(KEY_TABLE[table], np.zeros(0, np.int64))
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
