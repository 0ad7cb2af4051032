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
bfloat16's 4.2 ns a value, on the path of every push. Those passes are row_kernels', imported where one runs.
"""

from __future__ import annotations

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
        from . import row_kernels

        if values.ndim == out.ndim == 2:
            row_kernels.widen_f16(values.view(np.uint16), out)
        elif values.flags.c_contiguous and out.flags.c_contiguous:
            row_kernels.widen_f16(values.view(np.uint16).reshape(1, -1), out.reshape(1, -1))
        else:
            out[...] = values
        return out
    bits = out.view(np.uint32) if out.flags.c_contiguous else None
    if bits is None:  # a strided destination: widen into a temporary
        out[...] = widen(np.ascontiguousarray(values), dtype)
        return out
    np.left_shift(values, 16, out=bits, dtype=np.uint32)
    return out


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


def _key(rng: np.random.Generator) -> np.uint64:
    """One draw of `rng`: the key of a call's hashes, so that the same Generator state gives the same bits."""
    return np.uint64(rng.integers(0, 1 << 63, dtype=np.int64))


def add_rows(table: np.ndarray, ids: np.ndarray, delta: np.ndarray, dtype: str, dim: int,
             rng: np.random.Generator | None = None) -> None:
    """table[ids] += delta for stored 16-bit rows and float32 `delta` rows [n, dim + state], ids
    distinct: the vectors widened, added and narrowed back as narrow_rows does (the same bits for the
    same `rng`), the state added in float32. bfloat16 in one compiled pass over the rows, without the
    temporaries of gathering, widening, adding, narrowing and scattering in turn."""
    if dtype == "bfloat16":
        from . import row_kernels

        row_kernels.bf16_add_rows(table, ids, np.ascontiguousarray(delta, dtype=np.float32), dim,
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
        from . import row_kernels

        return row_kernels.bf16_stochastic(bits.reshape(-1), _key(rng)).reshape(bits.shape)
    # round to nearest, ties to even: add 0x7fff and the lowest kept bit, then truncate
    wide = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    out = (wide >> 16).astype(np.uint16)  # as _bf16_round says for ±inf, the largest finite values and NaN
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return out


def _narrow_f16_stochastic(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    # float16 keeps 10 fraction bits of a float32's 23 down to 2^-14, one fewer per halving below (its
    # subnormals), none below 2^-24. The bits it cannot hold are dropped after a random integer below
    # their weight is added to them, which carries into the kept bits with the right odds (as
    # _narrow_bf16 does with 16). Bit arithmetic, because nextafter and a division per value made this
    # 8x slower than bfloat16's, on every push's path.
    shape = np.shape(values)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    from . import row_kernels

    half, left = row_kernels.f16_stochastic_bits(values.view(np.uint32), _key(rng))
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
