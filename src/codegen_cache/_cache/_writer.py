"""Write-behind: a daemon thread per cache stores built modules off the caller's path."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from tvm.ir import IRModule
from tvm.runtime import Module

from .._artifacts._codecs import PendingArtifact
from .._key import CacheKey

__all__ = ["StoreJob", "WriteBehind"]


@dataclass(slots=True)
class StoreJob:
    """One built module waiting to be encoded and stored."""

    key: CacheKey
    store: str
    module: Module
    ir: IRModule
    pending: PendingArtifact
    release_lease: bool
    structural_hash: int  # of `ir` before the build: the mutation guard compares against it
    codegen: str


class WriteBehind:
    """Runs `write(job)` for each submitted job on one daemon thread, in order."""

    def __init__(self, write: Callable[[StoreJob], bool]) -> None:
        # A weak reference: the thread must not keep the cache alive.
        self._write = weakref.WeakMethod(write)
        self._queue: queue.Queue[StoreJob | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: StoreJob) -> None:
        """Queue `job`, starting the thread if needed."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=_loop, args=(self._write, self._queue),
                                                name="codegen-cache-writer", daemon=True)
                self._thread.start()
        self._queue.put(job)

    def wait(self, timeout: float | None = None) -> None:
        """Until every queued job is done, or `timeout` seconds have passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread is not None and self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(0.005)

    def close(self) -> None:
        """Finish the queued jobs and stop the thread."""
        self.wait()
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join(timeout=5)
                self._thread = None


def _loop(write_ref: weakref.WeakMethod, jobs: queue.Queue) -> None:
    while True:
        job = jobs.get()
        try:
            if job is None:
                return
            write = write_ref()
            if write is None:
                return
            write(job)
            del write
        finally:
            jobs.task_done()
