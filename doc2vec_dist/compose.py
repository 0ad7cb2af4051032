"""Vectors for URLs the model never saw, composed from the parts of them it knows.

Changes when what a URL's parts are, or how its vector is composed from them, changes.

    from doc2vec_dist import Model
    Model.load(m).url_vectors(["https://shop.example/shoes/red-42"])   # key, vector, source, part
    doc2vec-dist neighbors --model M --url https://shop.example/shoes/red-42
    doc2vec-dist export --model M --table words_out --urls todays_urls.parquet --out urls.parquet
    doc2vec-dist infer --model M new_events/ --out users.parquet      # --no-compose: drop them, as before

A URL first seen today has no row, yet its host and path already say much: shop.example/shoes/red-42
is near shop.example/shoes/blue-41. Its parts, read from the URL as the model's rule normalised it
(urls.py), from the most specific to the least:

    path     each prefix of its path, the longest first: shop.example/shoes/red-42 (the same page under
             another query), shop.example/shoes; the root "/" only for the home page itself
    host     shop.example (with its port, where the rule kept one; the scheme and userinfo left out)
    domain   the registered domain: the host's last two labels, or three under a two-letter country
             code whose second level is a generic one (co.uk, com.au, ac.jp …; SECOND_LEVELS). An
             approximation of the Public Suffix List, which this package does not carry: a private
             suffix (blogspot.com, github.io) makes its sites one domain. An IP address or a host of
             one label is its own domain

Only absolute http(s) URLs have parts; any other token (an item id, a word of text) has none.

A part's row is derived after training from the rows of the model's URLs that share it, weighted by
their training counts: shop.example's row is the count-weighted mean of the rows of every URL the
model knows on shop.example. A URL's vector is its own row where the model has one ("own"); else the
row of its most specific part that some known URL shares ("path", "host", "domain"); else it has none
(a site the model never saw). Every answer says which (`source`) and from which part (`part`).

Why derived, not trained: benchmarks/new_urls.py measured both (docs/benchmarks.md, "Vectors for URLs
never seen"). The trained alternative there gives each part a row of its own, trained jointly: every
event also names its URL's parts as words of the user. It ranked new URLs somewhat better on the
synthetic sample and not on the messy log, and neither way lifted the new users' recall@10 above
infer dropping unknown URLs; it needs no change to the engine, but trains on about three times the
tokens, and it moved the known URLs' own rows. fastText's way, a URL's row the sum of
its parts' rows trained through the sum, would need the kernels to gather and scatter 1 + P rows for
every target and negative; we did not build it.

The rows live in the space of the table asked: words_out (what infer trains a new user against and
what users are scored against), or words where the model trained input vectors (PV-DM, dbow_words).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .scoring import named

SOURCES = ("own", "path", "host", "domain")  # where a URL's vector came from, most specific first
# second levels under a two-letter country code that are a public suffix together with it (co.uk,
# com.au, ac.jp): the common shape of the Public Suffix List's country entries
SECOND_LEVELS = ("ac", "co", "com", "edu", "gob", "gov", "go", "mil", "ne", "net", "nic", "or", "org")
MAX_DEPTH = 16  # path prefixes looked at, at most (deeper segments share the prefix of this depth)

# scheme://[userinfo@]host[:port] path, of an absolute http(s) URL (RE2, Arrow's engine)
_URL = r"^(?i:https?)://(?:[^/?#@]*@)?(?P<host>[^/?#]+)(?P<path>[^?#]*)"
_HOSTNAME = r"^(?P<name>\[[^\]]*\]|[^:]*)"  # the host less its port
_DOMAIN = r"(?P<domain>[^.]+\.(?:(?:" + "|".join(SECOND_LEVELS) + r")\.[a-z]{2}|[^.]+))$"
_ADDRESS = r"^(\[.*\]|[0-9.]+)$"  # an IPv6 literal or an IPv4 address: its own domain


def url_parts(urls: pa.Array) -> dict[str, pa.Array]:
    """The parts of each of `urls` (normalised strings), null where a URL has none: "host", "domain",
    "segments" (int32: the path's segments, "/a/b" 2, "/" 1) and "path1" … "pathD" (the prefix of its
    first d segments, host included: "shop.example/shoes"; D the most segments of any URL, at most
    MAX_DEPTH). Arrow's regular expressions, no Python per URL."""
    urls = urls.cast(pa.string())
    found = pc.extract_regex(urls, _URL)
    host, path = _field(found, "host"), _field(found, "path")
    path = pc.if_else(pc.equal(path, ""), "/", path)
    name = _field(pc.extract_regex(host, _HOSTNAME), "name")
    address = pc.match_substring_regex(name, _ADDRESS)
    domain = pc.coalesce(pc.if_else(address, name, _field(pc.extract_regex(name, _DOMAIN), "domain")), name)
    segments = pc.count_substring(path, "/").cast(pa.int32())
    parts = {"host": host, "domain": domain, "segments": segments}
    depth = min(int(pc.max(segments).as_py() or 0), MAX_DEPTH)
    for d in range(1, depth + 1):
        prefix = _field(pc.extract_regex(path, rf"^(?P<p>(?:/[^/]*){{{d}}})"), "p")
        parts[f"path{d}"] = pc.binary_join_element_wise(host, prefix, "")
    return parts


