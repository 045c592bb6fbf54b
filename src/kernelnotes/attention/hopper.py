"""The Hopper forward for D = 128: FlashAttention-3's schedule, in Gluon.

``kernel.py``'s forward is a ``tl`` kernel (FlashAttention-2's algorithm). On a Hopper GPU
(sm_90) at D = 128 ``flash_attention`` runs this one instead, which adds the three ideas of
FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, arXiv:2407.08608) that
``tl`` cannot ask for and Gluon (``triton.experimental.gluon``, Triton's lower-level dialect) can
say:

1. **Warp specialisation.** One producer warp only issues TMA loads: each consumer
   warpgroup's query tile once, then the key and value tiles through a ring of ``stages``
   shared-memory stages. ``k_ready``/``v_ready`` mbarriers say a stage has landed; ``empty``
   (count 2) says both consumer warpgroups are done with it. The producer gets 24 registers a
   thread, the consumers 240 (``setmaxnreg``), as FlashAttention-3 does.
2. **Ping-pong between two consumer warpgroups.** Each owns its own ``block_m``-row query tile
   and runs the whole online softmax for it; they hand a *turn* back and forth through a pair of
   mbarriers, and a warpgroup issues its ``wgmma`` only while it holds the turn. So warpgroup 0's
   softmax (exp2 on the multi-function units) runs while warpgroup 1's matrix products occupy
   the tensor cores, and the other way round.
3. **Intra-warpgroup overlap** (``Config.overlap``). Within one warpgroup, S_j = Q K_j^T is issued
   together with O += P_{j-1} V_{j-1}, both asynchronously, so that the softmax of S_j runs
   while P_{j-1} V_{j-1} is still on the tensor cores. P goes to the second ``wgmma`` straight
   from registers (its A operand in a ``DotOperandLayout``), never through shared memory.

Conventions follow ``kernel.py``: scores in the log2 domain (``qk_scale = sm_scale * log2 e``,
``exp2``), the returned log-sum-exp in natural log, grouped-query attention by reading key/value
head ``h // (Hq / Hkv)``. Causal attention is top-left (query i sees key j iff j <= i, as SDPA's
``is_causal``; with Nq = Nk bottom-right is the same mask): key tiles past the diagonal are
skipped and only the diagonal tile is masked; causal programs run longest first.

Needs a Hopper GPU: Gluon kernels do not run in Triton's interpreter. Written for Triton 3.6
(the API names it renamed later are looked up at import). lab/attention/ holds the design study
that led here (NOTES.md) and lab/attention/aot_check.py, which compiles every configuration for
sm_90 without a GPU. The schedule's building blocks (``tma_load``, ``key_tiles``, ``take_turn``,
``pass_turn``, ``turns``, ``softmax_step``, ``lpt_heads``) and its constants are public: the
lab's designs reuse them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# Hopper's TMA load: async_copy_global_to_shared in Triton 3.6, async_load in later releases
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

LOG2E = 1.4426950408889634  # scores are kept in the log2 domain: exp(x) = exp2(x log2 e)
LN2 = gl.constexpr(0.6931471805599453)  # the log-sum-exp goes back to natural log

# Registers a thread after setmaxnreg (FlashAttention-3's split): 2 x 128 consumer threads at 240
# and the producer's warpgroup (one warp padded to four) at 24 use 64,512 of the SM's 65,536
CONSUMER_REGS = gl.constexpr(240)
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup: a wgmma's unit
PRODUCER_WARPS = gl.constexpr(1)

MAX_SHARED_BYTES = 227 * 1024  # what one block of an H100/H200 may allocate
HEAD_DIMS = (64, 128)
ROW_MULTIPLE = 128  # N must be a multiple of this: no key tile runs past the head's keys


class Config(NamedTuple):
    """One variant of the kernel.

    block_m: query rows of each consumer warpgroup (a program covers 2 * block_m rows).
    block_n: keys a tile (each stage holds one key tile and one value tile).
    stages: depth of the K/V ring in shared memory.
    overlap: intra-warpgroup overlap of S_{j+1} = Q K_{j+1}^T with the softmax of S_j.
    """

    block_m: int
    block_n: int
    stages: int
    overlap: bool

    def shared_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """Shared memory of the tiles: two query tiles and `stages` (K, V) pairs."""
        q = 2 * self.block_m * head_dim
        kv = self.stages * 2 * self.block_n * head_dim
        return (q + kv) * elem_bytes


# The variants worth timing; lab/attention/aot_check.py compiles each for D = 64 and 128, all
# without spills under Triton 3.6. 128 query rows a warpgroup (S and O each 128 fp32 registers a
# thread at D = 128) spilled at both head dims with 240 registers, so it is not among them.
CONFIGS = [
    Config(block_m=64, block_n=128, stages=2, overlap=False),
    Config(block_m=64, block_n=128, stages=2, overlap=True),
    Config(block_m=64, block_n=128, stages=3, overlap=True),  # 224 KiB of tiles at D = 128
]


# What fa3_forward uses when given no config: FlashAttention-3's shape for D = 128 (64 query
# rows a warpgroup, 128-key tiles, intra-warpgroup overlap) with a three-stage ring, the fastest
# of CONFIGS at D = 128 in lab/attention/results/designs.json (H200)
DEFAULT_CONFIG = CONFIGS[2]


# --8<-- [start:fa3_tile_order]
@gluon.jit
def _program_tile(LPT_HEADS, CAUSAL: gl.constexpr):
    """(query tile, batch-head) of this program. Causal tiles differ in work (tile i reads
    i + 1 key tiles), so they run longest first across groups of LPT_HEADS heads, as the
    product's forward orders them: a heavy tile launched last would set the kernel's tail, and
    the group keeps the heads running together few enough that their K and V stay in L2."""
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    if CAUSAL:
        n_m = gl.num_programs(0)
        launch = pid_bh * n_m + pid_m
        group = launch // (LPT_HEADS * n_m)
        rank = launch % (LPT_HEADS * n_m)
        heads = gl.minimum(LPT_HEADS, gl.num_programs(1) - group * LPT_HEADS)  # last: fewer
        pid_m = n_m - 1 - rank // heads
        pid_bh = group * LPT_HEADS + rank % heads
    return pid_m, pid_bh


@gluon.jit
def key_tiles(row0, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Key tiles of the query rows row0 .. row0 + BLOCK_M: tiles [0, n_full) are seen whole by
    every row (no mask), [n_full, n_seen) by some rows (the diagonal: masked)."""
    n_tiles = N // BLOCK_N
    if CAUSAL:
        n_full = gl.minimum((row0 + 1) // BLOCK_N, n_tiles)  # last key <= the first row
        n_seen = gl.minimum(gl.cdiv(row0 + BLOCK_M, BLOCK_N), n_tiles)
    else:
        n_full = n_tiles
        n_seen = n_tiles
    return n_full, n_seen
# --8<-- [end:fa3_tile_order]


# --8<-- [start:fa3_producer]
@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, empty,
              N, GROUP, LPT_HEADS, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """One warp: TMA loads of the two query tiles, then of every key tile either consumer
    warpgroup reads (the union: the second warpgroup's rows are later, so it reads at least as
    many) with its value tile, into stage j % STAGES. A stage is refilled once both warpgroups
    have arrived on its `empty` barrier."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid_m, pid_bh = _program_tile(LPT_HEADS, CAUSAL)
    row0 = pid_bh * N + pid_m * (2 * BLOCK_M)  # rows of [B * H * N, D]
    for wg in gl.static_range(2):
        mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
        tma_load(q_desc, [row0 + wg * BLOCK_M, 0], q_ready.index(wg), q_smem.index(wg))
    _, n_all = key_tiles(pid_m * (2 * BLOCK_M) + BLOCK_M, N, BLOCK_M, BLOCK_N, CAUSAL)
    kv_row0 = (pid_bh // GROUP) * N  # b * Hq + h -> b * Hkv + h // GROUP: the shared K, V head
    for j in range(n_all):
        s = j % STAGES
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)  # the first round passes
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [kv_row0 + j * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [kv_row0 + j * BLOCK_N, 0], v_ready.index(s), v_smem.index(s))
# --8<-- [end:fa3_producer]


# --8<-- [start:fa3_softmax]
@gluon.jit
def take_turn(turn, k, WG: gl.constexpr):
    """Wait for this warpgroup's k-th turn on the tensor cores. Warpgroup 0 goes first: on a
    fresh barrier a wait for parity 1 passes at once. Turns strictly alternate, so a turn
    barrier never runs two phases ahead of its waiter (which a parity wait could not tell)."""
    mbarrier.wait(turn.index(WG), (k & 1) ^ (1 - WG))


@gluon.jit
def pass_turn(turn, WG: gl.constexpr):
    mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def turns(n_tiles, OVERLAP: gl.constexpr):
    """Turns a warpgroup takes for n_tiles >= 1 key tiles: with overlap one a tile plus the last
    P V; without, one for S = Q K^T and one for P V a tile."""
    if OVERLAP:
        return n_tiles + 1
    else:
        return 2 * n_tiles


@gluon.jit
def softmax_step(s, m_i, l_i, qk_scale, rows, cols, masked, CAUSAL: gl.constexpr):
    """One online-softmax update of the score tile s [BLOCK_M, BLOCK_N] (S2 = qk_scale * s):
    m' = max(m, rowmax S2), P = 2^(S2 - m'), alpha = 2^(m - m'), l' = alpha l + rowsum P.
    masked (the diagonal tile) hides keys past each row. Top-left causal with Nq = Nk gives
    every row key 0 in the first tile, so m' is finite from the first tile on."""
    if CAUSAL:
        if masked:
            s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)  # m starts at -inf: alpha is 0 on the first tile
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)
# --8<-- [end:fa3_softmax]


