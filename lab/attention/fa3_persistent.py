"""Design C: a persistent FlashAttention-3-style forward in Gluon (a lab study).

Design B (``kernelnotes.attention.hopper``, lab/attention/NOTES.md) launches one program per
2 x 64 query rows. At N = 1024 a program reads only 8 key tiles, and its prologue (the two query
tiles, the first key tile) and its epilogue (storing O) sit exposed: it reached 0.81-0.88x cuDNN
there. This design runs the same algorithm - one TMA producer warp (24 registers a thread), two
64-row consumer warpgroups (240 registers) taking turns on the tensor cores through a pair of
mbarriers, the intra-warpgroup overlap (``Config.overlap``), P kept in registers as the A
operand of P V - but **persistently**: the grid is min(#SMs, #tiles) programs, and program p
works through the tiles p, p + P, p + 2P, ... (a static strided order; causal tiles are
numbered longest first across groups of heads, as hopper.py numbers its launches). Because the
producer does not stop at a tile's end it runs ahead into the next tile's query tiles and key and
value tiles while the consumers finish the current one, so one tile's epilogue and the next
one's prologue hide under the neighbouring work:

- each consumer warpgroup's query tile is double-buffered (a ring of 2 a warpgroup, with
  ``q_ready`` / ``q_empty`` barriers): the producer loads tile i + 1's Q while tile i's is read;
- the K/V ring index and its phases come from a running count of the key tiles this program has
  loaded, continued across tiles (not reset per tile);
- the turn counter also runs across tiles: both warpgroups take the same number of turns on
  every tile (the one with fewer key tiles takes empty turns), so over the whole program too.

Shared memory: 2 x 2 query tiles plus ``stages`` (K, V) pairs. At D = 128 with 64-row query tiles
and 128-key tiles that is 64 KiB + stages x 64 KiB: two stages (192 KiB) fit the 227 KiB a block
may have, three do not; so ``CONFIGS`` has two-stage configurations only.

A study: it uses the package's public API only and nothing in the package imports it. It has
been compiled offline for sm_90 with Triton 3.6 (lab/attention/aot_check.py --persistent) but
has NOT run on a GPU yet: ``python -m benchmarks --lab attention designs`` first probes it in a
child process with a time limit (a wrong barrier phase hangs). Nothing runs at import.
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
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The product's constants (register split, shared memory, head dims) and schedule blocks
from kernelnotes.attention.hopper import (
    CONSUMER_REGS,
    CONSUMER_WARPS,
    LN2,
    LOG2E,
    MAX_SHARED_BYTES,
    PRODUCER_REGS,
    PRODUCER_WARPS,
    check_hopper_device,
    check_inputs,
    key_tiles,
    lpt_heads,
    pass_turn,
    softmax_step,
    take_turn,
    tma_load,
    turns,
)

Q_BUFFERS = gl.constexpr(2)  # query tiles a consumer warpgroup holds: tile i and tile i + 1


class Config(NamedTuple):
    """One variant. block_m: query rows of each consumer warpgroup (a tile is 2 * block_m
    rows); block_n: keys a K/V tile; stages: depth of the K/V ring; overlap: intra-warpgroup
    overlap of S_j = Q K_j^T with O += P_{j-1} V_{j-1}."""

    block_m: int
    block_n: int
    stages: int
    overlap: bool

    def shared_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """Shared memory of the tiles: 2 warpgroups x Q_BUFFERS query tiles, `stages` (K, V)."""
        q = 2 * Q_BUFFERS.value * self.block_m * head_dim
        kv = self.stages * 2 * self.block_n * head_dim
        return (q + kv) * elem_bytes


# Both fit at D = 64 and D = 128 (192 KiB of tiles at D = 128); three stages fit only at D = 64
CONFIGS = [
    Config(block_m=64, block_n=128, stages=2, overlap=False),
    Config(block_m=64, block_n=128, stages=2, overlap=True),
]
DEFAULT_CONFIG = CONFIGS[1]


# ------------------------------------------------------------------------------ tile order
@gluon.jit
def _tile_coords(t, n_m, n_bh, LPT_HEADS, CAUSAL: gl.constexpr):
    """(query tile, batch-head) of work tile t of n_m * n_bh. Non-causal: t = bh * n_m + m, the
    order of hopper.py's grid. Causal: longest first within groups of LPT_HEADS heads (tile m
    reads m + 1 key tiles), the numbering hopper.py gives its launch index."""
    pid_m = t % n_m
    pid_bh = t // n_m
    if CAUSAL:
        group = t // (LPT_HEADS * n_m)
        rank = t % (LPT_HEADS * n_m)
        heads = gl.minimum(LPT_HEADS, n_bh - group * LPT_HEADS)  # the last group: fewer
        pid_m = n_m - 1 - rank // heads
        pid_bh = group * LPT_HEADS + rank % heads
    return pid_m, pid_bh


# --------------------------------------------------------------------------- mbarrier phases
# Every ring below follows one rule. An mbarrier's phase flips each time its expected arrivals
# (and, for TMA, bytes) are complete; wait(bar, parity) returns once the phase of that parity
# has completed, and on a fresh barrier a wait for parity 1 returns at once. So the n-th use
# (n = 0, 1, ...) of a barrier in a ring of R is slot n % R, parity (n // R) & 1 for the side
# waiting on "full", and (n // R) & 1 ^ 1 for the side waiting on "empty" (its first round
# passes). n is a running count per program, never reset at a tile boundary:
#   K/V:  n = c, the program's key-tile count (c = sum of the earlier tiles' n_all + j), R = stages
#   Q:    n = i, the program's tile count, R = Q_BUFFERS, one ring per consumer warpgroup
#   turn: warpgroup WG's k-th turn (k a running count) waits turn[WG] for parity (k & 1) ^ (1-WG)
# (hopper.take_turn with k counted from the program's first tile: each warpgroup takes
# turns(n_all) turns on every tile, so turns still strictly alternate and turn[WG] never runs
# two phases ahead of its waiter)
@gluon.jit
def _phase(n, R: gl.constexpr):
    return (n // R) & 1


# ------------------------------------------------------------------------------ producer
@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
              v_ready, empty, N, n_bh, GROUP, LPT_HEADS, CAUSAL: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp, over this program's tiles in order: for tile i the two query tiles into buffer
    i % Q_BUFFERS (once the consumers released tile i - Q_BUFFERS's), then every key tile
    either warpgroup reads, with its value tile, into K/V slot c % STAGES. It never waits for a
    tile's end: while the consumers finish tile i it is already loading tile i + 1."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    n_m = N // (2 * BLOCK_M)
    i = 0  # tiles begun by this program
    c = 0  # key tiles loaded by this program (all its earlier tiles' n_all)
    for t in range(gl.program_id(0), n_m * n_bh, gl.num_programs(0)):
        pid_m, pid_bh = _tile_coords(t, n_m, n_bh, LPT_HEADS, CAUSAL)
        row0 = pid_bh * N + pid_m * (2 * BLOCK_M)  # rows of [B * Hq * N, D]
        qb = i % Q_BUFFERS
        for wg in gl.static_range(2):
            qi = qb * 2 + wg  # query slot: buffer qb of warpgroup wg
            mbarrier.wait(q_empty.index(qi), _phase(i, Q_BUFFERS) ^ 1)  # first round passes
            mbarrier.expect(q_ready.index(qi), q_desc.block_type.nbytes)
            tma_load(q_desc, [row0 + wg * BLOCK_M, 0], q_ready.index(qi), q_smem.index(qi))
        _, n_all = key_tiles(pid_m * (2 * BLOCK_M) + BLOCK_M, N, BLOCK_M, BLOCK_N, CAUSAL)
        kv_row0 = (pid_bh // GROUP) * N  # the K, V head this query head shares (GQA)
        for j in range(n_all):
            cj = c + j
            s = cj % STAGES
            mbarrier.wait(empty.index(s), _phase(cj, STAGES) ^ 1)  # the first round passes
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma_load(k_desc, [kv_row0 + j * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma_load(v_desc, [kv_row0 + j * BLOCK_N, 0], v_ready.index(s), v_smem.index(s))
        c += n_all
        i += 1


# ------------------------------------------------------------------------------ consumers
@gluon.jit
def _consumer(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, empty, turn, o_ptr,
              lse_ptr, N, n_bh, qk_scale, LPT_HEADS, CAUSAL: gl.constexpr,
              STAGES: gl.constexpr, OVERLAP: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG over this program's tiles: for each, the online softmax of its
    BLOCK_M query rows over its key tiles, then O and lse stored from the wgmma registers. The
    counters c (key tiles), tk (turns) and i (tiles) run on across tiles, as the producer's."""
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    n_m = N // (2 * BLOCK_M)
    i = 0  # tiles done by this program
    c = 0  # key tiles consumed (released) by this program: the producer's count at tile start
    tk = 0  # turns this warpgroup has taken: the same for both warpgroups at every tile start
    for t in range(gl.program_id(0), n_m * n_bh, gl.num_programs(0)):
        pid_m, pid_bh = _tile_coords(t, n_m, n_bh, LPT_HEADS, CAUSAL)
        row0 = pid_m * (2 * BLOCK_M) + WG * BLOCK_M  # this warpgroup's first row, in its head
        n_full, n_mine = key_tiles(row0, N, BLOCK_M, BLOCK_N, CAUSAL)
        _, n_all = key_tiles(pid_m * (2 * BLOCK_M) + BLOCK_M, N, BLOCK_M, BLOCK_N, CAUSAL)
        rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
        qi = (i % Q_BUFFERS) * 2 + WG
        q = q_smem.index(qi)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_ready.index(qi), _phase(i, Q_BUFFERS))

        if OVERLAP:
            # turn tk: S_0 alone
            take_turn(turn, tk, WG)
            s0 = c % STAGES
            mbarrier.wait(k_ready.index(s0), _phase(c, STAGES))
            s_tok = warpgroup_mma(q, k_smem.index(s0).permute((1, 0)),
                                  gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                                  use_acc=False, is_async=True)
            pass_turn(turn, WG)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows, cols0, n_full == 0,
                                               CAUSAL)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            # turn tk + j: S_j with O += P_{j-1} V_{j-1}
            for j in range(1, n_mine):
                cj = c + j
                s_idx = cj % STAGES
                prev = (cj - 1) % STAGES
                take_turn(turn, tk + j, WG)
                mbarrier.wait(k_ready.index(s_idx), _phase(cj, STAGES))
                s_tok = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)),
                                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                                      use_acc=False, is_async=True)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                mbarrier.wait(v_ready.index(prev), _phase(cj - 1, STAGES))
                o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                pass_turn(turn, WG)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
                p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows,
                                                   j * BLOCK_N + cols0, j >= n_full, CAUSAL)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                mbarrier.arrive(empty.index(prev), count=1)  # K/V item cj - 1 is free
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            # every S = Q K^T of this tile has completed: the query buffer may be refilled
            mbarrier.arrive(q_empty.index(qi), count=1)
            # turn tk + n_mine: the last P V alone
            cl = c + n_mine - 1
            last = cl % STAGES
            take_turn(turn, tk + n_mine, WG)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            mbarrier.wait(v_ready.index(last), _phase(cl, STAGES))
            o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
            pass_turn(turn, WG)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            mbarrier.arrive(empty.index(last), count=1)
        else:
            # turns tk + 2j (S_j) and tk + 2j + 1 (P_j V_j)
            for j in range(n_mine):
                cj = c + j
                s_idx = cj % STAGES
                phase = _phase(cj, STAGES)
                take_turn(turn, tk + 2 * j, WG)
                mbarrier.wait(k_ready.index(s_idx), phase)
                s_tok = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)),
                                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout),
                                      use_acc=False, is_async=True)
                pass_turn(turn, WG)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, rows,
                                                   j * BLOCK_N + cols0, j >= n_full, CAUSAL)
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                take_turn(turn, tk + 2 * j + 1, WG)
                mbarrier.wait(v_ready.index(s_idx), phase)
                o_tok = warpgroup_mma(p_op, v_smem.index(s_idx), acc, is_async=True)
                pass_turn(turn, WG)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                mbarrier.arrive(empty.index(s_idx), count=1)
            mbarrier.arrive(q_empty.index(qi), count=1)

        # Key tiles only the other warpgroup reads (causal, block_m > block_n / 2; none with
        # CONFIGS): wait for each to land, so this arrival counts towards its own round of
        # `empty`, then release it
        for j in range(n_mine, n_all):
            cj = c + j
            s_idx = cj % STAGES
            mbarrier.wait(k_ready.index(s_idx), _phase(cj, STAGES))
            mbarrier.wait(v_ready.index(s_idx), _phase(cj, STAGES))
            mbarrier.arrive(empty.index(s_idx), count=1)
        # Empty turns up to the tile's common count, so that tk stays equal in both warpgroups
        for k in range(turns(n_mine, OVERLAP), turns(n_all, OVERLAP)):
            take_turn(turn, tk + k, WG)
            pass_turn(turn, WG)

        # epilogue (runs while the other warpgroup has the tensor cores, and while the producer
        # loads the next tile): O = acc / l, lse = (m + log2 l) ln 2
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        lse = gl.where(seen, (m_i + gl.log2(l_safe)) * LN2, float("inf"))
        o = acc * gl.convert_layout(1.0 / l_safe, row_o)[:, None]
        offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        flat_rows = pid_bh.to(gl.int64) * N + offs_m
        o_ptrs = o_ptr + flat_rows[:, None] * HEAD_DIM + offs_d[None, :]
        gl.store(o_ptrs, o.to(dtype), mask=(offs_m < N)[:, None])
        gl.store(lse_ptr + pid_bh.to(gl.int64) * N + rows, lse, mask=rows < N)

        c += n_all
        tk += turns(n_all, OVERLAP)
        i += 1


