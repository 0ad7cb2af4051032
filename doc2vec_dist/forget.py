"""forget: erase users from a model and from every corpus, held-out file, export and index named with it.

Changes when what forgetting a user removes from the model, or the order of the whole, changes; what each
other place loses is forget_steps.py's, how one file is rewritten forget_files.py's, the forget list itself
(salted hashes, and who reads it) forgotten.py's, closing up a corpus's ids compact.py's.

    doc2vec-dist forget --model M (--keys FILE | --key K …) [--corpus C] [--exports DIR] [--index I]
                        [--retrain-epochs N [--retrain-out DIR]]

What each place loses:
  model    a new version without the users' rows (the docs table's ids closed up in order, as
           compact.py closes up a corpus's; the words tables copied byte for byte), committed, then
           every other version deleted: the older ones hold the users, and keeping them would undo the
           erasure. docs.arrow loses their keys; config.json and eval-*.json any value that is one of
           them; MODEL/forget.arrow gains their salted hashes. MODEL/exports, when there, as --exports.
  corpus   shards, docs.arrow, vocab.arrow (counts of what stays), changed.arrow without them, ids closed
           up the same way (so the model and its corpus still agree, and tomorrow's refresh joins), its
           corpus.json's examples without their keys, and its forget.arrow gains the hashes; the
           held-out file it names (corpus.json's holdout_out) loses their pairs.
  exports  every (key, vector) Parquet file or directory, held-out or neighbours Parquet, npy matrix
           with its keys, word2vec text and JSON report (jobs/train.py's job.json) under DIR loses the
           rows and values that are their keys; an index directory under DIR is treated as --index.
           A rewritten Parquet file's statistics are computed anew over the rows that stay.
  index    flat: the rows removed (ids after them move down, as `index --update` does); ivfpq: removed
           from their lists, their keys null and their re-rank vectors zero; hnsw: their keys null
           (dead ids, kept out of results) and their vectors in the graph zero.

Nothing is changed before everything is checked: the model and each named place is read, and every
file that would change is probed for writing; one that cannot be (a read-only export) is refused in one
line naming it. Then the changes run, each file replaced whole (a temporary name, then a rename), and
each file changed or removed is printed. Every step is keyed by the keys alone, so a forget that stops
midway (a crash, a full disk) is finished by running the same command again: what it did already holds
none of the keys and is left alone; a new model version that committed before its key file moved
(MODEL/docs.arrow.forget-pending, recorded by sha256 in the version's manifest) is finished first.

A key not in the model is reported, not an error (the person may never have been there), and its hash
joins the forget list all the same, so a later refresh never brings them in; keys of which none is in
the model are a warning (the wrong model?). The model's URL rows still carry what the forgotten users
taught them: docs/forget.md says so; --retrain-epochs N dilutes it (retrain: N epochs from the new
version on the corpus without them, into a new model, every other vector left as forget wrote it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import checkpoint, compact, forgotten, modeldir, storage
from .errors import UserError
from .forget_steps import Step, _corpus_steps, _exports_steps, _index_step, _is_index, _json_step, _probe
from .modeldir import ModelDir
from .read_formats import UTF8_BOM

log = logging.getLogger(__name__)

PENDING_KEYS = "docs.arrow.forget-pending"   # a new version's key file, until it replaces docs.arrow
SHOWN_UNKNOWN = 3                            # positions of unknown keys named in the report


# ---------------------------------------------------------------------------------------------------
# the keys asked for
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Keys:
    """The keys to forget, each once, in the order given, with where each was given (for messages that
    must not repeat a key: "line 3 of FILE")."""

    values: list[str]
    where: list[str]


def read_keys(path: str | None, given: list[str] | None, doc_col: str | None = None) -> Keys:
    """--keys FILE (a text file, a key per line, or Parquet with a 'key' column, or the corpus's user
    column) and --key K…, stripped of surrounding whitespace as prepare strips keys; one line for a file
    that cannot be read or holds none."""
    values, where = [], []
    if path is not None:
        if not os.path.isfile(path):
            raise UserError(f"{path}: {'is a directory' if os.path.isdir(path) else 'no such file'}; --keys takes a "
                            "file of keys (one per line, or Parquet with a 'key' column)")
        with open(path, "rb") as fh:
            head = fh.read(4)
        if head == b"PAR1":
            try:
                schema = pq.read_schema(path)
                column = next((c for c in ("key", doc_col) if c and c in schema.names), None)
                if column is None:
                    raise UserError(f"{path}: no 'key' column (columns: {', '.join(schema.names)}); --keys takes "
                                    "Parquet with the keys in a column 'key'")
                found = pq.read_table(path, columns=[column]).column(column).cast(pa.string()).to_pylist()
            except (OSError, pa.ArrowException) as exc:
                raise UserError(f"{path}: cannot read it as Parquet ({exc})") from None
            rows = [(k, f"row {i} of {path}") for i, k in enumerate(found)]
        elif head[:4] == b"ARRO":
            raise UserError(f"{path}: an Arrow file (a forget list?), not keys: --keys takes the keys themselves, a "
                            "text file with one per line or Parquet with a 'key' column")
        else:
            with open(path, "rb") as fh:  # a byte-order mark (Windows editors, Excel) is not part of the first key
                lines = fh.read().removeprefix(UTF8_BOM).split(b"\n")
            rows = []
            for i, raw in enumerate(lines):
                try:
                    rows.append((raw.decode("utf-8"), f"line {i + 1} of {path}"))
                except UnicodeDecodeError:
                    raise UserError(f"{path}: line {i + 1} is not valid UTF-8; give the keys as UTF-8 text") from None
        for key, at in rows:
            if key is not None and key.strip():
                values.append(key.strip())
                where.append(at)
        if not values:
            raise UserError(f"{path}: holds no keys; give one key per line")
    for key in given or []:
        if not key.strip():
            raise UserError("--key '': a key is not empty")
        values.append(key.strip())
        where.append(f"--key {key.strip()}")
    if not values:
        raise UserError("give the keys to forget: --keys FILE or --key K")
    first = {}
    for key, at in zip(values, where, strict=True):
        first.setdefault(key, at)
    return Keys(list(first), list(first.values()))


# ---------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------

def _finish_pending(model: str) -> list[str]:
    """A version forget committed before its key file moved into place: move it now. A pending key file that
    no committed version names (a forget stopped before its commit) is removed."""
    pending = os.path.join(model, PENDING_KEYS)
    if not os.path.exists(pending):
        return []
    wanted = (ModelDir(model).manifest.get("forget") or {}).get("keys_sha256")
    if wanted and wanted == storage.sha256_file(pending):
        os.replace(pending, os.path.join(model, "docs.arrow"))
        return [os.path.join(model, "docs.arrow")]
    os.remove(pending)
    return []


# manifest fields a version forget writes takes from the one it rewrites (the trainers' record of the run)
_CARRIED = ("epoch", "lr", "num_ps", "num_workers", "plan", "config", "corpus", "corpus_stats", "losses", "trainer")


def _write_version_without(model: str, found: ModelDir, ids: np.ndarray) -> list[str]:
    """A new version of the model without the docs rows `ids` (sorted), and its key file; then
    every other version deleted. Returns the files changed and removed."""
    version = checkpoint.next_version(model)
    vrel = os.path.join(model, "checkpoints", f"v{version}")
    tables, changed = {}, []
    pending = os.path.join(model, PENDING_KEYS)
    try:
        for table, spec in found.manifest["tables"].items():
            os.makedirs(os.path.join(vrel, table), exist_ok=True)
            if table != "docs":  # the URL tables keep every row: the same bytes
                for part in spec["parts"]:
                    shutil.copyfile(os.path.join(modeldir.version_dir(model, found.version), part["path"]),
                                    os.path.join(vrel, part["path"]))
                tables[table] = [dict(part) for part in spec["parts"]]
                continue
            tables[table] = _docs_parts(found, spec, ids, vrel)
        docs = pa.ipc.open_file(pa.memory_map(os.path.join(model, "docs.arrow"))).read_all()
        stays = np.ones(docs.num_rows, bool)
        stays[ids] = False
        kept = docs.filter(pa.array(stays))
        kept = kept.set_column(kept.schema.get_field_index("id"), "id",
                               pa.array(np.arange(kept.num_rows, dtype=np.int64)))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, docs.schema) as writer:
            writer.write_table(kept, max_chunksize=1 << 20)
        storage.write_local(pending, sink.getvalue().to_pybytes())
        stats = dict(found.manifest.get("corpus_stats") or {})
        if "num_docs" in stats:
            stats["num_docs"] = int(stats["num_docs"]) - len(ids)
        if "num_tokens" in stats and "length" in docs.column_names:  # the corpus forgotten beside it has as many
            gone = pc.sum(docs.column("length").take(pa.array(ids))).as_py() or 0
            stats["num_tokens"] = int(stats["num_tokens"]) - int(gone)
        extra = {k: found.manifest[k] for k in _CARRIED if found.manifest.get(k) is not None}
        extra.update(corpus_stats=stats, positions=None,
                     forget={"from_version": found.version, "users_removed": len(ids),
                             "keys_sha256": storage.sha256_file(pending)})
        dims = {name: spec["dim"] for name, spec in found.manifest["tables"].items()}
        dtype = found.manifest["tables"]["docs"].get("dtype", "float32")
        checkpoint.commit(model, version, tables, dims, extra, keep=1, dtype=dtype)  # keep=1: the rest are pruned
    except BaseException:
        if modeldir.latest_version(model) != version:  # not committed: nothing of it stays
            checkpoint.discard_version(model, version)
            with contextlib.suppress(OSError):
                os.remove(pending)
        raise  # committed (a failure while pruning): the key file waits for the next run (_finish_pending)
    os.replace(pending, os.path.join(model, "docs.arrow"))
    changed += [os.path.join(vrel, "manifest.json"), *(os.path.join(vrel, p["path"]) for t in tables.values()
                                                         for p in t), os.path.join(model, "LATEST"),
                os.path.join(model, "docs.arrow")]
    return changed


def _docs_parts(found: ModelDir, spec: dict, ids: np.ndarray, vrel: str) -> list[dict]:
    """The docs table without rows `ids`, the others closed up, in as many parts as before (row r in part
    r % T), each row's bytes as they were."""
    total = len(spec["parts"])
    paths = [os.path.join(vrel, "docs", modeldir.part_name(t, total)) for t in range(total)]
    writers, sinks, pending, rows = [None] * total, [None] * total, [[] for _ in range(total)], [0] * total
    schema = None

    def flush(t: int, force: bool = False) -> None:
        held = sum(b.num_rows for b in pending[t])
        if pending[t] and (force or held >= 65536):
            writers[t].write_table(pa.Table.from_batches(pending[t], schema).combine_chunks(), max_chunksize=65536)
            pending[t] = []

    try:
        for part in range(total):
            for batch in found.record_batches("docs", part):
                if schema is None:
                    schema = batch.schema
                    for t in range(total):
                        sinks[t] = pa.OSFile(paths[t], "wb")
                        writers[t] = pa.ipc.new_file(sinks[t], schema)
                column = batch.schema.get_field_index("id")
                new = compact.new_ids(batch.column(column).to_numpy(), ids)
                stays = new >= 0
                batch = batch.filter(pa.array(stays)).set_column(column, "id", pa.array(new[stays], pa.int64()))
                new = new[stays]
                for t in range(total):
                    mine = np.flatnonzero(new % total == t)
                    if len(mine):
                        pending[t].append(batch.take(pa.array(mine)))
                        rows[t] += len(mine)
                        flush(t)
        for t in range(total):
            if writers[t] is not None:
                flush(t, force=True)
                writers[t].close()
                sinks[t].close()
    except BaseException:
        for sink in sinks:
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink.close()
        raise
    return [{"path": f"docs/{modeldir.part_name(t, total)}", "rows": rows[t], "bytes": os.path.getsize(paths[t]),
             "sha256": storage.sha256_file(paths[t])} for t in range(total)]


