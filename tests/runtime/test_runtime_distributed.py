"""Real multi-process checks of the Rebalancer and TorchFlopsMeter (gloo, CPU, spawned ranks).

Each launch starts ``world_size`` fresh processes with a FileStore in ``tmp_path``; every rank
runs a worker function of this module and saves what it saw with ``torch.save``; the parent
checks the results against a single-process reference computed here. The happy-path scenarios
share one launch (process start-up dominates the runtime on a small machine).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import count_exchanges, launch, mark_done, ok, stay_stuck  # noqa: E402

from seqbalance.plan import plan_step  # noqa: E402
from seqbalance.runtime import CollectiveError, Rebalancer  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORLD = 3
COUNTS = (5, 0, 9)  # rank 1 starts empty: incomplete and empty local batches
PLAN_OPTIONS = {"max_tokens": 96}


def _sample(rank: int, index: int) -> dict[str, torch.Tensor]:
    """Sample ``index`` of ``rank``: several fields and dtypes, first dimension = length."""
    generator = torch.Generator().manual_seed(1000 * rank + index)
    length = int(torch.randint(1, 60, (1,), generator=generator))
    return {
        "input_ids": torch.randint(0, 50_000, (length,), generator=generator),
        "logprobs": torch.randn(length, generator=generator),
        "hidden": torch.randn(length, 3, generator=generator).to(torch.bfloat16),
        "mask": torch.rand(length, generator=generator) > 0.5,
        "reward": torch.randn(1, generator=generator, dtype=torch.float64),
    }


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _happy_paths(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    local = [_sample(rank, i) for i in range(COUNTS[rank])]
    rebalancer = Rebalancer(timeout=20.0, length_key="input_ids", **PLAN_OPTIONS)
    result = rebalancer.rebalance(local)
    out["list"] = {
        "microbatches": result.microbatches,
        "origin": result.origin,
        "global_indices": [mb.tolist() for mb in result.global_indices],
        "plan": [[mb.tolist() for mb in r] for r in result.plan.ranks],
        "plan_rank": result.plan_rank,
        "sent": result.sent_samples,
        "received": result.received_samples,
    }
    # Per-token outputs (variable first dim) and one row per sample.
    flat = [s for mb in result.microbatches for s in mb]
    per_token = [
        s["input_ids"].double() + 1e6 * float(o[0])
        for s, o in zip(flat, result.origin, strict=True)
    ]
    rows = torch.tensor([[int(o[0]), int(o[1])] for o in result.origin], dtype=torch.int64).reshape(
        -1, 2
    )
    out["restored_tokens"] = result.restore(per_token)
    out["restored_rows"] = result.restore(rows)

    # Packed input: one tensor per field + cu_seqlens; rank 1 passes an empty pack.
    lengths = [s["input_ids"].shape[0] for s in local]
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    packed = {
        "input_ids": torch.cat([s["input_ids"] for s in local])
        if local
        else torch.zeros(0, dtype=torch.int64),
        "hidden": torch.cat([s["hidden"] for s in local])
        if local
        else torch.zeros(0, 3, dtype=torch.bfloat16),
    }
    packed_result = rebalancer.rebalance(packed, cu_seqlens=cu)
    out["packed"] = {
        "microbatches": packed_result.microbatches,
        "origin": packed_result.origin,
    }

    # Nobody has anything: an empty step on every rank.
    empty = rebalancer.rebalance([])
    out["empty"] = (len(empty.microbatches), empty.num_samples, empty.restore([]))

    # Groups stay together; fewer samples than ranks leaves some ranks empty.
    grouped = [{"input_ids": torch.arange(10 + i)} for i in range(4)]
    group_result = rebalancer.rebalance(grouped, groups=[rank, rank, 7, 7])
    out["groups"] = group_result.origin.tolist()
    tiny = [{"input_ids": torch.arange(5)}] if rank == 0 else []
    tiny_result = rebalancer.rebalance(tiny)
    out["tiny"] = (
        tiny_result.num_samples,
        tiny_result.restore(torch.ones(tiny_result.num_samples, 2)),
    )

    # A bad input on one rank becomes the same ValueError on every rank (no hang).
    bad = (
        [{"input_ids": torch.zeros(3, dtype=torch.int64)}] if rank != 2 else [{"x": torch.ones(2)}]
    )
    try:
        rebalancer.rebalance(bad)
        out["mismatch"] = None
    except ValueError as error:
        out["mismatch"] = str(error)

    # The FLOPs meter: each rank adds its packed micro-batches, one all_reduce per interval.
    from seqbalance.runtime.flops import TorchFlopsMeter

    meter = TorchFlopsMeter(_toy_spec(), peak_flops_per_s=1e12)
    padded = torch.tensor([0, 5, 9, -1, -1], dtype=torch.int32)
    meter.add(padded, valid=torch.argmin(padded))
    meter.add(lengths=torch.tensor([rank + 1]))
    report = meter.report(2.0)
    out["flops"] = report
    return out


def _toy_spec() -> Any:
    from seqbalance.measure.toy_model import TinyCausalTransformer

    return TinyCausalTransformer().model_spec()


@pytest.fixture(scope="module")
def happy(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("happy"), WORLD, _happy_paths))


def _reference() -> tuple[list[dict[str, torch.Tensor]], np.ndarray, Any]:
    samples = [_sample(r, i) for r in range(WORLD) for i in range(COUNTS[r])]
    lengths = np.array([s["input_ids"].shape[0] for s in samples])
    return samples, lengths, plan_step(lengths, WORLD, **PLAN_OPTIONS)


def test_plan_is_identical_on_every_rank_and_matches_single_process(happy: list) -> None:
    _, _, reference = _reference()
    expected = [[mb.tolist() for mb in r] for r in reference.ranks]
    for result in happy:
        assert result["list"]["plan"] == expected
    slots = sorted(result["list"]["plan_rank"] for result in happy)
    assert slots == list(range(WORLD))
    for result in happy:
        assert result["list"]["global_indices"] == expected[result["list"]["plan_rank"]]


def test_exchanged_tensors_are_bit_identical(happy: list) -> None:
    samples, _, _ = _reference()
    offsets = np.concatenate([[0], np.cumsum(COUNTS)])
    seen = []
    for result in happy:
        flat = [s for mb in result["list"]["microbatches"] for s in mb]
        assert len(flat) == len(result["list"]["origin"])
        for sample, (origin_rank, origin_index) in zip(flat, result["list"]["origin"], strict=True):
            expected = samples[offsets[origin_rank] + origin_index]
            assert list(sample) == list(expected)
            for name, tensor in sample.items():
                assert tensor.dtype == expected[name].dtype
                assert tensor.shape == expected[name].shape
                assert _bits(tensor) == _bits(expected[name]), name
            seen.append((int(origin_rank), int(origin_index)))
    assert sorted(seen) == [(r, i) for r in range(WORLD) for i in range(COUNTS[r])]


def test_only_samples_that_change_rank_travel(happy: list) -> None:
    moved = sum(
        int((result["list"]["origin"][:, 0] != rank).sum()) for rank, result in enumerate(happy)
    )
    assert sum(r["list"]["sent"] for r in happy) == moved
    assert sum(r["list"]["received"] for r in happy) == moved
    for rank, result in enumerate(happy):
        assert result["list"]["received"] == int((result["list"]["origin"][:, 0] != rank).sum())


def test_restore_returns_outputs_in_original_order(happy: list) -> None:
    for rank, result in enumerate(happy):
        local = [_sample(rank, i) for i in range(COUNTS[rank])]
        restored = result["restored_tokens"]
        assert len(restored) == len(local)
        for sample, output in zip(local, restored, strict=True):
            assert torch.equal(output, sample["input_ids"].double() + 1e6 * rank)
        rows = result["restored_rows"]
        assert rows.dtype == torch.int64
        assert rows.tolist() == [[rank, i] for i in range(COUNTS[rank])]


def test_packed_input_is_repacked_per_microbatch(happy: list) -> None:
    samples, _, _ = _reference()
    offsets = np.concatenate([[0], np.cumsum(COUNTS)])
    for result in happy:
        origin = result["packed"]["origin"]
        position = 0
        for fields, cu in result["packed"]["microbatches"]:
            assert cu.dtype == torch.int32
            members = origin[position : position + len(cu) - 1]
            position += len(cu) - 1
            expected = [samples[offsets[r] + i] for r, i in members]
            assert cu.tolist() == [0, *np.cumsum([s["input_ids"].shape[0] for s in expected])]
            for name in ("input_ids", "hidden"):
                assert _bits(fields[name]) == _bits(torch.cat([s[name] for s in expected]))
        assert position == len(origin)


def test_groups_stay_on_one_rank(happy: list) -> None:
    holder = {}
    for rank, result in enumerate(happy):
        for origin_rank, index in result["groups"]:
            group = origin_rank if index < 2 else 7
            holder.setdefault(group, set()).add(rank)
    assert sorted(holder) == [0, 1, 2, 7]
    assert all(len(ranks) == 1 for ranks in holder.values())


def test_fewer_samples_than_ranks(happy: list) -> None:
    assert sorted(result["tiny"][0] for result in happy) == [0, 0, 1]
    assert happy[0]["tiny"][1].tolist() == [[1.0, 1.0]]
    assert all(result["tiny"][1].shape[0] == 0 for result in happy[1:])


def test_all_ranks_empty(happy: list) -> None:
    for result in happy:
        assert result["empty"] == (0, 0, [])


def test_bad_input_on_one_rank_raises_the_same_error_everywhere(happy: list) -> None:
    messages = [result["mismatch"] for result in happy]
    assert messages[0] is not None
    assert "disagree on sample fields" in messages[0]
    assert messages == [messages[0]] * WORLD


def test_flops_meter_reduces_over_the_group(happy: list) -> None:
    from seqbalance.cost import FlopsModel

    model = FlopsModel(_toy_spec())
    per_rank = [model.per_sample([5, 4]).sum() + model.per_sample([r + 1]).sum() for r in range(3)]
    for result in happy:
        report = result["flops"]
        assert (report.dp_size, report.num_gpus) == (WORLD, WORLD)
        assert report.total_flops == pytest.approx(sum(per_rank), rel=1e-12)
        assert report.tokens == 3 * 9 + 1 + 2 + 3
        assert report.tflops_per_gpu == pytest.approx(sum(per_rank) / 2.0 / WORLD / 1e12)
        assert report.mfu == pytest.approx(report.tflops_per_gpu)


def _tensor_parallel_pair(rank: int, world_size: int) -> dict[str, Any]:
    """Two ranks forming one TP=2 replica: both add the same micro-batches, as TP ranks do."""
    from seqbalance.runtime.flops import TorchFlopsMeter

    def interval(**layout: Any) -> Any:
        meter = TorchFlopsMeter(_toy_spec(), peak_flops_per_s=1e12, timeout=20.0, **layout)
        meter.add(torch.tensor([0, 5, 9, 9, -1]), valid=4)  # sub-sequences of 5, 4 and 0 tokens
        meter.add(lengths=[6])
        return meter.report(2.0)

    dp_groups = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group
    return {
        "sizes": interval(tensor_parallel=2),
        "group": interval(group=dp_groups[rank], tensor_parallel=2, dp_size=1),
        "world_default": interval(),
    }


def test_flops_meter_at_tensor_parallel_2_reports_the_true_tflops(tmp_path: Path) -> None:
    from seqbalance.cost import FlopsModel

    results = [{"ok": out} for out in ok(launch(tmp_path, 2, _tensor_parallel_pair))]
    # The toy model (hidden 64, 2 layers, 4 heads of 16, SwiGLU 176, vocab 512) costs per token
    # 2·(2·(4·64² + 3·64·176) + 64·512) = 266,240 FLOPs and per causal pair 2·2·4·(16 + 16) = 512.
    # The replica trains sequences of 5, 4, 0 and 6 tokens: 15 tokens, 15 + 10 + 0 + 21 = 46
    # pairs; training is 3x forward.
    replica = 3 * (266_240 * 15 + 512 * 46)
    assert replica == 12_051_456
    assert FlopsModel(_toy_spec()).per_sample([5, 4, 0, 6]).sum() == replica
    # One replica on 2 GPUs for 2 s: replica / (2 s x 2 GPUs) per GPU.
    true_tflops = replica / 2.0 / 2 / 1e12
    for result in results:
        for name in ("sizes", "group"):
            report = result["ok"][name]
            assert (report.dp_size, report.num_gpus, report.tensor_parallel) == (1, 2, 2)
            assert report.total_flops == pytest.approx(replica, rel=1e-12)
            assert (report.tokens, report.samples) == (15, 4)
            assert report.tflops_per_gpu == pytest.approx(true_tflops, rel=1e-12)
            assert report.mfu == pytest.approx(true_tflops)
            assert report.tokens_per_s == 7.5
        # Not told about TP, the meter takes both ranks for replicas: 2x too high (the bug fixed).
        wrong = result["ok"]["world_default"]
        assert (wrong.dp_size, wrong.num_gpus) == (2, 2)
        assert wrong.tflops_per_gpu == pytest.approx(2 * true_tflops, rel=1e-12)


def _failing_rank(rank: int, world_size: int, exit_early: bool, directory: str) -> dict[str, Any]:
    rebalancer = Rebalancer(timeout=2.0)
    if rank == 1:
        if exit_early:
            raise RuntimeError("rank 1 failed before the collective")
        stay_stuck(directory, [0], limit_s=8)  # alive but never joins the collective
        return {}
    started = time.monotonic()
    try:
        rebalancer.rebalance([{"input_ids": torch.arange(4)}])
    except CollectiveError as error:
        return {"raised": str(error), "elapsed": time.monotonic() - started}
    finally:
        mark_done(directory, rank)
    return {"raised": None}


@pytest.mark.parametrize("exit_early", [False, True], ids=["peer-hangs", "peer-exits"])
def test_a_failing_rank_makes_the_others_raise_instead_of_hanging(
    tmp_path: Path, exit_early: bool
) -> None:
    results = launch(tmp_path, 2, _failing_rank, exit_early, str(tmp_path))
    survivor = results[0]["ok"]
    assert survivor["raised"] is not None
    assert "did not complete within 2 s" in survivor["raised"]
    # The peer would keep it waiting 8 s (or forever); the 2 s timeout must fire long before.
    assert survivor["elapsed"] < 7
    if exit_early:
        assert results[1]["type"] == "RuntimeError"


def _async_overlap(rank: int, world_size: int) -> dict[str, Any]:
    steps = [[_sample(10 * step + rank, i) for i in range(3 + 4 * rank)] for step in range(3)]
    # Reference: the same steps rebalanced synchronously on the world group.
    reference = [Rebalancer(timeout=20.0, **PLAN_OPTIONS).rebalance(s) for s in steps]
    group = dist.new_group(backend="gloo")
    rebalancer = Rebalancer(group, timeout=20.0, **PLAN_OPTIONS)
    futures = [rebalancer.rebalance_async(s) for s in steps]
    total = torch.ones(1)
    for _ in range(10):  # the training loop keeps using the world group meanwhile
        dist.all_reduce(total)
    results = [future.result(timeout=60) for future in futures]
    restored = results[0].restore(torch.from_numpy(results[0].origin))
    rebalancer.close()
    try:
        Rebalancer().rebalance_async([])
        needs_group = None
    except ValueError as error:
        needs_group = str(error)
    return {
        "same_origin": [
            r.origin.tolist() == ref.origin.tolist()
            for r, ref in zip(results, reference, strict=True)
        ],
        "same_bits": [
            [_bits(t) for mb in r.microbatches for s in mb for t in s.values()]
            == [_bits(t) for mb in ref.microbatches for s in mb for t in s.values()]
            for r, ref in zip(results, reference, strict=True)
        ],
        "restored": restored.tolist(),
        "reduced": float(total.item()),
        "needs_group": needs_group,
    }


def test_rebalance_async_overlaps_with_the_training_loops_collectives(tmp_path: Path) -> None:
    for rank, out in enumerate(ok(launch(tmp_path, 2, _async_overlap))):
        assert out["same_origin"] == [True] * 3
        assert out["same_bits"] == [True] * 3
        assert out["restored"] == [[rank, i] for i in range(3 + 4 * rank)]
        assert out["reduced"] == 2.0**10
        assert "dedicated process group" in out["needs_group"]


# Settings that differ between the two ranks: (rank 0's, rank 1's) Rebalancer keywords and the
# names the error must give.
DISAGREEMENTS = {
    "max_tokens": ({"max_tokens": 1000}, {"max_tokens": 2000}, ["max_tokens (1000 vs 2000)"]),
    "num_microbatches": (
        {"num_microbatches": 1},
        {"num_microbatches": 2},
        ["num_microbatches (1 vs 2)"],
    ),
    "cost": ({"cost": "tokens"}, {"cost": "flops"}, ['cost ("tokens" vs "flops")']),
    "keep_local": ({"keep_local": True}, {"keep_local": False}, ["keep_local (true vs false)"]),
    "length_key": ({}, {"length_key": "input_ids"}, ['length_key (null vs "input_ids")']),
}


def _nan_at_777(lengths: np.ndarray) -> np.ndarray:
    """A cost model that fails on one length (a user's cost function with a hole)."""
    return np.where(lengths == 777, np.nan, lengths.astype(float))


def _two_ranks(rank: int, world_size: int) -> dict[str, Any]:
    exchanges = count_exchanges()
    timeout = 20.0
    out: dict[str, Any] = {"disagree": {}}
    samples = [{"input_ids": torch.arange(100 + 10 * i + rank)} for i in range(3)]
    for name, settings in DISAGREEMENTS.items():
        rebalancer = Rebalancer(timeout=timeout, **settings[rank])
        try:
            rebalancer.rebalance(samples)
            out["disagree"][name] = None
        except ValueError as error:
            out["disagree"][name] = str(error)
    out["exchanges_before_agreement"] = list(exchanges)
    # The group is still healthy: agreeing ranks rebalance as usual.
    out["agreed"] = Rebalancer(timeout=timeout).rebalance(samples).num_samples

    # An incomplete batch: 2 + 1 samples of 900 tokens under a 1000-token cap need 2
    # micro-batches per rank, 4 slots for 3 samples.
    capped = Rebalancer(timeout=timeout, max_tokens=1000)
    incomplete = capped.rebalance([torch.zeros(900)] * (2 - rank))
    out["incomplete"] = (
        incomplete.num_samples,
        [len(mb) for mb in incomplete.microbatches],
        incomplete.plan.options.allow_empty,
        incomplete.plan.n_microbatches,
    )
    full = capped.rebalance([torch.zeros(900)] * 2)
    out["full"] = (full.plan.options.allow_empty, full.plan.n_microbatches)
    # A sample over the cap is named by its rank and local index.
    try:
        capped.rebalance([torch.zeros(500), torch.zeros(1200)] if rank == 1 else [])
        out["oversize"] = None
    except ValueError as error:
        out["oversize"] = str(error)

    # So is a sample whose cost the cost model rejects.
    try:
        Rebalancer(timeout=timeout, cost=_nan_at_777).rebalance(
            [torch.zeros(100), torch.zeros(777)] if rank == 1 else [torch.zeros(5)]
        )
        out["bad_cost"] = None
    except ValueError as error:
        out["bad_cost"] = str(error)

    # Samplers on a data-parallel group: here the two ranks are the tensor-parallel ranks of
    # one replica (dp_size 1), so each rank's data-parallel group holds only itself.
    from seqbalance.runtime import BalancedBatchSampler, LengthGroupedSampler

    dp_groups = [dist.new_group([0]), dist.new_group([1])]
    lengths = np.arange(1, 41)
    out["sampler_dp_group"] = list(BalancedBatchSampler(lengths, 8, group=dp_groups[rank]))
    out["sampler_global"] = list(BalancedBatchSampler(lengths, 8))
    out["grouped_dp_group"] = list(LengthGroupedSampler(lengths, 4, group=dp_groups[rank]))
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("two"), 2, _two_ranks))


