"""Upgrades of llvm entries (LLVM IR -> shared library) in a helper process, one per cache directory.

Emitting an object file runs LLVM, which aborts the whole process on an I/O error (a full
disk) and may leave C++ threads that abort at exit; linking runs a compiler that Ctrl-C in a
terminal or a Jupyter interrupt would kill with the rest of the process group. So neither
runs in the user's process: lower() stores the LLVM IR at once, drops a marker file in
`<dir>/upgrade/`, and makes sure an upgrader is running. The upgrader is this module run as a
program, in a session of its own, detached (a grandchild: nobody has to wait for it), with the
package's own import path and nothing from the caller's working directory or PYTHON* variables
(_helper.py). It holds
`<dir>/upgrade/.lock` (an flock: at most one per directory and host), upgrades every marked
entry, and exits after IDLE_SECONDS without work. Whoever starts it takes that lock first and
hands the locked descriptor down: when many processes ask at once, one wins the lock and starts
the only upgrader; the others see it held. The upgrader never imports TVM's Python package: it
is given the shared libraries of the TVM its starter has loaded, and this host's LLVM triple,
and calls TVM's LLVM through tvm-ffi's Python API (_compat/_emit.py, _artifacts/_link.py). A marker whose upgrade fails is dropped;
the next process that loads the raw entry marks it again, so a failed or interrupted upgrade
is retried later, and the raw entry serves hits meanwhile. The lock is _upgrade_lock.py's. The
upgrader makes no directory again: a cache directory removed while it works stays removed (it
exits once its directory is gone or replaced).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .._forksafe import on_fork_child
from .._helper import helper_argv, helper_env
from .._log import warn_once
from .._storage._faults import FILE_MODE, ensure_dir, real_dir
from .._storage._layout import STAGED_DIR
from . import _push
from ._upgrade_lock import HELD, marker_dir as _marker_dir, take_lock as _take_lock, wait_exited

__all__ = ["IDLE_SECONDS", "request", "wait_exited", "wait_idle"]

logger = logging.getLogger(__name__)

IDLE_SECONDS = 3.0
_MARKER = re.compile(r"^(compiled|source)\.([0-9a-f]{32})$")
# The launcher forks before it imports anything (the upgrader loads TVM's libraries), so that
# whoever starts it waits for a bare interpreter start only.
# argv: the directory, the descriptor of its upgrade lock (locked by the parent), this host's
# LLVM triple, then the TVM shared libraries to load.
_BOOTSTRAP = (
    "import os, sys\n"
    "if os.fork() > 0:\n    os._exit(0)\n"
    "from codegen_cache._cache._upgrade import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
# wait_idle starts an upgrader at most this often (one that dies at start must not be
# restarted on every poll).
_RESPAWN_SECONDS = 1.0
# Locked descriptors on their way to a launcher: a child forked meanwhile closes its copies,
# or it would hold the lock (it is shared by every copy) and no upgrader would ever start.
_handing: set[int] = set()


def _close_handed() -> None:
    for fd in list(_handing):
        try:
            os.close(fd)
        except OSError:
            pass
    _handing.clear()


on_fork_child(_close_handed)


def request(directory: Path, store: str, digest: str) -> bool:
    """Mark an entry for upgrading and make sure an upgrader runs; False if that failed."""
    markers = _marker_dir(directory)
    try:
        ensure_dir(markers, directory)
        fd = os.open(markers / f"{store}.{digest}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
    except OSError as err:
        logger.debug("codegen cache: cannot mark %s for upgrading: %s", digest[:16], err)
        return False
    # Marker first, then the lock: an upgrader about to exit rescans after releasing its
    # lock, so either it sees this marker or we get its lock and start the next one.
    return _ensure_running(directory)


def _ensure_running(directory: Path) -> bool:
    """Start an upgrader unless one runs; True when one runs now (False: none runs, none could start)."""
    fd = _take_lock(directory)
    if fd is None:
        return False
    if fd == HELD:
        return True
    _handing.add(fd)
    try:
        return _spawn(directory, fd)
    finally:
        # The upgrader holds the lock through its own copy of the descriptor from now on.
        if fd in _handing:
            _handing.discard(fd)
            os.close(fd)


def _spawn(directory: Path, lock_fd: int) -> bool:
    if not sys.executable:
        return False
    try:
        # The launcher forks the upgrader and exits at once; waiting for it reaps it. It runs
        # isolated from the caller's directory and PYTHON* variables (_helper), and the switch
        # stays off there: the upgrader compiles nothing through TVM's entry points.
        launcher = subprocess.run(
            helper_argv(_BOOTSTRAP, str(directory), str(lock_fd), *_tvm_here()),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, pass_fds=(lock_fd,), timeout=60, check=False, env=helper_env(),
        )
    except (OSError, subprocess.SubprocessError) as err:
        warn_once(logger, ("upgrader", str(directory)), "codegen cache: cannot start the llvm upgrader "
                  "(%s); llvm entries stay LLVM IR (slower hits, still correct)", err)
        return False
    return launcher.returncode == 0


def _tvm_here() -> list[str]:
    """This host's LLVM triple, then the TVM shared libraries loaded here (TVM is imported if it is not yet)."""
    from .. import _compat
    from .._compat._emit import tvm_libraries

    host = _compat.host_llvm_triple()
    return [host, *tvm_libraries()]


