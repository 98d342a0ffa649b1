"""The model key sees what a Relax compile reads besides its input, or the model cache steps aside.

What the pipeline reads and TVM users register from Python: an FLegalize over TVM's
(register_op_attr), a pipeline registered by name, a global function a pass calls, the tuning
database in context. A compile after one of them changed gets an executable compiled with the
change (its numbers, numpy), never the one compiled before; an unchanged compile keeps hitting,
also in fresh processes that register such functions and with verify=True.
"""

from __future__ import annotations

import inspect
import logging
import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import codegen_cache as cc
import model_reads
import relax_models
from codegen_cache import _compat
from codegen_cache._build import _reads
from processes import python_json


def _compile(mod=None, **kwargs):
    """(executable, the model-level outcome's tier or None where the model cache stepped aside)."""
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(model_reads.model() if mod is None else mod, "llvm", **kwargs)
    tiers = [o.tier for o in outcomes if o.codegen == "relax.build"]
    return executable, (tiers[0] if tiers else None)


@pytest.fixture
def stock_legalization():
    """TVM's FLegalize of relax.add (a Function), put back after the test."""
    original = tvm.ir.Op.get("relax.add").get_attr("FLegalize")
    yield original
    model_reads.restore_legalization("relax.add", original)


def test_an_flegalize_registered_over_tvms_gives_its_own_executable_and_tvms_comes_back(enabled, stock_legalization):
    stock, _ = _compile()
    tvm.ir.register_op_attr("relax.add", "FLegalize", model_reads.subtract, level=11)
    subtracted, tier = _compile()
    assert tier == "codegen"
    np.testing.assert_allclose(model_reads.run(subtracted), model_reads.EXPECTED["subtract"], rtol=1e-6)
    tvm.ir.register_op_attr("relax.add", "FLegalize", model_reads.multiply, level=12)
    multiplied, tier = _compile()
    assert tier == "codegen"
    np.testing.assert_allclose(model_reads.run(multiplied), model_reads.EXPECTED["multiply"], rtol=1e-6)
    model_reads.restore_legalization("relax.add", stock_legalization)
    again, tier = _compile()
    assert tier == "memory"  # TVM's own legalization again: the first executable's key
    np.testing.assert_allclose(model_reads.run(again), model_reads.EXPECTED["stock"], rtol=1e-6)
    np.testing.assert_allclose(model_reads.run(stock), model_reads.EXPECTED["stock"], rtol=1e-6)


def test_a_legalization_tvms_helper_makes_from_a_users_function_runs_that_function(enabled, stock_legalization):
    # TVM's own helper returns a closure of TVM's code; what it calls is the user's function.
    from tvm import topi
    from tvm.relax.transform.legalize_ops.common import _call_topi_without_attr

    stock, _ = _compile()
    scope: dict = {"topi": topi}
    exec("def add_as(a, b):\n    return topi.subtract(a, b)\n", scope)
    tvm.ir.register_op_attr("relax.add", "FLegalize", _call_topi_without_attr(scope["add_as"], "add"), level=11)
    subtracted, tier = _compile()
    assert tier == "codegen"
    np.testing.assert_allclose(model_reads.run(subtracted), model_reads.EXPECTED["subtract"], rtol=1e-6)
    exec("def add_as(a, b):\n    return topi.multiply(a, b)\n", scope)  # the cell run again, edited
    tvm.ir.register_op_attr("relax.add", "FLegalize", _call_topi_without_attr(scope["add_as"], "add"), level=12)
    multiplied, tier = _compile()
    assert tier == "codegen"
    np.testing.assert_allclose(model_reads.run(multiplied), model_reads.EXPECTED["multiply"], rtol=1e-6)


def test_a_pipeline_registered_by_name_is_keyed_by_its_body_not_its_name(enabled):
    name = "cgc_test_reads_pipeline"
    try:
        model_reads.register_pipeline(name, model_reads.legalizing_pipeline(model_reads.subtract))
        first, tier = _compile(relax_pipeline=name)
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(first), model_reads.EXPECTED["subtract"], rtol=1e-6)
        model_reads.register_pipeline(name, model_reads.legalizing_pipeline(model_reads.multiply))
        second, tier = _compile(relax_pipeline=name)
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(second), model_reads.EXPECTED["multiply"], rtol=1e-6)
        model_reads.register_pipeline(name, model_reads.legalizing_pipeline(model_reads.subtract))
        assert _compile(relax_pipeline=name)[1] == "memory"  # the same body again: the first key
    finally:
        relax.pipeline.PIPELINE_MAP.pop(name, None)


