"""A store's value files: the names diskcache gives them, and how they are read.

Shared by the lookup through key files (`_disk.py`) and the diskcache side of a store
(`_safedisk.py`), which only a store's open imports.
"""

from __future__ import annotations

import os
import re
import stat

from .._errors import ArtifactError, UnsafeEntryError
from ._faults import READ_FLAGS

__all__ = ["VALUE_FILE", "file_size", "read_value_file"]

# diskcache names value files <2 hex>/<2 hex>/<28 hex>.val; a row naming anything else was
# planted, and following it would read or delete files outside the store.
VALUE_FILE = re.compile(r"^[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val$")


def read_value_file(directory: str, filename: object, size: int | None) -> tuple[bytes, str]:
    """The bytes of a value file and its path: a regular file, read up to `size` bytes."""
    if not VALUE_FILE.match(str(filename)):
        raise UnsafeEntryError(f"refusing to read value file {str(filename)[:80]!r} (not a store file name)")
    path = os.path.join(directory, str(filename))
    fd = os.open(path, READ_FLAGS)  # a symlink fails here (ELOOP); a FIFO opens without blocking
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeEntryError(f"value file {path} is not a regular file")
        if size is not None and info.st_size != size:
            raise ArtifactError(f"value file holds {info.st_size} bytes, its row says {size}")
        wanted = info.st_size if size is None else size
        chunks, got = [], 0
        while got < wanted:
            chunk = os.read(fd, wanted - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) != wanted:
        raise ArtifactError(f"value file ended after {len(data)} of {wanted} bytes")
    return data, path


def file_size(path: str) -> int | None:
    """The size of the regular file at `path` (None: absent, or not a regular file)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
