"""What codegen_cache.build is asked to build: the input, the targets, the pipeline (tvm.tirx.build's steps 0-2), and the lowering (steps 3-6)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from .._compat import tvm, DLDeviceType, IRModule, PrimFunc, split_host_device_mods, Target
from .. import _compat
from .._targets import as_target

__all__ = ["Plan", "prepare_plan", "plan", "tirx_host"]


class Plan(NamedTuple):
    """The input and tvm.tirx.build's steps 0-2: the target to bind, the pipeline's target, the host.

    A NamedTuple, not a frozen dataclass: the class is made when the switch is imported
    (docs/benchmarks.md at 5788f7c, "Records made at import").
    """

    mod: IRModule
    original: PrimFunc | IRModule  # what the caller passed: memory hits are compared with it
    func_targets: tuple[Target, ...]
    hashed: list[int]  # the input's structural hash once computed (shared by a PrimFunc's plans)
    bind: Target
    target: Target | None
    host: Target
    pipeline: str | None


# ---- the input and steps 0-2 of tvm.tirx.build -----------------------------------------------

# A PrimFunc cannot change once made (TVM copies on write while we hold a reference), so its
# IRModule, function targets and structural hash are kept by identity: a re-run that passes
# the same object skips the hash. IRModules can change in place (update, __setitem__): never.
_PRIMFUNC_MEMO_MAX = 256
_primfuncs: dict[int, tuple[PrimFunc, IRModule, tuple[Target, ...], list[int]]] = {}


def _func_targets(mod: IRModule) -> tuple[Target, ...]:
    found = []
    for func in mod.functions.values():
        f_target = func.attrs.get("target", None) if func.attrs is not None else None
        if isinstance(f_target, Target):
            found.append(f_target)
    return tuple(found)


def _input(mod: PrimFunc | IRModule) -> tuple[IRModule, PrimFunc | IRModule, tuple[Target, ...], list[int]]:
    """(IRModule, what memory hits compare with, function targets, [structural hash] once known)."""
    if isinstance(mod, PrimFunc):
        memo = _primfuncs.get(id(mod))
        if memo is not None and memo[0] is mod:
            return memo[1], mod, memo[2], memo[3]
        irmod = IRModule.from_expr(mod)
        memo = (mod, irmod, _func_targets(irmod), [])
        if len(_primfuncs) >= _PRIMFUNC_MEMO_MAX:
            _primfuncs.clear()
        _primfuncs[id(mod)] = memo
        return memo[1], mod, memo[2], memo[3]
    if not isinstance(mod, IRModule):
        raise TypeError(f"build expects a tvm.tirx.PrimFunc or a tvm.IRModule, got {type(mod).__name__}")
    others = sorted(gv.name_hint for gv, func in mod.functions.items() if not isinstance(func, PrimFunc))
    if others:
        raise TypeError(f"codegen_cache.build builds TIR, as tvm.tirx.build does; this IRModule also has "
                        f"{others} (Relax functions?). Compile it with tvm.compile after codegen_cache.enable(): "
                        "the whole model is then cached (docs/tvm.md)")
    return mod, mod, _func_targets(mod), []


def plan(mod: PrimFunc | IRModule, target: str | Target | None, pipeline: str | None) -> Plan:
    irmod, original, func_targets, hashed = _input(mod)
    if pipeline is not None and not isinstance(pipeline, str):
        # tvm.tirx.build asserts the same (a Pass object is not accepted there either).
        raise TypeError(f"pipeline must be a pipeline name or None, got {type(pipeline).__name__}")
    current = Target.current()
    bind = current if target is None else target
    bind = _target(bind if bind is not None else "llvm")
    chosen = current if target is None else target
    if chosen is None and func_targets:
        chosen = func_targets[0]
    chosen = _target(chosen) if chosen is not None else None
    host = tirx_host(chosen)
    return Plan(irmod, original, func_targets, hashed, _with_host(bind, host), chosen, host, pipeline)


def tirx_host(target: Target | None) -> Target:
    """The host tvm.tirx.build builds `target` with (its step 2): the target's own host, a CPU
    target itself, else llvm where TVM's LLVM runtime is enabled, else c.

    TVM asks for the default on every build; here it is asked only where it is taken (TVM's
    answer makes an LLVM target machine: a warm build of a CPU target does not ask).
    """
    if target is not None and target.host is not None:
        return target.host
    if target is not None and target.get_target_device_type() == DLDeviceType.kDLCPU:
        return target
    return _target("llvm" if _compat.runtime_enabled("llvm") else "c")


# Memoized: Target construction and with_host cost about as much as the rest of a warm build.
@lru_cache(maxsize=256)
def _target_from_str(text: str) -> Target:
    return Target(text)


def _target(value: Any) -> Target:
    if isinstance(value, Target):
        return value
    if isinstance(value, str):
        try:
            return _target_from_str(value)
        except (ValueError, TypeError):
            pass  # as_target raises it again, naming the value and the accepted forms
    return as_target(value)


@lru_cache(maxsize=256)
def _with_host(target: Target, host: Target) -> Target:
    return target.with_host(host)


def prepare_plan(plan: Plan) -> tuple[IRModule, list[tuple[Target, IRModule]]]:
    """Steps 3-6 of tvm.tirx.build: the host module and the non-empty device modules to build."""
    mod = tvm.tirx.transform.BindTarget(plan.bind)(plan.mod)
    passes, finalize_host, finalize_device = _compat.tir_pipeline(plan.pipeline, plan.target)
    mod = passes(mod)
    host_mod, device_mod_dict = split_host_device_mods(mod)
    host_mod = finalize_host()(host_mod)
    device_mods = [(t, finalize_device()(m)) for t, m in device_mod_dict.items()]
    host_all = IRModule({}, attrs=host_mod.attrs)
    host_all.update(host_mod)
    return host_all, [(t, m) for t, m in device_mods if len(m.functions) != 0]
