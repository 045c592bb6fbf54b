"""FlashAttention-2 in Triton: forward, backward, and a drop-in for F.scaled_dot_product_attention.

On a Hopper GPU the D = 128 forward runs hopper.py's kernel instead (FlashAttention-3's schedule,
Shah et al. 2024, arXiv:2407.08608) for the shapes that kernel takes; see ``_launch_fwd``.
Order: the jit kernels (forward; backward preprocess, dK/dV and dQ), then the launchers, then the
torch custom operators ``kernelnotes::flash_attn_fwd`` / ``kernelnotes::flash_attn_bwd`` (fake
implementations and autograd), then the public functions ``flash_attention`` (SDPA's signature),
``flash_attn_fwd`` and ``flash_attn_bwd``.
The algorithm is Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning" (2023, arXiv:2307.08691), Algorithms 1 and 2; the post is
docs/posts/09-flash-attention-2.md. Written for this project, not adapted from the Triton tutorial.
The fused backward (dQ added with atomics) is the paper's Section 3.2 scheme; the deterministic
default gives dQ its own kernel instead.

Conventions: q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] with Hq a multiple of Hkv (grouped-query
attention); a causal mask lets query i see key j iff j <= i + causal_off, with causal_off = 0
(top-left, SDPA's ``is_causal``) or Nk - Nq (bottom-right, for decoding with a KV cache); a
query row that sees no key (bottom-right with Nq > Nk) gets O = 0 and L = +inf, so its
gradients are 0 too, as PyTorch's math attention gives for a fully masked row. Scores live in
the log2 domain: S2 = (sm_scale * log2 e) q k^T, so every exponential is an exp2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import (
    check_real,
    check_tensor,
    check_tiles,
    interpreted,
)
from kernelnotes.attention.reference import ALIGNMENTS

try:  # host-side TMA descriptors (Triton >= 3.4); without them D = 128 takes the pointer kernel
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


# --8<-- [start:mma]
@triton.jit
def _mma(a, b, acc, DOT_FP32: tl.constexpr):
    """tl.dot(a, b, acc) with fp32 accumulation. DOT_FP32 is set only under the CPU interpreter for
    bfloat16, whose tl.dot (triton 3.9) multiplies the raw bf16 bit patterns: the upcast operands
    give the same products, as bf16 x bf16 is exact in fp32."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
# --8<-- [end:mma]


