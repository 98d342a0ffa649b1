"""The cache's failure policy: a storage failure is counted, warned about once, and becomes a miss.

Storage errors (SQLite, the filesystem, a diskcache timeout) and rows the store refuses to
read (they would need unpickling) turn into None here; nothing else is caught. A full disk or a
read-only directory fails reads, stores and locks alike, so those get one warning per fault
for the cache directory, not one per operation they broke.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ArtifactError, CacheLinkError, ReadOnlyStoreError
from .._log import warn_once
from .._storage._disk import STORAGE_ERRORS
from .._storage._faults import storage_fault

__all__ = ["StorageGuard"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class StorageGuard:
    """Runs storage operations of one cache directory, turning their failures into None."""

    def __init__(self, directory: Path, count: Callable[[str], None]) -> None:
        self.directory = directory
        self.count = count

    def __call__(self, kind: str, func: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """func(*args, **kwargs), or None when the storage failed (counted as error:<kind>)."""
        try:
            return func(*args, **kwargs)
        except STORAGE_ERRORS as err:
            self.error(kind, err)
            return None
        except (TypeError, ArtifactError) as err:  # a row we did not write (SafeDisk refuses it)
            self.error(f"{kind}-unsafe", err)
            return None

    def error(self, kind: str, err: BaseException) -> None:
        """Count a failure of `kind` and say what is wrong, once per fault."""
        self.count(f"error:{kind}")
        fault = storage_fault(err, self.directory)
        if isinstance(err, (ReadOnlyStoreError, CacheLinkError)):
            logger.debug("codegen cache: %s skipped: %s", kind, err)  # warned once where it was found
        elif fault == "no-space":
            self.warn(fault, "codegen cache: no space left for %s (%s); compiling without storing "
                      "until space is freed", self.directory, err)
        elif fault == "read-only":
            self.warn(fault, "codegen cache: %s cannot be written (%s); serving the entries it has "
                      "and storing nothing new", self.directory, err)
        else:
            self.warn(kind, "codegen cache: %s failed (%s: %s); continuing without the cache for it",
                      kind, type(err).__name__, err)

    def stored(self) -> None:
        """A store worked: space is back, so the next full disk is worth a warning again."""
        warn_once.forget(("no-space", str(self.directory)))

    def warn(self, key: str, msg: str, *args: object) -> None:
        """Log at WARNING the first time for `key` and this directory in this process, then at DEBUG."""
        warn_once(logger, (key, str(self.directory)), msg, *args)

    @staticmethod
    def debug(msg: str, *args: object) -> None:
        """Log at DEBUG."""
        logger.debug(msg, *args)
