"""Fused linear layers (Triton) against float64 references; the NumPy reference against the math.

Tolerances: relative Frobenius-norm error <= 10 u of the precision the kernel rounds to: the dtype,
except fp32 on the GPU, whose tl.dot takes fp32 inputs through tf32 (see tol).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton

from kernelnotes._testing import UNIT_ROUNDOFF, dtype_name, poison_, poison_allocations, rel_err
from kernelnotes.ffn import reference as ref
from tests._machine import DEVICE, ON_GPU, size
from tests._offline import compiled_offline

ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TORCH_ACT = {
    "none": lambda z: z,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}
# A fixed config on the GPU (tests do not autotune); the launcher's interpreter default on the CPU.
# BLOCK_K 32 keeps three fp32 stages in shared memory (96 KB).
CONFIG = (
    triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3
    )
    if ON_GPU
    else None
)
# Sizes that divide no block size (the interpreter's 16, the GPU's 64/128/256).
M, K, N = size(37, 1000), size(45, 777), size(53, 1030)


def tol(dtype) -> float:
    """10 u. For fp32 on the GPU u is tf32's (tl.dot rounds fp32 inputs to tf32 there); the
    interpreter's tl.dot is an fp32 NumPy matmul (it ignores input_precision), so on the CPU fp32
    is held to fp32's own u."""
    if dtype == torch.float32:
        return 10 * UNIT_ROUNDOFF["tf32" if ON_GPU else "float32"]
    return 10 * UNIT_ROUNDOFF[dtype_name(dtype)]


def rand(*shape, dtype, scale=1.0, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEVICE)
    return t.requires_grad_(requires_grad)


def f64(*ts):
    return [t.detach().double().cpu().requires_grad_() for t in ts]


def kernel():
    from kernelnotes.ffn import kernel as k

    return k


@pytest.fixture(autouse=True)
def _fixed_config():
    """Every op on CONFIG: a fixed config on the GPU (tests do not autotune), the ops' own choice
    (the interpreter's small config) on the CPU."""
    with kernel().use_config(CONFIG):
        yield


# ----------------------------------------------------------------------------------- forward
@pytest.mark.parametrize(
    ("act", "dtype"),
    [(a, torch.bfloat16) for a in ACTS]
    + [
        ("none", torch.float16),
        ("gelu", torch.float16),
        ("relu", torch.float32),
        ("silu", torch.float32),
    ],
    ids=lambda p: p if isinstance(p, str) else dtype_name(p),
)
def test_linear_act_forward_matches_float64(act, dtype):
    k = kernel()
    x, W, b = (
        rand(M, K, dtype=dtype, seed=1),
        rand(N, K, dtype=dtype, scale=K**-0.5, seed=2),
        rand(N, dtype=dtype, seed=3),
    )
    y, z = k._linear_act_forward(x, W, b, act, store_z=True, config=CONFIG)
    xd, Wd, bd = f64(x, W, b)
    zr = xd @ Wd.T + bd
    assert y.dtype == dtype and y.shape == (M, N)
    assert (z is None) == (act == "none")  # no activation: z is y, and none is stored
    assert rel_err(y if z is None else z, zr) <= tol(dtype)
    assert rel_err(y, TORCH_ACT[act](zr)) <= tol(dtype)


def test_every_output_element_is_written():
    """NaN-poisoned outputs: the masked (M, N, K not multiples of the tile) and unmasked paths."""
    k = kernel()
    for m, kk, n in ((M, K, N), (size(64, 1024), size(64, 1024), size(96, 2048))):  # masked, EVEN
        x, W, b = (
            rand(m, kk, dtype=torch.float16),
            rand(n, kk, dtype=torch.float16, scale=0.1),
            rand(n, dtype=torch.float16),
        )
        y, z = poison_(x.new_empty(m, n)), poison_(x.new_empty(m, n))
        k._matmul(x, W.t(), y, bias=b, z=z, act=2, store_z=True, config=CONFIG)
        assert not y.isnan().any() and not z.isnan().any()
        dz = poison_(x.new_empty(m, n))
        db = torch.zeros(n, device=DEVICE, dtype=torch.float32)
        k._matmul(x, W.t(), dz, z=z, db=db, act=2, grad_act=True, config=CONFIG)
        assert not dz.isnan().any()
        ref_dz = (x.double() @ W.double().T) * torch.from_numpy(
            ref.activation_grad(z.double().cpu().numpy(), "gelu")
        ).to(DEVICE)
        assert rel_err(dz, ref_dz) <= tol(torch.float16)
        assert rel_err(db, ref_dz.sum(0)) <= tol(torch.float16)


