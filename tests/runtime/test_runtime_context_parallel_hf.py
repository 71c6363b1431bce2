"""Hugging Face causal LMs trained on context-parallel plans: equal to one process.

Tiny Qwen3 and Llama models (the bundled presets scaled down: grouped-query attention, Qwen3's
query/key norms, Llama-3's rotary scaling; no download) run on 4 gloo processes with
``attn_implementation="seqbalance_cp"`` through the executor's ``run_step``, several optimizer
steps in a row, each step a different plan: every strategy's (CP sizes 1, 2 and 4; samples up
to 3.75x the per-rank cap, so some shard over 4 ranks), the contiguous split, a slot where
ranks belong to two CP groups at once, and a 2-token sample over 4 ranks (members with no
token of their shard). The Qwen3 model is also fed the way a training loop gets its data:
the slots a ``BalancedBatchSampler`` with ``context_parallel`` hands each rank over an epoch
(the dataset's samples fetched whole, each rank computing its share), and the slots the
``Rebalancer`` makes of every rank's rollouts in two steps (a sharded sample reaching every
member of its group), each slot run with ``SlotBatch.of`` + ``SlotAttention`` + ``slot_loss``.
One launch (module-scoped) returns every rank's loss and gradients of every step; the parent
runs the same steps in one process, every sample whole with the ``sdpa`` attention, one sample
per forward.

Tolerance: float64 everywhere; the loss to 1e-12 relative, every gradient element to 1e-10
relative plus 1e-12 absolute (measured: about 1e-15, float64 rounding).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from _cp import CP_STRATEGIES, plan_cp
from _multiprocess import launch, ok

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("transformers")
F = torch.nn.functional

from seqbalance.cost.context_parallel import CommModel  # noqa: E402
from seqbalance.measure.hf_model import hf_causal_lm, scaled_preset  # noqa: E402
from seqbalance.plan import PlanOptions  # noqa: E402
from seqbalance.plan.context_parallel import ContextParallel, ContextParallelPlan  # noqa: E402
from seqbalance.runtime import BalancedBatchSampler, Rebalancer  # noqa: E402
from seqbalance.runtime.context_parallel import (  # noqa: E402
    ATTENTION_NAME,
    ContextParallelGroups,
    SlotAttention,
    SlotBatch,
    attention_forward,
    register_attention,
    run_step,
    slot_logits,
    slot_loss,
)
from seqbalance.runtime.context_parallel.hf import check_implementation  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORLD = 4
CAP = 24  # tokens per rank and slot
VOCAB = 61
LR = 0.05
TIMEOUT = 30.0  # seconds any collective may wait
SCALE = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "head_dim": 8,
    "intermediate_size": 48,
    "vocab_size": VOCAB,
}
MODELS = {
    name: scaled_preset(name, max_position=128, **SCALE) for name in ("qwen3-8b", "llama-3.1-8b")
}
CP = ContextParallel(sizes=(1, 2, 4), comm=CommModel())


def _model(config: dict[str, Any]) -> Any:
    return hf_causal_lm(config, seed=3).to(torch.float64)


def _samples(lengths: np.ndarray, step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randint(0, VOCAB, (int(n),), generator=generator) for n in lengths]


def _sgd(model: Any) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= LR * parameter.grad


# ------------------------------------------------------------------ the steps
def _steps() -> list[ContextParallelPlan]:
    rng = np.random.default_rng(5)
    plans = []
    for k, strategy in enumerate(CP_STRATEGIES):
        lengths = rng.integers(1, 40, 12)
        lengths[: 2 + k] = [90, 60, 30, 41][: 2 + k]  # longer than a rank's cap: CP 2 and 4
        plans.append(
            plan_cp(
                lengths,
                WORLD,
                max_tokens=CAP,
                context_parallel=CP,
                strategy=strategy,
                allow_empty=True,
            )
        )
    contiguous = ContextParallel(sizes=(1, 2, 4), scheme="contiguous", comm=CommModel())
    plans.append(plan_cp([70, 33, 5, 12, 2], WORLD, max_tokens=CAP, context_parallel=contiguous))
    assigned = PlanOptions(cost="flops", max_tokens=CAP, context_parallel=CP, allow_empty=True)
    # Slot 0: a CP-4 sample, a CP-2 sample on ranks 0-1 (ranks 0 and 1 gather over two groups)
    # and a whole sample on rank 3; slot 1: a 2-token sample over all four ranks (two members
    # hold none of its tokens) beside a CP-2 sample on ranks 2-3.
    plans.append(
        ContextParallelPlan.from_assignment(
            [40, 20, 6, 2, 30, 7],
            WORLD,
            assigned,
            cp_size=[4, 2, 1, 4, 2, 1],
            group_start=[0, 0, 3, 0, 2, 0],
            slot_of=[0, 0, 0, 1, 1, 1],
        )
    )
    return plans


def _train(rank: int, world_size: int, configs: dict[str, Any], texts: list[str]) -> Any:
    """Every model through every plan, an SGD step after each: per model and step, this
    rank's view of the step loss and the (all-reduced) gradients; then the first model fed by
    the sampler and by the Rebalancer (:func:`_fed`)."""
    groups = ContextParallelGroups(timeout=TIMEOUT)
    out: dict[str, list[Any]] = _fed(rank, _model(configs[FED_MODEL]), groups)
    for name, config in configs.items():
        model = _model(config)
        out[name] = []
        for step, text in enumerate(texts):
            plan = ContextParallelPlan.from_json(text)
            model.zero_grad(set_to_none=True)
            result = run_step(model, plan, _samples(plan.lengths, step), groups, timeout=TIMEOUT)
            out[name].append(
                {
                    "loss": result.loss,
                    "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                }
            )
            _sgd(model)
    out["attention apart"] = [_attention_apart(rank, configs[FED_MODEL], texts[0], groups)]
    return out


def _attention_apart(rank: int, config: dict[str, Any], text: str, groups: Any) -> str:
    """run_step where rank 1's model attends with sdpa (switched on that rank alone): what
    each rank raised (adv19d M3: rank 1 raised alone in its first slot, its peers waited in
    the K/V gather)."""
    model = _model(config)
    if rank == 1:
        model.set_attn_implementation("sdpa")
    plan = ContextParallelPlan.from_json(text)
    try:
        run_step(model, plan, _samples(plan.lengths, 0), groups, timeout=TIMEOUT)
    except ValueError as error:
        return f"ValueError: {error}"
    return "ran"


# ------------------------------------------------------------------ fed by sampler, Rebalancer
FED_MODEL = "qwen3-8b"
FED = PlanOptions(cost="flops", max_tokens=CAP, context_parallel=CP)
_RNG = np.random.default_rng(9)
_LENGTHS = np.where(
    _RNG.random(24) < 0.25, _RNG.integers(CAP + 1, 84, 24), _RNG.integers(2, CAP, 24)
)
_LENGTHS[:2] = (83, 50)  # over 3 and 2 ranks' cap: CP 4 and 2
DATASET = [  # a quarter longer than a rank's cap
    torch.randint(0, VOCAB, (int(n),), generator=torch.Generator().manual_seed(i))
    for i, n in enumerate(_LENGTHS)
]
GLOBAL_BATCH = 8  # 3 steps of the epoch
LOCAL = ((5, 0, 4, 3), (2, 3, 3, 1))  # the Rebalancer's samples per rank, in two steps


def _local(step: int, rank: int) -> list[torch.Tensor]:
    """This rank's rollouts of the Rebalancer's ``step``: some longer than a rank's cap."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(2, 80, (LOCAL[step][rank],), generator=generator).tolist()
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]


