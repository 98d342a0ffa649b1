"""Several remote tiers as one, looked up in order (Redis in front of an object store), as sccache's chain.

A lookup asks each tier in turn and the first entry found wins. An entry found in a later tier
is copied into the earlier ones off the caller's path: the cache hands the hit to its writer
thread (`refresh`), which pushes it there, so the next host finds it in the faster tier. A push
goes to every tier that takes writes: 'failed' when any failed (the outbox retries it, and a tier
that has it answers 'kept'), else 'stored' when any stored it.

Build leases are the first tier's that has them: one place decides who builds a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._envelope import Opened

__all__ = ["RemoteChain"]

_BACKFILL_ENTRIES = 256


class _NoLeases:
    enabled = False
    expiry = 0.0


class RemoteChain:
    """Remote tiers in lookup order, with the interface of one (fetch/get, push/put, leases, refresh, close)."""

    def __init__(self, tiers: Sequence[Any]) -> None:
        self.tiers = list(tiers)
        self.read_only = all(getattr(t, "read_only", False) for t in self.tiers)
        self.ttl = max((getattr(t, "ttl", 0.0) or 0.0) for t in self.tiers)
        self.leases = next((t.leases for t in self.tiers if getattr(t.leases, "enabled", False)), _NoLeases())
        # digest -> (index of the tier that served it, its frame): copied into the tiers before it.
        self._backfill: dict[str, tuple[int, bytes]] = {}
        self._due: dict[str, list[int]] = {}  # digest -> the tiers whose TTL refresh a hit made due

    def __repr__(self) -> str:
        return f"RemoteChain({self.tiers!r})"

    @property
    def signed(self) -> bool:
        """Whether every tier signs and checks its entries."""
        return all(t.signed for t in self.tiers)

    def fetch(self, digest: str, *, library: bool = False) -> Opened | None:
        """The first tier's checked entry for `digest`; one from a later tier is copied forward later (refresh)."""
        for index, tier in enumerate(self.tiers):
            found = tier.fetch(digest, library=library)
            if found is None:
                continue
            if index and not self.tiers[0].read_only:
                if len(self._backfill) >= _BACKFILL_ENTRIES:
                    self._backfill.pop(next(iter(self._backfill)), None)
                self._backfill[digest] = (index, bytes(found.frame))
            return found
        return None

    def get(self, digest: str, *, library: bool = False) -> bytes | None:
        """As fetch(), as bytes."""
        found = self.fetch(digest, library=library)
        return None if found is None else bytes(found.frame)

    def forget(self, digest: str) -> None:
        """Look `digest` up for real next time, in every tier."""
        for tier in self.tiers:
            tier.forget(digest)

    def push(self, digest: str, blob: bytes, *, portable: bool = True) -> str:
        """Push to every tier: 'failed' if any failed, else 'stored' if any stored, else 'kept' or 'skipped'."""
        outcomes = [tier.push(digest, blob, portable=portable) for tier in self.tiers]
        for outcome in ("failed", "stored", "kept"):
            if outcome in outcomes:
                return outcome
        return "skipped"

    def put(self, digest: str, blob: bytes, *, portable: bool = True) -> bool:
        """Store where no entry is, in every tier; True when some tier stored it."""
        return self.push(digest, blob, portable=portable) == "stored"

    def refresh_due(self, digest: str) -> bool:
        """Whether a hit of `digest` has work for the writer: a copy forward, or a tier's TTL refresh."""
        due = [i for i, tier in enumerate(self.tiers) if tier.refresh_due(digest)]  # each marks its interval done
        if due:
            if len(self._due) >= _BACKFILL_ENTRIES:
                self._due.pop(next(iter(self._due)), None)
            self._due[digest] = due
        return digest in self._backfill or bool(due)

    def refresh(self, digest: str, *, library: bool) -> None:
        """Copy a later tier's hit into the tiers before it, and extend TTLs where a tier keeps them."""
        found = self._backfill.pop(digest, None)
        if found is not None:
            index, frame = found
            for tier in self.tiers[:index]:
                tier.push(digest, frame, portable=True)
        for index in self._due.pop(digest, ()):
            self.tiers[index].refresh(digest, library=library)

    def check(self) -> None:
        """One round trip to each tier; raises what the first failing one raised."""
        for tier in self.tiers:
            tier.check()

    def connect_early(self) -> None:
        """Start connecting to every tier."""
        for tier in self.tiers:
            tier.connect_early()

    def close(self) -> None:
        """Close every tier."""
        for tier in self.tiers:
            tier.close()