def test_a_global_function_a_pass_calls_is_keyed_by_its_code(enabled):
    name, global_name = "cgc_test_reads_calls_global", "cgc_test_reads.legalize_add"
    try:
        model_reads.register_pipeline(name, model_reads.calling_global(global_name))
        tvm.register_global_func(global_name, model_reads.subtract, override=True)
        first, tier = _compile(relax_pipeline=name)
        np.testing.assert_allclose(model_reads.run(first), model_reads.EXPECTED["subtract"], rtol=1e-6)
        tvm_ffi.register_global_func(global_name, model_reads.multiply, override=True)  # another alias
        second, tier = _compile(relax_pipeline=name)
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(second), model_reads.EXPECTED["multiply"], rtol=1e-6)
    finally:
        relax.pipeline.PIPELINE_MAP.pop(name, None)
        tvm_ffi.remove_global_func(global_name)


def test_the_tuning_database_in_context_is_keyed_by_its_records(enabled):
    name = "cgc_test_reads_tuned"
    mod, _named = relax_models.mlp()
    database = model_reads.tuned_database()
    try:
        model_reads.register_pipeline(name, model_reads.tuned_pipeline)
        with cc.record_outcomes() as outcomes:
            untuned = tvm.compile(mod, model_reads.LLVM, relax_pipeline=name)
            with database:
                tuned = tvm.compile(mod, model_reads.LLVM, relax_pipeline=name)
            again = tvm.compile(mod, model_reads.LLVM, relax_pipeline=name)
    finally:
        relax.pipeline.PIPELINE_MAP.pop(name, None)
    assert [o.tier for o in outcomes if o.codegen == "relax.build"] == ["codegen", "codegen", "memory"]
    assert model_reads.parallel_launches(untuned) == model_reads.parallel_launches(again) == 0
    assert model_reads.parallel_launches(tuned) > 0  # the database's schedules, not the untuned executable


def test_a_redefined_helper_of_a_registered_function_changes_the_key(enabled):
    scope: dict = {}
    exec("def helper():\n    return 1\ndef f(x):\n    return helper() + x\n", scope)
    tvm.register_global_func("cgc_test_reads.uses_helper", scope["f"], override=True)
    try:
        before = _reads.registered_part(frozenset({"llvm"}))
        exec("def helper():\n    return 2\n", scope)  # a notebook cell run again
        assert _reads.registered_part(frozenset({"llvm"})) != before
        assert _reads.registered_part(frozenset({"llvm"})) == _reads.registered_part(frozenset({"llvm"}))
    finally:
        tvm_ffi.remove_global_func("cgc_test_reads.uses_helper")


@pytest.mark.parametrize("make", [lambda v: tvm.tirx.IntImm("int32", v), lambda v: tvm.runtime.convert([1, v])],
                         ids=["IntImm", "Array"])
def test_a_tvm_object_a_registered_closure_holds_is_keyed_by_its_structure(enabled, make):
    def holding(value):
        return lambda x: (value, x)

    def registered_with(value):
        tvm.register_global_func(name, holding(value), override=True)
        return _reads.registered_part(frozenset({"llvm"}))

    name = "cgc_test_reads.holds_ir"
    try:
        first = registered_with(make(3))
        assert registered_with(make(4)) not in ("", first)
        assert registered_with(make(3)) == first  # an equal object, another instance
    finally:
        tvm_ffi.remove_global_func(name)


def test_a_lowering_rule_is_keyed_for_the_target_kinds_that_read_it(enabled):
    op = tvm.ir.Op.get("tirx.exp")
    original = op.get_attr("llvm.FLowerIntrinsic")
    llvm, cuda = frozenset({"llvm"}), frozenset({"cuda"})
    before = (_reads.registered_part(llvm), _reads.registered_part(cuda))

    def exp_rule(call):
        return call

    try:
        tvm.ir.register_op_attr("tirx.exp", "llvm.FLowerIntrinsic", exp_rule, level=99)
        assert _reads.registered_part(llvm) != before[0]
        assert _reads.registered_part(cuda) == before[1]  # a cuda compile does not read llvm's rules
    finally:
        op.reset_attr("llvm.FLowerIntrinsic")
        if original is not None:
            op.set_attr("llvm.FLowerIntrinsic", original, 10)
    assert _reads.registered_part(llvm) == before[0]


def test_importing_more_of_tvm_does_not_change_the_key(enabled):
    before = _reads.registered_part(frozenset({"llvm"}))
    import tvm.relax.frontend.nn.llm  # noqa: F401  registers TVM's own functions and op attributes
    import tvm.contrib.cblas  # noqa: F401
    assert _reads.registered_part(frozenset({"llvm"})) == before


