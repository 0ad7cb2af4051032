"""The types a run's tables are held in (--dtype): float32, or 16 bits a value (bfloat16, float16), in the
parameter servers, on the wire and in checkpoints; the math stays float32.

Changes when a table type is added, or how rows are narrowed to one or widened from it.

numpy has float16 but no bfloat16: bfloat16 is kept as its 16 bits (uint16), the top half of the
float32 with the same value, and converted here with bit operations (no dependency: ml_dtypes would
be the one to take). A row of a 16-bit table carries its optimiser state (row-wise Adagrad's
accumulator) as float32 still, its 4 bytes as two 16-bit columns after the vector: one array a row,
`stored_width` columns of `stored` values, which a server holds, a pull returns and a push carries.

Narrowing rounds to nearest, or stochastically (an update smaller than half a unit in the last
place is then applied with a probability proportional to its size, instead of being lost, as
FBGEMM's 16-bit embeddings do), from a seeded numpy Generator so that a run is reproducible. The
Generator gives one key per call; the random bits of each value are a hash of that key and the value's
position (splitmix64), in one numba pass with the rounding: drawing them with the Generator took 3 of
bfloat16's 4.2 ns a value, on the path of every push.
"""

from __future__ import annotations

import numba
import numpy as np

DTYPES = ("float32", "bfloat16", "float16")
STORED = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.uint16), "float16": np.dtype(np.float16)}


def stored(dtype: str) -> np.dtype:
    """The numpy type a table of `dtype` is held in (bfloat16: its bits, as uint16)."""
    return STORED[dtype]


