"""Vectors for URLs the model never saw (issue 51, part 3): composed from the parts of them it knows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import Model
from doc2vec_dist.cli import main
from doc2vec_dist.compose import url_parts
from doc2vec_dist.errors import UserError
from doc2vec_dist.infer import infer
from doc2vec_dist.modeldir import ModelDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL_TRUTH = os.path.join(ROOT, "data", "sample", "truth", "urls.parquet")

HOST = "www.quailkale.com"  # a site of the sample: 20 pages, four of them under /questions
NEW_IN_SECTION = f"https://{HOST}/questions/a-page-first-seen-today"
NEW_ON_HOST = f"https://{HOST}/a-page-first-seen-today"
NEW_SUBDOMAIN = "https://shop.quailkale.com/basket"
OTHER_SITE = "https://never.example/a"


def test_the_parts_of_a_url():
    parts = url_parts(pa.array(["https://news.irisglen.co.uk/local/spruce-quest-3", "https://shop.example.com:8080/a/b?x=1",
                                "http://10.0.0.1/x", "https://localhost/", "item42", "https://user@[::1]:80/p", None]))
    assert parts["host"].to_pylist() == ["news.irisglen.co.uk", "shop.example.com:8080", "10.0.0.1", "localhost", None,
                                         "[::1]:80", None]
    assert parts["domain"].to_pylist() == ["irisglen.co.uk", "example.com", "10.0.0.1", "localhost", None, "[::1]",
                                           None]
    assert parts["path1"].to_pylist() == ["news.irisglen.co.uk/local", "shop.example.com:8080/a", "10.0.0.1/x",
                                          "localhost/", None, "[::1]:80/p", None]
    # the page under another query shares its whole path: the deepest part of a URL with a query
    assert parts["path2"].to_pylist() == ["news.irisglen.co.uk/local/spruce-quest-3", "shop.example.com:8080/a/b",
                                          None, None, None, None, None]


def _expected(model: ModelDir, prefix: str) -> tuple[np.ndarray, int]:
    """The count-weighted mean of the words_out rows of the model's URLs starting with `prefix`, computed here
    with Python's strings, and how many there are."""
    vocab = model.vocab()
    tokens, counts = vocab.column("token").to_pylist(), vocab.column("count").to_numpy().astype(np.float64)
    rows = [i for i, t in enumerate(tokens) if t.startswith(prefix)]
    table = model.read_table("words_out").astype(np.float64)
    return (table[rows] * counts[rows, None]).sum(0) / counts[rows].sum(), len(rows)


def test_a_url_never_seen_takes_the_row_of_its_most_specific_known_part(trained_model):
    found = ModelDir(trained_model)
    known = found.keys("words_out").to_pylist()
    own = next(u for u in known if u.startswith(f"https://{HOST}/questions/"))
    model = Model.load(trained_model)
    asked = [NEW_IN_SECTION, NEW_ON_HOST, NEW_SUBDOMAIN, OTHER_SITE, own.replace(f"https://{HOST}", f"HTTPS://{HOST.upper()}"),
             NEW_IN_SECTION.replace(f"https://{HOST}", f"HTTPS://{HOST.upper()}:443") + "#top"]
    answer = model.url_vectors(asked)
    assert answer.column_names == ["key", "vector", "source", "part"]
    # the parts are read from the URL as the model's rule normalised it
    assert answer.column("key").to_pylist() == asked[:4] + [own, NEW_IN_SECTION]
    assert answer.column("source").to_pylist() == ["path", "host", "domain", None, "own", "path"]
    assert answer.column("part").to_pylist() == [f"{HOST}/questions", HOST, "quailkale.com", None, None,
                                                 f"{HOST}/questions"]
    vectors = answer.column("vector").to_pylist()
    for got, prefix in zip(vectors[:3], (f"https://{HOST}/questions/", f"https://{HOST}/", f"https://{HOST}/")):
        want, n = _expected(found, prefix)
        assert n >= 2
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert vectors[3] is None  # a site the model never saw: no vector, a null one
    np.testing.assert_array_equal(vectors[4], model.vector(own, "words_out"))
    # the words table is composed in its own space (this model has none: dbow without dbow_words)
    with pytest.raises(UserError, match="words"):
        model.url_vectors([NEW_ON_HOST], table="words")
    with pytest.raises(UserError, match="URL tables"):
        model.url_vectors([NEW_ON_HOST], table="docs")


