"""Tests for doc2vec_dist.synthetic: the files, their determinism, and the structure planted in them."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.errors import UserError
from doc2vec_dist.synthetic import generate

USERS, URLS, COMMUNITIES, MEAN_EVENTS = 3000, 2000, 8, 30.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One medium data set in three files, read back as numpy arrays for the statistical tests."""
    out = str(tmp_path_factory.mktemp("synthetic") / "out")
    summary = generate(out, USERS, URLS, seed=11, communities=COMMUNITIES, events_per_user=MEAN_EVENTS,
                       users_per_file=1000, progress=False)
    events = pq.read_table(os.path.join(out, "events"))
    users = pq.read_table(os.path.join(out, "truth", "users.parquet"))
    urls = pq.read_table(os.path.join(out, "truth", "urls.parquet"))

    user_ids = users["user_id"].to_numpy(zero_copy_only=False)
    user_of = pc.index_in(events["user_id"], value_set=users["user_id"]).to_numpy(zero_copy_only=False)
    url_of = pc.index_in(events["url"], value_set=urls["url"]).to_numpy(zero_copy_only=False)
    return {
        "out": out, "summary": summary, "events": events, "users": users, "urls": urls,
        "user_ids": user_ids,
        "user": user_of,                                   # truth row of each event's user
        "url_rank": url_of,                                # truth row = rank, of each event's URL
        "ts": events["ts"].cast(pa.int64()).to_numpy(),
        "user_community": users["community"].to_numpy(),
        "url_community": urls["community"].to_numpy(),
    }


def _files(root: str) -> dict[str, bytes]:
    found = {}
    for d, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(d, name), "rb") as f:
                found[os.path.relpath(os.path.join(d, name), root)] = f.read()
    return found


# --- layout, schema, determinism ----------------------------------------------------------------------

def test_summary_and_layout(data):
    s = data["summary"]
    assert {k: s[k] for k in ("users", "urls", "files", "communities")} == {
        "users": USERS, "urls": URLS, "files": 3, "communities": COMMUNITIES}
    assert s["events"] == data["events"].num_rows
    assert s["seconds"] > 0
    out = data["out"]
    assert sorted(os.listdir(out)) == ["events", "generate.json", "truth"]
    assert sorted(os.listdir(os.path.join(out, "events"))) == [f"part-{i:05d}.parquet" for i in range(3)]
    assert sorted(os.listdir(os.path.join(out, "truth"))) == ["urls.parquet", "users.parquet"]
    assert not [p for p in os.listdir(os.path.dirname(out)) if ".partial" in p]  # staging renamed away
    with open(os.path.join(out, "generate.json")) as f:
        info = json.load(f)
    assert info["parameters"] == {"users": USERS, "urls": URLS, "seed": 11, "communities": COMMUNITIES,
                                  "events_per_user": MEAN_EVENTS, "general_fraction": 0.3, "zipf_s": 1.0,
                                  "hub_share": 0.0, "users_per_file": 1000}
    assert info["summary"]["events"] == s["events"]


def test_schema(data):
    assert data["events"].schema == pa.schema(
        [("user_id", pa.string()), ("url", pa.string()), ("ts", pa.timestamp("ms", tz="UTC"))])
    assert data["users"].schema == pa.schema(
        [("user_id", pa.string()), ("community", pa.int32()), ("mix", pa.list_(pa.float32())),
         ("events", pa.int32())])
    assert data["urls"].schema == pa.schema(
        [("url", pa.string()), ("community", pa.int32()), ("rank", pa.int64()), ("prob", pa.float64())])
    # Each events file holds its users' events and nothing else; the truth has one row group per file.
    assert pq.ParquetFile(os.path.join(data["out"], "truth", "users.parquet")).metadata.num_row_groups == 3
    for i in range(3):
        part = pq.read_table(os.path.join(data["out"], "events", f"part-{i:05d}.parquet"))
        got = set(part["user_id"].to_pylist())
        assert got == set(data["user_ids"][i * 1000:(i + 1) * 1000])


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    kw = {"communities": 4, "users_per_file": 100, "progress": False}
    generate(str(tmp_path / "a"), 300, 300, seed=5, **kw)
    generate(str(tmp_path / "b"), 300, 300, seed=5, **kw)
    generate(str(tmp_path / "c"), 300, 300, seed=6, **kw)
    a, b, c = (_files(str(tmp_path / x)) for x in "abc")
    assert len([p for p in a if p.startswith("events")]) == 3
    for path in a:
        if path != "generate.json":  # it records the run time
            assert a[path] == b[path], path
    info_a, info_b = json.loads(a["generate.json"]), json.loads(b["generate.json"])
    info_a["summary"].pop("seconds"), info_b["summary"].pop("seconds")
    assert info_a == info_b
    for path in ("events/part-00000.parquet", "truth/urls.parquet", "truth/users.parquet"):
        assert a[path] != c[path], path
    ev_a = pq.read_table(str(tmp_path / "a" / "events"))
    ev_c = pq.read_table(str(tmp_path / "c" / "events"))
    assert not set(ev_a["user_id"].to_pylist()) & set(ev_c["user_id"].to_pylist())


