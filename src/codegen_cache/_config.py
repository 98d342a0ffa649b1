"""Settings: explicit arguments, then environment variables, then defaults.

This is the only module that reads the environment for our own settings. Every variable is
listed in ENV_VARS with its parser; docs/configuration.md documents each one and its default.
An empty value counts as unset (so `CODEGEN_CACHE_DIR= cmd` means "the default").

Between the environment and the defaults come the cache directory's own settings, its
`cache.conf` (`_config_file`): the ones in FILE_SETTINGS, parsed by the same parsers, so that a
limit set once with `codegen-cache config --set` binds every process using the directory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ._config_file import FILE_NAME, ConfigFileError, read_config_file
from ._errors import ConfigError
from ._spelling import nearest

__all__ = [
    "ENV_VARS",
    "FILE_ALIASES",
    "FILE_SETTINGS",
    "REMOTE_ACCEPTED",
    "REMOTE_URL_OPTIONS",
    "AwsSettings",
    "Settings",
    "SettingRow",
    "check_directory",
    "aws_settings",
    "check_remote_url",
    "configure_logging",
    "describe_settings",
    "format_age",
    "format_size",
    "parse_age",
    "parse_bool",
    "parse_size",
    "redact_url",
    "refuse_file_as_directory",
    "settings_from_env",
    "file_setting",
    "suggest_env_var",
    "split_remote_urls",
    "own_env_vars",
    "unknown_env_vars",
]

ENV_PREFIX = "CODEGEN_CACHE_"

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
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(name, value, "a whole number of 0 or more")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "a whole number of 0 or more") from None
    if number < 0:
        raise ConfigError(name, value, "a whole number of 0 or more")
    return number


def _parse_deadline(name: str, value: str | float) -> float:
    try:
        seconds = parse_age(name, value)
    except ConfigError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(name, value, "a duration above 0, e.g. 0.5 (seconds) or 2s")
    return seconds


def _parse_level(name: str, value: str) -> str:
    level = str(value).strip().upper()
    if level not in _LOG_LEVELS:
        raise ConfigError(name, value, "one of " + ", ".join(_LOG_LEVELS))
    return level


def _parse_dir(name: str, value: str | os.PathLike[str]) -> Path:
    text = os.fspath(value)
    if not text.strip():
        raise ConfigError(name, value, "a directory path, e.g. ~/.cache/codegen-cache")
    return Path(text).expanduser()


def _parse_dir_list(name: str, value: str | os.PathLike[str] | tuple | list) -> tuple[str, ...]:
    """Directories separated by os.pathsep (or a list of them); each a path, `<path>/*` or `*`."""
    if isinstance(value, (str, os.PathLike)):
        items = [item for item in os.fspath(value).split(os.pathsep) if item.strip()]
    elif isinstance(value, (tuple, list)) and all(isinstance(v, (str, os.PathLike)) for v in value):
        items = [os.fspath(v) for v in value]
    else:
        raise ConfigError(name, value, _DIR_LIST_ACCEPTED)
    dirs = []
    for item in items:
        text = item.strip()
        if text != "*" and not os.path.isabs(os.path.expanduser(text.removesuffix(f"{os.sep}*"))):
            raise ConfigError(name, value, f"{_DIR_LIST_ACCEPTED} ({text!r} is not an absolute path)")
        dirs.append(text if text == "*" else os.path.expanduser(text))
    return tuple(dirs)


_DIR_LIST_ACCEPTED = f"absolute directory paths separated by {os.pathsep!r}; <path>/* for every directory below it; * for all"


def _parse_min_codegen_time(name: str, value: str | float) -> str | float:
    """`auto` (learnt per codegen: docs/cache.md), or a duration: shorter codegen runs are kept in memory only."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_age(name, value)
    except ConfigError:
        raise ConfigError(name, value, _MIN_CODEGEN_ACCEPTED) from None


_MIN_CODEGEN_ACCEPTED = "auto, or seconds of 0 or more, e.g. 0 (store every entry) or 0.002"


def _parse_text(name: str, value: str) -> str | None:
    return str(value) or None


