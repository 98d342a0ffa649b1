"""Where a fresh host's remote hit of an llvm library goes, step by step, beside its disk hit.

    python benchmarks/profile_fleet_hit.py [--kernels vadd,matmul] [--reps 41]

As bench_fleet.py's fleet reuse (host A builds and links, host B's remote hit with its disk
entry deleted before each call, then B's disk hit, interleaved), with the steps of both paths
wrapped in perf_counter timers (private methods: a profiling tool, not a user of the API).
A step missing from this code's version is left out. The timers' own cost is in every figure.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from redis_server import RedisServer  # noqa: E402
from timing import compile_bytecode, interleave  # noqa: E402

SECRET = "profile-fleet-secret"
_times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
_label: list[str | None] = [None]


def _wrap(owner, name: str, tag: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None:
        return

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if _label[0]:
                _times[(_label[0], tag)].append(time.perf_counter() - t0)

    setattr(owner, name, timed)


def _instrument() -> None:
    from codegen_cache._cache import _promotion, _tiers
    from codegen_cache._storage import _client, _disk, _pending, _remote

    for owner, name, tag in [
        (_tiers.DiskTier, "get", "disk tier"), (_disk.ArtifactStore, "read", "  store read"),
        (_pending.PendingFiles, "read", "  staged-file read"), (_tiers.RemoteTierView, "get", "remote tier"),
        (_remote.RedisTier, "fetch", "  RedisTier.fetch"), (_remote.RedisTier, "get", "  RedisTier.get"),
        (_client.RespClient, "get", "    GET round trip"), (_remote, "open_value", "    envelope checks"),
        (_promotion.Promotion, "_stage_fill", "  staged file written"), (_tiers, "decode_entry", "  decode"),
        (_promotion.Promotion, "_promote_fill", "copy handed to the writer"),
    ]:
        _wrap(owner, name, tag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="vadd", help="comma-separated names from benchmarks/kernels.py")
    parser.add_argument("--reps", type=int, default=41)
    args = parser.parse_args()
    import codegen_cache as cc
    import kernels
    from codegen_cache._cache import _upgrade
    from codegen_cache._cache._writer import writer

    _instrument()
    with tempfile.TemporaryDirectory(prefix="profile-fleet-") as tmp:
        root = Path(tmp)
        server = RedisServer(root / "redis", priority=-10)
        try:
            for name in args.kernels.split(","):
                mod, target = cc.prepare_for_codegen(kernels.kernel(name, False), "llvm")
                a = cc.CodegenCache(root / f"a-{name}", remote=server.url, remote_secret=SECRET)
                a.lower(mod, target)
                assert a.flush(300, upgrades=True)
                key = a.key_for(mod, target).digest
                a.close()
                _upgrade.wait_exited(a.directory, 60)
                b = cc.CodegenCache(root / f"b-{name}", remote=server.url, remote_secret=SECRET, memory_entries=0)
                tiers: collections.Counter = collections.Counter()

                def forget(b=b, key=key):
                    writer.wait(30)
                    b.store("compiled").delete(key)
                    b.staged("compiled").remove(key)

                def hit(label, b=b, mod=mod, target=target, tiers=tiers):
                    def run():
                        _label[0] = label
                        try:
                            tiers[(label, b.lower_with_outcome(mod, target)[1].tier)] += 1
                        finally:
                            _label[0] = None
                    return run

                times = interleave({"remote": (hit("remote"), forget), "disk": (hit("disk"), lambda: writer.wait(30))},
                                   args.reps, warmup=1)
                remote, disk = (statistics.median(times[k]) for k in ("remote", "disk"))
                print(f"{name}: remote hit {remote * 1e6:.0f} us, disk hit {disk * 1e6:.0f} us, "
                      f"{remote / disk:.2f}x; tiers {dict(tiers)}; load average {os.getloadavg()[0]:.1f}")
                for label in ("remote", "disk"):
                    for (which, tag), xs in _times.items():
                        if which == label:
                            print(f"  {label:6} {tag:28} {statistics.median(xs) * 1e6:8.1f} us  (n={len(xs)})")
                _times.clear()
                b.close()
        finally:
            server.stop()


if __name__ == "__main__":
    compile_bytecode()
    main()
