"""Newton's method: root finding (NumPy reference) and Newton-refined sqrt/rsqrt (Triton).

``sqrt`` and ``rsqrt`` are drop-ins for ``torch.sqrt`` and ``torch.rsqrt`` (same arguments,
gradients, ``torch.compile``), backed by the custom operators ``kernelnotes::sqrt`` and
``kernelnotes::rsqrt``; they import torch and triton on first use only. The post:
docs/posts/01-newton.md.
"""

from typing import TYPE_CHECKING

from kernelnotes._lazy import lazy_exports
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

__all__ = [  # literal, so documentation tools read it without running the module
    "NoConvergenceError", "NonFiniteError", "RootFindingError", "ZeroDerivativeError", "bisection",
    "convergence_order", "halley", "newton", "newton_system", "sqrt", "rsqrt",
]


if TYPE_CHECKING:  # type checkers and the API reference see them; at run time they load lazily
    from kernelnotes.newton.kernel import rsqrt, sqrt

__getattr__ = lazy_exports(__name__, {"kernel": _KERNEL_NAMES})
