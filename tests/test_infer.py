"""infer: vectors for new users with words_out frozen; gensim's sanity check, determinism, no silent loss."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import Model
from doc2vec_dist.cli import main
from doc2vec_dist.corpus import Corpus, iter_shard
from doc2vec_dist.errors import UserError
from doc2vec_dist.infer import infer, initial_vectors
from doc2vec_dist.scoring import unit_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")
TRUTH = os.path.join(ROOT, "data", "sample", "truth", "users.parquet")


def training_events(corpus_path: str) -> dict[str, list[str]]:
    """Every user's training URLs (held-out ones excluded), in time order, from the corpus shards."""
    corpus = Corpus(corpus_path)
    urls = corpus.vocab().column("token").to_pylist()
    keys = corpus.docs().column("key").to_pylist()
    events = {}
    for path in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(path):
            for i, doc in enumerate(doc_ids):
                events[keys[doc]] = [urls[t] for t in tokens[offsets[i]:offsets[i + 1]]]
    return events


@pytest.fixture(scope="module")
def few_users_file(tmp_path_factory) -> tuple[str, list[str]]:
    """The raw sample events (user_id, url, ts) of 300 users, as a Parquet file: (path, users)."""
    events = pq.read_table(SAMPLE_EVENTS)
    users = pc.unique(events.column("user_id")).to_pylist()[:300]
    path = str(tmp_path_factory.mktemp("few") / "events.parquet")
    pq.write_table(events.filter(pc.is_in(events.column("user_id"), value_set=pa.array(users))), path)
    return path, users


def test_inferred_training_users_find_themselves_among_the_model_docs(trained_model, sample_corpus):
    """gensim's sanity check: re-infer training users from their own URLs; the model's vector of the same
    user should be among the nearest docs. Measured on the dim-32 sample model (retrained each session):
    top-10 hit rate 0.66–0.72 on these 50 users over six trainings/seeds (0.68–0.69 on all 5,000; top-1 0.43). gensim's infer_vector on gensim's model of the same
    corpus: top-10 0.78, and ours on that gensim model also 0.78: same algorithm, different model."""
    events = training_events(sample_corpus[0])
    model = Model.load(trained_model)
    rng = np.random.default_rng(0)
    keys = model.keys("docs").to_pylist()
    chosen = sorted(rng.choice(len(keys), 50, replace=False).tolist())
    vectors = model.infer({keys[i]: events[keys[i]] for i in chosen})
    assert vectors.shape == (50, 32) and np.isfinite(vectors).all()
    similarity = unit_rows(vectors) @ unit_rows(model.table("docs")).T
    own = similarity[np.arange(50), chosen]
    rank = (similarity > own[:, None]).sum(1)
    hit_rate = float(np.mean(rank < 10))
    print(f"self top-10 hit rate {hit_rate:.2f}, top-1 {np.mean(rank < 1):.2f}")
    assert hit_rate >= 0.5


def test_same_seed_same_vectors_and_another_seed_other_vectors(trained_model, few_users_file):
    path, users = few_users_file
    run = {"time_col": "ts", "batch_users": 128, "progress": False}  # 3 batches
    keys, a = infer(trained_model, [path], **run)
    keys2, b = infer(trained_model, [path], **run)
    _, c = infer(trained_model, [path], seed=2, **run)
    assert sorted(keys.to_pylist()) == sorted(users) and keys.equals(keys2)
    np.testing.assert_array_equal(a, b)  # bit for bit
    assert not np.allclose(a, c, atol=1e-3)
    # the vectors moved well away from their seeded starting points
    start = initial_vectors(keys.to_pylist(), a.shape[1], seed=1)
    assert np.median(np.linalg.norm(a - start, axis=1)) > 10 * np.linalg.norm(start, axis=1).max()


