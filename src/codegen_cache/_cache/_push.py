"""Every returned miss reaches the remote eventually: the push after a build, and what was left behind.

The writer thread pushes a fresh entry after it moved it into its store, and removes the
staged file only after that push was tried (`CodegenCache._promotion`). So an entry whose
process ended first (`os._exit`, SIGKILL, `Pool.terminate`, the exit wait running out) is still
staged, and one whose push failed has a marker in `<dir>/outbox/` (`_storage._outbox`). The
next process that opens the directory with a writable remote, and `codegen-cache` commands
there, push both (`Pusher.drain`, one process at a time). The llvm upgrader marks each
library it links and, where its environment names the remote, pushes it at once (`upgraded`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._config import settings_from_env
from .._errors import ConfigError
from .._storage._disk import STORAGE_ERRORS
from .._storage._outbox import Outbox

__all__ = ["Pusher", "upgraded"]

logger = logging.getLogger(__name__)

Promotion = Callable[[str, str, bytes], Callable[[], None]]


class Pusher:
    """Pushes entries of one cache directory to a writable remote; what fails is marked for later."""

    def __init__(self, remote: Any, directory: Path, *, max_age: float | None = None) -> None:
        self.remote = remote
        self.outbox = Outbox(directory)
        self.max_age = max_age  # the remote's TTL: an older marker names an entry that would be gone

    def push(self, kind: str, digest: str, blob: bytes, *, portable: bool = True) -> bool:
        """Push `blob`; False only when it failed and could not be marked for a later push either."""
        if self._outcome(digest, blob, portable) != "failed":
            return True
        return self.outbox.mark(kind, digest)

    def _outcome(self, digest: str, blob: bytes, portable: bool) -> str:
        push = getattr(self.remote, "push", None)
        if push is None:  # an object with get() and put(digest, blob) -> bool
            return "stored" if self.remote.put(digest, blob) else "failed"
        return push(digest, blob, portable=portable)

    def drain(self, stores: Mapping[str, Any], staged: Mapping[str, Any], promotion: Promotion, *,
              only: Mapping[str, list[str]] | None = None) -> int:
        """Promote and push what is staged (`only` these digests per store, when given), then what the outbox names.

        How many entries went. `only`: what was staged when this process opened the directory,
        so that its own new entries are left to the jobs that will promote them.
        """
        self.outbox.open()
        staged_digests = {mode: list(files.digests()) if only is None else list(only.get(mode, ()))
                          for mode, files in staged.items()}
        if not any(staged_digests.values()) and not self.outbox.pending():
            return 0  # the common case at open: nothing left behind (and no lock file made for it)
        moved = 0
        with self.outbox.draining() as mine:
            if not mine:
                return 0  # another process of this directory pushes them now
            for mode, files in staged.items():
                for digest in staged_digests[mode]:
                    blob = files.read(digest)
                    if blob is not None:
                        promotion(mode, digest, blob)()
                        moved += 1
            for kind, digest in self.outbox.pending(self.max_age):
                try:
                    row = stores["compiled" if kind == "lib" else kind].read(digest)
                except STORAGE_ERRORS as err:
                    logger.debug("codegen cache: cannot read %s for the remote: %s", digest[:16], err)
                    continue
                if row is None:
                    self.outbox.done(kind, digest)  # gone from the store (evicted, cleared): nothing to push
                    continue
                if self._outcome(digest, row.blob, kind != "lib") == "failed":
                    break  # the remote is offline now: the rest stay marked
                self.outbox.done(kind, digest)
                moved += 1
        return moved


# ---- in the llvm upgrader ---------------------------------------------------------------------

_upgrader_remote: list[Any] = []  # the upgrader process's tier, made on its first library


def upgraded(directory: Path, store: str, digest: str, blob: bytes, count: Callable[..., None]) -> None:
    """The upgrader linked `digest`'s library: mark it for the remote, and push it if the environment names one."""
    if store != "compiled":
        return
    remote = _remote_from_env(count)
    if remote is not None and remote.push(digest, blob, portable=False) != "failed":
        return
    outbox = Outbox(directory)
    if remote is not None or outbox.in_use():  # else no cache of this directory writes to a remote
        outbox.mark("lib", digest)


def _remote_from_env(count: Callable[..., None]) -> Any:
    # The upgrader inherits the environment of the process that started it: where the remote
    # is configured there (the usual fleet setup), it is configured here too. Otherwise the
    # marker waits for the next process that opens the directory with a remote.
    if not _upgrader_remote:
        try:
            settings = settings_from_env()
        except ConfigError as err:
            logger.warning("codegen cache: not pushing libraries: %s", err)
            settings = None
        remote = None
        if settings is not None and settings.remote and not settings.remote_read_only:
            from .._storage._remotes import open_remote

            remote = open_remote(settings, on_event=count, lease=0)
        _upgrader_remote.append(remote)
    return _upgrader_remote[0]
