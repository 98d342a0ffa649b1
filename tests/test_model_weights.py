"""Real models with their weights bound in: keyed by content, stored once, served whole or not at all.

Models are nn.Module MLPs bound with BindParams (about 2 MiB of weights, over the size from which
weights are keyed and stored apart) and an ONNX graph through from_onnx; outputs are compared
with numpy.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

import codegen_cache as cc
from codegen_cache import _compat
from codegen_cache._build import _relax, _tensors
from codegen_cache._storage._layout import MODEL_CODEC, TENSOR_CODEC

IN, WIDTH = 256, 1024  # two 1 MiB weights


class MLP(nn.Module):
    def __init__(self, activation: str = "relu") -> None:
        self.l1, self.l2 = nn.Linear(IN, WIDTH), nn.Linear(WIDTH, IN)
        self.activation = activation

    def forward(self, x):
        h = self.l1(x)
        return self.l2(nn.op.relu(h) if self.activation == "relu" else nn.op.silu(h))


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"l1.weight": rng.standard_normal((WIDTH, IN), dtype=np.float32) * 0.05,
            "l1.bias": rng.standard_normal(WIDTH, dtype=np.float32),
            "l2.weight": rng.standard_normal((IN, WIDTH), dtype=np.float32) * 0.05,
            "l2.bias": rng.standard_normal(IN, dtype=np.float32)}


def _bound(values: dict[str, np.ndarray], activation: str = "relu") -> tvm.IRModule:
    mod, _ = MLP(activation).export_tvm({"forward": {"x": nn.spec.Tensor((1, IN), "float32")}})
    return relax.transform.BindParams("forward", {n: tvm.runtime.tensor(v) for n, v in values.items()})(mod)


X = np.random.default_rng(9).standard_normal((1, IN), dtype=np.float32)


def _expected(values: dict[str, np.ndarray]) -> np.ndarray:
    h = np.maximum(X @ values["l1.weight"].T + values["l1.bias"], 0)
    return h @ values["l2.weight"].T + values["l2.bias"]


def _run(executable, entry: str = "forward") -> np.ndarray:
    return relax.VirtualMachine(executable, tvm.cpu())[entry](tvm.runtime.tensor(X)).numpy()


def _tiers(outcomes) -> list[str]:
    return [o.tier for o in outcomes if o.codegen == "relax.build"]


def _entries(cache, codec: str) -> list[str]:
    store = cache.store("compiled")
    return [k for k in store.keys() if codec.encode() in (store.get(k) or b"")[-64:]]


def _size(cache) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(cache.directory) for f in files)


def _fresh(cache) -> cc.CodegenCache:
    return cc.CodegenCache(cache.directory, write_behind=False)


def test_a_bound_model_is_served_from_its_weights_entries_in_a_fresh_process_view(enabled):
    values = _weights()
    np.testing.assert_allclose(_run(tvm.compile(_bound(values), "llvm")), _expected(values), rtol=1e-4, atol=1e-5)
    assert len(_entries(enabled, TENSOR_CODEC)) == 2  # the two weights; the biases stay in the skeleton
    with cc.use_cache(_fresh(enabled)), cc.record_outcomes() as outcomes:
        warm = tvm.compile(_bound(values), "llvm")
    assert _tiers(outcomes) == ["disk"]
    np.testing.assert_allclose(_run(warm), _expected(values), rtol=1e-4, atol=1e-5)
    warm.export_library(str(enabled.directory.parent / "m.so"))  # warm = cold: the hit exports and runs
    exported = tvm.runtime.load_module(str(enabled.directory.parent / "m.so"))
    np.testing.assert_allclose(_run(exported), _expected(values), rtol=1e-4, atol=1e-5)


def test_editing_one_tensor_adds_that_tensors_bytes_and_the_executables_own(enabled):
    values = _weights()
    tvm.compile(_bound(values), "llvm")
    before, chunks = _size(enabled), len(_entries(enabled, TENSOR_CODEC))
    edited = dict(values, **{"l2.weight": values["l2.weight"] + 1})
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(_bound(edited), "llvm")
    assert _tiers(outcomes) == ["codegen"]
    np.testing.assert_allclose(_run(executable), _expected(edited), rtol=1e-4, atol=1e-5)
    assert len(_entries(enabled, TENSOR_CODEC)) == chunks + 1
    assert _size(enabled) - before <= 1.2 * edited["l2.weight"].nbytes + (256 << 10)


def test_two_models_sharing_their_tensors_share_the_entries(enabled):
    values = _weights()
    tvm.compile(_bound(values, "relu"), "llvm")
    chunks = sorted(_entries(enabled, TENSOR_CODEC))
    with cc.record_outcomes() as outcomes:
        tvm.compile(_bound(values, "silu"), "llvm")  # another model, the same tensors
    assert _tiers(outcomes) == ["codegen"]
    assert sorted(_entries(enabled, TENSOR_CODEC)) == chunks
    assert len(_entries(enabled, MODEL_CODEC)) == 2


def _damage_one_chunk(cache, how: str) -> None:
    store = cache.store("compiled")
    digest = _entries(cache, TENSOR_CODEC)[0]
    if how == "evicted":
        store.delete(digest)
        return
    row = store.read(digest)
    if how == "entry":
        blob = bytearray(row.blob)
        blob[100] ^= 0xFF
        store.put(digest, bytes(blob))
        return
    assert row.path is not None  # a value file beside the database: damaged on disk, behind the store's back
    with open(row.path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("how", ["entry", "file", "evicted"])
def test_a_damaged_or_evicted_tensor_is_a_miss_and_never_a_wrong_weight(enabled, how):
    values = _weights()
    tvm.compile(_bound(values), "llvm")
    assert enabled.flush(upgrades=True, timeout=120)  # the llvm upgrader replaces library entries: done first
    _damage_one_chunk(enabled, how)
    fresh = _fresh(enabled)
    with cc.use_cache(fresh), cc.record_outcomes() as outcomes:
        executable = tvm.compile(_bound(values), "llvm")
        again = tvm.compile(_bound(values), "llvm")
    assert _tiers(outcomes) == ["codegen", "memory"]
    np.testing.assert_allclose(_run(executable), _expected(values), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_run(again), _expected(values), rtol=1e-4, atol=1e-5)
    with cc.use_cache(_fresh(enabled)), cc.record_outcomes() as outcomes:  # stored anew, whole
        np.testing.assert_allclose(_run(tvm.compile(_bound(values), "llvm")), _expected(values), rtol=1e-4, atol=1e-5)
    assert _tiers(outcomes) == ["disk"]


def test_verify_reports_a_model_whose_weights_are_gone_and_fix_removes_the_model(enabled):
    from codegen_cache._cli._inventory import verify_entries

    values = _weights()
    tvm.compile(_bound(values), "llvm")
    assert verify_entries(enabled)["bad"] == []
    (model,) = _entries(enabled, MODEL_CODEC)
    _damage_one_chunk(enabled, "evicted")
    found = verify_entries(enabled, fix=True)
    assert [(b["key"], b["removed"]) for b in found["bad"]] == [(model, True)]
    assert _entries(enabled, MODEL_CODEC) == []


class _DictRemote:
    """A remote tier as the cache takes one: get(digest) and put(digest, blob)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def get(self, digest):
        return self.entries.get(digest)

    def put(self, digest, blob) -> bool:
        self.entries.setdefault(digest, bytes(blob))
        return True


