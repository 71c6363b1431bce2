"""Input checks shared by every package: one place that turns bad input into a clear ValueError.

Each check names the offending argument and value (and the sample index for arrays), so a user
sees ``lengths[17] = -3 is negative`` rather than an obscure failure deep inside an algorithm.
"""

from __future__ import annotations

import numbers
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_COST_TOTAL",
    "MAX_RANKS",
    "MAX_TIMEOUT_SECONDS",
    "MAX_TOKENS_LIMIT",
    "NPY_ERRORS",
    "SPEED_RANGE",
    "EmptySlotError",
    "as_group_ids",
    "as_lengths",
    "as_sample_values",
    "as_speeds",
    "as_weights",
    "check_bool",
    "check_bounded_count",
    "check_choice",
    "check_flops_rate",
    "check_int",
    "check_non_negative_float",
    "check_positive_float",
    "check_ranks",
    "check_timeout",
    "host_array",
    "map_npy",
    "naming",
    "not_a_file",
    "npy_error",
    "prefixed",
    "refuse_masked",
    "token_total",
]


NPY_ERRORS = (OSError, ValueError, EOFError, TypeError, OverflowError, tokenize.TokenError)
"""What ``np.load`` raises for a file that is no readable ``.npy`` array: an empty file
(EOFError), a header cut or garbled (tokenize's TokenError), a shape holding a bool or a
negative size (TypeError; OverflowError from a memory map)."""

_NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of every ``.npy`` file."""


_LARGE_HEADER = re.compile(r"Header info length \((\d+)\) is large")
"""numpy's refusal of a ``.npy`` header over ``max_header_size``, with its length."""


def map_npy(path: Any) -> Any:
    """``np.load(path, mmap_mode="r", allow_pickle=False)``: a ``.npy`` file mapped (an ``.npz``
    archive opened), never unpickled. Mapped, not read: a header claiming more than the file
    holds (cut short, or garbled to terabytes) is refused before memory the size of the claim is
    taken; numpy's overflow warning for a claim past int64 is kept quiet (its error says so).
    Raises what ``np.load`` raises (``NPY_ERRORS``; ``npy_error`` puts it in words)."""
    with np.errstate(over="ignore"):
        return np.load(path, mmap_mode="r", allow_pickle=False)


def npy_error(path: Any, error: BaseException) -> str:
    """What ``np.load``'s ``error`` on the file ``path`` means, in words: numpy calls any file
    that is neither a ``.npy`` array nor a ``.npz`` archive "pickled (object) data" and advises
    ``allow_pickle=True``, which would run the code in a pickle, and is no help for a text or JSON
    file of lengths. Such a file is said to be no ``.npy`` file, with its first bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError:
        return str(error)
    if head.startswith((_NPY_MAGIC, b"PK")) or not head:  # an array, an archive, or empty
        large = _LARGE_HEADER.match(str(error))
        if large:  # numpy's advice: allow_pickle=True, which would trust any pickle in it
            return (
                f"its header is {int(large.group(1)):,} bytes, more than numpy reads from a file "
                "(max_header_size, 10,000 bytes; numpy.save writes far less)"
            )
        return str(error)
    return f"it is no .npy file: it begins {head!r}, not with numpy's {_NPY_MAGIC!r}"


MAX_TOKENS_LIMIT = 2**53
"""Largest token count or token sum accepted anywhere: exact in int64 and float64 arithmetic."""


def token_total(values: np.ndarray) -> int | float:
    """The sum of the non-negative integers ``values`` (tokens, patches), exactly where it is
    compared with ``MAX_TOKENS_LIMIT``: the float64 sum alone rounds there (one sample of
    2**53 + 1 tokens summed to 2**53 and passed the limit, to fail later as an invalid plan
    blaming the strategy), so a sum from 2**52 to 2**62 is the int64 one (a Python int, which
    cannot wrap that far below 2**63); beyond, the float64 sum (far past the limit anyway)."""
    total = float(values.sum(dtype=np.float64))
    if MAX_TOKENS_LIMIT / 2 <= total <= 2.0**62:
        return int(values.sum(dtype=np.int64))
    return total


MAX_COST_TOTAL = 2.0**960
"""Largest sum of a step's costs (and micro-batch overheads, one per sample) accepted by the
planner, about 1e289: scaled by rank speeds (down to 2**-30) and summed over ranks and
positions it still stays far below float64's largest value (about 1.8e308)."""


