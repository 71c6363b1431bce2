"""Adversarial (adv11c V2, V3): context-parallel steps whose inputs are wrong on one rank, and
token ids of another integer type.

V2: ``ContextParallelGroups.prepare`` checked a rank's plan (its world size, ``validate()``)
before the plan agreement, and ``run_step`` checked the samples only inside the slots: a rank
with a plan for another world, or a sample of another length, raised ValueError alone while
its peers waited out the timeout in the agreement or the first K/V gather (CollectiveError),
and a rank that went on met its peers' pending collectives (gloo aborted the process). Such
errors now travel in the agreement: the same ValueError on every rank, before any slot runs.

V3: token ids of int32 failed the loss (``cross_entropy`` takes int64 targets) on the ranks
with tokens only; uint8 ones held ``IGNORE_INDEX`` (-100) as 156, a real token, in the labels
of every sample's last token. Token ids are now labelled in int64: the loss equals int64's.
adv12a A4: a ``samples`` container without a length (a generator) raised TypeError in
``prepare`` on its rank alone, and sparse or meta token ids passed ``prepare`` and failed in the
slots on their rank alone; both now travel in the agreement too. adv13a F10: a negative token
id, or a uint64 one beyond int64 (wrapped negative in int64), passed ``prepare`` and failed in
the embedding on the ranks computing that sample alone; now refused in the agreement too.

Real gloo processes.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from _multiprocess import launch, ok  # noqa: E402

from seqbalance.cost.context_parallel import CommModel  # noqa: E402
from seqbalance.measure.toy_model import TinyCausalTransformer, ToyModelConfig  # noqa: E402
from seqbalance.plan import PlanOptions, plan_step  # noqa: E402
from seqbalance.plan.context_parallel import ContextParallel  # noqa: E402
from seqbalance.runtime.context_parallel import (  # noqa: E402
    IGNORE_INDEX,
    ContextParallelGroups,
    run_step,
    slot_batch,
)

pytestmark = pytest.mark.multiprocess

CONFIG = ToyModelConfig(
    vocab_size=61, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24
)
OPTIONS = PlanOptions(
    cost="flops", max_tokens=24, context_parallel=ContextParallel(comm=CommModel())
)
LENGTHS = [30, 9, 5, 40]
TIMEOUT = 5.0


def _samples(lengths: list[int], dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, 61, (n,), generator=generator).to(dtype) for n in lengths]


def _step(plan: Any, samples: list[torch.Tensor], groups: ContextParallelGroups) -> float:
    model = TinyCausalTransformer(CONFIG, seed=3).to(torch.float64)
    forward = TinyCausalTransformer.slot_logits
    return run_step(model, plan, samples, groups, forward=forward, timeout=TIMEOUT).loss


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    groups = ContextParallelGroups(timeout=TIMEOUT)
    plan = plan_step(LENGTHS, world_size, OPTIONS)
    alone = OPTIONS.replace(max_tokens=64, context_parallel=ContextParallel(sizes=(1,)))
    odd = {
        "world": (plan_step(LENGTHS, 1, alone), _samples(LENGTHS)),
        "length": (plan, _samples([30, 9, 5, 41])),
        "count": (plan, _samples(LENGTHS[:3])),
        "float": (plan, _samples(LENGTHS, torch.float32)),
        "no plan": (
            plan_step(LENGTHS, world_size, OPTIONS.replace(context_parallel=None, max_tokens=64)),
            [],
        ),
        # adv12a A4: passed prepare and failed on rank 1 alone (TypeError; in the slots).
        "generator": (plan, (sample for sample in _samples(LENGTHS))),
        "sparse": (plan, [sample.to_sparse() for sample in _samples(LENGTHS)]),
        "meta": (plan, [sample.to("meta") for sample in _samples(LENGTHS)]),
        # adv13a F10: passed prepare and failed in the embedding on its rank alone.
        "negative": (plan, [sample - 70 for sample in _samples(LENGTHS)]),
        "beyond int64": (plan, [(s + 2**63).to(torch.uint64) for s in _samples(LENGTHS)]),
        # adv15a F14: TypeError "len() of a 0-d tensor" in prepare on its rank alone.
        "0-d": (plan, torch.tensor(5)),
    }
    out: dict[str, Any] = {}
    for name, (their_plan, their_samples) in odd.items():
        mine = (their_plan, their_samples) if rank == 1 else (plan, _samples(LENGTHS))
        try:
            _step(*mine, groups)
            out[name] = "returned"
        except Exception as error:  # what each rank raised is the result
            out[name] = f"{type(error).__name__}: {error}"
    for dtype in (torch.int64, torch.int32, torch.uint8):
        out[str(dtype)] = _step(plan, _samples(LENGTHS, dtype), groups)
    return out


def test_inputs_wrong_on_one_rank_fail_every_rank_alike(tmp_path) -> None:
    results = ok(launch(tmp_path, 2, _worker))
    expected = {
        "world": "the plan is for 1 ranks, the world has 2",
        "length": "samples[3] has shape (41,) of torch.int64, the plan says 40 integer",
        "count": "samples holds 3 samples, the plan has 4",
        "float": "samples[0] has shape (30,) of torch.float32, the plan says 30 integer",
        "no plan": "plan must be a ContextParallelPlan, got StepPlan",
        "generator": "samples must be a sequence of token-id tensors, got generator",
        "sparse": "samples[0] is a torch.sparse_coo tensor: only dense",
        "meta": "samples[0] is a meta-device tensor: only dense",
        "negative": "samples[0] holds the token id -",
        "beyond int64": "samples[0] holds the token id 92233720368547",
        "0-d": "samples must be a sequence of token-id tensors, got Tensor of 0 dimensions",
    }
    for name, text in expected.items():
        assert results[0][name] == results[1][name], name
        assert results[0][name].startswith(f"ValueError: rank 1: {text}"), results[0][name]
    for result in results:
        loss = result["torch.int64"]
        assert loss > 0 and result["torch.int32"] == loss and result["torch.uint8"] == loss


def test_labels_of_small_integer_token_ids_ignore_the_last_token() -> None:
    plan = plan_step([6, 4], 1, OPTIONS.replace(context_parallel=ContextParallel(sizes=(1,))))
    for dtype in (torch.uint8, torch.int16, torch.int32):
        batches = [slot_batch(plan, 0, j, _samples([6, 4], dtype)) for j in range(plan.n_slots)]
        assert all(b.labels.dtype == b.input_ids.dtype == torch.int64 for b in batches)
        assert sum(int((b.labels == IGNORE_INDEX).sum()) for b in batches) == 2, dtype
    bools = [torch.ones(6, dtype=torch.bool), torch.ones(4, dtype=torch.bool)]
    with pytest.raises(ValueError, match=r"\(sample \d\) has shape \(\d,\) of torch.bool"):
        slot_batch(plan, 0, 0, bools)