def test_every_form_of_events_gives_the_same_vectors(trained_model, few_users_file, tmp_path):
    """Model.infer's dict, pairs and Table forms and infer() on a file read the same events the same way."""
    path, _ = few_users_file
    # in time order, so that pairs and dicts (which have no time column) hold each user's URLs in order
    # and users appear in the same order everywhere: a batch's draws follow the order of its users
    table = pq.read_table(path).sort_by("ts")
    path = str(tmp_path / "by_time.parquet")
    pq.write_table(table, path)
    order = pc.unique(table.column("user_id")).to_pylist()
    keys, expected = infer(trained_model, [path], time_col="ts", progress=False)
    assert keys.to_pylist() == order
    model = Model.load(trained_model)
    pairs = list(zip(table.column("user_id").to_pylist(), table.column("url").to_pylist()))
    by_user: dict[str, list[str]] = {}
    for user, url in pairs:
        by_user.setdefault(user, []).append(url)
    np.testing.assert_array_equal(model.infer(table, time_col="ts"), expected)
    np.testing.assert_array_equal(model.infer(pairs), expected)
    np.testing.assert_array_equal(model.infer(by_user), expected)
    # --format text: one user per line, key = line number
    text = tmp_path / "users.txt"
    text.write_text("".join(" ".join(by_user[u]) + "\n" for u in order[:5]))
    keys, vectors = infer(trained_model, [str(text)], format="text", progress=False)
    assert keys.to_pylist() == ["0", "1", "2", "3", "4"]
    np.testing.assert_array_equal(vectors, model.infer({str(i): by_user[u] for i, u in enumerate(order[:5])}))


def test_a_user_whose_every_url_is_null_or_empty_keeps_a_row_without_a_vector(trained_model, few_users_file, tmp_path,
                                                                               logged):
    """Such a user left the output file without a word (the input's 8 users, the file's 6 rows; only `skipped 2
    document(s) left with no token` said so): it is named and kept, as a user with no URL the model knows is."""
    path, users = few_users_file
    events = pq.read_table(path, columns=["user_id", "url"])
    empty = pa.table({"user_id": ["emptyurl", "nullurl", "nullurl"], "url": pa.array(["", None, "  "], pa.string())})
    mixed = str(tmp_path / "mixed.parquet")
    pq.write_table(pa.concat_tables([events, empty]), mixed)
    logged.clear()
    summary = infer(trained_model, [mixed], str(tmp_path / "out.parquet"), progress=False)
    written = pq.read_table(summary["path"])
    vector_of = dict(zip(written.column("key").to_pylist(), written.column("vector").to_pylist()))
    assert written.num_rows == len(users) + 2 and set(vector_of) == {*users, "emptyurl", "nullurl"}
    assert vector_of["emptyurl"] is None and vector_of["nullurl"] is None
    assert (summary["rows"], summary["null_vectors"], summary["users_without_known_urls"]) == (len(users), 2, 2)
    warnings = [r.getMessage() for r in logged.records if r.levelname == "WARNING"]
    assert warnings == [(f"warning: 2 users have no URL the model knows (emptyurl, nullurl): their rows in "
                         f"{summary['path']} have a null vector")]
    # the arrays: a row of NaN each, in the same place
    with pytest.warns(UserWarning, match=r"2 users have no URL the model knows \(emptyurl, nullurl\): their rows are NaN"):
        keys, vectors = infer(trained_model, [mixed], progress=False)
    at = keys.to_pylist()
    assert np.isnan(vectors[at.index("emptyurl")]).all() and np.isnan(vectors[at.index("nullurl")]).all()
    assert np.isfinite(np.delete(vectors, [at.index("emptyurl"), at.index("nullurl")], axis=0)).all()