def _other_versions(model: str, latest: int) -> list[str]:
    """Every version directory but LATEST's: what a model forget rewrote holds in its older versions."""
    root = os.path.join(model, "checkpoints")
    return sorted(os.path.join(root, n) for n in os.listdir(root) if n != f"v{latest}" and n.startswith("v")
                  and n[1:].isdigit())


# ---------------------------------------------------------------------------------------------------
# forget
# ---------------------------------------------------------------------------------------------------

def forget(model: str, keys: Keys, corpus: str | None = None, exports: str | None = None, index: str | None = None,
           say: Callable[[str], None] = print) -> dict:
    """Erase the users `keys` from the model and the corpus, exports and index given (see the module
    docstring); `say` gets a line for each file changed or removed. Returns what was done, counted."""
    if storage.is_uri(model):
        raise UserError(f"{model}: forget works on a local model directory (its versions are rewritten in place); "
                        "run it where the model's storage is mounted")
    model = os.path.abspath(model)
    found = ModelDir(model)  # not a model: one line naming it
    checkpoint.refuse_other_writer(model)
    for given, flag in ((corpus, "--corpus"), (exports, "--exports"), (index, "--index")):
        if given is not None and not os.path.isdir(given):
            raise UserError(f"{given}: {'no such directory' if not os.path.exists(given) else 'not a directory'}; "
                            f"{flag} takes a directory")
    drop = pa.array(keys.values, pa.string())
    with checkpoint.writing(model):
        for path in _finish_pending(model):
            say(f"changed {path}")
        found = ModelDir(model)
        if found.key_count("docs") != found.spec("docs")["rows"]:
            raise UserError(f"{model}: docs.arrow holds {found.key_count('docs'):,} keys and its v{found.version} "
                            f"{found.spec('docs')['rows']:,} user rows; the model is damaged (a key file replaced by "
                            "hand?), so forget cannot tell whose row is whose")
        before = found.version
        listed = forgotten.of_model(model, found.manifest)
        model_keys = found.keys("docs")
        at = pc.index_in(drop, value_set=model_keys)
        in_model = at.is_valid().to_numpy(zero_copy_only=False)
        ids = np.sort(at.filter(pa.array(in_model)).to_numpy().astype(np.int64))
        absent = np.flatnonzero(~in_model)
        already = listed.matches(drop.take(pa.array(absent))) if len(absent) else np.zeros(0, bool)
        after = checkpoint.next_version(model) if len(ids) else before
        new_list = forgotten.ForgetList(listed.hashes, listed.salt, list(listed.model_ids), listed.path)
        added = new_list.add(keys.values)
        if found.manifest.get("model_id") and found.manifest["model_id"] not in new_list.model_ids:
            new_list.model_ids.append(found.manifest["model_id"])
        steps: list[Step] = []
        if added or not os.path.exists(os.path.join(model, forgotten.FILE)):
            def write_list() -> list[str]:
                new_list.write(os.path.join(model, forgotten.FILE))
                return [os.path.join(model, forgotten.FILE)]
            steps.append(Step("the model's forget list", [os.path.join(model, forgotten.FILE)], write_list))
        if corpus is not None:
            steps += _corpus_steps(os.path.abspath(corpus), drop, new_list)
        left: list[str] = []
        for root in dict.fromkeys(os.path.abspath(r) for r in (exports, os.path.join(model, "exports")) if r):
            if os.path.isdir(root):
                steps += _exports_steps(os.path.abspath(root), drop, found.manifest, model, before, after, left)
        if index is not None:
            if not _is_index(index):
                from .index_update import read_index_params

                read_index_params(index)  # names what is there
            step = _index_step(os.path.abspath(index), drop, found.manifest, model, before, after)
            steps += [step] if step else []
        for name in sorted(os.listdir(model)):
            if name == "config.json" or (name.startswith("eval-") and name.endswith(".json")):
                step = _json_step(os.path.join(model, name), set(keys.values))
                steps += [step] if step else []
        older = _other_versions(model, before)
        if len(ids):
            # the version it replaces is pruned with the older ones (commit's keep=1): each is said
            replaced = sorted([*older, modeldir.version_dir(model, found.version)])
            steps.append(Step(f"the model {model} ({len(ids):,} users)", [os.path.join(model, "checkpoints"),
                                                                          os.path.join(model, "docs.arrow")],
                              lambda: _write_version_without(model, found, ids) + replaced))
        elif older and found.manifest.get("forget"):  # a forget stopped before pruning the versions it replaced
            def prune() -> list[str]:
                for path in older:
                    shutil.rmtree(path)
                return older
            steps.append(Step(f"older versions of {model}", [os.path.join(model, "checkpoints")], prune))
        steps = list({step.what: step for step in steps}.values())  # an index both under --exports and --index once
        for step in steps:  # every file that would change, probed before any changes
            _probe(step)
        changed = []
        for step in steps:
            for path in step.run():
                changed.append(path)
                say(f"{'removed' if not os.path.exists(path) else 'changed'} {path}")
    if left:
        log.warning(f"warning: {len(left)} file(s) under the exports are not files doc2vec-dist writes and were not "
                    f"looked at: {', '.join(left[:3])}" + (f" and {len(left) - 3} more" if len(left) > 3 else ""))
    unknown = absent[~already] if len(absent) else absent
    return {"model": model, "keys": len(keys.values), "removed": len(ids), "from_version": before,
            "to_version": after, "already_forgotten": int(already.sum()), "not_in_model": len(unknown),
            "not_in_model_where": [keys.where[i] for i in unknown[:SHOWN_UNKNOWN]], "changed": changed,
            "corpus": corpus}


