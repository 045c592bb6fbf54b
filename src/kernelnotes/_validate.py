"""Argument checks shared by every launcher: each failure names the argument and what was wrong.

Torch is only touched through the tensor that is passed in, so this module imports without torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable


def _names(dtypes: Iterable) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t,
    *,
    dtypes: Iterable | None = None,
    ndim: int | None = None,
    min_ndim: int | None = None,
    nonempty: bool = False,
    contiguous: bool = False,
    device=None,
) -> None:
    """Raise a ``TypeError``/``ValueError`` naming ``name`` unless ``t`` is a fitting tensor."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in tuple(dtypes):
        raise TypeError(f"{name} must have dtype in ({_names(dtypes)}), got {_names([t.dtype])}")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}"
        )
    if nonempty and t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (strides {t.stride()} for shape {tuple(t.shape)})"
        )
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all inputs on one device)")


# what a number argument may be; NaN fails every rule, and only the unit intervals admit no inf
REAL_RULES = {
    "a finite number": math.isfinite,
    "a finite number > 0": lambda x: 0.0 < x < math.inf,
    "a finite number >= 0": lambda x: 0.0 <= x < math.inf,
    "in [0, 1)": lambda x: 0.0 <= x < 1.0,
    "in [0, 1]": lambda x: 0.0 <= x <= 1.0,
}


def check_real(name: str, value, rule: str) -> float:
    """``value`` as a float; a ``TypeError`` naming ``name`` unless it is a real number (int,
    float or NumPy scalar, not a tensor), a ``ValueError`` unless it is ``rule`` (a key of
    ``REAL_RULES``)."""
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    x = float(value)
    if not REAL_RULES[rule](x):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return x


def check_tiles(name: str, tiles, rules: dict, optional: Iterable = ()) -> None:
    """A launch config's tile sizes: ``tiles`` (a mapping) sets exactly the keys of ``rules``, plus
    any of ``optional``, each a power of two (``tl.arange`` needs one) of at least
    ``rules[key][0]`` that divides ``rules[key][1]`` where that is not None."""
    missing = [k for k in rules if k not in tiles]
    unknown = sorted(set(tiles) - set(rules) - set(optional))
    if missing or unknown:
        may = f" (and may set {', '.join(optional)})" if optional else ""
        raise ValueError(f"{name} must set exactly {', '.join(rules)}{may}: "
                         + "; ".join(f"{what} {', '.join(keys)}" for what, keys in
                                     (("missing", missing), ("unknown", unknown)) if keys))
    for key, (least, divides) in rules.items():
        b = tiles[key]
        if type(b) is not int or b < least or b & (b - 1) or (divides is not None and divides % b):
            but = f" dividing {divides}" if divides is not None else ""
            raise ValueError(f"{name} {key}={b!r} must be a power of two >= {least}{but}")


def interpreted(kernel) -> bool:
    """Whether a @triton.jit function runs in Triton's interpreter (TRITON_INTERPRET=1 at its
    import)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_kernel_device(name: str, t, kernel) -> None:
    """Compiled Triton kernels need CUDA tensors; the interpreter (TRITON_INTERPRET=1) needs CPU
    ones. Skipped while torch.compile traces a caller: Dynamo cannot look at a kernel object, and
    the op it traces to runs its launcher, which checks again, when the graph runs."""
    import torch

    if torch.compiler.is_compiling():
        return
    if interpreted(kernel) and t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device}, but Triton runs in the interpreter (TRITON_INTERPRET=1): "
            "pass CPU tensors"
        )
    if not interpreted(kernel) and t.device.type != "cuda":
        raise ValueError(
            f"{name} is on {t.device}; compiled Triton kernels need a CUDA tensor "
            "(set TRITON_INTERPRET=1 before importing triton to run them on the CPU)"
        )
