"""The MetaSchedule builder hook: worker processes, shared counters, tune_tir run twice."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult
from tvm.script import tirx as T
from tvm.target import Target

import codegen_cache as cc
import kernels
from conftest import CUDA_TARGET, HAS_NVCC
from cuda_stub import build_stub
from codegen_cache._build import _metaschedule
from codegen_cache._build._metaschedule import CachedBuild, cached_export, metaschedule_builder

LLVM = Target({"kind": "llvm", "num-cores": 2})


@T.prim_func(s_tir=True)
def matmul(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"), C: T.Buffer((64, 64), "float32")):
    for i, j, k in T.grid(64, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


@pytest.fixture(autouse=True)
def _close_hook_caches():
    """CachedBuild keeps one cache per directory in the process; close this test's."""
    yield
    while _metaschedule._caches:
        _metaschedule._caches.popitem()[1].close()


def _vadd_main():
    return tvm.IRModule({"main": kernels.vadd.with_attr("global_symbol", "main")})


def _check_vadd(path):
    module = tvm.runtime.load_module(path)
    a = np.arange(1024, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"))
    module["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), 2 * a)


def test_cached_build_pickles_with_its_directory(tmp_path):
    hook = CachedBuild(tmp_path / "cache")
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads)):
        copy = loads(dumps(hook))
        assert isinstance(copy, CachedBuild) and copy.cache_dir == str(tmp_path / "cache")


