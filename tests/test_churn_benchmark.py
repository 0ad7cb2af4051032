"""benchmarks/churn.py's pieces that decide what is measured: the days it splits the events into, who is
active when, and the held-out pairs (new URLs of the day after the last refresh, no model trains on them)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from conftest import load_benchmark

from doc2vec_dist.synthetic import _WINDOW_START_MS, generate

DAY_MS = 86_400_000


def test_days_active_users_and_heldout_pairs(tmp_path):
    churn = load_benchmark("churn")
    out = str(tmp_path / "gen")
    generate(out, 400, 100, seed=2, events_per_user=20, days=12, churn_per_week=0.1, progress=False)
    events = pq.read_table(os.path.join(out, "events"))
    truth = pq.read_table(os.path.join(out, "truth", "users.parquet"))
    files = churn.split_days(events, _WINDOW_START_MS, 10, 2, str(tmp_path))
    assert [os.path.basename(f) for f in files] == ["base.parquet", "day-01.parquet", "day-02.parquet"]
    assert sum(pq.read_metadata(f).num_rows for f in files) == len(events)
    last = pc.cast(pq.read_table(files[-1])["ts"], pa.int64()).to_numpy()
    assert (last >= _WINDOW_START_MS + 11 * DAY_MS).all()
    active = churn.active_at(truth, _WINDOW_START_MS + 12 * DAY_MS - 1)
    assert 0 < len(active) < len(truth)
    pairs = pq.read_table(churn.heldout_pairs(files[-1], files[:-1], active, str(tmp_path)))
    assert pc.all(pc.is_in(pairs["key"], value_set=active)).as_py()
    earlier = {(u, v) for f in files[:-1] for u, v in zip(*pq.read_table(f, columns=["user_id", "url"]).to_pydict()
                                                          .values(), strict=True)}
    found = set(zip(pairs["key"].to_pylist(), pairs["token"].to_pylist(), strict=True))
    assert found and not found & earlier and len(found) == len(pairs)
