"""Interpreter start-up hook of tvm-codegen-cache: with CODEGEN_CACHE_ENABLE set, enable() once tvm is imported.

`codegen_cache_enable.pth` (installed beside the package) imports this module only when the
variable is set to something other than an explicit "off" and Python does not run isolated
(`python -I`); it costs a process nothing else. This module imports nothing but `sys`, which
every interpreter has loaded already, and holds only the finder: a process that never imports
TVM pays for one small module (compiled at each start where no .pyc can be written) and one
finder that declines every other name (`python -m benchmarks startup`). What runs once tvm is
imported is in _codegen_cache_turn_on.py.

The hook is a meta-path finder that waits for the `tvm` package to finish importing, then
calls codegen_cache's enable_from_environment(). Where tvm is imported from inside another
watched package's import (tilelang imports its own TVM first; a module of codegen_cache imports
TVM), it waits for the outermost of them to finish. Nothing is imported before that: a Python
process that never imports TVM never imports codegen_cache.
"""

import sys  # no `from __future__ import annotations`: that is a module import too

_WATCHED = ("tvm", "tilelang", "codegen_cache")
# codegen_cache imports TVM on first use, from whichever of its modules needs it first (one that
# enable() itself imports, too): TVM imported while any of them runs waits for it to finish.
_WATCHED_PREFIX = "codegen_cache."
# Packages whose modules' state as imported is kept.
_KEPT = ("tvm", "tvm_ffi")


class _EnableAfterImport:
    """Finds nothing itself: wraps the loader of `tvm`/`tilelang` so that enable() runs after it.

    It also keeps, once `import tvm` and enable() complete, the objects each module of tvm and tvm_ffi holds
    (`imported`; the key of a whole compile takes a module that still holds them as TVM's import
    left it: codegen_cache/_build/_imports.py), and whether
    tvm_ffi, where Python code can register functions into TVM, was imported before tvm began
    (`ffi_first`: then the registries may hold more than TVM's import put there).

    A meta-path finder needs only find_spec (the import system duck-types it); subclassing
    importlib.abc.MetaPathFinder would import tempfile, pathlib, random and re into every
    process that has the variable set.
    """

    def __init__(self) -> None:
        self.busy = False
        self.running: set[str] = set()  # the watched packages whose import is under way
        self.imported: dict[str, tuple] = {}
        self.ffi_first = "tvm_ffi" in sys.modules
        self.enable = False  # install(): turn the switch on as tvm's import completes; watch(): only keep

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "tvm_ffi" and "tvm" not in self.running:
            self.ffi_first = True
        if (fullname not in _WATCHED and not fullname.startswith(_WATCHED_PREFIX)) or self.busy:
            return None
        self.busy = True  # the other finders are asked below; they must not find this one again
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
            self.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            self.running.add(fullname)
            try:
                run(module)
            finally:
                self.running.discard(fullname)
            if self.running or "tvm" not in sys.modules:
                return  # inside another watched import (or before tvm): enable when it is complete
            _uninstall()
            if self.enable:
                from _codegen_cache_turn_on import turn_on  # the rest, only where tvm is imported

                turn_on()
            # After the switch's own imports and replacements: no user code has run since tvm's import began.
            self.keep_imported()

        loader.exec_module = exec_module
        return spec

    def keep_imported(self) -> None:
        """Keep what every module of tvm and tvm_ffi holds now, as `import tvm` completes."""
        for name, module in list(sys.modules.items()):
            if name.partition(".")[0] in _KEPT and isinstance(module, type(sys)):
                self.imported[name] = tuple(vars(module).values())


_finder = _EnableAfterImport()


def _uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Put the hook first on sys.meta_path (once): enable() runs when tvm has been imported."""
    _finder.enable = True
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def watch() -> None:
    """Keep what TVM's import leaves in its modules, without turning anything on (`import
    codegen_cache` before tvm: an enable() later reads less at its first key)."""
    if _finder not in sys.meta_path and "tvm" not in sys.modules:
        sys.meta_path.insert(0, _finder)
