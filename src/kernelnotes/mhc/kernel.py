"""mHC in Triton: the pre step (projection + gates + Sinkhorn + layer input) and the post step.

Order: the jit kernels (split-K projection, big-fuse, post), then the torch-facing launchers
``mhc_pre``, ``mhc_pre_from_mixes`` and ``mhc_post``. The semantics are DeepSeek-V4's
(report eq. 1-7) and the FlashInfer kernels' (``mhc_pre_big_fuse``, ``mhc_post``, PR #3285);
docs/posts/08-mhc-kernel-study.md maps one onto the other. Forward only (inference).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime import driver

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import check_kernel_device, check_real, check_tensor, check_tiles

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
    both streaming kernels 2% to 5% slower on the H200, not faster (post 08)."""
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
    tl.store(w_ptr + offs, hi.to(tl.bfloat16), mask=mask)  # exact: hi is a bf16 value
    tl.store(w_ptr + n + offs, _round_bf16(w - hi).to(tl.bfloat16), mask=mask)
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


# --8<-- [start:configs]
# The streaming kernels, (BLOCK_T, BLOCK_H, num_warps): 512 to 4096 elements per stream and
# program, 4 to 16 bf16 per thread and stream, four streams in flight per thread; BLOCK_T = 1
# gives small T the most programs. Which wins depends on the kernel and H (H200 sweeps at
# T = 8192: for mhc_pre_from_mixes at H = 4096 the 8 x 512 and 2 x 1024 tiles, for mhc_post
# 1 x 512 and 1 x 2048; within 2% of each other at H = 7168): five candidates.
STREAM_CONFIGS = [triton.Config({"BLOCK_T": t, "BLOCK_H": h}, num_warps=w)
                  for t, h, w in ((1, 512, 4), (1, 1024, 4), (2, 1024, 4), (1, 2048, 8),
                                  (8, 512, 8))]