# --8<-- [start:key_range]
@triton.jit
def _key_range(start_m, causal_off, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    """Keys of the query tile start_m .. start_m + BLOCK_M: [0, n_full) in whole tiles that every
    row sees (no mask), [n_full, hi) the diagonal and the key tail (masked). Causal: query i sees
    key j iff j <= i + causal_off (0 top-left, as SDPA; Nk - Nq bottom-right)."""
    if CAUSAL:
        n_full = tl.minimum(tl.maximum(start_m + causal_off + 1, 0), N_K)  # seen by every row
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_off, 0), N_K)  # seen by some row
    else:
        n_full = N_K
        hi = N_K
    return (n_full // BLOCK_N) * BLOCK_N, hi
# --8<-- [end:key_range]


# --8<-- [start:tile_order]
@triton.jit
def _tile_order(LPT_HEADS, CAUSAL: tl.constexpr):
    """(query tile, batch-head) of this program. Causal tiles differ in work (tile i sees i + 1
    key tiles), so they go longest first, across groups of LPT_HEADS heads: all the group's
    last tiles, then its second-to-last, ... A late heavy tile would otherwise set the
    kernel's tail; the group keeps the heads that run together few enough that their keys
    and values stay in L2. Without a mask every tile has the same work: launch order."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if CAUSAL:
        n_m = tl.num_programs(0)
        pid = pid_bh * n_m + pid_m  # the launch order
        group = pid // (LPT_HEADS * n_m)
        rank = pid % (LPT_HEADS * n_m)
        heads = tl.minimum(LPT_HEADS, tl.num_programs(1) - group * LPT_HEADS)  # last: fewer
        pid_m = n_m - 1 - rank // heads
        pid_bh = group * LPT_HEADS + rank % heads
    return pid_m, pid_bh
# --8<-- [end:tile_order]


# --8<-- [start:softmax_step]
@triton.jit
def _visible(offs_m, offs_kv, N_K, causal_off, CAUSAL: tl.constexpr,
             EVEN_N: tl.constexpr = False):
    """[rows, keys]: query i may see key j, i.e. j < Nk and, if CAUSAL, j <= i + causal_off.
    EVEN_N: Nk is a multiple of the key tile, so no tile the forward visits runs past Nk and
    j < Nk holds; the diagonal tiles then cost one compare a score, not two and an and."""
    if CAUSAL:
        visible = offs_kv[None, :] <= offs_m[:, None] + causal_off
        if not EVEN_N:
            visible = visible & (offs_kv[None, :] < N_K)
    else:
        visible = offs_kv[None, :] < N_K
    return visible


@triton.jit
def _softmax_step(qk, l_i, m_i, qk_scale, MASK: tl.constexpr):
    """One online-softmax update of a score tile qk (S2 = qk_scale * qk):
    m^(j) = max(m^(j-1), rowmax S2), P~ = 2^(S2 - m^(j)), alpha = 2^(m^(j-1) - m^(j)),
    l^(j) = alpha l^(j-1) + rowsum P~. Returns P~, alpha, l^(j), m^(j)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASK:  # a row that has seen only masked keys keeps m = -inf: subtract 0 instead
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    p = tl.math.exp2(qk * qk_scale - m_sub[:, None])  # one fma and one exp2 per score
    alpha = tl.math.exp2(m_i - m_sub)  # m starts at -inf, so alpha is 0 on the first tile
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new
# --8<-- [end:softmax_step]


# --8<-- [start:fwd_inner]
@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_n, offs_d,
               lo, hi, N_K, causal_off, qk_scale,
               MASK: tl.constexpr,  # tail or diagonal tiles: apply the key bound and causal mask
               CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, EVEN_N: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_kv = start_n + offs_n  # key indices j of this tile           [BLOCK_N]
        kv_mask = offs_d[None, :] < HEAD_DIM  # padded head-dim columns load as 0
        if MASK and not EVEN_N:
            kv_mask = kv_mask & (offs_kv[:, None] < N_K)
        k = tl.load(k_base + offs_kv[:, None] * stride_kn + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        qk = _mma(q, tl.trans(k), None, DOT_FP32)  # Q_i K_jᵀ, so S2_ij = qk_scale * qk
        if MASK:
            qk = tl.where(_visible(offs_m, offs_kv, N_K, causal_off, CAUSAL, EVEN_N), qk,
                          float("-inf"))
        p, alpha, l_i, m_i = _softmax_step(qk, l_i, m_i, qk_scale, MASK)  # P̃_ij, α, ℓ_i, m_i
        v = tl.load(v_base + offs_kv[:, None] * stride_vn + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        acc = acc * alpha[:, None]
        acc = _mma(p.to(v.dtype), v, acc, DOT_FP32)  # Õ_i^(j) = diag(α) Õ_i^(j-1) + P̃_ij V_j
    return acc, l_i, m_i
# --8<-- [end:fwd_inner]


# --8<-- [start:fwd_kernel]
@triton.jit
def _flash_attn_fwd_kernel(
    Q, K, V, O,  # q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; o [B, Hq, Nq, D] contiguous
    L,  # [B, Hq, Nq] fp32 log-sum-exp (natural log), +inf for a row that sees no key
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H_Q, N_Q, N_K,  # Hq query heads; Nq queries; Nk keys
    CAUSAL_OFF,  # causal: query i sees key j iff j <= i + CAUSAL_OFF (0: top-left)
    GROUP,  # Hq // Hkv query heads share one key/value head
    sm_scale,  # σ, usually 1/sqrt(D)
    LPT_HEADS,  # causal: heads per longest-first group (_tile_order)
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # D padded to a power of two >= 16
    BLOCK_M: tl.constexpr,  # B_r: queries per program
    BLOCK_N: tl.constexpr,  # B_c: keys per inner step
    DOT_FP32: tl.constexpr = False,  # CPU interpreter with bf16 only (see _mma)
    EVEN_N: tl.constexpr = False,  # Nk % BLOCK_N == 0: no key tile runs past Nk
):
    pid_m, pid_bh = _tile_order(LPT_HEADS, CAUSAL)
    off_b = (pid_bh // H_Q).to(tl.int64)
    off_h = (pid_bh % H_Q).to(tl.int64)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm \
        + offs_d[None, :] * stride_qd
    q_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptrs, mask=q_mask, other=0.0)  # Q_i stays on chip for the whole loop
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    # the launcher passes unit head-dim strides for k and v (it copies otherwise)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # fold log2(e) into σ: exp(x) = exp2(x log2 e)

    causal_off = CAUSAL_OFF  # query i sees key j iff j <= i + causal_off
    n_full, hi = _key_range(start_m, causal_off, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    # stage 1: tiles below the diagonal and inside [0, Nk): no mask at all
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                               offs_m, offs_n, offs_d, 0, n_full, N_K, causal_off, qk_scale,
                               False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_FP32, EVEN_N)
    # stage 2: the diagonal tiles and the key tail, masked
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                               offs_m, offs_n, offs_d, n_full, hi, N_K, causal_off, qk_scale,
                               True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_FP32, EVEN_N)

    empty = l_i == 0.0  # nothing visible: O = 0 and L = +inf, never 0/0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc * (1.0 / l_safe)[:, None]  # O_i = diag(ℓ_i)⁻¹ Õ_i: B_r divisions, not B_r x D
    lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_ptrs = O + (pid_bh.to(tl.int64) * N_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=q_mask)
    tl.store(L + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)
# --8<-- [end:fwd_kernel]


# --8<-- [start:fwd_tma]
# The Hopper forward for 64 < D <= 128: K, V (and Q) tiles come by TMA from [B*H*N, D] views of
# contiguous tensors, and the unmasked loop is software pipelined so that the tensor cores work
# while the softmax runs (FlashAttention-3's intra-warpgroup overlap, Shah et al. 2024,
# arXiv:2407.08608, written as source order): step t waits for S_t = Q K_t^T, then issues
# acc += P_{t-1} V_{t-1} and leaves it in flight during the softmax of S_t.
@triton.jit
def _tma_rows(desc, row0, start, offs_n, N_K, ZERO_TAIL: tl.constexpr):
    """Rows start .. start + BLOCK_N of one head's keys or values (row0: the head's first row).
    Rows past Nk belong to the next head (or are zero past the tensor): ZERO_TAIL clears them,
    which V needs (P is 0 there, but 0 * inf is NaN) and K does not (its scores are masked)."""
    t = desc.load([row0 + start, 0])
    if ZERO_TAIL:
        t = tl.where((start + offs_n)[:, None] < N_K, t, 0.0)
    return t


@triton.jit
def _fwd_tma_pipelined(acc, l_i, m_i, q, k_desc, v_desc, kv_row0, offs_n, lo, hi, N_K, qk_scale,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr):
    """Tiles lo .. hi (all fully visible, none past Nk), pipelined as described above.

    P crosses iterations as int16 bits: a loop-carried dot operand would be staged through
    shared memory, which makes the P V MMA synchronous; rebuilt from bits inside the loop it
    stays a register operand. The prologue and the last P V sit in `if` blocks of their own, so
    that the prologue's K tile is not kept alive (in shared memory) through the loop."""
    p_bits = tl.zeros([BLOCK_M, BLOCK_N], tl.int16)
    alpha = tl.full([BLOCK_M], 1.0, tl.float32)
    if hi > lo:
        k = _tma_rows(k_desc, kv_row0, lo, offs_n, N_K, False)
        p, alpha, l_i, m_i = _softmax_step(_mma(q, tl.trans(k), None, DOT_FP32), l_i, m_i,
                                           qk_scale, False)
        p_bits = p.to(q.dtype).to(tl.int16, bitcast=True)
    for start_n in range(lo + BLOCK_N, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _tma_rows(k_desc, kv_row0, start_n, offs_n, N_K, False)
        qk = _mma(q, tl.trans(k), None, DOT_FP32)  # S_t: waited for, the softmax needs it
        v = _tma_rows(v_desc, kv_row0, start_n - BLOCK_N, offs_n, N_K, False)
        acc = _mma(p_bits.to(q.dtype, bitcast=True), v, acc * alpha[:, None], DOT_FP32)
        p, alpha, l_i, m_i = _softmax_step(qk, l_i, m_i, qk_scale, False)  # beside that MMA
        p_bits = p.to(q.dtype).to(tl.int16, bitcast=True)
    if hi > lo:
        v = _tma_rows(v_desc, kv_row0, hi - BLOCK_N, offs_n, N_K, False)
        acc = _mma(p_bits.to(q.dtype, bitcast=True), v, acc * alpha[:, None], DOT_FP32)
    return acc, l_i, m_i


@triton.jit
def _fwd_tma_masked(acc, l_i, m_i, q, k_desc, v_desc, kv_row0, offs_m, offs_n, lo, hi, N_K,
                    causal_off, qk_scale, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                    DOT_FP32: tl.constexpr, EVEN_N: tl.constexpr):
    """The diagonal tiles and the key tail: masked, in _fwd_inner's order. With EVEN_N
    (Nk % BLOCK_N == 0) no tile runs past Nk, and V goes from shared memory to the MMA as it
    came: zeroing its tail would take it through registers and back."""
    for start_n in range(lo, hi, BLOCK_N):
        k = _tma_rows(k_desc, kv_row0, start_n, offs_n, N_K, False)
        qk = tl.where(_visible(offs_m, start_n + offs_n, N_K, causal_off, CAUSAL, EVEN_N),
                      _mma(q, tl.trans(k), None, DOT_FP32), float("-inf"))
        p, alpha, l_i, m_i = _softmax_step(qk, l_i, m_i, qk_scale, True)
        v = _tma_rows(v_desc, kv_row0, start_n, offs_n, N_K, not EVEN_N)
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], DOT_FP32)
    return acc, l_i, m_i


@triton.jit
def _flash_attn_fwd_tma_kernel(
    Q, K, V,  # TMA descriptors of [B*Hq*Nq, D], [B*Hkv*Nk, D], [B*Hkv*Nk, D] (contiguous)
    O, L,  # as _flash_attn_fwd_kernel
    N_Q, N_K, CAUSAL_OFF, GROUP, sm_scale, LPT_HEADS,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr = False,
    EVEN_N: tl.constexpr = False,  # Nk % BLOCK_N == 0
):
    pid_m, pid_bh = _tile_order(LPT_HEADS, CAUSAL)  # b * Hq + h; its kv head: pid_bh // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = Q.load([pid_bh * N_Q + start_m, 0])  # rows past Nq: the next head's, never stored
    kv_row0 = (pid_bh // GROUP) * N_K
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634

    causal_off = CAUSAL_OFF
    n_full, hi = _key_range(start_m, causal_off, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fwd_tma_pipelined(acc, l_i, m_i, q, K, V, kv_row0, offs_n, 0, n_full, N_K,
                                       qk_scale, BLOCK_M, BLOCK_N, DOT_FP32)
    acc, l_i, m_i = _fwd_tma_masked(acc, l_i, m_i, q, K, V, kv_row0, offs_m, offs_n, n_full, hi,
                                    N_K, causal_off, qk_scale, CAUSAL, BLOCK_N, DOT_FP32, EVEN_N)

    empty = l_i == 0.0  # nothing visible: O = 0 and L = +inf
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc * (1.0 / l_safe)[:, None]
    lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    o_ptrs = O + (pid_bh.to(tl.int64) * N_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=mask)
    tl.store(L + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)
# --8<-- [end:fwd_tma]


# --8<-- [start:bwd_preprocess]
@triton.jit
def _bwd_preprocess_kernel(
    O, DO, Delta,  # o [B, Hq, Nq, D] contiguous; do any strides; Delta [B, Hq, Nq] fp32
    stride_dob, stride_doh, stride_dom, stride_dod,
    H_Q, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H_Q).to(tl.int64)
    off_h = (pid_bh % H_Q).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + (pid_bh.to(tl.int64) * N_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + pid_bh.to(tl.int64) * N_Q + offs_m, tl.sum(o * do, 1),  # D_i = rowsum(dO∘O)
             mask=offs_m < N_Q)
# --8<-- [end:bwd_preprocess]


# --8<-- [start:bwd_dkdv]
@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base,
                    stride_qm, stride_dom, offs_n, offs_d, lo, hi, N_Q, N_K, causal_off, qk_scale,
                    MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    DQ_ATOMIC: tl.constexpr, DOT_FP32: tl.constexpr):
    # transposed tiles: rows are keys j, columns queries i, so dK_j, dV_j accumulate in place
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        # rows past Nq load q = dO = 0 and L = +inf, so they add exactly 0: no mask needed
        row_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_mask,
                    other=0.0)
        l2 = tl.load(l_base + offs_m, mask=offs_m < N_Q, other=float("inf")) * 1.4426950408889634
        kqT = _mma(k, tl.trans(q), None, DOT_FP32)  # (Q_i K_jᵀ)ᵀ        [BLOCK_N, BLOCK_M]
        pT = tl.math.exp2(kqT * qk_scale - l2[None, :])  # P_ijᵀ = 2^(S2 - L log2 e), recomputed
        if MASK:
            pT = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_off, pT, 0.0)
        if DQ_ATOMIC:  # keys past Nk (zero rows of k) give 2^(-L) that may overflow: drop them
            pT = tl.where(offs_n[:, None] < N_K, pT, 0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=row_mask,
                     other=0.0)
        dv = _mma(pT.to(do.dtype), do, dv, DOT_FP32)  # dV_j += P_ijᵀ dO_i
        dpT = _mma(v, tl.trans(do), None, DOT_FP32)  # dP_ijᵀ = V_j dO_iᵀ
        Di = tl.load(d_base + offs_m, mask=offs_m < N_Q, other=0.0)
        dsT = pT * (dpT - Di[None, :])  # dS_ij = P_ij (dP_ij - D_i)
        dk = _mma(dsT.to(q.dtype), q, dk, DOT_FP32)  # dK_j += dS_ijᵀ Q_i (σ applied at the end)
        if DQ_ATOMIC:  # fused variant: dQ_i += dS_ij K_j added from every key tile, in any order
            dq = _mma(tl.trans(dsT.to(k.dtype)), k, None, DOT_FP32)
            tl.atomic_add(dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq,
                          mask=row_mask, sem="relaxed")
    return dk, dv


