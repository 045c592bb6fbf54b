"""What the mHC design studies share: a few lines copied from the package's private helpers
(ceil division, powers of two, the Hopper check), the input checks, and C_l and Sinkhorn
from the whole mixes by torch ops (the studies' kernels write the mixes and layer_input)."""

from __future__ import annotations

import torch

from kernelnotes.mhc.torch_reference import gates_torch

N_MIX = 24  # [pre 0..3 | post 4..7 | comb 8..23]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_inputs(caller: str, needs: str, residual, fn, scale, base, chunk: int):
    """A CUDA tensor on a Hopper GPU (Gluon does not run in Triton's interpreter), mhc_pre's
    inputs, H in whole TMA boxes of ``chunk`` columns. Returns (T, H)."""
    if not isinstance(residual, torch.Tensor) or residual.device.type != "cuda":
        where = residual.device if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"residual is on {where}: {caller} needs a CUDA tensor on a Hopper GPU "
                         "(Gluon kernels do not run in Triton's interpreter)")
    major, minor = torch.cuda.get_device_capability(residual.device)
    if major != 9:
        raise ValueError(f"residual is on an sm_{major}{minor} GPU: {caller} needs Hopper "
                         f"(sm_90), for its {needs}")
    if residual.dtype != torch.bfloat16 or residual.ndim != 3 or residual.shape[1] != 4:
        raise ValueError(f"residual must be [T, 4, H] bfloat16, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    T, _, H = residual.shape
    if H % chunk:
        raise ValueError(f"residual has H = {H}: {caller} needs H a multiple of {chunk}")
    if fn.dtype != torch.float32 or tuple(fn.shape) != (N_MIX, 4 * H):
        raise ValueError(f"fn must have shape (24, 4H) = (24, {4 * H}), got {tuple(fn.shape)}")
    for name, t, n in (("scale", scale, 3), ("base", base, N_MIX)):
        if t.dtype != torch.float32 or tuple(t.shape) != (n,):
            raise ValueError(f"{name} must be ({n},) float32, got {tuple(t.shape)}")
    return T, H


def finish(mix, sqrsum, layer_input, H, scale, base, *, rms_eps, pre_eps, sinkhorn_eps,
           post_mult, sinkhorn_iters):
    """(layer_input, C_l, comb) given the whole raw mixes [T, 24] and sums of squares [T]:
    C_l and Sinkhorn by torch ops. (The studies were measured with the product's big-fuse
    kernel running only its metadata programs here; the product no longer has that branch.)"""
    rstd = torch.rsqrt(sqrsum[:, None] / (4 * H) + rms_eps)
    _, post, comb = gates_torch(mix * rstd, scale, base, pre_eps=pre_eps,
                                sinkhorn_eps=sinkhorn_eps, post_mult=post_mult,
                                sinkhorn_iters=sinkhorn_iters)
    return layer_input, post, comb
