"""What a process made by fork() must not inherit from its parent, and how the cache resets it.

fork() copies the memory of the calling thread's process but only that thread: a lock another
thread held stays held forever in the child, a queue keeps the parent's unfinished jobs, and a
file lock or a SQLite connection is shared with the parent. Each component registers what
its child must do (`on_fork_child`): forget the parent's jobs, locks and connections, start
its own when first used. `ForkGate` makes fork() wait until no thread of ours is inside
SQLite, whose own mutexes would otherwise be copied while held, and `BuildGate` until none is
inside a codegen (TVM's own mutexes and first-time statics). A lock of ours that a parent's
thread may hold at the fork is made anew in the child (`renew_after_fork`).

Imports need the same care, for any module: a module that another thread is importing at the
fork stays locked in the child for good (importlib's per-module lock, owned by a thread the
child does not have), and the child's first import of it hangs. The cache imports its codecs,
TVM's codegens and TVM names on first use, so a fork while another thread makes its first
`lower()` would leave such a child. fork() therefore also waits until no other thread is
importing, and a child made after that wait ran out forgets those half-done imports: its own
first import of the module runs it afresh.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["BuildGate", "ForkGate", "build_gate", "on_fork_child", "renew_after_fork", "sqlite_gate"]

logger = logging.getLogger(__name__)

_callbacks: list[Callable[[], Callable[[], None] | None]] = []
_callbacks_lock = threading.Lock()


def on_fork_child(callback: Callable[[], None]) -> None:
    """Run `callback` in every child process right after fork (a bound method is held weakly)."""
    if hasattr(callback, "__self__"):
        ref = weakref.WeakMethod(callback)  # type: ignore[arg-type]
    else:
        ref = lambda: callback  # noqa: E731 - a plain function lives as long as its module
    with _callbacks_lock:
        _callbacks.append(ref)


def renew_after_fork(namespace: dict[str, Any], name: str, factory: Callable[[], Any] = threading.Lock) -> None:
    """In every child of fork, `namespace[name]` becomes `factory()`: a lock (of a module's globals
    or a long-lived object's __dict__) that a thread of the parent may have held at the fork."""
    on_fork_child(lambda: namespace.__setitem__(name, factory()))


def _after_fork_in_child() -> None:
    global _callbacks_lock
    # The lock may have been held by another thread of the parent at the fork.
    _callbacks_lock = threading.Lock()
    alive = []
    for ref in _callbacks:
        callback = ref()
        if callback is None:
            continue
        alive.append(ref)
        try:
            callback()
        except Exception:  # noqa: BLE001 - one component's reset must not stop the others'
            logger.exception("codegen cache: resetting %r after fork failed", callback)
    _callbacks[:] = alive


class ForkGate:
    """Threads pass through it around SQLite calls; fork() waits until none is inside."""

    # A SQLite call waits at most its busy timeout (a few seconds); a fork waits a bit longer,
    # then goes ahead rather than hang the parent.
    FORK_WAIT = 10.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._inside -= 1
            if not self._inside:
                self._cond.notify_all()

    def before_fork(self) -> None:
        """Hold the gate shut until the fork is done (called in the forking thread)."""
        self._cond.acquire()
        deadline = time.monotonic() + self.FORK_WAIT
        while self._inside and time.monotonic() < deadline:
            self._cond.wait(deadline - time.monotonic())
        self._forking = True

    def after_fork_in_parent(self) -> None:
        """Open the gate again."""
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        """A new gate: the child has none of the parent's threads inside."""
        self._reset()


class BuildGate(ForkGate):
    """A ForkGate for long native calls (a codegen, which TVM runs with the GIL released).

    A fork is held back while a thread is inside: a C++ static being initialised there the
    first time (`__cxa_guard_acquire`), or a mutex held, stays held in the child for good. Once
    a fork is pending no new call goes in, so builds one after another cannot hold it back; a
    call made inside another on the same thread (a codegen lowering through the cache) goes in,
    and the forking thread's own call does not count.
    """

    def _reset(self) -> None:
        super()._reset()
        self._depth = threading.local()

    def __enter__(self) -> None:
        depth = getattr(self._depth, "n", 0)
        if not depth:
            super().__enter__()
        self._depth.n = depth + 1

    def __exit__(self, *exc: object) -> None:
        self._depth.n -= 1
        if not self._depth.n:
            super().__exit__()

    def before_fork(self) -> None:
        self._cond.acquire()
        self._forking = True
        own = 1 if getattr(self._depth, "n", 0) else 0
        deadline = time.monotonic() + self.FORK_WAIT
        while self._inside > own and time.monotonic() < deadline:
            self._cond.wait(deadline - time.monotonic())

    def after_fork_in_child(self) -> None:
        depth = getattr(self._depth, "n", 0)
        self._reset()
        if depth:  # forked from inside a build: this thread is still in it
            self._depth.n, self._inside = depth, 1


sqlite_gate = ForkGate()
build_gate = BuildGate()


def _module_locks() -> dict[str, Any]:
    """importlib's module locks (`importlib._bootstrap._module_locks`, name -> weak reference to a
    lock with `owner` and `count`: private to CPython, docs/maintaining.md); {} where not there."""
    locks = getattr(sys.modules.get("_frozen_importlib"), "_module_locks", None)
    return locks if isinstance(locks, dict) else {}


def _imports_of_other_threads() -> list[str]:
    """Names of the modules that threads other than this one are importing now."""
    me = threading.get_ident()
    names = []
    for name, ref in _module_locks().copy().items():
        lock = ref() if callable(ref) else None
        if getattr(lock, "count", 0) and getattr(lock, "owner", me) != me:
            names.append(name)
    return names


def _wait_for_imports() -> None:
    # Called before fork(), after the builds and before the SQLite gate shuts (an import may use the cache).
    deadline = time.monotonic() + ForkGate.FORK_WAIT
    while _imports_of_other_threads() and time.monotonic() < deadline:
        time.sleep(0.001)


def _forget_imports_of_other_threads() -> None:
    # Only after _wait_for_imports ran out: the module is dropped with its lock, half-made as it
    # is; the child's first import of it makes it again (or fails loudly) instead of hanging.
    for name in _imports_of_other_threads():
        _module_locks().pop(name, None)
        module = sys.modules.get(name)
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            del sys.modules[name]
            logger.warning("codegen cache: forked while another thread was importing %s; "
                           "this process imports it again", name)

if hasattr(os, "register_at_fork"):
    # Hooks before a fork run in the reverse order of registration, those in the child in order:
    # builds are waited for first (they import), then imports, then SQLite calls; imports are
    # forgotten first in the child.
    os.register_at_fork(after_in_child=_forget_imports_of_other_threads)
    os.register_at_fork(before=sqlite_gate.before_fork, after_in_parent=sqlite_gate.after_fork_in_parent,
                        after_in_child=sqlite_gate.after_fork_in_child)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    os.register_at_fork(before=_wait_for_imports)
    os.register_at_fork(before=build_gate.before_fork, after_in_parent=build_gate.after_fork_in_parent,
                        after_in_child=build_gate.after_fork_in_child)