def test_a_url_the_model_does_not_hold_is_still_an_error_for_vector_naming_the_way_to_compose(trained_model):
    model = Model.load(trained_model)
    with pytest.raises(UserError) as err:
        model.vector(NEW_ON_HOST, "words_out")
    assert str(err.value).startswith(f"unknown words_out key {NEW_ON_HOST!r}: the model never saw this URL; "
                                     "url_vectors() composes a vector for it from its path, host or domain")


def test_neighbors_of_a_url_say_whether_its_vector_was_composed(trained_model):
    model = Model.load(trained_model)
    own = model.keys("words_out")[5].as_py()
    answer = model.neighbors(urls=[own, NEW_ON_HOST], k=5, table="words_out")
    assert answer.column_names == ["key", "neighbor", "score", "rank", "source"]
    by_key = answer.to_pylist()
    assert {r["key"]: r["source"] for r in by_key} == {own: "own", NEW_ON_HOST: "host"}
    # a URL the model knows: the same answer as by key
    mine = answer.filter(pc.equal(answer.column("key"), own)).drop_columns(["source"])
    assert mine.equals(model.neighbors(own, k=5, table="words_out"))
    # a new page of the site: its neighbours are pages of the site's community (the sample's sites are random
    # draws of their community's pages, nothing more alike)
    theirs = [r["neighbor"] for r in by_key if r["key"] == NEW_ON_HOST]
    community = _communities()
    site = community[next(u for u in community if u.startswith(f"https://{HOST}/"))]
    assert len(theirs) == 5 and sum(community[n] == site for n in theirs) >= 4
    with pytest.warns(UserWarning, match=r"1 URL with no vector: the model knows neither it nor its host or domain "
                                         r"\(a site it never saw\): https://never.example/a"):
        answer = model.neighbors(urls=[NEW_ON_HOST, OTHER_SITE], k=3, table="words_out")
    assert set(answer.column("key").to_pylist()) == {NEW_ON_HOST}
    with pytest.raises(UserError, match="1 URL with no vector"):
        model.neighbors(urls=[OTHER_SITE], table="words_out")


