"""Moving staged entries into their stores and to the remote: the writer's jobs of a CodegenCache.

A miss stages its entry in a file before lower() returns (`CodegenCache._stage`); what is here
moves that file's bytes into the diskcache store, pushes them to the remote, asks the llvm
upgrader for a shared library, and removes the staged file last. A job holds what it needs,
not the cache: it runs even if the cache object is gone. The same for the index store's
entries (codegen_cache.build's index, compiled Relax models) and for tools (`promote_staged`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .._artifacts import read_meta, upgradable
from .._errors import ArtifactError
from .._storage._outbox import Outbox
from . import _upgrade
from ._flight import FleetFlight, Lease
from ._push import Pusher
from ._state import CacheState
from ._writer import writer

__all__ = ["Promotion"]


class Promotion(CacheState):
    """CodegenCache's promotion of staged entries (a mixin: the attributes are CodegenCache's, see _state.py)."""

    def _promote(self, mode: str, digest: str, blob: bytes, *, remote: bool, lease: Lease | None = None) -> None:
        job = self._promotion(mode, digest, blob, remote, lease)
        if self.write_behind:
            writer.submit(job)
        else:
            job()

    def _promote_later(self, mode: str, digest: str, blob: bytes) -> None:
        """A staged entry was read (its writer may be gone): move it into its store, and to the remote."""
        writer.submit(self._promotion(mode, digest, blob, True))

    def _promote_fill(self, mode: str, digest: str, blob: bytes | memoryview) -> None:
        """A remote hit's copy for this disk (the remote has it): stored by the writer, off the caller's path.

        Nothing is staged first: a process that ends before the writer ran loses this copy
        alone (its next lowering of the key is a remote hit again), and the caller pays neither
        a file write nor a copy of the value (`blob` may be a view of it: copied in the job).
        """
        job = self._promotion(mode, digest, blob, False, fill=True)
        if self.write_behind:
            writer.submit(job)
        else:
            job()

    def _promotion(self, mode: str, digest: str, blob: bytes | memoryview, remote: bool,
                   lease: Lease | None = None, pusher: Pusher | None = None, *,
                   fill: bool = False) -> Callable[[], None]:
        # The job holds what it needs, not the cache: it runs even if the cache object is gone.
        store, staged, guard, directory = self._stores[mode], self._staged[mode], self._guard, self.directory
        pusher = (pusher or self._pusher) if remote else None
        spare = self.write_behind and not fill  # on this thread, a spare file would cost the caller what it saves

        def promote() -> None:
            data = bytes(blob)  # a remote hit's view copied here, not on its caller's path
            stored = guard("write", store.put, digest, data)
            # The staged file goes only after the push was tried (or marked for later): a
            # process that ends before this line leaves the file, and the next opener pushes it.
            pushed = pusher is None or pusher.push(mode, digest, data)
            FleetFlight.release(lease)  # after the push: waiting hosts find the entry, not the lease
            if stored:
                if pushed and not fill:
                    staged.remove(digest, data)
                # llvm-ir entries get a shared library, unless the IR is another target's (cross-compiled).
                if mode == "compiled" and b"llvm-ir" in data[-64:] and _native_llvm(data):
                    _upgrade.request(directory, mode, digest)
            if spare:
                staged.keep_spare()  # the next miss writes into a file made here, not one it makes

        return promote

    def _refresh_later(self, digest: str, blob: bytes | memoryview | None) -> None:
        """A hit from disk or remote: have the writer extend the remote entry's TTL (once per interval)."""
        due = getattr(self._remote, "refresh_due", None)
        if due is not None and due(digest):
            remote, library = self._remote, blob is not None and b"llvm-so" in bytes(blob[-64:])
            writer.submit(lambda: remote.refresh(digest, library=library))

    def _push_pending(self, pusher: Pusher | None = None, *, only: dict[str, list[str]] | None = None) -> int:
        """Push what is staged (`only` those digests, when given) or marked in the outbox; how many."""
        pusher = pusher or self._pusher
        if pusher is None:
            return 0
        return pusher.drain(self._stores, self._staged,
                            lambda mode, digest, blob: self._promotion(mode, digest, blob, True, pusher=pusher),
                            only=only)

    def _ask_upgrade(self, mode: str, digest: str) -> None:
        """A hit was served from LLVM IR: have it turned into a shared library (once per process)."""
        if digest not in self._upgrades_asked:
            self._upgrades_asked.add(digest)
            writer.submit(lambda: _upgrade.request(self.directory, mode, digest))

    def promote_staged(self, *, remote: str | None = None) -> int:
        """Move every staged entry into its store now (tools do, to see all); how many moved.

        They, and the entries marked for the remote, are pushed to this cache's remote, or to
        the `remote` URL given (a tool that opens the cache without its remote tier).
        """
        pusher = self._pusher
        if remote is not None and pusher is None and (any(next(s.digests(), None) for s in self._staged.values())
                                                      or Outbox(self.directory).pending()):
            pusher = self._pusher_for(self._make_remote(None, dataclasses.replace(self.settings, remote=remote)))
        moved = 0
        for mode, staged in self._staged.items():
            for digest in list(staged.digests()):
                blob = staged.read(digest)
                if blob is not None:
                    self._promotion(mode, digest, blob, pusher is not None, pusher=pusher)()
                    moved += 1
        for digest in list(self._staged_index.digests()):
            blob = self._staged_index.read(digest)
            if blob is not None:
                self._index_promotion(digest, blob)()
                moved += 1
        if pusher is not None:
            self._push_pending(pusher)
            if pusher is not self._pusher:
                pusher.remote.close()
        return moved

    # ---- the index store's entries (codegen_cache.build's index, compiled Relax models) --------

    def stage_index_entry(self, digest: str, blob: bytes) -> bool:
        """Stage an index-store entry now (it survives the process) for the writer to store; False: not stored."""
        if not self._guard("stage", self._staged_index.write, digest, blob):
            return bool(self._guard("write", self._stores["index"].put, digest, blob))
        self.promote_index_entry(digest, blob)
        return True

    def promote_index_entry(self, digest: str, blob: bytes) -> None:
        """Move a staged entry of the index store into the store (by the writer; write_behind=False: now)."""
        job = self._index_promotion(digest, blob)
        if self.write_behind:
            writer.submit(job)
        else:
            job()

    def _index_promotion(self, digest: str, blob: bytes) -> Callable[[], None]:
        store, staged, guard = self._stores["index"], self._staged_index, self._guard

        def promote() -> None:
            if guard("write", store.put, digest, blob):
                staged.remove(digest, blob)

        return promote


def _native_llvm(blob: bytes) -> bool:
    try:
        return upgradable(*read_meta(blob))
    except ArtifactError:
        return False
