"""Held-out URL prediction and pair correlations on the model trained on the sample."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.errors import UserError
from doc2vec_dist.evaluate import heldout_metrics, pairs_metrics, read_pairs
from doc2vec_dist.modeldir import ModelDir

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


def test_heldout_pairs_the_model_was_trained_on_are_left_out_and_counted(trained_model, sample_corpus, tmp_path,
                                                                          metrics, caplog):
    # a pair whose URL is in the user's training document is not held out (a file of another split, a refresh
    # that took the hidden events back): ranked, it only counted as a miss, without a word
    from doc2vec_dist.scoring import seen_tokens

    held = pq.read_table(sample_corpus[1])
    found = ModelDir(trained_model)
    row_of = {key: i for i, key in enumerate(found.keys("docs").to_pylist())}
    users = sorted(set(held.column("key").to_pylist()))[:40]
    seen = seen_tokens(sample_corpus[0], np.array([row_of[u] for u in users]))
    urls = found.keys("words_out")
    trained = pa.table({"key": users, "token": [urls[int(seen[row_of[u]][0])].as_py() for u in users]})
    path = str(tmp_path / "held.parquet")
    pq.write_table(pa.concat_tables([held, trained]), path)
    with caplog.at_level("WARNING"):
        m = heldout_metrics(trained_model, path, k=10)
    assert f"{path}: 40 of its {held.num_rows + 40:,} pairs (of the users evaluated) are in {trained_model}'s " \
           "training documents" in caplog.text
    assert m == metrics  # the figures of the held-out pairs alone
    pq.write_table(trained, path)
    with pytest.raises(UserError, match=f"{path}: every one of its 40 pairs .* is in .* training documents"):
        heldout_metrics(trained_model, path, k=10)


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
    # a NaN in the matrix gave pearson nan, exit 0, and eval-pairs.json a NaN (no valid JSON)
    ("lee.txt", "1 0.5 0.2\n0.5 1 nan\n0.2 nan 1\n", r"row 1, column 2 holds nan \(1 pair\(s\) above the diagonal"),
    ("lee.txt", "1 0.5 0.2\n0.5 1 inf\n0.2 0.1 1\n", "row 1, column 2 holds inf"),
])
def test_bad_pairs_files_are_user_errors_naming_the_file(tmp_path, name, content, message):
    path = str(tmp_path / name)
    with open(path, "w") as fh:
        fh.write(content)
    with pytest.raises(UserError, match=message) as err:
        read_pairs(path)
    assert path in str(err.value)


def test_a_pairs_table_is_read_from_a_parquet_directory_or_a_name_in_capitals(tmp_path):
    """A Parquet directory and pairs.CSV were read as a matrix: "not a numeric similarity matrix"."""
    folder = tmp_path / "pairs_dir"
    folder.mkdir()
    pq.write_table(pa.table({"key1": ["a", "c"], "key2": ["b", "d"], "score": [0.5, 1.0]}), folder / "part-0.parquet")
    upper = tmp_path / "pairs.CSV"
    upper.write_text("key1,key2,score\na,b,0.5\nc,d,1\n")
    for path in (folder, upper):
        keys1, keys2, scores = read_pairs(str(path))
        assert (keys1, keys2, scores.tolist()) == (["a", "c"], ["b", "d"], [0.5, 1.0])


def test_a_correlation_with_a_constant_is_refused(trained_model, tmp_path):
    """Every score the same gave pearson nan, exit 0, and scipy's ConstantInputWarning."""
    path = tmp_path / "flat.txt"
    np.savetxt(path, np.ones((4, 4)))
    with pytest.raises(UserError, match=r"flat\.txt: every score is 1: a correlation with a constant is undefined"):
        pairs_metrics(trained_model, str(path))
    # a file that varies, whose scored share does not (tune's validation and test shares)
    from doc2vec_dist.evaluate import in_test_share

    keys1, keys2 = [f"a{i}" for i in range(100)], [f"b{i}" for i in range(100)]
    test = in_test_share(pa.array([f"{a}\x1f{b}" for a, b in zip(keys1, keys2)], pa.string()), 0.2, 0)
    assert 3 <= test.sum() < 100
    share = tmp_path / "share.csv"
    share.write_text("key1,key2,score\n" + "".join(f"{a},{b},{1.0 if t else i / 100}\n"
                                                   for i, (a, b, t) in enumerate(zip(keys1, keys2, test))))
    with pytest.raises(UserError, match=r"share\.csv: every score of the test share is 1: a correlation with a "
                                        "constant is undefined"):
        pairs_metrics(trained_model, str(share), test_fraction=0.2)


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
    # each key's side comes from its own hash: binomial, sd sqrt(5000 x 0.2 x 0.8) = 28
    assert m["test_users"] == pytest.approx(0.2 * (5000 - m["skipped_keys"]), abs=100)
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
    from doc2vec_dist import modeldir
    from doc2vec_dist.model import Model

    full = modeldir.ModelDir(trained_model).read_table("docs")
    ids = np.array([0, 7, 123, len(full) - 1], dtype=np.int64)
    np.testing.assert_array_equal(Model(trained_model).gather("docs", ids), full[ids])
    read = modeldir.ModelDir.read_table  # every whole-table read of a model goes through ModelDir
    tables = []
    monkeypatch.setattr(modeldir.ModelDir, "read_table",
                        lambda self, table, *a, **k: tables.append(table) or read(self, table, *a, **k))
    m = heldout_metrics(trained_model, sample_corpus[1], max_users=100)
    assert tables == ["words_out"] and m["users"] == 100 and 0 < m["model_recall@10"] <= 1


