"""faiss indexes and neighbour queries on the model trained on the sample (8 planted communities)."""

from __future__ import annotations

import glob
import itertools
import json
import os
import re

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import modeldir
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import export
from doc2vec_dist.index import ServedIndex, build_index, ivfpq_shape, resolve_kind
from doc2vec_dist.model import neighbors
from doc2vec_dist.modeldir import ModelDir
from doc2vec_dist.scoring import unit_rows

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
    return ModelDir(trained_model).keys("docs").to_pylist()[::100][:50]


def read_index_dir(out: str, kind: str = "flat") -> tuple[faiss.Index, list[str], dict]:
    files = [".doc2vec-dist.json", "index.faiss", "keys.parquet", "params.json"] + (["vectors.npy"] if kind == "ivfpq" else [])
    assert sorted(os.listdir(out)) == sorted(files)
    with open(os.path.join(out, "params.json")) as fh:
        params = json.load(fh)
    keys = pq.read_table(os.path.join(out, "keys.parquet")).column("key").to_pylist()
    return faiss.read_index(os.path.join(out, "index.faiss")), keys, params


def export_order(model: str) -> list[str]:
    """Keys part by part, as export writes them and as faiss ids are given."""
    keys = ModelDir(model).keys("docs")
    return [k for part in ModelDir(model).parts("docs") for ids, _ in part for k in keys.take(ids).to_pylist()]


# the build tunes its search to recall 0.96 on one query sample; on 5,000 rows the figure measured on
# another sample of 1,000 moves by about ±0.01 between trainings, hence 0.93 here
@pytest.mark.parametrize("kind, min_recall", [("flat", 1.0), ("hnsw", 0.93), ("ivfpq", 0.93)])
def test_build_index_writes_index_keys_and_params(trained_model, tmp_path, kind, min_recall):
    out = str(tmp_path / f"index-{kind}")
    returned = build_index(out, kind=kind, model=trained_model, table="docs", progress=False)

    index, keys, params = read_index_dir(out, kind)
    assert params == returned
    assert (params["kind"], params["rows"], params["dim"]) == (kind, 5000, 32)
    assert min_recall <= params["recall_at_10_vs_exact"] <= 1.0
    assert params["recall_queries"] == 1000 and params["peak_rss_bytes"] > 0 and params["index_bytes"] > 0
    assert index.ntotal == 5000 and index.d == 32
    assert keys == export_order(trained_model)  # faiss id i ↔ row i of keys.parquet
    assert os.listdir(tmp_path) == [f"index-{kind}"]  # no temp directory left

    # the index searches cosine: a user's own normalised vector finds that user first
    served = ServedIndex.load(out)
    all_keys = ModelDir(trained_model).keys("docs").to_pylist()
    matrix = modeldir.ModelDir(trained_model).read_table("docs")
    picked = [keys[i] for i in range(0, 5000, 1000)]
    v = matrix[[all_keys.index(k) for k in picked]]
    scores, found = served.search((v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32), 1)
    assert [keys[i] for i in found[:, 0]] == picked
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-4)


def test_ivfpq_is_trained_on_a_sample_and_reranks_with_exact_scores(trained_model, tmp_path):
    out = str(tmp_path / "ivfpq")
    params = build_index(out, kind="ivfpq", model=trained_model, progress=False)
    served = ServedIndex.load(out)
    assert isinstance(served.index, faiss.IndexIVFPQ)
    assert served.index.nlist == params["nlist"] and served.index.nprobe == params["search"]
    assert params["train_rows"] <= 5000 and params["pq_m"] == 16 and params["k_factor"] >= 1
    assert params["tuning_recall"] >= params["target_recall"] or params["search"] == params["nlist"]

    # recall checked here independently of the build: 200 users against numpy's exact cosine
    keys = pq.read_table(os.path.join(out, "keys.parquet")).column("key").to_pylist()
    matrix = modeldir.ModelDir(trained_model).read_table("docs")
    row_of = {k: i for i, k in enumerate(ModelDir(trained_model).keys("docs").to_pylist())}
    unit = matrix[[row_of[k] for k in keys]]
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    queries = unit[::25]
    exact = np.argsort(-(queries @ unit.T), axis=1)[:, :10]
    scores, found = served.search(queries, 10)
    recall = np.mean([len(set(e) & set(f)) / 10 for e, f in zip(exact, found)])
    assert recall >= 0.93
    # scores are exact cosines, not PQ approximations
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ unit.T, found, 1), atol=1e-5)


