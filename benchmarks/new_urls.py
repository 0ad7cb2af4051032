"""Vectors for URLs never seen, measured (issue 51, part 3): tokens held out of training, new users, recall@10.

    python benchmarks/new_urls.py                      # data/sample (synthetic: its hosts carry its communities)
    python benchmarks/new_urls.py --data messy         # benchmarks/messy_urls.py's log: generate 10k x 15k, 20% of
                                                       # its events written another way (normalised by the rule here)
    python benchmarks/new_urls.py --data pypi          # 100,000 PyPI summaries (../shared/data): words, not URLs
    python benchmarks/new_urls.py --quick              # a smoke run: the sample, 2 epochs, seed 1
    python benchmarks/new_urls.py --report A.json B.json   # the tables of earlier runs, their seeds pooled
    python benchmarks/new_urls.py --time-compose 1000000 10000   # what composing costs, 10k pages, 1M URLs

Per seed, in one process and one local Ray:

  split     20% of the distinct tokens (normalised URLs, or words) are held out of training, and 20% of
            the users are new. Training: the other users' events less those of held-out tokens. A new
            user's events in time order: the first 80% visible, the rest hidden (text, which has no time:
            one word of each document of 3+ words hidden, the others visible)
  train     prepare and train (dim, epochs, one worker, the seed); for "trained", a second model on the
            same events, each event followed by its URL's parts as words of the same user (below)
  infer     the new users' vectors from their visible events, each arm its own way
  rank      every token of the log is a candidate (the universe): each arm gives it a vector or none.
            A user's score for a token is the model's log P(token | user) as `evaluate` scores it
            (d·o + ns_exponent · log count); a composed token's count is the mean count of the known
            tokens whose rows it averages. The user's visible tokens are left out; recall@10 is the share
            of the user's distinct hidden tokens in the top 10, averaged over users. A user infer cannot
            place is ranked by popularity (a zero vector)

The arms:

  drop       today's infer (--no-compose): unknown tokens dropped; only the model's own tokens ranked
  drop+rank  the same users' vectors; unknown tokens ranked too, by their composed vectors
  derived    infer composing (the default; compose.py): an unknown URL's row is the count-weighted mean
             of the known rows sharing its most specific part (path prefix, host, domain); ranked likewise
  geo-count  derived, but a composed token ranked with the geometric mean of the counts of the URLs
             averaged (the mean of their log counts: their mean prior) instead of the mean count, which
             the most visited of them set (URL data only)
  true-count derived, but a composed token ranked with its true count (in the whole log, times the
             training events' share): not a method (no one knows a new URL's count), a bound on what
             a better estimate of it could gain
  trained    part rows trained jointly: every event (user, url) also gives (user, "host:…"), (user,
             "domain:…") and (user, "path:…") for each path prefix short of the URL itself, so the part
             rows are words the users predict; infer reads the visible events with their parts (unknown
             URLs dropped, their parts kept), and an unknown URL's vector is its most specific part's
             trained row (its count: the part's count over its URLs'). Not fastText's composition (a
             URL's row the sum of its parts' rows, trained through the sum): that needs the kernels to
             gather and scatter 1 + P rows per target and negative (compose.py says why we did not)

Text (--data pypi): words have no host or path. Their parts are taken to be fastText's: character
n-grams of "<word>" (3 to 5 characters), derived after training as for URLs (an n-gram's row: the
count-weighted mean of the known words containing it; an unknown word's: the mean of its known
n-grams' rows). This is the benchmark's own composer, not the product's: infer composes URLs only.

Users reported: the new users whose hidden events include a held-out token ("new-token users"; the
issue's population), and all new users with hidden events. Columns: recall@10 over all of their hidden
tokens, over the held-out tokens only, and the users infer could not place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from doc2vec_dist.runners import calm_openmp

calm_openmp()  # before faiss is imported

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.modeldir import ModelDir

HOLDOUT = 0.2      # share of the distinct tokens held out of training
NEW_USERS = 0.2    # share of the users who are new
VISIBLE = 0.8      # share of a new user's events (in time order) that infer sees
TRAIN = {"dim": 100, "epochs": 10, "num_ps": 1, "num_workers": 1, "cpus_per_worker": 2, "progress": False}
PYPI = os.path.join(ROOT, "..", "shared", "data", "pypi_summaries.parquet")
NGRAMS = (3, 4, 5)
K = 10
ARMS = ("drop", "drop+rank", "derived", "geo-count", "true-count", "trained")
PART_PREFIXES = ("host:", "domain:", "path:")


# -- the data --------------------------------------------------------------------------------------------

def sample_events() -> pa.Table:
    return pq.read_table(os.path.join(ROOT, "data", "sample", "events"), columns=["user_id", "url", "ts"])


def messy_events(work: str, users: int, urls: int) -> pa.Table:
    """benchmarks/messy_urls.py's messy log of `generate --users U --urls M` (seed 0), normalised by the
    default rule, as prepare would: a page held out is held out in every way it is written."""
    import messy_urls

    from doc2vec_dist.synthetic import generate
    from doc2vec_dist.urls import UrlRule, normalize

    generated = os.path.join(work, f"generated-{users}x{urls}")
    if not os.path.isdir(generated):
        generate(generated, users, urls, seed=0, progress=False)
    path = os.path.join(work, f"messy-{users}x{urls}.parquet")
    messy_urls.messy_log(generated, path, messy_urls.MESSY)
    events = pq.read_table(path, columns=["user_id", "url", "ts"])
    return events.set_column(1, "url", normalize(events.column("url").combine_chunks(), UrlRule()))


def pypi_events(docs: int, seed: int = 0) -> pa.Table:
    """`docs` PyPI summaries (a seeded sample) as events: package, word (lower-cased runs of letters and
    digits), position as the time."""
    table = pq.read_table(PYPI, columns=["package", "summary"])
    pick = np.sort(np.random.default_rng(seed).choice(table.num_rows, min(docs, table.num_rows), replace=False))
    table = table.take(pa.array(pick))
    users, words, times = [], [], []
    for package, summary in zip(table.column("package").to_pylist(), table.column("summary").to_pylist()):
        found = re.findall(r"[a-z0-9]+", (summary or "").lower())
        users += [package] * len(found)
        words += found
        times += range(len(found))
    return pa.table({"user_id": users, "url": words, "ts": pa.array(times, pa.int64())})


# -- the split ---------------------------------------------------------------------------------------------

def split(events: pa.Table, seed: int, text: bool) -> dict:
    """Held-out tokens, new users, and the training, visible and hidden events."""
    rng = np.random.default_rng(seed)
    tokens = pc.unique(events.column("url")).sort()
    held_out = tokens.filter(pa.array(rng.random(len(tokens)) < HOLDOUT))
    users = pc.unique(events.column("user_id")).sort()
    new = users.filter(pa.array(rng.random(len(users)) < NEW_USERS))
    is_new = pc.is_in(events.column("user_id"), value_set=new)
    train = events.filter(pc.and_(pc.invert(is_new), pc.invert(pc.is_in(events.column("url"), value_set=held_out))))
    theirs = events.filter(is_new).sort_by([("user_id", "ascending"), ("ts", "ascending")])
    user = theirs.column("user_id").combine_chunks()
    starts = np.flatnonzero(np.r_[True, pc.not_equal(user.slice(1), user.slice(0, len(user) - 1)).to_numpy(
        zero_copy_only=False)])
    lengths = np.diff(np.r_[starts, len(user)])
    position = np.arange(len(user)) - np.repeat(starts, lengths)
    length = np.repeat(lengths, lengths)
    if text:  # one word of each document of 3+ words, at random
        chosen = np.repeat((rng.random(len(lengths)) * lengths).astype(np.int64), lengths)
        hidden = (length >= 3) & (position == chosen)
    else:
        hidden = position >= np.ceil(VISIBLE * length)
    return {"held_out": held_out, "train": train, "visible": theirs.filter(pa.array(~hidden)),
            "hidden": theirs.filter(pa.array(hidden)), "universe": tokens}


def with_parts(events: pa.Table) -> pa.Table:
    """Each event followed by events of its URL's parts (host:, domain: where it is not the host, path:
    for each path prefix short of the URL's own path, and its own path where the URL has a query), same
    user and time: what the "trained" arm's model learns part rows from."""
    from doc2vec_dist.compose import url_parts

    urls = events.column("url").combine_chunks()
    parts = url_parts(urls)
    queried = pc.match_substring_regex(urls, r"[?#]").fill_null(False)
    segments = parts["segments"]
    pieces = [events]
    extra = [("host:", parts["host"], None), ("domain:", parts["domain"], pc.not_equal(parts["domain"], parts["host"]))]
    for name in [k for k in parts if k.startswith("path")]:
        d = int(name[4:])
        extra.append(("path:", parts[name], pc.or_(pc.less(pa.scalar(d, pa.int32()), segments), queried)))
    for prefix, values, keep in extra:
        mask = pc.is_valid(values) if keep is None else pc.and_(pc.is_valid(values), keep.fill_null(False))
        chosen = events.filter(mask)
        pieces.append(chosen.set_column(1, "url", pc.binary_join_element_wise(prefix, values.filter(mask), "")))
    return pa.concat_tables(pieces)


