"""ccache's ways with a cache: short options, -M and config --set, --dry-run, stats in du's bytes,
config refusing a file for a directory, and read-only users of a directory.

Against real caches in tmp_path, through main(argv) (tests/test_cli.py's helpers), and the entry
point as a subprocess where its process is the point.
"""

from __future__ import annotations

import subprocess

import pytest

import codegen_cache as cc
from codegen_cache._cli import _main as _cli
from codegen_cache._cli._parser import expand_short_options
from codegen_cache._config_file import FILE_NAME, read_config_file
from test_cli import cli, copy, filled, run, run_json  # noqa: F401 - fixtures
import variants


@pytest.mark.parametrize(("argv", "expanded"), [
    (["-s"], ["stats"]), (["-z"], ["stats", "--reset"]), (["-C"], ["clear"]), (["-p"], ["config"]),
    (["-V"], ["--version"]), (["-x", "k.py"], ["explain", "k.py"]),
    (["-M", "5G"], ["config", "--set", "max_size=5G"]), (["-M5G"], ["config", "--set", "max_size=5G"]),
    (["--dir", "d", "-s", "-v"], ["--dir", "d", "stats", "-v"]), (["--json", "-C"], ["--json", "clear"]),
    (["stats", "-s"], ["stats", "-s"]),  # after the command: that command's option, left alone
])
def test_ccaches_short_options_stand_for_commands(argv, expanded):
    assert expand_short_options(argv) == expanded


def test_dash_s_is_stats_and_dash_z_zeroes_it(capsys, copy):
    root, _keys = copy
    assert run_json(capsys, "--dir", str(root), "-s")[1]["counters"]["misses"] == 4
    code, _out, _err = run(capsys, "--dir", str(root), "-z")
    assert code == 0 and run_json(capsys, "--dir", str(root), "-s")[1]["counters"]["misses"] == 0


def test_dash_capital_c_clears(capsys, copy):
    root, _keys = copy
    code, out, _err = run(capsys, "--dir", str(root), "-C")
    assert code == 0 and "removed 4 entries" in out


def test_dash_capital_m_keeps_the_limit_in_the_directory_for_every_process(capsys, tmp_path):
    code, out, _err = run(capsys, "--dir", str(tmp_path), "-M", "5G")
    assert code == 0 and "compiled_size_limit = 5.0 GiB" in out and FILE_NAME in out
    assert read_config_file(tmp_path) == {"compiled_size_limit": "5G"}
    code, data = run_json(capsys, "--dir", str(tmp_path), "-p")
    row = next(r for r in data["settings"] if r["field"] == "compiled_size_limit")
    assert (row["value"], row["origin"]) == (5 << 30, FILE_NAME)
    assert run_json(capsys, "--dir", str(tmp_path), "stats")[1]["stores"]["compiled"]["size_limit"] == 5 << 30
    done = cli("stats", "--json", env={"CODEGEN_CACHE_DIR": str(tmp_path)})  # another process, no variable
    assert '"size_limit": 5368709120' in done.stdout
    assert run(capsys, "--dir", str(tmp_path), "config", "--unset", "max_size")[0] == 0
    assert read_config_file(tmp_path) == {}


def test_config_set_refuses_what_a_directory_does_not_keep_and_bad_values(capsys, tmp_path):
    code, _out, err = run(capsys, "--dir", str(tmp_path), "config", "--set", "remote=redis://x")
    assert code == _cli.EXIT_USAGE and "'remote' for setting: expected one of compiled_size_limit" in err
    code, _out, err = run(capsys, "--dir", str(tmp_path), "-M", "lots")
    assert code == _cli.EXIT_USAGE and "invalid value 'lots' for max_size" in err
    code, _out, err = run(capsys, "--dir", str(tmp_path), "config", "--unset", "remote")
    assert code == _cli.EXIT_CONFIG and "'remote' for --unset" in err
    assert not (tmp_path / FILE_NAME).exists()


