"""Whether code may be loaded from a cache directory: the rule of git's safe.directory, for a cache.

Compiled entries are shared libraries that a hit loads into the user's process, so whoever can
change a cache directory can make its users run their code. Before anything is loaded from a
directory, it and its parents must be safe from other users, checked from the directory upward:

- each is owned by the user or by root, or it is a setgid directory of a group the user is in
  (the team cache of docs/reliability.md: `chmod 2775`, members with `umask 002`);
- none is writable by the world, nor by a group, unless the user is in that group and the
  directory is setgid (deliberately shared), or the group is the user's own private group (a
  group of one: the usual `umask 002` systems); a sticky parent such as /tmp may be (there only
  an entry's owner may rename it), the cache directory itself may not, even when the user owns it;
- a symlink on the way is followed, and the directories it leads to are checked the same way.

The walk ends at the first parent that is the user's own or root's, or sticky: above it nobody
else can move what lies below. Root is not special (git's rule): a directory another user owns
is not root's to trust. An administrator trusts a directory explicitly with the setting
`trusted_dirs` (CODEGEN_CACHE_TRUSTED_DIRS): a path, `<path>/*` for everything below it, or `*`.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import stat
from collections.abc import Iterable, Iterator
from typing import NamedTuple

__all__ = ["Untrusted", "is_trusted_by_setting", "untrusted"]


class Untrusted(NamedTuple):
    """Why nothing is loaded from a cache directory: which directory, who owns it, what is wrong."""

    directory: str
    owner: str
    reason: str

    def __str__(self) -> str:
        return f"{self.directory} (owned by {self.owner}) {self.reason}"


def untrusted(cache_dir: str | os.PathLike[str], trusted_dirs: Iterable[str] = (),
              inside: Iterable[str] = ()) -> Untrusted | None:
    """Why code must not be loaded from `cache_dir`, or None when it may (module docstring).

    `inside`: subdirectories (relative paths) that entries are read from; those that exist are
    held to the cache directory's own rule.
    """
    path = os.path.abspath(os.fspath(cache_dir))
    real = os.path.realpath(path)
    if trusted_dirs and _named_by_setting((path, real), trusted_dirs):
        return None
    for chain in (_lexical(path), _lexical(real)) if real != path else (_lexical(path),):  # no link: one walk
        found = _check_chain(chain)
        if found is not None:
            return found
    inside = list(inside)
    below: dict[str, int] = {}  # directory -> how many of `inside` lie in it
    for name in inside:
        parent = name.rpartition("/")[0]
        # A plain dict: Counter(generator) checks it against every Mapping registered (TVM
        # registers its own), on a fresh process's first hit (docs/benchmarks.md at 5788f7c).
        below[parent] = below.get(parent, 0) + 1
    # A directory holding several of them is listed once, not asked a failed lstat for each
    # absent one; one holding one (a store's keys/) is not listed: the store's own entries are there.
    present: dict[str, frozenset[str]] = {}
    for name in inside:
        parent, _, leaf = name.rpartition("/")
        if below[parent] > 1:
            if parent not in present:
                present[parent] = _names_in(os.path.join(path, parent) if parent else path)
            if leaf not in present[parent]:
                continue  # absent: made by this cache when needed (ours), or refused if a link then
        sub = os.path.join(path, name)
        try:
            info = os.lstat(sub)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            continue  # a link or a file there is refused where it is opened (never followed)
        problem = _problem(info, cache_dir=True)
        if problem is not None:
            return Untrusted(sub, _owner_name(info.st_uid), problem)
    return None


def _names_in(directory: str) -> frozenset[str]:
    try:
        with os.scandir(directory) as scan:
            return frozenset(entry.name for entry in scan)
    except OSError:
        return frozenset()  # absent or not a directory: nothing below it to check


def is_trusted_by_setting(path: str, trusted_dirs: Iterable[str]) -> bool:
    """Whether the administrator's setting names `path` (itself, a `<dir>/*` above it, or `*`)."""
    return _named_by_setting((os.path.abspath(path), os.path.realpath(path)), trusted_dirs)


def _named_by_setting(candidates: tuple[str, str], trusted_dirs: Iterable[str]) -> bool:
    for entry in trusted_dirs:
        if entry == "*":
            return True
        if entry.endswith(f"{os.sep}*"):
            root = os.path.abspath(os.path.expanduser(entry[:-2]))
            if any(c == root or c.startswith(root.rstrip(os.sep) + os.sep) for c in candidates):
                return True
        elif os.path.abspath(os.path.expanduser(entry)) in candidates:
            return True
    return False


def _lexical(path: str) -> Iterator[str]:
    """`path` and each of its parents, up to the root."""
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _check_chain(chain: Iterator[str]) -> Untrusted | None:
    first = True  # the cache directory, or where it would be made: the nearest existing one
    for path in chain:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # not made yet: whoever may create it is decided by the parents below
        except OSError as err:
            return Untrusted(path, "?", f"cannot be examined ({err.strerror or err})")
        if stat.S_ISLNK(info.st_mode):
            # The link is followed by the second walk (the real path); here its directory counts.
            first = False
            continue
        problem = _problem(info, cache_dir=first)
        if problem is not None:
            return Untrusted(path, _owner_name(info.st_uid), problem)
        if not first and (info.st_uid in (os.geteuid(), 0) or info.st_mode & stat.S_ISVTX):
            return None  # nobody else can move what lies below this directory
        first = False
    return None


def _problem(info: os.stat_result, *, cache_dir: bool) -> str | None:
    uid, mode, gid = info.st_uid, info.st_mode, info.st_gid
    me = os.geteuid()
    shared = bool(mode & stat.S_ISGID) and gid in _my_groups()
    if uid not in (me, 0) and not shared:
        return f"is not owned by you ({_owner_name(me)}) nor a setgid directory of a group of yours"
    if not cache_dir and mode & stat.S_ISVTX:
        return None  # sticky (as /tmp): whoever may write here still cannot move what is ours
    if mode & stat.S_IWOTH:
        return "is writable by every user"
    if mode & stat.S_IWGRP and not shared and not _private_group(gid):
        return f"is writable by group {_group_name(gid)}, which is not a setgid directory of a group of yours"
    return None


@functools.lru_cache(maxsize=8)
def _my_groups_of(uid: int, gid: int) -> frozenset[int]:
    return frozenset([gid, *os.getgroups()])


def _my_groups() -> frozenset[int]:
    return _my_groups_of(os.geteuid(), os.getegid())


@functools.lru_cache(maxsize=32)
def _private_group(gid: int) -> bool:
    """A group of the user's own: named as the user, with no other member (user private groups)."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getegid() and group.gr_name == me and all(member == me for member in group.gr_mem)


def _owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name!r} (gid {gid})"
    except KeyError:
        return f"gid {gid}"
