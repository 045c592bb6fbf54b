"""Fused linear layers in Triton: matmul + bias + activation in one kernel, and their backward.

Order: the jit helpers and kernels, then the launchers (``_matmul``, ``linear_act_forward``,
``linear_swiglu_forward``, ``act_backward``, ``linear_backward``), then the autograd Functions
and the public ``linear_act``, ``linear_swiglu``, ``ffn`` and ``FeedForward``. The posts
(docs/posts/05-feed-forward-networks.md, docs/posts/06-backprop.md) derive every formula.

One matmul kernel serves every product of the forward and the backward pass: it reads A and B
through strides, so ``dX = dZ W`` and ``dW = dZ^T X`` are the same kernel with other strides, and
its epilogue (in fp32, before the one cast) adds the bias and applies the activation, or, in the
backward pass, multiplies by the activation's derivative and sums the bias gradient.

Its K loop fetches the tiles in one of two ways: by pointer loads (``_tile_dot_ptr``, autotuned)
or by Hopper TMA descriptors (``_tile_dot_tma``), chosen by a config with ``TMA=True`` and, with
config=None, for large problems on Hopper.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernelnotes._grid import cdiv
from kernelnotes._validate import check_kernel_device, check_tensor, interpreted

# --8<-- [start:activations]
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")  # codes 0..4 in the kernels


# Phi(z) by erfc(s) ~ t P(t) e^(-s^2), s = |z| / sqrt 2, t = 1 / (1 + 0.375 s): the halved
# coefficients of P from reference.erfc_fit() (relative error 6.4e-7; test_ffn refits them).
ERFC_P = tl.constexpr(0.375)
ERFC_C0 = tl.constexpr(0.105669711)
ERFC_C1 = tl.constexpr(0.107844812)
ERFC_C2 = tl.constexpr(0.0833309905)
ERFC_C3 = tl.constexpr(0.141534398)
ERFC_C4 = tl.constexpr(-0.0648039465)
ERFC_C5 = tl.constexpr(0.193972795)
ERFC_C6 = tl.constexpr(-0.0675490788)


@triton.jit
def _normal_cdf(z):
    """(Phi(z), e^(-z^2/2)) in fp32. Half of erfc(|z| / sqrt 2) is the smaller tail, so Phi keeps
    its relative accuracy for z << 0, where 0.5 (1 + erf(z / sqrt 2)) cancels to 0. One
    approximate reciprocal, one exp2 and a Horner chain: in the sm_90 code of Triton 3.6 the GELU
    epilogues (forward and derivative) take about half the instructions they took with the
    library erf, and no longer spill registers."""
    s = tl.abs(z) * 0.7071067811865476
    if INTERPRETED:  # the interpreter has no libdevice
        t = 1.0 / (1.0 + ERFC_P * s)
    else:  # div.approx: no range guards, as 1 <= 1 + p s (and huge s gives t = 0, as it should)
        t = libdevice.fast_dividef(1.0, 1.0 + ERFC_P * s)
    q = ERFC_C6 * t + ERFC_C5  # Horner: P(t) / 2
    q = q * t + ERFC_C4
    q = q * t + ERFC_C3
    q = q * t + ERFC_C2
    q = q * t + ERFC_C1
    q = q * t + ERFC_C0
    e = tl.math.exp2(-1.4426950408889634 * s * s)  # e^(-s^2) = e^(-z^2 / 2)
    q = q * t * e  # erfc(s) / 2: the tail beyond |z|
    return tl.where(z >= 0.0, 1.0 - q, q), e


INTERPRETED = tl.constexpr(interpreted(_normal_cdf))


@triton.jit
def _act(z, ACT: tl.constexpr):
    """sigma(z) in fp32: 1 relu, 2 gelu (erf form), 3 gelu (tanh form), 4 silu, 0 identity."""
    if ACT == 1:
        y = tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as F.relu
    elif ACT == 2:
        cdf, _ = _normal_cdf(z)
        y = z * cdf  # z Phi(z)
    elif ACT == 3:
        u = 0.7978845608028654 * (z + 0.044715 * z * z * z)  # sqrt(2/pi) (z + 0.044715 z^3)
        y = z * tl.sigmoid(2.0 * u)  # = z (1 + tanh u) / 2, without the cancellation in 1 + tanh
    elif ACT == 4:
        y = z * tl.sigmoid(z)
    else:
        y = z
    return y


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    """sigma'(z) in fp32, for the same codes as _act (relu'(0) = 0, as torch; relu'(NaN) = NaN,
    where torch passes dY through)."""
    if ACT == 1:
        d = tl.where(z > 0.0, 1.0, tl.where(z <= 0.0, 0.0, z))  # a NaN z fails both: NaN
    elif ACT == 2:
        cdf, e = _normal_cdf(z)
        d = cdf + z * 0.3989422804014327 * e  # Phi(z) + z phi(z), phi(z) = e^(-z^2/2) / sqrt(2 pi)
    elif ACT == 3:
        u = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        s = tl.sigmoid(2.0 * u)  # (1 + tanh u) / 2
        zc = tl.minimum(tl.maximum(z, -16.0), 16.0)  # s (1 - s) < 1e-300 beyond: avoid 0 * inf
        du = 0.7978845608028654 * (1.0 + 0.134145 * zc * zc)  # u'(z), 0.134145 = 3 * 0.044715
        d = s + 2.0 * zc * s * (1.0 - s) * du
    elif ACT == 4:
        s = tl.sigmoid(z)
        d = s * (1.0 + z * (1.0 - s))
    else:
        d = tl.full(z.shape, 1.0, tl.float32)
    return d


# --8<-- [end:activations]

activation_epilogue = _act
"""``activation_epilogue(z, ACT)``: the ``@triton.jit`` function that applies the activation of
code ``ACT = ACTIVATIONS.index(name)`` to an fp32 tile, what the matmul's epilogue inlines.
Public so that other kernels (benchmarks/_epilogue_sass.py, lab/ffn's Gluon study) apply the same
epilogue."""


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each column-tile while it is in L2."""
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % group_m
    pid_n = (tile % tiles_per_group) // group_m
    return pid_m, pid_n


# --8<-- [start:epilogue]
@triton.jit
def _add_column_sums(db_ptrs, tile, mask):
    """db += the tile's column sums, by atomics in no fixed order. Relaxed: db is read only after
    the kernel, and Triton's default (acq_rel) would make each a fence that waits for the tile's
    stores (dZ1 of the FFN block 1.91 -> 1.86 ms on an H200)."""
    tl.atomic_add(db_ptrs, tl.sum(tile, axis=0), mask=mask, sem="relaxed")


@triton.jit
def _epilogue(
    acc,  # fp32 [BLOCK_M, BLOCK_N] tile of A B; rows and columns outside C are 0
    off_m,
    off_n,  # its first row and column in C
    M,
    N,
    c_ptr,
    stride_cm,
    bias_ptr,
    z_ptr,
    stride_zm,
    db_ptr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    STORE_Z: tl.constexpr,
    GRAD_ACT: tl.constexpr,
    ACC_DB: tl.constexpr,
    C_TMA: tl.constexpr = False,  # c_ptr and z_ptr are TMA descriptors with [BLOCK_M,
    # BLOCK_N / 2] boxes (_tma_halves)
):
    """Everything after the matmul, in fp32 while the tile is in registers; one cast to store."""
    offs_m = off_m + tl.arange(0, acc.shape[0])
    offs_n = off_n + tl.arange(0, acc.shape[1])
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if GRAD_ACT and C_TMA:  # loads Z and stores dZ itself, a half tile at a time
        left, right = _column_halves(acc)
        _grad_act_half(left, off_m, off_n, N, c_ptr, z_ptr, db_ptr, ACT, ACC_DB)
        _grad_act_half(right, off_m, off_n + left.shape[1], N, c_ptr, z_ptr, db_ptr, ACT, ACC_DB)
    else:
        if GRAD_ACT:
            z_ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :]
            z = tl.load(z_ptrs, mask=c_mask, other=0.0).to(tl.float32)
            acc = acc * _act_grad(z, ACT)  # dZ = dA * sigma'(Z); 0 outside C
            if ACC_DB:
                _add_column_sums(db_ptr + offs_n, acc, offs_n < N)
        else:
            if STORE_Z and C_TMA:
                _store_tma(z_ptr, acc, off_m, off_n)
            elif STORE_Z:
                z_ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :]
                tl.store(z_ptrs, acc.to(z_ptr.dtype.element_ty), mask=c_mask)
            acc = _act(acc, ACT)
        if C_TMA:
            _store_tma(c_ptr, acc, off_m, off_n)
        else:
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _column_halves(tile):
    """A [BM, BN] tile as its left and right [BM, BN / 2] halves, what _tma_halves' boxes hold."""
    BM: tl.constexpr = tile.shape[0]
    BN: tl.constexpr = tile.shape[1]
    return tile.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()


