"""What naming the outcome's fields costs a lowering: the old positional emit against the named ones.

    python benchmarks/bench_emit.py [--rounds 31]

Every lowering records one outcome (`_outcome.emit`), a memory hit included. Variants, timed
interleaved (a batch of each per round, order shuffled), median per call, no sink collecting:

- positional: the emit of before issue 26, `emit(*fields)` with nine positional values (kept
  as a tuple, made into an Outcome only when read);
- keywords: today's `emit(tier=..., key=..., ...)`, keyword-only, kept as the same tuple;
- dataclass: an `Outcome(...)` (frozen, slotted) built by keywords on every call, then kept.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleave  # noqa: E402

from codegen_cache import _outcome  # noqa: E402
from codegen_cache._outcome import Outcome  # noqa: E402


def positional_emit(*fields: object) -> None:
    """The emit of before issue 26 (its body as it was)."""
    sinks = _outcome._sinks.get()
    if sinks:
        outcome = Outcome(*fields)
        _outcome._last.set(outcome)
        for sink in sinks:
            sink.append(outcome)
    else:
        _outcome._last.set(fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    digest = "0" * 32
    number = 20000

    def positional():
        for _ in range(number):
            positional_emit("memory", digest, "cuda", "source", 1e-5, 0.0, 1e-3, 2e-5)

    def keywords():
        for _ in range(number):
            _outcome.emit(tier="memory", key=digest, codegen="cuda", mode="source", key_seconds=1e-5,
                          load_seconds=0.0, codegen_seconds=1e-3, total_seconds=2e-5)

    def dataclass():
        for _ in range(number):
            _outcome._last.set(Outcome(tier="memory", key=digest, codegen="cuda", mode="source", key_seconds=1e-5,
                                       load_seconds=0.0, codegen_seconds=1e-3, total_seconds=2e-5))

    samples = interleave({"positional": positional, "keywords": keywords, "dataclass": dataclass}, args.rounds)
    medians = {name: statistics.median(xs) / number for name, xs in samples.items()}
    for name, seconds in medians.items():
        print(f"{name:<12} {seconds * 1e9:7.0f} ns   {(seconds - medians['positional']) * 1e9:+6.0f} ns")
    assert _outcome.last_outcome().tier == "memory"


if __name__ == "__main__":
    main()
