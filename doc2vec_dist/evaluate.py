"""Quality figures for a model: held-out URL prediction and correlation with human similarity ratings.

Changes when a quality figure is added or defined differently.

Held-out prediction ranks every URL for a user by the model's estimate of P(url | user) (d·o plus
the log of the negative-sampling prior, see scoring.py), leaving out the URLs the user was trained on,
and asks where the hidden URLs land.
The same ranking by global popularity is reported beside it as the baseline to beat.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from . import logs, storage
from .corpus import Corpus
from .errors import UserError
from .ids import hash_strings, repeated_rows
from .model import Model, model_corpus
from .modeldir import ModelDir
from .scoring import check_k, lookup, seen_tokens, unit_rows, url_log_prior, with_prior
from .urls import normalize, recorded

log = logging.getLogger(__name__)

SCORES_BYTES = 1 << 30  # the score matrices of one batch of users, at most


@dataclasses.dataclass
class HeldoutRanks:
    """Where each held-out pair's URL landed in its user's ranking, for the model and the popularity baseline.

    users: the doc ids evaluated (sorted); user_of_pair: each pair's position in `users`; ranks: per scorer,
    each pair's URLs scored strictly above its hidden URL, capped at `upto` (a hidden URL the user was trained
    on counts as `upto`); reciprocal: per scorer, each user's 1 / (1 + rank of its best hidden URL), uncapped."""

    upto: int
    users: np.ndarray
    user_of_pair: np.ndarray
    ranks: dict[str, np.ndarray]
    reciprocal: dict[str, np.ndarray]
    users_with_pairs: int
    skipped_pairs: int

    def recall(self, name: str, k: int) -> np.ndarray:
        """Each user's recall@k (k <= upto): the share of its hidden URLs in its top k."""
        hit = (self.ranks[name] < k).astype(np.float64)
        return np.bincount(self.user_of_pair, weights=hit, minlength=len(self.users)) / np.bincount(
            self.user_of_pair, minlength=len(self.users))


def heldout_metrics(model: str, heldout: str, k: int = 10, max_users: int | None = 20_000, seed: int = 0,
                    corpus_path: str | None = None, batch: int = 512, baseline: bool = True,
                    without_top: int = 0) -> dict:
    """recall@k and MRR of the model and of the popularity baseline on held-out (key, token) pairs.

    recall@k is averaged over users (share of each user's hidden URLs in the top k); MRR is the mean
    reciprocal rank of each user's best-ranked hidden URL. Seen URLs are excluded from the ranking.
    Popularity ranks by the corpus's counts, ties by id. `baseline=False` skips it (tune measures
    every trial, the baseline once). Past `max_users` users with pairs (None: no limit), a random
    sample of that many (by `seed`) is evaluated: `users` says how many, `users_with_pairs` of how many.
    without_top > 0: the long tail's figures, the `without_top` most common URLs left out (rank_heldout).
    """
    k = check_k(k, "evaluate")
    found = rank_heldout(model, heldout, k, max_users, seed, corpus_path, batch, baseline, without_top=without_top)
    return {"k": k, "users": len(found.users), "users_with_pairs": found.users_with_pairs,
            "pairs": len(found.user_of_pair), "skipped_pairs": found.skipped_pairs,
            **{f"{name}_{metric}": value for name in found.ranks
               for metric, value in ((f"recall@{k}", float(found.recall(name, k).mean())),
                                     ("mrr", float(found.reciprocal[name].mean())))}}


