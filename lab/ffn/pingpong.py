"""A fused linear layer with the Hopper "ping-pong" schedule, in Gluon: a design study.

``kernelnotes.ffn.linear_act`` is one ``tl`` kernel: each program multiplies a tile, then runs
the epilogue while its tensor cores wait. CUTLASS's ping-pong schedule hides the epilogue: two
groups of MMA warps own alternate output tiles and take turns on the tensor cores, so that one's
epilogue runs while the other multiplies. ``tl`` cannot ask for that schedule (Triton 3.6's
automatic warp specialization hung on the H200); Gluon, Triton's lower-level dialect
(``triton.experimental.gluon``), can say it. The epilogue is the same
``kernelnotes.ffn.kernel.activation_epilogue`` that ``linear_act`` inlines, so the two differ
only in the schedule. lab/ffn/NOTES.md says what it measured.

Needs a Hopper GPU: Gluon kernels do not run in Triton's interpreter. Uses the package's public
API only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernelnotes.attention.hopper import tma_load  # the TMA-load name across Triton releases
from kernelnotes.ffn.kernel import ACTIVATIONS, activation_epilogue

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64  # one warpgroup's tile: 128 fp32 accumulators a thread
STAGES = 6  # 6 x 32 KiB of operands in flight, shared by both MMA warpgroups


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering, as kernelnotes.ffn.kernel's: GROUP_M row-tiles share each column-tile."""
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % group_m
    pid_n = (tile % tiles_per_group) // group_m
    return pid_m, pid_n


def _check_hopper(name, t):
    if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} is on {where}: linear_act_pingpong needs a CUDA tensor on a "
                         "Hopper GPU (Gluon kernels do not run in Triton's interpreter)")
    major, minor = torch.cuda.get_device_capability(t.device)
    if major != 9:
        raise ValueError(f"{name} is on an sm_{major}{minor} GPU: linear_act_pingpong needs "
                         "Hopper (sm_90), for its wgmma and TMA")


def _tma_readable(t) -> bool:
    """Unit stride along K, start and rows 16-byte aligned: what a TMA descriptor reads."""
    return (t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


# --8<-- [start:pingpong_loader]
@gluon.jit
def _pingpong_loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                     GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr):
    """One warp: the TMA loads of this program's tiles, in tile order, into a ring of STAGES
    stages. Stage s is refilled once its consumer has arrived on empty[s]."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    i = 0  # this program's (tile, k) step
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, NUM_SMS):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        for kt in range(gl.cdiv(K, BLOCK_K)):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # the first round passes
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma_load(a_desc, [pid_m * BLOCK_M, kt * BLOCK_K], ready.index(s), a_bufs.index(s))
            tma_load(b_desc, [pid_n * BLOCK_N, kt * BLOCK_K], ready.index(s), b_bufs.index(s))
            i += 1
# --8<-- [end:pingpong_loader]


# --8<-- [start:pingpong_mma]
@gluon.jit
def _pingpong_mma(a_bufs, b_bufs, ready, empty, turn, y_ptr, bias_ptr, M, N, K, stride_ym,
                  ACT: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr,
                  NUM_SMS: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr):
    """One MMA warpgroup (WG = 0 or 1): the program's tiles j = WG, WG + 2, ... Each waits for
    its turn, runs its K loop on the tensor cores, passes the turn to the other warpgroup, and
    then applies the epilogue and stores straight from the wgmma registers, while the other
    multiplies. The turn also keeps the stage ring safe: a warpgroup starts waiting on a stage
    only after the other has consumed every earlier stage, so a barrier's phase parity never
    runs two phases ahead of its waiter."""
    BLOCK_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, 16])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    n_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), NUM_SMS)
    mine = 0  # how many tiles this warpgroup has done
    for j in range(WG, n_tiles, 2):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + j * NUM_SMS, num_pid_m, num_pid_n, GROUP_M)
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        if HAS_BIAS:  # loaded before the turn: its latency hides under the wait
            bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
        mbarrier.wait(turn.index(WG), (mine & 1) ^ (1 - WG))  # warpgroup 0 goes first
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        i = j * k_tiles
        for kt in range(k_tiles):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # step i - 1 is done:
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=kt > 0)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
        mbarrier.arrive(turn.index(1 - WG), count=1)  # the other warpgroup's main loop starts
        z = acc
        if HAS_BIAS:
            z = z + bias[None, :]
        y = activation_epilogue(z, ACT)
        offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        gl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
        mine += 1
# --8<-- [end:pingpong_mma]


# --8<-- [start:pingpong_kernel]
@gluon.jit
def _pingpong_kernel(a_desc, b_desc, y_ptr, bias_ptr, M, N, K, stride_ym,
                     ACT: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr,
                     NUM_SMS: gl.constexpr, STAGES: gl.constexpr):
    """Persistent: one program per SM. Its four warps are MMA warpgroup 0; worker partitions
    add MMA warpgroup 1 (four warps) and the loader (one warp). setmaxnreg gives each MMA
    warpgroup 232 registers a thread and the loader 40, as CUTLASS does."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape,
                                       b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    for w in gl.static_range(2):
        mbarrier.init(turn.index(w), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_pingpong_mma, (a_bufs, b_bufs, ready, empty, turn, y_ptr, bias_ptr, M, N, K,
                         stride_ym, ACT, HAS_BIAS, GROUP_M, NUM_SMS, STAGES, 0)),
        (_pingpong_mma, (a_bufs, b_bufs, ready, empty, turn, y_ptr, bias_ptr, M, N, K,
                         stride_ym, ACT, HAS_BIAS, GROUP_M, NUM_SMS, STAGES, 1)),
        (_pingpong_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M,
                            NUM_SMS, STAGES)),
    ], [4, 1], [232, 40])
