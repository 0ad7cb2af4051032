"""Times: every time column as float64 epoch seconds, UTC, as it is read (_time_seconds), and the one kind
of time the inputs may hold (TimeKinds).

Changes when a kind of time is read differently: the units of epoch numbers and how their size says them,
ISO 8601 strings, timestamps and dates, or which mixes of kinds are refused. readers.py's docstring says
what a user sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .corpus import CorpusError
from .read_files import Options
from .read_formats import _utf8_strings

# One unit whatever the input held, so that files in different units order one user's events together
# and --window-days and a base's latest time mean what they say. float64 seconds keep NaN for a missing
# time (it sorts last and equals nothing, so it is never a duplicate) and -inf for a base's own tokens,
# and resolve about a quarter of a microsecond at present-day times: finer than any log's clock but a
# nanosecond one's.

TIME_UNITS = ("s", "ms", "us", "ns")
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
UNIT_NAMES = {"s": "epoch seconds", "ms": "epoch milliseconds", "us": "epoch microseconds",
              "ns": "epoch nanoseconds"}
ORDER = "order"  # the unit of numbers that are no epoch time in any unit: they only order a user's events
# An epoch time is taken to lie between 1973-03-03 (1e8 s) and the year 5138 (1e11 s). Its size then
# says its unit without overlap: seconds 1e8..1e11, milliseconds 1e11..1e14, microseconds 1e14..1e17,
# nanoseconds 1e17..1e20. Present-day times (about 1.7e9 s) are far from every bound.
EPOCH_SECONDS = (1e8, 1e11)
_SIZE_BOUNDS = np.array([EPOCH_SECONDS[0] * PER_SECOND[u] for u in TIME_UNITS] + [EPOCH_SECONDS[1] * 10**9])
_ZONED = r"\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d(?::?\d\d)?)$"  # an ISO 8601 time with a UTC offset


def _sizes(values: np.ndarray) -> np.ndarray:
    """For each value, the index in TIME_UNITS of the unit its size says it is an epoch time in: -1 when
    too small for any (before 1973 in seconds: a sequence number, a negative), len(TIME_UNITS) when too
    large for any (NaN too)."""
    return np.searchsorted(_SIZE_BOUNDS, values, side="right") - 1


def unit_by_size(value: float) -> str | None:
    """The unit in which `value` is an epoch time (see EPOCH_SECONDS), None when it is one in none."""
    size = int(_sizes(np.array([value], np.float64))[0])
    return TIME_UNITS[size] if 0 <= size < len(TIME_UNITS) else None


@dataclass(frozen=True)
class TimeReading:
    """How a file's time column was read: `what` says so in the report; `unit` is that of its numbers
    (s, ms, us, ns, or ORDER for numbers that are no epoch time), None for timestamps, dates and ISO
    strings, which carry their own."""

    what: str
    unit: str | None = None

    @property
    def epoch(self) -> bool:
        return self.unit != ORDER


def _number(value) -> str:
    """A time value as a message shows it: 1700000000000, not 1.7e+12."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def _epoch_numbers(values: np.ndarray, shown: pa.Array, path: str, column: str, row_base: int, opt: Options,
                   file_unit: str | None) -> tuple[np.ndarray, TimeReading | None]:
    """Numbers as epoch seconds: in --time-unit, else in the unit their size says (that of the median of
    the file's first block with a time, then the same for the whole file). A value of another size is
    refused naming its row; numbers too small for any unit only order each user's events, and are
    refused where a time is needed (opt.epochs_for)."""
    finite = np.isfinite(values)
    where = f"{path}: column '{column}' row"

    def value_at(i: int) -> str:
        return _number(shown[int(i)].as_py())

    infinite = np.flatnonzero(np.isinf(values))  # (NaN is a missing time; an infinity was taken for a time)
    if infinite.size:
        i = infinite[0]
        raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}, which is no time ({infinite.size:,} such "
                          "value(s) in this block); leave a missing time empty (null)")

    if opt.time_unit is not None:
        seconds = values / PER_SECOND[opt.time_unit]
        beyond = np.flatnonzero(finite & (np.abs(seconds) >= EPOCH_SECONDS[1]))
        if beyond.size:
            i = beyond[0]
            size = unit_by_size(abs(values[i]))
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}, which in {UNIT_NAMES[opt.time_unit]} "
                              f"(--time-unit {opt.time_unit}) lies after the year 5000"
                              + (f"; its size says {UNIT_NAMES[size]} (--time-unit {size})" if size else ""))
        return seconds, TimeReading(f"{UNIT_NAMES[opt.time_unit]} (--time-unit {opt.time_unit})", opt.time_unit)
    if not finite.any():
        return values, None  # no time in this block: nothing says a unit yet
    sizes = _sizes(values)
    unit = file_unit
    if unit is None:
        size = int(_sizes(np.array([np.median(values[finite])]))[0])
        unit = ORDER if size < 0 else TIME_UNITS[size] if size < len(TIME_UNITS) else None
        if unit is None:
            i = int(np.flatnonzero(finite)[np.argmax(values[finite])])
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}: numbers of this size are no epoch time "
                              "in any unit (seconds are about 1.7e9 today, milliseconds 1.7e12, up to nanoseconds "
                              "1.7e18); give --time-unit s|ms|us|ns if they are")
    if unit == ORDER:
        if opt.epochs_for:
            i = int(np.flatnonzero(finite)[0])
            raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}: these numbers are no epoch time (seconds "
                              "are about 1.7e9 today, milliseconds 1.7e12), and " + opt.epochs_for + " needs times; "
                              "give --time-unit s|ms|us|ns if they are epoch times")
        odd = np.flatnonzero(finite & (sizes >= 0))
    else:
        odd = np.flatnonzero(finite & (sizes != TIME_UNITS.index(unit)))
    if odd.size:
        i = odd[0]
        size = int(sizes[i])
        this = ("no epoch time in any unit" if size < 0 else "too large for an epoch time in any unit"
                if size >= len(TIME_UNITS) else f"{UNIT_NAMES[TIME_UNITS[size]]} by its size")
        rest = ("numbers that are no epoch time (they only order each user's events)" if unit == ORDER
                else f"{UNIT_NAMES[unit]} by their size")
        raise CorpusError(f"{where} {row_base + i} holds {value_at(i)}, {this}, but the file's times are {rest}: "
                          "a file's times must be in one unit (give --time-unit s|ms|us|ns to say which)")
    if unit == ORDER:
        return values, TimeReading("numbers that only order each user's events (no epoch time in any unit: "
                                   "below 1e8)", ORDER)
    return values / PER_SECOND[unit], TimeReading(f"{UNIT_NAMES[unit]} (detected)", unit)


