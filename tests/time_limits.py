"""Time limits for tests on a loaded machine: relative to comparable work timed in the same run.

An absolute limit such as "< 2 s" flakes when the machine is busy (a forked child's exit took
2.34 s at load 5): the time the same kind of work takes in this run says how busy it is. A
limit derived from it must still fail on the fault the test is about, so every limit has a
ceiling below what that fault costs (a 30 s wait, a hang).
"""

from __future__ import annotations

__all__ = ["limit"]


def limit(baseline: float, *, at_least: float, at_most: float, factor: float = 4.0) -> float:
    """`factor` x `baseline` (comparable work timed in this run) plus `at_least`, capped at `at_most`.

    `at_most` must stay below what the fault under test costs, so the test can still fail.
    """
    if not 0 < at_least < at_most:
        raise ValueError(f"need 0 < at_least < at_most, got {at_least} and {at_most}")
    return min(at_most, at_least + factor * max(0.0, baseline))
