"""The Redis remote tier, against a real redis-server on a loopback port started here."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import frame
from codegen_cache._artifacts import FORMAT_VERSION
from codegen_cache._storage._remote import RedisTier
from conftest import counting_codegen, run_binary
from redis_server import RedisServer, _free_port, _need_redis_server

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install 'tvm-codegen-cache[redis]')")

SECRET = "team-secret-for-tests"
REMOTE_LOGGER = "codegen_cache._storage"  # the tier's modules: _remote, _health, _client
# A remote failure must cost at most one socket timeout (0.5 s) plus a build; this bound is
# generous for a busy 2-core machine and still far below anything that looks like a hang.
NO_HANG_SECONDS = 10.0


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server for the session, reaped at the end."""
    _need_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server):
    """The session server's URL, emptied before the test."""
    with redis_server.client() as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test alone (to kill or stop), reaped at the end."""
    _need_redis_server()
    server = RedisServer(tmp_path)
    yield server
    server.close()


@pytest.fixture
def hosts(tmp_path):
    """Make caches in separate directories ("hosts"); all closed at the end."""
    made = []

    def make(name, url, *, secret=SECRET, **kwargs):
        c = cc.CodegenCache(tmp_path / name, remote=url, remote_secret=secret, write_behind=False, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _check_vadd(module, kind):
    if kind == "llvm":
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    else:
        assert "__global__" in module.inspect_source("") and "vadd" in module.inspect_source("")


def _remote_records(caplog, level=logging.WARNING):
    return [r for r in caplog.records if r.name.startswith(REMOTE_LOGGER) and r.levelno >= level]


# ---- sharing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llvm", "cuda"])
def test_two_hosts_share_one_redis(hosts, redis_url, llvm_vadd, cuda_vadd, kind):
    mod, target = llvm_vadd if kind == "llvm" else cuda_vadd
    compile_device = kind == "llvm"  # CUDA: source-only, what a GPU-less host can produce
    codegen, calls = counting_codegen(kind, kind)
    a, b = hosts("a", redis_url), hosts("b", redis_url)
    built, o1 = a.lower_with_outcome(mod, target, codegen=codegen, compile_device=compile_device)
    module, o2 = b.lower_with_outcome(mod, target, codegen=codegen, compile_device=compile_device)
    assert (o1.tier, o2.tier, len(calls)) == ("codegen", "remote", 1)
    _check_vadd(module, kind)
    if kind == "cuda":
        assert module.inspect_source("") == built.inspect_source("")
    assert a.stats().remote_stores == 1
    assert (b.stats().hits_remote, b.stats().codegen_runs) == (1, 0)
    # The remote hit was stored on B's disk: another process on host B hits its disk.
    again = cc.CodegenCache(b.directory)
    try:
        assert again.lower_with_outcome(mod, target, codegen=codegen, compile_device=compile_device)[1].tier == "disk"
    finally:
        again.close()
    assert len(calls) == 1


def test_keys_are_namespaced_with_the_format_version(hosts, redis_url, redis_server, llvm_vadd):
    mod, target = llvm_vadd
    a = hosts("a", redis_url)
    a.lower(mod, target)
    key = a.key_for(mod, target).digest
    with redis_server.client() as client:
        assert [k.decode() for k in client.keys("*")] == [f"codegen-cache:v{FORMAT_VERSION}:{key}"]


def test_remote_from_environment(tmp_path, redis_url, monkeypatch, llvm_vadd):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE", redis_url)
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_SECRET", SECRET)
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    for name, tier in (("a", "codegen"), ("b", "remote")):
        c = cc.CodegenCache(tmp_path / name, write_behind=False)
        try:
            assert isinstance(c._remote, RedisTier) and c._remote.signed  # noqa: SLF001
            assert c.lower_with_outcome(mod, target, codegen=codegen)[1].tier == tier
            # The upgrader has the environment too: it pushes the library it links (before it is
            # done, so that it pushes nothing into the next test's emptied server).
            assert c.flush(60, upgrades=True)
        finally:
            c.close()
    assert len(calls) == 1
    with redis.Redis.from_url(redis_url) as client:
        assert len(client.keys(f"codegen-cache:v{FORMAT_VERSION}:lib:*")) == 1


# ---- rejected entries ------------------------------------------------------------------------


def _stored_value(server, cache, mod, target, codegen):
    name = cache._remote.redis_key(cache.key_for(mod, target, codegen=codegen).digest)  # noqa: SLF001
    with server.client() as client:
        return name, client.get(name)


@pytest.mark.parametrize("where", ["payload", "envelope", "truncated"])
def test_a_damaged_entry_is_rejected_counted_rebuilt_and_replaced(hosts, redis_url, redis_server, llvm_vadd, where,
                                                                   caplog):
    """Damaged for every reader (checksum, envelope, length): the rebuild replaces it."""
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    a = hosts("a", redis_url)
    a.lower(mod, target, codegen=codegen)
    name, value = _stored_value(redis_server, a, mod, target, codegen)
    garbled = bytearray(value)
    if where == "truncated":
        garbled = garbled[: len(garbled) // 2]
    else:
        garbled[{"payload": -100, "envelope": 0}[where]] ^= 0xFF
    with redis_server.client() as client:
        client.set(name, bytes(garbled))
    b = hosts("b", redis_url)
    module, outcome = b.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "codegen" and len(calls) == 2
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    assert (b.stats().remote_rejected, b.stats().hits_remote) == (1, 0)
    assert any("rejected remote entry" in r.getMessage() and "replaces the damaged value" in r.getMessage()
               for r in _remote_records(caplog))
    # B's rebuild replaced the bad entry: a third host hits it.
    assert b.stats().remote_replaced == 1
    assert hosts("c", redis_url).lower_with_outcome(mod, target, codegen=codegen)[1].tier == "remote"
    assert len(calls) == 2


def test_an_entry_with_a_bad_signature_is_rejected_and_left_in_place(hosts, redis_url, redis_server, llvm_vadd,
                                                                       caplog):
    """Another secret's entry and a tampered one look the same: not loaded, and never overwritten."""
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    a = hosts("a", redis_url)
    a.lower(mod, target, codegen=codegen)
    name, value = _stored_value(redis_server, a, mod, target, codegen)
    garbled = bytearray(value)
    garbled[10] ^= 0xFF  # inside the signature
    with redis_server.client() as client:
        client.set(name, bytes(garbled))
    b = hosts("b", redis_url)
    module, outcome = b.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "codegen" and len(calls) == 2
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    assert (b.stats().remote_rejected, b.stats().remote_kept, b.stats().remote_stores) == (1, 1, 0)
    with redis_server.client() as client:
        assert client.get(name) == bytes(garbled)
    assert any("left in place" in r.getMessage() for r in _remote_records(caplog))


