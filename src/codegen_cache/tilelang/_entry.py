"""The tilelang frontend's entry format, apart from the frontend so that listing and checking a
cache directory (codegen-cache ls, verify) needs neither tilelang nor TVM."""

from __future__ import annotations

from .._artifacts import Artifact

__all__ = ["ENTRY_CODEC", "entry_problem"]

ENTRY_CODEC = "tilelang-kernel"


def entry_problem(art: Artifact, digest: str) -> str | None:
    """Why an unframed entry cannot serve key `digest` (None: it can). The hit path and verify use it."""
    if art.codec != ENTRY_CODEC:
        return f"codec {art.codec!r}, expected {ENTRY_CODEC!r}"
    if art.meta.get("key") != digest:
        return f"entry is stored under {digest[:16]} but its metadata names key {str(art.meta.get('key'))[:16]}"
    if len(art.fields) != 3:
        return f"{ENTRY_CODEC} entry has {len(art.fields)} payload fields, expected 3"
    if not isinstance(art.meta.get("params"), str):
        return "its kernel parameters (params) are not a string"
    return None
