"""Preparing a kernel: from a PrimFunc or IRModule to the module and target a device codegen takes.

Follows tvm/tirx/build.py: BindTarget with a host, the default TIR pipeline,
split_host_device_mods and the finalize passes. TVM calls this lowering; here "lower" is
the codegen's (DeviceCodegen.lower), so this step is "prepare" (one meaning per word).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._compat import tvm, IRModule, PrimFunc, split_host_device_mods, Target
from .. import _compat
from .._errors import PrepareError
from .._targets import TargetLike, as_target

__all__ = ["CPU_KINDS", "PreparedKernel", "prepare_for_codegen", "prepare_kernel"]

CPU_KINDS = frozenset({"llvm", "c"})


@dataclass(frozen=True, slots=True)
class PreparedKernel:
    """The host module and, for GPU targets, the device module of one prepared kernel."""

    host_mod: IRModule
    host_target: Target
    device_mod: IRModule | None
    device_target: Target | None

    def codegen_input(self) -> tuple[IRModule, Target]:
        """The (module, target) that `target.build.<kind>` of the requested kind takes."""
        if self.device_mod is not None and self.device_target is not None:
            return self.device_mod, self.device_target
        return self.host_mod, self.host_target


def _with_host(target: Target) -> Target:
    if target.host is not None:
        return target
    if target.kind.name in CPU_KINDS:
        return target.with_host(target)
    host = "llvm" if tvm.runtime.enabled("llvm") else "c"
    return target.with_host(Target(host))


def prepare_kernel(kernel: PrimFunc | IRModule, target: TargetLike, *, pipeline: str = "default") -> PreparedKernel:
    """Run TVM's TIR pipeline on `kernel` for `target` and split it into host and device parts."""
    if isinstance(kernel, PrimFunc):
        kernel = IRModule.from_expr(kernel)
    if not isinstance(kernel, IRModule):
        raise TypeError(f"Expected a tvm.tirx.PrimFunc or tvm.IRModule, got {type(kernel).__name__}")
    target = _with_host(as_target(target))
    mod = tvm.tirx.transform.BindTarget(target)(kernel)
    passes, finalize_host, finalize_device = _compat.tir_pipeline(pipeline)
    mod = passes(mod)
    host_mod, device_mods = split_host_device_mods(mod)
    host_mod = finalize_host()(host_mod)
    kind = target.kind.name
    if kind in CPU_KINDS:
        return PreparedKernel(host_mod, target, None, None)
    device_mods = {t: finalize_device()(m) for t, m in device_mods.items() if len(m.functions)}
    if not device_mods:
        names = [gv.name_hint for gv in kernel.functions]
        raise PrepareError(
            f"Kernel {names} has no thread binding, so preparing it for target kind {kind!r} "
            f"produced host code only. Bind its loops to blockIdx/threadIdx "
            f"(e.g. T.thread_binding) before building for {kind!r}."
        )
    if len(device_mods) > 1:
        raise PrepareError(
            f"Kernel prepared for {len(device_mods)} device targets "
            f"({[str(t) for t in device_mods]}); one device target per kernel is supported"
        )
    (device_target, device_mod), = device_mods.items()
    return PreparedKernel(host_mod, target.host, device_mod, device_target)


def prepare_for_codegen(kernel: PrimFunc | IRModule, target: TargetLike) -> tuple[IRModule, Target]:
    """The (module, target) pair to pass to DeviceCodegen.lower for this kernel and target."""
    return prepare_kernel(kernel, target).codegen_input()