def test_unknown_urls_are_counted_and_reported_not_silently_dropped(trained_model, few_users_file, tmp_path, logged):
    path, users = few_users_file
    events = pq.read_table(path, columns=["user_id", "url"])
    strangers = pa.table({"user_id": [users[0], users[0], users[1], "newcomer", "newcomer"],
                          "url": ["https://never.example/a", "https://never.example/b", "https://never.example/a",
                                  "https://never.example/c", "https://never.example/c"]})
    mixed = str(tmp_path / "mixed.parquet")
    pq.write_table(pa.concat_tables([events, strangers]), mixed)
    logged.clear()
    summary = infer(trained_model, [mixed], str(tmp_path / "out.parquet"), progress=False)
    err = logged.text
    assert (summary["unknown_events"], summary["unknown_urls"], summary["users_without_known_urls"]) == (5, 3, 1)
    assert "skipped 5 events with URLs the model never saw (3 distinct URLs)" in err
    # the user it cannot place is named, in a warning of its own (issue 47), and kept in the file with a null vector
    warnings = [r.getMessage() for r in logged.records if r.levelname == "WARNING"]
    assert warnings == [(f"warning: 1 user has no URL the model knows (newcomer): its row in {summary['path']} has a "
                        "null vector")]
    written = pq.read_table(summary["path"])
    assert summary["rows"] == len(users) and summary["null_vectors"] == 1 and written.num_rows == len(users) + 1
    vector_of = dict(zip(written.column("key").to_pylist(), written.column("vector").to_pylist()))
    assert vector_of["newcomer"] is None and all(v is not None for k, v in vector_of.items() if k != "newcomer")
    # Model.infer answers in the order asked: a row of NaN for the user it cannot place, and a warning naming it
    logged.clear()
    with pytest.warns(UserWarning) as caught:
        vectors = Model.load(trained_model).infer({"newcomer": ["https://never.example/c"], users[0]: ["nope", *[
            u for u in events.filter(pc.equal(events.column("user_id"), users[0])).column("url").to_pylist()]]})
    assert [str(w.message) for w in caught] == ["1 user has no URL the model knows (newcomer): its row is NaN"]
    assert np.isnan(vectors[0]).all() and np.isfinite(vectors[1]).all()
    assert "skipped 2 events" in logged.text
    # nobody left: refused (issue 26, item 3), nothing written; no longer an empty file and exit 0
    events_path = _write(strangers, tmp_path)
    with pytest.raises(UserError) as err:
        infer(trained_model, [events_path], str(tmp_path / "new" / "empty.parquet"), progress=False)
    assert str(err.value).startswith(f"{events_path}: none of the 5 events has a URL the model knows (their 3 distinct "
                                     "URLs are not among the ")
    assert not os.path.exists(tmp_path / "new")


def _write(table: pa.Table, tmp_path) -> str:
    path = str(tmp_path / "table.parquet")
    pq.write_table(table, path)
    return path


def test_cli_help_lists_the_flags_of_prepare_and_the_overrides(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["infer", "--help"])
    assert exit_info.value.code == 0
    listed = {word.rstrip(",") for word in capsys.readouterr().out.split() if word.startswith("--")}
    wanted = ("--model --out --format --doc-col --token-col --time-col --time-unit --delimiter --epochs --alpha --seed "
              "--batch-users --tmp-dir --no-progress")
    assert not set(wanted.split()) - listed


def test_cli_writes_key_vector_parquet_that_index_reads(trained_model, few_users_file, tmp_path, capsys):
    from doc2vec_dist.index_sources import parquet_source

    path, users = few_users_file
    out = str(tmp_path / "new" / "users.parquet")
    code = main(["infer", "--model", trained_model, path, "--out", out, "--time-col", "ts", "--epochs", "5",
                 "--seed", "7", "--batch-users", "100", "--no-progress"])
    stdout = capsys.readouterr().out
    assert code == 0 and f"inferred {len(users)} user vectors (dim 32)" in stdout
    table = pq.read_table(out)
    assert table.schema.field("key").type == pa.string()
    assert table.schema.field("vector").type == pa.list_(pa.float32(), 32)
    assert sorted(table.column("key").to_pylist()) == sorted(users)
    assert parquet_source(out).dim == 32
    assert not [f for f in os.listdir(os.path.dirname(out)) if ".tmp-" in f]
    _, again = infer(trained_model, [path], time_col="ts", epochs=5, seed=7, batch_users=100, progress=False)
    np.testing.assert_array_equal(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), again)


