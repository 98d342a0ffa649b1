"""Why a compiled model missed: the nearest stored entry of the same model, and the key parts that differ.

Each stored model adds a record (key digest, key parts, its weights' per-tensor digests, when
made) to its family's lineage entry in the index store (codec "model-lineage", one entry per
family; the newest FAMILY_RECORDS records are kept). A family is what a user calls "the same
model": the names of the module's Relax functions. A miss is explained against the record
that shares the most key parts, newest first on a tie, as JAX's explain_cache_misses does:
the parts that differ, and for the weights which tensors.

Records are written after the model's own entry (by the writer thread where the cache writes
behind): a lost record costs an explanation, never a hit. Two processes adding to one family
at once may keep one record of the two (the last write wins).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import xxhash

from .._artifacts import frame, unframe
from .._cache import CodegenCache
from .._compat import IRModule
from .._errors import ArtifactError
from .._storage._disk import STORAGE_ERRORS
from .._storage._layout import LINEAGE_CODEC

__all__ = ["FAMILY_RECORDS", "add_record", "explain", "family_of", "nearest"]

logger = logging.getLogger(__name__)

FAMILY_RECORDS = 16
_STORE = "index"
_PREFIX = b"cgc-model-family\0"
# Key parts a reader understands without the key: shown first, in this order.
_TELLING = ("input", "weights", "params", "target", "pass_context", "registered", "relax_pipeline",
            "tir_pipeline", "exec_mode", "system_lib", "database", "codegens", "codegen_cache", "tvm", "tvm_ffi",
            "llvm", "model_format")


def family_of(mod: IRModule) -> str:
    """The lineage digest of `mod`'s family: the sorted names of its functions."""
    names = sorted(gv.name_hint for gv in mod.functions)
    return xxhash.xxh3_128_hexdigest(_PREFIX + "\0".join(names).encode())


def _records(cache: CodegenCache, family: str) -> list[dict[str, Any]]:
    try:
        blob = cache.store(_STORE).get(family)
        art = unframe(blob) if blob is not None else None
    except (*STORAGE_ERRORS, ArtifactError) as err:
        logger.debug("codegen cache: no model lineage %s: %s", family[:16], err)
        return []
    records = art.meta.get("records") if art is not None and art.codec == LINEAGE_CODEC else None
    return [r for r in records or () if isinstance(r, dict) and isinstance(r.get("parts"), dict)]


def nearest(records: list[dict[str, Any]], key: str, parts: dict[str, str],
            tensors: list[str] | None) -> dict[str, Any] | None:
    """The record sharing the most parts with `parts` (not `key` itself), with what differs; None: no other record."""
    best = None
    for record in records:
        if record.get("key") == key:
            continue
        stored = record["parts"]
        names = [*parts, *(n for n in stored if n not in parts)]
        differs = [n for n in names if stored.get(n) != parts.get(n)]
        rank = (len(names) - len(differs), record.get("created") or 0.0)
        if best is None or rank > best[0]:
            best = (rank, record, differs)
    if best is None:
        return None
    _rank, record, differs = best
    differs.sort(key=lambda n: (_TELLING.index(n) if n in _TELLING else len(_TELLING), n))
    found = {"key": record.get("key"), "created": record.get("created"), "differs": differs}
    theirs = record.get("tensors")
    if "weights" in differs and isinstance(theirs, list) and tensors is not None:
        if len(theirs) == len(tensors):
            found["tensors"] = [i for i, (a, b) in enumerate(zip(theirs, tensors)) if a != b]
        found["tensor_count"] = [len(theirs), len(tensors)]
    return found


def describe(found: dict[str, Any] | None) -> str:
    """One line: which parts differ from the nearest entry (and which tensors)."""
    if found is None:
        return "no other entry of this model is stored"
    parts = []
    for name in found["differs"]:
        if name == "weights" and "tensors" in found:
            count = found["tensor_count"][1]
            parts.append(f"weights (tensor{'s' if len(found['tensors']) != 1 else ''} "
                         f"{', '.join(map(str, found['tensors'][:8]))}{' ...' if len(found['tensors']) > 8 else ''}"
                         f" of {count})")
        else:
            parts.append(name)
    return f"differs from the nearest entry {str(found['key'])[:16]} in: {', '.join(parts) or 'nothing'}"


def add_record(cache: CodegenCache, family: str, key: str, parts: dict[str, str], tensors: list[str] | None) -> None:
    """Explain the miss that stored `key` (logged at INFO), then add its record to the family's lineage."""
    records = _records(cache, family)
    found = nearest(records, key, parts, tensors)
    if found is not None:
        logger.info("codegen cache: compiled model %s missed: %s", key[:16], describe(found))
    record = {"key": key, "parts": parts, "created": time.time(), "tensors": tensors}
    records = [r for r in records if r.get("key") != key][-(FAMILY_RECORDS - 1):] + [record]
    try:
        cache.store(_STORE).put(family, frame(LINEAGE_CODEC, {"key": family, "records": records}, []))
    except STORAGE_ERRORS as err:
        logger.debug("codegen cache: model lineage %s not stored: %s", family[:16], err)


def explain(cache: CodegenCache, family: str, key: str, parts: dict[str, str], tensors: list[str] | None,
            stored: bool) -> dict[str, Any]:
    """A report of one model key: hit or miss, and for a miss the nearest entry of the same model."""
    records = _records(cache, family)
    found = None if stored else nearest(records, key, parts, tensors)
    return {"key": key, "status": "hit" if stored else "miss", "parts": parts, "family_entries": len(records),
            "nearest": found, "verdict": "stored: a compile of it is served by the cache" if stored else
            describe(found)}
