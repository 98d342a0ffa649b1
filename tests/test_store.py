"""The diskcache store keeps only str keys and bytes values, and never unpickles."""

from __future__ import annotations

import pickle
import sqlite3

import diskcache
import pytest

from codegen_cache._storage._disk import ArtifactStore, UnsafeEntryError


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def test_bytes_round_trip(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert store.put("k", b"v" * 100_000)  # large: a file beside the database
    assert store.put("small", b"x")
    assert store.get("k") == b"v" * 100_000 and store.get("small") == b"x"
    assert sorted(store.keys()) == ["k", "small"]
    assert store.delete("k") and store.get("k") is None


def test_refuses_to_store_anything_but_bytes(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    with pytest.raises(TypeError, match="values must be bytes"):
        store.put("k", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys must be str"):
        store.put(("tuple",), b"x")  # type: ignore[arg-type]


def test_never_unpickles_a_planted_row(tmp_path):
    # Something else writes a pickled value into our directory (CVE-2025-69872).
    plain = diskcache.Cache(str(tmp_path / "s"))
    plain.set("k", Boom())
    plain.set(("pickled", "key"), b"v")
    plain.close()
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    with pytest.raises(UnsafeEntryError):
        store.get("k")
    with pytest.raises(UnsafeEntryError):
        list(store.keys())


def test_size_limit_evicts(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1_000_000)
    for i in range(40):
        store.put(f"k{i}", bytes(50_000))
    store.cull()
    assert store.volume() <= 1_000_000
    assert store.get("k39") == bytes(50_000)  # least-recently-stored goes first
    assert store.get("k0") is None


def test_stores_are_separate(tmp_path):
    a = ArtifactStore(tmp_path / "compiled", size_limit=1 << 20)
    b = ArtifactStore(tmp_path / "source", size_limit=1 << 20)
    a.put("k", b"compiled")
    assert b.get("k") is None
    assert pickle is not None and sqlite3 is not None


def test_a_small_shared_library_gets_a_value_file_of_its_own(tmp_path):
    # A framed shared library starts with the ELF magic; a hit maps it from its value file in
    # place, so it is never kept inside the database, however small.
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    small_lib = b"\x7fELF" + b"\0" * 1000
    store.put("lib", small_lib)
    store.put("text", b"not a library" * 10)
    row = store.read("lib")
    assert row.blob == small_lib and row.path is not None
    with open(row.path, "rb") as f:
        assert f.read() == small_lib
    assert store.read("text").path is None  # other small values stay in the database
