"""TVM's own build entry points routed through the cache, for tests that run TVM code unchanged.

The one place that does it (tests/warm_scenarios.py and tools/tvm_suite.py use it): the
package's own switch, codegen_cache.enable() (docs/tvm.md), and its undoing.
"""

from __future__ import annotations

import codegen_cache as cc


def route(*, children: bool = True) -> None:
    """From now on, TVM's compiles in this process go through the active cache (idempotent)."""
    cc.enable(children=children)


def unroute() -> None:
    """TVM's own entry points again."""
    cc.disable()
