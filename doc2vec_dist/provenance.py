"""Which model a set of vectors came from, and the checks that keep two models' vectors apart.

Changes when what an index, an export or inferred vectors record of their model changes, or when
the rule for which artefacts may be used together changes.

Every model has an id: a random one written into the manifest of its first checkpoint (by `train`,
`baseline`, `train --init-from`) and carried into every later version (a resumed run keeps it). A
model trained with --init-from lists the ids it descends from (`derived_from`, its parent first).
Vectors made from a model record where they came from as a `source`:

    {"model": path, "model_id": id, "version": N, "table": "docs", "derived_from": [ids]}

in an index's params.json (with "vectors": the Parquet an index was built from, if any) and in the
schema metadata of the Parquet that export and infer write (key `doc2vec_dist.source`), whose
(key, vector) table `key_vector_table` makes.

Two models' vectors live in two embedding spaces: a cosine across them is a number with no meaning.
`check` compares a recorded source with the model it is used with: another model is refused (one
line naming both); an older version of the same model, or a model of the same lineage (one trained
--init-from the other), is said in a warning line. Models, indexes and files from before ids were
recorded carry none: then nothing can be checked, and a note says so.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import outputs
from .errors import UserError
from .modeldir import ModelDir, vectors_array

log = logging.getLogger(__name__)

PARQUET_KEY = b"doc2vec_dist.source"


def of_model(found: ModelDir, table: str, shown: str | None = None) -> dict:
    """The source of `table` of the model `found` at its version; `shown` names the model (default: its
    absolute path; a remote model's URI rather than its local copy)."""
    manifest = found.manifest
    return {"model": shown or os.path.abspath(found.path), "model_id": manifest.get("model_id"),
            "version": found.version, "table": table, "derived_from": list(manifest.get("derived_from") or [])}


def parquet_metadata(source: dict | None) -> dict[bytes, bytes]:
    """Schema metadata recording `source` in a Parquet file (nothing for None)."""
    return {PARQUET_KEY: json.dumps(source).encode()} if source else {}


def key_vector_table(keys: pa.Array, vectors: np.ndarray, source: dict | None = None,
                     missing: np.ndarray | None = None) -> pa.Table:
    """(key, vector) rows; the schema carries the marker of a vectors file (outputs), so a file written
    from it is one that export and infer may later replace, and the model they came from (`source`,
    of_model), so an index or a query made from them can be checked against a model.
    `missing` (bool per row) marks keys without a vector (users infer could not place): their vector is null."""
    column = vectors_array(vectors)
    if missing is not None and missing.any():
        column = pa.FixedSizeListArray.from_arrays(column.values, column.type.list_size, mask=pa.array(missing))
    return pa.table({"key": keys.cast(pa.string()), "vector": column},
                    metadata={**outputs.parquet_metadata("vectors"), **parquet_metadata(source)})


def of_parquet_schema(metadata: dict | None) -> dict | None:
    """The source recorded in a Parquet schema's metadata, or None (another tool's file, or one written
    before sources were recorded, or a record that does not parse)."""
    raw = (metadata or {}).get(PARQUET_KEY)
    if not raw:
        return None
    try:
        source = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return source if isinstance(source, dict) else None


def of_parquet(path: str) -> dict | None:
    """The source recorded in a key/vector Parquet file (None if it records none)."""
    try:
        return of_parquet_schema(pq.read_schema(path).metadata)
    except (OSError, ValueError):
        return None


def describe(source: dict | None) -> str:
    """'the model at PATH (id 1a2b3c4d, v3, table docs)', or what is known of it."""
    if not source or not source.get("model"):
        return "no recorded model"
    details = [f"id {source['model_id'][:8]}" if source.get("model_id") else "no id"]
    if source.get("version") is not None:
        details.append(f"v{source['version']}")
    if source.get("table"):
        details.append(f"table {source['table']}")
    return f"the model at {source['model']} ({', '.join(details)})"


def check(recorded: dict | None, current: dict, what: str, *, update: bool = False, redo: str = "",
          remake: str = "") -> str:
    """Whether vectors recorded as coming from `recorded` may be used with `current` (the source of the
    model they are used with now); `what` names them in messages (an index, a Parquet file).

    Returns how they relate: "same" (the same model and version), "older" / "newer" (the same model,
    another version), "ancestor" / "descendant" (one was trained --init-from the other, directly or
    through others), "unknown" (one of them records no id: a note says so, unless neither does). Another model is a
    UserError naming both, ending in `remake` (how to make them from this model), and so is another
    table. A warning line says when the recorded vectors are not the model's latest, ending in `redo`
    (how to bring them up to date). With `update` (index
    --update: `current` is the new source, `recorded` the old index), an older index or one of an
    ancestor is what an update is for: an information line says what it updates from and to, and only
    going back to older vectors is a warning.
    """
    recorded = recorded or {}
    model, table, theirs = current.get("model") or current.get("vectors"), current.get("table"), recorded.get("table")
    if table and theirs and table != theirs:
        raise UserError(f"{what} holds vectors of table {theirs} of {describe(recorded)}, not of table {table}; "
                        f"give --table {theirs}, or vectors of table {table}")
    mine, ours = current.get("model_id"), recorded.get("model_id")
    if not mine and not ours:  # neither side could ever be checked (files of another tool, say): nothing to say
        return "unknown"
    if not mine or not ours:
        log.info(f"note: {model if not mine else what} records no model id (made before doc2vec-dist recorded "
                 f"them, or by another tool): cannot check that {what} belongs to {model}")
        return "unknown"
    if mine == ours:
        version, at = recorded.get("version") or 0, current.get("version") or 0
        relation = "same" if version == at else "older" if version < at else "newer"
    elif ours in (current.get("derived_from") or []):
        relation = "ancestor"
    elif mine in (recorded.get("derived_from") or []):
        relation = "descendant"
    else:
        fix = "build a new index (index without --update)" if update else f"use vectors of {model}" + (
            f" ({remake})" if remake else "")
        raise UserError(f"{what} was made from {describe(recorded)}, another model than {describe(current)}; "
                        f"their vectors live in two embedding spaces: {fix}")
    if update:
        if relation in ("newer", "descendant"):
            log.warning(f"warning: {what} was made from {describe(recorded)}, newer than {describe(current)}: "
                        "this update takes it back to older vectors")
        elif relation != "same":
            log.info(f"{what} was made from {describe(recorded)}; updating it to {describe(current)}")
    elif relation != "same":
        how = {"older": f"an older version of {model}, whose latest is v{current.get('version')}",
               "newer": f"a newer version of {model} than v{current.get('version')}",
               "ancestor": f"an earlier model that {model} was trained from (--init-from)",
               "descendant": f"a later model trained from {model} (--init-from)"}[relation]
        log.warning(f"warning: {what} was made from {describe(recorded)}, {how}: its vectors are not the model's "
                    "own" + (f"; {redo}" if redo else ""))
    return relation
