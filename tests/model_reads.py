"""What a Relax compile reads besides its input, as TVM users register it: for tests/test_model_key_reads.py.

`model()` is `main(x) = x * w + 1` (w bound); the legalizations below turn its `relax.add` into a
subtraction or a multiplication, so a served executable's numbers say which one it was compiled
with. `tuned_database(...)` holds one real record per task of the MLP (a schedule that
parallelizes its outer loop), so an executable compiled under it calls TVM's parallel launch.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, topi

import relax_models

WEIGHTS = np.arange(8, dtype="float32").reshape(2, 4)
X = relax_models.inputs((2, 4))
EXPECTED = {"stock": X * WEIGHTS + 1, "subtract": X * WEIGHTS - 1, "multiply": X * WEIGHTS * 1}
LLVM = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def model() -> tvm.IRModule:
    """main(x) = x * WEIGHTS + 1."""
    return relax_models.with_constant(WEIGHTS)


def subtract(bb, call):
    """relax.add legalized as a subtraction."""
    return bb.call_te(topi.subtract, call.args[0], call.args[1])


def multiply(bb, call):
    """relax.add legalized as a multiplication."""
    return bb.call_te(topi.multiply, call.args[0], call.args[1])


LEGALIZATIONS = {"subtract": subtract, "multiply": multiply}


def run(executable) -> np.ndarray:
    """main(X) on the Relax VM."""
    return relax_models.run(executable, "main", X)


def legalizing_pipeline(legalize):
    """A pipeline factory (what register_pipeline takes) that legalizes relax.add with `legalize`."""

    def pipeline():
        return tvm.transform.Sequential([relax.transform.LegalizeOps({"relax.add": legalize}),
                                         relax.get_pipeline("default")])

    return pipeline


def calling_global(name: str):
    """A pipeline factory whose legalization of relax.add calls the global function `name` (looked up when run)."""

    def pipeline():
        def legalize(bb, call):
            return tvm.get_global_func(name)(bb, call)

        return tvm.transform.Sequential([relax.transform.LegalizeOps({"relax.add": legalize}),
                                         relax.get_pipeline("default")])

    return pipeline


def tuned_pipeline():
    """Relax's zero pipeline (which applies the tuning database in context), then the default one."""
    return tvm.transform.Sequential([relax.get_pipeline("zero"), relax.get_pipeline("default")])


def register_pipeline(name: str, factory) -> None:
    """relax.register_pipeline(name)(factory), replacing an earlier one (register_pipeline refuses to)."""
    relax.pipeline.PIPELINE_MAP.pop(name, None)
    relax.register_pipeline(name)(factory)


def restore_legalization(op_name: str, original) -> None:
    """Put TVM's own FLegalize of `op_name` back (register_op_attr only goes up in level)."""
    op = tvm.ir.Op.get(op_name)
    op.reset_attr("FLegalize")
    op.set_attr("FLegalize", original, 10)


def tuned_database():
    """A MemoryDatabase with one real record per task of relax_models.mlp(): its outer loop parallelized."""
    from tvm.s_tir import meta_schedule as ms

    mod, _named = relax_models.mlp()
    with LLVM:
        fused = relax.get_pipeline("zero")(mod)
    database = ms.database.MemoryDatabase()
    for task in ms.relax_integration.extract_tasks(fused, LLVM):
        workload = task.dispatched[0]
        schedule = tvm.s_tir.Schedule(workload)
        schedule.work_on(next(iter(workload.get_global_vars())).name_hint)
        block = schedule.get_child_blocks(schedule.get_sblock("root"))[0]
        schedule.parallel(schedule.get_loops(block)[0])
        database.commit_tuning_record(ms.database.TuningRecord(
            schedule.trace, database.commit_workload(workload), [1e-5], LLVM))
    return database


def parallel_launches(executable) -> int:
    """How often the executable's library calls TVM's parallel launch (a tuned MLP does, an untuned one not)."""
    return executable.mod.imports[0].inspect_source("ll").count("TVMBackendParallelLaunch")
