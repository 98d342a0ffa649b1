"""The switch is safe to leave on: CODEGEN_CACHE_ENABLE=1 costs nothing where nothing compiles, `import tvm`
never fails because of it, it works in every install, doctor tells when it cannot, and helper processes run
only the package's own code.

Fresh interpreters throughout: the start-up hook, the install modes and the helpers exist only there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache._cli import main
from codegen_cache._cli._doctor import HOOK_FILE, doctor
from codegen_cache._config import settings_from_env
from processes import START_UP_HOOK, environ, python, python_json
from workers import variant

ROOT = Path(__file__).resolve().parents[1]
needs_hook = pytest.mark.skipif(not START_UP_HOOK.exists(),
                                reason=f"no {START_UP_HOOK.name} for this interpreter (an install older than the "
                                       "package's editable-install support)")

MODULES = "import json, sys; print(json.dumps(sorted(sys.modules)))"


# ---- the switch costs nothing where nothing compiles ---------------------------------------------


@needs_hook
def test_the_variable_adds_one_small_module_to_a_process_that_never_imports_tvm():
    without = set(python_json(MODULES, env={"CODEGEN_CACHE_ENABLE": None}))
    with_var = set(python_json(MODULES, env={"CODEGEN_CACHE_ENABLE": "1"}))
    assert with_var - without == {"_codegen_cache_startup"}  # no importlib.abc, tempfile, pathlib, re, random
    assert without - with_var == set()


@needs_hook
def test_python_in_isolated_mode_starts_without_the_hook():
    done = subprocess.run([sys.executable, "-I", "-c", MODULES], capture_output=True, text=True, timeout=60,
                          env=environ(CODEGEN_CACHE_ENABLE="1"), check=True)
    assert "_codegen_cache_startup" not in json.loads(done.stdout)


@needs_hook
@pytest.mark.slow
def test_import_tvm_with_the_variable_imports_what_import_tvm_and_enable_import(tmp_path):
    env = {"CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    switched = set(python_json(f"import tvm\n{MODULES}", env={**env, "CODEGEN_CACHE_ENABLE": "1"}))
    enabled = set(python_json(f"import tvm, codegen_cache\ncodegen_cache.enable(children=False)\n{MODULES}",
                              env={**env, "CODEGEN_CACHE_ENABLE": None}))
    plain = set(python_json(f"import tvm, codegen_cache\n{MODULES}", env={**env, "CODEGEN_CACHE_ENABLE": None}))
    assert switched - enabled == {"_codegen_cache_startup", "_codegen_cache_turn_on"}  # the hook's two modules only
    # Beyond `import tvm; import codegen_cache` (the registry only): the cache layer and the switch,
    # and standard modules; no other package's (diskcache comes with the first store write,
    # platformdirs only where no directory is given).
    assert {m.split(".")[0] for m in switched - plain if not m.startswith("codegen_cache.")
            and m.split(".")[0] not in sys.stdlib_module_names and not m.startswith("_sysconfigdata")} == {
        "_codegen_cache_startup", "_codegen_cache_turn_on"}
    assert not (tmp_path / "cache").exists()  # enabling opens no store: the first compile does


# ---- import tvm never fails because of the cache --------------------------------------------------

# What a user's script does: import TVM, compile, run; and what the switch did.
COMPILE_AND_RUN = """
    import json, sys
    {before}
    import numpy as np
    import tvm
    from tvm import te

    a = te.placeholder((64,), name="a")
    f = tvm.compile(te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2, name="b")]), "llvm")
    x = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    y = tvm.runtime.tensor(np.zeros(64, "float32"))
    f(x, y)
    cc = sys.modules.get("codegen_cache")
    print(json.dumps({{"right": bool((y.numpy() == 2 * np.arange(64)).all()), "imported": cc is not None,
                      "enabled": bool(cc and cc.is_enabled())}}))