def wait_idle(directory: Path, timeout: float) -> bool:
    """Until no entry of `directory` is marked for upgrading (or `timeout`); True when none is.

    Returns False at once where no upgrader runs and none can be started (the lock cannot be
    had, the helper does not start): waiting would change nothing.
    """
    deadline = time.monotonic() + timeout
    last_start = -_RESPAWN_SECONDS
    while True:
        if not _marked(directory):
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if now - last_start >= _RESPAWN_SECONDS:
            last_start = now
            if not _ensure_running(directory):
                return False
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _marked(directory: Path) -> list[str]:
    """The markers in `<dir>/upgrade/`, sorted; none where that is missing or not a real directory."""
    markers = _marker_dir(directory)
    try:
        if not real_dir(markers, directory):
            return []
        return sorted(n for n in os.listdir(markers) if _MARKER.match(n))
    except OSError:
        return []


# ---- the upgrader program ------------------------------------------------------------------


def _upgrade_one(directory: Path, store_name: str, digest: str, stores: dict, counters, tvm: list[str]) -> None:
    from .._artifacts._link import upgrade
    from .._errors import ArtifactError
    from .._storage._disk import STORAGE_ERRORS, ArtifactStore
    from .._storage._fsprobe import scratch_dir
    from .._storage._pending import PendingFiles

    store = stores.get(store_name)
    if store is None:
        # The size limit is the store's own setting, kept in its database; this one is unused.
        # Nothing is made again here: a cache directory removed meanwhile stays removed.
        store = stores[store_name] = ArtifactStore(directory / store_name, size_limit=1 << 62, make_root=False)
    staged = PendingFiles(directory / STAGED_DIR / store_name, make_root=False)
    try:
        row = store.read(digest)
        blob = row.blob if row is not None else staged.read(digest)
        if blob is None:
            return
        better = upgrade(blob, scratch_dir(directory / "tmp", root=directory, make_root=False),
                         host_triple=tvm[0], libraries=tvm[1:])
        if better is None:
            return
        # Only over the entry we read, checked and stored in one transaction: a rebuild
        # (recache) may have replaced it meanwhile, and one that is gone (cleared, evicted, its
        # directory removed) is not brought back.
        if store.put(digest, better, over=lambda current: current == blob if current is not None
                     else staged.read(digest) == blob):
            staged.remove(digest, blob)
            counters.add("upgrades")
            _push.upgraded(directory, store_name, digest, better, counters.add)  # the library, for the fleet
    except (ArtifactError, *STORAGE_ERRORS, RuntimeError, ValueError, subprocess.SubprocessError) as err:
        # OSError (in STORAGE_ERRORS) covers a TVM library that does not load and a failed link.
        counters.add("error:upgrade")
        logger.warning("codegen cache: upgrading %s/%s failed: %s", store_name, digest[:16], err)


def _serve(directory: Path, lock: int | None, tvm: list[str]) -> int:
    from .._storage._counters import CounterTable
    try:
        home = os.stat(directory)
    except OSError:
        return 0  # removed before this upgrader started
    if lock is None:
        lock = _take_lock(directory)
        if lock is None or lock == HELD:
            return 0  # another upgrader has this directory, or none can
    else:
        os.set_inheritable(lock, False)  # the linker must not hold it
    stores, counters = {}, CounterTable(directory, make_root=False)
    idle_since = time.monotonic()
    while True:
        if not _same_directory(directory, home):
            return 0  # the cache directory was removed (or replaced): nothing left to upgrade here
        names = _marked(directory)
        for name in names:
            store_name, digest = _MARKER.match(name).groups()  # type: ignore[union-attr]
            _upgrade_one(directory, store_name, digest, stores, counters, tvm)
            try:
                os.unlink(_marker_dir(directory) / name)
            except OSError:
                pass
        if names:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_SECONDS:
            # Its databases closed before the lock goes: whoever waits for the lock (wait_exited)
            # may then remove or replace them, and this process may take long to exit.
            for store in stores.values():
                store.close()
            stores.clear()
            fcntl.flock(lock, fcntl.LOCK_UN)
            if not _marked(directory):
                return 0
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0  # a new upgrader took over the new markers
            idle_since = time.monotonic()
        else:
            time.sleep(0.1)


def _same_directory(directory: Path, home: os.stat_result) -> bool:
    """Whether `directory` is still the directory this upgrader started in (not removed, not replaced)."""
    try:
        now = os.stat(directory)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (home.st_dev, home.st_ino)


def main(argv: list[str]) -> int:
    """The upgrader of the cache directory argv[0], holding the locked descriptor argv[1] (from `request`).

    argv[2]: this host's LLVM triple ('' where unknown); argv[3:]: the TVM libraries to load.
    """
    directory, lock, tvm = Path(argv[0]), int(argv[1]), argv[2:] or [""]
    # LLVM and the linker create their files with the process umask: never world-accessible,
    # whatever umask the process that started the upgrader had (the cache's own files are 0660).
    os.umask(os.umask(0) | 0o007)
    try:
        ensure_dir(directory / "tmp", directory, make_root=False)
        log = os.open(directory / "tmp" / "cgc-upgrader.log",
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        os.dup2(log, 2)  # what LLVM or the linker print too
        os.close(log)
    except OSError:
        pass
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s codegen-cache upgrader %(process)d: %(message)s")
    return _serve(directory, lock, tvm)
