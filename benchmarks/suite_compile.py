"""tvm.compile of a Llama-style Relax model: plain TVM against the same compile through codegen_cache.enable().

Every measurement is a fresh interpreter that builds the model (tests/relax_models.llama:
RMSNorm, q/k/v/o projections, softmax attention, SwiGLU; hidden 256, seq 32) and times
tvm.compile alone. Per round (timing.fresh_rounds), in a new order:

- plain: TVM as installed, the switch off;
- cold: enable() on an empty cache directory (the model and all its codegen results are stored);
- warm: enable() on a directory a cold run filled (its llvm entries linked, as they are once the
  upgrader ran): a fresh process's compile is a model-level disk hit; in that process the same
  compile again (an equal module built anew: a re-run notebook cell) is a memory hit.

After each cold run the suite waits, untimed, for the upgrader it started, so that its linking
does not share the next run's cores. `cuda` is {"kind": "cuda", "arch": "sm_90"}: without a CUDA
driver TVM makes source-only CUDA.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from timing import child_env, fresh_rounds, paired, row, run_child, verdict

ROUNDS = 5
LAYERS = 4
TARGETS = {"llvm": "llvm", "cuda": '{"kind": "cuda", "arch": "sm_90"}'}
DESCRIPTION = (
    f"`tvm.compile` of a Llama-style Relax model ({LAYERS} layers, hidden 256, seq 32; llvm and source-only CUDA "
    "for sm_90) in fresh processes: TVM as installed (plain), through `codegen_cache.enable()` on an empty directory "
    "(cold), on a filled one (warm: a model-level disk hit), and the same compile again in the warm process (a "
    "memory hit of an equal module built anew). **Floor**: plain `tvm.compile`, in the same rounds. **Goals**: warm "
    ">= 20x faster than plain; the re-run >= 100x; cold within 5% of plain in CPU time of the compiling process "
    "(every thread; what the cache defers until the compile returns, the writer and the upgrader process, is not in "
    "it), and in wall time as the median of per-round ratios (no verdict within the rounds' noise).")

CHILD = r"""
import json, sys, time
import tvm
import relax_models
mode, target, layers, directory = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
target = tvm.target.Target(json.loads(target) if target.startswith("{") else target)
mod, _ = relax_models.llama(layers=layers)
if mode != "plain":
    import codegen_cache as cc
    cc.enable(cc.CodegenCache(directory), children=False)
t0, c0 = time.perf_counter(), time.process_time()
tvm.compile(mod, target)
found = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
if mode != "plain":
    found["tier"] = cc.last_outcome().tier
if mode == "warm":
    again, _ = relax_models.llama(layers=layers)
    t0 = time.perf_counter()
    tvm.compile(again, target)
    found["rerun"] = time.perf_counter() - t0
print(json.dumps(found))
"""


def _settle(directory: str) -> None:
    """Wait (untimed) for the upgrader a cold run started."""
    import codegen_cache as cc
    from codegen_cache._cache import _upgrade

    cache = cc.CodegenCache(directory)
    cache.flush(upgrades=True, timeout=300)
    cache.close()
    _upgrade.wait_exited(Path(directory), 60)


def _target_rows(name: str, layers: int, rounds: int, scratch: Path) -> list[dict]:
    target, env = TARGETS[name], child_env()
    warm_dir = str(scratch / f"warm-{name}")
    run_child(CHILD, ["cold", target, str(layers), warm_dir], env)
    _settle(warm_dir)
    count = iter(range(1 << 30))

    def cold() -> dict:
        directory = str(scratch / f"cold-{name}-{next(count)}")
        found = run_child(CHILD, ["cold", target, str(layers), directory], env)
        _settle(directory)
        shutil.rmtree(directory, ignore_errors=True)
        return found

    s = fresh_rounds({"plain": (CHILD, ["plain", target, str(layers), ""], env), "cold": cold,
                      "warm": (CHILD, ["warm", target, str(layers), warm_dir], env)}, rounds)
    med = {v: {k: statistics.median(x[k] for x in s[v]) for k in ("wall", "cpu")} for v in s}
    rerun = statistics.median(x["rerun"] for x in s["warm"])
    tiers = sorted({x["tier"] for x in s["warm"]})
    plain = med["plain"]["wall"]
    wall_ratio, noise = paired([x["wall"] for x in s["cold"]], [x["wall"] for x in s["plain"]])
    cpu_ratio = med["cold"]["cpu"] / med["plain"]["cpu"]
    case = f"{name}, {layers} layer{'s' if layers > 1 else ''}"
    return [
        row(f"plain tvm.compile: {case}", plain, note=f"CPU {med['plain']['cpu'] * 1e3:.0f} ms"),
        row(f"cold through the cache (CPU): {case}", med["cold"]["cpu"], floor=med["plain"]["cpu"], ratio=cpu_ratio,
            goal="<= 1.05x plain", ok=cpu_ratio <= 1.05, note="CPU time of the compiling process, every thread"),
        row(f"cold through the cache (wall): {case}", med["cold"]["wall"], floor=plain, ratio=wall_ratio,
            goal="<= 1.05x plain", ok=verdict(wall_ratio, 1.05, noise),
            note=f"median of per-round ratios, noise +-{noise:.2f}"),
        row(f"warm, a fresh process: {case}", med["warm"]["wall"], floor=plain, ratio=med["warm"]["wall"] / plain,
            goal=">= 20x faster", ok=plain / med["warm"]["wall"] >= 20,
            note=f"{plain / med['warm']['wall']:.0f}x faster; served from {'/'.join(tiers)}"),
        row(f"re-run in the warm process: {case}", rerun, floor=plain, ratio=rerun / plain, goal=">= 100x faster",
            ok=plain / rerun >= 100, note=f"{plain / rerun:.0f}x faster; an equal module built anew"),
    ]


def run(rounds: int) -> list[dict]:
    """Plain, cold and warm tvm.compile per target, as rows."""
    layers = 1 if rounds <= 2 else LAYERS
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-", ignore_cleanup_errors=True) as scratch:
        for name in TARGETS if rounds > 2 else ["llvm"]:
            rows += _target_rows(name, layers, rounds, Path(scratch))
    return rows