def _user_step(
    model: Any, plan: Any, slots: list[tuple[Any, list[torch.Tensor]]], groups: Any
) -> dict[str, Any]:
    """What a training loop does with the slots a sampler or the Rebalancer hands this rank
    (each: its ``SlotInputs`` and its pieces' whole samples): every slot's loss and backward,
    then the sums over the ranks; returns the step's loss and gradients."""
    assert not plan.barriers
    groups.prepare(plan)  # the step's CP process groups (and the plan agreement check)
    labelled = float(np.maximum(plan.lengths - 1, 0).sum())
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for inputs, tokens in slots:
        batch = SlotBatch.of(inputs, tokens)
        attention = SlotAttention(inputs, groups, timeout=TIMEOUT)
        if inputs.n_tokens or attention.gathers:  # a member with no token still gathers
            loss = slot_loss(model, batch, attention) / labelled
            loss.backward()
            total += loss.detach()
    for parameter in model.parameters():
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        dist.all_reduce(parameter.grad)
    dist.all_reduce(total)
    step = {"loss": float(total), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
    _sgd(model)
    return step


def _fed(rank: int, model: Any, groups: Any) -> dict[str, list[dict[str, Any]]]:
    """The model trained on the epoch a ``BalancedBatchSampler`` hands this rank (step by
    step: the dataset indices it fetched, loss, gradients), and on the steps a ``Rebalancer``
    makes of every rank's rollouts (a fresh copy of the same weights)."""
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    sampler = BalancedBatchSampler([len(t) for t in DATASET], GLOBAL_BATCH, seed=3, options=FED)
    by_step: dict[int, list[Any]] = {}
    for slot in sampler:  # ContextParallelSlot: a batch of dataset indices, and its inputs
        by_step.setdefault(slot.step, []).append(slot)
    out: dict[str, list[dict[str, Any]]] = {"sampler": [], "rebalancer": []}
    for step, slots in sorted(by_step.items()):
        fed = [(slot.inputs, [DATASET[i] for i in slot]) for slot in slots]
        result = _user_step(model, sampler.step_plan(step), fed, groups)
        out["sampler"].append({**result, "indices": sorted(i for slot in slots for i in slot)})
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(initial[n])
    rebalancer = Rebalancer(timeout=TIMEOUT, length_key="input_ids", options=FED)
    for step in range(len(LOCAL)):
        result = rebalancer.rebalance([{"input_ids": t} for t in _local(step, rank)])
        fed = [
            (slot.inputs, [sample["input_ids"] for sample in samples])
            for slot, samples in zip(result.slots, result.microbatches, strict=True)
        ]
        out["rebalancer"].append(_user_step(model, result.plan, fed, groups))
    return out


def _reference(config: dict[str, Any], plans: list[ContextParallelPlan]) -> list[dict[str, Any]]:
    """The same steps in one process: each sample whole, alone, with sdpa attention."""
    return _reference_steps(
        config, [_samples(plan.lengths, step) for step, plan in enumerate(plans)]
    )


def _reference_steps(
    config: dict[str, Any], steps: list[list[torch.Tensor]]
) -> list[dict[str, Any]]:
    """Steps of the given samples in one process: each sample whole, alone, with sdpa
    attention; the mean token loss of the step, then an SGD step."""
    model = _model(config)
    model.set_attn_implementation("sdpa")
    out = []
    for samples in steps:
        model.zero_grad(set_to_none=True)
        labelled = float(sum(max(len(tokens) - 1, 0) for tokens in samples))
        loss = 0.0
        for tokens in samples:
            if tokens.numel() < 2:
                continue
            logits = model(input_ids=tokens[None]).logits[0, :-1]
            part = F.cross_entropy(logits, tokens[1:], reduction="sum") / labelled
            part.backward()
            loss += float(part.detach())
        out.append(
            {"loss": loss, "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
        )
        _sgd(model)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ContextParallelPlan], Any]:
    plans = _steps()
    texts = [plan.to_json() for plan in plans]
    directory = tmp_path_factory.mktemp("cp_hf")
    return plans, ok(launch(directory, WORLD, _train, MODELS, texts, timeout_s=240.0))


