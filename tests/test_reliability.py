"""Faults the cache must survive: kill -9 mid-store, corruption, a full disk, read-only and noexec
directories, toolchain and environment changes, file permissions.

Every fault ends in a correct module (from the cache or rebuilt) and never in an exception
from lower(). docs/reliability.md lists each fault and the test here that shows it. The full
counts run with --stress; the default run keeps a small subset.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tvm

import codegen_cache as cc
import hooks
import kernels
from codegen_cache import _key
from codegen_cache._artifacts import decode
from codegen_cache._cache import _upgrade
from codegen_cache._registry import DeviceCodegen
from codegen_cache._storage._disk import ArtifactStore
from codegen_cache.codegens import cuda as cuda_codegen
from conftest import CUDA_TARGET
from workers import check_module, variant

WORKERS = Path(__file__).with_name("workers.py")


@pytest.fixture
def stress(request) -> bool:
    """True under --stress: run the full counts."""
    return bool(request.config.getoption("--stress"))


@pytest.fixture
def spawn():
    """Start `python workers.py <role> <args>` processes; every one is killed and reaped at the end."""
    procs: list[subprocess.Popen] = []

    def start(role: str, **args) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(WORKERS), role, json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    """Wait for a worker and return its JSON result line."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@contextlib.contextmanager
def mounted(path: Path, *mount_args: str):
    """mount ... path for the block (lazily unmounted after); skip where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *mount_args, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip() or 'needs root'})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only_view(source: Path, path: Path):
    """`source` bind-mounted read-only at `path` (root ignores chmod, so a mount is the real test)."""
    with mounted(path, "--bind", str(source)):
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount read-only here ({done.stderr.strip()})")
        yield path


def fill(mount_point: Path, *, leave: int = 0) -> Path:
    """Fill a filesystem with one file, to the last byte but `leave`; return the file."""
    filler = mount_point / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


def orphan_files(store: Path) -> list[str]:
    """Value files of a store that no row refers to."""
    db = sqlite3.connect(f"{(store / 'cache.db').as_uri()}?mode=ro", uri=True)
    try:
        referenced = {row[0] for row in db.execute("SELECT filename FROM Cache WHERE filename IS NOT NULL")}
    finally:
        db.close()
    return sorted(p for p in (str(f.relative_to(store)) for f in store.rglob("*.val")) if p not in referenced)


def warnings_of(caplog) -> list[str]:
    """Messages of WARNING or above that the codegen_cache loggers emitted."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("codegen_cache") and r.levelno >= logging.WARNING]


def populate(directory: Path, *indices: int) -> None:
    """Store variants `indices`, compiled and source, in `directory`."""
    cache = cc.CodegenCache(directory, write_behind=False)
    for i in indices:
        for compiled in (True, False):
            cache.lower(*variant(i), compile_device=compiled)
    cache.close()


def lower_fresh(directory: Path, i: int, compiled: bool, **options) -> tuple[str, cc.CacheStats]:
    """Lower variant i in a new CodegenCache on `directory`; check the module; (tier, its stats)."""
    cache = cc.CodegenCache(directory, write_behind=False, **options)
    try:
        module, outcome = cache.lower_with_outcome(*variant(i), compile_device=compiled)
        check_module(module, i, compiled)
        return outcome.tier, cache.stats(shared=False)
    finally:
        cache.close()