def _iso_seconds(strings: pa.Array) -> np.ndarray:
    """ISO 8601 strings as epoch seconds: those with a UTC offset (Z, +02:00) at that offset, the others
    as UTC; nanosecond fractions kept. Raises pa.ArrowInvalid when a value is no ISO 8601 time."""
    out = np.full(len(strings), np.nan)
    zoned = pc.match_substring_regex(strings, _ZONED)
    for mask, tz in ((zoned, "UTC"), (pc.invert(zoned), None)):
        part = strings.filter(mask)  # a null is in neither part: it stays NaN
        if not len(part):
            continue
        for unit in ("us", "ns"):
            try:
                raw = part.cast(pa.timestamp(unit, tz=tz)).cast(pa.int64()).to_numpy(zero_copy_only=False)
                break
            except pa.ArrowInvalid:
                if unit == "ns":
                    raise
        out[mask.fill_null(False).to_numpy(zero_copy_only=False)] = raw / PER_SECOND[unit]
    return out


def _time_seconds(arr: pa.Array, path: str, column: str, row_base: int, opt: Options,
                  file_unit: str | None = None) -> tuple[np.ndarray, TimeReading | None]:
    """A time column as float64 epoch seconds, UTC (NaN for a missing time), and how it was read.

    Timestamps of any unit and time zone (one without a zone is taken as UTC) and dates carry their
    unit; numbers, and strings that are numbers, are epoch times in --time-unit or the unit their size
    says (_epoch_numbers); other strings are ISO 8601 (_iso_seconds). file_unit: the unit the file's
    numbers were found in so far.
    """
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):  # CSV hands us bytes
        arr = _utf8_strings(arr, path, column, row_base)
        typ = arr.type
    if pa.types.is_timestamp(typ):
        raw = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
        zone = f"{typ.tz}" if typ.tz else "no time zone: taken as UTC"
        return raw.astype(np.float64) / PER_SECOND[typ.unit], TimeReading(f"timestamps ({typ.unit}, {zone})")
    if pa.types.is_date32(typ):
        return (arr.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.float64) * 86400.0,
                TimeReading("dates (UTC midnight)"))
    if pa.types.is_date64(typ):
        return (arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 1000.0,
                TimeReading("dates (UTC midnight)"))
    if pa.types.is_null(typ):
        return np.full(len(arr), np.nan), None
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        # unsafe: an int64 of nanoseconds is past float64's exact integers, and rounds (by well under a µs)
        values = arr.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        return _epoch_numbers(values, arr, path, column, row_base, opt, file_unit)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        arr = pc.utf8_trim_whitespace(arr)
        try:
            values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            pass
        else:
            return _epoch_numbers(values, arr, path, column, row_base, opt, file_unit)
        try:
            return _iso_seconds(arr), TimeReading("ISO 8601 strings (UTC where they give no offset)")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        # Only the error path looks at values one by one, to name the first that is no time at all.
        for i, value in enumerate(arr.to_pylist()):
            if value is not None and not (_parses(value, float) or _parses(value, _iso_seconds)):
                raise CorpusError(f"{path}: column '{column}' is not a time: cannot read {value!r} (row "
                                  f"{row_base + i}) as a number or an ISO 8601 timestamp")
        raise CorpusError(f"{path}: column '{column}' mixes numbers and ISO 8601 timestamps; use one "
                          "kind of time in a file")
    raise CorpusError(f"{path}: column '{column}' holds {typ}, expected timestamps, numbers or "
                      "ISO 8601 strings")


def _parses(value: str, parse) -> bool:
    try:
        parse(pa.array([value], pa.string()) if parse is _iso_seconds else value)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return False


class TimeKinds:
    """One kind of time across the inputs: epoch times (of whatever unit or type, all made seconds),
    or numbers that only order each user's events; never both, as they cannot order one user's events
    together. prepare checks each block's readings (BlockState.readings) here in input order."""

    def __init__(self):
        self.first: dict[bool, tuple[str, TimeReading]] = {}  # epoch? → the first file read so, and how

    def check(self, path: str, column: str, reading: TimeReading) -> None:
        other = self.first.get(not reading.epoch)
        if other is not None:
            raise CorpusError(f"{path}: column '{column}' read as {reading.what}, but {other[0]}'s as "
                              f"{other[1].what}: one user's events cannot be ordered by both; give --time-unit "
                              "s|ms|us|ns if all are epoch times")
        self.first.setdefault(reading.epoch, (path, reading))
