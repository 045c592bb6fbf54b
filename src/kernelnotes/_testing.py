"""Helpers the tests and the posts' check fences share: error norms, poisoning, unit roundoff.

Tolerances are multiples of the unit roundoff ``u`` of the dtype the kernel computes in; a test
that widens one says why in a comment beside it.
"""

from __future__ import annotations

import numpy as np

# Unit roundoff u = 2^-p for p significand bits (fp32: 24, bf16: 8, fp16: 11, tf32: 11).
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "tf32": 2.0**-11,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}


def dtype_name(dtype) -> str:
    """'float32' for np.float32, torch.float32 or the string itself."""
    return str(dtype).removeprefix("torch.").removeprefix("<class 'numpy.").removesuffix("'>")


def rel_err(got, ref) -> float:
    """Relative-norm error ||got - ref|| / ||ref|| in float64 (Frobenius norm of the flattened
    arrays).

    NaN anywhere in ``got`` where ``ref`` is finite gives ``inf``, so a NaN never passes a bound.
    """
    got = _as_f64(got)
    ref = _as_f64(ref)
    if got.shape != ref.shape:
        raise ValueError(f"shapes differ: got {got.shape}, ref {ref.shape}")
    if np.isnan(got).any() and not np.isnan(ref).any():
        return float("inf")
    denom = np.linalg.norm(ref.ravel())
    num = np.linalg.norm((got - ref).ravel())
    return float(num / denom) if denom > 0 else float(num)


def _as_f64(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor, on any device and dtype
        a = a.detach().to("cpu").double().numpy()
    return np.asarray(a, dtype=np.float64)


def poison_(t):
    """Fill a tensor in place so that any element a kernel fails to write shows up: NaN for a
    floating tensor, the most negative value for an integer one (which has no NaN; an autotuner's
    cache-flush buffer is one), a bool tensor left as it is."""
    import torch

    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def poison_allocations(monkeypatch) -> None:
    """Make every ``torch.empty`` / ``torch.empty_like`` allocation start poisoned (see
    `poison_`) until ``monkeypatch.undo()``, so that an output element a launcher's kernel
    fails to write shows."""
    import torch

    real_empty, real_empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison_(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison_(real_empty_like(*a, **kw)))


def ulp_distance_f32(a, b) -> np.ndarray:
    """How many representable float32 numbers lie between ``a`` and ``b`` (0 when equal; NaN==NaN).

    Maps the float32 bit patterns onto a monotone integer line, so the count is exact across
    binades, subnormals and zero (+0 and -0 are 0 apart).
    """
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)

    def ordinal(x: np.ndarray) -> np.ndarray:
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordinal(a) - ordinal(b))
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    return np.where(both_nan, 0, np.where(one_nan, np.iinfo(np.int64).max, d))
