"""A Ctrl-C (SIGINT to the main thread: a terminal, a Jupyter interrupt) while a caller waits for the writer.

A notebook kernel survives the KeyboardInterrupt and goes on with the same writer; a script
exits and gives the writer its EXIT_SECONDS. Either way the writer's thread and lock must come
out of the interrupt as they went in: a dead thread leaves every queued job (stores, upgrade
requests) undone.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from codegen_cache._cache import _writer


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_flush_waits_leaves_the_writers_lock_and_thread_working():
    writer = _writer.Writer("test-writer")
    gate, held, release = threading.Event(), threading.Event(), threading.Event()
    writer.submit(lambda: gate.wait(30))  # a job running: wait() has something to wait for
    errors: list[BaseException] = []

    def take_the_lock_as_the_thread_does_between_jobs():
        try:
            with writer._cond:
                held.set()
                release.wait(30)
        except RuntimeError as err:  # "release unlocked lock": the waiter freed it meanwhile
            errors.append(err)

    def interrupt():
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    # The lock is taken while the caller waits, and the Ctrl-C comes while it is still held.
    timers = [threading.Timer(0.2, take_the_lock_as_the_thread_does_between_jobs), threading.Timer(1.2, interrupt)]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Python has it
    try:
        for timer in timers:
            timer.start()
        with pytest.raises(KeyboardInterrupt):
            writer.wait(20)
        assert held.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
        for timer in timers:
            timer.join(30)
    assert not errors, errors
    gate.set()
    assert writer.wait(10)  # the thread lives and takes new jobs
    ran = threading.Event()
    writer.submit(ran.set)
    assert ran.wait(10) and writer.wait(10)


@pytest.mark.timeout(60)
def test_wait_returns_within_its_timeout_while_another_thread_holds_the_lock():
    writer = _writer.Writer("test-writer")
    gate = threading.Event()
    writer.submit(lambda: gate.wait(30))
    writer._cond.acquire()  # what a KeyboardInterrupt between an acquire and its `try` leaves
    try:
        start = time.monotonic()
        assert writer.wait(0.5) is False
        assert time.monotonic() - start < 5
    finally:
        writer._cond.release()
        gate.set()
    assert writer.wait(10)