"""


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "codegen-cache:" in line]


@needs_hook
@pytest.mark.slow
@pytest.mark.parametrize(("case", "env", "before", "cause"), [
    ("a bad value of another setting", {"CODEGEN_CACHE_MEMORY_ENTRIES": "lots"}, "",
     "invalid value 'lots' for CODEGEN_CACHE_MEMORY_ENTRIES: expected a whole number of 0 or more"),
    ("garbage in the variable itself", {"CODEGEN_CACHE_ENABLE": "maybe"}, "",
     "invalid value 'maybe' for CODEGEN_CACHE_ENABLE: expected one of 1, 0, true, false, yes, no, on, off"),
    ("a cache directory that is a file", {"CODEGEN_CACHE_DIR": "{tmp}/a-file"}, "",
     "for directory (CODEGEN_CACHE_DIR): expected a directory (this path is a file)"),
    ("a package it cannot import", {}, "sys.modules['xxhash'] = None  # a dependency missing",
     "ModuleNotFoundError: import of xxhash halted"),
])
def test_import_tvm_steps_aside_with_one_warning_naming_the_cause_and_tvm_works(tmp_path, case, env, before, cause):
    (tmp_path / "a-file").write_text("not a directory")
    env = {"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache"),
           **{k: v.format(tmp=tmp_path) for k, v in env.items()}}
    done = python(COMPILE_AND_RUN.format(before=before), env=env)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["right"] and not found["enabled"], case
    (warning,) = _warnings(done.stderr)
    assert cause in warning and "TVM works without the cache" in warning and "Fix:" in warning, warning
    assert warning.startswith("<string>:"), "the warning points at the user's import statement"


@needs_hook
@pytest.mark.slow
def test_an_untrusted_directory_compiles_without_the_cache_with_one_warning(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by every user
    done = python(COMPILE_AND_RUN.format(before=""), env={"CODEGEN_CACHE_ENABLE": "1",
                                                          "CODEGEN_CACHE_DIR": str(shared / "cache")})
    assert json.loads(done.stdout.strip().splitlines()[-1])["right"]
    assert len([line for line in done.stderr.splitlines() if "not using" in line]) == 1, done.stderr


# A deployed model: a child in TVM's runtime-only mode loads a library built by its parent and runs it
# (as TVM's own test_dso_module_load does).
RUNTIME_ONLY_CHILD = """
    import json, sys
    import numpy as np
    import tvm

    f = tvm.runtime.load_module(sys.argv[1])
    x = tvm.runtime.tensor(np.arange(64, dtype="float32"))
    y = tvm.runtime.tensor(np.zeros(64, "float32"))
    f["main"](x, y)
    print(json.dumps({"right": bool((y.numpy() == 2 * np.arange(64)).all()),
                      "package": sorted(m for m in sys.modules if m.startswith("codegen_cache"))}))
"""


@needs_hook
@pytest.mark.slow
def test_a_runtime_only_tvm_loads_and_runs_a_model_as_without_the_package(tmp_path):
    library = tmp_path / "model.so"
    python(f"""
        import tvm
        from tvm import te
        a = te.placeholder((64,), name="a")
        func = te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2, name="b")]).with_attr("global_symbol", "main")
        tvm.compile(func, "llvm").export_library({str(library)!r})
    """, env={"CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache")})
    runs = {}
    for variable in (None, "1"):
        done = python(RUNTIME_ONLY_CHILD, str(library), env={"TVM_USE_RUNTIME_LIB": "1", "CODEGEN_CACHE_ENABLE": variable,
                                                             "CODEGEN_CACHE_DIR": str(tmp_path / "cache")})
        runs[variable] = (json.loads(done.stdout.strip().splitlines()[-1]), _warnings(done.stderr))
    assert runs["1"] == runs[None] == ({"right": True, "package": []}, [])


# ---- every install mode -------------------------------------------------------------------------

SWITCH_AT_IMPORT = """
    import json, sys
    import tvm
    cc = sys.modules.get("codegen_cache")
    print(json.dumps({"enabled": bool(cc and cc.is_enabled()), "package": cc and cc.__file__,
                      "hook": sys.modules["_codegen_cache_startup"].__file__ if "_codegen_cache_startup" in sys.modules
                      else None}))
