"""The remote tier against a misbehaving server: a fake Redis on 127.0.0.1 that answers wrongly.

Whatever the server does (wrong reply types, garbage, a reply trickled a byte at a time, a huge
announced value, a reset or a close in the middle of a reply), lower() returns a correct
module, within the call's deadline, and the fault is counted. None of these tests needs
redis-server.
"""

from __future__ import annotations

import random
import time
import tracemalloc

import numpy as np
import pytest

import codegen_cache as cc
from codegen_cache._artifacts import frame
from codegen_cache._storage._remote import DEFAULT_MAX_ENTRY_BYTES, RedisTier
from conftest import run_binary
from fake_redis import FakeRedis

pytestmark = pytest.mark.timeout(60)

SECRET = "team-secret-for-tests"
DEADLINE = 0.5  # the default remote timeout
# A busy 2-core machine can add seconds to anything; a hang (the old per-read timeout with a
# trickling server) would take minutes.
MARGIN = 3.0
EXPECTED = 2 * np.arange(1024, dtype="float32")


@pytest.fixture
def fake():
    made = []

    def make(answer=None):
        server = FakeRedis(answer)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def _lower(tmp_path, url, llvm_vadd):
    """One cold lower() through a cache whose remote is `url`: (outcome, seconds, stats)."""
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "c", remote=url, remote_secret=SECRET, write_behind=False)
    try:
        t0 = time.monotonic()
        module, outcome = cache.lower_with_outcome(mod, target)
        elapsed = time.monotonic() - t0
        np.testing.assert_array_equal(run_binary(module), EXPECTED)  # a fresh build, and right
        return outcome, elapsed, cache.stats()
    finally:
        cache.close()


def _tier_get(url):
    """One get through a fresh tier: (value, events, seconds)."""
    events = []
    tier = RedisTier(url, secret=SECRET, on_event=lambda name, n=1: events.append(name))
    try:
        t0 = time.monotonic()
        value = tier.get("k" * 32)
        return value, events, time.monotonic() - t0
    finally:
        tier.close()


def _on(command: bytes, reply: bytes, fake_server_ref: list, *, then_close: bool = False):
    """An answer: `reply` to `command`, Redis's own answer to the rest."""

    def answer(conn, args):
        if args[0].upper() != command:
            fake_server_ref[0].behave(conn, args)
            return
        conn.send(reply)
        if then_close:
            conn.close()

    return answer


def _serve(fake, command: bytes, reply: bytes, *, then_close: bool = False) -> FakeRedis:
    ref: list = []
    server = fake(_on(command, reply, ref, then_close=then_close))
    ref.append(server)
    return server


# ---- malformed replies ------------------------------------------------------------------------

NOT_OK = {
    "bulk": b"$2\r\nOK\r\n",
    "integer": b":1\r\n",
    "array": b"*1\r\n+OK\r\n",
    "resp3-map": b"%1\r\n+proto\r\n:3\r\n",  # what HELLO 3 answers
    "resp3-null": b"_\r\n",
    "other-status": b"+PONG\r\n",
    "error": b"-NOAUTH Authentication required.\r\n",
    "no-type-byte": b"OK\r\n",
    "binary": b"\x00\xff\xfe\x80garbage\r\n",
    "endless-line": b"+" + b"O" * 10_000 + b"\r\n",
    "trailing-bytes": b"+OK\r\n+OK\r\n",
}


@pytest.mark.parametrize("command", [b"AUTH", b"SELECT"])
@pytest.mark.parametrize("reply", NOT_OK.values(), ids=NOT_OK.keys())
def test_malformed_handshake_reply_is_a_counted_miss(fake, command, reply):
    server = _serve(fake, command, reply)
    value, events, elapsed = _tier_get(server.url("codegen:pw", db=2))
    assert value is None and events == ["error:remote"] and elapsed < DEADLINE + MARGIN
    assert [c[0] for c in server.commands][:1] == [b"AUTH"]  # the handshake really ran


