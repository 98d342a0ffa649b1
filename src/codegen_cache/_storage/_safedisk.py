"""The diskcache side of a store: `SafeDisk`, and a store opened through diskcache.

diskcache pickles anything that is not bytes/str/int/float and unpickles whatever rows of
mode PICKLE are in its database (CVE-2025-69872). `SafeDisk` refuses both directions, so a
hostile cache directory yields an error that the cache turns into a miss.

Imported where a store is first opened through diskcache (a write, an eviction, a clear, a
read-only directory); a lookup, through key files or the plain SQLite reader (`_disk.py`),
needs none of diskcache, so a process that only hits never imports it (what that saves:
docs/benchmarks.md at 5788f7c, "What a hit does not import").
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat

import diskcache

from .._errors import UnsafeEntryError
from ._faults import DIR_MODE, freeze_file_mode, share_file_mode
from ._values import VALUE_FILE, read_value_file

__all__ = ["SafeDisk", "Timeout", "open_cache"]

logger = logging.getLogger(__name__)

# What a write raises where the store stayed locked past its timeout (`retry=False`).
Timeout = diskcache.Timeout

_MKDIR_ATTEMPTS = 3


class SafeDisk(diskcache.Disk):
    """A diskcache Disk that stores and returns only bytes (values) and str (keys)."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError(f"store keys must be str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise UnsafeEntryError("refusing to unpickle a key read from the cache database")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if type(value) is not bytes:
            raise TypeError(f"store values must be bytes, got {type(value).__name__}")
        # Every value in a file (the store's min_file_size is 0): a key file can name it.
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode != diskcache.core.MODE_RAW and mode != diskcache.core.MODE_BINARY:
            raise UnsafeEntryError(f"refusing to read a cache row of mode {mode} (only bytes are stored)")
        if mode == diskcache.core.MODE_BINARY:
            return read_value_file(self._directory, filename, None)[0]
        return bytes(value)

    def remove(self, file_path):
        # diskcache removes the file a row names when the row goes (delete, cull, clear):
        # a planted '../../x' must not delete files outside the store, nor a FIFO or link
        # planted at a store name be treated as ours.
        if not VALUE_FILE.match(str(file_path)):
            logger.warning("codegen cache: not removing %r named by a store row (not a store file name)",
                           str(file_path)[:200])
            return
        full = os.path.join(self._directory, file_path)
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.lstat(full).st_mode):
                logger.warning("codegen cache: not removing %s: not a regular file (left in place)", full)
                return
        super().remove(file_path)

    def _write(self, full_path, iterator, mode, encoding=None):
        # Written here rather than by diskcache's own _write, which makes missing directories
        # with os.makedirs, parents included: a store (or a whole cache directory) removed
        # meanwhile would be made again, by the upgrader too. Only the two levels of a value
        # file's name are made, below a store directory that exists. And a failed write (a
        # full disk) leaves no partly written file: no row would refer to it, it would hold
        # that space for good.
        subdir = os.path.dirname(full_path)
        # Another thread's or process's remove of the last file in these levels removes them
        # (diskcache's os.removedirs) between our mkdir and open: made again, a few times.
        # The store directory gone: FileNotFoundError.
        for attempt in range(_MKDIR_ATTEMPTS):
            try:
                for path in (os.path.dirname(subdir), subdir):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(path, DIR_MODE)
                    if not stat.S_ISDIR(os.lstat(path).st_mode):
                        raise UnsafeEntryError(f"{path} is not a directory of the store (a symlink?)")
                writer = open(full_path, mode, encoding=encoding)  # mode "xb": a file of its own, never a link
                break
            except FileNotFoundError:
                if attempt == _MKDIR_ATTEMPTS - 1 or not os.path.isdir(self._directory):
                    raise
        if isinstance(iterator, io.BytesIO):
            # diskcache iterates a BytesIO line by line: thousands of write() calls for a
            # binary. One chunk (same file, same size).
            iterator = iter((iterator.getvalue(),))
        size = 0
        try:
            with writer:
                for chunk in iterator:
                    size += len(chunk)
                    writer.write(chunk)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            raise
        for path in (full_path, subdir, os.path.dirname(subdir)):
            share_file_mode(path)
        freeze_file_mode(full_path)
        return size


def open_cache(directory: str, *, timeout: float, size_limit: int) -> diskcache.Cache:
    """The diskcache store in `directory` (made if missing), storing through SafeDisk."""
    return diskcache.Cache(
        directory,
        timeout=timeout,
        disk=SafeDisk,
        size_limit=size_limit,
        eviction_policy="least-recently-stored",  # no write on every hit
        cull_limit=0,  # the caller culls after each put, to count what goes
        statistics=False,
        disk_min_file_size=0,  # every value in a file: its key file names it
    )