@pytest.mark.parametrize("writer_secret", [None, "another-secret"], ids=["unsigned", "other-secret"])
def test_unsigned_or_badly_signed_entry_is_rejected(hosts, redis_url, llvm_vadd, writer_secret):
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    hosts("writer", redis_url, secret=writer_secret).lower(mod, target, codegen=codegen)
    reader = hosts("reader", redis_url)
    module, outcome = reader.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "codegen" and len(calls) == 2
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    assert reader.stats().remote_rejected == 1


def test_signature_binds_the_key(hosts, redis_url, redis_server):
    """A validly signed entry copied under another key is rejected."""
    vadd, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    vmul, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    codegen, calls = counting_codegen()
    a = hosts("a", redis_url)
    a.lower(vadd, target, codegen=codegen)
    _name, value = _stored_value(redis_server, a, vadd, target, codegen)
    vmul_name = a._remote.redis_key(a.key_for(vmul, target, codegen=codegen).digest)  # noqa: SLF001
    with redis_server.client() as client:
        client.set(vmul_name, value)
    b = hosts("b", redis_url)
    module, outcome = b.lower_with_outcome(vmul, target, codegen=codegen)
    assert outcome.tier == "codegen" and b.stats().remote_rejected == 1
    a_in = np.arange(1024, dtype="float32")
    np.testing.assert_array_equal(run_binary(module, "vmul"), a_in * a_in)


