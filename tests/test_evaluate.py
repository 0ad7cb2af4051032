"""Held-out URL prediction and pair correlations on the model trained on the sample."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.checkpoint import ModelDir
from doc2vec_dist.errors import UserError
from doc2vec_dist.evaluate import heldout_metrics, pairs_metrics, read_pairs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH_USERS = os.path.join(ROOT, "data", "sample", "truth", "users.parquet")


@pytest.fixture(scope="module")
def metrics(trained_model, sample_corpus) -> dict:
    return heldout_metrics(trained_model, sample_corpus[1], k=10)


def test_heldout_metrics_are_rates_over_many_users(metrics, sample_corpus):
    assert metrics["k"] == 10
    assert metrics["users"] > 1000
    assert metrics["pairs"] == pq.read_table(sample_corpus[1]).num_rows
    assert metrics["skipped_pairs"] == 0
    for name in ("model_recall@10", "model_mrr", "popularity_recall@10", "popularity_mrr"):
        assert 0.0 < metrics[name] <= 1.0, name
    # an MRR counts the best hidden URL, recall@10 all of them: MRR >= recall@10 / 10 at least
    assert metrics["model_mrr"] >= metrics["model_recall@10"] / 10


def test_trained_model_beats_popularity_at_recall_10(metrics):
    assert metrics["model_recall@10"] > metrics["popularity_recall@10"]
    assert metrics["model_mrr"] > metrics["popularity_mrr"]


def test_heldout_pairs_of_unknown_users_are_skipped(trained_model, sample_corpus, tmp_path):
    held = pq.read_table(sample_corpus[1]).slice(0, 50)
    extra = pa.table({"key": ["nobody"] * 3, "token": held.column("token").to_pylist()[:3]})
    path = str(tmp_path / "held.parquet")
    pq.write_table(pa.concat_tables([held, extra]), path)
    m = heldout_metrics(trained_model, path)
    assert (m["pairs"], m["skipped_pairs"]) == (50, 3)


def test_heldout_file_without_token_column_is_a_user_error(trained_model, tmp_path):
    path = str(tmp_path / "held.parquet")
    pq.write_table(pa.table({"key": ["a"], "url": ["b"]}), path)
    with pytest.raises(UserError, match="column 'token' not found"):
        heldout_metrics(trained_model, path)
    with pytest.raises(UserError, match="missing.parquet"):
        heldout_metrics(trained_model, str(tmp_path / "missing.parquet"))


def test_read_pairs_of_a_square_matrix_uses_the_upper_triangle(tmp_path):
    path = str(tmp_path / "lee.txt")
    np.savetxt(path, np.array([[1.0, 0.2, 0.3], [0.2, 1.0, 0.4], [0.3, 0.4, 1.0]]))
    keys1, keys2, scores = read_pairs(path)
    assert keys1 == ["0", "0", "1"] and keys2 == ["1", "2", "2"]
    np.testing.assert_allclose(scores, [0.2, 0.3, 0.4])


def test_read_pairs_of_a_csv_table(tmp_path):
    path = str(tmp_path / "pairs.csv")
    with open(path, "w") as fh:
        fh.write("key1,key2,score\nua,ub,0.5\nuc,ud,2\n")
    keys1, keys2, scores = read_pairs(path)
    assert (keys1, keys2) == (["ua", "uc"], ["ub", "ud"])
    np.testing.assert_allclose(scores, [0.5, 2.0])


def test_read_pairs_keeps_numeric_looking_keys_as_written(tmp_path):
    path = str(tmp_path / "pairs.csv")
    with open(path, "w") as fh:
        fh.write("key1,key2,score\n007,010,0.5\n")
    keys1, keys2, _ = read_pairs(path)
    assert (keys1, keys2) == (["007"], ["010"])


@pytest.mark.parametrize("name, content, message", [
    ("pairs.csv", "a,b,score\nx,y,1\n", "column 'key1' not found"),
    ("lee.txt", "1 0.5 0.2\n0.5 1 0.1\n", "expected a square matrix"),
    ("lee.txt", "1 zero\n0 1\n", "not a numeric similarity matrix"),
])
def test_bad_pairs_files_are_user_errors_naming_the_file(tmp_path, name, content, message):
    path = str(tmp_path / name)
    with open(path, "w") as fh:
        fh.write(content)
    with pytest.raises(UserError, match=message) as err:
        read_pairs(path)
    assert path in str(err.value)


def test_a_missing_csv_pairs_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read pairs"):
        read_pairs(str(tmp_path / "missing.csv"))


def test_a_missing_matrix_pairs_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="missing.txt"):
        read_pairs(str(tmp_path / "missing.txt"))


def test_same_community_pairs_are_more_similar_than_different_community_pairs(trained_model, tmp_path):
    truth = pq.read_table(TRUTH_USERS, columns=["user_id", "community"])
    community = dict(zip(truth.column("user_id").to_pylist(), truth.column("community").to_pylist()))
    users = ModelDir(trained_model).keys("docs").to_pylist()
    rng = np.random.default_rng(0)
    same, different = [], []  # 100 random pairs of each kind
    while len(same) < 100 or len(different) < 100:
        a, b = (users[i] for i in rng.choice(len(users), 2, replace=False))
        kind = same if community[a] == community[b] else different
        if len(kind) < 100:
            kind.append(f"{a},{b},{int(kind is same)}\n")
    path = str(tmp_path / "pairs.csv")
    with open(path, "w") as fh:
        fh.write("key1,key2,score\n" + "".join(same + different))

    m = pairs_metrics(trained_model, path)
    assert m["pairs"] == 200
    # about 0.3 on this model; a random model gives 0 +- 0.07
    assert m["pearson"] > 0.15 and m["spearman"] > 0.15


def test_pairs_with_an_unknown_key_are_a_user_error(trained_model, tmp_path):
    user = ModelDir(trained_model).keys("docs")[0].as_py()
    path = str(tmp_path / "pairs.csv")
    with open(path, "w") as fh:
        fh.write(f"key1,key2,score\n{user},nobody,1\n{user},{user},0\n")
    with pytest.raises(UserError, match="unknown docs key 'nobody'"):
        pairs_metrics(trained_model, path)


def test_knn_label_accuracy_recovers_the_planted_communities(trained_model, tmp_path):
    from doc2vec_dist.evaluate import labels_metrics

    truth = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sample", "truth",
                         "users.parquet")
    m = labels_metrics(trained_model, truth, k=10, key_col="user_id", label_col="community")
    assert m["test_users"] + m["reference_users"] == 5000 - m["skipped_keys"]
    assert m["test_users"] == pytest.approx(0.2 * (5000 - m["skipped_keys"]), abs=1)
    assert m["knn_accuracy@10"] > 0.5, m  # 8 planted communities
    assert m["majority_accuracy"] < 0.2, m
    again = labels_metrics(trained_model, truth, k=10, key_col="user_id", label_col="community")
    assert again == m  # the split is fixed


def test_labels_file_without_the_label_column_names_it(trained_model, tmp_path):
    from doc2vec_dist.evaluate import labels_metrics

    path = tmp_path / "labels.csv"
    path.write_text("key,tag\n007,a\n")
    with pytest.raises(UserError, match="column 'label' not found"):
        labels_metrics(trained_model, str(path))


def test_heldout_metrics_reads_only_the_evaluated_users_rows(trained_model, sample_corpus, monkeypatch):
    """A 20M-user table is 8 GB, twice with its prior: the evaluated users' rows are gathered from the
    memory-mapped parts, and the whole docs table is never read."""
    from doc2vec_dist import checkpoint
    from doc2vec_dist.model import Model

    full = checkpoint.ModelDir(trained_model).read_table("docs")
    ids = np.array([0, 7, 123, len(full) - 1], dtype=np.int64)
    np.testing.assert_array_equal(Model(trained_model).gather("docs", ids), full[ids])
    read = checkpoint.ModelDir.read_table  # every whole-table read of a model goes through ModelDir
    tables = []
    monkeypatch.setattr(checkpoint.ModelDir, "read_table",
                        lambda self, table, *a, **k: tables.append(table) or read(self, table, *a, **k))
    m = heldout_metrics(trained_model, sample_corpus[1], max_users=100)
    assert tables == ["words_out"] and m["users"] == 100 and 0 < m["model_recall@10"] <= 1
