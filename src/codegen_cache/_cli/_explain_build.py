"""`codegen-cache explain --build`: why a codegen_cache.build call missed.

A build is served whole when its build key has an index entry in `<dir>/index` and every
codegen entry that index names is still stored. So a miss is either no index entry (the
nearest index entries say which build-key part differs: the input module, the PassContext,
the pipeline, ...) or an index entry whose parts are gone (evicted, cleared, pruned).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ._explain import _compare, _HINTS, _rank, _Relowering
from ._inventory import StoredItem, iter_entries

__all__ = ["explain_build"]


def explain_build(cache, kernel, target, *, limit: int = 3) -> dict[str, Any]:
    """The build key of `codegen_cache.build(kernel, target)`, whether it hits, and why not."""
    from .._build import build_key

    key = build_key(kernel, target, registry=cache.registry)
    report: dict[str, Any] = {"directory": str(cache.directory), "func_names": [], "modes": []}
    if key is None:
        report["entries"] = 0
        report["modes"].append({"mode": "build", "key": "-", "parts": {}, "status": "uncacheable", "entry": None,
                                "failure": None, "nearest": [], "patterns": [],
                                "verdict": ["This build has no key (a PassContext with instruments, or a module "
                                            "that cannot be hashed): codegen_cache.build lowers it every time, "
                                            "each codegen call still goes through the cache."]})
        return report
    indexed = list(iter_entries(cache, ("index",)))
    report["entries"] = len(indexed)
    exact = next((e for e in indexed if e.key == key.digest), None)
    missing = _missing_parts(cache, exact) if exact is not None else []
    status = "miss" if exact is None or missing else "hit"
    others = sorted((_compare(e, key.as_dict(), _Relowering(None)) for e in indexed if e is not exact),
                    key=_rank, reverse=True)
    patterns = Counter(tuple(d["part"] for d in c["differs"]) for c in others)
    report["modes"].append({
        "mode": "build",
        "key": key.digest,
        "parts": key.as_dict(),
        "status": status,
        "entry": None if exact is None else {"store": "index", "created": exact.created,
                                             "age_seconds": time.time() - (exact.created or time.time())},
        "failure": None,
        "nearest": others[:limit] if exact is None else [],
        "patterns": [{"differs": list(p), "entries": n} for p, n in patterns.most_common(5)] if exact is None else [],
        "verdict": _verdict(exact, missing, others, len(indexed), cache.directory),
    })
    return report


def _missing_parts(cache, index: StoredItem) -> list[str]:
    """The codegen entries an index entry names that are no longer stored ('host llvm compiled <digest>')."""
    missing = []
    for part in (*index.meta.get("devices", []), index.meta.get("host")):
        if not isinstance(part, dict) or part.get("mode") not in ("compiled", "source"):
            missing.append(f"a malformed part {part!r}")
            continue
        if not cache.has_entry(part["mode"], str(part.get("digest"))):
            missing.append(f"{part.get('role')} {part.get('codegen')} {part['mode']} {str(part.get('digest'))[:16]}")
    return missing


def _verdict(exact: StoredItem | None, missing: list[str], others: list[dict[str, Any]], entries: int, directory) -> list[str]:
    if exact is not None and not missing:
        return ["This build is served by the cache (its index entry and every entry it names are stored)."]
    if exact is not None:
        return [f"The build index knows this build, but entries it names are gone ({'; '.join(missing)}): "
                "evicted, cleared or pruned. The build lowers again and refills them."]
    if entries == 0:
        return [f"The cache at {directory} holds no build index entries: codegen_cache.build has not stored a "
                "build here (check CODEGEN_CACHE_DIR, --dir and CODEGEN_CACHE_DISABLE)."]
    best = others[0]
    return [f"{d['text']}. {_HINTS.get(d['part'], '')}".rstrip() for d in best["differs"]]
