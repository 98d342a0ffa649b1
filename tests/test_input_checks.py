"""Bad input at every public entry gets a clear error naming the argument and what is accepted."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import codegen_cache as cc
import kernels


@pytest.mark.parametrize("value", ["no", "false", "0", 1, None, []])
def test_compile_device_must_be_a_bool_everywhere(cache, llvm_vadd, value):
    mod, target = llvm_vadd
    codegen = cc.resolve_device_codegen(target)
    for call in (lambda: codegen.lower(mod, target, compile_device=value),
                 lambda: cache.lower(mod, target, compile_device=value),
                 lambda: cache.lower_with_outcome(mod, target, compile_device=value),
                 lambda: cache.key_for(mod, target, compile_device=value)):
        with pytest.raises(TypeError, match=r"compile_device must be (a bool|True or False), got "):
            call()


def test_key_for_needs_an_irmodule(cache, llvm_vadd):
    with pytest.raises(TypeError, match="key_for expects a tvm.IRModule, got NoneType"):
        cache.key_for(None, llvm_vadd[1], compile_device=True)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"settings": "x"}, "settings must be a codegen_cache.Settings or None, got str"),
    ({"directory": 42}, r"directory must be a path \(str or os.PathLike\) or None, got int"),
    ({"write_behind": "yes"}, "write_behind must be True or False"),
    ({"registry": {}}, "registry must be a DeviceCodegenRegistry or None, got dict"),
])
def test_cache_constructor_arguments(tmp_path, kwargs, match):
    with pytest.raises(TypeError, match=match):
        cc.CodegenCache(**({"directory": tmp_path} | kwargs))


def test_a_settings_value_is_checked_like_the_variable(tmp_path):
    with pytest.raises(cc.ConfigError, match="invalid value -1 for memory_entries: expected a whole number"):
        cc.CodegenCache(tmp_path, memory_entries=-1)


@pytest.mark.parametrize("target", ["notatarget", {"kind": "nope"}])
def test_build_names_a_bad_target_as_prepare_for_codegen_does(target):
    with pytest.raises(ValueError, match=r"Invalid target .*expected a tvm.target.Target, a target dict") as built:
        cc.build(kernels.vadd, target)
    with pytest.raises(ValueError) as lowered:
        cc.prepare_for_codegen(kernels.vadd, target)
    assert str(built.value) == str(lowered.value)
    with pytest.raises(ValueError, match="Invalid target"):
        cc.build_key(kernels.vadd, target)


def test_build_target_of_the_wrong_type():
    with pytest.raises(TypeError, match="Invalid target 42 of type int: expected a tvm.target.Target"):
        cc.build(kernels.vadd, 42)


def test_use_cache_rejects_a_path():
    with pytest.raises(TypeError, match=r"use_cache expects a CodegenCache or None, got str \(for a directory: "
                                        r"use_cache\(CodegenCache\('/tmp/x'\)\)\)"):
        with cc.use_cache("/tmp/x"):
            pass


def test_registry_arguments():
    reg = cc.DeviceCodegenRegistry()
    with pytest.raises(TypeError, match="target_kind must be a target kind name such as 'cuda', got 1"):
        reg.register(1, cc.DeviceCodegen("x"))
    with pytest.raises(TypeError, match="codegen must be a DeviceCodegen .*got 'x' of type str"):
        reg.register("llvm", "x")
    with pytest.raises(TypeError, match="import_path must be a module name"):
        reg.register_lazy("opencl", None)
    with pytest.raises(TypeError, match="DeviceCodegen name must be a non-empty str, got 3"):
        cc.DeviceCodegen(3)
    with pytest.raises(TypeError, match="DeviceCodegen 'x': build must be callable or None, got 'target.build.llvm'"):
        cc.DeviceCodegen("x", build="target.build.llvm")
    assert reg.kinds() == []  # nothing half-registered


def test_a_failing_predicate_is_raised_unchanged_with_the_codegen_named():
    reg = cc.DeviceCodegenRegistry()

    def picky(target):
        raise KeyError("boom")

    reg.register("llvm", cc.DeviceCodegen("picky", build=lambda m, t: m, supports_target=picky))
    with pytest.raises(KeyError, match="boom") as info:
        reg.resolve("llvm")
    assert any("device codegen 'picky'" in note and "'llvm'" in note for note in info.value.__notes__)


def test_a_failing_lazy_module_is_raised_raw_and_logged_once_with_the_way_out(caplog):
    reg = cc.DeviceCodegenRegistry()
    reg.register_lazy("opencl", "no_such_module_for_issue16")
    with caplog.at_level(logging.DEBUG, logger="codegen_cache"):
        for _ in range(2):
            with pytest.raises(ModuleNotFoundError, match="^No module named 'no_such_module_for_issue16'$"):
                reg.resolve("opencl")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "'no_such_module_for_issue16'" in text and "'opencl'" in text and "a later register_lazy" in text
    reg.register_lazy("opencl", "json")  # a later path replaces it, and the kind works again
    assert reg.allowed("opencl") == []


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_mistyped_variable_is_warned_about_once_by_the_library(tmp_path):
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import codegen_cache as cc, kernels
        cc.build(kernels.vadd, "llvm")
        cc.build(kernels.vmul, "llvm")
        cc.CodegenCache(%r)
        print(cc.last_outcome().tier)
    """) % (os.path.dirname(kernels.__file__), str(tmp_path / "other"))
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache"), "CODEGEN_CACHE_DISABLED": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=200)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["codegen"]  # the cache ran: the typo disabled nothing
    assert done.stderr.count("CODEGEN_CACHE_DISABLED is set but is not a codegen-cache setting") == 1
    assert "(did you mean CODEGEN_CACHE_DISABLE?)" in done.stderr


def test_a_cache_directory_that_is_a_regular_file(capsys, monkeypatch, tmp_path):
    from codegen_cache._cli import _main as cli

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(blocker))
    with pytest.raises(cc.ConfigError, match=r"for directory \(CODEGEN_CACHE_DIR\): expected a directory \(this path "
                                             r"is a file\)"):
        cc.CodegenCache()
    assert cli.main(["stats"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "this path is a file" in err and "does not exist" not in err


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda c: c.flush(timeout=-1), ValueError, "timeout must be 0 or more seconds"),
    (lambda c: c.flush(timeout="30"), TypeError, "timeout must be a number of seconds or None, got '30'"),
    (lambda c: c.close(timeout=float("nan")), ValueError, "timeout must be 0 or more seconds"),
    (lambda c: c.clear(compiled="yes"), TypeError, "compiled must be True or False, got 'yes'"),
    (lambda c: c.stats(shared="x"), TypeError, "shared must be True or False"),
])
def test_cache_method_arguments(cache, call, error, match):
    with pytest.raises(error, match=match):
        call(cache)


def test_other_public_entries_name_the_bad_argument():
    with pytest.raises(TypeError, match=r"path must be a path \(str or os.PathLike\), got 42"):
        cc.probe_filesystem(42)
    with pytest.raises(TypeError, match=r"cache_dir must be a path \(str or os.PathLike\) or None, got 42"):
        cc.CachedBuild(42)
    with pytest.raises(TypeError, match="cache_options must be a mapping"):
        cc.CachedBuild(None, cache_options=["verify"])
    with pytest.raises(TypeError, match="cached_export expects a tvm.runtime.Module"):
        cc.cached_export(None)
    with pytest.raises(ValueError, match="max_workers must be a whole number of 1 or more"):
        cc.metaschedule_builder(None, max_workers=0)
    with pytest.raises(TypeError, match="global_func_name must be a TVM global function name"):
        cc.global_func_device_codegen(3)