def _field(found: pa.Array, name: str) -> pa.Array:
    """A group of extract_regex's answer, null where the pattern did not match (StructArray.field
    would give "" there)."""
    return pc.struct_field(found, name)


@dataclass
class Composed:
    """How each asked URL's vector is made: its own row (`own` ≥ 0: the model's id), or the weighted
    mean of a group of known rows (`group` ≥ 0), or nothing. `vectors(matrix)` makes them in any table's
    space, so PV-DM's words and words_out are composed alike."""

    keys: pa.Array            # the URLs, as asked (normalised)
    source: pa.Array          # string: own, path, host, domain; null where there is no vector
    part: pa.Array            # string: the part whose row it is (null for own and none)
    own: np.ndarray           # int64 [n]: the model's id, -1 where composed or none
    group: np.ndarray         # int64 [n]: the group whose mean it is, -1 where own or none
    members: np.ndarray       # int64: model ids of every group's rows, group after group
    weights: np.ndarray       # float64: their weights (training counts)
    starts: np.ndarray        # int64 [groups + 1]: group g's members are members[starts[g]:starts[g+1]]
    counts: np.ndarray        # float64 [n]: own: its count; composed: the mean count of the URLs averaged

    @property
    def has_vector(self) -> np.ndarray:
        return (self.own >= 0) | (self.group >= 0)

    def vectors(self, matrix: np.ndarray) -> np.ndarray:
        """[n, dim] float32 rows in `matrix`'s space (a table, row = model id); NaN rows for none."""
        out = np.full((len(self.own), matrix.shape[1]), np.nan, np.float32)
        mine = self.own >= 0
        out[mine] = matrix[self.own[mine]]
        composed = self.group >= 0
        if composed.any():
            weighted = matrix[self.members].astype(np.float64) * self.weights[:, None]
            sums = np.add.reduceat(weighted, self.starts[:-1], axis=0)
            totals = np.add.reduceat(self.weights, self.starts[:-1])
            out[composed] = (sums / totals[:, None])[self.group[composed]]
        return out


class UrlComposer:
    """The parts of a model's vocabulary (computed once, level by level, when first needed) and the
    composition of vectors for URLs by them."""

    def __init__(self, tokens: pa.Array, weights: np.ndarray):
        """tokens: the vocabulary (row id → URL, as the model's rule wrote it); weights: each row's weight
        in a part's mean (its training count)."""
        self.tokens = tokens.cast(pa.string())
        self.weights = np.asarray(weights, dtype=np.float64)
        self._parts: dict[str, pa.Array] | None = None

    def _vocab_level(self, level: str) -> pa.Array | None:
        if self._parts is None:
            self._parts = url_parts(self.tokens)
        return self._parts.get(level)

    def compose(self, urls: pa.Array) -> Composed:
        """How to make each URL's vector (normalised by the model's rule already): own row, else its
        most specific known part, else none."""
        urls = urls.cast(pa.string())
        n = len(urls)
        own = pc.index_in(urls, value_set=self.tokens).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        source, part = np.full(n, None, dtype=object), np.full(n, None, dtype=object)
        source[own >= 0] = "own"
        group = np.full(n, -1, np.int64)
        groups = _Groups(self.weights)
        left = np.flatnonzero(own < 0)  # the URLs still without a vector
        asked = url_parts(urls.take(pa.array(left))) if len(left) and len(self.tokens) else {}
        depth = max((int(k[4:]) for k in asked if k.startswith("path")), default=0)
        levels = [(f"path{d}", "path") for d in range(depth, 0, -1)] + [("host", "host"), ("domain", "domain")]
        for level, name in levels if asked else ():
            theirs = self._vocab_level(level)  # None: no known URL is this deep
            # a URL's prefix of d segments is null where its path has fewer
            wanted = (group[left] < 0) & asked[level].is_valid().to_numpy(zero_copy_only=False)
            if theirs is None or not wanted.any():
                continue
            keys = asked[level].filter(pa.array(wanted))
            found = groups.add(theirs, keys)
            hit = found >= 0
            rows = left[np.flatnonzero(wanted)[hit]]
            group[rows], source[rows] = found[hit], name
            part[rows] = np.asarray(keys.to_pylist(), dtype=object)[hit]
        counts = np.zeros(n, np.float64)
        counts[own >= 0] = self.weights[own[own >= 0]]
        counts[group >= 0] = groups.mean_weights()[group[group >= 0]]
        return Composed(keys=urls, source=pa.array(source.tolist(), pa.string()), part=pa.array(part.tolist(), pa.string()),
                        own=own, group=group, members=groups.members(), weights=groups.weights(),
                        starts=np.asarray(groups.starts, np.int64), counts=counts)


