"""codegen_cache.build: parity with tvm.tirx.build, the warm path, the build key and its index."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.target import Target

import codegen_cache as cc
import kernels
from codegen_cache._build import _build
from codegen_cache._artifacts import frame, unframe
from codegen_cache._artifacts._cuda import module_payload
from conftest import CUDA_TARGET, HAS_NVCC
from cuda_stub import build_stub

TESTS = str(Path(__file__).parent)


def _run(module, name="vadd"):
    rng = np.random.default_rng(0)
    a, b = rng.random(1024, dtype="float32"), rng.random(1024, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"))
    module[name](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def _forbid_preparing(monkeypatch):
    """From here on, any preparing (the TIR pipeline) fails the test: a warm build must not prepare."""
    monkeypatch.setattr(_build, "prepare_plan", lambda plan: pytest.fail("the warm path prepared the kernel"))


# ---- parity with tvm.tirx.build ---------------------------------------------------------------


def test_llvm_build_runs_and_matches_tvm_exactly_cold_memory_and_disk(tmp_path, monkeypatch):
    reference = _run(tvm.tirx.build(kernels.vadd, "llvm"))
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    with cc.use_cache(cache):
        cold, r1 = _build.build_with_record(kernels.vadd, "llvm")
        warm, r2 = _build.build_with_record(kernels.vadd, "llvm")
    assert (r1.tier, r2.tier, cold.kind) == ("codegen", "memory", "llvm") and warm is cold
    _forbid_preparing(monkeypatch)
    # Served from the stored LLVM IR, then (once the helper has linked it) from the library.
    with cc.use_cache(cc.CodegenCache(tmp_path)):
        raw, r3 = _build.build_with_record(kernels.vadd, "llvm")
    assert cache.flush(upgrades=True, timeout=300)
    with cc.use_cache(cc.CodegenCache(tmp_path)):
        disk, r4 = _build.build_with_record(kernels.vadd, "llvm")
    # Both answer as the built llvm module (the library is the fast form of the same entry).
    assert r3.tier == r4.tier == "disk" and raw.kind == disk.kind == "llvm"
    # raw: the LLVM IR, or the library where the helper linked it before this build looked.
    assert isinstance(raw, (cc._artifacts.CachedIRModule, cc._artifacts.CachedLibraryModule))
    assert isinstance(disk, cc._artifacts.CachedLibraryModule)
    assert r4.key == r3.key == r1.key
    for module in (cold, warm, raw, disk):
        assert np.array_equal(_run(module), reference)  # bit for bit


def test_uncached_build_is_tvm_build_through_the_registry(tmp_path):
    calls = []
    registry = cc.DeviceCodegenRegistry()
    inner = cc.global_func_device_codegen("target.build.llvm")
    registry.register("llvm", cc.DeviceCodegen("llvm", build=lambda m, t: calls.append(t) or inner(m, t)))
    with cc.use_cache(None):
        module, record = _build.build_with_record(kernels.vadd, "llvm")
    assert record.tier == "uncached" and record.host.digest is None and module.kind == "llvm"
    assert np.array_equal(_run(module), _run(tvm.tirx.build(kernels.vadd, "llvm")))
    # A cache with its own registry: the build calls that registry's codegen, through the cache.
    cache = cc.CodegenCache(tmp_path, registry=registry, write_behind=False)
    with cc.use_cache(cache):
        cc.build(kernels.vadd, "llvm")
    assert len(calls) == 1 and cache.stats().codegen_runs == 1


def test_cuda_build_has_tvm_s_source_and_host_imports_it(tmp_path, monkeypatch):
    target = Target(CUDA_TARGET)
    reference = tvm.tirx.build(kernels.vadd_gpu, target)
    expected = reference.imports[0].inspect_source("")
    with cc.use_cache(cc.CodegenCache(tmp_path, write_behind=False)):
        cold, r1 = _build.build_with_record(kernels.vadd_gpu, target)
    # No CUDA driver here: TVM itself returns source-only CUDA, so build asks for source too.
    assert [(p.kind, p.mode) for p in r1.devices] == [("cuda", "source")] and r1.host.mode == "compiled"
    assert [m.kind for m in cold.imports] == ["cuda"] and cold.imports[0].inspect_source("") == expected
    _forbid_preparing(monkeypatch)
    with cc.use_cache(cc.CodegenCache(tmp_path)):
        warm, r2 = _build.build_with_record(kernels.vadd_gpu, target)
    # A CUDA source entry comes back as TVM's own source-only module, saving the same bytes.
    assert r2.tier == "disk" and [m.kind for m in warm.imports] == ["cuda"]
    assert warm.imports[0].inspect_source("") == expected
    assert module_payload(warm.imports[0]) == module_payload(cold.imports[0])
    assert warm.implements_function("vadd_gpu")


def test_cold_gpu_build_never_adds_imports_to_a_module_the_cache_holds(cache):
    target = Target(CUDA_TARGET)
    with cc.use_cache(cache):
        first = cc.build(kernels.vadd_gpu, target)
        host_digest = _build.build_with_record(kernels.vadd_gpu, target)[1].host.digest
    held = cache.fetch(host_digest, "compiled")[0]
    assert len(first.imports) == 1 and len(held.imports) == 0 and not held.same_as(first)


def test_target_none_follows_target_current_then_llvm(cache):
    with cc.use_cache(cache):
        with Target("llvm"):
            scoped = _build.build_with_record(kernels.vadd)[1]
        default = _build.build_with_record(kernels.vadd)[1]
    assert scoped.key == default.key == _build.build_key(kernels.vadd, "llvm")


def test_bad_arguments_raise_like_tvm_build_but_with_a_clear_type():
    with pytest.raises(TypeError, match="PrimFunc or a tvm.IRModule, got str"):
        cc.build("not a kernel", "llvm")
    with pytest.raises(TypeError, match="pipeline must be a pipeline name or None, got"):
        cc.build(kernels.vadd, "llvm", pipeline=tvm.tirx.transform.RemoveNoOp())
    with cc.use_cache(None), pytest.raises(ValueError, match="Unknown pre-built pipeline"):
        cc.build(kernels.vadd, "llvm", pipeline="no-such-pipeline")


def test_a_relax_module_is_pointed_at_tvm_compile_and_the_switch():
    import relax_models

    mod, _params = relax_models.mlp()
    with pytest.raises(TypeError, match=r"builds TIR, as tvm.tirx.build does; this IRModule also has \['forward'\]"
                                        r".*tvm.compile after codegen_cache.enable\(\)"):
        cc.build(mod, "llvm")


def test_disable_assert_config_is_honoured_and_keyed(cache):
    with cc.use_cache(cache):
        plain = _build.build_with_record(kernels.vadd, "llvm")[1]
        with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
            module, skipped = _build.build_with_record(kernels.vadd, "llvm")
    assert plain.key != skipped.key and plain.host.digest != skipped.host.digest
    assert np.array_equal(_run(module), _run(tvm.tirx.build(kernels.vadd, "llvm")))


# ---- the build key ------------------------------------------------------------------------------


def test_build_key_changes_with_each_input_it_keys():
    base = _build.build_key(kernels.vadd, "llvm")
    variants = {
        "kernel": _build.build_key(kernels.vmul, "llvm"),
        "target": _build.build_key(kernels.vadd, {"kind": "llvm", "mcpu": "skylake"}),
        "pipeline": _build.build_key(kernels.vadd, "llvm", pipeline=None),
    }
    for config in ({"opt_level": 3}, {"config": {"tirx.disable_vectorize": True}}, {"disabled_pass": ["tirx.Simplify"]},
                   {"required_pass": ["tirx.Simplify"]}):
        with tvm.transform.PassContext(**config):
            variants[str(config)] = _build.build_key(kernels.vadd, "llvm")
    digests = {name: key.digest for name, key in variants.items()}
    assert base.digest not in digests.values() and len(set(digests.values())) == len(digests), digests
    assert [name for name, _ in base.parts][:5] == ["input", "target", "pipeline_target", "pipeline", "pass_context"]


def test_build_key_ignores_what_it_excludes():
    base = _build.build_key(kernels.vadd, "llvm")
    equal = kernels.vadd.with_attr("global_symbol", "vadd")  # a new object, structurally equal
    assert not equal.same_as(kernels.vadd) and _build.build_key(equal, "llvm") == base
    assert _build.build_key(tvm.IRModule.from_expr(kernels.vadd), "llvm") == base
    assert _build.build_key(kernels.vadd, Target("llvm")) == base
    with tvm.transform.PassContext():  # a new context equal to the default one
        assert _build.build_key(kernels.vadd, "llvm") == base


def test_pass_instruments_bypass_the_index_and_still_see_every_pass(cache):
    seen = []

    @tvm.instrument.pass_instrument
    class Record:
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    with cc.use_cache(cache):
        cc.build(kernels.vadd, "llvm")
        with tvm.transform.PassContext(instruments=[Record()]):
            assert _build.build_key(kernels.vadd, "llvm") is None
            record = _build.build_with_record(kernels.vadd, "llvm")[1]
    # Not keyable as a build: "uncached" as a build, while its lowering was still a cache hit.
    assert record.tier == "uncached" and record.key is None and len(seen) > 10
    assert record.host.digest is not None


KEY_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc, kernels
    from codegen_cache._build import _build
    print(_build.build_key(kernels.vadd, "llvm").digest, _build.build_key(kernels.vadd_gpu, {cuda!r}).digest)
    """
)


