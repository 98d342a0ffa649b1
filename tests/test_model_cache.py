"""tvm.compile of Relax models through the cache: the model-level key, warm compiles that run no pipeline.

Models are written with tvm.relax.frontend.nn (tests/relax_models.py), compiled cold and warm,
in this process and in fresh ones, and run on the Relax VM; outputs are compared with numpy.
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
import tvm
from tvm import relax

import codegen_cache as cc
import relax_models
from codegen_cache import _compat
from codegen_cache._build._relax import MODEL_CODEC, model_key
from codegen_cache._key import CacheKey
from processes import python_json

SEQ, WIDTH = 8, 64


def _decoder():
    return relax_models.llama(layers=1, seq=SEQ, width=WIDTH, hidden=128, heads=2)


def _run_decoder(executable, named):
    x = relax_models.inputs((1, SEQ, WIDTH))
    return relax_models.run(executable, "forward", x, *relax_models.parameters(named))


def _model_outcomes(outcomes):
    return [o.tier for o in outcomes if o.codegen == "relax.build"]


def test_a_model_compiled_again_in_the_process_is_one_memory_hit(enabled):
    mod, named = _decoder()
    with cc.record_outcomes() as outcomes:
        cold = tvm.compile(mod, "llvm")
        warm = tvm.compile(mod, "llvm")
    assert _model_outcomes(outcomes) == ["codegen", "memory"]
    assert warm is not cold and warm.mod.kind == "relax.VMExecutable"
    np.testing.assert_allclose(_run_decoder(warm, named), _run_decoder(cold, named), rtol=1e-6)


def test_an_equal_but_distinct_module_is_served_and_a_changed_one_is_not(enabled):
    mod, named = _decoder()
    tvm.compile(mod, "llvm")
    other, _ = _decoder()  # built again: another object, structurally equal
    with cc.record_outcomes() as outcomes:
        tvm.compile(other, "llvm")
        tvm.compile(relax_models.llama(layers=1, seq=SEQ, width=WIDTH, hidden=64, heads=2)[0], "llvm")
    assert _model_outcomes(outcomes) == ["memory", "codegen"]


WARM_SCRIPT = """
    import json, sys
    import numpy as np
    import tvm
    import codegen_cache as cc
    import relax_models

    # Watched, not replaced: a function assigned over one of TVM's is TVM state the key holds.
    pipelines = {{f.__code__ for f in (tvm.relax.get_pipeline, tvm.relax.get_default_pipeline,
                                     tvm.tirx.get_tir_pipeline, tvm.tirx.get_default_tir_pipeline)}}
    ran = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in pipelines:
            ran.append(frame.f_code.co_name)

    mod, named = relax_models.llama(layers=1, seq={seq}, width={width}, hidden=128, heads=2)
    cc.enable(cc.CodegenCache(sys.argv[2]), children=False)
    if sys.argv[1] == "warm":  # every pipeline TVM's compile would run is watched
        sys.setprofile(watch)
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, sys.argv[3])
    sys.setprofile(None)
    if ran:
        raise AssertionError(f"a pipeline ran: {{ran}}")
    out = relax_models.run(executable, "forward", relax_models.inputs((1, {seq}, {width})),
                           *relax_models.parameters(named)) if sys.argv[3] == "llvm" else None
    imports = [m.kind for m in executable.mod.imports[0].imports]
    source = executable.mod.imports[0].imports[0].inspect_source() if imports else ""
    print(json.dumps({{"tiers": [(o.codegen, o.tier) for o in outcomes], "imports": imports, "source": source,
                      "out": out.ravel()[:64].tolist() if out is not None else None}}))
