"""Whole builds through the cache: codegen_cache.build, its index, preparing kernels, MetaSchedule.

Each name's module is imported on the first use of the name, so that the switch (which needs
`_build`, `_index`, `_reads` and `_relax`) does not import kernel preparation and MetaSchedule's
builder into every process that compiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._build import BuildPart, BuildRecord, build, build_key, build_with_record
    from ._identity import declare_salt
    from ._metaschedule import CachedBuild, cached_export, metaschedule_builder
    from ._prepare import PreparedKernel, prepare_for_codegen, prepare_kernel

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

# name -> the module that defines it, imported on the first use of the name.
_LAZY = {
    **dict.fromkeys(("BuildPart", "BuildRecord", "build", "build_key", "build_with_record"), "._build"),
    "declare_salt": "._identity",
    **dict.fromkeys(("CachedBuild", "cached_export", "metaschedule_builder"), "._metaschedule"),
    **dict.fromkeys(("PreparedKernel", "prepare_for_codegen", "prepare_kernel"), "._prepare"),
}

__getattr__ = lazy_names(__name__, _LAZY, globals())
