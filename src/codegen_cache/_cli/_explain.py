"""`codegen-cache explain`: why a lowering missed, part by part.

The key of the lowering is computed; then every stored entry's key parts (kept in its
metadata) are compared with it. The entries that share the most parts are the nearest, and
the parts they differ in say why the lookup missed: "same IR and target; tvm 0.27+abc ->
0.27+def" means the entry was written by another TVM build.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .._artifacts import unframe
from .._errors import ArtifactError
from ._inventory import ENTRY_STORES, StoredItem, iter_entries
from ._commands import plural
from .._storage._disk import STORAGE_ERRORS

__all__ = ["explain", "render"]

_LABELS = {"ir": "IR", "tvm_ffi": "tvm-ffi"}
_HINTS = {
    "ir": "The device IR differs: the kernel changed, or it was lowered differently (schedule, "
          "PassContext options, TVM's passes). Only the same device module can hit.",
    "target": "The target differs; every target attribute (arch, host, ...) is part of the key.",
    "codegen": "Another codegen made the entry (an override or a different registration for the kind).",
    "mode": "The entry was stored in the other mode (compile_device); lower in that mode, or warm this "
            "one: codegen-cache warm --mode compiled|source.",
    "tvm": "Entries written by another TVM build are never reused (its codegen may emit other code). "
           "Warm the cache with this build; codegen-cache prune --older-than removes the old entries.",
    "tvm_ffi": "Entries written with another tvm-ffi version are never reused.",
    "llvm": "Entries written with another LLVM version are never reused.",
    "format": "The artifact format changed with this version of tvm-codegen-cache.",
    "toolchain": "The codegen's toolchain differs: its compiler version (nvcc) or an environment "
                 "variable it reads.",
    "salt": "The codegen declares another salt of its own.",
    # codegen_cache.build's key (docs/tvm-build.md)
    "input": "The module given to codegen_cache.build differs (its structural hash).",
    "pipeline": "Another TIR pipeline was named.",
    "pipeline_target": "The target that picks the default pipeline differs.",
    "pass_context": "The PassContext differs (opt_level, config, required or disabled passes).",
    "codegens": "The codegens the build may call differ (a registration, an override, a mode, a toolchain).",
    "index_format": "The build index format changed with this version of tvm-codegen-cache.",
}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'host': {'kind': 'llvm'}} -> {'host.kind': 'llvm'}."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _short(value: Any, width: int = 48) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_diff(stored: str, wanted: str) -> list[str]:
    try:
        a, b = _flatten(json.loads(stored)), _flatten(json.loads(wanted))
    except ValueError:
        return [f"{_short(stored)} → {_short(wanted)}"]
    changes = []
    for name in sorted(set(a) | set(b)):
        if name not in a:
            changes.append(f"{name} (none) → {_short(b[name])}")
        elif name not in b:
            changes.append(f"{name} {_short(a[name])} → (none)")
        elif a[name] != b[name]:
            changes.append(f"{name} {_short(a[name])} → {_short(b[name])}")
    return changes


def _part_diff(name: str, stored: str | None, wanted: str | None) -> str:
    label = _LABELS.get(name, name)
    if stored is None:
        return f"{label} is not in the stored entry's key (written by another version)"
    if wanted is None:
        return f"{label} is in the stored entry's key but not in this one"
    if name in ("target", "toolchain"):
        changes = _json_diff(stored, wanted)
        more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
        return f"{label} " + ", ".join(changes[:3]) + more
    return f"{label} {_short(stored)} → {_short(wanted)}"


class _Relowering:
    """The IR hash the kernel would have if lowered for another target (memoized per target).

    The target is an attribute of every function in the device IR, so two lowerings of one
    kernel for two targets differ in the IR part too; lowering the kernel for the stored
    entry's target tells whether the target is the only real difference.
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.hashes: dict[str, str | None] = {}

    def ir_for(self, target_json: str | None) -> str | None:
        if self.kernel is None or not target_json:
            return None
        if target_json not in self.hashes:
            self.hashes[target_json] = self._lower(target_json)
        return self.hashes[target_json]

    def _lower(self, target_json: str) -> str | None:
        from .._key import ir_hash
        from .._build._prepare import prepare_for_codegen
        from ._kernel_files import parse_target

        try:
            mod, _target = prepare_for_codegen(self.kernel, parse_target(target_json))
        except Exception:  # noqa: BLE001 - the kernel may not lower for that target at all: no answer
            return None
        return f"{ir_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def _compare(entry: StoredItem, wanted: dict[str, str], relower: _Relowering) -> dict[str, Any]:
    stored = entry.parts
    names = list(wanted) + [n for n in stored if n not in wanted]
    same = [n for n in names if stored.get(n) == wanted.get(n)]
    differs = [n for n in names if stored.get(n) != wanted.get(n)]
    # Same kernel, other target: the IR differs only through the target attribute.
    via_target = ("ir" in differs and "target" in differs and stored.get("ir") is not None
                  and relower.ir_for(stored.get("target")) == stored.get("ir"))
    if via_target:
        differs.remove("ir")
    lead = [label for part, label in (("ir", "IR"), ("target", "target")) if part in same]
    pieces = ["same kernel (the IR differs only by its target attribute)"] if via_target else []
    pieces += [f"same {' and '.join(lead)}"] if lead else []
    texts = {n: _part_diff(n, stored.get(n), wanted.get(n)) for n in differs}
    if "mode" in differs and "toolchain" in differs:
        texts["toolchain"] = "toolchain (its compile-only parts follow the mode)"
    pieces += list(texts.values())
    return {
        "key": entry.key,
        "store": entry.store,
        "codegen": entry.meta.get("codegen"),
        "target": entry.target,
        "func_names": entry.meta.get("func_names", []),
        "created": entry.created,
        "shared": len(same) + via_target,
        "parts": len(names),
        "same": same,
        "ir_differs_by_target_only": via_target,
        "differs": [{"part": n, "stored": stored.get(n), "wanted": wanted.get(n), "text": texts[n]}
                    for n in differs],
        "summary": "; ".join(pieces) if differs else "identical key",
    }


