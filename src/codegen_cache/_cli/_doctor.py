"""`codegen-cache doctor`: is the key deterministic here, is the cache directory a safe place, does the switch work?

Key determinism: several fresh processes, each with its own PYTHONHASHSEED, compute the key
of the same sample lowerings (every built-in codegen's input, both modes, each lowered twice);
any key part that differs between processes or between the two lowerings is reported, since
such a part makes every run miss. Filesystem: `_fsprobe.probe` on the cache directory (and a
path that is a file). Switch: where CODEGEN_CACHE_ENABLE is set, whether this interpreter reads
the start-up hook's .pth file and a fresh process's `import tvm` turns the switch on, and if not
why. Remote: one round trip to CODEGEN_CACHE_REMOTE.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._helper import helper_argv, helper_env

__all__ = ["check_determinism", "check_filesystem", "check_remote", "check_switch", "check_toolchain", "doctor",
           "render"]

# (kernel in _demo_kernels, target, modes): the input of every built-in codegen family.
SAMPLES: tuple[tuple[str, Any, tuple[bool, ...]], ...] = (
    ("vadd", "llvm", (True, False)),
    ("vadd", "c", (False,)),
    ("vadd_gpu", {"kind": "cuda", "arch": "sm_90"}, (True, False)),
    ("matmul_16x16_k4", {"kind": "cuda", "arch": "sm_80"}, (False,)),
    ("matmul_16x16_k4", "llvm", (True,)),
)
SEEDS = ("0", "1", "4242", "65535", "123456789")
_CHILD = "import json, sys\nfrom codegen_cache._cli._doctor import _child\nprint(json.dumps(_child(json.loads(sys.argv[1]))))\n"


def _sample_kernel(name: str, target):
    from . import _demo_kernels as k

    if name.startswith("matmul_"):
        return (k.cuda_matmul if "gpu" in target.keys else k.cpu_matmul)(16, 16, 4)
    return getattr(k, name)


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: the key parts of each sample, lowered twice."""
    from .._build._prepare import prepare_for_codegen
    from .._cache._cache import CodegenCache
    from .._config import Settings
    from .._targets import as_target, canonical_target
    from ._inventory import target_summary
    from ._kernel_files import load_kernels, parse_target

    cache = CodegenCache(settings=Settings(directory=Path(spec["directory"])))
    jobs = [(name, as_target(t), modes, None) for name, t, modes in SAMPLES]
    if spec.get("kernels"):
        for text in spec["targets"]:
            target = parse_target(text)
            for name, kernel in load_kernels(spec["kernels"], target).items():
                jobs.append((name, target, (True, False), kernel))
    out: dict[str, Any] = {}
    for name, target, modes, kernel in jobs:
        kernel = kernel if kernel is not None else _sample_kernel(name, target)
        first, second = prepare_for_codegen(kernel, target), prepare_for_codegen(kernel, target)
        for compile_device in modes:
            if (cache.resolve(first[1]).build if compile_device else True) is None:
                continue
            label = f"{name} {target_summary(canonical_target(target))} {'compiled' if compile_device else 'source'}"
            key = cache.key_for(*first, compile_device=compile_device)
            again = cache.key_for(*second, compile_device=compile_device)
            out[label] = {"parts": key.as_dict(), "again": again.as_dict()}
    return out


