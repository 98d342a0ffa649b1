"""One contract for every tier (memory, disk, remote), then the writer, the failure cache and the read-only view.

cachetools-style: the same tests run against each tier, through its one interface
(`get(probe) -> Hit | COLLISION | None`, `put(entry)`), on real storage: a memory tier, a
diskcache store in tmp_path, a real redis-server on a loopback port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import frame, function_names, prepare
from codegen_cache._cache._failures import MARKER, FailureCache
from codegen_cache._cache._guard import StorageGuard
from codegen_cache._cache._tiers import COLLISION, DiskTier, Entry, Hit, MemoryTier, Probe, RemoteTierView
from codegen_cache._cache._writer import Writer
from codegen_cache._errors import CachedCodegenError, ReadOnlyStoreError
from codegen_cache._storage._disk import ArtifactStore
from codegen_cache._storage._memory import ModuleLRU
from codegen_cache._storage._pending import PendingFiles
from codegen_cache._storage._readonly import ReadOnlyView
from conftest import CUDA_TARGET, run_binary
from time_limits import limit

DIGEST = "0123456789abcdef0123456789abcdef"


def _entry(kind: str, digest: str = DIGEST) -> Entry:
    """A built module and its entry (bytes included): llvm source of a vector add, or CUDA source."""
    kernel, target, compiled = (kernels.vadd, "llvm", False) if kind == "llvm" else (kernels.vadd_gpu, CUDA_TARGET, False)
    mod, tgt = cc.prepare_for_codegen(kernel, target)
    with cc.use_cache(None):
        module = cc.resolve_device_codegen(tgt).lower(mod, tgt, compile_device=compiled)
    meta = {"key": digest, "build_seconds": 0.25}
    codec, meta, fields = prepare(module, meta, func_names=function_names(mod))
    return Entry(digest, "source", module, mod, meta, frame(codec, meta, fields))


class _Tiers:
    """Builds each tier kind on real storage under one directory."""

    def __init__(self, root, redis_url):
        self.root = root
        self.redis_url = redis_url
        self.counts: list[str] = []
        self.guard = StorageGuard(root, self.counts.append)
        self.closers = []

    def make(self, kind: str):
        if kind == "memory":
            return MemoryTier(ModuleLRU(max_entries=8, max_bytes=1 << 24))
        if kind == "disk":
            stores = {m: ArtifactStore(self.root / m, size_limit=1 << 30) for m in ("compiled", "source")}
            staged = {m: PendingFiles(self.root / "staged" / m) for m in ("compiled", "source")}
            self.closers += [s.close for s in stores.values()]
            promoted = []

            def promote(mode, digest, blob):
                stores[mode].put(digest, blob)
                staged[mode].remove(digest, blob)
                promoted.append(digest)

            tier = DiskTier(stores=stores, staged=staged, guard=self.guard, scratch=lambda: str(self.root),
                            on_staged_hit=promote, on_raw_hit=lambda mode, digest: None)
            tier.promoted = promoted
            return tier
        from codegen_cache._storage._remote import RedisTier

        remote = RedisTier(self.redis_url, secret="s", on_event=self.counts.append)
        self.closers.append(remote.close)
        return RemoteTierView(remote=remote, guard=self.guard, scratch=lambda: str(self.root))


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run installs it)")
    from redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.close()


@pytest.fixture(params=["memory", "disk", "remote"])
def tier(request, tmp_path):
    url = request.getfixturevalue("redis_url") if request.param == "remote" else None
    tiers = _Tiers(tmp_path, url)
    made = tiers.make(request.param)
    if request.param == "remote":
        import redis

        with redis.Redis.from_url(url) as client:
            client.flushall()
    yield made
    for close in tiers.closers:
        close()


@pytest.fixture(scope="module")
def entries():
    return {kind: _entry(kind) for kind in ("llvm", "cuda")}


def _same_module(served, built):
    assert served.inspect_source("") == built.inspect_source("") or served.inspect_source("ll") == built.inspect_source("")


def test_an_empty_tier_answers_none(tier, entries):
    assert tier.get(Probe(DIGEST, "source", entries["cuda"].ir)) is None


@pytest.mark.parametrize("kind", ["llvm", "cuda"])
def test_a_put_entry_comes_back_with_its_source_and_metadata(tier, entries, kind):
    entry = entries[kind]
    tier.put(entry)
    hit = tier.get(Probe(entry.digest, entry.mode, entry.ir))
    assert isinstance(hit, Hit) and hit.tier == tier.name
    assert hit.entry.meta["key"] == entry.digest and hit.entry.meta["build_seconds"] == 0.25
    _same_module(hit.entry.module, entry.module)


def test_another_key_is_not_served(tier, entries):
    tier.put(entries["cuda"])
    assert tier.get(Probe("f" * 32, "source", entries["cuda"].ir)) is None


def test_an_entry_is_served_to_a_structurally_equal_module(tier, entries):
    entry = entries["cuda"]
    tier.put(entry)
    equal, _ = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    assert not equal.same_as(entry.ir)
    assert isinstance(tier.get(Probe(entry.digest, entry.mode, equal)), Hit)


def test_another_module_under_the_same_key_is_a_collision_where_the_tier_can_tell(tier, entries):
    # Memory compares modules always; disk and remote only with verify (the entry holds the IR's digest).
    cuda, llvm = entries["cuda"], entries["llvm"]
    if tier.name == "memory":
        tier.put(cuda)
        assert tier.get(Probe(cuda.digest, "source", llvm.ir)) is COLLISION
        return
    verified = Entry(cuda.digest, "source", cuda.module, cuda.ir, {**cuda.meta, "ir_digest": "0" * 32})
    codec, meta, fields = prepare(cuda.module, verified.meta, func_names=function_names(cuda.ir))
    verified.blob = frame(codec, meta, fields)
    tier.put(verified)
    assert tier.get(Probe(cuda.digest, "source", llvm.ir, verify=True)) is COLLISION
    assert tier.get(Probe(cuda.digest, "source", cuda.ir)) is not None  # without verify: trusted


def test_a_corrupt_entry_is_a_miss(tier, entries):
    if tier.name == "memory":
        pytest.skip("the memory tier holds modules, not bytes")
    entry = entries["cuda"]
    bad = bytearray(entry.blob)
    bad[len(bad) // 2] ^= 0xFF
    tier.put(Entry(entry.digest, entry.mode, entry.module, entry.ir, entry.meta, bytes(bad)))
    assert tier.get(Probe(entry.digest, entry.mode, entry.ir)) is None


def test_disk_serves_a_staged_entry_and_promotes_it(tmp_path, entries):
    tiers = _Tiers(tmp_path, None)
    disk = tiers.make("disk")
    entry = entries["llvm"]
    disk.staged["source"].write(entry.digest, entry.blob)  # a process that died before promoting it
    assert disk.stores["source"].get(entry.digest) is None
    hit = disk.get(Probe(entry.digest, "source", entry.ir))
    assert isinstance(hit, Hit) and disk.promoted == [entry.digest]
    assert disk.stores["source"].get(entry.digest) == entry.blob
    assert list(disk.staged["source"].digests()) == []
    for close in tiers.closers:
        close()


def test_an_llvm_module_served_by_memory_and_disk_runs(tmp_path):
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    cache.lower(mod, target)
    for module in (cache.lower(mod, target), cc.CodegenCache(tmp_path).lower(mod, target)):
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    cache.close()


# ---- the writer -----------------------------------------------------------------------------


def test_the_writer_outlives_a_failing_job_and_runs_the_rest_in_order(caplog):
    writer, done = Writer(name="test-writer"), []
    writer.submit(lambda: done.append(1))
    writer.submit(lambda: (_ for _ in ()).throw(RuntimeError("a remote went away")))
    writer.submit(lambda: done.append(3))
    assert writer.wait(10) and done == [1, 3] and writer.failures == 1
    assert "background store job failed" in caplog.text


def test_waiting_for_the_writer_is_bounded_even_if_a_job_hangs():
    start = time.monotonic()
    threading.Event().wait(0.3)  # a timed wait of the same length, at this run's load
    baseline = time.monotonic() - start
    writer, release = Writer(name="test-writer"), threading.Event()
    writer.submit(lambda: release.wait(30))
    start = time.monotonic()
    assert writer.wait(0.3) is False
    # The job hangs for 30 s: the wait ends near its 0.3 s, far below that.
    assert time.monotonic() - start < limit(baseline, at_least=1.0, at_most=10.0) and writer.pending() == 1
    release.set()
    assert writer.wait(10) and writer.pending() == 0


# ---- the failure cache ------------------------------------------------------------------------


def test_a_remembered_failure_is_raised_until_its_ttl_runs_out(tmp_path):
    counts: list[str] = []
    failures = FailureCache(ArtifactStore(tmp_path / "failures", size_limit=1 << 20), ttl=0.5,
                            guard=StorageGuard(tmp_path, counts.append), count=counts.append)
    failures.remember(DIGEST, "cuda", ValueError("bad tile size 7"))
    with pytest.raises(CachedCodegenError, match="^bad tile size 7\n.*remembered by the codegen cache") as info:
        failures.raise_if_failed(DIGEST, "cuda")
    assert (info.value.codegen, info.value.key, info.value.error_type) == ("cuda", DIGEST, "ValueError")
    assert isinstance(info.value, ValueError) and info.value.args == ("bad tile size 7",)
    failures.raise_if_failed("f" * 32, "cuda")  # another key: nothing
    time.sleep(0.6)
    failures.raise_if_failed(DIGEST, "cuda")  # expired
    assert counts == ["failures_stored", "failures_served"]


def test_a_failure_kept_with_an_ir_digest_is_raised_only_for_that_ir(tmp_path):
    failures = FailureCache(ArtifactStore(tmp_path / "failures", size_limit=1 << 20), ttl=60,
                            guard=StorageGuard(tmp_path, lambda _: None), count=lambda _: None)
    failures.remember(DIGEST, "cuda", RuntimeError("boom"), ir_digest="a" * 32)
    failures.raise_if_failed(DIGEST, "cuda", ir_digest=lambda: "b" * 32)  # another module, same key
    with pytest.raises(CachedCodegenError):
        failures.raise_if_failed(DIGEST, "cuda", ir_digest=lambda: "a" * 32)


REMEMBER_IN_ANOTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from codegen_cache._cache._failures import FailureCache
    from codegen_cache._cache._guard import StorageGuard
    from codegen_cache._storage._disk import ArtifactStore

    root = Path(sys.argv[1])
    failures = FailureCache(ArtifactStore(root / "failures", size_limit=1 << 20), ttl=60,
                            guard=StorageGuard(root, lambda _: None), count=lambda _: None)
    failures.remember(sys.argv[2], "cuda", ValueError("bad tile size 9"))
    """
)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_store_without_failures_is_not_read_and_one_another_process_writes_is(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path / "failures", size_limit=1 << 20)
    failures = FailureCache(store, ttl=60, guard=StorageGuard(tmp_path, lambda _: None), count=lambda _: None)
    reads: list[str] = []
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda digest: reads.append(digest) or real_get(digest))
    failures.raise_if_failed(DIGEST, "cuda")
    failures.raise_if_failed(DIGEST, "cuda")
    assert reads == [] and not (tmp_path / "failures" / MARKER).exists()  # never written to: no SQLite read
    done = subprocess.run([sys.executable, "-c", REMEMBER_IN_ANOTHER_PROCESS, str(tmp_path), DIGEST],
                          capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "failures" / MARKER).is_file()
    with pytest.raises(ValueError, match="bad tile size 9") as info:
        failures.raise_if_failed(DIGEST, "cuda")  # the very next lookup of this process
    assert isinstance(info.value, CachedCodegenError)
    failures.raise_if_failed("f" * 32, "cuda")
    assert reads == [DIGEST, "f" * 32]


# ---- the read-only view -----------------------------------------------------------------------


def test_a_read_only_store_serves_rows_and_refuses_writes(tmp_path, entries):
    directory = tmp_path / "source"
    store = ArtifactStore(directory, size_limit=1 << 30)
    store.put(DIGEST, entries["cuda"].blob)
    store.close()
    os.chmod(directory, 0o555)
    try:
        view = ReadOnlyView(directory, __import__("codegen_cache._storage._safedisk", fromlist=["SafeDisk"]).SafeDisk(
            str(directory)))
        assert view.get(DIGEST) == entries["cuda"].blob and len(view) == 1 and list(view) == [DIGEST]
        with pytest.raises(ReadOnlyStoreError):
            view.set("x", b"y")
        view.close()
    finally:
        os.chmod(directory, 0o755)