REMOTE_ACCEPTED = (
    "redis://[[user]:password@]host[:port][/db], rediss://... (TLS), unix:///path/to/redis.sock[?db=N] or "
    "s3://BUCKET[/PREFIX]; several separated by spaces or commas are chained in that order"
)
_REMOTE_SCHEMES = ("redis", "rediss", "unix", "s3")
# A chain's URLs: split at whitespace or at a comma where a scheme follows, so a comma inside a
# password or a query does not split a URL.
_CHAIN_SPLIT = re.compile(r"\s+|,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
# S3's bucket naming rules (3-63 characters, lowercase letters, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# The query options of a remote URL; docs/remote.md says what each one does.
REMOTE_URL_OPTIONS = ("db", "timeout", "socket_timeout", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile",
                      "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")


def redact_url(url: str) -> str:
    """The URL (or each URL of a chain) with any password replaced by ***, for messages and listings."""
    parts = split_remote_urls(url) if isinstance(url, str) else []
    if len(parts) > 1:
        return " ".join(redact_url(part) for part in parts)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def split_remote_urls(text: str) -> list[str]:
    """The URLs of a remote setting, in lookup order (one, or a chain such as `redis://... s3://...`)."""
    return [part for part in _CHAIN_SPLIT.split(text.strip()) if part]


def check_remote_url(url: object, name: str = "remote (CODEGEN_CACHE_REMOTE)") -> str:
    """Check a remote URL, or a chain of them; ConfigError naming `name` and the (redacted) value if not.

    The one checker: the environment variable, the CLI (config, doctor) and the remote tiers
    accept and reject exactly the same URLs.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(name, url, REMOTE_ACCEPTED)
    parts = split_remote_urls(url)
    if len(parts) > 1:
        for part in parts:
            _check_one_remote_url(part, name)
        if len(set(parts)) != len(parts):
            raise ConfigError(name, redact_url(url), f"{REMOTE_ACCEPTED} (a URL appears twice in the chain)")
        return url
    return _check_one_remote_url(url.strip(), name)


def _check_one_remote_url(url: str, name: str) -> str:

    def bad(why: str) -> ConfigError:
        return ConfigError(name, redact_url(url), f"{REMOTE_ACCEPTED} ({why})")

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not a number in 0..65535
    except ValueError as err:
        raise bad(str(err)) from None
    if "://" not in url:
        raise bad("no scheme: write it as redis://host:port/db")
    if parts.scheme not in _REMOTE_SCHEMES:
        raise bad(f"scheme {parts.scheme!r} is not one of {', '.join(_REMOTE_SCHEMES)}")
    if parts.scheme == "s3":
        return _check_s3_url(url, parts, bad)
    problem = _remote_query_problem(parts.scheme, parts.query)
    if problem:
        raise bad(problem)
    if parts.scheme == "unix":
        if not parts.path:
            raise bad("a unix:// URL needs the socket path")
        return url
    if not parts.hostname:
        raise bad("no host")
    if port == 0:
        raise bad("port 0")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise bad(f"database {db!r} is not a number")
    return url


def _check_s3_url(url: str, parts, bad) -> str:
    # The endpoint, credentials and region come from the AWS variables and files (aws_settings):
    # nothing of them belongs in the URL, where a log would show it.
    if parts.username is not None or parts.password is not None or parts.port is not None:
        raise bad("an s3:// URL names the bucket alone: credentials and the endpoint come from the AWS "
                  "variables (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...) or files")
    if parts.query or parts.fragment:
        raise bad("an s3:// URL takes no options")
    if not _BUCKET.fullmatch(parts.hostname or ""):
        raise bad(f"bucket {parts.netloc!r} is not an S3 bucket name")
    if "//" in parts.path or any(seg in (".", "..") for seg in parts.path.split("/")):
        raise bad(f"prefix {parts.path!r} has an empty, '.' or '..' part")
    return url


class AwsSettings(NamedTuple):
    """Where an S3 tier connects and as whom: the standard AWS variables, then the profile's files."""

    endpoint: str | None
    region: str | None
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    profile: str


def aws_settings(environ: Mapping[str, str] | None = None) -> AwsSettings:
    """The AWS settings an S3 client reads: variables first, then the profile in the shared files.

    As the AWS SDKs do: AWS_PROFILE (default "default") picks the profile; the credentials file
    (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) gives its keys and the config file
    (AWS_CONFIG_FILE, ~/.aws/config, section "profile NAME") its region and endpoint_url; a
    variable wins over a file. AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL.
    """
    import configparser

    env = os.environ if environ is None else environ
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"

    def read(path: str, section: str) -> Mapping[str, str]:
        parser = configparser.RawConfigParser()
        try:
            parser.read(os.path.expanduser(path), encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            return {}
        return parser[section] if parser.has_section(section) else {}

    creds = read(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials", profile)
    section = profile if profile == "default" else f"profile {profile}"
    config = read(env.get("AWS_CONFIG_FILE") or "~/.aws/config", section)

    def pick(*names: str, files: tuple[Mapping[str, str], ...] = (), key: str = "") -> str | None:
        for var in names:
            if env.get(var):
                return env[var]
        for found in files:
            if found.get(key):
                return found[key]
        return None

    from_files = (creds, config)
    keys_from_env = bool(env.get("AWS_ACCESS_KEY_ID"))
    return AwsSettings(
        endpoint=pick("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", files=(config,), key="endpoint_url"),
        region=pick("AWS_REGION", "AWS_DEFAULT_REGION", files=(config,), key="region"),
        access_key_id=pick("AWS_ACCESS_KEY_ID", files=from_files, key="aws_access_key_id"),
        secret_access_key=pick("AWS_SECRET_ACCESS_KEY", files=() if keys_from_env else from_files,
                               key="aws_secret_access_key"),
        session_token=pick("AWS_SESSION_TOKEN", files=() if keys_from_env else from_files, key="aws_session_token"),
        profile=profile,
    )


def _remote_query_problem(scheme: str, query: str) -> str | None:
    options = dict(parse_qsl(query, keep_blank_values=True))
    for key in options:
        if key not in REMOTE_URL_OPTIONS:
            return f"unknown URL option {key!r}; accepted: {', '.join(REMOTE_URL_OPTIONS)}"
        if key.startswith("ssl_") and scheme != "rediss":
            return f"{key} needs a rediss:// URL"
    if not options.get("db", "0").isdigit():
        return f"database {options['db']!r} is not a number"
    for key in ("timeout", "socket_timeout"):
        try:
            seconds = float(options.get(key, "1"))
        except ValueError:
            seconds = 0.0
        if not 0 < seconds < float("inf"):
            return f"{key}={options[key]!r} is not a number of seconds above 0"
    if options.get("ssl_cert_reqs", "required").lower() not in ("none", "optional", "required"):
        return f"ssl_cert_reqs={options['ssl_cert_reqs']!r} is not one of none, optional, required"
    if options.get("ssl_check_hostname", "true").lower() not in _TRUE | _FALSE - {""}:
        return f"ssl_check_hostname={options['ssl_check_hostname']!r} is not one of true, false"
    return None


def _parse_remote(name: str, value: str) -> str | None:
    text = str(value).strip()
    return check_remote_url(text, name) if text else None


def default_directory() -> Path:
    """The default cache directory: the user cache dir of this tool (platformdirs)."""
    import platformdirs  # only where no directory is given

    return Path(platformdirs.user_cache_dir("codegen-cache", appauthor=False))


def tvm_state_directory() -> Path:
    """Where what was learnt of the installed TVM is kept (its clean state, its digest): per user,
    beside the default cache directory and never inside one, so every cache directory shares it and
    a removed cache directory stays removed."""
    if sys.platform.startswith("linux"):
        # platformdirs' rule on Linux, without importing it on a warm compile's path.
        base = os.environ.get("XDG_CACHE_HOME", "").strip()
        return Path(base if os.path.isabs(base) else os.path.expanduser("~/.cache")) / "codegen-cache-tvm"
    import platformdirs

    return Path(platformdirs.user_cache_dir("codegen-cache-tvm", appauthor=False))


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of the cache, with its default."""

    directory: Path = dataclasses.field(default_factory=default_directory)
    enable: bool = False
    disable: bool = False
    recache: bool = False
    compiled_size_limit: int = 4 << 30
    source_size_limit: int = 1 << 30
    memory_entries: int = 512
    memory_bytes: int = 256 << 20
    verify: bool = False
    read_only: bool = False
    trusted_dirs: tuple[str, ...] = ()
    remote: str | None = None
    remote_secret: str | None = None
    remote_ttl: float = 14 * 86400.0
    remote_max_entry_bytes: int = 32 << 20
    remote_timeout: float = 0.5
    remote_read_only: bool = False
    remote_lease: float = 5.0
    lease_wait: float = 600.0
    failure_ttl: float = 24 * 3600.0
    min_codegen_time: str | float = "auto"
    log_level: str | None = None


# name -> (Settings field, parser, one-line description); docs/configuration.md lists them all.
ENV_VARS: dict[str, tuple[str, object, str]] = {
    "CODEGEN_CACHE_DIR": ("directory", _parse_dir, "cache directory"),
    "CODEGEN_CACHE_ENABLE": ("enable", parse_bool, "1 routes every TVM compile of every Python process through the "
                             "cache, from its first import of tvm (codegen_cache.enable())"),
    "CODEGEN_CACHE_DISABLE": ("disable", parse_bool, "1 turns caching off: lower() calls the codegen (wins over ENABLE)"),
    "CODEGEN_CACHE_RECACHE": ("recache", parse_bool, "1 rebuilds every kernel and overwrites its entry"),
    "CODEGEN_CACHE_COMPILED_SIZE_LIMIT": ("compiled_size_limit", parse_size, "size limit of compiled/"),
    "CODEGEN_CACHE_SOURCE_SIZE_LIMIT": ("source_size_limit", parse_size, "size limit of source/"),
    "CODEGEN_CACHE_MEMORY_ENTRIES": ("memory_entries", _parse_count, "entries in the in-process tier"),
    "CODEGEN_CACHE_MEMORY_BYTES": ("memory_bytes", parse_size, "bytes in the in-process tier"),
    "CODEGEN_CACHE_VERIFY": ("verify", parse_bool, "1 makes every disk/remote hit exact"),
    "CODEGEN_CACHE_READ_ONLY": ("read_only", parse_bool, "1 serves hits and writes nothing to the directory "
                                "(also where it cannot be written)"),
    "CODEGEN_CACHE_TRUSTED_DIRS": ("trusted_dirs", _parse_dir_list,
                                   "cache directories trusted although other users could change them"),
    "CODEGEN_CACHE_REMOTE": ("remote", _parse_remote, "redis://host:port/db (any node of a cluster) or "
                             "s3://BUCKET/PREFIX of a shared tier; several are chained"),
    "CODEGEN_CACHE_REMOTE_SECRET": ("remote_secret", _parse_text, "HMAC key for remote entries"),
    "CODEGEN_CACHE_REMOTE_TTL": ("remote_ttl", parse_age, "remote entries expire this long after a write (0: never)"),
    "CODEGEN_CACHE_REMOTE_MAX_ENTRY": ("remote_max_entry_bytes", parse_size,
                                       "larger entries are neither written nor read"),
    "CODEGEN_CACHE_REMOTE_TIMEOUT": ("remote_timeout", _parse_deadline,
                                     "deadline of each remote call, connecting included"),
    "CODEGEN_CACHE_REMOTE_READ_ONLY": ("remote_read_only", parse_bool,
                                       "1: read the remote, never write to it (consumer hosts, replicas)"),
    "CODEGEN_CACHE_REMOTE_LEASE": ("remote_lease", parse_age,
                                   "expiry of a fleet-wide build lease, renewed while building (0: no lease)"),
    "CODEGEN_CACHE_LEASE_WAIT": ("lease_wait", parse_age, "longest wait for another process's compile"),
    "CODEGEN_CACHE_FAILURE_TTL": ("failure_ttl", parse_age, "how long a codegen failure is remembered"),
    "CODEGEN_CACHE_MIN_CODEGEN_TIME": ("min_codegen_time", _parse_min_codegen_time,
                                       "entries whose codegen runs faster are kept in memory only (auto: 5 ms; "
                                       "0: every entry in every tier)"),
    "CODEGEN_CACHE_LOG_LEVEL": ("log_level", _parse_level, "level of the codegen_cache logger"),
}


# What each parser accepts, for docs and `codegen-cache config`.
ACCEPTED: dict[object, str] = {
    _parse_dir: "a directory path (~ is expanded)",
    parse_bool: "1/0, true/false, yes/no, on/off",
    parse_size: "bytes, or a number with K, M, G or T (powers of 1024), e.g. 512M, 2G",
    parse_age: "seconds, or a number with s, m, h, d or w, e.g. 30s, 12h, 7d",
    _parse_count: "a whole number of 0 or more",
    _parse_deadline: "a duration above 0, e.g. 0.5 (seconds) or 2s",
    _parse_level: "one of " + ", ".join(_LOG_LEVELS),
    _parse_text: "text (empty: unset)",
    _parse_min_codegen_time: _MIN_CODEGEN_ACCEPTED,
    _parse_dir_list: _DIR_LIST_ACCEPTED,
    _parse_remote: REMOTE_ACCEPTED + " (empty: unset)",
}
_FIELD_PARSERS = {field: (var, parse) for var, (field, parse, _doc) in ENV_VARS.items()}


def settings_from_env(environ: Mapping[str, str] | None = None, *, base: Settings | None = None,
                      **overrides: object) -> Settings:
    """Build Settings from explicit overrides, then the environment, then defaults.

    Overrides are parsed like the variable they replace (so `compiled_size_limit="2G"` works)
    and a bad one raises ConfigError naming the argument; a bad variable names the variable.
    With `base`, its values take the place of the environment and the defaults.
    """
    values: dict[str, object] = {}
    if base is not None:
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Settings)}
    else:
        environ = own_env_vars(environ)
        for var, (field, parse, _doc) in ENV_VARS.items():
            raw = environ.get(var)
            if raw is not None and raw.strip():
                values[field] = parse(var, raw)  # type: ignore[operator]
        # The directory's own settings fill what the environment left unset; arguments override both.
        directory = overrides.get("directory")
        directory = _parse_dir("directory", directory) if directory is not None else values.get("directory")
        for field, value in file_settings(directory if directory is not None else default_directory()).items():
            values.setdefault(field, value)
    fields = _setting_names()
    if base is not None:
        # Values given as a Settings object are checked like arguments.
        values = {field: value if field not in _FIELD_PARSERS or value is None
                  else _FIELD_PARSERS[field][1](field, value) for field, value in values.items()}
    for field, value in overrides.items():
        if field not in fields:
            raise TypeError(f"unknown setting {field!r}; known settings: {sorted(fields)}")
        if value is None:
            continue
        _var, parse = _FIELD_PARSERS.get(field, (None, None))
        values[field] = value if parse is None else parse(field, value)  # type: ignore[operator]
    return Settings(**values)  # type: ignore[arg-type]


# The settings a cache directory's cache.conf may hold (by field name): what belongs to the
# directory rather than to one process. `max_size` is ccache's name for the main store's limit.
FILE_SETTINGS = ("compiled_size_limit", "source_size_limit", "failure_ttl", "min_codegen_time", "verify",
                 "read_only")
FILE_ALIASES = {"max_size": "compiled_size_limit"}
_FILE_ACCEPTED = "one of " + ", ".join((*FILE_SETTINGS, *FILE_ALIASES))
_ignored_names: set[tuple[str, str]] = set()  # unknown names of a cache.conf, logged once each


def file_setting(name: str, value: str) -> tuple[str, str]:
    """(field, value as written) for `name=value` of a cache.conf; ConfigError naming what is not accepted."""
    field = FILE_ALIASES.get(name.strip(), name.strip())
    if field not in FILE_SETTINGS:
        raise ConfigError("setting", name, f"{_FILE_ACCEPTED} (the settings a cache directory keeps)")
    _var, parse = _FIELD_PARSERS[field]
    parse(name.strip(), value)  # type: ignore[operator]  # refused here, not by every process that reads it
    return field, value.strip()


def file_settings(directory: str | os.PathLike[str]) -> dict[str, object]:
    """The settings `<directory>/cache.conf` holds, parsed (field -> value); {} where there is none.

    A bad value raises ConfigError naming the file and the setting, as a bad variable does; a name
    that is no setting of a directory (a newer version's, a typo) is ignored, logged once.
    """
    path = os.path.join(os.fspath(directory), FILE_NAME)
    try:
        raw = read_config_file(directory)
    except ConfigFileError as err:
        raise ConfigError(path, str(err), "lines of `name = value`, e.g. max_size = 5G") from None
    values: dict[str, object] = {}
    for name, text in raw.items():
        field = FILE_ALIASES.get(name, name)
        if field not in FILE_SETTINGS:
            if (path, name) not in _ignored_names:
                _ignored_names.add((path, name))
                logging.getLogger(__name__).warning("codegen cache: ignoring %r in %s: not a setting of a cache "
                                                    "directory (%s)", name, path, _FILE_ACCEPTED)
            continue
        if text:
            _var, parse = _FIELD_PARSERS[field]
            values[field] = parse(f"{name} in {path}", text)  # type: ignore[operator]
    return values


@functools.lru_cache(maxsize=1)
def _setting_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(Settings))


def disabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether CODEGEN_CACHE_DISABLE turns caching off (parsed, and a bad value refused, as settings_from_env does)."""
    var = "CODEGEN_CACHE_DISABLE"
    raw = (os.environ if environ is None else environ).get(var)
    _field, parse, _doc = ENV_VARS[var]  # the variable's own parser, as settings_from_env uses it
    return raw is not None and bool(raw.strip()) and bool(parse(var, raw))  # type: ignore[operator]


def own_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CODEGEN_CACHE_* variables that are set, by name (os.environ by default).

    The names are looked at first and only those values read: decoding every variable of the
    environment would be paid by a fresh process's first cache.
    """
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in list(environ) if name.startswith(ENV_PREFIX)}


def unknown_env_vars(environ: Mapping[str, str] | None = None) -> list[str]:
    """CODEGEN_CACHE_* variables that are set but mean nothing (typos)."""
    return sorted(v for v in own_env_vars(environ) if v not in ENV_VARS)


# ccache's names of the settings users reach for first, as a CODEGEN_CACHE_ variable would spell them.
_CCACHE_NAMES = {"MAXSIZE": "CODEGEN_CACHE_COMPILED_SIZE_LIMIT", "MAX_SIZE": "CODEGEN_CACHE_COMPILED_SIZE_LIMIT",
                 "READONLY": "CODEGEN_CACHE_READ_ONLY", "NOCACHE": "CODEGEN_CACHE_DISABLE"}


def suggest_env_var(name: str) -> str | None:
    """The setting's variable `name` most likely misspells (by edit distance, _spelling.nearest); None when
    none is close. ccache's own names (MAXSIZE, READONLY) map to ours."""
    tail = name.removeprefix(ENV_PREFIX).upper()
    if tail.replace("_", "") in _CCACHE_NAMES:
        return _CCACHE_NAMES[tail.replace("_", "")]
    found = nearest(tail, [var.removeprefix(ENV_PREFIX) for var in ENV_VARS])
    return None if found is None else ENV_PREFIX + found


def refuse_file_as_directory(path: str | os.PathLike[str], name: str = "directory (CODEGEN_CACHE_DIR)") -> None:
    """ConfigError where `path` exists and is not a directory (one stat, following links); a missing path is fine."""
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return
    except (OSError, ValueError):
        return  # missing, or not examinable: the cache decides at first use (it makes it, or skips it)
    raise ConfigError(name, os.fspath(path), "a directory (this path is a file)")


def check_directory(path: str | os.PathLike[str], name: str = "CODEGEN_CACHE_DIR") -> Path:
    """Create `path` if needed and check that this user can write there; ConfigError if not.

    The cache itself never fails on a read-only directory (it serves what is there); commands
    that must write (warm, clear, prune, verify --fix) check first so the user learns why.
    """
    path = Path(path).expanduser()
    accepted = "a directory this user can create and write to"
    if path.exists() and not path.is_dir():
        raise ConfigError(name, str(path), f"{accepted} (it is a file)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(name, str(path), f"{accepted} (cannot create it: {err.strerror or err})") from None
    # access() misses read-only mounts for some filesystems and ACLs; a real write does not.
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(name, str(path), f"{accepted} (cannot write there: {err.strerror or err})") from None
    return path


def configure_logging(settings: Settings) -> None:
    """Apply CODEGEN_CACHE_LOG_LEVEL to the codegen_cache logger (only when it is set)."""
    if settings.log_level is None:
        return
    logger = logging.getLogger("codegen_cache")
    logger.setLevel(settings.log_level)
    # Only the user's explicit setting adds a handler, and only where logging is unconfigured.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def format_size(n: float) -> str:
    """Bytes as B, KiB, MiB, GiB or TiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_age(seconds: float) -> str:
    """Seconds as the largest whole unit that fits: 45s, 12m, 3h, 14d (days, as the docs write durations)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0 or seconds >= 2 * size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


class SettingRow(NamedTuple):
    """One setting as `codegen-cache config` shows it."""

    variable: str
    field: str
    value: object
    default: object
    origin: str  # "argument", "environment", "cache.conf" (the directory's own) or "default"
    accepted: str
    description: str


def describe_settings(environ: Mapping[str, str] | None = None, **overrides: object) -> list[SettingRow]:
    """Every setting: its variable, effective value, default, and where the value came from."""
    environ = os.environ if environ is None else environ
    settings = settings_from_env(environ, **overrides)
    in_file = file_settings(settings.directory)
    defaults = Settings()
    rows = []
    for var, (field, parse, doc) in ENV_VARS.items():
        if overrides.get(field) is not None:
            origin = "argument"
        elif (environ.get(var) or "").strip():
            origin = "environment"
        elif field in in_file:
            origin = FILE_NAME
        else:
            origin = "default"
        rows.append(SettingRow(var, field, getattr(settings, field), getattr(defaults, field), origin,
                               ACCEPTED.get(parse, ""), doc))
    return rows
