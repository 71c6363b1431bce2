"""``seqbalance.integrations.verl.install``: the cost verl's call sites plan with, and
installations that nest, against a stand-in for ``verl.utils.seqlen_balancing`` (so it runs
without verl; tests/test_integrations_verl_parity.py installs into verl itself)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance import FlopsModel, ModelSpec, PlanOptions
from seqbalance.integrations import verl as sbv

torch = pytest.importorskip("torch")
# Not imported here (a module-level importorskip would): importing tensordict imports
# torch._dynamo, ~1.3 s of CPU at collection in every xdist worker; imported where used.
if importlib.util.find_spec("tensordict") is None:
    pytest.skip("tensordict is not installed", allow_module_level=True)

VERL = "verl.utils.seqlen_balancing"
DCP = "verl.utils.dynamic_cp_scheduler"
ENTRY = "get_megatron_dynamic_cp_scheduler_cls"
LINE = "from verl.utils.seqlen_balancing import calculate_workload, rearrange_micro_batches"
ENGINE = f"{LINE}\nfrom {DCP} import {ENTRY}"


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(source, module.__dict__)
    sys.modules[name] = module
    return module


@contextlib.contextmanager
def stand_in_verl(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """verl's balancing module and its dynamic-CP module (with function objects of their own)
    and one importer of both, removed again at the end, as is every installation."""
    for name in (VERL, DCP, "verl._engine", "verl._later"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module, dcp = types.ModuleType(VERL), types.ModuleType(DCP)
    for target, name in [*((module, n) for n in sbv.VERL_FUNCTIONS), (dcp, ENTRY)]:

        def original(*args: object, _name: str = name, **kwargs: object) -> str:
            return f"verl's {_name}"

        setattr(target, name, original)
    monkeypatch.setitem(sys.modules, VERL, module)
    monkeypatch.setitem(sys.modules, DCP, dcp)
    _module("verl._engine", ENGINE)
    try:
        yield module
    finally:
        sbv.uninstall()
        ours = ("verl._engine", "verl._later", "verl._user")
        for name in [name for name in sys.modules if name.startswith(ours)]:
            del sys.modules[name]


@pytest.fixture
def fake_verl(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    with stand_in_verl(monkeypatch) as module:
        yield module


def _bindings(verl: types.ModuleType) -> list[object]:
    """What verl's module and its importers hold now."""
    engine = sys.modules["verl._engine"]
    held = [getattr(verl, name) for name in sbv.VERL_FUNCTIONS]
    return [*held, engine.calculate_workload, engine.rearrange_micro_batches]


def lengths_batch(lengths: list[int]) -> object:
    rows = [torch.full((n,), i) for i, n in enumerate(lengths)]
    ids = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    from tensordict import TensorDict

    return TensorDict({"input_ids": ids}, batch_size=[len(lengths)])


def test_the_installed_cost_reaches_verls_call_sites(fake_verl) -> None:
    lengths = [3000, 2500, 900, 800, 700, 600, 500, 400, 300, 200]
    flops = FlopsModel(ModelSpec.preset("qwen3-8b")).per_sample(np.array(lengths))
    engine = sys.modules["verl._engine"]
    with sbv.install(model="qwen3-8b") as installation:
        assert installation.active and isinstance(installation.options.cost, ModelSpec)
        # verl's driver balances and sorts by calculate_workload: now the model's FLOPs.
        workload = engine.calculate_workload(torch.tensor(lengths))
        assert workload.dtype == torch.float64
        np.testing.assert_allclose(workload.numpy(), flops, rtol=1e-12)
        np.testing.assert_allclose(fake_verl.calculate_workload(lengths), flops, rtol=1e-12)
        # verl calls rearrange_micro_batches without a cost: it plans with the model's.
        got = engine.rearrange_micro_batches(lengths_batch(lengths), 4000)[1]
        want = sbv.rearrange_micro_batches(lengths_batch(lengths), 4000, model="qwen3-8b")[1]
        assert got == want
        verls = sbv.rearrange_micro_batches(lengths_batch(lengths), 4000)[1]
        assert got != verls  # the workload 24576 L + L^2 packs these differently
        # An explicit keyword still wins over the installation's.
        assert engine.rearrange_micro_batches(lengths_batch(lengths), 4000, cost=None)[1] == (verls)
    assert engine.calculate_workload == fake_verl.calculate_workload
    assert engine.calculate_workload(1) == "verl's calculate_workload"


def test_without_settings_the_helpers_are_verls_values(fake_verl, monkeypatch) -> None:
    monkeypatch.delenv(sbv.ENV_OPTIONS, raising=False)
    with sbv.install() as installation:
        assert installation.options is None
        assert fake_verl.calculate_workload([10, 3]).tolist() == [24576 * 10 + 100, 24576 * 3 + 9]
        assert fake_verl.karmarkar_karp.__wrapped__ is sbv.karmarkar_karp