def test_enabled_as_tvm_is_imported_the_key_is_the_one_a_scan_finds(tmp_path, monkeypatch):
    # CODEGEN_CACHE_ENABLE enables as `import tvm` completes, so nothing is scanned then; the key
    # must still be the one an explicit enable() (which scans) computes, or the two kinds of
    # process sharing a directory would never hit each other's models.
    monkeypatch.setenv("CODEGEN_CACHE_ENABLE", "1")
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "cache"))
    assert cc._switch.enable_from_environment()
    try:
        at_import = _reads.registered_part(frozenset({"llvm"}))
    finally:
        cc.disable()
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    try:
        assert _reads.registered_part(frozenset({"llvm"})) == at_import
    finally:
        cc.disable()
        cache.close()


class _Opaque:
    pass


def test_an_unidentifiable_registration_skips_the_model_cache_once_warned_and_a_salt_brings_it_back(
        enabled, caplog):
    opaque = _Opaque()

    def reads_an_object(x):
        return x if opaque else x

    tvm.register_global_func("cgc_test_reads.opaque", reads_an_object, override=True)
    try:
        with caplog.at_level(logging.WARNING, logger="codegen_cache"):
            first, tier = _compile()
            second, second_tier = _compile()
        assert tier is None and second_tier is None  # relax.build ran as TVM's own, twice
        np.testing.assert_allclose(model_reads.run(second), model_reads.EXPECTED["stock"], rtol=1e-6)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "cgc_test_reads.opaque" in warnings[0] and "declare_salt" in warnings[0]
        cc.declare_salt(reads_an_object, "v1")
        assert _compile()[1] == "codegen" and _compile()[1] == "memory"
    finally:
        tvm_ffi.remove_global_func("cgc_test_reads.opaque")


@pytest.mark.parametrize("func, salt, error, match", [
    ("not callable", "v1", TypeError, "expects a callable.*'not callable'"),
    (print, 1, TypeError, "salt must be a str or bytes, got 1 of type int"),
    (print, None, TypeError, "salt must be a str or bytes, got None"),
    (print, "", ValueError, "must not be empty"),
])
def test_declare_salt_refuses_bad_input_naming_it(func, salt, error, match):
    with pytest.raises(error, match=match):
        cc.declare_salt(func, salt)


@pytest.mark.parametrize("salt", [1, None, ["v1"]])
def test_declare_callback_salt_refuses_a_salt_that_is_no_str_or_bytes(salt):
    with pytest.raises(TypeError, match=f"salt must be a str or bytes, got {re.escape(repr(salt))}"):
        cc.declare_callback_salt("tvm_callback_cuda_postproc", salt)


def test_declare_salt_takes_bytes_and_a_tvm_ffi_function():
    def legalize(bb, call):
        return call

    cc.declare_salt(legalize, b"v1")
    cc.declare_salt(tvm_ffi.convert(legalize), "v2")
    with pytest.raises(TypeError, match="C\\+\\+ code"):
        cc.declare_salt(tvm.get_global_func("ir.OpGetAttr"), "v1")


def test_verify_true_serves_a_warm_model_from_disk_and_compares_the_input(tmp_path):
    first = cc.CodegenCache(tmp_path / "cache", write_behind=False, verify=True)
    cc.enable(first, children=False)
    try:
        cold, tier = _compile()
        assert tier == "codegen"
    finally:
        cc.disable()
        first.close()
    second = cc.CodegenCache(tmp_path / "cache", write_behind=False, verify=True)  # a new memory tier
    cc.enable(second, children=False)
    try:
        warm, tier = _compile()
        changed, changed_tier = _compile(relax_models.with_constant(model_reads.WEIGHTS + 1e-7))
    finally:
        cc.disable()
        second.close()
    assert tier == "disk" and changed_tier == "codegen"
    np.testing.assert_array_equal(model_reads.run(warm), model_reads.run(cold))


def test_disable_removes_the_registration_wrappers_and_enable_puts_them_back(tmp_path):
    originals = [getattr(module, name) for module, name in _compat.REGISTRATION_POINTS]
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    try:
        assert all(getattr(m, n) is not o for (m, n), o in zip(_compat.REGISTRATION_POINTS, originals))
    finally:
        cc.disable()
        cache.close()
    assert all(getattr(m, n) is o for (m, n), o in zip(_compat.REGISTRATION_POINTS, originals))


def test_tvms_registration_functions_call_the_points_the_hooks_wrap():
    # Private: tvm_ffi's register_global_func calls core._register_global_func at call time (the
    # fallback where it goes: a full scan per model key); tvm.ir's registration functions call
    # _ffi_api's. A failure here means a registration would go unseen until the next enable().
    assert callable(getattr(tvm_ffi.core, "_register_global_func", None))
    assert "core._register_global_func(" in inspect.getsource(tvm_ffi.registry.register_global_func)
    assert "_ffi_api.RegisterOpAttr(" in inspect.getsource(tvm.ir.register_op_attr)
    assert "_ffi_api.OpSetAttr(" in inspect.getsource(tvm.ir.Op.set_attr)
    assert "_ffi_api.OpResetAttr(" in inspect.getsource(tvm.ir.Op.reset_attr)
    assert "_ffi_api.RegisterOpLowerIntrinsic(op_name, f, target, level)" in inspect.getsource(
        tvm.tirx.register_intrin_lowering)


