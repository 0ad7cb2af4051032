"""precision.py: 16-bit tables (--dtype), narrowing float32 to them (to nearest, or stochastically) and back."""

import numpy as np
import pytest
import torch
from conftest import load_benchmark

from doc2vec_dist import precision

SPECIAL = np.array([0.0, -0.0, 1.0, -2.5, 3.14159, 1e-30, 1e-41, np.inf, -np.inf, 3.3e38, -3.3e38, 65504.0, 7e4,
                    1e-6, 6e-8], np.float32)


def test_bfloat16_to_nearest_is_torchs_bfloat16_bit_for_bit():
    values = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(10_000).astype(np.float32)])
    ours = precision.narrow(values, "bfloat16")
    assert ours.dtype == np.uint16
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(precision.widen(ours, "bfloat16"),
                                  torch.from_numpy(values).to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nan_and_inf_stay_what_they_are(dtype, rounding):
    rng = precision.rng_of(1, 2) if rounding == "stochastic" else None
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    back = precision.widen(precision.narrow(values, dtype, rng), dtype)
    assert np.isnan(back[:2]).all()
    np.testing.assert_array_equal(back[2:], values[2:])
    assert np.signbit(back[5]) and not np.signbit(back[4])


@pytest.mark.parametrize("dtype, step", [("bfloat16", 2.0 ** -7), ("float16", 2.0 ** -10)])
def test_stochastic_rounding_is_unbiased_where_nearest_loses_the_update(dtype, step):
    """1 + step/8 lies an eighth of the way to the next value: to nearest it is 1 (the update lost);
    stochastically it is the next value an eighth of the time, 1 + step/8 on average."""
    values = np.full(400_000, 1.0 + step / 8, np.float32)
    assert (precision.widen(precision.narrow(values, dtype), dtype) == 1.0).all()
    back = precision.widen(precision.narrow(values, dtype, precision.rng_of(3)), dtype)
    assert set(np.unique(back)) == {1.0, 1.0 + step}
    assert abs(back.mean() - (1.0 + step / 8)) < 0.01 * step  # to nearest is off by step / 8
    negative = precision.widen(precision.narrow(-values, dtype, precision.rng_of(3)), dtype)
    np.testing.assert_array_equal(negative, -back)  # sign-magnitude: the same draws round |x| the same way


@pytest.mark.parametrize("value", [3e-5, -3e-5, 1e-6, -7e-7, 4e-8, -4e-8, 1e-8, 2.0 ** -24 * 0.75])
def test_float16_rounds_its_subnormals_and_the_values_below_them_without_bias(value):
    """Below 2^-14 float16 keeps fewer bits (its subnormals, 2^-24 apart), and below 2^-24 none: a value
    there is 0 or ±2^-24, by its share of 2^-24."""
    values = np.full(400_000, value, np.float32)
    back = precision.widen(precision.narrow(values, "float16", precision.rng_of(4)), "float16").astype(np.float64)
    low, high = np.unique(back)
    assert high - low == pytest.approx(2.0 ** -24) and low <= np.float32(value) <= high
    share = (np.float32(value) - low) / (high - low)  # the chance of the upper neighbour
    assert abs((back == high).mean() - share) < 5 * np.sqrt(share * (1 - share) / len(values)) + 1e-9


def test_the_rounding_costs_are_measured_by_a_benchmark_not_a_test(tmp_path, capsys):
    """Every push of a float16 table narrows its rows on the servers' path: a rounding 8x slower than
    bfloat16's (nextafter and a division per value) cost the delta path its quality on the sample. Quiet,
    float16 costs ~2.1x bfloat16 here (docs/benchmarks.md); a clock's ratio is a busy machine's to break, so
    benchmarks/small_costs.py measures it, and this test holds that the script runs and says it."""
    small_costs = load_benchmark("small_costs")
    result = small_costs.main(["--repeats", "1", "--no-first-push", "--work", str(tmp_path)])
    seconds = result["rounding"]["seconds"]
    assert set(seconds) == {"bfloat16", "float16"} and min(seconds.values()) > 0
    assert result["rounding"]["float16_over_bfloat16"] == seconds["float16"] / seconds["bfloat16"]
    assert "rounding 20,000 x 64: bfloat16 " in capsys.readouterr().out
    assert (tmp_path / "small_costs.json").exists()


def test_stochastic_rounding_is_seeded_and_exact_values_never_move():
    values = np.random.default_rng(1).standard_normal((50, 7)).astype(np.float32)
    for dtype in ("bfloat16", "float16"):
        once = precision.narrow(values, dtype, precision.rng_of(9, 1))
        np.testing.assert_array_equal(once, precision.narrow(values, dtype, precision.rng_of(9, 1)))
        assert not np.array_equal(once, precision.narrow(values, dtype, precision.rng_of(9, 2)))
        exact = precision.widen(once, dtype)  # representable: every draw keeps it
        np.testing.assert_array_equal(precision.narrow(exact, dtype, precision.rng_of(5)), once)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rows_carry_their_float32_state_bit_for_bit_in_half_the_vector_bytes(dtype):
    dim = 5
    rows = np.random.default_rng(2).random((4, dim + 1), dtype=np.float32)
    rows[:, dim] = [1e-30, 3.3e38, 0.123456789, 7.0]  # an accumulator's float32, none of it rounded
    stored = precision.narrow_rows(rows, dtype, dim, precision.rng_of(1))
    assert stored.dtype == precision.stored(dtype) and stored.shape == (4, dim + 2)
    assert stored.nbytes == 4 * precision.row_bytes(dtype, dim, 1) == 4 * (2 * dim + 4)
    back = precision.widen_rows(stored, dtype, dim)
    np.testing.assert_array_equal(back[:, dim], rows[:, dim])
    np.testing.assert_allclose(back[:, :dim], rows[:, :dim], rtol=2 ** -7)
    assert precision.float_width(dtype, dim, stored.shape[1]) == dim + 1


def test_float32_is_passed_through_untouched():
    rows = np.random.default_rng(3).random((3, 4), dtype=np.float32)
    assert precision.narrow_rows(rows, "float32", 3, precision.rng_of(1)) is rows
    assert precision.widen_rows(rows, "float32", 3) is rows


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_bfloat16_rows_added_in_one_pass_are_the_rows_widened_added_and_narrowed(rounding):
    """A server's push into a bfloat16 table (precision.add_rows, one compiled pass) leaves exactly the
    bits of the three-step path it replaced, the Adagrad state added in float32."""
    gen = np.random.default_rng(3)
    dim = 6
    wide = gen.normal(0, 0.5, (50, dim + 1)).astype(np.float32)
    wide[:, dim] = np.abs(wide[:, dim])
    wide[7, 2] = np.inf  # kept as it is by either path
    table = precision.narrow_rows(wide, "bfloat16", dim)
    ids = np.r_[7, gen.choice(np.r_[0:7, 8:50], 19, replace=False)]
    delta = gen.normal(0, 1e-3, (20, dim + 1)).astype(np.float32)
    expected = table.copy()
    rows = precision.widen_rows(expected[ids], "bfloat16", dim)
    rows += delta

    def rng():
        return precision.rng_of(4) if rounding == "stochastic" else None
    expected[ids] = precision.narrow_rows(rows, "bfloat16", dim, rng())
    precision.add_rows(table, ids, delta, "bfloat16", dim, rng())
    np.testing.assert_array_equal(table, expected)
    assert not np.array_equal(table, precision.narrow_rows(wide, "bfloat16", dim))  # the push changed rows


def test_float16_widens_every_bit_pattern_as_numpys_cast_does():
    """float16 is widened by a compiled loop (numpy's cast was 13x bfloat16's widening): every one of
    the 65,536 patterns gives the cast's float32 bits (NaN: a NaN), into a strided destination too."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    cast = halves.astype(np.float32)
    nan = np.isnan(cast)
    for got in (precision.widen(halves, "float16"), precision.widen(halves.reshape(256, 256), "float16").reshape(-1)):
        np.testing.assert_array_equal(got[~nan].view(np.uint32), cast[~nan].view(np.uint32))
        assert np.isnan(got[nan]).all()
    rows = np.full((256, 259), 7.0, np.float32)  # the vectors of rows with a state column after them
    precision.widen(halves.reshape(256, 256), "float16", rows[:, :256])
    np.testing.assert_array_equal(rows[:, :256][~nan.reshape(256, 256)], cast.reshape(256, 256)[~nan.reshape(256, 256)])
    assert (rows[:, 256:] == 7.0).all()