def test_settings_from_the_environment_for_rays_setup_hook(fake_verl, monkeypatch, tmp_path):
    options = PlanOptions(cost="flops", model="qwen3-8b")
    flops = FlopsModel(ModelSpec.preset("qwen3-8b")).per_sample(np.array([100, 7]))
    path = tmp_path / "options.json"
    path.write_text(options.to_json())
    for value in (options.to_json(), str(path)):
        monkeypatch.setenv(sbv.ENV_OPTIONS, value)
        with sbv.install() as installation:
            assert installation.options == options
            np.testing.assert_allclose(fake_verl.calculate_workload([100, 7]), flops)
    monkeypatch.setenv(sbv.ENV_OPTIONS, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="SEQBALANCE_VERL_OPTIONS"):
        sbv.install()
    monkeypatch.setenv(sbv.ENV_OPTIONS, '{"format": "nope"}')
    with pytest.raises(ValueError, match="SEQBALANCE_VERL_OPTIONS"):
        sbv.install()
    assert not sbv.installations()


def test_bad_settings_fail_before_anything_is_replaced(fake_verl) -> None:
    before = _bindings(fake_verl)
    with pytest.raises(ValueError, match="max_tokens=4096"):
        sbv.install(options=PlanOptions(max_tokens=4096))
    with pytest.raises(ValueError, match="not both"):
        sbv.install(options=PlanOptions(), model="qwen3-8b")
    with pytest.raises(ValueError, match="goes with cost=None"):
        sbv.install(cost="tokens", model="qwen3-8b")
    with pytest.raises(ValueError):
        sbv.install(model="no-such-model")
    assert _bindings(fake_verl) == before


def test_an_inner_install_restores_the_outer_one(fake_verl) -> None:
    originals = _bindings(fake_verl)
    outer = sbv.install()  # process-wide, as Ray's setup hook does
    installed = _bindings(fake_verl)
    assert all(a is not b for a, b in zip(installed, originals, strict=True))
    with sbv.install(model="qwen3-8b"):
        later = _module("verl._later", LINE)  # imported inside the inner block
        assert later.calculate_workload([10])[0] != 24576 * 10 + 100
    assert _bindings(fake_verl) == installed
    assert later.calculate_workload is fake_verl.calculate_workload
    assert outer.active
    outer.uninstall()
    assert _bindings(fake_verl) == originals
    assert later.calculate_workload is originals[0]


OPS = st.lists(
    st.one_of(st.tuples(st.just("install"), st.sampled_from([None, "qwen3-8b"])),
              st.tuples(st.just("remove"), st.integers(0, 10**6)),
              st.tuples(st.just("import"), st.just(0))),
    max_size=12,
)  # fmt: skip


@settings(max_examples=examples(200, quick=10), deadline=None)
@given(OPS)
def test_any_order_of_installs_and_removals_restores_exactly(ops) -> None:
    """Model: the functions in verl are those of the newest installation still active (verl's
    own when none is), in verl's module and in every importer, whenever it was imported."""
    with pytest.MonkeyPatch.context() as monkeypatch, stand_in_verl(monkeypatch) as verl:
        dcp = sys.modules[DCP]
        originals = [getattr(verl, name) for name in sbv.VERL_FUNCTIONS]
        entry = getattr(dcp, ENTRY)
        rearrange = sbv.VERL_FUNCTIONS.index("rearrange_micro_batches")
        active: list[sbv.Installation] = []
        importers = [sys.modules["verl._engine"]]
        for op, value in ops:
            if op == "install":
                active.append(sbv.install(model=value))
            elif op == "remove" and active:
                active.pop(value % len(active)).uninstall()
            elif op == "import":
                importers.append(_module(f"verl._user{len(importers)}", ENGINE))
            want = (
                originals
                if not active
                else [active[-1].functions[name] for name in sbv.VERL_FUNCTIONS]
            )
            # The dynamic-CP entry: the newest installation with a model replaced it.
            owners = [inst for inst in active if ENTRY in inst.functions]
            want_entry = owners[-1].functions[ENTRY] if owners else entry
            assert [getattr(verl, name) for name in sbv.VERL_FUNCTIONS] == want
            assert getattr(dcp, ENTRY) is want_entry
            for module in importers:
                assert module.calculate_workload is want[0]
                assert module.rearrange_micro_batches is want[rearrange]
                assert getattr(module, ENTRY) is want_entry
            assert sbv.installations() == active
        sbv.uninstall()
        assert [getattr(verl, name) for name in sbv.VERL_FUNCTIONS] == originals
        assert all(m.calculate_workload is originals[0] for m in importers)
        assert all(getattr(m, ENTRY) is entry for m in [dcp, *importers])