def stored_width(dtype: str, dim: int, state: int) -> int:
    """Columns of `stored(dtype)` a row takes: the vector, then each float32 state value in as many
    columns as its 4 bytes fill."""
    return dim + state * (4 // STORED[dtype].itemsize)


def float_width(dtype: str, dim: int, stored: int) -> int:
    """Columns of float32 a row of `stored` stored columns widens to (stored_width's inverse)."""
    return dim + (stored - dim) // (4 // STORED[dtype].itemsize)


def row_bytes(dtype: str, dim: int, state: int) -> int:
    """Bytes of one row as a server holds it and a pull or push carries it."""
    return dim * STORED[dtype].itemsize + 4 * state


# -- values ---------------------------------------------------------------------------------------------------

def widen(values: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values of an array of `stored(dtype)` (no state columns); `values` itself for float32."""
    if dtype == "float32":
        if out is None:
            return values
        out[...] = values
        return out
    if out is None:
        out = np.empty(values.shape, dtype=np.float32)
    if dtype == "float16":
        if values.ndim == out.ndim == 2:
            _widen_f16(values.view(np.uint16), out)
        elif values.flags.c_contiguous and out.flags.c_contiguous:
            _widen_f16(values.view(np.uint16).reshape(1, -1), out.reshape(1, -1))
        else:
            out[...] = values
        return out
    bits = out.view(np.uint32) if out.flags.c_contiguous else None
    if bits is None:  # a strided destination: widen into a temporary
        out[...] = widen(np.ascontiguousarray(values), dtype)
        return out
    np.left_shift(values, 16, out=bits, dtype=np.uint32)
    return out


# 2^(e - 25) for float16's biased exponent e = 1..30 (its significand then counted with the implicit
# 1024), 2^-24 for e = 0 (subnormals); 31 is inf or NaN
_F16_SCALE = np.array([2.0 ** -24] + [2.0 ** (e - 25) for e in range(1, 31)] + [1.0], dtype=np.float32)


@numba.njit(nogil=True, cache=True)
def _widen_f16(halves: np.ndarray, out: np.ndarray) -> None:
    """float16 bits [n, m] (uint16) as float32 values into `out` [n, m], which may be strided (the
    vector columns of a row matrix): the significand times a power of two, exact, without a branch,
    so that it vectorizes (numpy's cast, value by value, cost the float16 feed more than any other
    step of a pull). NaN comes out as a NaN, not its payload."""
    scale = _F16_SCALE
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


def narrow(values: np.ndarray, dtype: str, rng: np.random.Generator | None = None) -> np.ndarray:
    """float32 `values` as `stored(dtype)`: rounded to nearest (ties to even), or with `rng`
    stochastically (unbiased: a value between two neighbours becomes the upper one with the
    probability of its distance from the lower). NaN stays NaN, ±inf stays ±inf; a value past the
    largest finite one becomes inf, as a float16 cast makes it. `values` itself for float32."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float32":
        return values
    if dtype == "bfloat16":
        return _narrow_bf16(values, rng)
    if rng is None:
        return values.astype(np.float16)
    return _narrow_f16_stochastic(values, rng)


@numba.njit(nogil=True, inline="always")
def _hash(key: np.uint64, i: int) -> np.uint64:
    """splitmix64's output at position i + 1 after `key`: 64 uniform bits, a pure function of both."""
    z = key + np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _key(rng: np.random.Generator) -> np.uint64:
    """One draw of `rng`: the key of a call's hashes, so that the same Generator state gives the same bits."""
    return np.uint64(rng.integers(0, 1 << 63, dtype=np.int64))


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
def _bf16_stochastic(bits: np.ndarray, key: np.uint64) -> np.ndarray:
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        out[i] = _bf16_round(np.uint64(bits[i]), key, i, True)
    return out


@numba.njit(nogil=True, cache=True)
def _bf16_add_rows(table: np.ndarray, ids: np.ndarray, delta: np.ndarray, dim: int, key: np.uint64,
                   stochastic: bool) -> None:
    # table[ids, :dim] += delta[:, :dim] in bfloat16 bits, each sum narrowed as _narrow_bf16 does it
    # (the same bits: value k of the [n, dim] block draws at position k), ids distinct
    wide = np.empty(dim, np.float32)
    bits = wide.view(np.uint32)
    for i in range(ids.size):
        row = ids[i]
        for j in range(dim):
            bits[j] = np.uint32(table[row, j]) << np.uint32(16)
            wide[j] += delta[i, j]
            table[row, j] = _bf16_round(np.uint64(bits[j]), key, i * dim + j, stochastic)


def add_rows(table: np.ndarray, ids: np.ndarray, delta: np.ndarray, dtype: str, dim: int,
             rng: np.random.Generator | None = None) -> None:
    """table[ids] += delta for stored 16-bit rows and float32 `delta` rows [n, dim + state], ids
    distinct: the vectors widened, added and narrowed back as narrow_rows does (the same bits for the
    same `rng`), the state added in float32. bfloat16 in one compiled pass over the rows, without the
    temporaries of gathering, widening, adding, narrowing and scattering in turn."""
    if dtype == "bfloat16":
        _bf16_add_rows(table, ids, np.ascontiguousarray(delta, dtype=np.float32), dim,
                       _key(rng) if rng is not None else np.uint64(0), rng is not None)
        if delta.shape[1] > dim:
            state = state_view(table, dtype, dim)
            state[ids] += delta[:, dim:]
        return
    rows = widen_rows(table[ids], dtype, dim)
    rows += delta
    table[ids] = narrow_rows(rows, dtype, dim, rng)


def _narrow_bf16(values: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    bits = np.ascontiguousarray(values).view(np.uint32)
    if rng is not None:
        return _bf16_stochastic(bits.reshape(-1), _key(rng)).reshape(bits.shape)
    # round to nearest, ties to even: add 0x7fff and the lowest kept bit, then truncate
    wide = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    out = (wide >> 16).astype(np.uint16)  # as _bf16_round says for ±inf, the largest finite values and NaN
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return out


@numba.njit(nogil=True, cache=True)
def _f16_stochastic_bits(bits: np.ndarray, key: np.uint64) -> tuple:
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


def _narrow_f16_stochastic(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # float16 keeps 10 fraction bits of a float32's 23 down to 2^-14, one fewer per halving below (its
    # subnormals), none below 2^-24. The bits it cannot hold are dropped after a random integer below
    # their weight is added to them, which carries into the kept bits with the right odds (as
    # _narrow_bf16 does with 16). Bit arithmetic, because nextafter and a division per value made this
    # 8x slower than bfloat16's, on every push's path.
    shape = np.shape(values)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    half, left = _f16_stochastic_bits(values.view(np.uint32), _key(rng))
    out = half.view(np.float16)
    edge = np.flatnonzero(left)  # NaN, ±inf, the edge of range: as a cast makes them (the largest finite stays)
    if len(edge):
        with np.errstate(over="ignore", invalid="ignore"):
            out[edge] = values[edge].astype(np.float16)
    return out.reshape(shape)


# -- rows: a vector and its float32 state -----------------------------------------------------------------

def state_view(rows: np.ndarray, dtype: str, dim: int) -> np.ndarray:
    """The float32 state columns of rows as stored (a view: writing it writes the rows)."""
    if dtype == "float32":
        return rows[:, dim:]
    return rows[:, dim:].view(np.float32)


def widen_rows(rows: np.ndarray, dtype: str, dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """Stored rows [n, stored_width] as float32 rows [n, dim + state]: the vectors widened, the state's
    bytes as they are. `rows` itself for float32 unless `out` is given."""
    if dtype == "float32":
        return widen(rows, dtype, out)
    state = (rows.shape[1] - dim) // 2
    if out is None:
        out = np.empty((len(rows), dim + state), dtype=np.float32)
    widen(rows[:, :dim], dtype, out[:, :dim])
    if state:
        out[:, dim:] = state_view(rows, dtype, dim)
    return out


def narrow_rows(rows: np.ndarray, dtype: str, dim: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """float32 rows [n, dim + state] as stored rows [n, stored_width] (the vectors narrowed as
    `narrow` does, the state kept float32). `rows` itself for float32."""
    if dtype == "float32":
        return rows
    state = rows.shape[1] - dim
    out = np.empty((len(rows), stored_width(dtype, dim, state)), dtype=STORED[dtype])
    out[:, :dim] = narrow(rows[:, :dim], dtype, rng)
    if state:
        state_view(out, dtype, dim)[:] = rows[:, dim:]
    return out


def rng_of(*key: int) -> np.random.Generator:
    """The Generator that stochastic rounding draws from for one push (or pull, save...), keyed so
    that the same run makes the same draws: e.g. (seed, shard, table, push)."""
    return np.random.default_rng([int(k) for k in key])
