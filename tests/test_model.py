"""The Python API: Model.load(path).vector / .neighbors, the same answers as the command line's."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import Model, checkpoint
from doc2vec_dist.checkpoint import ModelDir
from doc2vec_dist.errors import UserError


def test_vector_is_the_checkpoint_row_of_that_key(trained_model):
    model = Model.load(trained_model)
    keys = ModelDir(trained_model).keys("docs").to_pylist()
    docs = checkpoint.ModelDir(trained_model).read_table("docs")
    np.testing.assert_array_equal(model.vector(keys[17]), docs[17])
    url = ModelDir(trained_model).keys("words_out")[3].as_py()
    np.testing.assert_array_equal(model.vector(url, table="words_out"), checkpoint.ModelDir(trained_model).read_table("words_out")[3])


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
    top = model.neighbors(user, k=3, against="words_out").to_pylist()
    d = model.vector(user)
    from doc2vec_dist.scoring import url_log_prior

    prior = url_log_prior(ModelDir(trained_model))
    urls = ModelDir(trained_model).keys("words_out").to_pylist()
    expected = checkpoint.ModelDir(trained_model).read_table("words_out") @ d + prior
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
    docs = checkpoint.ModelDir(trained_model).read_table("docs")
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
    docs = checkpoint.ModelDir(numeric_model).read_table("docs")
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
    urls_by_key = model.neighbors(keys[0], k=5, against="words_out")
    assert urls_by_vector.column("neighbor").to_pylist() == urls_by_key.column("neighbor").to_pylist()
    np.testing.assert_allclose(urls_by_vector.column("score").to_numpy(), urls_by_key.column("score").to_numpy(),
                               rtol=1e-6)


def test_neighbors_of_a_user_just_inferred(numeric_model, tmp_path):
    from doc2vec_dist.index import build_index

    model = Model.load(numeric_model)
    urls = ModelDir(numeric_model).keys("words_out").to_pylist()
    inferred = model.infer({"alice": urls[:6]}, progress=False)
    found = model.neighbors(vectors=inferred[0], k=5).to_pylist()
    docs, keys = checkpoint.ModelDir(numeric_model).read_table("docs"), ModelDir(numeric_model).keys("docs").to_pylist()
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
    with pytest.raises(UserError) as err:
        model.neighbors(url)
    assert str(err.value) == (f"unknown docs key {url!r}: it is a URL of the model's vocabulary, not a user; add "
                              "--table words_out for similar URLs")
    with pytest.raises(UserError, match=f"unknown words_out key {user!r}: it is a user of the model, not a URL; drop "
                                        r"--table words_out for similar users \(--against words_out"):
        model.neighbors(user, table="words_out")
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
