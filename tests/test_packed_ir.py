"""llvm entries keep their LLVM IR zstd-packed in the store, the linked form and the remote; read back byte for byte."""

from __future__ import annotations

import pytest
import zstandard

import codegen_cache as cc
from codegen_cache._cli import _main as _cli
from codegen_cache._artifacts import _packed, decode, encode, frame, portable, unframe, upgrade
from codegen_cache._compat import host_llvm_triple
from codegen_cache._compat._emit import tvm_libraries
from codegen_cache._errors import ArtifactError
from codegen_cache._storage._remote import RedisTier
from redis_server import RedisServer, _need_redis_server


@pytest.fixture(scope="module")
def built(llvm_vadd):
    mod, target = llvm_vadd
    module = cc.resolve_device_codegen(target).invoke(mod, target, compile_device=True)
    return module, module.inspect_source("ll")


def test_a_packed_field_unpacks_to_the_text_and_plain_text_passes_through():
    text = b"; ModuleID = 'x'\n" + b"define void @f() {\n  ret void\n}\n" * 200
    packed = _packed.pack(text)
    assert _packed.is_packed(packed) and not _packed.is_packed(text) and len(packed) < len(text) / 5
    assert _packed.unpack(packed) == text and _packed.unpack(text) is text
    assert _packed.unpack(_packed.pack(text, _packed.SMALL_LEVEL)) == text


@pytest.mark.parametrize("bad", [
    zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 1000),  # size not declared
    _packed.pack(b"x" * 1000)[:-3],  # cut short
    b"\x28\xb5\x2f\xfd" + b"\x00" * 20,  # the magic, then nothing valid
])
def test_a_malformed_packed_field_is_an_artifact_error(bad):
    with pytest.raises(ArtifactError, match="packed LLVM IR"):
        _packed.unpack(bad)


def test_compact_packs_an_llvm_ir_entry_and_leaves_everything_else_alone(built, tmp_path):
    module, text = built
    raw = encode(module, {"key": "k"}, func_names=["vadd"])
    small = cc._artifacts.compact(raw)  # noqa: SLF001
    art = unframe(small)
    assert art.codec == "llvm-ir" and _packed.is_packed(art.fields[0]) and art.meta == unframe(raw).meta
    assert cc._artifacts.compact(small) == small  # noqa: SLF001 - packed once
    other = frame("source", {"key": "k"}, [b"__global__ void f() {}"])
    assert cc._artifacts.compact(other) is other  # noqa: SLF001
    corrupt = raw[:100] + bytes([raw[100] ^ 1]) + raw[101:]
    assert cc._artifacts.compact(corrupt) is corrupt  # noqa: SLF001 - never framed again under a new checksum
    loaded, _meta = decode(small, scratch=str(tmp_path))
    assert loaded.inspect_source("ll") == text


def test_the_linked_entry_keeps_the_ir_packed_smaller_and_gives_it_back_byte_for_byte(built, tmp_path):
    module, text = built
    small = cc._artifacts.compact(encode(module, {"key": "k"}, func_names=["vadd"]))  # noqa: SLF001
    linked = upgrade(small, str(tmp_path), libraries=tvm_libraries(), host_triple=host_llvm_triple())
    art = unframe(linked)
    assert art.codec == "llvm-so" and _packed.is_packed(art.fields[1])
    assert len(art.fields[1]) <= len(unframe(small).fields[0])
    loaded, _meta = decode(linked, scratch=str(tmp_path))
    assert loaded.kind == "llvm" and loaded.inspect_source("ll") == text
    # What another platform's host reads: the same packed IR, as an llvm-ir entry.
    other = unframe(portable(linked))
    assert other.codec == "llvm-ir" and bytes(other.fields[0]) == bytes(art.fields[1])
    assert decode(portable(linked), scratch=str(tmp_path))[0].inspect_source("ll") == text


def test_the_store_holds_packed_ir_and_a_hit_reads_it_back(tmp_path, llvm_vadd, capsys):
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    try:
        built = cache.lower(mod, target)
        digest = cache.key_for(mod, target).digest
        stored = unframe(cache.store("compiled").get(digest))
        assert stored.codec == "llvm-ir" and _packed.is_packed(stored.fields[0])
        assert cache.flush(upgrades=True, timeout=240)
        stored = unframe(cache.store("compiled").get(digest))
        assert stored.codec == "llvm-so" and _packed.is_packed(stored.fields[1])
    finally:
        cache.close()
    fresh = cc.CodegenCache(tmp_path / "cache")
    try:
        hit, outcome = fresh.lower_with_outcome(mod, target)
        assert outcome.tier == "disk"
        assert hit.inspect_source("ll") == built.inspect_source("ll")
    finally:
        fresh.close()
    # The command line shows the IR of the linked entry as the text.
    capsys.readouterr()
    assert _cli.main(["--dir", str(tmp_path / "cache"), "show", digest[:16], "--code"]) == 0
    assert built.inspect_source("ll") in capsys.readouterr().out


def test_the_remote_holds_the_packed_forms(tmp_path, llvm_vadd, request):
    _need_redis_server()
    server = RedisServer(tmp_path / "redis")
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "cache", remote=server.url, write_behind=False)
    try:
        cache.lower(mod, target)
        assert cache.flush(upgrades=True, timeout=240)
        digest = cache.key_for(mod, target).digest
        remote = RedisTier(server.url)
        request.addfinalizer(remote.close)
        # The key every host reads (not get(): it serves this platform's library where there is one).
        every_host = unframe(bytes(remote._read(remote.redis_key(digest), count_miss=False).frame))  # noqa: SLF001
        this_platform = unframe(remote.get(digest, library=True))
        assert every_host.codec == "llvm-ir" and _packed.is_packed(every_host.fields[0])
        assert this_platform.codec == "llvm-so" and _packed.is_packed(this_platform.fields[1])
    finally:
        cache.close()
        server.close()
