"""The Rebalancer with ``parts``, without processes: each rank's description on the wire, the
gather's checks and the combined parts, with a stand-in for the process group that hands every
rank the descriptions the others would send."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _parts import TINY_VLM  # noqa: E402

from seqbalance.cost import SampleParts  # noqa: E402
from seqbalance.plan import plan_step  # noqa: E402
from seqbalance.runtime import Rebalancer  # noqa: E402
from seqbalance.runtime.rebalancing.wire import WIRE_VERSION, decode, encode  # noqa: E402

OPTIONS = {"length_key": "input_ids", "cost": TINY_VLM, "max_tokens": 400}


class _Peers:
    """A process group of ``len(payloads)`` ranks as seen by ``rank``: its all_gather returns
    the other ranks' descriptions around its own."""

    def __init__(self, rank: int, payloads: list[bytes]) -> None:
        self.rank, self.world_size, self.payloads = rank, len(payloads), payloads

    def all_gather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        return [payload if r == self.rank else p for r, p in enumerate(self.payloads)]


def _samples(parts: SampleParts) -> list[dict[str, torch.Tensor]]:
    """One sample per entry of ``parts``: its tokens and a pixel field of its patches."""
    patches = parts.vision_patches
    return [
        {"input_ids": torch.arange(int(n)), "pixel_values": torch.full((int(p), 4), float(i))}
        for i, (n, p) in enumerate(zip(parts.tokens, patches, strict=True))
    ]


def _gather_everywhere(rebalancer: Rebalancer, inputs: list[tuple[Any, Any]]) -> list[Any]:
    """Every rank's ``engine.gather`` result (a ``_Batch``) or the ValueError it raised."""
    described = [
        rebalancer.engine.describe(samples, None, None, parts, len(inputs))
        for samples, parts in inputs
    ]
    payloads = [encode(header, table) for _, header, table, _ in described]
    return [
        _outcome(rebalancer.engine.gather, _Peers(rank, payloads), header, table, local)
        for rank, (local, header, table, _) in enumerate(described)
    ]


def _outcome(function: Any, *args: Any) -> Any:
    """``function(*args)``, or the ValueError it raised."""
    try:
        return function(*args)
    except ValueError as error:
        return error


# Rank 0: two samples, one with two images; rank 1: none; rank 2: three, one image.
RANK_PARTS = [
    SampleParts.from_grid_thw([10, 20], [[1, 4, 4], [2, 2, 4]], [0, 0], spatial_merge_size=2),
    SampleParts(tokens=np.zeros(0, np.int64), spatial_merge_size=2),
    SampleParts.from_grid_thw([5, 6, 7], [[1, 8, 4]], [1], spatial_merge_size=2),
]


def test_parts_travel_in_the_description_and_come_back_equal() -> None:
    rebalancer = Rebalancer(**OPTIONS)
    _, header, table, _ = rebalancer.engine.describe(
        _samples(RANK_PARTS[0]), None, None, RANK_PARTS[0], 3
    )
    assert header["error"] is None
    back, back_table = decode(encode(header, table), 0)
    assert json.loads(json.dumps(back["parts"])) == RANK_PARTS[0].to_dict()
    assert SampleParts.from_dict(back["parts"]) == RANK_PARTS[0]
    assert back_table.tolist() == [[18, 16 + 16], [20, 0]]  # tokens and pixel rows per sample
    assert back["wire"] == WIRE_VERSION == 2
    _, plain, _, _ = rebalancer.engine.describe(
        [{"input_ids": torch.arange(3)}], None, None, None, 3
    )
    assert plain["parts"] is None
    older = encode(header, table).replace(b'"wire": 2', b'"wire": 1')
    with pytest.raises(ValueError, match="rank 2 speaks wire format 1, this rank 2"):
        decode(older, 2)


def test_the_gather_concatenates_every_ranks_parts_in_rank_order() -> None:
    rebalancer = Rebalancer(**OPTIONS)
    inputs = [(_samples(p), p) for p in RANK_PARTS]
    inputs[1] = ([], None)  # a rank without samples may pass no parts
    batches = _gather_everywhere(rebalancer, inputs)
    expected = SampleParts.concatenate([RANK_PARTS[0], RANK_PARTS[2]])
    assert expected.tokens.tolist() == [18, 20, 5, 14, 7]
    assert expected.image_sample.tolist() == [0, 0, 3]
    for batch in batches:
        assert batch.parts == expected
        assert batch.counts.tolist() == [2, 0, 3]
        assert batch.rows[:, 0].tolist() == expected.tokens.tolist()
        assert batch.rows[:, 1].tolist() == expected.vision_patches.tolist()
        plan = rebalancer.engine.plan(batch, 3)
        reference = plan_step(expected, 3, rebalancer.options.replace(allow_empty=True))
        assert [[mb.tolist() for mb in r] for r in plan.ranks] == [
            [mb.tolist() for mb in r] for r in reference.ranks
        ]
        assert plan.vision_patches.tolist() == expected.vision_patches.tolist()
    # Without parts anywhere, nothing changes: no parts in the batch.
    plain = _gather_everywhere(rebalancer, [(_samples(p), None) for p in RANK_PARTS])
    assert all(batch.parts is None for batch in plain)
    # No samples anywhere: parts were passed, so there are (empty) parts.
    empty = _gather_everywhere(rebalancer, [([], RANK_PARTS[1])] * 3)
    assert all(batch.parts is not None and len(batch.parts) == 0 for batch in empty)


