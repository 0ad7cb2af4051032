"""Time units (issue 26, item 1): every time column becomes epoch seconds, UTC, as it is read.

Epoch milliseconds used to be taken as seconds: `--window-days 2` on them kept a few minutes of
events, ISO and millisecond files together gave a time_range of seconds and milliseconds mixed, and
a refresh on top of such a base counted no known user with new events. Here the same events are
written in every kind of time a log comes in, and each must give the same corpus.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import read_formats
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import Corpus, CorpusError, iter_shard
from doc2vec_dist.prepare import prepare, time_unit_asked

DAY = 86_400
T0 = 1_793_491_200  # 2026-10-31 00:00 UTC, as the logs


def _events(n: int = 300, days: int = 10, users: int = 40, seed: int = 0) -> dict[str, np.ndarray]:
    """n events over `days` days, in no order: each at a distinct whole second plus some milliseconds
    (so that whole seconds order them as the full times do)."""
    rng = np.random.default_rng(seed)
    seconds = T0 + rng.choice(days * DAY, n, replace=False)
    ms = seconds * 1000 + rng.integers(0, 1000, n)
    return {"user": np.array([f"u{i}" for i in rng.integers(0, users, n)]),
            "url": np.array([f"https://site.example/p{i}" for i in rng.integers(0, 25, n)]),
            "ms": ms.astype(np.int64)}


def _take(ev: dict, mask: np.ndarray) -> dict:
    return {k: v[mask] for k, v in ev.items()}


def _iso(ms: int, offset_hours: int | None = 0) -> str:
    """An ISO 8601 string of an epoch-millisecond time: with a UTC offset, or none (naive, UTC)."""
    tz = datetime.timezone(datetime.timedelta(hours=offset_hours or 0))
    text = datetime.datetime.fromtimestamp(ms / 1000, tz).isoformat(timespec="milliseconds")
    return text[:-6] if offset_hours is None else text


def _csv(path, ev: dict, time=str, header="user_id,url,ts", sep=",", texts: list[str] | None = None):
    """The events as CSV (gzipped for .gz), each time written by `time` from its milliseconds, or as `texts`."""
    texts = texts or [time(int(t)) for t in ev["ms"]]
    lines = [header] + [f"{u}{sep}{v}{sep}{t}" for u, v, t in zip(ev["user"], ev["url"], texts)]
    data = ("\n".join(lines) + "\n").encode()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as fh:
        fh.write(data)
    return str(path)


def _parquet(path, ev: dict, ts: pa.Array):
    pq.write_table(pa.table({"user_id": ev["user"], "url": ev["url"], "ts": ts}), path)
    return str(path)


def _expected(ev: dict) -> dict[str, list[str]]:
    """Each user's URLs in time order."""
    order = np.argsort(ev["ms"], kind="stable")
    out: dict[str, list[str]] = {}
    for i in order:
        out.setdefault(str(ev["user"][i]), []).append(str(ev["url"][i]))
    return out


def _documents(c: Corpus) -> dict[str, list[str]]:
    keys, words = c.docs()["key"].to_pylist(), c.vocab()["token"].to_pylist()
    return {keys[d]: [words[t] for t in tokens[offsets[i]:offsets[i + 1]]]
            for path in c.shard_paths for doc_ids, offsets, tokens in iter_shard(path)
            for i, d in enumerate(doc_ids)}


def _prepare(inputs, out, report: bool | None = None, **kw) -> Corpus:
    return prepare([str(i) for i in inputs], str(out), PrepareConfig(**{"time_col": "ts", **kw}), progress=False,
                   report=report)


# ------------------------------------------------------------------------------- the cases

def test_epoch_milliseconds_with_a_window_of_days_keep_those_days(tmp_path):
    """`prepare events_ms.csv.gz --window-days 2`: the last two days of ten, not the last 172.8 seconds."""
    ev = _events()
    path = _csv(tmp_path / "events_ms.csv.gz", ev)
    c = _prepare([path], tmp_path / "c", window_days=2)
    latest = ev["ms"].max() / 1000
    inside = ev["ms"] / 1000 >= latest - 2 * DAY
    assert 40 < inside.sum() < len(inside)  # about a fifth: both sides of the window are tested
    assert c.num_tokens == inside.sum()
    assert c.meta["skipped"]["events_outside_window"] == (~inside).sum()
    assert _documents(c) == _expected(_take(ev, inside))
    assert c.meta["time_unit"] == "s" and c.meta["window_start"] == latest - 2 * DAY
    assert c.meta["time_range"] == [ev["ms"][inside].min() / 1000, latest]
    assert c.meta["time_read"] == {"epoch milliseconds (detected)": [path]}


