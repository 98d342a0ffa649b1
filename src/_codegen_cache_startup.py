"""Interpreter start-up hook of tvm-codegen-cache: with CODEGEN_CACHE_ENABLE set, enable() once tvm is imported.

`codegen_cache_enable.pth` (installed beside the package) imports this module only when the
variable is set to something other than an explicit "off" and Python does not run isolated
(`python -I`); it costs a process nothing else. This module imports nothing but `sys`, which
every interpreter has loaded already: a process that never imports TVM pays for one small
module and one finder that declines every other name (benchmarks/bench_startup.py).

The hook is a meta-path finder that waits for the `tvm` package to finish importing, then
calls codegen_cache's enable_from_environment(). Where tvm is imported from inside another
watched package's import (tilelang imports its own TVM first; codegen_cache imports TVM), it
waits for the outermost of them to finish. Nothing is imported before that: a Python process
that never imports TVM never imports codegen_cache.

`import tvm` never fails because of the hook. Where TVM runs runtime-only (TVM_USE_RUNTIME_LIB=1,
or its compiler library did not load) nothing can compile, so the hook steps aside silently
and imports nothing. Anything else that keeps the switch from turning on (a TVM the package
cannot use, a bad CODEGEN_CACHE_* value, a cache directory that is a file) is one
RuntimeWarning naming the cause and the fix, and TVM works as without the package.
"""

from __future__ import annotations

import sys

_WATCHED = ("tvm", "tilelang", "codegen_cache")


class _EnableAfterImport:
    """Finds nothing itself: wraps the loader of `tvm`/`tilelang` so that enable() runs after it.

    A meta-path finder needs only find_spec (the import system duck-types it); subclassing
    importlib.abc.MetaPathFinder would import tempfile, pathlib, random and re into every
    process that has the variable set.
    """

    def __init__(self) -> None:
        self.busy = False
        self.running: set[str] = set()  # the watched packages whose import is under way

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED or self.busy:
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
            _enable()

        loader.exec_module = exec_module
        return spec


_finder = _EnableAfterImport()


def _runtime_only() -> bool:
    """Whether the TVM just imported is runtime-only: it loads and runs modules, it compiles nothing."""
    import os  # loaded by every interpreter's start-up already

    # TVM's own switch, and the flag TVM sets when its compiler library does not load either.
    tvm = sys.modules.get("tvm")
    return os.environ.get("TVM_USE_RUNTIME_LIB") == "1" or getattr(tvm, "_RUNTIME_ONLY", False) is True


def _enable() -> None:
    if _runtime_only():
        return  # nothing can compile here: no cache, no warning, nothing of the package imported
    try:
        from codegen_cache._switch import enable_from_environment

        enable_from_environment()
    except Exception as err:  # noqa: BLE001
        # The one broad catch of the package: this runs inside the user's `import tvm`, which
        # must never fail because of the cache. Whatever stops the switch (a TVM the package
        # cannot use, a bad setting, a bug of ours) leaves TVM as it is, and says so once.
        import warnings

        warnings.warn(
            f"codegen-cache: CODEGEN_CACHE_ENABLE is set but the cache is off in this process: "
            f"{type(err).__name__}: {err}. TVM works without the cache. Fix: {_fix_for(err)}",
            RuntimeWarning, stacklevel=_importer_level())


def _importer_level() -> int:
    """The stacklevel of the code whose import statement brought TVM in.

    warnings.warn skips importlib's own frames when it counts; the frames of this module are
    counted and passed over.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
        while frame is not None and "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename:
            frame = frame.f_back
        level += 1
    return level


def _fix_for(err: BaseException) -> str:
    if isinstance(err, ImportError):
        return ("install a TVM this package supports (pip install 'tvm-codegen-cache[tvm]' for apache-tvm 0.27), "
                "or unset CODEGEN_CACHE_ENABLE; `codegen-cache doctor` says more")
    if isinstance(err, ValueError):  # ConfigError: the message names the variable and what it accepts
        return "correct that value (`codegen-cache config` lists every setting), or unset CODEGEN_CACHE_ENABLE"
    return "run `codegen-cache doctor`, or unset CODEGEN_CACHE_ENABLE"


def _uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Put the hook first on sys.meta_path (once): enable() runs when tvm has been imported."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
