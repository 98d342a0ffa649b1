"""The cache: CodegenCache over the memory, disk and remote tiers, single-flight, failures, writer."""

from ._cache import CodegenCache

__all__ = ["CodegenCache"]
