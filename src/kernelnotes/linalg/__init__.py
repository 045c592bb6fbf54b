"""LU and QR decompositions and least squares: NumPy references and batched Triton kernels.

``kernelnotes.linalg.lu_factor``/``lu_solve``/``qr``/``lstsq`` (Triton, torch tensors) import torch
and triton on first use only; the references are in ``kernelnotes.linalg.reference``.
"""

from kernelnotes._lazy import lazy_exports

_KERNEL_NAMES = ("lu_factor", "lu_solve", "qr", "lstsq")

__all__ = [*_KERNEL_NAMES]


__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