# The projection: fixed tiles, no autotuner. 64 tokens (the MMA's M) by 128 columns of K a step,
# fn's tiles streaming from L2 beside the residual's. It was autotuned against 128 x 64 (8 warps,
# 4 stages) until H200 graph timings of the whole mhc_pre found 64 x 128 faster at every T tried,
# 1 to 8192 at both H (by 12% to 21% up to T = 512, 1% to 2% at 1024), where the autotuner,
# timing the kernel alone from a cold L2, had picked 128 x 64 for some T (post 08). Fixed tiles
# with the same bits also keep mhc_pre's bits from depending on a process's autotuner.
PROJECT_TILE = {"BLOCK_T": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
# Where one program an SM still fills the GPU (_fills; T = 8192), 128 tokens and 4 stages: 160 KiB
# of shared memory, so one program an SM, with 64 KiB of the residual in flight on it against
# 32 KiB (two programs, one step ahead each), and half of fn's bytes per residual byte. The same
# bits as the 64-token tile (same K-splits and steps; tested on the GPU); on the H200 1.9 us off
# the whole mhc_pre's GPU time at T = 8192, H = 7168, level at 4096 and at T = 1024 (post 08).
PROJECT_TILE_WIDE = {"BLOCK_T": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4}
FILL = 0.9  # the share of the SMs the wide tile's grid must cover
# fn's split: a latency-bound kernel of a few microseconds; 2048 elements and 8 warps a program
# took about 1 us less of the whole mhc_pre than 4096 and 4 (H200, CUDA graphs, both H)
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


# --8<-- [start:run_tuned]
_CHOSEN: dict = {}  # autotune key -> the launch kwargs of the config Triton's autotuner chose
_COMPILED: dict = {}  # (key, specialisation) -> (compiled kernel, its constexpr arguments)


def _specialisation(args) -> tuple:
    """What Triton compiles a kernel for besides its constexprs: each tensor's dtype and 16-byte
    alignment, each int's divisibility by 16, whether it is 1 and whether it fits 32 bits (an
    int's residue mod 16, or a pair where it is 1 or does not fit). A flat tuple built in one
    loop: it runs on every launch, and at small T a call's time is its host time."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec += (a.dtype, a.data_ptr() & 15)
        elif type(a) is int:
            spec.append(a & 15 if a != 1 and -0x80000000 <= a < 0x80000000 else (a == 1, a & 15))
        else:
            spec.append(type(a))
    return tuple(spec)


def _launch(kernel, grid: tuple, key: tuple, args: tuple, consts: dict) -> None:
    """``kernel[grid](*args, **consts)``; on a GPU, after the first call of a key and argument
    specialisation, the compiled kernel is launched directly. Triton's jit launch binds,
    specialises and hashes every argument on every call to find its compiled kernel; this
    looks it up by ``key`` (which must fix ``consts``) and a few alignment bits instead, and
    calls the compiled kernel's launcher as ``CompiledKernel.__getitem__``'s runner does (on
    the current stream, with Triton's launch hooks) without building a runner every call."""
    if args[0].device.type != "cuda":  # the interpreter: nothing compiled to keep
        kernel[grid](*args, **consts)
        return
    spec = (key, _specialisation(args))
    hit = _COMPILED.get(spec)
    if hit is None:
        compiled = kernel[grid](*args, **consts)  # compiles (once per process) and launches
        # the launcher takes every parameter in order, constexprs included (and ignored)
        _COMPILED[spec] = (compiled, tuple(consts[name] for name in kernel.arg_names[len(args):]))
        return
    compiled, tail = hit
    grid = (*grid, 1, 1)[:3]
    stream = driver.active.get_current_stream(driver.active.get_current_device())
    enter = knobs.runtime.launch_enter_hook  # a profiler's (Proton's), else None
    meta = None if enter is None else compiled.launch_metadata(grid, stream, *args, *tail)
    compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, meta, enter,
                 knobs.runtime.launch_exit_hook, *args, *tail)


def _tokens_key(T: int) -> int:
    """T as the autotune keys hold it: rounded up to a power of two. Every new key costs a
    round of the autotuner (each candidate timed for about a tenth of a second), and a model
    meets a new T on almost every call (decoding, ragged batches); the best tile follows T's
    size, not its last digits. The first T of a bucket picks the tile for the whole bucket."""
    return next_power_of_2(T)


def _run_tuned(tuned, grid, key: tuple, *args, **kwargs) -> None:
    """``tuned[grid](*args, **kwargs)`` the first time a key is seen, then its chosen config
    through :func:`_launch`. Triton's autotuner spends tens of microseconds of host time on every
    call, and its jit launch some more; on the H200 that showed in the timings of the short
    kernels (mhc_pre_from_mixes at T = 8192, H = 4096 is one pass over the residual, well under
    a millisecond)."""
    meta = _CHOSEN.get(key)
    if meta is None:
        tuned[grid](*args, **kwargs)
        _CHOSEN[key] = tuned.best_config.all_kwargs()
    else:
        _launch(tuned.fn, grid(meta), key, args, {**kwargs, **meta})
# --8<-- [end:run_tuned]


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: a few splits, to exercise the split-K path


def _check_config(name, config, sizes) -> None:
    """A launch config: a dict with the block sizes ``sizes`` ({key: (least, what it must divide
    or None)}, see check_tiles) and optionally num_warps and num_stages."""
    if not isinstance(config, dict):
        raise TypeError(f"{name} must be a dict, got {type(config).__name__}")
    check_tiles(name, config, sizes, optional=("num_warps", "num_stages"))


# the streaming kernels' tiles; the projection's: BLOCK_T is the MMA's M, BLOCK_K its K
_STREAM_SIZES = {"BLOCK_T": (1, None), "BLOCK_H": (1, None)}
_PROJECT_SIZES = {"BLOCK_T": (16, None), "BLOCK_K": (16, 256)}


def _check_common(residual, scale, base, sinkhorn_iters, post_mult, **eps):
    check_tensor("residual", residual, dtypes=(torch.bfloat16,), ndim=3, nonempty=True,
                 contiguous=True)
    check_kernel_device("residual", residual, _mhc_pre_fuse_kernel)
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
    if not (isinstance(sinkhorn_iters, int) and sinkhorn_iters >= 1):
        raise ValueError(f"sinkhorn_iters must be an int >= 1, got {sinkhorn_iters!r}")


def _dependent(on: bool) -> dict:
    """Launch arguments of a kernel with a ``PDL`` constexpr: with ``on`` (a GPU only), a
    programmatic dependent launch, whose programs may start before the kernel ahead of it in
    the stream has finished and wait for it in gdc_wait; else a plain launch."""
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps, post_mult,
          sinkhorn_iters, config, reverse, layer_input=None, pdl=False):
    """The big-fuse launch. Given a ``layer_input`` that another kernel has written (the
    one-pass design study, onepass.py), only its metadata programs run: C_l and Sinkhorn."""
    T, _, H = residual.shape
    S = dot_mix.shape[0]
    if config is None and residual.device.type != "cuda":
        config = INTERPRETER_CONFIG["fuse"]
    written = layer_input is not None
    if not written:
        layer_input = torch.empty((T, H), dtype=torch.bfloat16, device=residual.device)
    post_mix = torch.empty((T, N_HC), dtype=torch.float32, device=residual.device)
    comb_mix = torch.empty((T, N_HC, N_HC), dtype=torch.float32, device=residual.device)
    args = (dot_mix, sqrsum, residual, scale, base, layer_input, post_mix, comb_mix, T, H, S,
            1.0 / (N_HC * H), float(rms_eps), float(pre_eps), float(sinkhorn_eps),
            float(post_mult), int(sinkhorn_iters))
    meta_t = META_T["cuda" if residual.device.type == "cuda" else "cpu"]
    n_meta = cdiv(T, meta_t)
    grid = lambda m: (n_meta + cdiv(T, m["BLOCK_T"]) * cdiv(H, m["BLOCK_H"]),)  # noqa: E731
    s_max = next_power_of_2(S)
    fixed = dict(S_MAX=s_max, REVERSE=reverse, META_T=meta_t, **_dependent(pdl))
    if written:  # a grid of metadata programs alone: the streaming tile sizes go unused
        _mhc_pre_fuse_kernel[(n_meta,)](*args, **fixed, BLOCK_T=1, BLOCK_H=512, num_warps=4)
    elif config is None:
        key = ("fuse", H, _tokens_key(T), S, reverse, pdl, residual.device)
        _run_tuned(_fuse_tuned, grid, key, *args, **fixed)
    else:
        cfg = dict(config)
        _mhc_pre_fuse_kernel[grid(cfg)](*args, **fixed, **cfg)
    return layer_input, post_mix, comb_mix


