"""The names of the stores in a cache directory, in one place (docs/architecture.md, "What lives in a cache directory")."""

from __future__ import annotations

__all__ = ["ALL_STORES", "ENTRY_STORES", "FRONTEND_DIR", "INDEX_CODEC", "INDEX_CODECS", "LINEAGE_CODEC", "MODEL_CODEC",
           "STAGED_DIR", "STORE_NAMES", "TENSOR_CODEC"]

# A lowering's entry lives in the store named after its mode (the key's `mode` part).
ENTRY_STORES = ("compiled", "source")
# Every diskcache store: the two above, remembered codegen failures, and the index of whole builds
# (codegen_cache.build's index entries). Compiled Relax models are kept in `compiled`, beside the
# library they import: a warm compile reads both through their key files (_storage/_disk.py), or,
# where those lead nowhere, from one store's rows (_build/_relax.py).
STORE_NAMES = (*ENTRY_STORES, "failures", "index")
# Entries written but not yet moved into their store: `<dir>/staged/<store>/` (_storage/_pending.py).
STAGED_DIR = "staged"
# Whole-kernel entries of frontends (codegen_cache.tilelang), one plain file each, `<key>.so`:
# a PlainFiles store (_storage/_plain.py).
FRONTEND_DIR = "tilelang"
# Every store the command line reports on.
ALL_STORES = (*STORE_NAMES, FRONTEND_DIR)
# Whole-build entries: codegen_cache.build's index entries (no payload field; the index store) and
# compiled Relax models (tvm.compile through enable(): one field, the VMExecutable's bytes; the
# compiled store). Both are staged in `<dir>/staged/index/` until the writer stores them.
INDEX_CODEC = "build-index"
MODEL_CODEC = "relax-executable"
# A compiled model's bound weights, by content: one chunk of a constant's bytes per entry, in the
# compiled store beside the models that name it (_build/_tensors.py); stored directly, never staged
# in `index`.
TENSOR_CODEC = "tensor-chunk"
# The stored models of one family (the same Relax function names): what explains a model's miss
# (_build/_lineage.py); in the index store.
LINEAGE_CODEC = "model-lineage"
# Payload fields of each, for the command line's verify.
INDEX_CODECS = {INDEX_CODEC: 0, MODEL_CODEC: 1, TENSOR_CODEC: 1, LINEAGE_CODEC: 0}
