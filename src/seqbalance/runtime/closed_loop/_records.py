"""The records every rank hands ``ClosedLoop.learn`` (``loop`` module doc): their form, and
whether they describe one step that every rank observed alike (:func:`refusal`). Pure
functions of the records, so every rank judges alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["refusal", "statistics"]

_RECORD_KEYS = {"step", "setup", "stats", "error"}
"""The keys of every record (``loop`` module doc); ``"taken"``, ``"plan"``, ``"learned"``,
``"skip"`` and ``"due"`` may come with them (``"learned"`` and ``"due"`` do on every record this
release writes; a pending record saved by an older one lacks them)."""
_OPTIONAL_KEYS = {"taken", "plan", "learned", "skip", "due"}
_DIFFERING = (
    (
        "learned",
        "plan with different learned models or rank speeds at step {step}, so their plans "
        "differ: they loaded different adaptive states (another run's checkpoint on one rank, "
        "or a corrupted one), or computed the same fit differently (ranks whose floating-point "
        "results differ, e.g. other CPUs or BLAS libraries); every rank must load the same "
        "state and learn alike",
    ),
    (
        "plan",
        "observed the results of different steps as step {step}: observe() was given another "
        "step's result on one of them (a stale one), or they planned different samples "
        "(Adaptive.plan given other lengths, or another order, on one of them); every rank "
        "plans each step from the same lengths and observes its own result once, in order",
    ),
)
"""Optional record keys that must be equal on every rank, and what it means when not."""


def refusal(records: Sequence[Any], world_size: int, due: int) -> tuple[str | None, bool]:
    """Why step ``due`` cannot be learned from ``records`` (one per rank of ``world_size``, in
    rank order), or None; and whether the ranks agree on the step they observed (then only a
    rank's error, which kept it from measuring, refuses it: the step can be skipped alike).

    Raises:
        ValueError: the records are malformed (not one per rank, not records).
    """
    if len(records) != world_size:
        raise ValueError(f"records must hold one per rank ({world_size}), got {len(records)}")
    for rank, record in enumerate(records):
        if not isinstance(record, dict) or set(record) - _OPTIONAL_KEYS != _RECORD_KEYS:
            raise ValueError(
                f"rank {rank} sent a malformed closed-loop record: {record!r:.80} (is it in "
                "another collective? e.g. a sampler rank that skipped this step's observe() "
                "and started its next pass)"
            )
    disagreement = _disagreement(records, due)
    for rank, record in enumerate(records):
        if record["error"] is not None:
            return (
                f"rank {rank} could not report step {record['step']}: {record['error']}",
                disagreement is None,
            )
    return disagreement, disagreement is None


def _disagreement(records: Sequence[dict[str, Any]], due: int) -> str | None:
    """Why the well-formed ``records`` do not describe step ``due`` observed alike, or None."""
    for rank, record in enumerate(records):
        if record["setup"] != records[0]["setup"]:
            return (
                f"ranks 0 and {rank} set up the closed loop differently (options, Feedback "
                "settings, prior or lag): build it the same way on every rank"
            )
    steps = [record["step"] for record in records]
    # The step due on most ranks (ties: the lowest rank's), from the records: each rank's own
    # would name the others as wrong on the odd rank (one that loaded an older state).
    dues = [record.get("due", due) for record in records]
    due = max(dues, key=lambda value: (dues.count(value), -dues.index(value)))
    learned = "" if dues.count(due) == len(dues) else f", steps learned by rank: {dues}"
    for rank, (step, rank_due) in enumerate(zip(steps, dues, strict=True)):
        if step != due or rank_due != due:
            # A rank that observed the due step can only be wrong in the count it learned.
            wrong = (
                f"rank {rank} observed step {step} where step {due} was due"
                if step != due
                else f"rank {rank} had learned {rank_due} steps where {due} were due (it loaded "
                "another state?)"
            )
            return (
                f"{wrong} (steps observed by rank: {steps}{learned}): a missed or extra "
                "observe(), or a rank that loaded another state; every rank observes every step "
                "once, in order"
            )
    for key, problem in _DIFFERING:
        values = [record.get(key) for record in records]
        other = next((r for r, value in enumerate(values) if value != values[0]), None)
        if other is not None and None not in values:  # older records lack the key
            return f"ranks 0 and {other} " + problem.format(step=due)
    taken = [record.get("taken") for record in records]
    if any(count != taken[0] for count in taken):
        return (
            f"ranks observed step {due} after taking {taken} steps from their "
            "samplers (rank order): a missed or extra observe() on a rank (every rank "
            "observes every step once, after its micro-batches), or DataLoaders that take "
            "batches ahead differently (use the same num_workers and prefetch_factor on "
            "every rank)"
        )
    return None


def statistics(records: Sequence[dict[str, Any]]) -> np.ndarray:
    """The gathered statistics [world_size, 29] of accepted records, else ValueError."""
    try:
        return np.array([record["stats"] for record in records], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"closed-loop records hold malformed statistics: {error}") from None