def test_config_exits_non_zero_where_the_directory_is_a_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("")
    done = cli("config", env={"CODEGEN_CACHE_DIR": str(path)})
    assert done.returncode == _cli.EXIT_CONFIG
    assert f"invalid value '{path}' for CODEGEN_CACHE_DIR: expected a directory (this path is a file)" in done.stderr


def test_config_suggests_the_variable_a_typo_meant(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CODEGEN_CACHE_MAXSIZE", "5G")
    code, out, _err = run(capsys, "--dir", str(tmp_path), "config")
    assert code == 0
    assert "CODEGEN_CACHE_MAXSIZE is set but is not a codegen-cache setting (did you mean " \
           "CODEGEN_CACHE_COMPILED_SIZE_LIMIT?)" in out


def test_clear_dry_run_removes_nothing(capsys, copy):
    root, _keys = copy
    code, out, _err = run(capsys, "--dir", str(root), "clear", "--dry-run")
    assert code == 0 and "would remove 4 entries" in out
    assert len(run_json(capsys, "--dir", str(root), "ls")[1]) == 4
    assert run_json(capsys, "--dir", str(root), "clear", "-n", "--source")[1]["removed"] == 3


def test_prune_dry_run_lists_what_would_go_and_removes_nothing(capsys, copy):
    root, _keys = copy
    before = sorted(e["key"] for e in run_json(capsys, "--dir", str(root), "ls")[1])
    code, data = run_json(capsys, "--dir", str(root), "prune", "--max-size", "1", "--dry-run")
    assert code == 0 and data["dry_run"] and data["removed"] == len(before) and data["bytes_after"] < data["bytes_before"]
    assert sorted(e["key"] for e in run_json(capsys, "--dir", str(root), "ls")[1]) == before
    code, out, _err = run(capsys, "--dir", str(root), "prune", "--older-than", "0s", "-n")
    assert code == 0 and out.startswith("would remove 4 entries")


def test_prune_removes_the_least_recently_used_first(capsys, tmp_path):
    cache = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)
    keys = [cache.lower_with_outcome(*variants.variant(i))[1].key for i in range(3)]
    cache.close()
    again = cc.CodegenCache(tmp_path, min_codegen_time=0)
    again.lower(*variants.variant(0))  # the first stored is the last used
    again.close()
    code, data = run_json(capsys, "--dir", str(tmp_path), "prune", "--max-size", "1", "--dry-run")
    assert code == 0 and data["keys"][-1] == keys[0] and data["keys"][0] == keys[1]


def test_stats_shows_the_bytes_du_shows(capsys, copy):
    root, _keys = copy
    code, data = run_json(capsys, "--dir", str(root), "stats")
    du = subprocess.run(["du", "-s", "--block-size=1", str(root)], capture_output=True, text=True, check=True)
    assert code == 0 and data["bytes_on_disk"] == int(du.stdout.split()[0])
    assert data["stores"]["source"]["bytes_on_disk"] >= data["stores"]["source"]["bytes"]
    code, out, _err = run(capsys, "--dir", str(root), "stats")
    assert "on disk" in out and "entry bytes" in out


# ---- read-only users -------------------------------------------------------------------------------


