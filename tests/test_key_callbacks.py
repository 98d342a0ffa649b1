"""Callbacks TVM's codegens call are keyed by what they are: real hooks, real processes."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tvm
import tvm_ffi

import codegen_cache as cc
from codegen_cache import _switch
import hooks
import kernels
from codegen_cache.codegens import _callbacks, _pyfunc, cuda, gpu_source
from conftest import CUDA_TARGET
from cuda_stub import build_stub

POSTPROC = "tvm_callback_cuda_postproc"
TESTS = str(Path(__file__).parent)


@pytest.fixture
def cuda_add():
    return cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)


def _libraries_callbacks() -> set[str]:
    names = set()
    for lib in sorted((Path(tvm.__file__).parent / "lib").glob("libtvm*.so")):
        names |= {m.decode() for m in re.findall(rb"tvm_callback_[A-Za-z0-9_]+", lib.read_bytes())}
    return names


def test_the_callback_table_is_the_list_in_tvms_libraries():
    found = _libraries_callbacks()
    assert found, "no tvm_callback_* name in the installed TVM's libraries"
    table = {name for name in _callbacks.CALLBACKS if name.startswith("tvm_callback_")}
    assert found == table, f"TVM's libraries call {sorted(found)}; codegens/_callbacks.CALLBACKS has {sorted(table)}"


def test_every_python_global_the_codegen_libraries_name_is_in_the_table_or_excluded():
    import tvm.relax  # noqa: F401  registers relax's Python globals, so they are checked too
    import tvm.s_tir.meta_schedule  # noqa: F401
    import tvm.support.nvcc  # noqa: F401
    import tvm.support.rocm  # noqa: F401

    strings = set()
    for lib in ("libtvm_compiler.so", "libtvm_runtime_cuda.so"):
        data = (Path(tvm.__file__).parent / "lib" / lib).read_bytes()
        strings |= {m.decode() for m in re.findall(rb"[A-Za-z_][\w.]{3,}", data)}
    # tvm_ffi reports no metadata (type schema) for a function registered from Python.
    # TVM's own target.build.<kind> functions lose their metadata once codegen_cache.disable() has
    # registered them back over the switch's router (from Python): C++ functions, not callbacks.
    routed = {f"target.build.{kind}" for kind in _switch._ROUTED_KINDS}
    python = {name for name in tvm_ffi.registry.list_global_func_names()
              if name in strings and name not in routed and tvm_ffi.get_global_func_metadata(name) == {}}
    assert all(_pyfunc.python_callable(tvm_ffi.get_global_func(name)) is not None for name in python)
    assert {"tirx.intrinsics.cuda.get_codegen", "tvm_callback_libdevice_path"} <= python
    unknown = sorted(name for name in python if name not in _callbacks.CALLBACKS
                     and not any(fnmatch.fnmatch(name, pattern) for pattern in _callbacks.EXCLUDED_GLOBALS))
    assert not unknown, f"Python globals TVM's codegen libraries call, neither keyed nor excluded: {unknown}"


def test_tvms_python_registrations_are_in_the_table():
    root = Path(tvm.__file__).parent
    registered = set()
    for path in root.rglob("*.py"):
        registered |= set(re.findall(r"register_global_func\(\s*\"(tvm_callback_\w+)\"", path.read_text("utf-8", "replace")))
        registered |= set(re.findall(r"register_global_func\s*\ndef (tvm_callback_\w+)", path.read_text("utf-8", "replace")))
    assert registered and registered <= set(_callbacks.CALLBACKS)


# (kind, target, kernel, compile_device): every built-in codegen that runs on this machine.
RUNNABLE = [
    ("cuda", CUDA_TARGET, "vadd_gpu", False),
    ("opencl", {"kind": "opencl"}, "vadd_gpu", False),
    ("metal", {"kind": "metal"}, "vadd_gpu", False),
    ("webgpu", {"kind": "webgpu"}, "vadd_gpu", False),
    ("nvptx", {"kind": "nvptx"}, "vadd_gpu", True),
    ("rocm", {"kind": "rocm"}, "vadd_gpu", True),
    ("llvm", "llvm", "vadd", True),
    ("llvm", "llvm", "vadd", False),
    ("c", "c", "vadd", False),
]


@pytest.mark.timeout(120)
def test_every_callback_a_codegen_calls_is_a_part_of_its_key(cache):
    import tvm.support.nvcc  # noqa: F401  registers TVM's own callbacks
    import tvm.support.rocm  # noqa: F401

    called: list[str] = []

    def recorder(name, previous):
        def hook(*args):
            called.append(name)
            return previous(*args) if previous is not None else args[0]

        return hook

    stack = []
    for name in _callbacks.CALLBACKS:
        ctx = hooks.registered(name, recorder(name, tvm_ffi.get_global_func(name, allow_missing=True)))
        ctx.__enter__()
        stack.append(ctx)
        cc.declare_callback_salt(name, "recorder")  # it closes over a list: not keyable by itself
    seen = {}
    try:
        for kind, target, kernel, compile_device in RUNNABLE:
            mod, tgt = cc.prepare_for_codegen(getattr(kernels, kernel), target)
            parts = cache.key_for(mod, tgt, compile_device=compile_device).as_dict()["toolchain"]
            keyed = {n.split(":", 1)[1] for n in json.loads(parts) if n.startswith("callback:")}
            called.clear()
            try:
                cc.resolve_device_codegen(tgt).invoke(mod, tgt, compile_device=compile_device)
            except (RuntimeError, ValueError):
                pass  # a toolkit missing here (libdevice, ROCm): the callbacks it reached still count
            seen[(kind, compile_device)] = set(called)
            assert set(called) <= keyed, f"{kind} ({compile_device=}) called {sorted(called)}; keyed {sorted(keyed)}"
    finally:
        for ctx in reversed(stack):
            ctx.__exit__(None, None, None)
    # The recorder did see the callbacks where they are reached (so the check above can fail).
    assert seen[("cuda", False)] == {POSTPROC, "tirx.intrinsics.cuda.header_generator"}
    assert seen[("opencl", False)] == {"tvm_callback_opencl_postproc"}
    assert seen[("metal", False)] == {"tvm_callback_metal_compile"}
    assert "tvm_callback_libdevice_path" in seen[("nvptx", True)]


def _tagging_hook(tag):
    def hook(code, target):
        return code + f"\n// {tag}\n"

    return hook


def test_a_reregistered_hook_is_never_served_from_memory(cache, cuda_add):
    mod, target = cuda_add
    with hooks.declared(POSTPROC, _tagging_hook("X"), "tag-X"):
        first, o1 = cache.lower_with_outcome(mod, target, compile_device=False)
        assert "// X" in first.inspect_source("") and o1.tier == "codegen"
    with hooks.registered(POSTPROC, _tagging_hook("Y")):
        # Another registration: X's declaration does not carry over to it.
        second, o2 = cache.lower_with_outcome(mod, target, compile_device=False)
        assert "// Y" in second.inspect_source("") and o2.tier == "uncached"
        cc.declare_callback_salt(POSTPROC, "tag-Y")
        third, o3 = cache.lower_with_outcome(mod, target, compile_device=False)
        assert "// Y" in third.inspect_source("") and "// X" not in third.inspect_source("") and o3.tier == "codegen"
    # X again, as a new function object declared the same: X's own source.
    with hooks.declared(POSTPROC, _tagging_hook("X"), "tag-X"):
        again, o4 = cache.lower_with_outcome(mod, target, compile_device=False)
        assert o4.tier == "memory" and "// X" in again.inspect_source("")
    none, o5 = cache.lower_with_outcome(mod, target, compile_device=False)
    assert o5.tier == "codegen" and "// " not in none.inspect_source("").rsplit("}", 1)[-1]


SUFFIX = "// a global"


class _Config:
    suffix = "// object"

    def tag(self, code, target):
        return code + self.suffix


def _hooks_of_every_kind():
    """name -> a hook: each kind of callable a user may register; none of them keyable by itself."""
    import functools
    import textwrap as tw

    config = _Config()
    tag = "// a cell"

    class Callable:
        def __call__(self, code, target):
            return code

    def plain(code, target):
        return code + "\n// plain\n"

    def reads_global(code, target):
        return code + SUFFIX

    def reads_cell(code, target):
        return code + tag

    def reads_environment(code, target):
        return code + os.environ.get("CGC_TEST_SUFFIX", "")

    def reads_a_file(code, target):
        return code + Path(__file__).read_text()[:0]

    return {
        "plain function": plain,
        "function reading a global": reads_global,
        "closure": reads_cell,
        "function reading the environment": reads_environment,
        "function reading a file": reads_a_file,
        "lambda": lambda code, target: code,
        "functools.partial": functools.partial(lambda suffix, code, target: code + suffix, ""),
        "textwrap.dedent (a standard library function)": lambda code, target: tw.dedent(code),
        "C++ function": tvm_ffi.get_global_func("testing.echo"),
        "bound method": config.tag,
        "callable object": Callable(),
    }


@pytest.mark.parametrize("kind", sorted(_hooks_of_every_kind()))
def test_a_users_hook_of_any_kind_is_uncacheable_until_a_salt_is_declared_with_one_warning(
        tmp_path, cuda_add, caplog, kind):
    mod, target = cuda_add
    hook = _hooks_of_every_kind()[kind]
    cache = cc.CodegenCache(tmp_path, write_behind=False)
    with hooks.registered(POSTPROC, hook), caplog.at_level(logging.WARNING, logger="codegen_cache"):
        with pytest.raises(cc.UncacheableError, match=r"tvm_callback_cuda_postproc.*declare_callback_salt"):
            cache.key_for(mod, target, compile_device=False)
        for _ in range(3):
            module, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
            assert outcome.tier == "uncached" and "__global__" in module.inspect_source("")
        stats = cache.stats(shared=False)
        assert (stats.uncacheable, stats.hits, stats.stores) == (3, 0, 0)
        assert list(cache.store("source").keys()) == []
        warnings = [r for r in caplog.records if "tvm_callback_cuda_postproc" in r.getMessage()]
        assert len(warnings) == 1 and "declare_callback_salt" in warnings[0].getMessage()
        cc.declare_callback_salt(POSTPROC, f"{kind}-v1")
        assert cache.lower_with_outcome(mod, target, compile_device=False)[1].tier == "codegen"
        assert cache.lower_with_outcome(mod, target, compile_device=False)[1].tier == "memory"


HELPER = """SUFFIX = {suffix!r}