def _rank(comparison: dict[str, Any]) -> tuple:
    # Most shared parts first; on a tie the same IR is the more telling neighbour, then newest.
    same_ir = "ir" in comparison["same"] or comparison["ir_differs_by_target_only"]
    return (comparison["shared"], same_ir, comparison["created"] or 0.0)


def _failure(cache, digest: str) -> dict[str, Any] | None:
    if not (cache.directory / "failures").is_dir():
        return None
    try:
        blob = cache.store("failures").get(digest)
        meta = unframe(blob).meta if blob is not None else None
    except (ArtifactError, *STORAGE_ERRORS):
        return None
    return None if meta is None else {"error_type": meta.get("error_type"), "message": meta.get("message"),
                                      "created": meta.get("created")}


def _verdict(status: str, nearest: list[dict[str, Any]], entries: int, wanted_funcs: list[str],
             failure: dict[str, Any] | None, directory: Path, others_summary: str = "") -> list[str]:
    if status == "hit":
        return ["This lowering is served by the cache."]
    if status == "failure":
        return [f"The codegen failed for this key before ({failure['error_type']}: {_short(failure['message'], 200)}); "
                "the failure is served from the failure cache until it expires. "
                "codegen-cache clear --failures forgets it."]
    if entries == 0:
        return [f"The cache at {directory} holds no entries, so every lowering misses. If your runs "
                "should have filled it, check that they use this directory (CODEGEN_CACHE_DIR, --dir) "
                "and that CODEGEN_CACHE_DISABLE is not set."]
    if not nearest:
        return [f"No stored entry was made by this codegen ({others_summary}): nothing to compare with. "
                "Lower or warm this kernel for this target (codegen-cache warm) to fill the cache."]
    lines = []
    best = nearest[0]
    for diff in best["differs"]:
        if diff["part"] == "toolchain" and any(d["part"] == "mode" for d in best["differs"]):
            continue
        hint = _HINTS.get(diff["part"], f"The key part {diff['part']!r} differs.")
        if diff["part"] == "ir" and sorted(best["func_names"]) == sorted(wanted_funcs):
            hint += f" The nearest entry has the same functions ({', '.join(wanted_funcs)})."
        if diff["part"] == "target" and best["ir_differs_by_target_only"]:
            hint += " The kernel is the same: lowered for the entry's target, its IR matches."
        lines.append(f"{diff['text']}. {hint}" if diff["part"] != "ir" else hint)
    return lines


