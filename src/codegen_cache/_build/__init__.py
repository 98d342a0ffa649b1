"""Whole builds through the cache: codegen_cache.build, its index, lowering, MetaSchedule."""

from ._build import BuildPart, BuildRecord, build, build_key, build_with_record
from ._lowering import LoweredKernel, lower_for_codegen, lower_kernel
from ._metaschedule import CachedBuild, cached_export, metaschedule_builder

__all__ = [
    "BuildPart",
    "BuildRecord",
    "CachedBuild",
    "LoweredKernel",
    "build",
    "build_key",
    "build_with_record",
    "cached_export",
    "lower_for_codegen",
    "lower_kernel",
    "metaschedule_builder",
]