def _brute_force_heldout(model: str, heldout: str, corpus: str, k: int = 10, without_top: int = 0) -> dict:
    """recall@k and MRR one user at a time, written the plain way: every URL scored, seen ones removed,
    a full sort (popularity: by count, ties by id); without_top: the most common URLs neither hidden nor ranked."""
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.evaluate import seen_tokens
    from doc2vec_dist.scoring import url_log_prior, with_prior

    found = ModelDir(model)
    table = pq.read_table(heldout)
    doc_index = {key: i for i, key in enumerate(found.keys("docs").to_pylist())}
    word_index = {key: i for i, key in enumerate(found.keys("words_out").to_pylist())}
    counts = Corpus(corpus).counts()
    pop_order = sorted(range(len(counts)), key=lambda w: (-counts[w], w))
    hubs = set(pop_order[:without_top])
    hidden: dict[int, list[int]] = {}
    for key, token in zip(table.column("key").to_pylist(), table.column("token").to_pylist()):
        if word_index[token] not in hubs:
            hidden.setdefault(doc_index[key], []).append(word_index[token])
    users = sorted(hidden)
    seen = seen_tokens(corpus, np.array(users))
    docs, outs = with_prior(found.read_table("docs"), found.read_table("words_out"), url_log_prior(found))
    result = {"model": ([], []), "popularity": ([], [])}
    for user in users:
        excluded = set(seen.get(user, []).tolist()) | hubs
        scores = docs[user] @ outs.T
        model_order = [w for w in np.argsort(-scores, kind="stable") if w not in excluded]
        for name, order in (("model", model_order), ("popularity", [w for w in pop_order if w not in excluded])):
            rank = {w: r for r, w in enumerate(order)}
            result[name][0].append(np.mean([rank[w] < k for w in hidden[user]]))
            result[name][1].append(1.0 / (1 + min(rank[w] for w in hidden[user])))
    return {f"{name}_{m}": float(np.mean(v)) for name, (r, rr) in result.items() for m, v in (("recall@10", r), ("mrr", rr))}


def test_heldout_metrics_equal_a_one_user_at_a_time_ranking(trained_model, sample_corpus, tmp_path):
    """The whole-matrix ranking (torch topk, counts of higher scores) against a plain per-user sort, on
    500 users of the sample: the same figures."""
    table = pq.read_table(sample_corpus[1])
    users = sorted(set(table.column("key").to_pylist()))[:500]
    path = str(tmp_path / "h.parquet")
    pq.write_table(table.filter(pa.compute.is_in(table.column("key"), value_set=pa.array(users))), path)
    fast = heldout_metrics(trained_model, path, batch=64)  # several batches
    slow = _brute_force_heldout(trained_model, path, sample_corpus[0])
    assert fast["users"] == 500
    for name, value in slow.items():
        assert fast[name] == pytest.approx(value, abs=1e-9), name
    assert "popularity_mrr" not in heldout_metrics(trained_model, path, baseline=False)


