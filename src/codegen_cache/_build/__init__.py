"""Whole builds through the cache: codegen_cache.build, its index, preparing kernels, MetaSchedule."""

from ._build import BuildPart, BuildRecord, build, build_key, build_with_record
from ._identity import declare_salt
from ._prepare import PreparedKernel, prepare_for_codegen, prepare_kernel
from ._metaschedule import CachedBuild, cached_export, metaschedule_builder

__all__ = [
    "BuildPart",
    "BuildRecord",
    "CachedBuild",
    "PreparedKernel",
    "build",
    "build_key",
    "build_with_record",
    "cached_export",
    "declare_salt",
    "metaschedule_builder",
    "prepare_for_codegen",
    "prepare_kernel",
]
