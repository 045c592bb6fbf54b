"""Manifold-constrained hyper-connections (mHC): NumPy reference and Triton kernels.

``kernelnotes.mhc.mhc_pre``, ``mhc_pre_from_mixes``, ``mhc_post`` and ``split_fn`` (Triton
kernels, registered as ``kernelnotes::`` torch custom ops with backwards) and ``MhcPre`` (what
the pre ops return) import torch and triton on first use only; the NumPy reference lives in
``kernelnotes.mhc.reference``.
"""

from typing import TYPE_CHECKING

from kernelnotes._lazy import lazy_exports
from kernelnotes.mhc import reference
from kernelnotes.mhc.reference import amax_gain, gates, mhc_layer, mixes, sinkhorn

_KERNEL_NAMES = ("MhcPre", "mhc_pre", "mhc_pre_from_mixes", "mhc_post", "split_fn")

__all__ = [  # literal, so documentation tools read it without running the module
    "reference", "amax_gain", "gates", "mhc_layer", "mixes", "sinkhorn", "MhcPre", "mhc_pre",
    "mhc_pre_from_mixes", "mhc_post", "split_fn",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.mhc.kernel import MhcPre, mhc_post, mhc_pre, mhc_pre_from_mixes, split_fn

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
