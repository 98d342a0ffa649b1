"""The `tvm_install` key part: what is installed of tvm and tvm_ffi, not only their version strings.

A TVM developer's checkout, an editable install or a patched wheel keeps its version string
while its Python sources or its libraries change; a whole compile runs that code, so its key
holds a digest of the contents of every Python source and shared library of both packages.

Hashing them costs a few hundred milliseconds, so it is done once per install and remembered in
`installs.json` of the user's `codegen-cache-tvm` cache directory (_config.tvm_state_directory) with each file's size and modification time, as ccache checks a compiler
by its size and mtime. A process re-checks only the files it runs: the source of every tvm and
tvm_ffi module it imported, and the shared libraries. Where one differs from what was remembered
the digest is taken again. That is exact for this process's compiles: a file it did not import
did not take part in them. An edited file gives a new digest; reverting the edit gives the old
digest again, and so the old entries.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

import xxhash

from .._compat import tvm, tvm_ffi
from .._forksafe import renew_after_fork
from .._log import warn_once

__all__ = ["install_part", "write_json"]

logger = logging.getLogger(__name__)

_SUFFIXES = (".py", ".so", ".dylib", ".dll")
_FILE = "installs-2.json"  # the version: how a file's stats are written
_lock = threading.Lock()
renew_after_fork(globals(), "_lock", threading.Lock)


def _roots() -> tuple[str, ...]:
    return tuple(os.path.dirname(os.path.abspath(module.__file__)) for module in (tvm, tvm_ffi))


def _package_files(root: str) -> list[str]:
    """Every source and shared library under `root`, relative, sorted (no __pycache__, no links)."""
    found = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith(_SUFFIXES) and entry.is_file(follow_symlinks=False):
                    found.append(entry.path[len(root) + 1:])
    return sorted(found)


def _run_files(roots: tuple[str, ...]) -> dict[str, list[str]]:
    """root -> the files under it this process runs that were not looked at before: the sources of
    modules imported since, and the shared libraries mapped now where one was."""
    prefixes = tuple(root + os.sep for root in roots)
    names = sys.modules.keys() - _looked_at
    _looked_at.update(names)
    # Modules of the two packages are named after them (tvm.*, tvm_ffi.*): only those are looked at.
    paths = [path for name in names if name.startswith("tvm")
             if isinstance(path := getattr(sys.modules.get(name), "__file__", None), str) and path.startswith(prefixes)]
    if paths or not _looked_at_maps:
        # A module of tvm or tvm_ffi imported since may have loaded a library of theirs.
        paths.extend(path for path in _loaded_libraries() if path.startswith(prefixes))
        _looked_at_maps.append(True)
    files: dict[str, list[str]] = {root: [] for root in roots}
    for path in paths:
        for root, prefix in zip(roots, prefixes):
            if path.startswith(prefix):
                files[root].append(path[len(prefix):])
                break
    return files


_looked_at: set[str] = set()  # the names in sys.modules _run_files looked at
_looked_at_maps: list[bool] = []


def _loaded_libraries() -> set[str]:
    """The shared libraries mapped into this process (Linux's /proc/self/maps); elsewhere every
    library of the two packages."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return {os.path.join(root, p) for root in _roots() for p in _package_files(root) if not p.endswith(".py")}


def _stat(root: str, relative: str) -> str | None:
    """A file's size and mtime as installs.json keeps them ("size-mtime_ns": a string decodes fast)."""
    try:
        st = os.stat(os.path.join(root, relative))
    except OSError:
        return None
    return f"{st.st_size}-{st.st_mtime_ns}"


def _digest(root: str) -> tuple[str, dict[str, str]]:
    """The content digest of every source and library under `root`, with the stats taken before reading."""
    digest = xxhash.xxh3_128()
    stats = {}
    for relative in _package_files(root):
        stat = _stat(root, relative)
        if stat is None:
            continue
        stats[relative] = stat
        digest.update(f"{len(relative)}:{relative}".encode())
        hasher = xxhash.xxh3_128()
        with open(os.path.join(root, relative), "rb") as f:
            while chunk := f.read(1 << 22):
                hasher.update(chunk)
        digest.update(hasher.digest())
    return digest.hexdigest(), stats


def _read(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict, what: str) -> bool:
    """Replace `path` with `data` as JSON (a temporary file renamed over it); False, warned once, where
    it cannot be written (`what` names what is not kept)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(temporary, path)
        return True
    except OSError as err:
        warn_once(logger, ("tvm-state-file", str(path)), "codegen cache: cannot keep %s in %s (%s); it is "
                  "taken again in the next process", what, path, err)
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return False


class _Checked:
    """One root as this process checked it: the digest, and the files checked against it."""

    __slots__ = ("digest", "files")

    def __init__(self, digest: str, files: set[str]) -> None:
        self.digest = digest
        self.files = files


_checked: dict[str, _Checked] = {}
_last: list = [-1, ""]  # len(sys.modules) at the last call, and its answer


def install_part(directory: Path | None) -> str:
    """The digest of the installed tvm and tvm_ffi this process runs (module docstring).

    Each file is checked once per process, as it is first run (imported): the code a process
    runs does not change when its file does later.
    """
    with _lock:
        if _last[0] == len(sys.modules):
            return _last[1]
        remembered = None
        parts = []
        roots = _roots()
        run = _run_files(roots)
        for root in roots:
            held = _checked.get(root)
            new = [f for f in run[root] if held is None or f not in held.files]
            if held is None or new:
                if remembered is None:
                    remembered = _read(directory / _FILE) if directory is not None else {}
                entry = remembered.get(root)
                checked = held.files | set(new) if held is not None else set(new)
                found = _recall(entry, root, new)
                if found is None or (held is not None and found != held.digest):
                    found, stats = _digest(root)
                    remembered[root] = {"digest": found, "files": stats}
                    if directory is not None:
                        write_json(directory / _FILE, remembered, "the TVM install's digest")
                held = _checked[root] = _Checked(found, checked)
            parts.append(held.digest)
        _last[:] = [len(sys.modules), "-".join(parts)]
        return _last[1]


def _recall(entry: object, root: str, relatives: list[str]) -> str | None:
    """The remembered digest where every file of `relatives` still has the size and mtime it had."""
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict) or not isinstance(entry.get("digest"), str):
        return None
    files, prefix = entry["files"], root + os.sep
    for relative in relatives:
        kept = files.get(relative)
        try:
            st = os.stat(prefix + relative)
        except OSError:
            return None
        if kept != f"{st.st_size}-{st.st_mtime_ns}":
            return None
    return entry["digest"]
