"""Real TVM global-function hooks for tests: registered with override, restored afterwards."""

from __future__ import annotations

import contextlib

import tvm_ffi


@contextlib.contextmanager
def registered(name, func):
    """Register `func` under `name` (override=True) for the block; then put back what was there."""
    previous = tvm_ffi.get_global_func(name, allow_missing=True)
    tvm_ffi.register_global_func(name, func, override=True)
    try:
        yield
    finally:
        if previous is None:
            tvm_ffi.remove_global_func(name)
        else:
            tvm_ffi.register_global_func(name, previous, override=True)


@contextlib.contextmanager
def declared(name, func, salt):
    """registered(name, func) with `salt` declared for it (how a user's hook is keyed)."""
    import codegen_cache as cc

    with registered(name, func):
        cc.declare_callback_salt(name, salt)
        yield