# --- users and events ---------------------------------------------------------------------------------

def test_events_per_user(data):
    counts = np.bincount(data["user"], minlength=USERS)
    assert counts.min() >= 1
    assert abs(counts.mean() - MEAN_EVENTS) < 3.0           # standard error is about 0.7
    assert np.median(counts) < 0.8 * counts.mean()          # skewed ...
    assert counts.max() > 6 * MEAN_EVENTS                   # ... with a heavy tail
    np.testing.assert_array_equal(counts, data["users"]["events"].to_numpy())


def test_every_user_has_exactly_one_event_when_mean_is_one(tmp_path):
    generate(str(tmp_path / "o"), 500, 100, seed=1, events_per_user=1.0, progress=False)
    ev = pq.read_table(str(tmp_path / "o" / "events"))
    assert ev.num_rows == 500 and len(set(ev["user_id"].to_pylist())) == 500


def test_timestamps_distinct_within_window_and_rows_interleaved(data):
    user, ts = data["user"], data["ts"]
    start = np.datetime64("2024-03-01T00:00:00", "ms").astype(np.int64)
    assert ts.min() >= start and ts.max() < start + 30 * 86_400_000
    order = np.lexsort((ts, user))
    same_user = user[order][1:] == user[order][:-1]
    assert np.all(np.diff(ts[order])[same_user] > 0)       # strictly increasing within each user
    span = np.zeros(USERS)                                   # a user's events spread over the window
    np.maximum.at(span, user, ts - start)
    assert np.median(span[np.bincount(user) >= 10]) > 20 * 86_400_000
    # Shuffled within a file: consecutive rows rarely belong to the same user.
    assert np.mean(user[1:] == user[:-1]) < 0.01


def test_user_ids_opaque_and_unique(data):
    ids = data["user_ids"]
    assert len(set(ids)) == USERS
    assert all(re.fullmatch(r"u[0-9a-f]{12}", u) for u in ids)
    assert len({u[1] for u in ids}) == 16                   # not sequential: first digit varies
    assert np.all(data["user"] >= 0)                         # every event's user is in the truth


# --- URLs ---------------------------------------------------------------------------------------------

def test_urls_unique_and_realistic(data):
    urls = data["urls"]["url"].to_pylist()
    assert len(set(urls)) == URLS
    pattern = r"https://[a-z.]*[a-z]+\.(com|org|net|io|co\.uk|de|fr|info|co|app)/([a-z/]+/[a-z]+-[a-z]+-\d+)?"
    assert all(re.fullmatch(pattern, u) for u in urls)
    assert np.all(data["url_rank"] >= 0)                    # every event's URL is in the truth
    np.testing.assert_array_equal(data["urls"]["rank"].to_numpy(), np.arange(URLS))
    prob = data["urls"]["prob"].to_numpy()
    assert np.all(np.diff(prob) <= 0) and abs(prob.sum() - 1) < 1e-9


def test_url_popularity_is_zipf_like(data):
    counts = np.bincount(data["url_rank"], minlength=URLS).astype(float)
    ranks = np.arange(5, 300)
    slope = np.polyfit(np.log(ranks + 1), np.log(counts[ranks]), 1)[0]
    assert -1.3 < slope < -0.7, slope                       # zipf_s = 1
    assert counts[0] > 100 * np.median(counts)
    # The truth's expected shares match what was drawn.
    expected = data["urls"]["prob"].to_numpy() * counts.sum()
    np.testing.assert_allclose(counts[:20], expected[:20], rtol=0.15)