def check_determinism(processes: int = 3, *, kernels: str | None = None, targets: list[str] | None = None,
                      timeout: float = 600) -> dict[str, Any]:
    """Compute the sample keys in `processes` fresh processes; report every part that varies."""
    seeds = list(SEEDS[:processes]) + [str(1000 + i) for i in range(max(0, processes - len(SEEDS)))]
    spec = {"kernels": kernels, "targets": targets or []}
    results: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="codegen-cache-doctor-") as tmp:
        spec["directory"] = tmp
        procs = {}
        for seed in seeds:
            # Each its own PYTHONHASHSEED, and the package's own code only (_helper.py).
            procs[seed] = subprocess.Popen(
                helper_argv(_CHILD, json.dumps(spec), hash_seed=True),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=helper_env(hash_seed=seed),
            )
        for seed, proc in procs.items():
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                errors.append(f"PYTHONHASHSEED={seed}: no answer within {timeout:.0f} s")
                continue
            if proc.returncode != 0:
                tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
                errors.append(f"PYTHONHASHSEED={seed}: exited with {proc.returncode}: {tail[0]}")
                continue
            results[seed] = json.loads(stdout.strip().splitlines()[-1])
    unstable = []
    labels = sorted({label for r in results.values() for label in r})
    for label in labels:
        seen = {seed: r[label] for seed, r in results.items() if label in r}
        parts = list(next(iter(seen.values()))["parts"]) if seen else []
        for part in parts:
            across = {seed: v["parts"].get(part) for seed, v in seen.items()}
            within = {seed: v["again"].get(part) for seed, v in seen.items()}
            if len(set(across.values())) > 1:
                unstable.append({"sample": label, "part": part, "where": "between processes", "values": across})
            elif any(within[s] != across[s] for s in seen):
                unstable.append({"sample": label, "part": part, "where": "between two lowerings in one process",
                                 "values": {s: [across[s], within[s]] for s in seen}})
    return {"processes": len(seeds), "seeds": seeds, "samples": labels, "unstable": unstable, "errors": errors}


def check_filesystem(directory: Path, settings) -> dict[str, Any]:
    """The probe of the cache directory's filesystem, with what its findings mean here."""
    from .._config import format_size
    from .._storage._fsprobe import probe

    report = probe(directory)
    problems = list(report.warnings)
    is_file = directory.exists() and not directory.is_dir()
    if is_file:
        problems.append(f"{directory} is a file, not a directory: no cache can open there (CodegenCache raises "
                        "ConfigError) and CODEGEN_CACHE_ENABLE leaves the switch off with a warning; point "
                        "CODEGEN_CACHE_DIR (or --dir) at a directory, or move the file away")
    limits = settings.compiled_size_limit + settings.source_size_limit
    if report.free_bytes is not None and report.free_bytes < limits and not report.read_only:
        problems.append(
            f"the stores may grow to {format_size(limits)} (CODEGEN_CACHE_COMPILED_SIZE_LIMIT + "
            f"CODEGEN_CACHE_SOURCE_SIZE_LIMIT) but only {format_size(report.free_bytes)} is free: "
            "the disk can fill before eviction starts, and then new entries are skipped")
    from .._storage._trust import untrusted

    distrust = untrusted(directory, settings.trusted_dirs)
    if distrust is not None:
        problems.append(f"not trusted: {distrust}, so another user could make you run their code; lowerings run "
                        "uncached there (docs/reliability.md; CODEGEN_CACHE_TRUSTED_DIRS trusts it explicitly)")
    return {**report._asdict(), "directory": str(directory), "exists": directory.is_dir(),
            "is_file": is_file, "trusted": distrust is None, "problems": problems}


HOOK_FILE = "codegen_cache_enable.pth"
_OFF = ("", "0", "false", "no", "off")  # the values the .pth file reads as "not set", as it reads them
# In a fresh process with this environment: what `import tvm` did with the switch.
_SWITCH_PROBE = """
import json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import tvm
cc = sys.modules.get("codegen_cache")
print(json.dumps({"hook": "_codegen_cache_startup" in sys.modules, "enabled": bool(cc is not None and cc.is_enabled()),
                  "runtime_only": getattr(tvm, "_RUNTIME_ONLY", None) is True,
                  "warnings": [str(w.message) for w in caught if str(w.message).startswith("codegen-cache:")]}))
"""


