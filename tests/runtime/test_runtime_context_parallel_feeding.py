"""Context-parallel plans fed to real processes: ``BalancedBatchSampler`` and the ``Rebalancer``
with ``context_parallel`` on 4 gloo ranks (CP sizes 1, 2 and 4; samples up to four ranks'
cap), checked against single-process plans.

One launch runs every scenario (process start-up dominates on a small machine); each rank
returns what it saw, and the tests check it here: every token of every sample on exactly one
rank, the members of a CP group running the sample in the same slot, the epoch and the plans
those of ``plan_epoch`` / ``plan_step``, resume, rank agreement, and ``restore`` bringing every
sample's per-token outputs back whole to its origin rank, in origin order.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.cost import TimeModel  # noqa: E402
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel  # noqa: E402
from seqbalance.plan import ContextParallel, PlanOptions, plan_epoch, plan_step  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, Rebalancer, StepTiming  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORLD = 4
CAP = 64  # tokens per rank and slot
OPTIONS = PlanOptions(
    cost=ContextParallelTimeModel(TimeModel(1e-3, 1e-6, 1e-9), CommModel(1e9, 1e-5), 16, 2),
    max_tokens=CAP,
    context_parallel=ContextParallel(sizes=(1, 2, 4)),
    allow_empty=True,
)
RNG = np.random.default_rng(5)
LENGTHS = np.where(
    RNG.random(70) < 0.25, RNG.integers(CAP + 1, 4 * CAP + 1, 70), RNG.integers(1, CAP, 70)
)
GLOBAL_BATCH = 12
COUNTS = (5, 0, 9, 3)  # the Rebalancer's samples per rank: rank 1 starts empty
TIMEOUT = timedelta(seconds=30)


def _sampler(rank: int, options: PlanOptions = OPTIONS) -> BalancedBatchSampler:
    return BalancedBatchSampler(LENGTHS, GLOBAL_BATCH, seed=3, options=options)


def _record(slot: Any) -> dict[str, Any]:
    inputs = slot.inputs
    return {
        "step": slot.step,
        "slot": slot.slot,
        "indices": slot.indices.tolist(),
        "shards": inputs.shards.tolist(),
        "groups": [slot.cp_group(k) for k in range(len(slot))],
        "positions": [slot.positions(k).tolist() for k in range(len(slot))],
    }


def _sample(rank: int, index: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * rank + index)
    long = index % 3 == 0  # a third of them longer than one rank's cap
    high = 4 * CAP if long else CAP
    length = int(torch.randint(CAP + 1 if long else 1, high + 1, (1,), generator=generator))
    return {
        "input_ids": torch.randint(0, 1000, (length,), generator=generator),
        "advantages": torch.randn(length, 2, generator=generator),
    }


def _sampler_scenarios(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sampler = _sampler(rank)
    slots = list(sampler)
    out["epoch"] = [_record(slot) for slot in slots]
    # A DataLoader fetches the slot's whole samples (the batch is a sequence of indices).
    loader = torch.utils.data.DataLoader(
        LENGTHS.tolist(), batch_sampler=_sampler(rank), collate_fn=list
    )
    out["fetched"] = list(loader)
    # Resume after 5 slots, and the next epoch.
    state = sampler.state_dict(consumed=5)
    resumed = _sampler(rank)
    resumed.load_state_dict(state)
    out["resumed"] = [_record(slot) for slot in resumed]
    sampler.set_epoch(1)
    out["epoch_1"] = [_record(slot) for slot in sampler]
    # Ranks that disagree on the per-rank cap fail before any data.
    odd = _sampler(rank, OPTIONS.replace(max_tokens=CAP * 2) if rank == 3 else OPTIONS)
    try:
        iter(odd)
        out["disagreement"] = None
    except ValueError as error:
        out["disagreement"] = str(error)
    return out


def _rebalancer_scenarios(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    local = [_sample(rank, i) for i in range(COUNTS[rank])]
    rebalancer = Rebalancer(timeout=TIMEOUT, length_key="input_ids", options=OPTIONS)
    result = rebalancer.rebalance(local)
    slots = result.slots
    out["plan"] = result.plan.fingerprint()
    out["slots"] = [_record(slot) for slot in slots]
    out["global_indices"] = [mb.tolist() for mb in result.global_indices]
    # The micro-batches hold the slot's samples whole; this rank's share of each piece.
    out["shares"] = [
        [slot.local(k, sample["input_ids"]).tolist() for k, sample in enumerate(microbatch)]
        for slot, microbatch in zip(slots, result.microbatches, strict=True)
    ]
    out["origin"] = result.origin.tolist()
    # Per-token outputs of each piece's share go home whole, in origin order.
    outputs = [
        slot.local(k, sample["advantages"]) * 2 + 1
        for slot, microbatch in zip(slots, result.microbatches, strict=True)
        for k, sample in enumerate(microbatch)
    ]
    restored = result.restore(outputs)
    out["restored"] = len(restored) == len(local) and all(
        torch.equal(back, sample["advantages"] * 2 + 1)
        for back, sample in zip(restored, local, strict=True)
    )
    out["rows"] = _restore_error(result, torch.zeros(result.num_samples))
    short = [t[:-1] if i == 0 else t for i, t in enumerate(outputs)] if outputs else outputs
    out["short"] = _restore_error(result, short)
    # The next step: the slot records count the Rebalancer's steps.
    out["second_step"] = rebalancer.rebalance(local).slots[0].step
    # Off the critical path (iterate): the same plans, steps counted the same way.
    group = dist.new_group(backend="gloo")  # iterate's own collectives, off the loop's group
    ahead = Rebalancer(group, timeout=TIMEOUT, length_key="input_ids", options=OPTIONS)
    out["iterated"] = [
        (result.plan.fingerprint(), result.slots[0].step) for result in ahead.iterate([local] * 2)
    ]
    return out


def _restore_error(result: Any, outputs: Any) -> str | None:
    """The ValueError ``result.restore(outputs)`` raises (None: it restored)."""
    try:
        result.restore(outputs)
    except ValueError as error:
        return str(error)
    return None


TRUE = OPTIONS.replace(cost=dataclasses.replace(OPTIONS.cost, time=TimeModel(3e-3, 4e-6, 5e-9)))
"""What the slots "measure": the same communication, a compute that the prior underestimates."""


def _measured(plan: Any, rank: int) -> StepTiming:
    """The slot seconds ``rank`` would measure for ``plan`` under :data:`TRUE`."""
    seconds = plan.recosted(TRUE).costs[rank]
    return StepTiming(tuple(seconds.tolist()), 0.0, float(seconds.sum()))


def _adaptive_scenarios(rank: int) -> dict[str, Any]:
    """The closed loop with context parallelism: the Rebalancer (statistics riding on the
    gather) and the sampler (its lagged form, one all-gather per observe)."""
    local = [_sample(rank, i) for i in range(COUNTS[rank])]
    rebalancer = Rebalancer(timeout=TIMEOUT, length_key="input_ids", options=OPTIONS, adaptive=True)
    models = []
    for _ in range(6):
        result = rebalancer.rebalance(local)
        models.append(json.loads(result.plan.options.cost.time.to_json()))
        rebalancer.observe(result, _measured(result.plan, rank))
    sampler = BalancedBatchSampler(
        LENGTHS, GLOBAL_BATCH, seed=3, options=OPTIONS, adaptive=True, lookahead=1
    )
    sampled, iterator = [], iter(sampler)
    for step in range(6):
        first = next(iterator)  # the step is planned by now
        plan = sampler.step_plan(step)
        assert first.step == step
        slots = [first, *(next(iterator) for _ in range(plan.n_microbatches - 1))]
        indices = sampler.layout().step(step)
        planned = [list(plan.slot(rank, j, indices=indices)) for j in range(plan.n_microbatches)]
        sampled.append(
            (json.loads(plan.options.cost.time.to_json()), [list(s) for s in slots] == planned)
        )
        sampler.observe(_measured(plan, rank))
    return {"rebalancer": models, "sampler": sampled}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "sampler": _sampler_scenarios(rank),
        "rebalancer": _rebalancer_scenarios(rank),
        "adaptive": _adaptive_scenarios(rank),
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("cp_feeding"), WORLD, _worker, timeout_s=150.0))


def _check_tokens_once(
    pieces: list[tuple[int, int, int, int, tuple[int, ...], list[int]]], lengths: np.ndarray
) -> None:
    """``pieces``: (rank, slot, sample, shard, CP group, positions) of one step on every rank:
    each sample's shards on the ranks of its group, in one slot, each token exactly once."""
    by_sample: dict[int, list] = {}
    for rank, slot, sample, shard, group, positions in pieces:
        by_sample.setdefault(sample, []).append((rank, slot, shard, group, positions))
    for sample, held in by_sample.items():
        group = held[0][3]
        assert sorted(h[0] for h in held) == list(group), sample  # every member, once
        assert {h[1] for h in held} == {held[0][1]}, sample  # one slot for the whole group
        assert all(h[0] == group[h[2]] for h in held), sample  # shard s on member s
        tokens = np.sort(np.concatenate([np.asarray(h[4], dtype=np.int64) for h in held]))
        np.testing.assert_array_equal(tokens, np.arange(lengths[sample]))


