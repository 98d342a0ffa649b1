"""Fixtures for the tests against real tilelang (skipped, with the reason, where it is not installed)."""

from __future__ import annotations

import pytest

import codegen_cache as cc
import codegen_cache.tilelang as cct
from codegen_cache import _compat

# Each test module starts with `pytest.importorskip("tilelang", reason=NO_TILELANG)`.
NO_TILELANG = ("tilelang is not installed (or the TVM in use is not its own): these tests run in an environment made "
               "with pip install torch==2.13.0 tilelang && pip install '.[tilelang,testing]' (docs/tilelang.md)")
if _compat.DISTRIBUTION != "tilelang":
    NO_TILELANG_MODULE = "tilelang_is_not_the_tvm_in_use"  # importorskip of a name that does not exist
else:
    NO_TILELANG_MODULE = "tilelang"

SM80 = {"kind": "cuda", "arch": "sm_80"}


@pytest.fixture(autouse=True)
def _tilelang_isolated(tmp_path, monkeypatch):
    """tilelang's own caches in tmp_path; our hooks removed after each test."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang-cache"))
    monkeypatch.setenv("TILELANG_PRINT_ON_COMPILATION", "0")
    yield
    cct.disable()


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "codegen-cache"


@pytest.fixture
def fresh_cache(cache_dir):
    """A new CodegenCache object on the test's directory each call (as a new process sees it)."""
    return lambda: cc.CodegenCache(cache_dir)
