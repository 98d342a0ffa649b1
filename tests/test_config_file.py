"""A cache directory's own settings (cache.conf) bind every process that uses it; the environment overrides.

Also: misspelt CODEGEN_CACHE_* variables get the variable they most likely mean, by edit distance.
"""

from __future__ import annotations

import pytest

import codegen_cache as cc
from codegen_cache import _config
from codegen_cache._config_file import FILE_NAME, read_config_file, write_config_file
import processes


def test_a_limit_in_the_directorys_file_is_every_caches_limit(tmp_path):
    write_config_file(tmp_path, {"compiled_size_limit": "5G"})
    assert cc.CodegenCache(tmp_path).settings.compiled_size_limit == 5 << 30
    assert _config.settings_from_env({"CODEGEN_CACHE_DIR": str(tmp_path)}).compiled_size_limit == 5 << 30


def test_ccaches_max_size_is_the_compiled_stores_limit(tmp_path):
    (tmp_path / FILE_NAME).write_text("# set by hand\nmax_size = 2G\nsource_size_limit=100M\n")
    settings = _config.settings_from_env({}, directory=tmp_path)
    assert settings.compiled_size_limit == 2 << 30 and settings.source_size_limit == 100 << 20


def test_the_environment_and_arguments_override_the_file(tmp_path):
    write_config_file(tmp_path, {"compiled_size_limit": "5G", "source_size_limit": "2G"})
    environ = {"CODEGEN_CACHE_DIR": str(tmp_path), "CODEGEN_CACHE_COMPILED_SIZE_LIMIT": "1G"}
    settings = _config.settings_from_env(environ, source_size_limit="3G")
    assert settings.compiled_size_limit == 1 << 30 and settings.source_size_limit == 3 << 30


def test_config_says_where_each_value_came_from(tmp_path):
    write_config_file(tmp_path, {"compiled_size_limit": "5G"})
    environ = {"CODEGEN_CACHE_DIR": str(tmp_path), "CODEGEN_CACHE_SOURCE_SIZE_LIMIT": "1G"}
    origins = {r.field: r.origin for r in _config.describe_settings(environ)}
    assert origins["compiled_size_limit"] == FILE_NAME
    assert origins["source_size_limit"] == "environment" and origins["verify"] == "default"


def test_a_bad_value_in_the_file_names_the_file_and_the_setting(tmp_path):
    (tmp_path / FILE_NAME).write_text("max_size = lots\n")
    with pytest.raises(cc.ConfigError, match=r"'lots' for max_size in .*cache\.conf: expected a size"):
        cc.CodegenCache(tmp_path)


def test_a_line_that_is_not_name_value_is_refused(tmp_path):
    (tmp_path / FILE_NAME).write_text("max_size 5G\n")
    with pytest.raises(cc.ConfigError, match=r"line 1: 'max_size 5G' is not `name = value`"):
        _config.settings_from_env({}, directory=tmp_path)


def test_a_name_that_is_no_setting_of_a_directory_is_ignored(tmp_path, caplog):
    (tmp_path / FILE_NAME).write_text("remote = redis://elsewhere\nmax_size = 1G\n")
    assert _config.settings_from_env({}, directory=tmp_path).remote is None
    assert "ignoring 'remote'" in caplog.text


def test_only_the_directorys_settings_can_be_set_and_values_are_checked_before_writing():
    assert _config.file_setting("max_size", "5G") == ("compiled_size_limit", "5G")
    with pytest.raises(cc.ConfigError, match="'remote' for setting: expected one of compiled_size_limit"):
        _config.file_setting("remote", "redis://x")
    with pytest.raises(cc.ConfigError, match="'five' for max_size"):
        _config.file_setting("max_size", "five")


def test_a_link_or_a_directory_in_place_of_the_file_is_not_read(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("max_size = 1G\n")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / FILE_NAME).symlink_to(target)
    assert read_config_file(tmp_path / "cache") == {}
    (tmp_path / "other" / FILE_NAME).mkdir(parents=True)
    assert read_config_file(tmp_path / "other") == {}


@pytest.mark.smoke
def test_a_fresh_process_obeys_the_file(tmp_path):
    write_config_file(tmp_path, {"max_size": "3G"})
    done = processes.python(f"""
        import codegen_cache as cc
        print(cc.CodegenCache({str(tmp_path)!r}).settings.compiled_size_limit)
    """, env={"CODEGEN_CACHE_COMPILED_SIZE_LIMIT": None})
    assert done.stdout.split()[-1] == str(3 << 30)


@pytest.mark.parametrize(("typo", "meant"), [
    ("CODEGEN_CACHE_MAXSIZE", "CODEGEN_CACHE_COMPILED_SIZE_LIMIT"),  # ccache's CCACHE_MAXSIZE
    ("CODEGEN_CACHE_DISABLED", "CODEGEN_CACHE_DISABLE"),
    ("CODEGEN_CACHE_REMOTE_TTLL", "CODEGEN_CACHE_REMOTE_TTL"),
    ("CODEGEN_CACHE_READONLY", "CODEGEN_CACHE_READ_ONLY"),
    ("CODEGEN_CACHE_VERFIY", "CODEGEN_CACHE_VERIFY"),  # two letters swapped
    ("CODEGEN_CACHE_FAILURE", "CODEGEN_CACHE_FAILURE_TTL"),
    ("CODEGEN_CACHE_SIZE", None),  # two variables hold a size: no guess
    ("CODEGEN_CACHE_WHATEVER", None),
])
def test_a_misspelt_variable_suggests_the_nearest_by_edit_distance(typo, meant):
    assert _config.suggest_env_var(typo) == meant


def test_the_file_is_readable_by_whoever_may_read_the_directory(tmp_path):
    import os
    import stat

    tmp_path.chmod(0o750)
    path = write_config_file(tmp_path, {"max_size": "1G"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
