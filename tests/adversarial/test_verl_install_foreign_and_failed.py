"""Adversarial (adv8b L5, L6; adv9b P12, P14): ``seqbalance.integrations.verl.install`` among
other patches and failed installs (against a stand-in for verl's modules, as tests/integrations
does).

L5: removing an installation put back what its bindings held before it even where someone else
had replaced them since (another library's patch of ``rearrange_micro_batches`` made after
``install()``): that patch was undone by our ``uninstall()``. Now only a binding that still
holds the installation's own function is put back.

L6: an install whose later target failed to import otherwise than with ImportError (verl's
dynamic-CP module raising RuntimeError in a broken environment) raised with verl's balancing
functions already replaced and no installation recorded: nothing, not even ``uninstall()``,
could put verl's own back. Now a failed install puts back what it replaced before raising."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import pytest
from _profiles import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.integrations import verl as sbv

pytest.importorskip("torch")

VERL = "verl.utils.seqlen_balancing"
DCP = "verl.utils.dynamic_cp_scheduler"
NAMES = ("calculate_workload", "rearrange_micro_batches")
IMPORT_LINE = f"from {VERL} import {', '.join(NAMES)}"


class _DynamicCP:
    """A meta path finder for verl's dynamic-CP module: absent (ImportError: install skips
    it), or, when ``broken``, raising RuntimeError."""

    broken = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == DCP:
            if self.broken:
                raise RuntimeError("dynamic CP unavailable here (simulated)")
            raise ModuleNotFoundError(name)


def _stand_in(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    # Stand-in parent packages too: where verl is not installed (CI's main environment), the
    # import of the dynamic-CP module stopped at its missing parent with ImportError, before
    # the meta path finder below could play it broken.
    for parent in ("verl", "verl.utils"):
        package = types.ModuleType(parent)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, parent, package)
    module = types.ModuleType(VERL)
    for name in sbv.VERL_FUNCTIONS:

        def original(*args: object, _name: str = name, **kwargs: object) -> str:
            return f"verl's {_name}"

        setattr(module, name, original)
    monkeypatch.setitem(sys.modules, VERL, module)
    monkeypatch.delitem(sys.modules, DCP, raising=False)
    return module


def _importer(monkeypatch: pytest.MonkeyPatch, number: int) -> types.ModuleType:
    module = types.ModuleType(f"verl._adv8b_user{number}")
    exec(IMPORT_LINE, module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


OPS = st.lists(
    st.one_of(st.tuples(st.just("install"), st.sampled_from([None, "qwen3-8b"])),
              st.tuples(st.just("remove"), st.integers(0, 10**6)),
              st.tuples(st.just("foreign"), st.just(0)),
              st.tuples(st.just("failing"), st.just(0)),
              st.tuples(st.just("import"), st.just(0))),
    max_size=12,
)  # fmt: skip


def _wrapping(inner: Any) -> Any:
    def wrapper(*args: object, **kwargs: object) -> Any:
        return inner(*args, **kwargs)

    return wrapper


def _foreign_patch(modules: list[types.ModuleType], layers: list) -> None:
    """Another library wraps verl's functions everywhere they are bound (as install does)."""
    patch = {name: _wrapping(getattr(modules[0], name)) for name in NAMES}
    for module in modules:
        for name, function in patch.items():
            setattr(module, name, function)
    layers.append(("foreign", patch))