def suffix():
    return SUFFIX
"""
READING_PROCESS = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    sys.path.insert(0, {helper_dir!r})
    import tvm_ffi
    import codegen_cache as cc, kernels
    import helper

    def postproc(code, target):  # the same code in every process; what it reads differs
        if {reads!r} == "environment":
            return code + "\\n// " + os.environ["CGC_HOOK_TAG"] + "\\n"
        if {reads!r} == "a module attribute":
            return code + "\\n// " + helper.SUFFIX + "\\n"
        return code + "\\n// " + helper.suffix() + "\\n"

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postproc, override=True)
    if {salt!r}:  # its author says what its output depends on
        cc.declare_callback_salt("tvm_callback_cuda_postproc", "tag-" + os.environ["CGC_HOOK_TAG"])
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    module, outcome = cc.CodegenCache({cache!r}, write_behind=False).lower_with_outcome(mod, target, compile_device=False)
    print(json.dumps([outcome.tier, module.inspect_source("").strip().splitlines()[-1]]))
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reads", ["environment", "a module attribute", "a call into a module"])
@pytest.mark.slow
def test_processes_whose_hook_reads_state_the_key_cannot_see_each_get_their_own_output(tmp_path, reads):
    # The attack: the same hook code in two processes, its output decided by what it
    # reads when called. Before: the second process got the first one's source from disk.
    def run(tag, salt=False):
        helper_dir = tmp_path / f"helper-{tag}"
        helper_dir.mkdir(exist_ok=True)
        (helper_dir / "helper.py").write_text(HELPER.format(suffix=tag))
        script = READING_PROCESS.format(tests=TESTS, helper_dir=str(helper_dir), reads=reads, salt=salt,
                                        cache=str(tmp_path / "cache"))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=200,
                              env={**os.environ, "CGC_HOOK_TAG": tag})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert [run(tag) for tag in ("A", "B", "A")] == [["uncached", "// A"], ["uncached", "// B"], ["uncached", "// A"]]
    # Declared by what it reads: each state its own entry.
    assert [run(tag, salt=True) for tag in ("A", "B", "A", "B")] == [
        ["codegen", "// A"], ["codegen", "// B"], ["disk", "// A"], ["disk", "// B"]]


def test_tvms_own_hooks_are_told_from_users_without_reading_tvm_ffi_objects(monkeypatch):
    # Public API first: TVM's decorator leaves the registered Function at its module; with the
    # raw read unavailable (an unknown tvm-ffi layout), TVM's own hooks are keyed the same.
    import tvm.support.nvcc  # noqa: F401

    names = [n for n in _callbacks.TVM_HOMES if tvm_ffi.get_global_func(n, allow_missing=True) is not None]
    assert {"tvm_callback_libdevice_path", "tirx.intrinsics.cuda.get_codegen"} <= set(names)
    expected = {name: _callbacks.callback_identity(name) for name in names}
    assert all(identity.startswith(f"tvm {cc._compat.tvm_version()}: ") for identity in expected.values())
    monkeypatch.setattr(_pyfunc, "_layout", lambda: None)
    monkeypatch.setattr(_callbacks, "_known", {})
    assert {name: _callbacks.callback_identity(name) for name in names} == expected
    with hooks.registered(POSTPROC, _tagging_hook("Z")):  # a user's: never misidentified
        with pytest.raises(cc.UncacheableError, match="a user's function"):
            _callbacks.callback_identity(POSTPROC)


def test_tvm_code_around_a_users_function_is_a_users_hook(monkeypatch):
    # A function in TVM's files that closes over values (a wrapper made around a user's
    # function) is not TVM's own: the values came from elsewhere.
    from codegen_cache.codegens import _owner

    def users(code, target):
        return code

    def wrapper(code, target):
        return users(code, target)

    monkeypatch.setattr(_owner, "TVM_DIR", os.path.dirname(__file__) + os.sep)  # as if this file were TVM's
    assert _owner.owner_name(tvm_ffi.convert(users), _owner.TVM_DIR) is not None  # no closure: "TVM's"
    assert _owner.owner_name(tvm_ffi.convert(wrapper), _owner.TVM_DIR) is None
    assert _owner.owner_name(tvm_ffi.convert(wrapper), _owner.TVM_DIR, closures=True) is not None  # tilelang's rule


def test_the_python_callable_behind_a_function_is_found_and_a_cpp_one_is_not():
    # The raw read of tvm-ffi's Function objects (_pyfunc.py): this fails when the layout changes.
    hook = _tagging_hook("W")
    assert _pyfunc._layout() is not None, "tvm-ffi's Function layout is not recognized: update _pyfunc.py"
    assert _pyfunc.python_callable(tvm_ffi.convert(hook)) is hook
    assert _pyfunc.python_callable(tvm_ffi.get_global_func("testing.echo")) is None
    assert _pyfunc.python_callable(tvm_ffi.get_global_func("target.build.cuda")) is None


def test_tvms_own_callbacks_are_keyed_by_module_and_version():
    import tvm.support.nvcc  # noqa: F401

    identity = _callbacks.callback_identity("tvm_callback_libdevice_path")
    assert identity == f"tvm {cc._compat.tvm_version()}: tvm.support.nvcc.find_libdevice_path"


def test_codegen_cache_build_follows_the_hook_and_steps_aside_for_an_uncacheable_one(cache):
    target = tvm.target.Target(CUDA_TARGET)
    with cc.use_cache(cache):
        with hooks.declared(POSTPROC, _tagging_hook("X"), "tag-X"):
            assert "// X" in cc.build(kernels.vadd_gpu, target).imports[0].inspect_source("")
        with hooks.declared(POSTPROC, _tagging_hook("Y"), "tag-Y"):
            assert "// Y" in cc.build(kernels.vadd_gpu, target).imports[0].inspect_source("")
            assert cc.build_key(kernels.vadd_gpu, target) is not None
        config = _Config()
        with hooks.registered(POSTPROC, config.tag):
            assert cc.build_key(kernels.vadd_gpu, target) is None
            for _ in range(2):
                module, record = cc.build_with_record(kernels.vadd_gpu, target)
                assert record.tier == "uncached" and module.imports[0].inspect_source("").endswith("// object")
    assert cache.stats(shared=False).uncacheable == 2


def test_a_declared_salt_makes_a_callback_cacheable_for_that_registration_only(cache, cuda_add):
    mod, target = cuda_add
    config = _Config()
    with hooks.registered(POSTPROC, lambda code, target: code + config.suffix):
        cc.declare_callback_salt(POSTPROC, "object-suffix-v1")
        key = cache.key_for(mod, target, compile_device=False)
        assert key.as_dict()["toolchain"].count("declared:object-suffix-v1") == 1
        cache.lower(mod, target, compile_device=False)
        assert cache.lower_with_outcome(mod, target, compile_device=False)[1].tier == "memory"
    # Another registration under the name: the declaration does not carry over.
    with hooks.registered(POSTPROC, lambda code, target: code + config.suffix):
        with pytest.raises(cc.UncacheableError):
            cache.key_for(mod, target, compile_device=False)


@pytest.mark.parametrize("args, match", [
    (("tvm_callback_nonexistent", "v1"), "Unknown callback 'tvm_callback_nonexistent'"),
    ((POSTPROC, ""), "salt must be a non-empty str"),
    (("tvm_callback_Trainium_compile", "v1"), "No function is registered under 'tvm_callback_Trainium_compile'"),
])
def test_declare_callback_salt_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        cc.declare_callback_salt(*args)


HOOK_PROCESS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import tvm_ffi
    import codegen_cache as cc, kernels

    def postproc(code, target):
        return code + "\\n// hook {tag}\\n"

    tvm_ffi.register_global_func("tvm_callback_cuda_postproc", postproc, override=True)
    cc.declare_callback_salt("tvm_callback_cuda_postproc", "hook-{tag}")
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    module, outcome = cc.CodegenCache({cache!r}, write_behind=False).lower_with_outcome(mod, target, compile_device=False)
    print(outcome.tier, module.inspect_source("").strip().splitlines()[-1])
    """
)


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_two_processes_with_different_hooks_get_their_own_source(tmp_path):
    seeds = iter(range(1, 5))

    def run(tag):
        # Another PYTHONHASHSEED each time: no key part may depend on it.
        script = HOOK_PROCESS.format(tests=TESTS, cache=str(tmp_path / "cache"), tag=tag)
        env = {**os.environ, "PYTHONHASHSEED": str(next(seeds))}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=200, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    assert run("X") == ["codegen", "//", "hook", "X"]
    assert run("Y") == ["codegen", "//", "hook", "Y"]  # before: X's source, from disk
    assert run("X") == ["disk", "//", "hook", "X"]
    assert run("Y") == ["disk", "//", "hook", "Y"]


