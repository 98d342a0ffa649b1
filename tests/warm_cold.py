"""A scenario run three ways, each in fresh interpreters: no cache, an empty cache, a warm cache.

`three_ways(name, tmp_path)` runs tests/warm_scenarios.py's scenario `name` with TVM alone
("none"), then routed through a cache in a new directory ("empty"), then routed through that
same directory again ("warm"), each in a new process (forked with TVM imported, tests/forked.py),
and the files each exported loaded and run in another new process. It returns the observations
by condition; `assert_same` compares them key by key. The warm run must be served by the cache (otherwise it would test nothing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import forked

HERE = Path(__file__).parent
CONDITIONS = ("none", "empty", "warm")
HIT_TIERS = {"memory", "disk", "remote"}


def _python(args: list[str], env: dict[str, str], timeout: float) -> None:
    # Each run is another process that starts with TVM imported and nothing else (tests/forked.py):
    # what is compared is what each process finds and does, not an interpreter's start.
    done = forked.python([str(HERE / "warm_scenarios.py"), *args], env=env, timeout=timeout)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr[-4000:]}"


def as_llvm_ir(directory: Path) -> int:
    """Turn every llvm shared-library entry of `directory` back into its LLVM IR form; how many.

    What a process finds between a cold build and the upgrader's link of its entry: hits are
    llvm modules parsed from the IR (CachedIRModule), not loaded libraries.
    """
    import codegen_cache as cc
    from codegen_cache._artifacts import frame, unframe

    cache = cc.CodegenCache(directory, write_behind=False)
    store, turned = cache.store("compiled"), 0
    for digest in list(store.keys()):
        art = unframe(store.get(digest))
        if art.codec == "llvm-so":
            store.put(digest, frame("llvm-ir", art.meta, [art.fields[1]]))
            turned += 1
    cache.close()
    return turned


def three_ways(name: str, tmp_path: Path, *, timeout: float = 240, env: dict[str, str] | None = None,
               warm_form: str = "library") -> dict:
    """{condition: {"seen": ..., "loaded": ..., "tiers": ...}} of scenario `name`.

    warm_form "ir": the warm run finds the llvm entries as LLVM IR (not linked yet), not libraries.
    """
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "CODEGEN_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}
    base.pop("CODEGEN_CACHE_DISABLE", None)
    results = {}
    for condition in CONDITIONS:
        out = tmp_path / condition
        out.mkdir()
        _python([name, str(out), "plain" if condition == "none" else "route"], base, timeout)
        _python(["--load", str(out)], base, timeout)
        observed = json.loads((out / "observed.json").read_text())
        observed["loaded"] = json.loads((out / "loaded.json").read_text())
        results[condition] = observed
        if condition == "empty" and warm_form == "ir":
            assert as_llvm_ir(tmp_path / "cache") > 0
    return results


def _differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where or '.'}: {a!r} != {b!r}"]


def assert_same(results: dict) -> None:
    """Each condition observed what TVM alone did; the warm run was served by the cache."""
    reference = {k: results["none"][k] for k in ("seen", "loaded")}
    for condition in ("empty", "warm"):
        got = {k: results[condition][k] for k in ("seen", "loaded")}
        diffs = _differences(reference, got)
        assert not diffs, f"{condition} differs from no cache:\n" + "\n".join(diffs[:40])
    tiers = results["warm"]["tiers"]
    assert tiers and set(tiers) <= HIT_TIERS | {"failure"}, f"the warm run was not served by the cache: {tiers}"
    assert all(r.get("error") is None for r in results["none"]["loaded"]), results["none"]["loaded"]
