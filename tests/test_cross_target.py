"""llvm for another CPU (-mtriple aarch64, ARM, RISC-V on this host) is stored as LLVM IR and never linked here.

Such an entry cannot be a shared library this host loads, and linking its object with this host's
compiler fails (it did, twice per entry, in every process that opened the cache). It stays LLVM
IR: a hit is an llvm module parsed from it, which writes that CPU's object code and exports with
a cross toolchain, as the module TVM builds does. Host entries still become shared libraries.
"""

from __future__ import annotations

import pytest

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import read_meta
from warm_scenarios import CROSS_TARGETS

HOST = "llvm"


def _stored_codec(cache: cc.CodegenCache, digest: str) -> str:
    row = cache.store("compiled").read(digest)
    blob = row.blob if row is not None else cache.staged("compiled").read(digest)
    return read_meta(blob)[0]


def _upgrader_log(directory) -> str:
    log = directory / "tmp" / "cgc-upgrader.log"
    return log.read_text() if log.exists() else ""


@pytest.mark.timeout(300)
def test_cross_target_entries_stay_ir_are_never_linked_and_hit_as_llvm_modules(tmp_path):
    directory = tmp_path / "cache"
    cache = cc.CodegenCache(directory)
    lowered = {name: cc.prepare_for_codegen(kernels.vadd, {"kind": "llvm", "mtriple": triple})
               for name, (triple, _machine) in CROSS_TARGETS.items()}
    lowered[HOST] = cc.prepare_for_codegen(kernels.vadd, "llvm")
    digests = {name: cache.lower_with_outcome(mod, target)[1].key for name, (mod, target) in lowered.items()}
    assert cache.flush(upgrades=True, timeout=240)
    for _ in range(2):  # a process that opens the cache afresh, twice: hits, and no upgrade asked for
        fresh = cc.CodegenCache(directory)
        for name, (mod, target) in lowered.items():
            module, outcome = fresh.lower_with_outcome(mod, target)
            assert outcome.tier == "disk" and module.kind == "llvm", name
            assert module.is_compilation_exportable() and not module.is_binary_serializable(), name
        assert fresh.flush(upgrades=True, timeout=240)
    codecs = {name: _stored_codec(cache, digest) for name, digest in digests.items()}
    assert codecs == {**{name: "llvm-ir" for name in CROSS_TARGETS}, HOST: "llvm-so"}, codecs
    stats = cc.CodegenCache(directory).stats()
    assert (stats.upgrades, stats.errors.get("upgrade", 0)) == (1, 0), stats
    assert "failed" not in _upgrader_log(directory)


def test_a_cross_target_hit_writes_that_cpus_object_code(tmp_path):
    triple, machine = CROSS_TARGETS["aarch64"]
    mod, target = cc.prepare_for_codegen(kernels.vadd, {"kind": "llvm", "mtriple": triple})
    cc.CodegenCache(tmp_path / "cache", write_behind=False).lower(mod, target)
    module, outcome = cc.CodegenCache(tmp_path / "cache").lower_with_outcome(mod, target)
    assert outcome.tier == "disk" and isinstance(module, cc._artifacts.CachedIRModule)
    module.write_to_file(str(tmp_path / "vadd.o"))
    assert int.from_bytes((tmp_path / "vadd.o").read_bytes()[18:20], "little") == machine
    assert module.get_function("_get_target_string")().find(triple) >= 0
