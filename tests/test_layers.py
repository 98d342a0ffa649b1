"""The package's layers import only downward, and no module imports another in a cycle."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "codegen_cache"


def _imports() -> dict[str, set[str]]:
    """Module -> package modules it imports (relative imports, function-level ones included)."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = path.name == "__init__.py"
        tree = ast.parse(path.read_text())
        typing_only = {id(node) for branch in ast.walk(tree)
                       if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
                       for node in ast.walk(branch)}
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = module.split(".") if package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for name in [target] + [f"{target}.{alias.name}" for alias in node.names]:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module and not name.startswith(module + "."):
                    graph[module].add(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    seen: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        seen.add(node)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt in stack:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in seen and (found := visit(nxt)):
                return found
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in seen and (found := visit(start)):
            return found
    return None


def test_no_module_imports_another_in_a_cycle():
    graph = _imports()
    assert "codegen_cache._cache._cache" in graph  # the walk found the package
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_registry_and_the_context_import_no_cache():
    graph = _imports()
    for module in ("codegen_cache._registry", "codegen_cache._context"):
        assert not {m for m in graph[module] if m.startswith(("codegen_cache._cache", "codegen_cache._storage"))}


def test_layers_contract_holds():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(lint).exists():
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    done = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
