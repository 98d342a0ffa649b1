"""Framed artifacts: round trips per codec, and malformed bytes raise ArtifactError only."""

from __future__ import annotations

import struct

import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import CachedLibraryModule, decode, encode, frame, read_meta, unframe, upgrade
from codegen_cache._artifacts import CudaPayload
from codegen_cache._compat import host_llvm_triple
from codegen_cache._compat._emit import tvm_libraries
from conftest import CUDA_TARGET

CASES = [("llvm", kernels.vadd, True), ("llvm", kernels.vadd, False), ("c", kernels.vadd, False),
         (CUDA_TARGET, kernels.vadd_gpu, False), ("opencl", kernels.vadd_gpu, False)]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    scratch = str(tmp_path_factory.mktemp("scratch"))
    out = {}
    for target, kernel, compile_device in CASES:
        mod, tgt = cc.prepare_for_codegen(kernel, target)
        module = cc.resolve_device_codegen(tgt).invoke(mod, tgt, compile_device=compile_device)
        out[(tgt.kind.name, compile_device)] = (module, encode(module, {"key": "k"}, func_names=["__tvm_ffi_vadd" if tgt.kind.name == "llvm" else "vadd"]))
    return scratch, out


def test_round_trip_keeps_source_and_functions(blobs):
    scratch, cases = blobs
    for (kind, compiled), (module, blob) in cases.items():
        loaded, meta = decode(blob, scratch=scratch)
        assert meta["key"] == "k" and meta["module_kind"] == module.kind
        if module.kind == "llvm":
            # The raw form (LLVM IR) loads back as an llvm module; its upgrade as a library that
            # answers as the built llvm module (kind, properties, source).
            assert loaded.kind == "llvm" and loaded.implements_function("vadd")
            assert loaded.inspect_source("ll") == module.inspect_source("ll")
            upgraded, _ = decode(upgrade(blob, scratch, libraries=tvm_libraries(), host_triple=host_llvm_triple()),
                                 scratch=scratch)
            assert upgraded.kind == "llvm" and upgraded.implements_function("vadd")
            assert upgraded.get_property_mask() == module.get_property_mask()
            assert upgraded.inspect_source("ll") == module.inspect_source("ll")
            assert isinstance(upgraded, CachedLibraryModule)
        else:
            assert loaded.inspect_source("") == module.inspect_source(""), kind
        if module.kind == "c":
            assert loaded.kind == "c" and loaded.implements_function("__tvm_ffi_vadd")


def test_every_flipped_byte_is_detected(blobs):
    scratch, cases = blobs
    _, blob = cases[("cuda", False)]
    for pos in range(0, len(blob), max(1, len(blob) // 200)):
        bad = bytearray(blob)
        bad[pos] ^= 0x5A
        with pytest.raises(cc.ArtifactError):
            decode(bytes(bad), scratch=scratch)


def test_truncations_are_detected(blobs):
    scratch, cases = blobs
    _, blob = cases[("c", False)]
    for cut in (0, 3, 10, len(blob) // 2, len(blob) - 1):
        with pytest.raises(cc.ArtifactError):
            decode(blob[:cut], scratch=scratch)


def test_error_message_names_the_problem():
    with pytest.raises(cc.ArtifactError, match="bad magic b'NOPE'"):
        unframe(b"\0" * 40 + b"NOPE")
    with pytest.raises(cc.ArtifactError, match="shorter than the frame footer"):
        unframe(b"CGCA")
    blob = frame("source", {"a": 1}, [b"x"])
    assert read_meta(blob) == ("source", {"a": 1})
    with pytest.raises(cc.ArtifactError, match="unknown codec 'mystery'"):
        decode(frame("mystery", {}, []), scratch="/tmp")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=512))
def test_random_bytes_raise_only_artifact_error(data, tmp_path):
    with pytest.raises(cc.ArtifactError):
        decode(data, scratch=str(tmp_path))


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.binary(max_size=64), max_size=5), codec=st.sampled_from(["llvm-so", "cuda-bin", "c", "source", "x"]))
def test_well_framed_garbage_raises_only_artifact_error(fields, codec, tmp_path_factory):
    scratch = str(tmp_path_factory.getbasetemp())
    blob = frame(codec, {"source_format": "cu"}, fields)
    try:
        module, _ = decode(blob, scratch=scratch)
    except cc.ArtifactError:
        return
    except cc.CudaRuntimeUnavailableError:
        # A well-formed CUDA binary artifact on a machine without a driver.
        assert codec == "cuda-bin" and fields[0] in (b"fatbin", b"cubin", b"ptx")
        return
    # Only the text codecs (source, c) accept any one field, and give a source module.
    assert codec in ("source", "c") and len(fields) == 1 and isinstance(module, tvm.runtime.Module)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=256))
def test_cuda_payload_parser_rejects_garbage(data):
    try:
        payload = CudaPayload.from_bytes(data)
    except cc.ArtifactError:
        return
    assert payload.to_bytes() == data


def test_cuda_payload_round_trip():
    fmap = struct.pack("<Q", 0)
    payload = CudaPayload("fatbin", fmap, b"\x01\x02")
    assert CudaPayload.from_bytes(payload.to_bytes()) == payload


# ---- the stored LLVM IR text: printed into a memfd, byte for byte inspect_source's ------------


def test_stored_llvm_ir_is_the_modules_own_text_by_either_route(blobs, monkeypatch):
    from codegen_cache._artifacts import _llvm

    module = blobs[1][("llvm", True)][0]
    text = module.inspect_source("ll").encode()
    assert _llvm.ir_text(module) == text  # the memfd route, where this machine has memfds
    assert unframe(encode(module, {"key": "k"}, func_names=["__tvm_ffi_vadd"])).fields[0] == text
    # LLVM cannot open the memfd's path (no /proc, a sandbox): TVM raises, the text comes from memory.
    monkeypatch.setattr(_llvm, "fd_path", lambda fd: "/nonexistent-codegen-cache-dir/ir.ll")
    assert _llvm.ir_text(module) == text
    monkeypatch.setattr(_llvm, "_memfd_create", None)  # a platform without memfds
    assert _llvm.ir_text(module) == text
    assert _llvm.ir_triple(text) == _llvm.ir_triple(text.decode()) != ""


@pytest.mark.slow
def test_a_file_size_limit_makes_the_ir_text_come_from_memory_not_a_memfd(tmp_path):
    # LLVM ends the process when a write fails, and RLIMIT_FSIZE applies to memfds too: the
    # kernel sends SIGXFSZ to a process writing past it. Under a limit below the module's text,
    # the store must still get the whole text, and the process must live on.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import resource, sys
        import codegen_cache as cc, kernels
        from codegen_cache._artifacts import _llvm
        mod, tgt = cc.prepare_for_codegen(kernels.vadd, "llvm")
        module = cc.resolve_device_codegen(tgt).invoke(mod, tgt, compile_device=True)
        text = module.inspect_source("ll").encode()
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        assert len(text) > 4096
        assert _llvm.ir_text(module) == text
        print("whole", len(text))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=240, env={**__import__("os").environ,
                                            "PYTHONPATH": str(__import__("pathlib").Path(__file__).parent)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("whole ")