def test_neighbors_url_on_the_command_line(trained_model, capsys):
    assert main(["neighbors", "--model", trained_model, "--url", NEW_IN_SECTION, "--k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["key", "neighbor", "score", "rank", "source"]
    assert len(lines) == 4 and all(line.startswith(NEW_IN_SECTION + "\t") and line.endswith("\tpath")
                                   for line in lines[1:])


def test_export_of_url_vectors_for_a_list_of_urls(trained_model, tmp_path, capsys):
    listed = tmp_path / "urls.parquet"
    own = ModelDir(trained_model).keys("words_out")[0].as_py()
    pq.write_table(pa.table({"url": [own, NEW_ON_HOST, OTHER_SITE, NEW_ON_HOST]}), listed)
    out = str(tmp_path / "urls_out.parquet")
    assert main(["export", "--model", trained_model, "--table", "words_out", "--urls", str(listed), "--out", out,
                 "--no-progress"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"exported 3 URL vectors of words_out to {out}: 1 the model's own, 1 composed (1 from "
                               "a host), 1 without a vector (null)")
    assert "warning: 1 URL with no vector: the model knows neither it nor its host or domain" in said.err
    table = pq.read_table(out)
    assert table.column_names == ["key", "vector", "source", "part"]
    assert table.column("key").to_pylist() == [own, NEW_ON_HOST, OTHER_SITE]  # distinct, in the order given
    assert table.column("source").to_pylist() == ["own", "host", None]
    np.testing.assert_array_equal(table.column("vector")[1].as_py(),
                                  Model.load(trained_model).url_vectors([NEW_ON_HOST]).column("vector")[0].as_py())
    # the file is a vectors file of the model's words_out: an index reads it, leaving out the null row
    assert main(["index", "--vectors", out, "--out", str(tmp_path / "i"), "--no-progress"]) == 0
    assert "1 row with a null or all-zero vector" in capsys.readouterr().err
    # tomorrow's list replaces the file this command wrote
    (tmp_path / "tomorrow.txt").write_text(NEW_IN_SECTION + "\n")
    assert main(["export", "--model", trained_model, "--table", "words_out", "--urls", str(tmp_path / "tomorrow.txt"),
                 "--out", out, "--no-progress"]) == 0
    assert pq.read_table(out).column("source").to_pylist() == ["path"]


def _communities() -> dict[str, int]:
    truth = pq.read_table(URL_TRUTH)
    return dict(zip(truth.column("url").to_pylist(), truth.column("community").to_pylist()))


def _new_pages_of_one_community(community: int, sites: int = 5) -> list[str]:
    truth = pq.read_table(URL_TRUTH)
    urls = truth.filter(pc.equal(truth.column("community"), community)).column("url").to_pylist()
    hosts = list(dict.fromkeys(u.split("/")[2] for u in urls))[:sites]
    return [f"https://{h}/a-page-first-seen-today-{i}" for h in hosts for i in range(2)]


def test_infer_places_a_user_who_visited_only_pages_the_model_never_saw(trained_model, tmp_path, logged):
    events = tmp_path / "new.csv"
    pages = _new_pages_of_one_community(3)
    events.write_text("user_id,url\n" + "".join(f"newcomer,{u}\n" for u in pages))
    logged.clear()
    summary = infer(trained_model, [str(events)], str(tmp_path / "u.parquet"), progress=False)
    assert summary["rows"] == 1 and summary["null_vectors"] == 0
    assert (summary["composed_events"], summary["composed_urls"], summary["unknown_events"]) == (10, 10, 0)
    assert "composed vectors for 10 URLs the model never saw (10 events) from their host" in logged.text
    # the user lands among the community of the sites visited
    model = Model.load(trained_model)
    vector = pq.read_table(summary["path"]).column("vector")[0].as_py()
    likeliest = model.neighbors(vectors=np.array(vector, np.float32), table="docs", against="words_out", k=10)
    community = _communities()
    assert sum(community[u] == 3 for u in likeliest.column("neighbor").to_pylist()) >= 6
    # without composing, as before: nothing the model knows, refused
    with pytest.raises(UserError, match="none of the 10 events has a URL the model knows"):
        infer(trained_model, [str(events)], str(tmp_path / "v.parquet"), progress=False, compose=False)
    assert main(["infer", "--model", trained_model, str(events), "--out", str(tmp_path / "w.parquet"),
                 "--no-compose", "--no-progress"]) == 2


def test_model_infer_composes_and_compose_false_drops_them_as_before(trained_model):
    model = Model.load(trained_model)
    known = model.keys("words_out").to_pylist()[100:110]
    assert not np.array_equal(model.infer({"b": known + [NEW_ON_HOST]}, seed=3), model.infer({"b": known}, seed=3))
    np.testing.assert_array_equal(model.infer({"b": known + [NEW_ON_HOST]}, seed=3, compose=False),
                                  model.infer({"b": known}, seed=3))


def test_a_list_of_urls_is_a_parquet_or_csv_column_or_lines_of_text(tmp_path):
    from doc2vec_dist.export import read_url_list

    (tmp_path / "u.csv").write_text("user_id,url\nu1,https://a.example/x\nu2,https://a.example/y\n")
    (tmp_path / "u.txt").write_text("https://a.example/x\n\n  https://a.example/y  \n")
    pq.write_table(pa.table({"key": ["https://a.example/x", None, "https://a.example/y"]}), tmp_path / "u.parquet")
    for name in ("u.csv", "u.txt", "u.parquet"):
        assert read_url_list(str(tmp_path / name)) == ["https://a.example/x", "https://a.example/y"], name
    with pytest.raises(UserError, match="no such file"):
        read_url_list(str(tmp_path / "nope.txt"))
    (tmp_path / "blank.txt").write_text("\n  \n")
    pq.write_table(pa.table({"url": pa.array([None], pa.string())}), tmp_path / "nulls.parquet")
    for name in ("blank.txt", "nulls.parquet"):
        with pytest.raises(UserError, match=f"{name}: no URLs in it; give one URL a line, or a Parquet or CSV file "
                                            "with a url column"):
            read_url_list(str(tmp_path / name))


def test_the_benchmarks_split_and_part_words():
    """benchmarks/new_urls.py: held-out tokens never reach training, a new user's hidden events follow its
    visible ones, and the trained arm's part words are those compose.py reads."""
    from conftest import load_benchmark

    bench = load_benchmark("new_urls")
    events = pa.table({"user_id": [f"u{i % 40}" for i in range(400)],
                       "url": [f"https://s{i % 7}.example/sec{i % 3}/p{i % 23}" for i in range(400)],
                       "ts": pa.array(range(400), pa.int64())})
    s = bench.split(events, seed=1, text=False)
    assert len(s["held_out"]) and not pc.any(pc.is_in(s["train"].column("url"), value_set=s["held_out"])).as_py()
    new = set(s["visible"].column("user_id").to_pylist())
    assert new and not new & set(s["train"].column("user_id").to_pylist())
    last_seen = {}
    for user, ts in zip(s["visible"].column("user_id").to_pylist(), s["visible"].column("ts").to_pylist()):
        last_seen[user] = max(ts, last_seen.get(user, ts))
    assert all(ts > last_seen[user] for user, ts in zip(s["hidden"].column("user_id").to_pylist(),
                                                         s["hidden"].column("ts").to_pylist()))
    one = pa.table({"user_id": ["u", "u"], "url": ["https://a.b.example.com/x/y", "https://a.b.example.com/x/y?q=1"],
                    "ts": pa.array([1, 2], pa.int64())})
    assert bench.with_parts(one).column("url").to_pylist() == [
        "https://a.b.example.com/x/y", "https://a.b.example.com/x/y?q=1", "host:a.b.example.com", "host:a.b.example.com",
        "domain:example.com", "domain:example.com", "path:a.b.example.com/x", "path:a.b.example.com/x",
        "path:a.b.example.com/x/y"]


def test_the_benchmarks_recall_is_each_users_share_of_hidden_tokens_in_the_top_k():
    """benchmarks/new_urls.py's recall: per user, the share of its hidden tokens among its K best-scored unseen
    ones (evaluate.rank_hidden gives each hidden token's rank; it once gave per-user recall, and the benchmark
    broke when that changed)."""
    from conftest import load_benchmark

    bench = load_benchmark("new_urls")
    k, tokens = bench.K, 40
    rows = np.eye(tokens, dtype=np.float32)[:, :tokens]
    users = np.zeros((2, tokens), np.float32)
    users[0, :k + 1] = 1.0                   # user 0 scores tokens 0..k above the rest (0 it has seen)
    users[1, tokens - k:] = 1.0              # user 1 the last k
    counts = np.ones(tokens)
    seen = [np.array([0]), np.zeros(0, np.int64)]
    hidden = [np.array([1, 2, tokens - 1]), np.array([0, tokens - 1])]
    got = bench.recall(users, rows, counts, 0.0, seen, hidden)
    assert got.shape == (2,)
    np.testing.assert_allclose(got, [2 / 3, 1 / 2])
