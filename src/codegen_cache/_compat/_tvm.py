"""The TVM names of `codegen_cache._compat`, imported with TVM itself.

Only `codegen_cache._compat` imports this module, on the first use of one of its names (see
there); everything else reads these names as `_compat.<name>`.
"""

from __future__ import annotations

import builtins
import functools
import importlib.util
import sys
from typing import Any

from . import _INSTALL_HINT
from . import __all__ as _PACKAGE_NAMES

# The package's names less the two it defines without TVM: one list, kept in __init__.
__all__ = [name for name in _PACKAGE_NAMES if name not in ("module_property_mask", "require_installed")]


def _import_tvm() -> str:
    """Make `import tvm` work; the distribution: 'tilelang' where tilelang is installed, else 'apache-tvm'."""
    try:
        has_tilelang = importlib.util.find_spec("tilelang") is not None
    except (ImportError, ValueError):  # a broken or half-removed install counts as none
        has_tilelang = False
    if has_tilelang:
        try:
            import tilelang  # noqa: F401  puts its bundled TVM on sys.path and loads its libraries
        except ImportError as err:
            raise ImportError(f"tilelang is installed but does not import ({err}). {_INSTALL_HINT}") from err
        return "tilelang"
    try:
        import tvm  # noqa: F401
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return "apache-tvm"


DISTRIBUTION = _import_tvm()

import tvm  # noqa: E402
import tvm.s_tir  # noqa: E402  registers the schedule passes the default TIR pipeline uses
import tvm.tirx  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm.ir import IRModule  # noqa: E402
from tvm.runtime import Module  # noqa: E402
from tvm.script import tirx as script_tirx  # noqa: E402
from tvm.target import Target  # noqa: E402
from tvm.tirx import PrimFunc  # noqa: E402
from tvm.tirx.build import split_host_device_mods  # noqa: E402
from tvm_ffi import DLDeviceType  # noqa: E402

# The runtime tensor class (apache-tvm 0.27 names it Tensor; older TVMs NDArray; None: neither).
Tensor = getattr(tvm.runtime, "Tensor", None) or getattr(tvm.runtime, "NDArray", None)

try:
    _hash = tvm_ffi.structural_hash
    _equal = tvm_ffi.structural_equal
except AttributeError:  # older TVMs keep them under tvm.ir
    _hash = tvm.ir.structural_hash
    _equal = tvm.ir.structural_equal


def structural_hash(obj: Any) -> int:
    """Structural hash with free variables mapped (stable across lowerings of a CPU module)."""
    # map_free_vars=False gives a different hash on every lowering of a CPU module: its
    # storage_alignment attributes refer to buffers that compare by identity.
    return _hash(obj, map_free_vars=True)


def structural_equal(a: Any, b: Any) -> bool:
    """Structural equality with free variables mapped, as the hash."""
    return bool(_equal(a, b, map_free_vars=True))


def structure_hash(obj: Any) -> int | None:
    """structural_hash with every tensor's bytes left out (shape and dtype kept); None where tvm-ffi cannot."""
    try:
        return _hash(obj, map_free_vars=True, skip_tensor_content=True)
    except TypeError:  # a tvm-ffi without skip_tensor_content (tilelang's)
        return None


def structure_equal(a: Any, b: Any) -> bool:
    """structural_equal with every tensor's bytes left out, as structure_hash (only called where it answered)."""
    return bool(_equal(a, b, map_free_vars=True, skip_tensor_content=True))


def bound_constants(func: Any) -> list | None:
    """The tensors of the Relax constants in `func`, in the order TVM's expression visitor meets them.

    None where `func` is not a Relax function or this TVM has no visitor for its constants.
    Only constants call back into Python: the walk itself is TVM's.
    """
    made = _constant_visitor()
    if made is None or not isinstance(func, tvm.relax.Function):
        return None
    found: list = []
    try:
        made[0](found).visit_expr(func)
    except (RuntimeError, TypeError, ValueError):  # TVM's errors are RuntimeErrors: a function it cannot walk
        return None
    return found


@functools.lru_cache(maxsize=1)
def _constant_visitor() -> tuple[Any] | None:
    """(a visitor class taking the list it appends constants' tensors to,), or None where TVM has none."""
    try:
        functor = importlib.import_module("tvm.relax.expr_functor")
    except ImportError:
        return None
    generic = getattr(tvm.ir, "GenericConst", None)  # apache-tvm 0.27: relax constants are ir.GenericConst
    method = "visit_generic_const_" if generic is not None else "visit_constant_"
    if not hasattr(functor.PyExprVisitor, method):
        return None

    def __init__(self, found: list) -> None:
        self.found = found

    def visit(self, const: Any) -> None:
        self.found.append(const.value if generic is not None else const.data)

    return (functor.visitor(type("ConstantCollector", (functor.PyExprVisitor,), {"__init__": __init__, method: visit})),)


