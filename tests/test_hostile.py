"""Hostile bytes: fuzzed disk entries and remote payloads, planted pickles and planted file names.

Malformed bytes (flipped, cut, extended, random) are always a miss and a rebuild; well-framed
bytes with a valid checksum but nonsense inside never make lower() raise; nothing read from
a cache directory or a remote is ever unpickled; a row naming a file outside its store is
never followed. The full example counts run with --stress.
"""

from __future__ import annotations

import pickle
import sqlite3

import diskcache
import pytest
import tvm
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import codegen_cache as cc
from codegen_cache._artifacts import HOT_META, frame
from codegen_cache._errors import ArtifactError
from codegen_cache._storage._disk import KEYS_DIR
from test_reliability import populate
from workers import check_module, variant

CODECS = ["llvm-so", "cuda-bin", "c", "source", "failure", "", "x" * 40]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=8)


@pytest.fixture
def stress(request) -> bool:
    """True under --stress: run the full counts."""
    return bool(request.config.getoption("--stress"))


def _examples(stress: bool, default: int, full: int):
    return settings(max_examples=full if stress else default, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A cache with variant 1 stored both ways; no memory tier, so every lower reads the store."""
    directory = tmp_path_factory.mktemp("hostile") / "cache"
    populate(directory, 1)
    cache = cc.CodegenCache(directory, write_behind=False, memory_entries=0)
    keys = {compiled: cache.key_for(*variant(1), compile_device=compiled).digest for compiled in (True, False)}
    blobs = {compiled: cache.store(_store(compiled)).get(keys[compiled]) for compiled in (True, False)}
    yield cache, keys, blobs
    cache.close()


def _store(compiled: bool) -> str:
    return "compiled" if compiled else "source"


def malformed(blob: bytes):
    """Strategy: `blob` with bytes flipped, cut short, extended or spliced; or random bytes."""
    n = len(blob)

    def flip(changes: dict[int, int]) -> bytes:
        out = bytearray(blob)
        for pos, mask in changes.items():
            out[pos] ^= mask
        return bytes(out)

    return st.one_of(
        st.dictionaries(st.integers(0, n - 1), st.integers(1, 255), min_size=1, max_size=8).map(flip),
        st.integers(0, n - 1).map(lambda k: blob[:k]),
        st.binary(min_size=1, max_size=64).map(lambda tail: blob + tail),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=64)).map(lambda a: blob[: a[0]] + a[1] + blob[a[0] :]),
        st.binary(max_size=4096),
    )


def well_framed(digest: str):
    """Strategy: valid frames (correct checksum and key) of any codec, metadata and fields."""
    meta = st.fixed_dictionaries({"key": st.just(digest)}, optional={name: JSON for name in sorted(HOT_META - {"key"})})
    fields = st.lists(st.one_of(st.binary(max_size=64), st.sampled_from([b"fatbin", b"cubin", b"ptx", b"\0" * 8])),
                      max_size=5)
    return st.builds(frame, st.sampled_from(CODECS), meta, fields)


def test_malformed_disk_entries_are_rebuilt_never_served(seeded, stress):
    cache, keys, blobs = seeded

    @_examples(stress, 15, 300)
    @given(data=st.data())
    def run(data):
        compiled = data.draw(st.booleans(), label="compiled")
        bad = data.draw(malformed(blobs[compiled]), label="entry")
        assume(bad != blobs[compiled])
        # The llvm upgrader a compiled miss started may still be linking that entry: it replaces
        # only the entry it read, but a put between its check and its store would be replaced by
        # a valid entry (served from disk, not rebuilt). Planted once no upgrade is pending.
        assert cache.flush(timeout=120, upgrades=True)
        cache.store(_store(compiled)).put(keys[compiled], bad)
        module, outcome = cache.lower_with_outcome(*variant(1), compile_device=compiled)
        assert outcome.tier == "codegen"
        check_module(module, 1, compiled)

    run()


def test_well_framed_nonsense_on_disk_never_breaks_lower(seeded, stress):
    # A valid checksum is not authentication: such an entry may be served (the cache directory
    # is trusted, docs/reliability.md), but it must never make lower() raise.
    cache, keys, _blobs = seeded

    @_examples(stress, 30, 400)
    @given(data=st.data())
    def run(data):
        compiled = data.draw(st.booleans(), label="compiled")
        cache.store(_store(compiled)).put(keys[compiled], data.draw(well_framed(keys[compiled]), label="entry"))
        assert isinstance(cache.lower(*variant(1), compile_device=compiled), tvm.runtime.Module)

    run()


class _Remote:
    """A remote tier whose get() returns whatever the test planted."""

    def __init__(self) -> None:
        self.blob: bytes | None = None
        self.puts = 0

    def get(self, key: str) -> bytes | None:
        return self.blob

    def put(self, key: str, blob: bytes) -> bool:
        self.puts += 1
        return True


def test_malformed_and_nonsense_remote_payloads_never_break_lower(tmp_path, seeded, stress):
    _cache, keys, blobs = seeded
    remote = _Remote()
    cache = cc.CodegenCache(tmp_path / "local", write_behind=False, memory_entries=0, remote=remote)

    @_examples(stress, 20, 300)
    @given(data=st.data())
    def run(data):
        compiled = data.draw(st.booleans(), label="compiled")
        cache.store(_store(compiled)).clear()  # the local store misses: the remote answers
        if data.draw(st.booleans(), label="malformed"):
            remote.blob = data.draw(malformed(blobs[compiled]), label="payload")
            assume(remote.blob != blobs[compiled])
            module, outcome = cache.lower_with_outcome(*variant(1), compile_device=compiled)
            assert outcome.tier == "codegen"
            check_module(module, 1, compiled)
        else:
            remote.blob = data.draw(well_framed(keys[compiled]), label="payload")
            cache.lower(*variant(1), compile_device=compiled)

    run()
    cache.close()


def test_redis_envelopes_are_rejected_never_raised(stress):
    from codegen_cache._storage._envelope import Rejection, open_value, seal

    blob = frame("source", {"key": "k"}, [b"text"])
    secrets = [None, b"team secret"]
    name = "codegen-cache:v3:k"
    sealed = [seal(name, blob, secret) for secret in secrets]

    @_examples(stress, 300, 3000)
    @given(which=st.sampled_from([0, 1]), data=st.data())
    def run(which, data):
        value = data.draw(malformed(sealed[which]) | st.binary(max_size=256), label="value")
        opened = open_value(name, value, secrets[which])
        if isinstance(opened, Rejection):
            assert opened.kind in ("damaged", "signature", "unsigned", "version")
            return
        # Only an intact entry (or, unsigned, a frame that passes its own checks) gets through.
        assert which == 0 or value == sealed[1]
        assert isinstance(opened[0], memoryview) and isinstance(opened[1], str)

    run()


def test_redis_tier_rejects_hostile_payloads_inside_a_full_lower(tmp_path, seeded, stress):
    from codegen_cache._storage._remote import RedisTier

    _cache, keys, blobs = seeded

    class Client:
        value: bytes | None = None

        def get(self, name, limit):
            return None if b":lib:" in name else self.value  # the entry every host reads, no library

        def set(self, name, value, px=None, *, nx=False):
            return True

        def run(self, script, key, args, read):
            return 0

        def close(self):
            pass

    from codegen_cache._storage._envelope import seal

    tier = RedisTier("redis://127.0.0.1:9/0", secret="team secret")
    tier._client = tier.leases._client = client = Client()  # noqa: SLF001
    cache = cc.CodegenCache(tmp_path / "local", write_behind=False, memory_entries=0, remote=tier)
    honest = {c: seal(tier.redis_key(keys[c]), blobs[c], b"team secret") for c in (True, False)}

    @_examples(stress, 12, 200)
    @given(data=st.data())
    def run(data):
        compiled = data.draw(st.booleans(), label="compiled")
        cache.store(_store(compiled)).clear()
        tier._absent.clear()  # noqa: SLF001
        client.value = data.draw(malformed(honest[compiled]), label="value")
        assume(client.value != honest[compiled])
        module, outcome = cache.lower_with_outcome(*variant(1), compile_device=compiled)
        assert outcome.tier == "codegen"
        check_module(module, 1, compiled)

    run()
    client.value = honest[True]
    cache.store("compiled").clear()
    tier._absent.clear()  # noqa: SLF001
    assert cache.lower_with_outcome(*variant(1), compile_device=True)[1].tier == "remote"
    cache.close()


# ---- nothing is ever unpickled --------------------------------------------------------------


class Unpickled(BaseException):
    """Raised by the patched pickle loaders: a BaseException, so no `except Exception` hides it."""


class Boom:
    def __init__(self, size: int = 0) -> None:
        self.padding = b"x" * size

    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def _refuse(*args, **kwargs):
    raise Unpickled("something tried to unpickle cache bytes")


def test_no_code_path_unpickles_planted_rows(tmp_path, monkeypatch, cuda_vadd):
    directory = tmp_path / "cache"
    mod, target = cuda_vadd
    probe = cc.CodegenCache(directory)
    digests = [probe.key_for(*variant(i), compile_device=c).digest for i in (1, 2) for c in (True, False)]
    digests.append(probe.key_for(mod, target, compile_device=False).digest)
    probe.close()
    # What someone with write access to the directory could plant with diskcache itself:
    # pickled values under our keys (small ones in the database, large ones in files) and
    # pickled keys, in every store.
    for store in ("compiled", "source", "failures", "leases"):
        plain = diskcache.Cache(str(directory / store))
        for n, digest in enumerate(digests):
            plain.set(digest, Boom(size=100_000 if n % 2 else 0))
        plain.set(("pickled", "key"), b"x")
        plain.close()
    for name in ("load", "loads", "Unpickler", "_load", "_loads", "_Unpickler"):
        monkeypatch.setattr(pickle, name, _refuse)
    with pytest.raises(Unpickled):  # the control: diskcache alone would unpickle these rows
        diskcache.Cache(str(directory / "compiled")).get(digests[0])

    # A full cycle: misses over planted rows, leases, builds, stores, memory and disk hits,
    # a failing codegen stored and served, and listing the store.
    for round_ in range(2):
        cache = cc.CodegenCache(directory, write_behind=bool(round_))
        for i in (1, 2):
            for compiled in (True, False):
                for _ in range(2):
                    check_module(cache.lower(*variant(i), compile_device=compiled), i, compiled)
        assert "__global__" in cache.lower(mod, target, compile_device=False).inspect_source("")

        def broken(m, t):
            raise ValueError("invalid config")

        failing = cc.DeviceCodegen("llvm", build=broken, build_without_compile=broken)
        with pytest.raises((ValueError, cc.CachedCodegenError), match="invalid config"):
            cache.lower(*variant(3), codegen=failing)
        with pytest.raises(cc.CachedCodegenError, match="invalid config"):
            cache.lower(*variant(3), codegen=failing)
        with pytest.raises(ArtifactError):
            list(cache.store("compiled").keys())  # a pickled key is refused, not unpickled
        cache.close()
    assert cc.CodegenCache(directory).lower_with_outcome(*variant(1))[1].tier == "disk"


# ---- planted file names ---------------------------------------------------------------------


@pytest.mark.parametrize("named_in", ["row", "key file"])
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_row_naming_a_file_outside_its_store_is_never_read_or_deleted(tmp_path, where, named_in):
    directory = tmp_path / "cache"
    populate(directory, 1)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious" * 10_000)
    name = "../../victim.bin" if where == "relative" else str(victim)
    cache = cc.CodegenCache(directory, write_behind=False)
    digest = cache.key_for(*variant(1), compile_device=False).digest  # LLVM IR: a value file
    key_file = directory / "source" / KEYS_DIR / digest
    key_file.unlink()  # read-only, replaced by rename, as its writer does
    if named_in == "key file":
        key_file.write_text(f"{name}\n{victim.stat().st_size}\n")  # the row still names the entry's file
    else:  # no key file: read from the row
        db = sqlite3.connect(str(directory / "source" / "cache.db"))
        with db:
            assert db.execute("UPDATE Cache SET filename = ? WHERE key = ?", (name, digest)).rowcount == 1
        db.close()
    module, outcome = cache.lower_with_outcome(*variant(1), compile_device=False)
    check_module(module, 1, False)
    if named_in == "row":
        assert outcome.tier == "codegen"  # refused: a miss
        assert cache.stats(shared=False).errors  # counted, not served
    else:
        assert outcome.tier == "disk"  # the key file is not followed: the row's own file is read
    assert victim.read_bytes() == b"precious" * 10_000  # read as a corrupt entry, it was deleted
    cache.store("source").delete(digest)
    cache.store("source").clear()
    cache.close()
    assert victim.read_bytes() == b"precious" * 10_000
