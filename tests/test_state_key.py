"""A whole compile's key sees TVM's state as its difference from a clean import, whoever changed it and how.

Each test changes TVM's state the way a user can (TVM's own function put where TVM does not put
it, TVM code bound to another value, a function assigned over one of TVM's, a lowering rule
through TVM's public helper, a registration made while the switch was off), compiles, and
checks the numbers against what that state computes: a served executable of the clean state
would give the stock numbers. Then the state goes back and the first executable is served again.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax, topi
from tvm.relax.transform.legalize_ops.common import _call_topi_without_attr

import codegen_cache as cc
from codegen_cache._build import _install, _reads
import model_reads
from processes import python_json, reap

LLVM = frozenset({"llvm"})


@pytest.fixture
def enabled(tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    try:
        yield cache
    finally:
        cc.disable()
        cache.close()


def _compile(**kwargs):
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(model_reads.model(), "llvm", **kwargs)
    tiers = [o.tier for o in outcomes if o.codegen == "relax.build"]
    return executable, tiers[0] if tiers else None


@pytest.fixture
def add_legalization():
    op = tvm.ir.Op.get("relax.add")
    original = op.get_attr("FLegalize")
    yield original
    model_reads.restore_legalization("relax.add", original)


def test_tvms_own_legalization_put_on_another_operator_gives_that_operators_numbers(enabled, add_legalization):
    stock, _ = _compile()
    tvm.ir.register_op_attr("relax.add", "FLegalize", tvm.ir.Op.get("relax.multiply").get_attr("FLegalize"), level=11)
    moved, tier = _compile()
    assert tier == "codegen"
    np.testing.assert_allclose(model_reads.run(moved), model_reads.EXPECTED["multiply"], rtol=1e-6)
    model_reads.restore_legalization("relax.add", add_legalization)
    again, tier = _compile()
    assert tier == "memory"
    np.testing.assert_allclose(model_reads.run(again), model_reads.run(stock), rtol=1e-6)


def test_tvm_code_bound_to_another_value_is_another_registration(enabled):
    name = "cgc_test_state.legalize_add"
    model_reads.register_pipeline("cgc_state_global", model_reads.calling_global(name))
    try:
        tvm.register_global_func(name, _call_topi_without_attr(topi.subtract), override=True)
        first, _ = _compile(relax_pipeline="cgc_state_global")
        np.testing.assert_allclose(model_reads.run(first), model_reads.EXPECTED["subtract"], rtol=1e-6)
        tvm.register_global_func(name, _call_topi_without_attr(topi.multiply), override=True)
        second, tier = _compile(relax_pipeline="cgc_state_global")
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(second), model_reads.EXPECTED["multiply"], rtol=1e-6)
        tvm.register_global_func(name, functools.partial(_call_topi_without_attr(topi.subtract)), override=True)
        third, tier = _compile(relax_pipeline="cgc_state_global")
        np.testing.assert_allclose(model_reads.run(third), model_reads.EXPECTED["subtract"], rtol=1e-6)
    finally:
        tvm_ffi.remove_global_func(name)
        relax.pipeline.PIPELINE_MAP.pop("cgc_state_global", None)


def test_a_function_assigned_over_one_of_tvms_is_keyed_and_putting_it_back_hits(enabled):
    original = relax.transform.LegalizeOps
    stock, _ = _compile()
    relax.transform.LegalizeOps = functools.partial(original, {"relax.add": model_reads.subtract})
    try:
        replaced, tier = _compile()
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(replaced), model_reads.EXPECTED["subtract"], rtol=1e-6)
    finally:
        relax.transform.LegalizeOps = original
    again, tier = _compile()
    assert tier == "memory"
    np.testing.assert_allclose(model_reads.run(again), model_reads.run(stock), rtol=1e-6)


def test_a_lowering_rule_through_tvms_public_helper_changes_the_build_key(enabled):
    @tvm.script.tirx.prim_func
    def exp(a: tvm.script.tirx.Buffer((16,), "float32"), b: tvm.script.tirx.Buffer((16,), "float32")):
        for i in range(16):
            b[i] = tvm.script.tirx.exp(a[i])

    op = tvm.ir.Op.get("tirx.exp")
    original = op.get_attr("llvm.FLowerIntrinsic")
    before = cc.build_key(exp, "llvm")

    def exp_as_itself(call):
        return call

    try:
        tvm.tirx.register_intrin_lowering("tirx.exp", "llvm", f=exp_as_itself, level=99)
        assert cc.build_key(exp, "llvm") != before
    finally:
        op.reset_attr("llvm.FLowerIntrinsic")
        if original is not None:
            op.set_attr("llvm.FLowerIntrinsic", original, 10)
    assert cc.build_key(exp, "llvm") == before


def test_a_registration_made_while_the_switch_was_off_is_seen(tmp_path, add_legalization):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    clean = _reads.registered_part(LLVM)
    cc.disable()
    tvm.ir.register_op_attr("relax.add", "FLegalize", model_reads.subtract, level=11)
    cc.enable(cache, children=False)
    try:
        assert _reads.registered_part(LLVM) != clean
        compiled, _ = _compile()
        np.testing.assert_allclose(model_reads.run(compiled), model_reads.EXPECTED["subtract"], rtol=1e-6)
    finally:
        cc.disable()
        cache.close()


def test_a_registration_right_after_enable_is_seen_by_the_first_compile(tmp_path, add_legalization):
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    try:
        _compile()  # the stock model is stored: a stale state would be served it
        cc.disable()
        cc.enable(cache, children=False)
        tvm.ir.register_op_attr("relax.add", "FLegalize", model_reads.subtract, level=11)
        compiled, tier = _compile()
        assert tier == "codegen"
        np.testing.assert_allclose(model_reads.run(compiled), model_reads.EXPECTED["subtract"], rtol=1e-6)
    finally:
        cc.disable()
        cache.close()


def test_a_fork_right_after_enable_gives_a_child_that_compiles(tmp_path):
    # Nothing enable() starts may leave a child forked right after it holding a lock of TVM's or
    # of this package that a thread it does not have held at the fork.
    import os

    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                executable, _ = _compile()
                code = 0 if np.allclose(model_reads.run(executable), model_reads.EXPECTED["stock"], rtol=1e-6) else 1
            finally:
                os._exit(code)  # never back into pytest from the child
        assert reap(pid, 120) == 0
    finally:
        cc.disable()
        cache.close()


_LEGALIZED = [
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.exp", "relax.log", "relax.sqrt", "relax.nn.relu", "relax.nn.silu", "relax.sigmoid", "relax.tanh"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from(_LEGALIZED), place=st.sampled_from(_LEGALIZED))
def test_tvms_own_legalization_at_any_other_place_changes_the_key(enabled, source, place):
    op = tvm.ir.Op.get(place)
    original = op.get_attr("FLegalize")
    moved = tvm.ir.Op.get(source).get_attr("FLegalize")
    clean = _reads.registered_part(LLVM)
    tvm.ir.register_op_attr(place, "FLegalize", moved, level=50)
    try:
        changed = _reads.registered_part(LLVM)
    finally:
        model_reads.restore_legalization(place, original)
    assert (changed != clean) == (source != place)
    assert _reads.registered_part(LLVM) == clean


def test_an_edited_tvm_file_gives_another_install_digest_and_reverting_it_the_old_one(tmp_path, monkeypatch):
    package = tmp_path / "site" / "tvm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "libtvm.so").write_bytes(b"\x7fELF" + bytes(64))
    monkeypatch.setattr(_install, "_roots", lambda: (str(package),))
    monkeypatch.setattr(_install, "_run_files", lambda roots: {str(package): ["__init__.py", "libtvm.so"]})
    state = tmp_path / "state"

    def digest():
        _install._checked.clear()
        _install._last[:] = [-1, ""]
        return _install.install_part(state)

    first = digest()
    assert digest() == first  # remembered: sizes and mtimes unchanged
    (package / "__init__.py").write_text("X = 2\n")
    edited = digest()
    assert edited != first
    (package / "__init__.py").write_text("X = 1\n")
    assert digest() == first
    _install._checked.clear()
    _install._last[:] = [-1, ""]


PROCESS = """
    import json, sys
    change, variant = sys.argv[1], sys.argv[2]
    if change == "global_before_import_tvm":  # tvm_ffi registers before TVM is imported
        import tvm_ffi

        def legalize_add(bb, call):
            from tvm import topi
            return bb.call_te(topi.subtract if variant == "changed" else topi.add, call.args[0], call.args[1])

        tvm_ffi.register_global_func("users.legalize_add", legalize_add, override=True)
    import tvm
    from tvm import relax
    import codegen_cache as cc
    import model_reads
    options = {}
    if change == "global_before_import_tvm":
        model_reads.register_pipeline("users", model_reads.calling_global("users.legalize_add"))
        options["relax_pipeline"] = "users"
    elif variant == "changed" and change == "tvm_own_elsewhere":
        multiply = tvm.ir.Op.get("relax.multiply").get_attr("FLegalize")
        tvm.ir.register_op_attr("relax.add", "FLegalize", multiply, level=11)
    elif variant == "changed" and change == "module_attribute":
        original = relax.transform.LegalizeOps
        relax.transform.LegalizeOps = lambda *a, **k: original({"relax.add": model_reads.subtract})
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(model_reads.model(), "llvm", **options)
    print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                      "out": model_reads.run(executable).tolist()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("change", ["tvm_own_elsewhere", "module_attribute", "global_before_import_tvm"])