@pytest.mark.parametrize("background", [False, True])
def test_the_weights_chunks_go_to_the_remote_through_the_put_path_of_every_entry(tmp_path, monkeypatch, background):
    # background: stored by the writer thread after tvm.compile returned (what big models get)
    monkeypatch.setattr(_relax, "BACKGROUND_BYTES", 1 if background else _relax.BACKGROUND_BYTES)
    remote = _DictRemote()
    cache = cc.CodegenCache(tmp_path / "cache", remote=remote, write_behind=background)
    cc.enable(cache, children=False)
    try:
        tvm.compile(_bound(_weights()), "llvm")
        assert cache.flush(timeout=120)
        chunks = _entries(cache, TENSOR_CODEC)
        with cc.use_cache(_fresh(cache)), cc.record_outcomes() as outcomes:
            warm = tvm.compile(_bound(_weights()), "llvm")
    finally:
        cc.disable()
        cache.close()
    assert _tiers(outcomes) == ["disk"]
    np.testing.assert_allclose(_run(warm), _expected(_weights()), rtol=1e-4, atol=1e-5)
    assert len(chunks) == 2 and set(chunks) <= set(remote.entries)
    assert all(TENSOR_CODEC.encode() in remote.entries[d][-64:] for d in chunks)


def test_a_rerun_hashes_no_tensor_with_tvm_and_compares_structure_only(enabled, monkeypatch):
    mod = _bound(_weights())
    tvm.compile(mod, "llvm")
    hashed = []
    full_hash, full_equal = _compat.structural_hash, _compat.structural_equal
    monkeypatch.setattr(_compat, "structural_hash", lambda obj: hashed.append(type(obj).__name__) or full_hash(obj))
    monkeypatch.setattr(_compat, "structural_equal", lambda a, b: pytest.fail("compared tensors' bytes"))
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm")
    assert _tiers(outcomes) == ["memory"]
    assert "IRModule" not in hashed and "Function" not in hashed
    np.testing.assert_allclose(_run(executable), _expected(_weights()), rtol=1e-4, atol=1e-5)


