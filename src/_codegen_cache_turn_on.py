"""What the start-up hook runs once `tvm` is imported with CODEGEN_CACHE_ENABLE set: turn the switch on, or step aside.

`import tvm` never fails because of the hook. Where TVM runs runtime-only (TVM_USE_RUNTIME_LIB=1,
or its compiler library did not load) nothing can compile, so the hook steps aside silently
and imports nothing of the package. Anything else that keeps the switch from turning on (a TVM
the package cannot use, a missing dependency, a bad CODEGEN_CACHE_* value, a cache directory
that is a file) is one RuntimeWarning, pointing at the user's import statement, naming the
cause and the fix; TVM works as without the package.
"""

import os
import sys


def _runtime_only() -> bool:
    """Whether the TVM just imported is runtime-only: it loads and runs modules, it compiles nothing."""
    # TVM's own switch, and the flag TVM sets when its compiler library does not load either.
    tvm = sys.modules.get("tvm")
    return os.environ.get("TVM_USE_RUNTIME_LIB") == "1" or getattr(tvm, "_RUNTIME_ONLY", False) is True


def turn_on() -> None:
    """enable_from_environment(), or step aside (silently where nothing can compile, else with one warning)."""
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

    Counted as warnings.warn counts: from turn_on's frame, past the hook's own frames, without
    importlib's bootstrap frames (warn skips those).
    """
    ours = (__file__, getattr(sys.modules.get("_codegen_cache_startup"), "__file__", None))
    frame, level = sys._getframe(1), 1  # the frame of turn_on
    while frame is not None and frame.f_code.co_filename in ours:
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
