"""A fleet sharing one Redis: what a fresh host's remote hit costs, and how many builds hosts starting together make.

1. Fleet reuse (llvm, compiled): host A builds each kernel and its upgrader links the shared
   library, which goes to the remote. Then, interleaved round by round in one process
   (timing.interleave): a fresh host's remote hit (host B, whose disk entry is deleted before
   each call, untimed), B's own later disk hit, and the bare codegen (the build); after them,
   apart, a remote hit served the LLVM IR only (host C on a second database that holds no
   library). A warm-up round comes first: neither hit counts what only a process's first call
   pays (B's connection to Redis, its store's SQLite connection). Then the first hit in a fresh
   process, which counts those for both: fresh interpreters in turn (timing.fresh_rounds), each
   making its cache, then the kernel, then one timed lowering: a remote hit on an empty
   directory, then a disk hit on the directory that process left.
2. Fleet-wide builds: 8 host processes, each with its own directory, start together on the
   same 30 cold keys (tests/fleet_host.py), with the build lease (default) and without
   (CODEGEN_CACHE_REMOTE_LEASE=0), one after the other on a fresh server.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from redis_server import RedisServer, why_no_remote
from timing import child_env, fresh_rounds, interleave, row, run_child, summary

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
ROUNDS = 5
DESCRIPTION = (
    "A fleet of hosts sharing one Redis (a private `redis-server` on loopback): a fresh host's remote hit of an llvm "
    "kernel (the linked library, stored by the host that built it) against its own later disk hit, in one process "
    "and as a fresh process's first call; a remote hit served the LLVM IR only; and 8 host processes starting "
    "together on the same 30 cold keys, with and without the build lease. **Floor**: the disk hit of the same host "
    "(for the builds: one build per key). **Goals**: a remote hit <= 2x the disk hit, and the host that hit links "
    "nothing; with the lease, the 8 hosts make at most 36 builds for 30 keys and no host gets a wrong module.")

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


FIRST_CHILD = r"""
import json, sys, time
import codegen_cache as cc
import kernels
directory, url, secret, name = sys.argv[1:5]
cache = cc.CodegenCache(directory, remote=url, remote_secret=secret, memory_entries=0)
mod, target = cc.prepare_for_codegen(kernels.kernel(name, False), "llvm")
t0 = time.perf_counter()
module, outcome = cache.lower_with_outcome(mod, target)
seconds = time.perf_counter() - t0
cache.close()  # its writer's jobs (the remote hit's copy) are done before it exits
print(json.dumps({"tier": outcome.tier, "seconds": seconds, "module": type(module).__name__}))
"""


def first_hits(root: Path, url: str, name: str, rounds: int) -> dict:
    """Fresh processes: a remote hit on an empty directory, then a disk hit on the one it left."""
    env, count = child_env(), iter(range(1 << 30))

    def both() -> dict:
        directory = str(root / f"first-{name}-{next(count)}")
        remote = run_child(FIRST_CHILD, [directory, url, SECRET, name], env)
        disk = run_child(FIRST_CHILD, [directory, url, SECRET, name], env)
        return {"remote": remote["seconds"], "disk": disk["seconds"], "tiers": [remote["tier"], disk["tier"]]}

    s = fresh_rounds({"first": both}, rounds)["first"]
    return {"remote": statistics.median(x["remote"] for x in s), "disk": statistics.median(x["disk"] for x in s),
            "tiers": sorted({tuple(x["tiers"]) for x in s})}


def run(rounds: int) -> list[dict]:
    """Remote hits against disk hits per kernel, fresh-process first hits, fleet-wide builds, as rows."""
    why = why_no_remote(HERE.parent)
    if why:
        return [row("fleet", None, note=f"skipped: {why}")]
    smoke = rounds <= 2
    names = ["vadd"] if smoke else ["vadd", "matmul", "64 funcs"]
    reps = 3 if smoke else 4 * rounds + 1
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis", priority=-10)
        try:
            for r in reuse(root / "reuse", server.url, names, reps):
                t = r["t"]
                links_nothing = r["b_upgrades"] == 0 and not r["b_upgrade_markers"] and \
                    set(r["remote_modules"]) == {"CachedLibraryModule"} and set(r["tiers"]["remote"]) == {"remote"}
                ratio = r["ratio_remote_disk"]
                out.append(row(f"remote hit of a fresh host: {r['kernel']} / llvm", t["remote"]["median"],
                               floor=t["disk"]["median"], ratio=ratio, goal="<= 2x disk hit, links nothing",
                               ok=ratio <= 2.0 and links_nothing,
                               note=f"per-round ratio {r['paired_ratio']:.2f}; build {t['build']['median'] * 1e3:.1f} ms; "
                                    f"{r['b_upgrades']} upgrades"))
                out.append(row(f"remote hit served LLVM IR only: {r['kernel']} / llvm", t["remote_ir"]["median"],
                               floor=t["disk"]["median"], note="what a remote without the library serves"))
            for name in names[:2]:
                f = first_hits(root / "reuse", server.url, name, max(2, rounds))
                out.append(row(f"a fresh process's first call, remote hit: {name} / llvm", f["remote"], floor=f["disk"],
                               note=f"floor: the next fresh process's disk hit; tiers {f['tiers']}"))
            for lease in (True, False):
                import redis

                with redis.Redis.from_url(server.url) as client:
                    client.flushall()
                (root / f"fleet-{lease}").mkdir()
                hosts, keys = (4, 8) if smoke else (8, 30)
                found = fleet(root / f"fleet-{lease}", server.url, hosts, keys, lease)
                limit = keys + keys // 5
                out.append(row(f"{hosts} hosts x {keys} cold keys, lease {'on' if lease else 'off'}: builds",
                               found["builds"], unit="builds", floor=keys,
                               goal=f"<= {limit} builds, none wrong" if lease else None,
                               ok=found["builds"] <= limit and not found["wrong"] if lease else None,
                               note=f"max {found['max_builds_per_key']} per key; {found['lease_waits']} lease waits; "
                                    f"{found['wrong']} wrong"))
        finally:
            server.stop()
    return out
