"""The commands that only read or tidy a cache directory start without TVM (as `ccache -s` does):
--version, config, stats, ls, show, verify, clear, prune. What the CLI, the package and the cache
layer import when they are imported must not import TVM; `_compat` imports it on first use."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache import _compat

SRC = Path(__file__).resolve().parents[1] / "src" / "codegen_cache"
# What a maintenance command imports: the package, the CLI, and what its commands import when run.
ROOTS = ("codegen_cache", "codegen_cache._cli._main", "codegen_cache._cli._commands", "codegen_cache._cli._inventory",
         "codegen_cache._cli._stats_report", "codegen_cache._cache._cache", "codegen_cache._storage._disk")
# The names _compat defines without TVM; every other name of its __all__ imports TVM when read.
TVM_FREE = {"module_property_mask", "require_installed"}
TVM_NAMES = set(_compat.__all__) - TVM_FREE


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in SRC.rglob("*.py")}


def _import_time_nodes(tree: ast.Module):
    """Nodes that run when the module is imported: not function bodies, not `if TYPE_CHECKING:` blocks."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(node.decorator_list if not isinstance(node, ast.Lambda) else [])
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, package: bool, node: ast.ImportFrom) -> list[str]:
    base = module.split(".") if package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    target = ".".join(base + ([node.module] if node.module else []))
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def _closure_problems(roots) -> tuple[set[str], list[str]]:
    """(modules imported at import time from `roots`, what among them reads a TVM name at import)."""
    modules = _modules()
    seen: set[str] = set()
    problems: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]  # parent packages run first
        path = modules[name]
        for node in _import_time_nodes(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(SRC)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and node.level:
                targets = _resolve(name, path.name == "__init__.py", node)
                todo += targets
                if targets[0].endswith("._compat"):
                    problems += [f"{where} from _compat import {a.name}" for a in node.names if a.name in TVM_NAMES]
                if targets[0].endswith("._compat._tvm") or any(t.endswith("._compat._tvm") for t in targets[1:]):
                    problems.append(f"{where} imports _compat._tvm")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_compat"
                  and node.attr in TVM_NAMES):
                problems.append(f"{where} reads _compat.{node.attr} at import")
    return seen, problems


def test_what_the_maintenance_commands_import_reads_no_tvm_name_at_import():
    seen, problems = _closure_problems(ROOTS)
    assert {"codegen_cache._cache._cache", "codegen_cache._registry", "codegen_cache._key"} <= seen  # the walk works
    assert problems == [], "read TVM names as _compat.<name> inside functions: " + ", ".join(problems)


def test_the_import_walk_sees_a_tvm_name_bound_at_import(tmp_path, monkeypatch):
    # A module that binds a TVM name at import, as `from .._compat import Target` does, is found.
    seen, problems = _closure_problems(["codegen_cache._cli._demo_kernels"])
    assert "codegen_cache._cli._demo_kernels" in seen
    assert any("from _compat import tvm" in p for p in problems), problems


def test_a_tvm_name_of_compat_is_the_one_tvm_has():
    import tvm

    assert _compat.Target is tvm.target.Target and _compat.tvm is tvm
    assert set(_compat.__all__) >= {"Target", "IRModule", "Module", "tvm", "tvm_ffi"}
    with pytest.raises(AttributeError, match="no_such_name"):
        _compat.no_such_name  # noqa: B018


def test_lazy_package_names_are_the_modules_own():
    from codegen_cache import _build, _switch

    assert cc.enable is _switch.enable and cc.build is _build.build and cc.main.__module__ == "codegen_cache._cli._main"
    with pytest.raises(AttributeError, match="no_such_name"):
        cc.no_such_name  # noqa: B018


# ---- in a fresh interpreter: the commands themselves -------------------------------------------------

_RUN = """
import json, sys
from codegen_cache._cli import main
code = main(json.loads(sys.argv[1]))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tvm", "tvm_ffi", "tilelang"))
print(json.dumps({"code": code, "tvm": loaded}))
"""

COMMANDS = (["--version"], ["config"], ["stats"], ["stats", "-v"], ["ls"], ["show", "KEY"], ["show", "KEY", "--code"],
            ["verify"], ["prune", "--older-than", "30d"], ["prune", "--max-size", "1G"], ["clear", "--failures"],
            ["clear"])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache directory with a C source entry and a remembered failure, and the entry's key."""
    import kernels

    root = tmp_path_factory.mktemp("cli-imports") / "cache"
    cache = cc.CodegenCache(root, write_behind=False)
    _module, outcome = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vmul, "c"), compile_device=False)
    cache.close()
    return root, outcome.key


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_maintenance_commands_never_import_tvm(cache_dir):
    root, key = cache_dir
    for argv in COMMANDS:
        argv = [a.replace("KEY", key[:12]) for a in argv]
        done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(["--dir", str(root), *argv])],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result == {"code": 0, "tvm": []}, (argv, result, done.stdout[-2000:])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_command_that_lowers_still_imports_tvm(cache_dir):
    # The check above can fail: `explain` needs TVM, and the same probe sees it imported.
    root, _key = cache_dir
    kernels = str(Path(__file__).parent / "kernels.py")
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(["--dir", str(root), "explain", kernels,
                                                                   "--kernel", "vmul", "--target", "c",
                                                                   "--mode", "source"])],
                          capture_output=True, text=True, timeout=240)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "tvm" in result["tvm"], (result, done.stderr[-2000:])


_HOOKED = """
import sys
import _codegen_cache_startup
_codegen_cache_startup.install()  # what codegen_cache_enable.pth does with CODEGEN_CACHE_ENABLE set
{body}
print("enabled" if codegen_cache.is_enabled() else "off")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("body", [
    "import codegen_cache\ncodegen_cache.enable()",  # TVM first imported by a module enable() imports
    "import codegen_cache\ncodegen_cache.CodegenCache(sys.argv[1]).key_for",  # by _compat, outside any import
])
def test_the_start_up_hook_enables_when_codegen_cache_imports_tvm_itself(body, tmp_path):
    code = _HOOKED.format(body=body if "key_for" not in body else body + "\ncodegen_cache._compat.Target")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True,
                          timeout=240, env={**__import__("os").environ, "CODEGEN_CACHE_ENABLE": "1",
                                            "CODEGEN_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0 and done.stdout.strip().endswith("enabled"), done.stdout + done.stderr[-2000:]