@triton.jit
def _flash_attn_bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV,  # dk, dv [B, Hkv, Nk, D] contiguous
    DQ,  # fp32 [B, Hq, Nq, D] zeros, only with DQ_ATOMIC
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H_Q, H_KV, N_Q, N_K, CAUSAL_OFF, GROUP, sm_scale,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M1: tl.constexpr,  # queries per inner step
    BLOCK_N1: tl.constexpr,  # keys per program
    DQ_ATOMIC: tl.constexpr = False,  # also add σ⁻¹ dQ into DQ with atomics (non-deterministic)
    DOT_FP32: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)  # one key/value head: b * Hkv + hk
    off_b = (pid_bh // H_KV).to(tl.int64)
    off_hk = (pid_bh % H_KV).to(tl.int64)
    start_n = pid_n * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :], mask=kv_mask, other=0.0)  # K_j, V_j stay on chip
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    causal_off = CAUSAL_OFF
    nq_ceil = tl.cdiv(N_Q, BLOCK_M1) * BLOCK_M1
    if CAUSAL:  # rows i >= j - off see key j; rows i >= start_n + BLOCK_N1 - 1 - off see them all
        lo = tl.minimum(tl.maximum(start_n - causal_off, 0) // BLOCK_M1 * BLOCK_M1, nq_ceil)
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N1 - 1 - causal_off, 0), BLOCK_M1) * BLOCK_M1
        mid = tl.minimum(tl.maximum(mid, lo), nq_ceil)
    else:
        lo = 0
        mid = 0
    # every query head of the group adds into the same dK_j, dV_j: a loop, not atomics,
    # so the backward is deterministic
    for g in range(0, GROUP):
        off_h = off_hk * GROUP + g
        bh_q = off_b * H_Q + off_h
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        l_base = L + bh_q * N_Q
        d_base = Delta + bh_q * N_Q
        dq_base = DQ + bh_q * N_Q * HEAD_DIM
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base,
                                 stride_qm, stride_dom, offs_n, offs_d, lo, mid, N_Q, N_K,
                                 causal_off, qk_scale, True, HEAD_DIM, BLOCK_M1, DQ_ATOMIC,
                                 DOT_FP32)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base,
                                 stride_qm, stride_dom, offs_n, offs_d, mid, nq_ceil, N_Q, N_K,
                                 causal_off, qk_scale, False, HEAD_DIM, BLOCK_M1, DQ_ATOMIC,
                                 DOT_FP32)
    out = (pid_bh.to(tl.int64) * N_K + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)  # dK = σ dSᵀ Q
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)
# --8<-- [end:bwd_dkdv]


