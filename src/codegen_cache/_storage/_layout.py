"""The names of the stores in a cache directory, in one place (docs/architecture.md, "What lives in a cache directory")."""

from __future__ import annotations

__all__ = ["ALL_STORES", "ENTRY_STORES", "FRONTEND_DIR", "STORE_NAMES"]

# A lowering's entry lives in the store named after its mode (the key's `mode` part).
ENTRY_STORES = ("compiled", "source")
# Every diskcache store: the two above, remembered codegen failures, codegen_cache.build's index.
STORE_NAMES = (*ENTRY_STORES, "failures", "builds")
# Whole-kernel entries of frontends (codegen_cache.tilelang), one plain file each, `<key>.so`:
# a PlainFiles store (_storage/_plain.py).
FRONTEND_DIR = "tilelang"
# Every store the command line reports on.
ALL_STORES = (*STORE_NAMES, FRONTEND_DIR)
