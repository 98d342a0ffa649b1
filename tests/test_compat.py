"""The compatibility module: the only importer of TVM, on either TVM distribution."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from codegen_cache import _compat

SRC = Path(__file__).resolve().parents[1] / "src" / "codegen_cache"


def _tvm_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in ("tvm", "tvm_ffi", "tilelang")]
    return found


def _top_level_tvm_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    top = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
    found = []
    for node in top.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if node.__class__ is ast.ImportFrom and node.level:
            continue
        found += [f"{path.relative_to(SRC)}:{node.lineno} {n}" for n in names
                  if n.split(".")[0] in ("tvm", "tvm_ffi", "tilelang")]
    return found


def test_no_module_but_compat_imports_tvm_at_import_time():
    offenders = [hit for path in sorted(SRC.rglob("*.py")) if path.parent != SRC / "_compat"
                 for hit in _top_level_tvm_imports(path)]
    assert offenders == [], "import TVM names from codegen_cache._compat instead: " + ", ".join(offenders)


def test_the_import_check_sees_a_tvm_import(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("import tvm.tirx\nfrom tvm_ffi import Object\n")
    assert len(_tvm_imports(probe)) == 2


_BLOCKED = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tvm", "tvm_ffi", "tilelang"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
try:
    import codegen_cache
except ImportError as err:
    print("ImportError:", err)
else:
    print("imported")
"""


@pytest.mark.timeout(120)
def test_without_any_tvm_the_package_names_both_extras():
    done = subprocess.run([sys.executable, "-c", _BLOCKED], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("ImportError:"), out
    assert "tvm-codegen-cache[tvm]" in out and "tvm-codegen-cache[tilelang]" in out


def test_the_pipeline_comes_back_as_three_parts_on_either_tvm():
    passes, finalize_host, finalize_device = _compat.tir_pipeline("default")
    assert isinstance(passes, _compat.tvm.transform.Pass)
    assert isinstance(finalize_host(), _compat.tvm.transform.Pass)
    assert isinstance(finalize_device(), _compat.tvm.transform.Pass)


def test_the_tvm_salt_names_the_distribution():
    version = _compat.tvm_version()
    assert version.startswith(_compat.tvm.__version__ + "+")
    if _compat.DISTRIBUTION == "tilelang":
        import tilelang

        assert version.endswith(f"+tilelang-{tilelang.__version__}")
    else:
        assert "tilelang" not in version


def test_tilelang_enable_without_tilelang_names_the_extra():
    import codegen_cache.tilelang as cct

    if _compat.DISTRIBUTION == "tilelang":
        pytest.skip("tilelang's TVM is in use: enable() works here (tests/with_tilelang)")
    with pytest.raises(ImportError, match=r"tvm-codegen-cache\[tilelang\]"):
        cct.enable()
    assert not cct.is_enabled()