def test_signed_entry_with_bad_checksum_is_rejected(hosts, redis_url, llvm_vadd):
    """A writer holding the secret but storing a broken frame: the checksum catches it."""
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    a = hosts("a", redis_url)
    a.lower(mod, target, codegen=codegen)
    digest = a.key_for(mod, target, codegen=codegen).digest
    good = a._remote.get(digest)  # noqa: SLF001
    broken = bytearray(good)
    broken[-1] ^= 0x01
    with redis.Redis.from_url(redis_url) as client:
        client.delete(a._remote.redis_key(digest))  # noqa: SLF001 - put() never writes over an entry
    assert a._remote.put(digest, bytes(broken))  # noqa: SLF001 - put signs whatever it is given
    b = hosts("b", redis_url)
    assert b.lower_with_outcome(mod, target, codegen=codegen)[1].tier == "codegen"
    assert b.stats().remote_rejected == 1 and len(calls) == 2
    assert b.stats().remote_replaced == 1  # a bad frame is bad for everyone, signed or not


def test_a_pickle_in_redis_is_never_unpickled(hosts, redis_url, redis_server, llvm_vadd, tmp_path):
    mod, target = llvm_vadd
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self):
            return (Path.touch, (marker,))

    b = hosts("b", redis_url)
    name = b._remote.redis_key(b.key_for(mod, target).digest)  # noqa: SLF001
    with redis_server.client() as client:
        client.set(name, pickle.dumps(Bomb()))
    module, outcome = b.lower_with_outcome(mod, target)
    assert outcome.tier == "codegen" and b.stats().remote_rejected == 1 and not marker.exists()
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))


# ---- size cap and TTL -------------------------------------------------------------------------


