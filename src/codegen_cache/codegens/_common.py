"""Helpers shared by the built-in codegen families."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from .._registry import DeviceCodegen, DeviceCodegenRegistry, default_registry

__all__ = ["env_salts", "register_all"]


def env_salts(names: Iterable[str]) -> dict[str, str]:
    """The values of the environment variables a codegen reads, for its cache key."""
    return {f"env:{name}": os.environ.get(name, "<unset>") for name in names}


def register_all(
    codegens: Mapping[str, Iterable[DeviceCodegen]], registry: DeviceCodegenRegistry | None = None
) -> None:
    """Register each kind's codegens unless a codegen of that name is already there."""
    registry = default_registry if registry is None else registry
    for kind, entries in codegens.items():
        taken = {c.name for c in registry.registered(kind)}
        for codegen in entries:
            if codegen.name not in taken:
                registry.register(kind, codegen)
