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

import math

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


def _check_offsets(name: str, t: torch.Tensor) -> None:
    """The kernels index with int32: every element's offset must fit."""
    reach = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True) if s > 0)
    if reach > _INT32_MAX:
        raise ValueError(f"{name} of shape {tuple(t.shape)} spans more than 2^31 - 1 elements")


def _act_code(activation: str) -> int:
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


def _check_linear(x, weight, bias, out_rows: int = 1, *, names=("x", "weight", "bias")):
    """x [M, K], weight [out_rows * N, K], bias [out_rows * N] or None, one dtype and device."""
    xn, wn, bn = names
    check_tensor(xn, x, dtypes=SUPPORTED, ndim=2)
    check_kernel_device(xn, x, _matmul_kernel)
    _check_layer(weight, bias, x, x.shape[1], f"{xn} has shape {tuple(x.shape)}",
                 names=(wn, bn), out_rows=out_rows)
    _check_offsets(xn, x)
    _check_offsets("the output", torch.empty((x.shape[0], weight.shape[0]), device="meta"))


# --8<-- [start:forward_launchers]
def linear_act_forward(x, weight, bias=None, activation="gelu", *, store_z=False, config=None):
    """Forward of one fused layer: ``y = sigma(x W^T + b)`` (and ``z = x W^T + b`` if store_z).

    Args:
        x: [M, K] bfloat16 / float16 / float32 (fp32 goes through tf32 in ``tl.dot``).
            CUDA tensor (CPU tensor under the Triton interpreter). Any strides.
        weight: [N, K] as ``nn.Linear`` stores it, x's dtype and device.
        bias: [N], contiguous, or None.
        activation: one of ``ACTIVATIONS``: "relu", "gelu" (erf form, Hendrycks & Gimpel 2016,
            arXiv:1606.08415), "gelu_tanh" (its tanh approximation), "silu" (Elfwing et al. 2017,
            arXiv:1702.03118) or "none".
        store_z: also return the pre-activation ``z`` (kept for the backward pass).
        config: a ``triton.Config`` with BLOCK_M/N/K and GROUP_M, or None to autotune over
            ``MATMUL_CONFIGS`` on a GPU (a small fixed config under the interpreter).
    Returns:
        (y, z): y [M, N] in x's dtype; z [M, N] or None.
    """
    act = _act_code(activation)
    _check_linear(x, weight, bias)
    _check_config(config)
    M, N = x.shape[0], weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    z = torch.empty_like(y) if store_z and act else None
    if y.numel():
        _matmul(x, weight.t(), y, bias=bias, z=z, act=act, store_z=z is not None, config=config)
    return y, (y if store_z and not act else z)


