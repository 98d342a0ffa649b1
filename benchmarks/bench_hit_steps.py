"""A fresh process's first disk hit of a kernel, step by step, on two source trees in alternating processes.

    python benchmarks/bench_hit_steps.py OLD_SRC NEW_SRC [ROUNDS]

e.g. `git worktree add /tmp/old 71b77ce` then `python benchmarks/bench_hit_steps.py /tmp/old/src src 9`.
Each tree fills a cache directory of its own (the llvm vector add and another kernel, linked into
shared libraries), then, round by round, fresh interpreters with `PYTHONPATH=<tree>` hit the other
kernel first (what a process makes once) and then time the vector add's hit: once plainly (wall
and main-thread CPU time) and once under cProfile. Prints the plain medians and, per tree, the
median cumulative and own time of each function (cProfile inflates short calls alike in both).
Only the public API is used, so any two checkouts compare (docs/benchmarks.md, "Kernel hits at
their floor").
"""
import sys, os, subprocess, json, statistics, tempfile
from pathlib import Path
HERE = str(Path(__file__).resolve().parent)
CHILD = r'''
import sys, time, os, json, cProfile, pstats
sys.path.insert(0, sys.argv[3])
import tvm, tvm_ffi
import codegen_cache as cc
import kernels as K
prepare = getattr(cc, "prepare_for_codegen", None) or cc.lower_for_codegen
mod, tgt = prepare(K.vadd(False), "llvm")
warm, _ = prepare(K.vadd(False, scale=2.0, name="warm"), "llvm")
d = sys.argv[1]
if sys.argv[2] == "fill":
    c = cc.CodegenCache(d, write_behind=False)
    for m in (mod, warm):
        c.lower(m, tgt); c.flush(timeout=600, upgrades=True)
    sys.exit()
cache = cc.CodegenCache(d)
cache.lower(warm, tgt)
if sys.argv[2] == "plain":
    t0, c0 = time.perf_counter(), time.thread_time(); cache.lower(mod, tgt); t1, c1 = time.perf_counter(), time.thread_time()
    print(json.dumps({"total": t1 - t0, "cpu": c1 - c0})); sys.exit()
prof = cProfile.Profile()
prof.enable(); cache.lower(mod, tgt); prof.disable()
out = {}
base = os.path.dirname(cc.__file__)
for (path, line, name), (c_, nc, tt, ct, _) in pstats.Stats(prof).stats.items():
    out[path.replace(base, "cgc").split("site-packages/")[-1] + ":" + name] = [ct, tt, nc]
print(json.dumps(out))
'''
if len(sys.argv) < 3:
    raise SystemExit(__doc__)
trees = {"old": os.path.abspath(sys.argv[1]), "new": os.path.abspath(sys.argv[2])}
n = int(sys.argv[3]) if len(sys.argv) > 3 else 7
env0 = dict(os.environ); env0.pop("PYTHONDONTWRITEBYTECODE", None)
res = {t: [] for t in trees}; plain = {t: [] for t in trees}
with tempfile.TemporaryDirectory() as tmp:
    dirs = {}
    for t, src in trees.items():
        env = dict(env0, PYTHONPATH=src)
        dirs[t] = os.path.join(tmp, t)
        subprocess.run([sys.executable, "-c", CHILD, dirs[t], "fill", HERE], env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-c", CHILD, dirs[t], "plain", HERE], env=env, check=True, capture_output=True)
    for i in range(n):
        for t, src in (list(trees.items()) if i % 2 else list(trees.items())[::-1]):
            env = dict(env0, PYTHONPATH=src)
            for kind in ("prof", "plain"):
                r = subprocess.run([sys.executable, "-c", CHILD, dirs[t], kind, HERE], env=env, check=True, capture_output=True, text=True)
                (res if kind == "prof" else plain)[t].append(json.loads(r.stdout.strip().splitlines()[-1]))
print("plain first-hit medians (no profiler), wall:", {t: round(statistics.median(x["total"] for x in plain[t]) * 1e6) for t in trees},
      "CPU:", {t: round(statistics.median(x["cpu"] for x in plain[t]) * 1e6) for t in trees}, "load", os.getloadavg())
for t in trees:
    keys = set().union(*res[t])
    med = {k: statistics.median(r.get(k, [0, 0, 0])[0] for r in res[t]) for k in keys}
    tot = {k: statistics.median(r.get(k, [0, 0, 0])[1] for r in res[t]) for k in keys}
    print(f"== {t}: cumulative (tottime) medians over {n} processes, us")
    for k in sorted(med, key=lambda k: -med[k])[:45]:
        print(f"{med[k]*1e6:8.0f} {tot[k]*1e6:8.0f}  {k}")
