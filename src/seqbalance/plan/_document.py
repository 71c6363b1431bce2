"""What the plan types share as JSON documents: loading, equality, and the malformed error.

``StepPlan``, ``EpochPlan`` and ``ContextParallelPlan`` each write a versioned JSON document
(``to_json``); two plans are equal when their documents are, timings aside, which is what
"byte-identical on every rank" means.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


class PlanDocument:
    """Equality by the JSON document without timings (plans hold arrays: no hash)."""

    def to_json(self, *, timing: bool = True) -> str:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, PlanDocument)
        return self.to_json(timing=False) == other.to_json(timing=False)

    __hash__ = None  # type: ignore[assignment]


def load_document(text: str, expected: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object in ``text``, whose ``format`` must be one of ``expected``.

    Raises:
        ValueError: not JSON, not an object, or another format (named).
    """
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError) as error:
        raise ValueError(f"not valid JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") not in expected:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"expected a {' or '.join(expected)} document, got format {found!r}")
    return data


MALFORMED_ERRORS = (KeyError, TypeError, ValueError, OverflowError, AttributeError)
"""What reading a document of the right format but the wrong contents can raise."""


def malformed(kind: str, error: Exception) -> str:
    """The message of a document of the right format but the wrong contents."""
    return f"malformed {kind} document: {type(error).__name__}: {error}"


def whole(value: Any, field: str) -> int:
    """A document's integer field as it was written: a JSON integer (not a float such as 3.5
    or 3.0000001, a bool or a string, which ``int()`` would have read silently).

    Raises:
        ValueError: naming the field and the value.
    """
    if type(value) is not int:
        raise ValueError(f"{field} must be an integer, got {value!r:.60}")
    return value


def number(value: Any, field: str) -> float:
    """A document's float field: a finite JSON number (an integer or a float; not a bool, a
    string, NaN or an infinity, which no plan writes).

    Raises:
        ValueError: naming the field and the value.
    """
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r:.60}")
    return float(value)


def flag(value: Any, field: str) -> bool:
    """A document's bool field: JSON true or false (``bool()`` read any value).

    Raises:
        ValueError: naming the field and the value.
    """
    if type(value) is not bool:
        raise ValueError(f"{field} must be true or false, got {value!r:.60}")
    return value


def integers(values: Any, field: str) -> np.ndarray:
    """int64 array of a document's (nested) list of integers: every entry a JSON integer, as
    ``whole`` (``np.asarray(..., dtype=np.int64)`` truncated 2.5 to 2 and read true as 1).

    Raises:
        ValueError: naming the field and the first entry of another kind; an entry beyond
            int64 or lists of uneven lengths are malformed too (numpy's error).
    """
    array = np.asarray(values, dtype=object)
    entries = array.ravel().tolist()
    if any(type(entry) is not int for entry in entries):
        bad = next(entry for entry in entries if type(entry) is not int)
        raise ValueError(f"{field} must hold integers, got {bad!r:.60}")
    return np.array(entries, dtype=np.int64).reshape(array.shape)


def numbers(values: Any, field: str) -> np.ndarray:
    """float64 array of a document's (nested) list of finite numbers (each as ``number``).

    Raises:
        ValueError: naming the field and the first entry of another kind.
    """
    array = np.asarray(values, dtype=object)
    entries = array.ravel().tolist()
    for entry in entries:
        if type(entry) not in (int, float) or not math.isfinite(entry):
            raise ValueError(f"{field} must hold finite numbers, got {entry!r:.60}")
    return np.array(entries, dtype=np.float64).reshape(array.shape)