# --8<-- [start:fa3_consumer]
@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, empty, turn, o_ptr, lse_ptr,
              N, qk_scale, LPT_HEADS, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
              OVERLAP: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG (0 or 1): the online softmax of query rows
    row0 .. row0 + BLOCK_M, where row0 = (2 * tile + WG) * BLOCK_M, over its key tiles; then
    O = acc / l and lse, stored straight from the wgmma registers."""
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    # wgmma accumulators: S [BLOCK_M, BLOCK_N] and O [BLOCK_M, HEAD_DIM], 16 rows a warp
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, HEAD_DIM, 16])
    # P as the register A operand of P V (two 16-bit values a 32-bit register)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_m, pid_bh = _program_tile(LPT_HEADS, CAUSAL)
    row0 = pid_m * (2 * BLOCK_M) + WG * BLOCK_M  # first query row of this warpgroup, in its head
    n_full, n_mine = key_tiles(row0, N, BLOCK_M, BLOCK_N, CAUSAL)
    _, n_all = key_tiles(pid_m * (2 * BLOCK_M) + BLOCK_M, N, BLOCK_M, BLOCK_N, CAUSAL)
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    q = q_smem.index(WG)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready.index(WG), 0)

    if OVERLAP:
        # prologue, turn 0: S_0 alone
        take_turn(turn, 0, WG)
        mbarrier.wait(k_ready.index(0), 0)
        s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)),
                              gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                              use_acc=False, is_async=True)
        pass_turn(turn, WG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows, cols0, n_full == 0,
                                           CAUSAL)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # turn j: issue S_j and O += P_{j-1} V_{j-1}; the softmax of S_j runs while P V does
        for j in range(1, n_mine):
            s_idx = j % STAGES
            prev = (j - 1) % STAGES
            take_turn(turn, j, WG)
            mbarrier.wait(k_ready.index(s_idx), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)),
                                  gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                                  use_acc=False, is_async=True)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]  # before P V reads acc
            mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            pass_turn(turn, WG)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_j; P V in flight
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows,
                                               j * BLOCK_N + cols0, j >= n_full, CAUSAL)
            # p_op is read by the wgmma in flight: naming it keeps its registers from reuse
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            mbarrier.arrive(empty.index(prev), count=1)  # K_{j-1} and V_{j-1} are free
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        # last turn: the last P V alone
        last = (n_mine - 1) % STAGES
        take_turn(turn, n_mine, WG)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        mbarrier.wait(v_ready.index(last), ((n_mine - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        pass_turn(turn, WG)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        mbarrier.arrive(empty.index(last), count=1)
    else:
        # two turns a tile: S_j = Q K_j^T, then, after the softmax, O += P_j V_j
        for j in range(n_mine):
            s_idx = j % STAGES
            phase = (j // STAGES) & 1
            take_turn(turn, 2 * j, WG)
            mbarrier.wait(k_ready.index(s_idx), phase)
            s_tok = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)),
                                  gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                                  use_acc=False, is_async=True)
            pass_turn(turn, WG)  # the other warpgroup's product queues behind this one
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows,
                                               j * BLOCK_N + cols0, j >= n_full, CAUSAL)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            take_turn(turn, 2 * j + 1, WG)
            mbarrier.wait(v_ready.index(s_idx), phase)
            o_tok = warpgroup_mma(p_op, v_smem.index(s_idx), acc, is_async=True)
            pass_turn(turn, WG)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            mbarrier.arrive(empty.index(s_idx), count=1)

    # Key tiles only the other warpgroup reads (causal, block_m > block_n / 2): wait until each
    # has landed, so that this arrival counts towards its own round of `empty`, then release it
    for j in range(n_mine, n_all):
        s_idx = j % STAGES
        mbarrier.wait(k_ready.index(s_idx), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(s_idx), (j // STAGES) & 1)
        mbarrier.arrive(empty.index(s_idx), count=1)
    # Both warpgroups take the same number of turns, or the one with more would wait forever
    for k in range(turns(n_mine, OVERLAP), turns(n_all, OVERLAP)):
        take_turn(turn, k, WG)
        pass_turn(turn, WG)

    # epilogue: O = acc / l, lse = (m + log2 l) ln 2; a row that saw no key gets O = 0, L = +inf
    # (top-left causal with Nq = Nk has none, kept for the convention)
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    lse = gl.where(seen, (m_i + gl.log2(l_safe)) * LN2, float("inf"))
    o = acc * gl.convert_layout(1.0 / l_safe, row_o)[:, None]
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    flat_rows = pid_bh.to(gl.int64) * N + offs_m  # rows of [B * H * N, D]
    o_ptrs = o_ptr + flat_rows[:, None] * HEAD_DIM + offs_d[None, :]
    gl.store(o_ptrs, o.to(dtype), mask=(offs_m < N)[:, None])
    gl.store(lse_ptr + pid_bh.to(gl.int64) * N + rows, lse, mask=rows < N)
# --8<-- [end:fa3_consumer]


# --8<-- [start:fa3_kernel]
@gluon.jit
def _fa3_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, N, GROUP, qk_scale, LPT_HEADS,
                    CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    """One program: 2 x BLOCK_M query rows of one head. Its four warps are consumer warpgroup
    0; worker partitions add consumer warpgroup 1 (four warps) and the producer (one warp).

    q_desc, k_desc, v_desc: TMA descriptors of q viewed as [B * Hq * N, D] and k, v as
    [B * Hkv * N, D] (contiguous), blocks [BLOCK_M, D], [BLOCK_N, D], [BLOCK_N, D]; GROUP =
    Hq // Hkv. o_ptr: [B * Hq * N, D] in q's dtype; lse_ptr: [B * Hq * N] float32."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape,
                                       q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release a stage
    for w in gl.static_range(2):
        mbarrier.init(q_ready.index(w), count=1)
        mbarrier.init(turn.index(w), count=1)
    fence_async_shared()  # the initialised barriers are visible to the TMA unit
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, empty, turn, o_ptr,
                     lse_ptr, N, qk_scale, LPT_HEADS, CAUSAL, STAGES, OVERLAP, 0)),
        (_consumer, (q_smem, k_smem, v_smem, q_ready, k_ready, v_ready, empty, turn, o_ptr,
                     lse_ptr, N, qk_scale, LPT_HEADS, CAUSAL, STAGES, OVERLAP, 1)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                     empty, N, GROUP, LPT_HEADS, CAUSAL, STAGES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
# --8<-- [end:fa3_kernel]


# heads per longest-first group of causal programs: their K and V fill about this much L2
# (the product's forward uses the same budget)
LPT_L2_BYTES = 16 << 20


def lpt_heads(n_heads: int, N: int, D: int, elem_bytes: int) -> int:
    return max(1, min(n_heads, LPT_L2_BYTES // (2 * N * D * elem_bytes)))


def takes(q, k, v, causal_off: int = 0, capability: tuple[int, int] | None = None) -> bool:
    """Whether ``flash_attention``'s forward goes through this kernel: D = 128, bf16 or fp16,
    k and v of q's B, N and D (Nq = Nk, a positive multiple of 128) with Hkv dividing Hq, the
    top-left mask (causal_off = 0, which with Nq = Nk is also the bottom-right one), a grid that
    fits, on a Hopper GPU: ``capability`` (9, x), or None to read q's CUDA device. Everything else
    keeps kernel.py's forward."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    if not (D == 128 and q.dtype in (torch.bfloat16, torch.float16)
            and k.dtype == v.dtype == q.dtype and k.shape == v.shape
            and k.shape[0] == B and k.shape[2:] == q.shape[2:] and Hkv > 0 and Hq % Hkv == 0
            and Nq > 0 and Nq % ROW_MULTIPLE == 0 and causal_off == 0 and 0 < B * Hq <= 65535):
        return False
    if capability is None:
        if q.device.type != "cuda":
            return False
        capability = torch.cuda.get_device_capability(q.device)
    return capability[0] == 9


def check_inputs(q, k, v, causal, sm_scale, fn: str = "fa3_forward"):
    """Refuse tensors and scalars that a Hopper attention forward ``fn`` does not take, naming
    the argument. No device check: these refusals can be tested with CPU tensors."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name} has dtype {t.dtype}: {fn} takes bfloat16 or float16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype and device ({q.dtype} on {q.device}), "
                             f"got {t.dtype} on {t.device}")
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be [B, H, N, D], got shapes {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    if v.shape != k.shape or k.shape[0] != B or k.shape[2:] != q.shape[2:] or Hkv == 0 \
            or H % Hkv:
        raise ValueError(f"k and v must be [B, Hkv, N, D] with q's B, N and D and Hkv dividing "
                         f"q's H (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    if D not in HEAD_DIMS:
        raise ValueError(f"q has head dim D={D}: {fn} takes D in {HEAD_DIMS} (q has shape "
                         f"{tuple(q.shape)})")
    if N == 0 or N % ROW_MULTIPLE != 0:
        raise ValueError(f"q has sequence length N={N}: {fn} needs a positive multiple of "
                         f"{ROW_MULTIPLE} (q has shape {tuple(q.shape)})")
    if B * H == 0 or B * H > 65535:  # the batch-head index is fa3_forward's second grid axis
        raise ValueError(f"q has B * H = {B * H}: {fn} needs 1 .. 65535 (q has shape "
                         f"{tuple(q.shape)})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the TMA descriptors read it as "
                             f"[B * H * N, D]), got strides {tuple(t.stride())}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if sm_scale is not None and (isinstance(sm_scale, bool) or not (
            isinstance(sm_scale, (int, float)) and math.isfinite(sm_scale) and sm_scale > 0)):
        raise ValueError(f"sm_scale must be a positive finite float or None, got {sm_scale!r}")


def check_hopper_device(q, fn: str = "fa3_forward"):
    """Refuse a q that is not on a Hopper (sm_90) GPU, naming ``fn``; checked last, after every
    refusal that CPU tensors can reach."""
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}: {fn} needs CUDA tensors on a Hopper GPU (Gluon "
                         "kernels do not run in Triton's interpreter)")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        raise ValueError(f"q is on an sm_{major}{minor} GPU: {fn} needs Hopper (sm_90), for its "
                         "wgmma, TMA and setmaxnreg")


def _check_config(config, N, D, element_size):
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config (see CONFIGS) or None, got {config!r}")
    if N % config.block_n != 0:
        raise ValueError(f"config {config} needs N a multiple of block_n={config.block_n}, "
                         f"got N={N}")
    need = config.shared_bytes(D, element_size)
    if need > MAX_SHARED_BYTES:
        raise ValueError(f"config {config} needs {need} bytes of shared memory at D={D}: more "
                         f"than the {MAX_SHARED_BYTES} a block has")


# --8<-- [start:fa3_launcher]
def fa3_forward(q, k, v, causal: bool = False, sm_scale: float | None = None,
                config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(sm_scale q k^T [+ causal mask]) v with FlashAttention-3's schedule (Shah et al.
    2024, arXiv:2407.08608), and its log-sum-exp.

    Args:
        q: [B, Hq, N, D]; k, v: [B, Hkv, N, D] with Hkv dividing Hq (grouped-query attention);
            bfloat16 or float16, contiguous, on a Hopper GPU; D in (64, 128), N a positive
            multiple of 128.
        causal: top-left causal mask (query i sees key j iff j <= i), as SDPA's is_causal.
        sm_scale: the score scale; None for 1 / sqrt(D).
        config: one of CONFIGS, or None for DEFAULT_CONFIG.
    Returns:
        o [B, Hq, N, D] in q's dtype, and lse [B, Hq, N] float32, the natural-log log-sum-exp of
        each query row's scaled scores.
    """
    check_inputs(q, k, v, causal, sm_scale)
    if config is not None:
        _check_config(config, q.shape[2], q.shape[3], q.element_size())
    check_hopper_device(q)
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    cfg = config or DEFAULT_CONFIG
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(D)
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16

    def desc(t, heads, rows):
        block = [rows, D]
        return TensorDescriptor.from_tensor(t.view(B * heads * N, D), block,
                                            gl.NVMMASharedLayout.get_default_for(block, dtype))

    grid = (triton.cdiv(N, 2 * cfg.block_m), B * H)
    _fa3_fwd_kernel[grid](
        desc(q, H, cfg.block_m), desc(k, Hkv, cfg.block_n), desc(v, Hkv, cfg.block_n), o, lse,
        N, H // Hkv, scale * LOG2E, lpt_heads(B * H, N, D, q.element_size()),
        CAUSAL=causal, STAGES=cfg.stages, OVERLAP=cfg.overlap, num_warps=CONSUMER_WARPS.value)
    return o, lse
# --8<-- [end:fa3_launcher]