def test_auto_kind_is_flat_up_to_a_million_rows_then_ivfpq():
    assert resolve_kind("auto", 1_000_000) == "flat"
    assert resolve_kind("auto", 1_000_001) == "ivfpq"
    with pytest.raises(UserError, match="unknown index kind 'annoy'"):
        resolve_kind("annoy", 10)


def test_ivfpq_shape_fits_the_table():
    small, large = ivfpq_shape(5000, 32), ivfpq_shape(20_000_000, 100)
    assert small["nlist"] * 39 <= 5000 and 32 % small["pq_m"] == 0
    assert large["nlist"] == 8192 and large["pq_m"] == 50 and large["pq_bits"] == 8
    assert large["train_rows"] < 1_000_000  # trained on a sample, not the table
    assert ivfpq_shape(100_000, 101)["pq_m"] == 101  # a prime dim: one dim per sub-quantizer


def test_build_logs_recall_and_memory(trained_model, tmp_path, logged):
    build_index(str(tmp_path / "idx"), kind="hnsw", model=trained_model, progress=False, report=True)
    line = logged.messages[-1]
    assert re.search(r"recall@10 vs exact: 0\.9\d\d|recall@10 vs exact: 1\.000", line), line
    assert "peak memory" in line and "MiB on disk" in line


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
    v = modeldir.matrix_of(exported.column("vector"), 32)[:3]
    _, found = index.search((v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32), 1)
    assert list(found[:, 0]) == [0, 1, 2]


def test_index_streams_a_parquet_dataset_of_float16_part_files(trained_model, tmp_path):
    vectors = str(tmp_path / "docs16")
    export(trained_model, "docs", vectors, dtype="float16", progress=False)
    assert len(glob.glob(os.path.join(vectors, "*.parquet"))) == 2  # one file per parameter server: two units
    out = str(tmp_path / "idx")
    params = build_index(out, kind="ivfpq", vectors_path=vectors, progress=False)

    _, keys, _ = read_index_dir(out, "ivfpq")
    assert keys == export_order(trained_model)  # files in order, rows in file order
    assert params["rows"] == 5000 and params["recall_at_10_vs_exact"] >= 0.93
    # the same ids as an index built from the model itself: the order of units is the same
    from_model = build_index(str(tmp_path / "idx2"), kind="flat", model=trained_model, progress=False)
    assert pq.read_table(os.path.join(tmp_path, "idx2", "keys.parquet")).column("key").to_pylist() == keys
    assert from_model["rows"] == 5000


def test_index_of_an_untrained_table_names_it(trained_model, tmp_path):
    with pytest.raises(UserError, match="table 'words' was not trained"):
        build_index(str(tmp_path / "idx"), model=trained_model, table="words", progress=False)
    assert os.listdir(tmp_path) == []


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
    keys = ModelDir(trained_model).keys("docs").to_pylist()
    matrix = modeldir.ModelDir(trained_model).read_table("docs")
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


def test_similar_urls_for_a_url_by_cosine_of_words_out(trained_model, sample_corpus):
    urls = ModelDir(trained_model).keys("words_out").to_pylist()
    result = neighbors(trained_model, [urls[4]], k=5, table="words_out").to_pydict()
    assert result["rank"] == [1, 2, 3, 4, 5] and urls[4] not in result["neighbor"]
    unit = unit_rows(modeldir.ModelDir(trained_model).read_table("words_out"))  # a never-trained URL stays zero
    cosine = unit @ unit[4]
    cosine[4] = -np.inf
    assert result["neighbor"] == [urls[i] for i in np.argsort(-cosine)[:5]]


def test_neighbors_from_a_saved_index_match_the_exact_scan(trained_model, query_users, tmp_path):
    flat = str(tmp_path / "flat")
    build_index(flat, kind="flat", model=trained_model, progress=False)
    exact = neighbors(trained_model, query_users, k=10)
    served = neighbors(trained_model, query_users, k=10, index=flat)
    assert served.column("key").to_pylist() == exact.column("key").to_pylist()
    assert served.column("neighbor").to_pylist() == exact.column("neighbor").to_pylist()
    np.testing.assert_allclose(served.column("score").to_numpy(), exact.column("score").to_numpy(), atol=1e-5)

    ivfpq = str(tmp_path / "ivfpq")
    build_index(ivfpq, kind="ivfpq", model=trained_model, progress=False)
    approx = neighbors(trained_model, query_users, k=10, index=ivfpq).to_pydict()
    assert len(approx["key"]) == 10 * len(query_users) and not set(zip(approx["key"], approx["neighbor"])) & {
        (q, q) for q in query_users}
    pairs = set(zip(exact.column("key").to_pylist(), exact.column("neighbor").to_pylist()))
    assert len(pairs & set(zip(approx["key"], approx["neighbor"]))) / len(pairs) >= 0.9