# ------------------------------------------------------------------------------ kernel
@gluon.jit
def _fa3_persistent_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, N, n_bh, GROUP, qk_scale,
                           LPT_HEADS, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                           OVERLAP: gl.constexpr):
    """A persistent program: tiles pid, pid + P, ... of the N // (2 BLOCK_M) x n_bh tiles. Its
    four warps are consumer warpgroup 0; worker partitions add warpgroup 1 and the producer.
    Descriptors as hopper.py's: q [B * Hq * N, D], k and v [B * Hkv * N, D], GROUP = Hq // Hkv,
    n_bh = B * Hq."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * Q_BUFFERS] + q_desc.block_type.shape,
                                       q_desc.layout)  # slot buffer * 2 + warpgroup
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1],
                                        mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1],
                                        mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)  # the producer's expect; TMA bytes complete it
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups release a stage
    for w in gl.static_range(2 * Q_BUFFERS):
        mbarrier.init(q_ready.index(w), count=1)
        mbarrier.init(q_empty.index(w), count=1)  # one warpgroup reads each query slot
    for w in gl.static_range(2):
        mbarrier.init(turn.index(w), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, empty, turn,
                     o_ptr, lse_ptr, N, n_bh, qk_scale, LPT_HEADS, CAUSAL, STAGES, OVERLAP, 0)),
        (_consumer, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, empty, turn,
                     o_ptr, lse_ptr, N, n_bh, qk_scale, LPT_HEADS, CAUSAL, STAGES, OVERLAP, 1)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                     v_ready, empty, N, n_bh, GROUP, LPT_HEADS, CAUSAL, STAGES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


# ------------------------------------------------------------------------------ host side
def _check_config(config, N, D, element_size):
    """hopper.fa3_forward's config refusals, plus N a multiple of a tile pair's 2 * block_m."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a fa3_persistent.Config (see CONFIGS) or None, "
                        f"got {config!r}")
    if N % config.block_n != 0 or N % (2 * config.block_m) != 0:
        raise ValueError(f"config {config} needs N a multiple of block_n={config.block_n} "
                         f"and of 2 * block_m={2 * config.block_m}, got N={N}")
    need = config.shared_bytes(D, element_size)
    if need > MAX_SHARED_BYTES:
        raise ValueError(f"config {config} needs {need} bytes of shared memory at D={D}: "
                         f"more than the {MAX_SHARED_BYTES} a block has")


