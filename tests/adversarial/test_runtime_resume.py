"""Adversarial: sampler resume points at random positions, resumed with the same or altered
settings. Either every sample of the epoch is trained exactly once (consumed before the
checkpoint + yielded after it, over all ranks), or ``load_state_dict`` raises ValueError.
Some settings give the samples as ``SampleParts`` with images (and sometimes a patch cap)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from _parts import TINY_VLM, image_parts
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

# One altered setting per case: (name, function of the base settings -> altered settings).
ALTERATIONS = {
    "max_tokens": lambda s: {**s, "max_tokens": (s["max_tokens"] or 900) + 1},
    "cost": lambda s: {**s, "cost": "flops" if s["cost"] == "tokens" else "tokens"},
    "lengths": lambda s: {**s, "lengths": _perturbed(s["lengths"])},
    "seed": lambda s: {**s, "seed": s["seed"] + 1},
    "groups": lambda s: {**s, "groups": None if s["groups"] is not None else _pairs(s)},
    "shuffle": lambda s: {**s, "shuffle": not s["shuffle"]},
    "bucket_window": lambda s: {**s, "bucket_window": 2 if s["bucket_window"] is None else None},
    "drop_last": lambda s: {**s, "drop_last": not s["drop_last"]},
    "global_batch_size": lambda s: {**s, "global_batch_size": s["global_batch_size"] + 1},
    "dp_size": lambda s: {**s, "dp_size": s["dp_size"] + 1},
    "objective": lambda s: {
        **s,
        "objective": "lockstep" if s["objective"] == "step" else "step",
    },
    # Parts added, or taken away (with the patch cap, which needs them).
    "parts": lambda s: {
        **s,
        "parts_seed": 0 if s["parts_seed"] is None else None,
        "max_vision_patches": None,
    },
}


def _perturbed(lengths: list[int]) -> list[int]:
    """Same count, one length changed: the case the old resume state could not see."""
    return [lengths[0] + 1, *lengths[1:]]


def _pairs(settings: dict[str, Any]) -> list[int]:
    return [i // 2 for i in range(len(settings["lengths"]))]


@st.composite
def balanced_settings(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 48))
    return {
        "lengths": draw(st.lists(st.integers(1, 400), min_size=n, max_size=n)),
        "global_batch_size": draw(st.integers(2, 12)),
        "dp_size": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 3)),
        "shuffle": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "bucket_window": draw(st.sampled_from([None, 2])),
        "groups": None,
        "max_tokens": draw(st.sampled_from([None, 800])),
        "cost": draw(st.sampled_from(["tokens", "flops"])),
        "objective": draw(st.sampled_from(["step", "lockstep"])),
        **draw(
            st.sampled_from([{"parts_seed": None, "max_vision_patches": None}])
            | st.fixed_dictionaries(
                {
                    "parts_seed": st.integers(0, 3),
                    "max_vision_patches": st.sampled_from([None, 400]),
                }
            )
        ),
    }


def _samplers(settings: dict[str, Any]) -> list[BalancedBatchSampler]:
    values = dict(settings)
    lengths, batch, dp = (
        values.pop("lengths"),
        values.pop("global_batch_size"),
        values.pop("dp_size"),
    )
    parts_seed = values.pop("parts_seed")
    if parts_seed is not None:
        # Each sample: its drawn length as text plus 0..3 images of at most 384 patches in all
        # (within the 400-patch cap), costed with the images when the cost is FLOPs.
        lengths = image_parts(np.random.default_rng(parts_seed), np.asarray(lengths))
        values["cost"] = TINY_VLM if values["cost"] == "flops" else "tokens"
    return [
        BalancedBatchSampler(lengths, batch, dp_rank=r, dp_size=dp, allow_empty=True, **values)
        for r in range(dp)
    ]


def _check_resume(
    old: list[Any], new: list[Any], epoch: int, consumed: int, *, rank0_only: bool = False
) -> str:
    """Consume ``consumed`` batches on every rank of ``old``, checkpoint (through JSON), load
    into ``new``; return "refused" or "exact" (and fail on a sample trained twice or never)."""
    trained: Counter[int] = Counter()
    states = []
    for sampler in old:
        sampler.set_epoch(epoch)
        for batch in itertools.islice(iter(sampler), consumed):
            trained.update(batch)
        states.append(json.loads(json.dumps(sampler.state_dict())))
    if rank0_only:  # one checkpoint for every rank, as Trainer saves it on the main process
        states = [states[0]] * len(states)
    if len(states) != len(new):
        # Another dp size: the checkpoint of rank r goes to rank r where it exists.
        states = (states * len(new))[: len(new)]
    try:
        for sampler, state in zip(new, states, strict=True):
            sampler.load_state_dict(state)
    except ValueError:
        return "refused"
    expected: Counter[int] = Counter()
    for sampler in new:
        for batch in sampler:
            trained.update(batch)
        sampler.set_epoch(epoch)
        expected.update(i for batch in sampler for i in batch)
    assert trained == expected, "a sample was trained twice or skipped"
    return "exact"


@given(settings=balanced_settings(), epoch=st.integers(0, 2), consumed=st.integers(0, 12))
def test_balanced_resume_with_the_same_settings_is_exact(settings, epoch, consumed) -> None:
    outcome = _check_resume(_samplers(settings), _samplers(settings), epoch, consumed)
    assert outcome == "exact"


@given(settings=balanced_settings(), epoch=st.integers(0, 2), consumed=st.integers(0, 12))
def test_rank_zeros_checkpoint_resumes_every_rank_exactly(settings, epoch, consumed) -> None:
    outcome = _check_resume(
        _samplers(settings), _samplers(settings), epoch, consumed, rank0_only=True
    )
    assert outcome == "exact"


@given(
    settings=balanced_settings(),
    altered=st.sampled_from(sorted(ALTERATIONS)),
    epoch=st.integers(0, 2),
    consumed=st.integers(0, 12),
)
def test_balanced_resume_with_an_altered_setting_is_refused(
    settings, altered, epoch, consumed
) -> None:
    changed = ALTERATIONS[altered](settings)
    outcome = _check_resume(_samplers(settings), _samplers(changed), epoch, consumed)
    assert outcome == "refused", altered


@given(
    n=st.integers(0, 60),
    batch=st.integers(1, 6),
    dp=st.integers(1, 3),
    other_batch=st.integers(1, 6),
    other_dp=st.integers(1, 3),
    consumed=st.integers(0, 12),
    drop_last=st.booleans(),
)
def test_length_grouped_resume_is_exact_or_refused(
    n, batch, dp, other_batch, other_dp, consumed, drop_last
) -> None:
    lengths = np.random.default_rng(n).integers(1, 500, size=n)

    def make(b: int, d: int) -> list[LengthGroupedSampler]:
        return [
            LengthGroupedSampler(
                lengths, b, dp_rank=r, dp_size=d, seed=1, drop_last=drop_last, allow_empty=True
            )
            for r in range(d)
        ]

    outcome = _check_resume(make(batch, dp), make(other_batch, other_dp), 1, consumed)
    same = (batch, dp) == (other_batch, other_dp)
    assert outcome == ("exact" if same else "refused")


# ---------------------------------------------------------------- any call order
CALLS = st.one_of(
    st.tuples(st.just("set_epoch"), st.integers(0, 2)),
    st.tuples(st.just("iter"), st.just(0)),
    st.tuples(st.just("take"), st.integers(1, 6)),
    st.tuples(st.just("save"), st.integers(0, 3)),  # consumed = yielded - this (a prefetch)
    st.tuples(st.just("load"), st.integers(0, 5)),
)


@given(
    settings=balanced_settings(),
    rank=st.integers(0, 2),
    fixed=st.sampled_from([None, 1, 2]),
    calls=st.lists(CALLS, max_size=25),
)
def test_any_call_order_yields_the_epoch_in_order_and_states_never_skip(
    settings, rank, fixed, calls
) -> None:
    """Whatever the order of ``set_epoch``, ``iter``, ``next``, ``state_dict`` and
    ``load_state_dict``: every batch yielded is the next one of its epoch, every state records
    the epoch and count of what was yielded in it, and resuming it yields exactly the rest."""
    settings = {**settings, "num_microbatches": fixed}
    make = _samplers_or_none(settings)
    if make is None:
        return
    rank = min(rank, settings["dp_size"] - 1)
    full: dict[int, list[list[int]]] = {}
    for epoch in range(3):
        sampler = make()[rank]
        sampler.set_epoch(epoch)
        try:
            full[epoch] = list(sampler)
        except ValueError:  # a step the options cannot plan (a fixed count under the cap)
            return
    epoch_of = full.__getitem__

    sampler = make()[rank]
    model = _Model()
    saved: list[tuple[dict, list[list[int]]]] = []
    for call, value in calls:
        if call == "set_epoch":
            sampler.set_epoch(value)
            model.set_epoch(value)
        elif call == "iter":
            model.start(iter(sampler))
        elif call == "take":
            model.take(value, epoch_of(model.epoch))
        elif call == "save":
            claimed = len(model.done) - value
            if claimed < model.base:
                with pytest.raises(ValueError, match="consumed"):
                    sampler.state_dict(consumed=claimed)
                continue
            state = json.loads(json.dumps(sampler.state_dict(consumed=claimed)))
            assert (state["epoch"], state["consumed"]) == (model.epoch, claimed)
            saved.append((state, model.done[:claimed]))
        elif saved:  # load
            state, prefix = saved[value % len(saved)]
            sampler.load_state_dict(state)
            model.load(state["epoch"], prefix)
    for state, prefix in saved:  # every state resumes a fresh sampler to the epoch's end
        fresh = make()[rank]
        fresh.load_state_dict(state)
        assert prefix + list(fresh) == epoch_of(state["epoch"])


class _Model:
    """What the sampler should be at: the epoch, the batches of it counted as trained, where
    the running pass started among them, and the running iterator (None: none usable)."""

    def __init__(self) -> None:
        self.epoch, self.done, self.base = 0, [], 0
        self.iterator: Any = None
        self.ended: list[Any] = []  # iterators of passes that ended: they must raise
        self.resume: list[list[int]] | None = None

    def _end(self) -> None:
        if self.iterator is not None:
            self.ended.append(self.iterator)
        self.iterator = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._end()
            self.epoch, self.done, self.base, self.resume = epoch, [], 0, None

    def start(self, iterator: Any) -> None:
        # A loaded position goes to the first pass that runs (its first next()): an iterator
        # made and superseded before it ran leaves it to the next one.
        self._end()
        self.done = list(self.resume) if self.resume is not None else []
        self.base, self.iterator = len(self.done), iterator

    def take(self, count: int, expected: list[list[int]]) -> None:
        for old in self.ended:
            with pytest.raises(RuntimeError, match="belongs to a pass that a later"):
                next(old)
        self.ended = []
        if self.iterator is not None:
            self.resume = None  # this pass runs: a later iter() starts the epoch afresh
        for _ in range(count if self.iterator is not None else 0):
            batch = next(self.iterator, None)
            if batch is None:
                assert len(self.done) == len(expected), "the pass ended early"
                self.iterator = None
                return
            assert batch == expected[len(self.done)], "not the epoch's next batch"
            self.done = [*self.done, batch]

    def load(self, epoch: int, prefix: list[list[int]]) -> None:
        self._end()
        self.epoch, self.done, self.base, self.resume = (
            epoch,
            list(prefix),
            len(prefix),
            list(prefix),
        )


def _samplers_or_none(settings: dict[str, Any]) -> Any:
    """A maker of the settings' samplers (one per rank), or None when they refuse them (a step
    that a fixed micro-batch count cannot fill, under a cap)."""
    try:
        _samplers(settings)
    except ValueError:
        return None
    return lambda: _samplers(settings)
