"""Timing helpers: interleaved repetitions, medians, percentiles, unit formatting."""

from __future__ import annotations

import compileall
import importlib.util
import random
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["compile_bytecode", "fmt_ratio", "fmt_time", "interleave", "linear_fit", "percentile", "summary"]

# A variant is a callable, or (callable, untimed callable run just before it).
Variant = Callable[[], Any] | tuple[Callable[[], Any], Callable[[], Any] | None]


def interleave(variants: Mapping[str, Variant], reps: int, *, warmup: int = 1) -> dict[str, list[float]]:
    """Time each variant `reps` times, one of each per round, in a new order every round.

    On a shared, noisy machine a slow spell then hits every variant alike, so the ratios of
    medians stay meaningful even when the absolute numbers drift. The order is shuffled (seeded,
    so runs compare), not rotated: under a rotation each variant always follows the same one,
    and what that one leaves behind (evicted caches, the writer thread's work) is charged to it
    alone (what that did to section 7: docs/benchmarks.md).
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


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares line y = slope * x + intercept, with r^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx if sxx else float("nan")
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys))
    return {"slope": slope, "intercept": intercept, "r2": 1 - ss_res / ss_tot if ss_tot else float("nan")}


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


def fmt_ratio(ratio: float | None) -> str:
    """A ratio as 1.23x / 45x / 6789x."""
    if ratio is None or ratio != ratio:
        return "-"
    if ratio < 10:
        return f"{ratio:.2f}x"
    return f"{ratio:.0f}x"
