"""Keys are the same in every fresh process for every kind of input TVM builds, dynamic shapes included.

tests/key_inputs_script.py builds static and dynamic TIR, a multi-function host module, a CUDA
device module, C, and Relax models (dynamic shapes, emit_te) through the cache; it runs three
times, each in a fresh process, over one cache directory. From the second run on, every build is
a hit, with the same build key and the same codegen-level keys.

One input is not the same from process to process: Relax's emit_te with two or more symbolic
variables that are not dimensions of its inputs (a concat of (n,) and (m,)) makes a PrimFunc
whose scalar parameters come in the order of a Python set of TVM objects, i.e. of their
addresses (tvm.relax.utils.gen_call_tir_inputs: `list(used_vars - bound_vars)`), and calls it
in that order; the Relax VM's shape function then computes the two sizes in an order that
varies the same way (vm_shape_lower.cc iterates an unordered_map whose hash of a free variable
is its address). Two orders are two different functions: serving one's code to the other would
swap its arguments. There the key must follow the TIR module: the same module text, the same
key and a hit; another text, another key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ORDER_DEPENDENT = "relax emit_te concat, two vars"


def _run(directory: Path) -> dict:
    env = {"PYTHONPATH": str(HERE), "CODEGEN_CACHE_DIR": str(directory)}
    done = subprocess.run([sys.executable, str(HERE / "key_inputs_script.py"), str(directory)], capture_output=True,
                          text=True, timeout=400, env={**__import__("os").environ, **env}, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)
def test_every_kind_of_input_hits_in_fresh_processes_after_the_first(tmp_path):
    first, *later = [_run(tmp_path / "cache") for _ in range(3)]
    assert all(t == "built" for v in first.values() for t in v["tiers"]), first
    for i, run in enumerate(later):
        for name, seen in run.items():
            if name == ORDER_DEPENDENT:
                earlier = [r[name] for r in (first, *later[:i])]
                same = [e for e in earlier if e["signature"] == seen["signature"]]
                if not same:  # TVM made another module this time: another function, another key
                    assert seen["tiers"] == ["built"] and all(seen["keys"] != e["keys"] for e in earlier), seen
                    continue
                assert seen["keys"] == same[0]["keys"] and set(seen["tiers"]) <= {"disk", "memory"}, (seen, same)
                continue
            assert seen["tiers"] and set(seen["tiers"]) <= {"disk", "memory"}, (name, seen, first[name])
            assert seen["keys"] == first[name]["keys"], name
            assert seen.get("codegen_keys") == first[name].get("codegen_keys"), name
