"""The examples in docs/*.md run, and the reference pages cover what the code has.

Every ```python block in docs/*.md runs as its own script in a fresh process, with
CODEGEN_CACHE_DIR set to a temporary directory. A block preceded by the line
`<!-- docs-test: skip -->` is not run (a fragment, or one that needs a service).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codegen_cache import _config, _key
from codegen_cache._cli import _main as _cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
SKIP = "<!-- docs-test: skip -->"
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[tuple[str, int, str]]:
    """(file name, line, code) of every runnable python block."""
    blocks = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        for match in _FENCE.finditer(text):
            if match.group(1) != "python":
                continue
            before = text[: match.start()].rstrip().splitlines()
            if before and before[-1].strip() == SKIP:
                continue
            blocks.append((path.name, text.count("\n", 0, match.start()) + 1, match.group(2)))
    return blocks


BLOCKS = python_blocks()


@pytest.mark.parametrize(("name", "line", "code"), BLOCKS, ids=[f"{n}:{line}" for n, line, _c in BLOCKS])
def test_doc_example_runs(name, line, code, tmp_path):
    script = tmp_path / "example.py"  # TVMScript needs its source in a real file
    script.write_text(code)
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CODEGEN_CACHE_DISABLE", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=280)
    assert done.returncode == 0, f"docs/{name} line {line}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_docs_have_runnable_examples():
    files = {name for name, _line, _code in BLOCKS}
    assert {"architecture.md", "key.md", "configuration.md", "recipes.md", "cli.md"} <= files


def _text(name: str) -> str:
    return " ".join((DOCS / name).read_text().split())


def test_configuration_documents_every_variable_with_its_default():
    text = (DOCS / "configuration.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `CODEGEN_CACHE_")}
    assert sorted(rows) == sorted(_config.ENV_VARS)
    for var, row in rows.items():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == 4 and cells[1] and cells[2], f"{var}: default and accepted values are documented"


def test_key_doc_copies_the_exclusion_list():
    docstring = _key.__doc__
    excluded = docstring[docstring.index("Deliberately excluded"):].strip()
    assert " ".join(excluded.split()) in _text("key.md")


def test_cli_doc_covers_every_command_and_exit_code():
    text = (DOCS / "cli.md").read_text()
    parser = _cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    for command in commands:
        assert f"## {command}" in text, f"docs/cli.md has no section for {command}"
    for code in _cli.EXIT_CODES:
        assert re.search(rf"^\| {code} \|", text, re.MULTILINE), f"docs/cli.md does not list exit code {code}"


def test_architecture_has_its_picture():
    text = (DOCS / "architecture.md").read_text()
    for word in ("key", "memory", "disk", "remote", "build", "decode", "runtime.Module"):
        assert word in text
