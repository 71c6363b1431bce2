"""Adversarial: random streams through a WindowBalancer with random options.

Whatever the lengths, options and push / dispatch pattern: nothing raises but ValueError, no
call hangs or jams the buffer for good (``flush()`` always empties it), every accepted sample
comes out exactly once, no sample waits more than ``max_delay`` dispatches, and every plan
honours the options (``StepPlan.validate``). Some streams push ``SampleParts`` with images
(sometimes under a patch cap): every dispatch then hands back exactly its samples' parts."""

from __future__ import annotations

import numpy as np
from _parts import TINY_VLM, image_parts
from hypothesis import event, given
from hypothesis import strategies as st

from seqbalance.runtime.rebalancing.window import WindowBalancer

PATCH_CAP = {"max_vision_patches": st.integers(40, 600)}


@st.composite
def balancers(draw: st.DrawFn) -> tuple[WindowBalancer, int | None]:
    """A balancer, and the seed of the images of its stream (None: a stream of lengths)."""
    dp = draw(st.integers(1, 4))
    batch = draw(st.integers(1, 10))
    window = draw(st.integers(batch, 4 * batch))
    minimum_delay = -(-window // batch) - 1
    max_delay = draw(st.sampled_from([None, minimum_delay, minimum_delay + 2]))
    options = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "max_tokens": st.integers(50, 1000),
                "num_microbatches": st.integers(1, 3),
                "cost": st.sampled_from(["tokens", "flops"]),
                "objective": st.sampled_from(["step", "lockstep"]),
                "allow_oversize": st.booleans(),
                "allow_empty": st.booleans(),
                "strategy": st.sampled_from(["balanced", "first_fit", "token_kk"]),
            },
        )
    )
    images = draw(st.none() | st.integers(0, 2**16))
    if images is not None:
        # A cost that sees token counts only would ignore the images: FLOPs count them too.
        options["cost"] = TINY_VLM if options.get("cost") == "flops" else "tokens"
        options.update(draw(st.fixed_dictionaries({}, optional=PATCH_CAP)))
    balancer = WindowBalancer(dp, batch, window=window, max_delay=max_delay, **options)
    return balancer, images


@given(drawn=balancers(), data=st.data())
def test_random_streams_never_jam_lose_duplicate_or_delay_too_long(drawn, data) -> None:
    balancer, images = drawn
    lengths = data.draw(st.lists(st.integers(0, 1200), max_size=60))
    stream = (
        np.array(lengths, dtype=np.int64)
        if images is None
        else image_parts(np.random.default_rng(images), np.array(lengths, dtype=np.int64))
    )
    pushed_at: dict[int, int] = {}
    position_of: dict[int, int] = {}  # id -> position in the stream
    dispatches = []
    position = 0
    while position < len(lengths):
        size = data.draw(st.integers(1, balancer.window), label="push size")
        chunk = np.arange(
            position, min(position + size, position + balancer.window - len(balancer), len(lengths))
        )
        position += len(chunk)
        try:
            ids = balancer.push(stream[chunk] if images is None else stream.take(chunk))
        except ValueError as error:
            # Refused whole (nothing buffered): over a cap.
            assert "exceeds max_tokens" in str(error) or "exceeds max_vision_patches" in str(error)
            event("push refused: over a cap")
        else:
            pushed_at.update((int(i), balancer.dispatches) for i in ids)
            position_of.update(zip(ids.tolist(), chunk.tolist(), strict=True))
        wants = data.draw(st.booleans(), label="dispatch early")
        if balancer.ready() or (wants and len(balancer) >= balancer.batch_size):
            try:
                dispatch = balancer.dispatch()
            except ValueError as error:
                assert "can be planned" in str(error)
                event("dispatch refused: unplannable buffer")
                break  # the options cannot plan this buffer: flush hands it back
            assert dispatch.ids.size == balancer.batch_size
            dispatches.append(dispatch)
    dispatches += balancer.flush()
    assert len(balancer) == 0

    out = np.concatenate([d.ids for d in dispatches]) if dispatches else np.zeros(0, int)
    assert sorted(out.tolist()) == sorted(pushed_at)  # every accepted sample exactly once
    for index, dispatch in enumerate(dispatches):
        assert dispatch.index == index
        waited = [index - pushed_at[int(i)] for i in dispatch.ids]
        assert dispatch.waited.tolist() == waited
        assert max(waited, default=0) <= balancer.max_delay
        if images is not None:
            assert dispatch.parts == stream.take([position_of[int(i)] for i in dispatch.ids])
            event("a stream of parts")
        else:
            assert dispatch.parts is None
        if dispatch.plan is None:
            assert dispatch.unplanned and index == len(dispatches) - 1
            event("flush returned samples unplanned")
            continue
        dispatch.plan.validate()
        planned = sorted(int(i) for r in dispatch.plan.ranks for mb in r for i in mb)
        assert planned == list(range(dispatch.ids.size))
