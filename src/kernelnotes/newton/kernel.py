"""Elementwise sqrt and 1/sqrt in Triton by Newton refinement of a bit-trick estimate.

Order: the jit kernels; the launcher; the PyTorch custom operators ``kernelnotes::sqrt``
and ``kernelnotes::rsqrt`` (with ``*_out`` forms, fake implementations and gradients);
then the public ``sqrt`` and ``rsqrt``, which take torch.sqrt's and torch.rsqrt's
arguments. The post (docs/posts/01-newton.md) derives the number of Newton steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kernelnotes._grid import cdiv
from kernelnotes._validate import check_kernel_device, check_tensor, interpreted

Tensor = torch.Tensor

# --8<-- [start:constants]
MAGIC = 0x5F3759DF  # i -> MAGIC - (i >> 1) halves and negates the exponent: ~1/sqrt(x)
NEWTON_STEPS = 2  # y_0 -> y_2 on 1/sqrt(x), |e_2| < 4.7e-6: enough for fp16/bf16;
# float32 takes one more, residual-corrected, step (see the post for the bound)
# --8<-- [end:constants]


# --8<-- [start:rsqrt_estimate]
@triton.jit
def _rsqrt_estimate(x, NEWTON_STEPS: tl.constexpr):
    """1/sqrt(x) for normal x > 0 within 5e-6 (relative): bit trick, Newton steps."""
    i = x.to(tl.int32, bitcast=True)
    y = (0x5F3759DF - (i >> 1)).to(tl.float32, bitcast=True)  # |e_0| <= 0.0344
    for _ in tl.static_range(NEWTON_STEPS):
        # Newton on g(y) = 1/y^2 - x:  e_{k+1} = -3/2 e_k^2 - 1/2 e_k^3
        y = y * (1.5 - 0.5 * x * y * y)
    return y


INTERPRETED = tl.constexpr(interpreted(_rsqrt_estimate))  # Triton's CPU interpreter
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
    REFINE: tl.constexpr,  # the residual-corrected third step: fp32 only
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if BF16_BITS:
        # bf16 -> fp32 is a 16-bit shift; done on the bits it keeps subnormals exact
        # everywhere (Triton's interpreter flushes them when it converts)
        x16 = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32)
        x = (x16 << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(x_ptr + offs, mask=mask, other=1.0).to(tl.float32)

    # read off the bits (immune to FTZ), each test one integer compare:
    bits = x.to(tl.int32, bitcast=True)
    ok = (bits - 1).to(tl.uint32, bitcast=True) < 0x7F7FFFFF  # 0 < x < inf
    tiny = bits.to(tl.uint32, bitcast=True) < 0x00800000  # +0 or positive subnormal
    if INTERPRETED:  # NumPy would warn about the special lanes' inf * 0 and overflows
        xs = tl.where(ok, x * tl.where(tiny, 16777216.0, 1.0), 1.0)
    else:  # no select for them: the last one drops their garbage (fewer instructions)
        xs = tl.where(tiny, x * 16777216.0, x)  # 2^24 x is normal and exact

    y = _rsqrt_estimate(xs, NEWTON_STEPS)  # ~1/sqrt(xs), |e| < 4.7e-6
    if RSQRT:
        res = y
        if REFINE:
            # third Newton step, the residual r = 1 - (xs y) y by one fma: only the
            # rounding of xs*y (half an ulp of the result) and the last one remain
            r = tl.fma(-(xs * y), y, 1.0)
            res = tl.fma(0.5 * y, r, y)
        res = tl.where(tiny, res * 4096.0, res)  # 1/sqrt(x) = 2^12 / sqrt(2^24 x)
        # the special lanes with x >= 0 are +-0 and inf: flipping the exponent bits
        # maps +-0 to +-inf and inf to +0; x < 0, -inf and NaN give NaN
        flipped = (bits ^ 0x7F800000).to(tl.float32, bitcast=True)
        special = tl.where(x >= 0.0, flipped, float("nan"))
    else:
        res = xs * y
        if REFINE:
            # one Newton step on s^2 - xs: s += (y/2)(xs - s^2), the residual by one fma
            res = tl.fma(0.5 * y, tl.fma(-res, res, xs), res)
        res = tl.where(tiny, res * 0.000244140625, res)  # sqrt(x) = 2^-12 sqrt(2^24 x)
        # +-0 -> +-0, inf -> inf; x < 0, NaN -> NaN
        special = tl.where(x >= 0.0, x, float("nan"))
    res = tl.where(ok, res, special)
    tl.store(out_ptr + offs, res.to(out_ptr.dtype.element_ty), mask=mask)


# --8<-- [end:sqrt_kernel]


# --8<-- [start:launcher]
SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
BLOCK = 4096  # elements per program


def _launch(x: Tensor, out: Tensor | None, rsqrt: bool, block: int) -> Tensor:
    """Run the kernel on x (any layout) into out (allocated if None); returns out."""
    check_tensor("x", x, dtypes=SUPPORTED)
    check_kernel_device("x", x, _sqrt_kernel)
    if type(block) is not int or block < 128 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 128, got {block!r}")
    x = x.contiguous()  # elementwise: only the order of the elements changes
    if out is not None and not (
        out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
        and (out.data_ptr() == x.data_ptr() or not _shares_memory(out, x))
    ):  # out is x: fine (a lane reads its element, then writes it); a partial overlap,
        # a strided out or another dtype: compute, then copy
        return out.copy_(_launch(x, None, rsqrt, block))
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # Triton launches on the current device
            return _launch(x, out, rsqrt, block)
    if out is None:
        out = torch.empty_like(x)
    n = x.numel()
    if n:
        bf16 = x.dtype == torch.bfloat16
        _sqrt_kernel[(cdiv(n, block),)](
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


def _shares_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# --8<-- [end:launcher]


NS = "kernelnotes"  # the operators' namespace: torch.ops.kernelnotes.sqrt, ...


# --8<-- [start:ops]
@torch.library.custom_op(f"{NS}::sqrt", mutates_args=())
def _sqrt_op(x: Tensor, block: int = BLOCK) -> Tensor:
    return _launch(x, None, rsqrt=False, block=block)


@torch.library.custom_op(f"{NS}::rsqrt", mutates_args=())
def _rsqrt_op(x: Tensor, block: int = BLOCK) -> Tensor:
    return _launch(x, None, rsqrt=True, block=block)


@torch.library.custom_op(f"{NS}::sqrt_out", mutates_args=("out",))
def _sqrt_out_op(x: Tensor, out: Tensor, block: int = BLOCK) -> None:
    _launch(x, out, rsqrt=False, block=block)


@torch.library.custom_op(f"{NS}::rsqrt_out", mutates_args=("out",))
def _rsqrt_out_op(x: Tensor, out: Tensor, block: int = BLOCK) -> None:
    _launch(x, out, rsqrt=True, block=block)


# what torch.compile and FakeTensorMode see: shapes and dtypes, no data
@_sqrt_op.register_fake
@_rsqrt_op.register_fake
def _(x, block=BLOCK):
    check_tensor("x", x, dtypes=SUPPORTED)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_sqrt_out_op.register_fake
@_rsqrt_out_op.register_fake
def _(x, out, block=BLOCK):
    check_tensor("x", x, dtypes=SUPPORTED)


# the gradients need the output y only, not x
def _save_y(ctx, inputs, output):
    ctx.save_for_backward(output)


def _sqrt_backward(ctx, grad):  # y = x^(1/2):  dy/dx = 1 / (2 y)
    (y,) = ctx.saved_tensors
    return grad / (2 * y), None


def _rsqrt_backward(ctx, grad):  # y = x^(-1/2):  dy/dx = -x^(-3/2) / 2 = -y^3 / 2
    (y,) = ctx.saved_tensors
    return -0.5 * grad * y.pow(3), None


_sqrt_op.register_autograd(_sqrt_backward, setup_context=_save_y)
_rsqrt_op.register_autograd(_rsqrt_backward, setup_context=_save_y)
# --8<-- [end:ops]


# --8<-- [start:public]
_KERNEL_DEVICE = "cpu" if interpreted(_sqrt_kernel) else "cuda"  # where it runs


def _plain_eager(*tensors: Tensor) -> bool:
    """Whether the operator would only run the launcher: plain tensors, no autograd, not
    traced (torch.compile, fake tensors, make_fx, vmap). Then the launcher is called
    directly: the dispatcher's round trip through Python costs several µs of host time
    per call, more than the kernel takes at a million elements (8 MB at ~4 TB/s)."""
    return (
        not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None
        and all(type(t) is torch.Tensor and not is_functorch_wrapped_tensor(t)
                for t in tensors)
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def _unary(name: str, input: Tensor, out: Tensor | None) -> Tensor:
    """Check the arguments as torch.<name> sees them, then call the operator. Only
    tensor metadata is read, so the checks run on fake tensors and under Dynamo too."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{name}(): input must be a Tensor, got {type(input).__name__}")
    if not (input.is_floating_point() or input.is_complex()):
        input = input.to(torch.get_default_dtype())  # ints and bools promote, as torch
    if input.dtype not in SUPPORTED:
        raise TypeError(
            f"{name}(): input must be float32, float16 or bfloat16 (integer and bool "
            f"inputs are promoted to the default dtype), got {input.dtype}; "
            f"torch.{name} takes it"
        )
    if input.device.type != _KERNEL_DEVICE:
        raise ValueError(
            f"{name}(): input is on {input.device}, but the kernel runs on "
            + ("cpu here (Triton's interpreter, TRITON_INTERPRET=1)"
               if _KERNEL_DEVICE == "cpu" else "cuda (compiled Triton)")
        )
    rsqrt = name == "rsqrt"
    if out is None:
        if _plain_eager(input):
            return _launch(input, None, rsqrt, BLOCK)
        return (_rsqrt_op if rsqrt else _sqrt_op)(input)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}(): out must be a Tensor, got {type(out).__name__}")
    if not (out.is_floating_point() or out.is_complex()):  # torch.can_cast(float, ...)
        raise TypeError(
            f"{name}(): out has dtype {out.dtype}, the result's {input.dtype} "
            "can't be cast to it"
        )
    if out.device != input.device:
        raise ValueError(f"{name}(): out is on {out.device}, input on {input.device}")
    if out.shape != input.shape:
        if out.numel():  # torch resizes it with a deprecation warning; we refuse
            raise ValueError(
                f"{name}(): out has shape {tuple(out.shape)}, input "
                f"{tuple(input.shape)}: pass an out of input's shape, or an empty one"
            )
        out.resize_(input.shape)  # an empty out is resized, as torch does
    if torch.is_grad_enabled() and (input.requires_grad or out.requires_grad):
        raise RuntimeError(
            f"{name}(): functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad."
        )
    if _plain_eager(input, out):
        return _launch(input, out, rsqrt, BLOCK)
    (_rsqrt_out_op if rsqrt else _sqrt_out_op)(input, out)
    return out


