"""Compiled CUDA entries made on a host without a GPU: nvcc runs, nothing is loaded.

A GPU-less build machine (CI, a login node) fills the compiled store for GPU hosts that share
the cache (its directory, or the remote tier). The compile is single-flight like a lowering:
N processes warming one configuration run nvcc once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _artifacts
from .._artifacts import read_meta
from .._errors import ArtifactError
from .._compat import IRModule
from .._targets import TargetLike, as_target
from ._tiers import Probe

if TYPE_CHECKING:
    from ._cache import CodegenCache
    from ._flight import SingleFlight

__all__ = ["precompile_cuda"]


def precompile_cuda(cache: CodegenCache, mod: IRModule, target: TargetLike, codegen: Any = None, *,
                    flight: SingleFlight, stage: Callable[..., Callable[[], None] | None]) -> str:
    """Compile CUDA with nvcc and store the binary for compile_device=True; returns the key digest.

    `flight` is the cache's single-flight and `stage` its CodegenCache._stage: the cache hands
    them over, as a lowering's miss uses them.
    """
    from ..codegens.cuda import compile_cuda_payload

    target = as_target(target)
    codegen = cache.resolve(target, codegen)
    key = cache.key_for(mod, target, compile_device=True, codegen=codegen)
    digest = key.digest

    def stored() -> bytes | None:
        # Present is enough: on this host the entry cannot be loaded (no driver), only kept.
        return cache.entry_blob("compiled", digest)

    stats = cache.counters
    count = stats.add_for

    def hit(blob: bytes) -> str:
        # Found, so nvcc did not run: a hit, as ccache counts one, saving the recorded compile time.
        try:
            saved = float(read_meta(blob)[1].get("build_seconds") or 0.0)
        except (ArtifactError, TypeError, ValueError):
            saved = 0.0  # a bad entry: the cache drops it when it is read
        stats.add_hit(codegen.name, "compiled", "disk", saved)
        return digest

    found = None if cache.settings.recache else stored()
    if found:
        return hit(found)
    stats.add_call(codegen.name, "compiled", "misses")
    held = promote = None
    if not cache.settings.recache:
        held, found = flight.begin(digest, stored)
        if found:
            # Compiled by another process while we waited: a hit, not a miss.
            stats.add_call(codegen.name, "compiled", "misses", -1)
            return hit(found)
    try:
        t0 = time.perf_counter()
        payload, source = compile_cuda_payload(mod, target)
        seconds = time.perf_counter() - t0
        count(codegen.name, "compiled", "codegen_runs")
        count(codegen.name, "compiled", "codegen_seconds", seconds)
        meta = {"key": digest, "parts": key.as_dict(), "codegen": codegen.name, "mode": "compiled",
                "target_kind": target.kind.name, "build_seconds": seconds, "created": time.time()}
        if cache.settings.verify:
            meta["ir_digest"] = Probe(digest, "compiled", mod).ir_digest
        blob = _artifacts.encode_cuda_binary(payload, source, meta, func_names=_artifacts.function_names(mod))
        promote = stage(codegen.name, "compiled", digest, blob)
    finally:
        flight.release(held)
    if promote is not None:
        promote()
    return digest
