"""Test configuration: hypothesis profiles (see ``_profiles.py``; derandomized in CI so a
failure reproduces), one CPU thread per process, and the order that lets the README's
``pytest -n 2 --dist loadfile`` (pytest-xdist: one worker per core, a module's tests on one
worker so its module-scoped set-ups run once) finish both workers together, and the garbage
collector kept off the modules that collection imports."""

import gc
import os
import sys
from collections.abc import Generator

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
    "test_plan_speeds.py",
    "test_plan_properties.py",
    "test_plan_bruteforce.py",
    "test_plan_context_parallel_properties.py",
    "test_runtime_examples.py",
    "test_runtime_closed_loop.py",
    "test_runtime_window.py",
    "test_measure_launch.py",
    "test_integrations_hf_resume.py",
    "test_closed_loop_level_shift.py",
    "test_integrations_verl_parity.py",
    "test_architecture.py",
    "test_plan_epoch.py",
    "test_integrations_megatron.py",
    "test_runtime_samplers_fit.py",
    "test_plan_intervals.py",
    "test_plan_packing.py",
    "test_runtime_samplers_files.py",
    "test_device_check.py",
    "test_plan_rivals.py",
    "test_docs_examples.py",
    "test_cli_bench.py",
    "test_runtime_context_parallel.py",
    "test_cli_simulate.py",
    "test_verl_install_foreign_and_failed.py",
)
"""Modules that take the longest in the README's test command (per-module seconds of
``pytest --durations=0 -n 2 --dist loadfile``, the 25 longest), started first so that no worker
is left alone with one of them at the end; the others keep their order. 25: in a simulation of
xdist's loadfile scheduling on those seconds, each module 30% slower or faster at random, the
two workers end 0.3% apart on average (the 17 listed before: 1.0%, 15 or 20: 0.6%, 2.6%).
Only a hint: a module missing from the list runs in its place, a listed one that is gone
changes nothing."""


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    """Collect with the cyclic garbage collector paused, then move everything collection made
    (torch, transformers and the other imports: about 400,000 objects) out of its reach.

    Each full collection walks every tracked object, about 0.15-0.3 s once torch and the test
    modules are imported; collection's imports and assertion rewriting set off about 20 of
    them (2-3 s of CPU in each xdist worker), and every later one during the tests walked
    those same long-lived objects again. Reference counting frees what it always freed; one
    full collection at the end frees the cycles collection left, before ``gc.freeze``
    (undone at the end of the session: the interpreter's exit frees them as it always did,
    which extensions that check for leaks at exit, such as triton's, expect).
    """
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def pytest_unconfigure() -> None:
    """Hand the objects frozen after collection back to the collector (see above)."""
    gc.unfreeze()


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
    # What a rank imports when it unpickles its test's worker function (the test module's own
    # imports): about 0.3 s of CPU per rank, for hundreds of ranks.
    "pytest",
    "hypothesis",
    "seqbalance.plan",
    "seqbalance.runtime",
    "seqbalance.runtime.context_parallel",
    # What its chunk attention imports on first use (it imports torch._dynamo, about 1.3 s).
    "torch.nn.attention.bias",
    "seqbalance.measure.toy_model",
    # Ranks that build a Hugging Face model: about 3 s of CPU per rank, 4 ranks a launch in
    # some tests. Not megatron-core: importing it changes how every tensor pickles (its
    # safe_globals), so the launcher would need it to read any rank's result.
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3.modeling_qwen3",
)
"""Modules the fork server of the suite's ranks imports once, beside torch (the server starts
at a worker's first launch, from ``seqbalance.measure.launch.FORKSERVER_PRELOAD``), instead of
every rank importing them again. Each rank is still a fresh process forked from the server; a
module that is not installed is left out (the server skips a preload that raises ImportError).
Tensors pickle as before (checked); their side effects are those the ranks of the tests that
import them had anyway: torch._dynamo's wrapper around ``torch.manual_seed`` and two warning
filters (sympy's deprecations, transformers' lr_scheduler warnings)."""