# -- composers for words (the benchmark's own: fastText's character n-grams) ---------------------------------

def ngrams(word: str) -> set[str]:
    marked = f"<{word}>"
    return {marked[i:i + n] for n in NGRAMS for i in range(len(marked) - n + 1)}


class NgramComposed:
    """What Inferrer.add_composed and the ranking read of a compose answer (compose.Composed's shape)."""

    def __init__(self, own, word_grams, gram_words, gram_weights, weights, n):
        self.own = own
        self.word_grams = word_grams      # per asked word: ids of its known n-grams (own: empty)
        self.gram_words, self.gram_weights = gram_words, gram_weights
        self.has_vector = (own >= 0) | np.array([len(g) > 0 for g in word_grams], bool)
        composed = (own < 0) & self.has_vector
        self.source = pa.array(["own" if o >= 0 else "ngram" if c else None for o, c in zip(own, composed)], pa.string())
        gram_count = np.array([weights[w].sum() / len(w) for w in gram_words])  # mean count of its words
        self.counts = np.array([weights[o] if o >= 0 else (gram_count[g].mean() if len(g) else 0.0)
                                for o, g in zip(own, word_grams)])

    def vectors(self, matrix: np.ndarray) -> np.ndarray:
        grams = np.stack([(matrix[w] * c[:, None]).sum(0) / c.sum() for w, c in zip(self.gram_words, self.gram_weights)]) \
            if self.gram_words else np.zeros((0, matrix.shape[1]), np.float32)
        out = np.full((len(self.own), matrix.shape[1]), np.nan, np.float32)
        for i, (o, g) in enumerate(zip(self.own, self.word_grams)):
            if o >= 0:
                out[i] = matrix[o]
            elif len(g):
                out[i] = grams[g].mean(0)
        return out


