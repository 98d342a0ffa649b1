"""The remote tier against a real 3-master Redis Cluster on loopback (redis-server --cluster-enabled yes).

A `redis://` URL of any one node serves the whole cluster: the client routes by key slot,
follows -MOVED (resharding) and -ASK (a slot migrating), keeps one deadline per call, and a
database in a cluster URL is a clear configuration error.
"""

from __future__ import annotations

import logging
import signal
import time

import numpy as np
import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame
from codegen_cache._storage._cluster import key_slot
from codegen_cache._storage._leases import new_token
from codegen_cache._storage._remote import RedisTier
from conftest import counting_codegen, run_binary
from redis_server import RedisCluster, _need_redis_server
from variants import variant

pytest.importorskip("redis", reason="the redis client is not installed (pip install 'tvm-codegen-cache[redis]')")

pytestmark = pytest.mark.timeout(240)

SECRET = "team-secret-for-tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters, no replicas, for the whole module; every node stopped at the end."""
    _need_redis_server()
    made = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield made
    made.close()


@pytest.fixture
def fresh(cluster):
    """The module's cluster, emptied before the test."""
    cluster.flush()
    return cluster


def _events():
    events: list[str] = []
    return events, (lambda name, n=1: events.append(name))


def _blob(i: int) -> bytes:
    return frame("source", {"key": f"{i:032d}"}, [b"__global__ void k%d() {}" % i])


def _cluster_slots_calls(cluster) -> int:
    total = 0
    for node in cluster.nodes:
        with node.client() as client:
            total += int(client.info("commandstats").get("cmdstat_cluster|slots", {}).get("calls", 0))
    return total


def _check(module, i: int) -> None:
    import tvm

    a = np.arange(256, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(256, "float32"))
    module[f"add_{i}"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), a + i)


@pytest.mark.parametrize("writer_node, reader_node", [(0, 2), (1, 0)])
def test_hosts_share_entries_through_any_nodes_url(tmp_path, fresh, writer_node, reader_node):
    mods = [variant(i) for i in range(600, 612)]
    codegen, calls = counting_codegen()
    writer = cc.CodegenCache(tmp_path / "w", remote=fresh.url(writer_node), remote_secret=SECRET, write_behind=False)
    reader = cc.CodegenCache(tmp_path / "r", remote=fresh.url(reader_node), remote_secret=SECRET, write_behind=False)
    try:
        for mod, target in mods:
            writer.lower(mod, target, codegen=codegen)
        tiers = []
        for i, (mod, target) in zip(range(600, 612), mods):
            module, outcome = reader.lower_with_outcome(mod, target, codegen=codegen)
            tiers.append(outcome.tier)
            _check(module, i)
        assert tiers == ["remote"] * 12 and len(calls) == 12
        for cache in (writer, reader):
            stats = cache.stats()
            assert not stats.errors and stats.remote_offline == 0, stats
        sizes = []
        for node in fresh.nodes:
            with node.client() as client:
                sizes.append(client.dbsize())
        assert sum(sizes) == 12 and all(sizes), sizes  # spread over every master
    finally:
        writer.close()
        reader.close()


def test_the_slot_map_is_read_once_after_the_first_redirect(fresh):
    events, sink = _events()
    before = _cluster_slots_calls(fresh)
    tier = RedisTier(fresh.url(1), secret=SECRET, on_event=sink)
    try:
        for i in range(60):
            assert tier.push(f"{i:032d}", _blob(i)) == "stored"
        for i in range(60):
            assert tier.get(f"{i:032d}") == _blob(i)
        assert tier._client.slots.clustered and len(tier._client.slots.nodes()) == 3  # noqa: SLF001
    finally:
        tier.close()
    assert _cluster_slots_calls(fresh) - before == 1
    assert "error:remote" not in events


def _owner(cluster, slot: int) -> int:
    with cluster.nodes[0].client() as client:
        for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(i for i, n in enumerate(cluster.nodes) if n.port == int(master[1]))
    raise AssertionError(f"no node serves slot {slot}")


def _node_id(cluster, index: int) -> str:
    with cluster.nodes[index].client() as client:
        return client.execute_command("CLUSTER", "MYID").decode()


def _setslot(cluster, slot: int, *args: str, nodes=None) -> None:
    for index in (range(len(cluster.nodes)) if nodes is None else nodes):
        with cluster.nodes[index].client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, *args)