# --8<-- [end:pingpong_kernel]


# --8<-- [start:pingpong_launcher]
def linear_act_pingpong(x, weight, bias=None, activation="gelu"):
    """``y = sigma(x W^T + b)``, as ``kernelnotes.ffn.linear_act`` computes it, by ping-pong.

    Args:
        x: [M, K] bfloat16 or float16 on a Hopper GPU (sm_90); unit stride along K, its start
            and rows 16-byte aligned (what a TMA descriptor reads): K a multiple of 8 for a
            contiguous x.
        weight: [N, K] as ``nn.Linear`` stores it, x's dtype and device, the same layout rule.
        bias: [N], contiguous, or None.
        activation: one of ``kernelnotes.ffn.kernel.ACTIVATIONS``.
    Returns:
        y [M, N] in x's dtype.

    The schedule is CUTLASS's "ping-pong" for Hopper (NVIDIA, CUTLASS 3.x, the
    ``KernelTmaWarpSpecializedPingpong`` kernel schedule); its MMA is ``wgmma`` (PTX ISA,
    "Asynchronous Warpgroup Level Matrix Multiply-Accumulate").
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    act = ACTIVATIONS.index(activation)
    _check_hopper("x", x)
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x has dtype {x.dtype}: linear_act_pingpong takes bfloat16 or float16")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise TypeError(f"{name} must have x's dtype and device, got {t.dtype} on {t.device}")
    if x.ndim != 2 or weight.ndim != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, x {tuple(x.shape)}: "
                         "need x [M, K] and weight [N, K]")
    if bias is not None and (bias.shape != (weight.shape[0],) or not bias.is_contiguous()):
        raise ValueError(f"bias must be contiguous of shape ({weight.shape[0]},)")
    for name, t in (("x", x), ("weight", weight)):
        if not _tma_readable(t):  # the descriptors below read t as stored
            raise ValueError(f"{name} has strides {tuple(t.stride())} from address "
                             f"{t.data_ptr():#x}: a TMA descriptor needs unit stride along K, "
                             "and its start and rows 16-byte aligned")
    (M, K), N = x.shape, weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    if K == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: linear_act_pingpong needs K >= 1")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    a_desc = TensorDescriptor.from_tensor(
        x, [BLOCK_M, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dtype))
    b_desc = TensorDescriptor.from_tensor(
        weight, [BLOCK_N, BLOCK_K],
        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], dtype))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = max(1, min(sms, triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)))
    _pingpong_kernel[(programs,)](
        a_desc, b_desc, y, y if bias is None else bias, M, N, K, y.stride(0),
        ACT=act, HAS_BIAS=bias is not None, GROUP_M=8, NUM_SMS=programs, STAGES=STAGES,
        num_warps=4)
    return y
# --8<-- [end:pingpong_launcher]