class NgramComposer:
    """An unknown word's vector: the mean of its known character n-grams' rows, each the count-weighted
    mean of the rows of the known words containing it."""

    def __init__(self, tokens: pa.Array, weights: np.ndarray):
        self.words = tokens.to_pylist()
        self.weights = np.asarray(weights, np.float64)
        self.index: dict[str, list[int]] = {}
        for i, word in enumerate(self.words):
            for gram in ngrams(word):
                self.index.setdefault(gram, []).append(i)

    def compose(self, tokens: pa.Array) -> NgramComposed:
        own = pc.index_in(tokens, value_set=pa.array(self.words, pa.string())).fill_null(-1).to_numpy(
            zero_copy_only=False).astype(np.int64)
        gram_id: dict[str, int] = {}
        word_grams = []
        for word, o in zip(tokens.to_pylist(), own):
            mine = [] if o >= 0 else [gram_id.setdefault(g, len(gram_id)) for g in sorted(ngrams(word))
                                      if g in self.index]
            word_grams.append(np.array(mine, np.int64))
        gram_words = [np.array(self.index[g], np.int64) for g in gram_id]
        return NgramComposed(own, word_grams, gram_words, [self.weights[w] for w in gram_words], self.weights,
                             len(tokens))


# -- the arms --------------------------------------------------------------------------------------------

def train_model(events: pa.Table, where: str, train: dict, seed: int) -> str:
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.trainer import train as train_it

    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, "events.parquet")
    pq.write_table(events, path)
    corpus = prepare([path], os.path.join(where, "corpus"), PrepareConfig(time_col="ts"), progress=False)
    model = os.path.join(where, "model")
    train_it(corpus.path, model, TrainConfig(**train, seed=seed))
    return model


