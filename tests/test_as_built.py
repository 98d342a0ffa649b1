"""Cached llvm hits answer as the built llvm module, also where TVM hands them out as plain Modules.

A hit runs from a loaded shared library (kind `library` to TVM); registered by handle, it and
every handle of it in another module's import tree answer `kind`, the properties, sources and
`export_library` as the built module does (src/codegen_cache/_artifacts/_as_built.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import CachedLibraryModule, _as_built
from conftest import run_binary
from warm_scenarios import _Relax


@pytest.fixture
def warm(tmp_path):
    """(a cache whose vadd entry is a shared library, the lowered vadd)."""
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cache.lower(mod, target)
    assert cache.flush(upgrades=True, timeout=240)
    return tmp_path / "cache", mod, target


def _library_hit(directory, mod, target):
    module, outcome = cc.CodegenCache(directory, memory_entries=0).lower_with_outcome(mod, target)
    assert outcome.tier == "disk" and isinstance(module, CachedLibraryModule)
    return module


def test_a_library_hit_answers_as_the_built_module(warm):
    directory, mod, target = warm
    built = tvm.get_global_func("target.build.llvm")(mod, target)
    hit = _library_hit(directory, mod, target)
    for check in (lambda m: m.kind, lambda m: m.get_property_mask(), lambda m: m.is_runnable(),
                  lambda m: m.is_binary_serializable(), lambda m: m.is_compilation_exportable(),
                  lambda m: m.inspect_source("ll"), lambda m: list(m.get_function("get_func_names")()),
                  lambda m: m.get_function("__tvm_is_system_module")(), lambda m: m.implements_function("vadd"),
                  lambda m: m.get_function("_get_target_string")()):
        assert check(hit) == check(built)
    assert np.array_equal(run_binary(hit), run_binary(built))


def _plain_handle(hit):
    holder = tvm.get_global_func("runtime.SourceModuleCreate")("", "c")  # any module that can import one
    holder.import_module(hit)
    plain = holder.imports[0]
    assert type(plain) is tvm.runtime.Module and plain.same_as(hit)
    return plain


def test_a_handle_tvm_hands_back_answers_as_the_hit_does_while_the_switch_is_on(warm):
    directory, mod, target = warm
    hit = _library_hit(directory, mod, target)
    plain = _plain_handle(hit)
    assert (plain.kind, plain.is_compilation_exportable()) == ("library", False)  # TVM's own class, untouched
    cc.enable(children=False)
    try:
        assert (plain.kind, plain.is_compilation_exportable()) == ("llvm", True)
    finally:
        cc.disable()
    assert (plain.kind, plain.is_compilation_exportable()) == ("library", False)
    assert (hit.kind, hit.is_compilation_exportable()) == ("llvm", True)  # the hit itself, always


def test_other_modules_keep_their_own_answers(warm, tmp_path):
    directory, mod, target = warm
    _library_hit(directory, mod, target)
    built = tvm.tirx.build(kernels.vadd, "llvm")
    built.export_library(str(tmp_path / "user.so"))
    loaded = tvm.runtime.load_module(str(tmp_path / "user.so"))
    assert (loaded.kind, loaded.is_compilation_exportable(), loaded.is_binary_serializable()) == ("library", False, True)
    assert built.kind == "llvm"


@pytest.mark.timeout(300)
def test_exporting_a_relax_executable_of_a_hit_leaves_the_callers_tree_as_it_was(tmp_path, monkeypatch):
    import routing

    routing.route(children=False)
    try:
        cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
        with cc.use_cache(cache):
            relax.build(_Relax, "llvm")
        assert cache.flush(upgrades=True, timeout=240)
        with cc.use_cache(cc.CodegenCache(tmp_path / "cache", memory_entries=0)):
            ex = relax.build(_Relax, "llvm")
    finally:
        routing.unroute()
    before = [m.__chandle__() for m in ex.mod.imports]
    ex.export_library(str(tmp_path / "model.so"))
    assert [m.__chandle__() for m in ex.mod.imports] == before
    x = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    loaded = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "model.so")), tvm.cpu())
    assert np.array_equal(loaded["main"](x, x).numpy(), relax.VirtualMachine(ex, tvm.cpu())["main"](x, x).numpy())


def test_the_registry_is_bounded_and_a_module_handed_out_again_is_registered_again(warm, monkeypatch):
    directory, mod, target = warm
    monkeypatch.setattr(_as_built, "MAX_MODULES", 2)
    cache = cc.CodegenCache(directory)
    first = cache.lower(mod, target)  # a disk hit, kept in the memory tier
    others = [_library_hit(directory, mod, target) for _ in range(2)]
    assert _as_built.record_of(first) is None and first.kind == "llvm"  # dropped: the oldest; it still answers
    assert cache.lower(mod, target) is first and _as_built.record_of(first) is not None  # a memory hit: again
    assert all(_as_built.record_of(o) is not None for o in others[1:])
