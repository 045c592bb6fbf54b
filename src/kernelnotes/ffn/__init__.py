"""Feed-forward networks and backprop: a NumPy reference (forward with cache, manual backward,
gradient check) and fused Triton linear layers (matmul + bias + activation) with their backward.

The Triton names (``linear_act``, ``linear_swiglu``, ``ffn``, ``FeedForward``, ``use_config``)
import torch and triton on first use only. The ops are ``torch.library`` custom operators
(``torch.ops.kernelnotes.linear_act`` and the rest): differentiable, and traceable by
``torch.compile(fullgraph=True)``.
"""

from typing import TYPE_CHECKING

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
    "use_config",
)

__all__ = [  # literal, so documentation tools read it without running the module
    "ACTIVATIONS", "activation", "activation_grad", "ffn_backward", "ffn_forward", "grad_check",
    "swiglu_ffn_forward", "worked_example", "linear_act", "linear_swiglu", "ffn", "FeedForward",
    "use_config",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.ffn.kernel import FeedForward, ffn, linear_act, linear_swiglu, use_config

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
