"""Moving staged entries into their stores and to the remote: the writer's jobs of a CodegenCache.

A miss stages its entry in a file before lower() returns (`CodegenCache._stage`); a Promoter
moves that file's bytes into the diskcache store, pushes them to the remote, asks the llvm
upgrader for a shared library, and removes the staged file last. It holds the stores, not the
cache, and so does each job it makes: a job runs even if the cache object is gone. The same for
whole-build entries (staged in `staged/index/`: codegen_cache.build's index entries go to the
index store, compiled Relax models to the compiled store; both are pushed to the remote by
digest, as kernels are) and for tools (`promote_staged`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import _artifacts
from .._artifacts import read_meta
from .._errors import ArtifactError
from .._storage._disk import GROUP_TAG, ArtifactStore
from .._storage._layout import MODEL_CODEC, TENSOR_CODEC
from .._storage._pending import PendingFiles
from . import _upgrade
from ._flight import FleetFlight, Lease
from ._guard import StorageGuard
from ._push import Pusher
from ._writer import writer

__all__ = ["Promoter"]


class Promoter:
    """Moves a CodegenCache's staged entries into their stores and to its remote (by the writer thread)."""

    def __init__(self, directory: Path, *, stores: dict[str, ArtifactStore], staged: dict[str, PendingFiles],
                 staged_index: PendingFiles, guard: StorageGuard, pusher: Pusher | None, write_behind: bool) -> None:
        self.directory, self.stores, self.staged, self.staged_index = directory, stores, staged, staged_index
        self.guard, self.pusher, self.write_behind = guard, pusher, write_behind

    def promote(self, mode: str, digest: str, blob: bytes, *, lease: Lease | None = None) -> None:
        """A fresh entry was staged: store it and push it (by the writer; write_behind=False: now)."""
        self._run(self.job(mode, digest, blob, remote=True, lease=lease))

    def promote_later(self, mode: str, digest: str, blob: bytes) -> None:
        """A staged entry was read (its writer may be gone): move it into its store, and to the remote."""
        writer.submit(self.job(mode, digest, blob, remote=True))

    def promote_fill(self, mode: str, digest: str, blob: bytes | memoryview) -> None:
        """A remote hit's copy for this disk (the remote has it): stored by the writer, off the caller's path.

        Nothing is staged first: a process that ends before the writer ran loses this copy
        alone (its next lowering of the key is a remote hit again), and the caller pays neither
        a file write nor a copy of the value (`blob` may be a view of it: copied in the job).
        """
        self._run(self.job(mode, digest, blob, remote=False, fill=True))

    def _run(self, job: Callable[[], None]) -> None:
        if self.write_behind:
            writer.submit(job)
        else:
            job()

    def job(self, mode: str, digest: str, blob: bytes | memoryview, *, remote: bool, lease: Lease | None = None,
            pusher: Pusher | None = None, fill: bool = False) -> Callable[[], None]:
        """What moves one entry: store it, push it (remote), then remove its staged file."""
        store, staged, guard, directory = self.stores[mode], self.staged[mode], self.guard, self.directory
        pusher = (pusher or self.pusher) if remote else None
        spare = self.write_behind and not fill  # on this thread, a spare file would cost the caller what it saves

        def promote() -> None:
            staged_data = bytes(blob)  # a remote hit's view copied here, not on its caller's path
            # The store and the remote keep an llvm entry's IR packed; the miss staged it plain,
            # so that the caller never waits for the packing (_artifacts/_packed.py).
            data = _artifacts.compact(staged_data)
            stored = guard("write", store.put, digest, data)
            # The staged file goes only after the push was tried (or marked for later): a
            # process that ends before this line leaves the file, and the next opener pushes it.
            pushed = pusher is None or pusher.push(mode, digest, data)
            FleetFlight.release(lease)  # after the push: waiting hosts find the entry, not the lease
            if stored:
                if pushed and not fill:
                    staged.remove(digest, staged_data)
                # llvm-ir entries get a shared library, unless the IR is another target's (cross-compiled).
                if mode == "compiled" and b"llvm-ir" in data[-64:] and _native_llvm(data):
                    _upgrade.request(directory, mode, digest)
            if spare:
                staged.keep_spare()  # the next miss writes into a file made here, not one it makes

        return promote

    def push_pending(self, pusher: Pusher | None = None, *, only: dict[str, list[str]] | None = None) -> int:
        """Push what is staged (`only` those digests, when given) or marked in the outbox; how many."""
        pusher = pusher or self.pusher
        if pusher is None:
            return 0
        return pusher.drain(self.stores, self.staged,
                            lambda mode, digest, blob: self.job(mode, digest, blob, remote=True, pusher=pusher),
                            only=only)

    def promote_staged(self, pusher: Pusher | None) -> int:
        """Move every staged entry into its store now, pushing to `pusher`'s remote; how many moved."""
        moved = 0
        for mode, staged in self.staged.items():
            for digest in list(staged.digests()):
                blob = staged.read(digest)
                if blob is not None:
                    self.job(mode, digest, blob, remote=pusher is not None, pusher=pusher)()
                    moved += 1
        for digest in list(self.staged_index.digests()):
            blob = self.staged_index.read(digest)
            if blob is not None:
                self._index_job(digest, blob)()
                moved += 1
        if pusher is not None:
            self.push_pending(pusher)
        return moved

    # ---- whole-build entries (codegen_cache.build's index entries, compiled Relax models) -------

    def stage_index_entry(self, digest: str, blob: bytes) -> bool:
        """Stage a whole-build entry now (it survives the process) for the writer to store; False: not stored."""
        if not self.guard("stage", self.staged_index.write, digest, blob):
            return bool(self.guard("write", self.stores[home_store(blob)].put, digest, blob))
        self.promote_index_entry(digest, blob)
        return True

    def promote_index_entry(self, digest: str, blob: bytes) -> None:
        """Move a staged whole-build entry into its store (by the writer; write_behind=False: now)."""
        self._run(self._index_job(digest, blob))

    def fill_index_entry(self, digest: str, blob: bytes | memoryview) -> None:
        """A whole-build entry the remote served: this disk's copy, stored by the writer (not pushed back)."""
        store, guard = self.stores[home_store(blob)], self.guard
        self._run(lambda: guard("write", store.put, digest, bytes(blob)))

    def _index_job(self, digest: str, blob: bytes) -> Callable[[], None]:
        home = home_store(blob)
        store, staged, guard, pusher = self.stores[home], self.staged_index, self.guard, self.pusher
        # A compiled model names the entries of its library: they are evicted with it (_groups.py).
        tag = GROUP_TAG if home == "compiled" else None

        def promote() -> None:
            # Whole-build entries travel like kernels: whatever a model or a build consists of
            # reaches the remote by its digest. The staged file goes only after the push was
            # tried (or marked in the outbox): a process that ends first leaves it for the next.
            stored = guard("write", store.put, digest, blob, tag=tag)
            pushed = pusher is None or pusher.push(home, digest, blob)
            if stored and pushed:
                staged.remove(digest, blob)

        return promote


def _native_llvm(blob: bytes) -> bool:
    try:
        return _artifacts.upgradable(*read_meta(blob))
    except ArtifactError:
        return False


def home_store(blob: bytes) -> str:
    """The store of a whole-build entry: a compiled Relax model's and its weights' chunks are `compiled`,
    beside its library; else `index`."""
    try:
        codec = read_meta(blob)[0]
    except ArtifactError:
        return "index"  # a bad frame: stored where a reader of the index checks and drops it
    return "compiled" if codec in (MODEL_CODEC, TENSOR_CODEC) else "index"