def test_the_steps_cover_what_they_claim(
    trained: tuple[list[ContextParallelPlan], Any],
) -> None:
    plans, _ = trained
    assert {int(c) for plan in plans for c in plan.cp_size} == {1, 2, 4}
    assert any(plan.barriers for plan in plans)  # Megatron's rule's barriers run too
    assert max(int(plan.lengths.max()) for plan in plans) > 3 * CAP
    starved = sum(
        int(((inputs.cp_sizes > 1) & (np.diff(inputs.cu_seqlens) == 0)).sum())
        for plan in plans
        for r in range(WORLD)
        for j in range(plan.n_slots)
        for inputs in [plan.slot_inputs(r, j)]
    )
    assert starved >= 2  # members that hold no token of their sample still join its gathers


def _assert_equal(reference: list[dict[str, Any]], got: list[list[dict[str, Any]]]) -> None:
    """Every rank's loss and gradients of every step (``got[rank][step]``) equal the
    reference's, to the module docstring's tolerance."""
    for step, expected in enumerate(reference):
        for rank, steps in enumerate(got):
            mine = steps[step]
            assert mine["loss"] == pytest.approx(expected["loss"], rel=1e-12), (step, rank)
            assert set(mine["grads"]) == set(expected["grads"])
            for parameter, grad in expected["grads"].items():
                torch.testing.assert_close(
                    mine["grads"][parameter], grad, rtol=1e-10, atol=1e-12, msg=f"{parameter}"
                )


