"""ParameterServer: initialisation, pull layout, and pushes from many callers at once on a real Ray."""

import numpy as np
import pytest

from doc2vec_dist import checkpoint, modeldir, precision
from doc2vec_dist.config import TableSpec
from doc2vec_dist.ps import NonFiniteUpdate, ParameterServer

TABLES = {"docs": TableSpec("docs", 101, 8, init="uniform"), "words_out": TableSpec("words_out", 50, 8, init="zeros")}


def test_initialisation_matches_gensim():
    ps = ParameterServer(1, 3, TABLES, seed=5)
    docs = ps.tables["docs"]
    assert docs.shape == (len(range(1, 101, 3)), 8)
    assert docs.min() >= -1 / 8 and docs.max() < 1 / 8  # U[-1, 1) / dim, gensim 4's prep_vectors
    assert docs.min() < -0.9 / 8 and docs.max() > 0.9 / 8
    assert not ps.tables["words_out"].any()  # syn1neg starts at zero


def test_pull_stacks_tables_in_request_order():
    ps = ParameterServer(0, 2, TABLES, seed=1)
    ps.tables["words_out"][:] = np.arange(25)[:, None]
    rows = ps.pull({"docs": np.array([3, 0]), "words_out": np.array([7, 2, 9])})
    assert rows.shape == (5, 8) and rows.flags.c_contiguous
    np.testing.assert_array_equal(rows[0], ps.tables["docs"][3])
    np.testing.assert_array_equal(rows[2:, 0], [7, 2, 9])


def test_non_finite_push_is_refused_before_anything_changes():
    ps = ParameterServer(0, 1, TABLES, seed=1)
    before = ps.tables["words_out"].copy()
    delta = np.ones((2, 8), np.float32)
    delta[1, 3] = np.nan
    with pytest.raises(NonFiniteUpdate, match="epoch 3 step 7"):
        ps.push({"words_out": np.array([0, 1])}, delta, "epoch 3 step 7")
    np.testing.assert_array_equal(ps.tables["words_out"], before)


def test_concurrent_pushes_to_the_same_rows_all_land(ray_cluster):
    ray = ray_cluster
    server = ray.remote(ParameterServer).options(num_cpus=0, max_concurrency=8).remote(0, 1, TABLES, 1)

    @ray.remote(num_cpus=0)
    def pusher(server, rounds):
        rows = np.arange(0, 50, dtype=np.int64)  # every row, every time: maximal contention
        refs = [server.push.remote({"words_out": rows}, np.ones((50, 8), np.float32)) for _ in range(rounds)]
        return len(ray.get(refs))

    assert sum(ray.get([pusher.remote(server, 50) for _ in range(6)])) == 300
    table = ray.get(server.pull.remote({"words_out": np.arange(50)}))
    np.testing.assert_array_equal(table, np.full((50, 8), 300.0, np.float32))
    ray.kill(server)


def test_a_push_adds_each_delta_row_to_its_row_repeated_ids_included():
    ps = ParameterServer(0, 1, TABLES, seed=1)
    before = ps.tables["docs"].copy()
    ids = np.array([5, 2, 5], dtype=np.int64)  # row 5 twice: both deltas land
    delta = np.arange(24, dtype=np.float32).reshape(3, 8)
    delta.flags.writeable = False  # as a push arrives from the object store
    ps.push({"docs": ids}, delta)
    expected = before.copy()
    expected[2] += delta[1]
    expected[5] += delta[0] + delta[2]
    np.testing.assert_allclose(ps.tables["docs"], expected, rtol=1e-6)


def test_an_assigning_push_writes_its_rows_over_and_refuses_non_finite_values():
    ps = ParameterServer(0, 1, TABLES, seed=1)
    before = ps.tables["docs"].copy()
    ids = np.array([7, 3], dtype=np.int64)
    rows = np.arange(16, dtype=np.float32).reshape(2, 8)
    for _ in range(2):  # a retried call lands the same
        ps.push({"docs": ids}, rows, "step 1", assign=True)
    np.testing.assert_array_equal(ps.tables["docs"][ids], rows)
    untouched = np.setdiff1d(np.arange(len(before)), ids)
    np.testing.assert_array_equal(ps.tables["docs"][untouched], before[untouched])
    bad = rows.copy()
    bad[1, 2] = np.nan
    with pytest.raises(NonFiniteUpdate, match="step 2"):
        ps.push({"docs": ids}, bad, "step 2", assign=True)
    np.testing.assert_array_equal(ps.tables["docs"][ids], rows)


