"""Nothing outside the cache is touched: no link inside it is followed, a planted upgrade lock
stops nothing, and a cache directory removed while the upgrader works stays removed.

The attacks of issue 23, each with real processes and real files: a symlink planted (before
first use) at each directory of the cache, leading to a directory outside that holds what a
followed link would write into; `upgrade/.lock` as a symlink, a directory or a FIFO; `rm -rf`
of the cache directory while its llvm entries are being linked.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache._cache import _upgrade
import forked
from processes import remove_tree
from test_lifecycle import _upgraders
from test_reliability import lower_fresh
from time_limits import limit
from workers import variant

TESTS = str(Path(__file__).parent)
DIRECTORIES = ("compiled", "source", "locks", "staged", "upgrade", "tmp", "stats", "failures", "index", "tilelang")

EVERY_STORE = textwrap.dedent("""
    import json, logging, sys
    sys.path.insert(0, {tests!r})
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    import tvm
    import codegen_cache as cc, kernels
    from codegen_cache.tilelang import _frontend
    from workers import variant

    def rejects(mod, target):
        raise ValueError("this codegen rejects every module")

    cache = cc.CodegenCache({directory!r})
    tiers = []
    for compiled in (True, False):  # compiled/ (llvm, upgraded), source/ (LLVM IR text)
        tiers.append(cache.lower_with_outcome(*variant(0), compile_device=compiled)[1].tier)
    try:  # failures/
        cache.lower(*variant(1), codegen=cc.DeviceCodegen("rejects", build=rejects))
    except ValueError:
        pass
    with cc.use_cache(cache):  # index/ (the build index)
        cc.build(kernels.vadd, tvm.target.Target("llvm"))
    # tilelang/: an entry as the frontend writes one (tilelang itself is not needed for that)
    _frontend._write_entry(cache.directory / "tilelang" / ("a" * 32 + ".so"), b"an entry")
    cache.stats()
    done = cache.flush(upgrades=True, timeout=120)
    # As a new process finds the directory: every returned miss must be there.
    fresh = cc.CodegenCache({directory!r}, memory_entries=0)
    again = [fresh.lower_with_outcome(*variant(0), compile_device=c)[1].tier for c in (True, False)]
    print(json.dumps({{"tiers": tiers, "flushed": done, "again": again}}))
""")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path below `root` and the bytes of each file (None for a directory)."""
    found = {}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", DIRECTORIES)
@pytest.mark.slow
def test_a_symlink_planted_at_a_directory_of_the_cache_is_never_followed_and_every_miss_is_stored(
        tmp_path, name):
    directory, outside = tmp_path / "cache", tmp_path / "outside"
    directory.mkdir()
    # What a followed link would write into or read from: store-like directories, a lock file's
    # place, a counter file (never to be folded or removed), an old scratch file (never swept).
    for sub in ("compiled", "source", "xx"):
        (outside / sub).mkdir(parents=True)
    (outside / "precious").write_bytes(b"not the cache's")
    (outside / "host-1-0000abcd.cnt").write_bytes(b"someone else's counters")
    (outside / "cgc-old").write_bytes(b"an old file")
    os.utime(outside / "cgc-old", (time.time() - 7200, time.time() - 7200))
    before = _snapshot(outside)
    (directory / name).symlink_to(outside)
    script = EVERY_STORE.format(tests=TESTS, directory=str(directory))
    # Another process (forked with TVM imported): what it leaves in the directory is the point.
    done = forked.python(["-c", script], timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"tiers": ["codegen", "codegen"], "flushed": True, "again": ["disk", "disk"]}
    assert _snapshot(outside) == before, "something outside the cache was written, read into it, or removed"
    assert (directory / name).is_symlink()  # refused, not removed: it is not the cache's
    warnings = [line for line in done.stderr.splitlines() if str(directory / name) in line]
    assert len(warnings) == 1 and "never follows a link" in warnings[0], done.stderr[-3000:]
    # Every returned miss was stored: a new process is served both from the disk.
    for compiled in (True, False):
        assert lower_fresh(directory, 0, compiled)[0] == "disk", (name, compiled)
    assert _snapshot(outside) == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("planted", ["symlink", "directory", "fifo"])