# --8<-- [start:launchers]
def mhc_pre(residual, fn, scale, base, *, rms_eps=1e-6, pre_eps=1e-6, sinkhorn_eps=1e-6,
            post_mult=2.0, sinkhorn_iters=20, num_splits=None, config=None):
    """The whole mHC pre step: RMS, the 24-wide projection, gates, Sinkhorn and A_l X_l.

    DeepSeek-V4 (report eqs. 1-7) with the paper's reordering (Xie et al. 2025,
    arXiv:2512.24880, sec. 4.3.1): the projection runs on the un-normalised residual and is
    divided by the RMS afterwards. Three launches: fn split into bf16 hi + lo parts, a split-K
    projection that reads the residual once and writes ``dot_mix`` [S, T, 24] and
    ``sqrsum`` [S, T], then the big-fuse kernel (see :func:`mhc_pre_from_mixes`). On a GPU the
    projection and the big-fuse are programmatic dependent launches: each is launched while the
    kernel before it drains and waits for it before its first read. Given fn already split by
    :func:`split_fn` (once, when the weights load), two launches, the same bits.

    Args:
        residual: X_l, [T, 4, H] bfloat16, contiguous, T >= 1, any H.
        fn: W^fused transposed, [24, 4H] float32, rows [pre 0..3 | post 4..7 | comb 8..23];
            or its hi + lo parts from :func:`split_fn`, [2, 24, 4H] bfloat16.
        scale: [3] float32, (alpha_pre, alpha_post, alpha_res).
        base: [24] float32, the static part S, one per slot.
        rms_eps, pre_eps, sinkhorn_eps: > 0 (DeepSeek-V4: 1e-6 each).
        post_mult: C_l = post_mult * sigmoid(.) (DeepSeek-V4: 2.0; FlashInfer's default 1.0).
        sinkhorn_iters: row + column normalisations (DeepSeek-V4: 20).
        num_splits: K-splits of the projection (default: enough programs to fill the GPU).
        config: None (on a GPU the projection's fixed tiles, PROJECT_TILE_WIDE where its grid
            fills the GPU and PROJECT_TILE elsewhere, with the same bits, and an autotuned
            big-fuse tile; a small fixed one under the interpreter) or
            ``{"project": {...}, "fuse": {...}}`` with ``project`` keys BLOCK_T, BLOCK_K
            (dividing 256), num_warps, num_stages and ``fuse`` keys BLOCK_T, BLOCK_H,
            num_warps (what the tests pass).
    Returns:
        layer_input [T, H] bfloat16 (A_l X_l), post_mix [T, 4] float32 (C_l),
        comb_mix [T, 4, 4] float32 (comb, with B_l = comb^T).
    """
    _check_common(residual, scale, base, sinkhorn_iters, post_mult, rms_eps=rms_eps,
                  pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps)
    T, _, H = residual.shape
    K = N_HC * H
    if config is None and residual.device.type != "cuda":
        config = INTERPRETER_CONFIG
    if config is not None:
        if not (isinstance(config, dict) and set(config) == {"project", "fuse"}):
            raise ValueError("config must be None or a dict with the keys 'project' and 'fuse', "
                             f"got {config!r}")
        _check_config("config['project']", config["project"], _PROJECT_SIZES)
        _check_config("config['fuse']", config["fuse"], _STREAM_SIZES)
    check_tensor("fn", fn, dtypes=(torch.float32, torch.bfloat16), contiguous=True,
                 device=residual.device)
    if not (num_splits is None or (isinstance(num_splits, int) and num_splits >= 1)):
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")
    if fn.dtype == torch.bfloat16:  # split by split_fn
        if tuple(fn.shape) != (2, N_MIX, K):
            raise ValueError(f"a split fn (bfloat16) must have shape (2, 24, 4H) = (2, 24, {K}), "
                             f"got {tuple(fn.shape)}")
        w = fn
    elif tuple(fn.shape) != (N_MIX, K):
        raise ValueError(f"fn must have shape (24, 4H) = (24, {K}), got {tuple(fn.shape)}")
    else:
        w = _split_fn(fn)
    dot_mix, sqrsum = _project(residual, w, num_splits, config)
    # backwards, to meet the projection's last reads in L2; on an H200 that buys ~nothing (post 08)
    return _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps,
                 post_mult, sinkhorn_iters, None if config is None else config["fuse"],
                 reverse=True, pdl=residual.device.type == "cuda")