def test_communities_balanced_with_popular_and_rare_urls(data):
    community = data["url_community"]
    sizes = np.bincount(community, minlength=COMMUNITIES)
    assert sizes.max() - sizes.min() <= 1
    for c in range(COMMUNITIES):
        ranks = np.flatnonzero(community == c)
        assert ranks.min() < 3 * COMMUNITIES and ranks.max() > URLS - 3 * COMMUNITIES


# --- planted structure and truth ----------------------------------------------------------------------

def test_planted_structure(data):
    user_c = data["user_community"][data["user"]]
    on_own = data["url_community"][data["url_rank"]] == user_c
    for c in range(COMMUNITIES):
        frac = on_own[user_c == c].mean()
        # Expected ~0.6 (0.7 of events topical x ~0.8 mixture mass, plus the general draws): far above
        # 1/8, yet far from 1 because of the general noise and the secondary communities.
        assert 0.4 < frac < 0.85, (c, frac)
    assert 0.5 < on_own.mean() < 0.7
    assert len(np.unique(data["user_community"])) == COMMUNITIES


def test_truth_users_consistent(data):
    users = data["users"]
    mix = np.stack(users["mix"].to_numpy(zero_copy_only=False))
    assert mix.shape == (USERS, COMMUNITIES) and np.all(mix >= 0)
    np.testing.assert_allclose(mix.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(mix.argmax(axis=1), data["user_community"])
    assert np.mean(np.sort(mix, axis=1)[:, -2:].sum(axis=1)) > 0.85   # sparse: mass on 1-2 communities
    assert set(data["user_ids"]) == set(data["events"]["user_id"].to_pylist())


# --- errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, name", [
    ({"users": 0}, "users"), ({"urls": 0}, "urls"), ({"communities": 0}, "communities"),
    ({"communities": 20}, "communities"), ({"events_per_user": 0.5}, "events_per_user"),
    ({"general_fraction": 1.5}, "general_fraction"), ({"zipf_s": -1.0}, "zipf_s"),
    ({"users_per_file": 0}, "users_per_file"), ({"seed": -1}, "seed"), ({"users": 2.5}, "users"),
    ({"events_per_user": "30"}, "events_per_user"),
])
def test_bad_parameters_name_the_parameter(tmp_path, kw, name):
    args = {"users": 10, "urls": 10, **kw}
    with pytest.raises(UserError, match=name):
        generate(str(tmp_path / "x"), args.pop("users"), args.pop("urls"), progress=False, **args)
    assert os.listdir(tmp_path) == []


def test_a_bad_flag_of_generate_is_named_as_the_flag(tmp_path, capsys):
    """The command's errors named the library's keyword ('hub_share=1.5'), not the flag the user gave."""
    from doc2vec_dist.cli import main

    assert main(["generate", "--users", "10", "--urls", "10", "--out", str(tmp_path / "g"), "--hub-share", "1.5",
                 "--no-progress"]) == 2
    assert "generate: --hub-share 1.5 (hub_share): must be between 0 and 1" in capsys.readouterr().err


def test_refuses_non_empty_output_and_accepts_empty_dir(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="full"):
        generate(str(tmp_path / "full"), 10, 10, progress=False)
    assert os.listdir(tmp_path / "full") == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    assert generate(str(tmp_path / "empty"), 10, 10, progress=False)["users"] == 10
    assert sorted(os.listdir(tmp_path)) == ["empty", "full"]


def test_generate_json_counts_the_sites_its_urls_are_on(tmp_path):
    """20 sites over 8 communities: each community takes 20 // 8 = 2, and generate.json said 20 where the URLs
    were on 16."""
    generate(str(tmp_path / "g"), 300, 200, seed=1, progress=False)
    with open(tmp_path / "g" / "generate.json") as fh:
        recorded = json.load(fh)["model"]["sites"]
    hosts = {url.split("/")[2] for url in pq.read_table(tmp_path / "g" / "truth" / "urls.parquet").column("url").to_pylist()}
    assert recorded == len(hosts) == 16


