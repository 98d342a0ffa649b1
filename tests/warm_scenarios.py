"""Scenarios that do what TVM's codegen, runtime-module and Relax VM tests do, for warm_cold.py.

Each scenario builds with TVM's own entry points (tvm.tirx.build, tvm.relax.build, tvm.compile)
and returns what a test would look at: kinds, properties, sources, outputs, exported files, error
types. Files it exports are listed as load jobs, which `load_and_run` runs in another fresh
process (the exported file must work where nothing was built). Run as a program:

    python warm_scenarios.py SCENARIO OUT_DIR route|plain      -> OUT_DIR/observed.json, jobs.json
    python warm_scenarios.py --load OUT_DIR                    -> OUT_DIR/loaded.json
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import sys
import tarfile

import numpy as np
import tvm
import tvm.s_tir  # noqa: F401
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import codegen_cache as cc
import routing

N = 64


def _digest(text) -> str:
    return hashlib.sha256(text if isinstance(text, bytes) else str(text).encode()).hexdigest()[:16]


def _source_digest(text: str) -> str:
    # TVM's LLVM IR names its alias-analysis (TBAA) nodes by buffer addresses: two builds of one
    # module differ there, with or without a cache.
    return _digest(re.sub(r'!"0x[0-9a-f]+"', '!"0x?"', text))


def _error(call) -> dict:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - what is raised is the observation
        return {"type": type(err).__name__, "tvm_internal": isinstance(err, tvm.error.InternalError),
                "runtime": isinstance(err, RuntimeError), "first_line": str(err).splitlines()[0][:200]}
    return {"type": None}


def _module_facts(module) -> dict:
    """What TVM's module tests look at on a built module."""
    facts = {"kind": module.kind, "mask": module.get_property_mask(),
             "binary_serializable": module.is_binary_serializable(), "runnable": module.is_runnable(),
             "compilation_exportable": module.is_compilation_exportable(),
             "write_formats": list(module.get_write_formats()), "imports": [m.kind for m in module.imports]}
    for fmt in ("", "ll", "s", "asm", "o", "c"):
        try:
            facts[f"source[{fmt}]"] = _source_digest(module.inspect_source(fmt))
        except Exception as err:  # noqa: BLE001
            facts[f"source[{fmt}]"] = f"error {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    for name in ("__tvm_is_system_module", "_get_target_string", "__tvm_get_system_lib_prefix", "get_func_names"):
        facts[name] = _error(lambda: module.get_function(name)) if not _has(module, name) else \
            _plain(module.get_function(name)())
    return facts


def _has(module, name) -> bool:
    try:
        module.get_function(name)
        return True
    except AttributeError:
        return False


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, str)) else [str(v) for v in value]


