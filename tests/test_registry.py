"""The registry keeps tilelang's device_codegen API, names, rules and errors."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import tvm
from tvm.target import Target

import codegen_cache as cc
from codegen_cache import DeviceCodegen, DeviceCodegenRegistry, global_func_device_codegen
from codegen_cache.codegens import install_builtins


def _marker(name):
    def codegen(mod, target):
        return name

    return codegen


def test_register_and_resolve_in_order():
    reg = DeviceCodegenRegistry()
    first = reg.register("cuda", DeviceCodegen("a", build=_marker("a")))
    reg.register("cuda", DeviceCodegen("b", build=_marker("b")))
    assert reg.allowed("cuda") == ["a", "b"]
    assert reg.resolve("cuda") is first


def test_same_name_twice_is_an_error_unless_override():
    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("a", build=_marker("a")))
    with pytest.raises(ValueError, match="'a' is already registered for target kind 'cuda'.*override=True"):
        reg.register("cuda", DeviceCodegen("a", build=_marker("a2")))
    replacement = DeviceCodegen("a", build=_marker("a2"))
    reg.register("cuda", DeviceCodegen("z", build=_marker("z")))
    assert reg.register("cuda", replacement, override=True) is replacement
    assert reg.allowed("cuda") == ["z", "a"]  # moved to the end, as tilelang's original
    assert reg.resolve("cuda").build(None, None) == "z"


def test_predicate_filters_and_order():
    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("hopper", build=_marker("h"), supports_target=lambda t: str(t.attrs.get("arch", "")).startswith("sm_9")))
    reg.register("cuda", DeviceCodegen("generic", build=_marker("g")))
    assert reg.allowed({"kind": "cuda", "arch": "sm_90"}) == ["hopper", "generic"]
    assert reg.allowed({"kind": "cuda", "arch": "sm_80"}) == ["generic"]
    assert reg.resolve({"kind": "cuda", "arch": "sm_80"}).name == "generic"


def test_matches_is_true_without_predicate():
    assert DeviceCodegen("x").matches(Target("llvm"))
    assert not DeviceCodegen("x", supports_target=lambda t: False).matches(Target("llvm"))


def test_resolve_error_names_kind_and_available():
    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("only80", supports_target=lambda t: False))
    with pytest.raises(ValueError, match=r"target 'llvm'\. Available: <none>\. Target kinds with a device codegen: cuda\."):
        reg.resolve("llvm")
    with pytest.raises(ValueError, match=r"target 'cuda'\. Available: only80\. None of them accepts target .*sm_90"):
        reg.resolve({"kind": "cuda", "arch": "sm_90"})


@pytest.mark.parametrize("compile_device, mode", [(True, "with compilation"), (False, "without compilation")])
def test_lower_missing_mode_names_codegen_kind_and_mode(compile_device, mode):
    codegen = DeviceCodegen("partial")
    with cc.use_cache(None):
        with pytest.raises(ValueError, match=f"Device codegen 'partial' for target 'llvm' does not support lowering {mode}"):
            codegen.lower(tvm.IRModule(), Target("llvm"), compile_device=compile_device)


def test_device_codegen_is_frozen():
    codegen = DeviceCodegen("x")
    with pytest.raises(AttributeError):
        codegen.name = "y"  # type: ignore[misc]


def test_global_func_codegen_unknown_name_fails_when_called():
    codegen = global_func_device_codegen("target.build.does_not_exist")
    with pytest.raises(ValueError, match=r"Cannot find global function target\.build\.does_not_exist") as info:
        codegen(tvm.IRModule(), Target("llvm"))
    assert "'target.build.llvm'" in info.value.__notes__[0]


def test_lazy_registration_imports_once_on_first_use(monkeypatch):
    reg = DeviceCodegenRegistry()
    imports = []
    module = types.ModuleType("fake_backend_mod")

    def loader():
        imports.append(1)
        reg.register("opencl", DeviceCodegen("fake", build_without_compile=_marker("f")))

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "fake_backend_mod":
                return None
            import importlib.machinery

            class Loader:
                def create_module(self, spec):
                    return module

                def exec_module(self, mod):
                    loader()

            return importlib.machinery.ModuleSpec(name, Loader())

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "fake_backend_mod", raising=False)
    reg.register_lazy("opencl", "fake_backend_mod")
    assert imports == []
    assert reg.allowed("opencl") == ["fake"]
    assert reg.allowed("opencl") == ["fake"]
    assert imports == [1]


def test_lazy_import_failure_is_raw_and_retried():
    reg = DeviceCodegenRegistry()
    reg.register_lazy("metal", "no_such_backend_module_xyz")
    with pytest.raises(ModuleNotFoundError, match="No module named 'no_such_backend_module_xyz'") as info:
        reg.allowed("metal")
    assert info.value.name == "no_such_backend_module_xyz"
    # Still registered: a later call tries again.
    with pytest.raises(ModuleNotFoundError, match="no_such_backend_module_xyz"):
        reg.resolve("metal")


def test_targets_accepted_as_target_dict_or_string():
    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("a"))
    for target in (Target({"kind": "cuda", "arch": "sm_90"}), {"kind": "cuda", "arch": "sm_90"}, "cuda", "nvidia/nvidia-a100"):
        assert reg.allowed(target) == ["a"]


def test_bad_target_error_names_value():
    with pytest.raises(ValueError, match="Invalid target 'not-a-kind'"):
        cc.allowed_device_codegens_for_target("not-a-kind")
    with pytest.raises(TypeError, match="Invalid target 42"):
        cc.resolve_device_codegen(42)


def test_registration_is_thread_safe():
    reg = DeviceCodegenRegistry()
    errors = []

    def work(i):
        try:
            reg.register("llvm", DeviceCodegen(f"c{i}"))
        except ValueError as err:  # pragma: no cover - would be a bug
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(reg.allowed("llvm")) == sorted(f"c{i}" for i in range(64))


def test_default_registry_has_builtin_kinds():
    for kind in ("cuda", "llvm", "c", "nvptx", "opencl", "metal", "rocm", "vulkan", "webgpu"):
        assert kind in cc.default_registry.kinds()
    assert cc.allowed_device_codegens_for_target("llvm") == ["llvm"]
    assert cc.resolve_device_codegen({"kind": "cuda", "arch": "sm_80"}).name == "cuda"


def test_module_level_functions_use_default_registry():
    codegen = DeviceCodegen("test-extra", build_without_compile=_marker("x"))
    assert cc.register_device_codegen("webgpu", codegen) is codegen
    try:
        assert "test-extra" in cc.allowed_device_codegens_for_target("webgpu")
        with pytest.raises(ValueError, match="already registered"):
            cc.register_device_codegen("webgpu", codegen)
    finally:
        with cc.default_registry._lock:
            cc.default_registry._codegens["webgpu"].remove(codegen)


def test_a_raising_predicate_propagates_unchanged_with_a_note_naming_codegen_and_kind():
    def boom(target):
        raise KeyError("boom")

    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("picky", supports_target=boom))
    for call in (reg.allowed, reg.resolve):
        with pytest.raises(KeyError) as info:
            call("cuda")
        assert info.value.args == ("boom",)
        assert "device codegen 'picky' registered for target kind 'cuda'" in info.value.__notes__[-1]


def _with_builtins():
    reg = DeviceCodegenRegistry()
    install_builtins(reg)
    return reg


def test_a_failing_user_lazy_path_never_removes_the_builtin_codegen():
    reg = _with_builtins()
    reg.register_lazy("opencl", "no.such.module")
    with pytest.raises(ModuleNotFoundError, match="No module named 'no'"):
        reg.allowed("opencl")  # raw, as tilelang's: the built-in is not consulted while it fails
    reg.register_lazy("opencl", "json")  # a later path replaces it; this one registers nothing
    assert reg.allowed("opencl") == ["opencl"]
    assert reg.resolve("opencl").name == "opencl"


def test_builtins_come_after_every_registered_codegen_whenever_it_was_registered():
    reg = _with_builtins()
    assert reg.allowed("llvm") == ["llvm"]  # first use: the built-in is loaded
    mine = reg.register("llvm", DeviceCodegen("mine"))
    assert reg.allowed("llvm") == ["mine", "llvm"]
    assert reg.resolve("llvm") is mine


def test_a_codegen_named_like_a_builtin_hides_it_without_override():
    reg = _with_builtins()
    reg.allowed("llvm")
    custom = reg.register("llvm", DeviceCodegen("llvm", build=_marker("custom")))
    assert reg.registered("llvm") == [custom]
    assert reg.resolve("llvm") is custom


def test_a_stock_kind_with_no_matching_registered_codegen_resolves_to_its_builtin():
    reg = _with_builtins()
    reg.register("cuda", DeviceCodegen("only80", supports_target=lambda t: False))
    assert reg.allowed("cuda") == ["cuda"]
    assert reg.resolve("cuda").toolchain is not None  # the built-in, which keys nvcc's version
    with pytest.raises(ValueError, match=r"target 'hexagon'\. Available: <none>\..*cuda, llvm"):
        reg.resolve("hexagon")  # not a stock kind here: as the original