def linear_swiglu_forward(x, weight, bias=None, *, store_z=False, config=None):
    """Forward of the gated layer: ``h = silu(x W_gate^T + b_gate) * (x W_up^T + b_up)``.

    SwiGLU (Shazeer 2020, arXiv:2002.05202) with both projections in one weight, as fused
    implementations keep them.

    Args:
        x: [M, K] bfloat16 / float16 / float32 (tf32), CUDA (CPU under the interpreter).
        weight: [2H, K] = [W_gate; W_up] (rows 0..H-1 gate, H..2H-1 up), x's dtype.
        bias: [2H] = [b_gate; b_up], contiguous, or None.
        store_z: also return ``z = [z_gate, z_up]`` [M, 2H] for the backward pass.
        config: a ``triton.Config`` or None (autotune over ``SWIGLU_CONFIGS`` on a GPU).
    Returns:
        (h, z): h [M, H] in x's dtype; z [M, 2H] or None.
    """
    _check_linear(x, weight, bias, out_rows=2)
    _check_config(config)
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
def act_backward(dy, z, activation="gelu", *, gated=False, want_dz=True, want_db=False):
    """``dZ = dY * sigma'(Z)`` (or the SwiGLU rule if gated) and ``db = sum_rows dZ`` in one pass.

    Args:
        dy: [M, N] contiguous, the gradient of the layer's output.
        z: [M, N] (or [M, 2N] = [z_gate, z_up] if gated) contiguous pre-activation, dy's dtype;
            ignored for activation "none".
        activation: as in ``linear_act_forward``; "silu" is implied when gated.
        want_dz: write dZ (for "none", dZ is dy itself and is returned without a copy).
        want_db: also return db in dy's dtype (summed in fp32).
    Returns:
        (dz, db): dz like z (or None), db [N] / [2N] (or None).
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


def linear_backward(dz, x, weight, *, want_dx=True, want_dw=True, config=None):
    """``dX = dZ W`` [M, K] and ``dW = dZ^T X`` [N, K] by the same kernel, strides swapped.

    Args: dz [M, N], x [M, K] and weight [N, K], one dtype and device, any strides.
    """
    _check_linear(x, weight, None)
    _check_config(config)
    M, K = x.shape
    N = weight.shape[0]
    check_tensor("dz", dz, dtypes=(x.dtype,), ndim=2, device=x.device)
    if tuple(dz.shape) != (M, N):
        raise ValueError(
            f"dz has shape {tuple(dz.shape)}, expected {(M, N)} (x's rows, weight's rows)"
        )
    _check_offsets("dz", dz)
    for name, shape in (("dx", (M, K)), ("dw", (N, K))):
        _check_offsets(name, torch.empty(shape, device="meta"))
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


# --8<-- [end:backward_launchers]


# --8<-- [start:autograd]
class LinearActFunction(torch.autograd.Function):
    """y = sigma(x W^T + b); backward: dZ = dY sigma'(Z), dX = dZ W, dW = dZ^T X, db = sum dZ."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, config):
        y, z = linear_act_forward(x, weight, bias, activation, store_z=True, config=config)
        ctx.save_for_backward(x, weight, None if activation == "none" else z)
        ctx.activation, ctx.config, ctx.has_bias = activation, config, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, z = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dz, db = act_backward(dy.contiguous(), z, ctx.activation, want_db=need_b and ctx.has_bias)
        dx, dw = linear_backward(dz, x, weight, want_dx=need_x, want_dw=need_w, config=ctx.config)
        return dx, dw, db, None, None


class SwiGLUFunction(torch.autograd.Function):
    """h = silu(z_g) * z_u with [z_g, z_u] = x W^T + b; backward through dZ = [dz_g, dz_u]."""

    @staticmethod
    def forward(ctx, x, weight, bias, config):
        h, z = linear_swiglu_forward(x, weight, bias, store_z=True, config=config)
        ctx.save_for_backward(x, weight, z)
        ctx.config, ctx.has_bias = config, bias is not None
        return h

    @staticmethod
    def backward(ctx, dh):
        x, weight, z = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dz, db = act_backward(dh.contiguous(), z, gated=True, want_db=need_b and ctx.has_bias)
        dx, dw = linear_backward(dz, x, weight, want_dx=need_x, want_dw=need_w, config=ctx.config)
        return dx, dw, db, None


