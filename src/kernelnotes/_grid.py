"""Launch-grid arithmetic in plain Python, for the launchers' host side.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function``s: called from Python,
each goes through Triton's JIT call wrapper, about 3 us a call with Triton 3.6 on our development
machine (against 0.1 us for the same integer arithmetic). ``mhc_pre`` made eleven such calls,
which added a few tens of microseconds of host time to every call. Inside ``@triton.jit`` code
use ``tl.cdiv``.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints a >= 0, b > 0: the number of blocks of b that cover a."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for ints n >= 1."""
    return 1 << (n - 1).bit_length()
