"""Entries written before lower() returns: one file per entry, renamed into place atomically.

A fresh module's entry is written here on the caller's thread (one write and a rename into
the page cache), so it survives whatever happens to the process
next: exit, os._exit, SIGTERM from Pool.terminate, garbage collection of the cache object.
Moving it into the diskcache store (`promote`) comes later, on a background thread, or from
any process that finds the file: every step is idempotent and the file is complete once it
is visible. Readers look here after a store miss (one stat).

Making a file is most of what staging costs (several times writing into a file made earlier
and renaming it: docs/benchmarks.md at 5788f7c, "The hand-written parts against the library"), so the
background writer keeps a spare file or two ready (`keep_spare`), made by this process, used within a minute, dropped
in a child of fork (the parent may write into them) and removed at exit.

Only names this module made are read or removed: `<digest>` (32 hex digits) for entries and
`cgc-*.tmp` while writing; files are opened without following symlinks, must be regular
files, and reads are bounded.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from .._forksafe import on_fork_child
from ._faults import FILE_MODE, READ_FLAGS, ensure_dir, freeze_file_mode, read_whole, real_dir, share_file_mode
from ._fsprobe import sweep_leftovers

__all__ = ["MAX_ENTRY_BYTES", "PendingFiles"]

logger = logging.getLogger(__name__)

MAX_ENTRY_BYTES = 1 << 30  # no codegen result comes near this; a bigger file was planted
_NAME = re.compile(r"^[0-9a-f]{32}$")
_TMP_PREFIX = "cgc-"
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SPARES = 2
_SPARE_SECONDS = 60.0  # well under the sweep's hour: an older spare is dropped, not used


def _drop(spares: list[tuple[int, str, float]]) -> None:
    # Closes and removes the spare files (at exit, or when they are too old to use).
    while spares:
        fd, tmp, _made = spares.pop()
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class PendingFiles:
    """The staging directory of one store: `<cache>/staged/<store>/`."""

    def __init__(self, directory: Path, *, make_root: bool = True) -> None:
        self.directory = str(directory)
        # <cache>/staged/<store>: nothing below the cache directory is reached through a link.
        self.root, self.make_root = os.path.dirname(os.path.dirname(self.directory)), make_root
        self._real = False  # seen as a real directory all the way down (then not looked at again)
        self._spares: list[tuple[int, str, float]] = []  # (fd, path, time.monotonic() when made)
        self._lock = threading.Lock()
        on_fork_child(self._forget_spares)
        weakref.finalize(self, _drop, self._spares)

    def _forget_spares(self) -> None:
        # In a child of fork: the parent's spare files are the parent's (close our copies only).
        for fd, _tmp, _made in self._spares:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._spares.clear()
        self._lock = threading.Lock()

    def _is_real(self) -> bool:
        """Whether the directory is there, with no link on the way down from the cache directory;
        OSError (warned once) where a link or a file is in the way."""
        if not self._real:
            self._real = real_dir(self.directory, self.root)
        return self._real

    def _new_file(self) -> tuple[int, str]:
        tmp = os.path.join(self.directory, f"{_TMP_PREFIX}{os.getpid()}-{time.monotonic_ns()}.tmp")
        try:
            if not self._is_real():
                raise FileNotFoundError(errno.ENOENT, "not made yet", self.directory)
            fd = os.open(tmp, _CREATE_FLAGS, FILE_MODE)
        except FileNotFoundError:  # first write, or the cache directory was removed under us
            ensure_dir(self.directory, self.root, make_root=self.make_root)
            self._real = True
            fd = os.open(tmp, _CREATE_FLAGS, FILE_MODE)
        return fd, tmp

    def keep_spare(self) -> None:
        """Make a file for a coming write now (the background writer calls this, not lower())."""
        with self._lock:
            if len(self._spares) >= _SPARES:
                return
        try:
            fd, tmp = self._new_file()
        except OSError:
            return  # the write will make its own, and report what fails
        try:
            share_file_mode(tmp)
        except OSError:
            pass
        with self._lock:
            self._spares.append((fd, tmp, time.monotonic()))

    def _spare(self) -> tuple[int, str] | None:
        with self._lock:
            while self._spares:
                fd, tmp, made = self._spares.pop()
                if time.monotonic() - made < _SPARE_SECONDS:
                    return fd, tmp
                _drop([(fd, tmp, made)])
        return None

    def path(self, digest: str) -> str:
        """Where the entry of `digest` is staged."""
        return os.path.join(self.directory, digest)

    def write(self, digest: str, blob: bytes) -> bool:
        """Write the entry atomically (a reader sees all of it or nothing); OSError on failure."""
        if not _NAME.match(digest):
            raise ValueError(f"not a key digest: {digest!r}")
        spare = self._spare()
        fd, tmp = spare if spare is not None else self._new_file()
        try:
            try:
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view):]
                if spare is None:
                    share_file_mode(tmp)
                freeze_file_mode(fd)
            finally:
                os.close(fd)
            try:
                os.rename(tmp, self.path(digest))
            except FileNotFoundError:
                if spare is None:
                    raise
                return self.write(digest, blob)  # the directory was removed under us: a new file in a new one
            return True
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def read(self, digest: str, *, max_bytes: int = MAX_ENTRY_BYTES) -> bytes | None:
        """The staged bytes of `digest`, or None (absent, not a regular file, or too big)."""
        try:
            if not self._is_real():
                return None
            fd = os.open(self.path(digest), READ_FLAGS)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTDIR):
                logger.debug("codegen cache: cannot open staged entry %s: %s", digest[:16], err)
            return None
        try:
            data = read_whole(fd, max_bytes)
        finally:
            os.close(fd)
        if data is None:
            logger.warning("codegen cache: ignoring %s: not a regular file of at most %d bytes, or one "
                           "that changed while read", self.path(digest), max_bytes)
        return data

    def remove(self, digest: str, blob: bytes | None = None) -> None:
        """Remove the staged file of `digest` (only if it still holds `blob`, when given)."""
        path = self.path(digest)
        try:
            if not self._is_real():
                return
        except OSError:
            return
        if blob is not None and self.read(digest) != blob:
            return  # replaced meanwhile (a rebuild): the newer file is promoted on its own
        try:
            os.unlink(path)
        except OSError as err:
            if err.errno != errno.ENOENT:
                logger.debug("codegen cache: cannot remove staged entry %s: %s", path, err)

    def digests(self) -> Iterator[str]:
        """Digests staged here (entries only, never temporary or foreign files)."""
        try:
            if not self._is_real():
                return iter(())
            with os.scandir(self.directory) as entries:
                names = [e.name for e in entries if _NAME.match(e.name) and e.is_file(follow_symlinks=False)]
        except OSError:
            return iter(())
        return iter(names)

    def sweep(self) -> int:
        """Remove temporary files of killed writers (ours: `cgc-*`, older than an hour); how many went."""
        try:
            if not self._is_real():
                return 0
        except OSError:
            return 0
        return sweep_leftovers(self.directory)

    def clear(self) -> int:
        """Remove every staged entry; how many went."""
        removed = 0
        for digest in list(self.digests()):
            try:
                os.unlink(self.path(digest))
                removed += 1
            except OSError:
                pass
        return removed
