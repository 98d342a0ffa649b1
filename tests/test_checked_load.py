"""What runs is what was checked: a hit loads the very bytes whose checksum and key were verified.

The attacks of issue 23, with real processes and real files: another process renames a library
over an entry's value file between its read and its load, truncates it after the load (with the
file mapped in place that was a SIGBUS), or overwrites it in place; an entry whose metadata
names another key holds a library with a constructor. The "other code" is a real shared library
whose constructor leaves a marker file: if it ever runs, the marker says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame, unframe
from codegen_cache._cache import _upgrade
from codegen_cache._storage._disk import ArtifactStore
from conftest import run_binary

TESTS = str(Path(__file__).parent)
LIBRARY = textwrap.dedent("""
    #include <fcntl.h>
    #include <unistd.h>
    __attribute__((constructor)) static void ran(void) {{
        int fd = open("{marker}", O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd);
    }}
    int which(void) {{ return {which}; }}
""")


def shared_library(directory: Path, name: str, marker: Path, which: int) -> Path:
    """A C shared library whose constructor creates `marker` and whose which() returns `which`."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: cannot build the foreign library")
    source = directory / f"{name}.c"
    source.write_text(LIBRARY.format(marker=marker, which=which))
    out = directory / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True, capture_output=True,
                   timeout=60)
    return out


def as_another_process(code: str) -> None:
    """Run `code` in a separate Python process (the attacker: the standard library only), and check it succeeded."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def linked(tmp_path_factory, llvm_vadds):
    """A cache directory whose llvm vector add is a linked shared library; its expected output."""
    directory = tmp_path_factory.mktemp("linked") / "cache"
    mod, target = llvm_vadds
    writer = cc.CodegenCache(directory, write_behind=False)
    expected = run_binary(writer.lower(mod, target), "vadd0")
    assert writer.flush(upgrades=True, timeout=240)  # linked into a shared library
    writer.close()
    # The tests copy this directory: no upgrader may still hold its database (SQLite removes the
    # -wal and -shm files when the last connection closes, under the copy's feet).
    assert _upgrade.wait_exited(directory, 60)
    return directory, expected


@pytest.fixture
def evil(tmp_path):
    """(library, marker): a foreign shared library, and the file its constructor creates."""
    marker = tmp_path / "the-foreign-constructor-ran"
    return shared_library(tmp_path, "evil", marker, 2), marker


def _copy(linked, tmp_path) -> Path:
    directory = tmp_path / "cache"
    shutil.copytree(linked[0], directory)
    return directory


def _value_file(directory: Path, mod, target) -> str:
    cache = cc.CodegenCache(directory)
    row = cache.store("compiled").read(cache.key_for(mod, target).digest)
    assert row is not None and row.path is not None and row.blob[:4] == b"\x7fELF"
    return row.path


@pytest.mark.timeout(300)
def test_a_library_renamed_over_the_value_file_between_its_check_and_its_load_never_runs(
        tmp_path, linked, llvm_vadds, evil, monkeypatch):
    mod, target = llvm_vadds
    library, marker = evil
    hits = 5
    for round_ in range(hits):
        directory = _copy(linked, tmp_path / str(round_))
        path = _value_file(directory, mod, target)
        read = ArtifactStore.read

        def read_then_swap(store, digest):
            row = read(store, digest)
            if row is not None and row.path == path:
                # Right after the bytes were read, another process puts a foreign library there.
                as_another_process(f"import os, shutil; shutil.copy({str(library)!r}, {path!r} + '.new'); "
                                   f"os.rename({path!r} + '.new', {path!r})")
            return row

        monkeypatch.setattr(ArtifactStore, "read", read_then_swap)
        module, outcome = cc.CodegenCache(directory, memory_entries=0).lower_with_outcome(mod, target)
        monkeypatch.setattr(ArtifactStore, "read", read)
        assert outcome.tier == "disk"
        np.testing.assert_array_equal(run_binary(module, "vadd0"), linked[1])
        assert Path(path).read_bytes() == library.read_bytes()  # the swap did happen
        assert not marker.exists(), "the foreign library's constructor ran"
        with open("/proc/self/maps") as maps:
            assert path not in maps.read()  # the value file itself was never mapped
    # The next lookup reads the foreign bytes (another size than its row says): rebuilt.
    cache = cc.CodegenCache(directory, memory_entries=0, write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target)
    assert outcome.tier == "codegen"
    np.testing.assert_array_equal(run_binary(module, "vadd0"), linked[1])
    assert not marker.exists()


HIT_THEN_ATTACK = textwrap.dedent("""
    import subprocess, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import codegen_cache as cc, kernels
    from conftest import run_binary
    mod, target = cc.prepare_for_codegen(kernels.vadds(), "llvm")
    cache = cc.CodegenCache({directory!r}, memory_entries=0)
    module, outcome = cache.lower_with_outcome(mod, target)
    assert outcome.tier == "disk", outcome.tier
    before = run_binary(module, "vadd0")
    # Another process changes the value file the bytes came from: {attack}.
    subprocess.run([sys.executable, "-c", {attacker!r}], check=True, timeout=60)
    for _ in range(100):  # every page of the loaded library is touched again
        assert (run_binary(module, "vadd0") == before).all()
    print("ok", before[:3].tolist())