def check_retrain(model: str, corpus: str | None, epochs: int | None, out: str | None) -> str | None:
    """Where `--retrain-epochs` writes (None: no retrain), refused in one line before anything is forgotten:
    it needs the model's --corpus (forgotten in the same run, so the two agree), N ≥ 1, and a new or empty
    --retrain-out (default MODEL-retrained, beside the model; a model there is never replaced)."""
    if epochs is None:
        if out is not None:
            raise UserError("--retrain-out is where --retrain-epochs N writes; give --retrain-epochs too")
        return None
    if epochs < 1:
        raise UserError(f"--retrain-epochs must be ≥ 1, not {epochs}")
    if corpus is None:
        raise UserError("--retrain-epochs trains on the model's corpus without the users: give it with --corpus, "
                        "which forget erases them from first")
    out = os.path.abspath(out if out is not None else os.path.abspath(model).rstrip(os.sep) + "-retrained")
    if out == os.path.abspath(model):
        raise UserError(f"{out}: --retrain-out is the model itself; the retrained model is a new one beside it")
    checkpoint.refuse_existing_model(out, overwrite=False)  # a model there: one line, before anything changes
    return out


def retrain(model: str, corpus: str, out: str, epochs: int, progress: bool = True) -> dict:
    """Train `epochs` epochs from the model's latest version (without the forgotten users) on the corpus
    without them, into the new model `out`: train --init-from the model, with its own settings. Every URL
    row then moves by what the remaining users alone teach, diluting what the forgotten ones taught
    (docs/forget.md); the new model takes the corpus's forget list."""
    from .trainer import train

    config = dataclasses.replace(ModelDir(model).config(), epochs=epochs, init_from=model, resume=False,
                                 resume_from=None, first_epoch="all", progress=progress)
    return train(corpus, out, config.validate())


