"""Test configuration: hypothesis profiles (see ``_profiles.py``; derandomized in CI so a
failure reproduces), one CPU thread per process, and the order that lets the README's
``pytest -n 2 --dist loadfile`` (pytest-xdist: one worker per core, a module's tests on one
worker so its module-scoped set-ups run once) finish both workers together."""

import os
import sys

import pytest
from _profiles import DERANDOMIZED, SCALES, active_profile
from hypothesis import HealthCheck, settings

for _name, _scale in SCALES.items():
    settings.register_profile(
        _name,
        max_examples=round(100 * _scale),
        deadline=None,
        derandomize=_name in DERANDOMIZED,
        print_blob=_name in DERANDOMIZED,
        suppress_health_check=[HealthCheck.too_slow],
    )
settings.load_profile(active_profile())

# Two xdist workers and the gloo ranks they start already fill a 2-core machine; torch's own
# thread pool on top of them only adds contention. Inherited by every process a test starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")

SLOWEST_FIRST = (
    "test_integrations_hf_resume.py",
    "test_plan_properties.py",
    "test_integrations_hf.py",
    "test_runtime_context_parallel.py",
    "test_plan_context_parallel_properties.py",
    "test_cli_bench.py",
    "test_runtime_samplers_lazy.py",
    "test_integrations_megatron.py",
    "test_runtime_examples.py",
    "test_runtime_context_parallel_hf.py",
    "test_integrations_verl_parity.py",
    "test_runtime_distributed.py",
    "test_runtime_samplers.py",
    "test_integrations_verl_install.py",
    "test_measure_launch.py",
    "test_plan_speeds.py",
)
"""Modules that take the longest in the README's test command (per-module seconds of
``pytest --durations=0 -n 2 --dist loadfile``), started first so that no worker is left alone
with one of them at the end; the others keep their order. Only a hint: a module missing from
the list runs in its place, a listed one that is gone changes nothing."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the ``SLOWEST_FIRST`` modules first (a stable sort: the order inside a module, and
    of the other modules, stays as collected); where the collected tests start ranks, their fork
    server imports ``RANK_PRELOAD`` too."""
    items.sort(
        key=lambda item: (
            SLOWEST_FIRST.index(item.path.name)
            if item.path.name in SLOWEST_FIRST
            else len(SLOWEST_FIRST)
        )
    )
    launch = sys.modules.get("seqbalance.measure.launch")
    if launch is not None:
        missing = [name for name in RANK_PRELOAD if name not in launch.FORKSERVER_PRELOAD]
        launch.FORKSERVER_PRELOAD = (*launch.FORKSERVER_PRELOAD, *missing)


RANK_PRELOAD = (
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3.modeling_qwen3",
    "megatron.core.parallel_state",
    "megatron.core.pipeline_parallel",
    "megatron.core.distributed",
    "megatron.core.transformer.transformer_config",
)
"""Modules the fork server of the suite's ranks imports once, beside torch (it is started by
the first launch of a worker, from ``seqbalance.measure.launch.FORKSERVER_PRELOAD``): each rank
that builds a Hugging Face or Megatron model imported them again, about 3 s of CPU per rank for
transformers and 1.5 s for megatron-core (4 per launch in some tests). Each rank is still a
fresh process forked from the server; one that is not installed is left out (the server
skips a preload that raises ImportError)."""
