"""The names of the stores in a cache directory, in one place (docs/architecture.md, "What lives in a cache directory"),
and the move of an earlier release's names to them (`migrate`)."""

from __future__ import annotations

import logging
import os
import shutil
import stat

__all__ = ["ALL_STORES", "ENTRY_STORES", "FRONTEND_DIR", "INDEX_CODEC", "INDEX_CODECS", "MODEL_CODEC", "OLD_DIRS",
           "OLD_STORE_NAMES", "STAGED_DIR", "STORE_NAMES", "migrate", "remove_old_dirs", "store_name"]

logger = logging.getLogger(__name__)

# A lowering's entry lives in the store named after its mode (the key's `mode` part).
ENTRY_STORES = ("compiled", "source")
# Every diskcache store: the two above, remembered codegen failures, and the index of whole builds
# (codegen_cache.build's index entries and compiled Relax models).
STORE_NAMES = (*ENTRY_STORES, "failures", "index")
# Entries written but not yet moved into their store: `<dir>/staged/<store>/` (_storage/_pending.py).
STAGED_DIR = "staged"
# Whole-kernel entries of frontends (codegen_cache.tilelang), one plain file each, `<key>.so`:
# a PlainFiles store (_storage/_plain.py).
FRONTEND_DIR = "tilelang"
# Every store the command line reports on.
ALL_STORES = (*STORE_NAMES, FRONTEND_DIR)
# What the index store holds: codegen_cache.build's index entries (no payload field) and
# compiled Relax models (tvm.compile through enable(): one field, the VMExecutable's bytes).
INDEX_CODEC = "build-index"
MODEL_CODEC = "relax-executable"
# Payload fields of each, for the command line's verify.
INDEX_CODECS = {INDEX_CODEC: 0, MODEL_CODEC: 1}

# Renamed by issue 26 ("build" is a whole build, "pending" said nothing of staging): the index
# store was `builds/` and the staged files `pending/` up to the release before this one.
# Store names a tool or the command line may still give, until the next release:
OLD_STORE_NAMES = {"builds": "index"}
# Directories moved on open, in this order (pending/builds/ becomes staged/index/).
OLD_DIRS = (("pending", STAGED_DIR), (f"{STAGED_DIR}/builds", f"{STAGED_DIR}/index"), ("builds", "index"))


def store_name(name: str) -> str:
    """A store's name, its old name (OLD_STORE_NAMES) given as the new one."""
    return OLD_STORE_NAMES.get(name, name)


def migrate(directory: str | os.PathLike[str]) -> None:
    """Give an earlier release's directories in `directory` their new names (OLD_DIRS).

    Only a real directory of this user is moved, and only where the new name is free. One
    rename each: atomic, so the entries inside stay whole and servable. Two processes opening
    the directory at once race safely: the loser's rename fails (the old name is gone, or the
    new one is there) and it uses what the winner moved. Where a move cannot be made (a
    read-only directory, another user's), the old directory stays: its entries miss, none
    breaks; `codegen-cache clear` removes it.
    """
    for old, new in OLD_DIRS:
        src, dst = os.path.join(directory, old), os.path.join(directory, new)
        try:
            info = os.lstat(src)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or os.path.lexists(dst):
                continue  # a link or a file is never followed nor moved; a new store is never replaced
            os.rename(src, dst)
        except FileNotFoundError:
            continue
        except OSError as err:
            logger.debug("codegen cache: cannot move %s to %s: %s", src, dst, err)
            continue
        logger.debug("codegen cache: moved %s to %s (its name before issue 26)", src, dst)


def remove_old_dirs(directory: str | os.PathLike[str]) -> int:
    """Remove what `migrate` could not move (the new name was taken); how many files went.

    Only real directories of this user; shutil.rmtree follows no link below them.
    """
    removed = 0
    for old, _new in reversed(OLD_DIRS):
        path = os.path.join(directory, old)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or not shutil.rmtree.avoids_symlink_attacks:
            continue
        removed += sum(len(files) for _root, _dirs, files in os.walk(path))
        shutil.rmtree(path, ignore_errors=True)
    return removed
