"""tilelang's parallel compile (what its autotuner runs) through the cache: nvcc once per unique config.

Without the cache, the same six compiles on four workers ran nvcc 4 times here (tilelang 0.1.15).
"""

from __future__ import annotations

import random
import threading

import pytest

from .conftest import NO_TILELANG, NO_TILELANG_MODULE, SM80

pytest.importorskip(NO_TILELANG_MODULE, reason=NO_TILELANG)

import tilelang  # noqa: E402

import codegen_cache.tilelang as cct  # noqa: E402

from .tl_kernels import scale  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.mark.skipif(not hasattr(tilelang, "par_compile"), reason="this tilelang has no par_compile")
@pytest.mark.nvcc
def test_parallel_compiles_of_the_same_configs_run_nvcc_once_per_config(monkeypatch):
    from tilelang.contrib import nvcc

    calls, lock = [], threading.Lock()
    real = nvcc.compile_cuda

    def counting(code, *args, **kwargs):
        with lock:
            calls.append(code)
        return real(code, *args, **kwargs)

    monkeypatch.setattr(nvcc, "compile_cuda", counting)
    cct.enable()
    # Factors no earlier run used: the workers' cache (the default one: contextvars do not
    # reach tilelang's worker threads) has never seen these kernels.
    factors = [random.uniform(2, 3), random.uniform(3, 4)]
    funcs = [scale(factor=factors[i % 2]) for i in range(6)]
    kernels = tilelang.par_compile(funcs, target=SM80, num_workers=4)
    assert len(calls) == 2, f"nvcc ran {len(calls)} times for 2 unique configurations"
    sources = [k.get_kernel_source() for k in kernels]
    assert len(set(sources)) == 2
    assert all(sources[i] == sources[i % 2] for i in range(6))
