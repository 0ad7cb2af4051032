"""numba's compiled row kernels: a parameter server's adds and writes of pushed rows, and the 16-bit
tables' conversions (precision.py). Changes when one of them does.

Imported only where one of them runs (precision.py and ps.py import this module inside the functions that
call it): a process that runs none, a server of small float32 tables (ps.NUMPY_TABLE_ELEMENTS), then never
imports numba (~0.14 s of a process's CPU) nor makes its first compiled call (~0.4 s).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def compiled() -> int:
    return 1


@numba.njit(nogil=True, cache=True)
def add_rows(table: np.ndarray, ids: np.ndarray, delta: np.ndarray) -> None:
    """table[ids[i]] += delta[i] for every i, in order (a repeated id gets every delta). Compiled and
    without the GIL, so a threaded server applies pushes to different tables at once; numpy's
    table[ids] += delta is a gather, an add and a scatter (35 ms for 75k rows x 100), and this server
    needs no torch (0.85 s of a process's start-up) for torch's index_add_."""
    for i in range(len(ids)):
        row = ids[i]
        for j in range(delta.shape[1]):
            table[row, j] += delta[i, j]


@numba.njit(nogil=True, cache=True)
def set_rows(table: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """table[ids[i]] = rows[i] for every i (compiled, without the GIL, as add_rows)."""
    for i in range(len(ids)):
        table[ids[i]] = rows[i]


# 2^(e - 25) for float16's biased exponent e = 1..30 (its significand then counted with the implicit
# 1024), 2^-24 for e = 0 (subnormals); 31 is inf or NaN
F16_SCALE = np.array([2.0 ** -24] + [2.0 ** (e - 25) for e in range(1, 31)] + [1.0], dtype=np.float32)


@numba.njit(nogil=True, cache=True)
def widen_f16(halves: np.ndarray, out: np.ndarray) -> None:
    """float16 bits [n, m] (uint16) as float32 values into `out` [n, m], which may be strided (the
    vector columns of a row matrix): the significand times a power of two, exact, without a branch,
    so that it vectorizes (numpy's cast, value by value, cost the float16 feed more than any other
    step of a pull). NaN comes out as a NaN, not its payload."""
    scale = F16_SCALE
    for i in range(halves.shape[0]):
        for j in range(halves.shape[1]):
            h = np.int32(halves[i, j])
            exponent = (h >> 10) & 0x1F
            fraction = h & 0x3FF
            significand = fraction + (1024 if exponent > 0 else 0)
            value = np.float32(significand) * scale[exponent]
            if exponent == 31:
                value = np.float32(np.inf) if fraction == 0 else np.float32(np.nan)
            out[i, j] = -value if h & 0x8000 else value


@numba.njit(nogil=True, inline="always")
def _hash(key: np.uint64, i: int) -> np.uint64:
    """splitmix64's output at position i + 1 after `key`: 64 uniform bits, a pure function of both."""
    z = key + np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(nogil=True, inline="always")
def _bf16_round(b: np.uint64, key: np.uint64, position: int, stochastic: bool) -> np.uint64:
    # the bfloat16 bits of float32 bits `b`: stochastically, a random 16-bit integer added to the low half
    # carries into the kept bits with the right odds; to nearest, ties to even, 0x7fff and the lowest kept
    # bit are added. ±inf has a zero low half, so it stays; the largest finite values may carry into inf,
    # as they should; NaN could carry into the sign bit or to inf, so it is set apart as a quiet NaN
    if b & np.uint64(0x7FFFFFFF) > np.uint64(0x7F800000):
        return ((b >> np.uint64(16)) & np.uint64(0x8000)) | np.uint64(0x7FC0)
    if stochastic:
        return (b + (_hash(key, position) >> np.uint64(48))) >> np.uint64(16)
    return (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)


@numba.njit(nogil=True, cache=True)
def bf16_stochastic(bits: np.ndarray, key: np.uint64) -> np.ndarray:
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        out[i] = _bf16_round(np.uint64(bits[i]), key, i, True)
    return out


@numba.njit(nogil=True, cache=True)
def bf16_add_rows(table: np.ndarray, ids: np.ndarray, delta: np.ndarray, dim: int, key: np.uint64,
                   stochastic: bool) -> None:
    # table[ids, :dim] += delta[:, :dim] in bfloat16 bits, each sum narrowed as precision's bfloat16 narrowing does it
    # (the same bits: value k of the [n, dim] block draws at position k), ids distinct
    wide = np.empty(dim, np.float32)
    bits = wide.view(np.uint32)
    for i in range(ids.size):
        row = ids[i]
        for j in range(dim):
            bits[j] = np.uint32(table[row, j]) << np.uint32(16)
            wide[j] += delta[i, j]
            table[row, j] = _bf16_round(np.uint64(bits[j]), key, i * dim + j, stochastic)


@numba.njit(nogil=True, cache=True)
def f16_stochastic_bits(bits: np.ndarray, key: np.uint64) -> tuple:
    """The float16 bits of float32 `bits` below 65504, stochastically rounded (the cast, exact by then,
    done here: numpy's took 3 ns a value); and a flag on the values left for the caller (their bits 0
    here): from 65504 up, inf, NaN. Without a branch, so that the loop vectorizes (a loop that wrote
    down the positions of the values it left as it met them, subnormals among them, could not)."""
    out = np.empty(bits.size, np.uint16)
    left = np.empty(bits.size, np.bool_)
    for i in range(bits.size):
        b = np.uint64(bits[i])
        size = b & np.uint64(0x7FFFFFFF)
        sign = (b >> np.uint64(16)) & np.uint64(0x8000)
        draw = _hash(key, i)
        # normal in float16: the magnitude plus a random integer below 2^13, its low 13 bits dropped,
        # the rest re-biased
        rounded = (size + (draw >> np.uint64(51))) & np.uint64(0x7FFFE000)
        exponent = rounded >> np.uint64(23)  # 113 (2^-14) ... 142 (2^15): float16's 1 ... 30
        half = sign | (((exponent - np.uint64(112)) << np.uint64(10)) & np.uint64(0x7C00)) | (
            (rounded >> np.uint64(13)) & np.uint64(0x3FF))
        half = (sign | np.uint64(0x7C00)) if exponent > np.uint64(142) else half  # rounded up past 65504
        # subnormal in float16 (below 2^-14): a count of 2^-24, the 24-bit significand shifted right by
        # `dropped` bits (14 at 2^-15, more below) after a random integer below 2^dropped is added (a
        # count of 1024 is the smallest normal's bits, as it should be); float32's own subnormals give 0
        biased = size >> np.uint64(23)
        dropped = min(np.uint64(126) - biased, np.uint64(62)) if biased < np.uint64(113) else np.uint64(14)
        significand = ((size & np.uint64(0x7FFFFF)) | np.uint64(0x800000)) if biased > np.uint64(0) else np.uint64(0)
        small = sign | ((significand + (draw >> (np.uint64(64) - dropped))) >> dropped)
        half = small if size < np.uint64(0x38800000) else half
        half = sign if size == np.uint64(0) else half
        special = size >= np.uint64(0x477FE000)
        out[i] = np.uint16(np.uint64(0) if special else half)
        left[i] = special
    return out, left