@pytest.mark.parametrize("name", list(DISAGREEMENTS))
def test_ranks_that_disagree_on_settings_raise_before_any_data_moves(two_ranks, name) -> None:
    messages = [result["disagree"][name] for result in two_ranks]
    assert messages[0] is not None
    assert messages[0] == messages[1]  # the same ValueError on every rank
    prefix = "ranks 0 and 1 disagree on the Rebalancer's settings: "
    assert messages[0].startswith(prefix)
    listed = messages[0][len(prefix) :].split(". Construct the Rebalancer")[0]
    assert listed.split("; ") == DISAGREEMENTS[name][2]  # exactly the differing settings
    for result in two_ranks:
        assert result["exchanges_before_agreement"] == []
        assert result["agreed"] == 3


def test_an_incomplete_batch_leaves_slots_empty_without_being_asked(two_ranks) -> None:
    counts = [result["incomplete"][0] for result in two_ranks]
    assert sorted(counts) == [1, 2]
    for result in two_ranks:
        _, sizes, allow_empty, m = result["incomplete"]
        assert (allow_empty, m) == (True, 2)
        assert len(sizes) == 2 and sum(sizes) == result["incomplete"][0]
        # A complete batch is planned with the options as given.
        assert result["full"] == (False, 2)


def test_an_oversize_sample_is_named_by_its_rank_and_local_index(two_ranks) -> None:
    messages = [result["oversize"] for result in two_ranks]
    assert messages[0] == messages[1]
    assert messages[0].startswith("rank 1: samples[1] has 1200 tokens")
    assert "max_tokens = 1000" in messages[0]
    costs = [result["bad_cost"] for result in two_ranks]
    assert costs[0] == costs[1] == "rank 1: cost(lengths)[1] = nan is not finite"