@pytest.mark.slow
def test_build_key_is_the_same_in_fresh_processes():
    script = KEY_SCRIPT.format(tests=TESTS, cuda=CUDA_TARGET)
    outs = set()
    for seed in ("0", "1"):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr[-2000:]
        outs.add(done.stdout.split()[-2] + done.stdout.split()[-1])
    assert len(outs) == 1


# ---- the warm path and the index ---------------------------------------------------------------


def test_a_changed_irmodule_is_rebuilt_not_served_from_memory(cache):
    mod = tvm.IRModule({"vadd": kernels.vadd})
    with cc.use_cache(cache):
        first = cc.build(mod, "llvm")
        mod["vadd"] = kernels.vmul.with_attr("global_symbol", "vadd")  # in place
        second, record = _build.build_with_record(mod, "llvm")
    assert record.tier == "codegen" and not np.array_equal(_run(first), _run(second))
    assert np.array_equal(_run(second), _run(tvm.tirx.build(mod, "llvm")))


def test_index_entry_is_framed_bytes_naming_the_device_level_entries(cache):
    with cc.use_cache(cache):
        record = _build.build_with_record(kernels.vadd_gpu, Target(CUDA_TARGET))[1]
    blob = cache.store("index").get(record.key.digest)
    art = unframe(blob)
    assert type(blob) is bytes and art.codec == "build-index" and art.fields == ()
    assert art.meta["host"]["digest"] == record.host.digest
    assert [d["digest"] for d in art.meta["devices"]] == [p.digest for p in record.devices]
    for part in (record.host, *record.devices):
        assert cache.store(part.mode).get(part.digest) is not None


