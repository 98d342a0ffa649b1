"""tilelang's own device-codegen registrations, ported for the conformance suite.

Origin: tile-ai/tilelang, commit 607a9144cf375e1176ad487dd5b0e3d87c2cb79a (PR #2442),
files tilelang/{cpu,cuda,metal,rocm,webgpu}/codegen.py and the lazy paths of
tilelang/backend/__init__.py (TILELANG_LAZY below). Adapted: imports (`tilelang.backend.
device_codegen` -> `codegen_cache`) and one kind (`hip` is not a target kind of apache-tvm,
so the rocm module registers its `hip` codegen for the `rocm` kind). Each module registers
when imported, as in tilelang; the tests import them through register_lazy_device_codegen.

Copyright (c) Tile-AI. Licensed under the MIT License:

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

# tilelang/backend/__init__.py at 607a9144c: register_lazy_device_codegen(kind, path) per kind.
TILELANG_LAZY = {
    "cuda": "tilelang_backends.cuda",
    "rocm": "tilelang_backends.rocm",  # tilelang: "hip" -> "tilelang.rocm.codegen"
    "c": "tilelang_backends.cpu",
    "llvm": "tilelang_backends.cpu",
    "metal": "tilelang_backends.metal",
    "webgpu": "tilelang_backends.webgpu",
}
