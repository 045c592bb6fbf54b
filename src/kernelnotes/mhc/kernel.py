"""mHC in Triton: the pre step (projection + gates + Sinkhorn + layer input) and the post step.

Order: the jit kernels (split-K projection, big-fuse, post, then the backward's four passes),
the backward's launchers, then the torch-facing launchers ``mhc_pre``, ``mhc_pre_from_mixes``
and ``mhc_post``. The semantics are DeepSeek-V4's
(report eq. 1-7) and the FlashInfer kernels' (``mhc_pre_big_fuse``, ``mhc_post``, PR #3285);
docs/posts/08-mhc-kernel-study.md maps one onto the other. Each public function is a
``kernelnotes::`` torch custom op with a fake implementation and a backward (Triton passes
over the [T, 4, H] tensors and one over the 24 gates a token).
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import check_real, check_tensor, check_tiles, interpreted

N_HC = 4  # streams; the kernels are written for exactly 4
N_MIX = 24  # [pre 0..3 | post 4..7 | comb 8..23], comb[j][k] at slot 8 + 4j + k


# --8<-- [start:round_bf16]
@triton.jit
def _round_bf16(v):
    """fp32 -> the nearest bf16 value (ties to even), still held in fp32; NaN stays NaN.

    Rounding by hand makes both machines agree: the interpreter's fp32->bf16 cast truncates.
    A carry into the exponent gives inf past bf16's largest value, as a cast does. NaN is
    passed as a canonical NaN: the GPU's NaN, 0x7FFFFFFF, would carry into the sign bit and
    come out as -0.0.
    """
    bits = v.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(v != v, float("nan"), bits.to(tl.float32, bitcast=True))
# --8<-- [end:round_bf16]


# --8<-- [start:stream_load]
@triton.jit
def _stream_load(ptrs, mask):
    """bf16 read once, as fp32. A plain load: the hint for data without reuse, evict_first, made
    both streaming kernels slower on the H200, not faster (lab/mhc/NOTES.md)."""
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
# --8<-- [end:stream_load]


# --8<-- [start:split_fn_kernel]
@triton.jit
def _mhc_split_fn_kernel(fn_ptr, w_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """fn (fp32) = hi + lo, two bf16 parts: w[0] = hi, w[1] = lo, each laid out as fn.

    bf16 x bf16 products are exact in the MMA's fp32 accumulator, so a bf16 MMA with both parts
    carries fn to 2^-16 relative, where a TF32 MMA would round it to 2^-11. Split once per call,
    not in every tile of the projection: there it would cost more instructions than the MMAs.
    """
    if PDL:  # the projection may be launched now: it waits in gdc_wait for this whole grid
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(fn_ptr + offs, mask=mask, other=0.0)
    hi = _round_bf16(w)
    finite = tl.abs(w) < float("inf")
    # a finite w past bf16's largest value rounds to inf: truncate it instead (the largest
    # bf16 of its sign), so that lo = w - hi stays finite
    trunc = (w.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)
    hi = tl.where(finite & (tl.abs(hi) == float("inf")), trunc, hi)
    # an inf (or NaN) weight is carried whole by hi; lo = inf - inf would be NaN and turn the
    # mix into NaN where the reference's x * inf saturates the gate
    lo = tl.where(finite, w - hi, 0.0)
    tl.store(w_ptr + offs, hi.to(tl.bfloat16), mask=mask)  # exact: hi is a bf16 value
    tl.store(w_ptr + n + offs, _round_bf16(lo).to(tl.bfloat16), mask=mask)
# --8<-- [end:split_fn_kernel]


# --8<-- [start:project_kernel]
@triton.jit
def _mhc_project_kernel(
    x_ptr,  # *bf16 [T, K]: the residual [T, 4, H] read flat, K = 4H
    w_ptr,  # *bf16 [2, 24, K]: W^fused transposed as hi + lo parts (_mhc_split_fn_kernel)
    dot_ptr,  # *fp32 [S, T, 24] out: partial x @ fn^T of each K-split
    sq_ptr,  # *fp32 [S, T] out: partial sum of x^2 of each K-split
    T, K, K_SPLIT,  # tokens, 4H, K columns per split (a multiple of BLOCK_K)
    BLOCK_T: tl.constexpr,  # tokens per program (the M of the MMA)
    BLOCK_K: tl.constexpr,
    MMA_BF16: tl.constexpr,  # False only under the interpreter (see below)
    PDL: tl.constexpr,  # launched as a programmatic dependent of the split (a GPU only)
):
    if PDL:  # before any read: w is the split's output, the residual the kernel's before it
        gdc_wait()
    pid_s = tl.program_id(0)  # splits fastest: a token block's whole row is read at one time
    pid_t = tl.program_id(1)
    offs_t = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_t = offs_t < T
    # one MMA of N = 64: column c < 32 takes fn's hi part of mix c, column 32 + c its lo part
    # (mixes 24 to 31 are padding); the two halves of the sum are added at the end
    offs_c = tl.arange(0, 64)
    mix, part = offs_c % 32, offs_c // 32
    mask_c = mix < 24
    k_lo = pid_s * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)

    acc = tl.zeros((BLOCK_T, 64), dtype=tl.float32)  # [x fn_hi^T | x fn_lo^T]
    sq = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)  # summed across k once, at the end
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_hi
        x = tl.load(x_ptr + offs_t[:, None] * K + offs_k[None, :],
                    mask=mask_t[:, None] & mask_k[None, :], other=0.0)  # bf16 [BT, BK]
        w = tl.load(w_ptr + (part * 24 + mix)[None, :] * K + offs_k[:, None],
                    mask=mask_k[:, None] & mask_c[None, :], other=0.0)  # bf16 [BK, 64], from L2
        if MMA_BF16:
            # "+ 0.0" makes the sum a register value at every step, so the step waits for its
            # MMA. Left in flight, the MMA reads the residual tile while the step's prefetch
            # overwrites it: Triton's pipeliner (3.6 and 3.9) gives a tile that also feeds
            # registers (the sum of squares below) one shared-memory buffer fewer than fn's
            # tiles (triton-lang/triton#6691). Tested in test_mhc.py, without a GPU.
            acc = tl.dot(x, w, acc) + 0.0
        else:  # Triton 3.9's interpreter multiplies bf16 tensors' raw bits: same values in fp32
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
        xf = x.to(tl.float32)
        sq += xf * xf
    if PDL:  # the big-fuse may be launched now, to wait in its gdc_wait for these stores
        gdc_launch_dependents()

    hi, lo = tl.split(tl.permute(tl.reshape(acc, (BLOCK_T, 2, 32)), (0, 2, 1)))  # [BT, 32] each
    offs_n = tl.arange(0, 32)
    row = pid_s * T + offs_t  # [BT], int64
    tl.store(dot_ptr + row[:, None] * 24 + offs_n[None, :], hi + lo,
             mask=mask_t[:, None] & (offs_n < 24)[None, :])
    tl.store(sq_ptr + row, tl.sum(sq, axis=1), mask=mask_t)
# --8<-- [end:project_kernel]


# --8<-- [start:gate_helpers]
@triton.jit
def _sum_splits(dot_ptr, offs, mask, T, S, S_MAX: tl.constexpr):
    """sum over the S split partials of dot_mix[s, t, slot] at offs = t * 24 + slot.

    Unrolled to S_MAX >= S with masked loads: all S loads are in flight at once, and the
    partials are added in split order (deterministic).
    """
    acc = tl.load(dot_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, S_MAX):
        live = offs * 0 + s < S  # s < S as a full tensor: the interpreter refuses a scalar mask
        acc += tl.load(dot_ptr + s * T * 24 + offs, mask=mask & live, other=0.0)
    return acc


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _pre_gate(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX: tl.constexpr, j: tl.constexpr,
              rstd, scale0, pre_eps):
    """A_l[j] for BLOCK_T tokens: sigmoid(mix_j * alpha_pre + S_j) + eps."""
    m = _sum_splits(dot_ptr, offs_t * 24 + j, mask_t, T, S, S_MAX)
    return _sigmoid(m * rstd * scale0 + tl.load(base_ptr + j)) + pre_eps
# --8<-- [end:gate_helpers]


# --8<-- [start:sinkhorn_kernel]
@triton.jit
def _softmax4(a, b, c, d, eps):
    """softmax of one row of 4 logits, + eps (the start of Sinkhorn)."""
    m = tl.maximum(tl.maximum(a, b), tl.maximum(c, d))
    a, b, c, d = tl.exp(a - m), tl.exp(b - m), tl.exp(c - m), tl.exp(d - m)
    s = a + b + c + d
    return a / s + eps, b / s + eps, c / s + eps, d / s + eps


@triton.jit
def _normalise4(a, b, c, d, eps):
    """One row or column of 4 divided by its sum + eps."""
    s = a + b + c + d + eps
    return a / s, b / s, c / s, d / s


@triton.jit
def _comb_logit(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX: tl.constexpr, slot: tl.constexpr,
                rstd, scale2):
    m = _sum_splits(dot_ptr, offs_t * 24 + slot, mask_t, T, S, S_MAX)
    return m * rstd * scale2 + tl.load(base_ptr + slot)


@triton.jit
def _comb_row(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX: tl.constexpr, j: tl.constexpr,
              rstd, scale2, eps):
    """Row j of comb (slots 8 + 4j + k) from the logits: the softmax over k, + eps."""
    return _softmax4(
        _comb_logit(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 8 + 4 * j, rstd, scale2),
        _comb_logit(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 9 + 4 * j, rstd, scale2),
        _comb_logit(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 10 + 4 * j, rstd, scale2),
        _comb_logit(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 11 + 4 * j, rstd, scale2),
        eps)


@triton.jit
def _post_and_comb(dot_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, offs_t, mask_t, rstd,
                   T, S, S_MAX: tl.constexpr, sinkhorn_eps, post_mult, sinkhorn_iters):
    """C_l = post_mult sigmoid(.) and comb = Sinkhorn(.) for BLOCK_T tokens, all in registers.

    comb is 16 per-token values c{j}{k}, each a [BLOCK_T] vector: a thread owns its tokens'
    whole 4 x 4 matrices, so the 40 normalisations need no exchange between threads (as a
    [BLOCK_T, 4, 4] tile, each tl.sum would cross lanes and warps, 40 times in a chain).
    """
    j = tl.arange(0, 4)
    m_post = _sum_splits(dot_ptr, offs_t[:, None] * 24 + 4 + j[None, :], mask_t[:, None], T, S,
                         S_MAX)
    post = post_mult * _sigmoid(m_post * rstd[:, None] * tl.load(scale_ptr + 1)
                                + tl.load(base_ptr + 4 + j)[None, :])  # [BT, 4]
    tl.store(post_ptr + offs_t[:, None] * 4 + j[None, :], post, mask=mask_t[:, None])

    a2 = tl.load(scale_ptr + 2)
    eps = sinkhorn_eps
    c00, c01, c02, c03 = _comb_row(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 0, rstd, a2, eps)
    c10, c11, c12, c13 = _comb_row(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 1, rstd, a2, eps)
    c20, c21, c22, c23 = _comb_row(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 2, rstd, a2, eps)
    c30, c31, c32, c33 = _comb_row(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 3, rstd, a2, eps)
    c00, c10, c20, c30 = _normalise4(c00, c10, c20, c30, eps)  # column-normalise (sum over j)
    c01, c11, c21, c31 = _normalise4(c01, c11, c21, c31, eps)
    c02, c12, c22, c32 = _normalise4(c02, c12, c22, c32, eps)
    c03, c13, c23, c33 = _normalise4(c03, c13, c23, c33, eps)
    for _ in range(1, sinkhorn_iters):
        c00, c01, c02, c03 = _normalise4(c00, c01, c02, c03, eps)  # row-normalise (over k)
        c10, c11, c12, c13 = _normalise4(c10, c11, c12, c13, eps)
        c20, c21, c22, c23 = _normalise4(c20, c21, c22, c23, eps)
        c30, c31, c32, c33 = _normalise4(c30, c31, c32, c33, eps)
        c00, c10, c20, c30 = _normalise4(c00, c10, c20, c30, eps)  # column-normalise
        c01, c11, c21, c31 = _normalise4(c01, c11, c21, c31, eps)
        c02, c12, c22, c32 = _normalise4(c02, c12, c22, c32, eps)
        c03, c13, c23, c33 = _normalise4(c03, c13, c23, c33, eps)
    out = comb_ptr + offs_t * 16  # comb[t, j, k] at + 4j + k
    tl.store(out, c00, mask=mask_t)
    tl.store(out + 1, c01, mask=mask_t)
    tl.store(out + 2, c02, mask=mask_t)
    tl.store(out + 3, c03, mask=mask_t)
    tl.store(out + 4, c10, mask=mask_t)
    tl.store(out + 5, c11, mask=mask_t)
    tl.store(out + 6, c12, mask=mask_t)
    tl.store(out + 7, c13, mask=mask_t)
    tl.store(out + 8, c20, mask=mask_t)
    tl.store(out + 9, c21, mask=mask_t)
    tl.store(out + 10, c22, mask=mask_t)
    tl.store(out + 11, c23, mask=mask_t)
    tl.store(out + 12, c30, mask=mask_t)
    tl.store(out + 13, c31, mask=mask_t)
    tl.store(out + 14, c32, mask=mask_t)
    tl.store(out + 15, c33, mask=mask_t)
# --8<-- [end:sinkhorn_kernel]


# --8<-- [start:fuse_kernel]
@triton.jit
def _rstd(sq_ptr, offs_t, mask_t, T, S, S_MAX: tl.constexpr, inv_k, rms_eps):
    """1 / RMS(vec X_l) for BLOCK_T tokens from the S split partials of sum x^2."""
    sq = tl.load(sq_ptr + offs_t, mask=mask_t, other=0.0)
    for s in tl.static_range(1, S_MAX):
        sq += tl.load(sq_ptr + s * T + offs_t, mask=mask_t & (offs_t * 0 + s < S), other=0.0)
    return 1.0 / tl.sqrt(sq * inv_k + rms_eps)


@triton.jit
def _mhc_pre_fuse_kernel(
    dot_ptr,  # *fp32 [S, T, 24]: x @ fn^T, un-normalised, in S split partials
    sq_ptr,  # *fp32 [S, T]: sum of x^2, in S split partials
    res_ptr,  # *bf16 [T, 4, H]: the residual X_l
    scale_ptr,  # *fp32 [3]: alpha_pre, alpha_post, alpha_res
    base_ptr,  # *fp32 [24]: S (static part), one per slot
    li_ptr,  # *bf16 [T, H] out: layer_input = A_l X_l
    post_ptr,  # *fp32 [T, 4] out: C_l
    comb_ptr,  # *fp32 [T, 4, 4] out: comb, B_l = comb^T
    T, H, S,
    inv_k, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters,
    S_MAX: tl.constexpr,  # a power of two >= S: the split loops are unrolled to it
    REVERSE: tl.constexpr,  # walk tokens last to first (to meet the projection's L2 tail)
    META_T: tl.constexpr,  # tokens per metadata program (C_l and Sinkhorn)
    BLOCK_T: tl.constexpr,  # tokens per streaming program
    BLOCK_H: tl.constexpr,  # hidden columns per streaming program
    PDL: tl.constexpr,  # launched as a programmatic dependent of the projection (a GPU only)
):
    if PDL:  # dot_mix and sqrsum are the projection's: wait for its whole grid
        gdc_wait()
    # Two kinds of program in one launch. The first cdiv(T, META_T) compute C_l and B_l for
    # META_T tokens each: Sinkhorn is 40 dependent normalisations of 4 x 4 numbers, so it gets
    # programs wide in tokens, not a streaming program's thin token tile. The rest stream the
    # residual and need only A_l, which they compute themselves (four sigmoids a token).
    n_meta = tl.cdiv(T, META_T)
    pid = tl.program_id(0)
    if pid < n_meta:
        # (names differ from the other branch's: Triton types a name once across both)
        tok = (pid * META_T + tl.arange(0, META_T)).to(tl.int64)
        live = tok < T
        r = _rstd(sq_ptr, tok, live, T, S, S_MAX, inv_k, rms_eps)
        _post_and_comb(dot_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, tok, live, r,
                       T, S, S_MAX, sinkhorn_eps, post_mult, sinkhorn_iters)
    else:
        n_h = tl.cdiv(H, BLOCK_H)
        pid_h = (pid - n_meta) % n_h  # neighbouring programs share tokens: mixes hit L1/L2
        pid_t = (pid - n_meta) // n_h
        if REVERSE:
            pid_t = tl.cdiv(T, BLOCK_T) - 1 - pid_t
        offs_t = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        mask_t = offs_t < T

        # the residual loads first: they depend on nothing, so they are in flight while the
        # gates below wait for dot_mix (the first real dependency is the FMA, not the load)
        offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = mask_t[:, None] & (offs_h < H)[None, :]
        x = res_ptr + offs_t[:, None] * (4 * H) + offs_h[None, :]  # stream j at + j * H
        x0 = _stream_load(x, mask)
        x1 = _stream_load(x + H, mask)
        x2 = _stream_load(x + 2 * H, mask)
        x3 = _stream_load(x + 3 * H, mask)

        rstd = _rstd(sq_ptr, offs_t, mask_t, T, S, S_MAX, inv_k, rms_eps)  # [BT]
        scale0 = tl.load(scale_ptr)
        p0 = _pre_gate(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 0, rstd, scale0, pre_eps)
        p1 = _pre_gate(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 1, rstd, scale0, pre_eps)
        p2 = _pre_gate(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 2, rstd, scale0, pre_eps)
        p3 = _pre_gate(dot_ptr, base_ptr, offs_t, mask_t, T, S, S_MAX, 3, rstd, scale0, pre_eps)

        acc = p0[:, None] * x0 + p1[:, None] * x1 + p2[:, None] * x2 + p3[:, None] * x3
        tl.store(li_ptr + offs_t[:, None] * H + offs_h[None, :],
                 _round_bf16(acc).to(tl.bfloat16), mask=mask)
# --8<-- [end:fuse_kernel]


# --8<-- [start:post_kernel]
@triton.jit
def _mhc_post_kernel(
    f_ptr,  # *bf16 [T, H]: the sublayer output F_l(A_l X_l)
    res_ptr,  # *bf16 [T, 4, H]: X_l
    post_ptr,  # *fp32 [T, 4]: C_l
    comb_ptr,  # *fp32 [T, 4, 4]: comb = B_l^T
    out_ptr,  # *bf16 [T, 4, H] out: X_{l+1}
    T, H,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    n_h = tl.cdiv(H, BLOCK_H)
    pid = tl.program_id(0)
    pid_h = pid % n_h
    pid_t = pid // n_h
    offs_t = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_t = offs_t < T
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = mask_t[:, None] & (offs_h < H)[None, :]

    f = _stream_load(f_ptr + offs_t[:, None] * H + offs_h[None, :], mask)
    row = offs_t[:, None] * (4 * H) + offs_h[None, :]  # stream j of X and of X_{l+1} at + j * H
    x = res_ptr + row
    x0 = _stream_load(x, mask)
    x1 = _stream_load(x + H, mask)
    x2 = _stream_load(x + 2 * H, mask)
    x3 = _stream_load(x + 3 * H, mask)
    for k in tl.static_range(4):  # new stream k = C[k] F + sum_j comb[j][k] X[j]
        c = comb_ptr + offs_t * 16 + k  # comb[t, j, k] at + 4j
        acc = tl.load(post_ptr + offs_t * 4 + k, mask=mask_t, other=0.0)[:, None] * f
        acc += tl.load(c, mask=mask_t, other=0.0)[:, None] * x0
        acc += tl.load(c + 4, mask=mask_t, other=0.0)[:, None] * x1
        acc += tl.load(c + 8, mask=mask_t, other=0.0)[:, None] * x2
        acc += tl.load(c + 12, mask=mask_t, other=0.0)[:, None] * x3
        tl.store(out_ptr + row + k * H, _round_bf16(acc).to(tl.bfloat16), mask=mask)
# --8<-- [end:post_kernel]


# --8<-- [start:post_backward_kernel]
@triton.jit
def _mhc_post_bwd_kernel(
    g_ptr,  # *[T, 4, H]: dL/dX_{l+1}, the output's gradient
    f_ptr,  # *bf16 [T, H]: x = F_l(A_l X_l)
    res_ptr,  # *bf16 [T, 4, H]: X_l
    post_ptr,  # *fp32 [T, 4]: C_l
    comb_ptr,  # *fp32 [T, 4, 4]: comb = B_l^T
    g_f_ptr,  # *bf16 [T, H] out: sum_k post[k] g_k
    g_res_ptr,  # *bf16 [T, 4, H] out: stream j gets sum_k comb[j][k] g_k
    g_mix_ptr,  # *fp32 [T, 20] out: <g_k, x> at slot k, <X_j, g_k> at slot 4 + 4j + k
    T, H,
    BLOCK_T: tl.constexpr,  # tokens per program; one warp a token at BLOCK_T = num_warps
    BLOCK_H: tl.constexpr,
):
    offs_t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_t = offs_t < T
    slot = tl.arange(0, 32)  # the 20 dot products of a token, summed across the H loop
    dots = tl.zeros((BLOCK_T, 32), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = mask_t[:, None] & (offs_h < H)[None, :]
        f = _stream_load(f_ptr + offs_t[:, None] * H + offs_h[None, :], mask)
        row = offs_t[:, None] * (4 * H) + offs_h[None, :]  # stream j at + j * H
        x0 = _stream_load(res_ptr + row, mask)
        x1 = _stream_load(res_ptr + row + H, mask)
        x2 = _stream_load(res_ptr + row + 2 * H, mask)
        x3 = _stream_load(res_ptr + row + 3 * H, mask)
        g_f = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        g_x0 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        g_x1 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        g_x2 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        g_x3 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        for k in tl.static_range(4):  # output stream k = C[k] x + sum_j comb[j][k] X_j
            g = _stream_load(g_ptr + row + k * H, mask)
            c = comb_ptr + offs_t * 16 + k  # comb[t, j, k] at + 4j
            g_f += tl.load(post_ptr + offs_t * 4 + k, mask=mask_t, other=0.0)[:, None] * g
            g_x0 += tl.load(c, mask=mask_t, other=0.0)[:, None] * g
            g_x1 += tl.load(c + 4, mask=mask_t, other=0.0)[:, None] * g
            g_x2 += tl.load(c + 8, mask=mask_t, other=0.0)[:, None] * g
            g_x3 += tl.load(c + 12, mask=mask_t, other=0.0)[:, None] * g
            # the row sums are over one warp's own token (no shared memory); each lands in its slot
            dots += tl.where(slot == k, tl.sum(g * f, axis=1)[:, None], 0.0)
            dots += tl.where(slot == 4 + k, tl.sum(x0 * g, axis=1)[:, None], 0.0)
            dots += tl.where(slot == 8 + k, tl.sum(x1 * g, axis=1)[:, None], 0.0)
            dots += tl.where(slot == 12 + k, tl.sum(x2 * g, axis=1)[:, None], 0.0)
            dots += tl.where(slot == 16 + k, tl.sum(x3 * g, axis=1)[:, None], 0.0)
        tl.store(g_f_ptr + offs_t[:, None] * H + offs_h[None, :],
                 _round_bf16(g_f).to(tl.bfloat16), mask=mask)
        tl.store(g_res_ptr + row, _round_bf16(g_x0).to(tl.bfloat16), mask=mask)
        tl.store(g_res_ptr + row + H, _round_bf16(g_x1).to(tl.bfloat16), mask=mask)
        tl.store(g_res_ptr + row + 2 * H, _round_bf16(g_x2).to(tl.bfloat16), mask=mask)
        tl.store(g_res_ptr + row + 3 * H, _round_bf16(g_x3).to(tl.bfloat16), mask=mask)
    tl.store(g_mix_ptr + offs_t[:, None] * 20 + slot[None, :], dots,
             mask=mask_t[:, None] & (slot < 20)[None, :])
# --8<-- [end:post_backward_kernel]


# --8<-- [start:pre_rows_kernel]
@triton.jit
def _mhc_pre_bwd_rows_kernel(
    res_ptr,  # *bf16 [T, 4, H]: X_l
    g_li_ptr,  # *[T, H]: dL/d layer_input
    g_pre_ptr,  # *fp32 [T, 4] out: <X_j, g_layer_input>, the gradient of pre_j
    T, H,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    offs_t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_t = offs_t < T
    # products summed element-wise across the H loop, across the row once at the end
    a0 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = mask_t[:, None] & (offs_h < H)[None, :]
        g = _stream_load(g_li_ptr + offs_t[:, None] * H + offs_h[None, :], mask)
        row = res_ptr + offs_t[:, None] * (4 * H) + offs_h[None, :]
        a0 += _stream_load(row, mask) * g
        a1 += _stream_load(row + H, mask) * g
        a2 += _stream_load(row + 2 * H, mask) * g
        a3 += _stream_load(row + 3 * H, mask) * g
    tl.store(g_pre_ptr + offs_t * 4, tl.sum(a0, axis=1), mask=mask_t)
    tl.store(g_pre_ptr + offs_t * 4 + 1, tl.sum(a1, axis=1), mask=mask_t)
    tl.store(g_pre_ptr + offs_t * 4 + 2, tl.sum(a2, axis=1), mask=mask_t)
    tl.store(g_pre_ptr + offs_t * 4 + 3, tl.sum(a3, axis=1), mask=mask_t)
# --8<-- [end:pre_rows_kernel]


# --8<-- [start:pre_backward_kernel]
@triton.jit
def _mhc_pre_bwd_kernel(
    res_ptr,  # *bf16 [T, K]: X_l read flat, K = 4H
    w_ptr,  # *bf16 [2, 24, K]: fn as hi + lo parts (_mhc_split_fn_kernel)
    g_li_ptr,  # *[T, H]: dL/d layer_input
    g_dot_ptr,  # *fp32 [T, 24]: dL/d dot, dot = x fn^T (from the gates' backward)
    g_sq_ptr,  # *fp32 [T]: dL/d sq, sq = |x|^2
    pre_ptr,  # *fp32 [T, 4]: the pre gates
    g_res_ptr,  # *bf16 [T, K] out: g_dot fn + 2 g_sq x + pre_j g_layer_input
    g_w_ptr,  # *fp32 [S, 24, K] out: g_dot^T x over each token split
    T, H, T_SPLIT,  # tokens, H, tokens per split (a multiple of BLOCK_T)
    BLOCK_T: tl.constexpr,  # the M of g_dot fn and the K of g_dot^T x
    BLOCK_H: tl.constexpr,
    MMA_BF16: tl.constexpr,  # False only under the interpreter (see _mhc_project_kernel)
):
    # stream fastest: the four programs of an H block read the same g_layer_input tile
    j = tl.program_id(0) % 4
    pid_h = tl.program_id(0) // 4
    pid_s = tl.program_id(1)
    K = 4 * H
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    col = j * H + offs_h  # [BH]: columns of the flat row and of fn
    offs_c = tl.arange(0, 32)  # the 24 mixes, padded to the MMA's K
    mask_w = (offs_c < 24)[:, None] & mask_h[None, :]
    w_hi = tl.load(w_ptr + offs_c[:, None] * K + col[None, :], mask=mask_w, other=0.0)
    w_lo = tl.load(w_ptr + (24 + offs_c)[:, None] * K + col[None, :], mask=mask_w, other=0.0)
    g_w = tl.zeros((32, BLOCK_H), dtype=tl.float32)
    t_lo = pid_s * T_SPLIT
    t_hi = tl.minimum(t_lo + T_SPLIT, T)
    for t0 in range(t_lo, t_hi, BLOCK_T):
        offs_t = (t0 + tl.arange(0, BLOCK_T)).to(tl.int64)
        mask_t = offs_t < t_hi
        mask = mask_t[:, None] & mask_h[None, :]
        x = tl.load(res_ptr + offs_t[:, None] * K + col[None, :], mask=mask, other=0.0)
        g_dot = tl.load(g_dot_ptr + offs_t[:, None] * 24 + offs_c[None, :],
                        mask=mask_t[:, None] & (offs_c < 24)[None, :], other=0.0)
        if MMA_BF16:
            # float32 products from bf16 MMAs: g_dot = hi + lo to 2^-16 and fn likewise; the
            # lo x lo term is below float32's rounding. TF32 would keep 2^-11.
            d_hi = g_dot.to(tl.bfloat16)
            d_lo = (g_dot - d_hi.to(tl.float32)).to(tl.bfloat16)
            g_x = tl.dot(d_hi, w_hi)
            g_x = tl.dot(d_lo, w_hi, g_x)
            g_x = tl.dot(d_hi, w_lo, g_x)
            g_w = tl.dot(tl.trans(d_hi), x, g_w)  # x is bf16: exact
            g_w = tl.dot(tl.trans(d_lo), x, g_w)
        else:  # the interpreter multiplies in float32 (numpy)
            g_x = tl.dot(g_dot, w_hi.to(tl.float32) + w_lo.to(tl.float32))
            g_w = tl.dot(tl.trans(g_dot), x.to(tl.float32), g_w)
        g_sq = tl.load(g_sq_ptr + offs_t, mask=mask_t, other=0.0)
        pre = tl.load(pre_ptr + offs_t * 4 + j, mask=mask_t, other=0.0)
        g_li = _stream_load(g_li_ptr + offs_t[:, None] * H + offs_h[None, :], mask)
        g_x += (2.0 * g_sq)[:, None] * x.to(tl.float32) + pre[:, None] * g_li
        tl.store(g_res_ptr + offs_t[:, None] * K + col[None, :], _round_bf16(g_x).to(tl.bfloat16),
                 mask=mask)
    tl.store(g_w_ptr + (pid_s * 24 + offs_c)[:, None] * K + col[None, :], g_w, mask=mask_w)
# --8<-- [end:pre_backward_kernel]


# --8<-- [start:gates_backward_kernel]
@triton.jit
def _col_vjp(x, g, eps):
    """x / (colsum x + eps) (sums over j, axis 1) taken back: its input's gradient from g."""
    s = tl.sum(x, axis=1)[:, None, :] + eps
    return (g - tl.sum(g * (x / s), axis=1)[:, None, :]) / s