def infer_users(model: str, visible: pa.Table, where: str, compose: bool, text: bool, users: list[str]) -> np.ndarray:
    """[users, dim]: each user's inferred vector (NaN where infer could not place one)."""
    import doc2vec_dist.infer as infer_module

    path = os.path.join(where, f"visible-{compose}.parquet")
    pq.write_table(visible, path)
    made = infer_module.UrlComposer
    if text and compose:  # the benchmark's word composer in the product's place (infer composes URLs only)
        infer_module.UrlComposer = NgramComposer
    try:
        keys, vectors = infer_module.infer(model, [path], time_col="ts", compose=compose, progress=False)
    finally:
        infer_module.UrlComposer = made
    out = np.full((len(users), vectors.shape[1]), np.nan, np.float32)
    at = pc.index_in(keys, value_set=pa.array(users, pa.string()))
    mine = at.is_valid().to_numpy(zero_copy_only=False)  # users with nothing hidden are not measured
    out[at.filter(pa.array(mine)).to_numpy().astype(np.int64)] = vectors[mine]
    return out


def universe_rows(model: str, universe: pa.Array, how: str, text: bool) -> tuple[np.ndarray, np.ndarray]:
    """([N, dim] vectors, NaN where none; [N] counts) of every token of the log, by an arm's rule: "own"
    (the model's rows only), "composed" (compose.py, or n-grams for text), "parts" (trained part rows)."""
    from doc2vec_dist.compose import UrlComposer, url_parts
    from doc2vec_dist.modeldir import ModelDir

    found = ModelDir(model)
    vocab = found.vocab()
    tokens, counts = vocab.column("token").combine_chunks(), vocab.column("count").to_numpy().astype(np.float64)
    table = found.read_table("words_out")
    own = pc.index_in(universe, value_set=tokens).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    vectors = np.full((len(universe), table.shape[1]), np.nan, np.float32)
    weight = np.zeros(len(universe))
    vectors[own >= 0], weight[own >= 0] = table[own[own >= 0]], counts[own[own >= 0]]
    if how == "composed":
        composer = NgramComposer(tokens, counts) if text else UrlComposer(tokens, counts)
        composed = composer.compose(universe)
        return composed.vectors(table), composed.counts
    if how == "composed-geo":  # URLs: each composed one's count the geometric mean of its group's counts
        composed = UrlComposer(tokens, counts).compose(universe)
        found, mine = composed.counts.copy(), composed.group >= 0
        if mine.any():
            logs = np.add.reduceat(np.log(np.maximum(composed.weights, 1e-30)), composed.starts[:-1])
            found[mine] = np.exp(logs / np.diff(composed.starts))[composed.group[mine]]
        return composed.vectors(table), found
    if how == "parts":  # the most specific part token the model trained
        parts = url_parts(universe)
        levels = [k for k in parts if k.startswith("path")][::-1] + ["host", "domain"]
        left = own < 0
        for level in levels:
            prefix = "path:" if level.startswith("path") else f"{level}:"
            names = pc.binary_join_element_wise(prefix, parts[level], "")
            at = pc.index_in(names, value_set=tokens).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            hit = left & (at >= 0)
            if not hit.any():
                continue
            # a part token's count is that of its training URLs together: per URL, over how many there are
            theirs = pc.value_counts(names.filter(pa.array(own >= 0))).to_pylist()
            per = {entry["values"]: entry["counts"] for entry in theirs}
            vectors[hit] = table[at[hit]]
            weight[hit] = [counts[a] / max(per.get(n, 1), 1) for a, n in zip(at[hit], names.filter(pa.array(hit))
                                                                             .to_pylist())]
            left &= ~hit
    return vectors, weight


