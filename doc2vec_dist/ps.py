"""ParameterServer: one shard's slice of every table, in this process's memory (numpy, not the object store).

Changes when how a server holds, serves or saves its rows changes.

Runs as a threaded Ray actor (the trainer wraps it), so pulls and pushes from many workers are served
at once; numpy releases the GIL while it copies (client.LocalServer runs it in a process without Ray).
Pushes carry deltas (new − pulled) and are added under the table's lock, so two workers updating the
same row both land; a worker that is the only writer of its rows pushes the rows themselves, written
over. Pulls take no lock: a pull racing a push may see part of it, which only adds the staleness that
asynchronous SGD already has.

With a 16-bit --dtype (precision.py) the tables hold 16 bits a value, and pulls and pushes carry them:
a pushed delta is widened, added to the widened rows and narrowed again, rounded stochastically from
a Generator keyed by the run's seed, the shard, the table and that table's count of applied pushes
(applied under its lock, so the same order of pushes gives the same rows); pushed rows (a sole
writer's) were narrowed by the worker and are written as they come.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Protocol

import numpy as np

from . import checkpoint, modeldir, precision
from .logs import quiet_exit_in_finalizers
from .sharding import global_rows, rows_on_shard

if TYPE_CHECKING:
    from .config import TableSpec, TrainConfig
    from .corpus import Corpus


class NonFiniteUpdate(RuntimeError):
    pass


def refuse_non_finite(rows: np.ndarray, push: str, who: str = "") -> None:
    """Raise NonFiniteUpdate for the push named `push` (by `who`) where `rows` hold NaN or ±inf. One
    pass, no temporary: they make the sum non-finite (so would a sum past 3e38, which only a diverged
    run produces). The servers check every push; a block handed from worker to worker is checked by
    its holder (client.ParameterClient.hand_over), as no server sees it."""
    if not np.isfinite(rows.sum()):
        raise NonFiniteUpdate(f"{who}non-finite values in the push of {push}; the learning rate is probably too high")


def ray_node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray): actors report it, and the driver watches
    whether Ray has marked it dead (run.Run._watch). Ray is not imported here for it: code that
    runs the servers and workers in one process (client.LocalServer) does without Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def load_compiled() -> None:
    """Load numba's machinery for compiled code now, in the background, while an actor starts: the
    first compiled call in a process takes ~0.3 s however small (later ones, from numba's cache, a few
    ms), and a server's first push, or a worker's first block, paid it in the middle of training; on
    the block schedule every worker waited for it at the end of its first round."""
    from .row_kernels import compiled

    threading.Thread(target=compiled, name="load-compiled", daemon=True).start()


# A float32 server whose every table slice is smaller than this (elements) applies pushes with numpy, and
# never imports numba (row_kernels, ~0.14 s of CPU) nor makes its first compiled call (~0.4 s: numba's
# registries, its BLAS check importing scipy.linalg), which every server of a small job, a tune trial or a
# test paid; np.add.at's adds (~9 ns an element against the compiled ~0.7) cost at most ~2.4 ms a push of
# a whole slice. The same float32 sums in the same order either way (np.add.at adds a repeated id's rows one
# by one): the bits do not depend on the path.
NUMPY_TABLE_ELEMENTS = 1 << 18


def _add_rows_numpy(table: np.ndarray, ids: np.ndarray, delta: np.ndarray) -> None:
    """row_kernels.add_rows with numpy (NUMPY_TABLE_ELEMENTS)."""
    np.add.at(table, ids, delta)


def _set_rows_numpy(table: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """row_kernels.set_rows with numpy (NUMPY_TABLE_ELEMENTS); its ids are distinct (an assign writes a worker's own rows)."""
    table[ids] = rows


def compiled_adds(shard: int, num_shards: int, tables: dict[str, TableSpec]) -> bool:
    """Whether a server applies pushes with numba's compiled adds: a 16-bit table (precision's rounding is
    compiled), or a table slice of NUMPY_TABLE_ELEMENTS or more."""
    if any(spec.dtype != "float32" for spec in tables.values()):
        return True
    return any(rows_on_shard(shard, num_shards, spec.rows) * precision.stored_width("float32", spec.dim, spec.state)
               >= NUMPY_TABLE_ELEMENTS for spec in tables.values())


def _fill_uniform(out: np.ndarray, rng: np.random.Generator, block: int = 1 << 16, dtype: str = "float32") -> None:
    """out[:] = U[-1, 1) / dim, a block of rows at a time: a 10M-row table needs no second copy. A
    16-bit table takes the same draws rounded to nearest."""
    dim = out.shape[1]
    for at in range(0, len(out), block):
        rows = rng.random((min(block, len(out) - at), dim), dtype=np.float32)
        rows *= 2.0
        rows -= 1.0
        rows /= dim
        out[at:at + len(rows)] = precision.narrow(rows, dtype)


class WarmRows(Protocol):
    """What a server reads of an earlier model over its fresh rows (train --init-from): warmstart.WarmStart
    is one. Named here by what the server uses, so the server knows nothing of how a warm start is decided."""

    model: str
    version: int
    rows: dict[str, int]  # per table, how many of its first rows come from the earlier model
    dropped: dict[str, np.ndarray]  # per table, the earlier model's rows left out (compact.py)


class ParameterServer:
    def __init__(self, shard: int, num_shards: int, tables: dict[str, TableSpec], seed: int, model: str | None = None,
                 warm: WarmRows | None = None, journal: str | None = None, rounding: str = "stochastic",
                 restore: tuple[int, int] | None = None):
        """tables: name → its TableSpec (global row count, dim, init, optimiser state columns).

        init "uniform" is gensim 4's initialisation of input vectors, U[-1, 1) / dim
        (keyedvectors.prep_vectors); "zeros" is its initialisation of the output weights (syn1neg). The
        spec's state columns follow the vector (row-wise Adagrad's accumulator), start at zero and are
        kept with the row.

        If `model` has a committed checkpoint (LATEST), the rows and their optimiser state are loaded
        from it instead: this is how a resumed run starts, and how a server that Ray restarts after
        a crash comes back (Ray re-runs __init__). The checkpoint may have been written by any number
        of servers; this one takes the rows that are its own under the current count.

        Otherwise, with `warm` (train --init-from), each table's first warm.rows[name] rows are read
        over the fresh ones from that earlier model's checkpoint (warmstart.py): a known key keeps its
        id in a refreshed corpus, so its row here is its row there (less the rows the refresh dropped
        before it, warm.dropped: compact.py).

        restore: (v, L) for a run resumed from version v while LATEST named L (a damaged L passed over, or
        --resume-from): v is loaded while LATEST still names L, and LATEST once the run has committed.

        journal: a directory where every push is also written down, one JSON line per table pushed
        to (its label, the table, the global rows): how the tests see who wrote which rows when.

        The tables are held in their spec's dtype (precision.stored: float32, float16, or bfloat16's
        bits), the optimiser state float32 within the row; a checkpoint or warm start of another dtype
        is narrowed (to nearest) or widened as it is read. rounding: "stochastic" or "nearest", how an
        applied delta is narrowed in a 16-bit table.
        """
        quiet_exit_in_finalizers()  # Ray's SIGTERM when this server is removed: no traceback on the console
        self.compiled = compiled_adds(shard, num_shards, tables)  # else numpy's adds, and no numba in this process
        self._add, self._set = _add_rows_numpy, _set_rows_numpy
        if self.compiled:
            from .row_kernels import add_rows, set_rows

            load_compiled()
            self._add, self._set = add_rows, set_rows
        self.shard, self.num_shards = shard, num_shards
        self.node = ray_node_id()
        self.tables: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}  # global row count of each table
        self.dims: dict[str, int] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.dtype = next(iter(tables.values())).dtype if tables else "float32"  # every table has the run's
        self.seed, self.rounding = seed, rounding
        self.applied: dict[str, int] = {}  # pushes of deltas applied to each table: its rounding's key
        self.restored_version: int | None = None
        manifest = None
        version = modeldir.latest_version(model) if model is not None else None
        if restore is not None and version == restore[1]:
            version = restore[0]  # resumed from an older version, and nothing committed since
        if version is not None:
            _, manifest = modeldir.load_manifest(model, version=version)
            self.restored_version = int(manifest["version"])
        for i, (name, spec) in enumerate(sorted(tables.items())):
            n = rows_on_shard(shard, num_shards, spec.rows)
            if manifest is not None:
                table = self._restore(model, manifest, spec, n)
            else:
                table = self._zeros(spec, n)
                if spec.init == "uniform":
                    _fill_uniform(table[:, :spec.dim], np.random.default_rng([seed, i, shard]), dtype=self.dtype)
                if warm is not None and name in warm.rows:
                    # the old rows of this shard: global rows r ≡ shard (mod S) below the old row count,
                    # which are this slice's first local rows (row r sits at r // S)
                    known = rows_on_shard(shard, num_shards, warm.rows[name])
                    modeldir.read_shard(warm.model, name, shard, num_shards, version=warm.version,
                                        out=table[:known], dtype=self.dtype, dropped=warm.dropped.get(name))
            self.tables[name] = table
            self.rows[name] = spec.rows
            self.dims[name] = spec.dim
            self.locks[name] = threading.Lock()
            self.applied[name] = 0
        self.table_index = {name: i for i, name in enumerate(sorted(self.tables))}
        self.pushes = 0
        self.apply_seconds = 0.0  # time spent applying pushes (under the tables' locks)
        self.pull_seconds = 0.0   # ... and gathering pulls
        self.journal = None
        if journal:
            os.makedirs(journal, exist_ok=True)
            self.journal = open(os.path.join(journal, f"ps{shard}-{os.getpid()}.jsonl"), "a")  # noqa: SIM115
    def _zeros(self, spec: TableSpec, n: int) -> np.ndarray:
        """An empty slice of `n` rows of a table, as this server holds it: the run's dtype, the optimiser
        state float32 within the row (precision.stored_width)."""
        return np.zeros((n, precision.stored_width(self.dtype, spec.dim, spec.state)), dtype=precision.stored(self.dtype))

    def _restore(self, model: str, manifest: dict, spec: TableSpec, n: int) -> np.ndarray:
        saved = manifest["tables"].get(spec.name)
        if saved is None or saved["rows"] != spec.rows or saved["dim"] != spec.dim:
            have = "absent" if saved is None else f"{saved['rows']} × {saved['dim']}"
            raise ValueError(f"{model}: checkpoint v{manifest['version']} table {spec.name!r} is {have}; this run "
                             f"needs {spec.rows} × {spec.dim}")
        table = self._zeros(spec, n)
        modeldir.read_shard(model, spec.name, self.shard, self.num_shards, version=int(manifest["version"]),
                            out=table, dtype=self.dtype)
        return table

    def info(self) -> dict:
        """This process and where its rows came from: a pid that changes means Ray restarted it; the
        node it runs on."""
        return {"pid": os.getpid(), "node": self.node, "restored_version": self.restored_version, "pushes": self.pushes,
                "apply_seconds": self.apply_seconds, "pull_seconds": self.pull_seconds}

    def pull(self, request: dict[str, np.ndarray]) -> np.ndarray:
        """Rows for each table in request order, stacked into one contiguous [n, width] array of the
        tables' stored type (precision.py: the worker widens them)."""
        t0 = time.perf_counter()
        total = sum(len(ids) for ids in request.values())
        dim = next(iter(self.tables.values())).shape[1]  # every table has the same width
        out = np.empty((total, dim), dtype=precision.stored(self.dtype))
        at = 0
        for name, ids in request.items():
            np.take(self.tables[name], ids, axis=0, out=out[at:at + len(ids)])
            at += len(ids)
        self.pull_seconds += time.perf_counter() - t0
        return out

    def push(self, request: dict[str, np.ndarray], delta: np.ndarray, step: str = "", assign: bool = False) -> int:
        """Add delta rows (stacked in request order, as pull returns them) to the tables, in place; with
        assign, write them over the rows instead (from a worker that is the only writer of those rows:
        their new values, no delta to compute, and a retried call lands the same).

        A non-finite delta is refused before anything is applied.

        In a 16-bit table, `delta` is of its stored type (precision.py); a delta is widened and added
        to the widened rows, which are narrowed back (_add_narrowed).
        """
        wide = delta
        if self.dtype != "float32":
            dim = next(iter(self.dims.values()))
            wide = precision.widen_rows(delta, self.dtype, dim)
        refuse_non_finite(wide, step, f"shard {self.shard}: ")
        at = 0
        t0 = time.perf_counter()
        for name, ids in request.items():
            ids = np.asarray(ids, dtype=np.int64)
            with self.locks[name]:
                if self.dtype == "float32":
                    (self._set if assign else self._add)(self.tables[name], ids, delta[at:at + len(ids)])
                elif assign:
                    self.tables[name][ids] = delta[at:at + len(ids)]
                elif len(ids):
                    self._add_narrowed(name, ids, wide[at:at + len(ids)])
            at += len(ids)
            if self.journal is not None and len(ids):
                rows = ids * self.num_shards + self.shard
                self.journal.write(json.dumps({"label": step, "table": name, "rows": rows.tolist()}) + "\n")
                self.journal.flush()
        self.apply_seconds += time.perf_counter() - t0
        self.pushes += 1
        return self.pushes

    def _add_narrowed(self, name: str, ids: np.ndarray, delta: np.ndarray) -> None:
        """table[ids] += delta in a 16-bit table, under its lock: the rows widened, the float32 delta
        added (a repeated id's deltas summed first), the vectors narrowed back, stochastically from the
        table's next Generator (precision.rng_of; 0 sets the servers' keys apart from the workers' 1)
        unless --rounding nearest; the optimiser state is float32 and added exactly."""
        table, dim = self.tables[name], self.dims[name]
        if len(np.unique(ids)) != len(ids):
            ids, inverse = np.unique(ids, return_inverse=True)
            summed = np.zeros((len(ids), delta.shape[1]), dtype=np.float32)
            np.add.at(summed, inverse, delta)
            delta = summed
        rng = None
        if self.rounding == "stochastic":
            rng = precision.rng_of(self.seed, 0, self.shard, self.table_index[name], self.applied[name])
        precision.add_rows(table, ids, delta, self.dtype, dim, rng)
        self.applied[name] += 1

    def save(self, model: str, version: int) -> dict[str, dict]:
        """Write this shard's slice of every table into version `version` of the model; entries per table."""
        entries = {}
        for name, table in self.tables.items():
            with self.locks[name]:
                ids = global_rows(self.shard, self.num_shards, self.rows[name])
                dim = self.dims[name]
                entries[name] = checkpoint.write_slice(model, version, name, self.shard, self.num_shards,
                                                       ids, table[:, :dim],
                                                       state=precision.state_view(table, self.dtype, dim),
                                                       dtype=self.dtype)
        return entries

    def memory(self) -> dict:
        return {name: int(t.nbytes) for name, t in self.tables.items()}


def table_specs(config: TrainConfig, corpus: Corpus) -> dict[str, TableSpec]:
    """The tables a run trains, by name: `words` only when something trains it (dbow_words or PV-DM).

    Inputs start uniform in [-1, 1)/dim, outputs at zero (gensim's initialisation); with adagrad each
    row carries one accumulator column (TrainConfig.table).
    """
    tables = [config.table("docs", corpus.num_docs)]
    if config.trains_words():
        tables.append(config.table("words", corpus.vocab_size))
    tables.append(config.table("words_out", corpus.vocab_size, init="zeros"))
    return {t.name: t for t in tables}
