"""Relax models written with tvm.relax.frontend.nn, as TVM users write them, for compile tests.

`llama(layers, ...)` is a Llama-style decoder stack (RMSNorm, q/k/v/o projections, softmax
attention, SwiGLU MLP); `mlp()` a two-layer perceptron; `with_constant(values)` a model whose
weight is a bound constant (relax.const), so that two models differ only in a weight's bytes.
`inputs(...)` makes deterministic inputs; `run(executable, ...)` runs one on the Relax VM.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.script import relax as R


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        self.weight = nn.Parameter((width,), "float32")

    def forward(self, x):
        return nn.op.rms_norm(x, self.weight, axes=[-1])


class DecoderBlock(nn.Module):
    def __init__(self, width: int, hidden: int, heads: int) -> None:
        self.heads = heads
        self.attention_norm, self.mlp_norm = RMSNorm(width), RMSNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        batch, seq, width = x.shape
        head = width // self.heads

        def split(t):
            return nn.op.permute_dims(nn.op.reshape(t, (batch, seq, self.heads, head)), [0, 2, 1, 3])

        h = self.attention_norm(x)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) * (head ** -0.5)
        attended = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        x = x + self.o(nn.op.reshape(nn.op.permute_dims(attended, [0, 2, 1, 3]), (batch, seq, width)))
        h = self.mlp_norm(x)
        return x + self.down(nn.op.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, layers: int, width: int, hidden: int, heads: int) -> None:
        self.layers = nn.ModuleList([DecoderBlock(width, hidden, heads) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def llama(layers: int = 2, seq: int = 32, width: int = 256, hidden: int = 512, heads: int = 4):
    """(IRModule, [(name, parameter)]) of a Llama-style decoder stack."""
    return Decoder(layers, width, hidden, heads).export_tvm(
        {"forward": {"x": nn.spec.Tensor((1, seq, width), "float32")}})


class MLP(nn.Module):
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(nn.op.relu(self.l1(x)))


def mlp():
    """(IRModule, [(name, parameter)]) of a two-layer perceptron on (4, 16) inputs."""
    return MLP().export_tvm({"forward": {"x": nn.spec.Tensor((4, 16), "float32")}})


def with_constant(values: np.ndarray) -> tvm.IRModule:
    """`main(x) = x * weight + 1` with `weight` bound as a constant of `values`."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(values.shape, str(values.dtype)))
    with builder.function("main", [x]):
        with builder.dataflow():
            scaled = builder.emit(relax.op.multiply(x, relax.const(values)))
            out = builder.emit_output(relax.op.add(scaled, relax.const(np.ones((), values.dtype))))
        builder.emit_func_output(out)
    return builder.get()


def inputs(shape, seed: int = 0) -> np.ndarray:
    """Deterministic float32 inputs."""
    return np.random.RandomState(seed).uniform(-1, 1, size=shape).astype("float32")


def parameters(named) -> list:
    """Deterministic tensors for export_tvm's [(name, parameter)]."""
    return [tvm.runtime.tensor(inputs([int(s) for s in p.shape], seed=i + 1)) for i, (_name, p) in enumerate(named)]


def run(executable, function: str, *args, device=None) -> np.ndarray:
    """Run `function` of `executable` on the Relax VM (CPU) with numpy/tensor arguments; numpy out."""
    vm = relax.VirtualMachine(executable, device or tvm.cpu())
    converted = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a) for a in args]
    return vm[function](*converted).numpy()
