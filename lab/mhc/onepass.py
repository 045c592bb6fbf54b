"""The mHC pre step in one pass over the residual, in Gluon: a design study (eighth design).

``kernel.mhc_pre`` reads the residual twice: a split-K projection, then the big-fuse kernel,
which needs the gates A_l, and they depend on a reduction over the whole row. Here each program
owns a tile of BT tokens x 4 streams x BH columns. It loads the tile once by TMA into shared
memory, adds its share of the projection, and writes ``layer_input`` for its columns from the
same shared memory once the other column slices of its token block have reported. The last
slice to report sums the block's partials in slice order (bitwise repeatable, whoever arrives
last) and publishes the gates. Every slice then sums a share of the other mixes for C_l and
Sinkhorn, which the big-fuse kernel's metadata programs finish. The residual crosses HBM once,
yet on the H200 this is slower than the two kernels: NOTES.md says why.

Needs a Hopper GPU: TMA loads, and Gluon kernels do not run in Triton's interpreter. Programs
wait on each other, so all of them must be resident at once: the grid is persistent (a few
programs per SM) and launched as a cooperative grid, which the driver refuses rather than hang.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    mma_v2,
)

from kernelnotes.attention.hopper import tma_load  # the TMA-load name across Triton releases
from kernelnotes.mhc import split_fn
from lab.mhc.common import cdiv, check_inputs, finish, next_power_of_2, sm_count

# a CTA-wide barrier: gl.thread_barrier in Triton 3.6, gl.barrier in later releases
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

BT = 64  # tokens per tile: the MMA's N; fn's tiles from L2 are shared by BT tokens
CHUNK = 64  # columns per TMA box: 128 bytes of bf16, the widest the 128-byte swizzle takes
PROGRAMS_PER_SM = 3  # 68 KiB of shared memory each at BH = 128


# --8<-- [start:publish_gates]
@gluon.jit
def _publish_gates(rows, mask, sq_row, tok, gate, base_ptr, scale_ptr, mix_ptr, sq_ptr, T, inv_k,
                   rms_eps, pre_eps, BT: gl.constexpr):
    """A token block's A_l from its partial rows: ``rows`` points at [parts, BT] partials of mix
    0 (mix j at + j * BT, the sum of squares at + sq_row), summed over the parts in order; also
    stores the block's mixes 0..3 and sum of squares. ``gate`` points at the block's [4, BT]."""
    live = tok < T
    sq = gl.sum(gl.load(rows + sq_row, mask=mask, other=0.0), axis=0)
    rstd = 1.0 / gl.sqrt(sq * inv_k + rms_eps)
    gl.store(sq_ptr + tok, sq, mask=live)
    a0 = gl.load(scale_ptr)
    for j in gl.static_range(4):
        mix = gl.sum(gl.load(rows + j * BT, mask=mask, other=0.0), axis=0)
        gl.store(mix_ptr + tok * 24 + j, mix, mask=live)
        z = mix * rstd * a0 + gl.load(base_ptr + j)
        gl.store(gate + j * BT, 1.0 / (1.0 + gl.exp(-z)) + pre_eps)
# --8<-- [end:publish_gates]


# --8<-- [start:onepass_kernel]
@gluon.jit
def _mhc_pre_onepass_kernel(
    x_desc,  # TMA descriptor of the residual viewed [T, 4H] bf16, box [BT, CHUNK]
    w_ptr,  # *bf16 [2, 24, 4H]: fn as hi + lo parts (kernel._mhc_split_fn_kernel)
    part_ptr,  # *fp32 [items, 25, BT] scratch: rows 0..23 x @ fn^T of a slice, row 24 sum x^2
    gate_ptr,  # *fp32 [blocks, 4, BT] scratch: A_l of each token block
    count_ptr,  # *i32 [2 * blocks], zeroed: arrivals per block, then gates-ready flags
    base_ptr, scale_ptr,  # *fp32 [24] and [3]
    mix_ptr,  # *fp32 [T, 24] out: the whole projection x @ fn^T (for C_l and Sinkhorn)
    sq_ptr,  # *fp32 [T] out: sum of x^2
    li_ptr,  # *bf16 [T, H] out: layer_input = A_l X_l
    T, H, n_items, n_blocks, num_programs,
    inv_k, rms_eps, pre_eps,
    G: gl.constexpr,  # column slices per token block, H // BH
    G_POW2: gl.constexpr,  # next_power_of_2(G): the reductions load [G_POW2, BT] at once
    BH: gl.constexpr,  # columns per slice, a multiple of CHUNK
):
    BT: gl.constexpr = x_desc.block_type.shape[0]
    CHUNK: gl.constexpr = x_desc.block_type.shape[1]
    NCH: gl.constexpr = BH // CHUNK
    K = 4 * H
    # layouts: tile rows as 16-byte vectors; the MMA computes acc[m, t] = sum_k w[m, k] x[t, k]
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 2],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    red: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [gl.num_warps(), 1], [1, 0])

    tile = gl.allocate_shared_memory(gl.bfloat16, [4 * NCH, BT, CHUNK], x_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    fence_async_shared()

    w_m = gl.arange(0, 32, layout=gl.SliceLayout(1, rows))  # 24 mixes padded to 32
    w_k = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, rows))
    w_mask = (w_m < 24)[:, None] & (w_k < CHUNK)[None, :]
    acc_m = gl.arange(0, 32, layout=gl.SliceLayout(1, mma))
    acc_t = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
    row_t = gl.arange(0, BT, layout=gl.SliceLayout(1, rows))
    red_s = gl.arange(0, G_POW2, layout=gl.SliceLayout(1, red))
    red_t = gl.arange(0, BT, layout=gl.SliceLayout(0, red))
    red_mask = (red_s < G)[:, None] & (red_t < BT)[None, :]

    phase = 0
    for item in range(gl.program_id(0), n_items, num_programs):
        b = item // G
        s = item % G
        t0 = b * BT
        # 1. the whole tile in flight at once: 4 streams x NCH boxes on one barrier; rows past
        # T come back as zeros
        mbarrier.expect(bar.index(0), 4 * NCH * x_desc.block_type.nbytes)
        for j in gl.static_range(4):
            for c in gl.static_range(NCH):
                tma_load(x_desc, [t0, j * H + s * BH + c * CHUNK], bar.index(0),
                         tile.index(j * NCH + c))

        # 2. the projection, chunk by chunk: fn's hi and lo tiles from L2, two bf16 MMAs
        acc = gl.zeros([32, BT], gl.float32, layout=mma)
        sq = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, rows))
        for j in gl.static_range(4):
            for c in gl.static_range(NCH):
                w = w_ptr + w_m[:, None] * K + (j * H + s * BH + c * CHUNK) + w_k[None, :]
                w_hi = gl.convert_layout(gl.load(w, mask=w_mask, other=0.0), a_op)
                w_lo = gl.convert_layout(gl.load(w + 24 * K, mask=w_mask, other=0.0), a_op)
                if j == 0 and c == 0:  # the first fn tiles are on their way before the wait
                    mbarrier.wait(bar.index(0), phase)
                x_c = tile.index(j * NCH + c)
                x_b = x_c.permute((1, 0)).load(b_op)
                acc = mma_v2(w_hi, x_b, acc)
                acc = mma_v2(w_lo, x_b, acc)
                xf = x_c.load(rows).to(gl.float32)
                sq += gl.sum(xf * xf, axis=1)
        phase ^= 1

        # 3. this slice's partials, then report; the last slice of the block publishes A_l
        part = part_ptr + item * (25 * BT)
        gl.store(part + acc_m[:, None] * BT + acc_t[None, :], acc,
                 mask=(acc_m < 24)[:, None] & (acc_t < BT)[None, :])
        gl.store(part + 24 * BT + row_t, sq)
        _cta_barrier()  # every thread's partials are written before the release below
        arrived = gl.atomic_add(count_ptr + b, 1, sem="acq_rel", scope="gpu")
        tok = t0 + red_t
        live = tok < T
        blk = part_ptr + (b * G + red_s)[:, None] * (25 * BT) + red_t[None, :]  # [G_POW2, BT]
        if arrived == G - 1:
            _publish_gates(blk, red_mask, 24 * BT, tok, gate_ptr + b * 4 * BT + red_t, base_ptr,
                           scale_ptr, mix_ptr, sq_ptr, T, inv_k, rms_eps, pre_eps, BT)
            _cta_barrier()
            gl.atomic_xchg(count_ptr + n_blocks + b, 1, sem="release", scope="gpu")
        else:
            while gl.atomic_add(count_ptr + n_blocks + b, 0, sem="acquire", scope="gpu") == 0:
                pass
        # every slice sums a share of the other 20 mixes, for C_l and Sinkhorn
        for r in range(4 + s, 24, G):
            mix = gl.sum(gl.load(blk + r * BT, mask=red_mask, other=0.0), axis=0)
            gl.store(mix_ptr + tok * 24 + r, mix, mask=live)

        # 4. layer_input from the tile still in shared memory
        g0 = gl.load(gate_ptr + (b * 4 + 0) * BT + row_t)
        g1 = gl.load(gate_ptr + (b * 4 + 1) * BT + row_t)
        g2 = gl.load(gate_ptr + (b * 4 + 2) * BT + row_t)
        g3 = gl.load(gate_ptr + (b * 4 + 3) * BT + row_t)
        out_t = t0 + row_t
        for c in gl.static_range(NCH):
            y = g0[:, None] * tile.index(0 * NCH + c).load(rows).to(gl.float32)
            y += g1[:, None] * tile.index(1 * NCH + c).load(rows).to(gl.float32)
            y += g2[:, None] * tile.index(2 * NCH + c).load(rows).to(gl.float32)
            y += g3[:, None] * tile.index(3 * NCH + c).load(rows).to(gl.float32)
            h = s * BH + c * CHUNK + w_k
            gl.store(li_ptr + out_t[:, None] * H + h[None, :], y.to(gl.bfloat16),
                     mask=(out_t < T)[:, None] & (h < H)[None, :])
        _cta_barrier()  # the tile is read before the next item's TMA overwrites it
        fence_async_shared()
# --8<-- [end:onepass_kernel]


def _slice_width(H: int) -> int:
    """Columns per slice: 128 where H allows (fewer slices to reduce), else 64."""
    return 128 if H % 128 == 0 else 64


# --8<-- [start:onepass_launcher]
def mhc_pre_onepass(residual, fn, scale, base, *, rms_eps=1e-6, pre_eps=1e-6, sinkhorn_eps=1e-6,
                    post_mult=2.0, sinkhorn_iters=20):
    """:func:`kernelnotes.mhc.mhc_pre` with the residual read once: fn split, one pass, C_l and
    Sinkhorn.

    DeepSeek-V4's pre step (report eqs. 1-7) with the projection on the un-normalised residual
    (Xie et al. 2025, arXiv:2512.24880, sec. 4.3.1). Three launches: fn's bf16 hi + lo split,
    the one-pass kernel, and C_l and Sinkhorn by torch ops (common.finish).

    Args:
        residual: X_l, [T, 4, H] bfloat16, contiguous, on a Hopper GPU (sm_90); H a multiple of
            64 (whole 128-byte TMA boxes per stream), its slices of 128 columns (64 where 128
            does not divide H) no more than the programs resident at once.
        fn: [24, 4H] float32; scale: [3] float32; base: [24] float32; the eps, post_mult and
            sinkhorn_iters: as :func:`kernelnotes.mhc.mhc_pre`.
    Returns:
        layer_input [T, H] bfloat16, post_mix [T, 4] float32, comb_mix [T, 4, 4] float32: the
        same bits from run to run (the partials are summed in slice order).
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    T, H = check_inputs("mhc_pre_onepass", "TMA loads", residual, fn, scale, base, CHUNK)

    dev = residual.device
    bh = _slice_width(H)
    G = H // bh
    n_blocks = cdiv(T, BT)
    n_items = n_blocks * G
    x_desc = TensorDescriptor.from_tensor(
        residual.view(T, 4 * H), [BT, CHUNK],
        gl.NVMMASharedLayout.get_default_for([BT, CHUNK], gl.bfloat16))
    part = torch.empty((n_items, 25, BT), dtype=torch.float32, device=dev)
    gate = torch.empty((n_blocks, 4, BT), dtype=torch.float32, device=dev)
    count = torch.zeros(2 * n_blocks, dtype=torch.int32, device=dev)
    mix = torch.empty((T, 24), dtype=torch.float32, device=dev)
    sqrsum = torch.empty((T,), dtype=torch.float32, device=dev)
    layer_input = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
    # every program resident at once (a waiting slice needs its block's others running), and
    # G <= programs: then each block's last item only waits on items that have all started
    programs = min(n_items, PROGRAMS_PER_SM * sm_count(dev))
    if G > programs:
        raise ValueError(f"residual has H = {H}: {G} slices of {bh} columns are more than the "
                         f"{programs} programs that fit on this GPU at once")
    _mhc_pre_onepass_kernel[(programs,)](
        x_desc, split_fn(fn), part, gate, count, base, scale, mix, sqrsum, layer_input,
        T, H, n_items, n_blocks, programs, 1.0 / (4 * H), float(rms_eps), float(pre_eps),
        G=G, G_POW2=max(2, next_power_of_2(G)), BH=bh, num_warps=4, launch_cooperative_grid=True)
    # C_l and Sinkhorn from the whole mixes
    return finish(mix, sqrsum, layer_input, H, scale, base, rms_eps=rms_eps, pre_eps=pre_eps,
                  sinkhorn_eps=sinkhorn_eps, post_mult=post_mult, sinkhorn_iters=sinkhorn_iters)
# --8<-- [end:onepass_launcher]