def test_cli_index_then_neighbors_from_a_keys_file_to_parquet(trained_model, query_users, tmp_path, capsys):
    import pyarrow as pa

    from doc2vec_dist.cli import main

    index = str(tmp_path / "users.index")
    assert main(["index", "--model", trained_model, "--kind", "ivfpq", "--out", index, "--no-progress"]) == 0
    assert re.search(r"index ivfpq: 5,000 rows × 32, recall@10 vs exact: \d\.\d{3}", capsys.readouterr().out)

    keys_file, out = str(tmp_path / "queries.parquet"), str(tmp_path / "neighbors.parquet")
    pq.write_table(pa.table({"key": query_users[:7]}), keys_file)
    assert main(["neighbors", "--model", trained_model, "--keys-file", keys_file, "--index", index, "--k", "3",
                 "--out", out]) == 0
    result = pq.read_table(out)
    assert result.column_names == ["key", "neighbor", "score", "rank"]
    assert result.column("key").to_pylist() == [q for q in query_users[:7] for _ in range(3)]
    assert result.column("rank").to_pylist() == [1, 2, 3] * 7
    assert not any(k == n for k, n in zip(result.column("key").to_pylist(), result.column("neighbor").to_pylist()))


def test_cli_neighbors_of_a_keys_file_without_a_key_column_is_a_clean_error(trained_model, tmp_path, capsys):
    import pyarrow as pa

    from doc2vec_dist.cli import main

    bad = str(tmp_path / "users.parquet")
    pq.write_table(pa.table({"user_id": ["a"]}), bad)
    assert main(["neighbors", "--model", trained_model, "--keys-file", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "users.parquet: cannot read a 'key' column" in err[0]


def test_a_search_that_must_scan_much_of_the_index_warns():
    from doc2vec_dist.index import _search_warning

    assert "nprobe 1024 of 2048 lists" in _search_warning("ivfpq", 1024, 2048, 0.97, 0.96)
    assert _search_warning("ivfpq", 8, 2048, 0.97, 0.96) is None
    assert "recall stayed at 0.821" in _search_warning("hnsw", 1024, None, 0.821, 0.96)


def _vectors_parquet(path: str, rows: int = 2000, dim: int = 16, tied: int = 2, group: int = 20) -> str:
    """Random unit-variance vectors with `tied` groups of `group` identical rows: exact search and HNSW
    break those ties differently, so recall on a tied user's queries stays below 1 at any efSearch."""
    import pyarrow as pa

    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    for g in range(tied):
        vectors[g * group:(g + 1) * group] = vectors[g * group]
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(rows)],
                             "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim)}), path)
    return path


def test_an_hnsw_build_that_ends_below_its_target_warns(tmp_path, logged):
    vectors = _vectors_parquet(str(tmp_path / "tied.parquet"))
    params = build_index(str(tmp_path / "idx"), kind="hnsw", vectors_path=vectors, target_recall=1.0,
                         progress=False, report=True)
    # measured here: ~0.985 on the tuning queries at efSearch 1024, ~0.99 on the others
    assert params["search"] == 1024 and params["tuning_recall"] < 1.0
    assert params["warning"].startswith("recall stayed at ") and "below the target 1.0" in params["warning"]
    assert f"warning: {params['warning']}" in logged.messages


def test_recall_below_the_target_by_more_than_sampling_noise_warns():
    from doc2vec_dist.index import _search_warning

    # the trial: an HNSW build targeting 0.96 measured 0.942 on its fresh queries, and said nothing
    assert "recall@10 is 0.942 at efSearch 64, below the target 0.96" in _search_warning("hnsw", 64, None, 0.942, 0.96)
    assert _search_warning("hnsw", 64, None, 0.955, 0.96) is None  # within the noise of 1,000 queries
    assert _search_warning("hnsw", 64, None, 0.955, 0.96, 0.961) is None
    assert _search_warning("flat", None, None, 1.0, 0.96) is None


def test_rebuilding_an_index_says_it_replaces_it(tmp_path, logged):
    vectors = _vectors_parquet(str(tmp_path / "v.parquet"), rows=300, tied=0)
    out = str(tmp_path / "users.index")
    build_index(out, kind="flat", vectors_path=vectors, progress=False)
    assert "replacing" not in logged.text
    logged.clear()
    build_index(out, kind="flat", vectors_path=vectors, progress=False)
    assert logged.messages == [f"replacing the index at {out}"]
    assert ServedIndex.load(out).index.ntotal == 300


# -- which model an index belongs to (issue 26, item 2) -------------------------------------------------

def model_id(model: str) -> str:
    return ModelDir(model).manifest["model_id"]


def test_an_index_records_the_model_version_and_table_it_was_built_from(trained_model, tmp_path):
    params = build_index(str(tmp_path / "index"), kind="flat", model=trained_model, progress=False)
    assert params["provenance"] == {"model": os.path.abspath(trained_model), "model_id": model_id(trained_model),
                                    "version": 10, "table": "docs", "derived_from": []}


def test_neighbors_refuses_an_index_of_another_model_and_names_both(small_models, tmp_path):
    first, second = small_models.make(tmp_path / "first", 1), small_models.make(tmp_path / "second", 2)
    index = str(tmp_path / "first.index")
    build_index(index, kind="flat", model=first, progress=False)
    assert neighbors(first, ["u1"], k=3, index=index).num_rows == 3
    # the same keys, the same dims: without the check it answered with scores from two spaces
    with pytest.raises(UserError) as err:
        neighbors(second, ["u1"], k=3, index=index)
    message = str(err.value)
    assert message.startswith(f"{index} was made from the model at {first} (id {model_id(first)[:8]}, v1")
    assert f"another model than the model at {second} (id {model_id(second)[:8]}, v1" in message


def test_an_index_older_than_the_model_is_used_with_a_warning(small_models, tmp_path, logged):
    model = small_models.make(tmp_path / "model", 1)
    index = str(tmp_path / "model.index")
    build_index(index, kind="flat", model=model, progress=False)
    neighbors(model, ["u1"], index=index)
    assert "warning" not in logged.text
    small_models.train_on(model, 2)  # the model trains on: v2
    found = neighbors(model, ["u1"], k=3, index=index)
    assert found.num_rows == 3
    warnings = [r.getMessage() for r in logged.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {index} was made from the model at {model} ")
    assert "an older version of" in warnings[0] and "whose latest is v2" in warnings[0]
    assert f"doc2vec-dist index --update {index} --model {model} --table docs --out {index}" in warnings[0]


def test_an_index_of_the_model_a_refresh_started_from_is_used_with_a_warning(small_models, tmp_path, logged):
    base = small_models.make(tmp_path / "base", 1)
    refreshed = small_models.make(tmp_path / "refreshed", 2, {"derived_from": [model_id(base)]})  # train --init-from base
    index = str(tmp_path / "base.index")
    build_index(index, kind="flat", model=base, progress=False)
    logged.clear()
    assert neighbors(refreshed, ["u1"], k=3, index=index).num_rows == 3
    assert f"an earlier model that {refreshed} was trained from (--init-from)" in logged.text


def test_an_index_of_another_table_is_refused(trained_model, tmp_path):
    index = str(tmp_path / "users.index")
    build_index(index, kind="flat", model=trained_model, table="docs", progress=False)
    url = ModelDir(trained_model).keys("words_out")[0].as_py()
    with pytest.raises(UserError, match=f"{index} holds vectors of table docs .*, not of table words_out"):
        neighbors(trained_model, [url], table="words_out", index=index)


def test_an_index_from_before_ids_is_used_with_a_note(small_models, tmp_path, logged):
    model = small_models.make(tmp_path / "model", 1)
    index = str(tmp_path / "model.index")
    build_index(index, kind="flat", model=model, progress=False)
    with open(os.path.join(index, "params.json")) as fh:
        params = json.load(fh)
    params.pop("provenance")  # as an index built before this change
    with open(os.path.join(index, "params.json"), "w") as fh:
        json.dump(params, fh)
    logged.clear()
    assert neighbors(model, ["u1"], k=3, index=index).num_rows == 3
    assert f"note: {index} records no model id" in logged.text and "warning" not in logged.text


def test_an_index_of_an_export_records_the_model_the_export_came_from(small_models, tmp_path):
    first, second = small_models.make(tmp_path / "first", 1), small_models.make(tmp_path / "second", 2)
    users = str(tmp_path / "users")
    export(first, "docs", users, progress=False)
    index = str(tmp_path / "users.index")
    params = build_index(index, kind="flat", vectors_path=users, progress=False)
    assert params["provenance"]["model_id"] == model_id(first)
    assert params["provenance"]["vectors"] == os.path.abspath(users)
    assert neighbors(first, ["u1"], k=3, index=index).num_rows == 3
    with pytest.raises(UserError, match="another model than the model at"):
        neighbors(second, ["u1"], k=3, index=index)
