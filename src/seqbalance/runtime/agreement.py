"""Ranks show each other the plan they made before any sample moves.

Equal settings are not enough for equal plans: a cost built by a factory, a closure or a class
instance with different parameters on each rank has the same options fingerprint (its qualified
name) but gives different costs, so the ranks would plan differently and an exchange would fail
(gloo aborts on mismatched sizes) or deliver the wrong samples. :func:`agreed_plan` all-gathers
a few bytes per rank, digests of what decided the plan and of the plan itself, and makes every
rank raise the same ``ValueError`` when they differ. :func:`differing_settings` words the
settings two ranks (or a saved state and this process) differ in, for every such refusal.

An error met on one rank alone (bad input, a cost table too short for a sample) must fail every
rank, or its peers wait in their next collective until the timeout: :func:`error_text` words it
for the gather every rank makes anyway, and :func:`raise_gathered_error` raises it there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from seqbalance.plan.types import StepPlan

if TYPE_CHECKING:
    from seqbalance.plan.base import Plan
    from seqbalance.runtime.collectives import Comm

__all__ = [
    "agreed_plan",
    "brief",
    "differing_settings",
    "error_text",
    "plan_digests",
    "raise_gathered_error",
]

_CHECKS = (
    ("planning", "error", "only some ranks could plan the step"),
    (
        "the step's per-sample costs",
        "costs",
        "their cost models give different costs for the same samples (a cost built with "
        "different parameters on each rank: a factory, a closure or a class instance?); build "
        "the same cost on every rank",
    ),
    ("the plan", "plan", "equal costs gave different plans (a nondeterministic strategy)"),
)
"""(what the ranks disagree on, record key, the likely cause), checked in this order."""


def brief(value: Any, width: int) -> str:
    """``value`` as JSON, cut to ``width`` characters, for naming what ranks disagree on."""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def differing_settings(
    first: Mapping[Any, Any], second: Mapping[Any, Any], word: Callable[[str, str, str], str]
) -> list[str]:
    """Every setting whose value differs between ``first`` and ``second`` (two ranks' settings,
    or a saved state's and this process's, as plain data), in words:
    ``word(name, first's value, second's value)``, each value as :func:`brief` JSON.

    Settings come in ``first``'s order, then those only ``second`` has (a missing one reads as
    None). Where both values are mappings, each differing field is named by its path
    (``model.FlopsModel.spec.vocab_size``): a long value cut short for the message could
    otherwise hide the difference, showing two equal texts.
    """
    changes = []
    for key in [*first, *(key for key in second if key not in first)]:
        mine, theirs = first.get(key), second.get(key)
        if mine == theirs:
            continue
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            changes += differing_settings(
                mine, theirs, lambda field, a, b, key=key: word(f"{key}.{field}", a, b)
            )
        else:
            changes.append(word(str(key), brief(mine, 60), brief(theirs, 60)))
    return changes


def error_text(
    error: BaseException, *, refusals: tuple[type[BaseException], ...] = (ValueError,)
) -> str:
    """``error`` as it travels to the other ranks in a gather: its message where it is one of
    ``refusals`` (a refusal of the input, worded for the user), else its kind and message (an
    ``IndexError`` of a cost table says little without its kind). Never empty: an error without
    a message is named by its kind, so that no rank reads it as no error."""
    text = str(error)
    if isinstance(error, refusals) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def raise_gathered_error(
    errors: Sequence[str | None], *, own: BaseException | None = None, what: str = ""
) -> None:
    """Raise the first error among ``errors`` (one per rank, in rank order, ``None`` where a
    rank had none), alike on every rank, or return where there is none.

    Args:
        errors: every rank's :func:`error_text`, or ``None``.
        own: this rank's own error where it was none of the refusals: raised here as it is
            (its traceback is the one to read), once the gather has told the peers.
        what: what failed, put before the rank (``"TorchFlopsMeter.report on "``).

    Raises:
        ValueError: ``"{what}rank {r}: {text}"`` for the first rank ``r`` with an error (or
            ``own``).
    """
    for rank, text in enumerate(errors):
        if text is not None:
            if own is not None:
                raise own
            raise ValueError(f"{what}rank {rank}: {text}")


def plan_digests(plan: Plan | None) -> dict[str, str]:
    """SHA-256 digests of what decided ``plan`` (a ``StepPlan``'s per-sample costs and
    micro-batch overhead, a ``ContextParallelPlan``'s slot seconds, as float64 bytes) and of
    the plan itself (every rank's micro-batches or slots); empty strings without a plan."""
    if plan is None:
        return {"costs": "", "plan": ""}
    if isinstance(plan, StepPlan):
        costs = hashlib.sha256(np.ascontiguousarray(plan.sample_costs, dtype=np.float64).tobytes())
        costs.update(np.float64(plan.overhead).tobytes())
    else:
        costs = hashlib.sha256(np.ascontiguousarray(plan.costs, dtype=np.float64).tobytes())
    layout = hashlib.sha256()
    for microbatches in plan.ranks:
        layout.update(np.array([mb.size for mb in microbatches], dtype=np.int64).tobytes())
        for mb in microbatches:
            layout.update(np.ascontiguousarray(mb, dtype=np.int64).tobytes())
    return {"costs": costs.hexdigest(), "plan": layout.hexdigest()}


def agreed_plan(comm: Comm, plan: Plan | None, error: str | None) -> tuple[Plan | None, str]:
    """``plan`` (this rank's plan of the step, ``None`` without samples or on ``error``, the
    planning error's message) once every rank of ``comm`` shows the same one, and its digest
    (``plan_digests``' ``"plan"``, computed once for the check: the caller reuses it).

    One all-gather of a small JSON record per rank.

    Raises:
        ValueError: on every rank: the planning error when every rank got the same one, or the
            first disagreement with rank 0 (some ranks failed to plan, different per-sample
            costs, or different plans from equal costs), naming the rank.
        CollectiveError: a peer failed or did not call within the timeout.
    """
    digests = plan_digests(plan)
    mine = json.dumps({"error": error, **digests}).encode()
    records = [json.loads(text) for text in comm.all_gather_bytes(mine, "all_gather of plans")]
    messages = {record["error"] for record in records}
    if len(messages) == 1 and error is not None:
        raise ValueError(error)  # the same planning error on every rank
    for what, key, cause in _CHECKS:
        rank = next((r for r, rec in enumerate(records) if rec[key] != records[0][key]), None)
        if rank is None:
            continue
        detail = ""
        if key == "error":
            detail = f" ({records[0][key] or 'planned'} vs {records[rank][key] or 'planned'})"
        raise ValueError(
            f"ranks 0 and {rank} disagree on {what}{detail}: {cause}; no sample was moved"
        )
    return plan, digests["plan"]