@triton.jit
def _row_vjp(x, g, eps):
    """x / (rowsum x + eps) (sums over k, axis 2) taken back."""
    s = tl.sum(x, axis=2)[:, :, None] + eps
    return (g - tl.sum(g * (x / s), axis=2)[:, :, None]) / s


@triton.jit
def _mhc_gates_bwd_kernel(
    dot_ptr,  # *fp32 [T, 24]: the raw mixes x fn^T
    sq_ptr,  # *fp32 [T]: |x|^2
    scale_ptr, base_ptr,  # *fp32 [3], [24]
    g_pre_ptr, g_post_ptr, g_comb_ptr,  # *fp32 [T, 4], [T, 4], [T, 4, 4]: the gates' gradients
    steps_ptr,  # *fp32 [T, 2 iters - 1, 16] scratch: the input of every Sinkhorn normalisation
    pre_ptr,  # *fp32 [T, 4] out: the pre gates (recomputed)
    g_dot_ptr,  # *fp32 [T, 24] out
    g_sq_ptr,  # *fp32 [T] out
    g_z_ptr,  # *fp32 [T, 24] out: each slot's logit z = alpha m + S taken back (g_base's part)
    g_scale_ptr,  # *fp32 [T, 3] out: each token's part of g_scale
    T, inv_k, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters,
    BLOCK_T: tl.constexpr,
):
    offs_t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    mask_t = offs_t < T
    r = 1.0 / tl.sqrt(tl.load(sq_ptr + offs_t, mask=mask_t, other=1.0) * inv_k + rms_eps)

    # pre and post: slots 0..7 of a [BT, 8] tile
    s8 = tl.arange(0, 8)
    m8 = tl.load(dot_ptr + offs_t[:, None] * 24 + s8[None, :], mask=mask_t[:, None],
                 other=0.0) * r[:, None]
    a8 = tl.load(scale_ptr + s8 // 4)  # alpha_pre for slots 0..3, alpha_post for 4..7
    sig = _sigmoid(m8 * a8[None, :] + tl.load(base_ptr + s8)[None, :])
    is_pre = (s8 < 4)[None, :]
    tl.store(pre_ptr + offs_t[:, None] * 4 + s8[None, :], sig + pre_eps,
             mask=mask_t[:, None] & is_pre)
    g8 = tl.where(is_pre,
                  tl.load(g_pre_ptr + offs_t[:, None] * 4 + s8[None, :],
                          mask=mask_t[:, None] & is_pre, other=0.0),
                  post_mult * tl.load(g_post_ptr + offs_t[:, None] * 4 + (s8 - 4)[None, :],
                                      mask=mask_t[:, None] & (s8 >= 4)[None, :], other=0.0))
    gz8 = g8 * sig * (1.0 - sig)  # d sigmoid

    # comb: Sinkhorn forward on [BT, 4, 4] tiles, each normalisation's input kept for the way back
    j = tl.arange(0, 4)[None, :, None]
    k = tl.arange(0, 4)[None, None, :]
    t3 = offs_t[:, None, None]
    mask3 = mask_t[:, None, None] & (j >= 0) & (k >= 0)
    a2 = tl.load(scale_ptr + 2)
    m16 = tl.load(dot_ptr + t3 * 24 + 8 + 4 * j + k, mask=mask3, other=0.0) * r[:, None, None]
    z16 = m16 * a2 + tl.load(base_ptr + 8 + 4 * j + k)
    e = tl.exp(z16 - tl.max(z16, axis=2)[:, :, None])
    p = e / tl.sum(e, axis=2)[:, :, None]  # the softmax over k
    c = p + sinkhorn_eps
    n_steps = 2 * sinkhorn_iters - 1
    steps = steps_ptr + t3 * (n_steps * 16) + 4 * j + k
    tl.store(steps, c, mask=mask3)
    c = c / (tl.sum(c, axis=1)[:, None, :] + sinkhorn_eps)
    for it in range(1, sinkhorn_iters):
        tl.store(steps + (2 * it - 1) * 16, c, mask=mask3)
        c = c / (tl.sum(c, axis=2)[:, :, None] + sinkhorn_eps)
        tl.store(steps + 2 * it * 16, c, mask=mask3)
        c = c / (tl.sum(c, axis=1)[:, None, :] + sinkhorn_eps)
    # ... and back, last normalisation first (each program reads only what it wrote)
    g = tl.load(g_comb_ptr + t3 * 16 + 4 * j + k, mask=mask3, other=0.0)
    for i in range(1, sinkhorn_iters):
        it = sinkhorn_iters - i
        g = _col_vjp(tl.load(steps + 2 * it * 16, mask=mask3, other=1.0), g, sinkhorn_eps)
        g = _row_vjp(tl.load(steps + (2 * it - 1) * 16, mask=mask3, other=1.0), g, sinkhorn_eps)
    g = _col_vjp(tl.load(steps, mask=mask3, other=1.0), g, sinkhorn_eps)
    gz16 = p * (g - tl.sum(g * p, axis=2)[:, :, None])  # the softmax taken back

    # z = alpha m + S, m = dot r: the slots' logits, g_dot, and r's gradient into sq's
    tl.store(g_z_ptr + offs_t[:, None] * 24 + s8[None, :], gz8, mask=mask_t[:, None])
    tl.store(g_z_ptr + t3 * 24 + 8 + 4 * j + k, gz16, mask=mask3)
    gm8 = gz8 * a8[None, :]
    gm16 = gz16 * a2
    tl.store(g_dot_ptr + offs_t[:, None] * 24 + s8[None, :], gm8 * r[:, None],
             mask=mask_t[:, None])
    tl.store(g_dot_ptr + t3 * 24 + 8 + 4 * j + k, gm16 * r[:, None, None], mask=mask3)
    # g_r = sum_slots g_m dot = sum_slots g_m m / r
    g_r = (tl.sum(gm8 * m8, axis=1) + tl.sum(tl.sum(gm16 * m16, axis=2), axis=1)) / r
    tl.store(g_sq_ptr + offs_t, -0.5 * g_r * r * r * r * inv_k, mask=mask_t)
    ga = gz8 * m8
    tl.store(g_scale_ptr + offs_t * 3, tl.sum(tl.where(is_pre, ga, 0.0), axis=1), mask=mask_t)
    tl.store(g_scale_ptr + offs_t * 3 + 1, tl.sum(tl.where(is_pre, 0.0, ga), axis=1),
             mask=mask_t)
    tl.store(g_scale_ptr + offs_t * 3 + 2, tl.sum(tl.sum(gz16 * m16, axis=2), axis=1),
             mask=mask_t)
# --8<-- [end:gates_backward_kernel]


# --8<-- [start:configs]
# The streaming kernels, (BLOCK_T, BLOCK_H, num_warps): 512 to 4096 elements per stream and
# program, 4 to 16 bf16 per thread and stream, four streams in flight per thread; BLOCK_T = 1
# gives small T the most programs. Which wins depends on the kernel and H (on an H200 at
# T = 8192 no one tile won for both kernels at both H): five candidates.
STREAM_CONFIGS = [triton.Config({"BLOCK_T": t, "BLOCK_H": h}, num_warps=w)
                  for t, h, w in ((1, 512, 4), (1, 1024, 4), (2, 1024, 4), (1, 2048, 8),
                                  (8, 512, 8))]
# The projection: fixed tiles, no autotuner. 64 tokens (the MMA's M) by 128 columns of K a step,
# fn's tiles streaming from L2 beside the residual's. Timed as the whole mhc_pre (CUDA graphs,
# an H200), it beat 128 x 64 at every T tried, which the autotuner, timing the kernel alone from
# a cold L2, had picked for some T. Fixed tiles with the same bits also keep mhc_pre's bits from
# depending on a process's autotuner.
PROJECT_TILE = {"BLOCK_T": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
# Where one program an SM still fills the GPU (_fills; T = 8192), 128 tokens and 4 stages: 160 KiB
# of shared memory, so one program an SM, with 64 KiB of the residual in flight on it against
# 32 KiB (two programs, one step ahead each), and half of fn's bytes per residual byte. The same
# bits as the 64-token tile (same K-splits and steps; tested on the GPU); on an H200 a little
# faster for the whole mhc_pre at T = 8192, H = 7168, level at 4096 and at T = 1024.
PROJECT_TILE_WIDE = {"BLOCK_T": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4}
FILL = 0.9  # the share of the SMs the wide tile's grid must cover
# fn's split: a latency-bound kernel of a few microseconds; 2048 elements and 8 warps a program
# were a little faster than 4096 and 4 (an H200, CUDA graphs, both H)
SPLIT_TILE = {"BLOCK": 2048, "num_warps": 8}
K_SPLIT_ALIGN = 256  # split boundaries on multiples of every BLOCK_K, so S is config-free
MAX_SPLITS = 16  # the big-fuse kernel unrolls its split sums: keep S (and its code) small
# Under the interpreter there is nothing to tune: one small fixed configuration.
INTERPRETER_CONFIG = {"project": {"BLOCK_T": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 1},
                      "fuse": {"BLOCK_T": 4, "BLOCK_H": 64, "num_warps": 4}}
# Tokens per metadata program: one token per thread at 4 warps; the interpreter's is small so
# that its tests' T = 5 and 33 leave a masked tail.
META_T = {"cuda": 128, "cpu": 16}

_fuse_tuned = triton.autotune(STREAM_CONFIGS, key=["H", "T", "S"])(_mhc_pre_fuse_kernel)
_post_tuned = triton.autotune(STREAM_CONFIGS, key=["H", "T"])(_mhc_post_kernel)
# --8<-- [end:configs]


# --8<-- [start:backward_tiles]
# The backward's streaming passes (post backward, pre rows): BLOCK_T = num_warps, so that a warp
# owns a token and the row sums need no shared memory; 256 columns a step, 8 bf16 (16 bytes) a
# thread.
STREAM_BWD_TILE = {"BLOCK_T": 4, "BLOCK_H": 256, "num_warps": 4}
# The pre step's main pass: 64 tokens (the MMA's M) by 64 columns, g_dot fn and g_dot^T x on
# the tensor cores, token splits for about two programs an SM (torch sums their fn-gradients).
# One stage, no software pipelining: the residual tile feeds an MMA and registers, the pattern
# that Triton's pipeliner gives a buffer too few (_mhc_project_kernel); other programs on the
# SM hide the loads' latency.
PRE_BWD_TILE = {"BLOCK_T": 64, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}
# The gates' backward: a token a thread (2 warps), so T = 8192 gives 128 programs; the
# interpreter's block is small, for masked tails.
GATES_BWD_BLOCK_T = {"cuda": 64, "cpu": 4}
GATES_BWD_WARPS = 2
# Under the interpreter: small tiles, so that the tests' sizes leave masked tails.
INTERPRETER_BWD_TILES = {"stream": {"BLOCK_T": 2, "BLOCK_H": 16, "num_warps": 4},
                         "pre": {"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 1}}
# --8<-- [end:backward_tiles]


# --8<-- [start:run_tuned]
_CHOSEN: dict = {}  # autotune key -> the launch kwargs of the config Triton's autotuner chose


def _tokens_key(T: int) -> int:
    """T as the autotune keys hold it: rounded up to a power of two. Every new key costs a
    round of the autotuner (each candidate timed for about a tenth of a second), and a model
    meets a new T on almost every call (decoding, ragged batches); the best tile follows T's
    size, not its last digits. The first T of a bucket picks the tile for the whole bucket."""
    return next_power_of_2(T)


def _run_tuned(tuned, kernel, grid, key: tuple, *args, **kwargs) -> None:
    """``tuned[grid](*args, **kwargs)`` the first time a key is seen, then ``kernel`` (the
    jit function ``tuned`` wraps) launched with the config the autotuner chose for the key's
    bucket: Triton's autotuner keys on T itself and would retune for every new T."""
    meta = _CHOSEN.get(key)
    if meta is None:
        tuned[grid](*args, **kwargs)
        _CHOSEN[key] = tuned.best_config.all_kwargs()
    else:
        kernel[grid(meta)](*args, **kwargs, **meta)
# --8<-- [end:run_tuned]


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: a few splits, to exercise the split-K path


# the streaming kernels' tiles; the projection's: BLOCK_T is the MMA's M, BLOCK_K its K
_STREAM_SIZES = {"BLOCK_T": (1, None), "BLOCK_H": (1, None)}
_PROJECT_SIZES = {"BLOCK_T": (16, None), "BLOCK_K": (16, 256)}
_STREAM_KEYS = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages")
_PROJECT_KEYS = ("BLOCK_T", "BLOCK_K", "num_warps", "num_stages")
# which device the kernels need: CPU tensors under the interpreter, CUDA ones when compiled
_DEVICE_TYPE = "cpu" if interpreted(_mhc_pre_fuse_kernel) else "cuda"


def _check_config(name, config, sizes) -> None:
    """A launch config: a dict with the block sizes ``sizes`` ({key: (least, what it must divide
    or None)}, see check_tiles) and optionally num_warps and num_stages."""
    if not isinstance(config, dict):
        raise TypeError(f"{name} must be a dict, got {type(config).__name__}")
    check_tiles(name, config, sizes, optional=("num_warps", "num_stages"))
    for key in ("num_warps", "num_stages"):
        v = config.get(key, 1)
        if type(v) is not int or v < 1:
            raise ValueError(f"{name} {key}={v!r} must be an int >= 1")


def _encode(config: dict | None, keys: tuple) -> list[int] | None:
    """A config dict as the custom ops take it: its values in ``keys`` order, -1 where unset."""
    return None if config is None else [int(config.get(k, -1)) for k in keys]


def _decode(values: list[int] | None, keys: tuple) -> dict | None:
    return None if values is None else {k: v for k, v in zip(keys, values, strict=True) if v != -1}


def _check_device(name: str, t: torch.Tensor) -> None:
    """Compiled Triton kernels need CUDA tensors; the interpreter (TRITON_INTERPRET=1) CPU ones."""
    if t.device.type != _DEVICE_TYPE:
        how = ("Triton runs in the interpreter (TRITON_INTERPRET=1): pass CPU tensors"
               if _DEVICE_TYPE == "cpu" else "compiled Triton kernels need CUDA tensors")
        raise ValueError(f"{name} is on {t.device}, but {how}")


def _check_int(name: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return int(value)


def _check_common(residual, scale, base, sinkhorn_iters, post_mult, **eps) -> None:
    check_tensor("residual", residual, dtypes=(torch.bfloat16,), ndim=3, nonempty=True,
                 contiguous=True)
    _check_device("residual", residual)
    if residual.shape[1] != N_HC:
        raise ValueError(f"residual must be [T, 4, H] (4 streams), got {tuple(residual.shape)}")
    for name, t, n in (("scale", scale, 3), ("base", base, N_MIX)):
        check_tensor(name, t, dtypes=(torch.float32,), ndim=1, contiguous=True,
                     device=residual.device)
        if t.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    for name, value in eps.items():
        check_real(name, value, "a finite number > 0")
    check_real("post_mult", post_mult, "a finite number")
    _check_int("sinkhorn_iters", sinkhorn_iters, 1)


def _dependent(on: bool) -> dict:
    """Launch arguments of a kernel with a ``PDL`` constexpr: with ``on`` (a GPU only), a
    programmatic dependent launch, whose programs may start before the kernel ahead of it in
    the stream has finished and wait for it in gdc_wait; else a plain launch."""
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
          sinkhorn_iters, config, reverse, pdl=False):
    """The big-fuse launch: layer_input [T, H] bf16, post_mix [T, 4], comb_mix [T, 4, 4]."""
    T, _, H = residual.shape
    S = dot_mix.shape[0]
    if config is None and residual.device.type != "cuda":
        config = INTERPRETER_CONFIG["fuse"]
    layer_input = torch.empty((T, H), dtype=torch.bfloat16, device=residual.device)
    post_mix = torch.empty((T, N_HC), dtype=torch.float32, device=residual.device)
    comb_mix = torch.empty((T, N_HC, N_HC), dtype=torch.float32, device=residual.device)
    args = (dot_mix, sqrsum, residual, scale, base, layer_input, post_mix, comb_mix, T, H, S,
            1.0 / (N_HC * H), float(rms_eps), float(pre_eps), float(sinkhorn_eps),
            float(post_mult), int(sinkhorn_iters))
    meta_t = META_T["cuda" if residual.device.type == "cuda" else "cpu"]
    n_meta = cdiv(T, meta_t)
    grid = lambda m: (n_meta + cdiv(T, m["BLOCK_T"]) * cdiv(H, m["BLOCK_H"]),)  # noqa: E731
    fixed = dict(S_MAX=next_power_of_2(S), REVERSE=reverse, META_T=meta_t, **_dependent(pdl))
    if config is None:
        key = ("fuse", H, _tokens_key(T), S, reverse, pdl, residual.device)
        _run_tuned(_fuse_tuned, _mhc_pre_fuse_kernel, grid, key, *args, **fixed)
    else:
        _mhc_pre_fuse_kernel[grid(config)](*args, **fixed, **config)
    return layer_input, post_mix, comb_mix


def _split_fn(fn):
    """fn [24, K] fp32 -> [2, 24, K] bf16, its hi and lo parts (_mhc_split_fn_kernel)."""
    n = fn.numel()
    w = torch.empty((2, *fn.shape), dtype=torch.bfloat16, device=fn.device)
    _mhc_split_fn_kernel[(cdiv(n, SPLIT_TILE["BLOCK"]),)](
        fn, w, n, **SPLIT_TILE, PDL=fn.device.type == "cuda")
    return w


def _project(residual, w, num_splits, config):
    """dot_mix [S, T, 24] and sqrsum [S, T] by the split-K projection."""
    T, _, H = residual.shape
    K = N_HC * H
    sms = _sm_count(residual.device)
    S, k_split = _splits(T, K, num_splits, sms)
    dot_mix = torch.empty((S, T, N_MIX), dtype=torch.float32, device=residual.device)
    sqrsum = torch.empty((S, T), dtype=torch.float32, device=residual.device)
    gpu = residual.device.type == "cuda"
    if config is None:  # on a GPU: the wide tile where its grid fills the GPU, else the 64-token
        config = PROJECT_TILE_WIDE if _fills(T, S, sms) else PROJECT_TILE
    _mhc_project_kernel[(S, cdiv(T, config["BLOCK_T"]))](
        residual, w, dot_mix, sqrsum, T, K, k_split, MMA_BF16=gpu, **_dependent(gpu), **config)
    return dot_mix, sqrsum


def _splits(T: int, K: int, num_splits: int | None, sms: int) -> tuple[int, int]:
    """(S, K columns per split) of the projection on a GPU of ``sms`` SMs: ``num_splits``, or by
    default ~2 programs per SM of 64-token blocks. Long K loops keep the load pipeline full, and
    few splits keep the partials that the big-fuse kernel sums few. Split boundaries fall on
    multiples of K_SPLIT_ALIGN, and every split is non-empty."""
    if num_splits is None:
        num_splits = max(1, min(2 * sms // cdiv(T, 64), cdiv(K, K_SPLIT_ALIGN), MAX_SPLITS))
    k_split = cdiv(cdiv(K, num_splits), K_SPLIT_ALIGN) * K_SPLIT_ALIGN
    return cdiv(K, k_split), k_split


def _fills(T: int, S: int, sms: int) -> bool:
    """Whether the wide projection tile's grid, one program an SM, covers FILL of ``sms`` SMs."""
    return cdiv(T, PROJECT_TILE_WIDE["BLOCK_T"]) * S >= FILL * sms


def _post(x, residual, post_mix, comb_mix, config):
    """The post launch: X_{l+1} [T, 4, H] bf16."""
    T, _, H = residual.shape
    if config is None and residual.device.type != "cuda":
        config = INTERPRETER_CONFIG["fuse"]
    out = torch.empty_like(residual)
    grid = lambda m: (cdiv(T, m["BLOCK_T"]) * cdiv(H, m["BLOCK_H"]),)  # noqa: E731
    args = (x, residual, post_mix, comb_mix, out, T, H)
    if config is None:
        _run_tuned(_post_tuned, _mhc_post_kernel, grid, ("post", H, _tokens_key(T),
                                                          residual.device), *args)
    else:
        _mhc_post_kernel[grid(config)](*args, **config)
    return out


def _backward_tiles(device: torch.device) -> tuple[dict, dict]:
    """(the streaming passes' tile, the pre pass's tile) on ``device``."""
    if device.type == "cuda":
        return STREAM_BWD_TILE, PRE_BWD_TILE
    return INTERPRETER_BWD_TILES["stream"], INTERPRETER_BWD_TILES["pre"]


# --8<-- [start:backward]
def _post_backward(x, residual, post_mix, comb_mix, grad):
    """mhc_post's backward: (g_x, g_residual, g_post_mix, g_comb_mix), each in its input's dtype.

    From out[k] = post[k] x + sum_j comb[j][k] X[j]: g_x = sum_k post[k] g[k],
    g_X[j] = sum_k comb[j][k] g[k], g_post[k] = <g[k], x>, g_comb[j][k] = <X[j], g[k]>, in one
    pass over g, x and X (float32 sums, bf16 outputs rounded once).
    """
    T, _, H = residual.shape
    stream, _ = _backward_tiles(residual.device)
    grad = grad.contiguous()  # autograd may hand over an expanded (stride-0) gradient
    g_x, g_res = torch.empty_like(x), torch.empty_like(residual)
    g_mix = torch.empty((T, 20), dtype=torch.float32, device=residual.device)
    _mhc_post_bwd_kernel[(cdiv(T, stream["BLOCK_T"]),)](
        grad, x, residual, post_mix, comb_mix, g_x, g_res, g_mix, T, H, **stream)
    g_post = g_mix[:, :N_HC].reshape(post_mix.shape).to(post_mix.dtype, copy=True)
    g_comb = g_mix[:, N_HC:].reshape(T, N_HC, N_HC).to(comb_mix.dtype, copy=True)
    return g_x, g_res, g_post, g_comb


def _gates_backward(dot, sq, g_pre, H, scale, base, g_post, g_comb, *, rms_eps, pre_eps,
                    sinkhorn_eps, post_mult, sinkhorn_iters):
    """The backward of the 24 gates a token (Sinkhorn included), recomputed from the raw mixes
    ``dot`` [T, 24] and the sums of squares ``sq`` [T] (float32) in one kernel:
    (g_dot, g_sq, pre, g_scale, g_base), given the gradients of pre (``g_pre`` [T, 4]), post
    and comb (None for an unused output)."""
    T = dot.shape[0]
    dev = dot.device
    g_post = (torch.zeros((T, N_HC), dtype=torch.float32, device=dev) if g_post is None
              else g_post.float().reshape(T, N_HC).contiguous())
    g_comb = (torch.zeros((T, N_HC, N_HC), dtype=torch.float32, device=dev) if g_comb is None
              else g_comb.float().contiguous())
    steps = torch.empty((T, 2 * sinkhorn_iters - 1, 16), dtype=torch.float32, device=dev)
    pre = torch.empty((T, N_HC), dtype=torch.float32, device=dev)
    g_dot, g_z = (torch.empty((T, N_MIX), dtype=torch.float32, device=dev) for _ in range(2))
    g_sq = torch.empty((T,), dtype=torch.float32, device=dev)
    g_scale = torch.empty((T, 3), dtype=torch.float32, device=dev)
    block_t = GATES_BWD_BLOCK_T["cuda" if dev.type == "cuda" else "cpu"]
    _mhc_gates_bwd_kernel[(cdiv(T, block_t),)](
        dot.float().contiguous(), sq.float().contiguous(), scale, base, g_pre.float().contiguous(),
        g_post, g_comb, steps, pre, g_dot, g_sq, g_z, g_scale, T, 1.0 / (N_HC * H),
        float(rms_eps), float(pre_eps), float(sinkhorn_eps), float(post_mult), int(sinkhorn_iters),
        BLOCK_T=block_t, num_warps=GATES_BWD_WARPS)
    return g_dot, g_sq, pre, g_scale.sum(0), g_z.sum(0)


def _pre_rows(residual, g_li):
    """g_pre [T, 4] float32: <X_j, g_layer_input> for each token and stream j."""
    T, _, H = residual.shape
    stream, _ = _backward_tiles(residual.device)
    g_pre = torch.empty((T, N_HC), dtype=torch.float32, device=residual.device)
    _mhc_pre_bwd_rows_kernel[(cdiv(T, stream["BLOCK_T"]),)](residual, g_li, g_pre, T, H, **stream)
    return g_pre


def _pre_mixes(residual, fn):
    """dot = x fn^T [T, 24] and sq = |x|^2 [T] (float32), x = vec(X_l): the forward's split-K
    projection (fn split into bf16 hi + lo parts first, unless given split)."""
    w = fn if fn.dtype == torch.bfloat16 else _split_fn(fn)
    config = None if residual.device.type == "cuda" else INTERPRETER_CONFIG["project"]
    dot_mix, sqrsum = _project(residual, w, None, config)
    return dot_mix.sum(0), sqrsum.sum(0)


def _pre_residual_backward(residual, fn, g_li, g_dot, g_sq, pre, t_splits=None):
    """(g_residual [T, 4, H] bf16, g_fn in fn's shape and dtype): one pass writes
    g_x = g_dot fn + 2 g_sq x + pre (x) g_layer_input and sums g_fn = g_dot^T x. A split fn's
    two parts both get g_fn (fn = hi + lo). ``t_splits``: the pass's token splits, whose fn
    gradients torch sums (default: enough programs for about two an SM)."""
    T, _, H = residual.shape
    _, tile = _backward_tiles(residual.device)
    w = fn if fn.dtype == torch.bfloat16 else _split_fn(fn)
    n_cols = N_HC * cdiv(H, tile["BLOCK_H"])
    S = t_splits or max(1, min(cdiv(2 * _sm_count(residual.device), n_cols),
                              cdiv(T, tile["BLOCK_T"])))
    t_split = cdiv(cdiv(T, S), tile["BLOCK_T"]) * tile["BLOCK_T"]
    S = cdiv(T, t_split)
    g_res = torch.empty_like(residual)
    g_w = torch.empty((S, N_MIX, N_HC * H), dtype=torch.float32, device=residual.device)
    _mhc_pre_bwd_kernel[(n_cols, S)](
        residual, w, g_li, g_dot.contiguous(), g_sq.contiguous(), pre.contiguous(), g_res, g_w,
        T, H, t_split, MMA_BF16=residual.device.type == "cuda", **tile)
    g_w = g_w.sum(0)
    return g_res, (g_w if fn.ndim == 2 else torch.stack((g_w, g_w)).to(fn.dtype))
# --8<-- [end:backward]


# --8<-- [start:custom_ops]
@torch.library.custom_op("kernelnotes::mhc_pre", mutates_args=())
def _mhc_pre_op(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor,
                base: torch.Tensor, rms_eps: float, pre_eps: float, sinkhorn_eps: float,
                post_mult: float, sinkhorn_iters: int, num_splits: int | None,
                config: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = fn if fn.dtype == torch.bfloat16 else _split_fn(fn)
    if config is None and residual.device.type != "cuda":
        config = _encode(INTERPRETER_CONFIG["project"], _PROJECT_KEYS) + _encode(
            INTERPRETER_CONFIG["fuse"], _STREAM_KEYS)
    project = None if config is None else _decode(config[:4], _PROJECT_KEYS)
    fuse = None if config is None else _decode(config[4:], _STREAM_KEYS)
    dot_mix, sqrsum = _project(residual, w, num_splits, project)
    # backwards, to meet the projection's last reads in L2 (on an H200 that buys ~nothing)
    return _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps,
                 post_mult, sinkhorn_iters, fuse, reverse=True,
                 pdl=residual.device.type == "cuda")


@_mhc_pre_op.register_fake
def _(residual, fn, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters,
      num_splits, config):
    T, _, H = residual.shape
    return (residual.new_empty((T, H)), residual.new_empty((T, N_HC), dtype=torch.float32),
            residual.new_empty((T, N_HC, N_HC), dtype=torch.float32))


def _eps(inputs) -> dict:
    rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters = inputs
    return dict(rms_eps=rms_eps, pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps,
                post_mult=post_mult, sinkhorn_iters=sinkhorn_iters)


def _mhc_pre_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.kw = _eps(inputs[4:9])


# The backwards' Triton passes are custom ops too, so that AOTAutograd traces a compiled model's
# backward through them (with their fake implementations) instead of into their launches.
@torch.library.custom_op("kernelnotes::mhc_gates_backward", mutates_args=())
def _gates_backward_op(dot: torch.Tensor, sq: torch.Tensor, g_pre: torch.Tensor, H: int,
                       scale: torch.Tensor, base: torch.Tensor, g_post: torch.Tensor | None,
                       g_comb: torch.Tensor | None, rms_eps: float, pre_eps: float,
                       sinkhorn_eps: float, post_mult: float, sinkhorn_iters: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    return _gates_backward(dot, sq, g_pre, H, scale, base, g_post, g_comb, rms_eps=rms_eps,
                           pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps, post_mult=post_mult,
                           sinkhorn_iters=sinkhorn_iters)


@_gates_backward_op.register_fake
def _(dot, sq, g_pre, H, scale, base, g_post, g_comb, rms_eps, pre_eps, sinkhorn_eps, post_mult,
      sinkhorn_iters):
    f32 = dict(dtype=torch.float32)
    return (torch.empty_like(dot, **f32), torch.empty_like(sq, **f32),
            torch.empty_like(g_pre, **f32), torch.empty_like(scale, **f32),
            torch.empty_like(base, **f32))


@torch.library.custom_op("kernelnotes::mhc_pre_mixes", mutates_args=())
def _pre_mixes_op(residual: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _pre_mixes(residual, fn)


@_pre_mixes_op.register_fake
def _(residual, fn):
    T = residual.shape[0]
    return (residual.new_empty((T, N_MIX), dtype=torch.float32),
            residual.new_empty((T,), dtype=torch.float32))


@torch.library.custom_op("kernelnotes::mhc_pre_rows", mutates_args=())
def _pre_rows_op(residual: torch.Tensor, g_li: torch.Tensor) -> torch.Tensor:
    return _pre_rows(residual, g_li)


@_pre_rows_op.register_fake
def _(residual, g_li):
    return residual.new_empty((residual.shape[0], N_HC), dtype=torch.float32)


@torch.library.custom_op("kernelnotes::mhc_pre_residual_backward", mutates_args=())
def _pre_residual_backward_op(residual: torch.Tensor, fn: torch.Tensor, g_li: torch.Tensor,
                              g_dot: torch.Tensor, g_sq: torch.Tensor, pre: torch.Tensor,
                              t_splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    return _pre_residual_backward(residual, fn, g_li, g_dot, g_sq, pre, t_splits)


@_pre_residual_backward_op.register_fake
def _(residual, fn, g_li, g_dot, g_sq, pre, t_splits):
    return torch.empty_like(residual), torch.empty_like(fn)


def _gates_back(residual, dot, sq, scale, base, g_li, g_post, g_comb, kw):
    """The gradient of the layer input (zeros for a missing one, else contiguous) and the gates'
    backward from the mixes (dot, sq): (g_li, (g_dot, g_sq, pre, g_scale, g_base))."""
    T, _, H = residual.shape
    g_li = (torch.zeros((T, H), dtype=residual.dtype, device=residual.device) if g_li is None
            else g_li.contiguous())
    return g_li, _gates_backward_op(dot, sq, _pre_rows_op(residual, g_li), H, scale, base, g_post,
                                    g_comb, **kw)


def _pre_backward(residual, fn, scale, base, g_li, g_post, g_comb, *, t_splits=None, **kw):
    """mhc_pre's backward: (g_residual, g_fn, g_scale, g_base), each in its input's dtype.

    With x = vec(X_l): dot = x fn^T and sq = |x|^2 recomputed by the forward's projection,
    g_pre = <X_j, g_layer_input> by one pass, the gates' backward by one kernel, then one pass for
    g_x = g_dot fn + 2 g_sq x + pre (x) g_layer_input and g_fn = g_dot^T x.
    """
    dot, sq = _pre_mixes_op(residual, fn)
    g_li, (g_dot, g_sq, pre, g_scale, g_base) = _gates_back(residual, dot, sq, scale, base, g_li,
                                                            g_post, g_comb, kw)
    g_res, g_fn = _pre_residual_backward_op(residual, fn, g_li, g_dot, g_sq, pre, t_splits)
    return g_res, g_fn, g_scale.to(scale.dtype), g_base.to(base.dtype)


def _mhc_pre_backward(ctx, g_li, g_post, g_comb):
    grads = _pre_backward(*ctx.saved_tensors, g_li, g_post, g_comb, **ctx.kw)
    return *grads, None, None, None, None, None, None, None


_mhc_pre_op.register_autograd(_mhc_pre_backward, setup_context=_mhc_pre_setup)


@torch.library.custom_op("kernelnotes::mhc_pre_from_mixes", mutates_args=())
def _mhc_pre_from_mixes_op(dot_mix: torch.Tensor, sqrsum: torch.Tensor, residual: torch.Tensor,
                           scale: torch.Tensor, base: torch.Tensor, rms_eps: float,
                           pre_eps: float, sinkhorn_eps: float, post_mult: float,
                           sinkhorn_iters: int, config: list[int] | None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps,
                 post_mult, sinkhorn_iters, _decode(config, _STREAM_KEYS), reverse=False)


@_mhc_pre_from_mixes_op.register_fake
def _(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
      sinkhorn_iters, config):
    T, _, H = residual.shape
    return (residual.new_empty((T, H)), residual.new_empty((T, N_HC), dtype=torch.float32),
            residual.new_empty((T, N_HC, N_HC), dtype=torch.float32))


def _from_mixes_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])
    ctx.kw = _eps(inputs[5:10])


def _from_mixes_backward(ctx, g_li, g_post, g_comb):
    dot_mix, sqrsum, residual, scale, base = ctx.saved_tensors
    g_li, (g_dot, g_sq, pre, g_scale, g_base) = _gates_back(
        residual, dot_mix.sum(0), sqrsum.sum(0), scale, base, g_li, g_post, g_comb, ctx.kw)
    g_res = pre[:, :, None] * g_li.float()[:, None, :]  # through layer_input only
    S = dot_mix.shape[0]  # every split partial enters the sum with weight 1
    return (g_dot.expand(S, *g_dot.shape).to(dot_mix.dtype),
            g_sq.expand(S, *g_sq.shape).to(sqrsum.dtype), g_res.to(residual.dtype),
            g_scale.to(scale.dtype), g_base.to(base.dtype), None, None, None, None, None, None)


_mhc_pre_from_mixes_op.register_autograd(_from_mixes_backward, setup_context=_from_mixes_setup)


@torch.library.custom_op("kernelnotes::mhc_post", mutates_args=())
def _mhc_post_op(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                 comb_mix: torch.Tensor, config: list[int] | None) -> torch.Tensor:
    return _post(x, residual, post_mix, comb_mix, _decode(config, _STREAM_KEYS))


@_mhc_post_op.register_fake
def _(x, residual, post_mix, comb_mix, config):
    return torch.empty_like(residual)


def _mhc_post_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])


@torch.library.custom_op("kernelnotes::mhc_post_backward", mutates_args=())
def _mhc_post_backward_op(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                          comb_mix: torch.Tensor, grad: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _post_backward(x, residual, post_mix, comb_mix, grad)


@_mhc_post_backward_op.register_fake
def _(x, residual, post_mix, comb_mix, grad):
    return tuple(torch.empty_like(t) for t in (x, residual, post_mix, comb_mix))


def _mhc_post_backward(ctx, grad):
    return *_mhc_post_backward_op(*ctx.saved_tensors, grad), None


_mhc_post_op.register_autograd(_mhc_post_backward, setup_context=_mhc_post_setup)


@torch.library.custom_op("kernelnotes::mhc_split_fn", mutates_args=())
def _split_fn_op(fn: torch.Tensor) -> torch.Tensor:
    return _split_fn(fn)


@_split_fn_op.register_fake
def _(fn):
    return fn.new_empty((2, *fn.shape), dtype=torch.bfloat16)
# --8<-- [end:custom_ops]


# --8<-- [start:launchers]
class MhcPre(NamedTuple):
    """What `mhc_pre` and `mhc_pre_from_mixes` return."""

    layer_input: torch.Tensor  # A_l X_l, [T, H] bfloat16
    post_mix: torch.Tensor  # C_l, [T, 4] float32
    comb_mix: torch.Tensor  # comb = B_l^T, [T, 4, 4] float32


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            *, rms_eps: float = 1e-6, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            post_mult: float = 2.0, sinkhorn_iters: int = 20, num_splits: int | None = None,
            config: dict | None = None) -> MhcPre:
    """The whole mHC pre step: RMS, the 24-wide projection, gates, Sinkhorn and A_l X_l.

    DeepSeek-V4 (report eqs. 1-7) with the paper's reordering (Xie et al. 2025,
    arXiv:2512.24880, sec. 4.3.1): the projection runs on the un-normalised residual and is
    divided by the RMS afterwards. Three launches: fn split into bf16 hi + lo parts, a split-K
    projection that reads the residual once and writes ``dot_mix`` [S, T, 24] and
    ``sqrsum`` [S, T], then the big-fuse kernel (see `mhc_pre_from_mixes`). Given fn
    already split by `split_fn` (once, when the weights load), two launches, the same
    bits. A ``kernelnotes::mhc_pre`` custom op: works under ``torch.compile`` and
    ``FakeTensorMode``, and is differentiable with respect to residual, fn, scale and base
    (the backward recomputes the projection with this kernel, takes the gates back in one kernel
    and writes the residual's gradient in one more pass).

    Args:
        residual: X_l, [T, 4, H] bfloat16, contiguous, T >= 1, any H >= 1; CUDA (CPU under
            Triton's interpreter).
        fn: W^fused transposed, [24, 4H] float32, rows [pre 0..3 | post 4..7 | comb 8..23];
            or its hi + lo parts from `split_fn`, [2, 24, 4H] bfloat16. Non-finite
            entries behave as in the float32 torch reference (an inf saturates its gate).
        scale: [3] float32, (alpha_pre, alpha_post, alpha_res).
        base: [24] float32, the static part S, one per slot.
        rms_eps: added to the mean square; a finite number > 0 (DeepSeek-V4: 1e-6).
        pre_eps: added to each pre gate; a finite number > 0 (1e-6).
        sinkhorn_eps: Sinkhorn's floor and denominators; a finite number > 0 (1e-6).
        post_mult: C_l = post_mult * sigmoid(.); finite (DeepSeek-V4: 2.0; FlashInfer 1.0).
        sinkhorn_iters: row + column normalisations, an int >= 1 (DeepSeek-V4: 20).
        num_splits: K-splits of the projection, an int >= 1 (default: enough programs to fill
            the GPU).
        config: None (on a GPU fixed projection tiles and an autotuned big-fuse tile; a small
            fixed one under the interpreter) or ``{"project": {...}, "fuse": {...}}`` with
            ``project`` keys BLOCK_T, BLOCK_K (a power of two dividing 256), optional
            num_warps, num_stages and ``fuse`` keys BLOCK_T, BLOCK_H, optional num_warps.

    Returns:
        MhcPre(layer_input [T, H] bfloat16 (A_l X_l), post_mix [T, 4] float32 (C_l),
        comb_mix [T, 4, 4] float32 (comb, with B_l = comb^T)).

    Raises:
        TypeError: an argument of the wrong type or dtype (named in the message).
        ValueError: a wrong shape, an empty or non-contiguous tensor, tensors on different
            devices or on one the kernels cannot run on, a non-finite or non-positive eps,
            a bad config.
    """
    _check_common(residual, scale, base, sinkhorn_iters, post_mult, rms_eps=rms_eps,
                  pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps)
    K = N_HC * residual.shape[2]
    check_tensor("fn", fn, dtypes=(torch.float32, torch.bfloat16), contiguous=True,
                 device=residual.device)
    if fn.dtype == torch.bfloat16 and tuple(fn.shape) != (2, N_MIX, K):
        raise ValueError(f"a split fn (bfloat16) must have shape (2, 24, 4H) = (2, 24, {K}), "
                         f"got {tuple(fn.shape)}")
    if fn.dtype == torch.float32 and tuple(fn.shape) != (N_MIX, K):
        raise ValueError(f"fn must have shape (24, 4H) = (24, {K}), got {tuple(fn.shape)}")
    if num_splits is not None:
        _check_int("num_splits", num_splits, 1)
    if config is not None:
        if not (isinstance(config, dict) and set(config) == {"project", "fuse"}):
            raise ValueError("config must be None or a dict with the keys 'project' and 'fuse', "
                             f"got {config!r}")
        _check_config("config['project']", config["project"], _PROJECT_SIZES)
        _check_config("config['fuse']", config["fuse"], _STREAM_SIZES)
        config = _encode(config["project"], _PROJECT_KEYS) + _encode(config["fuse"],
                                                                     _STREAM_KEYS)
    out = _mhc_pre_op(residual, fn, scale, base, float(rms_eps), float(pre_eps),
                      float(sinkhorn_eps), float(post_mult), int(sinkhorn_iters),
                      num_splits, config)
    return MhcPre(*out)


def split_fn(fn: torch.Tensor) -> torch.Tensor:
    """fn [24, 4H] float32 -> its bf16 hi and lo parts [2, 24, 4H], for `mhc_pre`.

    fn = hi + lo to 2^-16 relative (hi is fn rounded to bf16, lo the remainder rounded): the
    projection's bf16 MMA, with both parts side by side, carries fn that exactly. ``mhc_pre``
    splits fn on every call, one extra launch; a model whose fn is a fixed weight splits it
    once, when the weights load, and passes the parts instead. Redo the split whenever fn
    changes. An inf entry is carried whole by hi (lo is 0 there).

    Args:
        fn: [24, 4H] float32, contiguous, H >= 1; CUDA (CPU under Triton's interpreter).

    Returns:
        [2, 24, 4H] bfloat16: hi, then lo.

    Raises:
        TypeError: fn is not a float32 tensor.
        ValueError: a wrong shape, a non-contiguous fn, a device the kernel cannot run on.
        RuntimeError: fn requires grad (the split has no backward: pass fn itself to
            `mhc_pre` to train it).
    """
    check_tensor("fn", fn, dtypes=(torch.float32,), ndim=2, contiguous=True)
    _check_device("fn", fn)
    if fn.shape[0] != N_MIX or fn.shape[1] % N_HC or fn.shape[1] == 0:
        raise ValueError(f"fn must have shape (24, 4H) with H >= 1, got {tuple(fn.shape)}")
    if fn.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("kernelnotes::mhc_split_fn has no backward: pass fn itself to "
                           "mhc_pre to train it (or split a detached fn)")
    return _split_fn_op(fn)


def mhc_pre_from_mixes(dot_mix: torch.Tensor, sqrsum: torch.Tensor, residual: torch.Tensor,
                       scale: torch.Tensor, base: torch.Tensor, *, rms_eps: float = 1e-6,
                       pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
                       post_mult: float = 2.0, sinkhorn_iters: int = 20,
                       config: dict | None = None) -> MhcPre:
    """mhc_pre from a precomputed projection: FlashInfer's ``mhc_pre_big_fuse`` boundary.

    rstd = 1/sqrt(sum_s sqrsum[s] / (4H) + rms_eps); mixes = (sum_s dot_mix[s]) * rstd; then
    pre/post gates, Sinkhorn and layer_input as `mhc_pre`. One program per
    (BLOCK_T tokens, BLOCK_H columns), after one metadata program (post gates and Sinkhorn) per
    META_T tokens. A ``kernelnotes::mhc_pre_from_mixes`` custom op, differentiable with
    respect to dot_mix, sqrsum, residual, scale and base.

    Args:
        dot_mix: x @ fn^T of the un-normalised flat residual, [T, 24] or split-K [S, T, 24],
            float32, contiguous.
        sqrsum: sum of x^2 per token, [T] or [S, T] (as dot_mix), float32, contiguous.
        residual: X_l, [T, 4, H] bfloat16, as `mhc_pre`.
        scale: [3] float32; base: [24] float32.
        rms_eps, pre_eps, sinkhorn_eps, post_mult, sinkhorn_iters: as `mhc_pre`.
        config: None (autotune on a GPU) or a dict with BLOCK_T, BLOCK_H, optional num_warps.

    Returns:
        MhcPre(layer_input [T, H] bfloat16, post_mix [T, 4] float32,
        comb_mix [T, 4, 4] float32).

    Raises:
        TypeError: an argument of the wrong type or dtype (named in the message).
        ValueError: shapes that do not match, empty or non-contiguous tensors, devices, eps
            or config as `mhc_pre`.
    """
    _check_common(residual, scale, base, sinkhorn_iters, post_mult, rms_eps=rms_eps,
                  pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps)
    T = residual.shape[0]
    check_tensor("dot_mix", dot_mix, dtypes=(torch.float32,), contiguous=True,
                 device=residual.device)
    check_tensor("sqrsum", sqrsum, dtypes=(torch.float32,), contiguous=True,
                 device=residual.device)
    if dot_mix.ndim == 2:
        dot_mix = dot_mix[None]
    if sqrsum.ndim == 1:
        sqrsum = sqrsum[None]
    S = dot_mix.shape[0]
    if dot_mix.ndim != 3 or tuple(dot_mix.shape[1:]) != (T, N_MIX) or S < 1:
        raise ValueError(f"dot_mix must be [T, 24] or [S, T, 24] with T = {T}, "
                         f"got shape {tuple(dot_mix.shape)}")
    if tuple(sqrsum.shape) != (S, T):
        raise ValueError(f"sqrsum must be [T] or [S, T] matching dot_mix (S = {S}, T = {T}), "
                         f"got shape {tuple(sqrsum.shape)}")
    if config is not None:
        _check_config("config", config, _STREAM_SIZES)
    out = _mhc_pre_from_mixes_op(dot_mix, sqrsum, residual, scale, base, float(rms_eps),
                                 float(pre_eps), float(sinkhorn_eps), float(post_mult),
                                 int(sinkhorn_iters), _encode(config, _STREAM_KEYS))
    return MhcPre(*out)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
             comb_mix: torch.Tensor, *, config: dict | None = None) -> torch.Tensor:
    """X_{l+1} = B_l X_l + C_l F: out[t, k] = post[t, k] x[t] + sum_j comb[t, j, k] residual[t, j].

    The residual update of DeepSeek-V4 (report eq. 1; ``hc_post``) and FlashInfer's ``mhc_post``,
    accumulated in float32 and rounded once to bfloat16. A ``kernelnotes::mhc_post`` custom op,
    differentiable with respect to every input.

    Args:
        x: the sublayer output F_l(A_l X_l), [T, H] bfloat16, contiguous.
        residual: X_l, [T, 4, H] bfloat16, contiguous, T >= 1; CUDA (CPU under Triton's
            interpreter).
        post_mix: C_l, [T, 4] (or [T, 4, 1]) float32, contiguous.
        comb_mix: comb = B_l^T, [T, 4, 4] float32, contiguous.
        config: None (autotune on a GPU) or a dict with BLOCK_T, BLOCK_H, optional num_warps.

    Returns:
        X_{l+1}, [T, 4, H] bfloat16.

    Raises:
        TypeError: an argument of the wrong type or dtype (named in the message).
        ValueError: shapes that do not match, empty or non-contiguous tensors, tensors on
            different devices or on one the kernels cannot run on, a bad config.
    """
    check_tensor("residual", residual, dtypes=(torch.bfloat16,), ndim=3, nonempty=True,
                 contiguous=True)
    _check_device("residual", residual)
    T, n, H = residual.shape
    if n != N_HC:
        raise ValueError(f"residual must be [T, 4, H] (4 streams), got {tuple(residual.shape)}")
    check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2, contiguous=True, device=residual.device)
    if tuple(x.shape) != (T, H):
        raise ValueError(f"x must have shape (T, H) = {(T, H)}, got {tuple(x.shape)}")
    check_tensor("post_mix", post_mix, dtypes=(torch.float32,), contiguous=True,
                 device=residual.device)
    if tuple(post_mix.shape) not in ((T, N_HC), (T, N_HC, 1)):
        raise ValueError(f"post_mix must have shape {(T, 4)} or {(T, 4, 1)}, "
                         f"got {tuple(post_mix.shape)}")
    check_tensor("comb_mix", comb_mix, dtypes=(torch.float32,), contiguous=True,
                 device=residual.device)
    if tuple(comb_mix.shape) != (T, N_HC, N_HC):
        raise ValueError(f"comb_mix must have shape {(T, 4, 4)}, got {tuple(comb_mix.shape)}")
    if config is not None:
        _check_config("config", config, _STREAM_SIZES)
    return _mhc_post_op(x, residual, post_mix.reshape(T, N_HC), comb_mix,
                        _encode(config, _STREAM_KEYS))
# --8<-- [end:launchers]
