"""Row → (shard, local row) routing and the compact layout of a batch."""

import numpy as np

from doc2vec_dist.sharding import Routing, global_rows, local_row, rows_on_shard, shard_of


def test_every_row_has_one_home_and_round_trips():
    n, s = 103, 4

    assert sum(rows_on_shard(k, s, n) for k in range(s)) == n
    for k in range(s):
        g = global_rows(k, s, n)
        assert (shard_of(g, s) == k).all()
        np.testing.assert_array_equal(local_row(g, s), np.arange(len(g)))


def test_hot_rows_spread_evenly():
    # ids are by descending frequency: a batch's 1,000 hottest rows go to every server in equal shares,
    # and each server's local rows are the ones it holds
    r = Routing.of(np.arange(1000), 8)
    assert np.diff(r.bounds).max() - np.diff(r.bounds).min() <= 1
    for s in range(8):
        held = global_rows(s, 8, 10_000)
        np.testing.assert_array_equal(held[r.local[s]], np.arange(s, 1000, 8))


def test_routing_groups_by_shard_and_positions_point_back():
    uniq = np.array([0, 1, 2, 5, 6, 7, 11])
    r = Routing.of(uniq, 3)
    np.testing.assert_array_equal(r.bounds, [0, 2, 4, 7])  # shard 0: 0, 6; shard 1: 1, 7; shard 2: 2, 5, 11
    layout = np.concatenate([r.local[s] * 3 + s for s in range(3)])
    np.testing.assert_array_equal(layout[r.position], uniq)
