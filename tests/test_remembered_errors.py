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