def test_the_sampler_gives_each_rank_its_slots_of_the_plan_epoch_plan(ranks) -> None:
    epoch = plan_epoch(LENGTHS, GLOBAL_BATCH, WORLD, OPTIONS, seed=3)
    sharded = 0
    for step, plan in enumerate(epoch.steps):
        pieces = []
        for rank, result in enumerate(ranks):
            mine = [r for r in result["sampler"]["epoch"] if r["step"] == step]
            assert len(mine) == plan.n_microbatches
            for j, record in enumerate(mine):
                expected = plan.slot(rank, j, step=step, indices=epoch.sample_indices[step])
                assert record["indices"] == expected.indices.tolist()
                assert record["shards"] == expected.inputs.shards.tolist()
                for k, index in enumerate(record["indices"]):
                    pieces.append(
                        (
                            rank,
                            j,
                            index,
                            record["shards"][k],
                            record["groups"][k],
                            record["positions"][k],
                        )
                    )
        _check_tokens_once(pieces, LENGTHS)
        sharded += int((plan.cp_size > 1).sum())
    assert sharded > 0 and {int(c) for p in epoch.steps for c in p.cp_size} == {1, 2, 4}
    every = [i for r in ranks for rec in r["sampler"]["epoch"] for i in rec["indices"]]
    assert set(every) == set(range(LENGTHS.size))  # every sample of the epoch, on some rank


