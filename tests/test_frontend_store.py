"""The tilelang frontend's entries (`<dir>/tilelang/<key>.so`) are the cache's: stats, ls, show,
verify, prune and clear cover them, without tilelang installed.

Entries are written as codegen_cache.tilelang writes them (the package's own frame(), real
files in a temporary cache directory); the hit path's reader is the frontend's own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame
from codegen_cache._cli import _main as _cli
from codegen_cache._errors import ArtifactError
from codegen_cache._key import CacheKey
from codegen_cache._storage._plain import PlainFiles
from codegen_cache.tilelang import _frontend
from test_cli import run, run_json

TARGET = json.dumps({"kind": "cuda", "arch": "sm_80"}, sort_keys=True)


def _key(name: str) -> CacheKey:
    return CacheKey.from_parts([("func", name), ("call", "{}")])


def write_entry(root: Path, name: str, *, created: float | None = None, library: bytes = b"\x7fELF" + b"L" * 4000,
                key: CacheKey | None = None) -> str:
    """A frontend entry as _frontend._store frames it; its key digest."""
    key = key or _key(name)
    meta = {"key": key.digest, "parts": key.as_dict(), "params": "[]", "build_seconds": 2.5,
            "created": time.time() if created is None else created, "func_names": [name],
            "context": {"backend": "cuda", "target": TARGET, "target_host": json.dumps({"kind": "c"}),
                        "execution_backend": "tvm_ffi"}}
    blob = frame(_frontend.ENTRY_CODEC, meta, [library, f"// device {name}".encode(), b"// host"])
    (root / "tilelang").mkdir(parents=True, exist_ok=True)
    (root / "tilelang" / f"{key.digest}.so").write_bytes(blob)
    return key.digest


@pytest.fixture
def root(tmp_path):
    directory = tmp_path / "cache"
    cc.CodegenCache(directory, write_behind=False).close()
    return directory


def test_stats_ls_and_show_cover_frontend_entries(capsys, root):
    a = write_entry(root, "vadd", created=time.time() - 60)
    b = write_entry(root, "gemm", library=b"\x7fELF" + b"G" * 9000)
    sizes = {d: (root / "tilelang" / f"{d}.so").stat().st_size for d in (a, b)}
    _code, stats = run_json(capsys, "--dir", str(root), "stats")
    shown = stats["stores"]["tilelang"]
    assert {k: shown[k] for k in ("entries", "bytes", "size_limit")} == {
        "entries": 2, "bytes": sum(sizes.values()), "size_limit": cc.CodegenCache(root).settings.compiled_size_limit}
    assert shown["bytes_on_disk"] >= shown["bytes"]
    assert "tilelang" in run(capsys, "--dir", str(root), "stats")[1]
    _code, listed = run_json(capsys, "--dir", str(root), "ls")
    assert [(e["key"], e["store"], e["codegen"], e["functions"], e["target"], e["size"]) for e in listed] == [
        (b, "tilelang", "tilelang", ["gemm"], "cuda sm_80", sizes[b]),
        (a, "tilelang", "tilelang", ["vadd"], "cuda sm_80", sizes[a])]
    assert run_json(capsys, "--dir", str(root), "ls", "--compiled")[1] == []
    assert len(run_json(capsys, "--dir", str(root), "ls", "--tilelang")[1]) == 2
    out = run(capsys, "--dir", str(root), "ls")[1]
    assert "vadd" in out and "gemm" in out and "cuda sm_80" in out
    code, shown = run_json(capsys, "--dir", str(root), "show", a[:10], "--code")
    assert code == 0 and shown["integrity"] == "ok" and shown["code"] == "// device vadd"
    assert shown["parts"] == {"func": "vadd", "call": "{}"}
    code, out, _err = run(capsys, "--dir", str(root), "show", b)
    assert code == 0 and "tilelang.compile" in out and "gemm" in out and "tvm_ffi" in out


def test_verify_checks_frontend_entries_as_a_hit_does_and_fix_removes_bad_ones(capsys, root):
    good = write_entry(root, "good")
    corrupt = write_entry(root, "corrupt")
    path = root / "tilelang" / f"{corrupt}.so"
    blob = bytearray(path.read_bytes())
    blob[100] ^= 0xFF
    path.write_bytes(bytes(blob))
    # A sound frame under another key's name: a hit would not use it, so verify names it.
    moved = write_entry(root, "moved")
    elsewhere = "f" * 32
    os.replace(root / "tilelang" / f"{moved}.so", root / "tilelang" / f"{elsewhere}.so")
    code, out, _err = run(capsys, "--dir", str(root), "verify")
    assert code == _cli.EXIT_PROBLEMS
    assert f"tilelang/{corrupt[:16]}: " in out and "checksum mismatch" in out
    assert f"tilelang/{elsewhere[:16]}: " in out and "metadata names key" in out
    # The hit path's reader agrees on each, and drops what it rejects.
    assert _frontend._read_entry(root / "tilelang" / f"{good}.so", _key("good")) is not None
    code, data = run_json(capsys, "--dir", str(root), "verify", "--fix")
    assert data["removed"] == 2 and {b["key"] for b in data["bad"]} == {corrupt, elsewhere}
    assert sorted(p.name for p in (root / "tilelang").iterdir()) == [f"{good}.so"]
    code, data = run_json(capsys, "--dir", str(root), "verify")
    assert code == 0 and data["checked"] == 1


def test_the_hit_path_drops_an_entry_verify_calls_bad(root):
    digest = write_entry(root, "vadd")
    other = _key("other").digest
    path = root / "tilelang" / f"{other}.so"
    os.replace(root / "tilelang" / f"{digest}.so", path)  # vadd's entry at other's name
    assert _frontend._read_entry(path, _key("other")) is None and not path.exists()
    digest = write_entry(root, "vadd")
    art = _frontend._read_entry(root / "tilelang" / f"{digest}.so", _key("vadd"))
    assert art is not None and bytes(art.fields[0]).startswith(b"\x7fELF")


def test_prune_by_age_and_one_size_budget_across_stores_least_recently_used_first(capsys, root):
    now = time.time()
    old = write_entry(root, "old", created=now - 10 * 86400)
    mid = write_entry(root, "mid", created=now - 3 * 86400)
    new = write_entry(root, "new", created=now - 60)
    cache = cc.CodegenCache(root, write_behind=False)
    source_key = _key("a source entry").digest
    cache.store("source").put(source_key, frame("source", {"key": source_key, "mode": "source", "codegen": "c",
                                                           "source_format": "c", "created": now - 5 * 86400},
                                                [b"int f() { return 0; }" * 50]))
    cache.close()
    import sqlite3

    with sqlite3.connect(root / "source" / "cache.db") as conn:  # last used 5 days ago (prune goes by last use)
        conn.execute("UPDATE Cache SET access_time = ? WHERE key = ?", (now - 5 * 86400, source_key))
    code, data = run_json(capsys, "--dir", str(root), "prune", "--older-than", "7d")
    assert code == 0 and data["keys"] == [old] and not (root / "tilelang" / f"{old}.so").exists()
    # One budget for the stores together: the source entry (used 5 days ago) goes before `mid` (3 days;
    # a frontend entry's last use is when it was written).
    keep = (root / "tilelang" / f"{new}.so").stat().st_size
    code, data = run_json(capsys, "--dir", str(root), "prune", "--max-size", str(data["bytes_after"] - 1))
    assert data["keys"] == [source_key]
    code, data = run_json(capsys, "--dir", str(root), "prune", "--max-size", str(keep + 100), "--tilelang")
    assert data["keys"] == [mid] and data["bytes_after"] == keep
    assert [p.name for p in (root / "tilelang").iterdir()] == [f"{new}.so"]


def test_prune_sweeps_a_killed_writers_leftovers(capsys, root):
    digest = write_entry(root, "vadd")
    stale = root / "tilelang" / f"cgc-{digest}.so.123.456.tmp"
    stale.write_bytes(b"half an entry")
    fresh = root / "tilelang" / f"cgc-{digest}.so.789.1.tmp"
    fresh.write_bytes(b"being written")
    hour_ago = time.time() - 7200
    os.utime(stale, (hour_ago, hour_ago))
    code, data = run_json(capsys, "--dir", str(root), "prune", "--older-than", "30d")
    assert code == 0 and data["expired"] >= 1 and not stale.exists() and fresh.exists()
    assert (root / "tilelang" / f"{digest}.so").exists()


def test_only_the_caches_own_regular_files_are_read_or_removed(capsys, root, tmp_path):
    digest = write_entry(root, "vadd")
    outside = tmp_path / "precious.so"
    outside.write_bytes((root / "tilelang" / f"{digest}.so").read_bytes())
    link = root / "tilelang" / f"{'a' * 32}.so"
    link.symlink_to(outside)
    foreign = root / "tilelang" / "notes.so"
    foreign.write_bytes(b"someone else's")
    os.mkfifo(root / "tilelang" / f"{'b' * 32}.so")  # reading it would block
    store = PlainFiles(root / "tilelang")
    assert store.keys() == [digest] and len(store) == 1
    with pytest.raises(ArtifactError, match="symbolic link"):
        store.get("a" * 32)
    with pytest.raises(ValueError, match="32 lowercase hex"):
        store.path("../../etc/passwd")
    assert not store.delete("a" * 32) and not store.delete("b" * 32)
    assert [e["key"] for e in run_json(capsys, "--dir", str(root), "ls")[1]] == [digest]
    assert run_json(capsys, "--dir", str(root), "verify", "--fix")[1]["checked"] == 1
    run(capsys, "--dir", str(root), "prune", "--max-size", "0")
    assert not (root / "tilelang" / f"{digest}.so").exists()
    assert outside.exists() and link.is_symlink() and foreign.exists()
    write_entry(root, "again")
    cache = cc.CodegenCache(root, write_behind=False)
    assert cache.clear() == 1
    cache.close()
    assert outside.exists() and link.is_symlink() and foreign.exists()


def test_reads_are_bounded(tmp_path):
    store = PlainFiles(tmp_path, max_bytes=100)
    (tmp_path / f"{'c' * 32}.so").write_bytes(b"x" * 101)
    (tmp_path / f"{'d' * 32}.so").write_bytes(b"x" * 100)
    with pytest.raises(ArtifactError, match="at most 100 bytes"):
        store.get("c" * 32)
    assert store.get("d" * 32) == b"x" * 100 and store.get("e" * 32) is None
    assert store.volume() == 201


def test_cull_removes_the_least_recently_stored_until_the_store_fits(tmp_path):
    store = PlainFiles(tmp_path)
    keys = ["1" * 32, "2" * 32, "3" * 32]
    for age, key in zip((300, 200, 100), keys):
        path = tmp_path / f"{key}.so"
        path.write_bytes(b"x" * 1000)
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))
    assert store.cull(5000) == 0 and len(store) == 3
    assert store.cull(2000) == 1 and sorted(store.keys()) == keys[1:]
    # The entry just written stays even when it alone is over the limit.
    assert store.cull(0, keep=keys[1]) == 1 and store.keys() == [keys[1]]


@pytest.fixture
def tilelang_for_loading(monkeypatch):
    """The few tilelang modules _frontend._load imports, as stand-ins (tilelang is not installed here).

    The stand-in KernelCache loads `kernel_lib_path` with dlopen, as tilelang's adapters do.
    """
    import ctypes
    import sys
    import types

    def module(name, **attrs):
        found = types.ModuleType(name)
        found.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, found)
        return found

    class KernelCache:
        def _build_kernel(self, *, kernel_lib_path, **_kwargs):
            return kernel_lib_path, ctypes.CDLL(kernel_lib_path).which()

    def resolve_cache_dispatch(target, target_host, execution_backend, verbose):
        return KernelCache(), None, verbose

    for name in ("tilelang", "tilelang.engine", "tilelang.jit", "tilelang.jit.adapter", "tilelang.transform"):
        module(name)
    module("tilelang.engine.param", load_kernel_params=json.loads)
    module("tilelang.jit.adapter.base", CachedTextSource=lambda text: text)
    module("tilelang.transform.pass_config", normalize_pass_configs=lambda configs: configs)
    return types.SimpleNamespace(_resolve_cache_dispatch=resolve_cache_dispatch)


def test_a_tilelang_hit_loads_a_private_copy_of_the_checked_library_never_the_entry_file(
        root, tmp_path, tilelang_for_loading, monkeypatch):
    from test_checked_load import as_another_process, shared_library

    good = shared_library(tmp_path, "good", tmp_path / "good-ran", 1).read_bytes()
    evil_marker = tmp_path / "the-foreign-constructor-ran"
    evil = shared_library(tmp_path, "evil", evil_marker, 2)
    key = _key("vadd")
    meta = {"key": key.digest, "parts": key.as_dict(), "params": "[]", "build_seconds": 1.0, "func_names": ["vadd"]}
    entry = root / "tilelang" / f"{key.digest}.so"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(frame(_frontend.ENTRY_CODEC, meta, [good, b"// device", b"// host"]))
    get = PlainFiles.get

    def get_then_swap(store, digest):
        blob = get(store, digest)
        # Right after the entry was read, another process renames a foreign library over it.
        as_another_process(f"import os, shutil; shutil.copy({str(evil)!r}, {str(entry)!r} + '.new'); "
                           f"os.rename({str(entry)!r} + '.new', {str(entry)!r})")
        return blob

    monkeypatch.setattr(PlainFiles, "get", get_then_swap)
    cache = cc.CodegenCache(root)
    call = {"target": None, "target_host": None, "execution_backend": None, "out_idx": None, "pass_configs": None,
            "compile_flags": None, "verbose": None}
    (loaded_from, which), _seconds = _frontend._load(cache, key, None, call, tilelang_for_loading)
    assert which == 1 and not evil_marker.exists(), "the library loaded is not the one checked"
    assert entry.read_bytes() == evil.read_bytes()  # the swap did happen
    private = Path(loaded_from)
    assert private.parent == Path(cache.scratch_dir()) and private.name.endswith(f"-{key.digest}.so")
    assert private.stat().st_mode & 0o777 == 0o400
