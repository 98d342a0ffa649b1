"""Keys: equal inputs give equal keys, each input changes the key, excluded inputs do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tvm.target import Target

import codegen_cache as cc
import kernels
from codegen_cache import _key
from codegen_cache._key import CacheKey, compute_key
from codegen_cache._targets import canonical_target
from conftest import CUDA_TARGET

BUILTIN_INPUTS = [
    ("llvm", "vadd", True),
    ("llvm", "vadd", False),
    ("c", "vadd", False),
    (CUDA_TARGET, "vadd_gpu", False),
    (CUDA_TARGET, "vadd_gpu", True),
    ("opencl", "vadd_gpu", False),
    ("metal", "vadd_gpu", False),
    ("webgpu", "vadd_gpu", False),
]


def _key_of(target, kernel, compile_device, cache):
    mod, tgt = cc.prepare_for_codegen(getattr(kernels, kernel), target)
    return cache.key_for(mod, tgt, compile_device=compile_device)


def test_same_input_lowered_twice_gives_same_key(cache):
    for target, kernel, compile_device in BUILTIN_INPUTS:
        assert _key_of(target, kernel, compile_device, cache) == _key_of(target, kernel, compile_device, cache)


KEY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc, kernels
    cache = cc.CodegenCache({cache!r})
    out = []
    for target, kernel, compile_device in json.loads({inputs!r}):
        mod, tgt = cc.prepare_for_codegen(getattr(kernels, kernel), target)
        out.append(cache.key_for(mod, tgt, compile_device=compile_device).digest)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_keys_are_deterministic_across_fresh_processes(tmp_path):
    script = KEY_SCRIPT.format(tests=str(Path(__file__).parent), cache=str(tmp_path), inputs=json.dumps(BUILTIN_INPUTS))
    runs = []
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) == len(BUILTIN_INPUTS)  # and every input has its own key


def test_each_part_changes_the_key(llvm_vadd):
    mod, target = llvm_vadd
    other_mod, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    base = compute_key(mod, target, "llvm", True)
    variants = {
        "ir": compute_key(other_mod, target, "llvm", True),
        "target": compute_key(mod, Target({"kind": "llvm", "mcpu": "skylake"}), "llvm", True),
        "codegen": compute_key(mod, target, "llvm-alt", True),
        "mode": compute_key(mod, target, "llvm", False),
        "toolchain": compute_key(mod, target, "llvm", True, toolchain={"nvcc": "13.0"}),
        "salt": compute_key(mod, target, "llvm", True, salt="v2"),
    }
    for part, key in variants.items():
        assert key != base, part
    assert len({k.digest for k in variants.values()}) == len(variants)


@pytest.mark.parametrize("salt_index, name", [(0, "tvm"), (1, "tvm_ffi"), (2, "llvm")])
def test_static_salts_change_the_key(llvm_vadd, monkeypatch, salt_index, name):
    mod, target = llvm_vadd
    base = compute_key(mod, target, "llvm", True)
    salts = list(_key.static_salts())
    assert salts[salt_index][0] == name
    salts[salt_index] = (name, salts[salt_index][1] + "-changed")
    monkeypatch.setattr(_key, "static_salts", lambda: tuple(salts))
    monkeypatch.setattr(_key, "_tails", {})
    assert compute_key(mod, target, "llvm", True) != base


def test_artifact_format_version_changes_the_key(llvm_vadd):
    mod, target = llvm_vadd
    keys = {compute_key(mod, target, "llvm", True, format_version=v).digest for v in ("3", "4")}
    assert len(keys) == 2


def test_cuda_compile_env_changes_compiled_key_only(cache, cuda_vadd, monkeypatch):
    mod, target = cuda_vadd
    monkeypatch.delenv("TVM_CUDA_PTXAS_EXTRA_OPTS", raising=False)
    compiled, source = cache.key_for(mod, target, compile_device=True), cache.key_for(mod, target, compile_device=False)
    monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O1")
    assert cache.key_for(mod, target, compile_device=True) != compiled
    assert cache.key_for(mod, target, compile_device=False) == source


def test_cuda_arch_changes_the_key(cache):
    k90 = _key_of({"kind": "cuda", "arch": "sm_90"}, "vadd_gpu", False, cache)
    k80 = _key_of({"kind": "cuda", "arch": "sm_80"}, "vadd_gpu", False, cache)
    assert k90 != k80


def test_excluded_inputs_do_not_change_the_key(cache):
    # Target attribute order, and a Target built from a dict or from an equal Target.
    a = Target({"kind": "cuda", "arch": "sm_90", "max_num_threads": 1024})
    b = Target({"max_num_threads": 1024, "arch": "sm_90", "kind": "cuda"})
    mod, _ = cc.prepare_for_codegen(kernels.vadd_gpu, a)
    assert cache.key_for(mod, a, compile_device=False) == cache.key_for(mod, b, compile_device=False)
    # An unrelated environment variable.
    before = cache.key_for(mod, a, compile_device=True)
    os.environ["CODEGEN_CACHE_TEST_UNRELATED"] = "1"
    try:
        assert cache.key_for(mod, a, compile_device=True) == before
    finally:
        del os.environ["CODEGEN_CACHE_TEST_UNRELATED"]


def test_the_target_part_is_the_whole_export_with_its_host_as_sorted_json():
    host = {"kind": "llvm", "mcpu": "znver3", "fast-math": True}
    target = Target({"kind": "cuda", "arch": "sm_90", "max_num_threads": 512, "libs": ["cudnn", "cublas"],
                     "host": host})
    text = canonical_target(target)
    found = json.loads(text)
    assert text == json.dumps(found, sort_keys=True, separators=(",", ":"))
    assert (found["kind"], found["arch"], found["max_num_threads"], found["libs"]) == ("cuda", "sm_90", 512,
                                                                                    ["cudnn", "cublas"])
    assert (found["host"]["kind"], found["host"]["mcpu"], found["host"]["fast-math"]) == ("llvm", "znver3", True)
    other_host = Target({"kind": "cuda", "arch": "sm_90", "max_num_threads": 512, "libs": ["cudnn", "cublas"],
                         "host": {**host, "mcpu": "skylake"}})
    assert canonical_target(other_host) != text


def test_parts_are_named_and_ordered(llvm_vadd):
    mod, target = llvm_vadd
    key = compute_key(mod, target, "llvm", True)
    names = [name for name, _ in key.parts]
    assert names == ["ir", "target", "codegen", "mode", "tvm", "tvm_ffi", "llvm", "format", "toolchain", "salt"]
    assert CacheKey.from_parts(key.parts) == key
    assert json.loads(key.as_dict()["target"])["kind"] == "llvm"


def test_key_parts_are_length_prefixed():
    assert CacheKey.from_parts([("a", "bc")]) != CacheKey.from_parts([("ab", "c")])


def _two_functions(target="llvm", first=None, second=None):
    """A lowered module of two functions (vadd as 'first', vmul as 'second' unless swapped)."""
    import tvm

    a, _ = cc.prepare_for_codegen(first or kernels.vadd, target)
    b, _ = cc.prepare_for_codegen(second or kernels.vmul, target)
    (fa,), (fb,) = a.functions.values(), b.functions.values()
    return tvm.IRModule({"first": fa.with_attr("global_symbol", "first"),
                         "second": fb.with_attr("global_symbol", "second")})


def test_a_module_of_several_functions_hashes_by_function_exactly():
    from codegen_cache._key import ir_hash

    base = ir_hash(_two_functions())
    assert ir_hash(_two_functions()) == base  # lowered again: equal
    assert ir_hash(_two_functions(first=kernels.vmul, second=kernels.vadd)) != base  # functions swap names
    assert ir_hash(_two_functions(second=kernels.vadd)) != base  # one function changes
    assert ir_hash(_two_functions().with_attr("note", "x")) != base  # the module's attributes
    assert ir_hash(_two_functions("c")) != base  # the target attribute of each function