def rank_heldout(model: str, heldout: str, upto: int = 10, max_users: int | None = 20_000, seed: int = 0,
                 corpus_path: str | None = None, batch: int = 512, baseline: bool = True,
                 gather: Callable[[ModelDir, str, np.ndarray], np.ndarray] | None = None,
                 without_top: int = 0) -> HeldoutRanks:
    """Rank every URL for each user with held-out pairs (heldout_metrics says how), by the model and by
    popularity, and say where each hidden URL landed, up to rank `upto` (what recall@k for every k up to
    it needs: the report's curve). gather(model, table, rows): how the users' rows are read (default:
    Model.gather, from the memory-mapped parts; the report streams them). The `without_top` most common
    URLs (by the corpus's counts, ties by id) are neither hidden nor ranked, as if every user had
    seen them: on short documents a handful of hub words are a fifth of the hidden ones, and whether they
    stay in everyone's top k decides recall@k more than the rest of the vectors (benchmarks/quality.py)."""
    table = read_table_file(heldout, "held-out pairs", ("key", "token"), string_cols=("key", "token"))
    found = ModelDir.served(model)
    vocab = found.keys("words_out")
    doc_ids = key_rows(found, "docs", table.column("key").cast(pa.string()))
    # the hidden URLs read by the model's URL rule, as infer reads a new user's (urls.py)
    rule = recorded(found.store.path("vocab.arrow"))
    tokens = normalize(table.column("token").cast(pa.string()).combine_chunks(), rule)
    word_ids = pc.index_in(tokens, value_set=vocab.cast(pa.string()))
    valid = pc.and_(pc.is_valid(doc_ids), pc.is_valid(word_ids))
    skipped = len(table) - pc.sum(valid).as_py() if len(table) else 0
    docs = doc_ids.filter(valid).to_numpy(zero_copy_only=False).astype(np.int64)
    words = word_ids.filter(valid).to_numpy(zero_copy_only=False).astype(np.int64)
    if corpus_path is None:  # the model's own, checked: another at its path gave other figures, exit 0
        corpus, problem = model_corpus(found)
        if problem:
            raise UserError(f"{problem}: the held-out ranking reads each user's visited URLs and the URLs' counts "
                            "from the corpus the model was trained on")
        corpus_path = corpus.path
    counts = Corpus(corpus_path).counts()
    by_count = np.argsort(-counts, kind="stable")  # the URLs, most common first (then by id)
    hubs = by_count[:max(0, without_top)].astype(np.int64)
    if len(hubs):
        tail = ~np.isin(words, hubs)
        docs, words = docs[tail], words[tail]
    if len(docs) == 0:
        raise UserError(f"{heldout}: no held-out pair matches a user and URL of {model}"
                        + (f" outside its {without_top} most common URLs" if len(hubs) else ""))
    users = np.unique(docs)
    users_with_pairs = len(users)
    if max_users is not None and len(users) > max_users:
        users = np.sort(np.random.default_rng(seed).choice(users, max_users, replace=False))
        keep = np.isin(docs, users)
        docs, words = docs[keep], words[keep]
    seen = seen_tokens(corpus_path, users)
    docs, words, users = _left_out_if_trained(heldout, model, docs, words, users, seen, len(counts))
    # only the evaluated users' rows, from the verified memory-mapped parts: the whole table of 20M
    # users is 8 GB, and with its prior column a second copy (the benchmark's 20M run ran out of 24 GiB)
    rows = Model(found.path).gather("docs", users) if gather is None else gather(found, "docs", users)
    doc_matrix, out_matrix = with_prior(rows, found.read_table("words_out"), url_log_prior(found))
    # popularity ranks by count (then id), with no ties: each URL's place in that order
    popularity = np.empty(len(counts), np.int64)
    popularity[by_count] = np.arange(len(counts))
    batch = max(1, min(batch, SCORES_BYTES // (4 * max(len(counts), 1))))  # one [batch, URLs] float32 matrix
    outs = torch.from_numpy(np.ascontiguousarray(out_matrix.T))
    del out_matrix  # its transposed copy is what is scored: 0.4 GB less held at 1M URLs

    order = np.argsort(docs, kind="stable")
    docs, words = docs[order], words[order]
    user_of_pair = np.searchsorted(users, docs)  # 0..len(users)-1
    scorers = {"model": lambda a, b: torch.from_numpy(doc_matrix[a:b]) @ outs}
    results = {name: ([], []) for name in [*scorers, *(["popularity"] if baseline else [])]}
    for a in range(0, len(users), batch):
        b = min(a + batch, len(users))
        p0, p1 = np.searchsorted(user_of_pair, [a, b])
        rows, cols = torch.from_numpy(user_of_pair[p0:p1] - a), torch.from_numpy(words[p0:p1])
        mine = [seen.get(int(user), _NONE) for user in users[a:b]]
        if len(hubs):  # (popularity_ranks takes a URL seen twice as once)
            mine = [np.concatenate([m, hubs]) for m in mine]
        seen_rows = torch.from_numpy(np.repeat(np.arange(b - a), [len(t) for t in mine]))
        seen_cols = torch.from_numpy(np.concatenate(mine).astype(np.int64))
        for name, score in scorers.items():
            scores = score(a, b)
            scores[seen_rows, seen_cols] = -torch.inf  # seen URLs are not predictions
            ranks, reciprocal = rank_hidden(scores, rows, cols, upto)
            results[name][0].append(ranks)
            results[name][1].append(reciprocal)
        if baseline:  # the same ranking every user shares: counted, without a [batch, URLs] matrix of it
            ranks, reciprocal = popularity_ranks(popularity, user_of_pair[p0:p1] - a, words[p0:p1], mine, upto)
            results["popularity"][0].append(ranks)
            results["popularity"][1].append(reciprocal)
    return HeldoutRanks(upto, users, user_of_pair, {name: np.concatenate(r) for name, (r, _) in results.items()},
                        {name: np.concatenate(q) for name, (_, q) in results.items()}, users_with_pairs, int(skipped))


_NONE = np.zeros(0, np.int32)


def _left_out_if_trained(heldout: str, model: str, docs: np.ndarray, words: np.ndarray, users: np.ndarray,
                         seen: dict, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs less those whose URL the user was trained on (its document holds it): prepare --holdout hides
    every event of a hidden pair, so such a pair is no held-out one (a file of another split or corpus, or a
    refresh that took the hidden events back), and ranked it would only count as a miss (seen URLs are not
    predictions). A warning counts them; all of them: an error."""
    trained_keys = np.concatenate([_NONE.astype(np.int64)] + [user * vocab_size + seen.get(int(user), _NONE)
                                                              for user in users])
    trained = np.isin(docs * vocab_size + words, trained_keys)
    if not trained.any():
        return docs, words, users
    n = int(trained.sum())
    if trained.all():
        raise UserError(f"{heldout}: every one of its {n:,} pairs (of the users evaluated) is in {model}'s training "
                        "documents: these URLs were not held out of its corpus; give the held-out file prepare "
                        "--holdout-out wrote with the corpus the model was trained on")
    log.warning(f"warning: {heldout}: {n:,} of its {len(docs):,} pairs (of the users evaluated) are in {model}'s "
                "training documents, so not held out (a file of another split, or a refresh that took the hidden "
                "events back in); left out of the figures")
    docs, words = docs[~trained], words[~trained]
    return docs, words, users[np.isin(users, docs)]


def popularity_ranks(place: np.ndarray, rows: np.ndarray, cols: np.ndarray, seen: list[np.ndarray],
                     upto: int) -> tuple[np.ndarray, np.ndarray]:
    """rank_hidden for the popularity ranking (`place`: each URL's place in it, from 0), counted: a hidden URL's
    URLs ranked above it are those placed before it less the user's seen ones among them (its place in the
    order, less how many of its seen URLs come before); a seen hidden URL counts as `upto`, as at -inf."""
    # each user's seen URLs' places, sorted and unique, as one sorted array of user * span + place
    span, users = len(place) + 1, np.arange(len(seen), dtype=np.int64)
    owner = np.repeat(users, np.fromiter((len(s) for s in seen), np.int64, len(seen)))
    placed = np.unique(owner * span + place[np.concatenate([_NONE, *seen]).astype(np.int64)])
    start = np.searchsorted(placed, users * span)  # where each user's own begin
    count = np.searchsorted(placed, (users + 1) * span) - start
    hidden = place[cols]
    key = rows * span + hidden
    at = np.searchsorted(placed, key)
    before = at - start[rows]  # the user's seen URLs placed before the hidden one
    is_seen = before < count[rows]  # at is then inside the user's own: seen if it is the hidden URL's place
    is_seen[is_seen] = placed[at[is_seen]] == key[is_seen]
    ranks = np.where(is_seen, upto, np.minimum(hidden - before, upto)).astype(np.int32)
    best = np.full(len(seen), len(place), np.int64)  # the best placed hidden URL not seen, per user
    np.minimum.at(best, rows[~is_seen], hidden[~is_seen])
    higher = np.where(best < len(place), best - (np.searchsorted(placed, users * span + best) - start),
                      len(place) - count).astype(np.float64)
    return ranks, 1.0 / (1 + higher)


def key_rows(found: ModelDir, table: str, keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The row id of each of `keys` in a key table of the model (null where it has none), found by hashing the
    keys asked for and reading the key file's record batches past them: a 20M-user key table is never held,
    nor hashed (as a value set of 20M strings it took 3 GB)."""
    from .modeldir import KEY_TABLES

    asked = pc.unique(keys)
    rows = np.full(len(asked), -1, np.int64)
    name, column = KEY_TABLES[table]
    with pa.memory_map(found.store.path(name)) as source:
        reader = pa.ipc.open_file(source)
        start = 0
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b).column(column).cast(pa.string())
            hit = pc.index_in(batch, value_set=asked)
            where = np.flatnonzero(pc.is_valid(hit).to_numpy(zero_copy_only=False))
            rows[hit.filter(pc.is_valid(hit)).to_numpy()] = start + where
            start += len(batch)
    found_rows = pa.array(rows, mask=rows < 0)
    return pc.take(found_rows, pc.index_in(keys, value_set=asked))


def rank_hidden(scores: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, upto: int) -> tuple[np.ndarray, np.ndarray]:
    """Per hidden URL (`cols` at `rows` of `scores`, a row per user, seen URLs at -inf; every row has one):
    how many URLs score strictly above it, capped at `upto` (it is in a user's top k, k <= upto, exactly when
    this is below k: ties with the k-th score count as in), a hidden URL at -inf counting as `upto`; and per
    row, the reciprocal rank of its best hidden URL (1 / (1 + URLs scored strictly higher)). Whole-matrix
    operations, no Python per user: 20k users x 100k URLs in seconds."""
    users = scores.shape[0]
    hidden = scores[rows, cols]
    top = scores.topk(min(upto, scores.shape[1]), dim=1).values  # [users, upto], best first
    above = (top[rows] > hidden[:, None]).sum(1)
    ranks = torch.where(hidden > -torch.inf, above, torch.tensor(upto)).clamp(max=upto)
    best = torch.full((users,), -torch.inf).scatter_reduce(0, rows, hidden, "amax")
    higher = (scores > best[:, None]).to(torch.int32).sum(1, dtype=torch.int32)  # twice as fast as a bool sum
    return ranks.numpy().astype(np.int32), (1.0 / (1 + higher.to(torch.float64))).numpy()


def read_pairs(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """Human similarity judgements: a square matrix (Lee format; row i is the document keyed str(i),
    upper triangle used) or a table with columns key1, key2, score (Parquet, CSV or TSV)."""
    if path.lower().rstrip("/").endswith((".parquet", ".csv", ".tsv")) or _is_directory(path):
        t = read_table_file(path, "pairs", ("key1", "key2", "score"), string_cols=("key1", "key2"),
                            no_nulls=("key1", "key2", "score"))
        keys1, keys2 = t.column("key1").cast(pa.string()), t.column("key2").cast(pa.string())
        try:
            score = np.asarray(t.column("score").to_numpy(zero_copy_only=False), dtype=np.float64)
        except (ValueError, pa.ArrowException):
            raise UserError(f"{path}: column 'score' is not numbers ({t.schema.field('score').type})") from None
        bad = np.flatnonzero(~np.isfinite(score))
        if len(bad):
            raise UserError(f"{path}: row {bad[0]} has score {score[bad[0]]} ({len(bad):,} row(s) are not finite "
                            "numbers); every pair needs a score")
        # a pair, whichever way it is written: counted twice it would weigh twice in the correlation
        first = pc.less_equal(keys1, keys2)
        lo, hi = pc.if_else(first, keys1, keys2), pc.if_else(first, keys2, keys1)
        refuse_duplicates(path, "the pairs", pc.binary_join_element_wise(lo, hi, " / "), "pair",
                          " (key1 / key2, either way round)")
        return keys1.to_pylist(), keys2.to_pylist(), score
    try:
        matrix = np.loadtxt(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a numeric similarity matrix ({exc}); a table of key1, key2, score is read "
                        "from a name ending in .parquet, .csv or .tsv, or a Parquet directory") from None
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise UserError(f"{path}: expected a square matrix, found shape {matrix.shape}")
    i, j = np.triu_indices(len(matrix), 1)
    bad = np.flatnonzero(~np.isfinite(matrix[i, j]))
    if len(bad):
        raise UserError(f"{path}: row {i[bad[0]]}, column {j[bad[0]]} holds {matrix[i[bad[0]], j[bad[0]]]} "
                        f"({len(bad):,} pair(s) above the diagonal are not finite numbers); every pair needs a score")
    return [str(x) for x in i], [str(x) for x in j], matrix[i, j]


def _is_directory(path: str) -> bool:
    """A directory here or behind a URI (a Parquet dataset: read as a table)."""
    if not storage.is_uri(path):
        return os.path.isdir(path)
    import pyarrow.fs as pafs

    try:
        fs, inner = storage.resolve(path)
        return fs.get_file_info(inner).type == pafs.FileType.Directory
    except (OSError, pa.ArrowException):
        return False


def pairs_metrics(model: str, path: str, table: str = "docs", test_fraction: float | None = None, seed: int = 0,
                  part: str = "test") -> dict:
    """Pearson and Spearman correlation of cosine similarity with human scores: over every pair, or,
    with `test_fraction`, over one side of a fixed split of the pairs (`part`: "test", the pairs
    `in_test_share` puts there, or "validation", the rest; tune searches on the one, reports the other)."""
    from scipy.stats import pearsonr, spearmanr

    keys1, keys2, human = read_pairs(path)
    if test_fraction is not None:
        ordered = [(a, b) if a <= b else (b, a) for a, b in zip(keys1, keys2)]  # a pair, whichever way written
        test = in_test_share(pa.array([f"{a}\x1f{b}" for a, b in ordered], pa.string()), test_fraction, seed)
        mine = test if part == "test" else ~test
        if mine.sum() < 3:
            raise UserError(f"{path}: only {int(mine.sum())} of its {len(human)} pairs fall in the {part} share "
                            f"(test fraction {test_fraction}); too few to correlate")
        keys1, keys2, human = ([k for k, m in zip(keys1, mine) if m], [k for k, m in zip(keys2, mine) if m],
                               human[mine])
    # (before the model is read; of the pairs scored: a share of a file can be constant where the file is not)
    _not_constant(f"{path}: every score" + ("" if test_fraction is None else f" of the {part} share"), human)
    found = ModelDir.served(model)
    keys = found.keys(table)
    vectors = found.read_table(table)
    a = unit_rows(vectors[lookup(keys, keys1, table)])
    b = unit_rows(vectors[lookup(keys, keys2, table)])
    cosine = (a * b).sum(1)
    _not_constant("the model's cosine similarity of every pair", cosine, 1e-9)
    return {"pairs": len(human), **({} if test_fraction is None else {"part": part, "test_fraction": test_fraction}),
            "pearson": float(pearsonr(cosine, human)[0]), "spearman": float(spearmanr(cosine, human)[0])}


def _not_constant(what: str, values: np.ndarray, close: float = 0.0) -> None:
    if len(values) and np.ptp(values) <= close:
        raise UserError(f"{what} is {values[0]:g}: a correlation with a constant is undefined")


def in_test_share(keys: pa.Array, fraction: float, seed: int = 0) -> np.ndarray:
    """Which keys fall in the test share of a fixed split: those whose (seeded) hash lies in the lowest
    `fraction` of its range. A key's side depends on the key alone, not on the file's order or on the
    other keys, so tune's validation side and evaluate's test side never meet, whatever the model knows."""
    if not 0 < fraction < 1:
        raise UserError(f"the test fraction must be between 0 and 1, not {fraction}")
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    unit = (hash_strings(keys.cast(pa.string()), salt=seed) >> np.uint64(11)).astype(np.float64) / 2.0 ** 53
    return unit < fraction


def read_table_file(path: str, what: str, columns: tuple[str, ...], string_cols: tuple[str, ...] = (),
                    no_nulls: tuple[str, ...] = ()) -> pa.Table:
    """A Parquet (file or directory) or CSV/TSV table that must have `columns`, with no null in `no_nulls`
    (refused in one line naming the first such row).

    CSV columns in `string_cols` stay strings as written: a key "007" is not the number 7.
    """
    import pyarrow.csv as pcsv

    try:
        if path.lower().endswith((".csv", ".tsv")):
            t = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter="\t" if path.lower().endswith(".tsv")
                                                                    else ","),
                              convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(string_cols, pa.string())))
        else:
            t = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise UserError(f"{path}: cannot read {what} ({exc})".replace("\n", " ")) from None
    for col in columns:
        if col not in t.column_names:
            raise UserError(f"{path}: column {col!r} not found (columns: {', '.join(t.column_names)})")
    for col in no_nulls:
        nulls = t.column(col).null_count
        if nulls:
            row = pc.index(pc.is_null(t.column(col)), True).as_py()
            raise UserError(f"{path}: row {row} has no {col!r} ({nulls:,} row(s) are null there); every row of "
                            f"{what} needs one")
    return t