def test_builtin_codegens_declare_callbacks_from_the_table():
    declared = set(cuda.CALLBACKS) | {n for names in gpu_source.CALLBACKS.values() for n in names}
    assert declared <= set(_callbacks.CALLBACKS)


@pytest.fixture
def intrinsic_table():
    """TVM's CUDA intrinsic codegen table; entries a test adds are removed afterwards."""
    from tvm.backend.cuda.codegen import registry

    before = dict(registry.CODEGEN_REGISTRY)
    yield registry
    registry.CODEGEN_REGISTRY.clear()
    registry.CODEGEN_REGISTRY.update(before)


def test_a_users_cuda_intrinsic_codegen_is_uncacheable_until_a_salt_is_declared(cache, cuda_add, intrinsic_table):
    from tvm.backend.cuda.codegen import register_codegen

    mod, target = cuda_add
    before = cache.key_for(mod, target, compile_device=False)
    assert before.as_dict()["toolchain"].count('"cuda_intrinsics":"tvm"') == 1

    @register_codegen("codegen_cache_test_op")
    def first(x):
        return x

    with pytest.raises(cc.UncacheableError, match="CUDA intrinsic codegen for 'tirx.codegen_cache_test_op'"):
        cache.key_for(mod, target, compile_device=False)
    assert cache.lower_with_outcome(mod, target, compile_device=False)[1].tier == "uncached"
    # Declared for the lookup function the codegen calls: keyed by the salt.
    cc.declare_callback_salt("tirx.intrinsics.cuda.get_codegen", "my-intrinsics-v1")
    try:
        declared = cache.key_for(mod, target, compile_device=False)
        assert declared != before
        assert '"cuda_intrinsics":"declared:my-intrinsics-v1"' in declared.as_dict()["toolchain"]
    finally:  # this declaration only: TVM's get_codegen stays registered for the process
        _callbacks._declared.pop(tvm_ffi.get_global_func("tirx.intrinsics.cuda.get_codegen").__chandle__())


