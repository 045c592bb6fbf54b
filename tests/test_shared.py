"""The helpers every launcher shares: plain-Python grid arithmetic that agrees with Triton's, and
the number checks that name the argument."""

from __future__ import annotations

import math
import re
import timeit

import numpy as np
import pytest
import triton

from kernelnotes._grid import cdiv, next_power_of_2
from kernelnotes._validate import REAL_RULES, check_real


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


@pytest.mark.parametrize("rule, good, bad", [
    ("a finite number", [-1e300, 0, 2.5, np.float32(-3)], [math.inf, -math.inf, math.nan]),
    ("a finite number > 0", [1e-300, 1, np.float64(0.5)], [0.0, -0.0, -1, math.inf, math.nan]),
    ("a finite number >= 0", [0, -0.0, 7, np.int64(3)], [-1e-300, math.inf, math.nan]),
    ("in [0, 1)", [0, 0.5, 1 - 2**-53], [1, 1.5, -0.1, math.nan]),
    ("in [0, 1]", [0, 1, 0.25], [1 + 2**-52, -1e-9, math.nan]),
])
def test_check_real_takes_what_its_rule_says_and_names_the_argument(rule, good, bad):
    for v in good:
        got = check_real("x", v, rule)
        assert type(got) is float and got == float(v)
    for v in bad:
        with pytest.raises(ValueError, match=f"^x must be {re.escape(rule)}, got "):
            check_real("x", v, rule)
    for v in ("0.5", None, [1.0], 1j):
        with pytest.raises(TypeError, match=f"^x must be a real number, got {type(v).__name__}$"):
            check_real("x", v, rule)


def test_check_real_refuses_tensors():
    import torch

    with pytest.raises(TypeError, match="lr must be a real number, got Tensor"):
        check_real("lr", torch.tensor(0.1), "a finite number >= 0")
    assert set(REAL_RULES) >= {"a finite number", "in [0, 1]"}


def test_smi_summary_keeps_the_loaded_window_and_every_clock_reason():
    """benchmarks._harness.sustained's reading of nvidia-smi: lines outside the window, "[N/A]"
    fields and a line cut off mid-write are dropped; medians of the rest; the reasons OR-ed."""
    import datetime

    from benchmarks._harness import smi_summary

    text = "\n".join([
        "2026/12/02 03:50:00.100, 80.5, 700.00, 345, 1980, 0x0000000000000001",  # idle, before
        "2026/12/02 03:50:00.600, 690.1, 700.00, 1515, 1980, 0x0000000000000004",
        "2026/12/02 03:50:00.700, [N/A], 700.00, 1500, 1980, 0x0000000000000004",
        "2026/12/02 03:50:00.800, 688.0, 700.00, 1530, 1980, 0x0000000000000024",
        "2026/12/02 03:50:00.900, 695.3, 700.00, 1485, 1980, 0x0000000000000004",
        "2026/12/02 03:50:01.000, 91.0, 700.00, 1980, 1980, 0x0000000000000001",  # after
        "2026/12/02 03:50:01.1",
    ])
    at = datetime.datetime(2026, 12, 2, 3, 50)
    got = smi_summary(text, at + datetime.timedelta(seconds=0.5),
                      at + datetime.timedelta(seconds=0.95))
    assert got == {"power_w": 690.1, "power_limit_w": 700.0, "sm_mhz": 1515.0,
                   "max_sm_mhz": 1980.0, "clock_reasons": ["software power cap",
                                                           "software thermal slowdown"],
                   "samples": 3}
    assert smi_summary(text, at, at) == {}
