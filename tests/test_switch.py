"""codegen_cache.enable(): every TVM compile of a process (and of its children) through the cache.

Fresh interpreters show the start-up hook (CODEGEN_CACHE_ENABLE=1 from the first `import tvm`,
without importing codegen_cache); in-process tests undo the switch after each test.
"""

from __future__ import annotations

import multiprocessing
import os
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi

import codegen_cache as cc
import kernels
from processes import START_UP_HOOK, python, python_json

needs_hook = pytest.mark.skipif(not START_UP_HOOK.exists(),
                                reason=f"the start-up hook {START_UP_HOOK.name} is installed by a non-editable "
                                       "install (pip install .); this environment has none")


@pytest.fixture
def switch():
    """enable() undone after the test, whatever it did."""
    yield cc
    cc.disable()
    assert not cc.is_enabled()


def _tir_vadd():
    return tvm.IRModule({"vadd": kernels.vadd})


# ---- the switch in this process -------------------------------------------------------------------


def test_enable_replaces_tvms_entry_points_and_disable_puts_them_back(switch, tmp_path):
    originals = (tvm.relax.build, tvm.tirx.build, tvm_ffi.get_global_func("target.build.llvm").__chandle__())
    switch.enable(cc.CodegenCache(tmp_path / "cache"))
    switch.enable()  # idempotent: nothing is wrapped twice
    assert switch.is_enabled()
    assert tvm.relax.build is not originals[0] and tvm.relax.build.__wrapped__ is originals[0]
    assert tvm.tirx.build.__wrapped__ is originals[1]
    assert tvm_ffi.get_global_func("target.build.llvm").__chandle__() != originals[2]
    switch.disable()
    assert (tvm.relax.build, tvm.tirx.build) == originals[:2]
    assert tvm_ffi.get_global_func("target.build.llvm").__chandle__() == originals[2]


def test_enable_names_what_it_was_given_when_it_is_not_a_cache(switch, tmp_path):
    with pytest.raises(TypeError, match=r"enable expects a CodegenCache or None, got str.*CodegenCache\("):
        switch.enable(str(tmp_path))
    with pytest.raises(TypeError, match="got int"):
        switch.enable(42)
    assert not switch.is_enabled()


def test_tvm_entry_points_hit_the_cache_once_enabled(switch, tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    switch.enable(cache)
    target = tvm.target.Target("llvm")
    with cc.record_outcomes() as outcomes:
        first = tvm.tirx.build(_tir_vadd(), target)
        second = tvm.compile(_tir_vadd(), target)
    assert [o.tier for o in outcomes if o.codegen == "build"] == ["codegen", "memory"]
    a = np.arange(1024, dtype="float32")
    for module in (first, second.mod):
        out = tvm.runtime.tensor(np.zeros(1024, "float32"))
        module["vadd"](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), 2 * a)
    # A direct call of TVM's global codegen function goes through the cache too.
    device_mod, device_target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    with cc.record_outcomes() as outcomes:
        for _ in range(2):
            tvm_ffi.get_global_func("target.build.llvm")(device_mod, device_target)
    assert [(o.codegen, o.tier) for o in outcomes] == [("llvm", "codegen"), ("llvm", "memory")]


def test_without_an_active_cache_tvm_compiles_as_its_own(switch, tmp_path):
    switch.enable(cc.CodegenCache(tmp_path / "cache"))
    with cc.use_cache(None), cc.record_outcomes() as outcomes:
        tvm.compile(_tir_vadd(), "llvm")
    assert outcomes == []  # nothing went through a cache: TVM's own functions ran


def test_a_codegen_registered_over_the_switch_is_called_and_survives_disable(switch, tmp_path):
    """A user wraps what is registered under target.build.llvm (the switch's router) with their own."""
    tvms = tvm_ffi.get_global_func("target.build.llvm")
    switch.enable(cc.CodegenCache(tmp_path / "cache"))
    wrapped = tvm_ffi.get_global_func("target.build.llvm")
    calls = []

    def own_llvm(mod, target):
        calls.append(1)
        return wrapped(mod, target)

    tvm_ffi.register_global_func("target.build.llvm", own_llvm, override=True)
    try:
        module = tvm.tirx.build(_tir_vadd(), "llvm")
        assert calls, "the user's target.build.llvm was bypassed"
        assert module.implements_function("vadd")
        switch.disable()
        assert tvm_ffi.get_global_func("target.build.llvm").__chandle__() not in (
            wrapped.__chandle__(), tvms.__chandle__())  # the user's function stays where they put it
    finally:
        tvm_ffi.register_global_func("target.build.llvm", tvms, override=True)


def test_enable_sets_the_variables_children_need_and_disable_restores_them(switch, tmp_path, monkeypatch):
    monkeypatch.delenv("CODEGEN_CACHE_ENABLE", raising=False)
    monkeypatch.setenv("CODEGEN_CACHE_DIR", "/somewhere/else")
    switch.enable(cc.CodegenCache(tmp_path / "cache"))
    assert os.environ["CODEGEN_CACHE_ENABLE"] == "1"
    assert os.environ["CODEGEN_CACHE_DIR"] == str(tmp_path / "cache")
    switch.disable()
    assert "CODEGEN_CACHE_ENABLE" not in os.environ and os.environ["CODEGEN_CACHE_DIR"] == "/somewhere/else"
    switch.enable(children=False)
    assert "CODEGEN_CACHE_ENABLE" not in os.environ


def _forked_compile(directory: str) -> str:
    with cc.record_outcomes() as outcomes:
        tvm.tirx.build(_tir_vadd(), "llvm")
    return outcomes[-1].tier


