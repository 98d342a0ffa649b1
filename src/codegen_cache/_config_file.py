"""A cache directory's own settings: `<dir>/cache.conf`, as ccache keeps `ccache.conf` in its directory.

Lines of `name = value` (`#` starts a comment), written by `codegen-cache config --set` and `-M`.
Every process that uses the directory reads it when it makes its cache, so a limit set once binds
them all; _config parses and checks the values as it does the environment's, and the environment
and explicit arguments override them. The file is read without following a link, must be a regular
file, and is read no further than MAX_BYTES; it is replaced by a rename, never rewritten in place.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["FILE_NAME", "MAX_BYTES", "ConfigFileError", "read_config_file", "write_config_file"]

FILE_NAME = "cache.conf"
MAX_BYTES = 64 << 10
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class ConfigFileError(ValueError):
    """A line of a cache.conf that is not `name = value`."""


def read_config_file(directory: str | os.PathLike[str]) -> dict[str, str]:
    """The `name = value` pairs of `<directory>/cache.conf`; {} where there is none (or it is not a regular file).

    ConfigFileError (a ValueError) names the file and the line where a line is not `name = value`.
    """
    path = os.path.join(os.fspath(directory), FILE_NAME)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return {}  # none (or a link in its place: O_NOFOLLOW): the defaults
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ConfigFileError(f"{path} is over {MAX_BYTES} bytes: not a cache.conf")
    values: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise ConfigFileError(f"{path}, line {number}: {line.strip()!r} is not `name = value`")
        values[name.strip()] = value.strip()
    return values


def write_config_file(directory: str | os.PathLike[str], updates: dict[str, str | None]) -> Path:
    """Set (a str) or remove (None) settings in `<directory>/cache.conf`; the file's path.

    Written to a scratch file and renamed over the old one: a reader sees the old file or the new.
    """
    directory = Path(directory)
    values = read_config_file(directory)
    for name, value in updates.items():
        if value is None:
            values.pop(name, None)
        else:
            values[name] = value
    text = "# codegen-cache settings of this directory (codegen-cache config --set NAME=VALUE)\n"
    text += "".join(f"{name} = {value}\n" for name, value in sorted(values.items()))
    fd, temp = tempfile.mkstemp(prefix=".cache.conf.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # Readable by whoever may read the directory (every process of a team cache obeys it),
        # writable by its owner only.
        os.chmod(temp, 0o600 | stat.S_IMODE(os.stat(directory).st_mode) & 0o044)
        os.replace(temp, directory / FILE_NAME)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return directory / FILE_NAME