def test_a_rank_whose_model_attends_otherwise_fails_every_rank(
    trained: tuple[list[ContextParallelPlan], Any],
) -> None:
    _, results = trained
    for rank_results in results:
        (raised,) = rank_results["attention apart"]
        assert raised.startswith("ValueError: rank 1: the model's attn_implementation is 'sdpa'")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_loss_and_every_gradient_equal_one_process(
    trained: tuple[list[ContextParallelPlan], Any], name: str
) -> None:
    plans, results = trained
    _assert_equal(_reference(MODELS[name], plans), [result[name] for result in results])


def test_fed_by_the_sampler_equal_one_process(
    trained: tuple[list[ContextParallelPlan], Any],
) -> None:
    _, results = trained
    epochs = [result["sampler"] for result in results]
    assert len(epochs[0]) == len(DATASET) // GLOBAL_BATCH
    steps = []
    for step in range(len(epochs[0])):
        # Every rank saw pieces of the step's samples; together, each sample of the epoch once.
        seen = sorted({i for epoch in epochs for i in epoch[step]["indices"]})
        assert len(seen) == GLOBAL_BATCH
        steps.append([DATASET[i] for i in seen])
    covered = sorted({i for epoch in epochs for step in epoch for i in step["indices"]})
    assert covered == list(range(len(DATASET)))
    assert max(len(t) for t in DATASET) > 3 * CAP
    _assert_equal(_reference_steps(MODELS[FED_MODEL], steps), epochs)


def test_fed_by_the_rebalancer_equal_one_process(
    trained: tuple[list[ContextParallelPlan], Any],
) -> None:
    _, results = trained
    steps = [
        [tokens for rank in range(WORLD) for tokens in _local(step, rank)]
        for step in range(len(LOCAL))
    ]
    assert max(len(t) for step in steps for t in step) > 3 * CAP
    _assert_equal(
        _reference_steps(MODELS[FED_MODEL], steps), [result["rebalancer"] for result in results]
    )


# ------------------------------------------------------------------ one process
class _Groups:
    """No process group is touched when a slot holds whole samples only."""

    def group(self, size: int, start: int) -> Any:
        raise AssertionError("a slot of whole samples gathers nothing")


