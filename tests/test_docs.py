"""Every shell and Python block in docs/*.md runs, and the reference pages cover what the code has.

A page is a session: its blocks run in order, in one working directory, with one
CODEGEN_CACHE_DIR (so `codegen-cache stats` after `codegen-cache demo` sees the demo's entries).
The fence's info string says how a block runs:

    ```python                      run as a script (a fresh process)
    ```bash / ```sh                run as a bash script (-e -o pipefail)
    ```console                     each `$ ` line (with `\\` continuations) runs; the output
                                   shown is not compared (times and keys vary)
    ```python file=sweep.py        written to sweep.py in the working directory (not run):
                                   a file a later command uses
    ```console exit=3              the block (one bash -e shell) must exit with 3: its last
                                   command, the others succeeding
    ```bash needs=redis            skipped, with the reason, without redis-server (also: nvcc,
                                   gpu: a CUDA driver); with it, the page gets a server:
                                   CODEGEN_CACHE_REMOTE and `redis-cli` point at it
    ```python no-run: REASON       not run; the reason is required (use sparingly)

Blocks of other languages (text, conf, none) are not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from codegen_cache import _config, _key
from codegen_cache._artifacts import FORMAT_VERSION
from codegen_cache._cli import _main as _cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
SRC = Path(__file__).resolve().parent.parent / "src"
RUNNABLE = {"python", "bash", "sh", "console"}
NEEDS = {"nvcc", "redis", "gpu"}
_FENCE = re.compile(r"^```(\S*)[ \t]*([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
BLOCK_TIMEOUT = 280


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def option(self, name: str) -> str | None:
        match = re.search(rf"(?:^|\s){name}=(\S+)", self.info)
        return match.group(1) if match else None

    @property
    def no_run(self) -> str | None:
        match = re.match(r"no-run\b:?\s*(.*)", self.info)
        return match.group(1).strip() if match else None


def blocks() -> list[Block]:
    found = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        for match in _FENCE.finditer(text):
            found.append(Block(path.name, text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2).strip(),
                               match.group(3)))
    return found


BLOCKS = blocks()
RUN = [b for b in BLOCKS if b.lang in RUNNABLE]
# Each block runs in fresh interpreters that import TVM: all but one are in the slow tier. The
# default run runs SMOKE_PAGE's blocks up to its first command (with the files that command uses).
SMOKE_PAGE = "tvm.md"


def _tiered(blocks: list[Block]) -> list:
    params, smoke = [], True
    for block in blocks:
        marks = pytest.mark.smoke if block.page == SMOKE_PAGE and smoke else pytest.mark.slow
        if block.page == SMOKE_PAGE and block.option("file") is None:
            smoke = False
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


def _missing(need: str) -> str | None:
    """Why a block that needs `need` cannot run here (None: it can)."""
    if need == "nvcc":
        return None if shutil.which("nvcc") else "needs nvcc (not on PATH)"
    if need == "redis":
        return None if shutil.which("redis-server") else "needs redis-server (not on PATH)"
    if need == "gpu":
        from codegen_cache import _compat

        return None if _compat.runtime_enabled("cuda") else "needs a GPU (no CUDA driver loaded)"
    raise AssertionError(f"unknown need {need!r}")


class Page:
    """One page's session: a working directory, a cache directory, a bin/ with the commands."""

    def __init__(self, root: Path) -> None:
        self.cwd = root / "work"
        self.cwd.mkdir(parents=True)
        self.bin = bin_dir = root / "bin"
        bin_dir.mkdir()
        # The commands the docs name run this interpreter and these sources, installed or not.
        (bin_dir / "codegen-cache").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m codegen_cache "$@"\n')
        (bin_dir / "codegen-cache").chmod(0o755)
        # A shim, not a symlink: Python finds its virtual environment next to the path it was started by.
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python").chmod(0o755)
        self.env = {**os.environ, "CODEGEN_CACHE_DIR": str(root / "cache"),
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), str(self.cwd),
                                                                os.environ.get("PYTHONPATH")]))}
        for var in list(self.env):
            if var.startswith(_config.ENV_PREFIX) and var != "CODEGEN_CACHE_DIR":
                del self.env[var]
        self.redis = None

    def start_redis(self, tmp: Path) -> None:
        if self.redis is None:
            from redis_server import RedisServer

            tmp.mkdir(exist_ok=True)
            self.redis = RedisServer(tmp)
            # The page's `redis-cli ...` commands reach this server, as a reader's reach theirs.
            cli = shutil.which("redis-cli")
            if cli:
                (self.bin / "redis-cli").write_text(f'#!/bin/sh\nexec "{cli}" -p {self.redis.port} "$@"\n')
                (self.bin / "redis-cli").chmod(0o755)
            self.env["REDIS_PORT"] = str(self.redis.port)
            self.env["CODEGEN_CACHE_REMOTE"] = f"redis://127.0.0.1:{self.redis.port}/0"

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    made: dict[str, Page] = {}

    def get(name: str) -> Page:
        if name not in made:
            made[name] = Page(tmp_path_factory.mktemp(name.removesuffix(".md")))
        return made[name]

    yield get
    for page in made.values():
        page.close()


