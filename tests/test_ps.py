"""ParameterServer: initialisation, pull layout, and pushes from many callers at once on a real Ray."""

import numpy as np
import pytest

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
