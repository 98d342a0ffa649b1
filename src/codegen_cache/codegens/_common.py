"""Helpers shared by the built-in codegen families."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["env_salts"]


def env_salts(names: Iterable[str]) -> dict[str, str]:
    """The values of the environment variables a codegen reads, for its cache key."""
    return {f"env:{name}": os.environ.get(name, "<unset>") for name in names}
