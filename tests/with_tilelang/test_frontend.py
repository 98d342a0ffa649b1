"""tilelang.compile through the cache's frontend entry: a compiled function comes back unlowered, exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import NO_TILELANG, NO_TILELANG_MODULE, SM80

pytest.importorskip(NO_TILELANG_MODULE, reason=NO_TILELANG)

import tilelang  # noqa: E402

import codegen_cache as cc  # noqa: E402
import codegen_cache.tilelang as cct  # noqa: E402
from codegen_cache.tilelang import _frontend  # noqa: E402

from .tl_kernels import scale, vadd  # noqa: E402

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not hasattr(__import__("tilelang.cache", fromlist=["x"]), "_resolve_cache_dispatch")
                                 or tilelang.__version__ < "0.1.14", reason="the frontend entry needs tilelang >= 0.1.14")]

_CHILD = r"""
import json, sys
import tilelang
sys.path.insert(0, sys.argv[1])
import tl_kernels
import codegen_cache as cc, codegen_cache.tilelang as cct
cct.enable()
with cc.record_outcomes() as outcomes:
    kernel = tilelang.compile(tl_kernels.vadd(), target={"kind": "cuda", "arch": "sm_80"})
print(json.dumps({"source": kernel.get_kernel_source(), "tiers": [(o.codegen, o.tier) for o in outcomes]}))
"""


def _compile_in_a_new_process(tmp_path: Path) -> dict:
    import json

    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "codegen-cache"),
           "TILELANG_CACHE_DIR": str(tmp_path / "tilelang-cache-children")}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_new_process_gets_the_kernel_without_lowering_and_tilelang_stores_nothing(tmp_path):
    plain = tilelang.compile(vadd(), target=SM80).get_kernel_source()  # tilelang alone, its cache in tmp_path
    first = _compile_in_a_new_process(tmp_path)
    again = _compile_in_a_new_process(tmp_path)
    assert ("tilelang.compile", "codegen") in [tuple(t) for t in first["tiers"]]
    assert [tuple(t) for t in again["tiers"]] == [("tilelang.compile", "disk")]  # no device codegen either
    assert first["source"] == again["source"] == plain
    kernels = tmp_path / "tilelang-cache-children"
    stored_by_tilelang = [p for p in kernels.rglob("*.so")] if kernels.exists() else []
    assert stored_by_tilelang == [], "tilelang's own KernelCache stored a copy while ours was enabled"


def test_a_repeated_compile_is_the_same_kernel_object_after_an_exact_check(fresh_cache):
    cct.enable()
    with cc.use_cache(fresh_cache()), cc.record_outcomes() as outcomes:
        first = tilelang.compile(vadd(), target=SM80)
        second = tilelang.compile(vadd(), target=SM80)  # another PrimFunc object, structurally equal
        other = tilelang.compile(scale(), target=SM80)
    assert second is first and other is not first
    assert [o.tier for o in outcomes if o.codegen == "tilelang.compile"] == ["codegen", "memory", "codegen"]


def test_the_call_and_tilelang_settings_are_keyed(fresh_cache):
    cache = fresh_cache()
    call = {"target": SM80, "target_host": None, "execution_backend": None, "out_idx": None, "pass_configs": None,
            "compile_flags": None, "verbose": None}
    base = _frontend.frontend_key(cache, vadd(), call)
    assert _frontend.frontend_key(cache, vadd(), dict(call)) == base
    for change in ({"out_idx": [2]}, {"pass_configs": {"tl.enable_fast_math": True}}, {"compile_flags": ["-G"]},
                   {"target": {"kind": "cuda", "arch": "sm_90"}}):
        assert _frontend.frontend_key(cache, vadd(), {**call, **change}) != base, change
    assert _frontend.frontend_key(cache, scale(), call) != base
    assert _frontend.frontend_key(cache, vadd(), {**call, "target": "auto"}) is None  # depends on the GPU present
    assert _frontend.frontend_key(cache, vadd(), {**call, "target": "cuda"}) is None  # so does a CUDA target's arch
    assert _frontend.frontend_key(cache, vadd(), {**call, "target": {"kind": "cuda"}}) is None


def test_with_verify_a_disk_entry_of_another_function_is_not_served(fresh_cache, monkeypatch):
    cct.enable()
    cache = cc.CodegenCache(fresh_cache().directory, verify=True)
    with cc.use_cache(cache):
        vadd_source = tilelang.compile(vadd(), target=SM80).get_kernel_source()
    _frontend._memory.clear()  # noqa: SLF001 - as a new process
    # Make scale() collide with vadd(): same structural hash, so the same key.
    real = _frontend._compat.structural_hash  # noqa: SLF001
    vadd_hash = real(vadd())
    monkeypatch.setattr(_frontend._compat, "structural_hash", lambda f: vadd_hash)  # noqa: SLF001
    with cc.use_cache(cc.CodegenCache(cache.directory, verify=True)), cc.record_outcomes() as outcomes:
        kernel = tilelang.compile(scale(), target=SM80)
    assert [o.tier for o in outcomes if o.codegen == "tilelang.compile"] == ["codegen"]
    assert kernel.get_kernel_source() != vadd_source


def test_with_caching_off_tilelang_compiles_on_its_own(fresh_cache):
    cct.enable()
    with cc.use_cache(None), cc.record_outcomes() as outcomes:
        kernel = tilelang.compile(vadd(), target=SM80)
    assert outcomes == [] and kernel.get_kernel_source()


def test_clear_removes_the_frontend_entries(fresh_cache):
    cct.enable()
    cache = fresh_cache()
    with cc.use_cache(cache):
        tilelang.compile(vadd(), target=SM80)
    entries = list((cache.directory / "tilelang").glob("*.so"))
    assert len(entries) == 1
    (cache.directory / "tilelang" / "notes.so").write_text("not ours")  # not an entry name: kept
    assert cache.clear() >= 1
    assert sorted(p.name for p in (cache.directory / "tilelang").iterdir()) == ["notes.so"]


def test_the_cli_lists_verifies_and_prunes_a_real_frontend_entry(fresh_cache, capsys):
    import json

    from codegen_cache._cli import _main as _cli

    cct.enable()
    cache = fresh_cache()
    with cc.use_cache(cache):
        tilelang.compile(vadd(), target=SM80)
    root = str(cache.directory)
    assert _cli.main(["--dir", root, "ls", "--tilelang", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["codegen"] == "tilelang" and listed["functions"] == [str(vadd().attrs["global_symbol"])]
    assert listed["target"].startswith("cuda sm_80")
    assert _cli.main(["--dir", root, "verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] >= 1
    assert _cli.main(["--dir", root, "prune", "--tilelang", "--max-size", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == [listed["key"]]
    assert not list((cache.directory / "tilelang").glob("*.so"))


def test_the_frontend_store_is_bounded_by_the_compiled_size_limit(cache_dir):
    cct.enable()
    cache = cc.CodegenCache(cache_dir, compiled_size_limit=1)
    with cc.use_cache(cache):
        tilelang.compile(vadd(), target=SM80)
        (first,) = (cache.directory / "tilelang").glob("*.so")
        time.sleep(0.05)  # distinct file times
        tilelang.compile(scale(), target=SM80)
    # Each entry alone is over the limit: the newest is kept, the older culled.
    (entry,) = (cache.directory / "tilelang").glob("*.so")
    assert entry.name != first.name and entry.stat().st_size > 1


def test_kernel_parameters_read_as_plain_json_are_what_tilelangs_loader_gives(fresh_cache):
    from tilelang.engine.param import KernelParam, dump_kernel_params, load_kernel_params

    cct.enable()
    cache = fresh_cache()
    with cc.use_cache(cache):
        kernel = tilelang.compile(vadd(n=512), target=SM80)
    static = _frontend._static_params(kernel.params)
    assert static == [["float32", [512]]] * 3
    meta = {"params": dump_kernel_params(kernel.params), "static_params": static}
    fast, tilelangs = _frontend._kernel_params(meta), load_kernel_params(meta["params"])
    assert [(str(p.dtype), p.shape) for p in fast] == [(str(p.dtype), p.shape) for p in tilelangs]
    assert all(type(p) is KernelParam and type(p.dtype) is type(q.dtype) for p, q in zip(fast, tilelangs))
    # A symbolic dimension has no plain form: tilelang's own JSON is read, the Var kept.
    n = tilelang.tvm.tirx.Var("n", "int32")
    symbolic = [KernelParam(tilelang.tvm.DataType("float16"), [n, 4])]
    assert _frontend._static_params(symbolic) is None
    loaded = _frontend._kernel_params({"params": dump_kernel_params(symbolic), "static_params": None})
    assert str(loaded[0].dtype) == "float16" and loaded[0].shape[1] == 4 and str(loaded[0].shape[0]) == "n"
    # A damaged plain form is not trusted: tilelang's JSON is read instead.
    assert _frontend._kernel_params({"params": meta["params"], "static_params": [["float32", ["512"]]]})[0].shape \
        == [512]


def test_the_tilelang_version_check_reads_the_argument_names():
    import functools

    import tilelang.cache

    def old(target, execution_backend, verbose):  # tilelang < 0.1.14
        return target

    def new(target, target_host, execution_backend, verbose):
        return target

    assert _frontend._takes_target_host(tilelang.cache._resolve_cache_dispatch)
    assert _frontend._takes_target_host(new) and not _frontend._takes_target_host(old)
    assert _frontend._takes_target_host(functools.partial(new)) and not _frontend._takes_target_host(
        functools.partial(old))  # no code object: inspect.signature decides
