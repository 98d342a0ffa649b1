"""Parity with tilelang's registry: the same scenarios, same observable results.

Each scenario drives one registry API (ours on a fresh registry with a cache active, or
tilelang's original module) and returns what a caller can observe: values, names, identities,
and for errors the type, the message and the `.name` of import errors. EXPECTED holds the
results of the original (tilelang 607a9144c `tilelang/backend/device_codegen.py`, byte-identical
in the tilelang 0.1.12/0.1.13 wheels, sha256 below); our messages may add text after them.

When the original file is at hand, the same scenarios also run against it and must give
EXPECTED exactly: set TILELANG_DEVICE_CODEGEN to a tilelang wheel (.whl) or to the .py file,
or install a tilelang whose file has that hash. It is read, never imported as tilelang (it
imports only tvm and dataclasses; `tilelang.tvm.ffi` is stubbed with tvm_ffi, the TVM rename).

The tests after the scenarios take the differences of issue #14 one by one, then the
deliberate difference (compile_device must be a bool) and the built-in codegens.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import tvm
import tvm_ffi
from tvm.target import Target

import codegen_cache as cc
from codegen_cache import DeviceCodegen, DeviceCodegenRegistry, global_func_device_codegen

ORIGINAL_PATH = "tilelang/backend/device_codegen.py"
ORIGINAL_SHA256 = "a988daf51c1eefea54c4dc2967d212d6d578e83ab06a3b20d8ff7b1a99b9bc19"
FAKE_PREFIX = "codegen_cache_parity_"


# ---- the two APIs ---------------------------------------------------------------------------


@dataclass
class Api:
    """One registry's public surface, as the scenarios use it."""

    DeviceCodegen: Any
    register: Callable
    register_lazy: Callable
    allowed: Callable
    resolve: Callable
    global_func: Callable


def ours() -> Api:
    reg = DeviceCodegenRegistry()
    return Api(DeviceCodegen, reg.register, reg.register_lazy, reg.allowed, reg.resolve, global_func_device_codegen)


def original_source() -> tuple[bytes | None, str]:
    """The original module's bytes, or None and why not."""
    spec = os.environ.get("TILELANG_DEVICE_CODEGEN")
    if spec:
        path = Path(spec)
        if not path.is_file():
            return None, f"TILELANG_DEVICE_CODEGEN={spec} is not a file"
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                data = wheel.read(ORIGINAL_PATH)
        else:
            data = path.read_bytes()
    else:
        try:
            located = Path(str(importlib.metadata.distribution("tilelang").locate_file(ORIGINAL_PATH)))
        except importlib.metadata.PackageNotFoundError:
            return None, "tilelang's original module is not here: set TILELANG_DEVICE_CODEGEN to a tilelang 0.1.13 wheel"
        if not located.is_file():
            return None, f"the installed tilelang has no {ORIGINAL_PATH} (versions after 0.1.13 moved it)"
        data = located.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != ORIGINAL_SHA256:
        return None, f"{ORIGINAL_PATH} found has sha256 {digest}, not the 607a9144c module's"
    return data, ""


def original(source: bytes, monkeypatch) -> Api:
    """A fresh copy of the original module (fresh module globals: a fresh registry)."""
    stub = types.ModuleType("tilelang")
    stub.tvm = types.SimpleNamespace(ffi=tvm_ffi)  # tilelang's `tvm.ffi` is tvm_ffi
    monkeypatch.setitem(sys.modules, "tilelang", stub)
    module = types.ModuleType("tilelang_original_device_codegen")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, f"<tilelang 607a9144c {ORIGINAL_PATH}>", "exec"), module.__dict__)  # noqa: S102
    return Api(module.DeviceCodegen, module.register_device_codegen, module.register_lazy_device_codegen,
               module.allowed_device_codegens_for_target, module.resolve_device_codegen,
               module.global_func_device_codegen)


class FakeModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Importable modules whose body is a Python callable; records each import."""

    def __init__(self) -> None:
        self.bodies: dict[str, Callable[[], None]] = {}
        self.imports: list[str] = []

    def add(self, name: str, body: Callable[[], None]) -> str:
        self.bodies[FAKE_PREFIX + name] = body
        return FAKE_PREFIX + name

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.bodies:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.imports.append(module.__name__.removeprefix(FAKE_PREFIX))
        self.bodies[module.__name__]()


@pytest.fixture
def fake_modules(monkeypatch):
    finder = FakeModules()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    yield finder
    for name in [n for n in sys.modules if n.startswith(FAKE_PREFIX)]:
        del sys.modules[name]


def attempt(func: Callable[[], Any]) -> tuple:
    """('ok', value) or ('raises', type name, message, .name of an import error)."""
    try:
        return ("ok", func())
    except (ValueError, TypeError, KeyError, ImportError, RuntimeError) as err:
        return ("raises", type(err).__name__, str(err), getattr(err, "name", None))


# ---- scenarios --------------------------------------------------------------------------------

CUDA, OPENCL, LLVM = Target({"kind": "cuda", "arch": "sm_80"}), Target("opencl"), Target("llvm")


def _const(value):
    return lambda mod, target: value


def order_and_identity(api, mods):
    a = api.register("cuda", api.DeviceCodegen("a", build=_const("a")))
    b = api.DeviceCodegen("b", build=_const("b"))
    return [api.register("cuda", b) is b, api.allowed(CUDA), api.resolve(CUDA) is a, api.allowed(LLVM)]


def duplicate_name(api, mods):
    api.register("cuda", api.DeviceCodegen("a"))
    return [attempt(lambda: api.register("cuda", api.DeviceCodegen("a"))), api.allowed(CUDA)]


def override_moves_to_end(api, mods):
    api.register("cuda", api.DeviceCodegen("a", build=_const("a")))
    z = api.register("cuda", api.DeviceCodegen("z", build=_const("z")))
    a2 = api.DeviceCodegen("a", build=_const("a2"))
    return [api.register("cuda", a2, override=True) is a2, api.allowed(CUDA), api.resolve(CUDA) is z,
            api.register("cuda", api.DeviceCodegen("new"), override=True).name, api.allowed(CUDA)]


def no_codegen_message(api, mods):
    return [api.allowed(OPENCL), attempt(lambda: api.resolve(OPENCL))]


def none_match_message(api, mods):
    api.register("cuda", api.DeviceCodegen("only80", supports_target=lambda t: str(t.attrs["arch"]) == "sm_80"))
    api.register("cuda", api.DeviceCodegen("never", supports_target=lambda t: False))
    sm90 = Target({"kind": "cuda", "arch": "sm_90"})
    return [api.allowed(CUDA), api.allowed(sm90), attempt(lambda: api.resolve(sm90))]


def predicate_raw_value(api, mods):
    yes = api.DeviceCodegen("yes", supports_target=lambda t: "yes")
    zero = api.DeviceCodegen("zero", supports_target=lambda t: 0)
    api.register("cuda", zero)
    api.register("cuda", yes)
    return [yes.matches(CUDA), zero.matches(CUDA), api.DeviceCodegen("x").matches(CUDA), api.allowed(CUDA),
            api.resolve(CUDA).name]


def predicate_raises(api, mods):
    def boom(target):
        raise KeyError("boom")

    api.register("cuda", api.DeviceCodegen("fine"))
    api.register("cuda", api.DeviceCodegen("raising", supports_target=boom))
    return [attempt(lambda: api.allowed(CUDA)), attempt(lambda: api.resolve(CUDA))]


class Duck:
    """Not a DeviceCodegen: only the attributes the original reads."""

    def __init__(self, name):
        self.name = name

    def matches(self, target):
        return True

    def lower(self, mod, target, *, compile_device):
        return f"duck:{mod}:{compile_device}"


def duck_typed_entry(api, mods):
    duck = Duck("duck")
    return [api.register("llvm", duck) is duck, api.allowed(LLVM), api.resolve(LLVM) is duck,
            api.resolve(LLVM).lower("mod", LLVM, compile_device=True)]


def lazy_one_path_per_kind(api, mods):
    first = mods.add("first", lambda: api.register("opencl", api.DeviceCodegen("first")))
    second = mods.add("second", lambda: api.register("opencl", api.DeviceCodegen("second")))
    api.register_lazy("opencl", first)
    api.register_lazy("opencl", second)
    return [list(mods.imports), api.allowed(OPENCL), api.allowed(OPENCL), list(mods.imports)]


def lazy_new_path_after_load(api, mods):
    first = mods.add("first", lambda: api.register("opencl", api.DeviceCodegen("first")))
    second = mods.add("second", lambda: api.register("opencl", api.DeviceCodegen("second")))
    api.register_lazy("opencl", first)
    seen = [api.allowed(OPENCL)]
    api.register_lazy("opencl", second)
    seen.append(api.allowed(OPENCL))
    api.register_lazy("opencl", first)  # already imported: Python's module cache, no new entries
    return [*seen, api.allowed(OPENCL), list(mods.imports)]


def lazy_missing_module_raw_and_retried(api, mods):
    api.register_lazy("opencl", FAKE_PREFIX + "missing")
    first = attempt(lambda: api.allowed(OPENCL))
    second = attempt(lambda: api.resolve(OPENCL))
    good = mods.add("good", lambda: api.register("opencl", api.DeviceCodegen("good")))
    api.register_lazy("opencl", good)
    return [first, second, api.allowed(OPENCL)]


def lazy_module_error_raw_and_retried(api, mods):
    def body():
        raise RuntimeError("backend failed to initialize")

    api.register_lazy("opencl", mods.add("broken", body))
    return [attempt(lambda: api.allowed(OPENCL)), attempt(lambda: api.allowed(OPENCL)), list(mods.imports)]


def lazy_after_prior_miss(api, mods):
    late = mods.add("late", lambda: api.register("opencl", api.DeviceCodegen("late"), override=True))
    miss = attempt(lambda: api.resolve(OPENCL))
    api.register_lazy("opencl", late)
    return [miss, api.resolve(OPENCL).name, list(mods.imports)]


def lower_modes_and_inputs(api, mods):
    seen = []

    def build(mod, target):
        seen.append(target)
        return ["built", mod]

    codegen = api.DeviceCodegen("x", build=build)
    return [codegen.lower("not an IRModule", LLVM, compile_device=True), seen[0] is LLVM,
            attempt(lambda: codegen.lower("mod", LLVM, compile_device=False)),
            attempt(lambda: api.DeviceCodegen("y").lower("mod", OPENCL, compile_device=True))]


def global_func_codegens(api, mods):
    missing = api.global_func("codegen_cache_parity.missing")
    echo = api.global_func("codegen_cache_parity.echo")
    return [missing.__name__, missing.__qualname__, attempt(lambda: missing("mod", "target")),
            echo("mod", "target")]


SCENARIOS = [
    order_and_identity, duplicate_name, override_moves_to_end, no_codegen_message, none_match_message,
    predicate_raw_value, predicate_raises, duck_typed_entry, lazy_one_path_per_kind, lazy_new_path_after_load,
    lazy_missing_module_raw_and_retried, lazy_module_error_raw_and_retried, lazy_after_prior_miss,
    lower_modes_and_inputs, global_func_codegens,
]

MISSING = FAKE_PREFIX + "missing"
# What the original gives (recorded from it; test_original_gives_expected checks them again).
EXPECTED: dict[str, list] = {
    "order_and_identity": [True, ["a", "b"], True, []],
    "duplicate_name": [("raises", "ValueError", "Device codegen 'a' is already registered for target kind 'cuda'", None),
                       ["a"]],
    "override_moves_to_end": [True, ["z", "a"], True, "new", ["z", "a", "new"]],
    "no_codegen_message": [[], ("raises", "ValueError",
                                "No device codegen registered for target 'opencl'. Available: <none>.", None)],
    "none_match_message": [["only80"], [], ("raises", "ValueError",
                           "No device codegen registered for target 'cuda'. Available: only80, never.", None)],
    "predicate_raw_value": ["yes", 0, True, ["yes"], "yes"],
    "predicate_raises": [("raises", "KeyError", "'boom'", None), ("raises", "KeyError", "'boom'", None)],
    "duck_typed_entry": [True, ["duck"], True, "duck:mod:True"],
    "lazy_one_path_per_kind": [[], ["second"], ["second"], ["second"]],
    "lazy_new_path_after_load": [["first"], ["first", "second"], ["first", "second"], ["first", "second"]],
    "lazy_missing_module_raw_and_retried": [
        ("raises", "ModuleNotFoundError", f"No module named '{MISSING}'", MISSING),
        ("raises", "ModuleNotFoundError", f"No module named '{MISSING}'", MISSING),
        ["good"],
    ],
    "lazy_module_error_raw_and_retried": [("raises", "RuntimeError", "backend failed to initialize", None),
                                          ("raises", "RuntimeError", "backend failed to initialize", None),
                                          ["broken", "broken"]],
    "lazy_after_prior_miss": [("raises", "ValueError",
                               "No device codegen registered for target 'opencl'. Available: <none>.", None),
                              "late", ["late"]],
    "lower_modes_and_inputs": [
        ["built", "not an IRModule"], True,
        ("raises", "ValueError", "Device codegen 'x' for target 'llvm' does not support lowering without compilation", None),
        ("raises", "ValueError", "Device codegen 'y' for target 'opencl' does not support lowering with compilation", None),
    ],
    "global_func_codegens": ["build", "global_func_device_codegen.<locals>.build",
                             ("raises", "ValueError", "Cannot find global function codegen_cache_parity.missing", None),
                             "echo:mod:target"],
}


@pytest.fixture(scope="module", autouse=True)
def echo_global_func():
    tvm_ffi.register_global_func("codegen_cache_parity.echo", lambda mod, target: f"echo:{mod}:{target}", override=True)


def same(observed, expected, *, prefix: bool) -> bool:
    """Equal, except that our messages may add text after the original's."""
    if isinstance(expected, tuple) and expected[:1] == ("raises",) and isinstance(observed, tuple):
        return (observed[:2] == expected[:2] and observed[3:] == expected[3:]
                and (observed[2].startswith(expected[2]) if prefix else observed[2] == expected[2]))
    if isinstance(expected, list) and isinstance(observed, list) and len(observed) == len(expected):
        return all(same(o, e, prefix=prefix) for o, e in zip(observed, expected))
    return observed == expected


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_ours_gives_the_originals_results(scenario, fake_modules, cache):
    with cc.use_cache(cache):
        observed = scenario(ours(), fake_modules)
    assert same(observed, EXPECTED[scenario.__name__], prefix=True), observed


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_original_gives_expected(scenario, fake_modules, monkeypatch):
    source, why = original_source()
    if source is None:
        pytest.skip(why)
    observed = scenario(original(source, monkeypatch), fake_modules)
    assert same(observed, EXPECTED[scenario.__name__], prefix=False), observed