# --8<-- [start:bwd_dq]
@triton.jit
def _bwd_dq_inner(dq, q, do, l2, Di, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                  lo, hi, N_K, causal_off, qk_scale,
                  MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = offs_d[None, :] < HEAD_DIM
        if MASK:
            kv_mask = kv_mask & (offs_n[:, None] < N_K)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = _mma(q, tl.trans(k), None, DOT_FP32)  # Q_i K_jᵀ           [BLOCK_M, BLOCK_N]
        p = tl.math.exp2(qk * qk_scale - l2[:, None])  # P_ij = 2^(S2 - L log2 e), recomputed
        if MASK:  # also drops the key tail, where e^(0 - L) could overflow for very negative L
            p = tl.where(_visible(offs_m, offs_n, N_K, causal_off, CAUSAL), p, 0.0)
        dp = _mma(do, tl.trans(v), None, DOT_FP32)  # dP_ij = dO_i V_jᵀ
        ds = p * (dp - Di[:, None])  # dS_ij = P_ij (dP_ij - D_i)
        dq = _mma(ds.to(k.dtype), k, dq, DOT_FP32)  # dQ_i += dS_ij K_j   (σ applied at the end)
    return dq


@triton.jit
def _flash_attn_bwd_dq_kernel(
    Q, K, V, DO, L, Delta, DQ,  # dq [B, Hq, Nq, D] contiguous
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H_Q, N_Q, N_K, CAUSAL_OFF, GROUP, sm_scale,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M2: tl.constexpr,  # queries per program
    BLOCK_N2: tl.constexpr,  # keys per inner step
    DOT_FP32: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H_Q).to(tl.int64)
    off_h = (pid_bh % H_Q).to(tl.int64)
    off_hk = off_h // GROUP
    start_m = pid_m * BLOCK_M2
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :], mask=row_mask, other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :], mask=row_mask, other=0.0)
    l2 = tl.load(L + pid_bh.to(tl.int64) * N_Q + offs_m, mask=offs_m < N_Q,
                 other=float("inf")) * 1.4426950408889634
    Di = tl.load(Delta + pid_bh.to(tl.int64) * N_Q + offs_m, mask=offs_m < N_Q, other=0.0)
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    dq = tl.zeros([BLOCK_M2, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    causal_off = CAUSAL_OFF
    n_full, hi = _key_range(start_m, causal_off, N_K, BLOCK_M2, BLOCK_N2, CAUSAL)  # as forward
    dq = _bwd_dq_inner(dq, q, do, l2, Di, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       0, n_full, N_K, causal_off, qk_scale, False, CAUSAL, HEAD_DIM, BLOCK_N2,
                       DOT_FP32)
    dq = _bwd_dq_inner(dq, q, do, l2, Di, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       n_full, hi, N_K, causal_off, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_N2,
                       DOT_FP32)
    out = (pid_bh.to(tl.int64) * N_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_mask)  # dQ = σ dS K
# --8<-- [end:bwd_dq]


# --8<-- [start:configs]
def _fwd_configs(block_d: int) -> list:
    """Hopper forward tiles: B_r = 128 rows per program and 8 warps (64 and 4 as a third choice),
    a 2-3 stage K/V pipeline.
    Shared memory per program ~ (B_r + 2 stages * 2 B_c) * BLOCK_D * 2 bytes <= 228 KB."""
    if block_d <= 64:  # 64-key tiles, and 128-key tiles capped at 128 registers a thread:
        # uncapped they take 205 and leave one program per SM (H200: 13-18% slower); capped, two
        # programs fit without a spill, and in two H200 runs they were 2-8% faster than 64-key
        # tiles at N = 16384, 0-4% at N = 4096 without a mask, and tied (within 2%) on the
        # short causal rows at N = 4096. Sweeps at N = 4096 and 16384 (causal and not) kept
        # these two ahead of 28 other tiles and kernels: 128 rows / 4 warps 3-6% slower, 64 rows
        # 5-9%, 256 rows / 16 warps 9-15%, 32-key tiles 11-20%, the TMA-pipelined kernel 0-9%;
        # and, later, Triton 3.6's warp specialisation 3-16% and one masked loop for every
        # causal tile 13-32%
        shapes = [(128, 64, 8, 3, None), (128, 128, 8, 3, 128)]
    elif block_d <= 128:  # the 64-row tile wins on short causal rows (more programs)
        shapes = [(128, 128, 8, 3, None), (128, 64, 8, 3, None), (64, 64, 4, 3, None)]
    else:
        shapes = [(128, 64, 8, 2, None), (64, 64, 4, 2, None)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, maxnreg=r)
            for m, n, w, s, r in shapes]


def _dkdv_configs(block_d: int) -> list:
    """dK/dV keeps K_j, V_j and two fp32 [B_c, D] accumulators on chip: B_c shrinks with D."""
    if block_d <= 64:
        shapes = [(64, 128, 8, 3), (32, 128, 4, 3), (32, 64, 4, 3)]
    elif block_d <= 128:  # a third stage pays at D = 128 (H200 sweep: +8-10% at N = 16k)
        shapes = [(64, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3)]
    else:
        shapes = [(32, 64, 8, 2), (16, 64, 4, 2)]
    return [triton.Config({"BLOCK_M1": m, "BLOCK_N1": n}, num_warps=w, num_stages=s)
            for m, n, w, s in shapes]


def _dq_configs(block_d: int) -> list:
    if block_d <= 64:
        shapes = [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)]
    elif block_d <= 128:
        shapes = [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3)]
    else:
        shapes = [(64, 64, 8, 2), (64, 32, 4, 2)]
    return [triton.Config({"BLOCK_M2": m, "BLOCK_N2": n}, num_warps=w, num_stages=s)
            for m, n, w, s in shapes]


