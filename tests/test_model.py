"""The Python API: Model.load(path).vector / .neighbors, the same answers as the command line's."""

import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import Model, modeldir
from doc2vec_dist.errors import UserError
from doc2vec_dist.modeldir import ModelDir
from doc2vec_dist.scoring import ServingWarning


def test_vector_is_the_checkpoint_row_of_that_key(trained_model):
    model = Model.load(trained_model)
    keys = ModelDir(trained_model).keys("docs").to_pylist()
    docs = modeldir.ModelDir(trained_model).read_table("docs")
    np.testing.assert_array_equal(model.vector(keys[17]), docs[17])
    url = ModelDir(trained_model).keys("words_out")[3].as_py()
    np.testing.assert_array_equal(model.vector(url, table="words_out"), modeldir.ModelDir(trained_model).read_table("words_out")[3])


def test_neighbors_of_many_keys_at_once_and_cosine_scores(trained_model):
    model = Model.load(trained_model)
    keys = ModelDir(trained_model).keys("docs").to_pylist()[:3]
    result = model.neighbors(keys, k=5)
    assert result.num_rows == 15
    assert result.column("key").to_pylist() == [k for k in keys for _ in range(5)]
    first = result.slice(0, 5).to_pylist()
    assert all(r["neighbor"] != keys[0] for r in first)
    a, b = model.vector(keys[0]), model.vector(first[0]["neighbor"])
    assert first[0]["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-5)


def test_urls_for_a_user_are_scored_by_log_probability(trained_model):
    model = Model.load(trained_model)
    user = ModelDir(trained_model).keys("docs")[5].as_py()
    top = model.neighbors(user, k=3, against="words_out", exclude_seen=False).to_pylist()  # the whole ranking
    d = model.vector(user)
    from doc2vec_dist.scoring import url_log_prior

    prior = url_log_prior(ModelDir(trained_model))
    urls = ModelDir(trained_model).keys("words_out").to_pylist()
    expected = modeldir.ModelDir(trained_model).read_table("words_out") @ d + prior
    best = np.argsort(-expected)[:3]
    assert [r["neighbor"] for r in top] == [urls[i] for i in best]
    assert top[0]["score"] == pytest.approx(float(expected[best[0]]), rel=1e-4)


def test_indexes_are_built_once_per_table_pair(trained_model):
    model = Model.load(trained_model)
    key = ModelDir(trained_model).keys("docs")[0].as_py()
    model.neighbors(key)
    index = model._index("docs", "docs")
    model.neighbors(key, k=3)
    assert model._index("docs", "docs") is index


def test_unknown_key_and_non_model_are_clear_errors(trained_model, tmp_path):
    with pytest.raises(UserError, match="did you mean"):
        Model.load(trained_model).vector(ModelDir(trained_model).keys("docs")[0].as_py()[:-1])
    with pytest.raises(UserError, match="not a trained model"):
        Model.load(str(tmp_path))


def test_a_vector_is_read_from_the_parts_without_loading_the_table(trained_model):
    model = Model.load(trained_model)
    keys = ModelDir(trained_model).keys("docs").to_pylist()
    docs = modeldir.ModelDir(trained_model).read_table("docs")
    picked = [keys[i] for i in (4999, 0, 2501, 2)]  # rows from both parts, out of order
    np.testing.assert_array_equal(model.vectors(picked), docs[[4999, 0, 2501, 2]])
    assert model._tables == {}  # only the wanted rows were read


def test_similar_urls_for_a_url(trained_model):
    model = Model.load(trained_model)
    url = ModelDir(trained_model).keys("words_out")[0].as_py()
    result = model.neighbors(url, k=4, table="words_out").to_pylist()
    assert [r["rank"] for r in result] == [1, 2, 3, 4] and all(r["neighbor"] != url for r in result)
    a, b = model.vector(url, "words_out"), model.vector(result[0]["neighbor"], "words_out")
    assert result[0]["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-5)


def test_neighbors_on_a_saved_ivfpq_index(trained_model, tmp_path):
    from doc2vec_dist.index import build_index

    index = str(tmp_path / "users.index")
    build_index(index, kind="ivfpq", model=trained_model, progress=False)
    model = Model.load(trained_model)
    keys = ModelDir(trained_model).keys("docs").to_pylist()[:20]
    served = model.neighbors(keys, k=5, index=index)
    exact = model.neighbors(keys, k=5)
    assert served.num_rows == 100 and all(r["key"] != r["neighbor"] for r in served.to_pylist())
    assert served.column("rank").to_pylist() == [1, 2, 3, 4, 5] * 20
    overlap = set(zip(served["key"].to_pylist(), served["neighbor"].to_pylist())) & set(
        zip(exact["key"].to_pylist(), exact["neighbor"].to_pylist()))
    assert len(overlap) >= 90
    # re-ranked scores are the exact cosines
    first = served.slice(0, 1).to_pylist()[0]
    a, b = model.vector(first["key"]), model.vector(first["neighbor"])
    assert first["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-5)
    assert model.saved_index(index) is model.saved_index(index)  # loaded once
    with pytest.raises(UserError, match="within its own table"):
        model.neighbors(keys[0], against="words_out", index=index)
    with pytest.raises(UserError, match="not an index directory"):
        model.neighbors(keys[0], index=str(tmp_path))


# ------------------------------------------------------- numeric keys, and neighbours of a vector

@pytest.fixture(scope="module")
def numeric_model(tmp_path_factory):
    """A real gensim (baseline) model of 400 sample users whose ids were numbers (100000, 100001, …)."""
    from doc2vec_dist.baseline import train_gensim
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.prepare import prepare

    root = tmp_path_factory.mktemp("numeric")
    sample = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sample", "events")
    events = pq.read_table(sample, columns=["user_id", "url"])
    number = pc.index_in(events["user_id"], value_set=pc.unique(events["user_id"]))
    events = pa.table({"user_id": pc.add(number.cast(pa.int64()), 100000), "url": events["url"]})
    events = events.filter(pc.less(events["user_id"], 100400))
    pq.write_table(events, str(root / "events.parquet"))
    prepare([str(root / "events.parquet")], str(root / "corpus"), progress=False)
    model = str(root / "model")
    train_gensim(str(root / "corpus"), model, TrainConfig(dim=16, epochs=5, sample=0, progress=False), workers=1)
    return model


def test_integer_keys_are_the_strings_prepare_made_of_them(numeric_model):
    model = Model.load(numeric_model)
    keys = ModelDir(numeric_model).keys("docs").to_pylist()
    assert "100000" in keys  # prepare made the number a string
    docs = modeldir.ModelDir(numeric_model).read_table("docs")
    np.testing.assert_array_equal(model.vector(100000), docs[keys.index("100000")])
    np.testing.assert_array_equal(model.vectors([np.int64(100007), "100003"]),
                                  docs[[keys.index("100007"), keys.index("100003")]])
    result = model.neighbors(100000, k=3)
    assert result.column("key").to_pylist() == ["100000"] * 3
    assert result.column("neighbor").to_pylist() == model.neighbors("100000", k=3).column("neighbor").to_pylist()
    with pytest.raises(UserError, match="unknown docs key '99'"):
        model.vector(99)


def test_neighbors_of_vectors_score_as_those_of_keys(numeric_model):
    model = Model.load(numeric_model)
    keys = ["100001", "100002"]
    by_vector = model.neighbors(vectors=model.vectors(keys), k=5)
    by_key = model.neighbors(keys, k=4)
    assert by_vector.column_names == by_key.column_names == ["key", "neighbor", "score", "rank"]
    assert by_vector.column("key").to_pylist() == ["0"] * 5 + ["1"] * 5  # the vector's position
    for i, key in enumerate(keys):
        mine = by_vector.filter(pc.equal(by_vector["key"], str(i))).to_pylist()
        theirs = by_key.filter(pc.equal(by_key["key"], key)).to_pylist()
        # a vector is no key: nothing is left out, so the user's own row comes first at cosine 1
        assert mine[0]["neighbor"] == key and mine[0]["score"] == pytest.approx(1.0, abs=1e-5)
        assert [r["neighbor"] for r in mine[1:]] == [r["neighbor"] for r in theirs]
        np.testing.assert_allclose([r["score"] for r in mine[1:]], [r["score"] for r in theirs], atol=1e-6)
    # URLs for a user: the same d·o + ns_exponent·log count as for its key
    urls_by_vector = model.neighbors(vectors=model.vector(keys[0]), k=5, against="words_out")
    urls_by_key = model.neighbors(keys[0], k=5, against="words_out", exclude_seen=False)  # a vector has no visits
    assert urls_by_vector.column("neighbor").to_pylist() == urls_by_key.column("neighbor").to_pylist()
    np.testing.assert_allclose(urls_by_vector.column("score").to_numpy(), urls_by_key.column("score").to_numpy(),
                               rtol=1e-6)


def test_neighbors_of_a_user_just_inferred(numeric_model, tmp_path):
    from doc2vec_dist.index import build_index

    model = Model.load(numeric_model)
    urls = ModelDir(numeric_model).keys("words_out").to_pylist()
    inferred = model.infer({"alice": urls[:6]}, progress=False)
    found = model.neighbors(vectors=inferred[0], k=5).to_pylist()
    docs, keys = modeldir.ModelDir(numeric_model).read_table("docs"), ModelDir(numeric_model).keys("docs").to_pylist()
    cosine = docs @ inferred[0] / np.linalg.norm(docs, axis=1) / np.linalg.norm(inferred[0])
    best = np.argsort(-cosine)[:5]
    assert [r["neighbor"] for r in found] == [keys[i] for i in best]
    np.testing.assert_allclose([r["score"] for r in found], cosine[best], atol=1e-5)
    # a saved index answers a vector too, with the same neighbours (flat: exact)
    index = str(tmp_path / "users.index")
    build_index(index, kind="flat", model=numeric_model, progress=False)
    served = model.neighbors(vectors=inferred, k=5, index=index).to_pylist()
    assert [r["neighbor"] for r in served] == [keys[i] for i in best]
    with pytest.raises(UserError, match="16-dim vectors"):
        model.neighbors(vectors=np.zeros(15, np.float32))
    with pytest.raises(UserError, match="keys or vectors"):
        model.neighbors("100000", vectors=inferred)


# -- a key of the other table, and keys looked up in a vectors file (issue 26, item 12) -------------------

def test_a_url_asked_as_a_user_says_it_is_a_url_and_which_table_to_give(trained_model):
    model = Model.load(trained_model)
    url, user = model.keys("words_out")[3].as_py(), model.keys("docs")[3].as_py()
    # a Python caller is told the argument to give (issue 47); the command line names its flags (test_bad_input)
    for ask in (model.neighbors, model.vector):
        with pytest.raises(UserError) as err:
            ask(url)
        assert str(err.value) == (f"unknown docs key {url!r}: it is a URL of the model's vocabulary, not a user; give "
                                  'table="words_out" for similar URLs')
    with pytest.raises(UserError) as err:
        model.neighbors(user, table="words_out")
    assert str(err.value) == (f"unknown words_out key {user!r}: it is a user of the model, not a URL; leave out "
                              'table="words_out" for similar users (against="words_out": the URLs likeliest for '
                              "the user)")
    with pytest.raises(UserError, match="did you mean"):  # a near miss of neither kind still gets the closest keys
        model.neighbors(user[:-1])


def test_keys_looked_up_in_a_vectors_file_are_searched_as_its_vectors(small_models, tmp_path):
    from doc2vec_dist.export import export

    first = small_models.make(tmp_path / "first", 1)
    users = str(tmp_path / "users.parquet")
    export(first, "docs", users, progress=False)
    model = Model.load(first)
    by_file = model.neighbors(["u7", "u9"], k=5, vectors_file=users)
    assert by_file.equals(model.neighbors(["u7", "u9"], k=5))  # its own row left out, as a key's is
    with pytest.raises(UserError, match=rf"unknown {users} key 'u77x'; did you mean 'u77'"):
        model.neighbors(["u77x"], vectors_file=users)


def test_a_vectors_file_of_another_model_is_refused_naming_both(small_models, tmp_path, capsys):
    from doc2vec_dist.cli import main
    from doc2vec_dist.export import export

    first, second = small_models.make(tmp_path / "first", 1), small_models.make(tmp_path / "second", 2)
    users = str(tmp_path / "users")  # a directory export
    export(first, "docs", users, progress=False)
    assert main(["neighbors", "--model", second, "--vectors", users, "--key", "u1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {users} was made from the model at {first} (id ")
    assert f"another model than the model at {second} (id " in err[0]
    assert err[0].endswith(f"use vectors of {second} (infer or export them again with the model)")


def test_a_baseline_model_has_an_id_too(numeric_model):
    assert len(ModelDir(numeric_model).manifest["model_id"]) == 32


# -- rows without a vector, k, and the URLs a user visited (issue 47) -----------------------------------

def test_neighbors_skip_all_nan_rows_naming_them_and_answer_the_others(trained_model):
    """Model.infer gives NaN rows for users it cannot place: a query of them is skipped with a warning
    that names them, not answered with arbitrary users at score 0."""
    model = Model.load(trained_model)
    keys = model.keys("docs").to_pylist()
    vectors = model.vectors(keys[:3])
    vectors[1] = np.nan
    with pytest.warns(UserWarning) as caught:
        result = model.neighbors(vectors=vectors, k=4)
    assert [str(w.message) for w in caught] == [
        "neighbors: 1 vector all NaN (a user infer could not place) left out of the answer: at position 1"]
    assert result.column("key").to_pylist() == ["0"] * 4 + ["2"] * 4  # the others keep their positions
    alone = model.neighbors(vectors=vectors[[0, 2]], k=4)
    assert result.column("neighbor").to_pylist() == alone.column("neighbor").to_pylist()
    with pytest.warns(UserWarning, match=r"2 vectors all NaN .* left out of the answer: bob, carol$"):
        named = model.neighbors(vectors=np.stack([vectors[0], vectors[1], vectors[1]]), names=["alice", "bob", "carol"],
                                k=3, against="words_out")
    assert named.column("key").to_pylist() == ["alice"] * 3
    # only a row of NaN alone is a user without a vector: a partly NaN row, or inf, is refused naming its row
    broken = vectors.copy()
    broken[1] = broken[0]
    broken[1, 3] = np.nan
    with pytest.raises(UserError, match=r"^neighbors: the vector at position 1 holds NaN or inf in 1 of its 32 "):
        model.neighbors(vectors=broken)
    broken[1, 3] = np.inf
    with pytest.raises(UserError, match=r"^neighbors: the vector at position 1 holds NaN or inf"):
        model.neighbors(vectors=broken)
    with pytest.warns(UserWarning, match="left out of the answer: at position 0$"):
        assert model.neighbors(vectors=vectors[1]).num_rows == 0  # nothing left to answer: an empty table


def test_a_row_never_trained_is_left_out_of_neighbors_and_named(small_models, tmp_path, caplog):
    """A row all zero (a URL with no event in the corpus: seen only in held-out pairs, or cut by
    --max-tokens-per-doc) scored 0 against every row: `neighbors --table words_out --key URL` answered
    arbitrary URLs at 0.0000 with exit 0. Such a query is left out and named, as a user without a vector is."""
    from doc2vec_dist import checkpoint

    model = small_models.make(tmp_path / "model", 1, rows=50)
    matrix = np.random.default_rng(2).standard_normal((50, small_models.DIM)).astype(np.float32)
    matrix[3] = 0.0
    version = checkpoint.next_version(model)
    part = checkpoint.write_slice(model, version, "docs", 0, 1, np.arange(50), matrix)
    checkpoint.commit(model, version, {"docs": [part]}, {"docs": small_models.DIM}, {}, keep=3)
    found = Model.load(model)
    with pytest.warns(UserWarning, match=r"^neighbors: 1 key asked of docs is all zero \(a row never trained: .*\), "
                                         r"left out of the answer: u3$"):
        table = found.neighbors(["u3", "u4"], k=3)
    assert set(table.column("key").to_pylist()) == {"u4"} and table.num_rows == 3
    # nor is it ever an answer: asked for every other row, u4 is answered the 48 trained ones
    answered = found.neighbors("u4", k=60).column("neighbor").to_pylist()
    assert len(answered) == 48 and "u3" not in answered and "u4" not in answered
    # nor is it indexed (`index --model` kept it, and prepare said it would not be): named as a null vector is
    from doc2vec_dist.index import build_index
    from doc2vec_dist.index_sources import read_keys

    index = str(tmp_path / "users.index")
    with caplog.at_level("WARNING"):
        build_index(index, kind="flat", model=model, progress=False)
    assert "1 row with a null or all-zero vector" in caplog.text and "u3" in caplog.text
    indexed = read_keys(os.path.join(index, "keys.parquet")).to_pylist()
    assert len(indexed) == 49 and "u3" not in indexed
    with pytest.warns(UserWarning, match=r"^neighbors: 1 vector is all zero .* left out of the answer: at position 1$"):
        table = found.neighbors(vectors=np.stack([matrix[4], matrix[3]]), k=3)
    assert set(table.column("key").to_pylist()) == {"0"}


@pytest.mark.parametrize("k", [0, -3, 2.5, True, "5"])
def test_k_is_a_whole_number_of_at_least_one(trained_model, k):
    model = Model.load(trained_model)
    key = model.keys("docs")[0].as_py()
    with pytest.raises(UserError) as err:
        model.neighbors(key, k=k)
    assert str(err.value) == f"neighbors: k must be a whole number >= 1, not {k!r}"


def test_a_saved_index_refuses_k_below_one(numeric_model, tmp_path):
    from doc2vec_dist.index import ServedIndex, build_index

    index = str(tmp_path / "users.index")
    build_index(index, kind="flat", model=numeric_model, progress=False)
    served = ServedIndex.load(index)
    query = np.ones((1, 16), np.float32) / 4
    assert served.search(query, 1)[1].shape == (1, 1)
    with pytest.raises(UserError, match=r"^search: k must be a whole number >= 1, not 0$"):
        served.search(query, 0)
    with pytest.raises(UserError, match=r"^neighbors: k must be a whole number >= 1, not -3$"):
        Model.load(numeric_model).neighbors("100000", k=-3, index=index)


def _seen_urls(model: Model, corpus: str, user: str) -> set[str]:
    from doc2vec_dist.evaluate import seen_tokens

    row = int(model.rows(user)[0])
    urls = model.keys("words_out").to_pylist()
    return {urls[t] for t in seen_tokens(corpus, np.array([row]))[row]}


def test_likeliest_urls_for_a_user_leave_out_the_urls_it_visited(trained_model, sample_corpus, capsys):
    """As evaluate ranks them: a page the user was trained on is no prediction. The URLs visited are
    read from the model's corpus; a user with few unseen URLs still gets k answers (the search goes deeper)."""
    from doc2vec_dist.cli import main

    model = Model.load(trained_model)
    users = model.keys("docs").to_pylist()[:40]
    k = 10
    before = {u: model.neighbors(u, k=k, against="words_out", exclude_seen=False).column("neighbor").to_pylist()
              for u in users}
    seen = {u: _seen_urls(model, sample_corpus[0], u) for u in users}
    user = max(users, key=lambda u: len(set(before[u]) & seen[u]))
    assert set(before[user]) & seen[user]  # the old answer held pages the user visited
    got = model.neighbors([user, users[0]], k=k, against="words_out")  # on by default for user keys
    mine = got.filter(pc.equal(got["key"], user))
    assert mine.column("rank").to_pylist() == list(range(1, k + 1))
    everything = model.neighbors(user, k=k + len(seen[user]), against="words_out", exclude_seen=False)
    assert mine.column("neighbor").to_pylist() == [u for u in everything.column("neighbor").to_pylist()
                                                   if u not in seen[user]][:k]
    np.testing.assert_allclose(mine.column("score").to_numpy(),
                               [s for u, s in zip(everything["neighbor"].to_pylist(), everything["score"].to_pylist())
                                if u not in seen[user]][:k], rtol=1e-6)
    # k past what is left: every unseen URL of the vocabulary, and no more; a URL with no event in the corpus
    # (all its events held out: count 0, its row never trained) is no answer
    vocab = len(model.keys("words_out"))
    trained = model.table("words_out").any(axis=1) & (model.dir.vocab().column("count").to_numpy() > 0)
    answers = {model.keys("words_out")[int(i)].as_py() for i in np.flatnonzero(trained)}
    assert len(answers) < vocab  # the sample's held-out split leaves some
    assert model.neighbors(user, k=vocab, against="words_out").num_rows == len(answers - seen[user])
    # the command line: on by default, --no-exclude-seen for the model's ranking as it is
    assert main(["neighbors", "--model", trained_model, "--key", user, "--against", "words_out", "--k", "10"]) == 0
    shown = [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()[1:]]
    assert shown == mine.column("neighbor").to_pylist()
    assert main(["neighbors", "--model", trained_model, "--key", user, "--against", "words_out", "--k", "10",
                 "--no-exclude-seen"]) == 0
    assert [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()[1:]] == before[user]
    # similar users, or a vector: nothing to leave out, so exclude_seen is refused rather than ignored
    with pytest.raises(UserError, match=r"^neighbors: exclude_seen leaves out the URLs a user visited: it needs "):
        model.neighbors(user, exclude_seen=True)
    with pytest.raises(UserError, match=r"^neighbors: exclude_seen leaves out the URLs a user visited: it needs "):
        model.neighbors(vectors=model.vector(user), against="words_out", exclude_seen=True)


def test_a_models_user_asked_from_a_vectors_file_or_by_url_is_told_what_is_not_left_out(trained_model, tmp_path,
                                                                                         capsys):
    # asked from an export (--vectors), a user of the model got the URLs it visited back without a word, and
    # --exclude-seen was refused as if it were no user of the model; --url --exclude-seen was ignored
    from doc2vec_dist.cli import main
    from doc2vec_dist.export import export

    model = Model.load(trained_model)
    user = model.keys("docs")[0].as_py()
    path = str(tmp_path / "users.parquet")
    export(trained_model, "docs", path, progress=False)
    with pytest.warns(ServingWarning, match=rf"^neighbors: 1 user of {path} asked against words_out is the model's "
                                            rf"\({user}\): asked by the file's vectors, the URLs they visited are "
                                            "not left out of the answer; ask them by key without vectors_file"):
        model.neighbors(user, vectors_file=path, against="words_out")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the model's own ranking asked for as it is: nothing to say
        model.neighbors(user, vectors_file=path, against="words_out", exclude_seen=False)
    with pytest.raises(UserError, match=rf"^neighbors: exclude_seen leaves out the URLs a user of the model visited, "
                                        rf"read from its corpus by its row: the users of {path} are asked by the "
                                        rf"file's vectors; ask them by key without vectors_file \({user} are"):
        model.neighbors(user, vectors_file=path, against="words_out", exclude_seen=True)
    url = model.keys("words_out")[0].as_py()
    assert main(["neighbors", "--model", trained_model, "--url", url, "--exclude-seen", "--k", "2"]) == 2
    assert "--exclude-seen leaves out the URLs a user visited: it needs" in capsys.readouterr().err


def test_without_the_models_corpus_the_visited_urls_stay_in_and_it_says_so(trained_model, tmp_path, capsys):
    import json
    import shutil

    from doc2vec_dist.cli import main

    copy = shutil.copytree(trained_model, str(tmp_path / "model"))
    with open(os.path.join(copy, "config.json")) as fh:
        config = json.load(fh)
    gone = str(tmp_path / "corpus-gone")
    config["corpus"] = gone
    with open(os.path.join(copy, "config.json"), "w") as fh:
        json.dump(config, fh)
    model = Model.load(copy)
    user = model.keys("docs")[0].as_py()
    with pytest.warns(UserWarning) as caught:
        got = model.neighbors(user, k=5, against="words_out")
    assert [str(w.message) for w in caught] == [
        f"neighbors: the model's corpus {gone} is gone: the URLs each user visited are not left out of the answer"]
    assert got.equals(Model.load(trained_model).neighbors(user, k=5, against="words_out", exclude_seen=False))
    with pytest.raises(UserError, match=rf"^neighbors: the model's corpus {gone} is gone: the URLs each user visited cannot be left out; give "
                                         "exclude_seen=False$"):
        model.neighbors(user, k=5, against="words_out", exclude_seen=True)
    # the command line says it in a line of its own, and the flag to give
    assert main(["neighbors", "--model", copy, "--key", user, "--against", "words_out"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [(f"warning: neighbors: the model's corpus {gone} is gone: the URLs each user visited are not left "
                   "out of the answer")]
    assert main(["neighbors", "--model", copy, "--key", user, "--against", "words_out", "--exclude-seen"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("cannot be left out; give --no-exclude-seen")
