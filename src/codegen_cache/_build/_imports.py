"""TVM's modules as they were when their import finished: the clean state of a module imported since.

From the first whole-compile key of a process on (switch on or off: the finder changes nothing of
TVM), a meta-path finder watches the import of every `tvm.*` and `tvm_ffi.*` module and, as its
code finishes, keeps the objects its attributes hold. A module whose
attributes are still those objects is as TVM's own code left it, so the registered key part
needs no clean import of it from a helper process (_baseline.py): modules a compile imports
on the way (lowering, a backend) cost an identity check, not a helper process.

The finder finds nothing itself: it asks the finders after it and wraps the loader's
exec_module of what they found, as the start-up hook does (_codegen_cache_startup.py).
"""

from __future__ import annotations

import operator
import sys
import threading
import types
from typing import Any

from .._forksafe import renew_after_fork

__all__ = ["as_imported", "kept_values", "observe", "registries_as_imported", "unobserve"]

_PACKAGES = ("tvm", "tvm_ffi")
_lock = threading.Lock()
renew_after_fork(globals(), "_lock", threading.Lock)
# module name -> the values of its attributes as its import finished (held)
_imported: dict[str, tuple[Any, ...]] = {}


class _Observer:
    def __init__(self) -> None:
        self.busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] not in _PACKAGES or "." not in fullname or getattr(self.busy, "on", False):
            return None
        self.busy.on = True  # the other finders are asked below; they must not find this one again
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy.on = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            with _lock:
                _imported[fullname] = tuple(vars(module).values())

        loader.exec_module = exec_module
        return spec


_observer = _Observer()


def observe() -> None:
    """Watch TVM's imports from now on (idempotent)."""
    if _observer not in sys.meta_path:
        sys.meta_path.insert(0, _observer)


def unobserve() -> None:
    """Stop watching; what was kept stays true of the modules it names."""
    if _observer in sys.meta_path:
        sys.meta_path.remove(_observer)


def _at_start_up() -> dict[str, tuple[Any, ...]]:
    hook = sys.modules.get("_codegen_cache_startup")
    return getattr(getattr(hook, "_finder", None), "imported", None) or {}


def registries_as_imported() -> bool:
    """Whether TVM's registries hold only what `import tvm` put there, as far as the start-up hook
    saw: it watched the import, and tvm_ffi (where Python can register) was not imported before."""
    hook = sys.modules.get("_codegen_cache_startup")
    finder = getattr(hook, "_finder", None)
    return finder is not None and not finder.ffi_first


def _less_modules(values) -> tuple[Any, ...]:
    return tuple(value for value in values if not isinstance(value, types.ModuleType))


def kept_values() -> tuple[dict[str, tuple[Any, ...]], dict[str, tuple[Any, ...]]]:
    """What was kept (name -> values as imported): here, and by the start-up hook."""
    with _lock:
        return dict(_imported), _at_start_up()


def as_imported(name: str, module: types.ModuleType) -> bool:
    """Whether module `name` holds the objects its import left there (it was watched: here, or by
    the start-up hook as `import tvm` completed)."""
    with _lock:
        kept = _imported.get(name)
    if kept is None:
        kept = _at_start_up().get(name)
    if kept is None:
        return False
    now = vars(module).values()
    if len(kept) == len(now) and all(map(operator.is_, kept, now)):
        return True
    # Submodules imported since are added to their package: compared without modules.
    kept, now = _less_modules(kept), _less_modules(now)
    return len(kept) == len(now) and all(map(operator.is_, kept, now))
