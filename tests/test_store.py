"""The diskcache store keeps only str keys and bytes values, and never unpickles."""

from __future__ import annotations

import os
import pickle
import sqlite3
import time

import diskcache
import pytest

from codegen_cache._storage._disk import KEYS_DIR, STORAGE_ERRORS, ArtifactStore, UnsafeEntryError


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


def test_every_value_is_a_read_only_value_file(tmp_path):
    # Nothing is loaded from a value file in place (a hit loads its own copy of the bytes it
    # read and checked); a small value has a file too, so that its key file can name it.
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 30)
    store.put("lib", b"\x7fELF" + b"\0" * 1000)
    store.put("big", b"\x7fELF" + b"\0" * (64 << 10))
    for key in ("lib", "big"):
        path = store.read(key).path
        assert path is not None and os.stat(path).st_mode & 0o222 == 0  # never changed in place


DIGEST, OTHER = "0123456789abcdef" * 2, "fedcba9876543210" * 2


def _no_sqlite(*args, **kwargs):
    raise AssertionError("a lookup with a key file opened SQLite")


def test_a_lookup_with_a_key_file_reads_no_sqlite(tmp_path, monkeypatch):
    writer = ArtifactStore(tmp_path / "s", size_limit=1 << 30)
    assert writer.put(DIGEST, b"small") and writer.add(OTHER, b"b" * 100_000)
    assert sorted(os.listdir(tmp_path / "s" / KEYS_DIR)) == sorted([DIGEST, OTHER])
    monkeypatch.setattr(sqlite3, "connect", _no_sqlite)
    reader = ArtifactStore(tmp_path / "s", size_limit=1 << 30)  # a fresh process's store
    assert reader.get(DIGEST) == b"small" and reader.get(OTHER) == b"b" * 100_000


def test_a_key_file_that_leads_nowhere_sends_the_lookup_to_the_row(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 30)
    key_file = tmp_path / "s" / KEYS_DIR / DIGEST
    store.put(DIGEST, b"first")
    stale = key_file.read_bytes()
    store.put(DIGEST, b"second")  # the first value file is gone with its row
    assert key_file.read_bytes() != stale
    key_file.write_bytes(stale)
    assert store.get(DIGEST) == b"second"
    for planted in (b"../../../outside.val\n5\n", b"00/00/" + b"0" * 28 + b".val\n5\n", b"nonsense", b""):
        key_file.write_bytes(planted)
        assert store.get(DIGEST) == b"second"
    key_file.unlink()
    key_file.symlink_to(tmp_path / "elsewhere")
    assert store.get(DIGEST) == b"second"
    key_file.unlink()
    assert store.delete(DIGEST) is True and store.get(DIGEST) is None
    (tmp_path / "s" / KEYS_DIR).rmdir()
    (tmp_path / "s" / KEYS_DIR).symlink_to(tmp_path / "elsewhere-dir")  # no key file can be written
    assert store.put(DIGEST, b"third") and store.get(DIGEST) == b"third"  # stored all the same, read from its row


def test_key_files_go_with_their_entries(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1_000_000)
    keys = [f"{i:032x}" for i in range(400)]
    for key in keys:
        store.put(key, bytes(50_000))  # evicts as it goes: swept past a tenth of the entries, at least 64
        assert len(os.listdir(tmp_path / "s" / KEYS_DIR)) <= len(store) + 2 * 64  # counted every 64 evictions
    assert store.get(keys[-1]) == bytes(50_000) and store.get(keys[0]) is None
    store.expire()  # codegen-cache prune: every key file that leads nowhere goes
    assert set(os.listdir(tmp_path / "s" / KEYS_DIR)) == {key for key in keys if store.get(key) is not None}
    store.delete(keys[-1])
    assert keys[-1] not in os.listdir(tmp_path / "s" / KEYS_DIR)
    store.clear()
    assert os.listdir(tmp_path / "s" / KEYS_DIR) == []


def test_an_expiring_entry_has_no_key_file(tmp_path):
    # A key file would outlive its row's expiry: such entries are read from their row.
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 30)
    store.put(DIGEST, b"remembered", expire=0.05)
    assert store.get(DIGEST) == b"remembered"
    assert not (tmp_path / "s" / KEYS_DIR / DIGEST).exists()
    time.sleep(0.1)
    assert store.get(DIGEST) is None


def test_a_store_whose_table_is_not_made_yet_is_a_miss_then_a_hit(tmp_path):
    # Another thread or process opening the store makes cache.db before its table: a lookup in
    # between is a miss, never an error, and once the table is there the same reader finds rows.
    (tmp_path / "s").mkdir(mode=0o700)
    sqlite3.connect(tmp_path / "s" / "cache.db").close()  # the file, no table yet
    reader = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert reader.get("k") is None
    writer = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert writer.put("k", b"v")
    assert reader.get("k") == b"v"


def test_a_store_removed_under_its_process_is_read_again_after_the_next_write(tmp_path):
    # The store's own reader connection must follow diskcache's reopen: a connection left on
    # the removed database would miss every entry written after the removal.
    import shutil

    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert store.put("before", b"1") and store.get("before") == b"1"
    shutil.rmtree(tmp_path / "s")
    assert store.put("after", b"2")
    assert store.get("after") == b"2" and store.get("before") is None
    store.close()


def test_a_write_that_finds_the_store_locked_past_its_timeout_is_a_storage_error(tmp_path):
    # diskcache raises its own Timeout there; the cache turns only STORAGE_ERRORS into a miss or
    # a skipped store, so what reaches it must be one of them (an escaping Timeout would fail a
    # compile). Reads go on meanwhile; the write succeeds once the lock is let go.
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20, timeout=0.05)
    assert store.put("before", b"1")
    holder = sqlite3.connect(tmp_path / "s" / "cache.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write in progress
    try:
        with pytest.raises(STORAGE_ERRORS) as caught:
            store.put("during", b"2")
        assert isinstance(caught.value, TimeoutError) and "locked" in str(caught.value)
        assert store.get("before") == b"1" and store.get("during") is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.put("during", b"2") and store.get("during") == b"2"
    store.close()


def test_a_put_over_what_is_stored_reads_and_stores_in_one_transaction(tmp_path):
    # The llvm upgrader replaces an entry by its better form only where the entry is still the
    # one it read: no other process's put, delete or clear may come between the check and the put.
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    other = ArtifactStore(tmp_path / "s", size_limit=1 << 20, timeout=0.05)
    assert store.put("k", b"old") and other.put("unrelated", b"1")  # both open
    assert not store.put("k", b"new", over=lambda current: current == b"something else")
    assert store.get("k") == b"old"
    seen = []

    def over(current):
        seen.append(current)
        with pytest.raises(TimeoutError):  # another writer waits for this transaction
            other.put("k", b"theirs")
        with pytest.raises(TimeoutError):
            other.clear()
        return current == b"old"

    assert store.put("k", b"new", over=over)
    assert seen == [b"old"] and store.get("k") == b"new" and other.get("k") == b"new"
    assert store.delete("k")
    assert not store.put("k", b"newer", over=lambda current: current == b"new")  # gone: not brought back
    assert store.get("k") is None
    store.close(), other.close()