def test_a_model_too_big_for_the_memory_tier_is_a_memory_hit_while_its_executable_lives(tmp_path):
    import gc

    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False, memory_bytes=4 << 20)  # a quarter: 1 MiB
    mod = _bound(_weights())
    cc.enable(cache, children=False)
    try:
        with cc.record_outcomes() as outcomes:
            cold = tvm.compile(mod, "llvm")
            again = tvm.compile(mod, "llvm")
            del cold, again
            gc.collect()
            later = tvm.compile(mod, "llvm")  # nothing held it: read from disk, not kept alive by the tier
    finally:
        cc.disable()
        cache.close()
    assert _tiers(outcomes) == ["codegen", "memory", "disk"]
    np.testing.assert_allclose(_run(later), _expected(_weights()), rtol=1e-4, atol=1e-5)


def test_a_tensor_changed_in_place_after_a_compile_changes_the_key(enabled):
    values = _weights()
    tensors = {n: tvm.runtime.tensor(v) for n, v in values.items()}
    mod, _ = MLP().export_tvm({"forward": {"x": nn.spec.Tensor((1, IN), "float32")}})
    mod = relax.transform.BindParams("forward", tensors)(mod)
    tvm.compile(mod, "llvm")
    constants = _compat.bound_constants(mod["forward"])
    changed = dict(values, **{"l1.bias": values["l1.bias"] + 3})
    for tensor in constants:  # the very objects the module holds, written in place
        if tuple(tensor.shape) == (WIDTH,):
            tensor.copyfrom(changed["l1.bias"])
    with cc.record_outcomes() as outcomes:
        executable = tvm.compile(mod, "llvm")
    assert _tiers(outcomes) == ["codegen"]
    np.testing.assert_allclose(_run(executable), _expected(changed), rtol=1e-4, atol=1e-5)


def test_a_hit_saves_the_whole_compile_it_replaced(enabled):
    values = _weights()
    with cc.record_outcomes() as outcomes:
        tvm.compile(_bound(values), "llvm")
        tvm.compile(_bound(values), "llvm")
    miss, hit = [o for o in outcomes if o.codegen == "relax.build"]
    assert hit.tier == "memory" and hit.codegen_seconds >= 0.5 * miss.total_seconds
    row = enabled.stats(shared=False).by_codegen["relax.build/model"]
    assert row["saved_seconds"] == pytest.approx(hit.codegen_seconds)


def test_split_and_join_give_back_the_bytes_exactly():
    header = np.array([0xDD5E40F096B4A13F, 0], dtype="<u8").tobytes() + np.array([1, 0, 1], "<i4").tobytes()
    tensor = header + bytes([2, 32]) + (1).to_bytes(2, "little") + (1 << 15).to_bytes(8, "little") \
        + (1 << 17).to_bytes(8, "little")
    data = b"head" + tensor + os.urandom(1 << 17) + b"middle" + tensor + os.urandom(1 << 17) + b"tail" + b"\x3f" * 7
    skeleton, chunks, pieces = _tensors.split(data)
    assert len(chunks) == 2 and len(skeleton) == len(data) - 2 * (1 << 17)
    assert _tensors.join(skeleton, chunks, [bytes(p) for p in pieces]) == data
    assert _tensors.split(data[:-(1 << 17)])[1][:1] == chunks[:1]  # a header whose bytes run past the end is kept


