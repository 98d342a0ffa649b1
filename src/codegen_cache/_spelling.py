"""The name a misspelt one most likely meant, by edit distance (for CODEGEN_CACHE_* variables)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["edit_distance", "nearest"]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions), a swap of two neighbours counting one."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate `name` most likely misspells; None when none is close.

    Close: at most a third of the name's letters (two at least) differ. Where none is, the one
    candidate that shares a word (between underscores) of three letters or more with it; none
    where several do (a guess among them would mislead).
    """
    candidates = list(candidates)
    if not candidates:
        return None
    distance, best = min((edit_distance(name, c), c) for c in candidates)
    if distance <= max(2, len(name) // 3):
        return best
    words = {w for w in name.split("_") if len(w) >= 3}
    sharing = [c for c in candidates if words & set(c.split("_"))]
    return sharing[0] if len(sharing) == 1 else None