# ---- kill -9 mid-store ----------------------------------------------------------------------


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kills", [pytest.param(4, id="4-kills"), pytest.param(20, id="20-kills", marks=pytest.mark.stress)])
@pytest.mark.slow
def test_kill9_mid_store_leaves_no_corrupt_entry_stuck_lock_or_growing_temp(tmp_path, spawn, kills):
    directory, keys = tmp_path / "cache", 30
    rng = random.Random(kills)
    for k in range(kills):
        proc = spawn("writer", dir=str(directory), seed=k, keys=keys)
        assert '"ready"' in proc.stdout.readline(), proc.stderr.read()[-4000:]
        time.sleep(rng.uniform(0.0, 0.6))  # staging, storing, taking and releasing locks
        proc.kill()
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL

    cache = cc.CodegenCache(directory, write_behind=False)
    # Every entry on disk is whole: SQLite commits the row after the value file is written, and a
    # staged entry is renamed into place only once it is complete.
    for name in ("compiled", "source"):
        store = cache.store(name)
        for key in list(store.keys()):
            _module, meta = decode(store.get(key), scratch=str(tmp_path))
            assert meta["key"] == key
        for key in list(cache.staged(name).digests()):
            _module, meta = decode(cache.staged(name).read(key), scratch=str(tmp_path))
            assert meta["key"] == key
        # A kill between a value file and its row leaves that file behind: one per kill at most.
        assert len(orphan_files(directory / name)) <= kills
    # No lock outlives its holder: the kernel released every one (the files may stay: they hold nothing).
    for lock in (directory / "locks").iterdir() if (directory / "locks").is_dir() else ():
        with open(lock, "rb+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if lock.name == "keys" and hasattr(fcntl, "F_OFD_SETLK"):  # no byte of it is locked either
                fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    # Scratch leftovers: a staged file being written and a load per kill at most. (First the
    # upgrader the killed writers started finishes: its own scratch files come and go.)
    assert cache.flush(upgrades=True, timeout=300)
    leftovers = list((directory / "tmp").iterdir()) if (directory / "tmp").is_dir() else []
    assert len(leftovers) <= 2 * kills
    # Every lookup returns a correct module or misses, and none waits on a dead writer's lock.
    for i in range(keys):
        for compiled in (True, False):
            check_module(cache.lower(*variant(i), compile_device=compiled), i, compiled)
    stats = cache.stats(shared=False)
    assert (stats.corrupt, stats.lease_waits, stats.errors) == (0, 0, {})
    assert stats.hits + stats.misses == 2 * keys
    cache.close()
    # Leftovers older than an hour are swept by the next cache that stores (its writer, at its first store).
    old = time.time() - 7200
    for path in leftovers:
        os.utime(path, (old, old))
    assert lower_fresh(directory, keys, True)[0] == "codegen"
    assert not [p for p in leftovers if p.exists()]


# ---- corruption -----------------------------------------------------------------------------


def _row(directory: Path, store: str, key: str) -> tuple[str | None, bytes | None]:
    db = sqlite3.connect(str(directory / store / "cache.db"))
    try:
        return db.execute("SELECT filename, value FROM Cache WHERE key = ?", (key,)).fetchone()
    finally:
        db.close()


def _rewrite(directory: Path, store: str, key: str, blob: bytes) -> None:
    """Replace the stored bytes of `key` behind the cache's back (in the database or its file)."""
    filename, _value = _row(directory, store, key)
    if filename is not None:
        (directory / store / filename).write_bytes(blob)
        return
    db = sqlite3.connect(str(directory / store / "cache.db"))
    try:
        with db:
            db.execute("UPDATE Cache SET value = ? WHERE key = ?", (sqlite3.Binary(blob), key))
    finally:
        db.close()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-in-db", "source-in-file"])
def test_flipped_bytes_are_a_miss_and_rebuild(tmp_path, stress, compiled):
    # Both llvm entries hold LLVM IR (35-50 KB): value files. Entries inside the database are
    # covered in test_cache (small CUDA source entries).
    directory, store = tmp_path / "cache", "compiled" if compiled else "source"
    populate(directory, 1)
    key = cc.CodegenCache(directory).key_for(*variant(1), compile_device=compiled).digest
    filename, value = _row(directory, store, key)
    blob = bytes(value) if filename is None else (directory / store / filename).read_bytes()
    for pos in random.Random(5).sample(range(len(blob)), 200 if stress else 8):
        # The llvm upgrader replaces an entry it links: it must not race the damage.
        assert cc.CodegenCache(directory).flush(upgrades=True, timeout=180)
        bad = bytearray(cc.CodegenCache(directory).store(store).get(key))
        pos %= len(bad)  # the linked entry and the rebuilt one differ in length
        bad[pos] ^= 1 << random.Random(pos).randrange(8)
        _rewrite(directory, store, key, bytes(bad))
        tier, stats = lower_fresh(directory, 1, compiled)
        assert (tier, stats.corrupt) == ("codegen", 1), pos
        assert lower_fresh(directory, 1, compiled)[0] == "disk", pos  # rebuilt and stored again


@pytest.mark.parametrize("cut", ["empty", "one-byte", "header", "half", "all-but-one", "deleted"])
def test_truncated_or_deleted_value_file_is_a_miss_and_rebuild(tmp_path, cut):
    directory = tmp_path / "cache"
    populate(directory, 1)
    key = cc.CodegenCache(directory).key_for(*variant(1), compile_device=False).digest
    path = directory / "source" / _row(directory, "source", key)[0]
    data = path.read_bytes()
    if cut == "deleted":
        path.unlink()
    else:
        path.write_bytes(data[: {"empty": 0, "one-byte": 1, "header": 40, "half": len(data) // 2,
                                 "all-but-one": len(data) - 1}[cut]])
    assert lower_fresh(directory, 1, False)[0] == "codegen"
    assert lower_fresh(directory, 1, False)[0] == "disk"


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "garbage":
        path.write_bytes(random.Random(1).randbytes(len(data)))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "header-zeroed":
        path.write_bytes(bytes(100) + data[100:])
    elif how == "pages-overwritten":
        out = bytearray(data)
        for page in range(4096, len(out), 4096):
            out[page + 64 : page + 1024] = random.Random(page).randbytes(960)
        path.write_bytes(bytes(out))
    elif how == "deleted":
        path.unlink()


def _holders(path: str) -> list[int]:
    """Other processes with `path` (or its write-ahead log or shared memory) open."""
    names, found = {path, path + "-wal", path + "-shm"}, []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue  # gone, or not ours to look at
        if links & names:
            found.append(int(pid))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_once_the_upgrader_lets_go_of_a_directory_it_holds_none_of_its_databases(tmp_path):
    """What wait_exited promises whoever then removes or replaces the stores (the test below does)."""
    directory = tmp_path / "cache"
    populate(directory, 1)  # an llvm entry: an upgrader starts, links it, idles, and lets go
    assert _upgrade.wait_exited(directory, 60)
    assert _holders(str(directory / "compiled" / "cache.db")) == []


# One kind of damage in the default run; the others (each four fresh processes) in the slow tier.
@pytest.mark.parametrize("how", ["garbage", *(pytest.param(how, marks=pytest.mark.slow) for how in (
    "truncated", "header-zeroed", "pages-overwritten", "deleted"))])
def test_damaged_sqlite_index_is_a_miss_and_the_store_recovers(tmp_path, how):
    directory = tmp_path / "cache"
    populate(directory, 1)
    # No upgrader may hold the old database open: a new one made beside its shared-memory file
    # fails SQLite's writes until that process exits (an error, counted, and a miss: not this test).
    assert _upgrade.wait_exited(directory, 60)
    for store in ("compiled", "source"):
        _damage(directory / store / "cache.db", how)
    for compiled in (True, False):
        tier, stats = lower_fresh(directory, 1, compiled)
        assert tier in ("disk", "codegen") and not stats.errors
    # Whatever the damage, the stores work again: the next process hits.
    for compiled in (True, False):
        assert lower_fresh(directory, 1, compiled)[0] == "disk"


@pytest.mark.parametrize("what", ["stats.sqlite", "builds/cache.db", "failures/cache.db", "tmp"])
def test_damaged_side_files_never_break_lower(tmp_path, what):
    directory = tmp_path / "cache"
    populate(directory, 1)
    cache = cc.CodegenCache(directory)
    # The llvm upgrader links in tmp/ meanwhile: its scratch directory would make tmp/ not empty.
    assert cache.flush(upgrades=True, timeout=120)
    cache.stats()
    cache.close()
    path = directory / what
    if not path.exists():  # not made yet (no fold, no build, no scratch file): plant garbage there
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(2).randbytes(8192))
    elif what == "tmp":
        for child in path.iterdir():
            child.unlink() if child.is_file() else None
        path.rmdir()
        path.write_bytes(b"not a directory")
    else:
        _damage(path, "garbage")
    for i, compiled in ((1, True), (1, False), (2, True)):
        check_module(cc.CodegenCache(directory, write_behind=False).lower(*variant(i), compile_device=compiled), i, compiled)
    assert lower_fresh(directory, 2, True)[0] == "disk"