def report(result: dict, say: Callable[[str], None] = print) -> None:
    """The summary after the changed files: what was forgotten, what was not found, and the URL rows' note."""
    model, n = result["model"], result["keys"]
    if result["removed"]:
        say(f"forgot {result['removed']:,} of {n:,} key(s) in {model}: v{result['from_version']} → "
            f"v{result['to_version']}, the only version kept")
    if result["already_forgotten"]:
        say(f"{result['already_forgotten']:,} key(s) were forgotten before (on the model's forget list); what still "
            "held them is above")
    missing = result["not_in_model"]
    if missing:
        where = ", ".join(result["not_in_model_where"]) + (" …" if missing > SHOWN_UNKNOWN else "")
        say(f"{missing:,} key(s) are not in the model ({where}): never there, perhaps; their hashes join the forget "
            "list all the same, so no refresh brings them in")
        if missing == n:
            log.warning(f"warning: none of the {n:,} key(s) is in {model}: is it the model of these users (the same "
                        "user column and id scheme)?")
    if not result["corpus"]:
        log.warning(f"warning: no --corpus: the corpus {model} was trained on may still hold these users, and a refresh "
                    "joining through it is refused until it agrees with the model: run forget with --corpus too")
    if result.get("retrained"):
        r = result["retrained"]
        say(f"retrained {r['epochs']} epoch(s) from v{result['to_version']} without them into {r['model']}: its URL "
            "rows diluted of what they taught; export and index that model to serve it")
    else:
        say("the model's URL rows still carry what these users taught them; to dilute that, train on from this "
            "version without them: run forget with --retrain-epochs N (or doc2vec-dist train --corpus CORPUS "
            f"--init-from {model} --out NEW_MODEL --epochs N) (docs/forget.md)")
