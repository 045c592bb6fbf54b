"""Topic packages export their Triton launchers without importing torch or triton until first
use."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562): ``package.<submodule>`` is imported the first time one
    of its exported names is looked up, so ``import kernelnotes.<topic>`` stays NumPy-only."""
    where = {name: sub for sub, names in exports.items() for name in names}

    def __getattr__(name: str):
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{sub}"), name)

    return __getattr__
