"""FlashAttention forward with Triton's automatic warp specialisation: a design study.

The product's Hopper forward (``kernelnotes.attention``, D = 128) pipelines its loop by hand:
it issues P_{j-1} V_{j-1} and leaves it in flight while the softmax of S_j runs, all in the same
warps. FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) instead gives the loads to a
producer warp and the maths to consumer warpgroups. Triton 3.6 can derive such a split itself:
``tl.range(..., warp_specialize=True)`` on a loop of TMA loads and ``tl.dot`` turns a 4-warp
program into a load partition and two consumer warpgroups, each with half of the query rows.
This module is that loop written plainly (no hand pipelining: the pass does the scheduling), so
the two schedules can be timed side by side. lab/attention/NOTES.md says what it measured.

Scope: q, k, v CUDA, bf16 or fp16, [B, H, N, D] contiguous, D in {64, 128}, N a multiple of
128, no GQA; causal is top-left (SDPA's ``is_causal``). Needs a Hopper GPU. Uses the package's
public API only; nothing in the package imports it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

BLOCK_N = 128  # 64-key tiles gave NaN under the pass (kernelnotes.attention.kernel's note)
CONFIGS = {  # name: (BLOCK_M, num_warps, num_stages); the pass adds a load warpgroup and
    # splits the rows between two consumer warpgroups (4 warps -> 12). Three stages at D = 128
    # need 246 KB of shared memory, past the 227 KB a program may have.
    "m128_w4_s2": (128, 4, 2),
    "m256_w4_s2": (256, 4, 2),
}


@triton.jit
def _step(q, k_desc, v_desc, row, acc, l_i, m_i, qk_scale, offs_m, offs_n, start_n,
          MASK: tl.constexpr):
    """One key tile: S = Q K^T, the online-softmax update, acc += P V (log2 domain)."""
    k = k_desc.load([row + start_n, 0])
    qk = tl.dot(q, tl.trans(k))
    if MASK:  # the diagonal tile: query i sees key j iff j <= i
        qk = tl.where((start_n + offs_n)[None, :] <= offs_m[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([row + start_n, 0])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _fwd_ws_kernel(q_desc, k_desc, v_desc, O, L, N, sm_scale,
                   CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:  # longest rows first: a late heavy tile would set the kernel's tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    row = bh * N  # this head's first row in the [B*H*N, D] views
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([row + start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    # The pass takes one loop: under CAUSAL it masks every tile (a compare and a select a
    # score; below the diagonal they keep everything), two loops fail to compile in 3.6.
    hi = tl.minimum(start_m + BLOCK_M, N) if CAUSAL else N
    for start_n in tl.range(0, hi, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=True):
        acc, l_i, m_i = _step(q, k_desc, v_desc, row, acc, l_i, m_i, qk_scale, offs_m, offs_n,
                              start_n, CAUSAL)
    o = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(O + (row + offs_m)[:, None].to(tl.int64) * HEAD_DIM + offs_d[None, :],
             o.to(O.dtype.element_ty))
    tl.store(L + row + offs_m, lse)


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor on a Hopper GPU (this study does not "
                             "run in Triton's interpreter)")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{name} has dtype {t.dtype}: float16 or bfloat16 only")
        if t.shape != q.shape or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous with q's shape {tuple(q.shape)}")
    if q.dim() != 4 or q.shape[-1] not in (64, 128) or q.shape[2] % 256:
        raise ValueError(f"q has shape {tuple(q.shape)}: [B, H, N, D] with D in (64, 128) and "
                         "N a multiple of 256")


def attention_ws(q, k, v, causal: bool = False, sm_scale: float | None = None,
                 config: str = "m128_w4_s2"):
    """O [B, H, N, D] (q's dtype) and the log-sum-exp L [B, H, N] (fp32, natural log)."""
    _check(q, k, v)
    B, H, N, D = q.shape
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    bm, warps, stages = CONFIGS[config]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    rows = B * H * N
    descs = (TensorDescriptor(q, [rows, D], [D, 1], [bm, D]),
             TensorDescriptor(k, [rows, D], [D, 1], [BLOCK_N, D]),
             TensorDescriptor(v, [rows, D], [D, 1], [BLOCK_N, D]))
    _fwd_ws_kernel[(N // bm, B * H)](*descs, o, lse, N, sm_scale, CAUSAL=causal, HEAD_DIM=D,
                                     BLOCK_M=bm, BLOCK_N=BLOCK_N, NUM_STAGES=stages,
                                     num_warps=warps)
    return o, lse
