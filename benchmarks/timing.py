"""The one timing helper of every suite: interleaved rounds, fresh processes, CPU time, medians, rows.

- `interleave`: variants in this process, one call of each per round, the order shuffled;
- `fresh_rounds`: variants that are each a fresh interpreter, one of each per round, the order
  shuffled; each child prints one JSON object of what it timed (its main thread's CPU time
  where a loaded machine would disturb the wall time);
- `paired`: the median of per-round ratios of two variants and its noise (IQR / sqrt(n));
- `row`: one result row as every suite returns it (name, median, unit, floor, ratio, goal, ok, note).
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["child_env", "compile_bytecode", "fmt_time", "fresh_rounds", "interleave", "paired",
           "percentile", "row", "run_child", "summary", "verdict"]

TESTS = str(Path(__file__).resolve().parent.parent / "tests")
HERE = str(Path(__file__).resolve().parent)

# A variant is a callable, or (callable, untimed callable run just before it).
Variant = Callable[[], Any] | tuple[Callable[[], Any], Callable[[], Any] | None]


def interleave(variants: Mapping[str, Variant], reps: int, *, warmup: int = 1) -> dict[str, list[float]]:
    """Time each variant `reps` times, one of each per round, in a new order every round.

    On a shared, noisy machine a slow spell then hits every variant alike, so the ratios of
    medians stay meaningful even when the absolute numbers drift. The order is shuffled (seeded,
    so runs compare), not rotated: under a rotation each variant always follows the same one,
    and what that one leaves behind (evicted caches, the writer thread's work) is charged to it
    alone.
    """
    names = list(variants)
    calls = {n: (v if isinstance(v, tuple) else (v, None)) for n, v in variants.items()}
    for _ in range(warmup):
        for name in names:
            fn, pre = calls[name]
            if pre is not None:
                pre()
            fn()
    out: dict[str, list[float]] = {n: [] for n in names}
    order, rng = list(names), random.Random(0)
    for _ in range(reps):
        rng.shuffle(order)
        for name in order:
            fn, pre = calls[name]
            if pre is not None:
                pre()
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    return out


def child_env(**extra: str | None) -> dict[str, str]:
    """The environment of a timed child: no CODEGEN_CACHE_* of the caller, .pyc files written as a
    user's processes write them, benchmarks/ then tests/ importable; `extra` set (None: removed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEGEN_CACHE_")
           and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, TESTS, env.get("PYTHONPATH")]))
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_child(code: str, args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
              timeout: float = 900) -> dict[str, Any]:
    """Run `python -c code args` in a fresh interpreter; the JSON object its last line prints."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=child_env() if env is None else env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {list(args)[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# A fresh variant: (code, args, env), or a callable returning the child's JSON object.
Fresh = tuple[str, list[str], dict[str, str]] | Callable[[], dict[str, Any]]


def fresh_rounds(variants: Mapping[str, Fresh], rounds: int, *, warmup: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Each variant a fresh process, one of each per round, in a new (seeded) order every round.

    Returns every child's JSON object per variant. As with `interleave`, a slow spell of a
    shared machine then hits every variant alike, so per-round ratios (`paired`) hold.
    """
    def call(v: Fresh) -> dict[str, Any]:
        return v() if callable(v) else run_child(v[0], v[1], v[2])

    names = list(variants)
    for _ in range(warmup):  # page cache and .pyc files
        for name in names:
            call(variants[name])
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    order, rng = list(names), random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            out[name].append(call(variants[name]))
    return out


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """(median of the per-round ratios a/b, its noise: IQR / sqrt(n); inf under 4 rounds)."""
    ratios = [x / y for x, y in zip(a, b) if y]
    if not ratios:
        return float("nan"), float("inf")
    if len(ratios) < 4:
        return statistics.median(ratios), float("inf")
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), (q[2] - q[0]) / len(ratios) ** 0.5


def verdict(value: float, goal: float, noise: float = 0.0, *, at_least: bool = False) -> bool | None:
    """True within the goal; False past it by more than the noise; None past it within the noise."""
    if value != value:
        return None
    if (value >= goal) if at_least else (value <= goal):
        return True
    beyond = (goal - value) if at_least else (value - goal)
    return False if beyond > noise else None


def row(name: str, median: float | None, unit: str = "s", *, floor: float | None = None,
        ratio: float | None = None, goal: str | None = None, ok: bool | None = None, note: str = "") -> dict[str, Any]:
    """One result row: what every suite's run() returns a list of."""
    if ratio is None and floor and median is not None:
        ratio = median / floor
    return {"name": name, "median": median, "unit": unit, "floor": floor, "ratio": ratio, "goal": goal, "ok": ok,
            "note": note}


def compile_bytecode() -> None:
    """Write the package's bytecode, as `pip install` does, before any fresh process is timed.

    These machines set PYTHONDONTWRITEBYTECODE, so with the editable install the benchmarks
    run from, each module changed since its last .pyc (or never compiled, like a codegen module
    loaded at first use) would be compiled from source in every fresh interpreter: 1-3 ms
    of a cold compile's or a first hit's time that an installed package does not spend.
    """
    spec = importlib.util.find_spec("codegen_cache")
    if spec is not None and spec.origin is not None:
        compileall.compile_dir(Path(spec.origin).parent, quiet=2)


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(xs: list[float]) -> dict[str, float]:
    """Median, p10, p90, min and count of samples (seconds)."""
    if not xs:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan"), "min": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "p10": percentile(xs, 10), "p90": percentile(xs, 90),
            "min": min(xs), "n": len(xs)}


def fmt_time(seconds: float | None) -> str:
    """Seconds as a short string in us, ms or s."""
    if seconds is None or seconds != seconds:
        return "-"
    if seconds < 0:
        return "-" + fmt_time(-seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us" if seconds >= 1e-5 else f"{seconds * 1e6:.1f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms" if seconds < 0.1 else f"{seconds * 1e3:.0f}ms"
    return f"{seconds:.2f}s"
