"""Per-call outcomes: which tier served a lowering, its key, and where the time went."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from typing import Any
from dataclasses import dataclass

__all__ = ["TIERS", "Outcome", "emit", "emit_uncached", "last_outcome", "record_outcomes"]

# Where a result came from ("codegen": the codegen ran; "build" names a whole build only).
TIERS = ("memory", "disk", "remote", "codegen", "failure", "uncached")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one lowering cost and where its module came from.

    tier: memory | disk | remote (a hit), codegen (the codegen ran), failure (the call raised: a
      remembered codegen error was served, or the codegen raised now; no module), uncached (no
      cache was active, caching is disabled, or the cache stepped aside: an input it cannot key).
    key: the key digest ('' for uncached, and for a failure with no cache).
    key_seconds: computing the key (mostly the structural hash).
    load_seconds: reading and decoding the entry (0 for codegen).
    codegen_seconds: the codegen's own time (codegen, uncached, a failure now), or what the entry
      saved: the codegen time recorded when it was made (hits; for a codegen_cache.build hit, the
      codegen time of the whole build). 0 for a remembered failure.
    stored: for tier codegen, whether the entry was stored (False: skipped).
    """

    tier: str
    key: str
    codegen: str
    mode: str
    key_seconds: float
    load_seconds: float
    codegen_seconds: float
    total_seconds: float
    stored: bool | None = None

    @property
    def hit(self) -> bool:
        """True when a tier served the module without running the codegen."""
        return self.tier in ("memory", "disk", "remote")


# Holds an Outcome, or the tuple of its fields (made into an Outcome when read: cheaper on hits).
_last: contextvars.ContextVar[Outcome | tuple | None] = contextvars.ContextVar("codegen_cache_last", default=None)
_sinks: contextvars.ContextVar[tuple[list[Outcome], ...]] = contextvars.ContextVar("codegen_cache_sinks", default=())


def last_outcome() -> Outcome | None:
    """The outcome of the latest lowering through a cache in this context (thread/task)."""
    value = _last.get()
    return Outcome(*value) if isinstance(value, tuple) else value


def emit(*, tier: str, key: str, codegen: str, mode: str, key_seconds: float, load_seconds: float,
         codegen_seconds: float, total_seconds: float, stored: bool | None = None) -> None:
    """Record one lowering's outcome, Outcome's fields by name; built into an Outcome only when needed.

    Keyword-only, kept as a tuple until read: what that costs against positional values and
    against an Outcome made on every call is in docs/benchmarks.md at 5788f7c ("Named outcome fields").
    """
    fields = (tier, key, codegen, mode, key_seconds, load_seconds, codegen_seconds, total_seconds, stored)
    sinks = _sinks.get()
    if sinks:
        outcome = Outcome(*fields)
        _last.set(outcome)
        for sink in sinks:
            sink.append(outcome)
    else:
        _last.set(fields)


def emit_uncached(codegen: str, mode: str, seconds: float, *, failed: bool = False) -> None:
    """Record a lowering that went straight to the codegen (failed: and the codegen raised)."""
    emit(tier="failure" if failed else "uncached", key="", codegen=codegen, mode=mode, key_seconds=0.0,
         load_seconds=0.0, codegen_seconds=seconds, total_seconds=seconds, stored=False)


def run_uncached(codegen: str, mode: str, call: Callable[[], Any], start: float) -> Any:
    """Run a lowering straight through the codegen, recording it as uncached (or failed) since `start`."""
    try:
        module = call()
    except BaseException:
        emit_uncached(codegen, mode, time.perf_counter() - start, failed=True)
        raise
    emit_uncached(codegen, mode, time.perf_counter() - start)
    return module


@contextlib.contextmanager
def record_outcomes() -> Iterator[list[Outcome]]:
    """Collect the outcome of every lowering inside the block into the yielded list."""
    sink: list[Outcome] = []
    token = _sinks.set((*_sinks.get(), sink))
    try:
        yield sink
    finally:
        _sinks.reset(token)