def recall(user_vectors: np.ndarray, rows: np.ndarray, counts: np.ndarray, ns_exponent: float, seen: list,
           hidden: list, batch: int = 1024) -> np.ndarray:
    """recall@K per user (hidden: each user's candidate ids, none seen)."""
    from doc2vec_dist.evaluate import HeldoutRanks, rank_hidden

    users = np.nan_to_num(user_vectors, nan=0.0)  # a user without a vector: ranked by popularity
    usable = ~np.isnan(rows).any(axis=1)
    targets = torch.from_numpy(np.where(usable[:, None], rows, 0.0).astype(np.float32).T.copy())
    with np.errstate(divide="ignore"):
        prior = torch.from_numpy(np.where(usable & (counts > 0), ns_exponent * np.log(np.maximum(counts, 1e-30)),
                                          -np.inf).astype(np.float32))
    ranks = []
    for a in range(0, len(users), batch):
        b = min(a + batch, len(users))
        scores = torch.from_numpy(users[a:b]) @ targets + prior
        for i in range(a, b):
            scores[i - a, torch.from_numpy(seen[i])] = -torch.inf
        rows_ = torch.from_numpy(np.repeat(np.arange(b - a), [len(h) for h in hidden[a:b]]))
        cols = torch.from_numpy(np.concatenate(hidden[a:b]).astype(np.int64))
        ranks.append(rank_hidden(scores, rows_, cols, K)[0])  # per hidden token: tokens scored above it
    # each user's share of its hidden tokens in its top K, as evaluate counts it
    user_of_pair = np.repeat(np.arange(len(users)), [len(h) for h in hidden])
    return HeldoutRanks(K, np.arange(len(users)), user_of_pair, {"arm": np.concatenate(ranks)}, {}, len(users),
                        0).recall("arm", K)


def run_seed(events: pa.Table, seed: int, work: str, train: dict, text: bool, arms: tuple[str, ...],
             keep_models: bool = False) -> dict:
    where = os.path.join(work, f"seed{seed}")
    shutil.rmtree(where, ignore_errors=True)
    s = split(events, seed, text)
    universe = s["universe"]
    users = pc.unique(s["hidden"].column("user_id")).to_pylist()
    position = {u: i for i, u in enumerate(users)}

    def by_user(table: pa.Table) -> list[np.ndarray]:
        ids = pc.index_in(table.column("url"), value_set=universe).to_numpy(zero_copy_only=False)
        found = [[] for _ in users]
        for user, token in zip(table.column("user_id").to_pylist(), ids):
            if user in position:
                found[position[user]].append(token)
        return [np.unique(np.asarray(f, np.int64)) for f in found]

    seen = by_user(s["visible"])
    hidden = [np.setdiff1d(h, v) for h, v in zip(by_user(s["hidden"]), seen)]
    held = pc.is_in(universe, value_set=s["held_out"]).to_numpy(zero_copy_only=False)
    keep = np.array([len(h) > 0 for h in hidden])
    new_token = np.array([held[h].any() for h in hidden]) & keep
    t = time.perf_counter()
    model = train_model(s["train"], os.path.join(where, "plain"), train, seed)
    seconds = {"train": time.perf_counter() - t}
    ns = TrainConfig(**train).ns_exponent
    vectors, found = {}, {}
    t = time.perf_counter()
    dropped = infer_users(model, s["visible"], where, False, text, users)
    seconds["infer"] = time.perf_counter() - t
    for arm in arms:
        if arm == "drop":
            vectors[arm] = (dropped, *universe_rows(model, universe, "own", text))
        elif arm == "drop+rank":
            vectors[arm] = (dropped, *universe_rows(model, universe, "composed", text))
        elif arm == "derived":
            t = time.perf_counter()
            users_vectors = infer_users(model, s["visible"], where, True, text, users)
            seconds["infer composing"] = time.perf_counter() - t
            vectors[arm] = (users_vectors, *universe_rows(model, universe, "composed", text))
        elif arm == "geo-count":
            vectors[arm] = (vectors["derived"][0], *universe_rows(model, universe, "composed-geo", text))
        elif arm == "true-count":
            user_vectors, rows, counts = vectors["derived"]
            total = pc.value_counts(events.column("url"))
            true = dict(zip(total.field("values").to_pylist(), total.field("counts").to_numpy()))
            share = s["train"].num_rows / events.num_rows
            composed = (counts > 0) & ~pc.is_in(universe, value_set=ModelDir(model).keys("words_out")).to_numpy(
                zero_copy_only=False)
            counts = counts.copy()
            counts[composed] = [true[t] * share for t in universe.filter(pa.array(composed)).to_pylist()]
            vectors[arm] = (user_vectors, rows, counts)
        elif arm == "trained":
            t = time.perf_counter()
            augmented = train_model(with_parts(s["train"]), os.path.join(where, "parts"), train, seed)
            seconds["train with parts"] = time.perf_counter() - t
            users_vectors = infer_users(augmented, with_parts(s["visible"]), where, False, text, users)
            vectors[arm] = (users_vectors, *universe_rows(augmented, universe, "parts", text))
    for arm, (user_vectors, rows, counts) in vectors.items():
        every = recall(user_vectors[keep], rows, counts, ns, [x for x, k in zip(seen, keep) if k],
                       [x for x, k in zip(hidden, keep) if k])
        mine = new_token[keep]
        only_new = recall(user_vectors[new_token], rows, counts, ns, [x for x, k in zip(seen, new_token) if k],
                          [h[held[h]] for h, k in zip(hidden, new_token) if k])
        found[arm] = {"recall@10 new-token users": float(every[mine].mean()),
                      "recall@10 held-out tokens": float(only_new.mean()),
                      "recall@10 all users": float(every.mean()),
                      "unplaced new-token users": int(np.isnan(user_vectors[new_token]).all(axis=1).sum()),
                      "tokens with a vector": int((~np.isnan(rows).any(axis=1)).sum())}
    if not keep_models:
        shutil.rmtree(where, ignore_errors=True)
    return {"seed": seed, "users": int(keep.sum()), "new-token users": int(new_token.sum()),
            "universe": len(universe), "held out": len(s["held_out"]), "train events": s["train"].num_rows,
            "seconds": seconds, "arms": found}


