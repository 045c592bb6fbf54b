"""The mHC pre step in one pass, warp-specialized and pipelined, in Gluon: a design study (ninth).

The eighth design (onepass.py) moves in lockstep rounds: every program loads, multiplies, waits
and writes, and memory is busy only while it loads. Here each program is one CTA per SM with five
partitions, so that loads, multiplies, waits and writes of different token blocks overlap:

- a loader warp issues TMA loads of the program's tiles (64 tokens x 4 streams x 64 columns, a
  fixed column slice of every token block of its lane) into a ring of NBUF buffers;
- two projector warpgroups take alternate steps: ``wgmma`` against fn's slice, held in shared
  memory for the whole kernel, and the sum of squares; they write the slice's partials and count
  in; the last slice of a group of GROUP slices sums the group's gate rows, the last group of the
  block sums the groups' rows and publishes A_l;
- a writer warpgroup waits for a block's A_l and writes its columns of ``layer_input`` from the
  tile still in shared memory, then frees the buffer;
- a reducer warpgroup sums its share of the other 20 mixes once the block is complete, for the
  big-fuse kernel's metadata programs (C_l, Sinkhorn).

The residual crosses HBM once, the outputs match the float64 reference and repeat bit for bit, and
on the H200 it is still much slower than the two kernels: a buffer waits on the slowest slice of
its block and then on two levels of arrivals, longer than four buffers cover at the copy rate
(``stamps=True`` records where the time goes; docs/posts/08-mhc-kernel-study.md has the numbers).

Needs a Hopper GPU (TMA, wgmma); the programs wait on each other, so the grid is launched as a
cooperative grid of one program per SM.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernelnotes.attention.hopper import tma_load
from kernelnotes.mhc import split_fn
from lab.mhc.common import cdiv, check_inputs, finish, next_power_of_2, sm_count
from lab.mhc.onepass import (
    CHUNK,
    _cta_barrier,
    _publish_gates,
)

BT = 64  # tokens per tile: wgmma's M
BH = CHUNK  # columns per stream in a tile: one 128-byte TMA box (64)
NBUF = 4  # tile buffers; even, so that each buffer always belongs to the same projector
GROUP = 8  # slices per group in the two-level arrival
STAMPS = ("issued", "ready", "partials written", "arrived", "published", "gates seen", "freed")


# --8<-- [start:pipelined_parts]
@gluon.jit
def _stamp(stamp_ptr, k, slot: gl.constexpr, n_steps_max, STAMP: gl.constexpr):
    """With STAMP, the GPU's global timer (ns) for event ``slot`` of step k (STAMPS names them)."""
    if STAMP:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                        is_pure=False, pack=1)
        gl.store(stamp_ptr + (gl.program_id(0) * n_steps_max + k) * 8 + slot, now)


