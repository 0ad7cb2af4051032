"""Ids: how a key or token becomes a string, a 64-bit hash, and a word id.

Changes when the hashing (bucketing, the held-out draw, the key streams of `infer`) or the
token → word id lookup changes. Vectorised 64-bit hashes of strings: Python's hash() is salted per
process and a loop per key is slow; these are neither.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that spreads every input bit over the output."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def hash_strings(arr: pa.Array, salt: int = 0) -> np.ndarray:
    """uint64 hash of each string of a (large_)string array (nulls hash like empty strings).

    h(s) = mix(Σ_j s[j]·w_j  ^  mix(len(s))), with w_j a pseudo-random weight per byte position:
    one pass of numpy over the raw bytes, no Python per string.
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset:arr.offset + n + 1]
    lengths = np.diff(offsets)
    first, last = int(offsets[0]), int(offsets[-1])
    h = np.zeros(n, np.uint64)
    if last > first:
        data = np.frombuffer(data_buf, dtype=np.uint8)[first:last].astype(np.uint64)
        starts = offsets[:-1] - first
        position = np.arange(last - first, dtype=np.int64) - np.repeat(starts, lengths)
        weight = mix64(position.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15 ^ (salt & 0xFFFFFFFF)))
        nonempty = lengths > 0
        h[nonempty] = np.add.reduceat(data * weight, starts[nonempty])
    if arr.null_count:
        null = arr.is_null().to_numpy(zero_copy_only=False)
        h[null] = 0
        lengths = np.where(null, 0, lengths)
    return mix64(h ^ mix64(lengths.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFF)))


class TokenIds:
    """token string → word id, vectorised: binary search on the vocabulary's sorted hashes, then an
    exact string comparison, so a hash collision with an out-of-vocabulary token cannot map it wrongly.

    (pc.index_in would rebuild a hash table of the whole vocabulary on every batch.)
    """

    def __init__(self, tokens: pa.Array):
        self.tokens = tokens
        for salt in range(16):
            h = hash_strings(tokens, salt)
            order = np.argsort(h, kind="stable")
            sorted_h = h[order]
            if not np.any(sorted_h[1:] == sorted_h[:-1]):
                break
        else:  # 16 salts with a collision among the vocabulary's own tokens: astronomically unlikely
            raise RuntimeError("cannot find a collision-free hash for the vocabulary")
        self.salt, self.order, self.sorted_h = salt, order, sorted_h

    def lookup(self, values: pa.Array) -> np.ndarray:
        """int32 ids of `values` (strings), -1 for nulls and tokens not in the vocabulary."""
        if len(values) == 0 or len(self.tokens) == 0:
            return np.full(len(values), -1, np.int32)
        # Look each distinct token up once: a batch repeats its popular URLs many times.
        encoded = pc.dictionary_encode(values)
        uniq = encoded.dictionary
        h = hash_strings(uniq, self.salt)
        pos = np.minimum(np.searchsorted(self.sorted_h, h), len(self.sorted_h) - 1)
        cand = self.order[pos]
        same = self.sorted_h[pos] == h
        same &= pc.equal(uniq, self.tokens.take(pa.array(cand))).to_numpy(zero_copy_only=False)
        uniq_ids = np.where(same, cand, -1).astype(np.int32)
        idx = encoded.indices
        if idx.null_count:
            idx = idx.fill_null(len(uniq_ids))
            uniq_ids = np.append(uniq_ids, np.int32(-1))
        return uniq_ids[idx.to_numpy()]


def id_string(value):
    """One id (a key or a token) as the string prepare makes of it, as read_formats._as_strings casts a column:
    100000 → "100000", 7.0 → "7", true → "true"; None for None. A value that is no string, number or
    boolean (a list, a dict) is returned as it is, for the caller to refuse. Model looks keys up by it."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # Arrow's formatting, as read_formats._as_strings
        return pa.scalar(value, pa.float64()).cast(pa.string()).as_py()
    return value


def repeated_rows(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(rows whose key an earlier row has, in order; for each row, the first row with its key): the rows a
    file gives twice, found by Arrow's hash lookup of the keys in themselves."""
    first = pc.index_in(keys, value_set=keys).to_numpy(zero_copy_only=False)
    return np.flatnonzero(first != np.arange(len(keys), dtype=first.dtype)), first