def time_compose(vocab: int, asked: int, seed: int = 0) -> str:
    """What composing costs a model of `vocab` URLs (20,000 hosts, 30 sections each, random rows and
    counts) asked for `asked` new pages of its sites: the first compose (which reads the vocabulary's
    parts, once per loaded model), the vectors, and a second compose."""
    from doc2vec_dist.compose import UrlComposer

    rng = np.random.default_rng(seed)
    hosts = pa.array([f"site{i}.example{i % 50}.com" for i in range(20_000)]).take(
        pa.array(rng.integers(0, 20_000, vocab)))
    sections = pa.array([f"/s{i}" for i in range(30)]).take(pa.array(rng.integers(0, 30, vocab)))
    urls = pc.binary_join_element_wise("https://", hosts, sections, pa.array([f"/p{i}" for i in range(vocab)]), "")
    table = rng.standard_normal((vocab, 100)).astype(np.float32)
    new = pc.binary_join_element_wise("https://", hosts.slice(0, asked), sections.slice(0, asked),
                                      pa.array([f"/new{i}" for i in range(asked)]), "")
    t = time.perf_counter()
    composer = UrlComposer(urls, rng.integers(1, 1000, vocab))
    plan = composer.compose(new)
    first = time.perf_counter() - t
    t = time.perf_counter()
    plan.vectors(table)
    vectors = time.perf_counter() - t
    t = time.perf_counter()
    composer.compose(new)
    again = time.perf_counter() - t
    return (f"compose {asked:,} new pages against {vocab:,} URLs: first {first:.2f} s (the vocabulary's parts), "
            f"vectors {vectors:.2f} s, again {again:.2f} s; sources {pc.value_counts(plan.source).to_pylist()}")


METRICS = ("recall@10 new-token users", "recall@10 held-out tokens", "recall@10 all users")


