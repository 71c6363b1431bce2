"""Context-parallel executor on real gloo processes: loss and gradients equal one process.

The plans: every strategy's, hand-made overlapping groups, and random plans and assignments
with tiny samples, so that some members hold no token of their sample's shard (they must still
join every collective of their group, or their peers wait until the timeout).

Each launch (``seqbalance.measure.launch``) starts ``world_size`` processes that run every plan
of the scenario with the toy transformer in float64 and return the step loss and gradients; the
parent compares them with one process running all samples whole.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cp import CP_STRATEGIES, plan_cp
from _multiprocess import launch, mark_done, ok, stay_stuck

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel  # noqa: E402
from seqbalance.measure.calibrate_context_parallel import (  # noqa: E402
    calibrate_cost_model,
    measure_slot_timings,
)
from seqbalance.measure.toy_model import TinyCausalTransformer, ToyModelConfig  # noqa: E402
from seqbalance.plan import PlanOptions, plan_step  # noqa: E402
from seqbalance.plan.context_parallel import (  # noqa: E402
    ContextParallel,
    ContextParallelPlan,
)
from seqbalance.runtime import CollectiveError  # noqa: E402
from seqbalance.runtime.context_parallel import (  # noqa: E402
    ContextParallelGroups,
    SlotBatch,
    run_step,
    slot_batch,
)

pytestmark = pytest.mark.multiprocess

LAUNCH_TIMEOUT_S = 150.0
CONFIG = ToyModelConfig(
    vocab_size=61, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24
)
CAP = 24  # tokens per rank and slot
OPTIONS = ContextParallel(comm=CommModel())
ASSIGNED = PlanOptions(cost="flops", max_tokens=CAP, context_parallel=OPTIONS, allow_empty=True)
"""The request of the hand-made assignments (``ContextParallelPlan.from_assignment``)."""
TIMEOUT = 30.0  # seconds any collective may wait
FORWARD = TinyCausalTransformer.slot_logits


# ------------------------------------------------------------------ the computation
def _samples(lengths: list[int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, CONFIG.vocab_size, (n,), generator=generator) for n in lengths]


def _model() -> TinyCausalTransformer:
    return TinyCausalTransformer(CONFIG, seed=3).to(torch.float64)


def _run_plans(rank: int, world_size: int, plans: list[str]) -> list[dict[str, Any]]:
    groups = ContextParallelGroups(timeout=TIMEOUT)
    out = []
    for index, text in enumerate(plans):
        plan = ContextParallelPlan.from_json(text)
        model = _model()
        step = run_step(
            model, plan, _samples(plan.lengths.tolist()), groups, forward=FORWARD, timeout=TIMEOUT
        )
        assert step.slot_seconds > 0 and step.sync_seconds > 0
        assert len(step.slot_cpu_seconds) == plan.n_slots and min(step.slot_cpu_seconds) >= 0
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        out.append({"loss": step.loss, "grads": grads})
        if index == 0:  # gradient accumulation: the same step again, .grad not zeroed
            out[-1].update(_accumulated(model, plan, groups))
    return out


def _accumulated(model: Any, plan: ContextParallelPlan, groups: Any) -> dict[str, Any]:
    """``plan``'s step run again on ``model`` without zero_grad: the gradients then, and
    whether the held ones stayed in place while the slots ran (no second copy, review19)."""
    held = {n: p.grad.data_ptr() for n, p in model.named_parameters()}
    seen = []

    def forward(model: Any, *args: Any) -> Any:
        seen.append(all(p.grad.data_ptr() == held[n] for n, p in model.named_parameters()))
        return FORWARD(model, *args)

    samples = _samples(plan.lengths.tolist())
    run_step(model, plan, samples, groups, forward=forward, timeout=TIMEOUT)
    return {
        "accumulated": {n: p.grad for n, p in model.named_parameters()},
        "accumulated in place": bool(seen) and all(seen),
    }


def _reference(lengths: list[int]) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, every sample whole in one packed batch: mean loss over labelled tokens."""
    samples = _samples(lengths)
    ids = torch.cat(samples)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    labels = torch.cat(
        [torch.cat([s[1:], torch.tensor([-100])]) if s.numel() else s for s in samples]
    )
    model = _model()
    loss = model(ids, cu, labels)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


# ------------------------------------------------------------------ scenarios
LENGTHS_2 = [37, 9, 20, 5, 45, 3, 12, 1, 0, 30]
LENGTHS_4 = [90, 37, 9, 20, 5, 45, 3, 12, 1, 70, 26, 0, 48, 16]


