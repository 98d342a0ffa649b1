"""How the remote tier is doing: backoffs for reads and writes, counted events, one warning per fault.

A failed call is counted (`error:remote`) and takes calls offline for a backoff (`_backoff`):
a server that answered a write with an error (READONLY, OOM, NOPERM) stops writes only; one
that did not answer, answered garbage or refused the handshake stops every call. Each kind of
fault is warned about once per tier, later ones at DEBUG. Rejected entries are told apart by
what the reader may conclude (`_envelope.Rejection`); when several entries fail the signature
check and none passes, this host's secret is likely not the fleet's: it says so once and
writes nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import ConfigError, RemoteRefusedError
from ._backoff import Backoff
from ._envelope import Rejection

__all__ = ["FAILED", "SIGNATURE_FAILURES", "Health"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SIGNATURE_FAILURES = 3  # distinct entries failing the signature before "this host's secret is not the fleet's"
_HANDSHAKE = ("AUTH", "SELECT")
FAILED: Any = type("Failed", (), {"__repr__": lambda self: "FAILED"})()  # what attempt() returns for a failed call


class Health:
    """The state of one remote tier (`url` is shown redacted in every message)."""

    def __init__(self, url: str, *, backoff: float, max_backoff: float,
                 on_event: Callable[..., None] | None) -> None:
        self.url = url
        self.reads = Backoff(backoff, max_backoff)
        self.writes = Backoff(backoff, max_backoff)
        self._on_event = on_event
        self._warned: set[str] = set()
        self._signature_failures: set[str] = set()
        self._verified = 0

    def event(self, name: str) -> None:
        """Count `name` in the cache's counters."""
        if self._on_event is not None:
            self._on_event(name)

    def attempt(self, calls: Backoff, op: str, call: Callable[[], T]) -> T | Any:
        """call() as a call of kind `calls`: its result, or FAILED when it failed (counted, backed off, warned)."""
        try:
            result = call()
        except ConfigError as err:
            self.misconfigured(err)
            return FAILED
        except OSError as err:
            self.failed(calls, op, err)
            return FAILED
        self.back(calls)
        return result

    def failed(self, calls: Backoff, op: str, err: OSError) -> None:
        """Count a failed call of `op` and take calls offline; warn once per kind of fault."""
        self.event("error:remote")
        refused = isinstance(err, RemoteRefusedError) and err.command not in _HANDSHAKE
        if refused:
            delay = calls.failed()
        else:
            delays = [d for d in (self.reads.failed(), self.writes.failed()) if d is not None]
            delay = max(delays) if delays else None
        if delay is None:
            return  # another thread already took it offline
        if refused and calls is self.writes:
            hint = (" (a read-only replica: set CODEGEN_CACHE_REMOTE_READ_ONLY=1 on hosts that only read)"
                    if err.code == "READONLY" else "")
            self.warn(f"refused:{err.code}", "codegen cache: remote %s refused a %s (%s)%s; reads go on, "
                      "writes resume in %.0fs", self.url, op, err.message, hint, delay)
            return
        self.warn("outage", "codegen cache: remote %s failed on %s (%s: %s); local-only for %.0fs, then retrying",
                  self.url, op, type(err).__name__, err, delay)

    def misconfigured(self, err: ConfigError) -> None:
        """A URL the server cannot work with (a database in a cluster): off for good in this process."""
        self.event("error:remote")
        self.reads.stop(str(err))
        self.writes.stop(str(err))
        self.warn("config", "codegen cache: remote %s cannot be used: %s; working local-only", self.url, err)

    def back(self, calls: Backoff) -> None:
        """A call of this kind worked: end its backoff."""
        if calls.succeeded():
            logger.info("codegen cache: remote %s is reachable again", self.url)

    def verified(self) -> None:
        """An entry passed the signature check."""
        self._verified += 1

    def rejected(self, name: str, why: Rejection, *, replaceable: bool) -> None:
        """An entry was not loaded: count it, say why and what happens to it (once per tier)."""
        self.event("remote_rejected")
        if replaceable:
            fate = "not loaded; this host rebuilds it and replaces the damaged value"
        elif why.kind == "cap":
            fate = "not read, and left in place (a host with a larger cap may use it)"
        else:
            fate = "not loaded, and left in place: a host never replaces an entry it cannot verify"
        self.warn("rejected", "codegen cache: rejected remote entry %s (%s); %s", name, why.reason, fate)
        if why.kind not in ("signature", "unsigned"):
            return
        self._signature_failures.add(name)
        failed = len(self._signature_failures)
        if failed < SIGNATURE_FAILURES:
            return
        if self._verified:
            self.warn("secret", "codegen cache: %d remote entries at %s failed the signature check while %d "
                      "passed: another host writes with a different CODEGEN_CACHE_REMOTE_SECRET, or entries "
                      "were tampered with", failed, self.url, self._verified)
            return
        # Its entries would be rejected by the fleet and, stored where a key is free, kept
        # from it: a host that is likely wrong writes nothing more.
        self.writes.stop("this host's secret is likely not the fleet's")
        self.warn("secret", "codegen cache: %d remote entries at %s failed the signature check and none "
                  "passed: this host's CODEGEN_CACHE_REMOTE_SECRET is likely not the one the fleet writes "
                  "with. It keeps its builds local and writes nothing more to the remote", failed, self.url)

    def warn(self, what: str, msg: str, *args: object) -> None:
        """Log at WARNING the first time for `what` on this tier, then at DEBUG."""
        first = what not in self._warned
        self._warned.add(what)
        (logger.warning if first else logger.debug)(msg, *args)
