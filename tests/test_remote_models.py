"""Whole models through the remote tiers: host B, with an empty directory, compiles warm from what host A stored.

A model's entry, its library's parts and whatever else it consists of reach the remote by their
digests, as kernels do (Redis, S3, and Redis in front of S3); host B's `tvm.compile` runs no
Relax pipeline and no codegen, and its output is exactly host A's. A large model entry travels
in pieces; a missing piece is a miss (host B compiles), never a wrong module.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import tvm

import codegen_cache as cc
import relax_models
from redis_server import RedisServer, _need_redis_server

pytestmark = pytest.mark.timeout(300)

SECRET = "team-secret-for-tests"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    _need_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.close()


@pytest.fixture(params=["redis", "s3", "redis+s3"])
def remote(request, redis_url):
    """A remote of each kind, empty for this test (Redis: a database of its own; S3: a prefix of its own)."""
    import redis

    with redis.Redis.from_url(redis_url) as client:
        client.flushall()
    if request.param == "redis":
        return redis_url
    s3 = request.getfixturevalue("s3_env")
    bucket = s3.url(f"m-{uuid.uuid4().hex[:12]}")
    return bucket if request.param == "s3" else f"{redis_url} {bucket}"


def _compile(directory, remote, mod, **options):
    """tvm.compile through a cache of `directory` (a host), its outcomes and counters."""
    cache = cc.CodegenCache(directory, remote=remote, remote_secret=SECRET, write_behind=False, **options)
    cc.enable(cache, children=False)
    try:
        with cc.record_outcomes() as outcomes:
            executable = tvm.compile(mod, "llvm")
        return executable, [o.tier for o in outcomes if o.codegen == "relax.build"], cache.stats()
    finally:
        cc.disable()
        cache.close()


def _run(executable, named):
    x = relax_models.inputs((1, 8, 64))
    return relax_models.run(executable, "forward", x, *relax_models.parameters(named))


def test_a_host_with_an_empty_directory_compiles_a_model_warm_from_the_remote(tmp_path, remote):
    mod, named = relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)
    cold, tiers, _ = _compile(tmp_path / "a", remote, mod)
    assert tiers == ["codegen"]
    warm, tiers, stats = _compile(tmp_path / "b", remote, mod)
    assert tiers == ["disk"]  # the model entry came from the remote, and is on b's disk now
    assert stats.codegen_runs == 0 and not stats.errors, stats
    np.testing.assert_array_equal(_run(warm, named), _run(cold, named))
    again, tiers, stats = _compile(tmp_path / "b", remote, mod)  # a later process on b: its own disk
    assert tiers == ["disk"] and stats.codegen_runs == 0


def test_a_model_larger_than_a_piece_travels_in_pieces_and_a_missing_piece_is_a_miss(tmp_path, s3_env):
    from codegen_cache._storage._s3 import S3Tier

    url = s3_env.url(f"m-{uuid.uuid4().hex[:12]}")
    weights = np.random.default_rng(0).standard_normal((256, 256)).astype("float32")  # 256 KiB bound in the model
    mod = relax_models.with_constant(weights)
    x = relax_models.inputs(weights.shape)

    events: list[str] = []

    def host(name):
        tier = S3Tier(url, secret=SECRET, piece_bytes=64 << 10, on_event=lambda e, n=1: events.append(e))
        cache = cc.CodegenCache(tmp_path / name, remote=tier, write_behind=False)
        cc.enable(cache, children=False)
        try:
            with cc.record_outcomes() as outcomes:
                executable = tvm.compile(mod, "llvm")
            out = relax_models.run(executable, "main", x)
            return [o.tier for o in outcomes if o.codegen == "relax.build"], cache.stats(), out
        finally:
            cc.disable()
            cache.close()

    tiers, _, expected = host("a")
    assert tiers == ["codegen"]
    np.testing.assert_allclose(expected, x * weights + 1, rtol=1e-6)
    pieces = [o["name"] for o in S3Tier(url).objects() if "/piece/" in o["name"]]
    assert len(pieces) >= 4
    tiers, stats, out = host("b")
    assert tiers == ["disk"] and stats.codegen_runs == 0
    np.testing.assert_array_equal(out, expected)
    S3Tier(url).client.delete(pieces[1])
    tiers, stats, out = host("c")  # a piece gone: a miss, compiled here, the same output
    assert tiers == ["codegen"] and "remote_rejected" in events
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_local_hit_never_waits_for_the_remote(tmp_path, kind, request, monkeypatch):
    """With the remote stopped (it accepts connections, never answers; 3 s deadline), disk and memory hits of a
    kernel and a model return at their own speed: nothing on a hit's path asks the remote."""
    import signal

    from variants import variant

    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TIMEOUT", "3")
    if kind == "redis":
        _need_redis_server()
        server = RedisServer(tmp_path / "redis")
        url, stop, cont = server.url, server.proc.send_signal, server.proc.send_signal
        request.addfinalizer(server.close)
    else:
        s3 = request.getfixturevalue("s3_env")
        url = s3.url(f"h-{uuid.uuid4().hex[:12]}")
        stop, cont = (lambda _sig: s3.stop()), (lambda _sig: s3.cont())
    mod, _ = relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)
    kernel = variant(950)
    warm = cc.CodegenCache(tmp_path / "host", remote=url, remote_secret=SECRET, write_behind=False)
    warm.lower(*kernel)
    cc.enable(warm, children=False)
    tvm.compile(mod, "llvm")
    cc.disable()
    warm.close()
    stop(signal.SIGSTOP)
    try:
        cache = cc.CodegenCache(tmp_path / "host", remote=url, remote_secret=SECRET)
        cc.enable(cache, children=False)
        try:
            with cc.record_outcomes() as outcomes:
                t0 = time.monotonic()
                cache.lower(*kernel)
                tvm.compile(mod, "llvm")
                cache.lower(*kernel)
                tvm.compile(mod, "llvm")
                seconds = time.monotonic() - t0
            assert [o.tier for o in outcomes if o.codegen in ("llvm", "relax.build")] == [
                "disk", "disk", "memory", "memory"]
            assert seconds < 2.0, seconds  # below one deadline: no hit waited for the remote
        finally:
            cc.disable()
            cache.close(timeout=10)
    finally:
        cont(signal.SIGCONT)


