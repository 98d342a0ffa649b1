"""The object-store tier against a real S3 server (SeaweedFS's `weed mini`, tests/s3_server.py), never a mock.

A host with an empty directory hits what another stored; puts are create-only (a lost race is a
hit); read-only credentials (403), a stopped or absent server and a garbage object are misses
with one warning, within the deadline; leases give fleet-wide single-flight; `prune` bounds the
bucket; a chain puts Redis in front of S3.
"""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np
import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame
from codegen_cache._config import Settings, aws_settings
from codegen_cache._storage._remotes import open_remote
from codegen_cache._storage._s3 import S3Tier
from conftest import counting_codegen
from redis_server import RedisServer, _need_redis_server
from variants import variant

pytestmark = pytest.mark.timeout(240)

SECRET = "team-secret-for-tests"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server for the chain's tests, reaped at the end."""
    _need_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.close()


def _url(server, name: str = "") -> str:
    """A prefix of its own per test: tests share the session's bucket."""
    return server.url(f"t-{name or uuid.uuid4().hex[:12]}")


def _events():
    events: list[str] = []
    return events, (lambda name, n=1: events.append(name))


def _blob(i: int) -> bytes:
    return frame("source", {"key": f"{i:032d}"}, [b"__global__ void k%d() {}" % i])