def test_a_dataloader_fetches_the_slots_samples(ranks) -> None:
    for result in ranks:
        records = result["sampler"]["epoch"]
        assert result["sampler"]["fetched"] == [
            [int(LENGTHS[i]) for i in record["indices"]] for record in records
        ]


def test_resume_and_the_next_epoch(ranks) -> None:
    for result in ranks:
        sampler = result["sampler"]
        assert sampler["resumed"] == sampler["epoch"][5:]
        assert sampler["epoch_1"] != sampler["epoch"]
        assert len(sampler["epoch_1"]) > 0


def test_ranks_that_disagree_fail_before_any_data(ranks) -> None:
    for result in ranks:
        message = result["sampler"]["disagreement"]
        assert message is not None and "options.max_tokens" in message


def test_the_rebalancer_runs_the_plan_of_every_ranks_samples(ranks) -> None:
    samples = [_sample(r, i) for r in range(WORLD) for i in range(COUNTS[r])]
    lengths = np.array([s["input_ids"].shape[0] for s in samples])
    plan = plan_step(lengths, WORLD, OPTIONS)
    assert (plan.cp_size > 1).any() and (lengths > CAP).any()
    pieces = []
    for rank, result in enumerate(ranks):
        rebalanced = result["rebalancer"]
        assert rebalanced["plan"] == plan.fingerprint()
        assert len(rebalanced["slots"]) == plan.n_slots
        for j, record in enumerate(rebalanced["slots"]):
            expected = plan.slot(rank, j)
            assert record["indices"] == rebalanced["global_indices"][j]
            assert record["indices"] == expected.indices.tolist()
            for k, index in enumerate(record["indices"]):
                share = rebalanced["shares"][j][k]
                positions = record["positions"][k]
                assert share == samples[index]["input_ids"][positions].tolist()
                pieces.append((rank, j, index, record["shards"][k], record["groups"][k], positions))
        assert rebalanced["second_step"] == 1
        assert rebalanced["iterated"] == [(plan.fingerprint(), 0), (plan.fingerprint(), 1)]
    _check_tokens_once(pieces, lengths)


def test_restore_brings_every_samples_outputs_home_whole(ranks) -> None:
    for result in ranks:
        rebalanced = result["rebalancer"]
        assert rebalanced["restored"]
        assert "per-token outputs" in rebalanced["rows"]
    # A wrong share on one rank: every rank raises the same error, naming the rank.
    messages = {result["rebalancer"]["short"] for result in ranks}
    assert len(messages) == 1 and "rows, but this rank computes" in messages.pop()


def test_measured_slot_times_correct_the_cp_time_model_on_every_rank(ranks) -> None:
    """Rebalancer: step k is planned with what steps before k - 1 taught (the statistics ride on
    the next gather); the sampler (lookahead 1) likewise. Every rank plans with the same model,
    which becomes the measured compute; the sampler's slots are those of its own plans."""
    true = TRUE.cost.time
    for kind in ("rebalancer", "sampler"):
        runs = [result["adaptive"][kind] for result in ranks]
        assert all(run == runs[0] for run in runs), kind  # the same models on every rank
        models = [step if kind == "rebalancer" else step[0] for step in runs[0]]
        if kind == "sampler":  # every rank's slots are those of the step's plan
            assert all(step[1] for run in runs for step in run)
        assert models[0] == json.loads(OPTIONS.cost.time.to_json())  # the prior
        for name in ("t0", "t1", "t2"):
            assert models[-1][name] == pytest.approx(getattr(true, name), rel=1e-6), kind