# ---- issue #14, one test per difference found ------------------------------------------------


def test_1_override_removes_the_old_entry_and_appends_the_new_one_at_the_end():
    reg = DeviceCodegenRegistry()
    reg.register("cuda", DeviceCodegen("a", build=_const("a")))
    z = reg.register("cuda", DeviceCodegen("z", build=_const("z")))
    a2 = reg.register("cuda", DeviceCodegen("a", build=_const("a2")), override=True)
    assert reg.registered("cuda") == [z, a2]
    assert reg.resolve("cuda") is z


def test_2_one_lazy_path_per_kind_and_raw_import_errors_retried(fake_modules):
    reg = DeviceCodegenRegistry()
    reg.register_lazy("opencl", fake_modules.add("old", lambda: reg.register("opencl", DeviceCodegen("old"))))
    reg.register_lazy("opencl", MISSING)  # replaces the first path: "old" is never imported
    for _ in range(2):  # still registered after a failure: the next call imports again
        with pytest.raises(ModuleNotFoundError, match=f"^No module named '{MISSING}'$") as info:
            reg.allowed("opencl")
        assert info.value.name == MISSING
    assert fake_modules.imports == []


def test_3_messages_start_with_the_originals_wording():
    reg = DeviceCodegenRegistry()
    with pytest.raises(ValueError, match=r"^No device codegen registered for target 'opencl'\. Available: <none>\. "):
        reg.resolve("opencl")
    reg.register("cuda", DeviceCodegen("only80", supports_target=lambda t: False))
    with pytest.raises(ValueError, match=r"^No device codegen registered for target 'cuda'\. Available: only80\. "
                                         r'None of them accepts target \{"kind":"cuda"'):
        reg.resolve("cuda")
    with pytest.raises(ValueError, match=r"^Device codegen 'only80' is already registered for target kind 'cuda'\. "
                                         r"Pass override=True"):
        reg.register("cuda", DeviceCodegen("only80"))


