"""Keys are the same in every fresh process for every kind of input TVM builds, dynamic shapes included.

tests/key_inputs_script.py builds static and dynamic TIR, a multi-function host module, a CUDA
device module, C, and Relax models (dynamic shapes, emit_te) through the cache; it runs three
times, each in a fresh process, over one cache directory. From the second run on, every build is
a hit, with the same build key and the same codegen-level keys.

One input is not the same from process to process: Relax's emit_te with two or more symbolic
variables that are not dimensions of its inputs (a concat of (n,) and (m,)) makes a PrimFunc
whose scalar parameters come in the order of a Python set of TVM objects, i.e. of their
addresses (tvm.relax.utils.gen_call_tir_inputs: `list(used_vars - bound_vars)`), and calls it
in that order; the Relax VM's shape function then computes the two sizes in an order that
varies the same way (vm_shape_lower.cc iterates an unordered_map whose hash of a free variable
is its address). Two orders are two different functions: serving one's code to the other would
swap its arguments. There the key follows the parameters: the same order, the same key and a
hit; another order, another key. The shape function's stores are independent (each writes its
own slot from slots none of them writes), so the build key hashes them in one order
(`_key.input_hash`): any model with symbolic shapes varies that way, and hits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
import tvm.s_tir  # noqa: F401
from tvm.script import tirx as T

from codegen_cache._build._input_hash import input_hash
from codegen_cache._key import ir_hash

HERE = Path(__file__).parent
ORDER_DEPENDENT = "relax emit_te concat, two vars"
MODEL_OF_ORDER_DEPENDENT = "relax model emit_te concat, two vars"


def _run(directory: Path) -> dict:
    env = {"PYTHONPATH": str(HERE), "CODEGEN_CACHE_DIR": str(directory)}
    done = subprocess.run([sys.executable, str(HERE / "key_inputs_script.py"), str(directory)], capture_output=True,
                          text=True, timeout=400, env={**__import__("os").environ, **env}, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_every_kind_of_input_hits_in_fresh_processes_after_the_first(tmp_path):
    first, *later = [_run(tmp_path / "cache") for _ in range(3)]
    assert all(t == "codegen" for v in first.values() for t in v["tiers"]), first
    for i, run in enumerate(later):
        for name, seen in run.items():
            if name == ORDER_DEPENDENT:
                earlier = [r[name] for r in (first, *later[:i])]
                params = seen["signature"][0].split()[0]  # the parameter order, not the whole text
                same = [e for e in earlier if e["signature"][0].split()[0] == params]
                # The model-level input compiles the same Relax module: its cold run's TIR build (in
                # the first process) stored a module of the order TVM made there, under its build key.
                by_model = [r[MODEL_OF_ORDER_DEPENDENT] for r in (first, *later[:i])
                            if r[MODEL_OF_ORDER_DEPENDENT]["signature"]
                            and r[MODEL_OF_ORDER_DEPENDENT]["signature"][0].split()[0] == params]
                if not same and not by_model:  # TVM made another module this time: another function, another key
                    assert seen["tiers"] == ["codegen"] and all(seen["keys"] != e["keys"] for e in earlier), seen
                    continue
                assert set(seen["tiers"]) <= {"disk", "memory"}, (seen, same, by_model)
                if same:
                    assert seen["keys"] == same[0]["keys"], (seen, same)
                continue
            if name == MODEL_OF_ORDER_DEPENDENT:
                # emit_te orders the PrimFunc's parameters in the Relax input itself (a set of
                # addresses): another order is another model, never served the other's executable;
                # the same order as any earlier process is the same key, and a hit.
                earlier = [r[name] for r in (first, *later[:i])]
                if seen["tiers"] == ["codegen"]:
                    assert all(seen["keys"] != e["keys"] for e in earlier), seen
                    assert all(e["signature"] != seen["signature"] for e in earlier if e["signature"]), seen
                else:
                    assert set(seen["tiers"]) <= {"disk", "memory"}, seen
                    assert any(e["keys"] == seen["keys"] for e in earlier), (seen, earlier)
                continue
            assert seen["tiers"] and set(seen["tiers"]) <= {"disk", "memory"}, (name, seen, first[name])
            assert seen["keys"] == first[name]["keys"], name
            assert seen.get("codegen_keys") == first[name].get("codegen_keys"), name


@T.prim_func(s_tir=True)
def _shape_a(H: T.Buffer((T.int64(4),), "int64")):
    T.func_attr({"tirx.is_host_func": True})
    H[T.int64(3)] = H[T.int64(0)] + H[T.int64(1)]
    H[T.int64(2)] = T.int64(4) * (H[T.int64(0)] + H[T.int64(1)])


@T.prim_func(s_tir=True)
def _shape_b(H: T.Buffer((T.int64(4),), "int64")):
    T.func_attr({"tirx.is_host_func": True})
    H[T.int64(2)] = T.int64(4) * (H[T.int64(0)] + H[T.int64(1)])
    H[T.int64(3)] = H[T.int64(0)] + H[T.int64(1)]


@T.prim_func(s_tir=True)
def _dependent_a(H: T.Buffer((T.int64(4),), "int64")):
    H[T.int64(3)] = H[T.int64(0)] + H[T.int64(1)]
    H[T.int64(2)] = T.int64(4) * H[T.int64(3)]


@T.prim_func(s_tir=True)
def _dependent_b(H: T.Buffer((T.int64(4),), "int64")):
    H[T.int64(2)] = T.int64(4) * H[T.int64(3)]
    H[T.int64(3)] = H[T.int64(0)] + H[T.int64(1)]


def _module(shape_func):
    import kernels

    return tvm.IRModule({"shape_func": shape_func.with_attr("global_symbol", "shape_func"), "vadd": kernels.vadd})


def test_independent_stores_in_either_order_have_one_build_key():
    a, b = _module(_shape_a), _module(_shape_b)
    assert ir_hash(a) != ir_hash(b)  # TVM's structural hash tells the two orders apart
    assert input_hash(a) == input_hash(b)
    assert input_hash(_module(_dependent_a)) != input_hash(_module(_dependent_b))  # one reads what the other writes
    plain = tvm.IRModule({"vadd": _vadd()})
    assert input_hash(plain) == ir_hash(plain)  # nothing to reorder: the hash it always had


def _vadd():
    import kernels

    return kernels.vadd
