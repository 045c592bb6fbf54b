"""Newton's method: root finding (NumPy reference) and Newton-refined sqrt/rsqrt (Triton).

``kernelnotes.newton.sqrt``/``rsqrt`` import torch and triton on first use only.
"""

from kernelnotes.newton.reference import (
    NoConvergenceError,
    NonFiniteError,
    RootFindingError,
    ZeroDerivativeError,
    bisection,
    convergence_order,
    halley,
    newton,
    newton_system,
)

_KERNEL_NAMES = ("sqrt", "rsqrt")

__all__ = [
    "NoConvergenceError",
    "NonFiniteError",
    "RootFindingError",
    "ZeroDerivativeError",
    "bisection",
    "convergence_order",
    "halley",
    "newton",
    "newton_system",
    *_KERNEL_NAMES,
]


def __getattr__(name: str):
    if name in _KERNEL_NAMES:
        from kernelnotes.newton import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module 'kernelnotes.newton' has no attribute {name!r}")