def test_corrupt_or_dangling_index_falls_back_to_a_correct_build(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="codegen_cache")  # warned once per process, then DEBUG
    with cc.use_cache(cc.CodegenCache(tmp_path, write_behind=False)) as cache:
        key = _build.build_with_record(kernels.vadd, "llvm")[1].key
    store = cache.store("index")
    store.put(key.digest, frame("build-index", {"key": "someone else"}, []))
    with cc.use_cache(cc.CodegenCache(tmp_path)) as second:
        module, record = _build.build_with_record(kernels.vadd, "llvm")
    assert record.tier == "codegen" and "bad build-index entry" in caplog.text
    assert np.array_equal(_run(module), _run(tvm.tirx.build(kernels.vadd, "llvm")))
    # Its writer stores the rebuilt parts, and the llvm upgrader links them, in the background:
    # done before the clear, or they would be found again (parts served, no codegen run).
    assert second.flush(timeout=120, upgrades=True)
    cache.clear()  # the index now names entries that are gone
    # min_codegen_time=0: the tiers this directory learnt may run a cheap codegen without a key
    # (counted uncached_cheap, not codegen_runs), as they do at a high load.
    with cc.use_cache(cc.CodegenCache(tmp_path, min_codegen_time=0)) as fresh:
        module, record = _build.build_with_record(kernels.vadd, "llvm")
    assert record.tier == "codegen" and fresh.stats(shared=False).codegen_runs == 1
    assert np.array_equal(_run(module), _run(tvm.tirx.build(kernels.vadd, "llvm")))


def test_warm_builds_record_outcomes_and_count_hits(tmp_path):
    with cc.use_cache(cc.CodegenCache(tmp_path, write_behind=False)):
        cc.build(kernels.vadd_gpu, Target(CUDA_TARGET))
    fresh = cc.CodegenCache(tmp_path)
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        cc.build(kernels.vadd_gpu, Target(CUDA_TARGET))
        cc.build(kernels.vadd_gpu, Target(CUDA_TARGET))
    assert [(o.tier, o.codegen) for o in outcomes] == [("disk", "build"), ("memory", "build")]
    stats = fresh.stats(shared=False)
    # Each build served whole counts one hit, however many codegen results it holds (host and device).
    assert (stats.codegen_runs, stats.misses, stats.hits_disk, stats.hits_memory) == (0, 0, 1, 1)


def test_recache_rebuilds_instead_of_using_the_index(tmp_path):
    with cc.use_cache(cc.CodegenCache(tmp_path, write_behind=False)):
        cc.build(kernels.vadd, "llvm")
    recache = cc.CodegenCache(tmp_path, recache=True, write_behind=False)
    with cc.use_cache(recache):
        assert _build.build_with_record(kernels.vadd, "llvm")[1].tier == "codegen"
    assert recache.stats(shared=False).codegen_runs == 1


# ---- compiled CUDA, through a stub driver (TVM's CUDA runtime loads; nothing launches) ---------

STUB_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import tvm, codegen_cache as cc, kernels
    from codegen_cache._build import _build
    target = tvm.target.Target({cuda!r})
    cache = cc.CodegenCache({cache!r})
    with cc.use_cache(cache):
        module, record = _build.build_with_record(kernels.vadd_gpu, target)
    cache.flush()
    stats = cache.stats(shared=False)
    print(record.tier, record.devices[0].mode, [m.kind for m in module.imports][0],
          module.imports[0].implements_function("vadd_gpu_kernel"), stats.codegen_runs)
    """
)


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.slow
def test_compiled_cuda_build_where_the_cuda_runtime_loads(tmp_path):
    stub = build_stub(tmp_path / "stub")
    if stub is None:
        pytest.skip("gcc or libcudart.so.13 is missing: cannot build the stub CUDA driver")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    script = STUB_SCRIPT.format(tests=TESTS, cuda=CUDA_TARGET, cache=str(tmp_path / "cache"))
    lines = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        lines.append(done.stdout.split()[-5:])
    assert lines == [["codegen", "compiled", "cuda", "True", "2"], ["disk", "compiled", "cuda", "True", "0"]]