def test_the_long_tails_figures_leave_the_most_common_urls_out_of_the_hidden_and_the_ranked(trained_model,
                                                                                           sample_corpus, tmp_path):
    """without_top=N: the N most common URLs are neither hidden nor candidates, for the model and the
    popularity ranking alike (a plain per-user sort, as above, gives the same figures); the pairs of a
    hidden hub URL are dropped, and popularity no longer gets those for free."""
    from doc2vec_dist.corpus import Corpus

    table = pq.read_table(sample_corpus[1])
    users = sorted(set(table.column("key").to_pylist()))[:500]
    path = str(tmp_path / "h.parquet")
    table = table.filter(pa.compute.is_in(table.column("key"), value_set=pa.array(users)))
    pq.write_table(table, path)
    counts = Corpus(sample_corpus[0]).counts()
    hubs = np.argsort(-counts, kind="stable")[:20]
    vocab = ModelDir(trained_model).keys("words_out").to_pylist()
    hub_tokens = {vocab[w] for w in hubs}
    tail_pairs = sum(token not in hub_tokens for token in table.column("token").to_pylist())
    assert 0 < tail_pairs < len(table)  # the sample hides some hub URLs: the case is tested
    whole = heldout_metrics(trained_model, path)
    tail = heldout_metrics(trained_model, path, batch=64, without_top=20)
    assert tail["pairs"] == tail_pairs and whole["pairs"] == len(table)
    slow = _brute_force_heldout(trained_model, path, sample_corpus[0], without_top=20)
    for name, value in slow.items():
        assert tail[name] == pytest.approx(value, abs=1e-9), name
    assert tail["popularity_recall@10"] < whole["popularity_recall@10"]


def test_the_label_split_depends_on_each_key_alone(tmp_path):
    """The same keys are in the test share whatever the file's order and whichever other keys it holds."""
    from doc2vec_dist.evaluate import in_test_share

    keys = pa.array([f"user{i}" for i in range(2000)])
    test = in_test_share(keys, 0.2)
    assert 300 < test.sum() < 500
    reversed_test = in_test_share(keys[::-1], 0.2)[::-1]
    np.testing.assert_array_equal(test, reversed_test)
    np.testing.assert_array_equal(test[::3], in_test_share(keys.take(pa.array(range(0, 2000, 3))), 0.2))
    assert not np.array_equal(test, in_test_share(keys, 0.2, seed=1))
    with pytest.raises(UserError, match="between 0 and 1"):
        in_test_share(keys, 1.0)


def test_validation_side_of_labels_never_reads_a_test_users_label(trained_model, tmp_path):
    """tune measures trials on part="validation": scrambling the test share's labels leaves that figure
    exactly as it was, and moves the test side's."""
    from doc2vec_dist.evaluate import in_test_share, labels_metrics

    truth = pq.read_table(TRUTH_USERS, columns=["user_id", "community"])
    test = in_test_share(truth.column("user_id"), 0.2)
    scrambled = np.array(truth.column("community").to_pylist(), dtype=object)
    scrambled[test] = "nonsense"
    path = str(tmp_path / "scrambled.parquet")
    pq.write_table(pa.table({"user_id": truth.column("user_id"), "community": pa.array(scrambled.astype(str))}), path)

    def figures(labels: str, part: str) -> dict:
        return labels_metrics(trained_model, labels, key_col="user_id", label_col="community", part=part)

    val, val_scrambled = figures(TRUTH_USERS, "validation"), figures(path, "validation")
    assert val == val_scrambled and val["validation_users"] == int((~test).sum())
    assert val["knn_accuracy@10"] > 0.5  # the planted communities, voted on among the reference users
    assert figures(TRUTH_USERS, "test")["knn_accuracy@10"] > 0.5 > figures(path, "test")["knn_accuracy@10"] == 0


