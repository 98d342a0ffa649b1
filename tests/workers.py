"""Subprocess workers of the reliability tests, and the kernels and checks they share.

Run as `python workers.py <role> <json args>`: a fresh interpreter each time (what spawn
gives), so a worker can be killed with SIGKILL without touching the test process. Each role
prints one JSON line of results on stdout when it finishes.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.s_tir  # noqa: E402,F401
from tvm import te  # noqa: E402

import codegen_cache as cc  # noqa: E402

N = 256
# LLVM names its TBAA nodes after pointer addresses ("0x5559..."): they differ between processes.
_ADDRESS = re.compile(r'"0x[0-9a-f]+"')


@functools.lru_cache(maxsize=None)
def variant(i: int):
    """(module, target) of `C[j] = A[j] + i` for llvm, named add_<i>: one key per i."""
    a = te.placeholder((N,), name="A", dtype="float32")
    c = te.compute((N,), lambda j: a[j] + float(i), name="C")
    func = te.create_prim_func([a, c]).with_attr("global_symbol", f"add_{i}")
    return cc.prepare_for_codegen(tvm.IRModule({f"add_{i}": func}), "llvm")


@functools.lru_cache(maxsize=None)
def reference_source(i: int) -> str:
    """LLVM IR text of variant i, straight from the codegen (no cache), addresses masked."""
    mod, target = variant(i)
    return _masked(cc.resolve_device_codegen(target).invoke(mod, target, compile_device=False).inspect_source(""))


def _masked(text: str) -> str:
    return _ADDRESS.sub('"0x"', text)


def check_module(module: tvm.runtime.Module, i: int, compiled: bool) -> None:
    """Raise AssertionError unless `module` is what the codegen gives for variant i."""
    if compiled:
        a = np.arange(N, dtype="float32")
        out = tvm.runtime.tensor(np.zeros(N, "float32"))
        module[f"add_{i}"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), a + i)
    else:
        assert _masked(module.inspect_source("")) == reference_source(i), f"source of add_{i} differs"


def _write_line(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def writer(args: dict) -> None:
    """Store entries as fast as it can until killed: misses with locks, overwrites, deletes."""
    rng = random.Random(args["seed"])
    cache = cc.CodegenCache(args["dir"], memory_entries=0)
    keys = args["keys"]
    for i in range(keys):  # lower everything up front: the loop below is all cache work
        variant(i)
    cache.lower(*variant(0), compile_device=False)
    cache.flush()
    _write_line(ready=True, pid=os.getpid())
    while True:
        i = rng.randrange(keys)
        compiled = rng.random() < 0.5
        if rng.random() < 0.3:  # make the next lower a miss: delete, then lower again
            cache.store("compiled" if compiled else "source").delete(cache.key_for(*variant(i), compile_device=compiled).digest)
        cache.lower(*variant(i), compile_device=compiled)


def mixer(args: dict) -> None:
    """`ops` mixed lowers and evictions on `keys` keys; every result is checked."""
    rng = random.Random(args["seed"])
    cache = cc.CodegenCache(args["dir"], memory_entries=args.get("memory_entries", 4),
                            write_behind=args.get("write_behind", True))
    keys, ops = args["keys"], args["ops"]
    for i in range(keys):
        variant(i)
    # Wait for the others, so the operations overlap.
    Path(args["sync"], f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(Path(args["sync"]).glob("ready-*"))) < args["workers"] and time.monotonic() < deadline:
        time.sleep(0.01)
    counts = {"lowers": 0, "evictions": 0, "errors": 0, "wrong": 0}
    first_error = None
    for _ in range(ops):
        i = rng.randrange(keys)
        compiled = rng.random() < 0.5
        roll = rng.random()
        try:
            if roll < 0.15:
                key = cache.key_for(*variant(i), compile_device=compiled).digest
                cache.store("compiled" if compiled else "source").delete(key)
                cache._memory.discard(key)  # noqa: SLF001
                counts["evictions"] += 1
            elif roll < 0.18:
                cache._memory.clear()  # noqa: SLF001
                counts["evictions"] += 1
            else:
                module = cache.lower(*variant(i), compile_device=compiled)
                counts["lowers"] += 1
                try:
                    check_module(module, i, compiled)
                except AssertionError:
                    counts["wrong"] += 1
                    first_error = first_error or traceback.format_exc()
        except Exception:  # noqa: BLE001 - the test wants every error counted, of any type
            counts["errors"] += 1
            first_error = first_error or traceback.format_exc()
    cache.flush()
    local = cache.stats(shared=False)
    _write_line(**counts, first_error=first_error, hits=local.hits, misses=local.misses,
                codegen_runs=local.codegen_runs, cache_errors=local.errors)
    cache.close()


def _rejects(mod, target):
    raise ValueError("an invalid config")


def populate(args: dict) -> None:
    """For each [dir, umask]: under that umask, lower variant 0 both ways, remember a failure, flush stats there."""
    for directory, umask in args["jobs"]:
        os.umask(umask)
        cache = cc.CodegenCache(directory, write_behind=False)
        for compiled in (True, False):
            cache.lower(*variant(0), compile_device=compiled)
        try:  # a remembered failure: the failures store (and its marker) are made as a real one makes them
            cache.lower(*variant(0), codegen=cc.DeviceCodegen("rejects", build=_rejects))
        except ValueError:
            pass
        len(cache.store("index"))  # opened (so created) as codegen_cache.build would
        cache.reset_stats()  # makes stats.sqlite (live processes count in their own files)
        cache.close()
    _write_line(done=True)


def lookup(args: dict) -> None:
    """Lower variants `keys` both ways (with a TVM commit of `tvm_commit`, if given); print the tiers."""
    if args.get("tvm_commit"):
        from codegen_cache import _key

        salts = dict(_key.static_salts())
        salts["tvm"] = f"{tvm.__version__}+{args['tvm_commit']}"
        _key.static_salts = lambda: tuple(salts.items())
    cache = cc.CodegenCache(args["dir"], write_behind=False)
    tiers = []
    for i in args["keys"]:
        for compiled in (True, False):
            module, outcome = cache.lower_with_outcome(*variant(i), compile_device=compiled)
            check_module(module, i, compiled)
            tiers.append(outcome.tier)
    _write_line(tiers=tiers)


ROLES = {"writer": writer, "mixer": mixer, "populate": populate, "lookup": lookup}

if __name__ == "__main__":
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