def split_fn(fn):
    """fn [24, 4H] float32 -> its bf16 hi and lo parts [2, 24, 4H], for :func:`mhc_pre`.

    fn = hi + lo to 2^-16 relative (hi is fn rounded to bf16, lo the remainder rounded): the
    projection's bf16 MMA, with both parts side by side, carries fn that exactly. ``mhc_pre``
    splits fn on every call, one extra launch; a model whose fn is a fixed weight splits it
    once, when the weights load, and passes the parts instead. Redo the split whenever fn
    changes.
    """
    check_tensor("fn", fn, dtypes=(torch.float32,), ndim=2, contiguous=True)
    check_kernel_device("fn", fn, _mhc_split_fn_kernel)
    if fn.shape[0] != N_MIX or fn.shape[1] % N_HC or fn.shape[1] == 0:
        raise ValueError(f"fn must have shape (24, 4H) with H >= 1, got {tuple(fn.shape)}")
    return _split_fn(fn)


def _split_fn(fn):
    """fn [24, K] fp32 -> [2, 24, K] bf16, its hi and lo parts (_mhc_split_fn_kernel)."""
    n = fn.numel()
    w = torch.empty((2, *fn.shape), dtype=torch.bfloat16, device=fn.device)
    _launch(_mhc_split_fn_kernel, (cdiv(n, SPLIT_TILE["BLOCK"]),), ("split", fn.device), (fn, w, n),
            {**SPLIT_TILE, "PDL": fn.device.type == "cuda"})
    return w


