"""How the package starts a Python helper process: it runs the package's own code, nothing the caller's directory holds.

`python -c ...` and `python -m ...` put the working directory first on sys.path, and PYTHONPATH,
PYTHONSTARTUP or PYTHONHOME in the environment decide what a new interpreter imports: an
`xxhash.py` or `numpy.py` in the directory where the user runs a script would be imported and run
by the helper (and the helper would then fail at its work). So a helper starts isolated
(`python -I`: no working directory, no user site, no PYTHON* variable; and no start-up hook of
this package, which reads CODEGEN_CACHE_ENABLE only outside isolated mode) and its first line sets
sys.path to an explicit list: this package's own root, then the entries this interpreter imports
from (its sys.path: PYTHONPATH's entries as read at its start, entries the program added),
without the working directory ('' or its path).

A helper that must see PYTHONHASHSEED (doctor's determinism check starts one per seed) cannot
run under -I, which ignores it: it starts with -s and an environment without any other PYTHON*
variable, and sets the same path before it imports anything (the working directory joins
sys.path only after start-up, where the first line replaces it).
"""

from __future__ import annotations

import os
import sys
import contextlib
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from ._forksafe import renew_after_fork

__all__ = ["helper_argv", "helper_env", "import_path", "spawned_without_working_directory"]

# The directory that holds the codegen_cache package (site-packages, or src/ of a checkout).
_OWN_ROOT = str(Path(__file__).resolve().parent.parent)


def import_path() -> list[str]:
    """The sys.path a helper gets: the package's root, then this interpreter's entries but the working directory.

    Left out: '' and relative entries (the working directory of whoever reads them: `-c` and
    the prompt put '' first) and the working directory itself (`-m` puts it first). Kept, in
    order: the script's directory, PYTHONPATH's entries as this interpreter read them at its
    start, entries the program added (a TVM built from source), site-packages.
    """
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed
        cwd = None
    path = [_OWN_ROOT]
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or entry in path:
            continue
        if cwd is not None and os.path.realpath(entry) == cwd and entry != _OWN_ROOT:
            continue
        path.append(entry)
    return path


def helper_argv(code: str, *args: str, hash_seed: bool = False) -> list[str]:
    """The command line of a helper that runs `code` (its argv[1:] are `args`).

    hash_seed=True: the helper keeps PYTHONHASHSEED (start it with helper_env(..., hash_seed=...)).
    """
    prelude = f"import sys; sys.path[:] = {import_path()!r}\n"
    flags = ["-s"] if hash_seed else ["-I"]
    return [sys.executable, *flags, "-c", prelude + code, *args]


def helper_env(environ: Mapping[str, str] | None = None, *, hash_seed: str | None = None) -> dict[str, str]:
    """`environ` (os.environ) without PYTHON* variables and CODEGEN_CACHE_ENABLE; PYTHONHASHSEED=hash_seed if given."""
    environ = os.environ if environ is None else environ
    env = {name: value for name, value in environ.items()
           if not name.startswith("PYTHON") and name != "CODEGEN_CACHE_ENABLE"}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    return env


_SAFE_PATH = "PYTHONSAFEPATH"
_safe_path_lock = threading.Lock()
renew_after_fork(globals(), "_safe_path_lock")


@contextlib.contextmanager
def spawned_without_working_directory() -> Iterator[None]:
    """Processes multiprocessing spawns inside the block do not put the working directory on sys.path.

    A spawned worker runs `python -c "from multiprocessing.spawn import spawn_main; ..."`: until
    multiprocessing hands it the parent's sys.path it imports the standard modules that bootstrap
    it with the working directory first (a `pickle.py` there would run). PYTHONSAFEPATH=1 (Python
    3.11 and later; -P) keeps it off. Set in os.environ for the block, as spawn passes no
    environment of its own; the `codegen-cache` commands that spawn workers run in a process of
    their own.
    """
    with _safe_path_lock:
        before = os.environ.get(_SAFE_PATH)
        os.environ[_SAFE_PATH] = "1"
    try:
        yield
    finally:
        with _safe_path_lock:
            if before is None:
                os.environ.pop(_SAFE_PATH, None)
            else:
                os.environ[_SAFE_PATH] = before
