"""seqbalance in Megatron-LM's packing-scheduler registry (``integrations/megatron_packing.py``).

Megatron-LM ``main`` has the registry (``megatron/core/datasets/data_schedule.py``); no
megatron-core release does, so the registry tests run against a stand-in module written from
``main``'s contract (``BasePackingScheduler(max_seqlen_per_dp_cp_rank, cp_size, dp_size,
microbatch_group_size_per_vp_stage)``, ``DpBalancedScheduler``, ``PackingSchedulerEnum``,
``scheduler_map``, ``wrap_data_iterator``'s lookup), and against the real module when the
installed megatron-core has it.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import numpy as np
import pytest

import seqbalance as sb
from seqbalance.integrations.megatron_packing import _data_schedule, install, schedule


def _contract_module() -> types.ModuleType:
    """A stand-in for ``megatron.core.datasets.data_schedule`` with main's registry."""
    module = types.ModuleType("megatron.core.datasets.data_schedule")

    class BasePackingScheduler:
        def __init__(self, max_seqlen_per_dp_cp_rank, cp_size, dp_size, group):
            self.max_seqlen_per_dp_cp_rank = max_seqlen_per_dp_cp_rank
            self.cp_size = cp_size
            self.dp_size = dp_size
            self.microbatch_group_size_per_vp_stage = group

        def get_groups_and_subsamples(self, sample_id_seqlens):
            raise NotImplementedError

    class DpBalancedScheduler(BasePackingScheduler):
        def run(self, seqlens):  # the real run gathers, schedules, re-routes and packs
            return self.get_groups_and_subsamples(list(enumerate(seqlens)))

    class PackingSchedulerEnum(enum.Enum):
        DP_BALANCED = "dp_balanced"

    def wrap_data_iterator(config, seqlens, dp, cp=1):
        kind = module.PackingSchedulerEnum[config.sequence_packing_scheduler.upper()]
        scheduler = module.scheduler_map[kind](config.max_seqlen_per_dp_cp_rank, cp, dp, None)
        return scheduler.run(seqlens)

    module.BasePackingScheduler = BasePackingScheduler
    module.DpBalancedScheduler = DpBalancedScheduler
    module.PackingSchedulerEnum = PackingSchedulerEnum
    module.scheduler_map = {PackingSchedulerEnum.DP_BALANCED: DpBalancedScheduler}
    module.wrap_data_iterator = wrap_data_iterator
    return module


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _contract_module()
    monkeypatch.setitem(sys.modules, "megatron.core.datasets.data_schedule", module)
    return module


def _costs(groups: list[list[list[int]]], lengths: np.ndarray, dp: int, cp: int) -> np.ndarray:
    model = sb.FlopsModel(sb.ModelSpec.preset("qwen3-8b"))
    costs = model.per_sample(lengths)
    return np.array([[costs[mb].sum() for mb in step[::cp]] for step in groups])


