"""LU and QR decompositions and least squares: NumPy references and batched Triton kernels.

``kernelnotes.linalg.lu_factor``/``lu_factor_ex``/``lu_solve``/``qr``/``lstsq`` (Triton, torch
tensors) are drop-in replacements for their ``torch.linalg`` namesakes on small fp32 matrices:
custom operators (``torch.ops.kernelnotes.*``) with autograd, that work under ``torch.compile``.
They import torch and triton on first use only; the references are in
``kernelnotes.linalg.reference``.
"""

from typing import TYPE_CHECKING

from kernelnotes._lazy import lazy_exports

_KERNEL_NAMES = ("lu_factor", "lu_factor_ex", "lu_solve", "qr", "lstsq",
                 "LUFactor", "LUFactorEx", "QR", "Lstsq")

__all__ = [  # literal, so documentation tools read it without running the module
    "lu_factor", "lu_factor_ex", "lu_solve", "qr", "lstsq", "LUFactor", "LUFactorEx", "QR", "Lstsq",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.linalg.kernel import (
        QR,
        Lstsq,
        LUFactor,
        LUFactorEx,
        lstsq,
        lu_factor,
        lu_factor_ex,
        lu_solve,
        qr,
    )

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