# D = 128 on a Hopper GPU goes to hopper.py (FlashAttention-3's schedule, in Gluon) for the
# shapes it takes (hopper.takes: Nq = Nk, a multiple of 128, bf16/fp16, no explicit config); the
# rest of D = 128 goes to the TMA-pipelined forward with one tile: in an H200 sweep at N = 4k and
# 16k it beat 64-row tiles, 64-key tiles and 2 stages at every point. Triton's automatic warp
# specialisation is not used: lab/attention/NOTES.md.
TMA_HEAD_DIM = 128
TMA_FWD_CONFIG = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3)
# the interpreter runs one fixed small config (autotuning there would take minutes)
CPU_FWD_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)
CPU_BWD_CONFIG = triton.Config({"BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16},
                               num_warps=4, num_stages=1)
_TUNE_KEY = ["N_Q", "N_K", "GROUP", "CAUSAL", "HEAD_DIM"]
_tuned: dict = {}


def _autotuned(kernel, name: str, block_d: int, configs, reset_to_zero=None):
    key = (name, block_d, tuple(str(c) for c in configs))
    if key not in _tuned:  # atomics accumulate across the tuning runs: zero DQ before each
        _tuned[key] = triton.autotune(configs=configs, key=_TUNE_KEY,
                                      reset_to_zero=reset_to_zero)(kernel)
    return _tuned[key]
# --8<-- [end:configs]


_INTERPRETED = interpreted(_flash_attn_fwd_kernel)  # fixed at import (TRITON_INTERPRET)


def _interpreted() -> bool:
    return _INTERPRETED


def _dot_fp32(q) -> bool:
    return _interpreted() and q.dtype == torch.bfloat16


def _block_d(D: int) -> int:
    return max(16, next_power_of_2(D))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """The kernels read the head dim with stride 1 (vectorized loads); other strides are free."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


# heads per longest-first group of causal tiles: their K and V (bf16) fill about this much L2.
# H200 sweeps at D = 64, causal: groups of this size (16 heads at N = 4k, 4 at 16k) 0-5% faster
# than per-head order; 16 heads at 16k (64 MiB) up to 6% slower, all heads at 4k 9-14% slower
# (the keys no longer stay in L2)
LPT_L2_BYTES = 16 << 20


def _lpt_heads(n_heads: int, Nk: int, D: int) -> int:
    return max(1, min(n_heads, LPT_L2_BYTES // (4 * Nk * D)))


FWD_TILES = ("BLOCK_M", "BLOCK_N")
BWD_TILES = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")


def _causal_off(Nq: int, Nk: int, alignment: str) -> int:
    """Query i sees key j iff j <= i + offset: 0 top-left (SDPA), Nk - Nq bottom-right."""
    return 0 if alignment == "top_left" else Nk - Nq


# ----------------------------------------------------------------------------- argument checks
# shape, dtype and device checks only, so that they also run on fake tensors and under Dynamo
def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_alignment(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"causal_alignment must be a str, got {type(value).__name__}")
    if value not in ALIGNMENTS:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got {value!r}")
    return value


def _check_device(name: str, t) -> None:
    """Compiled Triton kernels need CUDA tensors; the interpreter (TRITON_INTERPRET=1) CPU ones."""
    if _INTERPRETED and t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}, but Triton runs in the interpreter "
                         "(TRITON_INTERPRET=1): pass CPU tensors")
    if not _INTERPRETED and t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; compiled Triton kernels need a CUDA tensor "
                         "(set TRITON_INTERPRET=1 before importing triton to run them on the CPU)")


def _check_qkv(q, k, v, names=("q", "k", "v")):
    nq, nk, nv = names
    check_tensor(nq, q, dtypes=DTYPES, ndim=4, nonempty=True)
    _check_device(nq, q)
    check_tensor(nk, k, dtypes=(q.dtype,), ndim=4, nonempty=True, device=q.device)
    check_tensor(nv, v, dtypes=(q.dtype,), ndim=4, nonempty=True, device=q.device)
    B, Hq, Nq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"{nk} and {nv} must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{nk} must be [B={B}, Hkv, Nk, D={D}] to match {nq} {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"the number of query heads Hq={Hq} must be a multiple of the number of "
                         f"key/value heads Hkv={k.shape[1]} (grouped-query attention): {nk} has "
                         f"shape {tuple(k.shape)}")
    if not 16 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported: need 16 <= D <= {MAX_HEAD_DIM} "
                         f"({nq} has shape {tuple(q.shape)})")
    if B * Hq > 65535:  # the batch-head index is the grid's second axis
        raise ValueError(f"B * Hq = {B * Hq} is not supported: at most 65535 (batch {B}, "
                         f"{Hq} heads of {nq})")


def _check_bwd_saved(q, o, lse):
    """o and lse as flash_attn_fwd returned them for q: the kernels index both as contiguous
    [B, Hq, Nq, (D)] buffers (the launcher copies other strides), so a shorter one would be read
    past its end, and a float16 lse would make Delta float16 too."""
    check_tensor("o", o, dtypes=(q.dtype,), ndim=4, device=q.device)
    if o.shape != q.shape:
        raise ValueError(f"o must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
    check_tensor("lse", lse, dtypes=(torch.float32,), ndim=3, device=q.device)
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must have shape [B, Hq, Nq] = {tuple(q.shape[:3])}, "
                         f"got {tuple(lse.shape)}")


def _check_config(config, tiles, name="config") -> list[int] | None:
    """A triton.Config that sets exactly ``tiles``, each a power of two of at least 16 (the rows,
    columns and inner dimension of a tl.dot), as the list of ints the custom ops take:
    the tiles, num_warps, num_stages and maxnreg (0 for none)."""
    if config is None:
        return None
    if not isinstance(config, triton.Config):
        raise TypeError(f"{name} must be a triton.Config or None, got {type(config).__name__}")
    check_tiles(name, config.kwargs, dict.fromkeys(tiles, (16, None)))
    return [*(config.kwargs[t] for t in tiles), config.num_warps, config.num_stages,
            config.maxnreg or 0]


def _config(values: list[int] | None, tiles) -> triton.Config | None:
    if values is None:
        return None
    *blocks, warps, stages, maxnreg = values
    return triton.Config(dict(zip(tiles, blocks, strict=True)), num_warps=warps,
                         num_stages=stages, maxnreg=maxnreg or None)


def _check_scale(name: str, sm_scale, D) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(sm_scale, bool):
        raise TypeError(f"{name} must be a real number or None, got bool")
    return check_real(name, sm_scale, "a finite number > 0")  # the running max needs σ > 0


# --8<-- [start:launcher]
def _launch_fwd(q, k, v, causal: bool, causal_off: int, sm_scale: float, config):
    """FlashAttention-2 forward (Dao 2023, arXiv:2307.08691, Algorithm 1) on checked inputs:
    returns o [B, Hq, Nq, D] (q's dtype, contiguous) and lse [B, Hq, Nq] float32. With no config,
    on a Hopper GPU at D = 128, the shapes hopper.takes go to hopper.fa3_forward instead
    (FlashAttention-3's schedule, Shah et al. 2024): the same outputs, the same conventions."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if config is None and D == TMA_HEAD_DIM and q.is_cuda:  # Hopper: FlashAttention-3's schedule
        from kernelnotes.attention import hopper

        if hopper.takes(q, k, v, causal_off if causal else 0):
            return hopper.fa3_forward(q.contiguous(), k.contiguous(), v.contiguous(), causal,
                                      sm_scale)
    k, v = _unit_last(k), _unit_last(v)
    q = _unit_last(q)
    o = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    block_d = _block_d(D)
    args = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), Hq, Nq, Nk, causal_off,
            Hq // Hkv, sm_scale)
    meta = dict(LPT_HEADS=_lpt_heads(B * Hq, Nk, D), CAUSAL=causal, HEAD_DIM=D,
                BLOCK_D=block_d, DOT_FP32=_dot_fp32(q))
    if config is None and _interpreted():
        config = CPU_FWD_CONFIG
    if D == TMA_HEAD_DIM and TensorDescriptor is not None:
        _fwd_tma(q, k, v, o, lse, causal_off, sm_scale, config or TMA_FWD_CONFIG, meta)
        return o, lse
    configs = _fwd_configs(block_d) if config is None else [config]
    whole = [c for c in configs if Nk % c.kwargs["BLOCK_N"] == 0]
    configs = whole or configs  # tiles that divide Nk skip the key bound (EVEN_N): prefer them
    even_n = bool(whole)  # then every candidate divides Nk
    if config is None:
        kernel = _autotuned(_flash_attn_fwd_kernel, "fwd", block_d, configs)
        grid = lambda META: (cdiv(Nq, META["BLOCK_M"]), B * Hq)  # noqa: E731
        kernel[grid](*args, **meta, EVEN_N=even_n)
    else:
        grid = (cdiv(Nq, config.kwargs["BLOCK_M"]), B * Hq)
        cap = {} if config.maxnreg is None else {"maxnreg": config.maxnreg}
        _flash_attn_fwd_kernel[grid](*args, **meta, **config.kwargs, EVEN_N=even_n,
                                     num_warps=config.num_warps, num_stages=config.num_stages,
                                     **cap)
    return o, lse


def _fwd_tma(q, k, v, o, lse, causal_off, sm_scale, config, meta):
    """The TMA-pipelined forward: [B*H*N, D] descriptors over contiguous q, k, v."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    descs = (TensorDescriptor(q, [B * Hq * Nq, D], [D, 1], [bm, D]),
             TensorDescriptor(k, [B * Hkv * Nk, D], [D, 1], [bn, D]),
             TensorDescriptor(v, [B * Hkv * Nk, D], [D, 1], [bn, D]))
    _flash_attn_fwd_tma_kernel[(cdiv(Nq, bm), B * Hq)](
        *descs, o, lse, Nq, Nk, causal_off, Hq // Hkv, sm_scale, **meta, BLOCK_M=bm, BLOCK_N=bn,
        EVEN_N=Nk % bn == 0, num_warps=config.num_warps, num_stages=config.num_stages)


def _launch_bwd(do, q, k, v, o, lse, causal: bool, causal_off: int, sm_scale: float, config,
                deterministic: bool):
    """FlashAttention-2 backward (Dao 2023, Algorithm 2) on checked inputs: dq, dk, dv."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    q, k, v, do = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(do)
    o, lse = o.contiguous(), lse.contiguous()
    block_d = _block_d(D)
    delta = torch.empty_like(lse)
    _bwd_preprocess_kernel[(cdiv(Nq, 64), B * Hq)](
        o, do, delta, *do.stride(), Hq, Nq, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=64)
    dk = torch.empty((B, Hkv, Nk, D), dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    if deterministic:
        dq = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    else:  # σ⁻¹ dQ accumulates here in fp32 from every key tile
        dq = torch.zeros((B, Hq, Nq, D), dtype=torch.float32, device=q.device)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    meta = dict(CAUSAL=causal, HEAD_DIM=D, BLOCK_D=block_d, DOT_FP32=_dot_fp32(q))
    dkdv_args = (q, k, v, do, lse, delta, dk, dv, dq, *strides, Hq, Hkv, Nq, Nk, causal_off,
                 Hq // Hkv, sm_scale)
    dq_args = (q, k, v, do, lse, delta, dq, *strides, Hq, Nq, Nk, causal_off, Hq // Hkv,
               sm_scale)
    if config is None and _interpreted():
        config = CPU_BWD_CONFIG
    if config is None:
        if deterministic:
            dkdv = _autotuned(_flash_attn_bwd_dkdv_kernel, "dkdv", block_d, _dkdv_configs(block_d))
        else:  # one candidate: tuning runs of an atomic kernel must re-zero DQ each time anyway
            dkdv = _autotuned(_flash_attn_bwd_dkdv_kernel, "dkdv_atomic", block_d,
                              _dkdv_configs(block_d)[:1], reset_to_zero=["DQ"])
        dkdv[lambda META: (cdiv(Nk, META["BLOCK_N1"]), B * Hkv)](
            *dkdv_args, **meta, DQ_ATOMIC=not deterministic)
        if deterministic:
            dqk = _autotuned(_flash_attn_bwd_dq_kernel, "dq", block_d, _dq_configs(block_d))
            dqk[lambda META: (cdiv(Nq, META["BLOCK_M2"]), B * Hq)](*dq_args, **meta)
    else:
        c = config.kwargs
        launch = dict(num_warps=config.num_warps, num_stages=config.num_stages)
        _flash_attn_bwd_dkdv_kernel[(cdiv(Nk, c["BLOCK_N1"]), B * Hkv)](
            *dkdv_args, **meta, BLOCK_M1=c["BLOCK_M1"], BLOCK_N1=c["BLOCK_N1"],
            DQ_ATOMIC=not deterministic, **launch)
        if deterministic:
            _flash_attn_bwd_dq_kernel[(cdiv(Nq, c["BLOCK_M2"]), B * Hq)](
                *dq_args, **meta, BLOCK_M2=c["BLOCK_M2"], BLOCK_N2=c["BLOCK_N2"], **launch)
    if not deterministic:
        dq = (dq * sm_scale).to(q.dtype)
    return dq, dk, dv
# --8<-- [end:launcher]


NS = "kernelnotes"  # the operators' namespace: torch.ops.kernelnotes.flash_attn_fwd, ...


# --8<-- [start:ops]
# The forward and the backward are torch custom operators: torch.compile and FakeTensorMode see
# their fake implementations (shapes only) instead of tracing into the launchers, and autograd
# calls the backward op. Configs travel as lists of ints (_check_config).
@torch.library.custom_op(f"{NS}::flash_attn_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
            causal_alignment: str, sm_scale: float, config: list[int] | None,
            deterministic: bool, bwd_config: list[int] | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse); ``deterministic`` and ``bwd_config`` are kept for the backward only."""
    off = _causal_off(q.shape[2], k.shape[2], causal_alignment)
    return _launch_fwd(q, k, v, causal, off, sm_scale, _config(config, FWD_TILES))


@_fwd_op.register_fake
def _(q, k, v, causal, causal_alignment, sm_scale, config, deterministic, bwd_config):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op(f"{NS}::flash_attn_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            o: torch.Tensor, lse: torch.Tensor, causal: bool, causal_alignment: str,
            sm_scale: float, deterministic: bool, config: list[int] | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    off = _causal_off(q.shape[2], k.shape[2], causal_alignment)
    return _launch_bwd(do, q, k, v, o, lse, causal, off, sm_scale, _config(config, BWD_TILES),
                       deterministic)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, causal, causal_alignment, sm_scale, deterministic, config):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(k.shape)


def _fwd_setup(ctx, inputs, output):
    q, k, v, causal, alignment, sm_scale, _, deterministic, bwd_config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)  # O(N) extra memory: o and lse, never P
    ctx.mark_non_differentiable(lse)
    ctx.args = (causal, alignment, sm_scale, deterministic, bwd_config)


def _fwd_backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _bwd_op(do, q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup)
# --8<-- [end:ops]


# --8<-- [start:api]
def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    causal_alignment: str = "top_left",
    deterministic: bool = True,
    fwd_config: triton.Config | None = None,
    bwd_config: triton.Config | None = None,
) -> torch.Tensor:
    """FlashAttention-2 with autograd, a drop-in for ``F.scaled_dot_product_attention``.

    Same signature and, for every input it accepts, the same result as
    ``torch.nn.functional.scaled_dot_product_attention`` up to rounding:
    ``softmax(scale * query @ key.mT + causal mask) @ value``. Forward and backward are the
    custom operators ``torch.ops.kernelnotes.flash_attn_fwd`` / ``flash_attn_bwd``, so the
    function works under ``torch.compile(fullgraph=True)`` and ``FakeTensorMode``.

    Args:
        query: [B, Hq, Nq, D] float16 or bfloat16, any strides, 16 <= D <= 256,
            B * Hq <= 65535. On a CUDA device (or on the CPU when Triton runs in its
            interpreter, ``TRITON_INTERPRET=1``).
        key: [B, Hkv, Nk, D], query's dtype and device. Hkv == Hq, or with ``enable_gqa``
            any divisor of Hq (grouped-query attention: query head h uses key head
            h // (Hq // Hkv), as SDPA).
        value: key's shape, dtype and device (SDPA's value head dim Ev != D is not supported).
        attn_mask: must be None: mask tensors are not supported.
        dropout_p: must be 0.0: dropout is not supported.
        is_causal: mask keys in the future. Aligned as SDPA aligns it, top-left: query i sees
            key j iff j <= i (``torch.ones(Nq, Nk).tril()``), unless ``causal_alignment``
            says otherwise.
        scale: σ in softmax(σ q kᵀ), a finite number > 0; None gives 1 / sqrt(D).
        enable_gqa: allow Hkv < Hq, as in SDPA.
        causal_alignment: ``"top_left"`` (default, SDPA's ``is_causal``) or
            ``"bottom_right"``: query i sees key j iff j <= i + Nk - Nq, so the last query sees
            every key, what decoding with a KV cache needs (FlashAttention >= 2.1, and SDPA with
            ``attn_mask=torch.nn.attention.bias.causal_lower_right(Nq, Nk)``). With
            Nq > Nk its first Nq - Nk rows see no key: their output is 0 and so are their
            gradients, as PyTorch's math attention gives for a fully masked row.
        deterministic: True (default): the atomic-free, bitwise repeatable backward; False:
            the fused backward that adds dQ with atomics (see ``flash_attn_bwd``).
        fwd_config: a ``triton.Config`` setting BLOCK_M, BLOCK_N (powers of two >= 16) for
            the forward; None autotunes on a GPU.
        bwd_config: a ``triton.Config`` setting BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2 for the
            backward; None autotunes on a GPU.

    Returns:
        [B, Hq, Nq, D], query's dtype, contiguous. A NaN in query row i makes output row i NaN,
        as in SDPA; a NaN in a key or value row reaches the rows that see it and, for values,
        the other rows of their query tile (SDPA's math backend: every row).

    Raises:
        TypeError: a non-tensor input, a dtype other than float16/bfloat16 (float32 included),
            mixed dtypes, a flag that is not a bool, a config that is not a triton.Config.
        ValueError: a mask, dropout_p != 0, a wrong rank or mismatched shapes, an empty input,
            an unsupported head dim, Hkv != Hq without enable_gqa (or Hq not a multiple of
            Hkv), inputs on different devices or on a device the kernels cannot run on, a
            scale that is not a finite number > 0, an unknown causal_alignment, bad tiles.
    """
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported: flash_attention takes no mask tensor "
                         "(causal masks: is_causal=True, with causal_alignment)")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 (dropout is not supported), got {dropout_p!r}")
    _check_flag("is_causal", is_causal)
    _check_flag("enable_gqa", enable_gqa)
    _check_flag("deterministic", deterministic)
    _check_alignment(causal_alignment)
    _check_qkv(query, key, value, ("query", "key", "value"))
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         "enable_gqa=True for grouped-query attention (as in SDPA)")
    sm_scale = _check_scale("scale", scale, query.shape[-1])
    fwd = _check_config(fwd_config, FWD_TILES, "fwd_config")
    bwd = _check_config(bwd_config, BWD_TILES, "bwd_config")
    o, _ = _fwd_op(query, key, value, is_causal, causal_alignment, sm_scale, fwd, deterministic,
                   bwd)
    return o
# --8<-- [end:api]


def flash_attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: triton.Config | None = None,
    *,
    causal_alignment: str = "top_left",
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 forward (Dao 2023, arXiv:2307.08691, Algorithm 1), with its log-sum-exp.

    Args:
        q: [B, Hq, Nq, D] float16 or bfloat16, any strides; 16 <= D <= 256 (any D: the kernel
            pads the head dim to a power of two and masks the padding).
        k: [B, Hkv, Nk, D], same dtype and device as q; Hq must be a multiple of Hkv.
        v: k's shape, dtype and device.
        causal: mask keys in the future (a bool), aligned by ``causal_alignment``.
        sm_scale: σ in softmax(σ q kᵀ), a finite number > 0; default 1/sqrt(D).
        config: a ``triton.Config`` with BLOCK_M, BLOCK_N (tests), powers of two >= 16, and its
            num_warps, num_stages and maxnreg (a register cap, or None); None autotunes on a GPU.
        causal_alignment: ``"top_left"`` (query i sees key j iff j <= i, SDPA's) or
            ``"bottom_right"`` (j <= i + Nk - Nq; rows with i < Nq - Nk see nothing and give
            zeros).

    Returns:
        o: [B, Hq, Nq, D] same dtype as q (contiguous); lse: [B, Hq, Nq] float32, the natural
        log-sum-exp of each row of σ q kᵀ, +inf for a row that sees no key. o carries
        autograd (lse does not).

    Raises:
        TypeError, ValueError: as ``flash_attention``, naming the argument.
    """
    _check_flag("causal", causal)
    _check_alignment(causal_alignment)
    _check_qkv(q, k, v)
    cfg = _check_config(config, FWD_TILES)
    sm_scale = _check_scale("sm_scale", sm_scale, q.shape[-1])
    return _fwd_op(q, k, v, causal, causal_alignment, sm_scale, cfg, True, None)


def flash_attn_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    config: triton.Config | None = None,
    deterministic: bool = True,
    *,
    causal_alignment: str = "top_left",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2 backward (Dao 2023, Algorithm 2) by recomputing P from ``lse``.

    A preprocess kernel computes D = rowsum(dO∘O). Then, with ``deterministic=True``, a dK/dV
    kernel (one program per key tile, looping over the queries of every head of its group) and a
    dQ kernel (one program per query tile, looping over the keys): no atomics, bitwise repeatable.
    With ``deterministic=False``, one fused kernel computes dK, dV and adds each tile's share of dQ
    into an fp32 buffer with atomics (5 tile matmuls per step instead of 7; the summation order,
    and so the last bits of dQ, vary from run to run).

    Args:
        do: [B, Hq, Nq, D] gradient of o, q's dtype, any strides.
        q: as given to ``flash_attn_fwd``.
        k: as given to ``flash_attn_fwd``.
        v: as given to ``flash_attn_fwd``.
        o: as ``flash_attn_fwd`` returned it (q's shape and dtype; any strides).
        lse: float32 [B, Hq, Nq], as ``flash_attn_fwd`` returned it.
        causal: the forward's flag (a bool).
        sm_scale: the forward's σ; default 1/sqrt(D).
        config: a ``triton.Config`` with BLOCK_M1, BLOCK_N1 (dK/dV) and BLOCK_M2, BLOCK_N2 (dQ),
            powers of two >= 16; None autotunes each kernel on a GPU.
        deterministic: choose the atomic-free backward (default) or the fused atomic one.
        causal_alignment: the forward's alignment.

    Returns:
        dq [B, Hq, Nq, D], dk and dv [B, Hkv, Nk, D], in q's dtype (contiguous).

    Raises:
        TypeError, ValueError: as ``flash_attn_fwd``, naming the argument.
        RuntimeError: an input requires grad with grad mode on: this op has no backward
            (double backward of attention is not supported).
    """
    _check_flag("causal", causal)
    _check_flag("deterministic", deterministic)
    _check_alignment(causal_alignment)
    _check_qkv(q, k, v)
    check_tensor("do", do, dtypes=(q.dtype,), ndim=4, device=q.device)
    if do.shape != q.shape:
        raise ValueError(f"do must have q's shape {tuple(q.shape)}, got {tuple(do.shape)}")
    _check_bwd_saved(q, o, lse)
    cfg = _check_config(config, BWD_TILES)
    sm_scale = _check_scale("sm_scale", sm_scale, q.shape[-1])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (do, q, k, v, o)):
        raise RuntimeError("flash_attn_bwd has no backward (double backward of attention is not "
                           "supported): call it under torch.no_grad() or on detached tensors")
    return _bwd_op(do, q, k, v, o, lse, causal, causal_alignment, sm_scale, deterministic, cfg)