def test_samplers_on_a_data_parallel_group_give_tensor_parallel_peers_the_same_data(
    two_ranks,
) -> None:
    for key in ("sampler_dp_group", "grouped_dp_group"):
        assert two_ranks[0][key] == two_ranks[1][key]  # same replica, same samples
        assert sorted(i for batch in two_ranks[0][key] for i in batch) == list(range(40))
    # The global default splits the replica's data between its two TP ranks: wrong under TP.
    split = [{i for batch in result["sampler_global"] for i in batch} for result in two_ranks]
    assert not split[0] & split[1] and len(split[0] | split[1]) == 40


# ---------------------------------------------------------------------- samples with images
IMAGE_COUNTS = (6, 0, 9)  # rank 1 has no samples and passes no parts
IMAGE_OPTIONS = {"max_tokens": 110, "max_vision_patches": 80}


def _image_rank(rank: int) -> tuple[list[dict[str, torch.Tensor]], Any]:
    """Rank ``rank``'s image samples: ``input_ids`` and ``pixel_values`` (one row per patch,
    ``[rank, sample, image, row]``: every row says where it belongs) and their parts."""
    from _parts import image_parts

    rng = np.random.default_rng(50 + rank)
    parts = image_parts(rng, rng.integers(1, 60, IMAGE_COUNTS[rank]), max_images=2)
    samples = []
    for i in range(len(parts)):
        rows = [
            torch.tensor([[rank, i, k, row] for row in range(int(np.prod(grid)))])
            for k, grid in enumerate(parts.grid_thw[parts.image_sample == i])
        ]
        samples.append(
            {
                "input_ids": torch.arange(int(parts.tokens[i])),
                "pixel_values": torch.cat(rows).float() if rows else torch.zeros(0, 4),
            }
        )
    return samples, parts


