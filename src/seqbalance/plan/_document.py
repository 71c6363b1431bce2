"""What the plan types share as JSON documents: loading, equality, and the malformed error.

``StepPlan``, ``EpochPlan`` and ``ContextParallelPlan`` each write a versioned JSON document
(``to_json``); two plans are equal when their documents are, timings aside, which is what
"byte-identical on every rank" means.
"""

from __future__ import annotations

import json
from typing import Any


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