def _vadd_mod(symbol="vadd", n=N):
    @T.prim_func(s_tir=True)
    def vadd(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32"), C: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("C"):
                vi = T.axis.spatial(n, i)
                C[vi] = A[vi] + B[vi] * T.float32(2)

    return tvm.IRModule({symbol: vadd.with_attr("global_symbol", symbol)})


def _run_vadd(module, name="vadd") -> str:
    a = np.arange(N, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(N, "float32"))
    module[name](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
    return _digest(out.numpy().tobytes())


# ---- scenarios ----------------------------------------------------------------------------------


def tir_llvm(out: str, jobs: list) -> dict:
    """A TIR kernel for llvm: properties, sources, running, timing, every way to write it out."""
    lib = tvm.tirx.build(_vadd_mod(), "llvm")
    seen = {"module": _module_facts(lib), "implements": lib.implements_function("vadd"),
            "run": _run_vadd(lib)}
    timer = lib.time_evaluator("vadd", tvm.cpu(), number=2, repeat=3)
    a = tvm.runtime.tensor(np.ones(N, "float32"))
    seen["timed"] = len(timer(a, a, tvm.runtime.tensor(np.zeros(N, "float32"))).results)
    for suffix in ("ll", "o", "s", "bc"):
        path = os.path.join(out, f"lib.{suffix}")
        lib.write_to_file(path)
        seen[f"write[{suffix}]"] = os.path.getsize(path) > 0
    with open(os.path.join(out, "lib.ll")) as f:
        seen["write[ll] text"] = _source_digest(f.read())
    for name, options in (("lib.so", {}), ("lib.tar", {}), ("lib_tar.so", {"fcompile": tvm.support.tar.tar})):
        path = os.path.join(out, name if "fcompile" not in options else "lib_fc.tar")
        seen[f"export[{name}]"] = _error(lambda: lib.export_library(path, **options))["type"]
        jobs.append({"load": "module", "path": path, "func": "vadd"})
    return seen


def tir_system_lib(out: str, jobs: list) -> dict:
    """A system-lib kernel: its queries, an object file linked by hand, a .tar export."""
    lib = tvm.tirx.build(_vadd_mod("syslib_vadd").with_attr("system_lib_prefix", ""), "llvm")
    seen = {"module": _module_facts(lib)}
    obj, dso = os.path.join(out, "sys.o"), os.path.join(out, "sys.so")
    lib.write_to_file(obj)
    tvm.support.cc.create_shared(dso, [obj])
    jobs.append({"load": "system_lib", "path": dso, "func": "syslib_vadd"})
    tar = os.path.join(out, "sys.tar")
    seen["export[tar]"] = _error(lambda: lib.export_library(tar))["type"]
    with tarfile.open(tar) as f:
        seen["tar members"] = sorted(m.name for m in f.getmembers())
    return seen


@I.ir_module
class _Relax:
    @T.prim_func(s_tir=True)
    def add(A: T.Buffer((N,), "float32"), B: T.Buffer((N,), "float32"), C: T.Buffer((N,), "float32")):
        for i in range(N):
            with T.sblock("C"):
                vi = T.axis.spatial(N, i)
                C[vi] = A[vi] + B[vi]

    @R.function
    def main(x: R.Tensor((N,), "float32"), y: R.Tensor((N,), "float32")):
        cls = _Relax
        z = R.call_tir(cls.add, (x, y), R.Tensor((N,), "float32"))
        w = R.multiply(z, y)
        return w


def _run_vm(vm) -> str:
    x = tvm.runtime.tensor(np.arange(N, dtype="float32"))
    return _digest(vm["main"](x, x).numpy().tobytes())


def relax_vm(out: str, jobs: list) -> dict:
    """A Relax model: the executable's import tree, running it, exporting it (.so, .tar)."""
    ex = tvm.compile(_Relax, "llvm")
    seen = {"executable": ex.mod.kind, "imports": [_module_facts(m) for m in ex.mod.imports],
            "run": _run_vm(relax.VirtualMachine(ex, tvm.cpu())), "jit_kind": ex.jit().kind}
    for name in ("model.so", "model.tar"):
        path = os.path.join(out, name)
        seen[f"export[{name}]"] = _error(lambda: ex.export_library(path))["type"]
        jobs.append({"load": "vm", "path": path})
    return seen


@I.ir_module
class _SysA:
    I.module_attrs({"system_lib_prefix": "libA_"})

    @T.prim_func(s_tir=True)
    def fill(x_handle: T.handle):
        n = T.int64()
        x = T.match_buffer(x_handle, [n], "float32")
        for i in range(n):
            x[i] = T.float32(3)

    @R.function
    def main(s: R.Shape(["m"])) -> R.Tensor:
        m = T.int64()
        gv0 = R.call_tir(_SysA.fill, (), R.Tensor((m + 1,), dtype="float32"))
        return gv0


def relax_system_lib(out: str, jobs: list) -> dict:
    """A Relax model as a system library: a static archive linked into a shared library by hand."""
    ex = relax.build(_SysA, tvm.target.Target("llvm", host="llvm"))
    archive, dso = os.path.join(out, "libA.a"), os.path.join(out, "all.so")
    seen = {"export[a]": _error(lambda: ex.export_library(archive, fcompile=tvm.support.cc.create_staticlib))["type"]}
    tvm.support.cc.create_shared(dso, ["-Wl,--whole-archive", archive, "-Wl,--no-whole-archive"])
    jobs.append({"load": "system_vm", "path": dso, "prefix": "libA_"})
    seen["imports"] = [m.kind for m in ex.mod.imports]
    return seen


def codegen_errors(out: str, jobs: list) -> dict:
    """A codegen error (an llvm duplicate global symbol): its type and message, twice."""
    @I.ir_module(s_tir=True)
    class Dup:
        @T.prim_func(s_tir=True)
        def first(A: T.Buffer((1,), "float32")):
            T.func_attr({"global_symbol": "dup_symbol", "tirx.noalias": True})
            A[0] = T.float32(1)

        @T.prim_func(s_tir=True)
        def second(A: T.Buffer((1,), "float32")):
            T.func_attr({"global_symbol": "dup_symbol", "tirx.noalias": True})
            A[0] = T.float32(2)

    return {"first": _error(lambda: tvm.compile(Dup, target="llvm")),
            "again": _error(lambda: tvm.compile(Dup, target="llvm"))}


CROSS_TARGETS = {"aarch64": ("aarch64-linux-gnu", 183), "arm": ("armv7l-linux-gnueabihf", 40),
                 "riscv64": ("riscv64-unknown-linux-gnu", 243)}


def cross_target(out: str, jobs: list) -> dict:
    """llvm for other CPUs (-mtriple): an llvm module that writes that CPU's object code."""
    seen = {}
    for name, (triple, machine) in CROSS_TARGETS.items():
        lib = tvm.tirx.build(_vadd_mod(f"vadd_{name}"), tvm.target.Target({"kind": "llvm", "mtriple": triple}))
        facts = _module_facts(lib)
        facts.pop("source[s]"), facts.pop("source[asm]")  # digests below, with the object's machine
        obj = os.path.join(out, f"{name}.o")
        lib.write_to_file(obj)
        with open(obj, "rb") as f:
            facts["elf machine"] = int.from_bytes(f.read(20)[18:20], "little")
        assert facts["elf machine"] == machine, facts
        tar = os.path.join(out, f"{name}.tar")
        facts["export[tar]"] = _error(lambda: lib.export_library(tar))["type"]
        facts["run"] = _error(lambda: lib["vadd_" + name])
        seen[name] = facts
    return seen


def relax_dynamic(out: str, jobs: list) -> dict:
    """Relax models with symbolic shapes (TVMScript and emit_te): run at two sizes, exported, loaded."""
    from key_inputs_script import RelaxDynamic, _emit_te

    seen = {}
    for name, mod in (("script", RelaxDynamic), ("emit_te", _emit_te(False))):
        ex = relax.build(mod, tvm.target.Target("llvm", host="llvm"))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        for n in (3, 17):
            x = tvm.runtime.tensor(np.linspace(0, 1, n, dtype="float32"))
            seen[f"{name} run n={n}"] = _digest(np.round(vm["main"](x, x).numpy(), 5).tobytes())
        path = os.path.join(out, f"{name}.so")
        seen[f"{name} export"] = _error(lambda: ex.export_library(path))["type"]
        jobs.append({"load": "vm_dynamic", "path": path})
    return seen


def _cuda_source_facts(module) -> dict:
    """What a test looks at on TVM's source-only CUDA module (it has no functions to ask without a runtime)."""
    packed = tvm.get_global_func("runtime.ModulePackImportsToTensor")(module).numpy().tobytes()
    facts = {"kind": module.kind, "mask": module.get_property_mask(),
             "binary_serializable": module.is_binary_serializable(), "runnable": module.is_runnable(),
             "compilation_exportable": module.is_compilation_exportable(),
             "write_formats": list(module.get_write_formats()), "saved_bytes": _digest(packed),
             "get_function": _error(lambda: module.get_function("no_such_kernel"))["type"]}
    for fmt in ("", "cu", "cuda", "ptx"):
        facts[f"source[{fmt}]"] = _digest(module.inspect_source(fmt))
    return facts


def relax_cuda_source(out: str, jobs: list) -> dict:
    """A Relax model for CUDA where no driver is: TVM's source-only CUDA module in the executable, exported."""
    import relax_models

    from codegen_cache._artifacts import _cuda

    mod, _named = relax_models.mlp()
    ex = tvm.compile(mod, tvm.target.Target({"kind": "cuda", "arch": "sm_90"}))
    library = ex.mod.imports[0]
    seen = {"executable": ex.mod.kind, "library": library.kind,
            "devices": [_cuda_source_facts(m) for m in library.imports],
            # Which check a hit of these modules makes (_cuda.fallback_module): a model's CUDA text
            # (TVM's headers and its kernels) is long for its kernels, so a twin is checked.
            "checked_on_a_twin": [len(p.code) > _cuda._TWIN_ABOVE * len(_cuda.function_infos(p.fmap))  # noqa: SLF001
                                  for p in map(_cuda.module_payload, library.imports)]}
    for name in ("model.so", "model.tar"):
        seen[f"export[{name}]"] = _error(lambda: ex.export_library(os.path.join(out, name)))
    # Without a driver the exported file cannot be loaded here (no CUDA loader), cached or not;
    # what it holds for the CUDA module is the saved bytes compared above.
    return seen


SCENARIOS = {f.__name__: f for f in (tir_llvm, tir_system_lib, relax_vm, relax_system_lib, relax_dynamic,
                                     codegen_errors, cross_target, relax_cuda_source)}


# ---- loading what was exported, in a process that built nothing ---------------------------------


def load_and_run(job: dict):
    """Load an exported file as a TVM user does and run it; a digest of the output."""
    if job["load"] == "module":
        return _run_vadd(tvm.runtime.load_module(job["path"]), job["func"])
    if job["load"] == "system_lib":
        ctypes.CDLL(job["path"])  # its constructor registers the functions in the system library
        return _run_vadd(tvm.runtime.system_lib(), job["func"])
    if job["load"] == "vm":
        return _run_vm(relax.VirtualMachine(tvm.runtime.load_module(job["path"]), tvm.cpu()))
    if job["load"] == "vm_dynamic":
        vm = relax.VirtualMachine(tvm.runtime.load_module(job["path"]), tvm.cpu())
        x = tvm.runtime.tensor(np.linspace(0, 1, 17, dtype="float32"))
        return _digest(np.round(vm["main"](x, x).numpy(), 5).tobytes())
    if job["load"] == "system_vm":
        ctypes.CDLL(job["path"])
        vm = relax.VirtualMachine(tvm.runtime.system_lib(job["prefix"]), tvm.cpu())
        return _digest(vm["main"](tvm.runtime.ShapeTuple([5])).numpy().tobytes())
    raise ValueError(f"unknown load job {job['load']!r}")


def main(argv: list[str]) -> int:
    if argv[0] == "--load":
        out = argv[1]
        with open(os.path.join(out, "jobs.json")) as f:
            jobs = json.load(f)
        loaded = []
        for job in jobs:
            try:
                loaded.append({"result": load_and_run(job)})
            except Exception as err:  # noqa: BLE001 - what is raised is the observation
                loaded.append({"error": type(err).__name__, "message": str(err).splitlines()[0][:200]})
        with open(os.path.join(out, "loaded.json"), "w") as f:
            json.dump(loaded, f, indent=1)
        return 0
    name, out, how = argv
    if how == "route":
        routing.route()
    jobs: list = []
    with cc.record_outcomes() as outcomes:
        seen = SCENARIOS[name](out, jobs)
    with open(os.path.join(out, "observed.json"), "w") as f:
        json.dump({"seen": seen, "tiers": [o.tier for o in outcomes]}, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "jobs.json"), "w") as f:
        json.dump(jobs, f)
    if how == "route":
        cc.get_cache().flush(upgrades=True, timeout=300)  # the next process finds the fast form
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