def _image_steps(rank: int, world_size: int) -> dict[str, Any]:
    from _parts import TINY_VLM

    samples, parts = _image_rank(rank)
    rebalancer = Rebalancer(timeout=20.0, length_key="input_ids", cost=TINY_VLM, **IMAGE_OPTIONS)
    result = rebalancer.rebalance(samples, parts=parts if samples else None)
    flat = [s for mb in result.microbatches for s in mb]
    per_token = [
        s["input_ids"].double() + 1e6 * float(o[0])
        for s, o in zip(flat, result.origin, strict=True)
    ]
    out: dict[str, Any] = {
        "microbatches": result.microbatches,
        "parts": [p.to_dict() for p in result.parts],
        "global_indices": [mb.tolist() for mb in result.global_indices],
        "origin": result.origin,
        "restored": result.restore(per_token),
    }
    # Rank 2 forgets its parts: the same ValueError everywhere, before anything moves.
    try:
        rebalancer.rebalance(samples, parts=parts if rank != 2 else None)
        out["disagree"] = None
    except ValueError as error:
        out["disagree"] = str(error)
    return out


def test_image_samples_rebalance_under_a_patch_cap(tmp_path: Path) -> None:
    from seqbalance.cost import SampleParts

    results = ok(launch(tmp_path, WORLD, _image_steps))
    ranks = [_image_rank(rank) for rank in range(WORLD)]
    combined = SampleParts.concatenate([parts for _, parts in ranks if len(parts)])
    # Both caps bind: without either, some micro-batch would exceed it.
    for cap in ("max_tokens", "max_vision_patches"):
        loose = plan_step(combined, WORLD, cost="tokens", **{**IMAGE_OPTIONS, cap: None})
        over = [
            int(loose.lengths[mb].sum()) > 110 or int(loose.vision_patches[mb].sum()) > 80
            for r in loose.ranks
            for mb in r
        ]
        assert any(over), cap
    seen = []
    for rank, out in enumerate(results):
        assert len(out["parts"]) == len(out["microbatches"]) == len(out["global_indices"])
        position = 0
        for batch, data, indices in zip(
            out["microbatches"], out["parts"], out["global_indices"], strict=True
        ):
            parts = SampleParts.from_dict(data)
            assert parts == combined.take(indices)  # the micro-batch's samples, in order
            tokens = [s["input_ids"].shape[0] for s in batch]
            pixels = [s["pixel_values"].shape[0] for s in batch]
            assert parts.tokens.tolist() == tokens
            assert parts.vision_patches.tolist() == pixels
            assert sum(tokens) <= 110 and sum(pixels) <= 80  # both caps, from what arrived
            for k, sample in enumerate(batch):
                origin_rank, origin_index = out["origin"][position + k].tolist()
                rows = sample["pixel_values"]
                assert (rows[:, :2] == torch.tensor([origin_rank, origin_index])).all()
                # The sample's images, in order: grid_thw rows match its pixel rows.
                grids = parts.grid_thw[parts.image_sample == k]
                expected = [j for j, grid in enumerate(grids) for _ in range(int(np.prod(grid)))]
                assert rows[:, 2].long().tolist() == expected
                seen.append((origin_rank, origin_index))
            position += len(batch)
        assert position == out["origin"].shape[0]
        # Outputs go back to their origin, in origin order.
        local, _ = ranks[rank]
        assert len(out["restored"]) == len(local)
        for sample, restored in zip(local, out["restored"], strict=True):
            assert torch.equal(restored, sample["input_ids"].double() + 1e6 * rank)
    assert sorted(seen) == [(r, i) for r in range(WORLD) for i in range(IMAGE_COUNTS[r])]
    messages = {out["disagree"] for out in results}
    assert messages == {
        "ranks disagree on passing parts: rank(s) [0] passed parts, rank(s) [2] did not; "
        "every rank with samples passes parts, or none does"
    }