def test_forked_workers_inherit_the_switch(switch, tmp_path):
    switch.enable(cc.CodegenCache(tmp_path / "cache", write_behind=False))
    tvm.tirx.build(_tir_vadd(), "llvm")  # built here, so the workers find it
    with multiprocessing.get_context("fork").Pool(2) as pool:
        tiers = pool.map(_forked_compile, [str(tmp_path)] * 2)
    assert set(tiers) <= {"memory", "disk"}, tiers


# ---- CODEGEN_CACHE_ENABLE=1: the start-up hook -----------------------------------------------------

COMPILE_PLAIN_TVM = """
    import sys
    import tvm
    from tvm import te

    a, b = te.placeholder((64,), name="a"), te.placeholder((64,), name="b")
    vadd = te.create_prim_func([a, b, te.compute((64,), lambda i: a[i] + b[i], name="c")])
    before = "codegen_cache" in sys.modules
    tvm.tirx.build(tvm.IRModule({"vadd": vadd}), "llvm")
    import codegen_cache as cc, json
    outcome = cc.last_outcome()
    print(json.dumps({"imported_before_compile": before, "enabled": cc.is_enabled(),
                      "tier": outcome.tier if outcome else None}))
"""


@needs_hook
@pytest.mark.smoke
def test_the_variable_enables_a_process_that_only_imports_tvm(tmp_path):
    env = {"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    first = python_json(COMPILE_PLAIN_TVM, env=env)
    second = python_json(COMPILE_PLAIN_TVM, env=env)
    assert first == {"imported_before_compile": True, "enabled": True, "tier": "codegen"}
    assert second["tier"] == "disk"


@needs_hook
@pytest.mark.parametrize("value", ["", "0", "off"])
@pytest.mark.slow
def test_without_the_variable_import_tvm_loads_nothing_of_the_package(tmp_path, value):
    env = {"CODEGEN_CACHE_ENABLE": value, "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    found = python_json(COMPILE_PLAIN_TVM, env=env)
    assert found == {"imported_before_compile": False, "enabled": False, "tier": None}


@needs_hook
@pytest.mark.slow
def test_disable_wins_over_enable_in_the_environment(tmp_path):
    env = {"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DISABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    found = python_json(COMPILE_PLAIN_TVM, env=env)
    assert found["enabled"] is False and found["tier"] is None
    assert not (tmp_path / "cache").exists()


@needs_hook
@pytest.mark.slow
def test_a_garbage_value_is_a_warning_with_the_one_line_error_of_every_variable(tmp_path):
    done = python("import tvm", env={"CODEGEN_CACHE_ENABLE": "maybe"})  # import tvm does not fail
    assert "ConfigError: invalid value 'maybe' for CODEGEN_CACHE_ENABLE: " \
           "expected one of 1, 0, true, false, yes, no, on, off" in done.stderr.strip().splitlines()[0]


@needs_hook
@pytest.mark.slow
def test_a_process_that_imports_the_package_first_is_enabled_too(tmp_path):
    found = python_json("""
        import codegen_cache as cc, json, tvm
        print(json.dumps(cc.is_enabled() and getattr(tvm.tirx.build, "_codegen_cache_router", False)))
    """, env={"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache")})
    assert found is True


@needs_hook
@pytest.mark.slow
def test_children_of_an_enabled_process_compile_through_its_cache(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(COMPILE_PLAIN_TVM))
    found = python_json(f"""
        import json, subprocess, sys
        import codegen_cache as cc
        cc.enable(cc.CodegenCache({str(tmp_path / 'cache')!r}))
        runs = [subprocess.run([sys.executable, {str(child)!r}], capture_output=True, text=True, check=True)
                for _ in range(2)]
        print(json.dumps([json.loads(run.stdout.strip().splitlines()[-1]) for run in runs]))
    """, env={"CODEGEN_CACHE_DIR": str(tmp_path / "elsewhere"), "CODEGEN_CACHE_ENABLE": None})
    assert [(run["enabled"], run["tier"]) for run in found] == [(True, "codegen"), (True, "disk")]
    assert not (tmp_path / "elsewhere").exists()


@needs_hook
@pytest.mark.timeout(600)
@pytest.mark.slow
def test_metaschedule_builder_workers_build_through_the_cache(tmp_path):
    """LocalBuilder's popen workers (TVM's own default_build) are enabled by the variable they inherit.

    TVM's default_build imports every tensor intrinsic in each new worker (tens of seconds on a
    loaded machine): one build here, of a module this process built first, so the worker's is a hit.
    """
    found = python_json("""
        import json
        import tvm, kernels
        import codegen_cache as cc
        from tvm.s_tir.meta_schedule.builder import BuilderInput, LocalBuilder
        cc.enable()
        mod = tvm.IRModule({"main": kernels.vadd.with_attr("global_symbol", "main")})
        tvm.tirx.build(mod, tvm.target.Target("llvm"))  # built and stored here
        cc.get_cache().flush()
        results = LocalBuilder(max_workers=1, timeout_sec=400).build([BuilderInput(mod, tvm.target.Target("llvm"))])
        assert results[0].error_msg is None, results[0].error_msg
        by = cc.get_cache().stats().as_dict()["by_codegen"]
        print(json.dumps({"llvm": by.get("llvm/compiled", {}), "build": by.get("build/build", {})}))
    """, env={"CODEGEN_CACHE_DIR": str(tmp_path / "cache")}, timeout=500)
    # One codegen run (here); the worker's build was a hit, counted once as a build.
    assert found["llvm"]["codegen_runs"] == 1 and found["build"]["hits"] >= 1, found