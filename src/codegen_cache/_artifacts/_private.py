"""Private copies of checked bytes, for loaders that need a file (dlopen): what runs is what was checked.

A stored shared library is read into memory and its checksum and key are checked there. Loading
it afterwards from the file it was read from would load whatever that file holds by then:
another process can rename a different library over the path between the check and the load,
overwrite it in place, or truncate it after the load (the next page fault of the mapped library
is a SIGBUS). So the loader gets a copy made from the checked bytes that no other process can
change:

- `load_private_copy`: a memfd sealed against writes and size changes (F_SEAL_WRITE,
  F_SEAL_SHRINK, F_SEAL_GROW), loaded through `/proc/self/fd/N` (spelled anew each time:
  `fd_path`), and kept for loads of the same bytes later in the process. Where memfds cannot be mapped
  executable (`vm.memfd_noexec`) or are missing, a file in the scratch directory that is
  unlinked before its first byte is written, loaded through its descriptor the same way: no
  path ever reaches it.
- `private_file`: for loaders that want a real file name (tilelang's, which pick the loader
  by the name's extension): a read-only file made with O_EXCL in the scratch directory under a
  name only this process uses, kept for the process's lifetime (a kernel may read its library's
  path again) and removed at exit.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import fcntl
import itertools
import os
import tempfile
import threading
from collections.abc import Callable
from typing import TypeVar

import xxhash

from .._forksafe import renew_after_fork

__all__ = ["SCRATCH_PREFIX", "fd_path", "load_private_copy", "private_file"]

# Every scratch file and directory the cache makes starts with this: the sweep of leftovers
# removes only names with it, so files the cache did not create are never touched.
SCRATCH_PREFIX = "cgc-"

T = TypeVar("T")

_PROC_FD = "/proc/self/fd"
_SEALS = (getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
          | getattr(fcntl, "F_SEAL_WRITE", 0) | getattr(fcntl, "F_SEAL_SEAL", 0))
# Whether this process can load from a memfd: None until the first load says.
_memfd_loads: list[bool | None] = [None]


def load_private_copy(data: bytes | memoryview, scratch: str, load: Callable[[str], T]) -> T:
    """load(path) where path names a file holding exactly `data` that no other process can change."""
    memfd_failed = False
    if _memfd_loads[0] is not False:
        digest = xxhash.xxh3_64_intdigest(data)
        fd, kept = _kept_copy(data, digest)
        if fd is not None:
            try:
                found = load(fd_path(fd))
            except (RuntimeError, OSError):
                if _memfd_loads[0]:
                    raise  # memfds load here: it is the library that does not
                memfd_failed = True  # noexec memfds, or a bad library: the scratch file tells which
            else:
                _memfd_loads[0] = True
                if not kept:
                    _keep(data, fd, digest)
                    fd = None
                return found
            finally:
                if fd is not None and not kept:
                    os.close(fd)
    found = _load_unlinked(data, scratch, load)
    if memfd_failed:
        _memfd_loads[0] = False  # the file loads where the memfd did not: memfds are not tried again
    return found


# Sealed copies stay open after their load (at most _KEPT of them, _KEPT_BYTES in all, the least
# recently used closed first): loading the same bytes again in this process (the memory tier
# evicted the module, another cache object, a fresh module for codegen_cache.build) maps the
# same sealed file instead of writing a new one. A copy is reused only for bytes equal to it,
# compared with what the sealed file holds (it cannot change): the process keeps no second copy
# of a library in its own memory.
_KEPT, _KEPT_BYTES = 32, 64 << 20
_kept: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()  # xxh3-64 -> (size, fd)
_kept_lock = threading.Lock()
renew_after_fork(globals(), "_kept_lock")


def _kept_copy(data: bytes | memoryview, digest: int) -> tuple[int | None, bool]:
    """(descriptor of a sealed memfd holding `data`, whether it is a kept one); (None, False) without memfds.

    `digest`: xxh3-64 of `data`.
    """
    with _kept_lock:
        found = _kept.get(digest)
        # bytes against bytes: a memoryview compares item by item, 30 times slower than the copy.
        if found is not None and found[0] == len(data) and \
                os.pread(found[1], found[0], 0) == (data if isinstance(data, bytes) else bytes(data)):
            _kept.move_to_end(digest)
            return found[1], True
    return _sealed_memfd(data), False


def _keep(data: bytes | memoryview, fd: int, digest: int) -> None:
    with _kept_lock:
        old = _kept.pop(digest, None)
        _kept[digest] = (len(data), fd)
        held = sum(size for size, _fd in _kept.values())
        while _kept and (len(_kept) > _KEPT or held > _KEPT_BYTES):
            size, dropped = _kept.popitem(last=False)[1]
            held -= size
            os.close(dropped)
    if old is not None:
        os.close(old[1])


def _load_unlinked(data: bytes | memoryview, scratch: str, load: Callable[[str], T]) -> T:
    fd, name = tempfile.mkstemp(prefix=SCRATCH_PREFIX, suffix=".so", dir=scratch)
    try:
        if os.path.isdir(_PROC_FD):
            os.unlink(name)  # from before the first byte, reachable only through the descriptor
            name = None
        _write_all(fd, data)
        return load(fd_path(fd) if name is None else name)
    finally:
        os.close(fd)
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)


_loads = itertools.count(1)


def fd_path(fd: int) -> str:
    """`/proc/self/fd/<fd>`, spelled differently on every call (extra "/" and "/." components).

    glibc's dlopen first looks for a loaded library whose name equals the name asked for, and
    returns that one without opening anything. Descriptor numbers are reused, so the plain
    name of a new copy can be the name of one still loaded: the old library would be served.
    Each call's name is unique in the process: the binary digits of a counter, written as "/"
    (0) and "/." (1) after /proc, which the kernel resolves to /proc itself.
    """
    digits = format(next(_loads), "b").replace("1", "\0").replace("0", "/").replace("\0", "/.")
    return f"/proc{digits}/self/fd/{fd}"


_memfd_create = getattr(os, "memfd_create", None) if hasattr(fcntl, "F_ADD_SEALS") else None


def _sealed_memfd(data: bytes | memoryview) -> int | None:
    """A memfd holding `data`, sealed against every change; None where memfds are not available."""
    if _memfd_create is None:
        return None
    try:
        fd = _memfd_create("codegen-cache", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        _write_all(fd, data)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        return None
    return fd


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def private_file(data: bytes | memoryview, scratch: str, name: str) -> str:
    """The path of a new read-only file holding `data`, ending in `name`, in the scratch directory.

    Made with O_EXCL under a name no other process uses (this process's id, a random part drawn
    once, a counter); the scratch directory is one nobody but the user (or the team that shares
    the cache, who may store entries anyway) can change, or a sticky one, where nobody else can
    rename it. It stays until the process exits (whoever loaded it may open the path again), then
    it is removed; a killed process's are swept with the other leftovers (`SCRATCH_PREFIX`).
    """
    if os.sep in name or name in ("", ".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    while True:
        path = os.path.join(scratch, f"{SCRATCH_PREFIX}{_own_prefix()}-{next(_own_files)}-{name}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
            break
        except FileExistsError:
            continue  # planted by someone who guessed the name: the next one
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    with _own_lock:
        _own_paths.append(path)
    return path


# No directory of the process's own: its first mkdir would be paid by a fresh process's first
# hit (docs/benchmarks.md at 5788f7c, "Figures behind code comments").
_own_files = itertools.count()
_own_paths: list[str] = []  # this process's private files, removed at its exit
_own_pid: list[tuple[int, str]] = []  # [(pid, the names' prefix)]: drawn anew in a child of fork
_own_lock = threading.Lock()
renew_after_fork(globals(), "_own_lock")


def _own_prefix() -> str:
    pid = os.getpid()
    with _own_lock:
        if not _own_pid or _own_pid[0][0] != pid:
            if _own_pid:
                _own_paths.clear()  # in a child of fork: the parent's files are the parent's to remove
            else:
                atexit.register(_remove_own)
            _own_pid[:] = [(pid, f"{pid}-{os.urandom(4).hex()}")]
        return _own_pid[0][1]


def _remove_own() -> None:
    if not _own_pid or _own_pid[0][0] != os.getpid():
        return  # a child of fork inherits the registration, not the files
    for path in _own_paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