def site_dirs() -> list[str]:
    """The directories whose .pth files this interpreter reads at start-up."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def check_switch(timeout: float = 600) -> dict[str, Any]:
    """Where CODEGEN_CACHE_ENABLE is set: can the switch work here, and does it (a fresh process imports tvm)?"""
    value = os.environ.get("CODEGEN_CACHE_ENABLE")
    dirs = site_dirs()
    hook = next((os.path.join(d, HOOK_FILE) for d in dirs if os.path.isfile(os.path.join(d, HOOK_FILE))), None)
    found: dict[str, Any] = {"variable": value, "hook_file": hook, "site_dirs": dirs, "probe": None,
                             "notes": [], "problems": []}
    if (value or "").strip().lower() in _OFF:
        found["notes"].append("CODEGEN_CACHE_ENABLE is not set: the switch is on only where a process calls "
                              "codegen_cache.enable()")
        return found
    problem = found["problems"].append
    if hook is None:
        problem(f"CODEGEN_CACHE_ENABLE is set but this interpreter reads no {HOOK_FILE} (looked in "
                f"{', '.join(dirs)}), so `import tvm` never turns the switch on; reinstall the package "
                "(pip install . or pip install -e ., docs/tvm.md), or call codegen_cache.enable()")
        return found
    if os.environ.get("TVM_USE_RUNTIME_LIB") == "1":
        problem("CODEGEN_CACHE_ENABLE is set but TVM_USE_RUNTIME_LIB=1 makes TVM runtime-only: nothing compiles "
                "here, so the switch steps aside (models load and run as without the cache)")
        return found
    # The probe is a process as the user starts them (the environment as it is: that is what it
    # checks), in an empty directory, so that nothing the working directory holds is imported.
    try:
        with tempfile.TemporaryDirectory(prefix="codegen-cache-doctor-") as empty:
            done = subprocess.run([sys.executable, "-c", _SWITCH_PROBE], capture_output=True, text=True,
                                  timeout=timeout, check=False, cwd=empty)
    except (OSError, subprocess.SubprocessError) as err:
        problem(f"the switch check could not start a fresh process: {err}")
        return found
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        problem(f"`import tvm` fails in a fresh process: {tail[0]}")
        return found
    probe = found["probe"] = json.loads(done.stdout.strip().splitlines()[-1])
    if probe["enabled"]:
        found["notes"].append("CODEGEN_CACHE_ENABLE: a fresh process's `import tvm` turned the switch on")
    elif probe["runtime_only"]:
        problem("CODEGEN_CACHE_ENABLE is set but TVM is runtime-only here (its compiler library did not load): "
                "nothing compiles, so the switch steps aside")
    elif probe["warnings"]:
        problem(f"CODEGEN_CACHE_ENABLE is set but `import tvm` leaves the switch off: {probe['warnings'][0]}")
    elif not probe["hook"]:
        problem(f"CODEGEN_CACHE_ENABLE is set but {hook} did not load the start-up hook in a fresh process "
                "(is `_codegen_cache_startup` importable from there?); reinstall the package")
    else:
        problem("CODEGEN_CACHE_ENABLE is set but a fresh process's `import tvm` did not turn the switch on "
                "(CODEGEN_CACHE_DISABLE=1?)")
    return found


def check_remote(settings) -> dict[str, Any]:
    """Where a remote is set: one round trip to it, and what a failure means."""
    from .._config import redact_url
    from .._errors import ConfigError
    from .._storage._remotes import open_remote

    if settings.remote is None:
        return {"url": None, "reached": None, "problems": []}
    url = redact_url(settings.remote)
    tier = open_remote(settings, read_only=True)
    try:
        tier.check()
    except (OSError, ConfigError) as err:
        return {"url": url, "reached": False, "problems": [
            f"the remote {url} cannot be reached ({type(err).__name__}: {err}): every lookup there is a miss and "
            "nothing is shared (the cache works from this host's disk); start or reach the server, or correct "
            "CODEGEN_CACHE_REMOTE (CODEGEN_CACHE_REMOTE_TIMEOUT is the deadline of each call)"]}
    finally:
        tier.close()
    return {"url": url, "reached": True, "problems": []}


def check_toolchain() -> dict[str, Any]:
    """TVM, LLVM, nvcc, a CUDA driver and a C compiler: what this host can make and load."""
    from .._compat import cuda_runtime_available, tvm
    from .._key import static_salts
    from ..codegens.cuda import find_nvcc, nvcc_version

    salts = dict(static_salts())
    return {
        "tvm": salts.get("tvm"),
        "tvm_ffi": salts.get("tvm_ffi"),
        "llvm": salts.get("llvm"),
        "llvm_enabled": bool(tvm.runtime.enabled("llvm")),
        "nvcc": find_nvcc(),
        "nvcc_version": nvcc_version(),
        "cuda_driver": cuda_runtime_available(),
        **check_compiler(),
    }


def check_compiler() -> dict[str, Any]:
    """The command the llvm upgrader links with ($CXX/$CC as a command line, else g++ ...), tried on a tiny library."""
    from .._artifacts import compiler_command

    command = compiler_command()
    found = {"c_compiler": " ".join(command) or None, "c_compiler_ok": False, "c_compiler_error": None}
    if not command:
        found["c_compiler_error"] = "none found ($CXX, $CC, g++, gcc, clang++, clang, c++, cc)"
        return found
    with tempfile.TemporaryDirectory(prefix="cgc-doctor-") as tmp:
        source, lib = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe.so")
        with open(source, "w") as f:
            f.write("int codegen_cache_probe(void) { return 0; }\n")
        try:
            # The way the upgrader links (-shared -fPIC), in a session of its own as there.
            done = subprocess.run([*command, "-shared", "-fPIC", "-o", lib, source], capture_output=True, text=True,
                                  timeout=120, start_new_session=True, check=False)
        except (OSError, subprocess.SubprocessError) as err:
            found["c_compiler_error"] = str(err)
            return found
        if done.returncode != 0 or not os.path.exists(lib):
            found["c_compiler_error"] = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        else:
            found["c_compiler_ok"] = True
    return found


def toolchain_notes(tool: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(notes, problems) about what the toolchain means for the cache."""
    notes, problems = [], []
    if tool["nvcc"]:
        notes.append(f"nvcc {tool['nvcc']} ({tool['nvcc_version']}): compiled CUDA entries can be made here")
    else:
        notes.append("nvcc not found: compiled CUDA entries cannot be made here "
                     "(pip install 'tvm-codegen-cache[cuda]'); CUDA source entries can")
    if tool["cuda_driver"]:
        notes.append("CUDA driver loaded: compiled CUDA entries are loaded and runnable here")
    else:
        notes.append("no CUDA driver: compiled CUDA entries can be made (codegen-cache warm) but not loaded here")
    if tool["c_compiler_ok"]:
        notes.append(f"C compiler `{tool['c_compiler']}` (from $CXX, $CC or PATH) links a shared library: "
                     "llvm entries become shared libraries")
    else:
        problems.append(f"C compiler `{tool['c_compiler'] or '-'}` cannot link a shared library "
                        f"({tool['c_compiler_error']}): llvm entries stay LLVM IR (correct, slower hits); "
                        "set CC or CXX to a working compiler command, or install gcc")
    return notes, problems