BAD_GET = {
    "status": b"+OK\r\n",
    "integer": b":42\r\n",
    "array": b"*1\r\n$1\r\nx\r\n",
    "nil-array": b"*-1\r\n",
    "length-below-nil": b"$-2\r\n",
    "length-not-a-number": b"$abc\r\n",
    "length-with-space": b"$ 5\r\nhello\r\n",
    "length-leading-zero": b"$05\r\nhello\r\n",
    "length-with-plus": b"$+5\r\nhello\r\n",
    "value-without-crlf": b"$5\r\nhelloXX\r\n",
    "resp3-double": b",1.5\r\n",
    "resp3-bool": b"#t\r\n",
    "resp3-null": b"_\r\n",
    "error": b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    "trailing-bytes": b"$-1\r\nEXTRA",
}


@pytest.mark.parametrize("reply", BAD_GET.values(), ids=BAD_GET.keys())
def test_wrong_typed_get_reply_is_a_counted_miss(fake, reply):
    server = _serve(fake, b"GET", reply)
    value, events, elapsed = _tier_get(server.url())
    assert value is None and events == ["error:remote"] and elapsed < DEADLINE + MARGIN


@pytest.mark.parametrize("reply", [b"$2\r\nOK\r\n", b":1\r\n", b"-OOM command not allowed\r\n", b"+QUEUED\r\n",
                                   b"$0\r\n\r\n"], ids=["bulk", "integer", "error", "other-status", "empty-bulk"])
def test_wrong_typed_set_reply_is_a_counted_failed_store(fake, reply):
    server = _serve(fake, b"SET", reply)
    events = []
    tier = RedisTier(server.url(), secret=SECRET, on_event=lambda name, n=1: events.append(name))
    try:
        assert tier.put("k" * 32, frame("source", {"key": "k"}, [b"x"])) is False
    finally:
        tier.close()
    assert events == ["error:remote"]


def test_a_nil_reply_to_set_nx_is_a_kept_entry_not_a_failure(fake):
    """SET NX answers nil where the key holds a value: the store left it alone (counted remote_kept)."""
    server = _serve(fake, b"SET", b"$-1\r\n")
    events = []
    tier = RedisTier(server.url(), secret=SECRET, on_event=lambda name, n=1: events.append(name))
    try:
        assert tier.push("k" * 32, frame("source", {"key": "k"}, [b"x"])) == "kept"
    finally:
        tier.close()
    assert events == ["remote_kept"] and server.commands[-1][-1] == b"NX"


def test_random_garbage_never_raises_and_every_call_is_counted(fake):
    """Replies of random bytes after each type byte: every get is None and counted once."""
    rng = random.Random(12)
    replies = [rng.choice(b"+-:$*_,#%~>!=(|").to_bytes(1, "big") + rng.randbytes(rng.randrange(0, 64))
               + rng.choice([b"", b"\r\n"]) for _ in range(60)]
    queue = list(replies)

    def answer(conn, args):
        conn.send(queue.pop(0))
        conn.close()  # so a reply cut short ends at EOF, not at the deadline

    server = fake(answer)
    events = []
    tier = RedisTier(server.url(), secret=SECRET, backoff=0, on_event=lambda name, n=1: events.append(name))
    try:
        for i in range(len(replies)):
            before = len(events)
            assert tier.get(f"{i:032d}") is None
            assert len(events) == before + 1, (replies[i], events[before:])
    finally:
        tier.close()
    assert set(events) <= {"error:remote", "remote_rejected", "remote_misses"}
    assert events.count("error:remote") > len(replies) // 2


# ---- a reply that never ends --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["handshake", "value"])
def test_trickled_reply_ends_at_the_deadline_not_per_read(tmp_path, fake, llvm_vadd, where):
    """1 byte every 0.3 s: each read is within the 0.5 s timeout, the whole call is not."""
    command, reply = (b"AUTH", b"+OK\r\n") if where == "handshake" else (b"GET", b"$1000\r\n" + b"x" * 1000)
    ref: list = []

    def answer(conn, args):
        if args[0].upper() == command:
            conn.trickle(reply, 0.3)
        else:
            ref[0].behave(conn, args)

    server = fake(answer)
    ref.append(server)
    outcome, elapsed, stats = _lower(tmp_path, server.url("codegen:pw"), llvm_vadd)
    assert outcome.tier == "codegen" and stats.errors.get("remote") == 1
    assert elapsed < DEADLINE + MARGIN, elapsed