@triton.jit
def _store_tma(c_desc, acc, off_m, off_n):
    """The tile to C by TMA, in two [BM, BN / 2] halves: each goes registers -> shared memory ->
    global while the program moves on (half the staging buffer of one whole-tile store), and
    the engine drops whatever falls outside C, so no masks."""
    left, right = _column_halves(acc)
    c_desc.store([off_m, off_n], left.to(c_desc.dtype))
    c_desc.store([off_m, off_n + left.shape[1]], right.to(c_desc.dtype))


@triton.jit
def _grad_act_half(da, off_m, off_n, N, dz_desc, z_desc, db_ptr, ACT: tl.constexpr,
                   ACC_DB: tl.constexpr):
    """dZ = dA * sigma'(Z) for a [BM, BN / 2] half tile at (off_m, off_n): Z in and dZ out by TMA
    (entries outside Z arrive as 0 and none outside dZ is written), db += its column sums. Half
    a tile at a time, the GELU backward epilogue compiles for sm_90 without register spills
    (whole tiles through pointers: 400 B a thread)."""
    z = z_desc.load([off_m, off_n]).to(tl.float32)
    dz = da * _act_grad(z, ACT)
    if ACC_DB:
        offs_n = off_n + tl.arange(0, da.shape[1])
        _add_column_sums(db_ptr + offs_n, dz, offs_n < N)
    dz_desc.store([off_m, off_n], dz.to(dz_desc.dtype))


# --8<-- [end:epilogue]


# --8<-- [start:matmul_kernel]
@triton.jit
def _k_tile(ptrs, offs_r, offs_c, rows, cols, EVEN: tl.constexpr):
    """One operand tile by pointers: entries past (rows, cols) load as 0, unless EVEN says there
    are none."""
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(offs_r[:, None] < rows) & (offs_c[None, :] < cols), other=0.0)


