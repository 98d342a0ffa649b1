"""A remembered codegen failure is raised as the exception type the codegen raised, with its message.

TVM's tests (and users) catch what the codegen raises: `tvm.error.InternalError` (an llvm duplicate
global symbol, webgpu allocation checks), a ValueError of a tuner's config. A failure served from
the failure cache is that type (a builtin or a class registered with tvm-ffi) and also a
CachedCodegenError; a class that cannot be named safely (a user's own) gives a CachedCodegenError.
"""

from __future__ import annotations

import pickle

import pytest
import tvm

import codegen_cache as cc
import kernels


class UsersOwnError(RuntimeError):
    """Not a builtin, not registered with tvm-ffi: never imported by name from a cache."""


def _failing(error: BaseException):
    calls = []

    def build(mod, target):
        calls.append(1)
        raise error

    return cc.DeviceCodegen("llvm", build=build, build_without_compile=build), calls


@pytest.mark.parametrize("error", [tvm.error.InternalError("Duplicate PrimFunc global_symbol 'f'"),
                                   ValueError("bad tile size 7"), KeyError("missing"), TypeError("no")],
                         ids=lambda e: type(e).__name__)
def test_a_remembered_failure_has_the_codegens_type_and_message(tmp_path, llvm_vadd, error):
    mod, target = llvm_vadd
    codegen, calls = _failing(error)
    with pytest.raises(type(error)):
        cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
    fresh = cc.CodegenCache(tmp_path)  # as another process sees the directory
    with pytest.raises(type(error)) as info:
        fresh.lower(mod, target, codegen=codegen)
    assert len(calls) == 1 and isinstance(info.value, cc.CachedCodegenError)
    assert str(info.value).startswith(str(error)) and "remembered by the codegen cache" in str(info.value)
    assert info.value.args == error.args or isinstance(error, KeyError)
    again = pickle.loads(pickle.dumps(info.value))  # errors cross process boundaries (pools)
    assert type(again) is type(info.value) and str(again) == str(info.value)


def test_a_tvm_error_is_still_caught_as_what_tvm_raises(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    codegen, _ = _failing(tvm.error.InternalError("webgpu allocation extent"))
    for _ in range(2):
        try:
            cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
        except tvm.error.InternalError as err:  # noqa: PERF203 - the point is what except catches
            assert "webgpu allocation extent" in str(err)
        else:
            pytest.fail("no error")


def test_a_users_own_error_class_comes_back_as_cached_codegen_error(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    codegen, _ = _failing(UsersOwnError("odd config"))
    with pytest.raises(UsersOwnError):
        cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
    with pytest.raises(cc.CachedCodegenError, match="UsersOwnError: odd config") as info:
        cc.CodegenCache(tmp_path).lower(mod, target, codegen=codegen)
    assert type(info.value) is cc.CachedCodegenError and info.value.error_type == "UsersOwnError"


def test_the_llvm_duplicate_symbol_error_is_internal_error_cold_and_warm(tmp_path):
    mod = tvm.IRModule({"first": kernels.vadd.with_attr("global_symbol", "dup"),
                        "second": kernels.vmul.with_attr("global_symbol", "dup")})
    for _ in range(2):
        with cc.use_cache(cc.CodegenCache(tmp_path, write_behind=False)):
            with pytest.raises(tvm.error.InternalError, match="Duplicate PrimFunc global_symbol 'dup'"):
                cc.build(mod, "llvm")
    assert cc.CodegenCache(tmp_path).stats().failures_served == 1


# ---- only what the codegen will raise again for the same inputs ------------------------------------


def _cause(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize("error", [
    RuntimeError("Cannot find ROCm path"),  # tvm.support.rocm.find_rocm_path
    RuntimeError("cannot find clang, candidates are: ['clang-18']"),
    RuntimeError("Cannot find libdevice for arch 90"),
    ValueError("ccache not found"),
    RuntimeError("libcuda.so.1: cannot open shared object file: No such file or directory"),
    tvm.error.InternalError("Failed to load module: undefined symbol: cuModuleLoad"),
    _cause(RuntimeError("compile failed"), FileNotFoundError(2, "No such file or directory", "nvcc")),
], ids=lambda e: str(e)[:30])
def test_a_failure_of_the_environment_is_never_remembered(tmp_path, llvm_vadd, error):
    mod, target = llvm_vadd
    codegen, calls = _failing(error)
    for _ in range(2):
        with pytest.raises(type(error)):
            cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
    assert len(calls) == 2  # run again: the user may have installed the toolchain meanwhile
    assert cc.CodegenCache(tmp_path).stats().failures_stored == 0


@pytest.mark.parametrize("error", [tvm.error.InternalError("Check failed: WebGPU allocation extent requires a finite "
                                                           "compile-time upper bound, but got n"),
                                   ValueError("bad tile size 7"), RuntimeError("Compilation error: ptxas fatal")],
                         ids=lambda e: type(e).__name__)
def test_a_failure_of_the_codegen_given_its_inputs_is_remembered(tmp_path, llvm_vadd, error):
    mod, target = llvm_vadd
    codegen, calls = _failing(error)
    for _ in range(2):
        with pytest.raises(type(error)):
            cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
    assert len(calls) == 1


def test_a_missing_rocm_is_not_remembered(tmp_path):
    import tvm.support.rocm

    try:
        tvm.support.rocm.find_rocm_path()
    except RuntimeError:
        pass
    else:
        pytest.skip("ROCm is installed here")
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {"kind": "rocm"})
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Cannot find ROCm path") as info:
            cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target)
        assert not isinstance(info.value, cc.CachedCodegenError)
    assert cc.CodegenCache(tmp_path).stats().failures_stored == 0


_UNBOUNDED = """
from tvm.script import tirx as T


@T.prim_func
def unbounded(a: T.handle, b: T.handle, n: T.int32):
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for bx in T.thread_binding(1, thread="blockIdx.x"):
        for tx in T.thread_binding(1, thread="threadIdx.x"):
            L = T.alloc_buffer((n,), "float32", scope="local")
            for i in range(n):
                L[i] = A[i]
            for i in range(n):
                B[i] = L[i]
"""


@pytest.mark.slow
def test_a_remembered_tvm_error_is_tvms_type_in_a_fresh_process(tmp_path):
    """A WebGPU kernel with an unbounded local allocation: TVM raises InternalError, cold and warm."""
    import processes

    (tmp_path / "unbounded.py").write_text(_UNBOUNDED)
    script = f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import tvm
        import codegen_cache as cc
        from unbounded import unbounded

        with cc.use_cache(cc.CodegenCache({str(tmp_path / "cache")!r}, write_behind=False)):
            try:
                cc.build(unbounded, "webgpu")
            except tvm.error.InternalError as err:
                print(json.dumps([type(err).__name__, isinstance(err, cc.CachedCodegenError)]))
    """
    assert processes.python_json(script) == ["InternalError", False]
    assert processes.python_json(script) == ["InternalError", True]  # served from the failure cache
