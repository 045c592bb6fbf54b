"""FlashAttention-2: NumPy reference (standard, tiled forward, backward) and Triton kernels.

``flash_attention`` is a drop-in for ``torch.nn.functional.scaled_dot_product_attention``;
it and the launchers ``flash_attn_fwd`` / ``flash_attn_bwd`` import torch and triton on first use.
"""

from typing import TYPE_CHECKING

from kernelnotes._lazy import lazy_exports
from kernelnotes.attention.reference import (
    ALIGNMENTS,
    VERSIONS,
    attention_naive,
    causal_mask,
    flash_attention_backward,
    flash_attention_forward,
    hbm_bytes_flash,
    hbm_bytes_standard,
    largest_tile,
    tile_bytes,
)

_KERNEL_NAMES = ("flash_attention", "flash_attn_fwd", "flash_attn_bwd")

__all__ = [  # literal, so documentation tools read it without running the module
    "ALIGNMENTS", "VERSIONS", "attention_naive", "causal_mask", "flash_attention_backward",
    "flash_attention_forward", "hbm_bytes_flash", "hbm_bytes_standard", "largest_tile",
    "tile_bytes", "flash_attention", "flash_attn_fwd", "flash_attn_bwd",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.attention.kernel import flash_attention, flash_attn_bwd, flash_attn_fwd

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