# --- issue 29: tables held in 16 bits (--dtype) ------------------------------------------------------------

def _tables(dtype: str, state: int = 0) -> dict:
    return {name: TableSpec(name, spec.rows, spec.dim, state=state, init=spec.init, dtype=dtype)
            for name, spec in TABLES.items()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_server_holds_and_serves_half_the_bytes(dtype):
    wide, half = ParameterServer(0, 2, TABLES, seed=1), ParameterServer(0, 2, _tables(dtype), seed=1)
    assert half.tables["docs"].dtype == precision.stored(dtype)
    assert sum(half.memory().values()) * 2 == sum(wide.memory().values())
    request = {"docs": np.array([3, 0]), "words_out": np.array([7, 2, 9])}
    pulled = half.pull(request)
    assert pulled.dtype == precision.stored(dtype) and pulled.nbytes * 2 == wide.pull(request).nbytes
    # the same draws as float32's initialisation, rounded to nearest
    np.testing.assert_array_equal(pulled, precision.narrow(wide.pull(request), dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_push_adds_the_widened_delta_with_seeded_stochastic_rounding(dtype):
    ids = np.arange(0, 50, dtype=np.int64)
    start = np.ones((50, 8), np.float32)
    delta = np.full((50, 8), 2e-4, np.float32)  # below half a unit in the last place of 1.0 in both types

    def run(seed: int, rounding: str = "stochastic") -> np.ndarray:
        ps = ParameterServer(0, 1, _tables(dtype), seed=seed, rounding=rounding)
        ps.push({"words_out": ids}, precision.narrow(start, dtype), assign=True)
        for _ in range(40):
            ps.push({"words_out": ids}, precision.narrow(delta, dtype, precision.rng_of(seed)))
        return precision.widen(ps.tables["words_out"], dtype)

    stochastic = run(1)
    np.testing.assert_array_equal(stochastic, run(1))  # reproducible bit for bit
    assert not np.array_equal(stochastic, run(2))
    assert abs(stochastic.mean() - 1.008) < 0.002  # 40 updates of 2e-4 landed on average
    np.testing.assert_array_equal(run(1, "nearest"), start)  # to nearest, each one is lost


def test_a_16_bit_table_keeps_adagrads_accumulator_float32_and_saves_it_so(tmp_path):
    ps = ParameterServer(0, 1, _tables("bfloat16", state=1), seed=1)
    assert ps.tables["docs"].shape == (101, 8 + 2)  # the accumulator's 4 bytes in two columns
    ids = np.array([4, 9], dtype=np.int64)
    delta = np.zeros((2, 9), np.float32)
    delta[:, 8] = [1e-7, 123.456]  # a float32 accumulator's increments, kept to the last bit
    ps.push({"docs": ids}, precision.narrow_rows(delta, "bfloat16", 8, precision.rng_of(1)))
    pulled = precision.widen_rows(ps.pull({"docs": ids}), "bfloat16", 8)
    np.testing.assert_array_equal(pulled[:, 8], delta[:, 8])
    entries = ps.save(str(tmp_path / "m"), 1)
    checkpoint.commit(str(tmp_path / "m"), 1, {n: [e] for n, e in entries.items()}, {n: 8 for n in entries}, {},
                      keep=1, dtype="bfloat16")
    vectors, state = modeldir.read_shard(str(tmp_path / "m"), "docs", 0, 1)  # a float32 reader
    assert vectors.dtype == np.float32
    np.testing.assert_array_equal(vectors, precision.widen(ps.tables["docs"][:, :8], "bfloat16"))
    np.testing.assert_array_equal(state[ids, 0], delta[:, 8])


def test_a_16_bit_push_refuses_non_finite_values():
    ps = ParameterServer(0, 1, _tables("bfloat16"), seed=1)
    before = ps.tables["docs"].copy()
    bad = np.zeros((2, 8), np.float32)
    bad[1, 1] = np.inf
    with pytest.raises(NonFiniteUpdate, match="step 4"):
        ps.push({"docs": np.array([1, 2])}, precision.narrow(bad, "bfloat16"), "step 4")
    np.testing.assert_array_equal(ps.tables["docs"], before)


_LOADED_AT_START = """
import threading
from doc2vec_dist import ps, row_kernels
from doc2vec_dist.config import TableSpec
tables = {"docs": TableSpec("docs", ps.NUMPY_TABLE_ELEMENTS // 8, 8)}  # big enough for the compiled adds
real = ps.load_compiled
ps.load_compiled = lambda: None
ps.ParameterServer(0, 1, tables, seed=1)
print(len(row_kernels.compiled.signatures))  # a server that does not load it: nothing compiled loaded yet
ps.load_compiled = real
ps.ParameterServer(0, 1, tables, seed=1)
for thread in threading.enumerate():
    if thread.name == "load-compiled":
        thread.join()
print(len(row_kernels.compiled.signatures))
"""


def test_a_server_loads_numbas_machinery_as_it_starts_not_at_its_first_push():
    """The first compiled call of a process costs ~0.3 s; a server pays it while it starts (a compiled call
    in a thread of its own), so its first push does not. In a fresh process, where nothing compiled ran yet;
    what that saves the first push is benchmarks/small_costs.py's to measure, not a test's clock."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LOADED_AT_START], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"], out


_SMALL_WITHOUT_NUMBA = """
import json
import sys
import numpy as np
from doc2vec_dist import ps
from doc2vec_dist.config import TableSpec
tables = {"docs": TableSpec("docs", 1000, 8, state=1), "words_out": TableSpec("words_out", 500, 8, init="zeros", state=1)}
rng = np.random.default_rng(0)
ids = rng.integers(0, 250, 3000)  # repeated ids: their deltas add one by one
delta = rng.standard_normal((3000, 9)).astype(np.float32)
def pushed(server):
    server.push({"words_out": ids}, delta)
    server.push({"docs": np.arange(10), "words_out": np.arange(5)}, delta[:15], assign=True)
    return {name: server.pull({name: np.arange(len(table))}) for name, table in server.tables.items()}
small = ps.ParameterServer(0, 2, tables, seed=1)
got = pushed(small)
loaded = "numba" in sys.modules
from doc2vec_dist import row_kernels
ps.NUMPY_TABLE_ELEMENTS = 1  # every table big: the compiled adds
big = ps.ParameterServer(0, 2, tables, seed=1)
want = pushed(big)
print(json.dumps({"compiled": [small.compiled, big.compiled], "loaded": loaded,
                  "same": all(np.array_equal(got[n], want[n]) for n in want),
                  "changed": bool(np.abs(want["words_out"]).sum() > 0)}))
"""


def test_a_server_of_small_float32_tables_adds_with_numpy_never_loads_numba_and_keeps_the_bits():
    """Below ps.NUMPY_TABLE_ELEMENTS a float32 server applies pushes with numpy (np.add.at) and never imports
    numba (row_kernels: ~0.55 s of CPU a process with its first compiled call); the rows come out bit for bit
    as the compiled adds make them, a repeated id's deltas and an assign included. In a fresh process."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SMALL_WITHOUT_NUMBA], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"compiled": [False, True], "loaded": False, "same": True, "changed": True}


def test_a_16_bit_or_big_table_takes_the_compiled_adds():
    from doc2vec_dist import ps

    small = {"docs": TableSpec("docs", 1000, 8)}
    assert not ps.compiled_adds(0, 2, small)
    assert ps.compiled_adds(0, 2, {"docs": TableSpec("docs", 1000, 8, dtype="bfloat16")})
    # the slice a server holds counts: 2 * NUMPY_TABLE_ELEMENTS // 8 rows over 2 servers is one each at the line
    rows = 2 * ps.NUMPY_TABLE_ELEMENTS // 8
    assert ps.compiled_adds(0, 2, {"docs": TableSpec("docs", rows, 8)})
    assert not ps.compiled_adds(0, 2, {"docs": TableSpec("docs", rows - 2, 8)})
