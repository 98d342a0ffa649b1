"""A fleet sharing one Redis: what a fresh host's remote hit costs, and how many builds hosts starting together make.

    python benchmarks/bench_fleet.py [--quick] [--json OUT.json]

1. Fleet reuse (llvm, compiled): host A builds each kernel and its upgrader links the shared
   library, which goes to the remote. Then, interleaved round by round in one process: a fresh
   host's remote hit (host B, whose disk entry is deleted before each call, untimed), B's own
   later disk hit, and the bare codegen (the build); after them, apart, a remote hit served the
   LLVM IR only (host C on a second database that holds no library: what the remote served
   before). Goal: remote hit <= 2x disk hit (medians), and B links nothing (no upgrade ever
   asked, a mapped library). A warm-up round comes first: neither hit counts what only a
   process's first call pays (B's connection to Redis, its store's SQLite connection).
   Then the first hit in a fresh process, which counts those for both: fresh interpreters in
   turn, each making its cache, then the kernel, then one timed lowering: a remote hit on an
   empty directory, then a disk hit on the directory that process left.
2. Fleet-wide builds: 8 host processes, each with its own directory, start together on the
   same 30 cold keys (tests/fleet_host.py), with the build lease (default) and without
   (CODEGEN_CACHE_REMOTE_LEASE=0), one after the other on a fresh server. Goal: <= 36 builds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(HERE))

from redis_server import RedisServer, why_no_remote  # noqa: E402
from timing import compile_bytecode, fmt_ratio, fmt_time, interleave, summary  # noqa: E402

SECRET = "bench-fleet-secret"


def reuse(root: Path, url: str, names: list[str], reps: int) -> list[dict]:
    """Section 1: per kernel, medians of the four variants measured side by side."""
    import codegen_cache as cc
    import kernels
    from codegen_cache import _compat
    from codegen_cache._cache import _upgrade
    from codegen_cache._cache._writer import writer

    build = _compat.builtin_func("target.build.llvm")
    ir_url = url.rsplit("/", 1)[0] + "/1"
    rows = []
    for name in names:
        mod, target = cc.prepare_for_codegen(kernels.kernel(name, False), "llvm")
        for where in (url, ir_url):
            a = cc.CodegenCache(root / f"a-{name}-{where[-1]}", remote=where, remote_secret=SECRET)
            a.lower(mod, target)
            assert a.flush(300, upgrades=True)
            key = a.key_for(mod, target).digest
            a.close()
            _upgrade.wait_exited(a.directory, 60)  # its helper process idles a while: not during the timing
        import redis

        with redis.Redis.from_url(ir_url) as client:
            client.delete(*client.keys("codegen-cache:v*:lib:*"))  # database 1 serves the IR only
        b = cc.CodegenCache(root / f"b-{name}", remote=url, remote_secret=SECRET, memory_entries=0)
        c = cc.CodegenCache(root / f"c-{name}", remote=ir_url, remote_secret=SECRET, memory_entries=0)
        tiers: dict[str, Counter] = {"remote": Counter(), "disk": Counter(), "remote_ir": Counter()}
        kinds: Counter = Counter()

        def forget(cache):
            def run():
                writer.wait(30)  # the previous hit's copy is in the store, not half-way there
                cache.store("compiled").delete(key)
                cache.staged("compiled").remove(key)
            return run

        def hit(cache, label):
            def run():
                module, outcome = cache.lower_with_outcome(mod, target)
                tiers[label][outcome.tier] += 1
                if label == "remote":
                    kinds[type(module).__name__] += 1
            return run

        def disk_ready():
            writer.wait(30)

        variants = {"remote": (hit(b, "remote"), forget(b)), "disk": (hit(b, "disk"), disk_ready),
                    "build": lambda: build(mod, target)}
        times = interleave(variants, reps, warmup=1)
        writer.wait(30)
        # Apart, after: each IR hit's copy asks for an upgrade, whose helper process (it
        # imports TVM) would load the machine under the variants above.
        times.update(interleave({"remote_ir": (hit(c, "remote_ir"), forget(c))}, max(5, reps // 3), warmup=1))
        writer.wait(30)
        _upgrade.wait_exited(c.directory, 60)
        upgrade_markers = sorted(p.name for p in (root / f"b-{name}" / "upgrade").glob("compiled.*")) \
            if (root / f"b-{name}" / "upgrade").exists() else []
        row = {"kernel": name, "t": {k: summary(v) for k, v in times.items()},
               "tiers": {k: dict(v) for k, v in tiers.items()}, "remote_modules": dict(kinds),
               "b_upgrades": b.stats().upgrades, "b_upgrade_markers": upgrade_markers}
        row["ratio_remote_disk"] = row["t"]["remote"]["median"] / row["t"]["disk"]["median"]
        row["ratio_p10s"] = row["t"]["remote"]["p10"] / row["t"]["disk"]["p10"]
        row["paired_ratio"] = statistics.median(r / d for r, d in zip(times["remote"], times["disk"]))
        rows.append(row)
        for cache in (b, c):
            cache.close()
    return rows


def first_hit(directory: str, url: str, name: str) -> None:
    """In a fresh interpreter (--first-hit): the first lowering of `name`, timed; one JSON line."""
    import codegen_cache as cc
    import kernels

    cache = cc.CodegenCache(directory, remote=url, remote_secret=SECRET, memory_entries=0)
    mod, target = cc.prepare_for_codegen(kernels.kernel(name, False), "llvm")
    t0 = time.perf_counter()
    module, outcome = cache.lower_with_outcome(mod, target)
    seconds = time.perf_counter() - t0
    print(json.dumps({"tier": outcome.tier, "seconds": seconds, "module": type(module).__name__}), flush=True)
    cache.close()  # its writer's jobs (the remote hit's copy) are done before it exits


def first_hits(root: Path, url: str, names: list[str], rounds: int) -> list[dict]:
    """Per kernel: fresh processes in turn, a remote hit (empty directory) then a disk hit (the one it left)."""
    rows = []
    for name in names:
        times: dict[str, list[float]] = {"remote": [], "disk": []}
        tiers: Counter = Counter()
        for i in range(rounds):
            directory = root / f"first-{name}-{i}"
            for expected in ("remote", "disk"):
                done = subprocess.run([sys.executable, __file__, "--first-hit", str(directory), url, name],
                                      capture_output=True, text=True, timeout=300, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"a fresh process failed:\n{done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                tiers[(expected, result["tier"], result["module"])] += 1
                times[expected].append(result["seconds"])
        row = {"kernel": name, "t": {k: summary(v) for k, v in times.items()},
               "tiers": [[*k, n] for k, n in tiers.items()]}
        row["ratio_remote_disk"] = row["t"]["remote"]["median"] / row["t"]["disk"]["median"]
        rows.append(row)
    return rows


def fleet(root: Path, url: str, hosts: int, keys: int, lease: bool) -> dict:
    """Section 2: `hosts` processes on the same `keys` cold keys, starting together."""
    log = root / "builds.log"
    env = {**os.environ, "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if not lease:
        env["CODEGEN_CACHE_REMOTE_LEASE"] = "0"
    start_at = time.time() + 8 + hosts
    procs = [subprocess.Popen([sys.executable, str(TESTS / "fleet_host.py"), str(root / f"host{h}"), "900",
                               str(keys), "--remote", url, "--secret", SECRET, "--start-at", str(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for h in range(hosts)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"a host failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    builds = Counter(line.split()[1] for line in log.read_text().splitlines())
    tiers = Counter(t for r in results for t in r["tiers"])
    return {"lease": lease, "hosts": hosts, "keys": keys, "builds": sum(builds.values()),
            "max_builds_per_key": max(builds.values()), "tiers": dict(tiers),
            "wrong": sum(len(r["wrong"]) for r in results),
            "lease_waits": sum(r["stats"]["remote_lease_waits"] for r in results),
            "lowering_seconds_median": statistics.median(s for r in results for s in r["seconds"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one kernel, fewer repetitions")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--same-priority", action="store_true",
                        help="leave redis-server at the default priority (by default it gets nice -10 where "
                             "allowed, standing in for a server on its own machine)")
    parser.add_argument("--first-hit", nargs=3, metavar=("DIR", "URL", "KERNEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_hit:
        first_hit(*args.first_hit)
        return
    why = why_no_remote(HERE.parent)
    if why:
        raise SystemExit(f"cannot run: {why}")
    load_start = os.getloadavg()
    names = ["vadd"] if args.quick else ["vadd", "matmul", "64 funcs"]
    reps = 15 if args.quick else 41
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis", priority=None if args.same_priority else -10)
        try:
            rows = reuse(root / "reuse", server.url, names, reps)
            firsts = first_hits(root / "reuse", server.url, names[:2], 3 if args.quick else 7)
            runs = []
            for lease in (True, False):
                import redis

                with redis.Redis.from_url(server.url) as client:
                    client.flushall()
                (root / f"fleet-{lease}").mkdir()
                runs.append(fleet(root / f"fleet-{lease}", server.url, 8, 30, lease))
        finally:
            priority = server.priority
            server.stop()
    load = os.getloadavg()
    print(f"redis-server priority: {'nice ' + str(priority) if priority is not None else 'default'}; "
          f"load average at the start {load_start[0]:.1f}, at the end {load[0]:.1f}")
    print("== 1. fleet reuse: llvm, a fresh host's remote hit vs its disk hit vs the build (medians) ==")
    print(f"{'kernel':>9} {'remote hit':>11} {'disk hit':>9} {'remote/disk':>12} {'(paired)':>9} {'(p10s)':>7} "
          f"{'remote, IR only':>16} {'build':>8}  fresh host: modules, upgrades")
    goals = []
    for r in rows:
        t = r["t"]
        print(f"{r['kernel']:>9} {fmt_time(t['remote']['median']):>11} {fmt_time(t['disk']['median']):>9} "
              f"{fmt_ratio(r['ratio_remote_disk']):>12} {fmt_ratio(r['paired_ratio']):>9} "
              f"{fmt_ratio(r['ratio_p10s']):>7} "
              f"{fmt_time(t['remote_ir']['median']):>16} {fmt_time(t['build']['median']):>8}  "
              f"{r['remote_modules']}, {r['b_upgrades']} upgrades {r['b_upgrade_markers'] or ''}")
        links_nothing = r["b_upgrades"] == 0 and not r["b_upgrade_markers"] and \
            set(r["remote_modules"]) == {"CachedLibraryModule"} and set(r["tiers"]["remote"]) == {"remote"}
        goals.append((f"{r['kernel']}: remote hit <= 2x disk hit, fresh host links nothing",
                      r["ratio_remote_disk"] <= 2.0 and links_nothing))
    print("\n== 1b. the first hit in a fresh process (each a new interpreter; medians) ==")
    print(f"{'kernel':>9} {'remote hit':>11} {'disk hit':>9} {'remote/disk':>12}  tiers")
    for r in firsts:
        t = r["t"]
        print(f"{r['kernel']:>9} {fmt_time(t['remote']['median']):>11} {fmt_time(t['disk']['median']):>9} "
              f"{fmt_ratio(r['ratio_remote_disk']):>12}  {r['tiers']}")
    print("\n== 2. fleet-wide builds: 8 hosts start together on the same 30 cold keys ==")
    print(f"{'lease':>6} {'builds':>7} {'max/key':>8} {'lease waits':>12} {'tiers':>30} {'wrong':>6}")
    for run in runs:
        print(f"{'yes' if run['lease'] else 'no':>6} {run['builds']:>7} {run['max_builds_per_key']:>8} "
              f"{run['lease_waits']:>12} {str(run['tiers']):>30} {run['wrong']:>6}")
    goals.append(("8 hosts x 30 cold keys: <= 36 builds with the lease", runs[0]["builds"] <= 36 and not runs[0]["wrong"]))
    print("\n== goals ==")
    for what, ok in goals:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    if args.json:
        Path(args.json).write_text(json.dumps({"reuse": rows, "first_hits": firsts, "fleet": runs, "goals": goals,
                                               "redis_priority": priority, "load_average": load,
                                               "load_average_start": load_start}, indent=2))


if __name__ == "__main__":
    compile_bytecode()
    main()
