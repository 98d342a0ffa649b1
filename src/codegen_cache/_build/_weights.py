"""The bound weights of a Relax model, keyed apart from its structure and hashed at memory speed.

TVM's structural hash reads every byte of every bound constant, several times slower than
memory: for a model with its weights bound in (BindParams, the ONNX importer) it is most of
what a key costs. A model whose Relax functions hold SPLIT_BYTES of constants or more is keyed
instead by two parts that together say what the one hash said:

    structure   TVM's structural hash with every tensor's bytes left out (shapes and dtypes
                kept), combined with the full hash (bytes included) of everything that is not a
                Relax function: TIR functions (their AllocateConst data), function and module
                attributes, global infos
    weights     xxh3-128 over each Relax constant's dtype, shape and raw bytes (read in place,
                through DLPack), in the order TVM's expression visitor meets them, Relax
                functions in name order

Two modules with equal structure visit their constants in the same order, so equal parts mean
equal structure and equal bytes at each constant's place. What this cannot see: a tensor held
by a Relax call's attributes (no TVM operator has such an attribute; docs/key.md).

The same tensors passed again are hashed again: a tensor's bytes can change in place (copyfrom,
a numpy view over DLPack) and nothing tells, so no digest is remembered by identity. For the
same reason an executable kept in memory is served again only while the tensors it was compiled
from still hold the bytes it was keyed by (`unchanged`): TVM's executable holds those very tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import xxhash

from .. import _compat
from .._compat import IRModule
from .._key import _encode_part

__all__ = ["SPLIT_BYTES", "Weights", "model_weights", "unchanged"]

# Below this many bytes of constants, TVM's own hash of the whole module is as fast: kept.
SPLIT_BYTES = 1 << 20
_STRUCTURE = b"cgc-model-structure\0"
_WEIGHTS = b"cgc-model-weights\0"


class Weights(NamedTuple):
    """A model's key parts when its weights are keyed apart: structure hash, weights digest, per-tensor digests."""

    structure: int
    digest: str
    nbytes: int
    tensors: tuple[str, ...]  # each constant's digest, in visiting order (what explain compares)
    objects: tuple[Any, ...]  # the constants' tensors themselves, in the same order


def model_weights(mod: IRModule, split_bytes: int | None = None) -> Weights | None:
    """The weights-apart parts of `mod`, or None: fewer constant bytes than SPLIT_BYTES, or not keyable so."""
    tensors: list[Any] = []
    others = []
    for gv, func in sorted(mod.functions.items(), key=lambda item: item[0].name_hint):
        found = _compat.bound_constants(func)
        if found is None:
            others.append((gv.name_hint, func))
        else:
            tensors.extend(found)
            others.append((gv.name_hint + "#attrs", func.attrs))
    buffers = []
    for tensor in tensors:
        if _compat.Tensor is None or not isinstance(tensor, _compat.Tensor):
            return None
        buffers.append(tensor)
    threshold = SPLIT_BYTES if split_bytes is None else split_bytes
    if sum(_nbytes(t) for t in buffers) < threshold:
        return None
    skipped = _compat.structure_hash(mod)
    if skipped is None:
        return None
    structure = xxhash.xxh3_64(_STRUCTURE)
    structure.update(_encode_part("module", f"{skipped & 0xFFFFFFFFFFFFFFFF:016x}"))
    for name, obj in (*others, ("#module-attrs", mod.attrs), ("#global-infos", mod.global_infos)):
        structure.update(_encode_part(name, f"{_compat.structural_hash(obj) & 0xFFFFFFFFFFFFFFFF:016x}"))
    digests = []
    total = 0
    whole = xxhash.xxh3_128(_WEIGHTS)
    for tensor in buffers:
        try:
            digests.append(_digest(tensor))
        except (TypeError, ValueError, RuntimeError, BufferError):
            return None  # a dtype numpy cannot view (bfloat16 without ml_dtypes): TVM's hash
        whole.update(digests[-1].encode())
        total += _nbytes(tensor)
    return Weights(structure.intdigest(), whole.hexdigest(), total, tuple(digests), tuple(buffers))


def unchanged(kept: Weights, now: Weights) -> bool:
    """Whether the tensors `kept` was hashed from still hold those bytes, given `now` has the same digests.

    A compiled executable holds the very tensors bound into its module (TVM does not copy them)
    and constants folded from them: one kept in memory is still the model `kept` names only if
    no one wrote into those tensors since. A tensor `now` passes again is checked by `now`'s own
    hash; any other is hashed again.
    """
    for old, new, digest in zip(kept.objects, now.objects, kept.tensors):
        if old.same_as(new):
            continue
        try:
            if _digest(old) != digest:
                return False
        except (TypeError, ValueError, RuntimeError, BufferError):
            return False
    return True


def _digest(tensor: Any) -> str:
    """xxh3-128 of a tensor's dtype, shape and bytes (read in place)."""
    data = _compat.tensor_buffer(tensor)
    one = xxhash.xxh3_128(_encode_part(str(tensor.dtype), str(tuple(int(s) for s in tensor.shape))))
    one.update(data)
    return one.hexdigest()


def _nbytes(tensor: Any) -> int:
    count = 1
    for extent in tensor.shape:
        count *= int(extent)
    dtype = tensor.dtype
    bits, lanes = getattr(dtype, "bits", 8), getattr(dtype, "lanes", 1)
    return count * max(1, bits * lanes // 8)
