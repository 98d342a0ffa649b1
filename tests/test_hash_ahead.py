"""Hashes computed ahead on a helper thread during a build: the same answers, each computed once, never a wait on nothing."""

import os
import threading

import pytest
import tvm

import codegen_cache as cc
from codegen_cache import _hash_ahead
from codegen_cache._key import _units, ir_hash, ir_hashes_ahead
from codegen_cache import _compat
from kernels import vmul
from relax_models import llama

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


class Module:
    """A stand-in for an IRModule: its units are its parts, combined by summing."""

    def __init__(self, *parts):
        self.parts = list(parts)


def units_of(mod):
    return mod.parts, sum


def counting(calls, gate=None):
    lock = threading.Lock()

    def function(part):
        if gate is not None:
            gate.wait(30)
        with lock:
            calls.append(part)
        return part * 10

    return function


def test_each_unit_is_computed_once_by_whichever_thread_comes_first():
    calls = []
    mods = [Module(*range(i * 50, i * 50 + 50)) for i in range(3)]
    with _hash_ahead.hashed_ahead(mods, units_of, counting(calls)):
        answers = [_hash_ahead.claimed(mod) for mod in mods]
    assert answers == [sum(p * 10 for p in mod.parts) for mod in mods]
    assert sorted(calls) == list(range(150))


def test_a_module_not_registered_or_no_longer_is_not_answered():
    mod = Module(1, 2)
    assert _hash_ahead.claimed(mod) is None
    with _hash_ahead.hashed_ahead([mod], units_of, counting([])):
        assert _hash_ahead.claimed(Module(1, 2)) is None  # equal is not the same object
    assert _hash_ahead.claimed(mod) is None
    assert not _hash_ahead.registered


def test_units_the_helper_never_reached_are_not_waited_for_after_the_block():
    gate, calls = threading.Event(), []
    mod = Module(1, 2, 3)
    with _hash_ahead.hashed_ahead([mod], units_of, counting(calls, gate)):
        entry = _hash_ahead.registered[id(mod)]
    # A caller that looked the module up before the block ended, and claims after: the helper
    # (held at its first unit) never got to the others, and nobody waits for them.
    done = threading.Event()
    threading.Thread(target=lambda: (entry.slots[1].done.wait(), done.set()), daemon=True).start()
    assert done.wait(10)
    assert entry.slots[0].cancelled and entry.slots[1].cancelled and not entry.slots[2].cancelled
    gate.set()
    assert entry.slots[2].done.wait(10) and calls == [3]


def test_an_error_while_hashing_is_raised_in_the_caller():
    def failing(part):
        raise ValueError(f"cannot hash {part}")

    mod = Module(1)
    with _hash_ahead.hashed_ahead([mod], units_of, failing):
        with pytest.raises(ValueError, match="cannot hash 1"):
            _hash_ahead.claimed(mod)


@pytest.mark.timeout(60)
def test_a_fork_child_never_waits_for_the_parents_helper():
    gate = threading.Event()
    mod = Module(1, 2)
    with _hash_ahead.hashed_ahead([mod], units_of, counting([], gate)):
        pid = os.fork()
        if pid == 0:  # the child: the helper thread is not here; its half-done slot must not be waited on
            os._exit(0 if _hash_ahead.claimed(mod) is None and not _hash_ahead.registered else 1)
        _, status = os.waitpid(pid, 0)
        gate.set()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_build_hashes_ahead_what_ir_hash_gives_and_keys_as_before(tmp_path):
    # The CUDA build of a model: a device module and a host module, each of many functions.
    mod, _params = llama(layers=1)
    seen = []
    cache = cc.CodegenCache(tmp_path / "cache")
    original = cc.CodegenCache._key_or_none

    def spy(self, codegen, ir, target, compile_device):
        seen.append((ir, original(self, codegen, ir, target, compile_device)))
        return seen[-1][1]

    cc.CodegenCache._key_or_none = spy
    cc.enable(cache, children=False)
    try:
        tvm.compile(mod, CUDA)
    finally:
        cc.disable()
        cc.CodegenCache._key_or_none = original
    assert len(seen) == 2 and not _hash_ahead.registered
    for ir, key in seen:
        assert key.ir_hash == ir_hash(ir) and len(_units(ir)[0]) > 2
    # What the helper computes for a module is what ir_hash computes without it.
    with ir_hashes_ahead([ir for ir, _key in seen]):
        assert [ir_hash(ir) for ir, _key in reversed(seen)] == [key.ir_hash for _ir, key in reversed(seen)]


def test_a_single_function_module_is_hashed_whole_as_before():
    mod = tvm.IRModule({"main": vmul})
    assert _units(mod)[0] == [mod]
    with ir_hashes_ahead([mod]):
        ahead = ir_hash(mod)
    assert ahead == ir_hash(mod) == _compat.structural_hash(mod)
