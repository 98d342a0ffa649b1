"""CodegenCache reads as one class: the package's other modules use its public methods and its
small interface for the package's own layers (counters, scratch_dir, has_entry, entry_blob,
tier_plan), never its private attributes."""

from __future__ import annotations

import ast
from pathlib import Path

import codegen_cache as cc
from codegen_cache._cache import _cache

SRC = Path(_cache.__file__).resolve().parents[1]


def _private_names() -> set[str]:
    """Every private attribute of CodegenCache: in its class body and set by its methods."""
    names = {n for n in vars(cc.CodegenCache) if n.startswith("_") and not n.startswith("__")}
    for node in ast.walk(ast.parse(Path(_cache.__file__).read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            names.add(node.attr)
    return names


def _reaches(node: ast.AST) -> bool:
    # `cache._x`, `self.cache._x`, `active._x`: an object that names a CodegenCache
    value = node.value
    name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
    return "cache" in name.lower() and name not in ("kernel_cache", "KernelCache")


def test_no_module_reaches_into_codegen_cache_private_attributes():
    private = _private_names()
    assert {"_stats", "_stores", "_flight", "_stage", "_memory"} <= private  # what collaborators used to read
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == Path(_cache.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private and _reaches(node):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: .{node.attr}")
    assert found == []


def test_the_interface_for_the_package_layers(tmp_path, llvm_vadd):
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time=0)
    _module, outcome = cache.lower_with_outcome(*llvm_vadd, compile_device=True)
    assert cache.has_entry("compiled", outcome.key) and not cache.has_entry("compiled", "0" * 32)
    assert cache.entry_blob("compiled", outcome.key) == cache.store("compiled").get(outcome.key)
    assert cache.counters.local().misses == 1
    assert Path(cache.scratch_dir()).is_dir() and cache.scratch_dir() == cache.scratch_dir()
    assert cache.tier_plan("llvm", "compiled").disk
    cache.close()
