"""The cache under DeviceCodegen.lower: tiers, stores, corruption, collisions, contexts."""

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
import kernels
from codegen_cache import _context
from codegen_cache._cache import _cache
from conftest import CUDA_TARGET, counting_codegen, run_binary


def test_second_lower_is_a_memory_hit_and_runs(cache, llvm_vadd):
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    m1, o1 = cache.lower_with_outcome(mod, target, codegen=codegen)
    m2, o2 = cache.lower_with_outcome(mod, target, codegen=codegen)
    assert (o1.tier, o2.tier) == ("codegen", "memory") and len(calls) == 1
    assert m2 is m1 and o2.hit and o1.key == o2.key
    np.testing.assert_array_equal(run_binary(m2), 2 * np.arange(1024, dtype="float32"))
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.hits_memory, stats.codegen_runs) == (1, 1, 1, 1)


def test_fresh_cache_hits_disk_and_module_runs(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen)
    module, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "disk" and len(calls) == 1
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))


def test_structurally_equal_module_hits_memory(cache):
    codegen, calls = counting_codegen()
    mod1, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    mod2, _ = cc.prepare_for_codegen(kernels.vadd, "llvm")
    assert not mod1.same_as(mod2)
    cache.lower(mod1, target, codegen=codegen)
    assert cache.lower_with_outcome(mod2, target, codegen=codegen)[1].tier == "memory"
    assert len(calls) == 1


