"""LU and QR decompositions and least squares: NumPy references and batched Triton kernels.

``kernelnotes.linalg.lu_factor``/``lu_factor_ex``/``lu_solve``/``qr``/``lstsq`` (Triton, torch
tensors) are drop-in replacements for their ``torch.linalg`` namesakes on small fp32 matrices:
custom operators (``torch.ops.kernelnotes.*``) with autograd, that work under ``torch.compile``.
They import torch and triton on first use only; the references are in
``kernelnotes.linalg.reference``.
"""

from kernelnotes._lazy import lazy_exports

_KERNEL_NAMES = ("lu_factor", "lu_factor_ex", "lu_solve", "qr", "lstsq",
                 "LUFactor", "LUFactorEx", "QR", "Lstsq")

__all__ = [*_KERNEL_NAMES]


__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
