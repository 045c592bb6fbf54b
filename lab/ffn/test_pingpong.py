"""Tests of the ping-pong design study (lab/ffn/pingpong.py). Not collected by CI (pyproject's
testpaths are tests/ and docs/): run ``pytest lab/ffn/test_pingpong.py`` from the repository
root; the GPU tests need a Hopper GPU (``-m gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests._machine import ON_GPU
from tests._offline import compiled_offline

ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu")
TORCH_ACT = {
    "none": lambda z: z,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}
U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # unit roundoff


def pingpong():
    from lab.ffn import pingpong as pp

    return pp


def rel_err(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).norm() / ref.norm())


def rand(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return t.to(dtype).to("cuda" if ON_GPU else "cpu")


def test_pingpong_refuses_bad_activations_and_cpu_tensors():
    """Gluon kernels do not run in the interpreter: on any machine a CPU tensor is refused with a
    message that says so, and a bad activation is named first."""
    pp = pingpong()
    x, W = torch.randn(16, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="activation must be one of"):
        pp.linear_act_pingpong(x, W, None, "swish")
    with pytest.raises(ValueError, match="x is on cpu: linear_act_pingpong needs a CUDA tensor"):
        pp.linear_act_pingpong(x, W)


def test_pingpong_compiles_for_sm90_without_a_gpu():
    """The ping-pong kernel, compiled for sm_90 in a process without the interpreter (with the
    GELU and without an activation): three partitions in 12 warps (the loader's warp padded to a
    warpgroup), setmaxnreg giving the MMA warpgroups 232 registers and the loader 40, and six
    32 KiB operand stages within the 227 KiB of shared memory a block may have."""
    code = r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from lab.ffn import pingpong as pp
desc = ("tensordesc<bf16[128, 64],NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, "
        "rank=2, transposed=False, fp4_padded=False, cga_layout=[])>")
out = {}
for act in (0, 2):
    cx = dict(ACT=act, HAS_BIAS=True, GROUP_M=8, NUM_SMS=132, STAGES=pp.STAGES)
    sig = dict(a_desc=desc, b_desc=desc, y_ptr="*bf16", bias_ptr="*bf16", M="i32", N="i32",
               K="i32", stride_ym="i32", **{k: "constexpr" for k in cx})
    ck = triton.compile(GluonASTSource(fn=pp._pingpong_kernel, signature=sig, constexprs=cx),
                        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    regs = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ck.asm["ptx"])
    out[act] = dict(shared=ck.metadata.shared, warps=ck.metadata.num_warps,
                    regs=sorted({int(r) for r in regs}))
print(json.dumps(out))
"""
    got = compiled_offline(code)
    stage = (128 + 128) * 64 * 2
    for act in ("0", "2"):
        assert got[act]["warps"] == 12 and {232, 40} <= set(got[act]["regs"])
        assert 6 * stage <= got[act]["shared"] <= 227 * 1024


@pytest.mark.gpu
def test_pingpong_refuses_what_tma_and_wgmma_cannot_take():
    pp = pingpong()
    x, W = rand(64, 128, dtype=torch.bfloat16), rand(96, 128, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        pp.linear_act_pingpong(x.float(), W.float())
    with pytest.raises(ValueError, match="weight has shape"):
        pp.linear_act_pingpong(x, W[:, :120])
    x100, w100 = rand(64, 100, dtype=torch.bfloat16), rand(96, 100, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x has strides .*16-byte aligned"):
        pp.linear_act_pingpong(x100, w100)  # rows of 200 bytes
    with pytest.raises(TypeError, match="bias"):
        pp.linear_act_pingpong(x, W, rand(96, dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("act", "dtype"),
    [(a, torch.bfloat16) for a in ACTS] + [("none", torch.float16), ("gelu", torch.float16)],
    ids=lambda p: p if isinstance(p, str) else str(p).removeprefix("torch."),
)
def test_pingpong_matches_float64_and_writes_every_element(act, dtype, monkeypatch):
    """NaN-filled outputs; sizes that divide no tile (128 x 128 x 64), one with fewer tiles than
    SMs and programs with a single tile (the second MMA warpgroup idle), and a 1 x 8 x 8 layer."""
    pp = pingpong()
    empty = torch.empty

    def poisoned(*args, **kw):
        return empty(*args, **kw).fill_(float("nan"))

    for m, kk, n, bias in ((1000, 776, 1030, True), (300, 200, 260, False), (1, 8, 8, True)):
        x = rand(m, kk, dtype=dtype, seed=1)
        W = rand(n, kk, dtype=dtype, scale=kk**-0.5, seed=2)
        b = rand(n, dtype=dtype, seed=3) if bias else None
        monkeypatch.setattr(torch, "empty", poisoned)
        y = pp.linear_act_pingpong(x, W, b, act)
        monkeypatch.undo()
        zr = x.double() @ W.double().T + (b.double() if bias else 0.0)
        assert y.dtype == dtype and y.shape == (m, n) and not y.isnan().any()
        assert rel_err(y, TORCH_ACT[act](zr)) <= 10 * U[dtype]


@pytest.mark.gpu
def test_pingpong_full_size_agrees_with_linear_act():
    """The benchmark's layer: the ping-pong kernel and linear_act apply the same epilogue to the
    same K order of wgmma sums, so they agree to within one rounding of the output."""
    from kernelnotes.ffn import linear_act

    pp = pingpong()
    x = rand(8192, 4096, dtype=torch.bfloat16, seed=1)
    W = rand(16384, 4096, dtype=torch.bfloat16, scale=4096**-0.5, seed=2)
    b = rand(16384, dtype=torch.bfloat16, seed=3)
    y = pp.linear_act_pingpong(x, W, b, "gelu")
    assert not y.isnan().any()
    assert rel_err(y, linear_act(x, W, b, "gelu")) <= U[torch.bfloat16]
    zr = x[:512].double() @ W.double().T + b.double()  # float64 on a slice of the rows
    assert rel_err(y[:512], F.gelu(zr)) <= 10 * U[torch.bfloat16]