def test_pv_dm_model_infers_with_words_and_words_out_frozen(ray_cluster, sample_corpus, tmp_path):
    """A tiny PV-DM model (sample 0: with the default subsampling, 3 epochs leave it at chance; one server and
    one worker start in half the time of two each). The inferred vectors of 1,000 users carry their
    community: k-NN (k=10) accuracy among themselves measured 0.60–0.62, the same users' trained doc
    vectors 0.38; chance (the largest community) is 0.13."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    model_dir = str(tmp_path / "dm")
    train(sample_corpus[0], model_dir, TrainConfig(mode="dm", dim=16, epochs=3, sample=0, num_ps=1, num_workers=1,
                                                       progress=False))
    model = Model.load(model_dir)
    words, words_out = model.table("words").copy(), model.table("words_out").copy()
    events = training_events(sample_corpus[0])
    keys = model.keys("docs").to_pylist()
    chosen = np.random.default_rng(1).choice(len(keys), 1000, replace=False)
    asked = {keys[i]: events[keys[i]] for i in chosen}
    vectors = model.infer(asked)
    np.testing.assert_array_equal(model.infer(asked), vectors)
    np.testing.assert_array_equal(model.table("words"), words)
    np.testing.assert_array_equal(model.table("words_out"), words_out)
    truth = pq.read_table(TRUTH)
    community = dict(zip(truth.column("user_id").to_pylist(), truth.column("community").to_pylist()))
    labels = np.array([community[keys[i]] for i in chosen])
    similarity = unit_rows(vectors) @ unit_rows(vectors).T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argsort(-similarity, axis=1)[:, :10]
    votes = np.array([np.bincount(labels[row], minlength=8).argmax() for row in nearest])
    accuracy = float(np.mean(votes == labels))
    print(f"PV-DM inferred k-NN community accuracy {accuracy:.2f}")
    assert accuracy >= 0.3


def test_a_missing_or_untrained_model_is_a_clear_error(tmp_path, capsys, few_users_file):
    path, _ = few_users_file
    missing = str(tmp_path / "no-such-model")
    out = str(tmp_path / "out.parquet")
    code = main(["infer", "--model", missing, path, "--out", out, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: {missing}: no such model directory"]
    assert not os.path.exists(out)
    with pytest.raises(UserError, match="not a trained model"):
        infer(str(tmp_path), [path])


# -- events that do not fit the model (issue 26, item 3) --------------------------------------------------

def test_events_of_another_site_are_refused_in_one_line_and_nothing_is_written(trained_model, tmp_path, capsys):
    events = str(tmp_path / "elsewhere.csv")
    with open(events, "w") as fh:
        fh.write("user_id,url\n" + "".join(f"v{i % 40},https://elsewhere.example/{i % 97}\n" for i in range(500)))
    out = str(tmp_path / "inferred.parquet")
    code = main(["infer", "--model", trained_model, events, "--out", out, "--no-progress"])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert code == 2 and "inferred" not in captured.out and len(errors) == 1
    assert errors[0].startswith(f"error: {events}: none of the 500 events has a URL the model knows (their 97 distinct")
    assert errors[0].endswith("does --token-col url hold their URLs?")  # an example of each side, not a guess
    assert os.listdir(tmp_path) == ["elsewhere.csv"]
    with pytest.raises(UserError, match="^the events: none of the 2 events"):  # the Python API says the same
        Model.load(trained_model).infer({"v1": ["https://elsewhere.example/1", "https://elsewhere.example/2"]})


def test_events_that_barely_overlap_the_model_get_a_warning_with_the_shares(trained_model, few_users_file, tmp_path,
                                                                         logged):
    path, _ = few_users_file
    known = pq.read_table(path, columns=["user_id", "url"]).slice(0, 30)  # 30 known events, of the first users
    strangers = pa.table({"user_id": [f"v{i % 200}" for i in range(600)],
                          "url": [f"https://elsewhere.example/{i}" for i in range(600)]})
    mixed = _write(pa.concat_tables([known, strangers]), tmp_path)
    summary = infer(trained_model, [mixed], str(tmp_path / "out.parquet"), progress=False)
    placed = summary["users"] - summary["users_without_known_urls"]
    assert summary["rows"] == placed > 0
    warnings = [r.getMessage() for r in logged.records if r.levelname == "WARNING"]
    assert warnings == [(f"warning: only 4.8% of the events (30 of 630) have a URL the model knows, and "
                         f"{placed / summary['users']:.1%} of the users ({placed:,} of {summary['users']:,}) get a "
                         "vector: these events hardly fit the model (another site, or another column read as the URL?)"),
                        ("warning: 200 users have no URL the model knows (v0, v1, v2, v3, v4 and 195 more): their rows "
                         f"in {summary['path']} have a null vector")]
    logged.clear()
    infer(trained_model, [path], str(tmp_path / "fits.parquet"), progress=False)  # the model's own site: no word
    assert not [r for r in logged.records if r.levelname == "WARNING"]


def test_inferred_vectors_record_the_model_and_neighbors_reads_them_by_key(trained_model, few_users_file, tmp_path,
                                                                         capsys):
    from doc2vec_dist.modeldir import ModelDir
    from doc2vec_dist.provenance import of_parquet

    path, _ = few_users_file
    out = str(tmp_path / "inferred.parquet")
    infer(trained_model, [path], out, progress=False, seed=3)
    manifest = ModelDir(trained_model).manifest
    assert of_parquet(out) == {"model": os.path.abspath(trained_model), "model_id": manifest["model_id"],
                               "version": 10, "table": "docs", "derived_from": []}
    # neighbours of an inferred user, by its key, from the command line: the model's own users
    written = pq.read_table(out)
    key = written.column("key")[5].as_py()
    vector = np.asarray(written.column("vector")[5].as_py(), np.float32)
    assert main(["neighbors", "--model", trained_model, "--vectors", out, "--key", key, "--k", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "key\tneighbor\tscore\trank" and len(lines) == 5
    expected = Model.load(trained_model).neighbors(vectors=vector, k=5).to_pydict()  # its own row is left out
    shown = [line.split("\t")[1] for line in lines[1:]]
    assert shown == [n for n in expected["neighbor"] if n != key][:4]
    assert all(line.startswith(f"{key}\t") for line in lines[1:])


# -- users infer cannot place: named, marked, and skipped by every reader (issue 47) ---------------------

def test_users_without_a_known_url_are_named_and_every_reader_of_the_file_skips_them(trained_model, few_users_file,
                                                                                   tmp_path, capsys):
    from doc2vec_dist.index import build_index

    path, _users = few_users_file
    events = pq.read_table(path, columns=["user_id", "url"]).slice(0, 200)
    placed = pc.unique(events.column("user_id")).to_pylist()
    strangers = [f"stranger{i}" for i in range(7)]
    lost = pa.table({"user_id": strangers, "url": [f"https://never.example/{i}" for i in range(7)]})
    mixed = _write(pa.concat_tables([events, lost]), tmp_path)
    out = str(tmp_path / "inferred.parquet")
    assert main(["infer", "--model", trained_model, mixed, "--out", out, "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert (f"warning: 7 users have no URL the model knows (stranger0, stranger1, stranger2, stranger3, stranger4 and "
            f"2 more): their rows in {out} have a null vector") in captured.err.splitlines()
    assert f"inferred {len(placed)} user vectors (dim 32) to {out}" in captured.out
    assert "and 7 users without one (a null vector)" in captured.out
    written = pq.read_table(out)
    assert written.num_rows == len(placed) + 7 and written.column("vector").null_count == 7

    # neighbors --vectors: the keys without a vector are skipped, named, and the others answered
    assert main(["neighbors", "--model", trained_model, "--vectors", out, "--key", placed[0], "--key", "stranger3",
                 "--k", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [(f"warning: {out}: 1 key asked has a null vector (a user infer could not "
                                         "place), left out of the answer: stranger3")]
    lines = captured.out.splitlines()
    assert lines[0] == "key\tneighbor\tscore\trank" and len(lines) == 4
    assert all(line.startswith(f"{placed[0]}\t") for line in lines[1:])

    # index --vectors: the null rows stay out of the index, named; the others are indexed
    params = build_index(str(tmp_path / "users.index"), kind="flat", vectors_path=out, progress=False)
    assert params["rows"] == len(placed) and params["null_vectors"] == 7
    keys = pq.read_table(str(tmp_path / "users.index" / "keys.parquet")).column("key").to_pylist()
    assert sorted(keys) == sorted(placed)
    assert main(["index", "--vectors", out, "--kind", "hnsw", "--out", str(tmp_path / "hnsw.index"),
                 "--no-progress"]) == 0
    assert (f"warning: {out}: 7 rows with a null or all-zero vector (users infer could not place, rows never trained) left out of the index: "
            "stranger0, stranger1, stranger2, stranger3, stranger4 and 2 more") in capsys.readouterr().err.splitlines()


# -- a review of infer: keys as prepare reads them, rows never trained, what the flags and numbers say -----------

def test_model_infer_gives_each_user_its_row_whatever_prepare_makes_of_the_keys(trained_model, few_users_file):
    """prepare strips keys of whitespace and reads them as strings: Model.infer looked its rows up by the keys as
    given (KeyError ' f '), gave 1 and "1" one vector and the other a NaN row with a false warning, the empty key a
    NaN row, None a TypeError and {} an error naming a temporary file."""
    path, users = few_users_file
    events = pq.read_table(path, columns=["user_id", "url"])
    urls = {u: events.filter(pc.equal(events.column("user_id"), u)).column("url").to_pylist() for u in users[:2]}
    a, b = urls[users[0]], urls[users[1]]
    model = Model.load(trained_model)
    plain = model.infer({"f": a, "g": b})
    np.testing.assert_array_equal(model.infer({" f ": a, "g": b}), plain)  # " f " is read as "f": f's vector
    np.testing.assert_array_equal(model.infer([(" f", u) for u in a] + [("g", u) for u in b]), plain)
    table = pa.table({"user_id": ["f "] * len(a) + ["g"] * len(b), "url": a + b})
    np.testing.assert_array_equal(model.infer(table), plain)
    # keys that would be one user, or none: one line naming them, never another user's row
    with pytest.raises(UserError, match=r"^the events: the keys 1 and '1' are one user once read as prepare reads "
                                        r"keys \('1': as strings, stripped of whitespace\)"):
        model.infer({1: a, "1": b, "g": a})
    with pytest.raises(UserError, match=r"^the events: the keys 'x ' and 'x' are one user"):
        model.infer(pa.table({"user_id": ["x ", "x"], "url": [a[0], b[0]]}))
    with pytest.raises(UserError, match=r"^the events: the key '' is empty; give each user a key"):
        model.infer({"": a, "g": b})
    with pytest.raises(UserError, match=r"^the events: a user's key is None"):
        model.infer({None: a, "g": b})
    # None is a user without URLs, as an empty list is: a row of NaN, named
    with pytest.warns(UserWarning, match=r"^1 user has no URL the model knows \(a\): its row is NaN"):
        vectors = model.infer({"a": None, "g": b})
    assert np.isnan(vectors[0]).all() and np.isfinite(vectors[1]).all()
    assert model.infer({}).shape == (0, 32) and model.infer([]).shape == (0, 32)


def test_urls_of_the_vocabulary_that_no_event_trained_count_as_urls_the_model_never_saw(trained_model, tmp_path,
                                                                                      logged):
    """A URL all of whose events were held out has a row of zeros that training never moved: a user with only such
    URLs got its random start moved by negatives alone, without a word. They are now URLs the model never saw:
    composed from their site's pages, or, with --no-compose, dropped, the user left without a vector and named."""
    from doc2vec_dist.modeldir import ModelDir

    vocab = ModelDir(trained_model).vocab()
    counts = vocab.column("count").to_numpy()
    untrained = vocab.column("token").take(pa.array(np.flatnonzero(counts == 0)[:3])).to_pylist()
    trained = vocab.column("token").take(pa.array(np.argsort(-counts)[:3])).to_pylist()
    assert len(untrained) == 3  # the sample is prepared with 20% of each user's URLs held out
    events = _write(pa.table({"user_id": ["unseen"] * 3 + ["seen"] * 3, "url": untrained + trained}), tmp_path)
    logged.clear()
    summary = infer(trained_model, [events], str(tmp_path / "dropped.parquet"), compose=False, progress=False)
    written = dict(zip(*pq.read_table(summary["path"]).to_pydict().values()))
    assert written["unseen"] is None and written["seen"] is not None
    assert (summary["untrained_urls"], summary["unknown_urls"], summary["users_without_known_urls"]) == (3, 3, 1)
    assert "3 URLs (3 events) are in the model's vocabulary but no event trained them" in logged.text
    assert "warning: 1 user has no URL the model knows (unseen)" in logged.text
    summary = infer(trained_model, [events], str(tmp_path / "composed.parquet"), progress=False)
    assert (summary["composed_urls"], summary["null_vectors"]) == (3, 0)  # composed from their sites, as new pages
    with pytest.raises(UserError, match="3 of them are, but no event trained them: held out, or cut by "
                                        "max_tokens_per_doc"):
        Model.load(trained_model).infer({"unseen": untrained}, compose=False)
    # Model.composed (url_vectors, export --urls, neighbors --url) reads them as infer does: not their zero row
    composed = Model.load(trained_model).composed(untrained)
    assert "own" not in composed.source.to_pylist() and composed.has_vector.all(), composed.source
    assert Model.load(trained_model).composed(trained).source.to_pylist() == ["own"] * 3


