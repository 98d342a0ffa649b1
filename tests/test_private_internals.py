"""Each private API of another library the package still uses: it is there, and it does what we rely on.

One test per use. A failure here means that library changed under us: switch that use to its
fallback (or to the public API) and measure again, as an A/B in the commit message
(docs/maintaining.md "What each one buys"). The raw layout of a tvm-ffi Function is checked in
tests/test_key_callbacks.py (test_the_python_callable_behind_a_function_is_found_and_a_cpp_one_is_not).
"""

from __future__ import annotations

import importlib
import inspect
import sqlite3
import sys
import threading
import time

import diskcache
import pytest
from processes import python

from codegen_cache._forksafe import _imports_of_other_threads
from codegen_cache._storage import _disk
from codegen_cache._storage._disk import ArtifactStore
from codegen_cache._storage._safedisk import SafeDisk
from codegen_cache.codegens import _common


def test_os_environ_private_dict_mirrors_every_change(monkeypatch):
    assert _common._RAW is not None and _common._ENCODE is not None, "os.environ has no _data: the fallback runs"
    names = ("CGC_TEST_PRIVATE_A", "CGC_TEST_PRIVATE_B")
    monkeypatch.setenv(names[0], "one")
    monkeypatch.delenv(names[1], raising=False)
    before = _common.env_values(names)
    assert before == (b"one", None) or before == ("one", None)
    monkeypatch.setenv(names[0], "two")
    monkeypatch.setenv(names[1], "x")
    assert _common.env_values(names) != before
    assert _common.env_salts(names) == {f"env:{names[0]}": "two", f"env:{names[1]}": "x"}


def test_os_environ_fallback_gives_the_same_salts(monkeypatch):
    monkeypatch.setenv("CGC_TEST_PRIVATE_A", "one")
    names = ("CGC_TEST_PRIVATE_A", "CGC_TEST_UNSET_B")
    private = _common.env_salts(names)
    monkeypatch.setattr(_common, "_RAW", None)
    assert _common.env_values(names) == ("one", None)
    assert _common.env_salts(names) == private == {"env:CGC_TEST_PRIVATE_A": "one", "env:CGC_TEST_UNSET_B": "<unset>"}


def test_diskcache_calls_the_value_file_writer_safedisk_replaces(tmp_path):
    # SafeDisk._write overrides a private method diskcache's Disk.store calls for a value file.
    assert list(inspect.signature(diskcache.Disk._write).parameters) == ["self", "full_path", "iterator", "mode",
                                                                          "encoding"]
    writes = []

    class CountingDisk(SafeDisk):
        def _write(self, full_path, iterator, mode, encoding=None):
            writes.append(full_path)
            return super()._write(full_path, iterator, mode, encoding)

    cache = diskcache.Cache(str(tmp_path / "s"), disk=CountingDisk, statistics=False)
    try:
        cache.set("big", b"v" * (64 << 10))
        cache.set("small", b"x")  # stays in the database: no file
    finally:
        cache.close()
    assert len(writes) == 1 and writes[0].endswith(".val")


def test_diskcache_table_has_the_columns_the_plain_reader_selects(tmp_path):
    store = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert store.put("k", b"x")
    with sqlite3.connect(tmp_path / "s" / "cache.db") as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(Cache)")}
    db.close()
    assert {"key", "raw", "mode", "filename", "value", "size", "expire_time"} <= columns
    assert (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY) == (_disk._MODE_RAW, _disk._MODE_BINARY)
    # The reader's answer, through a store this process never opened through diskcache.
    fresh = ArtifactStore(tmp_path / "s", size_limit=1 << 20)
    assert fresh.get("k") == b"x" and fresh._cache is None
    store.close(), fresh.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_writer_drains_before_atexit_handlers_registered_after_it():
    # threading._register_atexit runs the writer's exit wait before every atexit handler, also
    # one registered after the writer (atexit runs the last registered first): a temporary
    # directory's finalizer must not remove what a job still writes into.
    done = python("""
        import atexit, threading, time
        assert hasattr(threading, "_register_atexit"), "threading lost _register_atexit: the atexit fallback runs"
        from codegen_cache._cache._writer import writer
        atexit.register(lambda: print("atexit handler", flush=True))
        writer.submit(lambda: (time.sleep(0.3), print("job done", flush=True)))
    """)
    assert done.stdout.split("\n")[:2] == ["job done", "atexit handler"], done.stdout


def test_importlibs_module_locks_show_which_modules_other_threads_are_importing(tmp_path, monkeypatch):
    # fork() waits while _forksafe reads a module lock of importlib._bootstrap._module_locks
    # (name -> weak reference; `owner`, `count`) as held by another thread. Should that layout
    # change, the fork no longer waits and the lifecycle tests' children hang on the import.
    flag = tmp_path / "release"
    (tmp_path / "held_import.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.001)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = threading.Thread(target=importlib.import_module, args=("held_import",), daemon=True)
    thread.start()
    try:
        while "held_import" not in sys.modules:
            time.sleep(0.001)
        assert _imports_of_other_threads() == ["held_import"]
    finally:
        flag.touch()
        thread.join(30)
        sys.modules.pop("held_import", None)
    assert _imports_of_other_threads() == []