class FFNFunction(torch.autograd.Function):
    """y = sigma(x W1^T + b1) W2^T + b2 with sigma'(Z1) fused into the epilogue of dA1 = dY W2."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, activation, config):
        a1, z1 = linear_act_forward(x, w1, b1, activation, store_z=True, config=config)
        y, _ = linear_act_forward(a1, w2, b2, "none", config=config)
        ctx.save_for_backward(x, w1, w2, z1, a1)
        ctx.activation, ctx.config = activation, config
        ctx.has_b1, ctx.has_b2 = b1 is not None, b2 is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2, z1, a1 = ctx.saved_tensors
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        dy = dy.contiguous()
        cfg, act = ctx.config, _act_code(ctx.activation)
        db2 = None
        if need_b2 and ctx.has_b2:
            db2 = act_backward(dy, None, "none", want_dz=False, want_db=True)[1]
        dw2 = _matmul(dy.t(), a1, x.new_empty(w2.shape), config=cfg) if need_w2 else None
        # dZ1 = (dY W2) * sigma'(Z1) and db1 = sum_rows dZ1, in the epilogue of one matmul
        db1 = None
        if need_b1 and ctx.has_b1:
            db1 = torch.zeros(w1.shape[0], device=x.device, dtype=torch.float32)
        dz1 = _matmul(
            dy, w2, x.new_empty(z1.shape), z=z1, db=db1, act=act, grad_act=True, config=cfg
        )
        dx, dw1 = linear_backward(dz1, x, w1, want_dx=need_x, want_dw=need_w1, config=cfg)
        return dx, dw1, (None if db1 is None else db1.to(dy.dtype)), dw2, db2, None, None


# --8<-- [end:autograd]


# --8<-- [start:public]
def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear_act(x, weight, bias=None, activation="gelu", *, config=None):
    """``sigma(x W^T + b)`` in one kernel, differentiable (see ``linear_act_forward`` for args)."""
    if _needs_grad(x, weight, bias):
        _act_code(activation)
        return LinearActFunction.apply(x, weight, bias, activation, config)
    return linear_act_forward(x, weight, bias, activation, config=config)[0]


def linear_swiglu(x, weight, bias=None, *, config=None):
    """``silu(x W_gate^T + b_gate) * (x W_up^T + b_up)``, differentiable; W = [W_gate; W_up]."""
    if _needs_grad(x, weight, bias):
        return SwiGLUFunction.apply(x, weight, bias, config)
    return linear_swiglu_forward(x, weight, bias, config=config)[0]


def ffn(x, w1, b1, w2, b2, activation="gelu", *, config=None):
    """Two-layer FFN ``sigma(x W1^T + b1) W2^T + b2``, differentiable, x [M, d]."""
    _act_code(activation)
    _check_linear(x, w1, b1, names=("x", "w1", "b1"))  # errors name the arguments as passed
    _check_layer(w2, b2, x, w1.shape[0], f"w1 has shape {tuple(w1.shape)}", names=("w2", "b2"))
    if _needs_grad(x, w1, b1, w2, b2):
        return FFNFunction.apply(x, w1, b1, w2, b2, activation, config)
    a1, _ = linear_act_forward(x, w1, b1, activation, config=config)
    return linear_act_forward(a1, w2, b2, "none", config=config)[0]


class FeedForward(torch.nn.Module):
    """The transformer FFN on the fused kernels: ``W2 sigma(W1 x + b1) + b2``, or gated (SwiGLU).

    Args:
        d_model: input and output width d.
        d_hidden: hidden width h.
        activation: one of ``ACTIVATIONS`` (ignored when gated: SwiGLU uses silu).
        gated: ``W2 (silu(W_gate x) * (W_up x))`` (Shazeer 2020) with ``w_gate_up`` [2h, d].
        bias: whether the layers have biases.
        config: a fixed ``triton.Config`` for every kernel, or None to autotune on the GPU.

    Parameters (``nn.Linear`` layout and initialization, U(-1/sqrt(fan_in), 1/sqrt(fan_in))):
        w1 [h, d] / b1 [h], or w_gate_up [2h, d] / b_gate_up [2h] when gated; w2 [d, h], b2 [d].

    Example:
        >>> ffn = FeedForward(64, 256, "gelu", device="cuda", dtype=torch.bfloat16)
        >>> y = ffn(torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16))  # [8, 128, 64]
    """

    def __init__(
        self,
        d_model,
        d_hidden,
        activation="gelu",
        *,
        gated=False,
        bias=True,
        config=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        _act_code(activation)
        self.activation, self.gated, self.config = activation, gated, config
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

    def reset_parameters(self):
        for w, b in self._layers():
            bound = 1.0 / math.sqrt(w.shape[1])
            torch.nn.init.uniform_(w, -bound, bound)
            if b is not None:
                torch.nn.init.uniform_(b, -bound, bound)

    def _layers(self):
        first = (self.w_gate_up, self.b_gate_up) if self.gated else (self.w1, self.b1)
        return [first, (self.w2, self.b2)]

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.gated:
            h = linear_swiglu(x2, self.w_gate_up, self.b_gate_up, config=self.config)
            y = linear_act(h, self.w2, self.b2, "none", config=self.config)
        else:
            y = ffn(x2, self.w1, self.b1, self.w2, self.b2, self.activation, config=self.config)
        return y.reshape(*shape[:-1], y.shape[-1])


# --8<-- [end:public]