def test_a_migrating_slot_is_followed_by_ask_and_then_by_moved(fresh):
    """A key moved mid-migration is read with ASKING at its new node; after the move, MOVED updates the map."""
    events, sink = _events()
    tier = RedisTier(fresh.url(0), secret=SECRET, on_event=sink)
    digest = "a" * 32
    try:
        assert tier.push(digest, _blob(1)) == "stored"
        name = tier.redis_key(digest)
        slot = key_slot(name.encode())
        source = _owner(fresh, slot)
        target = (source + 1) % 3
        source_id, target_id = _node_id(fresh, source), _node_id(fresh, target)
        _setslot(fresh, slot, "IMPORTING", source_id, nodes=[target])
        _setslot(fresh, slot, "MIGRATING", target_id, nodes=[source])
        with fresh.nodes[source].client() as client:
            client.execute_command("MIGRATE", "127.0.0.1", fresh.nodes[target].port, name, 0, 5000)
        assert tier.get(digest) == _blob(1)  # -ASK from the source, ASKING + GET at the target
        with fresh.nodes[target].client() as client:
            assert int(client.info("commandstats")["cmdstat_asking"]["calls"]) >= 1
        _setslot(fresh, slot, "NODE", target_id)
        assert tier.get(digest) == _blob(1)  # -MOVED from the source: the slot is the target's now
        assert tier._client.slots.node_for(name.encode(), ("x", 0)) == ("127.0.0.1", fresh.nodes[target].port)  # noqa: SLF001
        assert tier.push("b" * 32, _blob(2)) == "stored" and tier.get("b" * 32) == _blob(2)
    finally:
        tier.close()
    assert "error:remote" not in events


def test_a_database_in_a_cluster_url_is_a_clear_configuration_error(tmp_path, fresh, llvm_vadd, caplog):
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "c", remote=fresh.url(0) + "/2", remote_secret=SECRET, write_behind=False)
    try:
        module, outcome = cache.lower_with_outcome(mod, target)
        assert outcome.tier == "codegen"
        np.testing.assert_array_equal(run_binary(module), 2 * np.arange(1024, dtype="float32"))
        assert cache.lower_with_outcome(variant(700)[0], variant(700)[1])[1].tier == "codegen"
        stats = cache.stats()
        assert stats.errors.get("remote") == 1 and stats.remote_offline >= 2  # off for good after the first
    finally:
        cache.close()
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "database 2" in r.getMessage()]
    assert len(messages) == 1
    assert "database 0 for a Redis Cluster" in messages[0] and "drop the /N or db=N" in messages[0]


def test_a_stopped_node_costs_one_deadline(fresh):
    tier = RedisTier(fresh.url(0), secret=SECRET, timeout=0.5)
    try:
        for i in range(30):
            tier.push(f"{i:032d}", _blob(i))
        stopped = fresh.nodes[2]
        on_it = next(f"{i:032d}" for i in range(30) if _owner(fresh, key_slot(tier.redis_key(f"{i:032d}").encode())) == 2)
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert tier.get(on_it) is None
            assert time.monotonic() - t0 < 0.5 + 2.0
            t0 = time.monotonic()
            assert tier.get("0" * 32) is None  # offline now: no second deadline
            assert time.monotonic() - t0 < 0.1
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
    finally:
        tier.close()


def test_leases_and_compare_scripts_run_on_each_keys_node(fresh):
    events, sink = _events()
    tier = RedisTier(fresh.url(2), secret=SECRET, on_event=sink, lease=5)
    tokens = {f"{i:032d}": new_token() for i in range(24)}
    try:
        for digest, token in tokens.items():
            assert tier.leases.take(digest, token) is True
            assert tier.leases.take(digest, new_token()) is False
        assert all(tier.leases.renew(d, t) for d, t in tokens.items())
        assert all(tier.leases.release(d, t) for d, t in tokens.items())
        assert not any(tier.leases.release(d, t) for d, t in tokens.items())  # gone: nothing to delete
        with fresh.client() as client:
            nodes_with_leases = set()
            for digest in tokens:
                nodes_with_leases.add(_owner(fresh, key_slot(tier.lease_key(digest).encode())))
                assert not client.exists(tier.lease_key(digest))
        assert nodes_with_leases == {0, 1, 2}
        tier.refresh("0" * 32, library=False)  # a script on a missing key: nothing to do, no error
    finally:
        tier.close()
    assert "error:remote" not in events


def test_libraries_and_leases_work_across_the_cluster(tmp_path, fresh):
    """The fast form through a cluster: the writer's libraries land on their slots' nodes, a reader maps them."""
    writer = cc.CodegenCache(tmp_path / "w", remote=fresh.url(0), remote_secret=SECRET)
    try:
        for i in range(620, 626):
            _check(writer.lower(*variant(i)), i)
        assert writer.flush(120, upgrades=True)
        assert writer.stats().remote_stores == 12  # six IR entries, six libraries
    finally:
        writer.close()
    reader = cc.CodegenCache(tmp_path / "r", remote=fresh.url(1), remote_secret=SECRET, write_behind=False)
    try:
        for i in range(620, 626):
            module, outcome = reader.lower_with_outcome(*variant(i))
            assert outcome.tier == "remote" and type(module).__name__ == "CachedLibraryModule"
            _check(module, i)
        assert not reader.stats().errors
    finally:
        reader.close()


