"""codegen_cache.explain_model: whether a tvm.compile of a Relax model hits, and if not, what differs."""

from __future__ import annotations

from typing import Any

from .. import _context
from .._compat import IRModule, Target
from .._storage._layout import MODEL_CODEC
from . import _lineage
from ._relax import _model_key

__all__ = ["explain_model"]


def explain_model(mod: IRModule, target: Any = None, *, params: Any = None, relax_pipeline: Any = "default",
                  tir_pipeline: Any = "default", exec_mode: str = "bytecode", system_lib: bool | None = None,
                  cache: Any = None) -> dict[str, Any]:
    """Would tvm.compile(mod, target, ...) hit? For a miss: the nearest stored entry of the same model and the key parts that differ."""
    cache = cache if cache is not None else _context.get_cache()
    if cache is None:
        raise ValueError("no cache is active: pass cache=, or use use_cache()/enable() first")
    as_target = Target(target) if isinstance(target, str) else target
    found = _model_key(mod, as_target, params, relax_pipeline, tir_pipeline, exec_mode, system_lib, cache.registry)
    if found is None:
        return {"key": None, "status": "uncacheable", "parts": {}, "family_entries": 0, "nearest": None,
                "verdict": "this compile has no model key: TVM compiles it as its own (its codegen calls are cached)"}
    key, weights = found
    stored = cache.entry_blob("compiled", key.digest)
    is_model = stored is not None and MODEL_CODEC.encode() in stored[-64:]
    return _lineage.explain(cache, _lineage.family_of(mod), key.digest, key.as_dict(),
                            list(weights.tensors) if weights is not None else None, is_model)