def tensor_buffer(tensor: Any):
    """A C-contiguous buffer of a CPU tensor's bytes without a copy (numpy over DLPack); else a copy of them."""
    import numpy

    try:
        array = numpy.from_dlpack(tensor)
    except (TypeError, ValueError, RuntimeError, BufferError):
        array = tensor.numpy()
    if not array.flags["C_CONTIGUOUS"]:
        array = numpy.ascontiguousarray(array)
    return array.reshape(-1).view(numpy.uint8)


def tir_pipeline(name: str | None, target: Target | None = None):
    """(passes, finalize_host, finalize_device) of a TIR pipeline, as apache-tvm 0.27 returns them.

    `name` None picks the default pipeline for `target`. tilelang's TVM returns the pipeline as
    one pass and keeps the finalize passes in tvm.tirx.pipeline; both shapes come back as one.
    """
    found = tvm.tirx.get_tir_pipeline(name) if name is not None else tvm.tirx.get_default_tir_pipeline(target)
    if isinstance(found, tuple):
        return found
    pipeline = importlib.import_module("tvm.tirx.pipeline")
    return found, pipeline.finalize_host_passes, pipeline.finalize_device_passes


def target_from_json(text: str) -> Target:
    """Target(text) for a target's JSON text, through TVM's constructor directly.

    Target.__init__ first converts a str with tvm_ffi.convert, whose isinstance check against
    tvm-ffi's Object ABC costs the first call of a process what docs/benchmarks.md at 5788f7c ("Private
    internals") shows; the constructor is the global function `target.Target` (what
    tvm.target._ffi_api.Target names), looked up through the public registry.
    """
    constructor = _target_constructor()
    if constructor is None:
        return Target(text)
    return constructor(text)


@functools.lru_cache(maxsize=1)
def _target_constructor():
    return tvm.get_global_func("target.Target", allow_missing=True)


def global_func(name: str, *, missing_ok: bool = False):
    """The TVM global function `name` as registered now (None if missing and missing_ok)."""
    return tvm.get_global_func(name, allow_missing=missing_ok)


@functools.lru_cache(maxsize=None)
def builtin_func(name: str):
    """A global function TVM registers at import and never replaces (loaders, constructors)."""
    return tvm.get_global_func(name)


def cuda_runtime_available() -> bool:
    """True when TVM's CUDA runtime (and so a CUDA driver library) is loaded in this process."""
    return global_func("ffi.Module.load_from_bytes.cuda", missing_ok=True) is not None


@functools.lru_cache(maxsize=64)
def runtime_enabled(kind: str) -> bool:
    """Whether TVM's runtime for `kind` is loaded here (fixed for the life of the process)."""
    try:
        return bool(tvm.runtime.enabled(kind))
    except (RuntimeError, ValueError):  # kinds TVM has no optional runtime for (c, webgpu)
        return False


@functools.lru_cache(maxsize=1)
def tvm_version() -> str:
    """TVM's version, its commit id where recorded, and the distribution it came with."""
    commit = None
    if DISTRIBUTION != "tilelang":  # tilelang's bundled TVM has no _version: no failed import to pay for
        try:
            from tvm import _version

            commit = getattr(_version, "commit_id", None)
        except ImportError:
            pass
    text = f"{tvm.__version__}+{commit or 'unknown'}"
    if DISTRIBUTION == "tilelang":
        # Two tilelang releases bundle different builds of the same TVM 0.25.dev0.
        import tilelang

        text += f"+tilelang-{tilelang.__version__}"
    return text


@functools.lru_cache(maxsize=1)
def ffi_version() -> str:
    """The tvm-ffi version ('none' for a TVM without the separate FFI package)."""
    return str(getattr(tvm_ffi, "__version__", "none"))


@functools.lru_cache(maxsize=1)
def llvm_version_major() -> str:
    """The LLVM major version TVM was built with, or 'none'."""
    try:
        return str(tvm.target.codegen.llvm_version_major())
    except (AttributeError, RuntimeError, ValueError):
        return "none"