def fa3_persistent_forward(q, k, v, causal: bool = False, sm_scale: float | None = None,
                           config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(sm_scale q k^T [+ causal mask]) v and its log-sum-exp, as
    ``kernelnotes.attention.hopper.fa3_forward`` (same arguments, scope and refusals), with a
    persistent grid of min(#SMs, #tiles) programs.

    Args:
        q: [B, Hq, N, D]; k, v: [B, Hkv, N, D], Hkv dividing Hq; bf16 or fp16, contiguous, on a
            Hopper GPU; D in (64, 128), N a positive multiple of 128.
        causal: top-left causal mask (query i sees key j iff j <= i).
        sm_scale: the score scale; None for 1 / sqrt(D).
        config: one of this module's CONFIGS, or None for DEFAULT_CONFIG.
    Returns:
        o [B, Hq, N, D] in q's dtype, lse [B, Hq, N] float32 (natural log).
    """
    fn = "fa3_persistent_forward"
    check_inputs(q, k, v, causal, sm_scale, fn)  # hopper.fa3_forward's refusals and scope
    if config is not None:
        _check_config(config, q.shape[2], q.shape[3], q.element_size())
    check_hopper_device(q, fn)
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

    n_tiles = triton.cdiv(N, 2 * cfg.block_m) * B * H
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(sms, n_tiles),)
    _fa3_persistent_kernel[grid](
        desc(q, H, cfg.block_m), desc(k, Hkv, cfg.block_n), desc(v, Hkv, cfg.block_n), o, lse,
        N, B * H, H // Hkv, scale * LOG2E, lpt_heads(B * H, N, D, q.element_size()),
        CAUSAL=causal, STAGES=cfg.stages, OVERLAP=cfg.overlap, num_warps=CONSUMER_WARPS.value)
    return o, lse