def table(results: list[dict], arms: tuple[str, ...]) -> str:
    """Each arm's mean over the seeds ± their spread (max − min: the seeds' splits differ, so this is
    mostly the split's own variance), then each arm's difference from drop, seed by seed (all arms of
    a seed share its split): mean [min, max]."""
    first = results[0]
    lines = [(f"{first['universe']:,} tokens ({first['held out']:,} held out), {first['users']:,} new users with hidden "
             f"events, {first['new-token users']:,} of them with a held-out token hidden (seed {first['seed']})"), ""]
    lines.append(f"{'arm':<12}" + "".join(f"{m:>28}" for m in METRICS) + f"{'unplaced':>10}")
    for arm in arms:
        cells = []
        for metric in METRICS:
            values = [r["arms"][arm][metric] for r in results]
            spread = f" ±{max(values) - min(values):.4f}" if len(values) > 1 else ""
            cells.append(f"{statistics.mean(values):.4f}{spread}".rjust(28))
        unplaced = statistics.mean(r["arms"][arm]["unplaced new-token users"] for r in results)
        lines.append(f"{arm:<12}" + "".join(cells) + f"{unplaced:>10.1f}")
    # derived less drop+rank: the same candidates, the users' vectors inferred composing or not
    pairs = [(arm, "drop") for arm in arms if arm != "drop" and "drop" in arms]
    pairs += [("derived", "drop+rank")] if {"derived", "drop+rank"} <= set(arms) else []
    if pairs:
        lines += ["", "differences, seed by seed: mean [min, max]"]
        for arm, base in pairs:
            cells = []
            for metric in METRICS:
                diff = [r["arms"][arm][metric] - r["arms"][base][metric] for r in results]
                cells.append(f"{statistics.mean(diff):+.4f} [{min(diff):+.4f}, {max(diff):+.4f}]".rjust(28))
            lines.append(f"{arm + ' − ' + base:<22}"[:22] + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import logging

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=("sample", "messy", "pypi"), default="sample")
    ap.add_argument("--users", type=int, default=10_000, help="--data messy: generate's users")
    ap.add_argument("--urls", type=int, default=15_000, help="--data messy: generate's URLs")
    ap.add_argument("--docs", type=int, default=100_000, help="--data pypi: summaries sampled (seed 0)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=TRAIN["epochs"])
    ap.add_argument("--dim", type=int, default=TRAIN["dim"])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=None,
                    help="default: all for URLs; all but trained for text")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "new_urls"),
                    help="where the data and the runs go (runs/ is not tracked)")
    ap.add_argument("--json", help="where the results go (default: WORK/new_urls-DATA.json)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: the sample, 2 epochs, seed 1")
    ap.add_argument("--keep", action="store_true", help="keep each seed's models under WORK/DATA/seedN")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="instead, print the tables of these runs' JSON files together (their seeds pooled)")
    ap.add_argument("--time-compose", type=int, nargs=2, metavar=("VOCAB", "ASKED"),
                    help="instead, time composing ASKED new pages against a model of VOCAB URLs (synthetic)")
    args = ap.parse_args(argv)
    if args.time_compose:
        print(time_compose(*args.time_compose))
        return 0
    if args.report:
        runs = []
        for path in args.report:
            with open(path) as fh:
                runs.append(json.load(fh))
        results = [r for run in runs for r in run["results"]]
        arms = tuple(a for a in ARMS if all(a in r["arms"] for r in results))
        print(f"{', '.join(args.report)}: seeds {' '.join(str(r['seed']) for r in results)}")
        print(table(results, arms))
        return 0
    if args.quick:
        args.epochs, args.seeds = 2, [1]
    text = args.data == "pypi"
    arms = tuple(args.arms or (tuple(a for a in ARMS if a not in ("geo-count", "trained")) if text else ARMS))
    if {"true-count", "geo-count"} & set(arms) and "derived" not in arms:
        arms = ("derived", *arms)
    if text and "geo-count" in arms:
        print("error: --arms geo-count composes URLs: not with --data pypi", file=sys.stderr)
        return 2
    arms = tuple(a for a in ARMS if a in arms)  # derived before those made from it
    to_terminal(logging.WARNING)
    try:
        from doc2vec_dist.cluster import ray_connection

        work = os.path.abspath(args.work)
        os.makedirs(work, exist_ok=True)
        events = {"sample": sample_events, "messy": lambda: messy_events(work, args.users, args.urls),
                  "pypi": lambda: pypi_events(args.docs)}[args.data]()
        train = {**TRAIN, "epochs": args.epochs, "dim": args.dim}
        with ray_connection(None):
            results = [run_seed(events, seed, os.path.join(work, args.data), train, text, arms, args.keep)
                       for seed in args.seeds]
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"\nnew tokens ({args.data}): {events.num_rows:,} events, dim {args.dim}, {args.epochs} epochs, "
          f"{HOLDOUT:.0%} of the tokens held out, {NEW_USERS:.0%} of the users new, seeds "
          f"{' '.join(map(str, args.seeds))}; mean over seeds ± spread (max − min)")
    print(table(results, arms))
    path = args.json or os.path.join(work, f"new_urls-{args.data}.json")
    with open(path, "w") as fh:
        json.dump({"settings": {**vars(args), "train": train}, "results": results}, fh, indent=2)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
