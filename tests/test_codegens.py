"""Contract tests over every built-in codegen that can run on this machine, in both modes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm

import codegen_cache as cc
from codegen_cache import _compat
import kernels
from codegen_cache.codegens import cuda as cuda_codegen
from conftest import CUDA_TARGET, HAS_NVCC
from cuda_stub import build_stub

# (target, kernel, compile_device, what the module's source must contain)
RUNNABLE_HERE = [
    pytest.param("llvm", kernels.vadd, True, None, id="llvm-compiled"),
    pytest.param("llvm", kernels.vadd, False, "define", id="llvm-source"),
    pytest.param("c", kernels.vadd, False, "__tvm_ffi_vadd", id="c-source"),
    pytest.param(CUDA_TARGET, kernels.vadd_gpu, False, "__global__", id="cuda-source"),
    pytest.param("opencl", kernels.vadd_gpu, False, "__kernel", id="opencl-source"),
    pytest.param("metal", kernels.vadd_gpu, False, "kernel void", id="metal-source"),
    pytest.param("webgpu", kernels.vadd_gpu, False, "fn vadd_gpu_kernel", id="webgpu-source"),
]


@pytest.mark.parametrize("target, kernel, compile_device, needle", RUNNABLE_HERE)
def test_builtin_codegen_contract(target, kernel, compile_device, needle):
    mod, tgt = cc.prepare_for_codegen(kernel, target)
    codegen = cc.resolve_device_codegen(tgt)
    assert codegen.name == tgt.kind.name
    with cc.use_cache(None):
        module = codegen.lower(mod, tgt, compile_device=compile_device)
    assert isinstance(module, tvm.runtime.Module)
    if needle is not None:
        assert needle in module.inspect_source("")


def test_llvm_kernel_through_registry_runs_and_matches_numpy(llvm_vadd):
    mod, target = llvm_vadd
    with cc.use_cache(None):
        module = cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)
    a = np.random.default_rng(0).random(1024, dtype=np.float32)
    b = np.random.default_rng(1).random(1024, dtype=np.float32)
    out = tvm.runtime.tensor(np.zeros(1024, "float32"))
    module["vadd"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a + b)


def test_c_has_no_compiled_mode():
    mod, target = cc.prepare_for_codegen(kernels.vadd, "c")
    with cc.use_cache(None), pytest.raises(ValueError, match="'c' for target 'c' does not support lowering with compilation"):
        cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)


def test_gpu_kernel_without_thread_binding_is_rejected():
    with pytest.raises(cc.PrepareError, match=r"\['vadd'\] has no thread binding.*'cuda'"):
        cc.prepare_for_codegen(kernels.vadd, CUDA_TARGET)


def test_vulkan_is_registered_but_not_in_this_tvm_build():
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, "vulkan")
    with cc.use_cache(None), pytest.raises(ValueError, match="Cannot find global function target.build.vulkan"):
        cc.resolve_device_codegen(target).lower(mod, target, compile_device=False)


@pytest.mark.skipif(_compat.cuda_runtime_available(), reason="a CUDA driver is present")
def test_cuda_compiled_without_driver_is_a_clear_error(cuda_vadd):
    mod, target = cuda_vadd
    with cc.use_cache(None), pytest.raises(cc.CudaRuntimeUnavailableError, match="CUDA runtime is not loaded"):
        cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)


def test_cuda_source_mode_never_compiles_and_keeps_env(cuda_vadd, monkeypatch):
    mod, target = cuda_vadd
    monkeypatch.delenv("TVM_COMPILE_FORCE_FALLBACK", raising=False)
    module = cuda_codegen.cuda_source_module(mod, target)
    assert module.kind == "cuda"
    assert cuda_codegen.module_payload(module).fmt == "cuda"
    assert "TVM_COMPILE_FORCE_FALLBACK" not in os.environ


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_compile_step_runs_without_a_driver(cuda_vadd):
    mod, target = cuda_vadd
    payload, source = cuda_codegen.compile_cuda_payload(mod, target)
    assert payload.fmt == "fatbin"
    assert len(payload.code) > 1000
    assert "vadd_gpu_kernel" in source
    assert cuda_codegen.CudaPayload.from_bytes(payload.to_bytes()) == payload


def _run_with_stub_driver(tmp_path, script_template):
    """Run a script (formatted with tests= and cache=) where the stub libcuda.so.1 is loaded."""
    stub = build_stub(tmp_path / "stub")
    if stub is None:
        pytest.skip("gcc or libcudart.so.13 is missing: cannot build the stub CUDA driver")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    script = script_template.format(tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


STUB_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc, kernels
    from codegen_cache import _compat
    assert _compat.cuda_runtime_available(), "stub libcuda did not load TVM's CUDA runtime"
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    cache = cc.CodegenCache({cache!r}, write_behind=False)
    m1, o1 = cache.lower_with_outcome(mod, target, compile_device=True)
    assert m1.kind == "cuda" and m1.implements_function("vadd_gpu_kernel"), m1
    assert not m1.implements_function("nope")
    cache2 = cc.CodegenCache({cache!r})
    m2, o2 = cache2.lower_with_outcome(mod, target, compile_device=True)
    src = cache2.lower(mod, target, compile_device=False)
    print(o1.tier, o2.tier, m2.kind, m2.implements_function("vadd_gpu_kernel"), "__global__" in src.inspect_source(""))
    """
)


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.slow
def test_compiled_cuda_loads_through_stub_driver(tmp_path):
    out = _run_with_stub_driver(tmp_path, STUB_SCRIPT)
    assert out.split()[-5:] == ["codegen", "disk", "cuda", "True", "True"]


PRECOMPILED_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc, kernels
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    module, outcome = cc.CodegenCache({cache!r}).lower_with_outcome(mod, target, compile_device=True)
    print(outcome.tier, module.kind, module.implements_function("vadd_gpu_kernel"))
    """
)


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.slow
def test_gpu_less_host_fills_compiled_store_for_gpu_host(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    key = cache.precompile_cuda(mod, target)
    assert key == cache.key_for(mod, target, compile_device=True).digest
    assert len(cache.store("compiled")) == 1
    out = _run_with_stub_driver(tmp_path, PRECOMPILED_SCRIPT)
    assert out.split()[-3:] == ["disk", "cuda", "True"]
