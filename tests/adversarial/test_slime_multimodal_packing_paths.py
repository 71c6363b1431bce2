"""Review14 item 5 (adv14b D9): ``multimodal_aware_packing = "separate"`` / ``"separate_raw"``
was refused on every call, but slime's ``dp_schedule.py`` applies it only on the dynamic path
(to the samples ``sample_is_multimodal`` marks): its static path ignores it, so a config that
sets it globally was refused on a static run slime runs unchanged. It is ignored on the static
path now, as slime does, and still refused on the dynamic path (the drop-in is not given which
samples are multimodal), saying so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from _configs import SLIME_TINY

from seqbalance.integrations.slime import ScheduleError, build_dp_schedule

CONFIG = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
LENGTHS = [30, 25, 20, 20, 15, 10, 30, 25]
KW = {"global_batch_size": 8, "rollout_indices": list(range(8))}


def _args(packing: str, *, dynamic: bool) -> SimpleNamespace:
    return SimpleNamespace(
        micro_batch_size=2, use_dynamic_batch_size=dynamic, max_tokens_per_gpu=100,
        balance_data=True, balance_by_flops=False, multimodal_aware_packing=packing,
        **SLIME_TINY,
    )  # fmt: skip


@pytest.mark.parametrize("packing", ["separate", "separate_raw"])
def test_the_static_path_ignores_it_as_slime_does(packing: str) -> None:
    off = build_dp_schedule(_args("off", dynamic=False), CONFIG, LENGTHS, **KW)
    assert build_dp_schedule(_args(packing, dynamic=False), CONFIG, LENGTHS, **KW) == off


@pytest.mark.parametrize("packing", ["separate", "separate_raw"])
def test_the_dynamic_path_refuses_it_naming_what_it_cannot_see(packing: str) -> None:
    with pytest.raises(ScheduleError) as raised:
        build_dp_schedule(_args(packing, dynamic=True), CONFIG, LENGTHS, **KW)
    message = str(raised.value)
    assert message.startswith(
        f"args.multimodal_aware_packing = {packing!r} is not supported by seqbalance's "
        "build_dp_schedule on the dynamic path (use_dynamic_batch_size): it is not given which "
        "samples are multimodal"
    ), message
    assert build_dp_schedule(_args("off", dynamic=True), CONFIG, LENGTHS, **KW)
