"""A store of plain files: one regular file `<32 hex digits><suffix>` per entry, in one directory.

Frontends keep whole-kernel entries this way (codegen_cache.tilelang: `<cache dir>/tilelang/
<digest>.so`, a frame whose field 0 is the kernel library; a hit loads a private copy of the
bytes read here, never the file itself). The cache and its
tools reach them here, with the methods of ArtifactStore they use: keys, get, delete, volume,
len, expire, clear; cull bounds the store's size as diskcache bounds its stores.

Only names this store makes are listed, read or removed: entries match `<32 hex><suffix>`,
must be regular files, are opened without following symlinks (the store's directory either),
and reads are bounded.
Leftovers of killed writers (names starting `cgc-`, older than an hour) are swept by expire().
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from .._errors import ArtifactError
from ._faults import READ_FLAGS, read_whole, real_dir
from ._fsprobe import sweep_leftovers

__all__ = ["MAX_PLAIN_BYTES", "PlainFiles"]

MAX_PLAIN_BYTES = 512 << 20  # a kernel library with its sources; a bigger file was planted
_KEY = re.compile(r"^[0-9a-f]{32}$")


class PlainFiles:
    """Entries as plain files `<key><suffix>` in `directory` (which need not exist)."""

    def __init__(self, directory: str | os.PathLike, suffix: str = ".so", max_bytes: int = MAX_PLAIN_BYTES) -> None:
        self.directory = Path(directory)
        self.suffix = suffix
        self.max_bytes = max_bytes

    def path(self, key: str) -> Path:
        """Where the entry of `key` lives; ValueError unless `key` is 32 lowercase hex digits."""
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"invalid entry key {key!r}: expected 32 lowercase hex digits")
        return self.directory / f"{key}{self.suffix}"

    def _names_an_entry(self, name: str) -> bool:
        # Not a regular expression per store: a store is made per lookup, so every first hit of
        # a process would compile one.
        stem = name[: len(name) - len(self.suffix)] if self.suffix else name
        return name.endswith(self.suffix) and _KEY.match(stem) is not None

    def _real(self) -> bool:
        """Whether the store's directory is there as a real directory (a link: refused, warned once)."""
        try:
            return real_dir(self.directory, self.directory.parent)
        except OSError:
            return False

    def _scan(self) -> list[os.DirEntry]:
        if not self._real():
            return []
        try:
            with os.scandir(self.directory) as scan:
                return [e for e in scan if self._names_an_entry(e.name) and e.is_file(follow_symlinks=False)]
        except OSError:
            return []

    def keys(self) -> list[str]:
        """Keys of the entries present (regular files with the store's names only)."""
        return [e.name[: -len(self.suffix)] if self.suffix else e.name for e in self._scan()]

    def __len__(self) -> int:
        return len(self._scan())

    def volume(self) -> int:
        """Bytes the entries hold (sizes of the files, as found now)."""
        total = 0
        for entry in self._scan():
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass  # removed meanwhile
        return total

    def mtime(self, key: str) -> float | None:
        """When the entry's file was last written (None: absent)."""
        try:
            info = os.lstat(self.path(key))
        except OSError:
            return None
        return info.st_mtime if stat.S_ISREG(info.st_mode) else None

    def get(self, key: str) -> bytes | None:
        """The entry's bytes; None when absent; ArtifactError when not a regular file or too big."""
        path = self.path(key)
        if not self._real():
            return None
        try:
            fd = os.open(path, READ_FLAGS)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if err.errno == errno.ELOOP:
                raise ArtifactError(f"{key}{self.suffix} is a symbolic link, not an entry") from None
            raise
        try:
            data = read_whole(fd, self.max_bytes)
        finally:
            os.close(fd)
        if data is None:
            raise ArtifactError(f"{key}{self.suffix} is not a regular file of at most {self.max_bytes} bytes "
                                "(or it changed while read)")
        return data

    def delete(self, key: str) -> bool:
        """Remove the entry (never through a symlink: unlink removes a link itself); whether it went."""
        path = self.path(key)
        if not self._real():
            return False
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return False
            os.unlink(path)
        except OSError:
            return False  # absent, or another process removed it first
        return True

    def cull(self, size_limit: int, keep: str | None = None) -> int:
        """Remove the least recently stored entries (oldest file first) until the store holds at most
        `size_limit` bytes, as diskcache culls its stores; never `keep` (the entry just written). How many went."""
        found = []
        for entry in self._scan():
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            found.append((info.st_mtime, info.st_size, entry.name[: len(entry.name) - len(self.suffix)]))
        excess = sum(size for _mtime, size, _key in found) - size_limit
        removed = 0
        for _mtime, size, key in sorted(found):
            if excess <= 0:
                break
            if key != keep and self.delete(key):
                excess -= size
                removed += 1
        return removed

    def expire(self) -> int:
        """Sweep leftovers of killed writers (`cgc-*`, older than an hour); entries never expire."""
        return sweep_leftovers(str(self.directory)) if self._real() else 0

    def clear(self) -> int:
        """Remove every entry; how many went."""
        return sum(1 for key in self.keys() if self.delete(key))