def save_json(obj: Any) -> str:
    """TVM's JSON serialization of an object (exact; slow: it writes the whole object out)."""
    return tvm.ir.save_json(obj)


# ---- errors: the classes a remembered codegen failure is raised as again -------------------


def _registered_errors() -> tuple[dict, dict]:
    """tvm-ffi's tables of registered error classes: (name -> class, class -> name)."""
    core = getattr(tvm_ffi, "core", None)
    return getattr(core, "ERROR_NAME_TO_TYPE", {}), getattr(core, "ERROR_TYPE_TO_NAME", {})


def error_identity(cls: type) -> str | None:
    """A name error_class() turns back into `cls`, or None when it cannot (a user's own class).

    `ffi:<name>` for a class registered with tvm-ffi (TVM's InternalError, ...), `builtins:<name>`
    for a builtin exception; nothing else, so that no name read from a cache is ever imported.
    """
    name = _registered_errors()[1].get(cls)
    if isinstance(name, str):
        return f"ffi:{name}"
    if cls.__module__ == "builtins" and getattr(builtins, cls.__name__, None) is cls:
        return f"builtins:{cls.__name__}"
    return None


def error_class(identity: object) -> type | None:
    """The exception class error_identity() named, looked up in the two tables only; else None."""
    if not isinstance(identity, str):
        return None
    table, _, name = identity.partition(":")
    if table == "ffi":
        found = _registered_errors()[0].get(name)
    elif table == "builtins":
        found = getattr(builtins, name, None)
    else:
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


# ---- runtime modules: what the cache's llvm hits need to answer as built modules --------------


def cuda_compute_version(target: Target) -> tuple[int, int] | None:
    """(major, minor) of a CUDA target's `arch` as TVM reads it; None without one; ValueError naming a bad one."""
    arch = target.attrs.get("arch") if target.kind.name == "cuda" else None
    if arch is None or not str(arch):
        return None
    try:
        from tvm.support import nvcc

        return nvcc.parse_compute_version(nvcc.get_target_compute_version(target))
    except (IndexError, RuntimeError, ValueError):
        raise ValueError(f"arch {str(arch)!r} is not a CUDA architecture TVM can read: expected "
                         "sm_<major><minor>[suffix], e.g. sm_80 or sm_90a") from None


@functools.lru_cache(maxsize=1)
def host_llvm_triple() -> str:
    """The triple LLVM builds for on this host by default (what `Target("llvm")` gets), or ''."""
    try:
        return str(tvm.target.codegen.llvm_get_system_triple())
    except (AttributeError, RuntimeError, ValueError):
        return ""


def ffi_function(func):
    """A Python callable as a TVM packed function (what Module.get_function returns).

    tvm_ffi.convert_func wraps a callable directly; convert first walks isinstance checks over
    TVM's abstract types, which fill the ABC caches at a fresh process's first call (the first
    model hit pays it otherwise). tvm-ffi before 0.1.14 has only convert.
    """
    return _convert_func(func)


_convert_func = getattr(tvm_ffi, "convert_func", None) or tvm_ffi.convert


class ModuleMethods:
    """The methods of tvm.runtime.Module the cache answers for its own llvm hits, while the switch is on.

    `install(replacements)` puts `replacements[name](TVM's own)` on tvm.runtime.Module for each
    name this TVM has (`missing` lists the others: that method stays TVM's); `uninstall()` leaves
    the class exactly as it was (an attribute inherited from tvm-ffi's Module is removed again,
    not copied down), except where someone else has replaced one of ours since.
    """

    NAMES = ("kind", "get_property_mask", "is_binary_serializable", "is_runnable", "is_compilation_exportable",
             "inspect_source", "write_to_file", "get_function", "implements_function", "export_library")
    _ABSENT = object()

    def __init__(self) -> None:
        # While installed: name -> (Module's own attribute before, or _ABSENT; ours).
        self._saved: dict[str, tuple[Any, Any]] | None = None
        self.missing: list[str] = []

    @staticmethod
    def _current(name: str) -> Any:
        for klass in Module.__mro__:  # the class that defines it (tvm's Module or tvm-ffi's)
            if name in vars(klass):
                return vars(klass)[name]
        return None

    def originals(self) -> dict[str, Any]:
        """TVM's own attribute for each name this TVM's Module has (call it before install)."""
        if self._saved is not None:
            raise RuntimeError("ModuleMethods.originals() while the replacements are installed")
        return {name: found for name in self.NAMES if (found := self._current(name)) is not None}

    @property
    def installed(self) -> bool:
        """Whether the replacements are on tvm.runtime.Module now."""
        return self._saved is not None

    def install(self, replacements: dict[str, Any]) -> None:
        """Put `replacements` (name -> function taking the original) on tvm.runtime.Module (idempotent)."""
        if self._saved is not None:
            return
        saved: dict[str, tuple[Any, Any]] = {}
        self.missing = []
        for name in self.NAMES:
            current = self._current(name)
            if current is None or name not in replacements:
                self.missing.append(name)
                continue
            ours = replacements[name](current)
            saved[name] = (vars(Module).get(name, self._ABSENT), ours)
            setattr(Module, name, ours)
        self._saved = saved

    def uninstall(self) -> None:
        """Put back what tvm.runtime.Module had before install() (idempotent)."""
        if self._saved is None:
            return
        for name, (before, ours) in self._saved.items():
            if vars(Module).get(name) is not ours:
                continue  # replaced again since install(): that one stays
            if before is self._ABSENT:
                delattr(Module, name)
            else:
                setattr(Module, name, before)
        self._saved = None


