"""What a remote still has to get from this directory: one empty marker file per entry, `<dir>/outbox/`.

An entry reaches the remote from the background writer after lower() returned. Until that
push has worked, the entry's staged file stays (`_storage._pending`): whoever opens the
directory next promotes and pushes it. A push that fails (the remote is down, refuses writes)
leaves a marker here instead, `<kind>.<digest>` (kind: compiled, source, or lib for an llvm
entry's shared library), and the staged file goes; the next process with a writable remote
pushes what the markers name from the store. Markers older than the remote TTL are dropped
(the entry would have expired there by now).

Only names this module made are read or removed; files are made without following symlinks.
A non-blocking flock on `.lock` lets one process of the directory push at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from .._forksafe import on_fork_child
from ._faults import FILE_MODE, ensure_dir
from ._layout import ENTRY_STORES

__all__ = ["KINDS", "Outbox"]

logger = logging.getLogger(__name__)

KINDS = (*ENTRY_STORES, "lib")
_MARKER = re.compile(rf"^({'|'.join(KINDS)})\.([0-9a-f]{{32}})$")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
# Descriptors of drain locks held now: a child made by fork closes its copies, or it would hold
# the lock (shared by every copy) for as long as it lives and no process would push.
_held: set[int] = set()


def _close_held() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


on_fork_child(_close_held)


class Outbox:
    """The markers of one cache directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory) / "outbox"

    def open(self) -> None:
        """Make the directory: a cache with a writable remote uses this one (the upgrader marks only then)."""
        try:
            ensure_dir(self.directory)
        except OSError as err:
            logger.debug("codegen cache: cannot make %s: %s", self.directory, err)

    def in_use(self) -> bool:
        """Whether a cache with a writable remote has used this directory."""
        return self.directory.is_dir()

    def mark(self, kind: str, digest: str) -> bool:
        """Remember that the remote lacks this entry (of `kind`); False when the marker cannot be made."""
        if kind not in KINDS or not re.fullmatch(r"[0-9a-f]{32}", digest):
            raise ValueError(f"not an outbox marker: {kind!r}, {digest!r}; kinds are {', '.join(KINDS)}")
        try:
            ensure_dir(self.directory)
            os.close(os.open(self.directory / f"{kind}.{digest}", _CREATE, FILE_MODE))
        except OSError as err:
            logger.debug("codegen cache: cannot mark %s %s for the remote: %s", kind, digest[:16], err)
            return False
        return True

    def done(self, kind: str, digest: str) -> None:
        """The remote has it now (or never will): forget the marker."""
        try:
            os.unlink(self.directory / f"{kind}.{digest}")
        except OSError as err:
            if err.errno != errno.ENOENT:
                logger.debug("codegen cache: cannot remove the outbox marker %s.%s: %s", kind, digest[:16], err)

    def pending(self, max_age: float | None = None) -> list[tuple[str, str]]:
        """(kind, digest) of every marker, oldest first; those older than `max_age` seconds are removed."""
        found = []
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    match = _MARKER.match(entry.name)
                    if match is None or not entry.is_file(follow_symlinks=False):
                        continue
                    made = entry.stat(follow_symlinks=False).st_mtime
                    if max_age and time.time() - made > max_age:
                        self.done(*match.groups())
                        continue
                    found.append((made, match.group(1), match.group(2)))
        except OSError:
            return []
        return [(kind, digest) for _made, kind, digest in sorted(found)]

    @contextlib.contextmanager
    def draining(self) -> Iterator[bool]:
        """True inside when this process may push now (no other process of the directory is pushing)."""
        try:
            ensure_dir(self.directory)
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except OSError as err:
            logger.debug("codegen cache: cannot open the outbox lock of %s: %s", self.directory, err)
            yield False
            return
        _held.add(fd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False  # another process pushes: what it does not push now, it marks
                return
            yield True
        finally:
            _held.discard(fd)
            os.close(fd)  # releases the flock
