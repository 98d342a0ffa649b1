"""Builds each kind of input TVM builds, through the cache; prints each build's keys and tiers as JSON.

Run by tests/test_key_stability.py in fresh processes over one cache directory (argv[1]).
"""

from __future__ import annotations

import hashlib
import json
import sys

import tvm
import tvm.s_tir  # noqa: F401
from tvm import relax, te, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import codegen_cache as cc
import kernels
import routing

LLVM = tvm.target.Target("llvm", host="llvm")


@T.prim_func(s_tir=True)
def dynamic_one(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for i in range(n):
        with T.sblock("B"):
            vi = T.axis.spatial(n, i)
            B[vi] = A[vi] + T.float32(1)


@T.prim_func(s_tir=True)
def dynamic_two(a: T.handle, b: T.handle, c: T.handle):
    n, m = T.int64(), T.int64()
    A = T.match_buffer(a, (n, m), "float32")
    B = T.match_buffer(b, (m,), "float32")
    C = T.match_buffer(c, (n, m), "float32")
    for i, j in T.grid(n, m):
        with T.sblock("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj] * B[vj]


@I.ir_module
class RelaxDynamic:
    @T.prim_func(s_tir=True)
    def scale(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        for i in range(n):
            with T.sblock("B"):
                vi = T.axis.spatial(n, i)
                B[vi] = A[vi] * T.float32(3)

    @R.function
    def main(x: R.Tensor(("n",), "float32"), y: R.Tensor(("n",), "float32")):
        n = T.int64()
        cls = RelaxDynamic
        z = R.call_tir(cls.scale, (x,), R.Tensor((n,), "float32"))
        w = R.add(z, y)
        return R.nn.softmax(w)


def _emit_te(two_vars: bool):
    bb = relax.BlockBuilder()
    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
    x = relax.Var("x", R.Tensor([n], "float32"))
    y = relax.Var("y", R.Tensor([m] if two_vars else [n], "float32"))

    def concat(A, B):
        if two_vars:  # n and m are not dimensions of the output: both become scalar parameters
            return te.compute((n + m,), lambda i: tirx.if_then_else(i < n, A[i], B[i - n]))
        return te.compute((n * 2,), lambda i: tirx.if_then_else(i < n, A[i], B[i - n]))

    with bb.function("main", [x, y]):
        out = bb.emit_te(concat, x, y)
        bb.emit_func_output(out)
    return bb.get()


def _signature(mod) -> str:
    """The TIR functions' parameters in order (what a call passes them), and a digest of the module's text."""
    params = ";".join(f"{gv.name_hint}({','.join(p.name for p in f.params)})" for gv, f in
                      sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint) if isinstance(f, tirx.PrimFunc))
    return f"{params} {hashlib.sha256(mod.script().encode()).hexdigest()[:12]}"


INPUTS = {
    "static tir llvm": lambda: cc.build(kernels.vadd, "llvm"),
    "static tir c": lambda: cc.build(kernels.vadd, "c"),
    "dynamic tir, one var": lambda: cc.build(dynamic_one, "llvm"),
    "dynamic tir, two vars": lambda: cc.build(dynamic_two, "llvm"),
    "multi-function host module": lambda: cc.build(tvm.IRModule({
        "vadd": kernels.vadd.with_attr("global_symbol", "vadd"),
        "vmul": kernels.vmul.with_attr("global_symbol", "vmul"),
        "dyn": dynamic_one.with_attr("global_symbol", "dyn")}), "llvm"),
    "cuda device module": lambda: cc.build(kernels.vadd_gpu, tvm.target.Target({"kind": "cuda", "arch": "sm_90"})),
    # A pipeline given as a Pass is not model-keyable: relax.build runs, and its TIR build is keyed.
    "relax, dynamic shapes": lambda: relax.build(RelaxDynamic, LLVM, relax_pipeline=relax.get_pipeline("default")),
    "relax emit_te, one var": lambda: relax.build(_emit_te(False), LLVM, relax_pipeline=relax.get_pipeline("default")),
    "relax emit_te concat, two vars": lambda: relax.build(_emit_te(True), LLVM,
                                                          relax_pipeline=relax.get_pipeline("default")),
    # The model level: the Relax input is keyed before any pipeline runs (one key, one outcome).
    "relax model, dynamic shapes": lambda: relax.build(RelaxDynamic, LLVM),
    "relax model emit_te concat, two vars": lambda: relax.build(_emit_te(True), LLVM),
}
# Whose outcome a run records: codegen_cache.build's, or the model level's for a Relax model.
OUTCOME_OF = {name: "relax.build" if name.startswith("relax model") else "build" for name in INPUTS}


def codegen_keys(mod, target) -> list[str]:
    """The codegen-level keys of a TIR build's parts (host and devices), lowered as codegen_cache.build does."""
    from codegen_cache._build._plan import prepare_plan, plan

    planned = plan(mod, target, "default")
    host, devices = prepare_plan(planned)
    cache = cc.get_cache()
    parts = [(m, t) for t, m in devices] + [(host, planned.host)]
    return [cache.key_for(m, t).digest for m, t in parts]


TIR_INPUTS = {"static tir llvm": (kernels.vadd, "llvm"), "static tir c": (kernels.vadd, "c"),
              "dynamic tir, two vars": (dynamic_two, "llvm"),
              "cuda device module": (kernels.vadd_gpu, tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))}


def main(directory: str) -> None:
    routing.route()
    seen = {}
    captured = []
    # What reaches tvm.tirx.build (the switch's router: hits included), watched with a profile
    # hook: a function assigned over TVM's, holding this list, would be keyed with the list's
    # contents (docs/key.md), so every build would have another key.
    router = tvm.tirx.build.__code__

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is router:
            mod = frame.f_locals["mod"]
            captured.append(_signature(tvm.IRModule(mod.functions) if isinstance(mod, tvm.IRModule)
                                       else tvm.IRModule({"main": mod})))

    sys.setprofile(watch)
    with cc.use_cache(cc.CodegenCache(directory)):
        for name, build in INPUTS.items():
            captured.clear()
            with cc.record_outcomes() as outcomes:
                build()
            builds = [o for o in outcomes if o.codegen == OUTCOME_OF[name]]
            seen[name] = {"keys": [o.key for o in builds], "tiers": [o.tier for o in builds],
                          "signature": list(captured)}
        for name, (mod, target) in TIR_INPUTS.items():
            seen[name]["codegen_keys"] = codegen_keys(mod, target)
        cc.get_cache().flush()
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
