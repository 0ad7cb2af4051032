"""Quality figures for a model: held-out URL prediction and correlation with human similarity ratings.

Changes when a quality figure is added or defined differently.

Held-out prediction ranks every URL for a user by the model's estimate of P(url | user) (d·o plus
the log of the negative-sampling prior, see scoring.py), leaving out the URLs the user was trained on,
and asks where the hidden URLs land.
The same ranking by global popularity is reported beside it as the baseline to beat.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import storage
from .checkpoint import ModelDir
from .corpus import Corpus, iter_shard
from .errors import UserError
from .model import Model
from .scoring import lookup, unit_rows, url_log_prior, with_prior


def seen_tokens(corpus_path: str, doc_ids: np.ndarray) -> dict[int, np.ndarray]:
    """The training tokens of the given documents, read from the corpus shards."""
    wanted = np.unique(doc_ids)
    seen: dict[int, np.ndarray] = {}
    for path in Corpus(corpus_path).shard_paths:
        for ids, offsets, tokens in iter_shard(path):
            hit = np.flatnonzero(np.isin(ids, wanted, assume_unique=True))
            for i in hit:
                seen[int(ids[i])] = tokens[offsets[i]:offsets[i + 1]]
    return seen


SCORES_BYTES = 1 << 30  # the score matrices of one batch of users, at most


def heldout_metrics(model: str, heldout: str, k: int = 10, max_users: int = 20_000, seed: int = 0,
                    corpus_path: str | None = None, batch: int = 512) -> dict:
    """recall@k and MRR of the model and of the popularity baseline on held-out (key, token) pairs.

    recall@k is averaged over users (share of each user's hidden URLs in the top k); MRR is the mean
    reciprocal rank of each user's best-ranked hidden URL. Seen URLs are excluded from the ranking.
    """
    table = read_table_file(heldout, "held-out pairs", ("key", "token"), string_cols=("key", "token"))
    found = ModelDir.served(model)
    doc_keys, vocab = found.keys("docs"), found.keys("words_out")
    doc_ids = pc.index_in(table.column("key").cast(pa.string()), value_set=doc_keys.cast(pa.string()))
    word_ids = pc.index_in(table.column("token").cast(pa.string()), value_set=vocab.cast(pa.string()))
    valid = pc.and_(pc.is_valid(doc_ids), pc.is_valid(word_ids))
    skipped = len(table) - pc.sum(valid).as_py() if len(table) else 0
    docs = doc_ids.filter(valid).to_numpy(zero_copy_only=False).astype(np.int64)
    words = word_ids.filter(valid).to_numpy(zero_copy_only=False).astype(np.int64)
    if len(docs) == 0:
        raise UserError(f"{heldout}: no held-out pair matches a user and URL of {model}")
    users = np.unique(docs)
    if len(users) > max_users:
        users = np.sort(np.random.default_rng(seed).choice(users, max_users, replace=False))
        keep = np.isin(docs, users)
        docs, words = docs[keep], words[keep]
    if corpus_path is None:
        corpus_path = found.corpus_path()
    seen = seen_tokens(corpus_path, users)
    # only the evaluated users' rows, from the verified memory-mapped parts: the whole table of 20M
    # users is 8 GB, and with its prior column a second copy (the benchmark's 20M run ran out of 24 GiB)
    doc_matrix, out_matrix = with_prior(Model(found.path).gather("docs", users), found.read_table("words_out"),
                                        url_log_prior(found))
    popularity = Corpus(corpus_path).counts().astype(np.float32)
    batch = max(1, min(batch, SCORES_BYTES // (8 * max(len(popularity), 1))))  # two [batch, URLs] float32 matrices

    order = np.argsort(docs, kind="stable")
    docs, words = docs[order], words[order]
    starts = np.searchsorted(docs, users)
    ends = np.searchsorted(docs, users, side="right")
    results = {"model": _Ranker(k), "popularity": _Ranker(k)}
    for b in range(0, len(users), batch):
        u = users[b:b + batch]
        scores = {"model": doc_matrix[b:b + len(u)] @ out_matrix.T, "popularity": np.tile(popularity, (len(u), 1))}
        for name, s in scores.items():
            for row, user in enumerate(u):
                s[row, seen.get(int(user), [])] = -np.inf  # seen URLs are not predictions
                results[name].add(s[row], words[starts[b + row]:ends[b + row]])
    return {"k": k, "users": len(users), "pairs": len(docs), "skipped_pairs": int(skipped),
            **{f"{name}_{metric}": value for name, r in results.items() for metric, value in r.result().items()}}


class _Ranker:
    def __init__(self, k: int):
        self.k, self.recalls, self.reciprocal = k, [], []

    def add(self, scores: np.ndarray, hidden: np.ndarray) -> None:
        top = np.argpartition(-scores, min(self.k, len(scores) - 1))[:self.k]
        self.recalls.append(np.isin(hidden, top).mean())
        best = scores[hidden].max()
        self.reciprocal.append(1.0 / (1 + int((scores > best).sum())))

    def result(self) -> dict:
        return {f"recall@{self.k}": float(np.mean(self.recalls)), "mrr": float(np.mean(self.reciprocal))}


def read_pairs(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """Human similarity judgements: a square matrix (Lee format; row i is the document keyed str(i),
    upper triangle used) or a table with columns key1, key2, score (Parquet, CSV or TSV)."""
    if path.endswith((".parquet", ".csv", ".tsv")):
        t = read_table_file(path, "pairs", ("key1", "key2", "score"), string_cols=("key1", "key2"))
        return ([str(x) for x in t.column("key1").to_pylist()], [str(x) for x in t.column("key2").to_pylist()],
                np.asarray(t.column("score").to_numpy(zero_copy_only=False), dtype=np.float64))
    try:
        matrix = np.loadtxt(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a numeric similarity matrix ({exc})") from None
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise UserError(f"{path}: expected a square matrix, found shape {matrix.shape}")
    i, j = np.triu_indices(len(matrix), 1)
    return [str(x) for x in i], [str(x) for x in j], matrix[i, j]


def pairs_metrics(model: str, path: str, table: str = "docs") -> dict:
    """Pearson and Spearman correlation of cosine similarity with human scores."""
    from scipy.stats import pearsonr, spearmanr

    keys1, keys2, human = read_pairs(path)
    found = ModelDir.served(model)
    keys = found.keys(table)
    vectors = found.read_table(table)
    a = unit_rows(vectors[lookup(keys, keys1, table)])
    b = unit_rows(vectors[lookup(keys, keys2, table)])
    cosine = (a * b).sum(1)
    return {"pairs": len(human), "pearson": float(pearsonr(cosine, human)[0]),
            "spearman": float(spearmanr(cosine, human)[0])}


def read_table_file(path: str, what: str, columns: tuple[str, ...], string_cols: tuple[str, ...] = ()) -> pa.Table:
    """A Parquet (file or directory) or CSV/TSV table that must have `columns`.

    CSV columns in `string_cols` stay strings as written: a key "007" is not the number 7.
    """
    import pyarrow.csv as pcsv

    try:
        if path.endswith((".csv", ".tsv")):
            t = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter="\t" if path.endswith(".tsv") else ","),
                              convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(string_cols, pa.string())))
        else:
            t = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise UserError(f"{path}: cannot read {what} ({exc})".replace("\n", " ")) from None
    for col in columns:
        if col not in t.column_names:
            raise UserError(f"{path}: column {col!r} not found (columns: {', '.join(t.column_names)})")
    return t


def labels_metrics(model: str, path: str, k: int = 10, key_col: str = "key", label_col: str = "label",
                   test_fraction: float = 0.2, seed: int = 0, table: str = "docs") -> dict:
    """k-NN label accuracy: each test user takes the majority label of its k nearest reference users.

    The split is fixed by `seed` over the keys in sorted order, so repeated runs and different models
    are scored on the same users. The majority label of the reference users is the baseline.
    """
    import faiss

    data = read_table_file(path, "labels", (key_col, label_col), string_cols=(key_col,))
    keys = data.column(key_col).cast(pa.string())
    found = ModelDir.served(model)
    rows = pc.index_in(keys, value_set=found.keys(table).cast(pa.string()))
    known = pc.is_valid(rows)
    rows = rows.filter(known).to_numpy(zero_copy_only=False).astype(np.int64)
    labels = data.column(label_col).filter(known).cast(pa.string()).to_numpy(zero_copy_only=False)
    if len(rows) < 10:
        raise UserError(f"{path}: only {len(rows)} of its keys are {table} keys of {model}")
    order = np.argsort(keys.filter(known).to_numpy(zero_copy_only=False), kind="stable")
    test = np.zeros(len(rows), bool)
    test[order[np.random.default_rng(seed).permutation(len(rows))[:max(1, int(test_fraction * len(rows)))]]] = True
    vectors = unit_rows(found.read_table(table))
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors[rows[~test]]))
    _, found = index.search(np.ascontiguousarray(vectors[rows[test]]), min(k, int((~test).sum())))
    ref_labels = labels[~test]
    names, codes = np.unique(ref_labels, return_inverse=True)
    votes = np.zeros((len(found), len(names)))
    for j in range(found.shape[1]):  # nearer neighbours break ties: a tiny bonus by rank
        np.add.at(votes, (np.arange(len(found)), codes[found[:, j]]), 1.0 + 1e-3 * (found.shape[1] - j))
    predicted = names[votes.argmax(1)]
    majority = names[np.bincount(codes).argmax()]
    return {"k": k, "test_users": int(test.sum()), "reference_users": int((~test).sum()),
            "skipped_keys": int(len(keys) - len(rows)), f"knn_accuracy@{k}": float((predicted == labels[test]).mean()),
            "majority_accuracy": float((labels[test] == majority).mean())}


def save_and_print(model: str, name: str, metrics: dict) -> str:
    path = os.path.join(model, f"eval-{name}.json")
    storage.write_local(path, json.dumps(metrics, indent=2))
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}", file=sys.stdout)
    return path
