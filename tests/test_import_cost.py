"""`import codegen_cache` brings in the registry only; the switch imports what a first compile needs, nothing more.

The cache's stores load at the first use of a cache, diskcache where a store is first opened
through it (a write; a lookup never is); what only a miss uses (build locks, the failures store,
staging and promotion, the upgrader) at the first miss; the remote tier's client (TLS) only
where a remote is configured; kernel preparation, MetaSchedule's builder, the CLI and
tilelang's frontend at their first use.
"""

from __future__ import annotations

import pytest

from processes import python_json

MODULES_AFTER = """
    import json, sys
    import tvm
    before = set(sys.modules)
    import codegen_cache
    imported = set(sys.modules) - before
    codegen_cache.enable(codegen_cache.CodegenCache(sys.argv[1]), children=False)
    enabled = set(sys.modules) - before - imported
    print(json.dumps({"import": sorted(imported), "enable": sorted(enabled)}))
"""

# Modules the first compile does not need (docs/tvm.md, "What the switch imports").
REMOTE = ("ssl", "codegen_cache._storage._client", "codegen_cache._storage._endpoint",
          "codegen_cache._storage._remote", "codegen_cache._storage._leases", "codegen_cache._storage._resp")
AT_FIRST_USE = ("codegen_cache._build._metaschedule", "codegen_cache._build._prepare", "codegen_cache._cli",
                "codegen_cache.tilelang")
# What only a miss, or a write to a store, uses: a process that only hits never imports it.
MISS = ("diskcache", "codegen_cache._storage._safedisk", "codegen_cache._storage._locks",
        "codegen_cache._storage._holders", "codegen_cache._storage._outbox", "codegen_cache._cache._flight",
        "codegen_cache._cache._failures", "codegen_cache._cache._promotion", "codegen_cache._cache._push",
        "codegen_cache._cache._upgrade")
# The CUDA codecs: a process that caches no CUDA (enable(), an llvm hit or miss) never imports them.
CUDA = ("codegen_cache._artifacts._cuda", "codegen_cache.codegens.cuda")
# Standard and third-party modules only a rarer path needs: the default directory (platformdirs,
# where none is given), a typo's suggestion (difflib); statistics is not used.
RARE = ("platformdirs", "difflib", "statistics")


@pytest.mark.slow
def test_import_codegen_cache_after_tvm_imports_no_cache_store_and_enable_no_remote_client(tmp_path):
    found = python_json(MODULES_AFTER, str(tmp_path / "cache"))
    imported, enabled = set(found["import"]), set(found["enable"])
    assert {m for m in imported if not m.startswith("codegen_cache")} <= {"xxhash", "xxhash._xxhash", "xxhash.version"}
    assert not {m for m in imported if m.startswith(("codegen_cache._cache", "codegen_cache._storage",
                                                     "codegen_cache._build", "codegen_cache._config"))}
    assert len(imported) <= 16, sorted(imported)
    # enable() with a cache: the cache and its disk stores, the switch and the model-level cache.
    assert {"codegen_cache._switch", "codegen_cache._build._relax", "codegen_cache._storage._disk"} <= enabled
    assert not enabled & set(REMOTE), sorted(enabled & set(REMOTE))
    assert not {m for m in enabled if m.startswith(AT_FIRST_USE)}
    assert not enabled & set(RARE), sorted(enabled & set(RARE))
    assert not enabled & set(MISS), sorted(enabled & set(MISS))
    assert not enabled & set(CUDA), sorted(enabled & set(CUDA))
    assert not (tmp_path / "cache").exists()  # enabling opens no store: the first compile does


HIT_THEN_MISS = """
    import json, sys
    import tvm
    import codegen_cache as cc
    import kernels
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    other, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    before = set(sys.modules)
    cache = cc.CodegenCache(sys.argv[1])
    tier = cache.lower_with_outcome(mod, target)[1].tier
    after_hit = set(sys.modules) - before
    miss = cache.lower_with_outcome(other, target)[1].tier
    cache.flush(timeout=120)
    print(json.dumps({"tiers": [tier, miss], "hit": sorted(after_hit), "miss": sorted(set(sys.modules) - before)}))
"""


@pytest.mark.slow
def test_a_process_that_only_hits_imports_nothing_only_a_miss_uses(tmp_path):
    import codegen_cache as cc
    import kernels

    filler = cc.CodegenCache(tmp_path / "cache", write_behind=False, min_codegen_time=0)
    filler.lower(*cc.prepare_for_codegen(kernels.vadd, "llvm"))
    assert filler.flush(timeout=120, upgrades=True)
    found = python_json(HIT_THEN_MISS, str(tmp_path / "cache"), env={"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0"})
    assert found["tiers"] == ["disk", "codegen"]
    assert not set(found["hit"]) & set(MISS), sorted(set(found["hit"]) & set(MISS))
    # The same modules do come with the first miss (where the list above is what a miss uses).
    assert {"codegen_cache._cache._flight", "codegen_cache._cache._promotion", "diskcache"} <= set(found["miss"])
    assert not set(found["miss"]) & set(CUDA), sorted(set(found["miss"]) & set(CUDA))
