"""Design D: a FlashAttention-3-style Hopper backward in Gluon (lab study, not the product's).

The backward of FlashAttention-2 (Dao 2023, arXiv:2307.08691, Algorithm 2) with the Hopper
machinery of FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024,
arXiv:2407.08608, its backward): one program per key/value tile of 128 rows, two consumer
warpgroups of 64 key rows each and one producer warp.

- The producer warp loads K_j and V_j once by TMA into shared memory (``kv_ready``), then streams
  the query tiles Q_i and dO_i through a ring of ``stages`` stages (``ready`` / ``empty``
  mbarriers, ``empty`` of count 2: both consumer warpgroups release a stage). It runs with 24
  registers a thread, the consumers with 240 (``setmaxnreg``).
- Consumer warpgroup w owns key rows n0 + 64 w .. n0 + 64 w + 64 and, for each query tile,
  reads lse_i and Delta_i with plain loads and computes (transposed tiles, keys as rows)
  S^T = K Q^T, P^T = 2^(S^T qk_scale - lse_i log2 e), dP^T = V dO^T (both wgmma from shared
  memory, issued together), dS^T = P^T o (dP^T - Delta_i), dV += P^T dO and dK += dS^T Q
  (P^T and dS^T as register A operands), then dQ_i += dS K: dS^T goes to shared memory and its
  transposed view is the A operand; the [BLOCK_M, D] fp32 partial is added into an fp32 global
  buffer with relaxed atomics (Triton 3.6's Gluon has no TMA reduce for Hopper).
- Delta = rowsum(dO o O) is computed with torch ops; dq = dq_f32 * sm_scale, dk * sm_scale.
- Causal (top-left, Nq = Nk): key tile j only visits query tiles from its diagonal on; a
  warpgroup skips (releases) query tiles that none of its keys see and masks the tiles that
  straddle its diagonal.

Scope as ``kernelnotes.attention.hopper.fa3_forward``: bf16/fp16, q, k, v, o, do of one shape
[B, H, N, D] (no grouped-query attention), contiguous, D in (64, 128), N a positive multiple of
128, Hopper only. Written for Triton 3.6 (renamed Gluon APIs are looked up at import).
Compiled offline for sm_90 (lab/attention/aot_check.py --bwd) but it has NOT run on a GPU:
lab/attention/bench_designs.py probes it in a child process with a time limit first.
Nothing runs at import.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The product forward's constants (register split, shared memory, head dims) and TMA load
from kernelnotes.attention.hopper import (
    CONSUMER_REGS,
    CONSUMER_WARPS,
    HEAD_DIMS,
    LOG2E,
    PRODUCER_REGS,
    PRODUCER_WARPS,
    ROW_MULTIPLE,
    check_hopper_device,
    tma_load,
)

LOG2E_C = gl.constexpr(LOG2E)
KEYS_PER_WG = gl.constexpr(64)  # key rows of each consumer warpgroup: a wgmma's M
DQ_CHUNK = gl.constexpr(64)  # columns of dQ a wgmma computes (and atomically adds) at a time
BLOCK_N = 128  # key rows of a program (two warpgroups)


class Config(NamedTuple):
    """block_m: query rows a step (the ring's tile); stages: depth of the Q/dO ring."""

    block_m: int
    stages: int

    def shared_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """K, V (128 rows each), `stages` (Q, dO) pairs and the two warpgroups' dS^T tiles."""
        kv = 2 * BLOCK_N * head_dim
        ring = self.stages * 2 * self.block_m * head_dim
        ds = 2 * KEYS_PER_WG.value * self.block_m
        return (kv + ring + ds) * elem_bytes


# per head dim: the configuration flash_bwd_hopper uses (aot_check.py --bwd compiles each)
CONFIGS = {64: Config(block_m=64, stages=2), 128: Config(block_m=64, stages=2)}


@gluon.jit
def _bwd_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_ready,
                  ready, empty, N, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """One warp: K_j, V_j once (both warpgroups' halves), then Q_i, dO_i for every query tile
    the program visits, into stage t % STAGES once both consumers released it."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    KW: gl.constexpr = k_desc.block_type.shape[0]
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    n0 = pid_n * (2 * KW)
    head_row = pid_bh * N
    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma_load(k_desc, [head_row + n0 + w * KW, 0], kv_ready, k_smem.index(w))
        tma_load(v_desc, [head_row + n0 + w * KW, 0], kv_ready, v_smem.index(w))
    if CAUSAL:
        m_start = n0 // BLOCK_M
    else:
        m_start = 0
    n_m = N // BLOCK_M
    for i in range(m_start, n_m):
        t = i - m_start
        s = t % STAGES
        mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)  # the first round passes
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma_load(q_desc, [head_row + i * BLOCK_M, 0], ready.index(s), q_smem.index(s))
        tma_load(do_desc, [head_row + i * BLOCK_M, 0], ready.index(s), do_smem.index(s))


@gluon.jit
def _bwd_step(i, t, q_smem, do_smem, k_w, v_w, ds_w, ready, empty, dk, dv, dq_ptr, lse_ptr,
              delta_ptr, head, keys, qk_scale, MASK: gl.constexpr, STAGES: gl.constexpr):
    """One query tile i (the program's t-th, in stage t % STAGES) for one warpgroup's 64 keys:
    returns dK, dV updated and adds its share of dQ_i / sm_scale into dq_ptr."""
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    KW: gl.constexpr = k_w.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, DQ_CHUNK, 16])
    # P^T, dS^T as register A operands: the same registers as their st_layout values
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    s = t % STAGES
    q = q_smem.index(s)
    do = do_smem.index(s)
    # lse and Delta are loaded one element a thread, then spread to the columns of S^T (as
    # wgmma-layout vectors their 16 addresses a thread spilled)
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    qcols = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_layout)
    qvec = head + i * BLOCK_M + gl.arange(0, BLOCK_M, layout=vec_layout)
    mbarrier.wait(ready.index(s), (t // STAGES) & 1)
    s_tok = warpgroup_mma(k_w, q.permute((1, 0)),
                          gl.zeros([KW, BLOCK_M], gl.float32, layout=st_layout),
                          use_acc=False, is_async=True)  # S^T = K Q^T
    dp_tok = warpgroup_mma(v_w, do.permute((1, 0)),
                           gl.zeros([KW, BLOCK_M], gl.float32, layout=st_layout),
                           use_acc=False, is_async=True)  # dP^T = V dO^T
    lse2 = gl.convert_layout(gl.load(lse_ptr + qvec) * LOG2E_C, col_layout)
    s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    if MASK:  # the causal diagonal: key j is seen by query i iff j <= i
        s_t = gl.where(keys[:, None] <= qcols[None, :], s_t, float("-inf"))
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :]).to(dtype)  # P^T, recomputed from lse
    delta = gl.convert_layout(gl.load(delta_ptr + qvec), col_layout)
    dp_t = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
    p_op = gl.convert_layout(p_t, op_layout)
    dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)  # dV += P^T dO
    ds_t = (p_t.to(gl.float32) * (dp_t - delta[None, :])).to(dtype)  # P^T o (dP^T - Delta)
    ds_op = gl.convert_layout(ds_t, op_layout)
    dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)  # dK += dS^T Q
    ds_w.store(ds_t)  # for dQ = dS K: dS^T's transposed view is the A operand
    fence_async_shared()
    dv, dk, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0,
                                             deps=(dv_tok, dk_tok, p_op, ds_op))
    mbarrier.arrive(empty.index(s), count=1)  # Q_i and dO_i are read
    # dQ_i += dS K in DQ_CHUNK-column pieces: one [BLOCK_M, DQ_CHUNK] fp32 partial live at a
    # time beside dK and dV, added from a layout of 4 consecutive columns a thread (8 addresses
    # a thread instead of 32: the wgmma layout's spilled)
    add_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [gl.num_warps(), 1], [1, 0])
    dq_rows = head + i * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, add_layout))
    offs_c = gl.arange(0, DQ_CHUNK, layout=gl.SliceLayout(0, add_layout))
    for c in gl.static_range(HEAD_DIM // DQ_CHUNK):
        dq_tok = warpgroup_mma(ds_w.permute((1, 0)), k_w.slice(c * DQ_CHUNK, DQ_CHUNK, dim=1),
                               gl.zeros([BLOCK_M, DQ_CHUNK], gl.float32, layout=dq_layout),
                               use_acc=False, is_async=True)
        dq = gl.convert_layout(warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok,)),
                               add_layout)
        gl.atomic_add(dq_ptr + dq_rows[:, None] * HEAD_DIM + (c * DQ_CHUNK + offs_c)[None, :],
                      dq, sem="relaxed")
    return dk, dv


@gluon.jit
def _bwd_consumer(q_smem, do_smem, k_smem, v_smem, ds_smem, kv_ready, ready, empty,
                  dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, N, sm_scale, qk_scale,
                  CAUSAL: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: dK, dV of key rows n0 + 64 WG .. + 64, and its share of dQ."""
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    KW: gl.constexpr = k_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    # wgmma accumulators: S^T, dP^T [KW, BLOCK_M]; dK, dV [KW, D]; dQ [BLOCK_M, D]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, HEAD_DIM, 16])
    key_l: gl.constexpr = gl.SliceLayout(1, st_layout)

    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    n0 = pid_n * (2 * KW)
    k0 = n0 + WG * KW  # first key row of this warpgroup, in its head
    if CAUSAL:
        m_start = n0 // BLOCK_M  # the producer's first query tile
        m_mine = k0 // BLOCK_M  # the first one any of this warpgroup's keys is seen by
        gl.static_assert(BLOCK_M == KW, "causal needs query tiles of the warpgroup's 64 rows")
        m_full = m_mine + 1  # from here on no query of a tile misses a key
    else:
        m_start = 0
        m_mine = 0
        m_full = 0  # no diagonal tiles
    n_m = N // BLOCK_M
    keys = k0 + gl.arange(0, KW, layout=key_l)
    k_w = k_smem.index(WG)
    v_w = v_smem.index(WG)
    ds_w = ds_smem.index(WG)
    head = pid_bh.to(gl.int64) * N
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    dk = gl.zeros([KW, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([KW, HEAD_DIM], gl.float32, layout=kv_layout)
    mbarrier.wait(kv_ready, 0)

    # query tiles of the program that none of this warpgroup's keys are seen by: release them
    for i in range(m_start, m_mine):
        t = i - m_start
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        mbarrier.arrive(empty.index(s), count=1)

    # causal: with BLOCK_M == 64 key rows, exactly one query tile (i = m_mine) straddles this
    # warpgroup's diagonal; it is peeled off the loop, the only masked step (two loops, masked
    # and not, or one loop with a per-tile flag, spilled at D = 128 under Triton 3.6)
    if CAUSAL:
        dk, dv = _bwd_step(m_mine, m_mine - m_start, q_smem, do_smem, k_w, v_w, ds_w, ready,
                           empty, dk, dv, dq_ptr, lse_ptr, delta_ptr, head, keys, qk_scale, True,
                           STAGES)
    for i in range(m_full, n_m):
        dk, dv = _bwd_step(i, i - m_start, q_smem, do_smem, k_w, v_w, ds_w, ready, empty, dk,
                           dv, dq_ptr, lse_ptr, delta_ptr, head, keys, qk_scale, False, STAGES)

    out_rows = head + k0 + gl.arange(0, KW, layout=gl.SliceLayout(1, kv_layout))
    out = out_rows[:, None] * HEAD_DIM + offs_d[None, :]
    gl.store(dk_ptr + out, (dk * sm_scale).to(dtype))  # dK = sm_scale dS^T Q
    gl.store(dv_ptr + out, dv.to(dtype))


@gluon.jit
def _flash_bwd_hopper_kernel(q_desc, do_desc, k_desc, v_desc, dq_ptr, dk_ptr, dv_ptr, lse_ptr,
                             delta_ptr, N, sm_scale, qk_scale,
                             CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """One program: key rows pid_n * 128 .. + 128 of head pid_bh. Its four warps are consumer
    warpgroup 0; worker partitions add consumer warpgroup 1 and the producer warp.

    q_desc, do_desc: TMA descriptors of q, do viewed as [B * H * N, D], blocks [BLOCK_M, D];
    k_desc, v_desc: of k, v, blocks [64, D]. dq_ptr: fp32 [B * H * N, D] zeros (dQ / sm_scale is
    added into it); dk_ptr, dv_ptr: [B * H * N, D] in q's dtype; lse_ptr (natural log),
    delta_ptr: fp32 [B * H * N]."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    KW: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape,
                                       q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape,
                                        do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape,
                                       v_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                   rank=2)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, KW, BLOCK_M], ds_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release a stage
    fence_async_shared()
    gl.warp_specialize([
        (_bwd_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, kv_ready, ready, empty,
                         dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, N, sm_scale, qk_scale,
                         CAUSAL, STAGES, 0)),
        (_bwd_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, kv_ready, ready, empty,
                         dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, N, sm_scale, qk_scale,
                         CAUSAL, STAGES, 1)),
        (_bwd_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem,
                         kv_ready, ready, empty, N, CAUSAL, STAGES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def _check_inputs(do, q, k, v, o, lse, causal, sm_scale):
    """Refuse what the kernel does not take, naming the argument; device checks come last, so
    the refusals can be tested with CPU tensors."""
    named = (("do", do), ("q", q), ("k", k), ("v", v), ("o", o))
    for name, t in named + (("lse", lse),):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q has dtype {q.dtype}: flash_bwd_hopper takes bfloat16 or float16")
    if q.ndim != 4:
        raise ValueError(f"q must be [B, H, N, D], got shape {tuple(q.shape)}")
    for name, t in named:
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype and device ({q.dtype} on {q.device}), "
                             f"got {t.dtype} on {t.device}")
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)} (no grouped-query "
                             f"attention here), got {tuple(t.shape)}")
    B, H, N, D = q.shape
    if lse.dtype != torch.float32 or lse.shape != (B, H, N) or lse.device != q.device:
        raise ValueError(f"lse must be float32 [B, H, N] = {(B, H, N)} on {q.device}, got "
                         f"{lse.dtype} {tuple(lse.shape)} on {lse.device}")
    if D not in HEAD_DIMS:
        raise ValueError(f"q has head dim D={D}: flash_bwd_hopper takes D in {HEAD_DIMS}")
    if N == 0 or N % ROW_MULTIPLE != 0:
        raise ValueError(f"q has sequence length N={N}: flash_bwd_hopper needs a positive "
                         f"multiple of {ROW_MULTIPLE}")
    if B * H == 0 or B * H > 65535:
        raise ValueError(f"q has B * H = {B * H}: flash_bwd_hopper needs 1 .. 65535")
    for name, t in named + (("lse", lse),):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if sm_scale is not None and (isinstance(sm_scale, bool) or not (
            isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale) and sm_scale > 0)):
        raise ValueError(f"sm_scale must be a positive finite float or None, got {sm_scale!r}")
    check_hopper_device(q, "flash_bwd_hopper")


def flash_bwd_hopper(do, q, k, v, o, lse, causal: bool = False, sm_scale: float | None = None):
    """Gradients (dq, dk, dv) of softmax(sm_scale q k^T [+ causal mask]) v, given the forward's
    output o and its natural-log log-sum-exp lse [B, H, N] float32 (as ``fa3_forward`` or
    ``kernelnotes.attention.flash_attn_fwd`` return them). q, k, v, o, do: [B, H, N, D] bf16 or
    fp16, contiguous, D in (64, 128), N a positive multiple of 128, on a Hopper GPU. causal: the
    top-left mask (SDPA's is_causal). Returns dq, dk, dv in q's dtype."""
    _check_inputs(do, q, k, v, o, lse, causal, sm_scale)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    B, H, N, D = q.shape
    cfg = CONFIGS[D]
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(D)
    delta = (do.float() * o.float()).sum(-1).contiguous()  # Delta_i = rowsum(dO o O)
    dq32 = torch.zeros((B, H, N, D), device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16

    def desc(t, rows):
        block = [rows, D]
        return TensorDescriptor.from_tensor(t.view(B * H * N, D), block,
                                            gl.NVMMASharedLayout.get_default_for(block, dtype))

    grid = (N // BLOCK_N, B * H)
    _flash_bwd_hopper_kernel[grid](
        desc(q, cfg.block_m), desc(do, cfg.block_m), desc(k, KEYS_PER_WG.value),
        desc(v, KEYS_PER_WG.value), dq32, dk, dv, lse, delta, N, scale, scale * LOG2E,
        CAUSAL=causal, STAGES=cfg.stages, num_warps=CONSUMER_WARPS.value)
    return (dq32 * scale).to(q.dtype), dk, dv