def refuse_duplicates(path: str, what: str, keys: pa.Array | pa.ChunkedArray, named: str, where: str = "") -> None:
    """One line naming the first key given twice in `keys` (a column of `path`) and its first two rows: a key
    counted twice would weigh twice in the figure, or (labels) be its own neighbour."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    again, first = repeated_rows(keys)
    if not len(again):
        return
    earliest = first[again].min()  # the key given twice that comes first, and its second row
    second = again[first[again] == earliest][0]
    raise UserError(f"{path}: {named} {keys[int(earliest)].as_py()!r}{where} is in rows {earliest} and {second}; "
                    f"{len(np.unique(first[again])):,} {named}(s) are given more than once: give each once in {what}")


def labels_metrics(model: str, path: str, k: int = 10, key_col: str = "key", label_col: str = "label",
                   test_fraction: float = 0.2, seed: int = 0, table: str = "docs", part: str = "test") -> dict:
    """k-NN label accuracy: each test user takes the majority label of its k nearest reference users.

    The split is fixed (`in_test_share`: about `test_fraction` of the keys, each by its own hash), so
    repeated runs and different models are scored on the same users. The majority label of the
    reference users is the baseline. part="validation" never looks at the test users: each reference
    user is voted on by its k nearest other reference users (what tune searches on).
    """
    k = check_k(k, "evaluate")
    data = read_table_file(path, "labels", (key_col, label_col), string_cols=(key_col,), no_nulls=(key_col, label_col))
    keys = data.column(key_col).cast(pa.string())
    refuse_duplicates(path, "the labels (one label a key)", keys, "key", f" (column {key_col!r})")
    found = ModelDir.served(model)
    rows = pc.index_in(keys, value_set=found.keys(table).cast(pa.string()))
    known = pc.is_valid(rows)
    rows = rows.filter(known).to_numpy(zero_copy_only=False).astype(np.int64)
    labels = data.column(label_col).filter(known).cast(pa.string()).to_numpy(zero_copy_only=False)
    if len(rows) < 10:
        raise UserError(f"{path}: only {len(rows)} of its keys are {table} keys of {model}")
    test = in_test_share(keys.filter(known), test_fraction, seed)
    if not test.any() or test.all():
        raise UserError(f"{path}: its {len(rows)} keys give no {'test' if not test.any() else 'reference'} users "
                        f"at test fraction {test_fraction}")
    vectors = unit_rows(found.read_table(table))
    ref_labels = labels[~test]
    names, codes = np.unique(ref_labels, return_inverse=True)
    majority = names[np.bincount(codes).argmax()]
    if part == "validation":
        predicted = names[knn_vote(vectors[rows[~test]], codes, vectors[rows[~test]], k, len(names),
                                   leave_one_out=True)]
        truth = ref_labels
        sizes = {"validation_users": int((~test).sum())}
    else:
        predicted = names[knn_vote(vectors[rows[~test]], codes, vectors[rows[test]], k, len(names))]
        truth = labels[test]
        sizes = {"test_users": int(test.sum()), "reference_users": int((~test).sum())}
    return {"k": k, **sizes, "skipped_keys": int(len(keys) - len(rows)),
            f"knn_accuracy@{k}": float((predicted == truth).mean()), "majority_accuracy": float((truth == majority).mean())}


def knn_vote(references: np.ndarray, codes: np.ndarray, queries: np.ndarray, k: int, classes: int,
             leave_one_out: bool = False) -> np.ndarray:
    """The label code of each query by majority of its k nearest references (inner product of the given,
    normalised, rows; nearer neighbours break ties). With leave_one_out the queries are the references,
    and each query's own row is not among its neighbours."""
    import faiss

    index = faiss.IndexFlatIP(references.shape[1])
    index.add(np.ascontiguousarray(references, dtype=np.float32))
    width = min(k + leave_one_out, len(references))
    _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), width)
    if leave_one_out:
        drop = found == np.arange(len(queries))[:, None]
        drop[~drop.any(1), -1] = True  # itself not found (ties with duplicates): the farthest goes
        found = found[~drop].reshape(len(queries), width - 1)
    votes = np.zeros((len(found), classes))
    for j in range(found.shape[1]):  # nearer neighbours break ties: a tiny bonus by rank
        np.add.at(votes, (np.arange(len(found)), codes[found[:, j]]), 1.0 + 1e-3 * (found.shape[1] - j))
    return votes.argmax(1)


def save_and_print(model: str, name: str, metrics: dict) -> str:
    """Print the figures, then save them as MODEL/eval-NAME.json (a local or remote model); returns
    the file's path. The figures come first: a model on a read-only share, or a full disk, still
    gets them, and then one line saying why they were not saved (a UserError)."""
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        logs.result(f"{key:<{width}}  {shown}")
    store = storage.Store.of(model)
    rel = f"eval-{name}.json"
    try:
        store.write_bytes(rel, json.dumps(metrics, indent=2).encode())
    except storage.CheckpointWriteError as exc:
        raise UserError(f"{exc}; the figures above are not saved") from None
    return storage.join(model, rel)
