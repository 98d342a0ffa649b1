"""Settings: explicit arguments, then environment variables, then defaults.

This is the only module that reads the environment for our own settings.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

import platformdirs

from ._errors import ConfigError

__all__ = ["ENV_VARS", "Settings", "parse_age", "parse_bool", "parse_size", "settings_from_env"]

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_size(name: str, value: str | int) -> int:
    """Parse a byte size such as 2G, 512MiB or 1048576; raise ConfigError naming `name`."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(name, value, "a size of 0 or more bytes, e.g. 512M, 2G or 1048576")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ConfigError(name, value, "a size of 0 or more bytes, e.g. 512M, 2G or 1048576")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_age(name: str, value: str | float) -> float:
    """Parse a duration such as 30s, 12h, 7d or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(name, value, "a duration of 0 or more, e.g. 30s, 12h or 7d")
        return float(value)
    match = _AGE_RE.match(str(value))
    if not match:
        raise ConfigError(name, value, "a duration of 0 or more, e.g. 30s, 12h or 7d")
    return float(match.group(1)) * _AGE_UNITS[match.group(2).lower()]


def parse_bool(name: str, value: str | bool) -> bool:
    """Parse 1/0, true/false, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(name, value, "one of 1, 0, true, false, yes, no, on, off")


def _parse_count(name: str, value: str | int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "a whole number of 0 or more") from None
    if number < 0:
        raise ConfigError(name, value, "a whole number of 0 or more")
    return number


def _parse_level(name: str, value: str) -> str:
    level = str(value).strip().upper()
    if level not in _LOG_LEVELS:
        raise ConfigError(name, value, "one of " + ", ".join(_LOG_LEVELS))
    return level


def default_directory() -> Path:
    """The default cache directory: the user cache dir of this tool (platformdirs)."""
    return Path(platformdirs.user_cache_dir("codegen-cache", appauthor=False))


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of the cache, with its default."""

    directory: Path = dataclasses.field(default_factory=default_directory)
    disable: bool = False
    recache: bool = False
    compiled_size_limit: int = 4 << 30
    source_size_limit: int = 1 << 30
    memory_entries: int = 512
    memory_bytes: int = 256 << 20
    verify: bool = False
    remote: str | None = None
    remote_secret: str | None = None
    remote_ttl: float = 14 * 86400.0
    remote_max_entry_bytes: int = 32 << 20
    lease_timeout: float = 30.0
    lease_wait: float = 600.0
    failure_ttl: float = 24 * 3600.0
    log_level: str | None = None


# name -> (Settings field, parser, one-line description); docs/configuration.md lists them all.
ENV_VARS: dict[str, tuple[str, object, str]] = {
    "CODEGEN_CACHE_DIR": ("directory", lambda n, v: Path(v).expanduser(), "cache directory"),
    "CODEGEN_CACHE_DISABLE": ("disable", parse_bool, "1 turns caching off: lower() calls the codegen"),
    "CODEGEN_CACHE_RECACHE": ("recache", parse_bool, "1 rebuilds every kernel and overwrites its entry"),
    "CODEGEN_CACHE_COMPILED_SIZE_LIMIT": ("compiled_size_limit", parse_size, "size limit of compiled/"),
    "CODEGEN_CACHE_SOURCE_SIZE_LIMIT": ("source_size_limit", parse_size, "size limit of source/"),
    "CODEGEN_CACHE_MEMORY_ENTRIES": ("memory_entries", _parse_count, "entries in the in-process tier"),
    "CODEGEN_CACHE_MEMORY_BYTES": ("memory_bytes", parse_size, "bytes in the in-process tier"),
    "CODEGEN_CACHE_VERIFY": ("verify", parse_bool, "1 makes every disk/remote hit exact"),
    "CODEGEN_CACHE_REMOTE": ("remote", lambda n, v: v or None, "redis://host:port/db of a shared tier"),
    "CODEGEN_CACHE_REMOTE_SECRET": ("remote_secret", lambda n, v: v or None, "HMAC key for remote entries"),
    "CODEGEN_CACHE_REMOTE_TTL": ("remote_ttl", parse_age, "remote entries expire this long after a write (0: never)"),
    "CODEGEN_CACHE_REMOTE_MAX_ENTRY": ("remote_max_entry_bytes", parse_size, "larger entries stay local-only"),
    "CODEGEN_CACHE_LEASE_TIMEOUT": ("lease_timeout", parse_age, "a compile lease expires unless renewed"),
    "CODEGEN_CACHE_LEASE_WAIT": ("lease_wait", parse_age, "longest wait for another process's compile"),
    "CODEGEN_CACHE_FAILURE_TTL": ("failure_ttl", parse_age, "how long a codegen failure is remembered"),
    "CODEGEN_CACHE_LOG_LEVEL": ("log_level", _parse_level, "level of the codegen_cache logger"),
}


def settings_from_env(environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build Settings from explicit overrides, then the environment, then defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for var, (field, parse, _doc) in ENV_VARS.items():
        if var in environ:
            values[field] = parse(var, environ[var])  # type: ignore[operator]
    for field, value in overrides.items():
        if value is not None:
            values[field] = value
    return Settings(**values)  # type: ignore[arg-type]