# ---- fresh processes ------------------------------------------------------------------------------

PROCESS = """
    import json, sys
    import tvm
    from tvm import relax
    import codegen_cache as cc
    import model_reads

    kind, variant, directory = sys.argv[1], sys.argv[2], sys.argv[3]
    legalize = model_reads.LEGALIZATIONS.get(variant)
    options = {}
    if kind == "op_attr" and legalize is not None:
        tvm.ir.register_op_attr("relax.add", "FLegalize", legalize, level=11)
    elif kind == "pipeline":  # the body written here, as a user's script has it
        if variant == "subtract":
            @relax.register_pipeline("users")
            def users():
                return model_reads.legalizing_pipeline(model_reads.subtract)()
        else:
            @relax.register_pipeline("users")
            def users():
                return model_reads.legalizing_pipeline(model_reads.multiply)()
        options["relax_pipeline"] = "users"
    elif kind == "global_function":
        tvm.register_global_func("users.legalize_add", legalize, override=True)
        relax.register_pipeline("users")(model_reads.calling_global("users.legalize_add"))
        options["relax_pipeline"] = "users"
    cc.enable(cc.CodegenCache(directory), children=False)
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(model_reads.model(), "llvm", **options)
    print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                      "out": model_reads.run(executable).tolist()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["op_attr", "pipeline", "global_function"])
def test_another_process_with_a_changed_registration_gets_its_own_executable(tmp_path, kind):
    directory = str(tmp_path / "cache")
    first = python_json(PROCESS, kind, "subtract", directory)
    changed = python_json(PROCESS, kind, "multiply", directory)
    unchanged = python_json(PROCESS, kind, "subtract", directory)
    assert first["tiers"] == changed["tiers"] == ["codegen"]
    np.testing.assert_allclose(first["out"], model_reads.EXPECTED["subtract"], rtol=1e-6)
    np.testing.assert_allclose(changed["out"], model_reads.EXPECTED["multiply"], rtol=1e-6)
    assert unchanged["tiers"] == ["disk"]  # the same code registered again: the same key
    np.testing.assert_allclose(unchanged["out"], model_reads.EXPECTED["subtract"], rtol=1e-6)


@pytest.mark.slow
def test_a_process_with_a_users_function_registered_keeps_hitting_with_verify(tmp_path):
    directory = str(tmp_path / "cache")
    env = {"CODEGEN_CACHE_VERIFY": "1"}
    cold = python_json(PROCESS, "op_attr", "subtract", directory, env=env)
    warm = python_json(PROCESS, "op_attr", "subtract", directory, env=env)
    assert cold["tiers"] == ["codegen"] and warm["tiers"] == ["disk"]
    assert warm["out"] == cold["out"]
    stock = python_json(PROCESS, "op_attr", "stock", directory, env=env)
    assert stock["tiers"] == ["codegen"]
    np.testing.assert_allclose(stock["out"], model_reads.EXPECTED["stock"], rtol=1e-6)


DATABASE_PROCESS = """
    import json, sys
    import tvm
    import codegen_cache as cc
    import model_reads, relax_models

    model_reads.register_pipeline("tuned", model_reads.tuned_pipeline)
    mod, _named = relax_models.mlp()
    cc.enable(cc.CodegenCache(sys.argv[2]), children=False)
    with cc.record_outcomes() as outcomes:
        if sys.argv[1] == "tuned":
            with model_reads.tuned_database():
                executable = tvm.compile(mod, model_reads.LLVM, relax_pipeline="tuned")
        else:
            executable = tvm.compile(mod, model_reads.LLVM, relax_pipeline="tuned")
    print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                      "parallel": model_reads.parallel_launches(executable)}))
"""


@pytest.mark.slow
def test_another_process_tuning_with_a_database_is_not_served_the_untuned_executable(tmp_path):
    directory = str(tmp_path / "cache")
    untuned = python_json(DATABASE_PROCESS, "untuned", directory)
    tuned = python_json(DATABASE_PROCESS, "tuned", directory)
    tuned_again = python_json(DATABASE_PROCESS, "tuned", directory)
    assert untuned["tiers"] == tuned["tiers"] == ["codegen"] and tuned_again["tiers"] == ["disk"]
    assert untuned["parallel"] == 0 and tuned["parallel"] > 0 and tuned_again["parallel"] == tuned["parallel"]