# ---- a full disk ----------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_full_disk_skips_stores_with_one_warning_and_recovers(tmp_path, caplog, cuda_vadd):
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as mnt:
        directory = mnt / "cache"
        cache = cc.CodegenCache(directory, write_behind=False)
        populate(directory, 0)
        filler = fill(mnt, leave=24 << 10)  # room to start writing a 35 KB value file, not to finish it
        caplog.set_level(logging.DEBUG, logger="codegen_cache")
        caplog.clear()
        for i in (1, 2):
            for compiled in (True, False):
                check_module(cache.lower(*variant(i), compile_device=compiled), i, compiled)
        mod, target = cuda_vadd
        assert "__global__" in cache.lower(mod, target, compile_device=False).inspect_source("")
        stats = cache.stats(shared=False)
        assert stats.stores == 0 and stats.stores_skipped >= 3 and stats.codegen_runs == 5
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "no space left" in messages[0], messages
        # Space is freed: no half-written value file holds on to it, and the caches store again.
        filler.unlink()
        for store in ("compiled", "source"):
            assert orphan_files(directory / store) == []
        check_module(cache.lower(*variant(3), compile_device=True), 3, True)
        assert cache.stats(shared=False).stores == 1
        cache.close()
        for i in (1, 2):
            assert lower_fresh(directory, i, True)[0] == "codegen"
            assert lower_fresh(directory, i, True)[0] == "disk"