def test_ranks_that_disagree_on_passing_parts_raise_the_same_error() -> None:
    rebalancer = Rebalancer(**OPTIONS)
    inputs = [(_samples(p), p) for p in RANK_PARTS]
    inputs[2] = (_samples(RANK_PARTS[2]), None)
    errors = _gather_everywhere(rebalancer, inputs)
    assert all(isinstance(e, ValueError) for e in errors)
    assert {str(e) for e in errors} == {
        "ranks disagree on passing parts: rank(s) [0] passed parts, rank(s) [2] did not; "
        "every rank with samples passes parts, or none does"
    }
    other_merge = SampleParts(tokens=[3], spatial_merge_size=1)
    inputs[2] = (_samples(other_merge), other_merge)
    rebalancer = Rebalancer(length_key="input_ids")
    errors = _gather_everywhere(rebalancer, inputs)
    assert {str(e) for e in errors} == {
        "the ranks' parts cannot be planned together: parts disagree on spatial_merge_size: [1, 2]"
    }


@pytest.mark.parametrize(
    ("parts", "options", "message"),
    [
        (
            SampleParts.from_grid_thw(
                [10, 3], [[1, 4, 4], [2, 2, 4]], [0, 0], spatial_merge_size=2
            ),
            {},
            "parts.tokens[1] = 3, but samples[1] has 20 tokens (field 'input_ids'): parts must "
            "describe this rank's samples, in order",
        ),
        (
            SampleParts(tokens=[18], spatial_merge_size=2),
            {},
            "parts hold 1 samples, but this rank passed 2: one entry per local sample, in order",
        ),
        (
            [18, 20],
            {},
            "parts must be a SampleParts (one entry per local sample) or None, got list",
        ),
        (
            RANK_PARTS[0],
            {"max_vision_patches": 20},
            "samples[0] has 32 vision patches, over max_vision_patches = 20 (1 of this rank's "
            "samples are); pass allow_oversize=True",
        ),
        (
            RANK_PARTS[0],
            {"max_tokens": 19},
            "samples[1] has 20 tokens (field 'input_ids'), over max_tokens = 19 (1 of",
        ),
        (
            RANK_PARTS[0],
            {"cost": "flops"},
            "cost 'flops:qwen3-8b' sees token counts only and would ignore the parts' images",
        ),
    ],
)
def test_a_bad_local_input_is_named_by_rank_and_local_index(parts, options, message) -> None:
    rebalancer = Rebalancer(**{**OPTIONS, **options})
    text_only = SampleParts(tokens=[5, 6], spatial_merge_size=2)
    good = (_samples(text_only), text_only)
    errors = _gather_everywhere(rebalancer, [good, (_samples(RANK_PARTS[0]), parts)])
    assert all(isinstance(e, ValueError) for e in errors)
    assert {str(e).startswith(f"rank 1: {message}") for e in errors} == {True}, errors[0]


def test_a_patch_cap_without_parts_is_refused_on_every_rank() -> None:
    rebalancer = Rebalancer(**OPTIONS, max_vision_patches=40)
    batches = _gather_everywhere(rebalancer, [(_samples(p), None) for p in RANK_PARTS])
    for batch in batches:
        with pytest.raises(ValueError, match="max_vision_patches = 40 needs the samples' images"):
            rebalancer.engine.plan(batch, 3)


def test_an_oversize_sample_with_allow_oversize_is_planned_alone() -> None:
    rebalancer = Rebalancer(**OPTIONS, max_vision_patches=20, allow_oversize=True)
    batches = _gather_everywhere(rebalancer, [(_samples(p), p) for p in RANK_PARTS])
    plan = rebalancer.engine.plan(batches[0], 3)
    alone = [mb.tolist() for r in plan.ranks for mb in r if 0 in mb]
    assert alone == [[0]]  # 32 patches, over the 20-patch cap: a micro-batch of its own
