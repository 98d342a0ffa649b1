"""`import codegen_cache` brings in the registry only; the switch imports what a first compile needs, nothing more.

The cache's stores (SQLite, diskcache) load at the first use of a cache; the
remote tier's client (TLS) only where a remote is configured; kernel preparation, MetaSchedule's
builder, the CLI and tilelang's frontend at their first use.
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
    assert not (tmp_path / "cache").exists()  # enabling opens no store: the first compile does