def test_a_value_too_big_for_the_disk_leaves_no_partial_file(tmp_path):
    # diskcache writes a large value to its file before the row; when that write fails it used
    # to leave the partial file behind, holding the space it had taken for good.
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as mnt:
        store = ArtifactStore(mnt / "store", size_limit=1 << 30)
        assert store.put("small", b"x" * 100)
        before = set((mnt / "store").rglob("*.val"))
        with pytest.raises(OSError, match="No space left"):
            store.put("big", b"x" * (2 << 20))
        assert set((mnt / "store").rglob("*.val")) == before and len(before) == 1  # the small one's
        assert store.put("fits", b"y" * (256 << 10)) and store.get("fits") == b"y" * (256 << 10)
        store.close()


@pytest.mark.timeout(300)
def test_storing_while_other_threads_delete_never_fails_a_write(tmp_path, stress):
    # Deleting a store's last value file in a directory level removes the level (diskcache's
    # os.removedirs); a write in another thread that had just made that level must make it again.
    import threading

    store, blob, failed = ArtifactStore(tmp_path / "source", size_limit=1 << 34), b"v" * (64 << 10), []

    def churn(thread: int) -> None:
        for i in range(3000 if stress else 100):
            try:
                if not store.put(f"{thread}-{i}", blob):
                    failed.append(f"{thread}-{i}: not stored")
            except OSError as err:
                failed.append(f"{thread}-{i}: {err!r}")
            store.delete(f"{thread}-{i}")

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert failed == []
    assert list((tmp_path / "source").rglob("*.val")) == []


@pytest.mark.timeout(600)
def test_full_disk_before_the_cache_ever_opened(tmp_path, caplog):
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=2m", "tmpfs") as mnt:
        filler = fill(mnt)
        caplog.set_level(logging.DEBUG, logger="codegen_cache")
        cache = cc.CodegenCache(mnt / "cache", write_behind=False)
        for compiled in (True, False):
            check_module(cache.lower(*variant(1), compile_device=compiled), 1, compiled)
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "no space left" in messages[0], messages
        filler.unlink()
        cache.close()
        assert lower_fresh(mnt / "cache", 1, True)[0] == "codegen"
        assert lower_fresh(mnt / "cache", 1, True)[0] == "disk"