def test_an_onnx_graph_with_bound_weights_is_served_warm(enabled):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    values = _weights()
    inits = [numpy_helper.from_array(values[n], n.replace(".", "_")) for n in values]
    nodes = [helper.make_node("Gemm", ["x", "l1_weight", "l1_bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "l2_weight", "l2_bias"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, IN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    np.testing.assert_allclose(_run(tvm.compile(from_onnx(model), "llvm"), "main"), _expected(values),
                               rtol=1e-4, atol=1e-5)
    assert _entries(enabled, TENSOR_CODEC)
    with cc.use_cache(_fresh(enabled)), cc.record_outcomes() as outcomes:
        warm = tvm.compile(from_onnx(model), "llvm")
    assert _tiers(outcomes) == ["disk"]
    np.testing.assert_allclose(_run(warm, "main"), _expected(values), rtol=1e-4, atol=1e-5)


def test_a_model_below_the_weights_size_keeps_tvms_hash_of_the_whole_module():
    small = relax.transform.BindParams("forward", {"l1.bias": tvm.runtime.tensor(np.ones(WIDTH, "float32"))})(
        MLP().export_tvm({"forward": {"x": nn.spec.Tensor((1, IN), "float32")}})[0])
    key = _relax.model_key(small, tvm.target.Target("llvm"), None, "default", "default", "bytecode", None,
                           cc.default_registry)
    assert key.as_dict()["weights"] == ""


def test_a_model_miss_is_explained_by_the_key_parts_that_differ_from_the_nearest_entry(enabled, caplog):
    values = _weights()
    tvm.compile(_bound(values), "llvm")
    assert cc.explain_model(_bound(values), "llvm")["status"] == "hit"
    edited = dict(values, **{"l2.weight": values["l2.weight"] * 2})
    report = cc.explain_model(_bound(edited), "llvm")
    assert report["status"] == "miss"
    assert report["nearest"]["differs"] == ["weights"]
    assert report["nearest"]["tensors"] == [2]  # l1.weight, l1.bias, l2.weight, l2.bias: the order TVM visits them
    with caplog.at_level("INFO", logger="codegen_cache"):
        tvm.compile(_bound(edited), "llvm")
    assert any("differs from the nearest entry" in r.getMessage() and "weights (tensor 2 of 4)" in r.getMessage()
               for r in caplog.records)
    with tvm.transform.PassContext(opt_level=3):
        report = cc.explain_model(_bound(edited), "llvm")
    assert report["status"] == "miss" and report["nearest"]["differs"] == ["pass_context"]
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake"})
    assert cc.explain_model(_bound(edited), target)["nearest"]["differs"][0] == "target"  # then what follows it


MODEL_FILE = """
import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn
import test_model_weights as t

values = t._weights()
values["l1.weight"] = values["l1.weight"] + {edit}
mod = t._bound(values)
"""


@pytest.mark.slow
def test_codegen_cache_explain_model_names_the_differing_part(enabled, tmp_path):
    import json
    import subprocess
    import sys

    tvm.compile(_bound(_weights()), "llvm")
    model = tmp_path / "model.py"
    model.write_text(MODEL_FILE.format(edit=1))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(os.path.dirname(__file__)), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "codegen_cache", "--dir", str(enabled.directory), "explain", "--model",
                           str(model), "-t", "llvm", "--json"], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "miss" and report["nearest"]["differs"] == ["weights"]
    assert report["nearest"]["tensors"] == [0]
    text = subprocess.run([sys.executable, "-m", "codegen_cache", "--dir", str(enabled.directory), "explain", "--model",
                           str(model)], capture_output=True, text=True, timeout=240, env=env).stdout
    assert "differs in weights" in text and "MISS" in text


@pytest.mark.parametrize("memory_bytes", [None, 4 << 20])  # held by the tier; held through the caller's executable
def test_a_kept_executable_whose_bound_tensors_were_written_in_place_is_not_served_for_the_old_bytes(
        tmp_path, memory_bytes):
    # TVM's executable holds the very tensors bound into the module: writing into one changes
    # what the executable computes. A later model with the old bytes must not get that executable.
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False, memory_bytes=memory_bytes)
    values = _weights()
    mod = _bound(values)
    cc.enable(cache, children=False)
    try:
        first = tvm.compile(mod, "llvm")
        for tensor in _compat.bound_constants(mod["forward"]):
            if tuple(tensor.shape) == (WIDTH,):
                tensor.copyfrom(values["l1.bias"] + 3)
        with cc.record_outcomes() as outcomes:
            again = tvm.compile(_bound(values), "llvm")  # fresh tensors with the bytes first was keyed by
    finally:
        cc.disable()
        cache.close()
    assert _tiers(outcomes) == ["disk"]
    np.testing.assert_allclose(_run(again), _expected(values), rtol=1e-4, atol=1e-5)
    assert first is not None
