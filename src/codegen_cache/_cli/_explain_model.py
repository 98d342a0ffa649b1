"""`codegen-cache explain --model FILE`: why a tvm.compile of a Relax model missed.

FILE is a Python file that builds the model and leaves it in a global `mod` (an IRModule; an
importer's output, bound weights included); `params` and `target` there are used when set, and
-t wins over `target`. The report names the model key, whether it is stored, and for a miss
the nearest stored entry of the same model (the same Relax function names) with the key parts
that differ: the weights (which tensors), the target, the PassContext, ...
"""

from __future__ import annotations

import runpy
from typing import Any

__all__ = ["explain_model_file", "render_model"]


def explain_model_file(cache, path: str, target: str | None) -> dict[str, Any]:
    """The explain_model report of the model FILE leaves in `mod`; ValueError when it leaves none."""
    from .._build._model_explain import explain_model
    from .._compat import IRModule

    found = runpy.run_path(path, run_name="__codegen_cache_explain__")
    mod = found.get("mod")
    if not isinstance(mod, IRModule):
        raise ValueError(f"{path} leaves no IRModule in a global `mod` (got {type(mod).__name__})")
    report = explain_model(mod, target if target is not None else found.get("target", "llvm"),
                           params=found.get("params"), cache=cache)
    report["directory"] = str(cache.directory)
    return report


def render_model(report: dict[str, Any]) -> list[str]:
    """The report as `codegen-cache explain --model` prints it."""
    lines = [f"cache {report['directory']}: {report['family_entries']} stored entries of this model",
             f"model: key {report['key'] or '-'} -> {report['status'].upper()}"]
    nearest = report["nearest"]
    if nearest is not None:
        lines.append(f"  nearest entry {str(nearest['key'])[:16]}: differs in {', '.join(nearest['differs'])}")
        if "tensors" in nearest:
            lines.append(f"  weights: tensors {nearest['tensors']} of {nearest['tensor_count'][1]} differ")
        elif "tensor_count" in nearest:
            lines.append(f"  weights: {nearest['tensor_count'][0]} tensors stored, {nearest['tensor_count'][1]} now")
    lines.append(f"  why: {report['verdict']}")
    return lines