def test_entries_over_the_size_cap_stay_local(hosts, redis_url, redis_server, llvm_vadd, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_MAX_ENTRY", "1K")
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    a = hosts("a", redis_url)
    assert a._remote.max_entry_bytes == 1024  # noqa: SLF001
    a.lower(mod, target, codegen=codegen)
    stats = a.stats()
    assert (stats.stores, stats.remote_stores, stats.remote_skipped) == (1, 0, 1)
    with redis_server.client() as client:
        assert client.dbsize() == 0
    assert hosts("b", redis_url).lower_with_outcome(mod, target, codegen=codegen)[1].tier == "codegen"
    assert len(calls) == 2


def test_a_planted_value_over_the_cap_is_not_read(hosts, redis_url, redis_server, llvm_vadd, monkeypatch):
    """The cap applies to reads, checked from the length Redis announces: 40 MiB is never read."""
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_MAX_ENTRY", "1M")
    # What is tested is the cap, not the deadline: a loaded machine (the whole suite) once took
    # over 0.5 s to answer the 40 MiB GET's header, an outage rather than a rejection.
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TIMEOUT", "5")
    mod, target = llvm_vadd
    b = hosts("b", redis_url)
    name = b._remote.redis_key(b.key_for(mod, target).digest)  # noqa: SLF001
    with redis_server.client() as client:
        client.set(name, bytes(40 << 20))
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        assert b._remote.get(b.key_for(mod, target).digest) is None  # noqa: SLF001
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20 and elapsed < NO_HANG_SECONDS, (peak, elapsed)
    module, outcome = b.lower_with_outcome(mod, target)
    assert outcome.tier == "codegen" and b.stats().remote_rejected == 1 and not b.stats().errors.get("remote")
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    # Not an outage, and not this host's to replace: a host with a larger cap may read it.
    assert b.stats().remote_kept == 1
    with redis_server.client() as client:
        assert client.strlen(name) == 40 << 20


def test_ttl_from_environment_is_set_on_each_entry(hosts, redis_url, redis_server, llvm_vadd, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TTL", "30s")
    mod, target = llvm_vadd
    a = hosts("a", redis_url)
    a.lower(mod, target)
    name = a._remote.redis_key(a.key_for(mod, target).digest)  # noqa: SLF001
    with redis_server.client() as client:
        assert 25_000 < client.pttl(name) <= 30_000


def test_entries_expire_after_the_ttl_and_zero_means_never(redis_url, redis_server):
    events = []
    short = RedisTier(redis_url, secret=SECRET, ttl=0.3, on_event=lambda name, amount=1: events.append(name))
    forever = RedisTier(redis_url, secret=SECRET, ttl=0)
    blob = frame("source", {"key": "k"}, [b"__global__ void k() {}"])
    try:
        assert short.put("a" * 32, blob) and forever.put("b" * 32, blob)
        assert short.get("a" * 32) == blob
        time.sleep(0.6)
        assert short.get("a" * 32) is None and events[-1] == "remote_misses"
        with redis_server.client() as client:
            assert client.pttl(forever.redis_key("b" * 32)) == -1
    finally:
        short.close()
        forever.close()


# ---- Redis down, slow, refusing --------------------------------------------------------------


def test_redis_killed_mid_run_still_correct_and_fast(tmp_path, own_redis, caplog):
    vadd, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    vmul, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    codegen, calls = counting_codegen()
    a = cc.CodegenCache(tmp_path / "a", remote=own_redis.url, remote_secret=SECRET)  # write-behind, as in use
    b = cc.CodegenCache(tmp_path / "b", remote=own_redis.url, remote_secret=SECRET)
    try:
        a.lower(vadd, target, codegen=codegen)
        a.flush()
        own_redis.kill()
        ones = np.arange(1024, dtype="float32")
        for cache, mod, func, expected in ((a, vmul, "vmul", ones * ones), (b, vadd, "vadd", 2 * ones),
                                           (b, vmul, "vmul", ones * ones)):
            t0 = time.perf_counter()
            module, outcome = cache.lower_with_outcome(mod, target, codegen=codegen)
            elapsed = time.perf_counter() - t0
            assert outcome.tier in ("codegen", "memory") and elapsed < NO_HANG_SECONDS, (outcome, elapsed)
            np.testing.assert_array_equal(run_binary(module, func), expected)
        a.flush()
        b.flush()
        sa, sb = a.stats(), b.stats()
        assert sa.errors.get("remote", 0) + sb.errors.get("remote", 0) >= 2
        assert sb.remote_offline >= 1  # later calls did not even try the dead server
    finally:
        a.close()
        b.close()
    assert len(calls) == 4  # vadd on A before the kill; then vmul on A, vadd and vmul on B
    # One warning per tier (cache), whatever the number of failed calls.
    warnings = [r for r in _remote_records(caplog) if "local-only" in r.getMessage()]
    assert len(warnings) == 2


def test_hung_redis_costs_one_timeout_then_local_only(tmp_path, own_redis, caplog):
    """A server that accepts connections but never answers (SIGSTOP): no hang, one warning."""
    vadd, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    vmul, _ = cc.prepare_for_codegen(kernels.vmul, "llvm")
    c = cc.CodegenCache(tmp_path / "c", remote=own_redis.url, remote_secret=SECRET)
    try:
        own_redis.proc.send_signal(signal.SIGSTOP)
        t0 = time.perf_counter()
        c.lower(vadd, target)
        c.lower(vmul, target)
        c.flush()
        elapsed = time.perf_counter() - t0
        assert elapsed < NO_HANG_SECONDS
        stats = c.stats()
        # The first lookup timed out; the rest (the lease re-check, vmul, both stores) skipped Redis.
        assert stats.errors.get("remote") == 1 and stats.remote_offline >= 3 and stats.codegen_runs == 2
    finally:
        own_redis.proc.send_signal(signal.SIGCONT)
        c.close()
    assert len([r for r in _remote_records(caplog) if "local-only" in r.getMessage()]) == 1


def test_tier_comes_back_after_the_backoff(own_redis, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOGGER)
    tier = RedisTier(own_redis.url, secret=SECRET, timeout=0.2, backoff=0.3)
    blob = frame("source", {"key": "k"}, [b"x"])  # noqa: SLF001
    try:
        own_redis.proc.send_signal(signal.SIGSTOP)
        assert tier.put("k" * 32, blob) is False
        assert tier.get("k" * 32) is None  # offline: no wait
        own_redis.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 5  # a busy machine may need more than one backoff period
        # The timed-out SET reached the stopped server and ran at SIGCONT: it is "kept" now.
        while tier.push("k" * 32, blob) == "failed":
            assert time.monotonic() < deadline, "the tier did not come back after SIGCONT"
            time.sleep(0.1)
        assert tier.get("k" * 32) == blob
    finally:
        own_redis.proc.send_signal(signal.SIGCONT)
        tier.close()
    assert any("reachable again" in r.getMessage() for r in _remote_records(caplog, logging.INFO))


def test_refused_connection_compiles_locally(tmp_path, llvm_vadd, caplog):
    """Nothing listens on the port: connection refused, the cache works local-only."""
    mod, target = llvm_vadd
    url = f"redis://127.0.0.1:{_free_port()}/0"
    c = cc.CodegenCache(tmp_path / "c", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        t0 = time.perf_counter()
        module = c.lower(mod, target)
        assert time.perf_counter() - t0 < NO_HANG_SECONDS
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
        assert c.lower_with_outcome(mod, target)[1].tier == "memory"
        assert c.stats().errors.get("remote") == 1
    finally:
        c.close()
    assert len(_remote_records(caplog)) == 1


# ---- TLS -------------------------------------------------------------------------------------


def _make_certs(directory: Path) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed; the rediss:// test needs it to make certificates")
    directory.mkdir()

    def run(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=120)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=codegen-cache test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return directory


@pytest.fixture
def tls_redis(tmp_path):
    """A redis-server that speaks only TLS, with its CA; reaped at the end."""
    _need_redis_server()
    server = RedisServer(tmp_path, tls=_make_certs(tmp_path / "certs"))
    yield server
    server.close()


def test_rediss_shares_entries_and_an_untrusted_server_is_local_only(hosts, tls_redis, llvm_vadd, caplog):
    mod, target = llvm_vadd
    codegen, calls = counting_codegen()
    hosts("a", tls_redis.url).lower(mod, target, codegen=codegen)
    assert hosts("b", tls_redis.url).lower_with_outcome(mod, target, codegen=codegen)[1].tier == "remote"
    assert len(calls) == 1
    # Without the team CA the server's certificate does not verify: nothing is read from it.
    untrusted = hosts("c", tls_redis.url.partition("?")[0])
    module, outcome = untrusted.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "codegen" and len(calls) == 2
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    assert untrusted.stats().errors.get("remote") == 1
    assert any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in _remote_records(caplog))


# ---- connections ------------------------------------------------------------------------------


def _connections_received(server) -> int:
    with server.client() as client:
        return int(client.info("stats")["total_connections_received"])


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_one_connection_serves_many_calls(request, tls):
    """Connections are reused (a TLS session included), not opened per call."""
    server = request.getfixturevalue("tls_redis" if tls else "own_redis")
    tier = RedisTier(server.url, secret=SECRET)
    blob = frame("source", {"key": "k"}, [b"__global__ void k() {}"])
    before = _connections_received(server)
    try:
        for i in range(20):
            assert tier.put(f"{i:032d}", blob) and tier.get(f"{i:032d}") == blob
    finally:
        tier.close()
    assert _connections_received(server) - before == 2  # the tier's one, and this count's own


def test_threads_share_the_tier_and_each_gets_its_own_answer(redis_url):
    """8 threads x 40 calls on distinct keys and sizes: every reply goes to the thread that asked."""
    import threading

    events = []
    tier = RedisTier(redis_url, secret=SECRET, on_event=lambda name, n=1: events.append(name))
    blobs = {t: frame("source", {"key": str(t)}, [os.urandom(100 + 3000 * t)]) for t in range(8)}
    wrong = []

    def work(t):
        for i in range(40):
            digest = f"{t:02d}{i:030d}"
            if not tier.put(digest, blobs[t]) or tier.get(digest) != blobs[t]:
                wrong.append((t, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        tier.close()
    assert not wrong and "error:remote" not in events and events.count("remote_stores") == 320


def test_a_forked_child_opens_its_own_connection(own_redis):
    """The child never speaks on the parent's socket; both go on working."""
    events = []
    tier = RedisTier(own_redis.url, secret=SECRET, on_event=lambda name, n=1: events.append(name))
    blob = frame("source", {"key": "k"}, [b"__global__ void k() {}"])
    try:
        assert tier.put("p" * 32, blob)
        before = _connections_received(own_redis)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if its calls worked
            ok = tier.get("p" * 32) == blob and tier.put("c" * 32, blob) and tier.get("c" * 32) == blob
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for _ in range(5):
            assert tier.get("c" * 32) == blob and tier.get("p" * 32) == blob
        assert _connections_received(own_redis) - before == 2  # the child's one, and this count's own
    finally:
        tier.close()
    assert "error:remote" not in events


# ---- unix socket, password, database ---------------------------------------------------------


def test_unix_socket_with_password_and_database(tmp_path):
    """unix://:password@/path?db=N: AUTH and SELECT on connect, entries shared, other databases untouched."""
    _need_redis_server()
    sock = tmp_path / "redis.sock"
    (tmp_path / "redis.conf").write_text(f"port 0\nunixsocket {sock}\nunixsocketperm 700\nsave \"\"\n"
                                         f"appendonly no\ndir {tmp_path}\nrequirepass pw%/word\n")
    proc = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(unix_socket_path=str(sock), password="pw%/word", socket_timeout=5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        blob = frame("source", {"key": "k"}, [b"__global__ void k() {}"])
        url = f"unix://:pw%25%2Fword@{sock}?db=3"
        writer, reader = RedisTier(url, secret=SECRET), RedisTier(url, secret=SECRET)
        try:
            assert writer.put("k" * 32, blob) and reader.get("k" * 32) == blob
        finally:
            writer.close()
            reader.close()
        assert client.dbsize() == 0 and client.execute_command("SELECT", 3) and client.dbsize() == 1
        events = []
        wrong = RedisTier(f"unix://:nope@{sock}?db=3", secret=SECRET, on_event=lambda name, n=1: events.append(name))
        assert wrong.get("k" * 32) is None and events == ["error:remote"]
        wrong.close()
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://cache.example:6379", "scheme 'http'"),
        ("127.0.0.1:6379", "no scheme"),
        ("redis://", "no host"),
        ("redis://127.0.0.1:99999/0", "out of range"),
        ("redis://127.0.0.1:6379/zero", "database 'zero'"),
        ("unix://", "socket path"),
        ("redis://127.0.0.1:6379/0?socket_keepalive=1", "unknown URL option 'socket_keepalive'; accepted: db,"),
        ("redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", "needs a rediss:// URL"),
        ("rediss://127.0.0.1:6379/0?ssl_cert_reqs=maybe", "not one of none, optional, required"),
        ("rediss://127.0.0.1:6379/0?ssl_ca_certs=/no/such/ca.pem", "cannot load the TLS certificates"),
        ("redis://127.0.0.1:6379/0?timeout=0", "timeout='0' is not a number of seconds above 0"),
        ("unix:///run/redis.sock?db=one", "database 'one'"),
        ("", ""),
    ],
)
def test_bad_url_error_names_the_value_and_what_is_accepted(url, why):
    with pytest.raises(cc.ConfigError, match="CODEGEN_CACHE_REMOTE") as info:
        RedisTier(url)
    message = str(info.value)
    assert repr(url) in message and why in message
    assert "redis://" in message and "rediss://" in message and "unix://" in message


def test_the_variable_rejects_the_url_options_the_tier_rejects():
    from codegen_cache._config import settings_from_env

    with pytest.raises(cc.ConfigError, match="CODEGEN_CACHE_REMOTE.*unknown URL option 'retry_on_timeout'"):
        settings_from_env({"CODEGEN_CACHE_REMOTE": "redis://127.0.0.1:6379/0?retry_on_timeout=yes"})


def test_bad_url_error_hides_the_password():
    with pytest.raises(cc.ConfigError, match=r"redis://:\*\*\*@h:6379/x") as info:
        RedisTier("redis://:hunter2@h:6379/x")
    assert "hunter2" not in str(info.value)


def test_cache_with_bad_remote_fails_at_construction(tmp_path):
    with pytest.raises(cc.ConfigError, match="'ftp://x'.*expected redis://"):
        cc.CodegenCache(tmp_path, remote="ftp://x")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_entry_bytes": 0}, "remote_max_entry_bytes"),
        ({"ttl": -1}, "remote_ttl"),
        ({"timeout": 0}, "timeout"),
        ({"secret": ""}, "remote_secret"),
    ],
)
def test_bad_options_fail_at_construction(kwargs, match):
    with pytest.raises(cc.ConfigError, match=match):
        RedisTier("redis://127.0.0.1:6379/0", **kwargs)


def test_good_urls_are_accepted_without_connecting():
    for url in ("redis://127.0.0.1:1/0", "rediss://user:pw@cache.internal:6380/2",
                "unix:///run/redis/redis.sock?db=1", "redis://[::1]:6379",
                "rediss://cache.internal:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false"):
        RedisTier(url, secret=SECRET).close()


def test_url_options_set_the_deadline_database_and_credentials():
    endpoint = RedisTier("redis://us%40er:p%3Ass@h:7000/1?timeout=2", secret=SECRET)._client.endpoint  # noqa: SLF001
    assert (endpoint.address, endpoint.db, endpoint.timeout) == (("h", 7000), 1, 2.0)
    assert (endpoint.username, endpoint.password, endpoint.tls) == ("us@er", "p:ss", None)
    assert RedisTier("rediss://h/0?db=4", secret=SECRET)._client.endpoint.db == 4  # noqa: SLF001


# ---- measurement (not in the default run) ------------------------------------------------------


@pytest.mark.stress
def test_measure_remote_costs(tmp_path, redis_url, capsys):
    """Figures for docs/remote.md: pytest tests/test_remote.py --stress -k measure -s"""
    tier = RedisTier(redis_url, secret=SECRET)
    lines = []
    for size in (16 << 10, 1 << 20, 16 << 20):
        blob = frame("source", {"key": "k"}, [os.urandom(size)])
        puts, gets = [], []
        for i in range(20 if size < (16 << 20) else 5):
            t0 = time.perf_counter()
            assert tier.put(f"{size}-{i}", blob)
            puts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert tier.get(f"{size}-{i}") == blob
            gets.append(time.perf_counter() - t0)
        lines.append(f"entry {size >> 10:>6} KiB: put {statistics.median(puts) * 1e3:8.2f} ms, "
                     f"get+verify {statistics.median(gets) * 1e3:8.2f} ms (median)")
    # The tier's own client against redis-py, side by side on the same server and values.
    from codegen_cache._storage._client import RespClient
    from codegen_cache._storage._endpoint import Endpoint

    own = RespClient(Endpoint.from_url(redis_url, 5.0))
    with redis.Redis.from_url(redis_url) as other:
        for size in (1 << 10, 16 << 10, 1 << 20, 16 << 20):
            value = os.urandom(size)
            other.set(b"raw", value)
            # Each client SETs its own key: overwriting a key the other just wrote costs a free.
            calls = {("GET", "own"): lambda: own.get(b"raw", 64 << 20), ("GET", "redis-py"): lambda: other.get(b"raw"),
                     ("SET", "own"): lambda: own.set(b"own", value, 60_000),
                     ("SET", "redis-py"): lambda: other.set(b"redis-py", value, px=60_000)}
            times = {call: [] for call in calls}
            for _ in range(30 if size < (16 << 20) else 7):
                for call, run in calls.items():
                    t0 = time.perf_counter()
                    run()
                    times[call].append(time.perf_counter() - t0)
            for command in ("GET", "SET"):
                ours, theirs = (statistics.median(times[command, who]) for who in ("own", "redis-py"))
                lines.append(f"raw {command} {size >> 10:>6} KiB: own client {ours * 1e3:8.3f} ms, "
                             f"redis-py {theirs * 1e3:8.3f} ms (median; ratio {ours / theirs:.2f})")
    own.close()
    misses = []
    for i in range(50):
        t0 = time.perf_counter()
        assert tier.get(f"missing-{i}") is None
        misses.append(time.perf_counter() - t0)
    lines.append(f"get of a missing key: {statistics.median(misses) * 1e3:.2f} ms (median)")
    tier.close()

    # What a miss costs the caller with and without the remote (write-behind: the put is on the
    # writer thread). recache=True rebuilds and stores every time.
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    for label, remote in (("no remote", None), ("remote", redis_url)):
        c = cc.CodegenCache(tmp_path / label, remote=remote, remote_secret=SECRET, recache=True)
        c.lower(mod, target)
        c.flush()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            c.lower(mod, target)
            times.append(time.perf_counter() - t0)
            c.flush()
        c.close()
        lines.append(f"lower() of a built llvm vadd, caller side, {label}: {statistics.median(times) * 1e3:.2f} ms")
    blob_size = len(frame("source", {}, [b""]))
    lines.append(f"(frame overhead {blob_size} bytes, envelope 6 + 32 bytes)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_a_plain_url_at_a_tls_port_says_to_use_rediss(tls_redis, caplog):
    """The server resets a plain-text client: the tier asks it for TLS and says what to change."""
    events = []
    tier = RedisTier(f"redis://127.0.0.1:{tls_redis.port}/0", secret=SECRET, on_event=lambda n, k=1: events.append(n))
    try:
        t0 = time.perf_counter()
        assert tier.get("k" * 32) is None
        assert time.perf_counter() - t0 < NO_HANG_SECONDS
    finally:
        tier.close()
    assert events == ["error:remote"]
    message = " ".join(r.getMessage() for r in _remote_records(caplog))
    assert "speaks TLS" in message and "use a rediss:// URL" in message