# ---- what a Relax compile reads besides its input (_build/_reads.py) --------------------------

# The module attributes TVM's Python registration functions call at call time, so that a
# wrapper put there sees every registration from Python whatever alias the caller used:
# tvm_ffi.register_global_func calls core._register_global_func (private: the fallback where it
# is missing is a full rescan per model key); tvm.ir.register_op_attr, Op.set_attr and
# Op.reset_attr call these tvm.ir._ffi_api functions.
REGISTRATION_POINTS: tuple[tuple[Any, str], ...] = (
    (getattr(tvm_ffi, "core", None), "_register_global_func"),
    (tvm.ir._ffi_api, "RegisterOpAttr"),
    (tvm.ir._ffi_api, "OpSetAttr"),
    (tvm.ir._ffi_api, "OpResetAttr"),
    # tvm.tirx.register_intrin_lowering: (op name, function, target kind, level)
    (getattr(getattr(tvm, "tirx", None), "_ffi_api", None), "RegisterOpLowerIntrinsic"),
)


def global_func_names() -> list[str]:
    """Every name in TVM's global function registry."""
    return list(tvm_ffi.registry.list_global_func_names())


def op_attr(op_name: str, key: str) -> Any:
    """The value of attribute `key` of operator `op_name` (None where unset or where no operator has `key`)."""
    try:
        return tvm.ir._ffi_api.OpGetAttr(tvm.ir._ffi_api.GetOp(op_name), key)
    except tvm.error.InternalError:  # "Attribute 'X' is not registered": no operator has it
        return None


def operators() -> list[tuple[str, Any]]:
    """(name, Op) of every registered operator."""
    get = tvm.ir._ffi_api.GetOp
    return [(name, get(name)) for name in list(tvm.ir.Op.list_op_names())]


def op_attr_values(ops: list[tuple[str, Any]], keys: tuple[str, ...]) -> list[tuple[str, str, Any]]:
    """(operator name, key, value) of every operator of `ops` (from operators()) that sets one of `keys`."""
    get = tvm.ir._ffi_api.OpGetAttr
    found = []
    for key in keys:
        try:
            found.extend((name, key, value) for name, op in ops if (value := get(op, key)) is not None)
        except tvm.error.InternalError:  # "Attribute 'X' is not registered": no operator has it
            continue
    return found


def target_kinds() -> list[str]:
    """The name of every registered target kind."""
    return [str(kind) for kind in tvm.target.Target.list_kinds()]


def named_pipelines() -> tuple[tuple[str, dict], ...]:
    """The registries of pipelines by name: ("relax", tvm.relax.pipeline.PIPELINE_MAP), ("tir", ...)."""
    found = []
    for kind, module_name in (("relax", "tvm.relax.pipeline"), ("tir", "tvm.tirx.compilation_pipeline")):
        module = sys.modules.get(module_name)
        table = getattr(module, "PIPELINE_MAP", None) if module is not None else None
        if isinstance(table, dict):
            found.append((kind, table))
    return tuple(found)


def current_database() -> Any:
    """The MetaSchedule tuning database in context (`with database:`), or None.

    Nothing is imported: a process that never imported MetaSchedule has no database in context.
    """
    ms = sys.modules.get("tvm.s_tir.meta_schedule")
    database = getattr(ms, "Database", None) if ms is not None else None
    return database.current() if database is not None else None