""")
ATTACKS = {
    "truncated": "import os; os.chmod({path!r}, 0o600); os.truncate({path!r}, 0)",
    "overwritten in place": "import os; os.chmod({path!r}, 0o600); size = os.path.getsize({path!r}); "
                            "f = open({path!r}, 'r+b'); f.write(open({evil!r}, 'rb').read()[:size].ljust(size, b'\\0'));"
                            " f.close()",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.slow
def test_a_value_file_changed_after_the_load_never_changes_or_kills_the_loaded_kernel(
        tmp_path, linked, llvm_vadds, evil, attack):
    mod, target = llvm_vadds
    library, marker = evil
    for round_ in range(5):
        directory = _copy(linked, tmp_path / str(round_))
        path = _value_file(directory, mod, target)
        attacker = ATTACKS[attack].format(path=path, evil=str(library))
        script = HIT_THEN_ATTACK.format(tests=TESTS, directory=str(directory), attack=attack, attacker=attacker)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
        assert done.returncode != -signal.SIGBUS, "the process died of SIGBUS"
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[0] == "ok" and not marker.exists()
    # The changed file is never served: a checksum mismatch (or a short read), rebuilt.
    cache = cc.CodegenCache(directory, memory_entries=0, write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target)
    assert outcome.tier == "codegen"
    np.testing.assert_array_equal(run_binary(module, "vadd0"), linked[1])


class _DictRemote:
    """A remote tier as CodegenCache accepts one (get/put by digest), holding bytes in a dict."""

    def __init__(self):
        self.blobs: dict[str, bytes] = {}

    def get(self, digest):
        return self.blobs.get(digest)

    def put(self, digest, blob):
        self.blobs[digest] = blob


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["disk", "remote"])
@pytest.mark.parametrize("fault", ["another key in its metadata", "a flipped byte"])
def test_a_stored_librarys_constructor_never_runs_before_its_checksum_and_key_are_checked(
        tmp_path, linked, llvm_vadds, evil, where, fault, caplog):
    mod, target = llvm_vadds
    library, marker = evil
    directory = _copy(linked, tmp_path)
    cache = cc.CodegenCache(directory, memory_entries=0, write_behind=False)
    digest = cache.key_for(mod, target).digest
    art = unframe(cache.store("compiled").get(digest))
    meta = {**art.meta, "key": "f" * 32} if fault.startswith("another") else art.meta
    blob = bytearray(frame("llvm-so", meta, [library.read_bytes(), bytes(art.fields[1])]))
    if fault == "a flipped byte":
        blob[100] ^= 0xFF  # inside the library: the checksum no longer matches
    if where == "disk":
        cache.store("compiled").put(digest, bytes(blob))
        reader = cache
    else:
        cache.clear()
        remote = _DictRemote()
        remote.put(digest, bytes(blob))
        reader = cc.CodegenCache(directory, memory_entries=0, write_behind=False, remote=remote)
    module, outcome = reader.lower_with_outcome(mod, target)
    assert not marker.exists(), "the constructor of a library that failed its checks ran"
    assert outcome.tier == "codegen" and reader.stats(shared=False).corrupt == 1
    np.testing.assert_array_equal(run_binary(module, "vadd0"), linked[1])
    if fault.startswith("another"):
        assert any("holds key ffffffffffffffff" in r.getMessage() for r in caplog.records)


def test_an_llvm_hit_maps_a_sealed_private_copy_not_the_value_file(tmp_path, linked, llvm_vadds):
    mod, target = llvm_vadds
    directory = _copy(linked, tmp_path)
    path = _value_file(directory, mod, target)
    module, outcome = cc.CodegenCache(directory, memory_entries=0).lower_with_outcome(mod, target)
    assert outcome.tier == "disk" and module.implements_function("vadd0")
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert path not in maps and "/memfd:codegen-cache" in maps


def test_entry_files_are_read_only_once_written(tmp_path, llvm_vadds, cuda_vadd):
    from codegen_cache._storage._pending import PendingFiles

    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cache.lower(*cuda_vadd, compile_device=False)
    mod, target = llvm_vadds
    cache.lower(mod, target)
    assert cache.flush(upgrades=True, timeout=240)
    staged = PendingFiles(tmp_path / "cache" / "staged" / "compiled")
    staged.keep_spare()
    staged.write("a" * 32, b"an entry")  # into the spare file
    staged.write("b" * 32, b"an entry")  # into a new file
    files = [*(tmp_path / "cache").rglob("*.val"), Path(staged.path("a" * 32)), Path(staged.path("b" * 32))]
    assert len(files) >= 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0, f"{path} is writable"


def test_a_new_copy_is_never_taken_for_a_library_still_loaded_under_the_same_descriptor_number(tmp_path):
    # glibc's dlopen returns a loaded library whose name equals the one asked for; the
    # descriptor number of a closed copy is the next copy's, so every load is named anew.
    import ctypes

    from codegen_cache._artifacts._private import load_private_copy

    libraries = [shared_library(tmp_path, f"lib{n}", tmp_path / f"ran{n}", n).read_bytes() for n in (1, 2, 3)]
    loaded = [load_private_copy(data, str(tmp_path), ctypes.CDLL) for data in libraries]  # all kept loaded
    assert [lib.which() for lib in loaded] == [1, 2, 3]
    assert all((tmp_path / f"ran{n}").exists() for n in (1, 2, 3))  # each one's own constructor ran


@pytest.mark.slow
def test_private_files_for_path_loaders_are_read_only_never_reused_and_removed_at_their_process_exit(tmp_path):
    script = textwrap.dedent(f"""
        import os
        from codegen_cache._artifacts import _private
        scratch = {str(tmp_path)!r}
        _private._own_prefix()
        planted = os.path.join(scratch, f"cgc-{{_private._own_pid[0][1]}}-0-k.so")
        os.symlink("/etc/passwd", planted)  # a name guessed beforehand: never written through
        first = _private.private_file(b"library bytes", scratch, "k.so")
        again = _private.private_file(b"other bytes", scratch, "k.so")
        assert open(first, "rb").read() == b"library bytes" and open(again, "rb").read() == b"other bytes"
        os.unlink(planted)
        print(first, again, oct(os.stat(first).st_mode & 0o777))
        child = os.fork()
        if child == 0:
            raise SystemExit(0)  # a child of fork runs the exit handlers: it removes nothing of its parent's
        os.waitpid(child, 0)
        assert os.path.exists(first) and os.path.exists(again)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    first, again, mode = done.stdout.split()
    assert first != again and first.endswith("k.so") and os.path.dirname(first) == str(tmp_path)
    assert mode == "0o400"
    assert list(tmp_path.iterdir()) == []  # gone with their process