@settings(max_examples=examples(200), deadline=None)
@given(OPS)
def test_bindings_are_the_newest_patch_still_in_place(ops) -> None:
    """Model: every patch (ours or another library's) is a layer; removing an installation
    takes its layer out wherever it lies; every binding is the top layer's (verl's own when
    none); a failed install adds none."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        verl = _stand_in(monkeypatch)
        finder = _DynamicCP()
        monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
        originals = {name: getattr(verl, name) for name in NAMES}
        modules = [verl, _importer(monkeypatch, 0)]
        layers: list[tuple[Any, dict[str, Any]]] = []
        try:
            for op, value in ops:
                if op == "install":
                    installation = sbv.install(model=value)
                    layers.append((installation, installation.functions))
                elif op == "remove":
                    ours = [layer for layer in layers if layer[0] != "foreign"]
                    if ours:
                        gone = ours[value % len(ours)]
                        gone[0].uninstall()
                        layers.remove(gone)
                elif op == "foreign":
                    _foreign_patch(modules, layers)
                elif op == "failing":
                    finder.broken = True
                    with pytest.raises(RuntimeError, match="simulated"):
                        sbv.install(model="qwen3-8b")
                    finder.broken = False
                else:
                    modules.append(_importer(monkeypatch, len(modules)))
                want = layers[-1][1] if layers else originals
                for module in modules:
                    assert [getattr(module, name) for name in NAMES] == [
                        want[name] for name in NAMES
                    ], (op, module.__name__)
        finally:
            sbv.uninstall()


@pytest.mark.parametrize(
    "ops",
    [
        [("install", None), ("foreign", 0), ("remove", 0)],  # L5: the later patch is kept
        [("install", None), ("foreign", 0), ("install", "qwen3-8b"), ("remove", 0)],
        [("failing", 0)],  # L6: nothing stays replaced
        [("install", None), ("failing", 0), ("remove", 0)],
    ],
)
def test_the_cases_found(ops) -> None:
    test_bindings_are_the_newest_patch_still_in_place.hypothesis.inner_test(ops)


@pytest.mark.parametrize("removed_first", ["older", "newer"])
def test_no_removed_installation_stays_where_verl_was_patched_in_between(removed_first) -> None:
    """adv9b P14: another library patched verl's module only (or it was reloaded) between two
    installs, so the newer one found that patch there and never reached the modules that had
    imported the older one's function; removing the older one first, then the newer, left those
    modules holding the older (removed) installation's function for good."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        verl = _stand_in(monkeypatch)
        user = _importer(monkeypatch, 0)
        originals = {name: getattr(verl, name) for name in NAMES}
        try:
            older = sbv.install()
            patch = {name: _wrapping(getattr(verl, name)) for name in NAMES}
            for name, function in patch.items():
                setattr(verl, name, function)  # verl's module only, as a profiler might
            newer = sbv.install(model="qwen3-8b")
            first, second = (older, newer) if removed_first == "older" else (newer, older)
            first.uninstall()
            if removed_first == "older":  # the newest installation reaches every module
                assert all(getattr(user, n) is newer.functions[n] for n in NAMES)
            second.uninstall()
            assert [getattr(user, n) for n in NAMES] == [originals[n] for n in NAMES]
            assert [getattr(verl, n) for n in NAMES] == [patch[n] for n in NAMES]
        finally:
            sbv.uninstall()


def _lazy(monkeypatch: pytest.MonkeyPatch, folder: Any, name: str, code: str) -> None:
    """A module that importlib's LazyLoader runs at the first attribute access."""
    (folder / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(folder))
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    loader.exec_module(module)


def test_modules_not_yet_loaded_are_not_loaded_by_install(tmp_path) -> None:
    """adv9b P12: install() / uninstall() read every sys.modules entry's ``__dict__`` with
    getattr, which loads a module LazyLoader has not loaded yet (``lazy_loader``, used by
    scikit-image, networkx, ...): install() ran its code, and one whose code raised (an
    optional dependency missing) made install() fail with that unrelated error."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        verl = _stand_in(monkeypatch)
        originals = {name: getattr(verl, name) for name in sbv.VERL_FUNCTIONS}
        ran: list[str] = []
        monkeypatch.setattr(sys, "adv9b_ran", ran, raising=False)
        _lazy(monkeypatch, tmp_path, "adv9b_lazy_side", "import sys\nsys.adv9b_ran.append(1)\n")
        _lazy(monkeypatch, tmp_path, "adv9b_lazy_broken", "raise RuntimeError('optional dep')")
        installation = sbv.install(model="qwen3-8b")
        try:
            assert verl.rearrange_micro_batches is installation.functions["rearrange_micro_batches"]
        finally:
            installation.uninstall()
        assert all(getattr(verl, name) is originals[name] for name in sbv.VERL_FUNCTIONS)
        assert ran == [] and not sbv.installations()
