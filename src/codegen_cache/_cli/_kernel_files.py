"""Kernel sources and targets as the command line names them.

A kernels source is a Python file or an importable module. It exposes `kernels` and/or
`variants`: each a mapping name -> PrimFunc/IRModule, an iterable of them, or a callable
returning one (called with the Target when it takes an argument, so a file can give each
target its own variants). Without either, every module-level PrimFunc/IRModule is a kernel.
A TVMScript text file (what `mod.script()` prints) holds one module.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import CachedCodegenError, KernelSourceError

__all__ = ["KernelSourceError", "codegen_target", "is_lowered", "last_line", "load_kernels", "load_module",
           "load_source", "parse_target"]

_KERNEL_ATTRS = ("kernels", "variants")


def parse_target(text: str):
    """A Target from JSON, a tag/kind, or 'kind -attr=value ...' (e.g. 'cuda -arch=sm_90'); else a ValueError naming it."""
    from .._compat import cuda_compute_version

    target = _target_of(text.strip())
    try:
        cuda_compute_version(target)  # TVM reads the arch only deep in the pipeline, with a 40-line traceback
    except ValueError as err:
        raise ValueError(f"Invalid target {text.strip()!r}: {err}") from None
    return target


def _target_of(text: str):
    from .._compat import Target
    from .._targets import as_target

    if not text:
        raise ValueError("Invalid target '': expected a kind such as 'llvm', 'kind -attr=value ...', JSON, or a tag")
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError as err:
            raise ValueError(f"Invalid target {text!r}: not valid JSON ({err})") from None
        return as_target(spec)
    try:
        return Target(text)
    except (ValueError, TypeError, RuntimeError):
        pass
    # TVM 0.27 rejects "cuda -arch=sm_90"; the same attributes as a dict are accepted.
    kind, *attrs = text.split()
    spec: dict[str, Any] = {"kind": kind}
    for attr in attrs:
        name, sep, value = attr.lstrip("-").partition("=")
        if not sep or not attr.startswith("-"):
            raise ValueError(f"Invalid target {text!r}: expected 'kind -attr=value ...', JSON, or a tag")
        spec[name] = value
    try:
        return Target(spec)
    except (ValueError, TypeError, RuntimeError) as err:
        reason = str(err).strip().splitlines()
        raise ValueError(f"Invalid target {text!r}: {reason[0] if reason else type(err).__name__}; expected a "
                         "kind or tag such as 'llvm', 'kind -attr=value ...' such as 'cuda -arch=sm_90', or JSON") \
            from None


def load_source(spec: str):
    """Import a kernels file (path ending in .py) or module (dotted name)."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise KernelSourceError(f"kernels file {spec!r} does not exist")
        path = path.resolve()
        name = f"_codegen_cache_kernels_{zlib.crc32(str(path).encode()):08x}"
        if name in sys.modules:
            return sys.modules[name]
        # The file's own directory first, so it can import its neighbours.
        sys.path.insert(0, str(path.parent))
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise KernelSourceError(f"cannot import {spec!r} as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - user code: any error means "cannot load it"
            del sys.modules[name]
            raise KernelSourceError(f"importing {spec!r} failed: {last_line(err)}") from err
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as err:
        raise KernelSourceError(f"{spec!r} is neither a .py file nor an importable module ({err})") from None
    except Exception as err:  # noqa: BLE001 - user code
        raise KernelSourceError(f"importing {spec!r} failed: {last_line(err)}") from err


def last_line(err: BaseException) -> str:
    """'Type: last line of the message' of an exception from user code (a remembered failure: the codegen's message)."""
    message = getattr(err, "message", None)
    if isinstance(err, CachedCodegenError) and isinstance(message, str):
        text = message.strip().splitlines()
        return f"{type(err).__name__}: {text[-1] if text else ''} (remembered failure)"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def _is_kernel(value: object) -> bool:
    from .._compat import IRModule, PrimFunc

    return isinstance(value, (PrimFunc, IRModule))


def _kernel_name(value, fallback: str) -> str:
    attrs = getattr(value, "attrs", None)
    symbol = attrs.get("global_symbol") if attrs is not None else None
    return str(symbol) if symbol is not None else fallback


def _as_mapping(value: object, where: str, target) -> dict[str, Any]:
    if callable(value) and not _is_kernel(value):
        takes_target = bool(inspect.signature(value).parameters)
        value = value(target) if takes_target else value()
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        values = list(value)  # type: ignore[call-overload]
        names = [_kernel_name(v, f"{where}[{i}]") for i, v in enumerate(values)]
        # Schedules often name every variant "main": number the repeats.
        items = [(n if names.count(n) == 1 else f"{n}[{i}]", v) for i, (n, v) in enumerate(zip(names, values))]
    else:
        raise KernelSourceError(f"{where} must be a mapping, an iterable or a callable, not {type(value).__name__}")
    for name, kernel in items:
        if not _is_kernel(kernel):
            raise KernelSourceError(f"{where}: {name!r} is a {type(kernel).__name__}, not a PrimFunc or IRModule")
    return dict(items)


def load_kernels(spec: str, target=None, *, names: list[str] | None = None) -> dict[str, Any]:
    """The kernels a source exposes (for `target`, when its variants depend on it)."""
    module = load_source(spec)
    kernels: dict[str, Any] = {}
    exposed = [a for a in _KERNEL_ATTRS if hasattr(module, a)]
    for attr in exposed:
        try:
            found = _as_mapping(getattr(module, attr), attr, target)
        except KernelSourceError:
            raise
        except Exception as err:  # noqa: BLE001 - user code building its variants
            raise KernelSourceError(f"{spec}: {attr} failed: {last_line(err)}") from err
        for name, kernel in found.items():
            if name in kernels:
                raise KernelSourceError(f"{spec}: two kernels are named {name!r}")
            kernels[name] = kernel
    if not exposed:
        kernels = {n: v for n, v in vars(module).items() if not n.startswith("_") and _is_kernel(v)}
    if names:
        missing = [n for n in names if n not in kernels]
        if missing:
            have = sorted(kernels)
            listed = ", ".join(have[:8]) + (f", ... ({len(have)} in all)" if len(have) > 8 else "")
            raise KernelSourceError(f"{spec} has no kernel named {', '.join(missing)}; it has {listed}")
        kernels = {n: kernels[n] for n in names}
    return kernels


def is_lowered(kernel) -> bool:
    """True for a module whose functions are all bound to a target (a codegen's input already)."""
    from .._compat import IRModule

    if not isinstance(kernel, IRModule) or not len(kernel.functions):
        return False
    return all(f.attrs is not None and "target" in f.attrs for f in kernel.functions.values())


def codegen_target(target):
    """The target a codegen is keyed with for an already-lowered module (as prepare_kernel gives it)."""
    from .._build._prepare import CPU_KINDS
    from .._compat import Target

    if target.kind.name in CPU_KINDS:
        return target if target.host is not None else target.with_host(target)
    if target.host is None:
        return target
    spec = dict(target.export())
    spec.pop("host", None)
    return Target(spec)


def load_module(path: str, target_text: str | None, *, kernel: str | None = None,
                lowered: bool | None = None):
    """(codegen input, target, kernel) from a .py file/module of kernels or a TVMScript text file.

    `kernel` is the module before lowering (None when the file holds a lowered module).
    """
    from .._build._prepare import prepare_for_codegen

    target = parse_target(target_text) if target_text else None
    file = Path(path)
    if file.is_file() and file.suffix != ".py":
        from tvm.script import from_source

        try:
            kernels = {file.stem: from_source(file.read_text())}
        except Exception as err:  # noqa: BLE001 - the TVMScript parser raises many kinds
            raise KernelSourceError(f"{path} is not TVMScript the parser accepts: {err}") from None
    else:
        kernels = load_kernels(path, target, names=[kernel] if kernel else None)
    if not kernels:
        raise KernelSourceError(f"{path} exposes no kernels")
    if len(kernels) > 1:
        raise KernelSourceError(f"{path} has {len(kernels)} kernels; pick one with --kernel: {sorted(kernels)}")
    (mod,) = kernels.values()
    if lowered or (lowered is None and is_lowered(mod)):
        from .._compat import IRModule

        if not isinstance(mod, IRModule):
            mod = IRModule.from_expr(mod)
        if target is None:
            # A lowered module carries its target on each function.
            target = next(iter(mod.functions.values())).attrs["target"]
        return mod, codegen_target(target), None
    if target is None:
        raise KernelSourceError("a target is needed to lower the kernel (--target)")
    try:
        return (*prepare_for_codegen(mod, target), mod)
    except RuntimeError as err:  # TVM's pipeline rejecting the kernel for this target (TVMError is one)
        raise KernelSourceError(f"cannot prepare the kernel for target {target_text!r}: {last_line(err)}") from None
