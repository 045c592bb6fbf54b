"""Feed-forward networks and backprop: a NumPy reference (forward with cache, manual backward,
gradient check) and fused Triton linear layers (matmul + bias + activation) with their backward.

The Triton names (``linear_act``, ``linear_swiglu``, ``ffn``, ``FeedForward``, ...) import torch
and triton on first use only; ``linear_act_pingpong`` is a design study in Gluon (pingpong.py).
"""

from kernelnotes._lazy import lazy_exports
from kernelnotes.ffn.reference import (
    ACTIVATIONS,
    activation,
    activation_grad,
    ffn_backward,
    ffn_forward,
    grad_check,
    swiglu_ffn_forward,
    worked_example,
)

_KERNEL_NAMES = (
    "linear_act",
    "linear_swiglu",
    "ffn",
    "FeedForward",
    "linear_act_forward",
    "linear_swiglu_forward",
    "act_backward",
    "linear_backward",
    "LinearActFunction",
    "SwiGLUFunction",
    "FFNFunction",
)

__all__ = [
    "ACTIVATIONS",
    "activation",
    "activation_grad",
    "ffn_backward",
    "ffn_forward",
    "grad_check",
    "swiglu_ffn_forward",
    "worked_example",
    *_KERNEL_NAMES,
    "linear_act_pingpong",
]


__getattr__ = lazy_exports(
    __name__, {"kernel": _KERNEL_NAMES, "pingpong": ("linear_act_pingpong",)}
)
