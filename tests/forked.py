"""Scripts run in another process that starts with TVM imported: a child of a forkserver.

For tests whose point is that another process sees what one left (a cache directory, exported
files), not that an interpreter starts: importing TVM takes seconds, a fork milliseconds. The
forkserver (multiprocessing's, one per test session) imports PRELOAD once, before any cache or
switch exists, so every child starts as a fresh interpreter would be after those imports: no
cache object, no switch, no entry in memory. A child gets the environment, working directory
and argv it is given, runs the script as __main__, and ends as a multiprocessing child does
(threading's exit hooks run; atexit's do not: tests of how a process ends use real interpreters).
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).parent
PRELOAD = ["numpy", "tvm", "tvm.s_tir", "tvm.relax", "tvm.script", "codegen_cache"]
_context: list = []


def _forkserver():
    if not _context:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _context.append(context)
    return _context[0]


def _child(argv: list[str], env: dict[str, str], cwd: str | None, out: str, err: str) -> None:
    # Descriptors 1 and 2 themselves, so that what TVM and LLVM write from C++ is captured too.
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as an interpreter would, by its traceback and exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def python(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `argv` (a script path and its arguments, or "-c", code, arguments) in a forked child;
    its CompletedProcess (stdout and stderr as text). A child still running at `timeout` is killed
    and subprocess.TimeoutExpired raised, as subprocess.run does."""
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="forked-") as scratch:
        out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        process = _forkserver().Process(target=_child, args=(list(argv), env, None if cwd is None else str(cwd), out, err))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, Path(out).read_text(), Path(err).read_text())
        code = process.exitcode
        process.close()
        return subprocess.CompletedProcess(argv, code, Path(out).read_text(errors="replace"),
                                           Path(err).read_text(errors="replace"))
