"""The Python API: Model.load(path).vector / .neighbors, the same answers as the command line's."""

import numpy as np
import pytest

from doc2vec_dist import Model, checkpoint
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import keys_of


def test_vector_is_the_checkpoint_row_of_that_key(trained_model):
    model = Model.load(trained_model)
    keys = keys_of(trained_model, "docs").to_pylist()
    docs = checkpoint.read_table(trained_model, "docs")
    np.testing.assert_array_equal(model.vector(keys[17]), docs[17])
    url = keys_of(trained_model, "words_out")[3].as_py()
    np.testing.assert_array_equal(model.vector(url, table="words_out"), checkpoint.read_table(trained_model, "words_out")[3])


def test_neighbors_of_many_keys_at_once_and_cosine_scores(trained_model):
    model = Model.load(trained_model)
    keys = keys_of(trained_model, "docs").to_pylist()[:3]
    result = model.neighbors(keys, k=5)
    assert result.num_rows == 15
    assert result.column("key").to_pylist() == [k for k in keys for _ in range(5)]
    first = result.slice(0, 5).to_pylist()
    assert all(r["neighbor"] != keys[0] for r in first)
    a, b = model.vector(keys[0]), model.vector(first[0]["neighbor"])
    assert first[0]["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-5)


def test_urls_for_a_user_are_scored_by_log_probability(trained_model):
    model = Model.load(trained_model)
    user = keys_of(trained_model, "docs")[5].as_py()
    top = model.neighbors(user, k=3, against="words_out").to_pylist()
    d = model.vector(user)
    from doc2vec_dist.index import url_log_prior

    prior = url_log_prior(trained_model)
    urls = keys_of(trained_model, "words_out").to_pylist()
    expected = checkpoint.read_table(trained_model, "words_out") @ d + prior
    best = np.argsort(-expected)[:3]
    assert [r["neighbor"] for r in top] == [urls[i] for i in best]
    assert top[0]["score"] == pytest.approx(float(expected[best[0]]), rel=1e-4)


def test_indexes_are_built_once_per_table_pair(trained_model):
    model = Model.load(trained_model)
    key = keys_of(trained_model, "docs")[0].as_py()
    model.neighbors(key)
    index = model._index("docs", "docs")
    model.neighbors(key, k=3)
    assert model._index("docs", "docs") is index


def test_unknown_key_and_non_model_are_clear_errors(trained_model, tmp_path):
    with pytest.raises(UserError, match="did you mean"):
        Model.load(trained_model).vector(keys_of(trained_model, "docs")[0].as_py()[:-1])
    with pytest.raises(UserError, match="not a trained model"):
        Model.load(str(tmp_path))


def test_a_vector_is_read_from_the_parts_without_loading_the_table(trained_model):
    model = Model.load(trained_model)
    keys = keys_of(trained_model, "docs").to_pylist()
    docs = checkpoint.read_table(trained_model, "docs")
    picked = [keys[i] for i in (4999, 0, 2501, 2)]  # rows from both parts, out of order
    np.testing.assert_array_equal(model.vectors(picked), docs[[4999, 0, 2501, 2]])
    assert model._tables == {}  # only the wanted rows were read


def test_similar_urls_for_a_url(trained_model):
    model = Model.load(trained_model)
    url = keys_of(trained_model, "words_out")[0].as_py()
    result = model.neighbors(url, k=4, table="words_out").to_pylist()
    assert [r["rank"] for r in result] == [1, 2, 3, 4] and all(r["neighbor"] != url for r in result)
    a, b = model.vector(url, "words_out"), model.vector(result[0]["neighbor"], "words_out")
    assert result[0]["score"] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-5)


def test_neighbors_on_a_saved_ivfpq_index(trained_model, tmp_path):
    from doc2vec_dist.index import build_index

    index = str(tmp_path / "users.index")
    build_index(index, kind="ivfpq", model=trained_model, progress=False)
    model = Model.load(trained_model)
    keys = keys_of(trained_model, "docs").to_pylist()[:20]
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