def test_iso_and_millisecond_files_give_one_time_range_in_seconds(tmp_path, logged):
    """ISO strings in one file, epoch milliseconds in another, users in both: one time_range in seconds,
    and each user's events ordered across the two files by their real times."""
    ev = _events()
    half = np.arange(len(ev["ms"])) % 2 == 0
    iso = _csv(tmp_path / "a.csv", _take(ev, half), time=_iso)
    ms = _csv(tmp_path / "b.csv.gz", _take(ev, ~half))
    c = prepare([iso, ms], str(tmp_path / "c"), PrepareConfig(time_col="ts"), progress=False, report=True)
    assert c.meta["time_unit"] == "s"
    assert c.meta["time_range"] == [ev["ms"].min() / 1000, ev["ms"].max() / 1000]
    assert _documents(c) == _expected(ev)
    assert f"{ms}: 'ts' read as epoch milliseconds (detected)" in logged.text
    assert f"{iso}: 'ts' read as ISO 8601 strings" in logged.text


# A kind of time → (how the file is written, how the report says it was read).
KINDS = {
    "epoch seconds": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: str(t // 1000)), "epoch seconds (detected)"),
    "float epoch seconds": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: f"{t / 1000:.3f}"),
                            "epoch seconds (detected)"),
    "epoch milliseconds": (lambda p, ev: _csv(p / "e.csv", ev), "epoch milliseconds (detected)"),
    "epoch microseconds": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: str(t * 1000)),
                           "epoch microseconds (detected)"),
    "epoch nanoseconds": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: str(t * 10**6)),
                          "epoch nanoseconds (detected)"),
    "Parquet int64 milliseconds": (lambda p, ev: _parquet(p / "e.parquet", ev, pa.array(ev["ms"])),
                                   "epoch milliseconds (detected)"),
    "JSON numbers in milliseconds": (lambda p, ev: _jsonl(p / "e.jsonl", ev, lambda t: t),
                                     "epoch milliseconds (detected)"),
    "ISO with Z": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: _iso(t).replace("+00:00", "Z")),
                   "ISO 8601 strings (UTC where they give no offset)"),
    "ISO with +02:00": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: _iso(t, 2)),
                        "ISO 8601 strings (UTC where they give no offset)"),
    "ISO without offset": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: _iso(t, None)),
                           "ISO 8601 strings (UTC where they give no offset)"),
    "ISO with nanoseconds": (lambda p, ev: _csv(p / "e.csv", ev, time=lambda t: _iso(t)[:-6] + "000789Z"),
                             "ISO 8601 strings (UTC where they give no offset)"),
    "timestamp[ms, UTC]": (lambda p, ev: _parquet(p / "e.parquet", ev, pa.array(ev["ms"], pa.timestamp("ms", "UTC"))),
                           "timestamps (ms, UTC)"),
    "timestamp[ns, Europe/Paris]": (lambda p, ev: _parquet(p / "e.parquet", ev, pa.array(
        ev["ms"] * 10**6, pa.timestamp("ns", "Europe/Paris"))), "timestamps (ns, Europe/Paris)"),
    "timestamp[s] without zone": (lambda p, ev: _parquet(p / "e.parquet", ev, pa.array(
        ev["ms"] // 1000, pa.timestamp("s"))), "timestamps (ms, no time zone: taken as UTC)"),  # Parquet has no s
}


def _jsonl(path, ev: dict, time) -> str:
    with open(path, "w") as fh:
        fh.writelines(json.dumps({"user_id": str(u), "url": str(v), "ts": time(int(t))}) + "\n"
                      for u, v, t in zip(ev["user"], ev["url"], ev["ms"]))
    return str(path)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_time_gives_the_same_corpus(tmp_path, kind):
    ev = _events(n=120)
    write, read_as = KINDS[kind]
    path = write(tmp_path, ev)
    c = _prepare([path], tmp_path / "c")
    assert _documents(c) == _expected(ev)
    assert c.meta["time_unit"] == "s" and c.meta["time_read"] == {read_as: [path]}
    whole_seconds = kind in ("epoch seconds", "timestamp[s] without zone")
    np.testing.assert_allclose(c.meta["time_range"], [ev["ms"].min() / 1000, ev["ms"].max() / 1000],
                               rtol=0, atol=1.0 if whole_seconds else 1e-6)


def test_time_unit_says_the_unit_of_numbers(tmp_path):
    ev = _events(n=60)
    path = _csv(tmp_path / "e.csv", ev)
    c = _prepare([path], tmp_path / "c", time_unit="ms")
    assert _documents(c) == _expected(ev) and c.meta["time_read"] == {"epoch milliseconds (--time-unit ms)": [path]}
    assert c.meta["time_range"] == [ev["ms"].min() / 1000, ev["ms"].max() / 1000]
    # recorded as fields (jobs/train.py compares them before reusing a corpus), not only in the report's wording
    assert (c.meta["time_unit_asked"], c.meta["time_numbers"]) == ("ms", True) == time_unit_asked(c.meta)
    detected = _prepare([path], tmp_path / "d")
    assert (detected.meta["time_unit_asked"], detected.meta["time_numbers"]) == (None, True)
    iso = _prepare([_jsonl(tmp_path / "iso.jsonl", ev, _iso)], tmp_path / "i")
    assert (iso.meta["time_unit_asked"], iso.meta["time_numbers"]) == (None, False)
    # a corpus.json from before the fields: read from the wording
    older = {k: v for k, v in c.meta.items() if k not in ("time_unit_asked", "time_numbers")}
    assert time_unit_asked(older) == ("ms", True)
    assert time_unit_asked({k: v for k, v in iso.meta.items() if k != "time_unit_asked"}) == (None, False)
    first = ev["ms"][0]
    with pytest.raises(CorpusError, match=rf"e\.csv: column 'ts' row 0 holds {first}, which in epoch seconds "
                                          r"\(--time-unit s\) lies after the year 5000; its size says epoch "
                                          r"milliseconds \(--time-unit ms\)"):
        _prepare([path], tmp_path / "c2", time_unit="s")
    with pytest.raises(CorpusError, match="--time-unit needs a time column"):
        prepare([path], str(tmp_path / "c3"), PrepareConfig(time_unit="ms"), progress=False)
    assert not os.path.exists(tmp_path / "c2") and not os.path.exists(tmp_path / "c3")


def test_a_file_in_two_units_is_refused_naming_the_row(tmp_path, monkeypatch):
    ev = _events(n=50)
    text = [str(t) for t in ev["ms"]]
    text[7] = str(ev["ms"][7] // 1000)  # one time in seconds among milliseconds
    _csv(tmp_path / "e.csv", ev, texts=text)
    with pytest.raises(CorpusError, match=rf"e\.csv: column 'ts' row 7 holds {ev['ms'][7] // 1000}, epoch seconds "
                                          r"by its size, but the file's times are epoch milliseconds by their size"):
        _prepare([tmp_path / "e.csv"], tmp_path / "c")
    text[7] = "0"  # a placeholder for no time is no time in any unit
    _csv(tmp_path / "e.csv", ev, texts=text)
    with pytest.raises(CorpusError, match=r"row 7 holds 0, no epoch time in any unit, but the file's times are "
                                          "epoch milliseconds"):
        _prepare([tmp_path / "e.csv"], tmp_path / "c")

    # the unit is the file's, not a block's: a later block in seconds is refused too
    monkeypatch.setattr(read_formats, "CSV_JSON_BLOCK_BYTES", 1000)
    ev = _events(n=400)
    seconds = np.arange(len(ev["ms"])) >= 300
    _csv(tmp_path / "blocks.csv", ev, texts=[str(t // 1000) if s else str(t) for t, s in zip(ev["ms"], seconds)])
    with pytest.raises(CorpusError, match=r"blocks\.csv: column 'ts' row 300 holds \d+, epoch seconds by its size, "
                                          "but the file's times are epoch milliseconds"):
        _prepare([tmp_path / "blocks.csv"], tmp_path / "c")
    assert not os.path.exists(tmp_path / "c")


def test_files_in_different_units_are_each_read_in_their_own(tmp_path):
    ev = _events()
    part = np.arange(len(ev["ms"])) % 3
    files = [_csv(tmp_path / "s.csv", _take(ev, part == 0), time=lambda t: f"{t / 1000:.3f}"),
             _csv(tmp_path / "ms.csv.gz", _take(ev, part == 1)),
             _parquet(tmp_path / "ns.parquet", _take(ev, part == 2), pa.array(ev["ms"][part == 2] * 10**6))]
    c = _prepare(files, tmp_path / "c")
    assert _documents(c) == _expected(ev)
    assert c.meta["time_read"] == {"epoch seconds (detected)": [files[0]], "epoch milliseconds (detected)": [files[1]],
                                   "epoch nanoseconds (detected)": [files[2]]}
    np.testing.assert_allclose(c.meta["time_range"], [ev["ms"].min() / 1000, ev["ms"].max() / 1000], rtol=0, atol=1e-6)


def test_sequence_numbers_order_events_but_need_no_window_or_base(tmp_path):
    """Numbers too small for an epoch time in any unit (1, 2, 3) order each user's events, as before;
    where a time is needed (--window-days, --base), or beside epoch times, they are refused."""
    (tmp_path / "seq.csv").write_text("user_id,url,ts\nu1,b,2\nu1,a,1\nu2,c,3\n")
    c = _prepare([tmp_path / "seq.csv"], tmp_path / "c")
    assert _documents(c) == {"u1": ["a", "b"], "u2": ["c"]}
    assert c.meta["time_unit"] == "order" and c.meta["time_range"] == [1, 3]
    with pytest.raises(CorpusError, match=r"seq\.csv: column 'ts' row 0 holds 2: these numbers are no epoch time "
                                          r".*--window-days needs times; give --time-unit s\|ms\|us\|ns"):
        _prepare([tmp_path / "seq.csv"], tmp_path / "w", window_days=1)
    ms = _csv(tmp_path / "ms.csv", _events(n=5))
    with pytest.raises(CorpusError, match=r"seq\.csv: column 'ts' row 0 holds 2: .* --base needs times"):
        _prepare([tmp_path / "seq.csv"], tmp_path / "b", base=_prepare([ms], tmp_path / "ms").path)
    with pytest.raises(CorpusError, match=rf"{ms}: column 'ts' read as epoch milliseconds \(detected\), but "
                                          rf"{tmp_path}/seq\.csv's as numbers that only order"):
        _prepare([tmp_path / "seq.csv", ms], tmp_path / "m")
    # with --time-unit they are epoch times, whatever their size
    c = _prepare([tmp_path / "seq.csv"], tmp_path / "s", time_unit="s", window_days=1)
    assert c.meta["time_unit"] == "s" and _documents(c) == {"u1": ["a", "b"], "u2": ["c"]}
    (tmp_path / "huge.csv").write_text("user_id,url,ts\nu1,a,1e25\n")
    with pytest.raises(CorpusError, match=r"huge\.csv: column 'ts' row 0 holds 1e25: numbers of this size are no "
                                          "epoch time in any unit"):
        _prepare([tmp_path / "huge.csv"], tmp_path / "h")


# ------------------------------------------------------------------------------------- a refresh

@pytest.fixture
def split(tmp_path):
    """Ten days of events: the first seven (the base's) and the last three (the refresh's)."""
    ev = _events(n=400, users=150)
    new = ev["ms"] >= (T0 + 7 * DAY) * 1000
    old_ev, new_ev = _take(ev, ~new), _take(ev, new)
    known_with_new = set(old_ev["user"]) & set(new_ev["user"])
    assert 5 < len(known_with_new) < len(set(old_ev["user"])) and set(new_ev["user"]) - set(old_ev["user"])
    return ev, old_ev, new_ev, known_with_new


@pytest.mark.parametrize("today", ["milliseconds", "ISO"])
def test_a_refresh_counts_the_known_users_with_new_events(tmp_path, split, today):
    """The base from ISO and millisecond files (as in the issue), today's events in either: every known
    user with events today has new events, none is 'not after the base', one time range in seconds."""
    ev, old_ev, new_ev, known_with_new = split
    half = np.arange(len(old_ev["ms"])) % 2 == 0
    base = _prepare([_csv(tmp_path / "old_iso.csv", _take(old_ev, half), time=_iso),
                     _csv(tmp_path / "old_ms.csv.gz", _take(old_ev, ~half))], tmp_path / "base")
    assert base.meta["time_range"] == [old_ev["ms"].min() / 1000, old_ev["ms"].max() / 1000]
    new = _csv(tmp_path / "new.csv", new_ev, time=_iso if today == "ISO" else str)
    fresh = _prepare([new], tmp_path / "fresh", base=base.path)
    r = fresh.meta["refresh"]
    assert r["grown_docs"] == len(known_with_new) and r["events_not_after_base"] == 0
    assert r["new_docs"] == len(set(new_ev["user"]) - set(old_ev["user"]))
    assert fresh.meta["time_range"] == [ev["ms"].min() / 1000, ev["ms"].max() / 1000]
    assert _documents(fresh) == _expected(ev)  # each user's earlier tokens, then today's


def _old_corpus_json(corpus: Corpus, time_range: list) -> None:
    """corpus.json as prepare wrote it before time units: no time_unit (nor the other new keys), and the
    time range in whatever unit the numbers were read in."""
    meta = dict(corpus.meta)
    for key in ("time_unit", "time_read", "delimiter", "stripped_whitespace", "stripped_where"):
        del meta[key]
    meta["time_range"] = time_range
    with open(os.path.join(corpus.path, "corpus.json"), "w") as fh:
        json.dump(meta, fh, indent=2)


@pytest.mark.parametrize("stored", ["milliseconds", "seconds", "seconds and milliseconds mixed"])
@pytest.mark.parametrize("today", ["milliseconds", "ISO"])
def test_a_base_from_before_time_units_still_joins(tmp_path, split, stored, today, logged):
    """A base whose corpus.json has no time_unit kept its numbers as they came: its range is read by
    the size of each end (the mixed one as the issue's, ISO seconds up to epoch milliseconds)."""
    ev, old_ev, new_ev, known_with_new = split
    base = _prepare([_csv(tmp_path / "old.csv.gz", old_ev)], tmp_path / "base")
    first, last = int(old_ev["ms"].min()), int(old_ev["ms"].max())
    _old_corpus_json(base, {"milliseconds": [first, last], "seconds": [first / 1000, last / 1000],
                            "seconds and milliseconds mixed": [first / 1000, last]}[stored])
    new = _csv(tmp_path / "new.csv", new_ev, time=_iso if today == "ISO" else str)
    fresh = prepare([new], str(tmp_path / "fresh"), PrepareConfig(time_col="ts", base=base.path), progress=False, report=True)
    r = fresh.meta["refresh"]
    assert r["grown_docs"] == len(known_with_new) and r["events_not_after_base"] == 0
    assert fresh.meta["time_unit"] == "s"
    assert fresh.meta["time_range"] == [ev["ms"].min() / 1000, ev["ms"].max() / 1000]
    assert _documents(fresh) == _expected(ev)
    assert f"{base.path}: its corpus.json predates time units; its time range read as " in logged.text


def test_a_base_whose_times_were_sequence_numbers_is_refused_for_timed_events(tmp_path, split):
    _, old_ev, new_ev, _ = split
    base = _prepare([_csv(tmp_path / "old.csv", old_ev)], tmp_path / "base")
    _old_corpus_json(base, [1, 5000])
    with pytest.raises(CorpusError, match=rf"{base.path}: its times \[1.0, 5000.0\] are numbers that only order "
                                          "events, no epoch time"):
        _prepare([_csv(tmp_path / "new.csv", new_ev)], tmp_path / "fresh", base=base.path)
    assert not os.path.exists(tmp_path / "fresh")
    # without a time column nothing compares times: the base joins
    fresh = prepare([str(tmp_path / "new.csv")], str(tmp_path / "fresh"), PrepareConfig(base=base.path), progress=False)
    assert fresh.meta["refresh"]["grown_docs"] > 0