def _project(residual, w, num_splits, config):
    """dot_mix [S, T, 24] and sqrsum [S, T] by the split-K projection."""
    T, _, H = residual.shape
    K = N_HC * H
    sms = _sm_count(residual.device)
    S, k_split = _splits(T, K, num_splits, sms)
    dot_mix = torch.empty((S, T, N_MIX), dtype=torch.float32, device=residual.device)
    sqrsum = torch.empty((S, T), dtype=torch.float32, device=residual.device)
    args = (residual, w, dot_mix, sqrsum, T, K, k_split)
    grid = lambda meta: (S, cdiv(T, meta["BLOCK_T"]))  # noqa: E731
    gpu = residual.device.type == "cuda"
    if config is None:  # on a GPU: the wide tile where its grid fills the GPU, else the 64-token
        tile = PROJECT_TILE_WIDE if _fills(T, S, sms) else PROJECT_TILE
        _launch(_mhc_project_kernel, grid(tile), ("project", tile["BLOCK_T"], residual.device),
                args, {**tile, "MMA_BF16": gpu, **_dependent(gpu)})
    else:
        cfg = dict(config["project"])
        _mhc_project_kernel[grid(cfg)](*args, MMA_BF16=gpu, **_dependent(gpu), **cfg)
    return dot_mix, sqrsum