def test_4_lower_of_a_non_irmodule_goes_to_the_codegen_with_or_without_a_cache(cache):
    codegen = DeviceCodegen("x", build=lambda mod, target: ("built", mod))
    with cc.use_cache(None):
        assert codegen.lower("placeholder", LLVM, compile_device=True) == ("built", "placeholder")
    with cc.use_cache(cache):
        assert codegen.lower("placeholder", LLVM, compile_device=True) == ("built", "placeholder")
        assert codegen.lower("placeholder", LLVM, compile_device=True) == ("built", "placeholder")
    stats = cache.stats(shared=False)
    assert (stats.uncacheable, stats.misses, stats.hits, stats.stores) == (2, 0, 0, 0)
    assert cc.last_outcome().tier == "uncached" and cc.last_outcome().key == ""


def test_5_matches_returns_the_predicates_own_value():
    marker = object()
    assert DeviceCodegen("x", supports_target=lambda t: marker).matches(LLVM) is marker
    assert DeviceCodegen("x", supports_target=lambda t: None).matches(LLVM) is None
    assert DeviceCodegen("x").matches(LLVM) is True


def test_6_duck_typed_entries_are_registered_resolved_and_lowered_by_themselves(cache):
    reg = DeviceCodegenRegistry()
    duck = Duck("duck")
    assert reg.register("llvm", duck) is duck
    assert reg.resolve("llvm") is duck
    assert reg.allowed({"kind": "llvm"}) == ["duck"]
    # Through a cache that resolves it: the entry's own lower runs, nothing is keyed or stored.
    resolving = cc.CodegenCache(cache.directory, registry=reg, write_behind=False)
    assert resolving.lower(tvm.IRModule(), "llvm", compile_device=False) == "duck:{}:False".format(tvm.IRModule())
    assert resolving.stats(shared=False).uncacheable == 1
    resolving.close()