def test_a_split_of_pairs_scores_each_side_apart(trained_model, tmp_path):
    """--test-fraction: the two sides together are every pair; the validation side's figure does not see
    the test side's scores; either way round a pair is on the same side."""
    from doc2vec_dist.evaluate import in_test_share

    users = ModelDir(trained_model).keys("docs").to_pylist()[:40]
    rng = np.random.default_rng(1)
    rows = [(a, b, float(rng.random())) for i, a in enumerate(users) for b in users[i + 1:]]
    path = str(tmp_path / "pairs.csv")

    def write(rows):
        with open(path, "w") as fh:
            fh.write("key1,key2,score\n" + "".join(f"{a},{b},{s}\n" for a, b, s in rows))

    write(rows)
    val = pairs_metrics(trained_model, path, test_fraction=0.5, part="validation")
    test = pairs_metrics(trained_model, path, test_fraction=0.5, part="test")
    assert val["pairs"] + test["pairs"] == len(rows) == 780 and 300 < test["pairs"] < 480
    in_test = in_test_share(pa.array([f"{a}\x1f{b}" if a <= b else f"{b}\x1f{a}" for a, b, _ in rows]), 0.5)
    write([(b, a, 9.0 * s if t else s) for (a, b, s), t in zip(rows, in_test)])  # swapped, test scores changed
    assert pairs_metrics(trained_model, path, test_fraction=0.5, part="validation") == val
    assert pairs_metrics(trained_model, path, test_fraction=0.5, part="test")["pairs"] == test["pairs"]


@pytest.mark.parametrize("k", [0, -3])
def test_k_below_one_is_refused_before_any_work(trained_model, sample_corpus, tmp_path, k):
    """issue 47: k 0 once failed deep in torch's topk (IndexError); labels' k-NN vote took it too."""
    from doc2vec_dist.evaluate import labels_metrics

    with pytest.raises(UserError, match=rf"^evaluate: k must be a whole number >= 1, not {k}$"):
        heldout_metrics(trained_model, sample_corpus[1], k=k)
    labels = str(tmp_path / "labels.parquet")
    keys = ModelDir(trained_model).keys("docs").to_pylist()[:100]
    pq.write_table(pa.table({"key": keys, "label": [str(i % 3) for i in range(100)]}), labels)
    with pytest.raises(UserError, match=rf"^evaluate: k must be a whole number >= 1, not {k}$"):
        labels_metrics(trained_model, labels, k=k)


def test_popularity_ranks_are_a_full_sort_per_user_on_random_cases():
    """popularity_ranks counts, for all users at once, what sorting each user's URLs by their place would
    give: a hidden URL's rank (those above it, less the user's seen ones; `upto` if seen, capped at `upto`),
    and the reciprocal of one plus the URLs above the user's best hidden one. Users with no seen URL, hidden
    URLs among the seen, repeated seen URLs."""
    from doc2vec_dist.evaluate import popularity_ranks

    rng = np.random.default_rng(7)
    for _ in range(200):
        urls, users, upto = int(rng.integers(1, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 10))
        place = rng.permutation(urls).astype(np.int64)
        seen = [rng.integers(0, urls, int(rng.integers(0, 6))).astype(np.int32) if rng.random() > 0.2
                else np.zeros(0, np.int32) for _ in range(users)]
        rows = np.sort(rng.integers(0, users, int(rng.integers(0, 25)))).astype(np.int64)
        cols = np.array([seen[r][0] if rng.random() < 0.3 and len(seen[r]) else rng.integers(0, urls)
                         for r in rows], np.int64)
        ranks, reciprocal = popularity_ranks(place, rows, cols, seen, upto)
        for r in range(users):
            order = [u for u in np.argsort(place) if u not in set(seen[r].tolist())]  # best placed first
            mine = [c for c, row in zip(cols.tolist(), rows.tolist(), strict=True) if row == r]
            want = [upto if c not in order else min(order.index(c), upto) for c in mine]
            assert ranks[rows == r].tolist() == want
            unseen = [order.index(c) for c in mine if c in order]
            assert reciprocal[r] == 1.0 / (1 + (min(unseen) if unseen else len(order)))