def _splits(T: int, K: int, num_splits: int | None, sms: int) -> tuple[int, int]:
    """(S, K columns per split) of the projection on a GPU of ``sms`` SMs: ``num_splits``, or by
    default ~2 programs per SM of 64-token blocks. Long K loops keep the load pipeline full, and
    few splits keep the partials that the big-fuse kernel sums few (H200 sweep at T = 8192:
    2 splits 81 us, 16 splits 92 us for H = 4096). Split boundaries fall on multiples of
    K_SPLIT_ALIGN, and every split is non-empty."""
    if num_splits is None:
        num_splits = max(1, min(2 * sms // cdiv(T, 64), cdiv(K, K_SPLIT_ALIGN), MAX_SPLITS))
    k_split = cdiv(cdiv(K, num_splits), K_SPLIT_ALIGN) * K_SPLIT_ALIGN
    return cdiv(K, k_split), k_split


def _fills(T: int, S: int, sms: int) -> bool:
    """Whether the wide projection tile's grid, one program an SM, covers FILL of ``sms`` SMs."""
    return cdiv(T, PROJECT_TILE_WIDE["BLOCK_T"]) * S >= FILL * sms


def mhc_pre_from_mixes(dot_mix, sqrsum, residual, scale, base, *, rms_eps=1e-6, pre_eps=1e-6,
                       sinkhorn_eps=1e-6, post_mult=2.0, sinkhorn_iters=20, config=None):
    """mhc_pre from a precomputed projection: FlashInfer's ``mhc_pre_big_fuse`` boundary.

    rstd = 1/sqrt(sum_s sqrsum[s] / (4H) + rms_eps); mixes = (sum_s dot_mix[s]) * rstd; then
    pre/post gates, Sinkhorn and layer_input as :func:`mhc_pre`. One program per
    (BLOCK_T tokens, BLOCK_H columns), after one metadata program (post gates and Sinkhorn) per
    META_T tokens.

    Args:
        dot_mix: x @ fn^T of the un-normalised flat residual, [T, 24] or split-K [S, T, 24],
            float32, contiguous.
        sqrsum: sum of x^2 per token, [T] or [S, T], float32, contiguous.
        residual, scale, base, eps, post_mult, sinkhorn_iters: as :func:`mhc_pre`.
        config: None (autotune on a GPU) or a dict with BLOCK_T, BLOCK_H, num_warps.
    Returns:
        layer_input [T, H] bfloat16, post_mix [T, 4] float32, comb_mix [T, 4, 4] float32.
    """
    _check_common(residual, scale, base, sinkhorn_iters, post_mult, rms_eps=rms_eps,
                  pre_eps=pre_eps, sinkhorn_eps=sinkhorn_eps)
    T = residual.shape[0]
    check_tensor("dot_mix", dot_mix, dtypes=(torch.float32,), contiguous=True,
                 device=residual.device)
    check_tensor("sqrsum", sqrsum, dtypes=(torch.float32,), contiguous=True, device=residual.device)
    if dot_mix.ndim == 2:
        dot_mix, sqrsum = dot_mix[None], sqrsum[None]
    S = dot_mix.shape[0]
    if dot_mix.ndim != 3 or tuple(dot_mix.shape[1:]) != (T, N_MIX) or S < 1:
        raise ValueError(f"dot_mix must be [T, 24] or [S, T, 24] with T = {T}, "
                         f"got shape {tuple(dot_mix.shape)}")
    if tuple(sqrsum.shape) != (S, T):
        raise ValueError(f"sqrsum must be [T] or [S, T] matching dot_mix (S = {S}, T = {T}), "
                         f"got shape {tuple(sqrsum.shape)}")
    if config is not None:
        _check_config("config", config, _STREAM_SIZES)
    return _fuse(dot_mix, sqrsum, residual, scale, base, rms_eps, pre_eps, sinkhorn_eps,
                 post_mult, sinkhorn_iters, config, reverse=False)


def mhc_post(x, residual, post_mix, comb_mix, *, config=None):
    """X_{l+1} = B_l X_l + C_l F: out[t, k] = post[t, k] x[t] + sum_j comb[t, j, k] residual[t, j].

    The residual update of DeepSeek-V4 (report eq. 1; ``hc_post``) and FlashInfer's ``mhc_post``,
    accumulated in float32 and rounded once to bfloat16.

    Args:
        x: the sublayer output F_l(A_l X_l), [T, H] bfloat16, contiguous.
        residual: X_l, [T, 4, H] bfloat16, contiguous.
        post_mix: C_l, [T, 4] (or [T, 4, 1]) float32.
        comb_mix: comb = B_l^T, [T, 4, 4] float32.
        config: None (autotune on a GPU) or a dict with BLOCK_T, BLOCK_H, num_warps.
    Returns:
        X_{l+1}, [T, 4, H] bfloat16.
    """
    check_tensor("residual", residual, dtypes=(torch.bfloat16,), ndim=3, nonempty=True,
                 contiguous=True)
    check_kernel_device("residual", residual, _mhc_post_kernel)
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
    if config is None and residual.device.type != "cuda":
        config = INTERPRETER_CONFIG["fuse"]
    if config is not None:
        _check_config("config", config, _STREAM_SIZES)
    out = torch.empty_like(residual)
    grid = lambda m: (cdiv(T, m["BLOCK_T"]) * cdiv(H, m["BLOCK_H"]),)  # noqa: E731
    if config is None:
        _run_tuned(_post_tuned, grid, ("post", H, _tokens_key(T), residual.device), x, residual,
                   post_mix, comb_mix, out, T, H)
    else:
        _mhc_post_kernel[grid(config)](x, residual, post_mix, comb_mix, out, T, H, **config)
    return out
# --8<-- [end:launchers]
