"""Adversarial (adv14a F3): ``run_step`` on ranks whose models' parameters differ, real gloo.

The plan agreement compared plans and samples, not the model: with rank 1's model of another
MLP width, hidden size or dtype, the K/V gathers or the gradient sum met buffers of other sizes
and gloo aborted one process ("terminate called after throwing an instance of
'gloo::EnforceNotMet' ... Received data size doesn't match expected size"), its peer raising
CollectiveError. The parameters' names, shapes and dtypes now travel in the agreement: the same
ValueError on every rank, before any slot runs.

adv16a F4: the gradient sum gave every parameter a gradient, a frozen one (requires_grad False)
zeros, so an optimizer holding it updated it (AdamW's weight decay moved a frozen embedding),
silently. Frozen parameters now keep no gradient and are not summed; which parameters train is
in the agreement (ranks freezing different ones would sum different parameters).

adv18a F5: a model on the meta device on rank 1 alone (deferred initialisation never
materialised there) passed the agreement (its layout matched), failed in the first slot on that
rank ("Tensor.item() cannot be called on meta tensors") and left rank 0 waiting in the K/V
gather until the timeout. A meta parameter is refused in the agreement now, on every rank, and
the parameters' device types are compared.

review18 item 6: a buffer left on the meta device (a rotary ``inv_freq`` after a partial
``to_empty()``) passed where a parameter is refused; buffers are walked too.
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
from seqbalance.runtime.context_parallel import ContextParallelGroups, run_step  # noqa: E402

pytestmark = pytest.mark.multiprocess

SIZES = {"vocab_size": 61, "hidden_size": 16, "num_layers": 1, "num_heads": 2}
OPTIONS = PlanOptions(
    cost="flops", max_tokens=24, context_parallel=ContextParallel(comm=CommModel())
)
LENGTHS = [30, 9, 5, 40]
# Rank 1's model in each case: (config changes, dtype).
ODD = {
    "alike": ({}, torch.float64),
    "mlp width": ({"intermediate_size": 26}, torch.float64),
    "hidden size": ({"hidden_size": 32}, torch.float64),
    "dtype": ({}, torch.float32),
}


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    samples = [torch.randint(0, 61, (n,), generator=generator) for n in LENGTHS]
    plan = plan_step(LENGTHS, world_size, OPTIONS)
    groups = ContextParallelGroups(timeout=5.0)
    out: dict[str, Any] = {}
    for case, (changes, dtype) in ODD.items():
        config = ToyModelConfig(**{**SIZES, "intermediate_size": 24, **(changes if rank else {})})
        model = TinyCausalTransformer(config, seed=3).to(dtype if rank else torch.float64)
        try:
            step = run_step(
                model, plan, samples, groups, forward=TinyCausalTransformer.slot_logits, timeout=5.0
            )
            out[case] = f"loss {step.loss:.12f}"
        except ValueError as error:
            out[case] = f"ValueError: {error}"
    for case, frozen_ranks in {"frozen alike": (0, 1), "frozen on rank 1": (1,)}.items():
        model = TinyCausalTransformer(ToyModelConfig(**SIZES, intermediate_size=24), seed=3)
        model.to(torch.float64).embed.weight.requires_grad_(rank not in frozen_ranks)
        try:
            step = run_step(
                model, plan, samples, groups, forward=TinyCausalTransformer.slot_logits, timeout=5.0
            )
            kept = {name for name, p in model.named_parameters() if p.grad is not None}
            out[case] = (
                f"loss {step.loss:.12f}, {len(kept)} gradients, embed: {'embed.weight' in kept}"
            )
        except ValueError as error:
            out[case] = f"ValueError: {error}"
    model = TinyCausalTransformer(ToyModelConfig(**SIZES, intermediate_size=24), seed=3)
    model.to("meta" if rank else torch.float64)
    try:
        run_step(
            model, plan, samples, groups, forward=TinyCausalTransformer.slot_logits, timeout=5.0
        )
        out["meta on rank 1"] = "ran"
    except Exception as error:
        out["meta on rank 1"] = f"{type(error).__name__}: {error}"
    # The same model object cast on rank 1 after a step it ran alike: the layout of a model
    # already checked is read again at every step, not taken from the last one.
    model = TinyCausalTransformer(ToyModelConfig(**SIZES, intermediate_size=24), seed=3)
    model.to(torch.float64)
    step = lambda: run_step(  # noqa: E731
        model, plan, samples, groups, forward=TinyCausalTransformer.slot_logits, timeout=5.0
    )
    step()
    if rank:
        model.to(torch.float32)
    try:
        out["cast after a step"] = f"loss {step().loss:.12f}"
    except ValueError as error:
        out["cast after a step"] = f"ValueError: {error}"
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return ok(launch(tmp_path_factory.mktemp("models"), 2, _worker))


def test_a_model_on_the_meta_device_on_one_rank_fails_every_rank_naming_it(results) -> None:
    assert [result["meta on rank 1"] for result in results] == 2 * [
        "ValueError: rank 1: model's parameter embed.weight is on the meta device (it holds no "
        "data): materialise the model (to_empty() and initialise, or load its weights) before "
        "run_step"
    ]


def test_models_apart_fail_every_rank_before_any_slot(results) -> None:
    assert results[0]["alike"] == results[1]["alike"]
    assert results[0]["alike"].startswith("loss ")
    for case in [*ODD, "cast after a step", "frozen on rank 1"]:
        if case == "alike":
            continue
        assert results[0][case] == results[1][case], case
        assert results[0][case] == (
            "ValueError: ranks disagree on the context-parallel model: ranks [1] hold a model "
            "whose parameters (names, shapes, dtypes, requires_grad, device types) differ from "
            "rank 0's; nothing was run"
        ), case
    parameters = sum(1 for _ in TinyCausalTransformer(ToyModelConfig(**SIZES)).parameters())
    loss = results[0]["alike"].removeprefix("loss ")
    for result in results:  # the loss as with every parameter training, no embedding gradient
        assert result["frozen alike"] == f"loss {loss}, {parameters - 1} gradients, embed: False"


def test_a_buffer_on_the_meta_device_is_refused_as_a_parameter_is() -> None:
    from seqbalance.runtime.context_parallel.executor import _parameter_layout

    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(16, 4)
            self.register_buffer("inv_freq", torch.ones(2), persistent=False)

    with torch.device("meta"):
        model = Rotary()
    model.embed.to_empty(device="cpu")  # the parameters materialised, the buffer not
    with pytest.raises(ValueError, match=r"^model's buffer inv_freq is on the meta device"):
        _parameter_layout(model)
    model.inv_freq = torch.ones(2)
    assert _parameter_layout(model) == _parameter_layout(model)  # a layout now, kept