ENV_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import tvm, kernels
    from codegen_cache._build._metaschedule import CachedBuild, cached_export
    mod = tvm.IRModule({{"main": kernels.vadd.with_attr("global_symbol", "main")}})
    module = CachedBuild()(mod, tvm.target.Target("llvm"), None)
    print(cached_export(module))
    """
)


@pytest.mark.slow
def test_without_a_directory_workers_use_codegen_cache_dir(tmp_path):
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    script = ENV_SCRIPT.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    _check_vadd(done.stdout.split()[-1])
    stats = cc.CodegenCache(tmp_path / "cache").stats()
    assert (stats.codegen_runs, stats.misses) == (1, 1)


@pytest.mark.smoke
def test_local_builder_second_batch_is_all_hits_and_its_artifacts_run(tmp_path):
    cache_dir = tmp_path / "cache"
    inputs = [BuilderInput(_vadd_main(), LLVM), BuilderInput(tvm.IRModule({"main": matmul}), LLVM)]
    results = []
    for _ in range(2):  # two pools: the second batch runs in a worker process the first never saw
        builder = metaschedule_builder(cache_dir, max_workers=1, timeout_sec=120)
        results.append(builder.build(inputs))
    first, second = results
    assert [r.error_msg for r in first + second] == [None] * 4
    # The first batch exports TVM's way (tar of object files); the second writes the cached .so.
    assert [Path(r.artifact_path).suffix for r in first + second] == [".tar", ".tar", ".so", ".so"]
    for result in (first[0], second[0]):
        _check_vadd(result.artifact_path)
    stats = cc.CodegenCache(cache_dir).stats()  # counters of every worker process
    assert (stats.codegen_runs, stats.misses, stats.hits_disk) == (2, 2, 2)


def test_cached_export_writes_modules_served_from_ir_and_from_the_library(tmp_path):
    hook = CachedBuild(tmp_path / "cache")
    hook(_vadd_main(), LLVM, None)
    raw = CachedBuild(tmp_path / "cache", cache_options={"memory_entries": 0})(_vadd_main(), LLVM, None)
    _check_vadd(cached_export(raw))  # any module, any number of times: no per-worker records
    _check_vadd(cached_export(raw))
    assert hook.cache().flush(upgrades=True, timeout=300)
    library = CachedBuild(tmp_path / "cache", cache_options={"memory_entries": 0})(_vadd_main(), LLVM, None)
    assert isinstance(library, cc._artifacts.CachedLibraryModule) and library.kind == "llvm"
    path = cached_export(library)
    assert path.endswith(".so")
    _check_vadd(path)


STUB_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import tvm, kernels
    from codegen_cache._build._metaschedule import CachedBuild, cached_export
    mod = tvm.IRModule({{"main": kernels.vadd_gpu.with_attr("global_symbol", "main")}})
    module = CachedBuild({cache!r})(mod, tvm.target.Target({cuda!r}), None)
    path = cached_export(module)
    loaded = tvm.runtime.load_module(path)
    print(path.rsplit(".", 1)[-1], module.kind, [m.kind for m in module.imports][0],
          [m.kind for m in loaded.imports][0])
    """
)


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.slow
def test_gpu_builds_export_a_fresh_host_with_the_cached_compiled_device_code(tmp_path):
    stub = build_stub(tmp_path / "stub")
    if stub is None:
        pytest.skip("gcc or libcudart.so.13 is missing: cannot build the stub CUDA driver")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    script = STUB_SCRIPT.format(tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"), cuda=CUDA_TARGET)
    for _ in range(2):  # cold (nvcc), then warm in a new process
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        suffix, host_kind, *imports = done.stdout.split()[-4:]
        assert (suffix, imports) == ("tar", ["cuda", "cuda"]) and host_kind in ("llvm", "library")
    stats = cc.CodegenCache(tmp_path / "cache").stats()
    # Built once each (device, host); one disk hit: the warm build, served whole (the cold
    # build's private copy of its host module is a read, not a hit).
    assert (stats.codegen_runs, stats.hits_disk) == (2, 1)


def test_a_warm_gpu_build_without_the_device_runtime_exports_as_the_cold_one(tmp_path):
    # No CUDA driver here: TVM's CUDA codegen makes a source-only module. A warm build in a new
    # cache object (no memory tier: from disk) is that module again, so MetaSchedule's export of it
    # packs the same device code as the cold build's, rather than failing on a plain source module.
    from codegen_cache._build._metaschedule import cached_export

    mod = tvm.IRModule({"main": kernels.vadd_gpu.with_attr("global_symbol", "main")})
    cold = CachedBuild(tmp_path / "cache")(mod, Target(CUDA_TARGET), None)
    warm = CachedBuild(tmp_path / "cache", cache_options={"memory_entries": 0})(mod, Target(CUDA_TARGET), None)
    assert [m.kind for m in warm.imports] == [m.kind for m in cold.imports] == ["cuda"]
    assert warm.imports[0].inspect_source("cu") == cold.imports[0].inspect_source("cu")
    for built in (cold, warm):
        path = cached_export(built)
        assert Path(path).stat().st_size > 0 and path.endswith(".tar")


@derived_object
class Finished(PyRunnerFuture):
    """A runner future that is done, with a fixed cost."""

    def __init__(self, cost: float) -> None:
        super().__init__()
        self.cost = cost

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return RunnerResult([self.cost], None)


@derived_object
class CheckingRunner(PyRunner):
    """Runs every artifact and checks its result; reports a cost that depends only on the
    candidate's place in the batch, so that timing noise cannot change the best schedule."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.a, self.b = rng.random((64, 64), dtype="float32"), rng.random((64, 64), dtype="float32")

    def run(self, runner_inputs):
        futures = []
        for index, runner_input in enumerate(runner_inputs):
            module = tvm.runtime.load_module(runner_input.artifact_path)
            out = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
            module["main"](tvm.runtime.tensor(self.a), tvm.runtime.tensor(self.b), out)
            np.testing.assert_allclose(out.numpy(), self.a @ self.b, rtol=1e-4)
            futures.append(Finished(1e-3 * (index + 1)))
        return futures


def _tune(cache_dir, work_dir):
    database = ms.tune_tir(
        matmul, LLVM, str(work_dir), max_trials_global=8, num_trials_per_iter=8,
        builder=metaschedule_builder(cache_dir, max_workers=2, timeout_sec=300), runner=CheckingRunner(),
        cost_model=ms.cost_model.RandomModel(seed=7), seed=7,
        num_tuning_cores=1,  # parallel sampling threads make the candidates depend on timing
    )
    best = ms.tir_integration.compile_tir(database, matmul, LLVM)
    return sorted(str(r.trace) for r in database.get_all_tuning_records()), best


# ~3 minutes on 2 busy cores, most of it TuneContext importing tvm.s_tir.tensor_intrin (over a
# minute of parsing, once per process). It runs in the default test run, so in CI.
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_tune_tir_twice_second_run_is_all_hits_with_the_same_best_schedule(tmp_path):
    cache_dir = tmp_path / "cache"
    traces1, best1 = _tune(cache_dir, tmp_path / "run1")
    after_first = cc.CodegenCache(cache_dir).stats()
    traces2, best2 = _tune(cache_dir, tmp_path / "run2")
    after_second = cc.CodegenCache(cache_dir).stats()
    assert len(traces1) == 8 and traces1 == traces2
    assert after_first.codegen_runs == after_first.misses == 8
    assert after_second.codegen_runs - after_first.codegen_runs == 0  # no codegen call in the second run
    assert after_second.misses - after_first.misses == 0
    assert after_second.hits - after_first.hits == 8
    assert str(best1.trace) == str(best2.trace)
    assert tvm_ffi.structural_equal(best1.mod, best2.mod)
