"""How vectors are scored against each other, and how keys become rows: the serving side's arithmetic.

Changes when what "similar" or "likely" means changes. Both `model` (exact queries) and `index` (faiss
builds) use it; it imports neither.

Similarity within one table (users like this user, URLs like this URL) is cosine: inner product of
normalised vectors. Scoring URLs for a user uses the model's own estimate of P(url | user). Negative
sampling's optimum is d·o = log[P(w|d) / (k·Pn(w))] with Pn(w) ∝ count(w)^ns_exponent, so
    log P(w|d) = d·o + ns_exponent · log count(w) + const.
d·o alone divides popularity out and ranks rare URLs first; adding the prior back ranks the URLs a
user is most likely to visit. As one inner product: [d, 1] · [o, ns_exponent · log count].
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import Corpus, iter_shard
from .errors import UserError
from .modeldir import ModelDir

NAMED = 5  # keys a message names before it says how many more


class ServingWarning(UserWarning):
    """What an answer left out, or could not do, said to a library caller through `warnings` (the command
    line prints it as a `warning:` line): a user without a vector skipped, the URLs a user visited
    left in because the model's corpus is gone."""


def check_k(k, what: str) -> int:
    """k, the answers wanted per query, as an int: a whole number >= 1, else a UserError. faiss takes
    k <= 0 for an empty answer or fails on an assertion, and a float for a type error."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"{what}: k must be a whole number >= 1, not {k!r}")
    return int(k)


def counted(n: int, thing: str, plural: str | None = None) -> str:
    """'1 user', '2 users'."""
    return f"{n:,} {thing if n == 1 else (plural or thing + 's')}"


def named(keys: list[str], total: int | None = None) -> str:
    """The first NAMED of `keys`, and how many more of `total` (default: len(keys)) there are."""
    total = len(keys) if total is None else total
    shown = ", ".join(str(k) for k in keys[:NAMED])
    return shown + (f" and {total - min(len(keys), NAMED):,} more" if total > NAMED else "")


def seen_tokens(corpus_path: str, doc_ids: np.ndarray) -> dict[int, np.ndarray]:
    """The training tokens (word ids) of the given documents, read from the corpus shards: the URLs
    each user visited, which a ranking of URLs for the user leaves out (evaluate, neighbors)."""
    wanted = np.unique(doc_ids)
    seen: dict[int, np.ndarray] = {}
    for path in Corpus(corpus_path).shard_paths:
        for ids, offsets, tokens in iter_shard(path):
            hit = np.flatnonzero(np.isin(ids, wanted, assume_unique=True))
            for i in hit:
                seen[int(ids[i])] = tokens[offsets[i]:offsets[i + 1]]
    return seen


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; all-zero rows (never trained) stay zero."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def url_log_prior(model: ModelDir) -> np.ndarray:
    """ns_exponent · log count(w) per word id; -inf for words never seen in training."""
    counts = model.vocab().column("count").to_numpy().astype(np.float64)
    with np.errstate(divide="ignore"):
        return (model.config().ns_exponent * np.log(counts)).astype(np.float32)


def prior_queries(doc_vectors: np.ndarray) -> np.ndarray:
    """[d, 1]: the user side of the model's log P(url | user) as one inner product."""
    return np.ascontiguousarray(np.hstack([doc_vectors, np.ones((len(doc_vectors), 1), np.float32)]))


def prior_targets(words_out: np.ndarray, log_prior: np.ndarray) -> np.ndarray:
    """[o, ns_exponent · log count]: the URL side (never-seen URLs get a huge negative score)."""
    return np.ascontiguousarray(np.hstack([words_out, np.maximum(log_prior, np.float32(-1e30))[:, None]]))


def with_prior(doc_vectors: np.ndarray, words_out: np.ndarray, log_prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Augmented (queries, targets) whose inner product is d·o + log prior: the model's log P(w|d) + const."""
    return prior_queries(doc_vectors), prior_targets(words_out, log_prior)


def lookup(keys: pa.Array, wanted: list[str], what: str, hint: Callable[[str], str | None] | None = None) -> np.ndarray:
    """Row ids of `wanted` keys; an unknown key is an error with what hint(key) says of it (say, that
    it is a key of another table), else with the closest known keys."""
    found = pc.index_in(pa.array(wanted, pa.string()), value_set=keys.cast(pa.string()))
    if found.null_count:
        key = wanted[found.is_null().to_numpy(zero_copy_only=False).argmax()]
        raise UserError(f"unknown {what} key {key!r}{(hint and hint(key)) or _suggest(keys, key)}")
    rows = found.to_numpy()
    return rows.astype(np.int64)


def _suggest(keys: pa.Array, key: str) -> str:
    prefix = key[:3]
    candidates = keys.filter(pc.starts_with(keys.cast(pa.string()), prefix)) if prefix else keys
    pool = candidates.slice(0, 200_000).to_pylist()
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def neighbor_table(keys: list[str], found: np.ndarray, scores: np.ndarray, names: pa.Array, k: int,
                   is_self: np.ndarray | None) -> pa.Table:
    """key, neighbor, score, rank (1-based) from search results, skipping -1 and the query itself."""
    keep = found >= 0
    if is_self is not None:
        keep &= ~is_self
    keep &= np.cumsum(keep, axis=1) <= k
    query, _ = np.nonzero(keep)  # row-major: by query, then by rank
    ranks = np.cumsum(keep, axis=1)[keep]
    return pa.table({"key": pa.array(keys, pa.string()).take(pa.array(query)),
                     "neighbor": names.take(pa.array(found[keep])).cast(pa.string()),
                     "score": pa.array(scores[keep], pa.float32()),
                     "rank": pa.array(ranks, pa.int32())})