def test_model_infer_of_no_usable_key_or_no_url_at_all_answers_as_documented(trained_model):
    """A table whose every key is null gave prepare's "nothing to prepare, every row was skipped", and {"a": None}
    its "no token occurs at least min_count=1 times" (a setting no Model.infer caller gave): no users, no rows;
    a user without URLs, a row of NaN named in a warning, as the docstring says."""
    from doc2vec_dist.scoring import ServingWarning

    model = Model.load(trained_model)
    url = model.keys("words_out")[0].as_py()
    assert model.infer(pa.table({"user_id": pa.array([None, None], pa.string()), "url": [url, url]})).shape == (0, 32)
    with pytest.warns(ServingWarning, match=r"1 user has no URL the model knows \(a\)"):
        rows = model.infer({"a": None})
    assert rows.shape == (1, 32) and np.isnan(rows).all()


def test_infer_refuses_a_learning_rate_that_is_not_a_finite_number(trained_model):
    """alpha=inf made every vector NaN: a null vector for every user, exit 0."""
    model = Model.load(trained_model)
    url = model.keys("words_out")[0].as_py()
    for option, value in (("alpha", float("inf")), ("min_alpha", float("inf")), ("alpha", float("nan"))):
        with pytest.raises(UserError, match=f"{option} must be a finite number, not {value}"):
            model.infer({"a": [url]}, **{option: value})