def sqrt(input: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Elementwise square root, within 1 ulp of the correctly rounded result.

    A drop-in for ``torch.sqrt``: the custom operator ``kernelnotes::sqrt``
    (``kernelnotes::sqrt_out`` when ``out`` is given), differentiable (the gradient is
    ``grad / (2 * sqrt(input))``, as torch's) and traceable by ``torch.compile``.

    Args:
        input: tensor of any shape and layout (a non-contiguous one is copied once),
            float32, float16 or bfloat16; integer and bool tensors are promoted to the
            default dtype, as ``torch.sqrt`` does. Half types are computed in float32.
            On a CUDA device, or the CPU under Triton's interpreter
            (``TRITON_INTERPRET=1``).
        out: optional tensor for the result: on input's device, of input's shape (an
            empty one is resized) and of a floating or complex dtype (the result is
            cast to it). Not with autograd, as in torch.

    Returns:
        sqrt(input) in input's dtype, or ``out``: +-0 for +-0, inf for inf, NaN for
        negative inputs and NaN, as ``torch.sqrt``.

    Raises:
        TypeError: input or out is not a tensor; input is float64 or complex (use
            ``torch.sqrt``); out has an integer or bool dtype.
        ValueError: input is not on the kernel's device; out is on another device, or
            has another shape and is not empty.
        RuntimeError: out is given while an argument requires grad (as torch).
    """
    return _unary("sqrt", input, out)


def rsqrt(input: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Elementwise 1/sqrt(x), the "fast inverse square root" made exact to 1 ulp.

    A drop-in for ``torch.rsqrt``: the custom operator ``kernelnotes::rsqrt``
    (``kernelnotes::rsqrt_out`` when ``out`` is given), differentiable (the gradient is
    ``-grad * rsqrt(input)**3 / 2``, as torch's) and traceable by ``torch.compile``.

    Args:
        input: as for `sqrt`.
        out: as for `sqrt`.

    Returns:
        1/sqrt(input) in input's dtype, or ``out``: +-inf for +-0, 0 for inf, NaN for
        negative inputs and NaN, as ``torch.rsqrt``.

    Raises:
        TypeError: input or out is not a tensor; input is float64 or complex (use
            ``torch.rsqrt``); out has an integer or bool dtype.
        ValueError: input is not on the kernel's device; out is on another device, or
            has another shape and is not empty.
        RuntimeError: out is given while an argument requires grad (as torch).
    """
    return _unary("rsqrt", input, out)


# --8<-- [end:public]