def test_a_kept_copy_is_reused_only_for_the_bytes_it_holds(tmp_path, monkeypatch):
    """Two libraries under one digest (a collision): the second gets a copy of its own bytes."""
    import ctypes

    from codegen_cache._artifacts import _private

    monkeypatch.setattr(_private, "_kept", type(_private._kept)())
    monkeypatch.setattr(_private.xxhash, "xxh3_64_intdigest", lambda data: 7)
    one, two = (shared_library(tmp_path, f"lib{n}", tmp_path / f"ran{n}", n).read_bytes() for n in (1, 2))
    first = _private.load_private_copy(one, str(tmp_path), ctypes.CDLL)
    other = _private.load_private_copy(memoryview(two), str(tmp_path), ctypes.CDLL)
    again = _private.load_private_copy(memoryview(two), str(tmp_path), ctypes.CDLL)
    assert (first.which(), other.which(), again.which()) == (1, 2, 2)
    assert first._handle != other._handle == again._handle


def test_a_second_load_of_the_same_bytes_maps_the_kept_sealed_copy(tmp_path):
    import ctypes

    from codegen_cache._artifacts import _private

    one, two = (shared_library(tmp_path, f"lib{n}", tmp_path / f"ran{n}", n).read_bytes() for n in (1, 2))
    first = _private.load_private_copy(one, str(tmp_path), ctypes.CDLL)
    again = _private.load_private_copy(bytes(one), str(tmp_path), ctypes.CDLL)  # equal bytes, another object
    other = _private.load_private_copy(two, str(tmp_path), ctypes.CDLL)
    assert first._handle == again._handle != other._handle  # the same sealed file: the library loaded once
    assert (first.which(), again.which(), other.which()) == (1, 1, 2)
    kept = [fd for size, fd in _private._kept.values() if os.pread(fd, size, 0) in (one, two)]
    assert len(kept) == 2
    for fd in kept:  # sealed: nobody (this process included) can change or resize a kept copy
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