def doctor(settings, *, processes: int = 3, kernels: str | None = None,
           targets: list[str] | None = None) -> dict[str, Any]:
    """Every check; `problems` lists what needs attention (empty: healthy)."""
    from .._config import unknown_env_vars

    report: dict[str, Any] = {"directory": str(settings.directory)}
    problems: list[str] = []
    if processes > 0:
        det = check_determinism(processes, kernels=kernels, targets=targets)
        report["determinism"] = det
        problems += [f"key part {u['part']!r} of {u['sample']} differs {u['where']}" for u in det["unstable"]]
        problems += [f"determinism check: {e}" for e in det["errors"]]
    fs = check_filesystem(Path(settings.directory), settings)
    report["filesystem"] = fs
    problems += fs["problems"]
    switch = check_switch()
    report["switch"] = switch
    problems += switch["problems"]
    remote = check_remote(settings)
    report["remote"] = remote
    problems += remote["problems"]
    try:
        tool = check_toolchain()
    except ImportError as err:
        # A TVM this package cannot use (runtime-only, another version): the other checks still report.
        problem = (f"TVM cannot be used by this package here ({type(err).__name__}: {err}): nothing is compiled "
                   "through the cache in this environment; install apache-tvm 0.27 (pip install "
                   "'tvm-codegen-cache[tvm]') or unset TVM_USE_RUNTIME_LIB where compiles should be cached")
        report["toolchain"] = {"error": str(err), "notes": [], "problems": [problem]}
        problems.append(problem)
    else:
        notes, tool_problems = toolchain_notes(tool)
        report["toolchain"] = {**tool, "notes": notes, "problems": tool_problems}
        problems += tool_problems
    unknown = unknown_env_vars()
    report["unknown_env_vars"] = unknown
    problems += [f"{v} is set but is not a codegen-cache setting (a typo?)" for v in unknown]
    report["problems"] = problems
    return report


