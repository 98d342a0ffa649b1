"""Eviction is least recently used, marks of use are written in batches, a model's parts go with it.

A hit marks its entry used without writing (a set in memory); the marks reach the store's rows when
the writer writes a batch, at flush() and at exit. A store over its limit loses the entries used
longest ago, down to a low-water mark under the limit, never more for a small overshoot.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame
from codegen_cache._storage._disk import ArtifactStore
from codegen_cache._storage._eviction import GROUP_TAG, LOW_WATER, on_disk
from codegen_cache._storage._layout import MODEL_CODEC
from codegen_cache._storage._usage import UseMarks
import processes
import variants

ENTRY = 20_000


def _access_times(store: ArtifactStore) -> dict[str, float]:
    with sqlite3.connect(store.directory / "cache.db") as conn:
        return dict(conn.execute("SELECT key, access_time FROM Cache"))


def _filled(tmp_path, count: int = 10) -> ArtifactStore:
    footprint_of_all = count * on_disk(ENTRY) + (64 << 10)
    store = ArtifactStore(tmp_path / "s", size_limit=footprint_of_all)
    for i in range(count):
        store.put(f"k{i}", bytes([i]) * ENTRY)
    return store


def test_a_used_entry_outlives_newer_ones_that_were_not_used(tmp_path):
    store = _filled(tmp_path)
    marks = UseMarks({"s": store})
    marks.mark("s", "k0")
    assert marks.write() == 1
    store.size_limit = store.footprint() - 1  # a small overshoot
    assert store.evict() >= 1
    assert store.get("k0") is not None  # stored first, used last: kept
    assert store.get("k1") is None  # the least recently used goes first


def test_a_small_overshoot_evicts_down_to_the_low_water_mark_not_everything(tmp_path):
    store = _filled(tmp_path)
    limit = store.footprint() - 1
    store.size_limit = limit
    evicted = store.evict()
    assert 1 <= evicted < 4
    assert store.footprint() <= LOW_WATER * limit
    assert len(store) == 10 - evicted
    assert store.evict() == 0  # under the limit now: the next put evicts nothing


def test_a_put_over_the_limit_evicts_the_least_recently_used_and_keeps_the_new_entry(tmp_path):
    store = _filled(tmp_path)
    marks = UseMarks({"s": store})
    for key in ("k0", "k1"):
        marks.mark("s", key)
    marks.write()
    store.put("new", b"n" * (4 * ENTRY))
    assert store.get("new") is not None and store.get("k0") is not None and store.get("k1") is not None
    assert store.get("k2") is None
    assert store.footprint() <= store.size_limit


def test_marking_use_writes_nothing_until_the_batch_is_written(tmp_path):
    store = _filled(tmp_path, 3)
    before = _access_times(store)
    marks = UseMarks({"s": store})
    for _ in range(100):
        marks.mark("s", "k0")  # a hundred hits of one entry: one row to write
    assert _access_times(store) == before
    assert marks.write() == 1
    after = _access_times(store)
    assert after["k0"] > before["k0"] and after["k1"] == before["k1"]


def test_a_full_batch_is_handed_to_the_background_writer(tmp_path):
    store = _filled(tmp_path, 1)
    jobs = []
    marks = UseMarks({"s": store}, background=jobs.append)
    for i in range(300):
        marks.mark("s", f"absent{i}")
    assert len(jobs) == 1  # once BATCH marks wait; not once per hit
    jobs[0]()
    assert marks.write() == 0  # nothing left


def test_marks_of_a_read_only_or_missing_store_are_dropped_quietly(tmp_path):
    missing = ArtifactStore(tmp_path / "none", size_limit=1 << 20)
    assert missing.mark_used(["k"], 1.0) == 0
    assert not (tmp_path / "none").exists()


def test_a_compiled_models_parts_are_evicted_with_it(tmp_path):
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    compiled, source, index = (cache.store(n) for n in ("compiled", "source", "index"))
    library = {"build_key": "b" * 32,
               "host": {"role": "host", "kind": "llvm", "codegen": "llvm", "mode": "compiled", "digest": "c" * 32},
               "devices": [{"role": "device", "kind": "cuda", "codegen": "cuda", "mode": "source", "digest": "d" * 32}]}
    model = frame(MODEL_CODEC, {"key": "a" * 32, "library": library}, [bytes(ENTRY)])
    assert compiled.put("a" * 32, model, tag=GROUP_TAG)
    compiled.put("c" * 32, bytes(ENTRY))
    source.put("d" * 32, bytes(ENTRY))
    index.put("b" * 32, b"index entry")
    for i in range(8):
        compiled.put(f"{i:032x}", bytes(ENTRY))
    marks = UseMarks(dict(compiled=compiled))
    marks.mark("compiled", "c" * 32)  # the library was used on its own: the model was not
    marks.write()
    compiled.size_limit = compiled.footprint() - 1
    compiled.evict()
    assert compiled.get("a" * 32) is None
    assert compiled.get("c" * 32) is None and source.get("d" * 32) is None and index.get("b" * 32) is None
    assert compiled.get(f"{7:032x}") is not None
    cache.close()


def test_a_hit_of_the_cache_marks_its_entry_used(tmp_path):
    cache = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)
    for i in range(4):
        cache.lower(*variants.variant(i))
    store = cache.store("compiled")
    before = _access_times(store)
    first = cache.key_for(*variants.variant(0)).digest
    again = cc.CodegenCache(tmp_path, min_codegen_time=0)  # another process's view: a disk hit
    again.lower(*variants.variant(0))
    assert again.stats(shared=False).hits_disk == 1
    assert _access_times(store) == before  # the hit wrote nothing
    again.flush()
    after = _access_times(store)
    assert after[first] > before[first]
    store.size_limit = store.footprint() - 1
    store.evict()
    assert store.get(first) is not None
    second = cache.key_for(*variants.variant(1)).digest
    assert store.get(second) is None
    cache.close()
    again.close()


@pytest.mark.slow
def test_a_process_that_only_hits_writes_its_marks_at_exit(tmp_path):
    cache = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)
    cache.lower(*variants.variant(0))
    digest = cache.key_for(*variants.variant(0)).digest
    cache.close()
    before = _access_times(cache.store("compiled"))[digest]
    processes.python(f"""
        import codegen_cache as cc, variants
        cache = cc.CodegenCache({str(tmp_path)!r}, min_codegen_time=0)
        cache.lower(*variants.variant(0))
        assert cache.stats(shared=False).hits_disk == 1
    """)
    assert _access_times(cache.store("compiled"))[digest] > before
    assert os.listdir(tmp_path / "compiled")  # the store is still there


def test_the_lru_benchmark_suite_returns_rows_with_a_floor():
    from benchmarks import suite_lru

    rows = suite_lru.run(1)
    assert [r["name"] for r in rows] == ["llvm vector add, memory hit, marking use",
                                         "llvm vector add, disk hit, marking use"]
    for row in rows:
        assert set(row) == {"name", "median", "unit", "floor", "ratio", "goal", "ok", "note"}
        assert row["median"] > 0 and row["floor"] > 0 and row["ratio"] == pytest.approx(row["median"] / row["floor"])
    assert suite_lru.DESCRIPTION


def test_a_compiled_relax_model_and_its_library_are_evicted_together(tmp_path):
    import relax_models
    import tvm

    import sqlite3 as sql

    cache = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)
    mod, _named = relax_models.mlp()
    cc.enable(cache, children=False)
    try:
        tvm.compile(mod, "llvm")
        cache.flush()
        with sql.connect(tmp_path / "compiled" / "cache.db") as conn:
            tagged = [k for (k,) in conn.execute("SELECT key FROM Cache WHERE tag = ?", (GROUP_TAG,))]
        assert len(tagged) == 1  # the model's entry
        model = cache.store("compiled").get(tagged[0])
        from codegen_cache._cache._groups import parts_of

        parts = list(parts_of(model))
        assert {store for store, _key in parts} >= {"index", "compiled"}
        assert all(cache.store(store).get(key) is not None for store, key in parts)
        with sql.connect(tmp_path / "compiled" / "cache.db") as conn:  # the model is the least recently used
            conn.execute("UPDATE Cache SET access_time = 0 WHERE key = ?", (tagged[0],))
        compiled = cache.store("compiled")
        compiled.size_limit = compiled.footprint() - 1
        assert compiled.evict() >= 1
        assert compiled.get(tagged[0]) is None
        assert all(cache.store(store).get(key) is None for store, key in parts)
    finally:
        cc.disable()
        cache.close()
    again = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)  # as a new process sees it
    cc.enable(again, children=False)
    try:
        tvm.compile(mod, "llvm")  # no model entry without its parts, nor parts without it: compiled again
        assert cc.last_outcome().tier == "codegen"
    finally:
        cc.disable()
        again.close()