HOST_B = """
import hashlib, json, sys
import tvm
import codegen_cache as cc
import relax_models
mod, named = relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)
cache = cc.CodegenCache(sys.argv[1], remote=sys.argv[2], remote_secret=sys.argv[3])
cc.enable(cache, children=False)
with cc.record_outcomes() as outcomes:
    executable = tvm.compile(mod, "llvm")
out = relax_models.run(executable, "forward", relax_models.inputs((1, 8, 64)), *relax_models.parameters(named))
print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                  "codegen_runs": cache.stats().codegen_runs, "out": hashlib.sha256(out.tobytes()).hexdigest()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_fresh_host_process_compiles_a_model_warm_from_the_remote(tmp_path, kind, request, redis_url):
    """Host B is a fresh interpreter with an empty directory: no state of host A's process helps it."""
    import hashlib

    from processes import python_json

    env = {}
    if kind == "s3":
        s3 = request.getfixturevalue("s3_env")
        url, env = s3.url(f"f-{uuid.uuid4().hex[:12]}"), s3.env()
    else:
        import redis

        with redis.Redis.from_url(redis_url) as client:
            client.flushall()
        url = redis_url
    mod, named = relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)
    cold, tiers, _ = _compile(tmp_path / "a", url, mod)
    assert tiers == ["codegen"]
    expected = hashlib.sha256(_run(cold, named).tobytes()).hexdigest()
    found = python_json(HOST_B, str(tmp_path / "b"), url, SECRET, env=env)
    assert found == {"tiers": ["disk"], "codegen_runs": 0, "out": expected}


def test_a_model_with_bound_weights_travels_with_its_weights_chunks(tmp_path, redis_url):
    # The weights are entries of their own (tensor chunks, by content): host B fetches the model's
    # entry and each chunk it names from the remote, and runs the same numbers.
    import redis
    from test_model_weights import _bound, _expected, _run as run_bound, _weights

    with redis.Redis.from_url(redis_url) as client:
        client.flushall()
    values = _weights(3)
    mod = _bound(values)
    cold, tiers, _ = _compile(tmp_path / "a", redis_url, mod)
    assert tiers == ["codegen"]
    warm, tiers, stats = _compile(tmp_path / "b", redis_url, mod)
    assert tiers == ["disk"] and stats.codegen_runs == 0 and not stats.errors, stats
    np.testing.assert_allclose(run_bound(warm), _expected(values), rtol=1e-3, atol=1e-5)
    np.testing.assert_array_equal(run_bound(warm), run_bound(cold))