def test_events_dir_recognises_a_generate_output_by_its_generate_json(tmp_path):
    from doc2vec_dist.synthetic import events_dir

    out = str(tmp_path / "gen")
    generate(out, 20, 30, seed=2, progress=False)
    assert events_dir(out) == os.path.join(out, "events")
    # anything else is no generate output: no generate.json, or someone's own file of that name
    assert events_dir(os.path.join(out, "events")) is None
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "events").mkdir()
    (tmp_path / "mine" / "generate.json").write_text('{"model": "mine"}')
    assert events_dir(str(tmp_path / "mine")) is None


def test_hub_share_puts_the_most_popular_url_in_that_share_of_users(tmp_path):
    """Skewed data like a real catalogue (issue 14): one URL in ~80% of short documents; without the
    option the data set is byte for byte what it was."""
    kw = {"seed": 3, "communities": 4, "events_per_user": 5.0, "users_per_file": 1000, "progress": False}
    generate(str(tmp_path / "hub"), 2000, 500, hub_share=0.8, **kw)
    generate(str(tmp_path / "plain"), 2000, 500, **kw)
    generate(str(tmp_path / "plain0"), 2000, 500, hub_share=0.0, **kw)
    ev = pq.read_table(str(tmp_path / "hub" / "events"))
    top = pq.read_table(str(tmp_path / "hub" / "truth" / "urls.parquet"))["url"][0].as_py()  # sorted by rank
    with_top = set(ev.filter(pc.equal(ev["url"], top))["user_id"].to_pylist())
    plain = pq.read_table(str(tmp_path / "plain" / "events"))
    plain_top = set(plain.filter(pc.equal(plain["url"], top))["user_id"].to_pylist())
    natural = len(plain_top) / 2000  # users who visit the top URL anyway
    assert natural < 0.4
    assert abs(len(with_top) / 2000 - (0.8 + 0.2 * natural)) < 0.04
    assert 4.5 < ev.num_rows / 2000 - 0.8 < 5.5  # the hub adds one event to its visitors
    # truth's prob is each URL's expected share of all events, the hub's visits counted (it said 0.07 of the top
    # URL where the events gave it 0.11): the top URL's and the others' as the events measure them
    truth = pq.read_table(str(tmp_path / "hub" / "truth" / "urls.parquet"))
    share = pc.sum(pc.equal(ev["url"], top)).as_py() / ev.num_rows
    assert abs(truth["prob"][0].as_py() - share) < 0.01 and abs(pc.sum(truth["prob"]).as_py() - 1) < 1e-9
    counts = dict(zip(*ev.group_by("url").aggregate([("url", "count")]).to_pydict().values()))
    rest = truth.slice(1, 20).to_pydict()
    measured = np.array([counts.get(u, 0) / ev.num_rows for u in rest["url"]])
    assert abs(measured.sum() / np.sum(rest["prob"]) - 1) < 0.05
    a, b = _files(str(tmp_path / "plain")), _files(str(tmp_path / "plain0"))
    assert all(a[p] == b[p] for p in a if p.startswith(("events", "truth")))
    assert json.loads(a["generate.json"])["parameters"]["hub_share"] == 0.0


def test_churn_users_come_and_go_and_the_active_population_stays_level(tmp_path):
    """--churn-per-week 0.1 over 60 days: about a tenth of the active users leave each week, arrivals keep
    the active population level, and each user's events lie within its own active span."""
    out = str(tmp_path / "churn")
    generate(out, 3000, 200, seed=3, events_per_user=10, days=60, churn_per_week=0.1, progress=False)
    truth = pq.read_table(os.path.join(out, "truth", "users.parquet"))
    start = pc.cast(truth["active_from"], pa.int64()).to_numpy()
    until = pc.cast(truth["active_until"], pa.int64()).to_numpy()
    day = 86_400_000
    first = start.min()
    active = [int(((start <= first + d * day) & (until > first + d * day)).sum()) for d in (0, 20, 40, 59)]
    assert max(active) < 1.25 * min(active), active
    weekly = ((start == first) & (until <= first + 7 * day)).sum() / (start == first).sum()
    assert 0.07 < weekly < 0.13, weekly
    events = pq.read_table(os.path.join(out, "events"))
    ts = pc.cast(events["ts"], pa.int64()).to_numpy()
    at = {u: i for i, u in enumerate(truth["user_id"].to_pylist())}
    row = np.array([at[u] for u in events["user_id"].to_pylist()])
    assert ((ts >= start[row]) & (ts < until[row])).all()