FRESH_PROCESS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc, kernels
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    cache = cc.CodegenCache({cache!r})
    module, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
    print(outcome.tier, "__global__" in module.inspect_source(""))
    """
)


@pytest.mark.slow
def test_fresh_process_hits_what_another_stored(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, compile_device=False)
    script = FRESH_PROCESS.format(tests=str(Path(__file__).parent), cache=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["disk", "True"]


def test_compiled_and_source_results_live_in_separate_stores(cache, llvm_vadd):
    mod, target = llvm_vadd
    cache.lower(mod, target, compile_device=True)
    cache.lower(mod, target, compile_device=False)
    assert len(cache.store("compiled")) == 1 and len(cache.store("source")) == 1
    assert (cache.directory / "compiled").is_dir() and (cache.directory / "source").is_dir()
    assert next(cache.store("compiled").keys()) != next(cache.store("source").keys())


def _cuda_facts(module) -> tuple:
    from codegen_cache._artifacts._cuda import module_payload

    return (module.kind, module.get_property_mask(), module.is_binary_serializable(), module.is_runnable(),
            module.is_compilation_exportable(), module_payload(module),
            *(module.inspect_source(fmt) for fmt in ("", "cu", "cuda", "ptx")))


def test_a_cuda_source_hit_is_tvms_own_source_only_module_saving_the_same_bytes(tmp_path, cuda_vadd):
    import tvm_ffi

    mod, target = cuda_vadd
    fresh = cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, compile_device=False)
    hit, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "disk" and hit is not fresh
    assert fresh.kind == "cuda" and _cuda_facts(hit) == _cuda_facts(fresh)
    # The postproc hook it borrowed to make the module is as it was: none registered.
    assert tvm_ffi.get_global_func("tvm_callback_cuda_postproc", allow_missing=True) is None


def test_a_cuda_module_saves_as_its_own_payload_and_no_other(tmp_path, cuda_vadd):
    # What a source-only CUDA hit checks TVM's module against (compared in place, by digest).
    from codegen_cache._artifacts._cuda import CudaPayload, module_payload, saves_as
    from codegen_cache._errors import ArtifactError

    mod, target = cuda_vadd
    module = cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, compile_device=False)
    own = module_payload(module)
    assert own.fmt == "cuda" and b"__global__" in own.code
    assert saves_as(module, own) and saves_as(module, CudaPayload(own.fmt, own.fmap, memoryview(own.code)))
    flipped = bytearray(own.code)
    flipped[len(flipped) // 2] ^= 1
    fmap = bytearray(own.fmap)
    fmap[-1] ^= 1
    for other in (CudaPayload(own.fmt, own.fmap, bytes(flipped)), CudaPayload(own.fmt, own.fmap, own.code + b" "),
                  CudaPayload(own.fmt, bytes(fmap), own.code), CudaPayload("ptx", own.fmap, own.code)):
        assert not saves_as(module, other), other.fmt
    host = tvm.get_global_func("target.build.llvm")(*cc.prepare_for_codegen(kernels.vadd, "llvm"))
    with pytest.raises(ArtifactError, match="expected a cuda module"):
        saves_as(host, own)


def test_making_a_cuda_source_hit_puts_back_the_users_postproc_hook(tmp_path, cuda_vadd):
    import tvm_ffi

    mod, target = cuda_vadd
    fresh = cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, compile_device=False)
    seen = []

    def postproc(code, target):  # a user's hook; its results are not cached (no declared salt)
        seen.append(len(code))
        return code

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postproc, override=True)
    try:
        handle = tvm_ffi.get_global_func("tvm_callback_cuda_postproc").__chandle__()
        from codegen_cache._artifacts._cuda import fallback_module, module_payload

        again = fallback_module(module_payload(fresh))
        assert again is not None and _cuda_facts(again) == _cuda_facts(fresh)
        assert seen == []  # the hook was not called for the cache's own module
        assert tvm_ffi.get_global_func("tvm_callback_cuda_postproc").__chandle__() == handle
    finally:
        tvm_ffi.remove_global_func("tvm_callback_cuda_postproc")


def test_a_cuda_source_entry_tvm_cannot_make_again_is_a_source_module_with_its_text(tmp_path, cuda_vadd):
    from codegen_cache._artifacts import frame, unframe

    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    fresh, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
    art = unframe(cache.store("source").get(outcome.key))
    assert art.codec == "cuda-fallback"
    # A function map naming one kernel under another symbol: not a map target.build.cuda makes.
    fmap = bytes(art.fields[0]).replace(b"vadd_gpu_kernel", b"vadd_gpu_kernek", 1)
    cache.store("source").put(outcome.key, frame("cuda-fallback", art.meta, [fmap, art.fields[1]]))
    hit, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "disk"
    assert hit.kind == "source" and hit.inspect_source("") == fresh.inspect_source("")


@pytest.mark.parametrize("padding", [0, 64 * 1024],
                         ids=["short text: TVM's save checked", "long text: a twin checked"])
def test_a_cuda_source_entry_is_served_as_tvms_module_only_with_the_function_map_tvm_makes(tmp_path, cuda_vadd,
                                                                                         padding):
    # The entry's text padded past the size where the check builds a twin with a marker for it
    # instead of saving the module. Retagged, a well-formed map that target.build.cuda does not
    # reproduce (its last argument tagged 2, a tag TVM never writes: 0 none, 1 a tensor map):
    # served as TVM's own module, the kernel would be launched by another map than the one
    # stored; the check sees it and serves the text.
    import struct

    from codegen_cache._artifacts import frame, unframe
    from codegen_cache._artifacts._cuda import CudaPayload, function_infos, module_payload

    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    fresh, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
    art = unframe(cache.store("source").get(outcome.key))
    fmap, text = bytes(art.fields[0]), bytes(art.fields[1]) + b"\n" + b"/" * 2 + b" " * padding + b"\n"
    cache.store("source").put(outcome.key, frame("cuda-fallback", art.meta, [fmap, text]))
    hit, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "disk" and hit.kind == "cuda"
    assert module_payload(hit) == CudaPayload("cuda", fmap, text) and hit.inspect_source("") == text.decode()

    (info,) = function_infos(fmap).values()
    assert info["arg_extra_tags"][-1] == 0
    retagged = fmap[:-4] + struct.pack("<I", 2)
    assert function_infos(retagged) != function_infos(fmap)
    cache.store("source").put(outcome.key, frame("cuda-fallback", art.meta, [retagged, text]))
    hit, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "disk"
    assert hit.kind == "source" and hit.inspect_source("") == text.decode()


def _flip_every_file(directory: Path) -> int:
    flipped = 0
    for path in directory.rglob("*"):
        if path.is_file() and path.suffix == ".val":
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
            flipped += 1
    return flipped


def test_flipped_bytes_in_stored_files_are_misses_and_rebuilt(tmp_path, llvm_vadd):
    # LLVM IR text (about 49 KB) is stored as a file beside the database (>= 32 KiB).
    mod, target = llvm_vadd
    fresh = cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, compile_device=False)
    assert _flip_every_file(tmp_path / "source") == 1
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "codegen"
    assert module.inspect_source("") == fresh.inspect_source("")
    assert cache.stats(shared=False).corrupt == 1
    # Stored again: the next fresh cache hits.
    assert cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, compile_device=False)[1].tier == "disk"


def test_flipped_bytes_in_small_entries_inside_the_database(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    cache.lower(mod, target, compile_device=False)
    store = cache.store("source")
    (key,) = list(store.keys())
    blob = bytearray(store.get(key))
    for pos in range(0, len(blob), 97):
        bad = bytearray(blob)
        bad[pos] ^= 1
        store.put(key, bytes(bad))
        cache._memory.clear()
        module, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
        assert outcome.tier == "codegen", pos
        assert "__global__" in module.inspect_source("")


def test_forced_collision_with_verify_gives_each_module_its_own_code(tmp_path, monkeypatch):
    monkeypatch.setattr(_cache, "ir_hash", lambda mod: 42)  # every module has the same hash
    add, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    mul, _ = cc.prepare_for_codegen(kernels.vmul_gpu, CUDA_TARGET)
    writer = cc.CodegenCache(tmp_path, write_behind=False, verify=True)
    assert writer.key_for(add, target, compile_device=False, structural_hash=42) == writer.key_for(
        mul, target, compile_device=False, structural_hash=42)
    src_add = writer.lower(add, target, compile_device=False).inspect_source("")
    # Memory tier: exact by structural_equal.
    src_mul = writer.lower(mul, target, compile_device=False).inspect_source("")
    assert "A_1[" in src_add or "+" in src_add
    assert src_add != src_mul and "*" in src_mul
    # Disk tier with verify: a fresh cache still tells them apart.
    reader = cc.CodegenCache(tmp_path, verify=True)
    assert reader.lower(mul, target, compile_device=False).inspect_source("") == src_mul
    assert reader.lower(add, target, compile_device=False).inspect_source("") == src_add
    assert reader.stats(shared=False).collisions >= 1


def test_without_verify_a_collision_on_disk_is_trusted(tmp_path, monkeypatch):
    # The documented 64-bit risk: without verify=True a disk hit trusts the key.
    monkeypatch.setattr(_cache, "ir_hash", lambda mod: 42)
    add, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    mul, _ = cc.prepare_for_codegen(kernels.vmul_gpu, CUDA_TARGET)
    src_add = cc.CodegenCache(tmp_path, write_behind=False).lower(add, target, compile_device=False).inspect_source("")
    assert cc.CodegenCache(tmp_path).lower(mul, target, compile_device=False).inspect_source("") == src_add


def _fails_on_multiply():
    """A CUDA source codegen that rejects any kernel with a multiply (a stand-in for a bad config)."""
    calls = []

    def build(mod, target):
        calls.append(mod)
        module = cc.resolve_device_codegen(target).build_without_compile(mod, target)
        if "] * B_ptr[" in module.inspect_source(""):
            raise RuntimeError("this codegen rejects multiplies")
        return module

    return cc.DeviceCodegen("cuda-picky", build_without_compile=build), calls


@pytest.mark.parametrize("fresh_reader", [False, True], ids=["same-cache", "fresh-cache"])
def test_forced_collision_with_verify_serves_a_failure_only_to_the_same_module(tmp_path, monkeypatch, fresh_reader):
    monkeypatch.setattr(_cache, "ir_hash", lambda mod: 42)  # every module has the same hash
    add, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    mul, _ = cc.prepare_for_codegen(kernels.vmul_gpu, CUDA_TARGET)
    codegen, calls = _fails_on_multiply()
    writer = cc.CodegenCache(tmp_path, write_behind=False, verify=True)
    assert writer.key_for(add, target, compile_device=False, codegen=codegen, structural_hash=42) == writer.key_for(
        mul, target, compile_device=False, codegen=codegen, structural_hash=42)
    with pytest.raises(RuntimeError, match="rejects multiplies"):
        writer.lower(mul, target, compile_device=False, codegen=codegen)
    reader = cc.CodegenCache(tmp_path, verify=True) if fresh_reader else writer
    # The same key, another module: it builds, and is not given the other kernel's error.
    module, outcome = reader.lower_with_outcome(add, target, compile_device=False, codegen=codegen)
    assert outcome.tier == "codegen" and "__global__" in module.inspect_source("")
    # The failing module itself still gets its remembered failure, without running the codegen.
    before = len(calls)
    with pytest.raises(cc.CachedCodegenError, match="rejects multiplies"):
        reader.lower(mul, target, compile_device=False, codegen=codegen)
    assert len(calls) == before


def test_without_verify_a_remembered_failure_trusts_the_key(tmp_path, monkeypatch):
    # The documented 64-bit risk, as for hits: without verify=True the failure is served by key.
    monkeypatch.setattr(_cache, "ir_hash", lambda mod: 42)
    add, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    mul, _ = cc.prepare_for_codegen(kernels.vmul_gpu, CUDA_TARGET)
    codegen, _calls = _fails_on_multiply()
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    with pytest.raises(RuntimeError):
        cache.lower(mul, target, compile_device=False, codegen=codegen)
    with pytest.raises(cc.CachedCodegenError):
        cache.lower(add, target, compile_device=False, codegen=codegen)


def test_use_cache_routes_device_codegen_lower(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    cache = cc.CodegenCache(tmp_path)
    with cc.use_cache(cache):
        assert cc.get_cache() is cache
        codegen.lower(mod, target, compile_device=True)
        codegen.lower(mod, target, compile_device=True)
    assert len(calls) == 1
    with cc.use_cache(None):
        assert cc.get_cache() is None
        codegen.lower(mod, target, compile_device=True)
    assert len(calls) == 2


def test_use_cache_rejects_other_objects():
    with pytest.raises(TypeError, match="CodegenCache or None, got dict"):
        with cc.use_cache({}):  # type: ignore[arg-type]
            pass


def _default_cache_dir_in_fresh_process(env):
    script = "import codegen_cache as cc; c = cc.get_cache(); print(c.directory if c else 'disabled')"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_default_cache_honours_env(tmp_path):
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "d")}
    env.pop("CODEGEN_CACHE_DISABLE", None)
    assert _default_cache_dir_in_fresh_process(env) == str(tmp_path / "d")
    assert _default_cache_dir_in_fresh_process({**env, "CODEGEN_CACHE_DISABLE": "1"}) == "disabled"
    env.pop("CODEGEN_CACHE_DIR")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert _default_cache_dir_in_fresh_process(env) == str(tmp_path / "xdg" / "codegen-cache")


def test_clear_empties_both_stores(cache, llvm_vadd):
    mod, target = llvm_vadd
    cache.lower(mod, target, compile_device=True)
    cache.lower(mod, target, compile_device=False)
    assert cache.clear() == 2
    assert len(cache.store("compiled")) == 0 and len(cache.store("source")) == 0
    assert cache.lower_with_outcome(mod, target)[1].tier == "codegen"


def test_unwritable_directory_still_compiles(tmp_path, llvm_vadd):
    if os.geteuid() == 0:
        target_dir = Path("/proc/codegen-cache-test")  # not creatable even for root
    else:
        target_dir = tmp_path / "ro"
        target_dir.mkdir()
        target_dir.chmod(0o500)
    mod, target = llvm_vadd
    cache = cc.CodegenCache(target_dir, write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target)
    assert outcome.tier == "codegen"
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    assert cache.lower_with_outcome(mod, target)[1].tier == "memory"


def test_a_store_locked_past_its_timeout_by_another_writer_still_compiles(tmp_path, llvm_vadd):
    # Another process holds the store's write lock for longer than the store waits: the write
    # fails (counted as a storage error, warned), the compile is not lost, and once the lock
    # goes the entry is found by a fresh process's cache.
    import sqlite3

    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False, min_codegen_time=0, memory_entries=0)
    other, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    assert cache.lower_with_outcome(other, target)[1].tier == "codegen"  # the store is made
    assert cache.flush(timeout=120, upgrades=True)
    holder = sqlite3.connect(tmp_path / "cache" / "compiled" / "cache.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        module, outcome = cache.lower_with_outcome(mod, target)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert outcome.tier == "codegen"
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    stats = cache.stats(shared=False)
    assert stats.errors == {"write": 1}
    cache.lower(mod, target)
    assert cache.flush(timeout=120, upgrades=True)
    module, outcome = cc.CodegenCache(tmp_path / "cache", write_behind=False).lower_with_outcome(mod, target)
    assert outcome.tier == "disk"
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))


def test_a_codegen_result_that_is_no_module_goes_back_to_its_caller_unstored(tmp_path, llvm_vadd):
    # tilelang's registry returns whatever a codegen returns; the cache cannot store such a result,
    # and must neither raise for it nor serve it later.
    mod, target = llvm_vadd
    results = iter(["first result", None])

    def build(mod, target):
        return next(results)

    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False, min_codegen_time=0)
    codegen = cc.DeviceCodegen("llvm-odd", build=build)
    assert cache.lower(mod, target, codegen=codegen) == "first result"
    assert cache.lower(mod, target, codegen=codegen) is None  # ran again: nothing was kept
    stats = cache.stats(shared=False)
    assert stats.codegen_runs == 2 and stats.stores == 0 and stats.stores_skipped == 2
    assert len(cache.store("compiled")) == 0


def test_bad_input_errors_name_the_value(cache, llvm_vadd):
    mod, _ = llvm_vadd
    # Not an IRModule: nothing to key, so the codegen gets it as it is (as in tilelang) and
    # the cache counts it as uncacheable; here TVM's codegen rejects the string.
    with pytest.raises(TypeError, match="Mismatched type on argument #0.*IRModule"):
        cache.lower("not a module", "llvm")  # type: ignore[arg-type]
    assert cache.stats(shared=False).uncacheable == 1
    with pytest.raises(ValueError, match="No device codegen named 'nope' for target kind 'llvm'"):
        cache.lower(mod, "llvm", codegen="nope")
    with pytest.raises(cc.ConfigError, match="invalid value -1 for memory_entries"):
        cc.CodegenCache("/tmp/x", memory_entries=-1)


def test_context_default_is_reset_between_tests():
    assert _context.active_cache is not None


def test_a_value_file_deleted_between_its_read_and_its_load_is_still_a_correct_hit(tmp_path, llvm_vadds, monkeypatch):
    # Another process (clear, prune, a size cull) may delete an entry's value file right after
    # this process read it: the bytes read are whole, and they are what is loaded.
    from codegen_cache._storage._disk import ArtifactStore

    writer = cc.CodegenCache(tmp_path, write_behind=False)
    mod, target = llvm_vadds  # an entry in a value file
    expected = run_binary(writer.lower(mod, target), "vadd0")
    assert writer.flush(upgrades=True, timeout=180)  # a shared library
    writer.close()
    read, deleted = ArtifactStore.read, []

    def read_then_delete(store, digest):
        row = read(store, digest)
        if row is not None and row.path is not None:
            os.unlink(row.path)
            deleted.append(row.path)
        return row

    monkeypatch.setattr(ArtifactStore, "read", read_then_delete)
    cache = cc.CodegenCache(tmp_path)
    module, outcome = cache.lower_with_outcome(mod, target)
    assert deleted and outcome.tier == "disk"
    np.testing.assert_array_equal(run_binary(module, "vadd0"), expected)
    assert cache.stats(shared=False).corrupt == 0