# ---- read-only and noexec directories --------------------------------------------------------


@pytest.mark.timeout(600)
def test_read_only_mount_serves_hits_with_one_warning(tmp_path, caplog, cuda_vadd):
    source = tmp_path / "populated"
    populate(source, 0)
    mod, target = cuda_vadd
    cc.CodegenCache(source, write_behind=False).lower(mod, target, compile_device=False)
    with read_only_view(source, tmp_path / "ro") as ro:
        caplog.set_level(logging.DEBUG, logger="codegen_cache")
        start = time.monotonic()
        cache = cc.CodegenCache(ro, write_behind=False)  # lease_wait stays 600 s: no lease may block
        for compiled in (True, False):
            module, outcome = cache.lower_with_outcome(*variant(0), compile_device=compiled)
            check_module(module, 0, compiled)
            assert outcome.tier == "disk"
        assert cache.lower_with_outcome(mod, target, compile_device=False)[1].tier == "disk"
        for compiled in (True, False):  # a new kernel: built, not stored
            check_module(cache.lower(*variant(4), compile_device=compiled), 4, compiled)
        assert lower_fresh(ro, 4, True)[0] == "codegen"
        assert time.monotonic() - start < 120
        stats = cache.stats(shared=False)
        assert (stats.hits_disk, stats.stores, stats.corrupt) == (3, 0, 0)
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "cannot be written" in messages[0], messages
        cache.close()