def console_commands(code: str) -> list[str]:
    """The commands of a console block: `$ ` lines, joined with their `\\` continuations."""
    commands, current = [], None
    for line in code.splitlines():
        if current is not None:
            current += "\n" + line
        elif line.startswith("$ "):
            current = line[2:]
        else:
            continue
        if not current.endswith("\\"):
            commands.append(current)
            current = None
    return commands


def _run(argv: list[str], page: Page, where: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=page.env, cwd=page.cwd,
                              timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: did not finish in {BLOCK_TIMEOUT} s")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", _tiered(RUN))
def test_doc_block_runs(block, pages, tmp_path):
    where = f"docs/{block.id}"
    if block.no_run is not None:
        pytest.skip(f"{where}: {block.no_run}")
    for need in filter(None, (block.option("needs") or "").split(",")):
        why = _missing(need)
        if why:
            pytest.skip(f"{where}: {why}")
    page = pages(block.page)
    if "redis" in (block.option("needs") or ""):
        page.start_redis(tmp_path / "redis")
    name = block.option("file")
    if name is not None:
        (page.cwd / name).write_text(block.code)
        return
    if block.lang == "python":
        script = page.cwd / f"block_{block.line}.py"  # TVMScript needs its source in a real file
        script.write_text(block.code)
        done = _run([sys.executable, str(script)], page, where)
        assert done.returncode == 0, f"{where}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return
    commands = [block.code] if block.lang in ("bash", "sh") else console_commands(block.code)
    assert commands, f"{where}: a console block with no `$ ` command"
    # One shell for the block (KEY=... on one line, $KEY on the next); -e stops at a failing
    # command, so the exit status is the first failure's, or the last command's.
    expected = int(block.option("exit") or 0)
    done = _run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(commands)], page, where)
    assert done.returncode == expected, (f"{where}: exited {done.returncode}, expected {expected}\n"
                                         f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def test_every_block_says_how_it_runs():
    for block in BLOCKS:
        words = block.info.split()
        if block.no_run is not None:
            assert block.no_run, f"docs/{block.id}: no-run needs a reason"
            continue
        for word in words:
            key, eq, value = word.partition("=")
            assert eq and key in ("needs", "file", "exit"), f"docs/{block.id}: unknown fence option {word!r}"
            if key == "needs":
                assert set(value.split(",")) <= NEEDS, f"docs/{block.id}: needs one of {sorted(NEEDS)}"
    assert not any("docs-test: skip" in p.read_text() for p in DOCS.glob("*.md")), "use a fence option instead"
    skipped = [b.id for b in RUN if b.no_run is not None]
    assert len(skipped) <= len(RUN) // 4, f"too many blocks that do not run: {skipped}"


def test_docs_have_runnable_examples():
    pages = {b.page for b in RUN if b.no_run is None}
    assert {"architecture.md", "key.md", "configuration.md", "recipes.md", "cli.md"} <= pages


def test_docs_show_the_current_artifact_format():
    for path in DOCS.glob("*.md"):
        text = path.read_text()
        for match in re.finditer(r"^\s+format\s+(\d+)\s*$", text, re.MULTILINE):
            assert int(match.group(1)) == FORMAT_VERSION, f"docs/{path.name} shows format {match.group(1)}"
        for match in re.finditer(r"^\| \d+ \| `format` \|[^|]*\| `(\d+)` \|", text, re.MULTILINE):
            assert int(match.group(1)) == FORMAT_VERSION, f"docs/{path.name} shows format {match.group(1)}"
        for match in re.finditer(r"codegen-cache:v(\d+):", text):
            assert int(match.group(1)) == FORMAT_VERSION, f"docs/{path.name} names remote keys v{match.group(1)}"


@pytest.mark.timeout(240)
@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("redis-cli")), reason="needs redis-server")
def test_remote_md_cleanup_command_deletes_the_caches_entries(tmp_path, llvm_vadd):
    """The `redis-cli --scan --pattern ... | xargs -r redis-cli unlink` of remote.md, run as written."""
    import codegen_cache as cc
    from redis_server import RedisServer

    command = re.search(r"`(redis-cli --scan --pattern '[^']*' \| xargs -r redis-cli unlink)`",
                        (DOCS / "remote.md").read_text()).group(1)
    server = RedisServer(tmp_path)
    try:
        cache = cc.CodegenCache(tmp_path / "cache", remote=server.url, remote_secret="s", write_behind=False)
        cache.lower(*llvm_vadd, compile_device=True)
        cache.close()
        with server.client() as client:
            client.set("unrelated", b"x")
            assert len(client.keys("*")) == 2  # the entry and ours
        shim = tmp_path / "bin"
        shim.mkdir()  # redis-cli on this server's port, as the page's command runs against the default one
        (shim / "redis-cli").write_text(f'#!/bin/sh\nexec "{shutil.which("redis-cli")}" -p {server.port} "$@"\n')
        (shim / "redis-cli").chmod(0o755)
        env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        with server.client() as client:
            assert client.keys("*") == [b"unrelated"]  # the cache's entries went, nothing else
    finally:
        server.close()


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


