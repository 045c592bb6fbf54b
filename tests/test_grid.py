"""The launchers' plain-Python grid arithmetic agrees with Triton's own helpers."""

from __future__ import annotations

import timeit

import triton

from kernelnotes._grid import cdiv, next_power_of_2


def test_cdiv_and_next_power_of_2_agree_with_triton():
    for a in [*range(0, 300), 4095, 4096, 4097, 2**31 - 1, 2**31, 2**40 + 3]:
        for b in (1, 2, 3, 16, 64, 128, 1000, 4096):
            assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b), (a, b)
    for n in [*range(1, 600), 2**20 - 1, 2**20, 2**20 + 1, 2**33 + 5]:
        p = next_power_of_2(n)
        assert p == triton.next_power_of_2(n), n
        assert p >= n and p & (p - 1) == 0 and (p == 1 or p // 2 < n), n


def test_cdiv_is_cheaper_than_tritons_on_the_host():
    # the reason the helper exists: Triton's goes through its JIT call wrapper
    ours = min(timeit.repeat(lambda: cdiv(8192, 64), number=2000, repeat=5))
    theirs = min(timeit.repeat(lambda: triton.cdiv(8192, 64), number=2000, repeat=5))
    assert ours < theirs / 3, (ours, theirs)
