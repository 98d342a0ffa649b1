"""tilelang's device codegen through the cache: exact hits for every module kind, complete keys."""

from __future__ import annotations

import json

import pytest

from .conftest import NO_TILELANG, NO_TILELANG_MODULE, SM80

pytest.importorskip(NO_TILELANG_MODULE, reason=NO_TILELANG)

import codegen_cache as cc  # noqa: E402
import codegen_cache.tilelang as cct  # noqa: E402
from codegen_cache._artifacts import _cuda, unframe  # noqa: E402
from codegen_cache._compat import tvm  # noqa: E402
from codegen_cache.codegens.cuda import nvcc_version as nvcc_build_id  # noqa: E402

from .tl_kernels import vadd  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def _lower(func, *, compile_device, config=None, target=SM80):
    """tilelang's own lowering (tilelang.engine.lower.lower) with host codegen: (artifact, device module)."""
    from tilelang.engine.lower import lower

    target = tvm.target.Target(target)
    with tvm.transform.PassContext(opt_level=3, config=config or {}), target:
        artifact = lower(func, target=target, enable_host_codegen=True, enable_device_compile=compile_device)
    (device,) = artifact.rt_mod.imports
    return artifact, device


def _sources(module):
    return {fmt: module.inspect_source(fmt) for fmt in ("", "cuda", "cu", "ptx")}


@pytest.mark.parametrize("compile_device", [False, True], ids=["source-only", "compiled"])
def test_a_disk_hit_is_the_module_tilelang_made(compile_device, fresh_cache):
    plain, plain_device = _lower(vadd(), compile_device=compile_device)
    cct.enable()
    with cc.use_cache(fresh_cache()):
        _lower(vadd(), compile_device=compile_device)
        assert cc.last_outcome().tier == "codegen"
    with cc.use_cache(fresh_cache()):  # a new cache object: the disk tier, as in a new process
        hit, hit_device = _lower(vadd(), compile_device=compile_device)
        outcome = cc.last_outcome()
    assert outcome.tier == "disk" and outcome.codegen == "tilelang.cuda"
    assert hit.kernel_source == plain.kernel_source and len(plain.kernel_source) > 100
    assert hit_device.kind == plain_device.kind == "cuda"
    assert _sources(hit_device) == _sources(plain_device)
    got, want = _cuda.module_payload(hit_device), _cuda.module_payload(plain_device)
    assert (got.fmt, got.fmap, got.code) == (want.fmt, want.fmap, want.code)
    if compile_device:
        assert want.fmt in ("cubin", "fatbin") and len(want.code) > 1000
    else:
        assert _cuda.is_placeholder(want)  # the source-only module: never stored as a binary


def test_the_placeholder_module_is_stored_as_a_cuda_module_with_its_source(fresh_cache):
    cct.enable()
    cache = fresh_cache()
    with cc.use_cache(cache):
        artifact, _ = _lower(vadd(), compile_device=False)
        key = cc.last_outcome().key
    cache.flush()
    art = unframe(cache.store("source").get(key))
    assert art.codec == "cuda-module"
    fmt, _fmap, data, sources = art.fields
    assert (fmt, data) == (b"ptx", b"ptx")
    assert json.loads(sources)["cuda"] == artifact.kernel_source


@pytest.mark.parametrize("config", [{"tl.device_compile_flags": ["-G"]}, {"tl.enable_fast_math": True},
                                    {"tl.ptxas_register_usage_level": 5}], ids=["-G", "fast-math", "ptxas-level"])
def test_a_compile_option_is_never_served_the_binary_made_without_it(config, fresh_cache):
    cct.enable()
    with cc.use_cache(fresh_cache()):
        _, plain = _lower(vadd(), compile_device=True)
    with cc.use_cache(fresh_cache()):
        _, flagged = _lower(vadd(), compile_device=True, config=config)
        assert cc.last_outcome().tier == "codegen"
    if "tl.device_compile_flags" in config:  # -G: device debug code, a different binary
        assert _cuda.module_payload(flagged).code != _cuda.module_payload(plain).code
    with cc.use_cache(fresh_cache()):
        _, again = _lower(vadd(), compile_device=True, config=config)
        assert cc.last_outcome().tier == "disk"
    assert _cuda.module_payload(again).code == _cuda.module_payload(flagged).code


def test_tilelang_env_vars_change_the_key_and_excluded_ones_do_not(fresh_cache, monkeypatch):
    cct.enable()
    with cc.use_cache(fresh_cache()):
        _lower(vadd(), compile_device=False)
        first = cc.last_outcome().key
        monkeypatch.setenv("TILELANG_CACHE_DIR", "/elsewhere")  # excluded: tilelang's own cache
        _lower(vadd(), compile_device=False)
        assert cc.last_outcome().key == first
        monkeypatch.setenv("TL_SOME_NEW_SWITCH", "1")  # an unknown TL_ variable is keyed
        _lower(vadd(), compile_device=False)
        assert cc.last_outcome().key != first


@pytest.mark.nvcc
def test_the_compiled_key_names_tilelang_headers_and_nvcc(fresh_cache):
    cct.enable()
    cache = fresh_cache()
    mod_key = None
    with cc.use_cache(cache):
        _lower(vadd(), compile_device=True)
        mod_key = cc.last_outcome().key
    import tilelang

    from codegen_cache.tilelang import _salts

    parts = _salts.compile_salts(cache.directory)
    assert len(parts["headers"]) == 32
    assert parts["nvcc"].endswith("/bin/nvcc " + nvcc_build_id()) or parts["nvcc"] == "none"
    assert _salts.tilelang_version() == tilelang.__version__
    assert mod_key
    # The headers digest is memoized in the cache directory under the installation's stamp.
    memo = json.loads((cache.directory / "tilelang-stamps.json").read_text())
    assert list(memo["headers"].values()) == [parts["headers"]]


def test_disable_gives_tilelang_its_own_path_back(fresh_cache):
    cct.enable()
    assert cct.is_enabled()
    cct.disable()
    assert not cct.is_enabled()
    with cc.use_cache(fresh_cache()), cc.record_outcomes() as outcomes:
        _lower(vadd(), compile_device=False)
    assert outcomes == []  # tilelang's codegen ran without passing through the cache
