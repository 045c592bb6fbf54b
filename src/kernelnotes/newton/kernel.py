"""Elementwise sqrt and 1/sqrt in Triton by Newton refinement of a bit-trick estimate.

Order: the jit kernels, then the torch-facing launchers ``sqrt`` and ``rsqrt``. The post
(docs/posts/01-newton.md) derives the number of steps from the convergence bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelnotes._grid import cdiv
from kernelnotes._validate import check_kernel_device, check_tensor, interpreted

# --8<-- [start:constants]
MAGIC = 0x5F3759DF  # i -> MAGIC - (i >> 1) halves the exponent of x and negates it: y_0 ~ 1/sqrt(x)
NEWTON_STEPS = 2  # y_0 -> y_2 on 1/sqrt(x), |e_2| < 4.7e-6: enough for fp16/bf16 results;
# float32 takes one more, residual-corrected, step (see the post for the bound)
# --8<-- [end:constants]


# --8<-- [start:rsqrt_estimate]
@triton.jit
def _rsqrt_estimate(x, NEWTON_STEPS: tl.constexpr):
    """1/sqrt(x) for normal x > 0 to a relative error below 5e-6: a bit trick, then Newton steps."""
    i = x.to(tl.int32, bitcast=True)
    y = (0x5F3759DF - (i >> 1)).to(tl.float32, bitcast=True)  # |e_0| <= 0.0344
    for _ in tl.static_range(NEWTON_STEPS):
        y = y * (
            1.5 - 0.5 * x * y * y
        )  # Newton on g(y) = 1/y^2 - x:  e_{k+1} = -3/2 e_k^2 - 1/2 e_k^3
    return y


INTERPRETED = tl.constexpr(interpreted(_rsqrt_estimate))  # Triton's CPU interpreter runs the kernel
# --8<-- [end:rsqrt_estimate]


# --8<-- [start:sqrt_kernel]
@triton.jit
def _sqrt_kernel(
    x_ptr,  # *fp32/fp16/bf16, n elements
    out_ptr,  # *same dtype as x
    n,  # number of elements
    RSQRT: tl.constexpr,  # False: sqrt(x); True: 1/sqrt(x)
    BF16_BITS: tl.constexpr,  # x holds bfloat16 bit patterns as int16
    NEWTON_STEPS: tl.constexpr,
    REFINE: tl.constexpr,  # the residual-corrected third step; float32 needs it, halves don't
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if BF16_BITS:
        # bf16 -> fp32 is a 16-bit shift; done on the bits it keeps subnormals exact everywhere
        # (Triton's interpreter flushes them when it converts)
        x = (tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32) << 16).to(
            tl.float32, bitcast=True
        )
    else:
        x = tl.load(x_ptr + offs, mask=mask, other=1.0).to(tl.float32)

    # read off the bits (immune to FTZ), each test one integer compare:
    bits = x.to(tl.int32, bitcast=True)
    ok = (bits - 1).to(tl.uint32, bitcast=True) < 0x7F7FFFFF  # 0 < x < inf; NaN, -x fail
    tiny = bits.to(tl.uint32, bitcast=True) < 0x00800000  # +0 or a positive subnormal
    if INTERPRETED:  # NumPy would warn about the inf * 0 and overflows of the special lanes
        xs = tl.where(ok, x * tl.where(tiny, 16777216.0, 1.0), 1.0)
    else:  # no select for them: their garbage is dropped by the last one (fewer instructions)
        xs = tl.where(tiny, x * 16777216.0, x)  # 2^24 x is normal and exact

    y = _rsqrt_estimate(xs, NEWTON_STEPS)  # ~1/sqrt(xs), |e| < 4.7e-6
    if RSQRT:
        res = y
        if REFINE:
            # third Newton step with the residual r = 1 - (xs y) y by one fma: only the rounding
            # of xs*y (half an ulp of the result) and the final rounding remain: <= 1 ulp
            r = tl.fma(-(xs * y), y, 1.0)
            res = tl.fma(0.5 * y, r, y)
        res = tl.where(tiny, res * 4096.0, res)  # 1/sqrt(x) = 2^12 / sqrt(2^24 x)
        # the special lanes with x >= 0 are +-0 and inf: flipping the exponent bits maps +-0 to
        # +-inf and inf to +0; x < 0, -inf and NaN give NaN
        flipped = (bits ^ 0x7F800000).to(tl.float32, bitcast=True)
        special = tl.where(x >= 0.0, flipped, float("nan"))
    else:
        res = xs * y
        if REFINE:
            # one Newton step on s^2 - xs: s += (y/2)(xs - s^2), the residual by one fma
            res = tl.fma(0.5 * y, tl.fma(-res, res, xs), res)
        res = tl.where(tiny, res * 0.000244140625, res)  # sqrt(x) = 2^-12 sqrt(2^24 x)
        special = tl.where(
            x >= 0.0, x, float("nan")
        )  # +-0 -> +-0, inf -> inf; x < 0, NaN -> NaN
    res = tl.where(ok, res, special)
    tl.store(out_ptr + offs, res.to(out_ptr.dtype.element_ty), mask=mask)


# --8<-- [end:sqrt_kernel]


# --8<-- [start:launcher]
SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


def _launch(
    x: torch.Tensor, out: torch.Tensor | None, rsqrt: bool, block: int
) -> torch.Tensor:
    check_tensor("x", x, dtypes=SUPPORTED, contiguous=True)
    check_kernel_device("x", x, _sqrt_kernel)
    if out is None:
        out = torch.empty_like(x)
    else:
        check_tensor("out", out, dtypes=(x.dtype,), contiguous=True, device=x.device)
        if out.shape != x.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, x has {tuple(x.shape)}")
    if block < 128 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 128, got {block}")
    n = x.numel()
    if n:
        grid = (cdiv(n, block),)
        bf16 = x.dtype == torch.bfloat16
        _sqrt_kernel[grid](
            x.view(torch.int16) if bf16 else x,
            out,
            n,
            RSQRT=rsqrt,
            BF16_BITS=bf16,
            NEWTON_STEPS=NEWTON_STEPS,
            REFINE=x.dtype == torch.float32,
            BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )
    return out


def sqrt(
    x: torch.Tensor, *, out: torch.Tensor | None = None, block: int = 4096
) -> torch.Tensor:
    """Elementwise square root by Newton refinement, within 1 ulp of the correctly rounded result.

    Args:
        x: any shape, contiguous, float32 / float16 / bfloat16 (half types are computed in fp32).
            CUDA tensor (CPU tensor under the Triton interpreter).
        out: optional output of x's shape, dtype and device.
        block: elements per program (a power of two).
    Returns:
        sqrt(x) in x's dtype: +-0 for +-0, inf for inf, NaN for x < 0 and NaN (as torch.sqrt).
    """
    return _launch(x, out, rsqrt=False, block=block)


def rsqrt(
    x: torch.Tensor, *, out: torch.Tensor | None = None, block: int = 4096
) -> torch.Tensor:
    """Elementwise 1/sqrt(x) by Newton refinement (the "fast inverse square root", made exact).

    Args and dtypes as :func:`sqrt`. Returns +-inf for +-0, 0 for inf, NaN for x < 0 and NaN
    (as torch.rsqrt).
    """
    return _launch(x, out, rsqrt=True, block=block)


# --8<-- [end:launcher]
