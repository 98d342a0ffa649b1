"""The background writer: one daemon thread per process for work no caller should wait for.

Its jobs move staged entries into their diskcache stores, push entries to the remote tier and
ask for llvm upgrades. None of them is needed for an entry to survive: lower() has written
the entry's file before it returns, and any process that finds a staged file promotes it. So
a job that is never run (the process was killed, the queue was cut at exit) loses nothing,
and the writer can be strict about time:

- a job that raises is logged and counted; the thread goes on with the next one;
- `wait(timeout)` returns within `timeout` whatever the thread does, and says if it drained;
- at interpreter exit the queue gets EXIT_SECONDS, and Ctrl-C there stops the wait;
- in a child made by fork the parent's queue is dropped (the parent runs its own jobs) and a
  thread starts again on the child's first job.

A caller does not wake the thread while it is busy: it looks for jobs every POLL_SECONDS, and
only after IDLE_SECONDS without one does it sleep until a submit wakes it. Waking a thread on
the caller's path costs the caller its CPU and then the GIL on a loaded machine: more than the
whole budget for what the cache adds to a miss (docs/benchmarks.md at 5788f7c, "Against the goals").

While a whole compile runs (`hold()`: codegen_cache.build, a Relax model's tvm.compile), the
thread starts no job: what it does (opening SQLite stores, writing them, starting the llvm
upgrader, which imports TVM) would take the cores that compile is using, and nothing in it is
needed before the compile returns. A hold is bounded (HOLD_SECONDS after the oldest queued
job, a wait() from any thread) so that a long or endless run of overlapping holds never keeps
entries out of their stores for long.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from .._forksafe import on_fork_child

__all__ = ["EXIT_SECONDS", "HOLD_SECONDS", "Writer", "writer"]

logger = logging.getLogger(__name__)

EXIT_SECONDS = 5.0
POLL_SECONDS = 0.05
WAIT_POLL_SECONDS = 0.005  # how often wait() looks at the queue
IDLE_SECONDS = 5.0
HOLD_SECONDS = 10.0  # the longest a hold keeps the oldest queued job waiting
Job = Callable[[], None]


class Writer:
    """A FIFO of jobs run by one daemon thread, started on the first job."""

    def __init__(self, name: str = "codegen-cache-writer") -> None:
        self.name = name
        self._reset()
        on_fork_child(self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: collections.deque[Job] = collections.deque()
        self._running = 0
        self._thread: threading.Thread | None = None
        self._asleep = False
        self._holds = 0  # hold() blocks open now (a fork child starts with none: its jobs are its own)
        self._waiting: list[object] = []  # a token per wait() call in progress: they end any hold
        self._queued_at: collections.deque[float] = collections.deque()  # time.monotonic() of each job
        self.failures = 0

    def submit(self, job: Job) -> None:
        """Queue `job`; the thread runs it within POLL_SECONDS (woken only if it sleeps)."""
        with self._cond:
            self._jobs.append(job)
            self._queued_at.append(time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            elif self._asleep:
                self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Inside the block (any thread's), the thread starts no job, for HOLD_SECONDS at most."""
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds = max(0, self._holds - 1)
                if not self._holds and self._jobs:
                    self._cond.notify_all()

    def _held(self) -> bool:
        # Called with the lock held.
        if not self._holds or self._waiting:
            return False
        return not self._queued_at or time.monotonic() - self._queued_at[0] < HOLD_SECONDS

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs) + self._running

    def wait(self, timeout: float | None = None) -> bool:
        """Until every job is done or `timeout` seconds passed; True when the queue drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # The caller never takes the lock: it looks at the queue (the thread counts a job as
        # running before it takes it off the queue) and sleeps. A KeyboardInterrupt (Ctrl-C, a
        # Jupyter interrupt) raised in Condition.wait can come after the lock is given up and
        # before it is taken again, and the waiter's release would then free the lock the thread
        # holds: the thread would die at its own release, with every queued job (stores, upgrade
        # requests) left undone. One raised between an acquire and its `try` would leave the lock
        # held for good, and the exit (which waits here) must end within EXIT_SECONDS whatever
        # the lock's state.
        token = object()
        self._waiting.append(token)  # a hold must not make a flush (or the exit) wait for nothing
        try:
            while self._jobs or self._running:
                if self._thread is None or not self._thread.is_alive():
                    # Nothing will run them (the thread could not start): the jobs are extras,
                    # their entries are on disk already.
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                time.sleep(WAIT_POLL_SECONDS if remaining is None else min(remaining, WAIT_POLL_SECONDS))
            return True
        finally:
            self._waiting.remove(token)

    def _loop(self) -> None:
        cond = self._cond
        last_job = time.monotonic()
        while True:
            with cond:
                while not self._jobs or self._held():
                    if self._jobs or time.monotonic() - last_job < IDLE_SECONDS:
                        cond.wait(POLL_SECONDS)
                        continue
                    self._asleep = True
                    try:
                        cond.wait()
                    finally:
                        self._asleep = False
                self._running += 1  # before the job leaves the queue: wait() reads both without the lock
                job = self._jobs.popleft()
                self._queued_at.popleft()
            try:
                job()
            except Exception:  # noqa: BLE001 - the thread outlives any one job's failure
                self.failures += 1
                logger.exception("codegen cache: a background store job failed (the entry stays staged)")
            finally:
                last_job = time.monotonic()
                with cond:
                    self._running -= 1
                    cond.notify_all()


writer = Writer()


def _at_exit() -> None:
    try:
        if not writer.wait(EXIT_SECONDS):
            # Read without the lock: wait() may have timed out on a lock left held.
            logger.debug("codegen cache: exiting with %d background jobs left (their entries are staged)",
                         len(writer._jobs) + writer._running)  # noqa: SLF001
    except KeyboardInterrupt:
        pass  # Ctrl-C while exiting: stop waiting, never abort the interpreter


# Before atexit's handlers, which include finalizers of temporary directories a job may use:
# threading's private hook runs before all of them, atexit.register (the fallback) only before
# those registered earlier. What it buys is that order, not time (docs/benchmarks.md at 5788f7c, "Private
# internals"); tests/test_private_internals.py fails when the hook goes.
try:
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    atexit.register(_at_exit)