STUB_DRIVER_PROCESS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import tvm_ffi
    import tvm.support.nvcc  # noqa: F401  TVM's own tvm_callback_cuda_compile
    import codegen_cache as cc, kernels
    from codegen_cache import _compat
    from codegen_cache.codegens import _callbacks
    assert _compat.cuda_runtime_available(), "stub libcuda did not load TVM's CUDA runtime"
    called = []

    def recorder(name, previous):
        def hook(*args):
            called.append(name)
            return previous(*args) if previous is not None else args[0]
        return hook

    for name in _callbacks.CALLBACKS:
        tvm_ffi.register_global_func(name, recorder(name, tvm_ffi.get_global_func(name, allow_missing=True)),
                                     override=True)
        cc.declare_callback_salt(name, "recorder")
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
    entry = cc.resolve_device_codegen(target)
    out = {{}}
    for compile_device in (False, True):
        del called[:]
        module = entry.invoke(mod, target, compile_device=compile_device)
        keyed = sorted(n.split(":", 1)[1] for n in entry.toolchain(target, compile_device) if n.startswith("callback:"))
        out[str(compile_device)] = [module.kind, sorted(set(called)), keyed]
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.timeout(300)
@pytest.mark.slow
@pytest.mark.nvcc
def test_with_a_cuda_runtime_loaded_cuda_codegens_call_only_keyed_callbacks(tmp_path):
    # TVM's CUDA runtime loaded (a stub libcuda.so.1): target.build.cuda would compile through
    # tvm_callback_cuda_compile; the built-in codegens must never get there.
    stub = build_stub(tmp_path / "stub")
    if stub is None:
        pytest.skip("gcc or libcudart.so.13 is missing: cannot build the stub CUDA driver")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    done = subprocess.run([sys.executable, "-c", STUB_DRIVER_PROCESS.format(tests=TESTS)], env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for mode, (kind, called, keyed) in out.items():
        assert kind == "cuda" and POSTPROC in called, (mode, called)
        assert "tvm_callback_cuda_compile" not in called
        assert set(called) <= set(keyed), (mode, called, keyed)


@pytest.mark.parametrize("compile_device", [False, True])
def test_the_memoized_cuda_toolchain_follows_every_input_on_the_next_call(intrinsic_table, monkeypatch, compile_device):
    from tvm.backend.cuda.codegen import register_codegen

    target = tvm.target.Target(CUDA_TARGET)

    def toolchain():
        return cuda._cuda_toolchain(target, compile_device)

    base = toolchain()
    assert toolchain() is base  # nothing changed: the memoized answer, encoded key tail reused
    tag = "// one"

    def hook(code, target):
        return code + tag

    with hooks.registered(POSTPROC, hook):
        with pytest.raises(cc.UncacheableError):
            toolchain()  # a user's hook: no key until its salt is declared
        cc.declare_callback_salt(POSTPROC, "memo-test-v1")
        hooked = toolchain()
        assert hooked[f"callback:{POSTPROC}"] == "declared:memo-test-v1" and hooked != base
        assert toolchain() is hooked
        tag = "// two"  # what it reads changed: its author says so with a new salt
        cc.declare_callback_salt(POSTPROC, "memo-test-v2")
        assert toolchain()[f"callback:{POSTPROC}"] == "declared:memo-test-v2"
    with hooks.registered(POSTPROC, hook):  # registered anew: the declaration does not carry over
        with pytest.raises(cc.UncacheableError):
            toolchain()
    assert toolchain() == base
    if compile_device:
        monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DMEMO_TEST")
        assert toolchain()["env:NVCC_APPEND_FLAGS"] == "-DMEMO_TEST"
        monkeypatch.setenv("PATH", "/nonexistent-memo-test")
        monkeypatch.delenv("CUDA_PATH", raising=False)
        assert toolchain()["nvcc_path"] != base["nvcc_path"] or base["nvcc_path"] == "none"

    @register_codegen("codegen_cache_memo_test_op")
    def op(x):
        return x

    with pytest.raises(cc.UncacheableError, match="CUDA intrinsic codegen"):
        toolchain()  # an entry added to TVM's intrinsic table is seen at once
