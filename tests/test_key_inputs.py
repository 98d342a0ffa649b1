"""Every input a codegen reads is a key part or a documented exclusion: environment, tools, PassContext.

The lists are derived from TVM's own sources and libraries (and nvcc's binary), so a TVM or
CUDA upgrade that reads something new fails here instead of serving another module.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import tvm
import tvm.relax  # noqa: F401  registers relax's pass configs
import tvm.s_tir  # noqa: F401

import codegen_cache as cc
import kernels
from codegen_cache.codegens import BUILTIN_FAMILIES, _common, cuda
from conftest import CUDA_TARGET, HAS_NVCC

TVM_DIR = Path(tvm.__file__).parent
# TVM's Python modules on (or beside) a device codegen's path: the support modules the
# codegens and their callbacks call (nvcc, rocm, utils, ...), and the target modules.
TVM_SOURCES = sorted([*TVM_DIR.glob("support/*.py"), *TVM_DIR.glob("target/**/*.py")])
# The libraries holding TVM's codegens.
TVM_LIBRARIES = [TVM_DIR / "lib" / "libtvm_compiler.so", TVM_DIR / "lib" / "libtvm_runtime_cuda.so"]
ENV_READS = [
    r"os\.environ\.get\(\s*[\"'](\w+)[\"']",
    r"os\.environ\[\s*[\"'](\w+)[\"']\s*\]",
    r"[\"'](\w+)[\"']\s+(?:not\s+)?in\s+os\.environ",
    r"os\.getenv\(\s*[\"'](\w+)[\"']",
]


def _env_read_by_tvm_python() -> dict[str, str]:
    found = {}
    for path in TVM_SOURCES:
        text = path.read_text("utf-8", "replace")
        for pattern in ENV_READS:
            for name in re.findall(pattern, text):
                found.setdefault(name, str(path.relative_to(TVM_DIR)))
    return found


def _strings(path: Path, pattern: bytes) -> set[str]:
    return {m.decode() for m in re.findall(rb"\x00(" + pattern + rb")\x00", path.read_bytes())}


def _toolchain_parts() -> dict[tuple[str, str], set[str]]:
    """{(codegen, mode): the names of the parts its toolchain puts in the key}, for every built-in codegen."""
    out = {}
    for kind in BUILTIN_FAMILIES:
        target = tvm.target.Target(CUDA_TARGET if kind == "cuda" else {"kind": kind})
        entry = cc.resolve_device_codegen(target)
        for compile_device in (True, False):
            if entry.supports_mode(compile_device):
                parts = entry.toolchain(target, compile_device) if entry.toolchain else {}
                out[(kind, "compiled" if compile_device else "source")] = set(parts)
    return out


def _keyed_env() -> dict[tuple[str, str], set[str]]:
    """{(codegen, mode): the env:NAME parts its toolchain puts in the key}, for every built-in codegen."""
    return {where: {name.split(":", 1)[1] for name in parts if name.startswith("env:")}
            for where, parts in _toolchain_parts().items()}


@pytest.fixture(scope="module")
def keyed_env():
    return _keyed_env()


@pytest.mark.slow
def test_every_env_var_tvms_python_reads_is_keyed_or_excluded(keyed_env):
    found = _env_read_by_tvm_python()
    assert {"TVM_CUDA_PTXAS_EXTRA_OPTS", "TVM_CUDA_COMPILE_MODE", "CUDA_PATH"} <= set(found), \
        f"the grep found too little ({sorted(found)}): are TVM's sources where it looks?"
    keyed = set().union(*keyed_env.values())
    missing = {name: where for name, where in found.items() if name not in keyed and name not in _common.EXCLUDED_ENV}
    assert not missing, f"read by TVM, neither a key part nor in codegens/_common.EXCLUDED_ENV: {missing}"


def test_every_tvm_env_var_in_the_codegen_libraries_is_keyed_or_excluded(keyed_env):
    found = set().union(*(_strings(lib, rb"TVM_[A-Z0-9_]+") for lib in TVM_LIBRARIES if lib.exists()))
    assert "TVM_COMPILE_FORCE_FALLBACK" in found
    keyed = set().union(*keyed_env.values())
    missing = sorted(found - keyed - set(_common.EXCLUDED_ENV))
    assert not missing, f"named in TVM's codegen libraries, neither keyed nor excluded: {missing}"


def _real_nvcc() -> Path | None:
    path = shutil.which("nvcc")
    if path is None:
        return None
    data = Path(path).read_bytes()
    if data.startswith(b"#!"):  # a wrapper script (exec /usr/local/cuda-X/bin/nvcc "$@")
        match = re.search(rb"(/\S+/nvcc)\b", data[2:])
        return Path(match.group(1).decode()) if match else None
    return Path(os.path.realpath(path))


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not installed")
@pytest.mark.nvcc
def test_every_variable_nvcc_itself_reads_is_a_compiled_cuda_key_part(keyed_env):
    nvcc = _real_nvcc()
    assert nvcc is not None and nvcc.exists()
    found = _strings(nvcc, rb"NVCC_[A-Z_]+")
    assert {"NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"} <= found
    assert found <= keyed_env[("cuda", "compiled")]


@pytest.mark.parametrize("name", cuda.COMPILE_ENV)
def test_each_compiled_cuda_env_var_changes_the_compiled_key_only(cache, cuda_vadd, monkeypatch, name):
    mod, target = cuda_vadd
    monkeypatch.delenv(name, raising=False)
    compiled, source = cache.key_for(mod, target, compile_device=True), cache.key_for(mod, target, compile_device=False)
    monkeypatch.setenv(name, "1")
    assert cache.key_for(mod, target, compile_device=True) != compiled
    assert cache.key_for(mod, target, compile_device=False) == source


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not installed")
@pytest.mark.nvcc
def test_which_nvcc_is_found_is_a_key_part(cache, cuda_vadd, monkeypatch, tmp_path):
    mod, target = cuda_vadd
    monkeypatch.delenv("CUDA_PATH", raising=False)
    before = cache.key_for(mod, target, compile_device=True)
    other = tmp_path / "cuda" / "bin"
    other.mkdir(parents=True)
    (other / "nvcc").write_text(f'#!/bin/sh\nexec {shutil.which("nvcc")} "$@"\n')
    (other / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda"))
    via_cuda_path = cache.key_for(mod, target, compile_device=True)
    assert via_cuda_path.as_dict()["toolchain"].count(str(other / "nvcc")) == 1
    assert via_cuda_path != before
    monkeypatch.delenv("CUDA_PATH")
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{os.environ['PATH']}")
    assert cache.key_for(mod, target, compile_device=True) == via_cuda_path  # the same nvcc, found on PATH
    monkeypatch.undo()
    assert cache.key_for(mod, target, compile_device=True) == before


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not installed")
@pytest.mark.timeout(180)
@pytest.mark.nvcc
def test_keyed_nvcc_flags_change_the_binary_and_excluded_variables_do_not(cuda_vadd, monkeypatch):
    mod, target = cuda_vadd
    for name in (*cuda.COMPILE_ENV, "TVM_CUDA_COMPILE_MODE", "TVM_CUDA_NVRTC_EXTRA_OPTS"):
        monkeypatch.delenv(name, raising=False)
    base = cuda.compile_cuda_payload(mod, target)[0].code
    with monkeypatch.context() as mp:  # excluded: read only on the NVRTC path
        mp.setenv("TVM_CUDA_COMPILE_MODE", "nvrtc")
        mp.setenv("TVM_CUDA_NVRTC_EXTRA_OPTS", "-G")
        assert cuda.compile_cuda_payload(mod, target)[0].code == base
    with monkeypatch.context() as mp:  # keyed: nvcc reads it
        mp.setenv("NVCC_APPEND_FLAGS", "-lineinfo")
        assert cuda.compile_cuda_payload(mod, target)[0].code != base


# ---- PassContext ------------------------------------------------------------------------------

# Config keys TVM's Python reads on a codegen's path that are NOT key parts, and why.
EXCLUDED_CONFIGS = {
    "cuda.kernels_output_dir": "tvm.support.nvcc.compile_cuda writes its temporary .cu and binary there instead "
    "of a temp dir; the compiled bytes are the same",
}

CODEGENS = [("cuda", "vadd_gpu", CUDA_TARGET, False), ("llvm", "vadd", "llvm", True),
            ("c", "vadd", "c", False), ("opencl", "vadd_gpu", {"kind": "opencl"}, False)]


def _configs() -> list[tuple[str, object]]:
    """Every registered boolean config with both values, and the int ones with a non-default value."""
    out = []
    for name, info in sorted(tvm.transform.PassContext.list_configs().items()):
        kind = str(info)
        if '"bool"' in kind:
            out += [(name, True), (name, False)]
        elif '"int"' in kind:
            out.append((name, 7))
    return out


def _text(module, kind: str) -> str:
    return module.inspect_source("ll") if kind == "llvm" else module.inspect_source("")


def test_python_pass_config_reads_on_the_codegen_path_are_documented():
    found = set()
    for path in TVM_SOURCES:
        found |= set(re.findall(r"\.config\[\s*[\"']([\w.]+)[\"']", path.read_text("utf-8", "replace")))
    assert "cuda.kernels_output_dir" in found
    assert found <= set(EXCLUDED_CONFIGS)


@pytest.mark.timeout(300)
def test_pass_configs_change_no_codegen_output():
    # Every boolean config x 2 values, the int ones and 3 opt levels, x 4 codegens: ~3 s.
    configs = _configs()
    booleans = {name for name, value in configs if value is True}
    assert len(booleans) >= 20, sorted(booleans)
    changed = []
    for kind, kernel, target, compile_device in CODEGENS:
        mod, tgt = cc.prepare_for_codegen(getattr(kernels, kernel), target)
        entry = cc.resolve_device_codegen(tgt)
        base = _text(entry.invoke(mod, tgt, compile_device=compile_device), kind)
        for name, value in configs:
            with tvm.transform.PassContext(config={name: value}):
                text = _text(entry.invoke(mod, tgt, compile_device=compile_device), kind)
            if text != base:
                changed.append((kind, name, value))
        for level in (0, 1, 3):
            with tvm.transform.PassContext(opt_level=level):
                if _text(entry.invoke(mod, tgt, compile_device=compile_device), kind) != base:
                    changed.append((kind, "opt_level", level))
    assert not changed, f"these change a codegen's output, so the key must hold them: {changed}"


def test_the_key_doc_lists_every_codegens_toolchain_parts():
    text = (Path(__file__).resolve().parent.parent / "docs" / "key.md").read_text()
    section = text[text.index("## Key parts per codegen and mode"):text.index("## Callbacks")]
    documented = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in ("source", "compiled"):
            documented[(cells[0], cells[1])] = set(re.findall(r"`([^`]+)`", cells[2]))
    assert documented == _toolchain_parts()


OUTER_TARGETS = [{"kind": "llvm", "mcpu": "skylake-avx512"}, {"kind": "llvm", "mcpu": "znver3", "mattr": ["+avx2"]},
                 {"kind": "cuda", "arch": "sm_80"}, {"kind": "c"}]


def test_an_enclosing_target_scope_changes_no_codegen_output():
    # The key holds the target argument, not Target.current(): a `with target:` around lower()
    # must not reach the output (the compiled CUDA codegen enters the argument's scope itself).
    changed = []
    for kind, kernel, target, compile_device in CODEGENS:
        mod, tgt = cc.prepare_for_codegen(getattr(kernels, kernel), target)
        entry = cc.resolve_device_codegen(tgt)
        base = _text(entry.invoke(mod, tgt, compile_device=compile_device), kind)
        for outer in OUTER_TARGETS:
            with tvm.target.Target(outer):
                if _text(entry.invoke(mod, tgt, compile_device=compile_device), kind) != base:
                    changed.append((kind, outer))
    assert not changed, f"the enclosing Target changes these codegens' output: {changed}"
