"""Structural hashes computed ahead, on a helper thread, while the caller goes on.

A build lowers several modules in turn (the device modules, then the host module), and each
codegen key needs its module's structural hash: one TVM hash per function (_key.ir_hash).
TVM releases the GIL while it hashes and while it generates code, so a helper thread takes
those hashes from the far end (the host module's last function first) while the caller
hashes the first module from the near end and then runs its codegen: the two meet in the
middle, and the later modules' keys are ready when their turn comes (docs/benchmarks.md,
"Cold within 5% of plain").

Whoever comes first to a function hashes it: the helper, or the caller when the helper has
not reached it, so nothing waits longer than hashing it itself would. The answer is the same
function of the same object either way; a module is matched by identity and kept alive while
it is registered, so its id stays its.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ._forksafe import on_fork_child

__all__ = ["Units", "claimed", "hashed_ahead", "registered"]

# What a module's hash is made of: the objects hashed one by one, and how their hashes combine.
Units = tuple[list[Any], Callable[[list[int]], int]]


class _Slot:
    """One object's hash: not started, being computed (by either thread), done, or cancelled."""

    __slots__ = ("cancelled", "done", "error", "obj", "started", "value")

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.started = self.cancelled = False
        self.done = threading.Event()
        self.value: int | None = None
        self.error: BaseException | None = None

    def run(self, function: Callable[[Any], int]) -> None:
        try:
            self.value = function(self.obj)
        except BaseException as err:  # noqa: BLE001 - re-raised by result() in the caller's thread
            self.error = err
        finally:
            self.done.set()


class _Module:
    __slots__ = ("combine", "function", "module", "slots")

    def __init__(self, module: Any, units: Units, function: Callable[[Any], int]) -> None:
        self.module, self.function = module, function
        self.slots, self.combine = [_Slot(obj) for obj in units[0]], units[1]


# id(module) -> what it is made of, for the modules a build registered. Read without the lock
# (one dict get), changed under it; empty but for the duration of a build's codegens.
registered: dict[int, _Module] = {}
_lock = threading.Lock()


def _claim(slot: _Slot) -> bool:
    """Whether the caller is the first to reach `slot` (it computes it then)."""
    with _lock:
        if slot.started:
            return False
        slot.started = True
        return True


def claimed(mod: Any) -> int | None:
    """The hash of a registered `mod`, computed here where the helper has not got to it; None: not
    registered (or no longer: the build that registered it has returned)."""
    entry = registered.get(id(mod))
    if entry is None or entry.module is not mod:
        return None
    values = []
    for slot in entry.slots:
        if _claim(slot):
            slot.run(entry.function)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        if slot.cancelled:
            return None
        values.append(slot.value)
    return entry.combine(values)


@contextmanager
def hashed_ahead(modules: Sequence[Any], units_of: Callable[[Any], Units],
                 function: Callable[[Any], int]) -> Iterator[None]:
    """Within the block, `function` of each unit of `modules` is computed on a helper thread, from the last."""
    entries = [_Module(mod, units_of(mod), function) for mod in modules]
    if not entries:
        yield
        return
    with _lock:
        for entry in entries:
            registered[id(entry.module)] = entry
    work = [slot for entry in reversed(entries) for slot in reversed(entry.slots)]

    def helper() -> None:
        for slot in work:
            if _claim(slot):
                slot.run(function)

    # A thread per build (starting one is small beside a build): a long-lived one would have to
    # be made again after fork, and a pool's idle count lies in a fork child.
    threading.Thread(target=helper, name="codegen-cache-hash-ahead", daemon=True).start()
    try:
        yield
    finally:
        with _lock:
            for slot in work:
                if not slot.started:  # not reached: never computed now; a caller between its
                    slot.started = slot.cancelled = True  # lookup and its claim hashes it itself
                    slot.done.set()
            for entry in entries:
                if registered.get(id(entry.module)) is entry:
                    del registered[id(entry.module)]


def _forget_in_child() -> None:
    # The helper thread does not exist in a fork child: a slot it was computing never finishes.
    global _lock
    _lock = threading.Lock()
    registered.clear()


on_fork_child(_forget_in_child)