def _harness_block() -> Block:
    return next(b for b in RUN if b.page == "recipes.md" and "record_outcomes() as outcomes" in b.code)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("setting", "tier"), [("CODEGEN_CACHE_RECACHE", "codegen"), ("CODEGEN_CACHE_DISABLE", "uncached")])
@pytest.mark.slow
def test_the_harness_recipe_runs_with_recache_and_with_the_cache_off(tmp_path, setting, tier):
    script = tmp_path / "harness.py"
    script.write_text(_harness_block().code)
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache"), setting: "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=BLOCK_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "5 codegen runs" in done.stdout and f"{[tier] * 5}" in done.stdout


BENCHMARKS = DOCS.parent / "benchmarks"


def test_the_benchmarks_page_is_generated_short_and_has_every_suite():
    text = (DOCS / "benchmarks.md").read_text()
    assert "Generated by `python -m benchmarks all --write-docs`" in text
    # About 300 lines: the goal rows of eleven suites (rows without a goal stay in the JSON).
    assert len(text.splitlines()) <= 350, "docs/benchmarks.md holds the current figures only"
    suites = sorted(p.stem.removeprefix("suite_") for p in BENCHMARKS.glob("suite_*.py"))
    headings = re.findall(r"^## (\S+)$", text, re.MULTILINE)
    assert suites and set(suites) <= set(headings), f"suites {suites}, headings {headings}"
    assert (DOCS / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_links_into_the_benchmarks_page_name_its_sections():
    headings = set(re.findall(r"^## (\S+)$", (DOCS / "benchmarks.md").read_text(), re.MULTILINE))
    for path in [DOCS.parent / "README.md", *DOCS.glob("*.md")]:
        for anchor in re.findall(r"benchmarks\.md#([\w-]+)", path.read_text()):
            assert anchor in headings, f"{path.name} links to benchmarks.md#{anchor}, which the page does not have"


def test_readme_keeps_its_two_commands_and_the_headline_figures():
    text = (DOCS.parent / "README.md").read_text()
    assert "python -m pip install '.[tvm]' && codegen-cache demo" in text
    assert "python -m pip install '.[test]' && python -m pytest -q" in text
    table = text[text.index("<!-- headline figures"):text.index("<!-- end of headline figures -->")]
    assert table.count("\n| [") >= 3, "README's table of headline figures is empty: run --write-docs"