""".format(seq=SEQ, width=WIDTH)


@pytest.mark.parametrize("target", ["llvm", "cuda"])
@pytest.mark.slow
def test_a_warm_compile_in_a_fresh_process_runs_no_pipeline_and_no_codegen(tmp_path, target):
    spec = "llvm" if target == "llvm" else '{"kind": "cuda", "arch": "sm_90"}'
    cold = python_json(WARM_SCRIPT, "cold", str(tmp_path / "cache"), spec)
    warm = python_json(WARM_SCRIPT, "warm", str(tmp_path / "cache"), spec)
    assert ["codegen"] == [tier for codegen, tier in cold["tiers"] if codegen == "relax.build"]
    assert warm["tiers"] == [["relax.build", "disk"]]  # nothing else: no lowering, no codegen
    assert warm["source"] == cold["source"]
    if target == "cuda":
        # Source-only CUDA (no driver here): the hit is TVM's own source-only module again (docs/cache.md).
        assert cold["imports"] == warm["imports"] == ["cuda"] and "__global__" in warm["source"]
    else:
        assert warm["imports"] == cold["imports"]
        np.testing.assert_array_equal(warm["out"], cold["out"])


COMPILE_AND_KILL = """
import os, signal, sys
import tvm
import codegen_cache as cc
import relax_models