def explain(cache, mod, target, *, modes: list[bool], limit: int = 3, kernel=None) -> dict[str, Any]:
    """For each mode: the key, whether it hits, the nearest stored entries and what differs.

    `kernel`, the module before lowering, lets explain tell a changed kernel from a changed
    target (by lowering it for the stored entries' targets).
    """
    from .._artifacts import function_names  # the names the cache records in entries

    entries = list(iter_entries(cache, ENTRY_STORES))
    wanted_funcs = function_names(mod)
    relower = _Relowering(kernel)
    report: dict[str, Any] = {"directory": str(cache.directory), "entries": len(entries),
                              "func_names": wanted_funcs, "modes": []}
    for compile_device in modes:
        key = cache.key_for(mod, target, compile_device=compile_device)
        wanted = key.as_dict()
        mode = "compiled" if compile_device else "source"
        exact = next((e for e in entries if e.key == key.digest and e.store == mode), None)
        unverified = _unverified(cache, exact, mod)
        if unverified:
            exact = None
        failure = None if exact else _failure(cache, key.digest)
        status = "hit" if exact else "failure" if failure else "miss"
        others = [_compare(e, wanted, relower) for e in entries if e is not exact]
        others.sort(key=_rank, reverse=True)
        patterns = Counter(tuple(d["part"] for d in c["differs"]) for c in others)
        # Entries of another codegen (llvm beside CUDA) differ in everything: not worth listing.
        nearest = [c for c in others if "codegen" in c["same"]][:limit]
        codegens = Counter(str(e.meta.get("codegen")) for e in entries)
        others_summary = "the cache holds " + ", ".join(f"{n} {name}" for name, n in codegens.most_common())
        report["modes"].append({
            "mode": mode,
            "key": key.digest,
            "parts": wanted,
            "status": status,
            "entry": None if exact is None else {"store": exact.store, "created": exact.created,
                                                 "age_seconds": time.time() - (exact.created or time.time())},
            "failure": failure,
            "nearest": nearest,
            "patterns": [{"differs": list(p), "entries": n} for p, n in patterns.most_common(5)],
            "verdict": [unverified] if unverified else _verdict(status, nearest, len(entries), wanted_funcs, failure,
                                                                cache.directory, others_summary),
        })
    return report


def _unverified(cache, exact: StoredItem | None, mod) -> str:
    """Why CODEGEN_CACHE_VERIFY=1 would not serve the entry stored under the key ('' if it would)."""
    if exact is None or not cache.settings.verify:
        return ""
    from .._cache._tiers import ir_digest

    stored = exact.meta.get("ir_digest")
    if stored is None:
        return ("An entry is stored under this key, but without the exact IR digest that CODEGEN_CACHE_VERIFY=1 "
                "requires (it was written with verify off): it is not served, so this lowering runs the codegen and "
                "stores an entry that carries the digest.")
    if stored != ir_digest(mod):
        return ("The entry stored under this key holds another IRModule (a 64-bit structural hash collision, "
                "caught by CODEGEN_CACHE_VERIFY=1): this lowering runs the codegen without caching.")
    return ""


def render(report: dict[str, Any]) -> list[str]:
    """The report as `codegen-cache explain` prints it."""
    from .._config import format_age

    names = [n.removeprefix("__tvm_ffi_") for n in report["func_names"]]
    lines = [f"cache {report['directory']}: {plural(report['entries'], 'entry', 'entries')}"
             + (f"; functions {', '.join(names)}" if names else "")]
    for m in report["modes"]:
        lines += ["", f"{m['mode']}: key {m['key']} -> {m['status'].upper()}"]
        if m["status"] == "hit":
            lines.append(f"  stored in {m['entry']['store']}/ {format_age(m['entry']['age_seconds'])} ago")
            lines += [f"  {line}" for line in m["verdict"]]
            continue
        for n in m["nearest"]:
            age = "?" if n["created"] is None else format_age(max(0.0, time.time() - n["created"]))
            lines.append(f"  {n['key'][:16]} {n['store']:<8} shares {n['shared']}/{n['parts']} parts, "
                         f"{age} old: {n['summary']}")
        if len(m["patterns"]) > 1:
            lines.append("  all stored entries, by what differs:")
            lines += [f"    {p['entries']:>5}  {', '.join(p['differs']) or '(nothing)'}" for p in m["patterns"]]
        lines += [f"  why: {line}" for line in m["verdict"]]
    return lines