def render(report: dict[str, Any]) -> list[str]:
    """The report as `codegen-cache doctor` prints it."""
    from .._config import format_size

    lines: list[str] = []
    out = lines.append
    det = report.get("determinism")
    if det is not None:
        out(f"key determinism: {len(det['samples'])} sample lowerings in {det['processes']} fresh processes "
            f"(PYTHONHASHSEED {', '.join(det['seeds'])}), each lowered twice")
        if not det["unstable"] and not det["errors"]:
            out("  ok: every key part is the same in every process and on every lowering")
        for u in det["unstable"]:
            out(f"  NOT DETERMINISTIC: part {u['part']!r} of {u['sample']} differs {u['where']}: every run "
                "computes another key, so it always misses")
        for e in det["errors"]:
            out(f"  ERROR: {e}")
    fs = report["filesystem"]
    free = format_size(fs["free_bytes"]) if fs["free_bytes"] is not None else "unknown"
    out(f"filesystem: {fs['directory']}" + ("" if fs["exists"] else " (a file)" if fs.get("is_file")
                                            else " (not created yet)"))
    out(f"  {fs['fs_type']} mounted at {fs['mount_point']}: {'network' if fs['is_network'] else 'local'}, "
        f"{'read-only' if fs['read_only'] else 'writable'}, {'noexec' if fs['noexec'] else 'exec'}, {free} free")
    for p in fs["problems"]:
        out(f"  WARNING: {p}")
    if not fs["problems"]:
        out("  ok: a local, writable filesystem with room for the size limits")
    tool = report["toolchain"]
    out("toolchain: TVM not usable here" if "error" in tool else
        f"toolchain: tvm {tool['tvm']}, tvm-ffi {tool['tvm_ffi']}, LLVM {tool['llvm']}")
    for note in tool["notes"]:
        out(f"  {note}")
    for problem in tool.get("problems", ()):
        out(f"  WARNING: {problem}")
    switch = report.get("switch")
    if switch is not None:
        out(f"switch: CODEGEN_CACHE_ENABLE={switch['variable'] or '(unset)'}, start-up hook "
            f"{switch['hook_file'] or 'not installed for this interpreter'}")
        for note in switch["notes"]:
            out(f"  {note}")
        for problem in switch["problems"]:
            out(f"  WARNING: {problem}")
    remote = report.get("remote")
    if remote is not None and remote["url"] is not None:
        out(f"remote: {remote['url']}" + (": reached" if remote["reached"] else ""))
        for problem in remote["problems"]:
            out(f"  WARNING: {problem}")
    for var in report["unknown_env_vars"]:
        out(f"configuration: WARNING: {var} is set but is not a codegen-cache setting (a typo?)")
    problems = report["problems"]
    out(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found" if problems else "no problems found")
    return lines

