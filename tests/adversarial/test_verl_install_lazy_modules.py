"""Adversarial (adv9b P12): ``install()`` / ``uninstall()`` looked for modules that imported
verl's functions by reading ``__dict__`` of every entry of ``sys.modules`` with getattr. A module
that importlib's ``LazyLoader`` had not loaded yet (``lazy_loader``, used by scikit-image,
networkx and others, makes them) loads on any attribute access: install() ran its code, and one
whose code raised (an optional dependency missing) made install() fail with that unrelated
error (and would have stopped an uninstall half-way). Now a namespace is read without touching
the module: nothing loads, install and uninstall go through. Against a stand-in for verl."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from seqbalance.integrations import verl as sbv

pytest.importorskip("torch")

VERL = "verl.utils.seqlen_balancing"


def _lazy(monkeypatch: pytest.MonkeyPatch, tmp_path, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    loader.exec_module(module)  # lazy: runs at the first attribute access


def test_modules_not_yet_loaded_are_not_loaded_by_install(monkeypatch, tmp_path) -> None:
    for parent in ("verl", "verl.utils"):
        package = types.ModuleType(parent)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, parent, package)
    verl = types.ModuleType(VERL)
    for name in sbv.VERL_FUNCTIONS:
        setattr(verl, name, lambda *args, _name=name: f"verl's {_name}")
    originals = dict(vars(verl))
    monkeypatch.setitem(sys.modules, VERL, verl)
    monkeypatch.delitem(sys.modules, "verl.utils.dynamic_cp_scheduler", raising=False)
    ran: list[str] = []
    monkeypatch.setattr(sys, "adv9b_ran", ran, raising=False)
    _lazy(monkeypatch, tmp_path, "adv9b_lazy_side", "import sys\nsys.adv9b_ran.append('ran')\n")
    _lazy(monkeypatch, tmp_path, "adv9b_lazy_broken", "raise RuntimeError('optional dep missing')")
    installation = sbv.install(model="qwen3-8b")
    try:
        assert verl.rearrange_micro_batches is installation.functions["rearrange_micro_batches"]
    finally:
        installation.uninstall()
    assert all(getattr(verl, name) is originals[name] for name in sbv.VERL_FUNCTIONS)
    assert ran == [] and not sbv.installations()
