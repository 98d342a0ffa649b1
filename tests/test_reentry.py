"""A codegen that asks the cache for the key its own thread is building gets a clear error at once.

A user's override of `target.build.llvm` that calls `resolve_device_codegen(t).lower(...)` lowers
its own input again: without a cache that recurses until RecursionError; with one it waited on
its own build lock (lease_wait, 600 s), then recursed. Now the inner call raises
ReentrantLoweringError (a RecursionError) at once, which the outer call raises too, and which is
never remembered as the kernel's failure.
"""

from __future__ import annotations

import time

import pytest
import tvm

import codegen_cache as cc


@pytest.fixture
def reentrant_llvm():
    """target.build.llvm overridden by a function that lowers its input through the registry again."""
    original = tvm.get_global_func("target.build.llvm")

    def lowers_again(mod, target):
        return cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)

    tvm.register_global_func("target.build.llvm", lowers_again, override=True)
    yield
    tvm.register_global_func("target.build.llvm", original, override=True)


@pytest.mark.timeout(60)
def test_a_codegen_that_lowers_its_own_input_again_fails_at_once(tmp_path, llvm_vadd, reentrant_llvm):
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path, lease_wait=30)
    started = time.monotonic()
    for _ in range(2):  # the second time is not a remembered failure: the same clear error
        with cc.use_cache(cache):
            with pytest.raises(cc._errors.ReentrantLoweringError, match="re-entered the codegen cache") as info:
                cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)
        assert isinstance(info.value, RecursionError) and not isinstance(info.value, cc.CachedCodegenError)
    assert time.monotonic() - started < 10  # no wait on its own lock
    assert cache.stats().failures_stored == 0


def test_after_the_override_is_gone_the_same_key_builds(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    original = tvm.get_global_func("target.build.llvm")
    tvm.register_global_func("target.build.llvm", lambda m, t: cc.resolve_device_codegen(t).lower(
        m, t, compile_device=True), override=True)
    try:
        with cc.use_cache(cache), pytest.raises(RecursionError):
            cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)
    finally:
        tvm.register_global_func("target.build.llvm", original, override=True)
    assert cache.lower_with_outcome(mod, target)[1].tier == "codegen"  # nothing was remembered
