"""Warm = cold: what TVM's own tests do gives the same outcome with no cache, an empty one, and a warm one.

Each scenario (tests/warm_scenarios.py: properties, sources, running, timing, export alone and in
a Relax executable, system libraries, cross-target code, codegen errors) runs in a fresh process
with TVM alone, then through an empty cache, then through the same cache, warm, in another fresh
process; the files each run exported are loaded and run in yet another. Every observation must
be the same (tests/warm_cold.py), and the warm run served by the cache.
"""

from __future__ import annotations

import pytest

from warm_cold import assert_same, three_ways
from warm_scenarios import SCENARIOS


# Six fresh interpreters a scenario: the default run runs SMOKE's; the others are in the slow tier.
SMOKE = "tir_llvm"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", [pytest.param(s, marks=pytest.mark.smoke if s == SMOKE else pytest.mark.slow)
                                      for s in sorted(SCENARIOS)])
def test_a_warm_cache_gives_what_tvm_alone_gives(tmp_path, scenario):
    seen = three_ways(scenario, tmp_path)
    assert_same(seen)
    if scenario == "relax_cuda_source":  # the hits' modules were checked on a twin (tests/test_cache.py: both checks)
        assert all(run["seen"]["checked_on_a_twin"] == [True] for run in seen.values())


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", ["relax_vm", "tir_llvm", "tir_system_lib"])
def test_a_warm_cache_whose_llvm_entries_are_still_ir_gives_what_tvm_alone_gives(tmp_path, scenario):
    """Between a cold build and the link of its entry, hits are llvm modules parsed from the IR."""
    assert_same(three_ways(scenario, tmp_path, warm_form="ir"))