def test_missing_cache_dir_under_a_read_only_mount(tmp_path, caplog):
    (tmp_path / "empty").mkdir()
    with read_only_view(tmp_path / "empty", tmp_path / "ro") as ro:
        caplog.set_level(logging.DEBUG, logger="codegen_cache")
        for _ in range(2):
            assert lower_fresh(ro / "cache", 1, True)[0] == "codegen"
        messages = warnings_of(caplog)
        assert len(messages) == 1 and "cannot be written" in messages[0], messages


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores chmod; test_read_only_mount_* covers it with a mount")
def test_chmod_read_only_directory_serves_hits(tmp_path, caplog):
    populate(tmp_path / "cache", 0)
    for path in sorted((tmp_path / "cache").rglob("*"), reverse=True):
        path.chmod(path.stat().st_mode & ~0o222)
    (tmp_path / "cache").chmod(0o555)
    try:
        caplog.set_level(logging.WARNING, logger="codegen_cache")
        assert lower_fresh(tmp_path / "cache", 0, True)[0] == "disk"
        assert lower_fresh(tmp_path / "cache", 5, True)[0] == "codegen"
    finally:
        for path in [tmp_path / "cache", *(tmp_path / "cache").rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_noexec_mount_still_serves_llvm_hits(tmp_path):
    with mounted(tmp_path / "noexec", "-t", "tmpfs", "-o", "size=16m,noexec", "tmpfs") as mnt:
        populate(mnt / "cache", 0)
        for _ in range(2):  # dlopen from <dir>/tmp fails there: the cache must not call that corrupt
            tier, stats = lower_fresh(mnt / "cache", 0, True)
            assert (tier, stats.corrupt) == ("disk", 0)


# ---- toolchain and environment changes --------------------------------------------------------


def test_changed_tvm_commit_never_serves_a_stale_entry(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    populate(directory, 1)
    salts = dict(_key.static_salts())
    monkeypatch.setattr(_key, "static_salts", lambda: tuple({**salts, "tvm": salts["tvm"] + "-other"}.items()))
    monkeypatch.setattr(_key, "_tails", {})
    for compiled in (True, False):
        assert lower_fresh(directory, 1, compiled)[0] == "codegen"
    monkeypatch.undo()
    _key._tails.clear()  # noqa: SLF001
    for compiled in (True, False):
        assert lower_fresh(directory, 1, compiled)[0] == "disk"  # both builds have their entries


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_changed_tvm_commit_in_a_fresh_process(tmp_path, spawn):
    directory = tmp_path / "cache"
    populate(directory, 1)
    assert finish(spawn("lookup", dir=str(directory), keys=[1], tvm_commit="0123abc"))["tiers"] == ["codegen", "codegen"]
    for compiled in (True, False):
        assert lower_fresh(directory, 1, compiled)[0] == "disk"


def _stamping_cuda_codegen() -> DeviceCodegen:
    """A stand-in for compiled CUDA (no driver here): CUDA source stamped with the toolchain it saw.

    It uses the built-in CUDA codegen's toolchain function, so its key has exactly the parts
    a compiled CUDA entry has (nvcc build id, the env vars nvcc reads, the target's arch).
    """
    builtin = cc.resolve_device_codegen(tvm.target.Target(CUDA_TARGET))

    def build(mod, target):
        stamp = json.dumps({**builtin.toolchain(target, True), "arch": str(target.attrs.get("arch"))}, sort_keys=True)
        text = f"// built with {stamp}\n" + cuda_codegen.cuda_source_module(mod, target).inspect_source("")
        return tvm.get_global_func("runtime.SourceModuleCreate")(text, "cu")

    return DeviceCodegen("cuda", build=build, build_without_compile=builtin.build_without_compile,
                         toolchain=builtin.toolchain)


CHANGES = {
    "nvcc-version": lambda mp: mp.setattr(cuda_codegen, "nvcc_version", lambda: "Build cuda_99.9.r99/compiler.0_0"),
    "ptxas-options": lambda mp: mp.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O1"),
    "ptxas-reg-level": lambda mp: mp.setenv("TVM_CUDA_PTXAS_REG_LEVEL", "2"),
    "no-fast-math": lambda mp: mp.setenv("TVM_CUDA_NVCC_NO_FAST_MATH", "1"),
    "kernel-debug": lambda mp: mp.setenv("TVM_KERNEL_DEBUG", "1"),
    "nvcc-append-flags": lambda mp: mp.setenv("NVCC_APPEND_FLAGS", "-lineinfo"),
    "postproc-hook": lambda mp: hooks.declared("tvm_callback_cuda_postproc", lambda code, target: code + "// hook\n",
                                               "hook-v1"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_toolchain_or_env_change_never_serves_a_stale_compiled_cuda_entry(tmp_path, monkeypatch, cuda_vadd, change):
    for name in cuda_codegen.COMPILE_ENV:
        monkeypatch.delenv(name, raising=False)
    mod, target = cuda_vadd
    codegen = _stamping_cuda_codegen()
    before = cc.CodegenCache(tmp_path, write_behind=False).lower(mod, target, codegen=codegen).inspect_source("")
    with monkeypatch.context() as mp, contextlib.ExitStack() as stack:
        changed = CHANGES[change](mp)
        if changed is not None:
            stack.enter_context(changed)  # a real hook, registered for the block
        module, outcome = cc.CodegenCache(tmp_path, write_behind=False).lower_with_outcome(mod, target, codegen=codegen)
        after = module.inspect_source("")
        assert outcome.tier == "codegen" and after != before
    module, outcome = cc.CodegenCache(tmp_path).lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "disk" and module.inspect_source("") == before


@pytest.mark.parametrize("compile_device", [True, False], ids=["compiled", "source"])
def test_changed_cuda_arch_never_serves_a_stale_entry(tmp_path, compile_device):
    codegen = _stamping_cuda_codegen()
    texts = {}
    for arch in ("sm_90", "sm_80", "sm_90"):
        mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {"kind": "cuda", "arch": arch})
        module, outcome = cc.CodegenCache(tmp_path, write_behind=False).lower_with_outcome(
            mod, target, compile_device=compile_device, codegen=codegen)
        assert outcome.tier == ("disk" if arch in texts else "codegen"), arch
        text = module.inspect_source("")
        assert texts.setdefault(arch, text) == text
    if compile_device:
        assert "sm_80" in texts["sm_80"] and "sm_90" in texts["sm_90"]


# ---- file permissions -----------------------------------------------------------------------


def _modes(directory: Path) -> dict[str, int]:
    modes = {}
    for p in [directory, *directory.rglob("*")]:
        try:
            modes[str(p.relative_to(directory)) or "."] = stat.S_IMODE(p.stat().st_mode)
        except FileNotFoundError:
            # A database's -wal and -shm go when its last connection closes: the llvm upgrader's
            # helper may close its own just after flush(upgrades=True) saw the upgrade done.
            continue
    return modes


UMASKS = (0o022, 0o002, 0o000, 0o077)
TEAM_GID = 4242


@pytest.fixture(scope="module")
def populated_under_umasks(tmp_path_factory):
    """One spawned process fills a cache under each umask, and one in a setgid team directory."""
    root = tmp_path_factory.mktemp("modes")
    team = root / "team"
    team.mkdir()
    runs = [([[str(root / f"umask-{u:03o}"), u] for u in UMASKS], {})]
    try:
        os.chown(team, -1, TEAM_GID)
        team.chmod(0o2775)
        # A member of the team group (root is given it here): the setgid directory is shared with it.
        runs.append(([[str(team / "cache"), 0o002]], {"extra_groups": [TEAM_GID]}))
    except PermissionError:
        pass  # chgrp needs root (or a second group): that test skips
    jobs = [job for batch, _how in runs for job in batch]
    for batch, how in runs:
        done = subprocess.run([sys.executable, str(WORKERS), "populate", json.dumps({"jobs": batch})],
                              capture_output=True, text=True, timeout=300, **how)
        assert done.returncode == 0, done.stderr[-4000:]
    # The llvm upgrader the populating process started works on in its scratch files: let it finish.
    for directory, _umask in jobs:
        assert cc.CodegenCache(directory).flush(upgrades=True, timeout=180)
    return root


@pytest.mark.parametrize("umask", UMASKS, ids=lambda u: f"umask-{u:03o}")
@pytest.mark.slow
def test_file_modes_fit_a_shared_cache_and_are_never_world_writable(populated_under_umasks, umask):
    directory = populated_under_umasks / f"umask-{umask:03o}"
    modes = _modes(directory)
    assert not {p: oct(m) for p, m in modes.items() if m & stat.S_IWOTH}
    databases = {p: m for p, m in modes.items() if p.endswith(("cache.db", "stats.sqlite"))}
    assert len(databases) == 5  # compiled, source, failures, builds, stats
    value_files = {p: m for p, m in modes.items() if p.endswith(".val")}
    assert value_files
    # An entry's file is never changed once written (a rebuild writes a new one): nobody may write it.
    assert not {p: oct(m) for p, m in value_files.items() if m & 0o222}
    if umask in (0o002, 0o000):
        # A team cache: every member of the group can write every database and directory and
        # read every entry (SQLite alone would create its databases 0644 whatever the umask).
        assert all(m & stat.S_IWGRP for m in databases.values()), databases
        assert all(m & stat.S_IRGRP for m in value_files.values()), value_files
        assert all(m & stat.S_IWGRP for p, m in modes.items() if (directory / p).is_dir())
    if umask == 0o077:
        assert all(m & 0o077 == 0 for m in modes.values()), modes


@pytest.mark.slow
def test_setgid_team_directory_gives_every_file_the_team_group(populated_under_umasks):
    directory = populated_under_umasks / "team" / "cache"
    if not directory.exists():
        pytest.skip("needs root (or membership of a second group) to chgrp")
    paths = list(directory.rglob("*"))
    assert any(p.name.endswith(".val") for p in paths)  # entries were stored: the team directory is trusted
    assert paths and all(p.stat().st_gid == TEAM_GID for p in paths)
    assert all(p.stat().st_mode & stat.S_ISGID for p in paths if p.is_dir())
