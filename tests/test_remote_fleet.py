"""A fleet on one machine: "host" processes, each with its own cache directory, sharing a real redis-server.

What a fleet relies on: no host can spoil what the others stored, a refused write never stops
reads, every returned miss reaches the remote (after os._exit, SIGKILL, Pool.terminate), the
fleet builds each key about once (a build lease in the remote), hits keep entries alive, and
the remote serves llvm entries as shared libraries for hosts of the same platform.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import codegen_cache as cc
from codegen_cache._artifacts import FORMAT_VERSION, frame, read_meta
from codegen_cache._cache import _upgrade
from codegen_cache._storage._envelope import open_value, seal
from codegen_cache._storage._platform import library_platform
from conftest import counting_codegen, run_binary
from redis_server import RedisServer, _need_redis_server
from variants import variant

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install 'tvm-codegen-cache[redis]')")

pytestmark = pytest.mark.timeout(240)

PREFIX = f"codegen-cache:v{FORMAT_VERSION}:"  # the remote tier's keys for this entry format
SECRET = "team-secret-for-tests"
HERE = Path(__file__).parent
HOST = HERE / "fleet_host.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One redis-server for this module, reaped at the end."""
    _need_redis_server()
    made = RedisServer(tmp_path_factory.mktemp("fleet-redis"))
    yield made
    made.close()


@pytest.fixture
def url(server):
    """The module's server, emptied before the test."""
    with server.client() as client:
        client.flushall()
    return server.url


@pytest.fixture
def hosts(tmp_path):
    """Caches in separate directories ("hosts" in this process); all closed at the end."""
    made = []

    def make(name, url, *, secret=SECRET, **kwargs):
        c = cc.CodegenCache(tmp_path / name, remote=url, remote_secret=secret, write_behind=False, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _environ(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **extra}


def _host(directory: Path, first: int, count: int, url: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A host process (tests/fleet_host.py); its stdout gives one JSON line."""
    return subprocess.Popen([sys.executable, str(HOST), str(directory), str(first), str(count), "--remote", url,
                             "--secret", SECRET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_environ(**(env or {})), start_new_session=True)


def _result(proc: subprocess.Popen, timeout: float = 200) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _entry_keys(client) -> set[bytes]:
    return {k for k in client.keys("codegen-cache:v*") if b":lease:" not in k and b":lib:" not in k}


def _check(module, i: int) -> None:
    """The variant's kernel runs and adds i."""
    import tvm

    a = np.arange(256, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(256, "float32"))
    module[f"add_{i}"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), a + i)


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


# ---- 1. no host spoils what others stored ------------------------------------------------------


def test_a_host_with_the_wrong_secret_spoils_nothing_and_says_why(hosts, url, server, caplog):
    mods = [variant(i) for i in range(6)]
    codegen, calls = counting_codegen()
    good = hosts("good", url)
    for mod, target in mods:
        good.lower(mod, target, codegen=codegen)
    with server.client() as client:
        before = {k: client.get(k) for k in _entry_keys(client)}
    assert len(before) == 6

    wrong = hosts("wrong", url, secret="not-the-fleet-secret")
    for i, (mod, target) in enumerate(mods):
        _check(wrong.lower(mod, target, codegen=codegen), i)
    extra, extra_target = variant(99)
    wrong.lower(extra, extra_target, codegen=codegen)  # a key nobody stored: it is not written either
    stats = wrong.stats()
    assert (stats.remote_rejected, stats.codegen_runs, stats.remote_stores) == (6, 7, 0)
    with server.client() as client:
        assert {k: client.get(k) for k in _entry_keys(client)} == before  # byte for byte
    secret_warnings = [r for r in caplog.records if "likely not the one the fleet writes with" in r.getMessage()]
    assert len(secret_warnings) == 1 and secret_warnings[0].levelno == logging.WARNING

    # The fleet's hosts still hit every entry; the wrong host's failures cost them nothing.
    other = hosts("other", url)
    assert [other.lower_with_outcome(m, t, codegen=codegen)[1].tier for m, t in mods] == ["remote"] * 6
    assert len(calls) == 6 + 7


def test_a_rejected_entry_counts_once_and_a_good_host_says_another_host_differs(hosts, url, server, caplog):
    """Signature failures beside verified entries: the warning blames another host, and writes go on."""
    mods = [variant(i) for i in range(10, 15)]
    codegen, _calls = counting_codegen()
    other = hosts("other-secret", url, secret="another-secret")
    for mod, target in mods[:3]:
        other.lower(mod, target, codegen=codegen)
    fleet = hosts("fleet", url)
    for mod, target in mods[3:]:
        fleet.lower(mod, target, codegen=codegen)
    reader = hosts("reader", url)
    for mod, target in reversed(mods):  # the good ones first
        reader.lower(mod, target, codegen=codegen)
    assert (reader.stats().hits_remote, reader.stats().remote_rejected) == (2, 3)
    messages = [r.getMessage() for r in caplog.records if "failed the signature check" in r.getMessage()]
    assert len(messages) == 1 and "another host writes with a different" in messages[0]
    new, new_target = variant(16)
    reader.lower(new, new_target, codegen=codegen)
    assert reader.stats().remote_stores == 1  # not the wrong one: it goes on writing


# ---- 3. writes fail alone ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica(server, tmp_path_factory):
    """A replica of the module's server (--replicaof), reaped at the end."""
    made = RedisServer(tmp_path_factory.mktemp("fleet-replica"), options=["--replicaof", "127.0.0.1", str(server.port)])
    yield made
    made.close()


def _synced(server, replica, keys: int) -> None:
    """Until the replica holds the master's entries (by name: its old keys may not be flushed yet)."""
    with server.client() as client:
        names = _entry_keys(client)
    assert len(names) == keys, names
    deadline = time.monotonic() + 30
    with replica.client() as client:
        while not all(client.exists(n) for n in names):
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.05)


