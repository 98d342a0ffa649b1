"""What filesystem a cache directory lives on, and whether the cache is safe there.

SQLite (under diskcache) relies on POSIX byte-range locks and shared memory for its WAL;
on NFS, SMB, 9p and FUSE filesystems those are missing or unreliable, so two hosts (or even
two processes) can corrupt the index. `probe()` reads /proc/self/mounts and reports the mount
that holds a path; `CodegenCache` warns once per directory when it is on such a filesystem.
The recommendation: a local cache directory per host, shared across hosts through the Redis
remote tier (CODEGEN_CACHE_REMOTE).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from typing import NamedTuple

from .._artifacts import SCRATCH_PREFIX
from .._log import warn_once
from .._validate import check_path
from ._faults import ensure_dir, share_file_mode

__all__ = ["NETWORK_FS_TYPES", "FsReport", "on_block_device", "probe", "scratch_dir", "sweep_leftovers",
           "warn_if_unsafe"]

logger = logging.getLogger(__name__)

# Filesystem types on which SQLite's locking is not reliable (network, cluster, shared folders).
# Every FUSE filesystem ("fuse", "fuse.sshfs", "fuse.s3fs", ...) counts too, except fuseblk
# (a local block device such as NTFS through ntfs-3g).
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre",
    "gpfs", "afs", "openafs", "davfs", "ncpfs", "ncp", "coda", "beegfs", "orangefs", "pvfs2",
    "panfs", "vboxsf", "vmhgfs", "fuse",
})
MOUNTS_FILE = "/proc/self/mounts"
# Below this much free space a cache of compiled kernels soon stops storing.
LOW_SPACE_BYTES = 256 << 20
RECOMMENDATION = (
    "SQLite is not safe on network filesystems: use a local cache directory on each host "
    "(CODEGEN_CACHE_DIR) and share entries across hosts with the Redis remote tier "
    "(CODEGEN_CACHE_REMOTE); see docs/reliability.md"
)
# Scratch files live seconds (a link, a dlopen); older ones were left by killed processes.
SCRATCH_MAX_AGE = 3600.0
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class FsReport(NamedTuple):
    """The mount holding a path: its type, flags, free space and what to worry about."""

    fs_type: str
    mount_point: str
    is_network: bool
    read_only: bool
    noexec: bool
    free_bytes: int | None
    warnings: Sequence[str] = ()


def _unescape(text: str) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as \040, \011, \012, \134.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def _read_mounts(mounts_file: str) -> list[tuple[str, str, set[str]]]:
    rows = []
    try:
        with open(mounts_file, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError as err:
        logger.debug("cannot read %s: %s", mounts_file, err)
        return rows
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            point = _unescape(parts[1]) if "\\" in parts[1] else parts[1]
            rows.append((point, parts[2], set(parts[3].split(","))))
    return rows


def _existing(path: str) -> str:
    """`path` resolved, or its nearest existing ancestor (a cache dir may not exist yet)."""
    current = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _is_network(fs_type: str) -> bool:
    return fs_type in NETWORK_FS_TYPES or (fs_type.startswith("fuse.") and fs_type != "fuseblk")


def _contains(mount_point: str, path: str) -> bool:
    return path == mount_point or mount_point == "/" or path.startswith(mount_point.rstrip("/") + "/")


def probe(path: str | os.PathLike[str], *, mounts_file: str | None = None) -> FsReport:
    """Report the filesystem that holds `path` (or would hold it, if it does not exist yet)."""
    where = _existing(check_path("path", path))
    best: tuple[str, str, set[str]] | None = None
    for mount_point, fs_type, options in _read_mounts(mounts_file or MOUNTS_FILE):
        # The longest mount point that contains the path wins; a later line for the same
        # mount point is a mount on top of the earlier one.
        if _contains(mount_point, where) and (best is None or len(mount_point) >= len(best[0])):
            best = (mount_point, fs_type, options)
    mount_point, fs_type, options = best if best is not None else ("/", "unknown", set())
    try:
        vfs = os.statvfs(where)
        # A pseudo filesystem (proc, sysfs) has no blocks at all: its free space means nothing.
        free: int | None = vfs.f_bavail * vfs.f_frsize if vfs.f_blocks else None
    except OSError:
        free = None
    is_network = _is_network(fs_type)
    # access() honours a read-only mount even for root, who bypasses the mode bits.
    read_only = "ro" in options or (os.path.isdir(where) and not os.access(where, os.W_OK | os.X_OK))
    noexec = "noexec" in options
    warnings = []
    if is_network:
        warnings.append(f"{where} is on a {fs_type} filesystem (mounted at {mount_point}). {RECOMMENDATION}")
    if read_only:
        warnings.append(f"{where} is not writable: the cache serves existing entries but stores nothing new")
    if noexec:
        warnings.append(
            f"{mount_point} is mounted noexec: compiled llvm entries cannot be loaded from the cache's "
            f"tmp/ there; the cache loads them from the system temp directory instead"
        )
    if free is not None and free < LOW_SPACE_BYTES:
        warnings.append(f"only {free >> 20} MiB free on {mount_point}: stores will be skipped when it fills")
    return FsReport(fs_type, mount_point, is_network, read_only, noexec, free, warnings)


def on_block_device(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is on a filesystem with a block device of its own (major device number not 0).

    Such a filesystem is local: the kernel numbers a filesystem without a block device with an
    anonymous device, major 0 (tmpfs, overlayfs, btrfs subvolumes, and every one of
    NETWORK_FS_TYPES); fuseblk, FUSE on a block device, is local here too. False where `path`
    cannot be stat'ed.
    """
    try:
        return os.major(os.stat(path).st_dev) != 0
    except (OSError, AttributeError):  # AttributeError: a platform without os.major
        return False