class _Groups:
    """The groups of known rows a compose answer averages, made level by level: a group per asked part
    that some known URL shares, its members (model ids) listed group after group."""

    def __init__(self, weights: np.ndarray):
        self.all_weights = weights
        self.parts: list[np.ndarray] = []
        self.starts = [0]

    def add(self, theirs: pa.Array, keys: pa.Array) -> np.ndarray:
        """Groups for the parts `keys` (one level's, of the asked URLs) from `theirs` (the same level's
        part of each known URL): the group of each key, -1 where no known URL shares it."""
        distinct = pc.unique(keys)
        at = pc.index_in(theirs, value_set=distinct)  # each known URL's part among the asked ones
        known = np.flatnonzero(at.is_valid().to_numpy(zero_copy_only=False))
        of = at.take(pa.array(known)).to_numpy(zero_copy_only=False).astype(np.int64)
        order = np.argsort(of, kind="stable")
        present, first = np.unique(of[order], return_index=True)
        group_of = np.full(len(distinct), -1, np.int64)
        group_of[present] = len(self.starts) - 1 + np.arange(len(present))
        self.parts.append(known[order])
        self.starts.extend((self.starts[-1] + np.r_[first[1:], len(of)]).tolist() if len(of) else [])
        return group_of[pc.index_in(keys, value_set=distinct).to_numpy(zero_copy_only=False)]

    def members(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)

    def weights(self) -> np.ndarray:
        return self.all_weights[self.members()]

    def mean_weights(self) -> np.ndarray:
        """Each group's mean weight: the mean count of the known URLs it averages."""
        if len(self.starts) == 1:
            return np.zeros(0)
        return np.add.reduceat(self.weights(), self.starts[:-1]) / np.diff(self.starts)


def no_vector_line(urls: list[str], total: int) -> str:
    """What to say of `total` URLs without a vector (`urls`: the first of them)."""
    return (f"{total:,} URL{'' if total == 1 else 's'} with no vector: the model knows neither "
            f"{'it' if total == 1 else 'them'} nor {'its' if total == 1 else 'their'} host or domain "
            f"(a site it never saw): {named(urls, total)}")


__all__ = ["MAX_DEPTH", "SECOND_LEVELS", "SOURCES", "Composed", "UrlComposer", "no_vector_line", "url_parts"]


def untrained(counts: np.ndarray, rows_of: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Which URLs of a vocabulary no event trained: count 0 (all their events held out, or cut by
    max_tokens_per_doc) and a words_out row that never moved from zero (rows_of: the rows of those ids; a row an
    --init-from model trained keeps its place though its events here are gone). Such a URL is one the model never
    saw: neither its own row (no direction) nor a member of a part's mean."""
    mask = np.zeros(len(counts), bool)
    zero = np.flatnonzero(np.asarray(counts) == 0)
    if len(zero):
        mask[zero] = ~np.asarray(rows_of(zero)).any(axis=1)
    return mask


def trained_only(tokens: pa.Array, mask: np.ndarray) -> pa.Array:
    """The vocabulary's tokens, null where `mask` (untrained) says: what a UrlComposer may compose from."""
    return pc.if_else(pa.array(~mask), tokens, pa.scalar(None, tokens.type)) if mask.any() else tokens