def _tree(root):
    """Every path under `root` but the counters (kept where the user can write), with its size and mtime."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if not p.is_relative_to(root / "stats") and p.name != "stats.sqlite" and not p.is_dir()}


def test_read_only_mode_serves_hits_builds_misses_and_writes_nothing(tmp_path, monkeypatch):
    cache = cc.CodegenCache(tmp_path, write_behind=False, min_codegen_time=0)
    cache.lower(*variants.variant(0))
    cache.close()
    before = _tree(tmp_path)
    monkeypatch.setenv("CODEGEN_CACHE_READ_ONLY", "1")
    reader = cc.CodegenCache(tmp_path, min_codegen_time=0)
    assert reader.read_only
    assert reader.lower_with_outcome(*variants.variant(0))[1].tier == "disk"
    assert reader.lower_with_outcome(*variants.variant(1))[1].tier == "codegen"  # built, not stored
    reader.flush()
    reader.close()
    assert _tree(tmp_path) == before
    assert reader.stats().hits_disk == 1  # counted where the user can write (as ccache's read_only does)
    fresh = cc.CodegenCache(tmp_path, min_codegen_time=0)
    assert not fresh.has_entry("compiled", fresh.key_for(*variants.variant(1)).digest)
    fresh.close()


def test_read_only_mode_from_the_directorys_file_binds_every_cache(tmp_path, capsys):
    assert run(capsys, "--dir", str(tmp_path), "config", "--set", "read_only=1")[0] == 0
    cache = cc.CodegenCache(tmp_path, min_codegen_time=0)
    assert cache.read_only and cache.lower_with_outcome(*variants.variant(2))[1].tier == "codegen"
    cache.close()
    assert not (tmp_path / "compiled").exists() and not (tmp_path / "staged").exists()


def test_a_read_only_cache_of_a_missing_directory_does_not_make_it(tmp_path):
    cache = cc.CodegenCache(tmp_path / "none", read_only=True, min_codegen_time=0)
    assert [cache.lower_with_outcome(*variants.variant(3))[1].tier for _ in range(2)] == ["codegen", "memory"]
    cache.close()
    assert not (tmp_path / "none").exists()


def test_a_remembered_failure_is_not_written_by_a_read_only_cache(tmp_path, llvm_vadd):
    def build(mod, target):
        raise ValueError("bad tile")

    codegen = cc.DeviceCodegen("llvm", build=build, build_without_compile=build)
    cache = cc.CodegenCache(tmp_path, read_only=True, min_codegen_time=0)
    with pytest.raises(ValueError, match="bad tile"):
        cache.lower(*llvm_vadd, codegen=codegen)
    assert not (tmp_path / "failures").exists()


@pytest.mark.smoke
def test_read_only_commands_on_an_unwritable_directory_warn_of_nothing(tmp_path):
    from test_reliability import read_only_view

    cache = cc.CodegenCache(tmp_path / "populated", write_behind=False, min_codegen_time=0)
    cache.lower(*variants.variant(0))
    cache.close()
    with read_only_view(tmp_path / "populated", tmp_path / "ro") as ro:
        for argv in (["stats"], ["ls"], ["verify"], ["config"], ["-s"]):
            done = cli("--dir", str(ro), *argv)
            assert done.returncode == 0 and "cannot be written" not in done.stderr + done.stdout, (argv, done.stderr)
        done = cli("--dir", str(ro), "stats")
        assert "read-only: hits are served" in done.stdout and "not kept" in done.stdout
        reader = cc.CodegenCache(ro, min_codegen_time=0)
        assert reader.read_only and reader.lower_with_outcome(*variants.variant(0))[1].tier == "disk"
        reader.close()


def test_the_config_sample_in_cli_md_lists_every_row_config_prints():
    from pathlib import Path

    from codegen_cache._config import ENV_VARS

    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    sample = page[page.index("$ CODEGEN_CACHE_MEMORY_ENTRIES=64 codegen-cache config"):]
    rows = [line.split()[0] for line in sample.split("```")[0].splitlines()[2:] if line.strip()]
    assert rows == list(ENV_VARS)


def test_read_only_mode_does_not_stop_an_explicit_clear_but_warm_refuses(capsys, copy, monkeypatch):
    root, _keys = copy
    monkeypatch.setenv("CODEGEN_CACHE_READ_ONLY", "1")
    code, _out, err = run(capsys, "--dir", str(root), "warm", str(variants.__file__), "-t", "llvm", "-j", "0")
    assert code == _cli.EXIT_CONFIG and "a read-only cache stores nothing" in err
    code, out, _err = run(capsys, "--dir", str(root), "clear")
    assert code == 0 and "removed 4 entries" in out