def test_an_upgrade_lock_that_is_not_a_regular_file_is_moved_aside_and_upgrades_go_on(tmp_path, planted):
    directory, target = tmp_path / "cache", tmp_path / "elsewhere"
    (directory / "upgrade").mkdir(parents=True)
    lock = directory / "upgrade" / ".lock"
    if planted == "symlink":
        target.write_bytes(b"not a lock")
        lock.symlink_to(target)
    elif planted == "directory":
        lock.mkdir()
        (lock / "inside").write_bytes(b"not the cache's")
    else:
        os.mkfifo(lock)
    cache = cc.CodegenCache(directory, write_behind=False)
    cache.lower(*variant(2), compile_device=True)
    assert cache.flush(upgrades=True, timeout=120)  # before: False, after the whole timeout
    digest = cache.key_for(*variant(2)).digest
    assert b"llvm-so" in cache.store("compiled").get(digest)[-64:]  # linked into a shared library
    assert stat.S_ISREG(os.lstat(lock).st_mode)
    (aside,) = [p for p in (directory / "upgrade").iterdir() if p.name.startswith(".lock.not-a-lock-")]
    if planted == "symlink":
        assert aside.is_symlink() and target.read_bytes() == b"not a lock"
    elif planted == "directory":
        assert (aside / "inside").read_bytes() == b"not the cache's"


@pytest.mark.timeout(120)
def test_waiting_for_upgrades_returns_at_once_where_no_upgrader_can_start(tmp_path, monkeypatch):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    monkeypatch.setattr(sys, "executable", "")  # no interpreter to start the helper with
    cache.lower(*variant(3), compile_device=True)
    assert (tmp_path / "cache" / "upgrade").is_dir() and os.listdir(tmp_path / "cache" / "upgrade")
    start = time.monotonic()
    assert cache.flush()  # the same call without upgrades: what it takes at this run's load
    baseline = time.monotonic() - start
    start = time.monotonic()
    assert cache.flush(upgrades=True, timeout=10.0) is False
    # It knew at once: no waiting for what cannot come (before: the whole 10 s).
    assert time.monotonic() - start < limit(baseline, at_least=1.0, at_most=5.0)
    assert lower_fresh(tmp_path / "cache", 3, True)[0] == "disk"  # the LLVM IR entry serves hits


RM_WHILE_UPGRADING = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import codegen_cache as cc
    from codegen_cache._cache import _upgrade
    from workers import variant
    cache = cc.CodegenCache({directory!r}, write_behind=False)
    for i in range({count}):
        cache.lower(*variant(100 + i), compile_device=True)  # each one an upgrade to do
    print("marked", flush=True)
""")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("delay", [0.0, 0.5, 1.5, 3.0])
@pytest.mark.slow
def test_a_cache_directory_removed_while_the_upgrader_works_stays_removed(tmp_path, delay):
    directory = tmp_path / "cache"
    script = RM_WHILE_UPGRADING.format(tests=TESTS, directory=str(directory), count=6)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "marked" in done.stdout, done.stderr[-3000:]
    # The upgrader is starting (or linking) now; the user removes the whole directory. As with
    # `rm -rf`, a file the upgrader writes meanwhile can make one pass fail: the user runs it again.
    time.sleep(delay)
    remove_tree(directory)
    deadline = time.monotonic() + 120
    while _upgraders(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _upgraders(directory), "the upgrader is still running"
    assert not directory.exists(), f"made again: {sorted(str(p) for p in directory.rglob('*'))}"
    assert _upgrade.wait_exited(directory, 1)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_cache_directory_that_is_itself_a_symlink_is_the_users_choice_and_is_used(tmp_path, caplog):
    # Where the cache lives is the user's to say (~/.cache/codegen-cache -> /data/cache): only
    # links inside the cache directory are refused.
    real = tmp_path / "data" / "cache"
    real.mkdir(parents=True)
    link = tmp_path / "cache-link"
    link.symlink_to(real)
    script = EVERY_STORE.format(tests=TESTS, directory=str(link))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"tiers": ["codegen", "codegen"], "flushed": True, "again": ["disk", "disk"]}
    assert "never follows a link" not in done.stderr and "not using" not in done.stderr, done.stderr[-3000:]
    assert (real / "compiled").is_dir() and (real / "staged").is_dir()