def _check(module, i: int) -> None:
    import tvm

    a = np.arange(256, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(256, "float32"))
    module[f"add_{i}"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), a + i)


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_a_host_with_an_empty_directory_hits_what_another_stored(tmp_path, s3_env):
    url = _url(s3_env)
    codegen, calls = counting_codegen()
    writer = cc.CodegenCache(tmp_path / "w", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        for i in range(800, 804):
            _check(writer.lower(*variant(i), codegen=codegen), i)
        assert writer.stats().remote_stores == 4
    finally:
        writer.close()
    reader = cc.CodegenCache(tmp_path / "r", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        for i in range(800, 804):
            module, outcome = reader.lower_with_outcome(*variant(i), codegen=codegen)
            assert outcome.tier == "remote"
            _check(module, i)
        stats = reader.stats()
        assert not stats.errors and stats.hits_remote == 4, stats
    finally:
        reader.close()
    assert len(calls) == 4


def test_the_environment_names_the_bucket(tmp_path, s3_env, monkeypatch):
    url = _url(s3_env)
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE", url)
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_SECRET", SECRET)
    for name in ("a", "b"):
        cache = cc.CodegenCache(tmp_path / name, write_behind=False)
        try:
            module, outcome = cache.lower_with_outcome(*variant(810))
            assert outcome.tier == ("codegen" if name == "a" else "remote")
            _check(module, 810)
        finally:
            cache.close()


def test_puts_are_create_only_and_a_lost_race_is_kept(s3_env):
    events, sink = _events()
    url = _url(s3_env)
    first = S3Tier(url, secret=SECRET, on_event=sink)
    second = S3Tier(url, secret=SECRET, on_event=sink)
    digest = "1" * 32
    assert first.push(digest, _blob(1)) == "stored"
    assert second.push(digest, _blob(2)) == "kept"  # another host's entry: never overwritten
    assert second.get(digest) == _blob(1) and first.get(digest) == _blob(1)
    assert events.count("remote_stores") == 1 and events.count("remote_kept") == 1


def test_tiers_of_one_bucket_share_one_store_and_closing_one_leaves_the_others_working(s3_env):
    """Making a store costs ~7 ms of CPU with the GIL held: a process makes one per bucket and settings."""
    url = _url(s3_env)
    first, second = S3Tier(url, secret=SECRET), S3Tier(url, secret=SECRET)
    assert first.push("8" * 32, _blob(8)) == "stored"
    first.close()
    assert second.get("8" * 32) == _blob(8)
    assert first.client._made() is second.client._made()
    slower = S3Tier(url, secret=SECRET, timeout=second.client.timeout + 1)
    assert slower.client._made() is not second.client._made()  # another deadline is another store
    assert slower.get("8" * 32) == _blob(8)


def test_read_only_credentials_refuse_writes_with_one_warning_and_reads_go_on(tmp_path, s3_env, monkeypatch, caplog):
    url = _url(s3_env)
    writer = cc.CodegenCache(tmp_path / "w", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        writer.lower(*variant(820))
    finally:
        writer.close()
    for name, value in s3_env.env("reader").items():
        monkeypatch.setenv(name, value)
    host = cc.CodegenCache(tmp_path / "r", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        assert host.lower_with_outcome(*variant(820))[1].tier == "remote"  # reads work
        for i in (821, 822, 823):
            module, outcome = host.lower_with_outcome(*variant(i))  # a 403 on the lease, then nothing written
            assert outcome.tier == "codegen"
            _check(module, i)
        assert host.lower_with_outcome(*variant(820))[1].tier == "memory"
        stats = host.stats()
        assert stats.errors.get("remote") == 1 and stats.remote_stores == 0, stats
    finally:
        host.close()
    assert len(_warnings(caplog, "refused")) == 1


def test_credentials_that_may_not_read_give_misses_and_one_warning(tmp_path, s3_env, monkeypatch, caplog):
    url = _url(s3_env)
    for name, value in s3_env.env("nobody").items():
        monkeypatch.setenv(name, value)
    host = cc.CodegenCache(tmp_path / "n", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        for i in (830, 831, 832):
            module, outcome = host.lower_with_outcome(*variant(i))
            assert outcome.tier == "codegen"
            _check(module, i)
        assert host.stats().errors.get("remote") == 1  # then off for the backoff
    finally:
        host.close()
    assert len(_warnings(caplog, url)) == 1


def test_read_only_mode_sends_no_write(tmp_path, s3_env, monkeypatch):
    url = _url(s3_env)
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_READ_ONLY", "1")
    host = cc.CodegenCache(tmp_path / "ro", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        assert host.lower_with_outcome(*variant(835))[1].tier == "codegen"
        assert host.flush(30)
        stats = host.stats()
        assert not stats.errors and stats.remote_stores == 0 and stats.remote_misses >= 1, stats
    finally:
        host.close()
    assert list(S3Tier(url).objects()) == []  # no entry, no lease


@pytest.mark.parametrize("how", ["stopped", "absent"])
def test_a_server_that_does_not_answer_is_a_miss_within_the_deadline(tmp_path, s3_env, monkeypatch, caplog, how):
    url = _url(s3_env)
    if how == "absent":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens (discard port)
    else:
        s3_env.stop()
    try:
        monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TIMEOUT", "0.5")
        host = cc.CodegenCache(tmp_path / how, remote=url, remote_secret=SECRET, write_behind=False)
        try:
            t0 = time.monotonic()
            module, outcome = host.lower_with_outcome(*variant(840))
            first = time.monotonic() - t0
            t0 = time.monotonic()
            module2, outcome2 = host.lower_with_outcome(*variant(841))
            second = time.monotonic() - t0
            assert outcome.tier == outcome2.tier == "codegen"
            _check(module, 840)
            _check(module2, 841)
            assert first < 0.5 + 1.5, first  # one deadline, then the build
            assert second < 0.5, second  # offline: no second deadline
            assert host.stats().errors.get("remote") == 1
        finally:
            host.close()
    finally:
        if how == "stopped":
            s3_env.cont()
    assert len(_warnings(caplog, url)) == 1


def test_garbage_and_oversized_objects_are_misses_and_never_loaded(tmp_path, s3_env, caplog):
    import obstore

    url = _url(s3_env)
    events, sink = _events()
    tier = S3Tier(url, secret=SECRET, on_event=sink, max_entry_bytes=1 << 20)
    store = s3_env.client()
    garbage, large = "2" * 32, "3" * 32
    obstore.put(store, tier.object_name(garbage), b"CGCR\x01\x00" + b"\x00garbage" * 100)
    obstore.put(store, tier.object_name(large), b"x" * (2 << 20))
    assert tier.get(garbage) is None and tier.get(large) is None
    assert events.count("remote_rejected") == 2 and "error:remote" not in events
    # Through the cache: a planted object under a kernel's own key is a miss, the build runs.
    cache = cc.CodegenCache(tmp_path / "c", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        mod, target = variant(850)
        digest = cache.key_for(mod, target).digest
        obstore.put(store, tier.object_name(digest), b"not an entry at all")
        module, outcome = cache.lower_with_outcome(mod, target)
        assert outcome.tier == "codegen"
        _check(module, 850)
        stats = cache.stats()
        # Damaged for every reader: removed, so this host's build took its place.
        assert stats.remote_rejected == 1 and stats.remote_stores == 1, stats
    finally:
        cache.close()
    other = cc.CodegenCache(tmp_path / "other", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        assert other.lower_with_outcome(*variant(850))[1].tier == "remote"
    finally:
        other.close()
    # One only unusable here (over this host's cap) is left for hosts with a larger cap.
    assert S3Tier(url, secret=SECRET).client.read_if_any(tier.object_name(large), 4 << 20) is not None


def test_an_unsigned_or_foreign_entry_is_not_loaded(s3_env):
    url = _url(s3_env)
    S3Tier(url).push("4" * 32, _blob(4))  # unsigned
    S3Tier(url, secret="another-secret").push("5" * 32, _blob(5))
    events, sink = _events()
    tier = S3Tier(url, secret=SECRET, on_event=sink)
    assert tier.get("4" * 32) is None and tier.get("5" * 32) is None
    assert events.count("remote_rejected") == 2


def test_leases_are_create_only_and_expire(s3_env):
    url = _url(s3_env)
    a = S3Tier(url, secret=SECRET, lease=1.0)
    b = S3Tier(url, secret=SECRET, lease=1.0)
    digest = "6" * 32
    assert a.leases.take(digest, b"a-token") is True
    assert b.leases.take(digest, b"b-token") is False
    assert a.leases.renew(digest, b"a-token") and not b.leases.renew(digest, b"b-token")
    assert not b.leases.release(digest, b"b-token")
    time.sleep(1.2)  # expired: belongs to nobody
    assert b.leases.take(digest, b"b-token") is True
    assert not a.leases.renew(digest, b"a-token")  # not a's any more
    assert b.leases.release(digest, b"b-token")
    assert a.leases.take(digest, b"a-token") is True
    assert S3Tier(url, read_only=True).leases.take(digest, b"c") is None  # no lease where no writes


def test_prune_deletes_what_is_older_than_the_age(s3_env):
    url = _url(s3_env)
    tier = S3Tier(url, secret=SECRET)
    for i in range(3):
        tier.push(f"{i:032d}", _blob(i))
    assert tier.prune(3600, dry_run=True) == (0, 0)
    count, size = tier.prune(0, dry_run=True)
    assert count == 3 and size > 0 and len(list(tier.objects())) == 3
    assert tier.prune(0) == (count, size)
    assert list(tier.objects()) == []


def test_redis_in_front_of_s3_serves_from_s3_and_copies_into_redis(tmp_path, s3_env, redis_url):
    """A chain `redis://... s3://...`: a host hits S3 when Redis lacks the entry, and its writer fills Redis."""
    url = _url(s3_env)
    chain = f"{redis_url} {url}"
    writer = cc.CodegenCache(tmp_path / "w", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        writer.lower(*variant(860))  # in S3 only
    finally:
        writer.close()
    host = cc.CodegenCache(tmp_path / "h", remote=chain, remote_secret=SECRET, write_behind=False)
    try:
        module, outcome = host.lower_with_outcome(*variant(860))
        assert outcome.tier == "remote"
        _check(module, 860)
        assert host.flush(30)
        assert host.stats().remote_stores >= 1  # the copy into Redis
    finally:
        host.close()
    redis_only = cc.CodegenCache(tmp_path / "r", remote=redis_url, remote_secret=SECRET, write_behind=False)
    try:
        assert redis_only.lower_with_outcome(*variant(860))[1].tier == "remote"
    finally:
        redis_only.close()


def test_aws_settings_come_from_the_variables_then_the_profile_files(tmp_path):
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text("[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n"
                     "[team]\naws_access_key_id = TEAM\naws_secret_access_key = teamsecret\n")
    config.write_text("[profile team]\nregion = eu-west-1\nendpoint_url = http://s3.internal:8333\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": str(config)}
    team = aws_settings({**files, "AWS_PROFILE": "team"})
    assert (team.access_key_id, team.secret_access_key, team.region, team.endpoint) == (
        "TEAM", "teamsecret", "eu-west-1", "http://s3.internal:8333")
    assert aws_settings(files).access_key_id == "DEF"
    env = aws_settings({**files, "AWS_PROFILE": "team", "AWS_ACCESS_KEY_ID": "ENV", "AWS_SECRET_ACCESS_KEY": "envs",
                        "AWS_REGION": "us-east-2", "AWS_ENDPOINT_URL": "http://other:1"})
    assert (env.access_key_id, env.secret_access_key, env.region, env.endpoint) == (
        "ENV", "envs", "us-east-2", "http://other:1")


@pytest.mark.parametrize("bad", ["s3://B", "s3://key:secret@bucket", "s3://bucket?region=x", "s3://bucket//p",
                                 "s3://bucket:9000"])
def test_a_bad_s3_url_fails_at_construction(tmp_path, bad):
    with pytest.raises(cc.ConfigError, match="s3://BUCKET"):
        cc.CodegenCache(tmp_path / "c", remote=bad)


def test_a_chain_opens_each_tier_in_order(s3_env, redis_url):
    chain = open_remote(Settings(remote=f"{redis_url}, {_url(s3_env)}", remote_secret=SECRET))
    try:
        assert [type(t).__name__ for t in chain.tiers] == ["RedisTier", "S3Tier"]
        assert chain.leases is chain.tiers[0].leases
    finally:
        chain.close()


@pytest.mark.parametrize("tier_kind", ["s3", "redis"])
def test_a_large_entry_travels_in_pieces_and_a_missing_piece_is_a_miss(s3_env, redis_url, tier_kind, request):
    from codegen_cache._storage._remote import RedisTier

    events, sink = _events()
    url = _url(s3_env) if tier_kind == "s3" else redis_url
    made = []

    def make(*args, **kwargs):
        made.append((S3Tier if tier_kind == "s3" else RedisTier)(*args, **kwargs))
        return made[-1]

    request.addfinalizer(lambda: [tier.close() for tier in made])
    writer = make(url, secret=SECRET, on_event=sink, piece_bytes=4096)
    reader = make(url, secret=SECRET, on_event=sink, piece_bytes=4096)
    digest = uuid.uuid4().hex
    blob = frame("source", {"key": digest}, [np.random.default_rng(0).bytes(50_000)])
    assert writer.push(digest, blob) == "stored"
    assert reader.get(digest) == blob  # 13 pieces of 4 KiB, checked and joined
    assert writer.push(digest, blob) == "kept"
    # A piece gone (evicted, expired): a miss, counted as a rejection, never a partial entry.
    if tier_kind == "s3":
        names = [o["name"] for o in writer.objects() if "/piece/" in o["name"]]
        assert len(names) == 13
        writer.client.delete(names[5])
    else:
        import redis

        with redis.Redis.from_url(url) as client:
            pieces = client.keys(f"{writer.prefix}piece:*")
            assert len(pieces) >= 13
            client.delete(pieces[5])
    fresh = make(url, secret=SECRET, on_event=sink, piece_bytes=4096)
    assert fresh.get(digest) is None and "remote_rejected" in events
    # The damaged manifest is replaced (Redis) or removed (S3): the next store makes the entry whole again.
    again = make(url, secret=SECRET, on_event=sink, piece_bytes=4096)
    again.get(digest)
    assert again.push(digest, blob) == "stored"
    assert make(url, secret=SECRET, piece_bytes=4096).get(digest) == blob


@pytest.mark.slow
def test_hosts_starting_together_on_one_bucket_build_each_key_about_once(tmp_path, s3_env):
    """4 host processes, own directories, 12 cold keys on one bucket: the lease objects make ~12 builds, not 48."""
    import json
    import os
    import subprocess
    import sys
    from collections import Counter
    from pathlib import Path

    here = Path(__file__).parent
    url = _url(s3_env)
    log = tmp_path / "builds.log"
    env = {**os.environ, **s3_env.env(), "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
           "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": "0.05"}
    start_at = time.time() + 12
    procs = [subprocess.Popen([sys.executable, str(here / "fleet_host.py"), str(tmp_path / f"host{h}"), "300", "12",
                               "--remote", url, "--secret", SECRET, "--start-at", str(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              start_new_session=True) for h in range(4)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=200)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    builds = Counter(line.split()[1] for line in log.read_text().splitlines())
    tiers = Counter(t for r in results for t in r["tiers"])
    assert all(r["wrong"] == [] for r in results)
    assert sum(builds.values()) <= 12 * 1.2, (builds, tiers)
    assert tiers["remote"] + tiers["codegen"] == 48
    assert sum(r["stats"]["remote_lease_waits"] for r in results) >= 12


def test_a_child_made_by_fork_after_the_parent_used_s3_works_local_only_and_never_hangs(s3_env):
    """obstore's runtime does not survive fork: the child's tier is off at once (a miss), not a request that waits."""
    import os

    tier = S3Tier(_url(s3_env), secret=SECRET)
    assert tier.push("7" * 32, _blob(7)) == "stored" and tier.get("7" * 32) == _blob(7)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one byte says what its lookup found, and how fast
        try:
            t0 = time.monotonic()
            found = tier.get("7" * 32)
            os.write(write, b"1" if found is None and time.monotonic() - t0 < 1.0 else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert tier.get("7" * 32) == _blob(7)  # the parent's tier goes on
