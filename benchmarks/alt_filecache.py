"""The alternative a user would pick instead: a file-per-entry directory cache.

In the style of Triton's and tilelang's kernel caches: one directory per key holding the
artifact file and a JSON manifest, written into a temporary directory and renamed into place
(atomic for readers; the first writer wins and later ones discard their copy). It stores the
same framed artifact bytes as the cache under test, so a comparison measures only the storage.
What it does not have: a size limit or eviction, single-flight across processes, counters, a
memory tier, a remote tier, a check that the manifest matches the artifact beyond its size.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

__all__ = ["FileCache"]

ARTIFACT = "artifact.bin"
MANIFEST = "manifest.json"


class FileCache:
    """key -> <root>/<key[:2]>/<key>/{artifact.bin, manifest.json}."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)

    def _entry(self, key: str) -> str:
        # Two-character fan-out, as Triton's and ccache's layouts do, keeps directories small.
        return os.path.join(self.root, key[:2], key)

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None (missing or incomplete)."""
        entry = self._entry(key)
        try:
            with open(os.path.join(entry, MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
            with open(os.path.join(entry, manifest["artifact"]), "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, KeyError, ValueError):
            return None
        if len(data) != manifest.get("size"):
            return None
        return data

    def put(self, key: str, blob: bytes, meta: dict | None = None) -> bool:
        """Store `blob` under `key`; False when another writer got there first."""
        final = self._entry(key)
        if os.path.exists(final):
            return False
        tmp = tempfile.mkdtemp(dir=self._tmp)
        with open(os.path.join(tmp, ARTIFACT), "wb") as f:
            f.write(blob)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"key": key, "artifact": ARTIFACT, "size": len(blob), **(meta or {})}, f)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            os.rename(tmp, final)
        except OSError:  # ENOTEMPTY/EEXIST: a concurrent writer won the rename
            for name in (ARTIFACT, MANIFEST):
                os.unlink(os.path.join(tmp, name))
            os.rmdir(tmp)
            return False
        return True
