"""Cache keys: an ordered list of named parts, hashed with xxh3-128.

Parts, in order: the device IRModule's structural hash, the canonical target, the codegen
name, the mode, then salts (TVM version and commit, tvm-ffi version, LLVM major, the
artifact format version, the codegen's toolchain, the codegen's own salt).

Deliberately excluded (they do not change what a codegen emits):
- parameter and buffer names of the IRModule (structural hashing ignores them);
- the order a Target's attributes were written in (the target is canonicalized);
- PYTHONHASHSEED, process id, host name, time, the cache directory, the Python version;
- the PassContext: the codegen's input is already lowered, so lowering options are in the IR
  (codegen_cache.build keys the *input* module and includes the PassContext there); every
  registered pass config and opt level was checked to change no built-in codegen's output;
- environment variables and callbacks a codegen does not read (each built-in codegen's
  toolchain lists the ones it does; codegens/_common.EXCLUDED_ENV lists the variables TVM
  reads that are left out, each with its reason).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache, partial
from typing import TYPE_CHECKING

import xxhash

from . import _compat
from ._targets import canonical_target

if TYPE_CHECKING:
    from ._compat import IRModule, Target

__all__ = ["PART_NAMES", "CacheKey", "ToolchainParts", "compute_key", "ir_hash", "static_salts"]

logger = logging.getLogger(__name__)

# The parts of a key, in order (metadata keeps them as sorted JSON; tools restore this order).
PART_NAMES = ("ir", "target", "codegen", "mode", "tvm", "tvm_ffi", "llvm", "format", "toolchain", "salt")


_BY_FUNCTION = b"cgc-ir-by-function\0"


def ir_hash(mod: IRModule) -> int:
    """Structural hash of `mod`, mapping free vars so lowered CPU modules hash stably.

    A module of several functions is hashed function by function, combined in name order
    with its attributes and global infos (what TVM's module hash covers): TVM's hash of a
    whole lowered host module costs more than its functions' hashes together (for 64 llvm
    functions; equal for a CUDA device module: docs/key.md, docs/benchmarks.md at 5788f7c "Against the
    goals"), while the per-function hashes tell the same modules apart (GlobalVar names
    are hashed, also where a body calls one).
    """
    functions = mod.functions
    if len(functions) <= 1:
        return _compat.structural_hash(mod)
    return _combined(_BY_FUNCTION, mod, {gv.name_hint: func for gv, func in functions.items()})


def _named_units(prefix: bytes, mod: IRModule, functions: dict) -> tuple[list, Callable[[list[int]], int]]:
    """The functions in name order, then the module's attributes and global infos; combined by _combine."""
    names = sorted(functions)
    return [functions[name] for name in names] + [mod.attrs, mod.global_infos], partial(_combine, prefix, names)


def _combined(prefix: bytes, mod: IRModule, functions: dict) -> int:
    """xxh3-64 of the functions' hashes in name order, with the module's attributes and global infos."""
    objects, combine = _named_units(prefix, mod, functions)
    return combine([_compat.structural_hash(obj) for obj in objects])


def _combine(prefix: bytes, names: list[str], values: list[int]) -> int:
    """`values`: the hashes of the functions called `names`, then of the attributes and the global infos."""
    digest = xxhash.xxh3_64(prefix)
    for name, value in zip(names, values):
        digest.update(_encode_part(name, f"{value & 0xFFFFFFFFFFFFFFFF:016x}"))
    digest.update(_encode_part("attrs", f"{values[-2] & 0xFFFFFFFFFFFFFFFF:016x}"))
    digest.update(_encode_part("global_infos", f"{values[-1] & 0xFFFFFFFFFFFFFFFF:016x}"))
    return digest.intdigest()


@lru_cache(maxsize=1)
def static_salts() -> tuple[tuple[str, str], ...]:
    """Salts that are fixed for the life of the process: TVM (version and commit), tvm-ffi, LLVM."""
    return (
        ("tvm", _compat.tvm_version()),
        ("tvm_ffi", _compat.ffi_version()),
        ("llvm", _compat.llvm_version_major()),
    )


def _encode_part(name: str, value: str) -> bytes:
    # Length-prefixed, so that no two different part lists encode to the same bytes.
    n, v = name.encode(), value.encode()
    return len(n).to_bytes(8, "little") + n + len(v).to_bytes(8, "little") + v


