"""What a clean import of this TVM installs: the baseline the `registered` key part is a difference from.

A helper process (this module run with -m, in a session of its own, with the cache switched
off) runs `import tvm` and reads every slot a compile reads (_state.py); then it imports the
TVM modules the asking process has imported, nothing of the user's, and reports the slots
those imports added and each module's digest. A slot that `import tvm` sets is compared with
what `import tvm` put there: importing a TVM module may register over it (tvm.target.intrin puts
its own lowering rule on tirx.exp), and a process that imported such a module compiles another
program, so that slot is a difference whichever process took the clean state first. A slot a
TVM module adds (a global function of meta_schedule, disco or a contrib package) is compared
with what that module's import put there: a process that did not import it cannot read it. A
module's digest does not depend on what else was imported. It is taken once per install (the
`tvm_install` digest and this package's version name the file), kept as JSON in the user's
`codegen-cache-tvm` cache directory (beside the install digests, _install.py;
~/.cache/codegen-cache-tvm on Linux), and merged when a process has imported TVM modules the
file does not cover yet. Nothing in the file is code: a damaged or planted file can only make
keys differ (misses), never run anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import xxhash

from .._config import tvm_state_directory
from .._errors import UncacheableError
from .._forksafe import renew_after_fork
from .._log import warn_once
from .._version import __version__
from ._install import write_json

__all__ = ["Baseline", "directory", "load"]

logger = logging.getLogger(__name__)

_TIMEOUT = 120.0
# The code that reads and fingerprints the state: a file taken by other code is not compared.
_READERS = ("_state.py", "_identity.py", "_baseline.py")
_lock = threading.Lock()
renew_after_fork(globals(), "_lock", threading.Lock)


class Baseline:
    """A clean import's state: `slots` (label -> fingerprint after `import tvm`), `added` (the slots
    the imports of `modules` added) and `modules` (name -> digest)."""

    __slots__ = ("added", "modules", "slots")

    def __init__(self, slots: dict[str, str], added: dict[str, str], modules: dict[str, str]) -> None:
        self.slots = slots
        self.added = added
        self.modules = modules

    def clean(self, label: str) -> str | None:
        """The clean fingerprint of slot `label` (module docstring); None where no import sets it."""
        found = self.slots.get(label)
        return found if found is not None else self.added.get(label)


_loaded: dict[str, Baseline] = {}


def directory() -> Path:
    """Where clean states and install digests are kept (_config.tvm_state_directory)."""
    return tvm_state_directory()


def load(install: str, needed: list[str], imported: list[str]) -> Baseline:
    """The baseline of this install covering the modules `needed`; taken by a helper process over
    every module `imported` here (in import order) where none kept covers them."""
    with _lock:
        held = _loaded.get(install)
        if held is not None and all(name in held.modules for name in needed):
            return held
        path = directory() / f"{install}-{__version__}-{_readers_digest()}.json"
        kept = _read(path)
        if kept is not None and all(name in kept.modules for name in needed):
            _loaded[install] = kept
            return kept
        # In the order they were imported here (sys.modules' order): some of TVM's modules import
        # only after others, as in any process that imported them.
        modules = list(dict.fromkeys([*imported, *needed, *(kept.modules if kept is not None else ()),
                                      *(held.modules if held else ())]))
        with _one_taker(path):
            # A pool's workers start together: one takes it, the others read what it wrote.
            kept = _read(path)
            if kept is not None and all(name in kept.modules for name in needed):
                taken = kept
            else:
                taken = _take(modules)
                _write(path, taken)
        _loaded[install] = taken
        return taken


@contextlib.contextmanager
def _one_taker(path: Path):
    """Hold `.lock` of that directory (flock: released if the holder dies) while the clean state is taken;
    without it (a directory that cannot be written), go on unlocked."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + _TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise _unavailable("another process has been taking TVM's clean state for too long") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


@functools.cache
def _readers_digest() -> str:
    digest = xxhash.xxh3_64()
    for name in _READERS:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()


def _read(path: Path) -> Baseline | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    slots, added, modules = data.get("slots"), data.get("added"), data.get("modules")
    if not isinstance(slots, dict) or not isinstance(added, dict) or not isinstance(modules, dict):
        return None
    if not all(isinstance(v, str) for v in (*slots.values(), *added.values(), *modules.values())):
        return None
    return Baseline(slots, added, modules)


def _write(path: Path, baseline: Baseline) -> None:
    write_json(path, {"slots": baseline.slots, "added": baseline.added, "modules": baseline.modules},
               "TVM's clean state")


def _take(modules: list[str]) -> Baseline:
    """Run the helper process over `modules`; UncacheableError where it gives no baseline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEGEN_CACHE_")}
    env["CODEGEN_CACHE_DISABLE"] = "1"  # a clean import: the start-up hook must not enable the switch
    request = json.dumps({"path": [p for p in sys.path if isinstance(p, str)], "modules": modules})
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=request, capture_output=True, text=True,
                              env=env, timeout=_TIMEOUT, start_new_session=True, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise _unavailable(str(err)) from err
    if done.returncode != 0:
        raise _unavailable(f"the helper process exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        data = json.loads(done.stdout)
        return Baseline(dict(data["slots"]), dict(data["added"]), dict(data["modules"]))
    except (ValueError, KeyError, TypeError) as err:
        raise _unavailable(f"the helper process's reply is not a baseline ({err})") from err


def _unavailable(reason: str) -> UncacheableError:
    warn_once(logger, "tvm-state-unavailable", "codegen cache: cannot learn what a clean import of TVM installs "
              "(%s); whole compiles run without the model-level cache", reason)
    return UncacheableError("TVM's clean state", reason, "see the warning above")


def _main() -> None:
    request = json.loads(sys.stdin.read())
    sys.path[:] = request["path"]
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    import tvm  # noqa: F401  the slots of `import tvm` alone (module docstring)

    from . import _state

    slots = _state.read_slots(None)  # `import tvm`'s own (module docstring)
    failed = []
    for name in request["modules"]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  a module the asking process imported may not import alone
            failed.append(name)
    # A module that does not import alone has no clean digest: "" differs from any digest, so a
    # process that imported it keys that module's state (a miss at worst, never a wrong hit).
    modules = {**dict.fromkeys(failed, ""), **_state.read_modules()}
    added = {label: fp for label, fp in _state.read_slots(None).items() if label not in slots}
    json.dump({"slots": slots, "added": added, "modules": modules}, sys.stdout)


if __name__ == "__main__":
    _main()