class EmptySlotError(ValueError):
    """A plan refused because some micro-batch (slot) would be empty without ``allow_empty``.

    The message is ``reason + hint``: why, then which options would plan it. Callers that never
    allow empty micro-batches (the drop-ins whose frameworks run every micro-batch on every
    rank) raise ``reason`` with a hint of their own, so no message suggests an option they
    refuse.

    Attributes:
        reason: the refusal without its hint.
        hint: what follows it (with its leading separator).
    """

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason + hint)
        self.reason, self.hint = reason, hint

    def __reduce__(self) -> tuple[type[EmptySlotError], tuple[str, str]]:
        # Made again from both parts: an exception unpickles as ``cls(*args)``, and ``args``
        # holds the joined message only, so a rank's refusal sent to another process (the
        # launcher, a process pool, Ray) raised TypeError there instead.
        return type(self), (self.reason, self.hint)


def prefixed(error: ValueError, prefix: str) -> ValueError:
    """``error``'s message after ``prefix`` (which step, which epoch), of the same kind: an
    :class:`EmptySlotError` stays one, so a caller that replaces its hint still can."""
    if isinstance(error, EmptySlotError):
        return EmptySlotError(prefix + error.reason, error.hint)
    return ValueError(f"{prefix}{error}")


_RAISED_BY = "raised by"


@contextmanager
def naming(what: str) -> Iterator[None]:
    """Run a user's code (a registered strategy's plan, a cost function): a ValueError is its
    way of refusing the input and propagates as it is; any other exception is a bug in it and
    propagates too, of its own type (hiding it would hide the bug), with the note "raised by
    ``what``" (Python 3.11+; the innermost only: a rival's error passes through balanced's)."""
    try:
        yield
    except ValueError:
        raise
    except Exception as error:
        named = any(note.startswith(_RAISED_BY) for note in getattr(error, "__notes__", ()))
        if hasattr(error, "add_note") and not named:  # 3.10 shows the traceback alone
            error.add_note(f"{_RAISED_BY} {what}")
        raise


def refuse_masked(values: Any, name: str) -> None:
    """ValueError when ``values`` is a numpy masked array with a masked entry: ``np.asarray``
    would read the data under the mask as if it were valid, and dropping the entry would move
    every index after it."""
    if isinstance(values, np.ma.MaskedArray):
        masked = np.ma.getmaskarray(values)
        if masked.any():
            where = np.unravel_index(int(np.flatnonzero(masked)[0]), masked.shape)
            index = ",".join(str(int(i)) for i in where)
            raise ValueError(
                f"{name}[{index}] is masked (a numpy masked array): give every entry a value "
                "(np.ma.filled) or leave the masked samples out first"
            )