def test_7_global_func_codegen_raises_tvm_ffis_error_for_an_unknown_name_with_a_hint():
    build = global_func_device_codegen("target.build.does_not_exist")
    assert (build.__name__, build.__qualname__) == ("build", "global_func_device_codegen.<locals>.build")
    with pytest.raises(ValueError, match="^Cannot find global function target.build.does_not_exist") as info:
        build(tvm.IRModule(), LLVM)
    assert str(info.value) == "Cannot find global function target.build.does_not_exist"  # tvm_ffi's, unchanged
    assert "'target.build.llvm'" in info.value.__notes__[0]


# ---- the deliberate difference (issue #16) ------------------------------------------------------


@pytest.mark.parametrize("value", [1, "False", None])
def test_compile_device_must_be_a_bool_unlike_the_original(value, cache):
    codegen = DeviceCodegen("x", build=_const("compiled"), build_without_compile=_const("source"))
    with cc.use_cache(cache), pytest.raises(TypeError, match=f"compile_device must be a bool, got {value!r}"):
        codegen.lower(tvm.IRModule(), LLVM, compile_device=value)


def test_the_original_takes_any_truthy_compile_device(monkeypatch):
    source, why = original_source()
    if source is None:
        pytest.skip(why)
    api = original(source, monkeypatch)
    codegen = api.DeviceCodegen("x", build=_const("compiled"), build_without_compile=_const("source"))
    assert codegen.lower("mod", LLVM, compile_device="False") == "compiled"
    assert codegen.lower("mod", LLVM, compile_device=None) == "source"
