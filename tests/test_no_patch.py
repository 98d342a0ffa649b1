"""Nothing of TVM is changed by a cache that was not switched on, and disable() undoes everything.

A served llvm hit answers as TVM's own result through its own class (export included), so a
cache used directly (`CodegenCache.lower`) leaves tvm.runtime.Module and TVM's global functions
as they are; enable() may put methods on them, and disable() takes every one of them off again
and leaves no way into the cache, also through a router someone captured while it was on.
Bad input of the same entry points: a PrimFunc given to `lower` unprepared, a bad CLI target.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import tvm
import tvm_ffi

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import CachedLibraryModule
from codegen_cache._cli import _main as _cli
from conftest import run_binary

TVM_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (tvm, tvm_ffi))


def _module_attributes() -> dict[str, dict[str, object]]:
    """Every attribute of tvm.runtime.Module and its bases, as objects (compared by identity)."""
    return {f"{klass.__module__}.{klass.__qualname__}": dict(vars(klass)) for klass in tvm.runtime.Module.__mro__}


def _global_functions() -> dict[str, int]:
    """TVM's global functions: name -> handle of what is registered under it."""
    names = tvm_ffi.registry.list_global_func_names()
    return {name: tvm_ffi.get_global_func(name).__chandle__() for name in names}


def _tvm_python_attributes() -> dict[tuple[str, str], int]:
    """(module, attribute) -> id of the value, for every loaded tvm/tvm_ffi module (submodules aside)."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in ("tvm", "tvm_ffi"):
            continue
        for attr, value in list(vars(module).items()):
            if not isinstance(value, types.ModuleType):
                found[(name, attr)] = id(value)
    return found


def _same_where_both(before: dict, after: dict) -> list:
    """Keys whose value changed (keys only one side has are new imports, not changes)."""
    return sorted(str(k) for k in before.keys() & after.keys() if before[k] != after[k])


def _own_code(value: object) -> str | None:
    """The file defining a function or property, None for other values."""
    func = value.fget if isinstance(value, property) else value
    code = getattr(func, "__code__", None)
    return code.co_filename if code is not None else None


@pytest.fixture
def warm_library(tmp_path):
    """(cache directory whose vadd entry is a linked shared library, lowered vadd, target)."""
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cache.lower(mod, target)
    assert cache.flush(upgrades=True, timeout=240)
    cache.close()
    return tmp_path / "cache", mod, target


def _disk_hit(directory, mod, target):
    module, outcome = cc.CodegenCache(directory, memory_entries=0).lower_with_outcome(mod, target)
    assert outcome.tier == "disk" and isinstance(module, CachedLibraryModule)
    return module


# ---- without the switch ---------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_disk_hit_without_the_switch_changes_nothing_of_tvm_and_still_exports(warm_library, tmp_path):
    directory, mod, target = warm_library
    assert not cc.is_enabled()
    classes, functions = _module_attributes(), _global_functions()
    hit = _disk_hit(directory, mod, target)
    for _ in range(2):  # and what a user then asks of it
        assert (hit.kind, hit.is_compilation_exportable(), hit.is_runnable()) == ("llvm", True, True)
        hit.export_library(str(tmp_path / "hit.so"))
        hit.export_library(str(tmp_path / "hit_opts.so"), workspace_dir=str(tmp_path))  # TVM's own export path
    assert _module_attributes() == classes
    assert _same_where_both(functions, _global_functions()) == []
    # Absolute, whatever ran before in this process: every method of the class is TVM's own code.
    foreign = {name: where for name, value in vars(tvm.runtime.Module).items()
               if (where := _own_code(value)) is not None and not where.startswith(TVM_DIRS)}
    assert foreign == {}
    for name in ("hit.so", "hit_opts.so"):
        loaded = tvm.runtime.load_module(str(tmp_path / name))
        assert np.array_equal(run_binary(loaded), 2 * np.arange(1024, dtype="float32"))


def test_a_plain_handle_of_a_hit_is_tvms_own_module_without_the_switch(warm_library):
    directory, mod, target = warm_library
    hit = _disk_hit(directory, mod, target)
    holder = tvm.get_global_func("runtime.SourceModuleCreate")("", "c")
    holder.import_module(hit)
    plain = holder.imports[0]
    assert type(plain) is tvm.runtime.Module and plain.kind == "library"  # what TVM says of a loaded library
    assert hit.kind == "llvm"


# ---- enable() and disable() -----------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_enable_then_disable_leaves_every_class_global_and_attribute_of_tvm_as_it_was(warm_library, tmp_path):
    directory, mod, target = warm_library
    tvm.tirx.build(tvm.IRModule({"vadd": kernels.vadd}), "llvm")  # TVM's own lazy imports, before the snapshot
    classes, functions, attributes = _module_attributes(), _global_functions(), _tvm_python_attributes()
    cc.enable(cc.CodegenCache(directory, memory_entries=0), children=False)
    try:
        assert _module_attributes() != classes  # the switch's methods are on while it is on
        built = tvm.tirx.build(tvm.IRModule({"vadd": kernels.vadd}), "llvm")
        assert built.kind == "llvm"
        tvm.get_global_func("target.build.llvm")(mod, target)
    finally:
        cc.disable()
    assert _module_attributes() == classes
    assert _same_where_both(functions, _global_functions()) == []
    assert _same_where_both(attributes, _tvm_python_attributes()) == []
    # What the switch handed out still exports and runs as TVM's own result.
    built.export_library(str(tmp_path / "built.so"))
    loaded = tvm.runtime.load_module(str(tmp_path / "built.so"))
    assert np.array_equal(run_binary(loaded), 2 * np.arange(1024, dtype="float32"))


def test_a_wrapper_registered_over_the_router_while_enabled_no_longer_writes_to_the_cache_after_disable(tmp_path):
    tvms = tvm_ffi.get_global_func("target.build.llvm")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    router = tvm_ffi.get_global_func("target.build.llvm")
    calls = []

    def own_llvm(mod, target):
        calls.append(1)
        return router(mod, target)

    tvm_ffi.register_global_func("target.build.llvm", own_llvm, override=True)
    try:
        cc.disable()
        mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
        with cc.use_cache(cache), cc.record_outcomes() as outcomes:
            built = tvm.tirx.build(tvm.IRModule({"vadd": kernels.vadd}), "llvm")
            router(mod, target)  # the router itself, kept by whoever captured it
        assert calls, "the user's function was not called"
        assert outcomes == [] and (cache.stats().misses, cache.stats().stores) == (0, 0)
        assert type(built) is tvm.runtime.Module and built.kind == "llvm"  # TVM's own result
    finally:
        tvm_ffi.register_global_func("target.build.llvm", tvms, override=True)


def test_entry_points_captured_while_enabled_are_tvms_own_after_disable(tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    tirx_build, relax_build = tvm.tirx.build, tvm.relax.build  # `from tvm.tirx import build` while on
    cc.disable()
    from warm_scenarios import _Relax

    with cc.use_cache(cache), cc.record_outcomes() as outcomes:
        tirx_build(tvm.IRModule({"vadd": kernels.vadd}), "llvm")
        relax_build(_Relax, "llvm")
    assert outcomes == [] and (cache.stats().misses, cache.stats().stores) == (0, 0)


# ---- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("active", [True, False], ids=["cache", "no-cache"])
def test_a_primfunc_given_to_lower_unprepared_names_prepare_for_codegen(tmp_path, active):
    cache = cc.CodegenCache(tmp_path / "cache")
    codegen = cc.resolve_device_codegen("llvm")
    with pytest.raises(TypeError, match=r"PrimFunc 'vadd'.*codegen_cache\.prepare_for_codegen\(func, target\)"):
        cache.lower(kernels.vadd, "llvm")
    with cc.use_cache(cache if active else None):
        with pytest.raises(TypeError, match=r"DeviceCodegen\.lower .*PrimFunc.*prepare_for_codegen"):
            codegen.lower(kernels.vadd, "llvm", compile_device=True)


@pytest.mark.parametrize("command", [
    ["explain", kernels.__file__, "--kernel", "vadd"],
    ["warm", kernels.__file__, "-j", "0"],
    ["doctor", "--processes", "0", "--kernels", kernels.__file__],
], ids=lambda c: c[0])
@pytest.mark.parametrize("target", ["cuda -arch=sm_9O", "nonsense"])
def test_a_bad_target_in_the_cli_is_one_line_naming_it(capsys, tmp_path, command, target):
    (tmp_path / "cache").mkdir()
    code = _cli.main(["--dir", str(tmp_path / "cache"), *command, "-t", target])
    _out, err = capsys.readouterr()
    assert code == _cli.EXIT_INPUT, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"Invalid target {target!r}" in err and ("sm_90" in err or "'llvm'" in err), err
