"""The codegen-cache command, against real caches in tmp_path: in-process via main(argv), and as
a subprocess for the entry point, exit codes and error output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import CUDA_TARGET, HAS_NVCC

import codegen_cache as cc
from codegen_cache._cache import _upgrade
from codegen_cache._cli import _main as _cli
from codegen_cache._artifacts import frame, read_meta
from codegen_cache._key import CacheKey

TESTS = Path(__file__).parent
KERNELS = str(TESTS / "kernels.py")


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache directory with llvm (compiled), c and CUDA (source) entries, and their keys."""
    import kernels

    root = tmp_path_factory.mktemp("filled") / "cache"
    cache = cc.CodegenCache(root, write_behind=False)
    keys = {}
    for label, kernel, target, compiled in (
        ("llvm", kernels.vadd, "llvm", True),
        ("c", kernels.vmul, "c", False),
        ("cuda", kernels.vadd_gpu, CUDA_TARGET, False),
        ("cuda2", kernels.vmul_gpu, CUDA_TARGET, False),
    ):
        mod, tgt = cc.prepare_for_codegen(kernel, target)
        _module, outcome = cache.lower_with_outcome(mod, tgt, compile_device=compiled)
        keys[label] = outcome.key
    cache.lower(*cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET), compile_device=False)  # a memory hit
    # The llvm entry's upgrade runs in a helper process that writes scratch files: let it
    # finish, so that copies of this directory do not race it.
    assert cache.flush(upgrades=True)
    cache.close()
    return root, keys


