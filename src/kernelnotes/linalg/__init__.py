"""LU and QR decompositions and least squares: NumPy references and batched Triton kernels.

``kernelnotes.linalg.lu_factor``/``lu_solve``/``qr``/``lstsq`` (Triton, torch tensors) import torch
and triton on first use only; the references are in ``kernelnotes.linalg.reference``.
"""

_KERNEL_NAMES = ("lu_factor", "lu_solve", "qr", "lstsq")

__all__ = [*_KERNEL_NAMES]


def __getattr__(name: str):
    if name in _KERNEL_NAMES:
        from kernelnotes.linalg import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module 'kernelnotes.linalg' has no attribute {name!r}")
