"""TVM's own build entry points routed through the cache, for tests that run TVM code unchanged.

The one place that does it (tests/warm_scenarios.py and tools/tvm_suite.py use it): until
`codegen_cache.enable()` routes every TVM compile, `tvm.tirx.build` is replaced with
`codegen_cache.build` (and `tvm.relax.build` reaches it, through relax's `_vmlink`). Builds that
`codegen_cache.build` does not take (a pipeline given as a Pass object) go to TVM's own.
"""

from __future__ import annotations

import tvm
import tvm.tirx

import codegen_cache as cc

_original = tvm.tirx.build


def _routed(mod, target=None, pipeline="default"):
    if pipeline is None or isinstance(pipeline, str):
        return cc.build(mod, target, pipeline)
    return _original(mod, target, pipeline)


def route() -> None:
    """From now on, tvm.tirx.build in this process goes through codegen_cache.build (idempotent)."""
    enable = getattr(cc, "enable", None)
    if enable is not None:  # the package's own switch, where it has one
        enable()
        return
    tvm.tirx.build = _routed


def unroute() -> None:
    """TVM's own tvm.tirx.build again."""
    disable = getattr(cc, "disable", None)
    if disable is not None:
        disable()
    tvm.tirx.build = _original