mod, _named = relax_models.llama(layers=1, seq={seq}, width={width}, hidden=128, heads=2)
cc.enable(cc.CodegenCache(sys.argv[1]), children=False)
tvm.compile(mod, "llvm")
print("compiled", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the writer never ran: the entries are only staged
""".format(seq=SEQ, width=WIDTH)


@pytest.mark.slow
def test_a_compiled_model_survives_its_process_killed_right_after_tvm_compile_returned(tmp_path):
    from processes import python

    done = python(COMPILE_AND_KILL, str(tmp_path / "cache"), check=False)
    assert "compiled" in done.stdout and done.returncode == -9, done.stderr[-3000:]
    mod, named = _decoder()
    cache = cc.CodegenCache(tmp_path / "cache")
    cc.enable(cache, children=False)
    try:
        with cc.record_outcomes() as outcomes:
            executable = tvm.compile(mod, "llvm")
    finally:
        cc.disable()
    assert _model_outcomes(outcomes) == ["disk"]
    np.testing.assert_allclose(_run_decoder(executable, named),
                               _run_decoder(tvm.relax.build(mod, "llvm"), named), rtol=1e-6)  # TVM alone
    cache.close()


def _key(mod, target="llvm", params=None, relax_pipeline="default", tir_pipeline="default", registry=None):
    target = tvm.target.Target(target) if isinstance(target, str) else target
    return model_key(mod, target, params, relax_pipeline, tir_pipeline, "bytecode", None, registry or cc.default_registry)


@pytest.mark.parametrize("where", [0, 511, 1023])
def test_two_models_that_differ_in_one_weight_never_share_a_key(where):
    weights = np.linspace(-1, 1, 1024, dtype="float32").reshape(32, 32)
    changed = weights.copy()
    changed.flat[where] += np.float32(2.0 ** -20)  # one ulp-scale change in one element
    first, second = relax_models.with_constant(weights), relax_models.with_constant(changed)
    assert _key(first).digest != _key(second).digest
    assert _key(first).digest == _key(relax_models.with_constant(weights.copy())).digest


def test_a_constant_of_another_dtype_or_shape_with_the_same_bytes_has_another_key():
    values = np.arange(16, dtype="float32")
    as_int = values.view("int32")
    assert _key(relax_models.with_constant(values)).digest != _key(relax_models.with_constant(as_int)).digest
    assert _key(relax_models.with_constant(values)).digest != \
        _key(relax_models.with_constant(values.reshape(4, 4))).digest


def test_models_differing_in_one_weight_each_run_their_own_weights_warm(enabled, tmp_path):
    weights = np.arange(8, dtype="float32")
    changed = weights.copy()
    changed[5] = 50
    x = np.ones(8, "float32")
    for values in (weights, changed, weights):
        executable = tvm.compile(relax_models.with_constant(values), "llvm")
        np.testing.assert_array_equal(relax_models.run(executable, "main", x), values + 1)
    fresh = cc.CodegenCache(enabled.directory)  # a new process's view: disk hits only
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        for values in (changed, weights):
            executable = tvm.compile(relax_models.with_constant(values), "llvm")
            np.testing.assert_array_equal(relax_models.run(executable, "main", x), values + 1)
    assert _model_outcomes(outcomes) == ["disk", "disk"]


def test_every_input_of_the_compile_is_in_the_model_key():
    mod, _ = relax_models.mlp()
    base = _key(mod).digest
    params = {"w": [tvm.runtime.tensor(np.ones(3, "float32"))]}
    other_params = {"w": [tvm.runtime.tensor(np.full(3, 2, "float32"))]}
    assert tvm.transform.PassContext.current().opt_level != 3
    with tvm.transform.PassContext(opt_level=3):
        at_opt3 = _key(mod).digest
    with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
        no_asserts = _key(mod).digest
    variants = [
        _key(mod, target=tvm.target.Target({"kind": "llvm", "mcpu": "skylake"})).digest,
        _key(mod, params=params).digest,
        _key(mod, params=other_params).digest,
        _key(mod, relax_pipeline="zero").digest,
        _key(mod, tir_pipeline=None).digest,
        at_opt3,
        no_asserts,
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert _key(mod).digest == base  # and the same inputs give the same key
    # The digest is the hash of every part it names (the tail's encoding is memoized).
    for key in (_key(mod), _key(mod, params=params), _key(relax_models.llama(layers=1)[0])):
        assert key.digest == CacheKey.from_parts(key.parts).digest


def test_the_default_host_is_in_the_key_only_where_tvm_builds_with_it():
    """tvm.tirx.build takes llvm (else c) as host for a device target without one; a CPU target is its own host."""
    mod, _ = relax_models.mlp()

    def rows(key):
        return sorted((json.loads(row["target"])["kind"], json.loads(row["target"]).get("mcpu", ""), row["mode"])
                      for row in json.loads(key.as_dict()["codegens"]))

    skylake = {"kind": "llvm", "mcpu": "skylake"}
    _compat.runtime_enabled.cache_clear()
    assert rows(_key(mod, target=tvm.target.Target(skylake))) == [("llvm", "skylake", "compiled")]
    # Keying a CPU model asks TVM nothing whose answer makes an LLVM target machine.
    assert _compat.runtime_enabled.cache_info().currsize == 0
    cuda = {"kind": "cuda", "arch": "sm_90"}
    device = ("cuda", "", "compiled" if _compat.runtime_enabled("cuda") else "source")
    host = ("llvm", "", "compiled") if _compat.runtime_enabled("llvm") else ("c", "", "source")
    assert rows(_key(mod, target=tvm.target.Target(cuda))) == sorted([device, host])
    assert rows(_key(mod, target=tvm.target.Target(cuda, host=skylake))) == [device, ("llvm", "skylake", "compiled")]


def test_inputs_the_key_cannot_hold_compile_as_tvms_own(enabled):
    mod, named = relax_models.mlp()
    as_pass = relax.get_pipeline("default")
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm", relax_pipeline=as_pass)
    assert _model_outcomes(outcomes) == []  # no model key: TVM's relax.build ran
    assert [o.codegen for o in outcomes if o.tier == "codegen"] == ["llvm", "build"]  # its codegen was cached
    assert _key(mod, relax_pipeline=as_pass) is None
    with tvm.transform.PassContext(instruments=[tvm.ir.instrument.PassTimingInstrument()]):
        assert _key(mod) is None
    x = relax_models.inputs((4, 16))
    expected = relax_models.run(tvm.relax.build.__wrapped__(mod, "llvm"), "forward", x,
                                *relax_models.parameters(named))
    np.testing.assert_allclose(relax_models.run(executable, "forward", x, *relax_models.parameters(named)),
                               expected, rtol=1e-6)


def test_a_damaged_model_entry_is_dropped_and_the_model_compiled_again(enabled):
    mod, named = _decoder()
    tvm.compile(mod, "llvm")
    store = enabled.store("compiled")
    (digest,) = [k for k in store.keys() if b"relax-executable" in (store.get(k) or b"")[-64:]]
    blob = bytearray(store.get(digest))
    blob[10] ^= 0xFF
    store.put(digest, bytes(blob))
    fresh = cc.CodegenCache(enabled.directory, write_behind=False)
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm")
    assert _model_outcomes(outcomes) == ["codegen"]
    assert MODEL_CODEC.encode() in store.get(digest)[-64:]
    assert _run_decoder(executable, named).shape == (1, SEQ, WIDTH)


def test_a_warm_model_reads_its_entries_through_key_files_opening_no_sqlite_store(enabled, monkeypatch):
    """The model's entry and its library's are read through their key files: a fresh process's warm compile
    opens no SQLite store (its first would be most of the compile's storage work)."""
    mod, named = _decoder()
    expected = _run_decoder(tvm.compile(mod, "llvm"), named)
    enabled.flush()
    opened, connect = [], sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda path, *a, **k: opened.append(str(path)) or connect(path, *a, **k))
    fresh = cc.CodegenCache(enabled.directory, write_behind=False)
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm")
    assert _model_outcomes(outcomes) == ["disk"]
    assert [path for path in opened if "/cache.db" in path] == []
    np.testing.assert_array_equal(_run_decoder(executable, named), expected)


def test_a_model_whose_library_entries_were_evicted_compiles_again(enabled):
    mod, named = _decoder()
    expected = _run_decoder(tvm.compile(mod, "llvm"), named)
    # The llvm upgrader too: one that read the library before the deletes below could put its
    # linked form back after them (a correct entry, but not the eviction this test makes).
    assert enabled.flush(upgrades=True, timeout=120)
    store = enabled.store("compiled")
    evicted = [k for k in store.keys() if b"relax-executable" not in (store.get(k) or b"")[-64:]]
    assert len(evicted) == len(store) - 1  # the library's entries go; the model's entry stays
    for digest in evicted:
        store.delete(digest)
    fresh = cc.CodegenCache(enabled.directory, write_behind=False)
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm")
    assert _model_outcomes(outcomes) == ["codegen"]
    np.testing.assert_array_equal(_run_decoder(executable, named), expected)


@pytest.mark.slow
def test_a_model_with_a_symbolic_sequence_length_hits_in_a_fresh_process(tmp_path):
    script = """
        import json, sys
        import numpy as np
        import tvm
        from tvm.relax.frontend import nn
        import codegen_cache as cc
        import relax_models

        model = relax_models.MLP()
        mod, named = model.export_tvm({"forward": {"x": nn.spec.Tensor(("n", 16), "float32")}})
        cc.enable(cc.CodegenCache(sys.argv[1]), children=False)
        with cc.record_outcomes() as outcomes:
            executable = tvm.compile(mod, "llvm")
        out = relax_models.run(executable, "forward", relax_models.inputs((5, 16)), *relax_models.parameters(named))
        print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                          "out": out.ravel().tolist()}))
    """
    runs = [python_json(script, str(tmp_path / "cache")) for _ in range(3)]
    assert [run["tiers"] for run in runs] == [["codegen"], ["disk"], ["disk"]]
    assert runs[0]["out"] == runs[1]["out"] == runs[2]["out"]


def test_the_codegens_of_a_modules_virtual_devices_are_in_its_key():
    from tvm.script import ir as I

    mod, _ = relax_models.mlp()
    mod = tvm.IRModule(mod.functions, attrs=mod.attrs,
                       global_infos={"vdevice": [I.vdevice({"kind": "cuda", "arch": "sm_80"}, 0)]})

    def registry(salt: str) -> cc.DeviceCodegenRegistry:
        found = cc.DeviceCodegenRegistry()
        source = cc.global_func_device_codegen("target.build.cuda")
        found.register("cuda", cc.DeviceCodegen("cuda", build_without_compile=source, salt=salt))
        found.register("llvm", cc.resolve_device_codegen("llvm"))
        return found

    first, second = (_key(mod, target=None, registry=registry(salt)) for salt in ("one", "two"))
    assert first is not None and first.digest != second.digest  # no target given: the vdevice's codegen counts


@pytest.mark.slow
def test_verify_knows_a_compiled_model_and_fix_keeps_it(enabled):
    # `codegen-cache verify --fix` removes what it cannot read: a model entry must not be one of them.
    import subprocess
    import sys

    mod, named = _decoder()
    cold = tvm.compile(mod, "llvm")
    done = subprocess.run([sys.executable, "-m", "codegen_cache", "--dir", str(enabled.directory), "verify", "--fix"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 bad" in done.stdout and "unknown codec" not in done.stdout, done.stdout
    again = cc.CodegenCache(enabled.directory, write_behind=False)
    cc.enable(again, children=False)
    try:
        with cc.record_outcomes() as outcomes:
            warm = tvm.compile(mod, "llvm")
        assert _model_outcomes(outcomes) == ["disk"]
        np.testing.assert_allclose(_run_decoder(warm, named), _run_decoder(cold, named), rtol=1e-6)
    finally:
        again.close()
