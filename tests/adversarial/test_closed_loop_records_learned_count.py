"""Adversarial (review14 item 8): the refusal where a rank observed the due step but had learned
another count of steps (it loaded another state) contradicted itself: "rank 1 observed step 3
where step 3 was due". It now names the count the rank had learned."""

from __future__ import annotations

from typing import Any

from seqbalance.runtime.closed_loop._records import refusal


def _record(step: int, due: int) -> dict[str, Any]:
    return {"step": step, "setup": "s", "stats": [0.0] * 29, "error": None, "due": due}


def test_a_rank_that_learned_another_count_is_named_by_its_count() -> None:
    message, agree = refusal([_record(3, 3), _record(3, 1)], 2, 3)
    assert not agree
    assert message is not None
    assert message.startswith(
        "rank 1 had learned 1 steps where 3 were due (it loaded another state?) (steps observed "
        "by rank: [3, 3], steps learned by rank: [3, 1])"
    ), message


def test_a_rank_that_observed_another_step_is_named_by_its_step() -> None:
    message, _ = refusal([_record(3, 3), _record(2, 3), _record(3, 3)], 3, 3)
    assert message is not None
    assert message.startswith(
        "rank 1 observed step 2 where step 3 was due (steps observed by rank: [3, 2, 3]):"
    ), message