def test_schedule_is_plan_step_in_megatrons_shape() -> None:
    lengths = sb.datasets.load("sharegpt")[:96]
    ids = [1000 + i for i in range(lengths.size)]
    groups = schedule(
        list(zip(ids, lengths.tolist(), strict=True)),
        max_seqlen_per_dp_cp_rank=4096,
        cp_size=2,
        dp_size=4,
        microbatch_group_size_per_vp_stage=2,
        cost="flops",
        model="qwen3-8b",
    )
    plan = sb.plan_step(
        lengths,
        4,
        cost="flops",
        model="qwen3-8b",
        max_tokens=8192,
        allow_oversize=True,
        microbatch_multiple=2,
    )
    assert len(groups) == plan.n_microbatches and len(groups) % 2 == 0
    for k, step in enumerate(groups):
        assert len(step) == 8
        for j, packed in enumerate(step):
            assert packed == [1000 + i for i in plan.ranks[j // 2][k].tolist()]
    seen = sorted(i for step in groups for packed in step[::2] for i in packed)
    assert seen == ids  # every sequence once per data-parallel rank's CP group


def test_schedule_is_never_worse_than_dp_balanced() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        dp = int(rng.integers(2, 6))
        lengths = np.minimum(rng.lognormal(6.5, 1.2, int(rng.integers(8 * dp, 40 * dp))), 16384)
        lengths = lengths.astype(np.int64) + 1
        options = {"cost": "flops", "model": "qwen3-8b", "max_tokens": 8192}
        try:
            theirs = sb.plan_step(
                lengths, dp, strategy="megatron_dp_balanced", allow_oversize=True, **options
            )
        except ValueError:
            continue  # Megatron's own assertion (a single packed micro-batch)
        groups = schedule(
            list(enumerate(lengths.tolist())),
            max_seqlen_per_dp_cp_rank=8192,
            cp_size=1,
            dp_size=dp,
            cost="flops",
            model="qwen3-8b",
        )
        ours = _costs(groups, lengths, dp, 1).sum(axis=0).max()
        assert ours <= theirs.step_cost * (1 + 1e-12)


def test_options_that_megatron_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens is Megatron's to set"):
        schedule([(0, 5)], max_seqlen_per_dp_cp_rank=8, cp_size=1, dp_size=1, max_tokens=4)


def test_install_registers_a_scheduler_megatron_builds(registry: types.ModuleType) -> None:
    cls = install(cost="flops", model="qwen3-8b")
    assert issubclass(cls, registry.BasePackingScheduler)
    assert issubclass(cls, registry.DpBalancedScheduler)  # keeps its run pipeline
    assert registry.PackingSchedulerEnum["SEQBALANCE"].value == "seqbalance"
    assert registry.scheduler_map[registry.PackingSchedulerEnum.DP_BALANCED] is (
        registry.DpBalancedScheduler
    )
    config = types.SimpleNamespace(
        sequence_packing_scheduler="seqbalance", max_seqlen_per_dp_cp_rank=4096
    )
    lengths = sb.datasets.load("sharegpt")[:64].tolist()
    groups = registry.wrap_data_iterator(config, lengths, 4)
    assert groups == schedule(
        list(enumerate(lengths)),
        max_seqlen_per_dp_cp_rank=4096,
        cp_size=1,
        dp_size=4,
        cost="flops",
        model="qwen3-8b",
    )
    with pytest.raises(ValueError, match="identifier"):
        install("not a name")


def test_a_megatron_without_the_registry_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = types.ModuleType("megatron.core.datasets.data_schedule")
    monkeypatch.setitem(sys.modules, "megatron.core.datasets.data_schedule", bare)
    with pytest.raises(ImportError, match=r"no megatron-core release up to 0\.19\.2"):
        install()


def test_the_installed_registry_when_there_is_one() -> None:
    try:
        module: Any = _data_schedule()
    except ImportError as error:
        pytest.skip(str(error))
    cls = install("seqbalance_test", cost="tokens")
    assert issubclass(cls, module.BasePackingScheduler)
    scheduler = cls(4096, 1, 2, None)
    groups = scheduler.get_groups_and_subsamples(list(enumerate([100] * 8)))
    assert sorted(i for step in groups for packed in step for i in packed) == list(range(8))


def test_empty_micro_batches_are_refused_as_megatron_refuses_them() -> None:
    """Megatron's pipeline packs each micro-batch with ``torch.cat`` of its sequences, which
    fails on none, on the ranks given an empty one only; its ``DpBalancedScheduler`` asserts
    there are enough sequences instead. ``allow_empty=True`` returned empty micro-batches
    (3 sequences, dp 2 x VPP group 4: 5 of 8 empty); and the refusal without it suggested
    ``allow_empty=True``. Now both name what Megatron can run."""
    pairs = [(0, 100), (1, 200), (2, 300)]
    sizes = {"max_seqlen_per_dp_cp_rank": 1000, "cp_size": 1, "dp_size": 2}
    with pytest.raises(ValueError, match=r"^allow_empty=True is not supported: Megatron packs"):
        schedule(pairs, **sizes, microbatch_group_size_per_vp_stage=4, allow_empty=True)
    with pytest.raises(ValueError) as refusal:
        schedule(pairs, **sizes, microbatch_group_size_per_vp_stage=4)
    assert str(refusal.value) == (
        "lengths has 3 samples, fewer than the 8 micro-batch slots (dp_size = 2 x 4 "
        "micro-batches), so some micro-batch would be empty; Megatron runs every micro-batch on "
        "every rank, none empty: schedule more sequences per global batch, or a smaller "
        "microbatch_group_size_per_vp_stage (the micro-batch count is a multiple of its 4 under "
        "virtual pipelining)"
    )
    with pytest.raises(ValueError, match="Megatron runs every micro-batch") as refusal:
        schedule([(0, 100)], **sizes)
    assert "allow_empty" not in str(refusal.value)
    assert "microbatch_group_size_per_vp_stage" not in str(refusal.value)


@pytest.mark.parametrize("name", ["dp_balanced", "DP_Balanced", 5, None])
def test_install_never_replaces_megatrons_own_scheduler(
    registry: types.ModuleType, name: object
) -> None:
    """adv14b D10: ``install("dp_balanced")`` replaced Megatron's own ``DpBalancedScheduler``
    in ``scheduler_map`` under Megatron's name, without a word (``"default_dynamic_cp"`` too,
    whose call passes ``min_cp_size``, which this scheduler does not take); a name that is no
    string raised AttributeError. A ValueError naming it now, Megatron's map unchanged; a
    second install under seqbalance's own name still replaces the first."""
    named = "is Megatron's own DpBalancedScheduler" if isinstance(name, str) else "an identifier"
    with pytest.raises(ValueError, match=named):
        install(name)
    assert registry.scheduler_map == {
        registry.PackingSchedulerEnum.DP_BALANCED: registry.DpBalancedScheduler
    }
    first = install("seqbalance")
    second = install("seqbalance", objective="lockstep")
    assert registry.scheduler_map[registry.PackingSchedulerEnum.SEQBALANCE] is second
    assert first is not second
