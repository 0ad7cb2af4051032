"""faiss indexes and neighbour queries on the model trained on the sample (8 planted communities)."""

from __future__ import annotations

import itertools
import json
import os

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import checkpoint
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import export, keys_of
from doc2vec_dist.index import build_index, neighbors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = os.path.join(ROOT, "data", "sample", "truth")
COMMUNITIES = 8


@pytest.fixture(scope="module")
def user_community() -> dict[str, int]:
    t = pq.read_table(os.path.join(TRUTH, "users.parquet"), columns=["user_id", "community"])
    return dict(zip(t.column("user_id").to_pylist(), t.column("community").to_pylist()))


@pytest.fixture(scope="module")
def url_community() -> dict[str, int]:
    t = pq.read_table(os.path.join(TRUTH, "urls.parquet"), columns=["url", "community"])
    return dict(zip(t.column("url").to_pylist(), t.column("community").to_pylist()))


@pytest.fixture(scope="module")
def query_users(trained_model) -> list[str]:
    """50 users spread over the id range (ids are in order of first appearance, not by community)."""
    return keys_of(trained_model, "docs").to_pylist()[::100][:50]


def read_index_dir(out: str) -> tuple[faiss.Index, list[str], dict]:
    assert sorted(os.listdir(out)) == ["index.faiss", "keys.parquet", "params.json"]
    with open(os.path.join(out, "params.json")) as fh:
        params = json.load(fh)
    keys = pq.read_table(os.path.join(out, "keys.parquet")).column("key").to_pylist()
    return faiss.read_index(os.path.join(out, "index.faiss")), keys, params


@pytest.mark.parametrize("kind, min_recall", [("flat", 1.0), ("hnsw", 0.9)])
def test_build_index_writes_index_keys_and_params(trained_model, tmp_path, kind, min_recall):
    out = str(tmp_path / f"index-{kind}")
    returned = build_index(out, kind=kind, model=trained_model, table="docs", progress=False)

    index, keys, params = read_index_dir(out)
    assert params == returned
    assert (params["kind"], params["rows"], params["dim"]) == (kind, 5000, 32)
    assert min_recall <= params["recall_at_10_vs_exact"] <= 1.0
    if kind == "flat":
        assert params["recall_at_10_vs_exact"] == 1.0
    assert index.ntotal == 5000 and index.d == 32
    assert keys == keys_of(trained_model, "docs").to_pylist()
    assert os.listdir(tmp_path) == [f"index-{kind}"]  # no temp directory left

    # the index searches cosine: a user's own normalised vector finds that user first
    matrix = checkpoint.read_table(trained_model, "docs")[:5]
    q = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    scores, found = index.search(q.astype(np.float32), 1)
    assert list(found[:, 0]) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-4)


def test_auto_kind_on_a_small_table_is_flat(trained_model, tmp_path):
    params = build_index(str(tmp_path / "idx"), kind="auto", model=trained_model, progress=False)
    assert (params["kind"], params["requested"]) == ("flat", "auto")


def test_index_from_an_exported_parquet_keeps_the_export_keys(trained_model, tmp_path):
    vectors = str(tmp_path / "docs.parquet")
    export(trained_model, "docs", vectors, progress=False)
    out = str(tmp_path / "idx")
    params = build_index(out, kind="flat", vectors_path=vectors, progress=False)

    index, keys, _ = read_index_dir(out)
    assert (params["rows"], params["dim"], params["source"]) == (5000, 32, vectors)
    exported = pq.read_table(vectors)
    assert keys == exported.column("key").to_pylist()  # faiss id i ↔ row i of keys.parquet
    v = checkpoint.matrix_of(exported.column("vector"), 32)[:3]
    _, found = index.search((v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32), 1)
    assert list(found[:, 0]) == [0, 1, 2]


def test_build_index_needs_exactly_one_source(trained_model, tmp_path):
    with pytest.raises(UserError, match="either --model"):
        build_index(str(tmp_path / "idx"), progress=False)
    with pytest.raises(UserError, match="either --model"):
        build_index(str(tmp_path / "idx"), model=trained_model, vectors_path="x.parquet", progress=False)


def test_index_from_a_parquet_without_vectors_is_a_user_error(tmp_path):
    import pyarrow as pa

    bad = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"key": ["a"], "other": [1.0]}), bad)
    with pytest.raises(UserError, match="bad.parquet"):
        build_index(str(tmp_path / "idx"), vectors_path=bad, progress=False)


def test_neighbors_are_ranked_without_the_query_and_scores_descend(trained_model, query_users):
    query = query_users[0]
    result = neighbors(trained_model, [query], k=10).to_pydict()

    assert result["rank"] == list(range(1, 11))
    assert set(result["key"]) == {query}
    assert query not in result["neighbor"]
    assert len(set(result["neighbor"])) == 10
    scores = result["score"]
    assert all(a >= b for a, b in itertools.pairwise(scores))
    assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)  # cosine

    # the scores are the cosine of the checkpoint rows
    keys = keys_of(trained_model, "docs").to_pylist()
    matrix = checkpoint.read_table(trained_model, "docs")
    a, b = matrix[keys.index(query)], matrix[keys.index(result["neighbor"][0])]
    assert scores[0] == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-4)


def test_nearest_users_share_the_planted_community(trained_model, query_users, user_community):
    result = neighbors(trained_model, query_users, k=10).to_pydict()
    assert len(result["key"]) == 10 * len(query_users)
    same = [user_community[q] == user_community[n] for q, n in zip(result["key"], result["neighbor"])]
    share = float(np.mean(same))
    assert share > 0.4, f"{share:.2f} of nearest users share the community (chance: {1 / COMMUNITIES:.3f})"


def test_likeliest_urls_for_a_user_are_urls_of_the_users_community(trained_model, sample_corpus, query_users,
                                                                 user_community, url_community):
    from doc2vec_dist.corpus import Corpus

    result = neighbors(trained_model, query_users, k=10, against="words_out").to_pydict()
    vocab = set(Corpus(sample_corpus[0]).vocab().column("token").to_pylist())
    assert set(result["neighbor"]) <= vocab
    assert result["rank"][:10] == list(range(1, 11))
    same = [user_community[q] == url_community[u] for q, u in zip(result["key"], result["neighbor"])]
    share = float(np.mean(same))
    assert share > 2 / COMMUNITIES, f"{share:.2f} of top URLs are of the user's community"


def test_an_unknown_key_suggests_the_near_miss(trained_model, query_users):
    near_miss = query_users[0][:-1] + ("x" if query_users[0][-1] != "x" else "y")
    with pytest.raises(UserError, match="did you mean") as err:
        neighbors(trained_model, [near_miss])
    assert repr(near_miss) in str(err.value) and repr(query_users[0]) in str(err.value)