def encode_parts(parts: Iterable[tuple[str, str]]) -> bytes:
    """Named parts as the bytes a key's digest hashes (CacheKey.from_parts)."""
    return b"".join(_encode_part(name, value) for name, value in parts)


class CacheKey:
    """A cache key: its named parts, in order, and their xxh3-128 digest."""

    __slots__ = ("_ir", "_tail", "digest")

    def __init__(self, parts: tuple[tuple[str, str], ...], digest: str) -> None:
        self._ir = parts[0]
        self._tail = tuple(parts[1:])
        self.digest = digest

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """The named parts, in order."""
        return (self._ir, *self._tail)

    @property
    def ir_hash(self) -> int:
        """The structural hash part, as an int."""
        return int(self._ir[1], 16)

    def as_dict(self) -> dict[str, str]:
        """The parts as an ordered dict (for metadata, `show` and `explain`)."""
        return dict(self.parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheKey) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"CacheKey({self.digest})"

    @classmethod
    def from_parts(cls, parts: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> CacheKey:
        """Hash named parts into a key."""
        data = encode_parts(parts)
        return cls(tuple(parts), xxhash.xxh3_128_hexdigest(data))


class ToolchainParts(Mapping):
    """A read-only toolchain part whose sorted items and hash are computed once.

    A toolchain function that memoizes its answer returns one of these: compute_key then
    finds the encoded key tail without sorting or hashing the parts again.
    """

    __slots__ = ("_data", "_hash", "sorted_items")

    def __init__(self, parts: Mapping[str, str]) -> None:
        self._data = dict(parts)
        self.sorted_items = tuple(sorted(self._data.items()))
        self._hash = hash(self.sorted_items)

    def __getitem__(self, name: str) -> str:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is ToolchainParts:
            return self is other or (self._hash == other._hash and self.sorted_items == other.sorted_items)
        return isinstance(other, Mapping) and self._data == dict(other)

    def __repr__(self) -> str:
        return f"ToolchainParts({self._data!r})"


_IR_PREFIX = _encode_part("ir", "0" * 16)[:-16]
# Everything but the IR hash is the same for many lowerings: encode it once per combination.
_TAILS_MAX = 4096
_tails: dict[tuple, tuple[tuple[tuple[str, str], ...], bytes]] = {}


def _tail(target: Target, codegen: str, compile_device: bool, toolchain: tuple | ToolchainParts, salt: str,
          format_version: str):
    # `toolchain`: its sorted items, or a ToolchainParts (hashed once, compared by identity first).
    memo = (target, codegen, compile_device, toolchain, salt, format_version)
    found = _tails.get(memo)
    if found is None:
        if type(toolchain) is ToolchainParts:
            toolchain = toolchain.sorted_items
        parts = (
            ("target", canonical_target(target)),
            ("codegen", codegen),
            ("mode", "compiled" if compile_device else "source"),
            *static_salts(),
            ("format", format_version),
            ("toolchain", json.dumps(dict(toolchain), sort_keys=True, separators=(",", ":"))),
            ("salt", salt),
        )
        found = (parts, encode_parts(parts))
        if len(_tails) >= _TAILS_MAX:
            _tails.clear()
        _tails[memo] = found
    return found


def compute_key(
    mod: IRModule,
    target: Target,
    codegen: str,
    compile_device: bool,
    *,
    toolchain: Mapping[str, str] | None = None,
    salt: str = "",
    structural_hash: int | None = None,
    format_version: str = "",
) -> CacheKey:
    """The key of lowering `mod` for `target` with the named codegen in one mode.

    `format_version`: the artifact format the entry is written in (a salt: entries of another
    layout are never looked up).
    """
    if structural_hash is None:
        structural_hash = ir_hash(mod)
    tail_parts, tail_bytes = _tail(
        target, codegen, compile_device,
        toolchain if type(toolchain) is ToolchainParts else tuple(sorted(toolchain.items())) if toolchain else (),
        salt, format_version,
    )
    ir_hex = f"{structural_hash & 0xFFFFFFFFFFFFFFFF:016x}"
    key = CacheKey((("ir", ir_hex), *tail_parts), xxhash.xxh3_128_hexdigest(_IR_PREFIX + ir_hex.encode() + tail_bytes))
    if logger.isEnabledFor(logging.DEBUG):
        for name, value in key.parts:
            logger.debug("key %s part %s = %s", key.digest[:16], name, value)
    return key
