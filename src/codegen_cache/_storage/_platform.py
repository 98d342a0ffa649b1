"""Which hosts may load each other's linked llvm libraries: the same OS, machine and C library."""

from __future__ import annotations

import os
import platform
import re
import sys
from functools import lru_cache

__all__ = ["library_platform"]


@lru_cache(maxsize=1)
def library_platform() -> str:
    """This host's platform as far as loading a linked library goes: OS, machine and C library with its version.

    A shared library linked on one host loads on another only where these match (glibc symbol
    versions are checked when it is loaded; another C library or machine cannot load it at
    all), so libraries are shared under this name and never across it. Strict on purpose:
    hosts with different glibc versions share the LLVM IR, and each links its own library.
    """
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc:
        name, version = platform.libc_ver()
        libc = f"{name}{version}" if name else ("darwin" + platform.mac_ver()[0] if sys.platform == "darwin"
                                                else "libc-unknown")
    return re.sub(r"[^A-Za-z0-9._-]+", "", f"{sys.platform}-{platform.machine()}-{libc}")