def _migrate(cluster, names: list[str]) -> list[tuple[int, str]]:
    """Start moving the slots of `names` to the next node and move the keys: those slots answer -ASK now.

    Returns (slot, target node id) for each slot, for _finish_migration.
    """
    moving = {}
    for name in names:
        slot = key_slot(name.encode())
        if slot in moving:
            continue
        source = _owner(cluster, slot)
        target = (source + 1) % len(cluster.nodes)
        target_id = _node_id(cluster, target)
        _setslot(cluster, slot, "IMPORTING", _node_id(cluster, source), nodes=[target])
        _setslot(cluster, slot, "MIGRATING", target_id, nodes=[source])
        moving[slot] = (source, target, target_id)
    for name in names:
        source, target, _ = moving[key_slot(name.encode())]
        with cluster.nodes[source].client() as client:
            client.execute_command("MIGRATE", "127.0.0.1", cluster.nodes[target].port, name, 0, 5000)
    return [(slot, target_id) for slot, (_, _, target_id) in moving.items()]


def _finish_migration(cluster, moved: list[tuple[int, str]]) -> None:
    for slot, target_id in moved:
        _setslot(cluster, slot, "NODE", target_id)


def test_a_ttl_refresh_follows_ask_to_a_node_that_lacks_the_script(fresh):
    """ASKING admits one command: the script's EVAL after the new node's NOSCRIPT needs its own."""
    events, sink = _events()
    tier = RedisTier(fresh.url(0), secret=SECRET, on_event=sink, ttl=80.0)
    digest = "c" * 32
    try:
        assert tier.push(digest, _blob(3)) == "stored"
        name = tier.redis_key(digest)
        for node in fresh.nodes:
            with node.client() as client:
                client.script_flush()  # no node has the refresh script: each needs EVAL
        with fresh.client() as client:
            client.pexpire(name, 5_000)  # more than an eighth of the TTL has passed
        moved = _migrate(fresh, [name])
        tier.refresh(digest, library=False)  # -ASK, then ASKING + EVALSHA, NOSCRIPT, ASKING + EVAL
        assert events.count("remote_refreshed") == 1, events
        _finish_migration(fresh, moved)
        with fresh.client() as client:
            assert client.pttl(name) > 70_000
    finally:
        tier.close()
    assert not [e for e in events if e.startswith("error")], events


def test_a_host_keeps_hitting_while_slots_move_by_ask_and_then_by_moved(tmp_path, fresh):
    """Hits (and their TTL refreshes) during a migration (-ASK) and after it (-MOVED): no error, no rebuild."""
    mods = [(i, *variant(i)) for i in range(640, 652)]
    codegen, calls = counting_codegen()
    writer = cc.CodegenCache(tmp_path / "w", remote=fresh.url(0), remote_secret=SECRET, write_behind=False)
    try:
        for _, mod, target in mods:
            writer.lower(mod, target, codegen=codegen)
    finally:
        writer.close()
    assert len(calls) == 12
    names = []
    for node in fresh.nodes:
        with node.client() as client:
            client.script_flush()  # no node has the refresh script: each needs EVAL
            for name in client.keys("codegen-cache:*"):
                client.pexpire(name, 60_000)  # due for a refresh at the default TTL
                names.append(name.decode())
    assert len(names) == 12
    moved = _migrate(fresh, names)
    host = cc.CodegenCache(tmp_path / "during", remote=fresh.url(1), remote_secret=SECRET, write_behind=False)
    try:
        for i, mod, target in mods:
            module, outcome = host.lower_with_outcome(mod, target, codegen=codegen)
            assert outcome.tier == "remote"
            _check(module, i)
        assert host.flush(30)
        stats = host.stats()
        assert not stats.errors and stats.remote_offline == 0, stats
        assert stats.remote_refreshed == 12, stats
    finally:
        host.close()
    _finish_migration(fresh, moved)
    after = cc.CodegenCache(tmp_path / "after", remote=fresh.url(2), remote_secret=SECRET, write_behind=False)
    try:
        for i, mod, target in mods:
            module, outcome = after.lower_with_outcome(mod, target, codegen=codegen)
            assert outcome.tier == "remote"
            _check(module, i)
        assert after.flush(30)
        stats = after.stats()
        assert not stats.errors and stats.remote_offline == 0, stats
    finally:
        after.close()
    assert len(calls) == 12
    for name in names:
        with fresh.nodes[_owner(fresh, key_slot(name.encode()))].client() as client:
            assert client.pttl(name) > 3_600_000  # refreshed during the migration