def _plans(lengths: list[int], world_size: int) -> list[ContextParallelPlan]:
    plans = [
        plan_cp(
            lengths,
            world_size,
            max_tokens=CAP,
            context_parallel=OPTIONS,
            strategy=strategy,
            allow_empty=True,
        )
        for strategy in CP_STRATEGIES
    ]
    contiguous = dataclasses.replace(OPTIONS, scheme="contiguous")
    plans.append(plan_cp(lengths, world_size, max_tokens=CAP, context_parallel=contiguous))
    return plans


def _overlapping_groups_plan() -> ContextParallelPlan:
    """Slot 0 mixes a CP-4 sample, a CP-2 sample on ranks 0-1 and a whole sample on rank 3;
    slot 1 a CP-2 sample on ranks 2-3 and whole samples: ranks 0 and 1 gather over two
    different groups in one slot."""
    return ContextParallelPlan.from_assignment(
        [40, 20, 6, 30, 5, 7],
        4,
        ASSIGNED,
        cp_size=[4, 2, 1, 2, 1, 1],
        group_start=[0, 0, 3, 2, 0, 1],
        slot_of=[0, 0, 0, 1, 1, 1],
    )


@pytest.mark.parametrize(("world_size", "lengths"), [(2, LENGTHS_2), (4, LENGTHS_4)])
def test_loss_and_gradients_match_one_process(
    tmp_path: Path, world_size: int, lengths: list[int]
) -> None:
    plans = _plans(lengths, world_size)
    if world_size == 4:
        plans.append(_overlapping_groups_plan())
        assert {int(c) for p in plans for c in p.cp_size} == {1, 2, 4}
    assert any(p.barriers for p in plans)  # the Megatron plan's barriers run too
    assert all((p.cp_size > 1).any() for p in plans)
    # Random plans and assignments in the same launch, tiny and zero-share cases included.
    plans += _random_plans(world_size, seed=world_size)
    starved = 0  # pieces of sharded samples with tokens whose member holds none of them
    for plan in plans:
        for r in range(plan.n_ranks):
            for j in range(plan.n_slots):
                inputs = plan.slot_inputs(r, j)
                none = (inputs.cp_sizes > 1) & (np.diff(inputs.cu_seqlens) == 0)
                starved += int((none & (plan.lengths[inputs.samples] > 0)).sum())
    assert starved >= 3  # the cases that used to deadlock are there
    texts = [p.to_json() for p in plans]
    results = ok(launch(tmp_path, world_size, _run_plans, texts, timeout_s=LAUNCH_TIMEOUT_S))
    for index, plan in enumerate(plans):
        loss, grads = _reference(plan.lengths.tolist())
        for result in results:
            outcome = result[index]
            assert outcome["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-15), index
            for name, grad in grads.items():
                torch.testing.assert_close(outcome["grads"][name], grad, rtol=1e-10, atol=1e-12)
                if index == 0:  # run twice without zero_grad: twice the gradient (adv19d M1)
                    assert outcome["accumulated in place"]  # no second gradient copy (review19)
                    torch.testing.assert_close(
                        outcome["accumulated"][name], 2 * grad, rtol=1e-10, atol=1e-12
                    )


def _random_assignment(rng: np.random.Generator, world_size: int) -> ContextParallelPlan:
    """Random lengths (many tiny: members with no token of their sample's shard), random CP
    sizes, blocks and slots under a cap no slot can reach (so every draw is a valid plan)."""
    n = int(rng.integers(1, 7))
    lengths = np.where(rng.random(n) < 0.5, rng.integers(0, 6, n), rng.integers(6, 40, n))
    lengths[0] = max(lengths[0], 2)  # a labelled token: the reference loss is a mean
    sizes = [s for s in (1, 2, 4) if world_size % s == 0]
    cp_size = rng.choice(sizes, n)
    start = np.array([int(rng.integers(0, world_size // c)) * c for c in cp_size.tolist()])
    slot_of = rng.integers(0, 3, n)
    cp = ContextParallel(sizes=tuple(sizes), comm=CommModel())
    return ContextParallelPlan.from_assignment(
        lengths,
        world_size,
        ASSIGNED.replace(max_tokens=4096, context_parallel=cp),
        cp_size=cp_size,
        group_start=start,
        slot_of=slot_of,
    )


def _random_plans(world_size: int, seed: int) -> list[ContextParallelPlan]:
    """Random plans of every strategy, random assignments, and the zero-share cases: a
    2- and a 3-token sample over 4 ranks (``validate()`` accepts them; a member holds no
    token of its shard)."""
    rng = np.random.default_rng(seed)
    plans = []
    sizes = (1, 2, 4)[: 2 if world_size == 2 else 3]
    for k in range(4):
        n = int(rng.integers(1, 9))
        tiny = k % 2 == 0
        lengths = rng.integers(0, 6, n) if tiny else rng.integers(1, 60, n)
        lengths[0] = max(lengths[0], 2)  # a labelled token: the reference loss is a mean
        cap = int(rng.integers(2, 8)) if tiny else int(rng.integers(16, 40))
        options = ContextParallel(sizes=sizes, comm=CommModel())
        cap = max(cap, -(-int(lengths.max()) // sizes[-1]))
        strategy = CP_STRATEGIES[k % len(CP_STRATEGIES)]
        plans.append(
            plan_cp(
                lengths,
                world_size,
                max_tokens=cap,
                context_parallel=options,
                strategy=strategy,
                allow_empty=True,
            )
        )
    plans += [_random_assignment(rng, world_size) for _ in range(4)]
    zero_share = ASSIGNED.replace(
        max_tokens=4096, context_parallel=ContextParallel(sizes=(world_size,), comm=CommModel())
    )
    plans.append(plan_step([2, 3], world_size, zero_share))
    plans.append(
        ContextParallelPlan.from_assignment(
            [1, 2, 0, 5, 1, 1],
            world_size,
            zero_share,
            cp_size=[world_size] * 6,
            group_start=[0] * 6,
            slot_of=[0, 0, 1, 1, 2, 3],
        )
    )
    return plans


def test_slot_batch_labels_cross_shards() -> None:
    # Sample 0 (10 tokens) on CP 2: rank 0 holds [0, 3) and [8, 10); the label of token 2 is
    # token 3, held by rank 1; the last token has no label.
    plan = plan_cp(
        [10, 4], 2, max_tokens=7, context_parallel=ContextParallel(sizes=(2,)), strategy="static_cp"
    )
    samples = [torch.arange(100, 110), torch.arange(200, 204)]
    batch = slot_batch(plan, 0, 0, samples)
    assert batch.input_ids.tolist() == [100, 101, 102, 108, 109, 200, 203]
    assert batch.labels.tolist() == [101, 102, 103, 109, -100, 201, -100]
    assert batch.position_ids.tolist() == [0, 1, 2, 8, 9, 0, 3]
    with pytest.raises(ValueError, match="samples holds 1 samples"):
        slot_batch(plan, 0, 0, samples[:1])
    with pytest.raises(ValueError, match=r"tokens\[1\] \(sample 1\) has shape \(3,\)"):
        slot_batch(plan, 0, 0, [samples[0], samples[1][:3]])
    # The same from the slot's inputs and its pieces' whole samples (what a sampler feeds).
    inputs = plan.slot_inputs(0, 0)
    again = SlotBatch.of(inputs, samples)
    assert again.input_ids.tolist() == batch.input_ids.tolist()
    assert again.labels.tolist() == batch.labels.tolist()
    with pytest.raises(ValueError, match="tokens holds 1 samples, the slot has 2 pieces"):
        SlotBatch.of(inputs, samples[:1])


def test_slot_batch_reads_the_token_ids_check_once(monkeypatch) -> None:
    # mend13 M2: the id check read one flag per sample (a device-to-host sync each on a GPU);
    # now one for all samples. Ids of every integer dtype pass; the first sample in error is
    # named, whether its ids or its shape are wrong.
    lengths = [10, 4, 7, 3]
    plan = plan_cp(
        lengths,
        2,
        max_tokens=64,
        context_parallel=ContextParallel(sizes=(2,)),
        strategy="static_cp",
    )
    assert plan.slot_inputs(0, 0).lengths.tolist() == lengths
    reads = []
    bool_of = torch.Tensor.__bool__
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append(1) or bool_of(t))
    dtypes = [torch.int8, torch.int32, torch.uint64, torch.int64]
    batch = slot_batch(
        plan, 0, 0, [torch.arange(n).to(d) for n, d in zip(lengths, dtypes, strict=True)]
    )
    assert len(reads) == 1
    assert batch.input_ids.dtype == torch.int64
    for dtype in (torch.uint8, torch.uint16, torch.uint32):  # no id of theirs is looked at
        reads.clear()
        slot_batch(plan, 0, 0, [torch.arange(n).to(dtype) for n in lengths])
        assert reads == []
    beyond = torch.tensor([5, 6, 2**63 - 3]).neg().view(torch.uint64)  # 2**64 - 5, ...
    negative = torch.tensor([1, 2, -3, 4])
    samples = [torch.arange(n) for n in lengths]
    with pytest.raises(
        ValueError,
        match=r"tokens\[3\] \(sample 3\) holds the token id 18446744073709551611 at position 0",
    ):
        slot_batch(plan, 0, 0, [*samples[:3], beyond])
    with pytest.raises(ValueError, match=r"tokens\[1\] .* id -3 at position 2: token ids must"):
        slot_batch(plan, 0, 0, [samples[0], negative, samples[2][:2], samples[3]])
    with pytest.raises(ValueError, match=r"tokens\[1\] \(sample 1\) has shape \(3,\)"):
        slot_batch(plan, 0, 0, [samples[0], samples[1][:3], samples[2], negative[:3]])


def _step(plan: ContextParallelPlan, groups: ContextParallelGroups, timeout: float) -> None:
    """A fresh model through ``plan`` (the failure cases: nothing is compared)."""
    samples = _samples(plan.lengths.tolist())
    run_step(_model(), plan, samples, groups, forward=FORWARD, timeout=timeout)


def _disagreeing(rank: int, world_size: int, texts: list[str]) -> dict[str, Any]:
    groups = ContextParallelGroups(timeout=TIMEOUT)
    plan = ContextParallelPlan.from_json(texts[rank])
    try:
        _step(plan, groups, TIMEOUT)
    except ValueError as error:
        return {"raised": str(error)}
    return {"raised": None}


def _hanging_peer(rank: int, world_size: int, text: str, directory: str) -> dict[str, Any]:
    timeout = 2.0
    plan = ContextParallelPlan.from_json(text)
    groups = ContextParallelGroups(timeout=timeout)
    if rank == 1:
        groups.prepare(plan)  # joins the agreement and the group creation, then never gathers
        stay_stuck(directory, [0], limit_s=8)
        return {}
    started = time.monotonic()
    try:
        _step(plan, groups, timeout)
    except CollectiveError as error:
        return {"raised": str(error), "elapsed": time.monotonic() - started}
    finally:
        mark_done(directory, rank)
    return {"raised": None}


def test_failures_raise_instead_of_hanging(tmp_path: Path) -> None:
    one = plan_cp([30, 3], 2, max_tokens=CAP, context_parallel=OPTIONS).to_json()
    other = plan_cp([30, 4], 2, max_tokens=CAP, context_parallel=OPTIONS).to_json()
    for result in ok(launch(tmp_path / "disagree", 2, _disagreeing, [one, other])):
        assert "ranks disagree on the context-parallel plan" in result["raised"]
    survivor = ok(launch(tmp_path / "hang", 2, _hanging_peer, one, str(tmp_path / "hang")))[0]
    assert survivor["raised"] is not None and "K/V all-gather" in survivor["raised"]
    assert "did not complete within 2 s" in survivor["raised"]
    assert survivor["elapsed"] < 7  # the peer would keep it waiting 8 s


def _calibrate(rank: int, world_size: int) -> dict[str, Any]:
    groups = ContextParallelGroups(timeout=TIMEOUT)
    model = _model()
    try:
        calibrate_cost_model(
            model, groups, ContextParallel(sizes=(1, 4)), max_tokens=64, spec=model.model_spec()
        )
        refused = None
    except ValueError as error:
        refused = str(error)
    cost = calibrate_cost_model(
        model,
        groups,
        ContextParallel(sizes=(1, 2)),
        max_tokens=64,
        spec=model.model_spec(),
        forward=FORWARD,
        trials=4,
        repeats=1,
        timeout=TIMEOUT,
    )
    plan = plan_cp([30, 100, 7], 2, max_tokens=64, context_parallel=OPTIONS)
    seconds = measure_slot_timings(
        model, plan, groups, _samples(plan.lengths.tolist()), forward=FORWARD, repeats=2
    )
    return {"refused": refused, "cost": cost.to_json(), "seconds": seconds, "slots": plan.n_slots}


def test_calibration_gives_every_rank_the_same_model(tmp_path: Path) -> None:
    results = ok(launch(tmp_path, 2, _calibrate, timeout_s=LAUNCH_TIMEOUT_S))
    assert "no CP size > 1 that divides 2 ranks" in results[0]["refused"]
    assert results[0]["cost"] == results[1]["cost"]  # one fit of every rank's slots, everywhere
    cost = ContextParallelTimeModel.from_json(results[0]["cost"])
    assert cost.comm.bytes_per_element == 8  # the float64 model's K/V
    assert (cost.kv_elements_per_token, cost.kv_layers) == (32, 2)
    # 4 whole-sample micro-batches on 2 ranks: 2 plans, then 6 of one short sample per rank;
    # sharded over CP 2: 64 and 128 tokens in 1 .. 32 samples of >= 4 tokens: 5 + 6 plans, one
    # slot on each rank.
    assert cost.time.fit_stats.n_observations == 2 * (2 + 6 + 5 + 6)
    assert cost.time.fit_stats.mape < 1.0
    assert cost.slot_jitter == 0.0  # one repeat: no spread to estimate
    seconds = results[0]["seconds"]  # [repeats, ranks, slots], gathered from every rank
    np.testing.assert_array_equal(seconds, results[1]["seconds"])
    assert seconds.shape == (2, 2, results[0]["slots"]) and (seconds > 0).all()
