"""The samplers' resume-state format, and the refusal of a state of another format."""

from __future__ import annotations

from typing import Any

__all__ = ["STATE_FORMAT", "check_state_format"]

STATE_FORMAT = "seqbalance.SamplerState/4"
"""``state_dict()["format"]``; changes whenever the resume state's layout, or the epoch order
its position counts in, changes (4: the keyed shuffle's round function, so a state of 3 would
resume at its count in another order, training some samples twice and others never)."""

_OLDER = tuple(f"seqbalance.SamplerState/{version}" for version in (1, 2, 3))


def check_state_format(found: Any) -> None:
    """Refuse a resume state whose ``format`` is ``found`` unless it is :data:`STATE_FORMAT`;
    an older seqbalance's state is told why and what to do (a user upgrading mid-training)."""
    if found in _OLDER:  # a tuple: a format of any kind compares, none raises TypeError
        raise ValueError(
            f"state_dict['format'] = {found!r}: written by an older seqbalance; epochs are "
            f"shuffled differently since {STATE_FORMAT!r}, so its position would resume in "
            "another order (some samples trained twice, others never). Resume with the "
            "seqbalance that saved it, or start the next epoch without the state "
            "(set_epoch(epoch + 1), no load_state_dict)"
        )
    if found != STATE_FORMAT:
        raise ValueError(
            f"state_dict['format'] = {found!r}, expected {STATE_FORMAT!r}: this resume point "
            "cannot be checked against this sampler"
        )