def test_a_read_only_replica_refuses_writes_and_reads_go_on(hosts, url, server, replica, caplog):
    mods = [variant(i) for i in range(20, 32)]
    codegen, calls = counting_codegen()
    writer = hosts("writer", url)
    for mod, target in mods[:10]:
        writer.lower(mod, target, codegen=codegen)
    _synced(server, replica, 10)
    reader = hosts("reader", replica.url)
    tiers = []
    for i, (mod, target) in zip(range(20, 32), mods):
        module, outcome = reader.lower_with_outcome(mod, target, codegen=codegen)
        tiers.append(outcome.tier)
        _check(module, i)
    reader.flush()
    # Two misses there: their lease (a write) came back READONLY; every entry the replica holds was read.
    assert tiers == ["remote"] * 10 + ["codegen"] * 2 and len(calls) == 12
    assert reader.stats().errors.get("remote") == 1 and reader.stats().hits_remote == 10
    readonly = [r.getMessage() for r in caplog.records if "READONLY" in r.getMessage()]
    assert len(readonly) == 1 and "reads go on" in readonly[0] and "CODEGEN_CACHE_REMOTE_READ_ONLY=1" in readonly[0]


def test_read_only_mode_reads_and_never_writes(hosts, url, server, replica, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_READ_ONLY", "1")
    mods = [variant(i) for i in range(40, 44)]
    codegen, calls = counting_codegen()
    with server.client() as client:
        client.config_resetstat()
    writer = hosts("writer", url, settings=cc.Settings(remote_read_only=False))
    for mod, target in mods[:2]:
        writer.lower(mod, target, codegen=codegen)
    _synced(server, replica, 2)
    with replica.client() as client:
        client.config_resetstat()
    consumer = hosts("consumer", replica.url)
    assert consumer._remote.read_only  # noqa: SLF001 - from the variable
    assert [consumer.lower_with_outcome(m, t, codegen=codegen)[1].tier for m, t in mods] == ["remote"] * 2 + ["codegen"] * 2
    consumer.flush()
    stats = consumer.stats()
    assert not stats.errors and stats.remote_stores == 0 and stats.remote_offline == 0
    with replica.client() as client:
        commands = client.info("commandstats")
    # PING: the master's heartbeat to its replicas (every repl-ping-replica-period), not ours.
    ours = {k for k in commands if k not in ("cmdstat_config|resetstat", "cmdstat_hello", "cmdstat_info",
                                             "cmdstat_ping")}
    assert ours == {"cmdstat_get"}, commands  # reads only: no lease, no store, no TTL refresh


def test_an_entry_the_server_has_no_memory_for_stops_writes_only(tmp_path, llvm_vadd, caplog):
    """OOM on one write (an entry over maxmemory): writes back off, reads go on at once."""
    from codegen_cache._storage._remote import RedisTier

    _need_redis_server()
    small = RedisServer(tmp_path / "small", options=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"])
    events = []
    tier = RedisTier(small.url, secret=SECRET, on_event=lambda name, n=1: events.append(name))
    try:
        mod, target = llvm_vadd
        a = cc.CodegenCache(tmp_path / "a", remote=small.url, remote_secret=SECRET, write_behind=False)
        a.lower(mod, target)
        digest = a.key_for(mod, target).digest
        huge = frame("source", {"key": "h" * 32}, [os.urandom(8 << 20)])
        assert tier.push("h" * 32, huge) == "failed" and events == ["error:remote"]
        assert tier.push("s" * 32, frame("source", {"key": "s"}, [b"x"])) == "failed"  # writes wait out the backoff
        assert tier.get(digest) is not None  # reads do not
        assert events == ["error:remote", "remote_offline"]
        b = cc.CodegenCache(tmp_path / "b", remote=small.url, remote_secret=SECRET, write_behind=False)
        module, outcome = b.lower_with_outcome(mod, target)
        assert outcome.tier == "remote"
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
        assert any("OOM" in r.getMessage() and "reads go on" in r.getMessage() for r in caplog.records)
        a.close()
        b.close()
    finally:
        tier.close()
        small.close()


# ---- 5. every returned miss reaches the remote -------------------------------------------------

N_EXIT = 35


def _in_redis(server, first: int, count: int, tmp_path: Path, *, slow: bool = True) -> int:
    """How many of the variants' entries are in Redis (their keys as a cache computes them)."""
    from slow_codegen import SLOW_LLVM

    probe = cc.CodegenCache(tmp_path / "keys-only")
    keys = [f"{PREFIX}{probe.key_for(*variant(i), codegen=SLOW_LLVM if slow else None).digest}"
            for i in range(first, first + count)]
    probe.close()
    with server.client() as client:
        return sum(client.exists(k) for k in keys)


def _open_and_flush(directory: Path, url: str) -> None:
    opener = cc.CodegenCache(directory, remote=url, remote_secret=SECRET)  # opening it is enough
    assert opener.flush(60)
    opener.close()


@pytest.mark.parametrize("how", ["os_exit", "sigkill"])
@pytest.mark.slow
def test_entries_of_a_process_that_ended_at_once_reach_the_remote_with_the_next_opener(tmp_path, url, server, how):
    directory = tmp_path / "host"
    proc = _host(directory, 100, N_EXIT, url, "--exit", "os_exit" if how == "os_exit" else "wait",
                 env={"SLOW_CODEGEN_SECONDS": "0"})
    try:
        if how == "sigkill":
            line = proc.stdout.readline()  # the results: every lower() has returned
            os.killpg(proc.pid, signal.SIGKILL)
            result = json.loads(line)
        else:
            result = _result(proc)
    finally:
        _reap(proc)
    assert result["wrong"] == [] and result["tiers"] == ["codegen"] * N_EXIT
    lowered = N_EXIT + (how == "os_exit")  # os._exit comes right after one more lower()
    before = _in_redis(server, 100, lowered, tmp_path)
    _open_and_flush(directory, url)
    assert _in_redis(server, 100, lowered, tmp_path) == lowered, f"{before} were there before the opener"
    # Another host is served them all, and builds nothing.
    other = _result(_host(tmp_path / "other", 100, lowered, url))
    assert other["tiers"] == ["remote"] * lowered and other["wrong"] == []


@pytest.mark.slow
def test_entries_of_terminated_pool_workers_reach_the_remote(tmp_path, url, server):
    import fleet_host

    directory = str(tmp_path / "host")
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(2)
    try:
        results = pool.starmap(fleet_host.lower_range,
                               [(directory, 200 + 10 * k, 10, url, SECRET, "llvm") for k in range(4)])
        pool.terminate()  # SIGTERM to the workers, as soon as the results are in
    finally:
        pool.terminate()
        pool.join()
    assert all(r["wrong"] == [] for r in results)
    _open_and_flush(Path(directory), url)
    assert _in_redis(server, 200, 40, tmp_path, slow=False) == 40


@pytest.mark.slow
def test_a_push_that_failed_is_marked_and_made_by_a_codegen_cache_command(tmp_path, llvm_vadd):
    """Redis down while the entry is pushed: the outbox marks it; `codegen-cache stats` there pushes it."""
    _need_redis_server()
    server = RedisServer(tmp_path / "redis")
    try:
        mod, target = llvm_vadd
        cache = cc.CodegenCache(tmp_path / "host", remote=server.url, remote_secret=SECRET, write_behind=False)
        digest = cache.key_for(mod, target).digest
        cache._remote.get(digest)  # noqa: SLF001 - the lookup works (Redis is up), then it goes away
        server.proc.send_signal(signal.SIGSTOP)
        cache._remote.health.reads.failed()  # noqa: SLF001 - skip the lookup's deadline: the store is the point
        cache.lower(mod, target)
        cache.close()
        # The upgrader links the entry meanwhile: it marks the library too (its environment has no remote).
        assert _upgrade.wait_idle(tmp_path / "host", 120)
        outbox = sorted(n for n in os.listdir(tmp_path / "host" / "outbox") if n != ".lock")
        assert outbox == [f"compiled.{digest}", f"lib.{digest}"]
        server.proc.send_signal(signal.SIGCONT)
        with server.client() as client:
            assert not client.exists(f"{PREFIX}{digest}")
        env = _environ(CODEGEN_CACHE_DIR=str(tmp_path / "host"), CODEGEN_CACHE_REMOTE=server.url,
                       CODEGEN_CACHE_REMOTE_SECRET=SECRET)
        done = subprocess.run([sys.executable, "-m", "codegen_cache", "stats"], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        with server.client() as client:
            assert client.exists(f"{PREFIX}{digest}")
            assert client.exists(f"{PREFIX}lib:{library_platform()}:{digest}")
        assert not [n for n in os.listdir(tmp_path / "host" / "outbox") if n != ".lock"]
    finally:
        server.close()


# ---- 6. fleet-wide single-flight ---------------------------------------------------------------


def _fleet(tmp_path: Path, url: str, hosts: int, keys: int, seconds: float, *args: str) -> tuple[list[dict], Counter]:
    """`hosts` host processes on the same `keys` cold keys, starting together; their results and the builds per key."""
    log = tmp_path / "builds.log"
    start_at = time.time() + 8 + hosts  # after every host has imported TVM and lowered its inputs
    procs = [_host(tmp_path / f"host{h}", 0 + 300, keys, url, "--start-at", str(start_at), *args,
                   env={"SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": str(seconds)}) for h in range(hosts)]
    try:
        results = [_result(p) for p in procs]
    finally:
        for p in procs:
            _reap(p)
    builds = Counter(line.split()[1] for line in log.read_text().splitlines()) if log.exists() else Counter()
    return results, builds


@pytest.mark.parametrize(("n_hosts", "n_keys"), [(4, 12), pytest.param(8, 30, marks=pytest.mark.stress)],
                         ids=["4x12", "8x30"])
@pytest.mark.slow
def test_hosts_starting_together_build_each_key_about_once(tmp_path, url, n_hosts, n_keys):
    results, builds = _fleet(tmp_path, url, n_hosts, n_keys, 0.05)
    assert all(r["wrong"] == [] for r in results)
    tiers = Counter(t for r in results for t in r["tiers"])
    # One host alone builds n_keys; without leases 8 hosts on 30 keys built 130.
    assert sum(builds.values()) <= n_keys * 1.2, (builds, tiers)
    assert tiers["codegen"] == sum(builds.values()) and tiers["remote"] + tiers["codegen"] == n_hosts * n_keys
    assert sum(r["stats"]["remote_lease_waits"] for r in results) >= n_keys  # they did wait for each other


@pytest.mark.slow
def test_a_host_that_dies_holding_a_lease_delays_the_others_by_its_expiry_only(tmp_path, url, server):
    """The holder is SIGKILLed mid-build: the waiter builds once the lease expires (2 s here), not at lease_wait."""
    holder = _host(tmp_path / "holder", 400, 1, url, env={"SLOW_CODEGEN_SECONDS": "60", "CODEGEN_CACHE_REMOTE_LEASE": "2"})
    try:
        deadline = time.monotonic() + 120
        with server.client() as client:
            while not client.keys(f"{PREFIX}lease:*"):
                assert time.monotonic() < deadline and holder.poll() is None, "the holder never took its lease"
                time.sleep(0.05)
        # The waiter imports TVM first (seconds): it starts lowering when told, just after the kill.
        go = tmp_path / "go"
        waiter = _host(tmp_path / "waiter", 400, 1, url, "--lease-wait", "100", "--start-file", str(go),
                       env={"SLOW_CODEGEN_SECONDS": "0", "CODEGEN_CACHE_REMOTE_LEASE": "2"})
        assert json.loads(waiter.stdout.readline()) == {"ready": True}
        os.killpg(holder.pid, signal.SIGKILL)  # its lease has 1.3-2 s left (renewed every 0.67 s)
        killed = time.monotonic()
        go.touch()
        waiter = _result(waiter)
    finally:
        _reap(holder)
    assert waiter["tiers"] == ["codegen"] and waiter["stats"]["remote_lease_waits"] == 1
    # It waited for the dead holder's lease to expire (2 s from its last renewal), not 100 s.
    assert waiter["seconds"][0] < 2.0 + 5.0 and time.monotonic() - killed < 60


@pytest.mark.slow
def test_a_live_holder_delays_the_others_by_lease_wait_at_most(tmp_path, url):
    """A build that outlives lease_wait (1 s): the waiter builds itself after 1 s, with a warning."""
    holder = _host(tmp_path / "holder", 410, 1, url, env={"SLOW_CODEGEN_SECONDS": "30"})
    try:
        time.sleep(0.5)
        deadline = time.monotonic() + 120
        with redis.Redis.from_url(url) as client:
            while not client.keys(f"{PREFIX}lease:*"):
                assert time.monotonic() < deadline and holder.poll() is None, "the holder never took its lease"
                time.sleep(0.05)
        waiter = _host(tmp_path / "waiter", 410, 1, url, "--lease-wait", "1", env={"SLOW_CODEGEN_SECONDS": "0"})
        out, err = waiter.communicate(timeout=120)
    finally:
        _reap(holder)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["tiers"] == ["codegen"] and result["wrong"] == []
    assert 0.8 <= result["seconds"][0] < 1.0 + 5.0  # it stops polling within a poll of lease_wait, never after
    assert "waited 1s for another host to build" in err


def test_a_remote_that_is_down_makes_nobody_wait(hosts, tmp_path, llvm_vadd):
    """The lease cannot be taken (Redis stopped): one deadline for the lookup, then a build, no wait."""
    _need_redis_server()
    server = RedisServer(tmp_path / "redis")
    try:
        mod, target = llvm_vadd
        cache = hosts("a", server.url)
        server.proc.send_signal(signal.SIGSTOP)
        t0 = time.perf_counter()
        module, outcome = cache.lower_with_outcome(mod, target)
        elapsed = time.perf_counter() - t0
        assert outcome.tier == "codegen" and elapsed < 0.5 + 3.0
        assert cache.stats().remote_lease_waits == 0 and cache.stats().errors.get("remote") == 1
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
    finally:
        server.close()


# ---- 7. hits keep entries alive ----------------------------------------------------------------


def test_hits_refresh_the_ttl_at_most_once_per_interval(hosts, url, server, llvm_vadd, monkeypatch):
    from codegen_cache._cache._writer import writer

    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TTL", "16")  # refreshed once 2 s of it have passed
    mod, target = llvm_vadd
    a = hosts("a", url)
    a.lower(mod, target)
    name = a._remote.redis_key(a.key_for(mod, target).digest)  # noqa: SLF001
    time.sleep(2.5)
    with server.client() as client:
        assert client.pttl(name) < 14_000
    b = hosts("b", url)
    assert b.lower_with_outcome(mod, target)[1].tier == "remote"
    assert writer.wait(30)
    with server.client() as client:
        assert client.pttl(name) > 15_000  # refreshed by the remote hit
    # Within the interval: a disk hit of another process asks, the server declines (no write).
    again = hosts("b", url)
    assert again.lower_with_outcome(mod, target)[1].tier == "disk"
    assert writer.wait(30)
    assert (b.stats().remote_refreshed, again.stats(shared=False).remote_refreshed) == (1, 0)
    time.sleep(2.5)
    later = hosts("b", url)
    assert later.lower_with_outcome(mod, target)[1].tier == "disk"
    assert writer.wait(30)
    with server.client() as client:
        assert client.pttl(name) > 15_000  # a disk hit keeps the remote entry alive too
    assert later.stats(shared=False).remote_refreshed == 1


def test_a_remote_hit_of_a_library_refreshes_the_library_and_its_ir(tmp_path, url, server, monkeypatch):
    from codegen_cache._cache._writer import writer

    # Stored with a TTL no upgrade outlasts, however loaded the machine; then both keys are given
    # a shorter one by hand, and a hit from a process with a 16 s TTL must set each anew.
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TTL", "3600")
    mod, target = variant(545)
    a = cc.CodegenCache(tmp_path / "a", remote=url, remote_secret=SECRET)
    a.lower(mod, target)
    assert a.flush(120, upgrades=True)
    digest = a.key_for(mod, target).digest
    names = [a._remote.redis_key(digest), a._remote.library_key(digest)]  # noqa: SLF001
    a.close()
    with server.client() as client:
        assert [client.pexpire(name, 10_000) for name in names] == [1, 1]  # both were stored
        before = [client.pttl(name) for name in names]
    assert all(0 < ttl <= 10_000 for ttl in before), before
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TTL", "16")
    b = cc.CodegenCache(tmp_path / "b", remote=url, remote_secret=SECRET)
    try:
        module, outcome = b.lower_with_outcome(mod, target)
        assert (outcome.tier, type(module).__name__) == ("remote", "CachedLibraryModule")
        assert writer.wait(30)
        assert b.stats(shared=False).remote_refreshed == 2
        with server.client() as client:
            after = [client.pttl(name) for name in names]
        assert all(10_000 < ttl <= 16_000 for ttl in after), (before, after)
    finally:
        b.close()


# ---- 4. the fast form is shared ----------------------------------------------------------------


def _codec(blob: bytes) -> str:
    return read_meta(blob)[0]


@pytest.mark.slow
def test_a_fresh_host_is_served_the_library_another_host_linked(tmp_path, url, server):
    a = cc.CodegenCache(tmp_path / "a", remote=url, remote_secret=SECRET)
    for i in range(500, 504):
        _check(a.lower(*variant(i)), i)
    assert a.flush(120, upgrades=True)  # the upgrader linked them; their libraries went to the remote
    digests = [a.key_for(*variant(i)).digest for i in range(500, 504)]
    a.close()
    with server.client() as client:
        libraries = client.keys(f"{PREFIX}lib:{library_platform()}:*")
        assert sorted(k.decode().rsplit(":", 1)[1] for k in libraries) == sorted(digests)
    b = _result(_host(tmp_path / "b", 500, 4, url, "--codegen", "llvm"))
    assert b["tiers"] == ["remote"] * 4 and b["wrong"] == []
    assert b["modules"] == ["CachedLibraryModule"] * 4  # a mapped library: nothing was JIT-compiled or linked
    assert b["stats"]["upgrades"] == 0 and not list((tmp_path / "b").glob("upgrade/compiled.*"))
    after = cc.CodegenCache(tmp_path / "b")
    assert {_codec(after.store("compiled").get(d)) for d in digests} == {"llvm-so"}  # its disk holds the library
    after.close()


def test_a_remote_hits_copy_is_stored_by_the_writer_and_is_on_disk_after_flush(tmp_path, url):
    """A remote hit's caller writes nothing: the background writer stores this host's copy (flush waits for it)."""
    from codegen_cache._cache._writer import writer

    mod, target = variant(540)
    a = cc.CodegenCache(tmp_path / "a", remote=url, remote_secret=SECRET)
    a.lower(mod, target)
    assert a.flush(120, upgrades=True)  # the remote holds the library
    digest = a.key_for(mod, target).digest
    linked = a.store("compiled").get(digest)
    a.close()
    assert _codec(linked) == "llvm-so"
    b = cc.CodegenCache(tmp_path / "b", remote=url, remote_secret=SECRET)  # write-behind, the default
    try:
        with writer.hold():
            module, outcome = b.lower_with_outcome(mod, target)
            assert (outcome.tier, type(module).__name__) == ("remote", "CachedLibraryModule")
            # Nothing on this disk yet, not even a staged file: the caller's path wrote nothing.
            assert b.store("compiled").get(digest) is None and list(b.staged("compiled").digests()) == []
        assert b.flush(60)
        assert b.store("compiled").get(digest) == linked  # the very bytes the remote served, checked
        _check(module, 540)
    finally:
        b.close()
    local = cc.CodegenCache(tmp_path / "b")  # no remote: its own disk serves it
    try:
        module, outcome = local.lower_with_outcome(mod, target)
        assert outcome.tier == "disk" and type(module).__name__ == "CachedLibraryModule"
        _check(module, 540)
    finally:
        local.close()


@pytest.mark.slow
def test_a_crash_right_after_a_remote_hit_loses_only_that_hosts_local_copy(tmp_path, url):
    """os._exit before the writer ran: the copies are not on that disk, and the next process there is served
    by the remote again (nothing built, nothing wrong), and keeps them."""
    a = cc.CodegenCache(tmp_path / "a", remote=url, remote_secret=SECRET)
    for i in range(530, 533):
        a.lower(*variant(i))
    assert a.flush(120, upgrades=True)
    digests = [a.key_for(*variant(i)).digest for i in range(530, 533)]
    a.close()
    crashed = _result(_host(tmp_path / "b", 530, 2, url, "--codegen", "llvm", "--exit", "os_exit", "--hold-writer"))
    assert crashed["tiers"] == ["remote", "remote"] and crashed["wrong"] == []  # then one more, and os._exit
    assert crashed["modules"] == ["CachedLibraryModule"] * 2
    left = cc.CodegenCache(tmp_path / "b")
    try:
        assert [left.store("compiled").get(d) for d in digests] == [None] * 3
        assert list(left.staged("compiled").digests()) == []
    finally:
        left.close()
    again = _result(_host(tmp_path / "b", 530, 3, url, "--codegen", "llvm"))
    assert again["tiers"] == ["remote"] * 3 and again["wrong"] == [] and again["stats"]["codegen_runs"] == 0
    kept = _result(_host(tmp_path / "b", 530, 3, url, "--codegen", "llvm"))
    assert kept["tiers"] == ["disk"] * 3 and kept["wrong"] == []


@pytest.mark.slow
def test_the_upgrader_pushes_the_library_itself_where_its_environment_names_the_remote(tmp_path, url, server):
    """A host that exits right after its build: its detached upgrader links and pushes the library."""
    env = {"CODEGEN_CACHE_REMOTE": url, "CODEGEN_CACHE_REMOTE_SECRET": SECRET}
    result = _result(_host(tmp_path / "a", 510, 2, url, "--codegen", "llvm", env=env))
    assert result["tiers"] == ["codegen", "codegen"]
    deadline = time.monotonic() + 120
    with server.client() as client:
        while len(client.keys(f"{PREFIX}lib:*")) < 2:
            assert time.monotonic() < deadline, "the upgrader did not push the libraries"
            time.sleep(0.2)


def test_a_library_is_never_loaded_from_another_platforms_key(hosts, url, server, llvm_vadd):
    """Libraries live under the platform's name: one planted for another platform, or under the
    key every host reads, is not mapped here (that key's llvm-so is served as its LLVM IR)."""
    mod, target = llvm_vadd
    a = hosts("a", url)
    a.lower(mod, target)
    assert a.flush(120, upgrades=True)
    digest = a.key_for(mod, target).digest
    with server.client() as client:
        ours = f"{PREFIX}lib:{library_platform()}:{digest}"
        opened = open_value(ours, client.get(ours), SECRET.encode())
        frame_bytes = bytes(opened[0])
        assert opened[1] == "llvm-so"
        # Move it: to another platform's key (signed for that key), and over the shared key.
        client.delete(ours)
        other = f"{PREFIX}lib:linux-riscv64-musl1.2:{digest}"
        client.set(other, seal(other, frame_bytes, SECRET.encode()))
        shared = f"{PREFIX}{digest}"
        client.set(shared, seal(shared, frame_bytes, SECRET.encode()))
    b = hosts("b", url)
    module, outcome = b.lower_with_outcome(mod, target)
    assert outcome.tier == "remote" and type(module).__name__ == "CachedIRModule"
    np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))


# ---- the ACL of docs/remote.md ------------------------------------------------------------------


def test_the_documented_acl_user_can_do_everything_the_tier_does(tmp_path, caplog):
    """docs/remote.md's `user codegen ...` line, as written: stores, hits, leases, refreshes, a replaced value."""
    import re

    from codegen_cache._storage._remote import RedisTier

    _need_redis_server()
    line = re.search(r"^user codegen on .*$", (HERE.parent / "docs" / "remote.md").read_text(), re.MULTILINE).group(0)
    (tmp_path / "acl").mkdir()
    conf = tmp_path / "acl" / "redis.conf"
    conf.write_text("user default on nopass ~* &* +@all\n" + line.replace(">CHANGE-ME", ">pw") + "\n")
    server = RedisServer(tmp_path / "acl", options=["--include", str(conf)])
    try:
        url = f"redis://codegen:pw@127.0.0.1:{server.port}/0"
        events = []
        tier = RedisTier(url, secret=SECRET, ttl=16, on_event=lambda name, n=1: events.append(name))
        blob = frame("source", {"key": "k" * 32}, [b"__global__ void k() {}"])
        assert tier.push("k" * 32, blob) == "stored" and tier.get("k" * 32) == blob
        assert tier.push("k" * 32, blob) == "kept"
        token = b"t"
        assert tier.leases.take("k" * 32, token) and tier.leases.renew("k" * 32, token)
        assert tier.leases.release("k" * 32, token)
        tier.refresh("k" * 32, library=False)
        with server.client() as client:
            client.set(tier.redis_key("d" * 32), b"garbage")  # damaged for everyone
        assert tier.get("d" * 32) is None and tier.push("d" * 32, blob) == "stored"
        tier.close()
        assert "error:remote" not in events and "remote_replaced" in events, events
    finally:
        server.close()
