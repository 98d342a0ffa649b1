"""What keying callbacks by identity costs a memory hit, side by side in one process.

    python benchmarks/bench_callback_key.py [--number 5000]

Three CUDA source codegens that differ only in their toolchain function, each hit from the
memory tier in a tight loop, batches interleaved (medians of 7):
- "presence": the old key part, whether tvm_callback_cuda_postproc is registered;
- "identity": the built-in toolchain now (the identity of each of the 4 Python globals
  target.build.cuda calls, memoized per registered function, and of TVM's intrinsic table);
- "identity + hook": the same with a user's Python hook registered and its salt declared (a
  user's hook is keyed only by a declared salt; without one the lowering is uncacheable).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import kernels  # noqa: E402
import tvm_ffi  # noqa: E402

import codegen_cache as cc  # noqa: E402
from codegen_cache import _compat  # noqa: E402
from codegen_cache.codegens import cuda  # noqa: E402

HOOK = "tvm_callback_cuda_postproc"
SUFFIX = "\n// tuned\n"


def presence(target, compile_device):
    return {"postproc_hook": str(_compat.global_func(HOOK, missing_ok=True) is not None)}


def hook(code, target):
    return code + SUFFIX


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=5000)
    args = parser.parse_args()
    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {"kind": "cuda", "arch": "sm_90"})
    builtin = cc.resolve_device_codegen(target)
    old = cc.DeviceCodegen("cuda", build_without_compile=cuda.cuda_source_module, toolchain=presence)
    cases = {"presence": (old, False), "identity": (builtin, False), "identity + hook": (builtin, True)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        cache = cc.CodegenCache(tmp)
        for _ in range(7):
            for name, (codegen, with_hook) in cases.items():
                if with_hook:
                    tvm_ffi.register_global_func(HOOK, hook, override=True)
                    cc.declare_callback_salt(HOOK, "tuned-v1")
                cache.lower(mod, target, compile_device=False, codegen=codegen)  # fills memory
                times[name].append(timeit.timeit(
                    lambda codegen=codegen: cache.lower(mod, target, compile_device=False, codegen=codegen),
                    number=args.number) / args.number)
                if with_hook:
                    tvm_ffi.remove_global_func(HOOK)
        cache.close()
    # The toolchain function alone (what a key computes per lowering), the same way.
    alone: dict[str, list[float]] = {name: [] for name in cases}
    tgt = target
    for _ in range(7):
        for name, (codegen, with_hook) in cases.items():
            if with_hook:
                tvm_ffi.register_global_func(HOOK, hook, override=True)
                cc.declare_callback_salt(HOOK, "tuned-v1")
            alone[name].append(timeit.timeit(lambda codegen=codegen: codegen.toolchain(tgt, False),
                                             number=args.number * 4) / (args.number * 4))
            if with_hook:
                tvm_ffi.remove_global_func(HOOK)
    base = statistics.median(times["presence"])
    print(f"{'toolchain':<18}{'memory hit us':>15}{'vs presence':>13}{'toolchain us':>14}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<18}{median * 1e6:>15.1f}{median / base:>12.2f}x{statistics.median(alone[name]) * 1e6:>14.2f}")


if __name__ == "__main__":
    main()