"""


def _project_copy(tmp_path: Path) -> Path:
    """What an install needs of this checkout (no build/ or egg-info of its own left behind in the checkout)."""
    copy = tmp_path / "project"
    copy.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    return copy


def _run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["pip install .", "a wheel", "pip install -e ."])
def test_the_variable_turns_the_switch_on_in_every_install_mode(tmp_path, mode):
    project = _project_copy(tmp_path)
    venv = tmp_path / "venv"
    _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv))
    scratch = str(venv / "bin" / "python")
    site_packages = Path(_run(scratch, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # TVM and the other dependencies from this environment, after the scratch one (nothing downloaded but
    # the build backend): a path line adds the directory only, not the .pth files in it.
    (site_packages / "zz_this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CODEGEN_CACHE_"))}
    if mode == "a wheel":
        _run(scratch, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(project), env=env)
        (wheel,) = (tmp_path / "dist").glob("*.whl")
        # --force-reinstall: the same version is already installed in this environment (seen through the
        # path line above), and pip would otherwise leave the scratch venv without it.
        _run(scratch, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel), env=env)
    else:
        _run(scratch, "-m", "pip", "install", "-q", "--no-deps", *mode.split()[2:-1], str(project), env=env)
    assert (site_packages / HOOK_FILE).is_file()
    env["CODEGEN_CACHE_DIR"] = str(tmp_path / "cache")
    off = json.loads(_run(scratch, "-c", textwrap.dedent(SWITCH_AT_IMPORT), env=env).stdout.splitlines()[-1])
    on = json.loads(_run(scratch, "-c", textwrap.dedent(SWITCH_AT_IMPORT),
                         env={**env, "CODEGEN_CACHE_ENABLE": "1"}).stdout.splitlines()[-1])
    assert off == {"enabled": False, "package": None, "hook": None}
    assert on["enabled"] is True
    installed_from = project / "src" if mode == "pip install -e ." else site_packages
    assert Path(on["package"]).is_relative_to(installed_from) and Path(on["hook"]).is_relative_to(installed_from)
    if mode == "pip install -e .":
        # Without the .pth file (an install made by an older version), doctor says why the variable does nothing.
        (site_packages / HOOK_FILE).unlink()
        done = subprocess.run([scratch, "-m", "codegen_cache", "doctor", "--processes", "0"], capture_output=True,
                              text=True, timeout=600, env={**env, "CODEGEN_CACHE_ENABLE": "1"}, check=False)
        assert done.returncode != 0
        assert f"CODEGEN_CACHE_ENABLE is set but this interpreter reads no {HOOK_FILE}" in done.stdout, done.stdout


# ---- doctor tells when the switch, the directory or the remote cannot work ------------------------


def _problems(monkeypatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return doctor(settings_from_env(), processes=0)["problems"]


def test_doctor_tells_that_the_cache_directory_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    problems = _problems(monkeypatch, CODEGEN_CACHE_DIR=str(tmp_path / "file"))
    assert any(f"{tmp_path / 'file'} is a file, not a directory" in p for p in problems), problems


def test_doctor_tells_that_the_remote_cannot_be_reached(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    problems = _problems(monkeypatch, CODEGEN_CACHE_DIR=str(tmp_path / "cache"),
                         CODEGEN_CACHE_REMOTE=f"redis://127.0.0.1:{port}/0")
    assert any(f"the remote redis://127.0.0.1:{port}/0 cannot be reached (ConnectionRefusedError" in p
               for p in problems), problems


@needs_hook
def test_doctor_tells_that_a_runtime_only_tvm_keeps_the_switch_off(tmp_path, monkeypatch):
    problems = _problems(monkeypatch, CODEGEN_CACHE_DIR=str(tmp_path / "cache"), CODEGEN_CACHE_ENABLE="1",
                         TVM_USE_RUNTIME_LIB="1")
    assert any("TVM_USE_RUNTIME_LIB=1 makes TVM runtime-only" in p for p in problems), problems


@needs_hook
@pytest.mark.slow
def test_doctor_tells_why_import_tvm_leaves_the_switch_off(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    problems = _problems(monkeypatch, CODEGEN_CACHE_ENABLE="1", CODEGEN_CACHE_DIR=str(tmp_path / "file"))
    assert any(p.startswith("CODEGEN_CACHE_ENABLE is set but `import tvm` leaves the switch off: codegen-cache:")
               and "(this path is a file)" in p for p in problems), problems


@needs_hook
@pytest.mark.slow
def test_doctor_says_the_switch_works_where_it_does(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_ENABLE", "1")
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "cache"))
    report = doctor(settings_from_env(), processes=0)
    assert report["switch"]["probe"]["enabled"] and not report["switch"]["problems"]


@pytest.mark.parametrize("command", [["config"], ["doctor", "--processes", "0"]])
def test_a_garbage_enable_value_is_the_one_line_config_error_of_the_cli(monkeypatch, capsys, command):
    monkeypatch.setenv("CODEGEN_CACHE_ENABLE", "maybe")
    assert main(command) != 0
    assert capsys.readouterr().err.strip() == (
        "codegen-cache: error: invalid value 'maybe' for CODEGEN_CACHE_ENABLE: "
        "expected one of 1, 0, true, false, yes, no, on, off")


# ---- helper processes run only the package's own code ---------------------------------------------

PLANTED = "open({marker!r}, 'a').write({name!r} + '\\n')\nraise ImportError('planted {name} ran')\n"


def _plant(directory: Path, marker: Path, names: tuple[str, ...]) -> None:
    directory.mkdir()
    for name in names:
        (directory / f"{name}.py").write_text(PLANTED.format(marker=str(marker), name=f"{directory.name}/{name}"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_llvm_upgrader_ignores_modules_planted_in_the_working_directory_and_pythonpath(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    _plant(tmp_path / "cwd", marker, ("xxhash", "numpy", "diskcache", "codegen_cache"))
    _plant(tmp_path / "pythonpath", marker, ("xxhash", "numpy", "sitecustomize", "tvm"))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "pythonpath" / "numpy.py"))
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cache.lower(*variant(3), compile_device=True)
    assert cache.flush(upgrades=True, timeout=240)
    digest = cache.key_for(*variant(3)).digest
    assert b"llvm-so" in cache.store("compiled").get(digest)[-64:]  # the upgrade happened: a shared library
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_doctors_determinism_processes_ignore_modules_planted_in_the_working_directory(tmp_path, monkeypatch):
    from codegen_cache._cli._doctor import check_determinism

    marker = tmp_path / "ran"
    _plant(tmp_path / "cwd", marker, ("xxhash", "numpy", "codegen_cache"))
    _plant(tmp_path / "pythonpath", marker, ("xxhash", "sitecustomize"))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
    found = check_determinism(1)
    assert found["errors"] == [] and found["samples"], found
    assert not marker.exists(), marker.read_text()


def test_a_helpers_import_path_keeps_what_the_program_added_and_leaves_out_the_working_directory(tmp_path,
                                                                                                 monkeypatch):
    from codegen_cache._helper import import_path

    tvm_from_source = tmp_path / "tvm" / "python"
    tvm_from_source.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), str(tvm_from_source), "relative/dir", *sys.path])
    path = import_path()
    assert path[0] == str(Path(cc.__file__).resolve().parent.parent)  # the package's own root first
    assert str(tvm_from_source) in path
    assert "" not in path and str(tmp_path) not in path and "relative/dir" not in path


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH (-P) is Python 3.11's")
def test_warm_workers_never_import_a_standard_module_planted_in_the_working_directory(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "ran"
    _plant(tmp_path / "cwd", marker, ("pickle", "runpy", "struct"))
    monkeypatch.chdir(tmp_path / "cwd")
    kernels = str(ROOT / "tests" / "kernels.py")
    code = main(["--dir", str(tmp_path / "cache"), "warm", kernels, "-t", "c", "--kernel", "vadd", "--kernel", "vmul",
                 "-j", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "2 ran the codegen" in out, out
    assert not marker.exists(), marker.read_text()
    assert "PYTHONSAFEPATH" not in os.environ


@needs_hook
@pytest.mark.slow
def test_doctor_runs_and_tells_in_a_runtime_only_environment(tmp_path):
    done = subprocess.run([sys.executable, "-m", "codegen_cache", "doctor", "--processes", "0"], capture_output=True,
                          text=True, timeout=600, env=environ(CODEGEN_CACHE_ENABLE="1", TVM_USE_RUNTIME_LIB="1",
                                                              CODEGEN_CACHE_DIR=str(tmp_path / "cache")))
    assert done.returncode == 1, done.stderr[-3000:]
    assert "TVM_USE_RUNTIME_LIB=1 makes TVM runtime-only" in done.stdout
    assert "toolchain: TVM not usable here" in done.stdout