def _whole_slot() -> tuple[ContextParallelPlan, Any]:
    plan = plan_cp([9, 5], 1, max_tokens=CAP, context_parallel=CP)
    return plan, plan.slot_inputs(0, 0)


def test_whole_samples_in_one_process_equal_sdpa() -> None:
    _, inputs = _whole_slot()
    model = _model(MODELS["qwen3-8b"])
    tokens = _samples(np.array([9, 5]), 0)
    packed = slot_logits(
        model,
        torch.cat(tokens),
        torch.from_numpy(inputs.position_ids),
        SlotAttention(inputs, _Groups()),
    )
    model.set_attn_implementation("sdpa")
    alone = torch.cat([model(input_ids=t[None]).logits[0] for t in tokens])
    torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)


def test_wrong_use_raises_a_named_error() -> None:
    assert register_attention() == ATTENTION_NAME == register_attention()
    _, inputs = _whole_slot()
    attention = SlotAttention(inputs, _Groups())
    module = torch.nn.Module()
    q = torch.zeros(1, 4, 14, 8, dtype=torch.float64)
    kv = torch.zeros(1, 1, 14, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="pass slot_attention=SlotAttention"):
        attention_forward(module, q, kv, kv, None)
    with pytest.raises(ValueError, match="the batch must be 1, got 2"):
        attention_forward(module, q.expand(2, -1, -1, -1), kv, kv, None, slot_attention=attention)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        attention_forward(module, q, kv, kv, torch.ones(1, 1, 14, 14), slot_attention=attention)
    with pytest.raises(ValueError, match="does not support sliding_window"):
        attention_forward(module, q, kv, kv, None, slot_attention=attention, sliding_window=4)
    module.is_causal = False
    with pytest.raises(ValueError, match="causal layers only"):
        attention_forward(module, q, kv, kv, None, slot_attention=attention)
    with pytest.raises(ValueError, match="holds 14 local tokens"):
        attention(q[0, :, :3], kv[0, :, :3], kv[0, :, :3])
    model = _model(MODELS["llama-3.1-8b"])
    model.set_attn_implementation("sdpa")
    ids = torch.zeros(14, dtype=torch.int64)
    with pytest.raises(ValueError, match="attn_implementation is 'sdpa'"):
        slot_logits(model, ids, torch.from_numpy(inputs.position_ids), attention)
    # adv19d M4: reentrant checkpointing failed in backward with torch's "backward through
    # the graph a second time"; named up front (run_step checks it in its agreement).
    model = _model(MODELS["llama-3.1-8b"]).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    check_implementation(model)  # exact: see the module docstring
    # review19 item 9: torch checkpoints reentrantly where use_reentrant is not given.
    # review19 item 11: offload=True wraps torch's function in transformers' own partial.
    for kwargs, offload in itertools.product(
        ({"use_reentrant": True}, {}, {"preserve_rng_state": True}), (False, True)
    ):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs, offload=offload
        )
        with pytest.raises(ValueError, match="use_reentrant': False"):
            check_implementation(model)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False}, offload=True
    )
    check_implementation(model)
    check_implementation(model.eval())  # no checkpoint runs outside training


def test_scaled_presets_keep_the_architecture_and_refuse_what_cp_cannot_run() -> None:
    qwen = MODELS["qwen3-8b"]
    assert qwen["model_type"] == "qwen3" and qwen["num_key_value_heads"] == 1  # 32:8 -> 4:1
    assert MODELS["llama-3.1-8b"]["max_position_embeddings"] == 131072  # the preset's
    with pytest.raises(ValueError, match="'gemma-3-27b' has layers"):
        scaled_preset("gemma-3-27b", max_position=64)
    with pytest.raises(ValueError, match="MLA"):
        scaled_preset("deepseek-v3", max_position=64)
    with pytest.raises(ValueError, match="scale keys must be among"):
        scaled_preset("qwen3-8b", max_position=64, layers=3)