def warn_if_unsafe(directory: str | os.PathLike[str]) -> FsReport | None:
    """Probe a cache directory; warn (once per directory and process) on a network filesystem."""
    report = probe(directory)
    if report.is_network:
        warn_once(logger, ("network-fs", os.path.realpath(os.fspath(directory))), "codegen cache: %s",
                  report.warnings[0])
    return report


def sweep_leftovers(directory: str, max_age: float = SCRATCH_MAX_AGE) -> int:
    """Remove the cache's own leftovers (names starting 'cgc-') older than `max_age` s; how many went.

    Only names with the cache's prefix, never through a symlink: a file or link someone else put
    in the directory is not the cache's to delete.
    """
    removed = 0
    cutoff = time.time() - max_age
    try:
        with os.scandir(directory) as scan:
            entries = [e for e in scan if e.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return 0
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if info.st_mtime > cutoff or info.st_uid != os.geteuid():
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path)  # never follows symlinks inside
            elif stat.S_ISREG(info.st_mode):
                os.unlink(entry.path)
            else:
                continue
            removed += 1
        except OSError as err:  # another process swept it first
            logger.debug("cannot remove scratch leftover %s: %s", entry.path, err)
    if removed:
        logger.info("removed %d scratch leftovers older than %.0fs from %s", removed, max_age, directory)
    return removed


def _mounted_noexec(path: str) -> bool:
    flag = getattr(os, "ST_NOEXEC", None)
    if flag is None:
        return probe(path).noexec  # no such statvfs flag on this platform: the mount table says
    return bool(os.statvfs(path).f_flag & flag)


def scratch_dir(preferred: str | os.PathLike[str], *, max_age: float = SCRATCH_MAX_AGE,
                root: str | os.PathLike[str] | None = None, make_root: bool = True, sweep: bool = True) -> str:
    """A directory for temporary files that are written and dlopen'ed.

    `preferred` (created if needed) when it can be written and is not on a noexec mount
    (dlopen fails there, which would make every cached llvm library look corrupt); else the
    system temp directory. Leftovers of killed processes older than `max_age` are removed
    (sweep=False: the caller sweeps them later, off a hit's path).
    `root`: the cache directory `preferred` lies in (no link below it is followed; make_root=False:
    a removed one is not made again, the system temp directory is used).
    """
    path = os.fspath(preferred)
    try:
        ensure_dir(path, root, make_root=make_root)
        share_file_mode(path)
        # In a world-writable, non-sticky directory anyone could swap a library between our
        # write and the dlopen.
        mode = os.stat(path).st_mode
        shared = bool(mode & stat.S_IWOTH) and not mode & stat.S_ISVTX
        # noexec from the mount's flags (one statvfs), not from reading the mount table.
        usable = not shared and os.access(path, os.W_OK | os.X_OK) and not _mounted_noexec(path)
    except OSError:
        usable = False
    if not usable:
        fallback = tempfile.gettempdir()
        logger.debug("scratch directory %s is unwritable, noexec or world-writable; using %s", path, fallback)
        return fallback
    if sweep:
        sweep_leftovers(path, max_age)
    return path