def test_timeout_setting_sets_the_deadline(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TIMEOUT", "0.2")
    server = fake(lambda conn, args: conn.trickle(b"$10\r\n0123456789\r\n", 0.1))
    cache = cc.CodegenCache(tmp_path / "c", remote=server.url(), remote_secret=SECRET, write_behind=False)
    try:
        assert cache._remote.timeout == 0.2  # noqa: SLF001
        t0 = time.monotonic()
        assert cache._remote.get("k" * 32) is None  # noqa: SLF001
        assert time.monotonic() - t0 < 0.2 + MARGIN
        assert cache.stats().errors.get("remote") == 1
    finally:
        cache.close()


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_bad_timeout_setting_names_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_TIMEOUT", value)
    with pytest.raises(cc.ConfigError, match=f"'{value}' for CODEGEN_CACHE_REMOTE_TIMEOUT: expected a duration above 0"):
        cc.CodegenCache(tmp_path / "c", remote="redis://127.0.0.1:1/0")


# ---- a value over the cap ---------------------------------------------------------------------


def _endless_value(announced: int, sent_before_break: list):
    """Announce `announced` bytes, then stream zeros until the client drops the connection."""

    ref: list = []

    def answer(conn, args):
        if args[0].upper() != b"GET" or b":lib:" in args[1]:  # the library's key (asked first): none
            FakeRedis.behave(ref[0], conn, args) if ref else conn.send(b"+OK\r\n" if args[0] != b"GET" else b"$-1\r\n")
            return
        conn.send(b"$%d\r\n" % announced)
        chunk = bytes(1 << 20)
        try:
            while conn.sent < 256 << 20:
                conn.send(chunk)
        finally:
            sent_before_break.append(conn.sent)

    answer.ref = ref  # the server, once made (its behave() answers the other commands)
    return answer


def test_value_over_the_cap_is_not_read(fake):
    """400 MB announced: the get returns at once, allocates nothing near it, drops the connection."""
    sent: list[int] = []
    server = fake(_endless_value(400_000_000, sent))
    events = []
    tier = RedisTier(server.url(), secret=SECRET, on_event=lambda name, n=1: events.append(name))
    try:
        tracemalloc.start()
        t0 = time.monotonic()
        assert tier.get("k" * 32) is None
        elapsed = time.monotonic() - t0
        _size, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        tier.close()
    # Rejected from the length line: reading the endless value would have ended at the deadline,
    # as a failed call. A bad entry, not an outage: no backoff.
    assert events == ["remote_rejected"] and elapsed < DEADLINE + MARGIN, (events, elapsed)
    assert peak < 4 << 20, peak
    assert server.finished.wait(10), "the client kept the connection open"
    assert sent and sent[0] < 64 << 20, sent  # the server's writes failed: nobody was reading


def test_value_over_the_cap_is_a_rejected_miss_and_rebuilt(tmp_path, fake, llvm_vadd):
    answer = _endless_value(DEFAULT_MAX_ENTRY_BYTES + 1000, [])
    server = fake(answer)
    answer.ref.append(server)
    outcome, elapsed, stats = _lower(tmp_path, server.url(), llvm_vadd)
    assert outcome.tier == "codegen" and stats.remote_rejected == 1 and not stats.errors.get("remote")
    # The tier did not go offline: the rebuild's store was sent, as SET NX (it replaces nothing).
    assert [c[-1] for c in server.commands if c[0] == b"SET" and b":lease:" not in c[1]] == [b"NX"]
    assert elapsed < DEADLINE + MARGIN


# ---- connections that break --------------------------------------------------------------------

BREAKS = {
    "reset-before-reply": (b"", "reset"),
    "reset-mid-reply": (b"$100\r\n" + b"x" * 50, "reset"),
    "eof-before-reply": (b"", "close"),
    "eof-mid-line": (b"$10", "close"),
    "eof-mid-value": (b"$100\r\n" + b"x" * 50, "close"),
    "eof-before-crlf": (b"$3\r\nabc", "close"),
}


def _break(sent: bytes, how: str):
    def answer(conn, args):
        if sent:
            conn.send(sent)
            time.sleep(0.05)  # the bytes reach the client before the break
        conn.reset() if how == "reset" else conn.close()

    return answer


@pytest.mark.parametrize(("sent", "how"), BREAKS.values(), ids=BREAKS.keys())
def test_connection_broken_mid_reply_is_a_counted_miss(fake, sent, how, caplog):
    value, events, elapsed = _tier_get(fake(_break(sent, how)).url())
    assert value is None and events == ["error:remote"] and elapsed < DEADLINE + MARGIN
    # The break itself ended the call, not its deadline.
    assert caplog.records and "TimeoutError" not in caplog.records[-1].getMessage()


# ---- connecting early ---------------------------------------------------------------------------


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_connect_early_makes_the_connection_the_first_call_uses(fake):
    """AUTH is sent on a connection opened in the background; the first call then sends only its GET on it."""
    server = fake()
    tier = RedisTier(server.url(auth=":pw"), secret=SECRET)
    try:
        tier.connect_early()
        _wait_for(lambda: server.commands)
        assert tier.get("k" * 32) is None
    finally:
        tier.close()
    assert server.connections == 1 and [c[0] for c in server.commands] == [b"AUTH", b"GET"]


def test_a_first_call_waits_for_an_early_connection_within_its_own_one_deadline(fake):
    """An early connection that hangs (AUTH never answered) costs the first call its deadline, once, not twice."""
    def answer(conn, args):
        if args[0].upper() != b"AUTH":
            conn.send(b"$-1\r\n")  # never reached: AUTH is never answered

    server = fake(answer)
    events = []
    tier = RedisTier(server.url(auth=":pw"), secret=SECRET, timeout=2.0, on_event=lambda name, n=1: events.append(name))
    try:
        tier.connect_early()
        t0 = time.perf_counter()
        assert tier.get("k" * 32) is None
        elapsed = time.perf_counter() - t0
    finally:
        tier.close()
    # It waited for the early connection, then tried its own within what was left of its deadline.
    assert 1.9 < elapsed < 3.9 and events == ["error:remote"]


def test_a_cache_with_a_remote_connects_before_its_first_lowering(fake, tmp_path):
    server = fake()
    cache = cc.CodegenCache(tmp_path / "c", remote=server.url(), remote_secret=SECRET)
    try:
        _wait_for(lambda: server.connections == 1)
        assert server.commands == []  # a connection and nothing else (no AUTH or SELECT in this URL)
    finally:
        cache.close()


def test_an_ip_address_is_connected_to_without_the_resolver(fake, monkeypatch):
    """A process's first getaddrinfo reads the resolver's configuration: an IP literal needs none of it."""
    import socket

    server = fake()
    asked = []
    real = socket.getaddrinfo

    def getaddrinfo(*args, **kwargs):
        asked.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for host in ("127.0.0.1", "localhost"):
        tier = RedisTier(f"redis://{host}:{server.port}/0", secret=SECRET)
        try:
            assert tier.get("k" * 32) is None
        finally:
            tier.close()
    assert asked == ["localhost"] and server.connections == 2


# ---- inside lower() ----------------------------------------------------------------------------

IN_LOWER = {
    "handshake-resp3-map": (b"AUTH", NOT_OK["resp3-map"]),
    "handshake-error": (b"SELECT", NOT_OK["error"]),
    "get-array": (b"GET", BAD_GET["array"]),
    "get-integer": (b"GET", BAD_GET["integer"]),
    "get-error": (b"GET", BAD_GET["error"]),
    "get-garbage-length": (b"GET", BAD_GET["length-not-a-number"]),
}


@pytest.mark.parametrize(("command", "reply"), IN_LOWER.values(), ids=IN_LOWER.keys())
def test_a_malformed_reply_inside_lower_is_a_fresh_build_and_counted(tmp_path, fake, llvm_vadd, command, reply):
    server = _serve(fake, command, reply)
    outcome, elapsed, stats = _lower(tmp_path, server.url("codegen:pw", db=2), llvm_vadd)
    assert outcome.tier == "codegen" and stats.errors.get("remote") == 1 and stats.hits_remote == 0
    if reply.startswith(b"-") and command == b"GET":
        # A refused read stops reads only: the lease and the store went on.
        assert (stats.remote_offline, stats.remote_stores) == (0, 1)
    else:
        assert stats.remote_offline >= 1  # the store skipped the faulty server
    assert elapsed < DEADLINE + MARGIN


@pytest.mark.parametrize(("sent", "how"), [BREAKS["reset-mid-reply"], BREAKS["eof-mid-value"]],
                         ids=["reset-mid-reply", "eof-mid-value"])
def test_a_connection_broken_inside_lower_is_a_fresh_build_and_counted(tmp_path, fake, llvm_vadd, sent, how):
    outcome, elapsed, stats = _lower(tmp_path, fake(_break(sent, how)).url(), llvm_vadd)
    assert outcome.tier == "codegen" and stats.errors.get("remote") == 1
    assert elapsed < DEADLINE + MARGIN


def test_the_tier_reconnects_after_a_fault_and_after_an_idle_close(fake):
    """A broken connection is never reused; an idle one the server closed is replaced, uncounted."""
    ref: list = []
    garbage_first = [True]

    def answer(conn, args):
        if garbage_first.pop() if garbage_first else False:
            conn.send(b"?garbage\r\n")
            return
        ref[0].behave(conn, args)
        conn.close()  # as Redis does to an idle client past its `timeout`

    server = fake(answer)
    ref.append(server)
    events = []
    tier = RedisTier(server.url(), secret=SECRET, backoff=0.2, on_event=lambda name, n=1: events.append(name))
    blob = frame("source", {"key": "k"}, [b"__global__ void k() {}"])
    try:
        assert tier.get("k" * 32) is None and events == ["error:remote"]
        assert server.finished.wait(10)  # the client dropped the broken connection
        time.sleep(0.3)  # past the backoff
        server.finished.clear()
        assert tier.put("k" * 32, blob) is True
        assert server.finished.wait(10)  # the server has closed the now idle connection
        assert tier.get("k" * 32) == blob
    finally:
        tier.close()
    assert events == ["error:remote", "remote_stores"]
    assert server.connections == 3  # the broken one, then one per call after each close


def test_every_client_failure_is_an_oserror_whatever_the_server_sends(fake):
    """The tier catches OSError only (and ConfigError): random replies to every command it sends stay OSErrors."""
    from codegen_cache._storage._client import RespClient
    from codegen_cache._storage._endpoint import Endpoint
    from codegen_cache._storage._scripts import RELEASE

    rng = random.Random(24)
    pieces = [b"+OK", b"-MOVED 1 127.0.0.1:1", b"-ASK 99999 x:0", b"-MOVED 5 :7000", b"*3", b"*-1", b":12", b"$3",
              b"$-1", b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$0\r\n:0", b"-NOSCRIPT", b"-ERR x", b"\xff\xfe"]
    replies = [b"\r\n".join(rng.choice(pieces) for _ in range(rng.randrange(1, 5))) + rng.choice([b"", b"\r\n"])
               for _ in range(80)]

    def answer(conn, args):
        conn.send(replies[len(server.commands) % len(replies)])
        conn.close()

    server = fake(answer)
    client = RespClient(Endpoint.from_url(server.url(), 0.3))
    calls = [lambda: client.get(b"k", 1 << 20), lambda: client.set(b"k", b"v", 1000, nx=True),
             lambda: client.run(RELEASE, b"k", [b"t"], lambda c, cmd, d: c.expect_int(cmd, d))]
    try:
        for i in range(len(replies)):
            try:
                calls[i % 3]()
            except OSError:
                pass  # anything else fails the test
    finally:
        client.close()


def test_a_host_name_that_cannot_be_encoded_is_a_counted_miss():
    events = []
    tier = RedisTier("redis://a..b:6379/0", secret=SECRET, on_event=lambda name, n=1: events.append(name))
    assert tier.get("k" * 32) is None and events == ["error:remote"]