def _tma_store_case(k):
    """The TMA kernel's config (TMA_CONFIG's tile on a GPU, the interpreter's under it), its twin
    with the epilogue's C and Z through pointers (TMA_STORE=False), and an [m, kk] x [kk, n]
    problem whose m and n divide no tile, with n % 8 == 0 so that rows of n bf16 are 16-byte
    aligned (what a TMA descriptor needs)."""
    base = k.TMA_CONFIG if ON_GPU else k.INTERPRETER_CONFIG
    cfg, by_pointers = (triton.Config({**base.kwargs, "TMA": True, "TMA_STORE": store},
                                      num_warps=base.num_warps, num_stages=base.num_stages)
                        for store in (True, False))
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    return cfg, by_pointers, (2 * bm + 5, size(40, 776), 2 * bn + bn // 2 + 8)


@pytest.mark.parametrize("act, store_z", [("none", False), ("gelu", False), ("gelu", True)])
def test_tma_store_writes_all_of_c_and_nothing_past_it(act, store_z):
    """The TMA kernel stores C (and Z, for training) by TMA when their rows allow it (_store_tma):
    into NaN-filled buffers with 8 guard columns, every element of C and Z is written, right, and
    no guard column is; M and N are not multiples of the tile, so the engine must clip both halves
    of edge tiles. Pointer stores of the same tiles (TMA_STORE=False) agree bit for bit."""
    k = kernel()
    cfg, pointer_cfg, (m, kk, n) = _tma_store_case(k)
    x, W, b = (rand(m, kk, dtype=torch.bfloat16, seed=1),
               rand(n, kk, dtype=torch.bfloat16, scale=kk**-0.5, seed=2),
               rand(n, dtype=torch.bfloat16, seed=3))

    def guarded():  # an [m, n] view of a NaN-filled [m, n + 8] buffer, and the buffer
        buf = torch.full((m, n + 8), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        return buf[:, :n], buf

    (c, c_buf), (z, z_buf) = guarded(), guarded()
    assert k._tma_halves(c, cfg.kwargs) is not None  # the path under test is taken
    k._matmul(x, W.t(), c, bias=b, z=z if store_z else None, act=k._act_code(act),
              store_z=store_z, config=cfg)
    assert c_buf[:, n:].isnan().all() and not c.isnan().any()
    zr = x.double() @ W.double().T + b.double()
    assert rel_err(c, zr if act == "none" else F.gelu(zr)) <= tol(torch.bfloat16)
    if store_z:
        assert z_buf[:, n:].isnan().all() and not z.isnan().any()
        assert rel_err(z, zr) <= tol(torch.bfloat16)
    else:
        assert z_buf.isnan().all()
    (c_ptr, _), (z_ptr, _) = guarded(), guarded()  # TMA_STORE=False: masked pointer stores
    k._matmul(x, W.t(), c_ptr, bias=b, z=z_ptr if store_z else None, act=k._act_code(act),
              store_z=store_z, config=pointer_cfg)
    assert torch.equal(c_ptr, c)
    # rows that TMA cannot write (a row stride of 2n + 2 bytes) fall back to pointer stores
    odd = torch.full((m, n + 1), float("nan"), device=DEVICE, dtype=torch.bfloat16)[:, :n]
    assert k._tma_halves(odd, cfg.kwargs) is None
    if store_z:  # and a Z that TMA cannot write takes C back to pointer stores with it
        assert torch.equal(z_ptr, z)
        c_odd, _ = guarded()
        k._matmul(x, W.t(), c_odd, bias=b, z=odd, act=k._act_code(act), store_z=True, config=cfg)
        assert torch.equal(c_odd, c) and torch.equal(odd, z)


def test_tma_grad_act_writes_all_of_dz_and_nothing_past_it():
    """The backward epilogue (GRAD_ACT) of the TMA kernel loads Z and stores dZ = dA * gelu'(Z)
    by TMA, half a tile at a time (_grad_act_half): into a NaN-filled buffer with 8 guard
    columns, every element of dZ is written and right, db is the column sums, and no guard
    column is touched; M and N divide no tile. Pointer loads and stores of the same tiles agree
    bit for bit, and a Z that TMA cannot read takes dZ back to pointers with it."""
    k = kernel()
    cfg, pointer_cfg, (m, kk, n) = _tma_store_case(k)
    da, W2 = rand(m, kk, dtype=torch.bfloat16, seed=1), rand(kk, n, dtype=torch.bfloat16, seed=2)
    z = rand(m, n, dtype=torch.bfloat16, seed=3)
    buf = torch.full((m, n + 8), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    dz, db = buf[:, :n], torch.zeros(n, device=DEVICE, dtype=torch.float32)
    assert k._tma_halves(dz, cfg.kwargs) is not None and k._tma_halves(z, cfg.kwargs) is not None
    k._matmul(da, W2, dz, z=z, db=db, act=2, grad_act=True, config=cfg)
    assert buf[:, n:].isnan().all() and not dz.isnan().any()
    zd = z.double()
    ref_dz = (da.double() @ W2.double()) * torch.from_numpy(
        ref.activation_grad(zd.cpu().numpy(), "gelu")).to(DEVICE)
    assert rel_err(dz, ref_dz) <= tol(torch.bfloat16)
    assert rel_err(db, ref_dz.sum(0)) <= tol(torch.bfloat16)
    by_pointers, db_p = torch.full_like(dz, float("nan")), torch.zeros_like(db)
    k._matmul(da, W2, by_pointers, z=z, db=db_p, act=2, grad_act=True, config=pointer_cfg)
    assert torch.equal(by_pointers, dz)
    # db: the same fp32 partial sums, added by atomics in another order: a few roundings apart
    assert rel_err(db_p, db) <= 8 * torch.finfo(torch.float32).eps
    z_odd = torch.full((m, n + 1), float("nan"), device=DEVICE, dtype=torch.bfloat16)[:, :n]
    z_odd.copy_(z)
    assert k._tma_halves(z_odd, cfg.kwargs) is None
    dz_odd = torch.full_like(dz, float("nan"))
    k._matmul(da, W2, dz_odd, z=z_odd, act=2, grad_act=True, config=cfg)
    assert torch.equal(dz_odd, dz)


def test_swiglu_and_act_backward_outputs_fully_written(monkeypatch):
    """torch.empty NaN-poisoned: the SwiGLU kernel writes all of h and z = [z_gate, z_up], the
    gated act_backward all of dZ (db starts at zeros, as its atomic adds need). M, H, K divide no
    block (the interpreter's 32, act_backward's 64, CONFIG's 128)."""
    k = kernel()
    H = size(29, 700)
    x = rand(M, K, dtype=torch.float16, seed=1)
    W = rand(2 * H, K, dtype=torch.float16, scale=K**-0.5, seed=2)
    b = rand(2 * H, dtype=torch.float16, seed=3)
    dh = rand(M, H, dtype=torch.float16, seed=4)
    poison_allocations(monkeypatch)
    h, z = k._linear_swiglu_forward(x, W, b, store_z=True, config=CONFIG)
    dz, db = k._act_backward(dh, z, gated=True, want_db=True)
    monkeypatch.undo()
    for t in (h, z, dz, db):
        assert not t.isnan().any()
    zr = x.double() @ W.double().T + b.double()
    assert rel_err(z, zr) <= tol(torch.float16)
    assert rel_err(h, F.silu(zr[:, :H]) * zr[:, H:]) <= tol(torch.float16)
    # dZ from the kernel's own z: h = silu(g) * u, differentiated by float64 autograd
    g, u = (t.double().cpu().requires_grad_() for t in (z[:, :H], z[:, H:]))
    (F.silu(g) * u).backward(dh.double().cpu())
    dzr = torch.cat([g.grad, u.grad], dim=1)
    assert rel_err(dz, dzr) <= tol(torch.float16)
    assert rel_err(db, dzr.sum(0)) <= tol(torch.float16)


def test_nan_propagates_through_every_activation():
    """A NaN row of x gives a NaN row of y for every activation (relu included, as F.relu), and a
    NaN row of Z a NaN row of dZ = dY sigma'(Z) in both backward paths (act_backward and the
    matmul epilogue); every other row stays finite. Torch passes dY through relu'(NaN); here the
    NaN shows."""
    k = kernel()
    x = rand(M, K, dtype=torch.float32, seed=1)
    W = rand(N, K, dtype=torch.float32, scale=K**-0.5, seed=2)
    z, dy = rand(M, N, dtype=torch.float32, seed=3), rand(M, N, dtype=torch.float32, seed=4)
    x[5], z[5] = float("nan"), float("nan")
    rest = torch.arange(M, device=DEVICE) != 5

    def nan_row_only(t):
        return bool(t[5].isnan().all() and torch.isfinite(t[rest]).all())

    for act in ACTS:
        assert nan_row_only(k.linear_act(x, W, None, act)), act
        dz, _ = k._act_backward(dy, z, act)
        fused = k._matmul(dy, torch.eye(N, device=DEVICE), torch.empty_like(dy), z=z,
                          act=k.ACTIVATIONS.index(act), grad_act=True, config=CONFIG)
        for d in (dz, fused):
            if act == "none":  # dZ = dY: Z is not read
                assert torch.isfinite(d).all()
            else:
                assert nan_row_only(d), act
    H = N // 2
    assert nan_row_only(k.linear_swiglu(x, W[: 2 * H]))
    gated_dz, _ = k._act_backward(dy[:, :H].contiguous(), z[:, : 2 * H].contiguous(), gated=True)
    assert nan_row_only(gated_dz)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_activation_epilogue_on_edge_values():
    """x = 0 and W = 0 make y = sigma(b): the epilogue alone, on 0, tiny, moderate and huge z."""
    k = kernel()
    zs = torch.tensor(
        [
            0.0,
            1e-30,
            -1e-30,
            1e-3,
            -1e-3,
            0.5,
            -0.5,
            3.0,
            -3.0,
            -6.0,  # fp32 1 + erf(z / sqrt 2) is 0 here; Phi(z) = erfc(|z| / sqrt 2) / 2 is not
            -10.0,
            30.0,
            -30.0,
            88.0,
            -88.0,
            1e30,
            -1e30,
            3e38,
            -3e38,
        ],
        dtype=torch.float64,
    )
    b = zs.to(torch.float32).to(DEVICE)
    x = torch.zeros(3, 8, device=DEVICE)
    W = torch.zeros(len(zs), 8, device=DEVICE)
    dy = torch.ones(3, len(zs), device=DEVICE)
    z = b.expand(3, -1).contiguous()
    for act in ACTS:
        y, _ = k._linear_act_forward(x, W, b, act, config=CONFIG)
        want = torch.from_numpy(ref.activation(b.double().cpu().numpy(), act))
        d, _ = k._act_backward(dy, z, act)
        dwant = torch.from_numpy(ref.activation_grad(b.double().cpu().numpy(), act))
        for got, exp in ((y[0], want), (d[0], dwant)):
            got = got.double().cpu()
            assert torch.isfinite(got).all(), (act, got)
            # rtol: GELU's Phi has the erfc fit's relative error (6.4e-7, reference.erfc_fit) plus
            # the fp32 rounding of e^(-z^2/2)'s argument, which the exponential turns into about
            # z^2/2 * a few u32 relative (2.6e-6 at z = -6 under the interpreter; 1e-5 is reached
            # near z = -12, past the points here). z = -30 and beyond underflow: atol.
            assert torch.allclose(got, exp, rtol=1e-5, atol=1e-30), (act, got, exp)
    assert k._act_backward(dy, z, "relu")[0][0, 0].item() == 0.0  # relu'(0) = 0, as torch


def test_gelu_erfc_constants_are_the_fit():
    """The kernel's erfc coefficients are reference.erfc_fit()'s, halved, to 9 digits; the fit's
    largest relative error on [0, 10] is below 1e-6, and checked here on a finer grid too."""
    k = kernel()
    c, max_rel_err = ref.erfc_fit()
    assert max_rel_err < 1e-6
    consts = [getattr(k, f"ERFC_C{i}").value for i in range(7)]
    assert np.allclose(consts, c / 2, rtol=1e-8, atol=0)
    s = np.linspace(0.0, 10.0, 100_003)
    t = 1.0 / (1.0 + k.ERFC_P.value * s)
    approx = 2 * t * np.polyval(consts[::-1], t) * np.exp(-s * s)  # with the kernel's digits
    exact = np.array([math.erfc(v) for v in s])
    assert np.max(np.abs(approx / exact - 1.0)) < 1e-6


def test_the_gpu_configs_on_even_and_uneven_shapes():
    """Each config the GPU autotunes over, the fp32 and FLATTEN ones and TMA_CONFIG (what
    config=None takes on Hopper), with and without masks."""
    k = kernel()
    first = k.MATMUL_CONFIGS[0]
    flat = triton.Config(
        {**first.kwargs, "FLATTEN": True}, num_warps=first.num_warps, num_stages=first.num_stages
    )
    cases = [(cfg, torch.bfloat16) for cfg in (*k.MATMUL_CONFIGS, flat, k.TMA_CONFIG)] + [
        (k.FP32_CONFIG, torch.float32)
    ]
    for cfg, dtype in cases:
        bm, bn, bk = (cfg.kwargs[n] for n in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        # K = bk + 8 keeps rows 16-byte aligned (TMA_CONFIG's descriptors), bk + 7 does not
        shapes = ((bm, 2 * bn, bk), (bm + 5, bn + 3, bk + 7), (3 * bm + 1, 2 * bn + 9, bk + 8))
        for m, n, kk in shapes:
            x, W, b = (
                rand(m, kk, dtype=dtype, seed=1),
                rand(n, kk, dtype=dtype, scale=0.1, seed=2),
                rand(n, dtype=dtype),
            )
            y, z = k._linear_act_forward(x, W, b, "silu", store_z=True, config=cfg)
            zr = x.double() @ W.double().T + b.double()
            assert rel_err(z, zr) <= tol(dtype) and rel_err(y, F.silu(zr)) <= tol(dtype)
    cfg = k.SWIGLU_CONFIGS[0]
    x, W = (
        rand(cfg.kwargs["BLOCK_M"] + 5, 70, dtype=torch.bfloat16),
        rand(2 * cfg.kwargs["BLOCK_N"] + 6, 70, dtype=torch.bfloat16),
    )
    zr = x.double() @ W.double().T
    H = W.shape[0] // 2
    with k.use_config(cfg):
        h = k.linear_swiglu(x, W)
    assert rel_err(h, F.silu(zr[:, :H]) * zr[:, H:]) <= tol(torch.bfloat16)


@pytest.mark.parametrize("variant", ["plain", "flatten", "default"])
def test_tma_kernel_forward_and_backward(variant):
    """The TMA kernel (config kwarg TMA=True) on every operand layout of the FFN: on the first
    config without and with FLATTEN, and TMA_CONFIG, what config=None takes on Hopper (under the
    interpreter its flags on the interpreter's tile)."""
    k = kernel()
    base = k.MATMUL_CONFIGS[0] if ON_GPU else k.INTERPRETER_CONFIG
    flags = {"TMA": True, "FLATTEN": variant != "plain"}
    if variant == "default":
        tile = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
        flags = {n: v for n, v in k.TMA_CONFIG.kwargs.items() if ON_GPU or n not in tile}
        if ON_GPU:
            base = k.TMA_CONFIG
    cfg = triton.Config({**base.kwargs, **flags}, num_warps=base.num_warps,
                        num_stages=base.num_stages)
    m, d, h, o = (
        size(37, 1000),
        size(48, 776),
        size(40, 1504),
        size(56, 1032),
    )  # rows 16-byte aligned
    x = rand(m, d, dtype=torch.bfloat16, seed=1, requires_grad=True)
    w1 = rand(h, d, dtype=torch.bfloat16, scale=d**-0.5, seed=2, requires_grad=True)
    b1 = rand(h, dtype=torch.bfloat16, seed=3, requires_grad=True)
    w2 = rand(o, h, dtype=torch.bfloat16, scale=h**-0.5, seed=4, requires_grad=True)
    b2 = rand(o, dtype=torch.bfloat16, seed=5, requires_grad=True)
    for a, b in ((x, w1.t()), (x.t(), x), (x, w1)):  # forward, dW, dX layouts all qualify
        assert k._tma_operands(a.detach(), b.detach(), cfg.kwargs) is not None
    dy = rand(m, o, dtype=torch.bfloat16, seed=6)
    with k.use_config(cfg):
        y = k.ffn(x, w1, b1, w2, b2, "gelu")
        y.backward(dy)
    ps = (x, w1, b1, w2, b2)
    ds = f64(*ps)
    yr = F.linear(F.gelu(F.linear(ds[0], ds[1], ds[2])), ds[3], ds[4])
    yr.backward(dy.double().cpu())
    assert rel_err(y, yr) <= tol(torch.bfloat16)
    for p, dp in zip(ps, ds, strict=True):
        assert rel_err(p.grad, dp.grad) <= 2 * tol(torch.bfloat16), p.shape


def test_non_contiguous_inputs():
    """x and W are read through their strides: transposed views need no copy."""
    k = kernel()
    x = rand(K, M, dtype=torch.bfloat16, seed=1).t()  # [M, K], column-major
    W = rand(K, N, dtype=torch.bfloat16, scale=K**-0.5, seed=2).t()  # [N, K], column-major
    assert not x.is_contiguous() and not W.is_contiguous()
    y = k.linear_act(x, W, None, "gelu")
    assert rel_err(y, F.gelu(x.double() @ W.double().T)) <= tol(torch.bfloat16)


def test_empty_batch():
    k = kernel()
    x, W = rand(0, K, dtype=torch.float16), rand(N, K, dtype=torch.float16)
    y = k.linear_act(x, W, None, "relu")
    assert y.shape == (0, N)


# ---------------------------------------------------------------------------------- backward
@pytest.mark.parametrize(
    ("act", "dtype"),
    [(a, torch.bfloat16) for a in ACTS] + [("gelu", torch.float16), ("gelu", torch.float32)],
    ids=lambda p: p if isinstance(p, str) else dtype_name(p),
)
def test_linear_act_backward_matches_float64(act, dtype):
    k = kernel()
    x = rand(M, K, dtype=dtype, seed=1, requires_grad=True)
    W = rand(N, K, dtype=dtype, scale=K**-0.5, seed=2, requires_grad=True)
    b = rand(N, dtype=dtype, seed=3, requires_grad=True)
    dy = rand(M, N, dtype=dtype, seed=4)
    k.linear_act(x, W, b, act).backward(dy)
    xd, Wd, bd = f64(x, W, b)
    TORCH_ACT[act](xd @ Wd.T + bd).backward(dy.double().cpu())
    for got, want in ((x.grad, xd.grad), (W.grad, Wd.grad), (b.grad, bd.grad)):
        assert got.dtype == dtype
        assert rel_err(got, want) <= tol(dtype)


@pytest.mark.parametrize(
    ("act", "dtype"),
    [("gelu", torch.bfloat16), ("relu", torch.float16), ("silu", torch.float32)],
    ids=str,
)
def test_two_layer_ffn_forward_backward(act, dtype):
    """FFNFunction: sigma'(Z1) fused into dA1 = dY W2, db1 summed in the same epilogue."""
    k = kernel()
    H = size(29, 1500)
    x = rand(M, K, dtype=dtype, seed=1, requires_grad=True)
    w1 = rand(H, K, dtype=dtype, scale=K**-0.5, seed=2, requires_grad=True)
    b1 = rand(H, dtype=dtype, seed=3, requires_grad=True)
    w2 = rand(N, H, dtype=dtype, scale=H**-0.5, seed=4, requires_grad=True)
    b2 = rand(N, dtype=dtype, seed=5, requires_grad=True)
    dy = rand(M, N, dtype=dtype, seed=6)
    y = k.ffn(x, w1, b1, w2, b2, act)
    y.backward(dy)
    ps = (x, w1, b1, w2, b2)
    ds = f64(*ps)
    yr = F.linear(TORCH_ACT[act](F.linear(ds[0], ds[1], ds[2])), ds[3], ds[4])
    yr.backward(dy.double().cpu())
    assert rel_err(y, yr) <= tol(dtype)
    # dW1 and db1 go through two roundings (a1 or dZ1 to the dtype, then the product): 2x
    for p, d in zip(ps, ds, strict=True):
        assert rel_err(p.grad, d.grad) <= 2 * tol(dtype), p.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_swiglu_forward_backward(dtype):
    k = kernel()
    H = size(29, 700)
    x = rand(M, K, dtype=dtype, seed=1, requires_grad=True)
    W = rand(2 * H, K, dtype=dtype, scale=K**-0.5, seed=2, requires_grad=True)
    b = rand(2 * H, dtype=dtype, seed=3, requires_grad=True)
    dh = rand(M, H, dtype=dtype, seed=4)
    h = k.linear_swiglu(x, W, b)
    h.backward(dh)
    xd, Wd, bd = f64(x, W, b)
    z = F.linear(xd, Wd, bd)
    hr = F.silu(z[:, :H]) * z[:, H:]
    hr.backward(dh.double().cpu())
    assert rel_err(h, hr) <= tol(dtype)
    for got, want in ((x.grad, xd.grad), (W.grad, Wd.grad), (b.grad, bd.grad)):
        assert rel_err(got, want) <= 2 * tol(dtype)  # dZ rounded to the dtype, then a product


@pytest.mark.parametrize("gated", [False, True])
def test_feedforward_module(gated):
    k = kernel()
    d, h = size(24, 1024), size(40, 2816)
    torch.manual_seed(0)
    mod = k.FeedForward(
        d, h, "gelu_tanh", gated=gated, device=DEVICE, dtype=torch.float32
    )
    n_params = sum(p.numel() for p in mod.parameters())
    assert n_params == (3 * d * h + 2 * h + d if gated else ref.param_count([d, h, d]))
    x = rand(2, size(9, 300), d, dtype=torch.float32, requires_grad=True)
    y = mod(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    # the same module in float64 eager torch
    xd = x.detach().double().cpu().requires_grad_()
    P = {n: p.detach().double().cpu().requires_grad_() for n, p in mod.named_parameters()}
    if gated:
        z = F.linear(xd, P["w_gate_up"], P["b_gate_up"])
        yr = F.linear(F.silu(z[..., :h]) * z[..., h:], P["w2"], P["b2"])
    else:
        yr = F.linear(F.gelu(F.linear(xd, P["w1"], P["b1"]), approximate="tanh"), P["w2"], P["b2"])
    yr.square().sum().backward()
    assert rel_err(y, yr) <= tol(torch.float32)
    assert rel_err(x.grad, xd.grad) <= 2 * tol(torch.float32)
    for n, p in mod.named_parameters():
        assert rel_err(p.grad, P[n].grad) <= 2 * tol(torch.float32), n


def test_kernel_gradients_against_central_differences():
    """fp32 kernel gradients against float64 central differences of the NumPy reference."""
    k = kernel()
    rng = np.random.default_rng(7)
    B, d, h, o = 6, 5, 7, 3
    X, Y = rng.standard_normal((B, d)), rng.standard_normal((B, o))
    layers = [
        (rng.standard_normal((h, d)) / 2, rng.standard_normal(h) / 2),
        (rng.standard_normal((o, h)) / 2, rng.standard_normal(o) / 2),
    ]
    params = [X] + [p for layer in layers for p in layer]

    def loss():
        return ref.mse_loss(ref.ffn_forward(X, layers, "silu")[0], Y)[0]

    numeric = ref.grad_check(loss, params)
    ts = [torch.tensor(p, dtype=torch.float32, device=DEVICE, requires_grad=True) for p in params]
    y = k.ffn(*ts, "silu")
    (0.5 * (y - torch.tensor(Y, dtype=torch.float32, device=DEVICE)).square().sum() / B).backward()
    for t, g in zip(ts, numeric, strict=True):
        assert rel_err(t.grad, g) <= tol(torch.float32)


# ------------------------------------------------------------------------------------- refusals
def test_refusals():
    k = kernel()
    x, W = rand(8, 16, dtype=torch.bfloat16), rand(4, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="input must have dtype"):
        k.linear_act(x.to(torch.int32), W)
    with pytest.raises(TypeError, match="weight must have dtype"):
        k.linear_act(x, W.half())
    with pytest.raises(ValueError, match="weight must be \\[N, K\\] with K = 16"):
        k.linear_act(x, W[:, :8])
    with pytest.raises(ValueError, match="input must have at least 1 dimension"):
        k.linear_act(x[0, 0], W)
    with pytest.raises(ValueError, match="bias has shape \\(5,\\), expected \\(4,\\)"):
        k.linear_act(x, W, rand(5, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bias must have dtype"):
        k.linear_act(x, W, rand(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="activation must be one of"):
        k.linear_act(x, W, None, "tanh")
    with pytest.raises(ValueError, match="activation must be one of"):
        k.FeedForward(16, 32, "swish")
    with pytest.raises(ValueError, match="even number of rows"):
        k.linear_swiglu(x, rand(5, 16, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="config must be a triton.Config"), k.use_config({}):
        pass
    with pytest.raises(ValueError, match="config is missing GROUP_M"):
        with k.use_config(triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})):
            pass
    with pytest.raises(ValueError, match="z has shape"):
        k._act_backward(rand(8, 4, dtype=torch.bfloat16), rand(8, 5, dtype=torch.bfloat16), "gelu")
    if ON_GPU:
        with pytest.raises(ValueError, match="input is on"):
            k.linear_act(x.cpu(), W.cpu())
    else:  # meta tensors run the fake impl, as F.linear gives a meta tensor
        assert k.linear_act(x.to("meta"), W.to("meta")).shape == (8, 4)


def test_non_contiguous_bias():
    """The kernels read the bias at unit stride: the public ops take a strided bias as torch does
    (a contiguous copy), the launchers refuse one."""
    k = kernel()
    x, W = rand(8, 16, dtype=torch.bfloat16), rand(4, 16, dtype=torch.bfloat16)
    b = rand(8, dtype=torch.bfloat16)[::2]  # [4], stride 2
    assert b.shape == (4,) and not b.is_contiguous()
    assert torch.equal(k.linear_act(x, W, b, "relu"), k.linear_act(x, W, b.contiguous(), "relu"))
    for call in (
        lambda: k._linear_act_forward(x, W, b, "gelu"),
        lambda: k._linear_swiglu_forward(x, W, b, store_z=True),
    ):
        with pytest.raises(ValueError, match="bias must be contiguous"):
            call()


def test_ffn_errors_name_the_arguments():
    k = kernel()
    x = rand(4, 6, dtype=torch.bfloat16)
    w1, b1 = rand(5, 6, dtype=torch.bfloat16), rand(5, dtype=torch.bfloat16)
    w2, b2 = rand(3, 5, dtype=torch.bfloat16), rand(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"w1 has shape \(5, 7\), but input has shape \(4, 6\)"):
        k.ffn(x, rand(5, 7, dtype=torch.bfloat16), b1, w2, b2)
    with pytest.raises(ValueError, match=r"b1 has shape \(4,\), expected \(5,\) to match w1"):
        k.ffn(x, w1, rand(4, dtype=torch.bfloat16), w2, b2)
    with pytest.raises(ValueError, match=r"w2 has shape \(3, 4\), but w1 has shape \(5, 6\)"):
        k.ffn(x, w1, b1, rand(3, 4, dtype=torch.bfloat16), b2)
    with pytest.raises(ValueError, match=r"b2 has shape \(4,\), expected \(3,\) to match w2"):
        k.ffn(x, w1, b1, w2, rand(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="w2 must have dtype"):
        k.ffn(x, w1, b1, w2.half(), b2)
    with pytest.raises(TypeError, match="b2 must have dtype"):
        k.ffn(x, w1, b1, w2, b2.float())
    with pytest.raises(ValueError, match="w2 must have 2 dimensions"):
        k.ffn(x, w1, b1, w2[0], b2)


def test_backward_launcher_refusals():
    """linear_backward and act_backward check their operands before any kernel reads them."""
    k = kernel()
    x, W = rand(4, 8, dtype=torch.bfloat16), rand(6, 8, dtype=torch.bfloat16)
    dz = rand(4, 6, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"dz has shape \(4, 7\), expected \(4, 6\)"):
        k._linear_backward(rand(4, 7, dtype=torch.bfloat16), x, W)
    with pytest.raises(TypeError, match="dz must have dtype"):
        k._linear_backward(dz.float(), x, W)
    with pytest.raises(TypeError, match="weight must have dtype"):
        k._linear_backward(dz, x, W.half())
    with pytest.raises(ValueError, match="weight must be \\[N, K\\] with K = 8"):
        k._linear_backward(dz, x, W[:, :7])
    with pytest.raises(ValueError, match="dz must have 2 dimensions"):
        k._linear_backward(dz[0], x, W)
    with pytest.raises(TypeError, match="config must be a triton.Config"):
        k._linear_backward(dz, x, W, config={"BLOCK_M": 16})
    other = "cpu" if ON_GPU else "meta"
    with pytest.raises(ValueError, match="dz is on"):
        k._linear_backward(dz.to(other), x, W)
    with pytest.raises(ValueError, match="input is on"):
        k._linear_backward(dz, x.to(other), W)
    dy, z = rand(4, 6, dtype=torch.bfloat16), rand(4, 6, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="z must have dtype"):
        k._act_backward(dy, z.float(), "gelu")
    with pytest.raises(TypeError, match="z must be a torch.Tensor"):
        k._act_backward(dy, None, "gelu")
    with pytest.raises(ValueError, match=r"z has shape \(4, 6\), expected \(4, 12\)"):
        k._act_backward(dy, z, gated=True)
    with pytest.raises(ValueError, match="z must be contiguous"):
        k._act_backward(dy, rand(6, 4, dtype=torch.bfloat16).t(), "gelu")
    with pytest.raises(ValueError, match="dy must be contiguous"):
        k._act_backward(rand(6, 4, dtype=torch.bfloat16).t(), z, "gelu")
    with pytest.raises(ValueError, match="z is on"):
        k._act_backward(dy, z.to(other), "gelu")


# ---------------------------------------------------------------------------- the math itself
@pytest.mark.parametrize("act", ref.ACTIVATIONS)
def test_reference_backward_against_central_differences(act):
    rng = np.random.default_rng(3)
    widths = [4, 6, 5, 2]  # three layers
    X, Y = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    layers = [
        (rng.standard_normal((o, i)), rng.standard_normal(o))
        for i, o in zip(widths[:-1], widths[1:], strict=True)
    ]

    def loss():
        return ref.mse_loss(ref.ffn_forward(X, layers, act)[0], Y)[0]

    y_hat, cache = ref.ffn_forward(X, layers, act)
    grads, dX = ref.ffn_backward(ref.mse_loss(y_hat, Y)[1], layers, cache, act)
    numeric = ref.grad_check(loss, [X] + [p for layer in layers for p in layer])
    analytic = [dX] + [g for pair in grads for g in pair]
    for a, n in zip(analytic, numeric, strict=True):
        assert rel_err(a, n) <= 1e-7


def test_activation_derivatives_against_central_differences():
    z = np.linspace(-6, 6, 1001) + 1e-3  # avoid relu's kink at 0
    for act in ref.ACTIVATIONS:
        eps = 1e-6
        num = (ref.activation(z + eps, act) - ref.activation(z - eps, act)) / (2 * eps)
        assert np.max(np.abs(num - ref.activation_grad(z, act))) < 1e-8, act


def test_xor_and_training():
    y, _ = ref.ffn_forward(ref.XOR_X, ref.xor_layers(), "relu")
    assert np.array_equal(y, ref.XOR_Y)
    layers, losses = ref.train(
        ref.XOR_X, ref.XOR_Y, [2, 4, 1], act="tanh", lr=0.5, steps=2000, seed=0
    )
    pred = ref.ffn_forward(ref.XOR_X, layers, "tanh")[0]
    assert np.array_equal(pred > 0.5, ref.XOR_Y > 0.5)
    assert losses[-1] < 1e-3 * losses[0]


def test_linear_layers_collapse():
    rng = np.random.default_rng(0)
    layers = [
        (rng.standard_normal((o, i)), rng.standard_normal(o)) for i, o in ((5, 8), (8, 3), (3, 6))
    ]
    X = rng.standard_normal((10, 5))
    y, _ = ref.ffn_forward(X, layers, "none")
    (W1, b1), (W2, b2), (W3, b3) = layers
    W, b = W3 @ W2 @ W1, W3 @ (W2 @ b1 + b2) + b3
    assert np.allclose(y, X @ W.T + b, rtol=1e-12, atol=1e-12)
    assert np.linalg.matrix_rank(W) == 3  # the narrowest layer bounds the rank


def test_relu_fit_error_falls_as_h_to_the_minus_2():
    f = lambda x: np.sin(2 * np.pi * x)  # noqa: E731
    x = np.linspace(0, 1, 4001)[:, None]
    hs = np.array([8, 16, 32, 64])
    errs = [
        np.max(np.abs(ref.ffn_forward(x, ref.relu_fit(f, h), "relu")[0][:, 0] - f(x[:, 0])))
        for h in hs
    ]
    slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert -2.2 < slope < -1.8


def test_counts():
    assert ref.param_count([784, 512, 10]) == 784 * 512 + 512 + 512 * 10 + 10
    fwd, bwd = ref.matmul_flops(32, [8, 16, 4], input_grad=True)
    assert bwd == 2 * fwd
    d = 4096
    assert math.isclose(3 * d * (8 * d / 3), 2 * d * (4 * d))  # SwiGLU at h = 8d/3 keeps 8 d^2


def test_epilogue_instruction_counts_compile_for_sm90_without_a_gpu():
    """benchmarks/_epilogue_sass.py, which the benchmark's energy rows cite: _act alone, compiled
    for sm_90 in a process without the interpreter, adds no instruction for the identity, and
    the GELU costs what _normal_cdf says: one reciprocal and one exp2 (MUFU), and more than
    SiLU's sigmoid."""
    got = compiled_offline("import json; from benchmarks._epilogue_sass import "
                           "instructions_per_element as f; print(json.dumps(f()))")
    assert set(got) == set(ref.ACTIVATIONS) - {"sigmoid", "tanh"}
    assert got["none"] == {"total": 0.0}
    assert got["gelu"]["MUFU"] == 2.0 and got["silu"]["MUFU"] == 2.0
    assert 0 < got["silu"]["total"] < got["gelu"]["total"] < 30


def test_energy_fit_is_the_least_squares_line_through_the_bias_only_kernel():
    """figures.energy_fit on energy rows made from a known line, E(a) = E0 + s n(a) plus noise
    that sums to zero against n: it gives back s, and break_even = (E_cublas - E0) / s; rows
    without a counted activation are refused."""
    from kernelnotes.ffn.figures import ENERGY, energy_fit

    e0, s, n = 1.17, 3.5e-3, {"relu": 0.0, "silu": 13.0, "gelu_tanh": 17.0, "gelu": 18.5}
    wiggle = np.array([0.0, 2e-3, -1e-3, 0.0])
    wiggle[3] = -(wiggle[1] * n["silu"] + wiggle[2] * n["gelu_tanh"]) / n["gelu"]  # _|_ n
    rows = [dict(op=ENERGY, impl="torch F.linear (cuBLAS, bias fused)", joules=e0 + 0.035),
            dict(op=ENERGY, impl="triton linear_act none", activation="none", joules=e0,
                 sass_per_element={"total": 0.0}),
            dict(op="forward", impl="triton linear_act gelu", joules=99.0)]  # not an energy row
    for (act, count), w in zip(n.items(), wiggle, strict=True):
        rows.append(dict(op=ENERGY, impl=f"triton linear_act {act}", activation=act,
                         joules=e0 + s * count + w, sass_per_element={"total": count}))
    fit = energy_fit(rows)
    assert math.isclose(fit["slope"], s, rel_tol=1e-12)
    assert math.isclose(fit["break_even"], 0.035 / s, rel_tol=1e-12)
    assert fit["instructions"] == {"none": 0.0, **n} and fit["cublas"] == e0 + 0.035
    for r in rows[3:]:
        r.pop("sass_per_element")
    with pytest.raises(ValueError, match="counted activation"):
        energy_fit(rows)


def test_table_energy_prices_only_the_rows_its_fit_is_made_from(monkeypatch):
    """table_energy: every row's energy over its own kernel's bias-only row; the fitted price
    only beside linear_act's rows (energy_fit leaves the ping-pong rows out)."""
    from kernelnotes import _results
    from kernelnotes.ffn import figures
    from kernelnotes.ffn.figures import ENERGY

    n = {"none": 0.0, "relu": 0.0, "silu": 13.0, "gelu": 18.5}
    rows = [dict(op=ENERGY, impl="torch F.linear (cuBLAS, bias fused)", joules=1.2, ms=1.7,
                 sm_mhz=1455.0)]
    kernels = (("triton linear_act", 1.19, 4e-3), ("gluon linear_act_pingpong", 1.2, 1e-2))
    for kernel, e0, per in kernels:
        for act, count in n.items():
            rows.append(dict(op=ENERGY, impl=f"{kernel} {act}", activation=act, ms=1.7,
                             sm_mhz=1500.0, joules=e0 + per * count,
                             sass_per_element={"total": count}))
    monkeypatch.setattr(_results, "load", lambda topic: {"rows": rows})
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in figures.table_energy().splitlines()[2:]}
    assert lines["triton linear_act gelu"][4:6] == ["+74.0", "+74.0"]  # 18.5 x 4 mJ, fitted
    assert lines["gluon linear_act_pingpong gelu"][4:6] == ["+185.0", ""]  # measured, no fit
    assert lines["torch F.linear (cuBLAS, bias fused)"][4:6] == ["", ""]


# ------------------------------------------------------------------------------- GPU, full size
@pytest.mark.gpu
def test_full_size_gelu_autotuned():
    """The issue's shape through the autotuned path (config=None) against cuBLAS + torch gelu."""
    k = kernel()
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    W = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16) / 64
    b = torch.randn(16384, device="cuda", dtype=torch.bfloat16)
    with k.use_config(None):  # the ops' own choice, not the tests' fixed CONFIG
        y = k.linear_act(x, W, b, "gelu")
    yr = F.gelu(F.linear(x.double(), W.double(), b.double()))
    assert rel_err(y, yr) <= tol(torch.bfloat16)


@pytest.mark.gpu
def test_ffn_autotuned_bias_gradient_is_not_accumulated_twice():
    """Autotuning runs the db-accumulating kernel several times; db must still be right."""
    k = kernel()
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mod = k.FeedForward(1024, 4096, "gelu", device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        for p in mod.parameters():
            p.grad = None
        with k.use_config(None):  # autotune, as a caller's first calls do
            mod(x).float().square().sum().backward()
        P = {n: p.detach().double().requires_grad_() for n, p in mod.named_parameters()}
        F.linear(
            F.gelu(F.linear(x.detach().double(), P["w1"], P["b1"])), P["w2"], P["b2"]
        ).square().sum().backward()
        for n, p in mod.named_parameters():
            assert rel_err(p.grad, P[n].grad) <= 2 * tol(torch.bfloat16), n


@pytest.mark.gpu
def test_tma_default_for_large_problems():
    """config=None on Hopper: large problems take the TMA kernel, and agree with float64."""
    k = kernel()
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mod = k.FeedForward(2048, 8192, "gelu", device="cuda", dtype=torch.bfloat16)
    c = torch.empty(4096, 8192, device="cuda", dtype=torch.bfloat16)
    assert k._tma_default(x.detach(), mod.w1.detach().t(), c)
    dy = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    P = {n: p.detach().double().requires_grad_() for n, p in mod.named_parameters()}
    xd = x.detach().double().requires_grad_()
    yr = F.linear(F.gelu(F.linear(xd, P["w1"], P["b1"])), P["w2"], P["b2"])
    yr.backward(dy.double())
    with k.use_config(None):  # config=None: the TMA default at this size
        y = mod(x)
        y.backward(dy)
    assert rel_err(y, yr) <= tol(torch.bfloat16)
    assert rel_err(x.grad, xd.grad) <= 2 * tol(torch.bfloat16)
    for n, p in mod.named_parameters():
        assert rel_err(p.grad, P[n].grad) <= 2 * tol(torch.bfloat16), n


# ------------------------------------------------------------------ custom ops (torch.library)
def _op_args(dtype=torch.float32, m=5, k_=7, n=6, seed=0):
    """Tiny operands: opcheck runs each op a dozen times under the interpreter."""
    x = rand(m, k_, dtype=dtype, seed=seed, requires_grad=True)
    W = rand(n, k_, dtype=dtype, scale=k_**-0.5, seed=seed + 1, requires_grad=True)
    b = rand(n, dtype=dtype, seed=seed + 2, requires_grad=True)
    return x, W, b


def test_opcheck_every_op():
    """torch.library.opcheck (schema, fake impl, autograd registration, AOT dispatch) of each
    kernelnotes op the FFN registers, forward and backward."""
    k = kernel()
    ops = torch.ops.kernelnotes
    x, W, b = _op_args()
    Wg = rand(12, 7, dtype=torch.float32, seed=4, requires_grad=True)
    w2 = rand(4, 6, dtype=torch.float32, seed=5, requires_grad=True)
    b2 = rand(4, dtype=torch.float32, seed=6, requires_grad=True)
    dy, z = rand(5, 6, dtype=torch.float32, seed=7), rand(5, 6, dtype=torch.float32, seed=8)
    dy4 = rand(5, 4, dtype=torch.float32, seed=9)
    cases = [
        (ops.linear_act, (x, W, b, "gelu", True)),
        (ops.linear_act, (x, W, None, "none", False)),
        (ops.linear_swiglu, (x, Wg, None, True)),
        (ops.ffn, (x, W, b, w2, b2, "silu", True)),
        (ops.ffn_act_backward, (dy, z, "gelu", False, True, True)),
        (ops.ffn_act_backward, (dy, torch.cat([z, z], 1), "silu", True, True, False)),
        (ops.ffn_linear_backward, (dy, x.detach(), W.detach(), True, True)),
        (ops.ffn_hidden_backward, (dy4, w2.detach(), z, "gelu_tanh", True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    assert k._linear_act_op._qualname == "kernelnotes::linear_act"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_compile_fullgraph_gives_eager_results():
    """torch.compile(fullgraph=True) of a function calling the public ops: aot_eager on the CPU
    (the interpreter), inductor on the GPU; forward and gradients equal eager's."""
    k = kernel()
    x, W, b = _op_args()
    Wg = rand(12, 7, dtype=torch.float32, seed=4, requires_grad=True)
    w2 = rand(4, 6, dtype=torch.float32, seed=5, requires_grad=True)

    def f(x, W, b, Wg, w2):
        y = k.linear_act(x, W, b, "gelu").sum() + k.ffn(x, W, b, w2, None, "relu").sum()
        return y + k.linear_swiglu(x, Wg).square().sum()

    backend = "inductor" if ON_GPU else "aot_eager"
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    ps = (x, W, b, Wg, w2)
    want = f(*ps)
    want_grads = torch.autograd.grad(want, ps)
    got = compiled(*ps)
    got_grads = torch.autograd.grad(got, ps)
    # the ops run the same kernels; only the compiled sums around them may add in another order
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-5)


def test_ops_under_fake_tensor_mode():
    """Shapes and dtypes without running a kernel: the fake impls, through the public functions
    (leading dimensions flattened as F.linear does) and the module."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    k = kernel()
    with FakeTensorMode():
        x = torch.empty(2, 3, 64, dtype=torch.bfloat16)
        W, b = torch.empty(96, 64, dtype=torch.bfloat16), torch.empty(96, dtype=torch.bfloat16)
        y = k.linear_act(x, W, b, "gelu")
        assert y.shape == (2, 3, 96) and y.dtype == torch.bfloat16
        assert k.linear_swiglu(x, W, b).shape == (2, 3, 48)
        w2 = torch.empty(64, 96, dtype=torch.bfloat16)
        assert k.ffn(x, W, b, w2, None, "silu").shape == (2, 3, 64)
        y, z = torch.ops.kernelnotes.linear_act(x[0], W, b, "gelu", True)
        assert z.shape == y.shape == (3, 96)
        mod = k.FeedForward(64, 128, gated=True, dtype=torch.float16)
        assert mod(x.half()).shape == (2, 3, 64)


@pytest.mark.parametrize("act", ACTS)
def test_op_gradients_against_float64_autograd(act):
    """Gradients of every input of linear_act, linear_swiglu and ffn (through the public
    functions, batched [2, 3, K] inputs) against float64 torch autograd of F.linear and the
    activation. The kernels take no float64 (so no gradcheck): fp32 inputs, held to 10 u of
    fp32 on the CPU (the interpreter's tl.dot is an fp32 NumPy matmul) and of tf32 on the GPU,
    doubled for the gradients: sigma'(Z) rounds in fp32 before the matmuls that use it."""
    k = kernel()
    x = rand(2, 3, 7, dtype=torch.float32, seed=1, requires_grad=True)
    W = rand(6, 7, dtype=torch.float32, seed=2, requires_grad=True)
    b = rand(6, dtype=torch.float32, seed=3, requires_grad=True)
    Wg = rand(10, 7, dtype=torch.float32, seed=4, requires_grad=True)
    bg = rand(10, dtype=torch.float32, seed=5, requires_grad=True)
    w2 = rand(4, 6, dtype=torch.float32, seed=6, requires_grad=True)
    b2 = rand(4, dtype=torch.float32, seed=7, requires_grad=True)
    ps = (x, W, b, Wg, bg, w2, b2)
    dd = f64(*ps)
    act64 = TORCH_ACT[act]

    def total(x, W, b, Wg, bg, w2, b2, lin, glu, two):
        return lin(x, W, b).sum() + glu(x, Wg, bg).square().sum() + two(x, W, b, w2, b2).sum()

    got = total(*ps, lambda *a: k.linear_act(*a, act), k.linear_swiglu,
                lambda *a: k.ffn(*a, act))

    def glu64(x, Wg, bg):
        zz = F.linear(x, Wg, bg)
        return F.silu(zz[..., :5]) * zz[..., 5:]

    want = total(*dd, lambda x, W, b: act64(F.linear(x, W, b)), glu64,
                 lambda x, W, b, w2, b2: F.linear(act64(F.linear(x, W, b)), w2, b2))
    got.backward()
    want.backward()
    assert rel_err(got.detach().reshape(1), want.detach().reshape(1)) <= tol(torch.float32)
    for p, d in zip(ps, dd, strict=True):
        assert rel_err(p.grad, d.grad) <= 2 * tol(torch.float32), p.shape


def test_only_the_asked_gradients_are_computed():
    """needs_input_grad: a frozen weight gets no gradient, and the input's is still right."""
    k = kernel()
    x, W, b = _op_args()
    W.requires_grad_(False)
    k.linear_act(x, W, b, "silu").sum().backward()
    assert W.grad is None and x.grad is not None and b.grad is not None
    xd, Wd, bd = f64(x, W, b)
    F.silu(F.linear(xd, Wd, bd)).sum().backward()
    assert rel_err(x.grad, xd.grad) <= tol(torch.float32)


def test_op_called_without_the_saved_pre_activation_says_so():
    """The raw op called with store_z=False cannot differentiate through the activation: the
    backward names the op instead of returning a wrong gradient."""
    x, W, b = _op_args()
    y, _ = torch.ops.kernelnotes.linear_act(x, W, b, "gelu", False)
    with pytest.raises(RuntimeError, match="kernelnotes::linear_act.*store_z=True"):
        y.sum().backward()


@pytest.mark.gpu
def test_full_size_ffn_gradients_against_float64_autograd():
    """A transformer-sized FFN block (bf16, x [4096, 1024] -> 4096 -> 1024) under
    torch.compile(fullgraph=True): outputs and every gradient against float64 autograd."""
    k = kernel()
    x = rand(4096, 1024, dtype=torch.bfloat16, seed=1, requires_grad=True)
    w1 = rand(4096, 1024, dtype=torch.bfloat16, scale=1024**-0.5, seed=2, requires_grad=True)
    b1 = rand(4096, dtype=torch.bfloat16, seed=3, requires_grad=True)
    w2 = rand(1024, 4096, dtype=torch.bfloat16, scale=4096**-0.5, seed=4, requires_grad=True)
    b2 = rand(1024, dtype=torch.bfloat16, seed=5, requires_grad=True)
    dy = rand(4096, 1024, dtype=torch.bfloat16, seed=6)
    ps = (x, w1, b1, w2, b2)
    with k.use_config(None):
        y = torch.compile(lambda *p: k.ffn(*p, "gelu"), fullgraph=True)(*ps)
        y.backward(dy)
    ds = f64(*ps)
    yr = F.linear(F.gelu(F.linear(ds[0], ds[1], ds[2])), ds[3], ds[4])
    yr.backward(dy.double().cpu())
    assert rel_err(y, yr) <= tol(torch.bfloat16)
    for p, d in zip(ps, ds, strict=True):
        assert rel_err(p.grad, d.grad) <= 2 * tol(torch.bfloat16), p.shape


# ---------------------------------------------------------------------- bad input, tabled
# Each row: (function, kind of bad input, call, expected). Expected is either a function giving
# torch's result for the same input (the op must agree with it, NaN where torch has NaN) or
# (exception type, the argument its message must name).


def _bad_inputs():
    dt = torch.float32
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dt).to(DEVICE)

    x, W, b = r(6, 8), r(5, 8), r(5)
    Wg, bg = r(10, 8), r(10)  # [W_gate; W_up], H = 5
    w1, b1, w2, b2 = r(12, 8), r(12), r(8, 12), r(8)
    nan_x = x.clone()
    nan_x[1, 2], nan_x[3, 0] = float("nan"), float("inf")
    xt, bt, bgt = r(8, 6).t(), r(10)[::2], r(20)[::2]  # non-contiguous views
    meta = torch.empty(5, 8, device="meta")
    k = kernel()

    # torch's answers in float64: its vectorized fp32 CPU gelu gives NaN at +inf, where the
    # scalar path and float64 give inf (as the kernels do)
    def lin(x_, W_=W, b_=b):
        return F.gelu(F.linear(x_.double(), W_.double(), b_.double())).to(dt)

    def glu(x_, W_=Wg, b_=bg):
        z = F.linear(x_.double(), W_.double(), b_.double())
        return (F.silu(z[..., :5]) * z[..., 5:]).to(dt)

    def two(x_):
        a = F.gelu(F.linear(x_.double(), w1.double(), b1.double()))
        return F.linear(a, w2.double(), b2.double()).to(dt)

    def module(**kw):
        torch.manual_seed(0)
        return k.FeedForward(8, 12, "gelu", device=DEVICE, dtype=dt, **kw)

    def mod_ref(x_):
        m = module().double()
        return F.linear(F.gelu(F.linear(x_.double(), m.w1, m.b1)), m.w2, m.b2).to(dt)

    la, sw, ff, FF, uc = "linear_act", "linear_swiglu", "ffn", "FeedForward", "use_config"
    return [
        (la, "wrong dtype", lambda: k.linear_act(x.int(), W, b), (TypeError, "input")),
        (la, "mixed dtypes", lambda: k.linear_act(x, W.half(), b), (TypeError, "weight")),
        (la, "wrong rank (weight 1-D)", lambda: k.linear_act(x, W[0], b), (ValueError, "weight")),
        (la, "wrong rank (0-d input)", lambda: k.linear_act(x[0, 0], W, b),
         (ValueError, "input")),
        (la, "batched input [2, 3, K]", lambda: k.linear_act(x.reshape(2, 3, 8), W, b),
         lambda: lin(x.reshape(2, 3, 8))),
        (la, "mismatched shapes (K)", lambda: k.linear_act(x, W[:, :7], b),
         (ValueError, "weight")),
        (la, "mismatched shapes (bias)", lambda: k.linear_act(x, W, b[:4]), (ValueError, "bias")),
        (la, "empty (no rows)", lambda: k.linear_act(x[:0], W, b), lambda: lin(x[:0])),
        (la, "empty (K = 0)", lambda: k.linear_act(x[:, :0], W[:, :0], b),
         lambda: lin(x[:, :0], W[:, :0])),
        (la, "non-contiguous input", lambda: k.linear_act(xt, W, b), lambda: lin(xt)),
        (la, "non-contiguous bias", lambda: k.linear_act(x, W, bt), lambda: lin(x, W, bt)),
        (la, "NaN/inf values", lambda: k.linear_act(nan_x, W, b), lambda: lin(nan_x)),
        (la, "wrong device", lambda: k.linear_act(x, meta, b), (ValueError, "weight")),
        (la, "invalid option (unknown activation)", lambda: k.linear_act(x, W, b, "swish"),
         (ValueError, "activation")),
        (la, "invalid option (activation not a str)", lambda: k.linear_act(x, W, b, 2),
         (TypeError, "activation")),
        (la, "not a tensor", lambda: k.linear_act(x.tolist(), W, b), (TypeError, "input")),
        (sw, "wrong dtype", lambda: k.linear_swiglu(x.int(), Wg, bg), (TypeError, "input")),
        (sw, "mixed dtypes", lambda: k.linear_swiglu(x, Wg, bg.half()), (TypeError, "bias")),
        (sw, "wrong rank (weight 3-D)", lambda: k.linear_swiglu(x, Wg[None], bg),
         (ValueError, "weight")),
        (sw, "odd number of weight rows", lambda: k.linear_swiglu(x, Wg[:9], bg[:9]),
         (ValueError, "weight")),
        (sw, "mismatched shapes (K)", lambda: k.linear_swiglu(x[:, :7], Wg, bg),
         (ValueError, "weight")),
        (sw, "batched input [2, 3, K]", lambda: k.linear_swiglu(x.reshape(2, 3, 8), Wg, bg),
         lambda: glu(x.reshape(2, 3, 8))),
        (sw, "empty (no rows)", lambda: k.linear_swiglu(x[:0], Wg, bg), lambda: glu(x[:0])),
        (sw, "non-contiguous input", lambda: k.linear_swiglu(xt, Wg, bg), lambda: glu(xt)),
        (sw, "non-contiguous bias", lambda: k.linear_swiglu(x, Wg, bgt),
         lambda: glu(x, Wg, bgt)),
        (sw, "NaN/inf values", lambda: k.linear_swiglu(nan_x, Wg, bg), lambda: glu(nan_x)),
        (sw, "wrong device", lambda: k.linear_swiglu(x, Wg, torch.empty(10, device="meta")),
         (ValueError, "bias")),
        (sw, "not a tensor", lambda: k.linear_swiglu(x, Wg.tolist()), (TypeError, "weight")),
        (ff, "wrong dtype", lambda: k.ffn(x.double(), w1, b1, w2, b2), (TypeError, "input")),
        (ff, "mixed dtypes", lambda: k.ffn(x, w1, b1, w2.half(), b2), (TypeError, "w2")),
        (ff, "wrong rank (w1 1-D)", lambda: k.ffn(x, w1[0], b1, w2, b2), (ValueError, "w1")),
        (ff, "mismatched shapes (w2's columns)", lambda: k.ffn(x, w1, b1, w2[:, :11], b2),
         (ValueError, "w2")),
        (ff, "mismatched shapes (b1)", lambda: k.ffn(x, w1, b1[:3], w2, b2), (ValueError, "b1")),
        (ff, "mismatched shapes (b2)", lambda: k.ffn(x, w1, b1, w2, b2[:3]), (ValueError, "b2")),
        (ff, "batched input [2, 3, d]", lambda: k.ffn(x.reshape(2, 3, 8), w1, b1, w2, b2),
         lambda: two(x.reshape(2, 3, 8))),
        (ff, "empty (no rows)", lambda: k.ffn(x[:0], w1, b1, w2, b2), lambda: two(x[:0])),
        (ff, "non-contiguous input", lambda: k.ffn(xt, w1, b1, w2, b2), lambda: two(xt)),
        (ff, "NaN/inf values", lambda: k.ffn(nan_x, w1, b1, w2, b2), lambda: two(nan_x)),
        (ff, "wrong device", lambda: k.ffn(x, w1, b1, w2, torch.empty(8, device="meta")),
         (ValueError, "b2")),
        (ff, "invalid option (unknown activation)", lambda: k.ffn(x, w1, b1, w2, b2, "tanh"),
         (ValueError, "activation")),
        (FF, "width not an int", lambda: k.FeedForward(8.0, 12), (TypeError, "d_model")),
        (FF, "width below 1", lambda: k.FeedForward(8, 0), (ValueError, "d_hidden")),
        (FF, "invalid option (unknown activation)", lambda: k.FeedForward(8, 12, "swish"),
         (ValueError, "activation")),
        (FF, "non-bool flag (gated)", lambda: k.FeedForward(8, 12, gated="yes"),
         (TypeError, "gated")),
        (FF, "non-bool flag (bias)", lambda: k.FeedForward(8, 12, bias=1), (TypeError, "bias")),
        (FF, "wrong dtype", lambda: module()(x.double()), (TypeError, "input")),
        (FF, "mismatched shapes (last dim)", lambda: module()(x[:, :7]), (ValueError, "input")),
        (FF, "wrong rank (0-d input)", lambda: module()(x[0, 0]), (ValueError, "input")),
        (FF, "empty (no rows)", lambda: module()(x[:0]), lambda: mod_ref(x[:0])),
        (FF, "NaN/inf values", lambda: module()(nan_x), lambda: mod_ref(nan_x)),
        (FF, "not a tensor", lambda: module()(x.tolist()), (TypeError, "input")),
        *((uc, kind, _enter(k, cfg), want) for kind, cfg, want in _bad_configs()),
    ]


def _enter(k, cfg):
    def call():
        with k.use_config(cfg):
            pass

    return call


def _bad_configs():
    """use_config's table: what it refuses, each naming config (the tile sizes reach tl.arange and
    tl.dot, which need powers of two of at least 16)."""
    def c(num_warps=4, **kw):
        tiles = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2} | kw
        return triton.Config({k_: v for k_, v in tiles.items() if v is not None},
                             num_warps=num_warps, num_stages=1)

    return [
        ("not a Config (dict)", {"BLOCK_M": 32}, (TypeError, "config")),
        ("not a Config (str)", "128x128", (TypeError, "config")),
        ("not a Config (the class)", triton.Config, (TypeError, "config")),
        ("missing key", c(GROUP_M=None), (ValueError, "config is missing GROUP_M")),
        ("unknown key", c(BLOCK_Q=32), (ValueError, "config sets unknown keys BLOCK_Q")),
        ("tile not a power of two", c(BLOCK_N=48), (ValueError, "config BLOCK_N")),
        ("tile below 16", c(BLOCK_K=8), (ValueError, "config BLOCK_K")),
        ("tile not an int", c(BLOCK_M=32.0), (ValueError, "config BLOCK_M")),
        ("non-bool flag", c(TMA="yes"), (TypeError, "config TMA")),
        ("invalid num_warps", c(num_warps=3), (ValueError, "config num_warps")),
    ]


BAD_INPUTS = [(f, kind) for f, kind, _, _ in _bad_inputs()]


@pytest.mark.parametrize("function, kind", BAD_INPUTS, ids=[f"{f}-{k}" for f, k in BAD_INPUTS])
def test_bad_input(function, kind):
    """Handled as torch handles it (same values, NaN where torch has NaN), or refused with a
    TypeError/ValueError that names the argument."""
    row = {(f, k_): (call, want) for f, k_, call, want in _bad_inputs()}
    call, want = row[function, kind]
    if isinstance(want, tuple):
        with pytest.raises(want[0], match=want[1]):
            call()
        return
    got, ref = call(), want()
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert torch.allclose(got, ref, rtol=BAD_RTOL, atol=BAD_RTOL, equal_nan=True)


BAD_RTOL = 1e-2 if ON_GPU else 1e-5  # fp32 through tf32 on the GPU
