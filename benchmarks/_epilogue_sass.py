"""How many machine instructions the FFN epilogue's activation costs per output element.

At the H200's power cap a call's time is its energy divided by the cap, so an epilogue costs
what its instructions cost to execute, whether or not they overlap the matmul. This compiles
``kernelnotes.ffn.kernel.activation_epilogue`` alone, the function the matmul's epilogue
inlines, for sm_90 (``triton.compile``, no GPU needed) and counts the SASS instructions it
adds per element over the identity, with the ``cuobjdump`` that ships with Triton. Imported
by ``bench_ffn.run`` (and ``tests/test_ffn.py``, which compiles it without a GPU).
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from kernelnotes.ffn.kernel import ACTIVATIONS, activation_epilogue

BLOCK, WARPS = 2048, 4  # 16 elements a thread: the per-element count is the total over 16
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


@triton.jit
def _act_only(x_ptr, y_ptr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, activation_epilogue(tl.load(x_ptr + offs), ACT).to(tl.bfloat16))


def _opcodes(act: int, arch: int) -> collections.Counter:
    source = triton.compiler.ASTSource(
        fn=_act_only, signature={"x_ptr": "*fp32", "y_ptr": "*bf16", "ACT": "constexpr",
                                 "BLOCK": "constexpr"},
        constexprs={"ACT": act, "BLOCK": BLOCK})
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": WARPS})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    return collections.Counter(_OPCODE.findall(sass))


def instructions_per_element(arch: int = 90) -> dict[str, dict]:
    """{activation: {"total": instructions a element, opcode: count a element, ...}} over the
    identity ("none"), for each of kernel.ACTIVATIONS."""
    per_thread = BLOCK // (32 * WARPS)
    base = _opcodes(0, arch)
    out = {}
    for code, name in enumerate(ACTIVATIONS):
        ops = _opcodes(code, arch)
        extra = {op: (ops[op] - base[op]) / per_thread for op in ops | base
                 if ops[op] != base[op]}
        out[name] = {"total": (sum(ops.values()) - sum(base.values())) / per_thread,
                     **dict(sorted(extra.items(), key=lambda kv: -kv[1]))}
    return out
