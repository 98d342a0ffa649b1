"""The llvm upgrader's TVM calls through tvm-ffi's Python API: the same object file as TVM's, without importing TVM."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import CachedLibraryModule, decode, encode
from codegen_cache._compat import host_llvm_triple
from codegen_cache._compat._emit import emit_object, tvm_libraries
from conftest import run_binary


@pytest.fixture(scope="module")
def built():
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    return cc.global_func_device_codegen("target.build.llvm")(mod, target)


def test_the_libraries_named_are_tvm_ffi_first_then_one_with_the_llvm_loader():
    libraries = tvm_libraries()
    assert libraries and "tvm_ffi" in libraries[0], libraries
    assert any("compiler" in p or p.endswith("/libtvm.so") for p in libraries), libraries


def test_the_object_file_is_byte_for_byte_the_one_tvms_python_api_writes(built, tmp_path):
    import tvm

    ir = tmp_path / "m.ll"
    ir.write_text(built.inspect_source("ll"))
    emit_object(tvm_libraries(), str(ir), str(tmp_path / "abi.o"))
    tvm.get_global_func("ffi.Module.load_from_file.ll")(str(ir), "ll").write_to_file(str(tmp_path / "api.o"))
    assert (tmp_path / "abi.o").read_bytes() == (tmp_path / "api.o").read_bytes() != b""


def test_tvms_error_comes_back_as_a_runtime_error_with_its_message(tmp_path):
    ir = tmp_path / "bad.ll"
    ir.write_text("this is not LLVM IR\n")
    with pytest.raises(RuntimeError, match="load_from_file.ll failed"):
        emit_object(tvm_libraries(), str(ir), str(tmp_path / "bad.o"))
    assert not (tmp_path / "bad.o").exists()


def test_an_entry_is_upgraded_in_a_process_that_never_imports_tvm(built, tmp_path):
    blob = encode(built, {"key": "k"}, func_names=["vadd"])
    (tmp_path / "raw").write_bytes(blob)
    script = textwrap.dedent("""
        import sys
        from codegen_cache._artifacts._link import upgrade
        better = upgrade(open(sys.argv[1], "rb").read(), sys.argv[2], host_triple=sys.argv[3], libraries=sys.argv[4:])
        open(sys.argv[1] + ".so", "wb").write(better)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "tvm"))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "raw"), str(tmp_path), host_llvm_triple(),
                           *tvm_libraries()], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"  # TVM's Python package never (tvm-ffi's only)
    module, _ = decode((tmp_path / "raw.so").read_bytes(), scratch=str(tmp_path))
    assert isinstance(module, CachedLibraryModule)
    assert run_binary(module).tolist() == [2.0 * i for i in range(1024)]
