"""Settings: explicit arguments, then environment variables, then defaults; clear errors for bad values."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache import _config as config
from codegen_cache._config import ConfigError, Settings, settings_from_env


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("1048576", 1 << 20), ("512M", 512 << 20), ("512MiB", 512 << 20), ("2g", 2 << 30),
     ("1.5K", 1536), (" 3 GB ", 3 << 30), (7, 7)],
)
def test_parse_size_accepts(text, expected):
    assert config.parse_size("X", text) == expected


@pytest.mark.parametrize("text", ["lots", "-1", "1Q", "", "M", -4, "1 2"])
def test_parse_size_rejects_naming_the_setting(text):
    with pytest.raises(ConfigError, match=r"for CODEGEN_CACHE_X: expected a size of 0 or more bytes"):
        config.parse_size("CODEGEN_CACHE_X", text)


@pytest.mark.parametrize(("text", "expected"), [("30", 30), ("30s", 30), ("12h", 43200), ("7d", 604800),
                                                ("2w", 1209600), ("1.5m", 90), (0.25, 0.25)])
def test_parse_age_accepts(text, expected):
    assert config.parse_age("X", text) == expected


@pytest.mark.parametrize("text", ["soon", "-1", "5y", -2.0])
def test_parse_age_rejects(text):
    with pytest.raises(ConfigError, match=r"expected a duration of 0 or more"):
        config.parse_age("X", text)


@pytest.mark.parametrize(("text", "expected"), [("1", True), ("yes", True), ("ON", True), ("true", True),
                                                ("0", False), ("no", False), ("off", False), (False, False)])
def test_parse_bool(text, expected):
    assert config.parse_bool("X", text) is expected


def test_parse_bool_rejects():
    with pytest.raises(ConfigError, match=r"invalid value 'maybe' for X: expected one of 1, 0, true"):
        config.parse_bool("X", "maybe")


def test_every_variable_sets_a_field_and_every_field_has_a_variable():
    fields = {f.name for f in dataclasses.fields(Settings)}
    mapped = [field for field, _parse, _doc in config.ENV_VARS.values()]
    assert sorted(mapped) == sorted(fields)
    assert all(var.startswith("CODEGEN_CACHE_") for var in config.ENV_VARS)
    assert all(parse in config.ACCEPTED for _field, parse, _doc in config.ENV_VARS.values())


def test_defaults():
    s = settings_from_env({})
    assert s == Settings()
    assert s.directory == config.default_directory()
    assert s.disable is False and s.recache is False and s.remote is None


def test_environment_then_explicit_arguments():
    env = {"CODEGEN_CACHE_SOURCE_SIZE_LIMIT": "2G", "CODEGEN_CACHE_DIR": "~/somewhere",
           "CODEGEN_CACHE_RECACHE": "1", "CODEGEN_CACHE_LOG_LEVEL": "debug"}
    s = settings_from_env(env)
    assert s.source_size_limit == 2 << 30 and s.recache is True and s.log_level == "DEBUG"
    assert s.directory == Path("~/somewhere").expanduser()
    s = settings_from_env(env, source_size_limit="16M", directory=Path("/x"), recache=None)
    assert s.source_size_limit == 16 << 20 and s.directory == Path("/x")
    assert s.recache is True  # None means "not given": the environment's value stays


def test_empty_value_means_unset():
    s = settings_from_env({"CODEGEN_CACHE_DIR": "", "CODEGEN_CACHE_COMPILED_SIZE_LIMIT": " ",
                           "CODEGEN_CACHE_REMOTE": ""})
    assert s == Settings()


def test_bad_explicit_argument_names_the_argument():
    with pytest.raises(ConfigError, match=r"invalid value -1 for compiled_size_limit"):
        settings_from_env({}, compiled_size_limit=-1)
    with pytest.raises(TypeError, match=r"unknown setting 'size'"):
        settings_from_env({}, size=1)


def test_remote_url_scheme_is_checked():
    assert settings_from_env({"CODEGEN_CACHE_REMOTE": "rediss://h:6380/1"}).remote == "rediss://h:6380/1"
    with pytest.raises(ConfigError, match=r"for CODEGEN_CACHE_REMOTE: expected redis://"):
        settings_from_env({"CODEGEN_CACHE_REMOTE": "http://h"})
    with pytest.raises(ConfigError, match=r"'http://user:\*\*\*@h:1'") as err:  # the password is not echoed
        settings_from_env({"CODEGEN_CACHE_REMOTE": "http://user:hunter2@h:1"})
    assert "hunter2" not in str(err.value)


def test_cache_constructor_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("CODEGEN_CACHE_SOURCE_SIZE_LIMIT", "64M")
    cache = cc.CodegenCache()
    assert cache.directory == tmp_path / "from-env" and cache.settings.source_size_limit == 64 << 20
    cache = cc.CodegenCache(tmp_path / "explicit", source_size_limit=1 << 20)
    assert cache.directory == tmp_path / "explicit" and cache.settings.source_size_limit == 1 << 20
    monkeypatch.setenv("CODEGEN_CACHE_MEMORY_BYTES", "lots")
    with pytest.raises(ConfigError, match=r"'lots' for CODEGEN_CACHE_MEMORY_BYTES"):
        cc.CodegenCache(tmp_path / "x")


def test_unknown_variables_are_found():
    env = {"CODEGEN_CACHE_DIRR": "x", "CODEGEN_CACHE_DIR": "y", "OTHER": "z"}
    assert config.unknown_env_vars(env) == ["CODEGEN_CACHE_DIRR"]


def test_check_directory(tmp_path):
    made = config.check_directory(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # the write probe is cleaned up
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"for CODEGEN_CACHE_DIR: expected .* \(it is a file\)"):
        config.check_directory(blocker)
    with pytest.raises(ConfigError, match=r"for --dir: expected a directory .* \(cannot create it"):
        config.check_directory(blocker / "sub", "--dir")


def test_describe_settings_gives_origins():
    rows = {r.variable: r for r in config.describe_settings({"CODEGEN_CACHE_VERIFY": "1"}, failure_ttl=5)}
    assert rows["CODEGEN_CACHE_VERIFY"].origin == "environment" and rows["CODEGEN_CACHE_VERIFY"].value is True
    assert rows["CODEGEN_CACHE_FAILURE_TTL"].origin == "argument" and rows["CODEGEN_CACHE_FAILURE_TTL"].value == 5
    assert rows["CODEGEN_CACHE_DISABLE"].origin == "default"


def test_configure_logging_only_when_asked():
    logger = logging.getLogger("codegen_cache")
    before = logger.level
    try:
        config.configure_logging(Settings())
        assert logger.level == before
        config.configure_logging(Settings(log_level="DEBUG"))
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(before)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)


def test_formats():
    assert config.format_size(0) == "0 B" and config.format_size(1536) == "1.5 KiB"
    assert config.format_size(4 << 30) == "4.0 GiB"
    assert config.format_age(30) == "30s" and config.format_age(86400) == "1d" and config.format_age(14 * 86400) == "14d"


def test_recache_rebuilds_and_overwrites(monkeypatch, tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    first = cc.CodegenCache(tmp_path / "c", write_behind=False)
    _module, outcome = first.lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "codegen"
    created = _created(first, outcome.key)
    monkeypatch.setenv("CODEGEN_CACHE_RECACHE", "1")
    again = cc.CodegenCache(tmp_path / "c", write_behind=False)
    assert again.settings.recache is True
    for _ in range(2):  # not served from memory either
        _module, outcome = again.lower_with_outcome(mod, target, compile_device=False)
        assert outcome.tier == "codegen" and outcome.stored
    assert _created(again, outcome.key) > created  # the entry was overwritten
    monkeypatch.delenv("CODEGEN_CACHE_RECACHE")
    _module, outcome = cc.CodegenCache(tmp_path / "c", write_behind=False).lower_with_outcome(
        mod, target, compile_device=False)
    assert outcome.tier == "disk"


def _created(cache: cc.CodegenCache, key: str) -> float:
    from codegen_cache._artifacts import read_meta

    return read_meta(cache.store("source").get(key))[1]["created"]


@pytest.mark.slow
def test_disable_turns_the_default_cache_off(tmp_path):
    script = "import codegen_cache as cc; print(cc.get_cache())"
    env = {**os.environ, "CODEGEN_CACHE_DISABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
