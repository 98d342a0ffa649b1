"""What is stored in a cache directory: list, find, verify and prune entries (for the CLI).

Only the public ArtifactStore API and the frame reader are used; nothing here decodes a
module, so listing and checking a cache of CUDA binaries works on a host without a GPU.
Store 'tilelang' is the frontend's plain files (`<dir>/tilelang/<key>.so`, _storage/_plain.py):
listed, checked and pruned here like the others, without tilelang installed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._artifacts import CODEC_FIELDS, read_meta, unframe
from .._errors import ArtifactError
from .._key import PART_NAMES
from .._storage._disk import STORAGE_ERRORS, ArtifactStore
from .._storage._layout import ALL_STORES, INDEX_CODECS, ENTRY_STORES, FRONTEND_DIR, MODEL_CODEC, TENSOR_CODEC
from .._storage._plain import PlainFiles
from ..tilelang._entry import ENTRY_CODEC, entry_problem

__all__ = ["ALL_STORES", "ENTRY_STORES", "LISTED_STORES", "StoredItem", "find_entries", "iter_entries",
           "open_store", "prune", "read_entry", "target_summary", "verify_entries"]

# TVM's symbol for function `name` in a host (llvm, c) module: the user knows it as `name`.
_FFI_PREFIX = "__tvm_ffi_"
# What ls and prune cover unless stores are picked: the entries of lowerings and of frontends.
LISTED_STORES = (*ENTRY_STORES, FRONTEND_DIR)
# The order of the key's parts (_key.compute_key); entry metadata is sorted JSON, so restore it.
# Payload fields per codec, as the decoder expects them (checked without decoding).
_CODEC_FIELDS = {**CODEC_FIELDS, "failure": 0,
                 **INDEX_CODECS, ENTRY_CODEC: 3}


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One stored entry as the CLI lists it: where it is, its size, and the metadata of its frame."""

    store: str
    key: str
    size: int
    codec: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the frame header could not be read

    @property
    def parts(self) -> dict[str, str]:
        """The named key parts recorded in the entry (empty for failures)."""
        parts = self.meta.get("parts")
        if not isinstance(parts, dict):
            return {}
        rank = {name: i for i, name in enumerate(PART_NAMES)}
        return {n: parts[n] for n in sorted(parts, key=lambda n: (rank.get(n, len(rank)), n))}

    @property
    def created(self) -> float | None:
        """When the entry was written (seconds since the epoch)."""
        value = self.meta.get("created")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def codegen(self) -> str | None:
        """The codegen that made the entry ('tilelang' for the frontend's entries)."""
        return self.meta.get("codegen") or (FRONTEND_DIR if self.store == FRONTEND_DIR else None)

    @property
    def functions(self) -> list[str]:
        """The user's names of the entry's functions (an llvm symbol `__tvm_ffi_scale` is `scale`)."""
        names = self.meta.get("func_names") or []
        return [n.removeprefix(_FFI_PREFIX) if isinstance(n, str) else str(n) for n in names]

    @property
    def target(self) -> str:
        """A short target description, e.g. 'cuda sm_90' or 'llvm'."""
        context = self.meta.get("context")  # a frontend entry's resolved target
        stored = context.get("target") if isinstance(context, dict) else None
        return (target_summary(self.parts.get("target")) or target_summary(stored if isinstance(stored, str) else None)
                or str(self.meta.get("target_kind", "?")))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (key parts included)."""
        created = self.created
        return {
            "key": self.key,
            "store": self.store,
            "size": self.size,
            "codec": self.codec,
            "codegen": self.codegen,
            "mode": self.meta.get("mode", self.store if self.store in ENTRY_STORES else None),
            "target": self.target if self.store != "failures" else None,
            "target_kind": self.meta.get("target_kind"),
            "module_kind": self.meta.get("module_kind"),
            "functions": self.functions,
            "func_names": self.meta.get("func_names", []),
            "codegen_seconds": self.meta.get("build_seconds"),
            "created": created,
            "age_seconds": None if created is None else max(0.0, time.time() - created),
            "parts": self.parts,
            "error": self.error,
            **({"error_type": self.meta.get("error_type"), "message": self.meta.get("message")}
               if self.store == "failures" else {}),
        }


def target_summary(canonical: str | None) -> str:
    """'cuda sm_90' from a canonical target JSON string ('' if unreadable)."""
    if not canonical:
        return ""
    try:
        target = json.loads(canonical)
    except ValueError:
        return ""
    if not isinstance(target, dict):
        return ""
    words = [str(target.get("kind", "?"))]
    for attr in ("arch", "mcpu", "model"):
        value = target.get(attr)
        if value:
            words.append(str(value) if attr == "arch" else f"-{attr}={value}")
    return " ".join(words)


def open_store(cache, name: str) -> ArtifactStore | PlainFiles | None:
    """The store `name` of the cache, or None when it was never written (looking creates nothing)."""
    if name == FRONTEND_DIR:
        directory = cache.directory / FRONTEND_DIR
        return PlainFiles(directory) if directory.is_dir() else None
    return cache.store(name) if (cache.directory / name).is_dir() else None


def _open_stores(cache, names: Iterable[str]) -> Iterator[tuple[str, ArtifactStore | PlainFiles]]:
    for name in names:
        store = open_store(cache, name)
        if store is not None:
            yield name, store


def _entry(name: str, key: str, blob: bytes) -> StoredItem:
    try:
        codec, meta = read_meta(blob)
    except ArtifactError as err:
        return StoredItem(name, key, len(blob), error=str(err))
    return StoredItem(name, key, len(blob), codec, meta)


def read_entry(store: ArtifactStore | PlainFiles, name: str, key: str) -> StoredItem | None:
    """The entry under `key` (None: gone); one that cannot be read is a StoredItem with its error."""
    try:
        blob = store.get(key)
    except (ArtifactError, *STORAGE_ERRORS) as err:
        return StoredItem(name, key, 0, error=f"cannot be read ({type(err).__name__}: {err})")
    return None if blob is None else _entry(name, key, blob)


def iter_entries(cache, stores: Iterable[str] = ENTRY_STORES) -> Iterator[StoredItem]:
    """Every readable entry of the named stores (expired ones are skipped)."""
    for name, store in _open_stores(cache, stores):
        for key in list(store.keys()):
            entry = read_entry(store, name, key)
            if entry is not None:
                yield entry


def find_entries(cache, prefix: str, stores: Iterable[str] = ALL_STORES) -> list[StoredItem]:
    """Entries whose key starts with `prefix` (case-insensitive)."""
    prefix = prefix.strip().lower()
    found = []
    for name, store in _open_stores(cache, stores):
        for key in list(store.keys()):
            if key.startswith(prefix):
                entry = read_entry(store, name, key)
                if entry is not None:
                    found.append(entry)
    return found


def _problem(store: str, key: str, blob: bytes) -> str | None:
    """Why the entry is bad, or None when its frame, checksum and key are sound."""
    try:
        art = unframe(blob)
    except ArtifactError as err:
        return str(err)
    expected = _CODEC_FIELDS.get(art.codec)
    if expected is None:
        return f"unknown codec {art.codec!r}"
    if store == FRONTEND_DIR:
        return entry_problem(art, key)  # what a hit checks
    if len(art.fields) != expected:
        return f"{art.codec} entry has {len(art.fields)} payload fields, expected {expected}"
    if art.meta.get("key") != key:
        return f"entry is stored under {key[:16]} but its metadata names key {str(art.meta.get('key'))[:16]}"
    if store in ENTRY_STORES and art.meta.get("mode", store) != store:
        return f"a {art.meta.get('mode')} entry in {store}/"
    return None


def verify_entries(cache, *, fix: bool = False, stores: Iterable[str] = ALL_STORES) -> dict[str, Any]:
    """Check framing, checksum and key of every entry, and that each compiled model's weights are all
    there (a model is served whole or not at all); with fix, delete the bad ones."""
    checked, bad = 0, []
    models: list[tuple[ArtifactStore, str, list[str]]] = []  # (store, model key, the chunks it names)
    chunks: set[str] = set()  # the sound weights chunks
    for name, store in _open_stores(cache, stores):
        try:
            keys = list(store.keys())
        except ArtifactError as err:  # a row only unpickling could read: not ours
            bad.append({"store": name, "key": None, "problem": str(err), "removed": False})
            continue
        for key in keys:
            try:
                blob = store.get(key)
            except (ArtifactError, *STORAGE_ERRORS) as err:
                problem: str | None = f"cannot be read ({type(err).__name__}: {err})"
            else:
                if blob is None:
                    continue  # expired or removed meanwhile
                problem = _problem(name, key, blob)
                if problem is None and name == "compiled":
                    _note_model_parts(store, key, blob, models, chunks)
            checked += 1
            if problem is not None:
                removed = bool(fix and store.delete(key))
                bad.append({"store": name, "key": key, "problem": problem, "removed": removed})
    for store, key, named in models:
        missing = [d for d in named if d not in chunks]
        if missing:
            removed = bool(fix and store.delete(key))
            bad.append({"store": "compiled", "key": key, "removed": removed,
                        "problem": f"compiled model names {len(missing)} weights chunk(s) not stored or bad "
                                   f"({missing[0][:16]}...): it is a miss"})
    return {"checked": checked, "bad": bad, "removed": sum(1 for b in bad if b["removed"])}


def _note_model_parts(store: ArtifactStore, key: str, blob: bytes, models: list, chunks: set[str]) -> None:
    """Note a sound weights chunk, or the chunks a compiled model names (checked once every entry was read)."""
    codec, meta = read_meta(blob)
    if codec == TENSOR_CODEC:
        chunks.add(key)
    elif codec == MODEL_CODEC and isinstance(meta.get("weights"), list):
        models.append((store, key, [c[2] for c in meta["weights"] if isinstance(c, list) and len(c) == 3]))


def _volume(cache, names: Iterable[str]) -> int:
    return sum(store.volume() for _name, store in _open_stores(cache, names))


def prune(cache, *, max_size: int | None = None, older_than: float | None = None,
          stores: Iterable[str] = ENTRY_STORES, now: float | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Remove entries not used for `older_than` seconds, then the least recently used until the stores fit `max_size`.

    `max_size` is one budget for the named stores together (by default the lowerings' entries and
    the frontend's), the least recently used entry of any of them going first (a frontend entry's
    last use is when it was written). dry_run: what would go, removing nothing.
    """
    stores = tuple(stores)
    now = time.time() if now is None else now
    before = _volume(cache, stores)
    expired = 0 if dry_run else sum(store.expire() for _name, store in _open_stores(cache, ALL_STORES))
    removed, freed = [], 0
    by_store = dict(_open_stores(cache, stores))
    used = {(name, key): when for name, store in by_store.items() if isinstance(store, ArtifactStore)
            for key, _size, _tag, when in store.by_use()}
    last_use = lambda e: used.get((e.store, e.key)) or e.created or 0.0  # noqa: E731
    entries = sorted(iter_entries(cache, stores), key=last_use)
    remove = (lambda entry: True) if dry_run else (lambda entry: by_store[entry.store].delete(entry.key))
    if older_than is not None:
        cutoff = now - older_than
        for entry in entries:
            if last_use(entry) and last_use(entry) < cutoff and remove(entry):
                removed.append(entry)
                freed += entry.size
    if max_size is not None:
        gone = {(e.store, e.key) for e in removed}
        # StoredItem sizes estimate what deleting frees; the stores' SQLite files shrink with them
        # (diskcache runs with auto_vacuum), so the volume measured after is close.
        excess = before - freed - max_size
        for entry in entries:
            if excess <= 0:
                break
            if (entry.store, entry.key) not in gone and remove(entry):
                removed.append(entry)
                freed += entry.size
                excess -= entry.size
    return {
        "removed": len(removed),
        "expired": expired,
        "freed_bytes": freed,
        "bytes_before": before,
        "bytes_after": before - freed if dry_run else _volume(cache, stores),
        "keys": [e.key for e in removed],
        "dry_run": dry_run,
    }