def _numpy_of(values: Any, name: str) -> np.ndarray:
    """``np.asarray(values)``, or a ValueError naming ``name`` where numpy cannot read them: a
    tensor that requires grad (torch's RuntimeError, raised on the rank that passed it alone
    where a step's input travels to every rank), a meta or sparse tensor, ragged
    lists. A tensor on an accelerator is read on the host, as ``cu_seqlens`` is (``groups`` on
    a GPU was refused: numpy reads host memory only)."""
    if getattr(values, "requires_grad", False):  # torch will not hand it to numpy
        raise ValueError(
            f"{name} must be a 1-D array of numbers: got a tensor that requires grad; "
            "pass it .detach()ed"
        )
    try:
        # A torch tensor, duck-typed (numpy is the only requirement). A meta one has no data
        # to copy: numpy refuses it below (TypeError), as a sparse one.
        device = getattr(getattr(values, "device", None), "type", "cpu")
        if device not in ("cpu", "meta") and callable(getattr(values, "cpu", None)):
            values = values.cpu()
        return np.asarray(values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a 1-D array of numbers: {error}") from None


def not_a_file(path: Path) -> str:
    """Why ``path`` names no file to read: ``no such file 'p'``, or what is there instead (a
    folder, or a FIFO, socket or device: each was called "no such file", though it is there)."""
    if path.is_dir():
        return f"{str(path)!r} is a folder, not a file"
    if path.exists():
        return f"{str(path)!r} is not a regular file (a FIFO, socket or device)"
    return f"no such file {str(path)!r}"


def host_array(values: Any, name: str) -> np.ndarray:
    """``values`` as a numpy array in host memory; a masked array and what numpy cannot read
    (a tensor that requires grad, a bfloat16 / meta / sparse tensor, ragged lists) are a
    ValueError naming ``name``."""
    refuse_masked(values, name)
    return _numpy_of(values, name)


def _as_1d_array(values: Any, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{name} must be a 1-D array of numbers, got a string {values!r}")
    array = host_array(values, name)
    if array.ndim != 1:
        if array.ndim == 0:
            raise ValueError(f"{name} must be a 1-D array of numbers, got the scalar {values!r}")
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.dtype == np.bool_ or (
        isinstance(values, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in values)
    ):
        raise ValueError(f"{name} must hold numbers, got booleans")
    if array.size == 0 and array.dtype.kind in "iufOUS":
        return array.astype(np.float64)
    if array.dtype.kind in "OUS":
        # numpy turns [1, "a"] into strings; look at the caller's own items to name the culprit.
        items = list(values) if isinstance(values, (list, tuple)) else array.tolist()
        bad = next((i for i, v in enumerate(items) if not isinstance(v, numbers.Real)), None)
        if bad is not None:
            raise ValueError(f"{name}[{bad}] = {items[bad]!r} is not a number")
        try:
            array = array.astype(np.float64)
        except OverflowError:  # an int or Fraction past float64's range (10**400)
            bad = next((i for i, v in enumerate(items) if abs(v) > _FLOAT64_MAX), 0)
            raise ValueError(f"{name}[{bad}] is {_BEYOND_FLOAT64}") from None
    # Kind, not issubdtype: numpy files timedelta64 under the integers.
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array


_FLOAT64_MAX = float(np.finfo(np.float64).max)
_BEYOND_FLOAT64 = "past the float64 range (magnitude above 1.8e308)"


def _float64(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` (of ``_as_1d_array``) as float64; a wider float past float64's range (a
    ``longdouble`` of 1e600) raises ValueError naming ``name`` and the index, where the cast
    would warn and make it infinite."""
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:
        too_large = np.abs(array) > _FLOAT64_MAX
        if too_large.any():
            bad = _first(too_large)
            raise ValueError(f"{name}[{bad}] = {array[bad]!r} is {_BEYOND_FLOAT64}")
    return array.astype(np.float64, copy=False)


def _wide_floats(array: np.ndarray) -> np.ndarray:
    """Floats at least as wide as float64, so bounds such as 2**62 compare without overflow
    (float16 holds at most 65504)."""
    return array.astype(np.promote_types(array.dtype, np.float64), copy=False)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def as_weights(values: Any, name: str = "weights") -> np.ndarray:
    """Return ``values`` as a float64 1-D array of finite, non-negative numbers.

    Raises ValueError naming ``name``, the index and the value of the first bad entry.
    """
    weights = _float64(_as_1d_array(values, name), name)
    finite = np.isfinite(weights)
    if not finite.all():
        bad = _first(~finite)
        raise ValueError(f"{name}[{bad}] = {float(weights[bad])} is not finite")
    negative = weights < 0
    if negative.any():
        bad = _first(negative)
        raise ValueError(f"{name}[{bad}] = {float(weights[bad])} is negative")
    # -0.0 as 0.0 (adding 0.0 does that): equal values give byte-identical plans and documents.
    return weights + 0.0 if np.signbit(weights).any() else weights


def as_sample_values(values: Any, name: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``as_weights`` of what a function returned for samples of ``shape``: one ``what`` per
    sample, however it came (an array, a tensor, a list; strings and other non-numbers refused
    by ``as_weights`` rather than converted, as ``np.asarray(..., dtype=float)`` would).

    Raises ValueError naming ``name``: no array of ``shape`` (a generator, a mapping, ``None``,
    a ragged list), or an entry that is no finite number >= 0.
    """
    try:
        found = tuple(np.shape(values))
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must return one {what} per sample: {error}") from None
    if found != shape:
        raise ValueError(
            f"{name} must return one {what} per sample: got shape {found} "
            f"({type(values).__name__}), expected {shape}"
        )
    return as_weights(values, name)


SPEED_RANGE = (2.0**-30, 2.0**30)
"""Relative speeds (1.0: a typical rank) lie in about [1e-9, 1e9], so that ``cost / speed``
never overflows or loses every digit."""


def as_speeds(values: Any, name: str, count: int | None = None) -> np.ndarray:
    """Return ``values`` as a float64 1-D array of positive, finite relative speeds.

    Raises ValueError naming ``name``: not a 1-D array of numbers, empty, an entry that is not
    positive and finite or lies outside ``SPEED_RANGE`` (with its index and value), or
    ``count`` given and a different length.
    """
    array = _float64(_as_1d_array(values, name), name)
    if array.size == 0:
        raise ValueError(f"{name} must not be empty (one speed per part or rank)")
    bad = ~(np.isfinite(array) & (array > 0))
    if bad.any():
        first = _first(bad)
        raise ValueError(f"{name}[{first}] = {float(array[first])} must be positive and finite")
    low, high = SPEED_RANGE
    bad = (array < low) | (array > high)
    if bad.any():
        first = _first(bad)
        raise ValueError(
            f"{name}[{first}] = {float(array[first])} is outside [2**-30, 2**30]: speeds are "
            "relative (1.0 for a typical rank)"
        )
    if count is not None and array.size != count:
        raise ValueError(f"{name} has {array.size} entries, expected {count} (one per part)")
    return array


def as_lengths(values: Any, name: str = "lengths") -> np.ndarray:
    """Return ``values`` as an int64 1-D array of non-negative integers (token counts).

    Floats are accepted only when they hold whole numbers (``3.0``); ``3.5``, NaN, inf, negative
    values and booleans raise ValueError naming ``name``, the sample index and the value.
    """
    array = _as_1d_array(values, name)
    if np.issubdtype(array.dtype, np.floating):
        array = _wide_floats(array)
        finite = np.isfinite(array)
        if not finite.all():
            bad = _first(~finite)
            raise ValueError(f"{name}[{bad}] = {float(array[bad])} is not finite")
        fractional = array != np.floor(array)
        if fractional.any():
            bad = _first(fractional)
            raise ValueError(f"{name}[{bad}] = {float(array[bad])} is not a whole number of tokens")
        too_large = np.abs(array) > 2**62
        if too_large.any():
            bad = _first(too_large)
            value = array[bad]  # a longdouble past float64 shown as it is, not as inf
            shown = float(value) if abs(value) <= _FLOAT64_MAX else repr(value)
            raise ValueError(f"{name}[{bad}] = {shown} is too large")
    elif array.dtype == np.uint64 and (array > np.iinfo(np.int64).max).any():
        bad = _first(array > np.iinfo(np.int64).max)
        raise ValueError(f"{name}[{bad}] = {int(array[bad])} is too large")
    lengths = array.astype(np.int64)
    negative = lengths < 0
    if negative.any():
        bad = _first(negative)
        raise ValueError(f"{name}[{bad}] = {int(lengths[bad])} is negative")
    return lengths


_NO_NUMBERS = (bool, np.bool_, np.timedelta64)
"""Scalars that pass for numbers (``numbers.Integral``) but are no count or seconds: truth values,
and numpy's durations, which numpy files under the integers (``int()`` / ``float()`` of one
raise TypeError)."""


MAX_RANKS = 2**18
"""Most ranks of one step (and most (rank, micro-batch) slots): per-rank arrays take memory
the size of any count, so a larger one is a mistake, not a plan."""


def check_ranks(value: Any, name: str) -> int:
    """``value`` as an int in ``[1, MAX_RANKS]``: a count of ranks (``dp_size``, ``n_ranks``).

    Raises:
        ValueError: not an int, below 1 or above ``MAX_RANKS`` (naming ``name`` and the value).
    """
    return check_bounded_count(value, name, most=MAX_RANKS)


def check_bounded_count(value: Any, name: str, *, most: int, unit: str = "") -> int:
    """``value`` as an int in ``[1, most]``, ``most`` a power of two (said as ``2**N``, then
    ``unit``)."""
    value = check_int(value, name, minimum=1)
    if value > most:
        power = most.bit_length() - 1
        raise ValueError(f"{name} must be <= 2**{power} = {most}{unit}, got {value}")
    return value


MAX_PARTS = 2**20
"""Most parts of one partition (each is a list or an array; far more than any cluster has
ranks)."""


def check_parts(value: Any, name: str) -> int:
    """``value`` as an int in ``[1, MAX_PARTS]``: a count of parts (``k``, ``k_partitions``).

    Raises:
        ValueError: not an int, below 1 or above ``MAX_PARTS`` (naming ``name`` and the value).
    """
    return check_bounded_count(value, name, most=MAX_PARTS, unit=" parts")


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """Return ``value`` as an int; reject bools, durations, non-integers and values below
    ``minimum``."""
    if isinstance(value, _NO_NUMBERS) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    result = int(value)
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def as_group_ids(groups: Any, n: int, name: str = "groups") -> np.ndarray:
    """Return ``groups`` as int64 group ids, one per sample of ``n`` (e.g. the GRPO prompt id).

    Whole floats are accepted; booleans, fractional or non-finite values, and a shape other than
    ``(n,)`` raise ValueError naming ``name`` (and the index and value of a bad id).
    """
    array = host_array(groups, name)
    # numpy reads a bool among ints as 0 or 1 and an int past int64 as a float, uint64 or an
    # object: name the item as the caller wrote it. Walked only where one may be among them.
    items: Any = None
    if array.dtype == object:
        items = array.ravel().tolist()
    elif isinstance(groups, (list, tuple)) and array.dtype != np.bool_:
        kinds = set(map(type, groups))
        if bool in kinds or np.bool_ in kinds or array.dtype.kind in "fu":
            items = groups
    for index, value in enumerate(items or ()):
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name}[{index}] = {value!r} is not an integer id (a bool)")
        if isinstance(value, int):
            _check_int64_id(value, index, name)
    # numpy reads ints beside a float as float64, which past 2**53 merges distinct ids.
    # (A float64 read only: numpy reads such a mix so; 2**53 would overflow a float16.)
    if items is not None and (
        array.dtype == object
        or (array.dtype == np.float64 and bool((np.abs(array) >= 2**53).any()))
    ):
        array = _exact_ids(items, array, name)
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"{name} must hold one id per sample ({n}), got shape {array.shape}")
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold integer ids, got dtype {array.dtype}")
    if array.dtype.kind == "f":
        array = _wide_floats(array)
        bad = ~np.isfinite(array) | (array != np.round(array)) | (np.abs(array) > 2**62)
        if bad.any():
            index = _first(bad)
            raise ValueError(f"{name}[{index}] = {array[index].item()!r} is not an integer id")
    if array.dtype == np.uint64 and n and array.max() > np.iinfo(np.int64).max:
        index = _first(array > np.iinfo(np.int64).max)
        raise ValueError(f"{name}[{index}] = {int(array[index])} does not fit in int64")
    return array.astype(np.int64)


def _check_int64_id(value: int, index: int, name: str) -> int:
    """``value`` (the id ``name[index]``), or ValueError where it does not fit in int64."""
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name}[{index}] = {value} does not fit in int64")
    return value


def _exact_ids(items: Sequence[Any], array: np.ndarray, name: str) -> np.ndarray:
    """Ids given as Python numbers (a list, or an object array: a pandas object column) read
    exactly: whole numbers (floats, Fractions, numpy integers) as ints, so ints past 2**53
    beside a float keep their values (numpy would read them all as float64, merging distinct
    ids); an integer past int64 raises ValueError naming ``name[i]``. ``array`` (numpy's own
    read) is returned where an item is no real number (refused by kind after); float64 where
    one is not whole (the float check names it)."""
    if not all(isinstance(value, numbers.Real) for value in items):
        return array
    whole = []
    for index, value in enumerate(items):
        if isinstance(value, numbers.Integral):
            value = _check_int64_id(int(value), index, name)
        elif abs(value) <= 2**62 and value == int(value):  # whole (NaN and inf fail the first)
            value = int(value)
        whole.append(value)
    if all(isinstance(value, int) for value in whole):
        return np.array(whole, dtype=np.int64).reshape(array.shape)
    return np.array(items, dtype=np.float64).reshape(array.shape)


def check_bool(value: Any, name: str) -> bool:
    """Return ``value`` as a bool; anything but ``True``/``False`` (numpy's too) is rejected."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_real(value: Any, name: str, *, positive: bool) -> float:
    kind = "positive" if positive else "non-negative"
    if isinstance(value, _NO_NUMBERS) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a {kind} number, got {value!r}")
    try:
        result = float(value)
    except OverflowError:  # an int or Fraction beyond a float's range
        result = np.inf
    if not np.isfinite(result) or result < 0 or (positive and result == 0):
        raise ValueError(f"{name} must be a {kind} finite number, got {value!r}")
    return result + 0.0  # -0.0 as 0.0: equal values give equal documents and fingerprints


def check_positive_float(value: Any, name: str) -> float:
    """Return ``value`` as a float; reject bools, NaN, inf and values <= 0."""
    return _check_real(value, name, positive=True)


def check_flops_rate(peak_flops_per_s: Any, efficiency: Any) -> tuple[float, float]:
    """Return ``(peak_flops_per_s, efficiency)`` as floats: a positive finite peak, an
    efficiency in (0, 1], and a product (the achieved FLOP/s, which seconds are divided by) that
    does not underflow: ``1e-300 x 1e-300`` was 0, and dividing by it a ZeroDivisionError."""
    peak = check_positive_float(peak_flops_per_s, "peak_flops_per_s")
    rate = check_positive_float(efficiency, "efficiency")
    if rate > 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    if not peak * rate >= sys.float_info.min:
        raise ValueError(
            f"peak_flops_per_s x efficiency = {peak!r} x {rate!r} = {peak * rate!r} FLOP/s is "
            "too small to divide by"
        )
    return peak, rate


MAX_TIMEOUT_SECONDS = 10.0 * 365 * 24 * 3600
"""Longest deadline accepted, in seconds (ten years): a longer one is a mistake (``inf``, a value
in the wrong unit), and ``datetime.timedelta`` overflows not far above it."""

MIN_TIMEOUT_SECONDS = 1e-3
"""Shortest deadline accepted, in seconds: torch.distributed's resolution (c10d counts deadlines
in whole milliseconds, so a shorter one becomes 0 ms: a store fails at once with a C++ stack
trace, and a collective's ``work.wait`` takes 0 ms as no deadline at all, waiting for a missing
peer for ever)."""


def check_timeout(value: Any, name: str) -> float:
    """Return a deadline in seconds as a float: positive, finite, at least
    ``MIN_TIMEOUT_SECONDS`` and at most ``MAX_TIMEOUT_SECONDS`` (so converting it to a
    ``timedelta`` can neither overflow nor round to zero)."""
    seconds = _check_real(value, name, positive=True)
    if seconds < MIN_TIMEOUT_SECONDS:
        raise ValueError(
            f"{name} must be at least {MIN_TIMEOUT_SECONDS:g} seconds (torch.distributed's "
            f"resolution), got {value!r}"
        )
    if seconds > MAX_TIMEOUT_SECONDS:
        raise ValueError(
            f"{name} must be at most {MAX_TIMEOUT_SECONDS:g} seconds (ten years), got {value!r}"
        )
    return seconds


def check_non_negative_float(value: Any, name: str) -> float:
    """Return ``value`` as a float; reject bools, NaN, inf and values < 0."""
    return _check_real(value, name, positive=False)


def check_choice(value: Any, name: str, choices: Sequence[str] | Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise raise naming the valid ones."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        listed = ", ".join(repr(option) for option in options)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value