@triton.jit
def _tile_dot_ptr(acc, a_ptr, b_ptr, offs_m, offs_n, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn,
                  EVEN: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc + A[offs_m, :] B[:, offs_n], BLOCK_K columns of A at a time, by pointer loads
    (masked unless EVEN)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    for kt in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - kt * BLOCK_K
        a = _k_tile(a_ptrs, offs_m, offs_k, M, k_left, EVEN)
        b = _k_tile(b_ptrs, offs_k, offs_n, k_left, N, EVEN)
        if DOT_FP32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # wgmma on sm_90; fp32 inputs go through tf32
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _tile_dot_tma(acc, a_desc, b_desc, off_m, off_n, K, A_T: tl.constexpr, B_T: tl.constexpr,
                  BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """The same with the tiles fetched by the Hopper TMA engine: no address arithmetic and no
    masks (rows and columns outside the matrix arrive as zeros). A_T / B_T: the descriptor is of
    the stored transpose, and the tile is transposed in shared memory."""
    for kt in range(tl.cdiv(K, BLOCK_K)):
        off_k = kt * BLOCK_K
        if A_T:
            a = a_desc.load([off_k, off_m]).T
        else:
            a = a_desc.load([off_m, off_k])
        if B_T:
            b = b_desc.load([off_n, off_k]).T
        else:
            b = b_desc.load([off_k, off_n])
        if DOT_FP32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _matmul_kernel(
    a_src,  # A [M, K]: a pointer (any strides); with TMA a descriptor of A, or of A^T if A_T
    b_src,  # B [K, N]: a pointer (W [N, K] read as B = W^T by swapping its strides); with TMA a
    # descriptor of B, or of B^T if B_T
    c_ptr,  # *C [M, N] output, row stride stride_cm, unit column stride; if C_TMA a descriptor
    bias_ptr,  # *[N] bias, read if HAS_BIAS
    z_ptr,  # *Z [M, N]: written (pre-activation) if STORE_Z, read (for sigma'(Z)) if GRAD_ACT;
    # with C_TMA a descriptor
    db_ptr,  # *fp32 [N]: += column sums of the output if ACC_DB (GRAD_ACT only)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,  # of pointer operands (unused with TMA)
    stride_cm,
    stride_zm,
    ACT: tl.constexpr,  # activation code, see ACTIVATIONS
    HAS_BIAS: tl.constexpr,
    STORE_Z: tl.constexpr,  # forward for training: keep Z = AB + b for the backward pass
    GRAD_ACT: tl.constexpr,  # backward: C = (AB) * sigma'(Z), i.e. dZ = dA * sigma'(Z)
    ACC_DB: tl.constexpr,
    EVEN: tl.constexpr,  # M, N, K all multiples of the block sizes: no masks anywhere
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,  # persistent grid: one program per SM walks the tiles
    TMA: tl.constexpr = False,  # a_src, b_src are TMA descriptors (Hopper)
    A_T: tl.constexpr = False,
    B_T: tl.constexpr = False,  # TMA: which operands are read transposed
    FLATTEN: tl.constexpr = False,  # one pipelined loop over (tile, k): see below
    C_TMA: tl.constexpr = False,  # c_ptr and z_ptr are TMA descriptors (_tma_halves)
    DOT_FP32: tl.constexpr = False,  # interpreter only, see _dot_fp32
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # With FLATTEN the next tile's loads overlap this tile's epilogue; the epilogue then takes its
    # coordinates from a second counter, tile_c (as Triton's persistent-matmul tutorial does).
    tile_c = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA:
            acc = _tile_dot_tma(acc, a_src, b_src, pid_m * BLOCK_M, pid_n * BLOCK_N, K, A_T, B_T,
                                BLOCK_K, DOT_FP32)
        else:
            acc = _tile_dot_ptr(acc, a_src, b_src, pid_m * BLOCK_M + tl.arange(0, BLOCK_M),
                                pid_n * BLOCK_N + tl.arange(0, BLOCK_N), M, N, K, stride_am,
                                stride_ak, stride_bk, stride_bn, EVEN, BLOCK_K, DOT_FP32)

        tile_c += NUM_SMS
        pid_m, pid_n = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        _epilogue(acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, c_ptr, stride_cm, bias_ptr, z_ptr,
                  stride_zm, db_ptr, ACT, HAS_BIAS, STORE_Z, GRAD_ACT, ACC_DB, C_TMA)


# --8<-- [end:matmul_kernel]


# --8<-- [start:swiglu_kernel]
@triton.jit
def _swiglu_kernel(
    x_ptr,  # *X [M, K]
    w_ptr,  # *W [2H, K]: rows 0..H-1 are W_gate, rows H..2H-1 are W_up
    bias_ptr,  # *[2H], read if HAS_BIAS
    h_ptr,  # *out [M, H] = silu(X W_gate^T + b_gate) * (X W_up^T + b_up)
    z_ptr,  # *[M, 2H] = [Z_gate, Z_up], written if STORE_Z
    M,
    H,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_hm,
    stride_zm,
    HAS_BIAS: tl.constexpr,
    STORE_Z: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    DOT_FP32: tl.constexpr = False,  # interpreter only, see _dot_fp32
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(H, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        g_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn  # W_gate^T
        u_ptrs = g_ptrs + H * stride_wn  # W_up^T
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            k_left = K - kt * BLOCK_K
            x = _k_tile(x_ptrs, offs_m, offs_k, M, k_left, EVEN)
            wg = _k_tile(g_ptrs, offs_k, offs_n, k_left, H, EVEN)
            wu = _k_tile(u_ptrs, offs_k, offs_n, k_left, H, EVEN)
            if DOT_FP32:
                x, wg, wu = x.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
            acc_g = tl.dot(x, wg, acc_g)  # one read of the X tile feeds both products
            acc_u = tl.dot(x, wu, acc_u)
            x_ptrs += BLOCK_K * stride_xk
            g_ptrs += BLOCK_K * stride_wk
            u_ptrs += BLOCK_K * stride_wk

        mask = (offs_m[:, None] < M) & (offs_n[None, :] < H)
        if HAS_BIAS:
            b_g = tl.load(bias_ptr + offs_n, mask=offs_n < H, other=0.0)
            b_u = tl.load(bias_ptr + H + offs_n, mask=offs_n < H, other=0.0)
            acc_g += b_g.to(tl.float32)[None, :]
            acc_u += b_u.to(tl.float32)[None, :]
        if STORE_Z:
            z_ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :]
            tl.store(z_ptrs, acc_g.to(z_ptr.dtype.element_ty), mask=mask)
            tl.store(z_ptrs + H, acc_u.to(z_ptr.dtype.element_ty), mask=mask)
        out = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(Z_gate) * Z_up
        h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :]
        tl.store(h_ptrs, out.to(h_ptr.dtype.element_ty), mask=mask)


# --8<-- [end:swiglu_kernel]


# --8<-- [start:act_backward_kernel]
@triton.jit
def _act_backward_kernel(
    dy_ptr,  # *dY [M, N_out], contiguous
    z_ptr,  # *Z [M, N_z], contiguous: N_z = N_out, or 2 N_out (= [Z_gate, Z_up]) if GATED
    dz_ptr,  # *dZ [M, N_z], contiguous, written if WRITE_DZ
    db_ptr,  # *fp32 [N_z]: += column sums of dZ if ACC_DB
    M,
    N_out,
    ACT: tl.constexpr,
    GATED: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    ACC_DB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N_out)
    row = offs_m[:, None].to(tl.int64)
    dy = tl.load(dy_ptr + row * N_out + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    if GATED:  # h = silu(g) * u:  dg = dh * u * silu'(g),  du = dh * silu(g)
        z_row = z_ptr + row * (2 * N_out) + offs_n[None, :]
        g = tl.load(z_row, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(z_row + N_out, mask=mask, other=0.0).to(tl.float32)
        dg = dy * u * _act_grad(g, 4)
        du = dy * _act(g, 4)
        dz_row = dz_ptr + row * (2 * N_out) + offs_n[None, :]
        tl.store(dz_row, dg.to(dz_ptr.dtype.element_ty), mask=mask)
        tl.store(dz_row + N_out, du.to(dz_ptr.dtype.element_ty), mask=mask)
        if ACC_DB:
            _add_column_sums(db_ptr + offs_n, dg, offs_n < N_out)
            _add_column_sums(db_ptr + N_out + offs_n, du, offs_n < N_out)
    else:
        if ACT == 0:
            dz = dy  # no activation: dZ = dY, only the bias gradient is wanted
        else:
            z = tl.load(z_ptr + row * N_out + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
            dz = dy * _act_grad(z, ACT)
        if WRITE_DZ:
            dz_ptrs = dz_ptr + row * N_out + offs_n[None, :]
            tl.store(dz_ptrs, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        if ACC_DB:
            _add_column_sums(db_ptr + offs_n, dz, offs_n < N_out)


# --8<-- [end:act_backward_kernel]


# --8<-- [start:configs]
SUPPORTED = (torch.bfloat16, torch.float16, torch.float32)
_INT32_MAX = 2**31 - 1

# Hopper: 128x256x64 bf16 tiles are 48 KB a stage (3 stages = 144 KB of the 228 KB of shared
# memory), and 8 warps (two warpgroups) issue the wgmma; 128x128 is the fallback.
MATMUL_CONFIGS = [
    triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3
    ),
    triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=4
    ),
]
# Two fp32 accumulators: 128x128 keeps them at 128 registers a thread.
SWIGLU_CONFIGS = [
    triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3
    ),
]
# What config=None uses for large problems on Hopper: the TMA kernel on the first tile. Four
# stages with FLATTEN and GROUP_M = 16 ranged from 3% faster to 1% slower than it for the fused
# GELU layer at 8192 x 16384 x 4096 (four runs on two H200s, each in interleaved rounds with this
# config), so it stays as it is; with the TMA store, FLATTEN alone moved the FFN block by less than
# the run-to-run noise, whichever of its matmuls took it (docs/posts/05, "Performance").
TMA_CONFIG = triton.Config({**MATMUL_CONFIGS[0].kwargs, "TMA": True},
                           num_warps=MATMUL_CONFIGS[0].num_warps,
                           num_stages=MATMUL_CONFIGS[0].num_stages)
# fp32 tiles are twice the bytes: 128x128x32 (32 KB a stage) fits where the lists above do not.
# fp32 is the tf32 correctness path, not a tuned one.
FP32_CONFIG = triton.Config(
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3
)
# Under the interpreter: small tiles, so that the tests' awkward sizes span several of them.
INTERPRETER_CONFIG = triton.Config(
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2}, num_warps=4, num_stages=1
)
_KEY = [
    "M",
    "N",
    "K",
    "stride_am",
    "stride_ak",
    "stride_bk",
    "stride_bn",
    "ACT",
    "HAS_BIAS",
    "STORE_Z",
    "GRAD_ACT",
    "ACC_DB",
]


def _even(args) -> bool:
    return (
        args["M"] % args["BLOCK_M"] == 0
        and args["N"] % args["BLOCK_N"] == 0
        and args["K"] % args["BLOCK_K"] == 0
    )


def _even_swiglu(args) -> bool:
    return (
        args["M"] % args["BLOCK_M"] == 0
        and args["H"] % args["BLOCK_N"] == 0
        and args["K"] % args["BLOCK_K"] == 0
    )


_matmul_fixed = triton.heuristics({"EVEN": _even})(_matmul_kernel)
_matmul_tuned = triton.autotune(MATMUL_CONFIGS, key=_KEY, reset_to_zero=["db_ptr"])(_matmul_fixed)
_swiglu_fixed = triton.heuristics({"EVEN": _even_swiglu})(_swiglu_kernel)
_swiglu_tuned = triton.autotune(SWIGLU_CONFIGS, key=["M", "H", "K", "HAS_BIAS", "STORE_Z"])(
    _swiglu_fixed
)
# --8<-- [end:configs]


def _interpreted() -> bool:
    return INTERPRETED.value  # the one answer, also what the jit code branches on


def _dot_fp32(t: torch.Tensor) -> bool:
    """Triton 3.9's interpreter multiplies bf16 tiles as their uint16 bit patterns, so under it
    bf16 operands are widened to fp32 first; bf16 x bf16 products are exact in fp32, as in wgmma."""
    return _interpreted() and t.dtype == torch.bfloat16


def _num_programs(device: torch.device, tiles: int) -> int:
    if device.type == "cuda":
        return max(1, min(tiles, torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(tiles, 3))  # interpreter: 3 programs, so the persistent loop is exercised


def _check_config(config) -> None:
    if config is None:
        return
    if not isinstance(config, triton.Config):
        raise TypeError(f"config must be a triton.Config or None, got {type(config).__name__}")
    missing = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"} - set(config.kwargs)
    if missing:
        raise ValueError(f"config is missing {', '.join(sorted(missing))}")
    unknown = set(config.kwargs) - {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "TMA", "FLATTEN",
                                    "TMA_STORE"}
    if unknown:
        raise ValueError(f"config sets unknown keys {', '.join(sorted(unknown))}")
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"):
        v = config.kwargs[key]
        least = 1 if key == "GROUP_M" else 16  # tl.dot needs tiles of at least 16
        if type(v) is not int or v < least or (key != "GROUP_M" and v & (v - 1)):
            kind = "an int >= 1" if key == "GROUP_M" else "a power of two >= 16"
            raise ValueError(f"config {key}={v!r} must be {kind}")
    for key in ("TMA", "FLATTEN", "TMA_STORE"):
        if key in config.kwargs and not isinstance(config.kwargs[key], bool):
            raise TypeError(f"config {key} must be a bool, got {type(config.kwargs[key]).__name__}")
    if type(config.num_warps) is not int or config.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config num_warps={config.num_warps!r} must be 1, 2, 4, 8 or 16")


def _check_offsets(name: str, t: torch.Tensor) -> None:
    """The kernels index with int32: every element's offset must fit."""
    reach = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True) if s > 0)
    if reach > _INT32_MAX:
        raise ValueError(f"{name} of shape {tuple(t.shape)} spans more than 2^31 - 1 elements")


def _check_span(name: str, shape) -> None:
    """A new contiguous tensor of this shape: every element's offset must fit int32."""
    if math.prod(shape) - 1 > _INT32_MAX:
        raise ValueError(f"{name} of shape {tuple(shape)} spans more than 2^31 - 1 elements")


def _act_code(activation: str) -> int:
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a str, one of {ACTIVATIONS}, got "
                        f"{type(activation).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return ACTIVATIONS.index(activation)


# --8<-- [start:matmul_launcher]
def _matmul(
    a, b, c, *, bias=None, z=None, db=None, act=0, store_z=False, grad_act=False, config=None
):
    """c = epilogue(a @ b): a [M, K] and b [K, N] with any strides, c [M, N] with unit column
    stride; the flags as in _matmul_kernel. config None: TMA_CONFIG for large problems on
    Hopper (_tma_default), else autotune on a GPU; a config with TMA=True: the TMA kernel,
    where both operands allow it (else the pointer kernel), which also stores c and stores or
    loads z by TMA where they allow it (_tma_halves) unless the config sets TMA_STORE=False."""
    M, K = a.shape
    N = b.shape[1]
    dummy = c  # never read or written: the constexpr flags switch those pointers off
    acc_db = db is not None and grad_act
    # db_ptr is zeroed before every autotuning trial (reset_to_zero): the dummy c is rewritten
    args = (
        a,
        b,
        c,
        dummy if bias is None else bias,
        dummy if z is None else z,
        dummy if db is None else db,
        M,
        N,
        K,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        0 if z is None else z.stride(0),
    )
    flags = dict(
        ACT=act,
        HAS_BIAS=bias is not None,
        STORE_Z=store_z,
        GRAD_ACT=grad_act,
        ACC_DB=acc_db,
        DOT_FP32=_dot_fp32(a),
    )
    if config is None:
        config = _default_config(a, b, c)
    if config is None and not _interpreted():

        def grid(meta):
            return (
                _num_programs(
                    c.device, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
                ),
            )

        _matmul_tuned[grid](*args, **flags, NUM_SMS=_num_programs(c.device, 1 << 30))
    else:
        cfg = config or INTERPRETER_CONFIG
        kw = {n: v for n, v in cfg.kwargs.items() if n not in ("TMA", "TMA_STORE")}
        tiles = cdiv(M, kw["BLOCK_M"]) * cdiv(N, kw["BLOCK_N"])
        launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        grid = (_num_programs(c.device, tiles),)
        nsm = _num_programs(c.device, 1 << 30)
        tma = _tma_operands(a, b, kw) if cfg.kwargs.get("TMA") else None
        if tma is None:
            _matmul_fixed[grid](*args, **flags, **kw, NUM_SMS=nsm, **launch)
        else:
            c_out, z_out = c, args[4]  # C, and Z if used, by TMA where both allow it
            if cfg.kwargs.get("TMA_STORE", True):
                moved = (c, z) if store_z or grad_act else (c,)
                descs = [_tma_halves(t, kw) for t in moved]
                if None not in descs:
                    c_out, z_out = descs if len(descs) == 2 else (descs[0], z_out)
            _matmul_fixed[grid](*tma[:2], c_out, args[3], z_out, *args[5:], **flags, TMA=True,
                                A_T=tma[2], B_T=tma[3], C_TMA=c_out is not c, **kw, NUM_SMS=nsm,
                                **launch)
    return c


def _default_config(a, b, c):
    """The config that config=None stands for: FP32_CONFIG for fp32, TMA_CONFIG for large problems
    on Hopper (_tma_default), else None (autotune on a GPU; INTERPRETER_CONFIG under the
    interpreter)."""
    if _interpreted():
        return None
    if a.dtype == torch.float32:
        return FP32_CONFIG
    return TMA_CONFIG if _tma_default(a, b, c) else None


def _tma_default(a, b, c) -> bool:
    """config=None on Hopper (and later) with a problem of at least two waves of TMA_CONFIG's
    128 x 256 tiles, and both operands TMA-readable: the fixed TMA config. An H200 sweep at
    8192 x 16384 x 4096 put it ahead of both autotuned pointer configs (benchmarks/bench_ffn)."""
    if torch.cuda.get_device_capability(c.device)[0] < 9:
        return False
    kw = TMA_CONFIG.kwargs
    tiles = cdiv(c.shape[0], kw["BLOCK_M"]) * cdiv(c.shape[1], kw["BLOCK_N"])
    return (tiles >= 2 * _num_programs(c.device, 1 << 30) and _tma_view(a)[0] is not None
            and _tma_view(b)[0] is not None)


def _tma_view(t):
    """(t, False) or (t^T, True), whichever has unit last stride and 16-byte aligned rows (what
    a TMA descriptor reads), or (None, None) if neither."""
    for view, transposed in ((t, False), (t.t(), True)):
        if view.stride(1) == 1 and (view.stride(0) * t.element_size()) % 16 == 0:
            if t.data_ptr() % 16 == 0:
                return view, transposed
    return None, None


def _tma_halves(t, kw):
    """A TMA descriptor of t [M, N] (C or Z) with [BLOCK_M, BLOCK_N / 2] boxes, or None if t's
    rows are not what TMA reads and writes (unit column stride, 16-byte aligned). The epilogue
    moves its tiles in halves (_store_tma, _grad_act_half). Compiled for sm_90 by Triton 3.6 at
    TMA_CONFIG, that takes the training forward (Z and C stored) from 255 registers and 2.6 KB
    of spills a thread with pointer stores to 175 registers and none, and the GELU backward
    epilogue (Z loaded, dZ stored) from 400 B of spills to none; whole-tile staging of Z and C
    needed 240 KiB of shared memory at three stages, past the 227 (docs/posts/06)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    view, transposed = _tma_view(t)
    if view is None or transposed:
        return None
    return TensorDescriptor.from_tensor(t, [kw["BLOCK_M"], kw["BLOCK_N"] // 2])


def _tma_operands(a, b, kw):
    """TMA descriptors of a [M, K] and b [K, N] read as stored (row-major) or transposed
    (column-major), and whether each is transposed; None if one of them is not TMA-readable."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    a_view, a_t = _tma_view(a)
    b_view, b_t = _tma_view(b)
    if a_view is None or b_view is None:
        return None
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    a_desc = TensorDescriptor.from_tensor(a_view, [bk, bm] if a_t else [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b_view, [bn, bk] if b_t else [bk, bn])
    return a_desc, b_desc, a_t, b_t


# --8<-- [end:matmul_launcher]


def _check_layer(weight, bias, like, k, k_from, *, names=("weight", "bias"), out_rows=1):
    """weight [out_rows * N, k] and bias [out_rows * N] or None, in like's dtype and on its
    device; k_from says where k comes from, and names are the arguments as the caller named them.
    The bias must be contiguous: the kernels read it at unit stride."""
    wn, bn = names
    check_tensor(wn, weight, dtypes=(like.dtype,), ndim=2, device=like.device)
    if weight.shape[1] != k:
        raise ValueError(
            f"{wn} has shape {tuple(weight.shape)}, but {k_from}: "
            f"{wn} must be [N, K] with K = {k} (nn.Linear's layout)"
        )
    if weight.shape[0] % out_rows:
        raise ValueError(
            f"{wn} has shape {tuple(weight.shape)}: the gated layer needs an even "
            "number of rows, [W_gate; W_up]"
        )
    if bias is not None:
        check_tensor(bn, bias, dtypes=(like.dtype,), ndim=1, contiguous=True, device=like.device)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"{bn} has shape {tuple(bias.shape)}, expected ({weight.shape[0]},) "
                f"to match {wn}'s rows"
            )
    _check_offsets(wn, weight)


def _check_linear(x, weight, bias, out_rows: int = 1, *, names=("input", "weight", "bias")):
    """x [M, K], weight [out_rows * N, K], bias [out_rows * N] or None, one dtype and device."""
    xn, wn, bn = names
    check_tensor(xn, x, dtypes=SUPPORTED, ndim=2)
    check_kernel_device(xn, x, _matmul_kernel)
    _check_layer(weight, bias, x, x.shape[1], f"{xn} has shape {tuple(x.shape)}",
                 names=(wn, bn), out_rows=out_rows)
    _check_offsets(xn, x)
    _check_span("the output", (x.shape[0], weight.shape[0]))


# --8<-- [start:forward_launchers]
def _linear_act_forward(x, weight, bias=None, activation="gelu", *, store_z=False, config=None):
    """Forward of one fused layer: ``y = sigma(x W^T + b)``, and ``z = x W^T + b`` if store_z.

    x [M, K] (any strides), weight [N, K], bias [N] contiguous or None, one dtype (bf16, fp16,
    fp32: fp32 goes through tf32 in ``tl.dot`` on a GPU) and device. config: a ``triton.Config``
    or None (``use_config``'s, else autotune on a GPU, a small fixed config under the
    interpreter). Returns (y [M, N], z [M, N] or None; None also for activation "none").
    """
    act = _act_code(activation)
    _check_linear(x, weight, bias)
    _check_config(config)
    config = config or _CONFIG[0]
    M, N = x.shape[0], weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    z = torch.empty_like(y) if store_z and act else None
    if y.numel():
        _matmul(x, weight.t(), y, bias=bias, z=z, act=act, store_z=z is not None, config=config)
    return y, z


def _linear_swiglu_forward(x, weight, bias=None, *, store_z=False, config=None):
    """Forward of the gated layer: ``h = silu(x W_gate^T + b_gate) * (x W_up^T + b_up)``.

    x [M, K], weight [2H, K] = [W_gate; W_up], bias [2H] or None. Returns (h [M, H],
    z = [z_gate, z_up] [M, 2H] or None).
    """
    _check_linear(x, weight, bias, out_rows=2)
    _check_config(config)
    config = config or _CONFIG[0]
    M, K = x.shape
    H = weight.shape[0] // 2
    h = torch.empty((M, H), device=x.device, dtype=x.dtype)
    z = torch.empty((M, 2 * H), device=x.device, dtype=x.dtype) if store_z else None
    if h.numel():
        args = (
            x,
            weight,
            h if bias is None else bias,
            h,
            h if z is None else z,
            M,
            H,
            K,
            x.stride(0),
            x.stride(1),
            weight.stride(0),
            weight.stride(1),
            h.stride(0),
            0 if z is None else z.stride(0),
        )
        flags = dict(HAS_BIAS=bias is not None, STORE_Z=z is not None, DOT_FP32=_dot_fp32(x))
        nsm = _num_programs(x.device, 1 << 30)
        if config is None and x.dtype == torch.float32 and not _interpreted():
            config = FP32_CONFIG
        if config is None and not _interpreted():

            def grid(meta):
                return (
                    _num_programs(
                        x.device, cdiv(M, meta["BLOCK_M"]) * cdiv(H, meta["BLOCK_N"])
                    ),
                )

            _swiglu_tuned[grid](*args, **flags, NUM_SMS=nsm)
        else:
            cfg = config or INTERPRETER_CONFIG
            kw = cfg.kwargs
            tiles = cdiv(M, kw["BLOCK_M"]) * cdiv(H, kw["BLOCK_N"])
            _swiglu_fixed[(_num_programs(x.device, tiles),)](
                *args,
                **flags,
                **kw,
                NUM_SMS=nsm,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
    return h, z


# --8<-- [end:forward_launchers]


# --8<-- [start:backward_launchers]
def _act_backward(dy, z, activation="gelu", *, gated=False, want_dz=True, want_db=False):
    """``dZ = dY * sigma'(Z)`` (or the SwiGLU rule if gated) and ``db = sum_rows dZ`` in one pass.

    dy [M, N] contiguous; z [M, N] (or [M, 2N] = [z_gate, z_up] if gated) contiguous, dy's
    dtype, ignored (may be None) for activation "none". Returns (dz like z, or None if not
    want_dz; for "none" dz is dy itself; db [N] / [2N] in dy's dtype, summed in fp32, or None).
    """
    act = 4 if gated else _act_code(activation)
    check_tensor("dy", dy, dtypes=SUPPORTED, ndim=2, contiguous=True)
    check_kernel_device("dy", dy, _act_backward_kernel)
    M, N = dy.shape
    nz = 2 * N if gated else N
    if act:
        check_tensor("z", z, dtypes=(dy.dtype,), ndim=2, contiguous=True, device=dy.device)
        if tuple(z.shape) != (M, nz):
            raise ValueError(f"z has shape {tuple(z.shape)}, expected {(M, nz)}")
    write_dz = want_dz and (act != 0 or gated)
    dz = torch.empty((M, nz), device=dy.device, dtype=dy.dtype) if write_dz else None
    db = torch.zeros(nz, device=dy.device, dtype=torch.float32) if want_db else None
    if dy.numel() and (write_dz or want_db):
        BLOCK_M, BLOCK_N = 64, 64
        grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
        _act_backward_kernel[grid](
            dy,
            dy if z is None else z,
            dy if dz is None else dz,
            dy if db is None else db,
            M,
            N,
            ACT=act,
            GATED=gated,
            WRITE_DZ=write_dz,
            ACC_DB=want_db,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            num_warps=4,
        )
    if want_dz and not write_dz:
        dz = dy
    return dz, (None if db is None else db.to(dy.dtype))


def _linear_backward(dz, x, weight, *, want_dx=True, want_dw=True, config=None):
    """``dX = dZ W`` [M, K] and ``dW = dZ^T X`` [N, K] by the same kernel, strides swapped.

    dz [M, N], x [M, K] and weight [N, K], one dtype and device, any strides.
    """
    _check_linear(x, weight, None)
    _check_config(config)
    config = config or _CONFIG[0]
    M, K = x.shape
    N = weight.shape[0]
    check_tensor("dz", dz, dtypes=(x.dtype,), ndim=2, device=x.device)
    if tuple(dz.shape) != (M, N):
        raise ValueError(
            f"dz has shape {tuple(dz.shape)}, expected {(M, N)} (input's rows, weight's rows)"
        )
    _check_offsets("dz", dz)
    for name, shape in (("dx", (M, K)), ("dw", (N, K))):
        _check_span(name, shape)
    dx = dw = None
    if want_dx:
        dx = torch.empty((M, K), device=x.device, dtype=x.dtype)
        if dx.numel():
            _matmul(dz, weight, dx, config=config)
    if want_dw:
        dw = torch.empty((N, K), device=x.device, dtype=x.dtype)
        if dw.numel():
            _matmul(dz.t(), x, dw, config=config)
    return dx, dw


def _hidden_backward(dy, w2, z1, activation, *, want_db=False, config=None):
    """The FFN's ``dZ1 = (dY W2) * sigma'(Z1)`` and ``db1 = sum_rows dZ1``, both in the epilogue
    of one matmul. dy [M, d] contiguous, w2 [d, h], z1 [M, h] contiguous. Returns (dz1, db1 in
    dy's dtype or None)."""
    act = _act_code(activation)
    config = config or _CONFIG[0]
    db = torch.zeros(w2.shape[1], device=dy.device, dtype=torch.float32) if want_db else None
    dz1 = torch.empty(z1.shape, device=dy.device, dtype=dy.dtype)
    if dz1.numel():
        _matmul(dy, w2, dz1, z=z1, db=db, act=act, grad_act=True, config=config)
    return dz1, (None if db is None else db.to(dy.dtype))


# --8<-- [end:backward_launchers]


# --8<-- [start:ops]
# The custom operators (torch.library): what torch.compile, FakeTensorMode and opcheck see. An
# op may not return None or an alias of an input, so an output it was not asked for is an empty
# tensor (_none), which the callers turn back into None.
def _none(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _or_none(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None or (t.ndim == 1 and t.shape[0] == 0) else t


@torch.library.custom_op("kernelnotes::linear_act", mutates_args=())
def _linear_act_op(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str,
    store_z: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z): z = input weight^T + bias if store_z and the activation is not "none", else
    empty."""
    y, z = _linear_act_forward(input, weight, bias, activation, store_z=store_z)
    return y, (_none(y) if z is None else z)


@_linear_act_op.register_fake
def _(input, weight, bias, activation, store_z):
    y = input.new_empty((input.shape[0], weight.shape[0]))
    return y, (y.new_empty(y.shape) if store_z and activation != "none" else _none(y))


@torch.library.custom_op("kernelnotes::linear_swiglu", mutates_args=())
def _linear_swiglu_op(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, store_z: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, z): z = [z_gate, z_up] if store_z, else empty."""
    h, z = _linear_swiglu_forward(input, weight, bias, store_z=store_z)
    return h, (_none(h) if z is None else z)


@_linear_swiglu_op.register_fake
def _(input, weight, bias, store_z):
    h = input.new_empty((input.shape[0], weight.shape[0] // 2))
    return h, (h.new_empty((input.shape[0], weight.shape[0])) if store_z else _none(h))


@torch.library.custom_op("kernelnotes::ffn", mutates_args=())
def _ffn_op(
    input: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor,
    b2: torch.Tensor | None, activation: str, save: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, a1, z1): a1 = sigma(z1) and z1 kept for the backward pass if save (z1 empty for
    "none"), else empty."""
    a1, z1 = _linear_act_forward(input, w1, b1, activation, store_z=save)
    y, _ = _linear_act_forward(a1, w2, b2, "none")
    if not save:
        return y, _none(y), _none(y)
    return y, a1, (_none(y) if z1 is None else z1)


@_ffn_op.register_fake
def _(input, w1, b1, w2, b2, activation, save):
    y = input.new_empty((input.shape[0], w2.shape[0]))
    if not save:
        return y, _none(y), _none(y)
    a1 = input.new_empty((input.shape[0], w1.shape[0]))
    return y, a1, (a1.new_empty(a1.shape) if activation != "none" else _none(y))


@torch.library.custom_op("kernelnotes::ffn_act_backward", mutates_args=())
def _act_backward_op(
    grad_output: torch.Tensor, z: torch.Tensor | None, activation: str, gated: bool,
    want_dz: bool, want_db: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dZ = dY sigma'(Z) or empty, db = column sums of dZ or empty); "none" writes no dZ."""
    dz, db = _act_backward(grad_output, z, activation, gated=gated,
                           want_dz=want_dz and (gated or activation != "none"), want_db=want_db)
    return (_none(grad_output) if dz is None else dz), (_none(grad_output) if db is None else db)


@_act_backward_op.register_fake
def _(grad_output, z, activation, gated, want_dz, want_db):
    n = grad_output.shape[1] * (2 if gated else 1)
    dz = grad_output.new_empty((grad_output.shape[0], n))
    return (dz if want_dz and (gated or activation != "none") else _none(grad_output),
            grad_output.new_empty(n) if want_db else _none(grad_output))


@torch.library.custom_op("kernelnotes::ffn_linear_backward", mutates_args=())
def _linear_backward_op(
    grad: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, want_dx: bool, want_dw: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX = dZ W or empty, dW = dZ^T X or empty)."""
    dx, dw = _linear_backward(grad, input, weight, want_dx=want_dx, want_dw=want_dw)
    return (_none(grad) if dx is None else dx), (_none(grad) if dw is None else dw)


@_linear_backward_op.register_fake
def _(grad, input, weight, want_dx, want_dw):
    return (input.new_empty(input.shape) if want_dx else _none(grad),
            weight.new_empty(weight.shape) if want_dw else _none(grad))


@torch.library.custom_op("kernelnotes::ffn_hidden_backward", mutates_args=())
def _hidden_backward_op(
    grad_output: torch.Tensor, w2: torch.Tensor, z1: torch.Tensor, activation: str, want_db: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dZ1 = (dY W2) sigma'(Z1), db1 = column sums of dZ1 or empty), in one matmul."""
    dz1, db1 = _hidden_backward(grad_output, w2, z1, activation, want_db=want_db)
    return dz1, (_none(dz1) if db1 is None else db1)


@_hidden_backward_op.register_fake
def _(grad_output, w2, z1, activation, want_db):
    return z1.new_empty(z1.shape), (z1.new_empty(z1.shape[1]) if want_db else _none(z1))


# --8<-- [end:ops]


# --8<-- [start:autograd]
def _dz_db(dy, z, activation, gated, need_db):
    """dZ (dY itself for "none") and db (or None) through the ffn_act_backward op."""
    plain = activation == "none" and not gated
    if plain and not need_db:
        return dy, None
    dz, db = torch.ops.kernelnotes.ffn_act_backward(dy, z, activation, gated, not plain, need_db)
    return (dy if plain else dz), _or_none(db)


def _linear_grads(dz, x, weight, need_x, need_w):
    if not (need_x or need_w):
        return None, None
    dx, dw = torch.ops.kernelnotes.ffn_linear_backward(dz, x, weight, need_x, need_w)
    return (dx if need_x else None), (dw if need_w else None)


def _no_z(op: str):
    return RuntimeError(f"kernelnotes::{op}: the backward pass needs the forward's saved "
                        "pre-activation: call it with store_z=True / save=True (the public "
                        "functions do so when an input requires grad)")


def _linear_act_setup(ctx, inputs, output):
    x, weight, bias, activation, store_z = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.activation, ctx.has_bias, ctx.store_z = activation, bias is not None, store_z


def _linear_act_backward(ctx, dy, _dz):
    """y = sigma(x W^T + b): dZ = dY sigma'(Z), dX = dZ W, dW = dZ^T X, db = sum_rows dZ."""
    x, weight, z = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if ctx.activation != "none" and not ctx.store_z:
        raise _no_z("linear_act")
    dz, db = _dz_db(dy.contiguous(), _or_none(z), ctx.activation, False, need_b and ctx.has_bias)
    dx, dw = _linear_grads(dz, x, weight, need_x, need_w)
    return dx, dw, db, None, None


_linear_act_op.register_autograd(_linear_act_backward, setup_context=_linear_act_setup)


def _swiglu_setup(ctx, inputs, output):
    x, weight, bias, store_z = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.has_bias, ctx.store_z = bias is not None, store_z


def _swiglu_backward(ctx, dh, _dz):
    """h = silu(z_g) * z_u with [z_g, z_u] = x W^T + b: dz_g = dh z_u silu'(z_g),
    dz_u = dh silu(z_g), then as a linear layer."""
    x, weight, z = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if not ctx.store_z:
        raise _no_z("linear_swiglu")
    dz, db = _dz_db(dh.contiguous(), z, "silu", True, need_b and ctx.has_bias)
    dx, dw = _linear_grads(dz, x, weight, need_x, need_w)
    return dx, dw, db, None


_linear_swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


def _ffn_setup(ctx, inputs, output):
    x, w1, b1, w2, b2, activation, save = inputs
    _, a1, z1 = output
    ctx.save_for_backward(x, w1, w2, a1, z1)
    ctx.activation, ctx.save = activation, save
    ctx.has_b1, ctx.has_b2 = b1 is not None, b2 is not None


def _ffn_backward(ctx, dy, _a1, _z1):
    """y = sigma(x W1^T + b1) W2^T + b2, with sigma'(Z1) fused into the epilogue of dA1 = dY W2."""
    x, w1, w2, a1, z1 = ctx.saved_tensors
    need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
    if not ctx.save:
        raise _no_z("ffn")
    dy = dy.contiguous()
    db2 = _dz_db(dy, None, "none", False, True)[1] if need_b2 and ctx.has_b2 else None
    dw2 = _linear_grads(dy, a1, w2, False, need_w2)[1]
    # dZ1 = (dY W2) * sigma'(Z1) and db1 = sum_rows dZ1, in the epilogue of one matmul ("none":
    # sigma' = 1, and a1 stands in for the Z1 the kernel does not read)
    z = a1 if ctx.activation == "none" else z1
    need_db1 = bool(need_b1 and ctx.has_b1)
    dz1, db1 = torch.ops.kernelnotes.ffn_hidden_backward(dy, w2, z, ctx.activation, need_db1)
    dx, dw1 = _linear_grads(dz1, x, w1, need_x, need_w1)
    return dx, dw1, _or_none(db1) if need_db1 else None, dw2, db2, None, None


_ffn_op.register_autograd(_ffn_backward, setup_context=_ffn_setup)
# --8<-- [end:autograd]


# --8<-- [start:public]
_CONFIG: list = [None]  # use_config's


@contextlib.contextmanager
def use_config(config: triton.Config | None) -> Iterator[None]:
    """Run every kernel launched inside the ``with`` block with one fixed ``triton.Config``.

    The ops choose their tiles themselves (``TMA_CONFIG`` for large problems on Hopper, else
    autotuning over ``MATMUL_CONFIGS``; a small fixed config under the interpreter). Benchmarks
    and tests that time or check one config ask for it here.

    Args:
        config: a ``triton.Config`` setting BLOCK_M, BLOCK_N, BLOCK_K and GROUP_M (and optionally
            TMA, FLATTEN, TMA_STORE), or None for the default choice.

    Raises:
        TypeError: config is not a ``triton.Config`` or None.
        ValueError: it lacks one of the four tile sizes.
    """
    _check_config(config)
    before, _CONFIG[0] = _CONFIG[0], config
    try:
        yield
    finally:
        _CONFIG[0] = before


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _rows(name: str, t: torch.Tensor, k: int) -> torch.Tensor:
    """t [*, k] as a matrix [prod(*), k] (as F.linear flattens its leading dimensions)."""
    if t.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension, got a 0-dimensional tensor")
    return t.reshape(math.prod(t.shape[:-1]), k)


def _check_input(name: str, t, weight_name: str, weight, bias_name: str, bias, out_rows: int = 1):
    """Shape, dtype and device checks that also hold on fake tensors and under Dynamo."""
    check_tensor(name, t, dtypes=SUPPORTED)
    if t.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension, got a 0-dimensional tensor")
    check_tensor(weight_name, weight)
    if bias is not None:
        check_tensor(bias_name, bias)
        bias = bias.contiguous()  # the kernels read it at unit stride
    _check_layer(weight, bias, t, t.shape[-1], f"{name} has shape {tuple(t.shape)}",
                 names=(weight_name, bias_name), out_rows=out_rows)
    return bias


def linear_act(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "gelu",
) -> torch.Tensor:
    """``activation(F.linear(input, weight, bias))`` in one kernel: ``sigma(x W^T + b)``.

    Differentiable (dZ = dY sigma'(Z), dX = dZ W, dW = dZ^T X, db = column sums of dZ), and a
    ``torch.library`` custom op (``torch.ops.kernelnotes.linear_act``), so it runs under
    ``torch.compile(fullgraph=True)`` and ``FakeTensorMode``.

    Args:
        input: [*, K] bfloat16, float16 or float32 (fp32 goes through tf32 in ``tl.dot`` on a
            GPU), any strides. CUDA tensor (CPU under the Triton interpreter).
        weight: [N, K] as ``nn.Linear`` stores it, input's dtype and device, any strides.
        bias: [N] or None, input's dtype and device.
        activation: one of ``ACTIVATIONS``: "relu", "gelu" (erf form, as ``F.gelu``; Hendrycks
            & Gimpel 2016, arXiv:1606.08415), "gelu_tanh" (``F.gelu(approximate="tanh")``),
            "silu" (Elfwing et al. 2017, arXiv:1702.03118) or "none".

    Returns:
        [*, N] in input's dtype. NaN and inf propagate as in torch.

    Raises:
        TypeError: a tensor argument is not a tensor, or has an unsupported or another dtype;
            activation is not a string.
        ValueError: 0-dimensional input, shapes that do not fit, tensors on another device (or
            on a GPU under the interpreter), an unknown activation, more than 2^31 - 1 elements.
    """
    _act_code(activation)
    bias = _check_input("input", input, "weight", weight, "bias", bias)
    lead, k = input.shape[:-1], input.shape[-1]
    store = _needs_grad(input, weight, bias) and activation != "none"
    y, _ = _linear_act_op(_rows("input", input, k), weight, bias, activation, store)
    return y.reshape(*lead, weight.shape[0])


def linear_swiglu(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The gated layer ``silu(x W_gate^T + b_gate) * (x W_up^T + b_up)`` in one kernel.

    SwiGLU (Shazeer 2020, arXiv:2002.05202) with both projections in one weight, as fused
    implementations keep them; one read of each input tile feeds both products. Differentiable,
    and a custom op (``torch.ops.kernelnotes.linear_swiglu``).

    Args:
        input: [*, K] bfloat16, float16 or float32, any strides.
        weight: [2H, K] = [W_gate; W_up] (rows 0..H-1 gate, H..2H-1 up), input's dtype and device.
        bias: [2H] = [b_gate; b_up] or None.

    Returns:
        [*, H] in input's dtype.

    Raises:
        TypeError: as ``linear_act``.
        ValueError: as ``linear_act``, and a weight with an odd number of rows.
    """
    bias = _check_input("input", input, "weight", weight, "bias", bias, out_rows=2)
    lead, k = input.shape[:-1], input.shape[-1]
    h, _ = _linear_swiglu_op(_rows("input", input, k), weight, bias,
                             _needs_grad(input, weight, bias))
    return h.reshape(*lead, weight.shape[0] // 2)


def ffn(
    input: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    activation: str = "gelu",
) -> torch.Tensor:
    """The two-layer FFN ``F.linear(activation(F.linear(input, w1, b1)), w2, b2)``.

    The first layer's activation is fused into its matmul; in the backward pass sigma'(Z1) and
    db1 are fused into the epilogue of dA1 = dY W2 (docs/posts/06-backprop.md). A custom op
    (``torch.ops.kernelnotes.ffn``), differentiable in every tensor.

    Args:
        input: [*, d] bfloat16, float16 or float32.
        w1: [h, d], b1: [h] or None: the first layer (``nn.Linear(d, h)``'s layout).
        w2: [d_out, h], b2: [d_out] or None: the second layer.
        activation: one of ``ACTIVATIONS``.

    Returns:
        [*, d_out] in input's dtype.

    Raises:
        TypeError: as ``linear_act``.
        ValueError: as ``linear_act``; errors name the argument (w1, b1, w2, b2).
    """
    _act_code(activation)
    b1 = _check_input("input", input, "w1", w1, "b1", b1)
    check_tensor("w2", w2)
    if b2 is not None:
        check_tensor("b2", b2)
        b2 = b2.contiguous()
    _check_layer(w2, b2, input, w1.shape[0], f"w1 has shape {tuple(w1.shape)}", names=("w2", "b2"))
    lead, k = input.shape[:-1], input.shape[-1]
    save = _needs_grad(input, w1, b1, w2, b2)
    y, _, _ = _ffn_op(_rows("input", input, k), w1, b1, w2, b2, activation, save)
    return y.reshape(*lead, w2.shape[0])


class FeedForward(torch.nn.Module):
    """The transformer FFN on the fused kernels: ``W2 sigma(W1 x + b1) + b2``, or gated (SwiGLU).

    Args:
        d_model: input and output width d (an int >= 1).
        d_hidden: hidden width h (an int >= 1).
        activation: one of ``ACTIVATIONS`` (ignored when gated: SwiGLU uses silu).
        gated: ``W2 (silu(W_gate x) * (W_up x))`` (Shazeer 2020) with ``w_gate_up`` [2h, d].
        bias: whether the layers have biases.
        device, dtype: of the parameters, as in ``nn.Linear``.

    Parameters (``nn.Linear`` layout and initialization, U(-1/sqrt(fan_in), 1/sqrt(fan_in))):
        w1 [h, d] / b1 [h], or w_gate_up [2h, d] / b_gate_up [2h] when gated; w2 [d, h], b2 [d].

    Raises:
        TypeError: d_model or d_hidden not an int, gated or bias not a bool, activation not a
            string.
        ValueError: a width below 1, an unknown activation.

    Example:
        >>> ffn = FeedForward(64, 256, "gelu", device="cuda", dtype=torch.bfloat16)
        >>> y = ffn(torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16))  # [8, 128, 64]
    """

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        activation: str = "gelu",
        *,
        gated: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("d_hidden", d_hidden)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in (("gated", gated), ("bias", bias)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        _act_code(activation)
        self.activation, self.gated = activation, gated
        kw = dict(device=device, dtype=dtype)
        rows = 2 * d_hidden if gated else d_hidden
        w_in = torch.nn.Parameter(torch.empty(rows, d_model, **kw))
        b_in = torch.nn.Parameter(torch.empty(rows, **kw)) if bias else None
        self.w2 = torch.nn.Parameter(torch.empty(d_model, d_hidden, **kw))
        self.b2 = torch.nn.Parameter(torch.empty(d_model, **kw)) if bias else None
        if gated:
            self.w_gate_up, self.b_gate_up = w_in, b_in
        else:
            self.w1, self.b1 = w_in, b_in
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for each tensor."""
        for w, b in self._layers():
            bound = 1.0 / math.sqrt(w.shape[1])
            torch.nn.init.uniform_(w, -bound, bound)
            if b is not None:
                torch.nn.init.uniform_(b, -bound, bound)

    def _layers(self):
        first = (self.w_gate_up, self.b_gate_up) if self.gated else (self.w1, self.b1)
        return [first, (self.w2, self.b2)]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """input [*, d_model] in the parameters' dtype and device -> [*, d_model]."""
        check_tensor("input", input)
        d = self.w2.shape[0]
        if input.ndim == 0 or input.shape[-1] != d:
            raise ValueError(f"input has shape {tuple(input.shape)}: its last dimension must be "
                             f"d_model = {d}")
        if self.gated:
            h = linear_swiglu(input, self.w_gate_up, self.b_gate_up)
            return linear_act(h, self.w2, self.b2, "none")
        return ffn(input, self.w1, self.b1, self.w2, self.b2, self.activation)


# --8<-- [end:public]