def test_another_process_under_a_changed_state_gets_tvms_result_and_the_clean_one_hits_again(tmp_path, change):
    # CODEGEN_CACHE_ENABLE: the switch turns on as `import tvm` completes, after what tvm_ffi registered.
    env = {"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    runs = [python_json(PROCESS, change, variant, env=env) for variant in ("clean", "changed", "clean")]
    expected = {"tvm_own_elsewhere": "multiply", "module_attribute": "subtract", "global_before_import_tvm": "subtract"}
    assert runs[0]["tiers"] == ["codegen"] and runs[1]["tiers"] == ["codegen"] and runs[2]["tiers"] == ["disk"]
    np.testing.assert_allclose(runs[0]["out"], model_reads.EXPECTED["stock"], rtol=1e-6)
    np.testing.assert_allclose(runs[1]["out"], model_reads.EXPECTED[expected[change]], rtol=1e-6)
    np.testing.assert_allclose(runs[2]["out"], model_reads.EXPECTED["stock"], rtol=1e-6)


def test_every_registration_function_in_tvms_sources_is_a_wrapped_point():
    # A registration through an FFI function no wrapper sees would go unseen until the next enable().
    import re
    from pathlib import Path

    from codegen_cache import _compat

    wrapped = {name for module, name in _compat.REGISTRATION_POINTS if module is not None}
    called = set()
    for path in Path(tvm.__file__).parent.rglob("*.py"):
        called |= set(re.findall(r"_ffi_api\.(Register\w*|Op(?:Set|Reset)Attr)\(", path.read_text(errors="replace")))
    # RegisterPatterns: the BYOC pattern table, which the key does not see (docs/key.md).
    assert called - {"RegisterPatterns"} <= wrapped


# ---- what the key does not see (docs/key.md, "What the key cannot see") -----------------------

_SETTINGS = types.SimpleNamespace(factor=1)


def _reads_an_attribute(bb, call):
    return bb.call_te(topi.multiply if _SETTINGS.factor == 1 else topi.subtract, call.args[0], call.args[1])


def test_what_the_key_does_not_see_what_a_function_reads_when_called_but_a_declared_salt_is_seen(enabled):
    name = "cgc_test_state.reads_an_attribute"
    tvm.register_global_func(name, _reads_an_attribute, override=True)
    try:
        before = _reads.registered_part(LLVM)
        _SETTINGS.factor = 2
        assert _reads.registered_part(LLVM) == before  # an object's attributes are not in the key
        cc.declare_salt(_reads_an_attribute, "factor=2")
        assert _reads.registered_part(LLVM) != before  # the way out
    finally:
        _SETTINGS.factor = 1
        tvm_ffi.remove_global_func(name)


def test_what_the_key_does_not_see_a_method_of_tvms_class_replaced(enabled):
    before = _reads.registered_part(LLVM)
    original = relax.BlockBuilder.call_te
    relax.BlockBuilder.call_te = lambda self, *args, **kwargs: original(self, *args, **kwargs)
    try:
        assert _reads.registered_part(LLVM) == before
    finally:
        relax.BlockBuilder.call_te = original


def test_what_the_key_does_not_see_module_data_changed_in_place_but_a_function_assigned_is_seen(enabled):
    from tvm.relax.backend import pattern_registry

    before = _reads.registered_part(LLVM)
    table = vars(tvm.relax.transform.legalize_ops.common)
    table["cgc_test_data"] = {"changed": True}
    try:
        assert _reads.registered_part(LLVM) == before
    finally:
        del table["cgc_test_data"]
    original = pattern_registry.get_patterns_with_prefix
    pattern_registry.get_patterns_with_prefix = lambda prefix: original(prefix)
    try:
        assert _reads.registered_part(LLVM) != before
    finally:
        pattern_registry.get_patterns_with_prefix = original
    assert _reads.registered_part(LLVM) == before


def test_what_the_key_does_not_see_a_global_function_of_cpp_code(enabled):
    before = _reads.registered_part(LLVM)
    native = tvm_ffi.get_global_func("ffi.String")  # a function of C++ code, put at a new name
    tvm_ffi.register_global_func("cgc_test_state.native", native, override=True)
    try:
        assert _reads.registered_part(LLVM) == before
    finally:
        tvm_ffi.remove_global_func("cgc_test_state.native")


def test_what_the_key_does_not_see_an_instance_at_a_module_attribute_swapped_for_another_of_its_class(enabled):
    module = vars(tvm.script.tirx)
    name = next(n for n, v in module.items() if type(v).__module__.startswith("tvm.") and callable(v)
                and not isinstance(v, (type, types.FunctionType, tvm_ffi.Function)))
    saved = module[name]
    before = _reads.registered_part(LLVM)
    module[name] = type(saved).__new__(type(saved))
    try:
        assert _reads.registered_part(LLVM) == before
    finally:
        module[name] = saved


EXPLICIT_OR_VARIABLE = """
    import json, sys
    import tvm
    import codegen_cache as cc
    import model_reads
    if sys.argv[1] == "explicit":
        cc.enable(cc.CodegenCache(sys.argv[2]), children=False)
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(model_reads.model(), "llvm")
    print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                      "out": model_reads.run(executable).tolist()}))
"""


@pytest.mark.slow
def test_a_process_with_the_variable_and_one_with_enable_share_the_clean_states_entries(tmp_path):
    directory = str(tmp_path / "cache")
    variable = {"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": directory}
    first = python_json(EXPLICIT_OR_VARIABLE, "variable", directory, env=variable)
    second = python_json(EXPLICIT_OR_VARIABLE, "explicit", directory, env={"CODEGEN_CACHE_ENABLE": None})
    third = python_json(EXPLICIT_OR_VARIABLE, "variable", directory, env=variable)
    assert (first["tiers"], second["tiers"], third["tiers"]) == (["codegen"], ["disk"], ["disk"])
    for run in (first, second, third):
        np.testing.assert_allclose(run["out"], model_reads.EXPECTED["stock"], rtol=1e-6)


IMPORTS_OVER_A_RULE = """
    import json, sys
    import numpy as np
    import tvm
    if sys.argv[1] == "intrin":
        import tvm.target.intrin  # registers its own lowering of tirx.exp over TVM's default one
    import codegen_cache as cc
    from tvm import relax
    from tvm.script import relax as R

    builder = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((8,), "float32"))
    with builder.function("main", [x]):
        builder.emit_func_output(builder.emit(relax.op.exp(x)))
    if sys.argv[2] == "explicit":
        cc.enable(cc.CodegenCache(sys.argv[3]), children=False)
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(builder.get(), "llvm")
    x = np.linspace(-2, 2, 8, dtype="float32")
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    print(json.dumps({"tiers": [o.tier for o in outcomes if o.codegen == "relax.build"],
                      "keys": [o.key for o in outcomes if o.codegen == "relax.build"],
                      "error": float(np.abs(out - np.exp(x)).max())}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["explicit", "variable"])
def test_a_tvm_module_that_registers_over_another_is_its_own_clean_state_whatever_ran_before(tmp_path, switch):
    # tvm.target.intrin, imported, replaces tirx.exp's default lowering: a process that imported it
    # compiles another program, whichever process took the clean state first (one per user,
    # shared by all), and a process that did not import it keys none of it.
    directory = str(tmp_path / "cache")
    env = {"XDG_CACHE_HOME": str(tmp_path / "state"), "CODEGEN_CACHE_DIR": directory,
           "CODEGEN_CACHE_ENABLE": "1" if switch == "variable" else None}
    runs = [python_json(IMPORTS_OVER_A_RULE, which, switch, directory, env=env)
            for which in ("intrin", "stock", "stock", "intrin")]
    assert [r["tiers"] for r in runs] == [["codegen"], ["codegen"], ["disk"], ["disk"]], runs
    assert runs[0]["keys"] == runs[3]["keys"] != runs[1]["keys"] == runs[2]["keys"], runs
    assert all(r["error"] < 1e-5 for r in runs), runs
