"""The names of the stores in a cache directory, in one place (docs/architecture.md, "What lives in a cache directory")."""

from __future__ import annotations

__all__ = ["ALL_STORES", "BUILDS_CODECS", "ENTRY_STORES", "FRONTEND_DIR", "INDEX_CODEC", "MODEL_CODEC", "STORE_NAMES"]

# A lowering's entry lives in the store named after its mode (the key's `mode` part).
ENTRY_STORES = ("compiled", "source")
# Every diskcache store: the two above, remembered codegen failures, codegen_cache.build's index.
STORE_NAMES = (*ENTRY_STORES, "failures", "builds")
# Whole-kernel entries of frontends (codegen_cache.tilelang), one plain file each, `<key>.so`:
# a PlainFiles store (_storage/_plain.py).
FRONTEND_DIR = "tilelang"
# Every store the command line reports on.
ALL_STORES = (*STORE_NAMES, FRONTEND_DIR)
# What the builds store holds: codegen_cache.build's index entries (no payload field) and
# compiled Relax models (tvm.compile through enable(): one field, the VMExecutable's bytes).
INDEX_CODEC = "build-index"
MODEL_CODEC = "relax-executable"
# Payload fields of each, for the command line's verify.
BUILDS_CODECS = {INDEX_CODEC: 0, MODEL_CODEC: 1}