@pytest.fixture
def copy(filled, tmp_path):
    """A private copy of the filled cache (for commands that change it), and its keys."""
    root, keys = filled
    dest = tmp_path / "cache"
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns("cgc-*"))
    return dest, keys


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """main(argv) in this process: (exit code, stdout, stderr)."""
    code = _cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str):
    code, out, err = run(capsys, *argv, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """The command as a subprocess (the installed entry point's module)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "codegen_cache", *argv], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


# ---- stats, ls, show ------------------------------------------------------------------------------


def test_stats_counts_entries_and_lookups(capsys, filled):
    root, _keys = filled
    code, data = run_json(capsys, "--dir", str(root), "stats")
    assert code == 0
    assert data["stores"]["compiled"]["entries"] == 1
    assert data["stores"]["source"]["entries"] == 3
    assert data["stores"]["source"]["bytes"] > 0
    counters = data["counters"]
    assert counters["misses"] == 4 and counters["codegen_runs"] == 4 and counters["hits_memory"] == 1
    assert data["hit_rate"] == pytest.approx(1 / 5)
    code, out, _err = run(capsys, "stats", "--dir", str(root))
    assert code == 0
    assert "hits" in out and "memory 1, disk 0" in out and "hit rate 20.0%" in out


def test_stats_of_a_default_directory_not_made_yet_does_not_create_it(capsys, monkeypatch, tmp_path):
    missing = tmp_path / "nothing-here"
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(missing))
    code, data = run_json(capsys, "stats")
    assert code == 0 and data["exists"] is False
    assert all(s["entries"] == 0 for s in data["stores"].values())
    assert not missing.exists()


@pytest.mark.parametrize("argv", [["stats"], ["ls"], ["show", "abcd"], ["clear"], ["clear", "--failures"],
                                  ["prune", "--older-than", "1d"], ["verify"],
                                  ["explain", KERNELS, "--kernel", "vadd", "-t", "llvm"]])
def test_a_mistyped_dir_is_an_error_not_an_empty_cache(capsys, tmp_path, argv):
    missing = tmp_path / "typo"
    code, out, err = run(capsys, "--dir", str(missing), *argv)
    assert code == _cli.EXIT_CONFIG and "removed" not in out
    assert f"invalid value '{missing}' for --dir: expected an existing cache directory" in err
    assert not missing.exists()


def test_stats_counts_cold_and_warm_runs_as_ccache_does(capsys, tmp_path):
    """Cold: misses = builds = stores, no hits; warm in a new process: hits only; breakdown and zeroed time."""
    import kernels

    root = tmp_path / "cache"
    lowered = [cc.prepare_for_codegen(k, t) for k, t in ((kernels.vadd, "llvm"), (kernels.vmul, "c"),
                                                       (kernels.vadd_gpu, CUDA_TARGET))]
    for _round in range(2):
        cache = cc.CodegenCache(root, write_behind=False)
        for (mod, target), compiled in zip(lowered, (True, False, False)):
            cache.lower(mod, target, compile_device=compiled)
        cache.close()
        _code, data = run_json(capsys, "--dir", str(root), "stats")
        c = data["counters"]
        if _round == 0:
            assert (c["misses"], c["codegen_runs"], c["stores"], c["hits"]) == (3, 3, 3, 0), c
            assert c["zeroed_at"] is None
    assert (c["misses"], c["codegen_runs"], c["stores"], c["hits_disk"], c["hits_memory"]) == (3, 3, 3, 3, 0), c
    by = c["by_codegen"]
    assert set(by) == {"llvm/compiled", "c/source", "cuda/source"}
    assert all(row["hits"] == 1 and row["misses"] == 1 and row["codegen_runs"] == 1 and row["stores"] == 1
               for row in by.values()), by
    assert sum(row["saved_seconds"] for row in by.values()) == pytest.approx(c["saved_seconds"])
    code, out, _err = run(capsys, "--dir", str(root), "stats", "-v")
    assert code == 0 and "zeroed      never" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("llvm "))
    assert row[:6] == ["llvm", "compiled", "1", "1", "1", "1"]
    before = time.time()
    assert run(capsys, "--dir", str(root), "stats", "--reset")[0] == 0
    _code, data = run_json(capsys, "--dir", str(root), "stats")
    assert data["counters"]["zeroed_at"] >= before - 1 and data["counters"]["by_codegen"] == {}
    code, out, _err = run(capsys, "--dir", str(root), "stats", "-v")
    assert "zeroed      20" in out and "nothing counted yet" in out


def test_stats_says_what_each_other_counter_counts_and_never_shows_the_zeroed_time_there(capsys, copy):
    root, _keys = copy
    code, out, _err = run(capsys, "--dir", str(root), "stats")
    other = [line for line in out.splitlines() if line.startswith("other")]
    assert code == 0 and other == ["other       upgrades 1: llvm entries linked into shared libraries by the background "
                                   "upgrader after their store (later hits load the library)"], out
    assert run(capsys, "--dir", str(root), "stats", "--reset")[0] == 0
    cache = cc.CodegenCache(root, write_behind=False)
    cache.lower(*cc.prepare_for_codegen(__import__("kernels").vadd_gpu, CUDA_TARGET), compile_device=False)
    cache.close()
    code, out, _err = run(capsys, "--dir", str(root), "stats")
    assert code == 0 and "zeroed_at" not in out and not any(line.startswith("other") for line in out.splitlines()), out


def test_ls_counts_its_entries_in_words(capsys, filled):
    root, _keys = filled
    code, _out, err = run(capsys, "--dir", str(root), "ls", "--compiled")
    assert code == 0 and err.strip().splitlines()[-1].startswith("1 entry, "), err
    code, _out, err = run(capsys, "--dir", str(root), "ls")
    assert code == 0 and err.strip().splitlines()[-1].startswith("4 entries, "), err


def test_stats_counts_a_build_and_its_memory_hit(capsys, tmp_path):
    """codegen_cache.build on an empty cache: misses and builds, no disk hit; then one memory hit."""
    import kernels

    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    with cc.use_cache(cache):
        cc.build(kernels.vadd, "llvm")
        cold = cache.stats()
        cc.build(kernels.vadd, "llvm")
        outcome = cc.last_outcome()
    assert (cold.misses, cold.codegen_runs, cold.stores, cold.hits) == (1, 1, 1, 0), cold
    assert outcome.tier == "memory" and outcome.codegen_seconds > 0
    warm = cache.stats()
    assert warm.hits_memory == 1 and warm.hits_disk == 0 and warm.saved_seconds == pytest.approx(
        outcome.codegen_seconds)
    cache.close()
    _code, data = run_json(capsys, "--dir", str(tmp_path / "cache"), "stats")
    assert data["stores"]["index"]["entries"] == 1  # the build index is part of the cache


def test_stats_reset_zeroes_counters_but_keeps_entries(capsys, copy):
    root, _keys = copy
    assert run(capsys, "--dir", str(root), "stats", "--reset")[0] == 0
    _code, data = run_json(capsys, "--dir", str(root), "stats")
    assert data["counters"]["misses"] == 0 and data["stores"]["source"]["entries"] == 3


def test_ls_lists_entries_with_codegen_target_and_parts(capsys, filled):
    root, keys = filled
    _code, entries = run_json(capsys, "--dir", str(root), "ls")
    by_key = {e["key"]: e for e in entries}
    assert set(by_key) == set(keys.values())
    cuda = by_key[keys["cuda"]]
    assert cuda["store"] == "source" and cuda["codegen"] == "cuda" and cuda["target"] == "cuda sm_90"
    assert cuda["func_names"] == ["vadd_gpu_kernel"] and cuda["codegen_seconds"] > 0
    assert list(cuda["parts"])[:4] == ["ir", "target", "codegen", "mode"]  # key order, not sorted JSON
    assert by_key[keys["llvm"]]["store"] == "compiled"
    _code, only_compiled = run_json(capsys, "--dir", str(root), "ls", "--compiled")
    assert [e["key"] for e in only_compiled] == [keys["llvm"]]
    code, out, err = run(capsys, "--dir", str(root), "ls", "--sort", "size")
    assert code == 0 and keys["cuda"][:16] in out and "4 entries" in err


def test_show_by_prefix_with_code(capsys, filled):
    root, keys = filled
    code, out, _err = run(capsys, "--dir", str(root), "show", keys["cuda"][:8], "--code")
    assert code == 0
    assert keys["cuda"] in out and "frame and checksum: ok" in out and "vadd_gpu_kernel" in out
    assert "__global__" in out  # the stored CUDA source
    _code, data = run_json(capsys, "--dir", str(root), "show", keys["c"][:10].upper())
    assert data["key"] == keys["c"] and data["integrity"] == "ok" and data["parts"]["codegen"] == "c"


def test_show_not_found_and_ambiguous_exit_4(capsys, filled):
    root, _keys = filled
    code, _out, err = run(capsys, "--dir", str(root), "show", "zz")
    assert code == _cli.EXIT_NOT_FOUND and "no entry" in err
    code, _out, err = run(capsys, "--dir", str(root), "show", "")
    assert code == _cli.EXIT_NOT_FOUND and "entries match" in err


# ---- explain ---------------------------------------------------------------------------------------


def test_explain_reports_a_hit(capsys, filled):
    root, keys = filled
    code, data = run_json(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd_gpu",
                          "-t", "cuda -arch=sm_90", "--mode", "source")
    assert code == 0
    (mode,) = data["modes"]
    assert mode["status"] == "hit" and mode["key"] == keys["cuda"]


def test_explain_tells_a_target_change_from_a_kernel_change(capsys, filled):
    root, keys = filled
    code, out, _err = run(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd_gpu",
                          "-t", "cuda -arch=sm_80", "--mode", "source")
    assert code == 0
    assert "MISS" in out
    assert f"{keys['cuda'][:16]} source" in out.splitlines()[3]  # nearest: the same kernel for sm_90
    assert "same kernel" in out and "target arch sm_90 → sm_80" in out
    _code, data = run_json(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd_gpu",
                           "-t", "cuda -arch=sm_80", "--mode", "source")
    nearest = data["modes"][0]["nearest"][0]
    assert nearest["key"] == keys["cuda"] and nearest["ir_differs_by_target_only"]
    assert [d["part"] for d in nearest["differs"]] == ["target"]


def _plant(cache: cc.CodegenCache, like: str, store: str, **changed: str) -> str:
    """Store a copy of entry `like` whose key parts differ as given; its new key."""
    meta = read_meta(cache.store(store).get(like))[1]
    parts = {**meta["parts"], **changed}
    key = CacheKey.from_parts(list(parts.items())).digest
    cache.store(store).put(key, frame("source", {**meta, "key": key, "parts": parts, "source_format": "cu"},
                                      [b"// planted"]))
    return key


def test_explain_names_the_salt_that_changed(capsys, copy):
    root, keys = copy
    cache = cc.CodegenCache(root, write_behind=False)
    # The vadd_gpu entry as another TVM build would have written it, in place of this build's.
    planted = _plant(cache, keys["cuda"], "source", tvm="0.26.0+gdeadbee")
    cache.store("source").delete(keys["cuda"])
    cache.close()
    _code, data = run_json(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd_gpu",
                           "-t", "cuda -arch=sm_90", "--mode", "source")
    mode = data["modes"][0]
    assert mode["status"] == "miss"
    best = mode["nearest"][0]
    assert best["key"] == planted
    assert best["summary"].startswith("same IR and target; tvm 0.26.0+gdeadbee → 0.27")
    assert any("another TVM build" in line for line in mode["verdict"])


def test_explain_an_empty_cache_and_a_cached_failure(capsys, tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    code, out, _err = run(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd", "-t", "c")
    assert code == 0 and "holds no entries" in out
    cache = cc.CodegenCache(root, write_behind=False)
    mod, target = cc.prepare_for_codegen(__import__("kernels").vadd, "c")
    key = cache.key_for(mod, target, compile_device=False).digest
    cache.store("failures").put(key, frame("failure", {"key": key, "codegen": "c", "error_type": "ValueError",
                                                      "message": "boom", "created": time.time()}, []))
    cache.close()
    _code, data = run_json(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd", "-t", "c")
    (mode,) = data["modes"]  # c has no compiled mode
    assert mode["status"] == "failure" and "boom" in mode["verdict"][0]


def test_explain_without_an_entry_of_the_same_codegen(capsys, copy):
    root, keys = copy
    cache = cc.CodegenCache(root, write_behind=False)
    for label in ("cuda", "cuda2"):
        cache.store("source").delete(keys[label])
    cache.close()
    _code, data = run_json(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd_gpu",
                           "-t", "cuda -arch=sm_90", "--mode", "source")
    (mode,) = data["modes"]
    assert mode["status"] == "miss" and mode["nearest"] == []  # llvm and c entries are no neighbours
    assert "No stored entry was made by this codegen (the cache holds 1 llvm, 1 c)" in mode["verdict"][0]


def test_explain_a_lowered_module_in_a_tvmscript_file(capsys, filled, tmp_path):
    root, keys = filled
    mod, _target = cc.prepare_for_codegen(__import__("kernels").vadd_gpu, CUDA_TARGET)
    path = tmp_path / "device.tvmscript"
    path.write_text(mod.script())
    # No --target: a lowered module carries it.
    _code, data = run_json(capsys, "--dir", str(root), "explain", str(path), "--mode", "source")
    assert data["modes"][0]["status"] == "hit" and data["modes"][0]["key"] == keys["cuda"]


def test_explain_input_errors_exit_5(capsys, filled, tmp_path):
    root, _keys = filled
    code, _out, err = run(capsys, "--dir", str(root), "explain", KERNELS, "-t", "llvm")
    assert code == _cli.EXIT_INPUT and "--kernel" in err  # several kernels in the file
    code, _out, err = run(capsys, "--dir", str(root), "explain", KERNELS, "--kernel", "vadd", "-t", "cuda -arch=sm_90")
    assert code == _cli.EXIT_INPUT and "thread binding" in err
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('nope')\n")
    code, _out, err = run(capsys, "--dir", str(root), "explain", str(bad), "-t", "llvm")
    assert code == _cli.EXIT_INPUT and "RuntimeError: nope" in err


# ---- clear, prune, verify ----------------------------------------------------------------------------


def test_clear_one_store_then_all(capsys, copy):
    root, keys = copy
    code, data = run_json(capsys, "--dir", str(root), "clear", "--compiled")
    assert code == 0 and data["removed"] == 1
    _code, entries = run_json(capsys, "--dir", str(root), "ls")
    assert {e["key"] for e in entries} == {keys["c"], keys["cuda"], keys["cuda2"]}
    code, out, _err = run(capsys, "--dir", str(root), "clear")
    assert code == 0 and "removed 3 entries" in out
    assert run_json(capsys, "--dir", str(root), "ls")[1] == []


def _age_entry(cache: cc.CodegenCache, store: str, key: str, seconds: float) -> None:
    blob = cache.store(store).get(key)
    meta = read_meta(blob)[1]
    from codegen_cache._artifacts import unframe

    art = unframe(blob)
    cache.store(store).put(key, frame(art.codec, {**meta, "created": time.time() - seconds}, art.fields))
    import sqlite3

    with sqlite3.connect(cache.directory / store / "cache.db") as conn:  # nor used since (prune goes by last use)
        conn.execute("UPDATE Cache SET access_time = ? WHERE key = ?", (time.time() - seconds, key))


def test_prune_older_than_and_max_size(capsys, copy):
    root, keys = copy
    cache = cc.CodegenCache(root, write_behind=False)
    _age_entry(cache, "source", keys["c"], 10 * 86400)
    _age_entry(cache, "source", keys["cuda"], 5 * 86400)
    cache.close()
    code, data = run_json(capsys, "--dir", str(root), "prune", "--older-than", "7d")
    assert code == 0 and data["keys"] == [keys["c"]]
    # The least recently used go first until the stores fit.
    code, data = run_json(capsys, "--dir", str(root), "prune", "--max-size", str(data["bytes_after"] - 1))
    assert code == 0 and data["keys"][0] == keys["cuda"] and data["bytes_after"] < data["bytes_before"]
    assert run(capsys, "--dir", str(root), "prune")[0] == _cli.EXIT_USAGE
    assert run(capsys, "--dir", str(root), "prune", "--max-size", "lots")[0] == _cli.EXIT_USAGE
    assert run(capsys, "--dir", str(root), "prune", "--older-than", "-1d")[0] == _cli.EXIT_USAGE


def test_verify_reports_and_fixes_bad_entries(capsys, copy):
    root, keys = copy
    code, data = run_json(capsys, "--dir", str(root), "verify")
    assert code == 0 and data["checked"] == 4 and data["bad"] == []
    cache = cc.CodegenCache(root, write_behind=False)
    blob = bytearray(cache.store("source").get(keys["cuda"]))
    blob[len(blob) // 3] ^= 0xFF
    cache.store("source").put(keys["cuda"], bytes(blob))
    cache.store("compiled").put(keys["llvm"], b"not a frame")
    good = cache.store("source").get(keys["c"])
    cache.store("source").put("0" * 32, good)  # a sound frame under the wrong key
    cache.close()
    code, out, _err = run(capsys, "--dir", str(root), "verify")
    assert code == _cli.EXIT_PROBLEMS
    assert "checksum mismatch" in out and "shorter than the frame footer" in out and "metadata names key" in out
    code, data = run_json(capsys, "--dir", str(root), "verify", "--fix")
    assert code == _cli.EXIT_PROBLEMS and data["removed"] == 3
    code, data = run_json(capsys, "--dir", str(root), "verify")
    assert code == 0 and data["checked"] == 2


# ---- warm ---------------------------------------------------------------------------------------------


def test_warm_in_process_then_all_hits(capsys, tmp_path):
    root = tmp_path / "cache"
    argv = ["--dir", str(root), "warm", KERNELS, "-t", "llvm", "-t", "c", "--kernel", "vadd", "--kernel", "vmul",
            "-j", "0"]
    code, data = run_json(capsys, *argv)
    assert code == 0 and data["tasks"] == 4 and data["codegen"] == 4 and data["failed"] == 0
    modes = {(r["kernel"], r["target"]): r["mode"] for r in data["results"]}
    assert modes[("vadd", "llvm")] == "compiled" and modes[("vadd", "c")] == "source"  # --mode auto
    code, data = run_json(capsys, *argv)
    assert code == 0 and data["hit"] == 4


@pytest.mark.slow
def test_warm_in_spawned_workers(capsys, tmp_path):
    root = tmp_path / "cache"
    code, out, _err = run(capsys, "--dir", str(root), "warm", KERNELS, "-t", "cuda -arch=sm_90", "--mode", "source",
                          "--kernel", "vadd_gpu", "--kernel", "vmul_gpu", "-j", "2", "--no-progress")
    assert code == 0 and "2 ran the codegen" in out and "2 workers" in out
    _code, entries = run_json(capsys, "--dir", str(root), "ls")
    assert sorted(e["func_names"][0] for e in entries) == ["vadd_gpu_kernel", "vmul_gpu_kernel"]


def test_warm_reports_a_failed_kernel_and_exits_1(capsys, tmp_path):
    code, data = run_json(capsys, "--dir", str(tmp_path / "c"), "warm", KERNELS, "-t", "cuda -arch=sm_90",
                          "--kernel", "vadd", "--kernel", "vadd_gpu", "--mode", "source", "-j", "0")
    assert code == _cli.EXIT_PROBLEMS and data["failed"] == 1 and data["codegen"] == 1
    (failed,) = [r for r in data["results"] if r["status"] == "failed"]
    assert failed["kernel"] == "vadd" and "thread binding" in failed["error"]


def test_warm_kernels_file_protocol(capsys, tmp_path):
    """`variants(target)` gives each target its own kernels; repeated names are numbered."""
    source = tmp_path / "sweep.py"
    source.write_text(textwrap.dedent('''
        import tvm.s_tir
        from tvm.script import tirx as T

        def scale(factor):
            @T.prim_func(s_tir=True)
            def main(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
                for i in range(256):
                    with T.sblock("B"):
                        vi = T.axis.spatial(256, i)
                        B[vi] = A[vi] * T.float32(factor)
            return main

        def variants(target):
            return [scale(f) for f in (2, 3, 4)]
    '''))
    code, data = run_json(capsys, "--dir", str(tmp_path / "c"), "warm", str(source), "-t", "c", "-j", "0")
    assert code == 0 and data["codegen"] == 3
    assert sorted(r["kernel"] for r in data["results"]) == ["main[0]", "main[1]", "main[2]"]


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_warm_fills_the_compiled_cuda_store_with_nvcc(capsys, tmp_path):
    root = tmp_path / "cache"
    argv = ["--dir", str(root), "warm", KERNELS, "-t", json.dumps(CUDA_TARGET), "--kernel", "vadd_gpu", "-j", "0"]
    code, data = run_json(capsys, *argv)
    assert code == 0 and data["codegen"] == 1
    (result,) = data["results"]
    assert result["mode"] == "compiled" and result["tier"] in ("nvcc", "codegen")
    _code, entries = run_json(capsys, "--dir", str(root), "ls", "--compiled")
    assert [e["codec"] for e in entries] == ["cuda-bin"]
    assert run_json(capsys, *argv)[1]["hit"] == 1
    counters = run_json(capsys, "--dir", str(root), "stats")[1]["counters"]
    assert (counters["misses"], counters["codegen_runs"], counters["stores"], counters["hits"]) == (1, 1, 1, 1)


# ---- doctor, demo, config ----------------------------------------------------------------------------


def test_doctor_without_the_process_check(capsys, tmp_path):
    code, data = run_json(capsys, "--dir", str(tmp_path / "c"), "doctor", "--processes", "0")
    fs = data["filesystem"]
    assert fs["fs_type"] and fs["free_bytes"] > 0 and fs["is_network"] is False
    assert data["toolchain"]["tvm"].startswith("0.27")
    assert code == (1 if data["problems"] else 0)


NONDETERMINISTIC = textwrap.dedent('''
    import codegen_cache as cc
    from codegen_cache.codegens.cpu import CODEGENS

    # The c codegen again, with a toolchain salt that follows PYTHONHASHSEED: never the same key twice.
    (base,) = CODEGENS["c"]
    cc.register_device_codegen("c", cc.DeviceCodegen(
        "c", build_without_compile=base.build_without_compile,
        toolchain=lambda target, compiled: {"seeded": str(hash("codegen"))}), override=True)

    from kernels import vadd
    kernels = {"vadd": vadd}
''')


@pytest.mark.slow
def test_doctor_finds_a_key_part_that_is_not_deterministic(tmp_path):
    source = tmp_path / "seeded.py"
    source.write_text(NONDETERMINISTIC)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = cli("--dir", str(tmp_path / "c"), "doctor", "--processes", "2", "--kernels", str(source), "-t", "c",
               "--json", env=env, timeout=280)
    assert done.returncode == _cli.EXIT_PROBLEMS, done.stderr[-2000:]
    report = json.loads(done.stdout)
    unstable = report["determinism"]["unstable"]
    assert unstable and {u["part"] for u in unstable} == {"toolchain"}
    assert all(u["sample"].startswith("vadd c") for u in unstable)
    assert report["determinism"]["errors"] == []


def test_demo_cold_then_warm_without_nvcc(capsys, tmp_path):
    code, data = run_json(capsys, "--dir", str(tmp_path / "demo"), "demo", "--nvcc-configs", "0")
    assert code == 0
    names = [s["name"] for s in data["sweeps"]]
    assert names == ["cuda matmul, source (54 configs)", "llvm matmul (18 schedules)"]
    for sweep in data["sweeps"]:
        assert sweep["cold_hits"] == 0 and sweep["warm_hits"] == sweep["kernels"]
    assert data["sweeps"][1]["speedup"] > 1  # llvm; CUDA source codegen is about as cheap as a disk hit
    assert data["stats"]["hits_disk"] == 72


@pytest.mark.slow
def test_the_demo_says_where_its_cache_is_and_the_command_it_suggests_shows_its_numbers(tmp_path):
    # README's first command, as a newcomer runs it: no --dir, no CODEGEN_CACHE_DIR.
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "CODEGEN_CACHE_DIR": ""}
    done = cli("demo", "--nvcc-configs", "0", "--no-progress", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "xdg" / "codegen-cache-demo"
    assert f"cache directory: {root}" in done.stdout
    suggested = [line.split("#")[0].split() for line in done.stdout.splitlines() if "stats -v" in line]
    assert suggested == [["codegen-cache", "--dir", str(root), "stats", "-v"]]
    stats = cli(*suggested[0][1:4], "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["counters"]["hits_disk"] == 72
    again = cli("demo", "--nvcc-configs", "0", "--no-progress", env=env)  # emptied first: the same numbers
    assert again.returncode == 0
    assert json.loads(cli(*suggested[0][1:4], "--json", env=env).stdout)["counters"]["hits_disk"] == 72


def test_config_shows_values_and_origins(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CODEGEN_CACHE_SOURCE_SIZE_LIMIT", "2G")
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE", "redis://app:hunter2@cache:6379/0")
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE_SECRET", "s3cret")
    monkeypatch.setenv("CODEGEN_CACHE_SIZE", "1G")  # a typo of a real name
    code, data = run_json(capsys, "--dir", str(tmp_path), "config")
    assert code == 0
    rows = {r["variable"]: r for r in data["settings"]}
    assert rows["CODEGEN_CACHE_SOURCE_SIZE_LIMIT"]["value"] == 2 << 30
    assert rows["CODEGEN_CACHE_SOURCE_SIZE_LIMIT"]["origin"] == "environment"
    assert rows["CODEGEN_CACHE_DIR"]["origin"] == "argument"
    assert rows["CODEGEN_CACHE_VERIFY"]["origin"] == "default"
    assert data["unknown_env_vars"] == ["CODEGEN_CACHE_SIZE"]
    assert rows["CODEGEN_CACHE_REMOTE"]["value"] == "redis://app:***@cache:6379/0"
    code, out, _err = run(capsys, "--dir", str(tmp_path), "config")
    assert code == 0 and "hunter2" not in out and "s3cret" not in out and "CODEGEN_CACHE_SIZE" in out


# ---- errors and exit codes (subprocess: what a shell sees) ------------------------------------------


@pytest.mark.parametrize(
    ("var", "value", "accepted"),
    [
        ("CODEGEN_CACHE_SOURCE_SIZE_LIMIT", "lots", "a size of 0 or more bytes"),
        ("CODEGEN_CACHE_MEMORY_ENTRIES", "-5", "a whole number of 0 or more"),
        ("CODEGEN_CACHE_LEASE_WAIT", "soon", "a duration of 0 or more"),
        ("CODEGEN_CACHE_REMOTE", "localhost:6379", "redis://[[user]:password@]host"),
        ("CODEGEN_CACHE_LOG_LEVEL", "loud", "one of DEBUG, INFO"),
    ],
)
def test_bad_setting_exits_3_naming_the_variable(capsys, monkeypatch, tmp_path, var, value, accepted):
    monkeypatch.setenv(var, value)
    code, _out, err = run(capsys, "--dir", str(tmp_path), "stats")
    assert code == _cli.EXIT_CONFIG
    assert f"invalid value {value!r} for {var}: expected {accepted}" in err


@pytest.mark.smoke
def test_bad_setting_in_a_shell_gives_one_line_and_no_traceback(tmp_path):
    done = cli("--dir", str(tmp_path), "ls", env={"CODEGEN_CACHE_COMPILED_SIZE_LIMIT": "lots"})
    assert done.returncode == _cli.EXIT_CONFIG
    assert done.stderr.strip() == ("codegen-cache: error: invalid value 'lots' for CODEGEN_CACHE_COMPILED_SIZE_LIMIT: "
                                   "expected a size of 0 or more bytes, e.g. 512M, 2G or 1048576")


def test_unwritable_directory_exits_3(capsys, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CODEGEN_CACHE_DIR", str(blocker / "cache"))
    # Nothing to clear in a directory that does not exist; warm must write there.
    assert run(capsys, "clear")[0] == 0
    code, _out, err = run(capsys, "warm", KERNELS, "-t", "c", "--kernel", "vadd")
    assert code == _cli.EXIT_CONFIG
    assert "for CODEGEN_CACHE_DIR: expected a directory this user can create and write to" in err
    code, _out, err = run(capsys, "--dir", str(blocker), "clear")
    assert code == _cli.EXIT_CONFIG and "for --dir" in err and "it is a file" in err


@pytest.mark.parametrize(("argv", "accepted"), [
    (["warm", KERNELS, "-t", "llvm", "-j", "-3"], "-j/--workers: invalid value '-3': expected a whole number of 0"),
    (["doctor", "--processes", "-1"], "--processes: invalid value '-1': expected a whole number of 0 or more"),
    (["demo", "--nvcc-configs", "-4"], "--nvcc-configs: invalid value '-4': expected a whole number from 0 to 54"),
    (["demo", "--nvcc-configs", "55"], "expected a whole number from 0 to 54"),
    (["explain", KERNELS, "-t", "llvm", "--limit", "0"], "--limit: invalid value '0': expected a whole number of 1"),
    (["warm", KERNELS, "-t", "llvm", "-j", "two"], "invalid value 'two'"),
])
def test_bad_numbers_are_usage_errors(capsys, tmp_path, argv, accepted):
    code, out, err = run(capsys, "--dir", str(tmp_path), *argv)
    assert code == _cli.EXIT_USAGE and accepted in err and out == ""


def test_demo_config_count_is_the_demo_sweep():
    from codegen_cache._cli import _demo_kernels

    assert _cli.DEMO_CONFIGS == len(_demo_kernels.CUDA_TILES)


@pytest.mark.slow
def test_version(capsys):
    code, out, _err = run(capsys, "--version")
    assert code == 0 and out.strip() == f"codegen-cache {cc.__version__}"
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"codegen-cache {cc.__version__}"


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "no-such-command")[0] == _cli.EXIT_USAGE
    assert run(capsys, "ls", "--sort", "colour")[0] == _cli.EXIT_USAGE
    assert run(capsys, "warm", KERNELS)[0] == _cli.EXIT_USAGE  # --target is required


def test_json_goes_before_or_after_the_command(capsys, filled):
    root, _keys = filled
    before = json.loads(run(capsys, "--json", "--dir", str(root), "ls")[1])
    after = json.loads(run(capsys, "ls", "--dir", str(root), "--json")[1])
    assert [e["key"] for e in before] == [e["key"] for e in after] and len(before) == 4


@pytest.mark.slow
def test_entry_point_runs(filled):
    root, _keys = filled
    exe = Path(sys.executable).parent / "codegen-cache"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "codegen_cache"]
    done = subprocess.run([*command, "--dir", str(root), "stats", "--json"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stores"]["source"]["entries"] == 3


def test_help_lists_the_exit_codes(capsys):
    code, out, _err = run(capsys, "--help")
    assert code == 0 and "exit codes:" in out and "configuration error" in out
    code, out, _err = run(capsys, "prune", "--help")
    assert code == 0 and "--older-than AGE" in out


# ---- what ls, config and explain say (issue 16) ---------------------------------------------------


def test_ls_shows_the_users_function_names_and_failures_apart(capsys, tmp_path):
    import kernels

    root = tmp_path / "cache"
    cache = cc.CodegenCache(root, write_behind=False)
    cache.lower(*cc.prepare_for_codegen(kernels.vadd, "llvm"), compile_device=True)

    def broken(mod, target):
        raise RuntimeError("no registers left")

    with pytest.raises(RuntimeError):
        cache.lower(*cc.prepare_for_codegen(kernels.vmul, "llvm"), compile_device=True,
                    codegen=cc.DeviceCodegen("broken", build=broken))
    cache.close()
    code, out, _err = run(capsys, "--dir", str(root), "ls", "--compiled", "--failures")
    assert code == 0
    entries_table, failures_table = out.split("\n\n")
    header, row = entries_table.splitlines()
    assert row.split()[header.split().index("FUNCTIONS")] == "vadd" and "__tvm_ffi_" not in out
    assert failures_table.splitlines()[0].split() == ["KEY", "STORE", "CODEGEN", "ERROR", "SIZE", "AGE"]
    assert "broken" in failures_table and "RuntimeError: no registers left" in failures_table
    _code, listed = run_json(capsys, "--dir", str(root), "ls", "--compiled")
    assert listed[0]["functions"] == ["vadd"] and listed[0]["func_names"] == ["__tvm_ffi_vadd"]


def test_config_prints_durations_as_the_docs_write_them(capsys, monkeypatch):
    for var in cc._config.ENV_VARS:  # noqa: SLF001
        monkeypatch.delenv(var, raising=False)
    code, out, _err = run(capsys, "config")
    docs = (TESTS.parent / "docs" / "configuration.md").read_text()
    assert code == 0
    for var in ("CODEGEN_CACHE_REMOTE_TTL", "CODEGEN_CACHE_LEASE_WAIT", "CODEGEN_CACHE_FAILURE_TTL"):
        shown = next(line.split()[-1] for line in out.splitlines() if line.startswith(var + " "))
        documented = next(line.split("|")[2].strip().strip("`") for line in docs.splitlines()
                          if line.startswith(f"| `{var}`"))
        assert shown == documented, (var, shown, documented)


def test_explain_honours_verify(capsys, monkeypatch, filled):
    root, _keys = filled
    argv = ("--dir", str(root), "explain", KERNELS, "--kernel", "vadd", "-t", "llvm", "--mode", "compiled")
    code, out, err = run(capsys, *argv)
    assert code == 0 and "-> HIT" in out, (code, out, err)
    monkeypatch.setenv("CODEGEN_CACHE_VERIFY", "1")
    code, out, _err = run(capsys, *argv)
    assert code == 0 and "-> MISS" in out and "without the exact IR digest" in out
    # And the lowering agrees: with verify on, that entry is not served.
    import kernels

    cache = cc.CodegenCache(settings=cc.settings_from_env(directory=root))
    try:
        _module, outcome = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vadd, "llvm"), compile_device=True)
    finally:
        cache.close()
    assert outcome.tier == "codegen"


def test_explain_a_build(capsys, tmp_path):
    import kernels

    root = tmp_path / "cache"
    cache = cc.CodegenCache(root, write_behind=False)
    with cc.use_cache(cache):
        cc.build(kernels.vadd, "llvm")
    argv = ("--dir", str(root), "explain", KERNELS, "-t", "llvm", "--build")
    code, out, _err = run(capsys, *argv, "--kernel", "vadd")
    assert code == 0 and "build: key" in out and "-> HIT" in out
    code, data = run_json(capsys, *argv, "--kernel", "vmul")
    (miss,) = data["modes"]
    assert miss["status"] == "miss" and [d["part"] for d in miss["nearest"][0]["differs"]] == ["input"]
    assert "module given to codegen_cache.build differs" in miss["verdict"][0]
    host = next(iter(run_json(capsys, "--dir", str(root), "ls", "--compiled")[1]))
    cache.store("compiled").delete(host["key"])
    cache.close()
    code, out, _err = run(capsys, *argv, "--kernel", "vadd")
    assert code == 0 and "-> MISS" in out and "entries it names are gone (host llvm compiled" in out


@pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")
@pytest.mark.nvcc
def test_precompile_counts_misses_and_hits(tmp_path):
    import kernels

    mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
    for expected in ((1, 1, 1, 0), (1, 1, 1, 1)):
        cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
        cache.precompile_cuda(mod, target)
        stats = cache.stats()
        cache.close()
        assert (stats.misses, stats.codegen_runs, stats.stores, stats.hits_disk) == expected
    assert stats.saved_seconds == pytest.approx(stats.codegen_seconds) and stats.saved_seconds > 0


@pytest.mark.parametrize("url", ["redis://", "redis://:6379/0", "redis://h:0", "redis://h/x", "unix://"])
def test_config_doctor_and_the_library_reject_the_same_remote_urls(capsys, monkeypatch, tmp_path, url):
    monkeypatch.setenv("CODEGEN_CACHE_REMOTE", url)
    with pytest.raises(cc.ConfigError) as library:
        cc.RedisTier(url)
    why = str(library.value).rpartition("(")[2]  # e.g. "no host)"
    for argv in (["config"], ["doctor", "--processes", "0"]):
        code, _out, err = run(capsys, "--dir", str(tmp_path), *argv)
        assert code == _cli.EXIT_CONFIG and "for CODEGEN_CACHE_REMOTE: expected" in err and why in err
    with pytest.raises(cc.ConfigError, match="for CODEGEN_CACHE_REMOTE"):
        cc.CodegenCache(tmp_path)


def test_warm_refuses_when_caching_is_disabled(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CODEGEN_CACHE_DISABLE", "1")
    code, _out, err = run(capsys, "--dir", str(tmp_path), "warm", KERNELS, "-t", "c", "--kernel", "vadd", "-j", "0")
    assert code == _cli.EXIT_CONFIG and "for CODEGEN_CACHE_DISABLE: expected unset or 0 to warm" in err


def test_every_parsed_command_has_its_function():
    parser = _cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    assert set(commands) == set(_cli.COMMANDS) and all(callable(f) for f in _cli.COMMANDS.values())


@pytest.mark.slow
def test_explain_and_warm_name_a_callback_the_key_cannot_hold(tmp_path):
    # A kernels file that registers a postproc hook with no trustworthy identity (a callable object).
    kernels = tmp_path / "hooked.py"
    kernels.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import tvm_ffi
        from kernels import vadd_gpu

        class Postproc:
            def __call__(self, code, target):
                return code

        tvm_ffi.register_global_func("tvm_callback_cuda_postproc", Postproc(), override=True)
    """))
    (tmp_path / "cache").mkdir()
    # explain has no key to explain: an input error that names the callback and the remedy.
    done = cli("--dir", str(tmp_path / "cache"), "explain", str(kernels), "--kernel", "vadd_gpu",
               "-t", "cuda -arch=sm_90", "--mode", "source")
    assert done.returncode == 5, (done.stdout, done.stderr[-2000:])
    assert "'tvm_callback_cuda_postproc' cannot be keyed" in done.stderr, done.stderr[-2000:]
    assert "declare_callback_salt" in done.stderr and "Traceback" not in done.stderr
    # warm lowers it (uncached), stores nothing, and says so: not "codegen", and exit 1 (a problem).
    done = cli("--dir", str(tmp_path / "cache"), "warm", str(kernels), "-j", "0",
               "-t", "cuda -arch=sm_90", "--mode", "source")
    assert done.returncode == 1, (done.stdout, done.stderr[-2000:])
    assert "NOT CACHED  vadd_gpu" in done.stdout and "0 ran the codegen, 0 already cached, 1 not cacheable" in done.stdout
    assert "declare_callback_salt" in done.stderr
    assert cc.CodegenCache(tmp_path / "cache").stats().stores == 0