@gluon.jit
def _loader(x_desc, w_desc, tiles, w_s, ready, empty, w_bar, H, s, lane, n_steps, R,
            stamp_ptr, n_steps_max, STAMP: gl.constexpr):
    """One warp: fn's slice once, then the program's tiles into the ring, a buffer as soon as the
    writer frees it."""
    BT: gl.constexpr = x_desc.block_type.shape[0]
    BH: gl.constexpr = x_desc.block_type.shape[1]
    NBUF: gl.constexpr = tiles.shape[0] // 4
    mbarrier.expect(w_bar.index(0), 8 * w_desc.block_type.nbytes)
    for part in gl.static_range(2):  # hi rows 0..23 and lo rows 24..47 of the split fn
        for j in gl.static_range(4):
            tma_load(w_desc, [part * 24, j * H + s * BH], w_bar.index(0), w_s.index(part * 4 + j))
    for k in range(n_steps):
        buf = k % NBUF
        mbarrier.wait(empty.index(buf), ((k // NBUF) & 1) ^ 1)  # the first round passes
        _stamp(stamp_ptr, k, 0, n_steps_max, STAMP)
        mbarrier.expect(ready.index(buf), 4 * x_desc.block_type.nbytes)
        for j in gl.static_range(4):  # rows past T come back as zeros
            tma_load(x_desc, [(lane + k * R) * BT, j * H + s * BH], ready.index(buf),
                     tiles.index(buf * 4 + j))


@gluon.jit
def _projector(tiles, w_s, ready, w_bar, part_ptr, group_ptr, gate_ptr, count_ptr, base_ptr,
               scale_ptr, mix_ptr, sq_ptr, T, s, lane, n_steps, n_blocks, R, inv_k, rms_eps,
               pre_eps, stamp_ptr, n_steps_max, G: gl.constexpr, NG: gl.constexpr,
               NG_POW2: gl.constexpr, GROUP: gl.constexpr, WG: gl.constexpr,
               STAMP: gl.constexpr):
    """A warpgroup; steps WG, WG + 2, ...: partials of the slice, then the two-level arrival."""
    BT: gl.constexpr = tiles.shape[1]
    NBUF: gl.constexpr = tiles.shape[0] // 4
    # fn's 24 rows padded to wgmma's N = 32: the hi box's rows 24..31 are lo rows (ignored),
    # the lo box's rows past 47 come back from TMA as zeros
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, 32, 16])
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    red: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    acc_t = gl.arange(0, BT, layout=gl.SliceLayout(1, acc_l))
    acc_m = gl.arange(0, 32, layout=gl.SliceLayout(0, acc_l))
    row_t = gl.arange(0, BT, layout=gl.SliceLayout(1, rows))
    red_t = gl.arange(0, BT, layout=gl.SliceLayout(0, red))
    red_g = gl.arange(0, GROUP, layout=gl.SliceLayout(1, red))
    red_n = gl.arange(0, NG_POW2, layout=gl.SliceLayout(1, red))
    mbarrier.wait(w_bar.index(0), 0)
    for k in range(WG, n_steps, 2):
        buf = k % NBUF
        b = lane + k * R
        mbarrier.wait(ready.index(buf), (k // NBUF) & 1)
        _stamp(stamp_ptr, k, 1, n_steps_max, STAMP)
        acc = gl.zeros([BT, 32], gl.float32, layout=acc_l)
        for j in gl.static_range(4):
            x_j = tiles.index(buf * 4 + j)
            acc = warpgroup_mma(x_j, w_s.index(j).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma(x_j, w_s.index(4 + j).permute((1, 0)), acc, is_async=True)
        sq = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(1, rows))
        for j in gl.static_range(4):  # while the MMAs run
            xf = tiles.index(buf * 4 + j).load(rows).to(gl.float32)
            sq += gl.sum(xf * xf, axis=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        part = part_ptr + (b * G + s) * (25 * BT)  # rows 0..23: x @ fn^T, row 24: sum x^2
        gl.store(part + acc_m[None, :] * BT + acc_t[:, None], acc,
                 mask=(acc_t < BT)[:, None] & (acc_m < 24)[None, :])
        gl.store(part + 24 * BT + row_t, sq)
        _cta_barrier()  # every thread's partials are written before the release below
        _stamp(stamp_ptr, k, 2, n_steps_max, STAMP)
        grp = s // GROUP
        size = gl.minimum(G - grp * GROUP, GROUP)
        arrived = gl.atomic_add(count_ptr + n_blocks + b * NG + grp, 1, sem="acq_rel",
                                scope="gpu")
        _stamp(stamp_ptr, k, 3, n_steps_max, STAMP)
        if arrived == size - 2:  # counts start at -1: the group's last slice sums its 5 rows
            first = part_ptr + (b * G + grp * GROUP) * (25 * BT)
            for r in gl.static_range(5):
                row = r + (r // 4) * 20  # mixes 0..3, then row 24
                v = gl.load(first + red_g[:, None] * (25 * BT) + row * BT + red_t[None, :],
                            mask=(red_g < size)[:, None] & (red_t < BT)[None, :], other=0.0)
                gl.store(group_ptr + ((b * NG + grp) * 5 + r) * BT + red_t, gl.sum(v, axis=0))
            _cta_barrier()
            done = gl.atomic_add(count_ptr + b, 1, sem="acq_rel", scope="gpu")
            if done == NG - 2:  # the block's last group: A_l from the groups' sums, stored
                # plainly: the writers read nothing else by it, the gate is the data (an atomic
                # release per element would serialise a fence per store)
                rows_of = group_ptr + b * NG * (5 * BT) + red_n[:, None] * (5 * BT) + red_t[None, :]
                _publish_gates(rows_of, (red_n < NG)[:, None] & (red_t < BT)[None, :], 4 * BT,
                               b * BT + red_t, gate_ptr + b * 4 * BT + red_t, base_ptr, scale_ptr,
                               mix_ptr, sq_ptr, T, inv_k, rms_eps, pre_eps, BT)
                _stamp(stamp_ptr, k, 4, n_steps_max, STAMP)


@gluon.jit
def _load_gates(gp, mask, BT: gl.constexpr):
    """A_l of a block, 4 x [BT], by volatile loads (past L1, which another SM's stores miss)."""
    return (gl.load(gp + 0 * BT, mask=mask, other=0.0, volatile=True),
            gl.load(gp + 1 * BT, mask=mask, other=0.0, volatile=True),
            gl.load(gp + 2 * BT, mask=mask, other=0.0, volatile=True),
            gl.load(gp + 3 * BT, mask=mask, other=0.0, volatile=True))


@gluon.jit
def _unwritten(g0, g1, g2, g3):
    """How many gates still hold the bits of int -1, the launcher's fill: a NaN that sigmoid's
    arithmetic never produces (a NaN there is 0x7fffffff)."""
    u = ((g0.to(gl.int32, bitcast=True) == -1) | (g1.to(gl.int32, bitcast=True) == -1)
         | (g2.to(gl.int32, bitcast=True) == -1) | (g3.to(gl.int32, bitcast=True) == -1))
    return gl.sum(u.to(gl.int32), axis=0)


@gluon.jit
def _writer(tiles, ready, empty, gate_ptr, li_ptr, T, H, s, lane, n_steps, R, stamp_ptr,
            n_steps_max, STAMP: gl.constexpr):
    """A warpgroup: layer_input = A_l X_l for the slice, step by step, from shared memory."""
    BT: gl.constexpr = tiles.shape[1]
    BH: gl.constexpr = tiles.shape[2]
    NBUF: gl.constexpr = tiles.shape[0] // 4
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_t = gl.arange(0, BT, layout=gl.SliceLayout(1, rows))
    col = s * BH + gl.arange(0, BH, layout=gl.SliceLayout(0, rows))
    g0, g1, g2, g3 = _load_gates(gate_ptr + lane * 4 * BT + row_t, row_t < BT, BT)
    for k in range(n_steps):
        buf = k % NBUF
        b = lane + k * R
        gp = gate_ptr + b * 4 * BT + row_t
        while _unwritten(g0, g1, g2, g3) > 0:
            g0, g1, g2, g3 = _load_gates(gp, row_t < BT, BT)
        _stamp(stamp_ptr, k, 5, n_steps_max, STAMP)
        mbarrier.wait(ready.index(buf), (k // NBUF) & 1)  # long done: for the memory model
        y = g0[:, None] * tiles.index(buf * 4 + 0).load(rows).to(gl.float32)
        y += g1[:, None] * tiles.index(buf * 4 + 1).load(rows).to(gl.float32)
        y += g2[:, None] * tiles.index(buf * 4 + 2).load(rows).to(gl.float32)
        y += g3[:, None] * tiles.index(buf * 4 + 3).load(rows).to(gl.float32)
        # the next block's gates, on their way while this block's layer_input goes out
        g0, g1, g2, g3 = _load_gates(gp + R * 4 * BT, (row_t < BT) & (k + 1 < n_steps), BT)
        tok = b * BT + row_t
        gl.store(li_ptr + tok[:, None] * H + col[None, :], y.to(gl.bfloat16),
                 mask=(tok < T)[:, None] & (col < H)[None, :])
        _cta_barrier()  # all four warps have read the tile
        mbarrier.arrive(empty.index(buf), count=1)
        _stamp(stamp_ptr, k, 6, n_steps_max, STAMP)


@gluon.jit
def _reducer(part_ptr, count_ptr, mix_ptr, T, s, lane, n_steps, R, G: gl.constexpr,
             NG: gl.constexpr, BT: gl.constexpr):
    """A warpgroup: mixes 4..23 of a block, spread over its slices, once all groups are in.
    Nothing waits on it, so its waits delay no other partition."""
    red: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    red_t = gl.arange(0, BT, layout=gl.SliceLayout(0, red))
    red_g = gl.arange(0, 32, layout=gl.SliceLayout(1, red))
    for k in range(n_steps):
        b = lane + k * R
        r0 = 4 + (s - b % G + G) % G  # this slice's first row of block b, if below 24
        if r0 < 24:
            while gl.atomic_add(count_ptr + b, 0, sem="acquire", scope="gpu") != NG - 1:
                pass
            tok = b * BT + red_t
            for r in range(r0, 24, G):
                mix = gl.zeros([BT], gl.float32, layout=gl.SliceLayout(0, red))
                for g0 in range(0, G, 32):  # in slice order: the same bits every run
                    g = g0 + red_g
                    mix += gl.sum(gl.load(part_ptr + ((b * G + g) * 25 + r)[:, None] * BT
                                          + red_t[None, :],
                                          mask=(g < G)[:, None] & (red_t < BT)[None, :],
                                          other=0.0), axis=0)
                gl.store(mix_ptr + tok * 24 + r, mix, mask=tok < T)
# --8<-- [end:pipelined_parts]


# --8<-- [start:pipelined_kernel]
@gluon.jit
def _mhc_pre_pipelined_kernel(
    x_desc,  # TMA descriptor of the residual viewed [T, 4H] bf16, box [BT, BH]
    w_desc,  # TMA descriptor of fn's hi + lo parts viewed [48, 4H] bf16, box [32, BH]
    part_ptr,  # *fp32 [blocks * G, 25, BT] scratch: each slice's partials
    group_ptr,  # *fp32 [blocks * NG, 5, BT] scratch: each group's gate rows
    gate_ptr,  # *fp32 [blocks, 4, BT], filled with the bits of int -1: A_l
    count_ptr,  # *i32 [blocks * (1 + NG)], filled with -1: groups done, then group arrivals
    base_ptr, scale_ptr,  # *fp32 [24] and [3]
    mix_ptr,  # *fp32 [T, 24] out: x @ fn^T (for C_l and Sinkhorn)
    sq_ptr,  # *fp32 [T] out: sum of x^2
    li_ptr,  # *bf16 [T, H] out: layer_input = A_l X_l
    stamp_ptr,  # *i64 [programs, n_steps_max, 8]: timer stamps, written only with STAMP
    T, H, n_blocks, R, n_steps_max, inv_k, rms_eps, pre_eps,
    G: gl.constexpr,  # column slices, H // BH
    NG: gl.constexpr,  # groups of GROUP slices
    NG_POW2: gl.constexpr,
    GROUP: gl.constexpr,
    NBUF: gl.constexpr,
    STAMP: gl.constexpr,
):
    BT: gl.constexpr = x_desc.block_type.shape[0]
    BH: gl.constexpr = x_desc.block_type.shape[1]
    s = gl.program_id(0) % G  # the column slice, the same for every step
    lane = gl.program_id(0) // G  # token blocks lane, lane + R, lane + 2R, ...
    n_steps = (n_blocks - lane + R - 1) // R
    tiles = gl.allocate_shared_memory(gl.bfloat16, [NBUF * 4, BT, BH], x_desc.layout)
    w_s = gl.allocate_shared_memory(gl.bfloat16, [8, 32, BH], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    w_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NBUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(w_bar.index(0), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_projector, (tiles, w_s, ready, w_bar, part_ptr, group_ptr, gate_ptr, count_ptr,
                      base_ptr, scale_ptr, mix_ptr, sq_ptr, T, s, lane, n_steps, n_blocks, R,
                      inv_k, rms_eps, pre_eps, stamp_ptr, n_steps_max, G, NG, NG_POW2, GROUP,
                      0, STAMP)),
        (_projector, (tiles, w_s, ready, w_bar, part_ptr, group_ptr, gate_ptr, count_ptr,
                      base_ptr, scale_ptr, mix_ptr, sq_ptr, T, s, lane, n_steps, n_blocks, R,
                      inv_k, rms_eps, pre_eps, stamp_ptr, n_steps_max, G, NG, NG_POW2, GROUP,
                      1, STAMP)),
        (_writer, (tiles, ready, empty, gate_ptr, li_ptr, T, H, s, lane, n_steps, R, stamp_ptr,
                   n_steps_max, STAMP)),
        (_reducer, (part_ptr, count_ptr, mix_ptr, T, s, lane, n_steps, R, G, NG, BT)),
        (_loader, (x_desc, w_desc, tiles, w_s, ready, empty, w_bar, H, s, lane, n_steps, R,
                   stamp_ptr, n_steps_max, STAMP)),
    ], [4, 4, 4, 1], [112, 88, 88, 40])
# --8<-- [end:pipelined_kernel]


def grid(T: int, H: int, sm_count: int) -> tuple[int, int, int]:
    """(programs, lanes R, steps of the longest lane): one program per SM, G = H / BH slices a
    lane, as many lanes as fit."""
    G, n_blocks = H // BH, cdiv(T, BT)
    lanes = max(1, min(n_blocks, sm_count // G))
    return G * lanes, lanes, cdiv(n_blocks, lanes)


# --8<-- [start:pipelined_launcher]
def mhc_pre_pipelined(residual, fn, scale, base, *, rms_eps=1e-6, pre_eps=1e-6,
                      sinkhorn_eps=1e-6, post_mult=2.0, sinkhorn_iters=20, stamps=False):
    """:func:`kernelnotes.mhc.mhc_pre` with the residual read once, by a warp-specialized pipeline.

    DeepSeek-V4's pre step (report eqs. 1-7) with the projection on the un-normalised residual
    (Xie et al. 2025, arXiv:2512.24880, sec. 4.3.1). Three launches: fn's bf16 hi + lo split,
    the pipelined kernel, and C_l and Sinkhorn by torch ops (common.finish).

    Args:
        residual: X_l, [T, 4, H] bfloat16, contiguous, on a Hopper GPU (sm_90); H a multiple of
            64 (whole 128-byte TMA boxes) and H / 64 slices no more than the GPU's SMs.
        fn: [24, 4H] float32; scale: [3] float32; base: [24] float32; the eps, post_mult and
            sinkhorn_iters: as :func:`kernelnotes.mhc.mhc_pre`.
        stamps: also return the GPU timer's stamps, int64 [programs, steps, 8] in ns, one per
            event of each step (``STAMPS`` names the first seven; zero where none happened).
    Returns:
        layer_input [T, H] bfloat16, post_mix [T, 4] float32, comb_mix [T, 4, 4] float32 (the
        same bits from run to run), and the stamps if asked for.
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    T, H = check_inputs("mhc_pre_pipelined", "TMA loads and wgmma", residual, fn, scale, base,
                        CHUNK)  # H in whole boxes: CHUNK == BH columns
    dev = residual.device
    G, n_blocks = H // BH, cdiv(T, BT)
    sms = sm_count(dev)
    if G > sms:
        raise ValueError(f"residual has H = {H}: its {G} slices of {BH} columns need as many "
                         f"programs at once, one per SM, and this GPU has {sms} SMs")
    programs, lanes, n_steps_max = grid(T, H, sms)
    NG = cdiv(G, GROUP)
    x_desc = TensorDescriptor.from_tensor(
        residual.view(T, 4 * H), [BT, BH],
        gl.NVMMASharedLayout.get_default_for([BT, BH], gl.bfloat16))
    w_desc = TensorDescriptor.from_tensor(
        split_fn(fn).view(2 * 24, 4 * H), [32, BH],
        gl.NVMMASharedLayout.get_default_for([32, BH], gl.bfloat16))
    part = torch.empty((n_blocks * G, 25, BT), dtype=torch.float32, device=dev)
    group = torch.empty((n_blocks * NG, 5, BT), dtype=torch.float32, device=dev)
    sync = torch.full((n_blocks * (1 + NG + 4 * BT),), -1, dtype=torch.int32, device=dev)
    count, gate = sync[:n_blocks * (1 + NG)], sync[n_blocks * (1 + NG):].view(torch.float32)
    mix = torch.empty((T, 24), dtype=torch.float32, device=dev)
    sqrsum = torch.empty((T,), dtype=torch.float32, device=dev)
    layer_input = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
    stamp = torch.zeros((programs, n_steps_max, 8) if stamps else (1,), dtype=torch.int64,
                        device=dev)
    _mhc_pre_pipelined_kernel[(programs,)](
        x_desc, w_desc, part, group, gate, count, base, scale, mix, sqrsum, layer_input, stamp,
        T, H, n_blocks, lanes, n_steps_max, 1.0 / (4 * H), float(rms_eps), float(pre_eps),
        G=G, NG=NG, NG_POW2=max(2, next_power_of_2(NG)), GROUP=GROUP, NBUF=NBUF, STAMP=stamps,
        num_warps=4, launch_cooperative_grid=True)
    out = finish(mix, sqrsum, layer_input, H, scale, base, rms_eps=rms_eps, pre_eps=pre_eps,
                 sinkhorn_eps=sinkhorn_eps, post_mult=post_mult, sinkhorn_iters=sinkhorn_iters)
    return (*out, stamp) if stamps else out
# --8<-- [end:pipelined_launcher]
